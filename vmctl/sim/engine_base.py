"""What the simulator's two engines share (:mod:`vmctl.sim.engine`): the state both read and write,
the queue, and what happens to a run that starts, is killed or completes, whatever its engine.

``EngineBase`` declares the engine's state (built by ``Simulator.__init__``) and holds the steps both
engines take the same way; the two-tier engine (:mod:`vmctl.sim.engine_twotier`) and the levelled
engine (:mod:`vmctl.sim.engine_levels`) add how a decision's effects, a rate change and a completion
touch their slots. ``_reschedule`` and ``_vacate`` are the engine's own (``Simulator.__init__`` binds
them to the chosen engine's methods).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from vmctl.errors import SimulationError
from vmctl.model import ClusterView, Job, RunningJob, Tier
from vmctl.sim.execution import ExecutionModel, Run
from vmctl.sim.workloads.core import UsageColumn

_Run = Run  # the engine's name of a running job (defined with the execution models)
_FG = Tier.FG
_BG = Tier.BG
_INF = math.inf


class _Live(RunningJob):
    """A RunningJob whose ``progress`` is live (as of the simulator's current time)."""

    __slots__ = ("_run", "_sim")
    _run: _Run
    _sim: EngineBase
    tasks_left = None
    throughput = None

    @property
    def progress(self) -> float:
        return self._run.progress_at(self._sim.now)


class EngineBase:
    """The simulator's state (see ``Simulator.__init__``, which sets every field) and the steps both
    engines share."""

    now: float
    model: ExecutionModel
    view: ClusterView
    two_tier: bool
    dropped: dict[str, int]
    # the workload, by job index
    _submit: array[float]
    _estimate: array[float]
    _overrun: bytearray  # the run time exceeds the estimate: the job ends killed at its estimate
    _work: array[float]
    _usage: list[tuple[float, ...]]
    _usage_col: UsageColumn | None  # a columnar trace's compact usage (tuples built ahead of arrivals)
    _width: array[int]
    # per-job outcomes and history
    _first_start: array[float]
    _end: array[float]
    _est_killed: bytearray
    _first_bg: bytearray
    _tier_changes: Counter[int]
    _job_migrations: Counter[int]
    _job_kills: Counter[int]
    _dropped_by_policy: bytearray
    _migrations: int
    _policy_kills: int
    _wasted: float
    _migration_loss: float
    _done: int
    # the queue (``_qjobs`` is the view's queue_index)
    _queue: list[Job]
    _qkey: dict[str, tuple[float, int]]
    _qjobs: dict[str, Job]
    # the runs, their snapshots (the view's ``running``) and their completion events
    _runs: dict[str, _Run]
    _snaps: dict[str, RunningJob]
    _pending: dict[str, _Run]  # runs whose snapshot is not built yet (two-tier engine's fg starts)
    _heap: list[tuple[float, int, _Run]]
    _version: int
    _dirty: dict[int, _Run]
    _rate: Callable[[_Run], float]
    # every level's occupancy; levels 0 and 1 are also the fg/bg lists of the two-tier engine
    _slot_job: list[list[str | None]]
    _slot_run: list[list[_Run | None]]
    _idle: list[set[int]]
    _fg_job: list[str | None]
    _bg_job: list[str | None]
    _fg_run: list[_Run | None]
    _bg_run: list[_Run | None]
    _fg_util: list[float]
    _idle_fg: set[int]
    _idle_bg: set[int]
    _bg_count: int
    _fg_run_kept: bool
    _loss: Sequence[float]
    _node_core: dict[str, int]
    # levelled engine: run lengths, slot-holding time, task-boundary releases
    _span: list[float] | None
    _held: list[float] | None
    _held_at: list[float]
    _resized: bytearray
    _released: bool
    runs: Mapping[str, _Run]
    # the chosen engine's (bound by ``Simulator.__init__``)
    _reschedule: Callable[[_Run], None]
    _vacate: Callable[[_Run], None]

    def _flush_dirty(self) -> None:
        if self._dirty:
            runs = self._runs
            reschedule = self._reschedule
            for run in self._dirty.values():
                if runs.get(run.job.id) is run:
                    reschedule(run)
            self._dirty.clear()

    def _enqueue(self, idx: int, job: Job) -> None:
        key = (self._submit[idx], idx)
        self._qkey[job.id] = key
        self._qjobs[job.id] = job
        q = self._queue
        if not q or self._qkey[q[-1].id] <= key:
            q.append(job)
        else:
            pos = bisect.bisect_left(q, key, key=lambda j: self._qkey[j.id])
            q.insert(pos, job)

    def _dequeue(self, job_id: str) -> Job:
        """Remove a queued job (usually the head) for a start."""
        q = self._queue
        qkey = self._qkey
        del self._qjobs[job_id]
        if q[0].id == job_id:
            del qkey[job_id]
            return q.pop(0)
        pos = bisect.bisect_left(q, qkey[job_id], key=lambda j: qkey[j.id])
        job = q[pos]
        if job.id != job_id:  # pragma: no cover - the key order is a total order
            raise SimulationError(time=self.now, problem=f"queue order broken at {job_id}")
        del q[pos]
        del qkey[job_id]
        return job

    def _new_run(self, job_id: str, tier: Tier, cores: tuple[int, ...]) -> _Run:
        """Take a queued job out of the queue into a new run (not placed yet)."""
        idx = self._qkey[job_id][1]  # (submit, position): the queue key knows the job's position
        now = self.now
        run = _Run(idx, self._dequeue(job_id), tier, cores, now)
        self._runs[job_id] = run
        first = self._first_start
        if first[idx] != first[idx]:  # NaN: first start
            first[idx] = now
            if tier is not _FG:
                self._first_bg[idx] = 1
        return run

    def _killed(self, run: _Run, requeue: bool) -> None:
        """A run the policy killed (out of ``_runs``, slots already freed): its progress is lost (counted in
        ``wasted_work``); with ``requeue`` the job waits again, else it is cancelled for good."""
        run.settle(self.now)
        self._version += 1
        run.version = -1
        self._policy_kills += 1
        self._job_kills[run.idx] += 1
        self._wasted += run.p0 * run.width
        if requeue:
            self._enqueue(run.idx, run.job)
        else:  # cancelled for good: no end time, left out of the metrics
            self._dropped_by_policy[run.idx] = 1
            self.dropped["killed by the policy"] = self.dropped.get("killed by the policy", 0) + 1
            self._done += 1

    def _held_count(self, run: _Run) -> None:
        """Add the core-seconds the run's slots were held since the last count (none while checkpointed),
        before its slots change (a move, checkpoint, resize or task boundary) and when it ends."""
        held, at, idx, now = self._held, self._held_at, run.idx, self.now
        if held is not None:
            held[idx] += (0 if run.checkpointed else len(run.cores)) * (now - at[idx])
            at[idx] = now

    def _complete(self, run: _Run) -> None:
        idx = run.idx
        if self._held is not None:
            self._held_count(run)
        jid = run.job.id
        del self._runs[jid]
        if self._pending.pop(jid, None) is None:
            del self._snaps[jid]
        self._vacate(run)
        run.version = -1
        self._end[idx] = self.now
        if self._usage_col is not None:  # a compact usage column: nothing reads a finished job's tuple
            self._usage[idx] = None  # type: ignore[call-overload]
        if self._overrun[idx]:
            self._est_killed[idx] = 1
        self._done += 1
