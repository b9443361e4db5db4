"""The SchedulingPolicy interface: ``decide(view, now) -> Decision``.

The daemon calls ``decide`` on every event (submission, completion, node change, operator change,
tick, or the ``wake_at`` a previous decision asked for); the simulator calls it at every instant
where something happened, after all completions and arrivals of that instant. The result is checked
by ``vmctl.policies.invariants.check_decision`` in both.

A policy object may hold configuration (thresholds, costs, a seed) but no state that changes between
calls: everything it needs about the cluster is in the view. That makes a policy result in the
simulator a claim about the daemon, and lets the daemon restart at any point.

A policy declares what it ``needs`` of the cluster (:class:`Needs`: VM levels per core, the level
discipline, job shapes, capped shared VMs); the simulator and vmctld describe what they offer as a
:class:`Offer` and refuse, before the first decision, a policy whose needs it does not meet
(``PolicyNeedsUnmet``, with what is missing). Example: MEASY needs 2 levels under the priority
discipline; EASY needs 1 level (any discipline); ``vcsched-*`` need capped shared VMs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from vmctl.errors import PolicyNeedsUnmet, PolicyParameterError, ValidationError
from vmctl.model import ClusterView, Decision, Discipline, Job, JobShape, NodeLayout

#: job shapes (``rigid``: ``procs`` fixed; ``moldable``: width chosen at start; ``task-bag``: workers
#: set by the policy)
SHAPES = ("rigid", "moldable", "task-bag")


@dataclass(frozen=True, slots=True)
class Needs:
    """What a policy needs of the cluster: at least ``levels`` VM levels per core, under one of
    ``disciplines`` (empty = any), the job ``shapes`` it schedules, and whether it places capped
    shared VMs on nodes (``PlaceShared``/``SetCap``)."""

    levels: int = 1
    disciplines: frozenset[Discipline] = frozenset()
    shapes: frozenset[str] = frozenset({"rigid"})
    shared_vms: bool = False

    @property
    def two_tier(self) -> bool:
        """The MEASY two-tier architecture: 2 levels under the priority discipline (fg loss applies)."""
        return self.levels >= 2 and Discipline.PRIORITY in self.disciplines

    def layout(self) -> NodeLayout:
        """The host layout vmctld lays a cluster out in for this policy (``vmctl policy set --relayout``,
        a configured policy no registered node can serve): the one discipline it names, else the family's
        natural one -- capped shared VMs (vcsched) on ``shared`` hosts of 1 level (no placeholder VMs,
        only the shared VMs), task bags on ``shared`` hosts of 2 workers per core (paper 001's testbed),
        anything else on the MEASY pair (``priority``, 2 levels). Levels: at least ``levels``; priority
        always 2 (vmctld's priority discipline is the fg/bg pair). Example: ``gs-m`` with ``mpl=3``:
        3 timeslice levels."""
        if len(self.disciplines) == 1:
            discipline = next(iter(self.disciplines))
        elif self.disciplines:
            discipline = Discipline.PRIORITY if Discipline.PRIORITY in self.disciplines else min(self.disciplines)
        elif self.shared_vms:
            discipline = Discipline.SHARED
        elif "task-bag" in self.shapes:
            return NodeLayout(Discipline.SHARED, max(2, self.levels))
        else:
            discipline = Discipline.PRIORITY
        if discipline is Discipline.PRIORITY:
            return NodeLayout(discipline, 2)
        return NodeLayout(discipline, max(1, self.levels))

    def to_json(self) -> dict[str, Any]:
        """The needs and the layout they are laid out in (None: more levels than an agent carries), as
        ``GET /v1/policy`` and ``vmctl policy list -o json`` show them."""
        try:
            lay = self.layout()
            layout: dict[str, Any] | None = {"discipline": lay.discipline.value, "levels": lay.levels}
        except ValidationError:
            layout = None
        return {"levels": self.levels, "disciplines": sorted(d.value for d in self.disciplines),
                "shapes": sorted(self.shapes), "shared_vms": self.shared_vms, "layout": layout}

    def text(self) -> str:
        """What ``vmctl policy list`` shows: ``3 levels, timeslice; rigid``."""
        parts = [f"{self.levels} level{'s' if self.levels != 1 else ''}"]
        parts.append("/".join(sorted(d.value for d in self.disciplines)) if self.disciplines else "any discipline")
        parts.append("/".join(sorted(self.shapes)))
        if self.shared_vms:
            parts.append("shared VMs")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Offer:
    """What a cluster (simulated or real) offers a policy; ``where`` names it in errors."""

    where: str
    levels: int
    discipline: Discipline
    shapes: frozenset[str] = frozenset({"rigid"})
    shared_vms: bool = False

    def check(self, policy: SchedulingPolicy) -> None:
        """Raise ``PolicyNeedsUnmet`` naming every need this offer does not meet."""
        needs = policy.needs
        missing: list[str] = []
        if needs.levels > self.levels:
            missing.append(f"{needs.levels} VM levels per core (it has {self.levels})")
        if needs.disciplines and self.discipline not in needs.disciplines:
            wanted = " or ".join(sorted(d.value for d in needs.disciplines))
            missing.append(f"the {wanted} discipline (it has {self.discipline.value})")
        shapes = sorted(needs.shapes - self.shapes)
        if shapes:
            missing.append(f"job shapes {', '.join(shapes)} (it has {', '.join(sorted(self.shapes))})")
        if needs.shared_vms and not self.shared_vms:
            missing.append("capped shared VMs (PlaceShared/SetCap)")
        if missing:
            raise PolicyNeedsUnmet(policy=policy.name, where=self.where, problem="needs " + "; ".join(missing))

PolicyParams = Mapping[str, Any]


class SchedulingPolicy(ABC):
    #: registry name, lower case (``easy``, ``measy``, ``mcb8`` ...)
    name: ClassVar[str] = ""
    #: one line for ``vmctl policy show`` and ``--help``
    summary: ClassVar[str] = ""
    #: parameter name -> (type, default, help); validated by ``__init__``
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {}
    #: what the policy needs of the cluster (checked by the simulator and vmctld before it runs)
    needs: ClassVar[Needs] = Needs()
    #: parameters left out of result reports (``reported_params``) while at their default: options
    #: added later (the EASY family's queue order) so that results of the paper's setting read as before
    quiet_params: ClassVar[frozenset[str]] = frozenset()
    #: the job fields besides submit time and size it orders or places jobs by (``priority``,
    #: ``deadline``); vmctld warns at submission about a given field the policy does not use
    job_fields: frozenset[str] = frozenset()

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = {}
        for key, value in params.items():
            if key not in self.parameters:
                known = ", ".join(sorted(self.parameters)) or "none"
                raise PolicyParameterError(policy=self.name, param=key, problem=f"unknown (known: {known})")
            kind = self.parameters[key][0]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                raise PolicyParameterError(
                    policy=self.name, param=key, problem=f"must be {kind.__name__}, got {value!r}"
                )
            self.params[key] = value
        for key, (_kind, default, _help) in self.parameters.items():
            self.params.setdefault(key, default)
        self.validate_params()

    def validate_params(self) -> None:
        """Override to check ranges; raise PolicyParameterError."""
        return None

    def check_job(self, job: Job, shape: JobShape | None, where: str) -> None:
        """Override to refuse, at submission, a job this policy cannot schedule (raise a
        ``ValidationError`` naming the field under ``where``, e.g. ``jobs[0].shape.times[1]``)."""
        return None

    @abstractmethod
    def decide(self, view: ClusterView, now: float) -> Decision:
        """Return the actions to take now. Must not mutate or retain ``view``."""

    def queue_order(self, queue: list[Job], now: float, total_cores: int) -> list[Job]:
        """The queued jobs (``queue``, in arrival order) in the order this policy considers them at
        ``now``: where ``vmctl job explain`` places a job. The default is arrival order; a policy that
        orders its queue otherwise (multifactor, shortest first) overrides it with that order."""
        return queue

    def cannot_act(self, view: ClusterView) -> bool:
        """A cheap, pure test that lets a caller skip ``decide`` when it cannot change anything.

        Contract: True only if ``decide(view, now)`` would return a Decision with no actions and no
        ``wake_at`` for every ``now``. Its reasons, default reason and reservation are not covered:
        a caller that needs them (the daemon reports waiting reasons) must call ``decide`` anyway.
        The default, False, is always correct; override only with a proof. Must not mutate or
        retain ``view``."""
        return False

    def reported_params(self) -> dict[str, Any]:
        """The parameters a result records: all of them, except ``quiet_params`` at their default."""
        return {k: v for k, v in self.params.items()
                if k not in self.quiet_params or v != self.parameters[k][1]}

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary, "params": dict(self.params)}
