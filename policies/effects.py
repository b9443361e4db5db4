"""What an action did: the typed effects the one occupancy model returns, for the simulator and vmctld.

:meth:`vmctl.policies.occupancy.Occupancy.apply` checks one action against the rules and returns an
:class:`Effect` saying what it did, in the words every executor needs, whatever the action's name:
*which job*, *what kind of change* (:class:`EffectKind`), *where the job is after it* and *where it was
before* (both as a :class:`Placement` in view coordinates), and *what it costs*. The checker
(:func:`vmctl.policies.invariants.check_decision`) returns the overlay with its ordered list of effects
(``Occupancy.effects``, one per action, in the decision's order), so an executor commits what the one
model decided instead of interpreting the action types again:

- the simulator (:mod:`vmctl.sim.engine`) turns each effect into progress kept or lost, costs and
  counters, then writes the overlay's slots into its arrays;
- vmctld's actuator turns each effect into record changes and VM operations (``before`` is the source
  of a migration, ``after`` its target).

Kinds (the action types that produce them; the priority names read fg/bg as levels 0 and 1):

===============  ==========================================  ==========================================
kind             actions                                     before -> after
===============  ==========================================  ==========================================
STARTED          StartFg, StartBg, Start                     None -> its slots
MOVED            Promote, Demote, Migrate, Move (of a        its slots -> its new slots (``cost``:
                 running job)                                seconds of no progress)
SUSPENDED        Suspend                                     its slots -> the same slots
RESUMED          Resume                                      its slots -> the same slots
CHECKPOINTED     Checkpoint                                  its slots -> None (progress kept)
RESTORED         Restore, Move of a checkpointed job         None (or, for a Restore of a suspended
                                                             job, its old slots) -> its new slots
STOPPED          Kill (``requeue``: queued again)            its slots (None: checkpointed) -> None
RESIZED          Resize (task bags)                          its slots -> its new slots (new width)
REPLICATED       Replicate (time slicing)                    its rows -> its rows plus one replica
UNREPLICATED     Unreplicate                                 its rows -> one row fewer
CAPPED           SetCap                                      placement -> same placement; shared VMs
                                                             carry the new cap (``action.cap`` is the
                                                             cap asked, None = uncapped)
PLACED_SHARED    PlaceShared (vcsched)                       None (a start) or its old placement ->
                                                             shared VMs on ``nodes`` capped at ``cap``
===============  ==========================================  ==========================================

A :class:`Placement` is one of two shapes. On core levels: ``cores[i]`` carries process (or worker) i
on level ``slot_levels[i]`` when the job holds slots on several levels (a task bag of a ``shared``
cluster), else on ``level``; ``replicas`` are the job's other rows (same cores, time slicing). As
capped shared VMs (``shared`` True): process i runs on node ``nodes[i]`` capped at ``cap``; no core
level is held (``cores`` empty, ``level`` -1). ``slots`` lists the (global core, level) pairs held on
the job's main row, in process order.

Example (priority discipline, 2 cores; job ``a`` queued, ``b`` running on level 1 of core 0)::

    occ = check_decision(view, Decision(actions=(StartFg("a", (1,)), Promote("b"))), now)
    [(e.kind, e.job_id, e.before and e.before.slots, e.after.slots) for e in occ.effects]
    # [(EffectKind.STARTED, "a", None, ((1, 0),)),
    #  (EffectKind.MOVED, "b", ((0, 1),), ((0, 0),))]

Policies import only ``vmctl.model``, ``vmctl.errors`` and the standard library; this module too, so
the daemon and the simulator import it freely.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from vmctl.model import Action, slots_of


class EffectKind(StrEnum):
    """What an action did to a job (see the module docstring for the actions behind each)."""

    STARTED = "started"
    MOVED = "moved"
    SUSPENDED = "suspended"
    RESUMED = "resumed"
    CHECKPOINTED = "checkpointed"
    RESTORED = "restored"
    STOPPED = "stopped"
    RESIZED = "resized"
    REPLICATED = "replicated"
    UNREPLICATED = "unreplicated"
    CAPPED = "capped"
    PLACED_SHARED = "placed-shared"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a job runs, in view coordinates (global core indices, levels 0 = fg, 1 = bg, ...).

    On core levels: process i on ``cores[i]``, at ``slot_levels[i]`` when that is not None (a task bag
    on several levels; ``level`` is then their lowest), else at ``level``; ``replicas``: its other
    rows on the same cores (sorted). As capped shared VMs: ``nodes[i]`` is process i's node and
    ``cap`` the CPU cap of each VM (a fraction of one core); ``cores`` is empty and ``level`` -1."""

    level: int
    cores: tuple[int, ...]
    slot_levels: tuple[int, ...] | None = None
    replicas: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    cap: float | None = None

    @property
    def shared(self) -> bool:
        """True for capped shared VMs (vcsched): the job holds no level of any core."""
        return self.level < 0

    @property
    def slots(self) -> tuple[tuple[int, int], ...]:
        """The (core, level) pairs of the job's main row, in process order (none for shared VMs)."""
        if self.level < 0:
            return ()
        return slots_of(self.cores, self.level, self.slot_levels)

    @property
    def all_slots(self) -> tuple[tuple[int, int], ...]:
        """Every (core, level) pair held: the main row, then each replica row."""
        main = self.slots
        if not self.replicas:
            return main
        return main + tuple((c, lv) for lv in self.replicas for c in self.cores)


@dataclass(frozen=True, slots=True)
class Effect:
    """What one action did (returned by ``Occupancy.apply``; kept in order in ``Occupancy.effects``).

    ``after``: the job's placement once the action is applied (None: it holds nothing, stopped or
    checkpointed). ``before``: its placement just before (None: it was queued, or checkpointed).
    ``cost``: seconds of no progress the action costs (a Move/Migrate's ``cost``; 0 otherwise).
    ``requeue``: for STOPPED, whether the job waits in the queue again. ``action``: the action itself
    (its ``reason`` fields, a SetCap's requested cap)."""

    kind: EffectKind
    job_id: str
    action: Action
    after: Placement | None
    before: Placement | None = None
    cost: float = 0.0
    requeue: bool = False

    @property
    def same_cores(self) -> bool:
        """True when the job keeps its cores (in order): a change of level in place, not a migration."""
        return (self.before is not None and self.after is not None
                and self.before.cores == self.after.cores and self.before.nodes == self.after.nodes)
