"""Execution models of the simulator: how the jobs the policy places advance, behind one interface.

The engine (:mod:`vmctl.sim.engine`) owns the clock, the queue, the occupancy of every (core, level)
slot and the completion events; an :class:`ExecutionModel` says what a placed job *does*: how much
work it needs, how fast it advances given the occupancy, and which events of its own (time-slice
boundaries, task boundaries) change that. A policy result in the simulator is then a claim about the
cluster the model describes. Implementations: :class:`TwoTierModel` (the MEASY paper's fg/bg
progress model, the default) and ``vmctl.sim.timeslice.TimeSliceModel`` (gang scheduling, paper 004).

Contract (stable: later changes are additive)
----------------------------------------------
Units. *Work* is seconds of dedicated standard-core time per process (a rigid job of the trace needs
``min(run_time, estimate)``). A run's *rate* is work per wall second: it is piecewise constant, the
engine settles a run's progress (``progress = p0 + rate * (t - max(t0, blocked_until))``) before it
asks for a new rate, and schedules the completion at ``progress == work``.

Lifetime. One model object serves one :class:`~vmctl.sim.engine.Simulator`. The engine calls, in
this order:

1. ``offer()`` (before anything else): the levels per core, the discipline, the job shapes and
   whether capped shared VMs exist. The engine builds the policy's view with that many levels under
   that discipline and refuses a policy whose ``needs`` the offer does not meet
   (``PolicyNeedsUnmet``, reference ``policy-needs-unmet``).
2. ``bind(state)`` once, with the engine's read-only :class:`EngineState`. Draw random numbers and
   precompute per-job data here; keep references, never copies, of the state's lists.
3. For every run that starts (a queued job placed by Start/StartFg/StartBg): ``work(run)``, once, the
   work the run needs to complete (moldable: the execution time at ``run.width``; task bag: the sum
   of its tasks). A model keeps its per-run state in ``run.data``.
4. ``rate(run)`` whenever something about the run changed: its placement or level, a resume, a model
   event that named it, a change on slots its rate depends on. The engine has settled the run at
   ``state.now`` with its previous rate just before. Suspended and checkpointed runs are not asked:
   the engine gives them rate 0 (``run.stopped``).
5. ``affected(level, cores)`` after slots on ``level`` of ``cores`` changed hands (start, move, kill,
   completion ...): the *other* runs whose rate depends on those slots; the engine re-rates them.
6. ``next_event()``: the time of the model's next internal event (``math.inf``: none). Asked on
   every turn of the main loop when ``has_events`` is True (so keep it O(1)); when that time comes,
   after the completions due at that instant, the engine calls ``on_event(now)``, which returns the
   runs whose rate changed (re-rated as in 4.). A model event alone does not call the policy: it
   sees the new state at the next submission, completion or ``wake_at`` it asked for.
7. ``on_schedule(schedule, now)`` when a decision carries a ``SliceSchedule`` (already checked by the
   invariant checker), returning the runs whose rate changed; ``on_resize(run, old_slots, now)``
   after a ``Resize`` moved a task bag's workers (``old_slots``: its (core, level) slots before; the
   engine has already applied the occupancy change, :mod:`vmctl.policies.occupancy`). The defaults
   refuse with ``SimulationError``.
8. ``expected_end(run, now)``: what the view reports as ``RunningJob.expected_end``.

Optional hooks (levelled path; added for moldable jobs and task bags, :mod:`vmctl.sim.exec_moldable`,
:mod:`vmctl.sim.exec_taskbag`): ``nodes(cores)``, asked once before the view is built, gives the
view's node fields (names, speeds, groups); ``span(run)``, asked at a start when a model overrides it,
is the run's length for the metrics when its work is not per process (a task bag's work is the sum of
its tasks); a model may call ``state.hold_slots(run, slots)`` from ``on_resize`` to keep (core, level)
slots a ``Resize`` gave up until a running task ends, and ``state.release_slots(run, slots)`` from
``on_event`` to give them up then.

Costs. A ``Move``/``Migrate`` (and a restore) with ``cost`` c makes the run advance nothing during
the next c seconds in which it *would* advance (``Run.debt``): on the two-tier model that is wall
time, on the time-slice model c seconds of its own slices. The engine implements this for every
model; ``rate`` never sees it.

What the engine keeps for itself. Occupancy (applied through the one occupancy model on the levelled
path), the queue, kills (progress lost), suspend/resume (rate 0, slots kept), checkpoint (slots
freed, progress kept; the view shows the job as a suspended running job that holds no slot) and
restore (a ``Move``/``Restore`` onto free slots, with a cost), counters and metrics. The priority
discipline of :class:`TwoTierModel` runs on the engine's specialised fg/bg fast path: its rates are
the model's ``rate``, its work the default ``job_work`` (``work`` is not called there), and its
"affected" runs, the bg runs under a changed fg slot, are found there; the hooks 3, 5, 6 and 7 and the
costs rule above are the levelled path's.

Writing a model (moldable, task bags ...): subclass :class:`ExecutionModel` in its own module,
implement ``offer`` and ``rate`` and whatever hooks it needs, and give the simulator a factory
(``SimConfig(execution=...)``). Nothing in the engine's loop changes.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol

from vmctl.cpushare import shared_rate as shared_rate
from vmctl.errors import SimulationError
from vmctl.model import Discipline, Job, JobShape, SliceSchedule, Tier, slots_of
from vmctl.policies.base import Offer

_INF = math.inf


class Run:
    """A job that holds slots (or is checkpointed) in the simulator: where it is and how fast it
    advances, ``progress(t) = p0 + rate * (t - max(t0, blocked_until))`` for ``t >= t0``.

    Models read ``idx`` (the job's position in the workload), ``job``, ``level`` (and ``replicas``, the
    other levels of the same cores a replicated job runs on), ``cores``, ``slot_levels`` (a task bag on
    several levels of a ``shared`` cluster: the level of each of ``cores``; None: ``level`` for all) and
    ``slots`` (the (core, level) pairs either way),
    ``width``, ``suspended``/``checkpointed``/``stopped`` and ``p0``/``t0``; they may keep their own
    per-run state in ``data``. Everything else is the engine's. On the two-tier fast path (the
    engine's hottest allocation) only the fields of ``__init__`` are set; the levelled path sets the
    others with :meth:`on_level` when the run starts."""

    __slots__ = (
        "blocked_until", "cap", "checkpointed", "cores", "data", "debt", "idx", "job", "level", "migrated_at", "nodes",
        "p0", "placed", "rate", "replicas", "shared", "slot_levels", "start_time", "suspended", "t0", "tier",
        "tier_since", "version",
    )
    cap: float  # set for shared runs only
    nodes: tuple[str, ...]  # set for shared runs only
    level: int  # the fields below: set by ``on_level`` (levelled path)
    suspended: bool
    checkpointed: bool
    debt: float
    replicas: tuple[int, ...]
    migrated_at: float
    data: Any
    slot_levels: tuple[int, ...] | None

    def __init__(self, idx: int, job: Job, tier: Tier, cores: tuple[int, ...], now: float) -> None:
        self.idx = idx
        self.job = job
        self.tier = tier
        self.cores = cores
        self.start_time = now
        self.tier_since = now
        self.p0 = 0.0
        self.t0 = now
        self.rate = 0.0
        self.blocked_until = now
        self.version = 0
        self.placed = True  # the view's snapshot must be rebuilt at the next reschedule
        self.shared = False  # capped shared VMs on ``nodes`` (vcsched) instead of a level of ``cores``

    def on_level(self, level: int) -> None:
        """Levelled path: the run starts on ``level``, running, owing nothing, with no model state."""
        self.level = level
        self.suspended = False
        self.checkpointed = False  # slots freed, progress kept
        self.debt = 0.0  # seconds of advancing time still owed to a move's cost
        self.replicas = ()  # other levels of the same cores it runs on (Replicate, timeslice)
        self.migrated_at = -_INF  # when it last moved to other cores
        self.data = None  # the execution model's own per-run state
        self.slot_levels = None  # a task bag on several levels: the level of each core (Start/Resize)

    @property
    def width(self) -> int:
        return len(self.cores)

    @property
    def slots(self) -> tuple[tuple[int, int], ...]:
        """Levelled path: the (core, level) slots the run holds, in worker order."""
        return slots_of(self.cores, self.level, self.slot_levels)

    @property
    def stopped(self) -> bool:
        """Suspended or checkpointed: advances nothing, whatever the model says."""
        return self.suspended or self.checkpointed

    def progress_at(self, t: float) -> float:
        start = self.t0 if self.t0 > self.blocked_until else self.blocked_until
        return self.p0 + self.rate * (t - start) if t > start else self.p0

    def settle(self, t: float) -> None:
        self.p0 = self.progress_at(t)
        self.t0 = t


class WorkloadRecord(Protocol):
    """What the engine needs from a workload record (``vmctl.sim.workloads.core.WorkloadJob``); a
    model may read more (``getattr``) from ``EngineState.records``."""

    @property
    def id(self) -> int: ...
    @property
    def submit(self) -> float: ...
    @property
    def run_time(self) -> float: ...
    @property
    def procs(self) -> int: ...
    @property
    def estimate(self) -> float: ...
    @property
    def cpu_usage(self) -> tuple[float, ...] | None: ...


class EngineState(Protocol):
    """What a model may read of the engine (read-only by contract; the lists are live, indexed by
    workload position ``idx`` or by core)."""

    now: float
    cores: int
    n: int  # jobs in the workload
    records: Sequence[WorkloadRecord]  # the workload's records, by idx (a model may getattr more)
    seed: int  # the run's seed: draw random numbers from it
    job_work: Sequence[float]  # min(run_time, estimate) per job: a rigid job's work
    job_usage: Sequence[tuple[float, ...]]  # actual CPU usage per process (all 1.0 under cpu_usage="full")
    # [level][core]: the run on that slot (the two-tier fast path fills level 0 from the first bg
    # placement on: only a bg run's rate reads it)
    slot_run: Sequence[Sequence[Run | None]]
    runs: Mapping[str, Run]  # job id -> run, of every job that holds slots or is checkpointed

    def hold_slots(self, run: Run, slots: tuple[tuple[int, int], ...]) -> None:
        """Levelled path: ``run`` takes back the (core, level) ``slots``, free since a ``Resize`` gave them
        up in the decision just applied (a task bag's worker finishes its running task there first);
        they join ``run.slots``. ``SimulationError`` when the decision gave one to another job."""
        ...

    def release_slots(self, run: Run, slots: tuple[tuple[int, int], ...]) -> None:
        """Levelled path: ``run`` gives up the (core, level) ``slots`` now (they leave ``run.slots``)."""
        ...


class ExecutionModel(ABC):
    """One execution model (see the module docstring for the contract)."""

    #: short name, shown in errors (``the simulator (timeslice model)``)
    name: ClassVar[str] = ""
    #: True when the model has internal events (``next_event``/``on_event`` are then called)
    has_events: ClassVar[bool] = False

    state: EngineState

    def __init__(self) -> None:
        #: job id -> shape of the jobs that are not rigid: the view's ``shapes`` (the view holds this very
        #: dict, built before ``bind``): fill it in ``bind``, never rebind it
        self.shapes: dict[str, JobShape] = {}
        self._bound = False

    @abstractmethod
    def offer(self) -> Offer:
        """What this model offers policies (levels, discipline, shapes, shared VMs)."""

    def nodes(self, cores: int) -> Mapping[str, Any] | None:
        """The policy view's node fields for a cluster of ``cores`` (``node_of_core``, ``local_core``,
        ``node_names``, ``node_speed``, ``node_group``), asked once before the view is built; None (the
        default): the simulator has no nodes."""
        return None

    def where(self) -> str:
        """How errors name the simulated cluster."""
        return f"the simulator ({self.name} model)"

    def bind(self, state: EngineState) -> None:
        if self._bound:
            raise SimulationError(time=state.now, problem=f"the {self.name} model already serves a simulator")
        self._bound = True
        self.state = state

    def work(self, run: Run) -> float:
        """Work the run needs to complete (called once, when it starts)."""
        return self.state.job_work[run.idx]

    def grown_work(self, run: Run) -> float:
        """Work the run gained since it started or was last asked (asked after a ``Resize``: a task bag's
        new workers' boots, :class:`vmctl.sim.exec_taskbag.TaskBagModel`); 0 by default."""
        return 0.0

    def span(self, run: Run) -> float:
        """The run's length for the metrics (the run time of the bounded slowdown; times the width, the
        core-seconds of the utilization), asked when it starts. The default, ``work(run)``, is right
        when each process does the run's work; a model whose work is summed over its processes (task
        bags) overrides it. Only an overriding model pays for it."""
        return self.work(run)

    @abstractmethod
    def rate(self, run: Run) -> float:
        """Work per wall second of a placed, not stopped run, given the occupancy now (>= 0)."""

    def affected(self, level: int, cores: Collection[int]) -> Iterable[Run]:
        """The other runs whose rate depends on ``level`` of ``cores`` (their holders changed)."""
        return ()

    def next_event(self) -> float:
        """Time of the next internal event; ``math.inf`` when none."""
        return _INF

    def on_event(self, now: float) -> Iterable[Run]:
        """The internal event due at ``now`` happened: the runs whose rate changed."""
        return ()

    def on_schedule(self, schedule: SliceSchedule, now: float) -> Iterable[Run]:
        """A decision's time-slice schedule applies from ``now``: the runs whose rate changed."""
        raise SimulationError(time=now, problem=f"the {self.name} model has no time slices (a decision "
                                                f"carried a SliceSchedule)")

    def on_resize(self, run: Run, old_slots: tuple[tuple[int, int], ...], now: float) -> Iterable[Run]:
        """A task bag's workers moved from the (core, level) ``old_slots`` to ``run.slots``: the runs whose
        rate changed besides ``run`` (which the engine re-rates anyway)."""
        raise SimulationError(time=now, problem=f"the {self.name} model does not model resize ({run.job.id})")

    def tasks_left(self, run: Run) -> int | None:
        """``RunningJob.tasks_left``: a task bag's unfinished tasks; None (the default) when the model
        has no task bags."""
        return None

    def expected_end(self, run: Run, now: float) -> float:
        """``RunningJob.expected_end``: on level 0 the end at full speed from now,
        ``max(now, blocked) + debt + estimate - progress``; on other levels unknown (``inf``)."""
        if run.level != 0 or run.stopped:
            return _INF
        begin = run.blocked_until if run.blocked_until > now else now
        return begin + run.debt + run.job.estimate - run.progress_at(now)


# ------------------------------------------------------------------------------------- two-tier


class TwoTierModel(ExecutionModel):
    """The MEASY paper's two-tier progress model (:mod:`vmctl.progress`): 2 levels per core
    under the priority discipline, a fg run at ``1 - loss`` (1 off the two-tier architecture), a bg
    run at the pace its slowest process gets from the cycles the fg VM leaves, capped shared VMs
    (vcsched) at ``shared_rate(cap, need)``. ``two_tier`` None: whether the policy needs the two-tier
    architecture (``Needs.two_tier``), resolved by the engine before ``bind``."""

    name: ClassVar[str] = "two-tier"

    def __init__(self, two_tier: bool | None = None, progress: Any = None) -> None:
        super().__init__()
        from vmctl.progress import ProgressModel

        self.two_tier = two_tier
        self.progress: ProgressModel = progress if progress is not None else ProgressModel()
        self.loss: list[float] = []
        self.beta: list[float] = []

    def offer(self) -> Offer:
        return Offer(where="the simulator", levels=2, discipline=Discipline.PRIORITY, shared_vms=True)

    def bind(self, state: EngineState) -> None:
        import numpy as np

        super().bind(state)
        if self.two_tier is None:
            raise SimulationError(time=state.now, problem="the two-tier model's two_tier flag was not resolved")
        n = state.n
        if self.two_tier:
            procs = np.asarray([r.procs for r in state.records], dtype=np.int64)
            self.loss, self.beta = self.progress.draw(state.seed, procs)
        else:
            self.loss = self.beta = [0.0] * n  # (one list: read only, issue 27)
        self._fg_run: Sequence[Run | None] = state.slot_run[0]
        self._fg_util: Sequence[float] = getattr(state, "fg_util")  # noqa: B009 - the fast path's own list
        self._usage = state.job_usage
        self._threshold = self.progress.bg_threshold

    def rate(self, run: Run) -> float:
        """The job's rate: its slowest process's (``ProgressModel.bg_process_rate``, inlined here
        because it is the engine's hottest loop for two-tier policies)."""
        i = run.idx
        loss = self.loss[i]
        if run.tier is _FG:
            return 1.0 - loss if self.two_tier else 1.0  # progress.fg_rate, inlined
        if run.shared:
            return shared_rate(run.cap, run.job.cpu_need)
        beta = self.beta[i]
        alone = 1.0 - loss
        threshold = self._threshold
        fg_run = self._fg_run
        fg_util = self._fg_util
        rate = 1.0
        for c, u_bg in zip(run.cores, self._usage[i], strict=True):
            if fg_run[c] is None:
                r = alone
            else:
                u = fg_util[c]
                if u > threshold:
                    return 0.0
                r = beta * (1.0 - u) / u_bg
                if r > beta:
                    r = beta
            if r < rate:
                rate = r
        return rate


_FG = Tier.FG



