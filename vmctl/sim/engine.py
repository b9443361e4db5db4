"""The discrete-event simulator behind ``vmctl sim``: a simulated cluster, a virtual clock, and the very
same policy objects the daemon runs.

Model. The machine has ``cores`` processors, each with the VM levels its *execution model* offers
(:mod:`vmctl.sim.execution`; by default the two-tier model: an fg slot and a bg slot, MEASY sec. 2.1).
A job runs one process per core, all on one level. A rigid job needs ``work = min(run_time,
estimate)`` seconds of dedicated-core work: a job still running when it has received its estimate is
killed there (as production EASY does), and counts as an *estimate kill*. How fast a job advances is
the model's ``rate`` (two-tier: :mod:`vmctl.progress`); rates are piecewise constant, so each
running job has one pending completion event in a heap, invalidated lazily (a version number per
change) when its rate changes.

One instant. At time ``t`` the engine (1) completes every job whose completion event is due, (1b)
fires the model's own event due at ``t`` (a time-slice boundary), (2) adds every job submitted at
``t`` to the queue, (3) calls ``policy.decide(view, t)`` once, (4) checks the decision (always: with
the checker's fast path :func:`vmctl.policies.invariants.accepts_fast` on the two-tier engine, else
:func:`vmctl.policies.invariants.check_decision`, which returns the overlay of the one occupancy model
with the effect of each action), and (5) commits it: the effects, in order (or, for a decision the
fast path accepted, its starts). Steps (3)-(5) are skipped when ``policy.cannot_act(view)`` is True: by
its contract the decision would have no actions and no ``wake_at`` (counted in
``SimResult.skipped_passes``). An instant with only a model event is not a pass at all. A decision's
``wake_at`` schedules another pass at that time; a later decision replaces it (policies are stateless,
so the latest decision is the one that knows what it waits for).

The view. ``ClusterView`` is built once and stays a *live* view of the engine's incrementally
maintained structures: the queue (a list in queue order: submit time, then position in the workload,
which is the job id order of a sorted trace), ``fg_job``/``bg_job``/``fg_util`` lists (every level's
``slot_job`` list), the ``idle_fg``/``idle_bg`` (``idle``) sets. ``running`` is a mapping over
``RunningJob`` snapshots rebuilt only when a job's placement changes, with live progress. Nothing is
copied per event beyond what the policy reads. Starting a queued job removes it from the queue list by
bisection.

Two engines, one per module, chosen by the execution model in ``Simulator.__init__`` (which binds the
chosen engine's ``_reschedule``/``_vacate``; ``Simulator`` mixes both in, the loop here is shared):

- :mod:`vmctl.sim.engine_twotier`, the two-tier model (fg/bg slots, the priority discipline, capped
  shared VMs): the *fast path* for decisions of starts on free slots, effects for the rest (moves
  in place or onto other cores, kills, shared VMs; suspend/checkpoint/restore raise
  :class:`SimulationError`);
- :mod:`vmctl.sim.engine_levels`, every other model: any number of levels, every effect kind
  (Suspend/Resume: rate 0, slots kept; Checkpoint: slots freed, progress kept; Restore or a Move back
  onto slots; move costs paid in time the job would advance; task bags' resizes and rows).

What both share (state, queue, kills, completions) is :mod:`vmctl.sim.engine_base`.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import itertools
import math
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import Any, Literal

import numpy as np

from vmctl.errors import SimulationError, ValidationError
from vmctl.model import ClusterView, Decision, Job, RunningJob
from vmctl.policies.base import Offer, SchedulingPolicy
from vmctl.policies.invariants import accepts_fast, check_decision
from vmctl.progress import ProgressModel
from vmctl.sim import metrics as metrics_mod
from vmctl.sim.engine_base import _Run
from vmctl.sim.engine_lean import LeanEngine
from vmctl.sim.engine_levels import LevelEngine
from vmctl.sim.engine_twotier import TwoTierEngine
from vmctl.sim.execution import ExecutionModel, TwoTierModel, WorkloadRecord
from vmctl.sim.execution import shared_rate as shared_rate
from vmctl.sim.timeslice import TimeSliceModel
from vmctl.sim.workloads.core import JobTable, UsageColumn

_EPS = 1e-9
_INF = math.inf
#: what the simulated cluster offers a policy under its default execution model (the two-tier model,
#: :class:`~vmctl.sim.execution.TwoTierModel`): 2 levels per core under the priority discipline, rigid
#: jobs, and capped shared VMs (vcsched; each core is then a one-core node, or ``SimConfig.cores_per_node``
#: cores make one). Another model offers what
#: its ``offer()`` says (``SimConfig.execution``).
SIM_OFFER: Offer = TwoTierModel().offer()


def _job_maker() -> Callable[[str, float, int, float, tuple[float, ...] | None, int, str], Job]:
    """A ``Job`` constructor without ``Job.__post_init__`` for jobs the simulator has already
    validated (``Simulator._validate_jobs``): it fills the slots through their member descriptors,
    which costs half of the frozen dataclass ``__init__``. Guarded: if ``Job`` gains or reorders a
    field, this fails at import time instead of building incomplete jobs."""
    names = tuple(f.name for f in dataclasses.fields(Job))
    expected = ("id", "submit_time", "procs", "estimate", "cpu_usage", "priority", "deadline", "user", "mem",
                "cpu_need")
    if names != expected:  # pragma: no cover - a tripwire for whoever changes Job
        raise RuntimeError(f"vmctl.sim.engine._job_maker knows Job fields {expected}, Job has {names}")
    defaults = {f.name: f.default for f in dataclasses.fields(Job)}
    d = {name: Job.__dict__[name].__set__ for name in names}
    s_id, s_submit, s_procs, s_est, s_usage = d["id"], d["submit_time"], d["procs"], d["estimate"], d["cpu_usage"]
    s_prio, s_deadline, s_user, s_mem, s_need = d["priority"], d["deadline"], d["user"], d["mem"], d["cpu_need"]
    deadline, mem, need = defaults["deadline"], defaults["mem"], defaults["cpu_need"]
    new = object.__new__

    def make(job_id: str, submit: float, procs: int, estimate: float, usage: tuple[float, ...] | None,
             priority: int, user_name: str) -> Job:
        job: Job = new(Job)
        s_id(job, job_id)
        s_submit(job, submit)
        s_procs(job, procs)
        s_est(job, estimate)
        s_usage(job, usage)
        s_prio(job, priority)
        s_deadline(job, deadline)
        s_user(job, user_name)
        s_mem(job, mem)
        s_need(job, need)
        return job

    return make


_make_job = _job_maker()
_ID, _SUBMIT, _PROCS = attrgetter("id"), attrgetter("submit"), attrgetter("procs")
_ESTIMATE, _RUN_TIME, _USAGE = attrgetter("estimate"), attrgetter("run_time"), attrgetter("cpu_usage")


def _column(records: Sequence[Any], name: str, default: Any) -> list[Any]:
    """``getattr(r, name, default)`` of every record (C-level when every record has the field)."""
    try:
        return list(map(attrgetter(name), records))
    except AttributeError:
        return [getattr(r, name, default) for r in records]


#: what the engine needs from a workload record (``vmctl.sim.workloads.core.WorkloadJob``)
WorkloadJobLike = WorkloadRecord


CpuUsageMode = Literal["paper", "full"]


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Knobs of one simulation run.

    - ``seed``: seeds every random draw of the progress model (per job, see ``progress.py``).
    - ``cpu_usage``: ``paper`` uses the workload's per-process usage (sec. 3.1; a job without one runs
      at 100 %); ``full`` sets every process to 100 % (sec. 3.5.2).
    - ``cpu_info``: when False the policy sees ``Job.cpu_usage = None`` (sec. 3.5.1).
    - ``two_tier``: run on the two-tier architecture (fg loss applies); None = whether the policy
      needs it (``policy.needs.two_tier``: 2 levels under the priority discipline).
    - ``batches``: number of batches for the batch-means confidence intervals.
    - ``execution``: makes the run's execution model (:mod:`vmctl.sim.execution`; one model object
      per simulator); None = the two-tier model with ``two_tier`` and ``progress`` above.
    - ``cores_per_node``: capped shared VMs (vcsched) only: how many consecutive cores make one node
      (default 1: every core is a one-core node ``core<i>``, the paper's hosts; more: nodes ``n0``,
      ``n1`` ... of that many cores, whose caps sum to at most their cores, as vmctld's nodes). A job's
      need and cap are fractions of one core either way (issue 22). ``cores`` must be a multiple.
    """

    seed: int = 1
    cpu_usage: CpuUsageMode = "paper"
    cpu_info: bool = True
    two_tier: bool | None = None
    progress: ProgressModel = field(default_factory=ProgressModel)
    batches: int = metrics_mod.DEFAULT_BATCHES
    execution: Callable[[], ExecutionModel] | None = None
    cores_per_node: int = 1


@dataclass(frozen=True, slots=True)
class SimResult:
    """Outcome of one run: metrics plus counters. Seconds are plain floats."""

    policy: str
    params: dict[str, object]
    cores: int
    jobs: int
    dropped: dict[str, int]
    metrics: metrics_mod.Metrics
    migrations: int
    estimate_kills: int
    policy_kills: int
    decisions: int
    wasted_work: float
    seed: int
    source: str = ""
    #: passes (counted in ``decisions``) where ``policy.cannot_act(view)`` held, so ``decide`` and the
    #: check were skipped; not in ``to_dict`` (an implementation detail, results do not depend on it)
    skipped_passes: int = 0
    #: time-sliced runs (the timeslice execution model with 2 levels or more): the metrics of paper 004
    #: sec. 3; in ``to_dict`` as ``gang`` only when present (other runs' output is unchanged)
    gang: metrics_mod.GangMetrics | None = None

    def to_dict(self) -> dict[str, object]:
        m = self.metrics

        def ci(i: metrics_mod.Interval | None) -> dict[str, float | int] | None:
            return None if i is None else i.to_dict()

        doc: dict[str, object] = {
            "source": self.source,
            "policy": self.policy,
            "params": dict(self.params),
            "cores": self.cores,
            "seed": self.seed,
            "jobs": self.jobs,
            "dropped": dict(self.dropped),
            "avg_wait": m.avg_wait,
            "avg_response": m.avg_response,
            "avg_bounded_slowdown": m.avg_bounded_slowdown,
            "utilization": m.utilization,
            "makespan": m.makespan,
            "migrations": self.migrations,
            "kills": {"estimate": self.estimate_kills, "policy": self.policy_kills},
            "wasted_work": self.wasted_work,
            "decisions": self.decisions,
            "ci95": {
                "avg_response": ci(m.ci_response),
                "avg_bounded_slowdown": ci(m.ci_bounded_slowdown),
                "avg_wait": ci(m.ci_wait),
            },
        }
        if self.gang is not None:
            doc["gang"] = self.gang.to_dict()
        return doc


class _RunningView(Mapping[str, RunningJob]):
    """Live ``ClusterView.running``: a read-only face of the simulator's dict of snapshots. The fast
    path's fg starts leave their snapshot to be built when the view is first read (``pending``, issue
    27: a job that starts and ends between two reads of ``running`` never needs one); every read builds
    the pending ones first, in start order, so the mapping and its order are the ones built eagerly."""

    __slots__ = ("_build", "_pending", "_snaps")

    def __init__(self, snaps: dict[str, RunningJob], pending: dict[str, Any] | None = None,
                 build: Callable[[], None] | None = None) -> None:
        self._snaps = snaps
        self._pending = pending if pending is not None else {}
        self._build = build

    def _all(self) -> dict[str, RunningJob]:
        if self._pending and self._build is not None:
            self._build()
        return self._snaps

    def __getitem__(self, key: str) -> RunningJob:
        return (self._all() if self._pending else self._snaps)[key]

    def get(self, key: str, default: Any = None) -> Any:
        return (self._all() if self._pending else self._snaps).get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._all() if self._pending else self._snaps)

    def __len__(self) -> int:
        return len(self._snaps) + len(self._pending)

    def __contains__(self, key: object) -> bool:
        return key in self._snaps or key in self._pending

    def keys(self) -> Any:
        return (self._all() if self._pending else self._snaps).keys()

    def values(self) -> Any:
        return (self._all() if self._pending else self._snaps).values()

    def items(self) -> Any:
        return (self._all() if self._pending else self._snaps).items()


ProgressCallback = Callable[[int, int], None]


class Simulator(LeanEngine, TwoTierEngine, LevelEngine):
    """Run one policy over one workload. ``jobs`` must be sorted by submit time (ties keep their order);
    jobs wider than the machine are dropped and counted in ``dropped``."""

    def __init__(
        self,
        jobs: Iterable[WorkloadJobLike],
        cores: int,
        policy: SchedulingPolicy,
        config: SimConfig | None = None,
        source: str = "",
        dropped: Mapping[str, int] | None = None,
    ) -> None:
        if not isinstance(jobs, Sequence):  # any iterable of records (a generator, a progress wrapper ...)
            jobs = list(jobs)
        if cores <= 0:
            raise ValidationError(field="cores", problem=f"must be > 0, got {cores}")
        self.config = config or SimConfig()
        self.policy = policy
        self.cores = cores
        self.source = source
        self.dropped: dict[str, int] = dict(dropped or {})
        cfg = self.config
        self.two_tier = policy.needs.two_tier if cfg.two_tier is None else cfg.two_tier
        model = cfg.execution() if cfg.execution is not None else TwoTierModel(self.two_tier, cfg.progress)
        offer = model.offer()
        offer.check(policy)
        self.model = model
        # the priority discipline of the two-tier model runs on the fg/bg fast path; every other model on
        # the levelled path (any number of levels, actions applied through the one occupancy model)
        self._leveled = not isinstance(model, TwoTierModel)
        if isinstance(model, TwoTierModel):
            if model.two_tier is None:
                model.two_tier = self.two_tier
            self.two_tier = model.two_tier
        # the workload's columns: straight from a ``JobTable`` (a trace read by ``read_swf``: no record
        # objects at all, issue 27), else read with C-level attribute getters (a 200,000-job trace pays
        # for every Python-level step per job here)
        table = jobs if isinstance(jobs, JobTable) else None
        if table is not None:
            wide = table.procs > cores
            if wide.any():
                self.dropped["wider than the machine"] = self.dropped.get("wider than the machine", 0) + int(
                    wide.sum())
                table = table.select(~wide)
            kept: Sequence[Any] = table
            all_procs = table.procs.tolist()
        else:
            all_procs = list(map(_PROCS, jobs))
            if all_procs and max(all_procs) > cores:
                keep = [p <= cores for p in all_procs]
                kept = list(itertools.compress(jobs, keep))
                all_procs = list(itertools.compress(all_procs, keep))
                self.dropped["wider than the machine"] = self.dropped.get("wider than the machine", 0) + (
                    len(jobs) - len(kept)
                )
            else:
                kept = list(jobs)
        n = len(kept)
        self.n = n
        sub_np = table.submit if table is not None else np.fromiter(map(float, map(_SUBMIT, kept)), np.float64, n)
        # (an ``array('d')``: 8 bytes a job, a list of floats 32)
        self._submit = array("d", sub_np.tobytes())
        unsorted = np.flatnonzero(sub_np[1:] < sub_np[:-1])
        del sub_np
        if unsorted.size:  # (NaN times compare as unordered; they pass, as they always did)
            raise ValidationError(field=f"job {kept[int(unsorted[0]) + 1].id}.submit",
                                  problem="jobs must be sorted by submit time")
        self._src = kept
        # the records' own ids; a job's id as the policy sees it (``Job.id``) is ``str`` of it, made when
        # the job arrives (``_jid``), so no string per job is kept for the whole run (issue 27: 12 MB on HPC2N)
        # (integer ids in an ``array('q')``: 8 bytes a job, where a list of ints holds 36)
        self._rid: Sequence[Any]
        if table is not None:
            self._rid = array("q", table.id.tobytes())
            unique = len(np.unique(table.id)) == n
        else:
            rid = list(map(_ID, kept))
            ints = all(type(r) is int for r in rid)
            unique = len(set(rid if ints else map(str, rid))) == n
            self._rid = array("q", rid) if ints and (not rid or -2**63 <= min(rid) <= max(rid) < 2**63) else rid
            del rid
        if not unique:
            raise ValidationError(field="workload", problem="job ids are not unique")
        self._index_map: dict[str, int] | None = None  # id -> position, built when first asked (outcome)
        # estimates, work and whether the run time exceeds the estimate (a kill at the estimate) as
        # machine numbers (issue 27: a list of floats is 32 bytes a job, an ``array('d')`` 8)
        if table is not None:
            est_np, run_np = table.estimate, table.run_time
        else:
            est_np = np.fromiter(map(float, map(_ESTIMATE, kept)), dtype=np.float64, count=n)
            run_np = np.fromiter(map(float, map(_RUN_TIME, kept)), dtype=np.float64, count=n)
        self._estimate = array("d", est_np.tobytes())
        self._work = array("d", np.minimum(run_np, est_np).tobytes())
        self._overrun = bytearray((run_np > est_np).tobytes())
        del est_np, run_np
        self._procs = array("i", map(int, all_procs))  # (4 bytes a job where a list holds 8, issue 27)
        # what the policy sees of who submitted a job and how urgent it is (traces carry no deadline):
        # the workload's priority and user id ("" when unknown; one string object per user)
        self._priority: Sequence[int] = (array("q", table.priority.tobytes()) if table is not None
                                         else _column(kept, "priority", 0))
        users = table.user.tolist() if table is not None else _column(kept, "user", -1)
        user_names = {u: str(u) if u >= 0 else "" for u in set(users)}
        self._user_name = list(map(user_names.__getitem__, users))
        # deadlines the workload gives (id -> time; most sources give none, and then nothing is paid)
        self._deadline_of: dict[str, float] = {} if table is not None else {
            jid: float(d) for jid, d in zip(map(str, self._rid), _column(kept, "deadline", None), strict=True)
            if d is not None}
        full = self.config.cpu_usage == "full"
        # a job without usage (SWF) runs every process at 100 %: one shared all-ones tuple per width
        ones: dict[int, tuple[float, ...]] = {}
        self._usage: list[tuple[float, ...]] = []
        given: list[int] = []  # positions of the usage the workload gave (validated below)
        # a columnar trace's compact usage (``UsageColumn``: ``vmctl sim run --trace``, issue 27) under the
        # two-tier model: a job's tuple is built a block of jobs ahead of its arrival (``_run``) and dropped
        # when it ends (``_complete``), so the run never holds every job's tuple (its values come from the
        # usage grid: all in (0, 1], nothing to validate)
        col = table.cpu_usage if table is not None else None
        self._usage_col = col if isinstance(col, UsageColumn) and not full and not self._leveled else None
        if self._usage_col is not None:
            self._usage = [None] * n  # type: ignore[list-item]  # filled ahead of the arrivals
        append = self._usage.append
        given_usage: Iterable[tuple[float, ...] | None] = (
            map(_USAGE, kept) if table is None else repeat(None) if table.cpu_usage is None else table.cpu_usage)
        for i, (u, procs) in enumerate(zip(given_usage, self._procs if self._usage_col is None else (),
                                           strict=False)):
            if full or u is None:
                one = ones.get(procs)
                if one is None:
                    one = ones[procs] = (1.0,) * procs
                append(one)
            else:
                if len(u) != procs:
                    raise ValidationError(field=f"job {kept[i].id}.cpu_usage",
                                          problem=f"{len(u)} entries for {procs} processes")
                append(tuple(u))
                given.append(i)
        self._validate_jobs(given)
        self._width = array("i", self._procs)  # the width each job last started with (moldable, task bags)
        # per-job outcomes
        self._first_start = array("d", [math.nan]) * n
        self._end = array("d", [math.nan]) * n
        self._est_killed = bytearray(n)
        # per-job history for ``job_rows`` (vmctl sim run --jobs-out): first tier, tier changes (promote,
        # demote, a migration to the other tier), migrations, policy kills; only the rare actions pay
        self._first_bg = bytearray(n)
        # (sparse counters: most runs change no job's tier, and 3 arrays were 2.4 MB over HPC2N, issue 27)
        self._tier_changes: Counter[int] = Counter()
        self._job_migrations: Counter[int] = Counter()
        self._job_kills: Counter[int] = Counter()
        self._dropped_by_policy = bytearray(n)
        self._migrations = 0
        self._policy_kills = 0
        self._wasted = 0.0
        self._migration_loss = 0.0  # levelled path: core-seconds of no progress paid for migrations (cost x width)
        self._decisions = 0
        self._skipped = 0
        # cluster state
        self.now = 0.0
        self._queue: list[Job] = []
        self._qkey: dict[str, tuple[float, int]] = {}
        self._qjobs: dict[str, Job] = {}  # the view's queue_index: exactly the jobs in _queue
        self._runs: dict[str, _Run] = {}
        self._snaps: dict[str, RunningJob] = {}
        self._pending: dict[str, _Run] = {}  # fast-path fg starts whose snapshot is built when first read
        self._fg_job: list[str | None] = [None] * cores
        self._bg_job: list[str | None] = [None] * cores
        self._fg_run: list[_Run | None] = [None] * cores
        self._bg_run: list[_Run | None] = [None] * cores
        self._fg_util: list[float] = [0.0] * cores
        self._idle_fg: set[int] = set(range(cores))
        self._idle_bg: set[int] = set(range(cores))
        self._usable = [True] * cores
        self._heap: list[tuple[float, int, _Run]] = []  # (time, version, run); versions are unique
        self._version = 0
        self._dirty: dict[int, _Run] = {}
        self._bg_count = 0  # jobs in the bg tier (fg changes need no bg rate updates when 0)
        # fast path: ``_fg_run`` is maintained from the first bg placement on (``_keep_fg_run``)
        self._fg_run_kept = not isinstance(model, TwoTierModel)
        self._wake: float | None = None
        self._released = False  # a task bag gave up a slot at a task boundary: the policy gets a pass
        self._done = 0
        # capped shared VMs (policies that need them): every core is a one-core node "core<i>", or
        # ``cores_per_node`` consecutive cores make a node "n<k>" (a shared VM stands on its node's first core)
        self._shared = policy.needs.shared_vms
        per = cfg.cores_per_node
        if per < 1 or cores % per:
            raise ValidationError(field="cores_per_node", problem=f"must be >= 1 and divide the {cores} cores, "
                                                                  f"got {per}")
        if per == 1:
            names = [f"core{c}" for c in range(cores)] if self._shared else []
        else:
            names = [f"n{c // per}" for c in range(cores)] if self._shared else []
        self._node_core: dict[str, int] = {}
        for c, name in enumerate(names):
            self._node_core.setdefault(name, c)
        # every level's occupancy: levels 0 and 1 are the fg/bg lists, further levels (levelled path) follow
        levels = offer.levels
        upper = range(max(0, levels - 2))
        none_jobs: list[list[str | None]] = [[None] * cores for _ in upper]
        none_runs: list[list[_Run | None]] = [[None] * cores for _ in upper]
        self._slot_job: list[list[str | None]] = [self._fg_job, self._bg_job, *none_jobs]
        self._slot_run: list[list[_Run | None]] = [self._fg_run, self._bg_run, *none_runs]
        self._idle: list[set[int]] = [self._idle_fg, self._idle_bg, *(set(range(cores)) for _ in upper)]
        del self._slot_job[levels:], self._slot_run[levels:], self._idle[levels:]
        if self._leveled:
            local = [c % per for c in range(len(names))]
            node_maps = model.nodes(cores) or {"node_of_core": names, "local_core": local,
                                               "node_names": list(dict.fromkeys(names))}
            self.view = ClusterView.leveled(
                cores, self._queue, _RunningView(self._snaps), self._slot_job, self._idle, offer.discipline,
                self._fg_util, self._usable, queue_index=self._qjobs, shapes=model.shapes, **node_maps,
            )
        else:
            self.view = ClusterView(
                total_cores=cores,
                queue=self._queue,
                running=_RunningView(self._snaps, self._pending, self._build_pending),
                fg_job=self._fg_job,
                bg_job=self._bg_job,
                idle_fg=self._idle_fg,
                idle_bg=self._idle_bg,
                fg_util=self._fg_util,
                usable=self._usable,
                queue_index=self._qjobs,
                node_of_core=names,
                local_core=[c % per for c in range(len(names))],
                node_names=list(dict.fromkeys(names)),
            )
        # what the execution model reads (``vmctl.sim.execution.EngineState``): live, never copied
        self.records: Sequence[WorkloadRecord] = kept
        self.seed = self.config.seed
        self.job_work: Sequence[float] = self._work
        self.job_usage: Sequence[tuple[float, ...]] = self._usage
        self.slot_run: Sequence[Sequence[_Run | None]] = self._slot_run
        self.runs: Mapping[str, _Run] = self._runs
        self.fg_util = self._fg_util
        # the metrics' run length of each job (``ExecutionModel.span``), when the model defines one
        self._span: list[float] | None = (list(self._work) if self._leveled and type(model).span is not
                                          ExecutionModel.span else None)
        # the core-seconds each run's slots were held (the utilization's count for a run whose width
        # changed, a resized task bag): ``_held`` so far, as of ``_held_at``; ``_resized`` flags those runs
        self._held: list[float] | None = None
        self._held_at: list[float] = []
        self._resized = bytearray(0)
        if self._leveled:
            self._held, self._held_at, self._resized = [0.0] * n, [0.0] * n, bytearray(n)
        # the engine: the two-tier engine (the fast path) for the two-tier model, the levelled one for
        # every other (vmctl.sim.engine_twotier, vmctl.sim.engine_levels)
        if self._leveled:
            # the trace's work stays what models read; ``_work`` becomes each job's work in its latest run
            self.job_work = list(self._work)
            self._reschedule, self._vacate = self._reschedule_leveled, self._vacate_leveled
        else:
            self._reschedule, self._vacate = self._reschedule_two_tier, self._vacate_two_tier
        model.bind(self)
        self._rate = model.rate
        if isinstance(model, TwoTierModel):
            self._loss = model.loss  # the fg rate, inlined on the fast path

    def _validate_jobs(self, given_usage: list[int]) -> None:
        """The rules of ``Job.__post_init__``, checked once for the whole workload: jobs are then built
        by :func:`_make_job`, which skips them (the engine's hottest allocation). ``given_usage``: the
        positions whose usage the workload gave (the all-ones tuples built here need no check)."""
        if self.n and min(self._procs) <= 0:
            i = next(i for i, p in enumerate(self._procs) if p <= 0)
            raise ValidationError(field=f"job {self._rid[i]}.procs", problem=f"must be > 0, got {self._procs[i]}")
        est = np.asarray(self._estimate, dtype=np.float64)
        bad = ~((est > 0) & np.isfinite(est))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValidationError(field=f"job {self._rid[i]}.estimate",
                                  problem=f"must be a positive number, got {self._estimate[i]}")
        for i in given_usage:
            usage = self._usage[i]
            if usage.count(1.0) == len(usage):  # counted in C
                continue
            for u in usage:
                if not 0.0 < u <= 1.0:
                    raise ValidationError(field=f"job {self._rid[i]}.cpu_usage", problem=f"{u} not in (0, 1]")

    # ------------------------------------------------------------------ main loop

    def run(self, on_progress: ProgressCallback | None = None, every: int = 2000) -> SimResult:
        """Run to the end. The cyclic garbage collector is paused meanwhile: the loop allocates many
        short-lived acyclic objects (jobs, snapshots, heap entries) that reference counting frees, and
        the collector would otherwise rescan the live structures again and again."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            if (self.lean_loop and self.lazy_snapshots and not self._leveled and not self.two_tier and not self._shared
                    and not self.model.has_events and not self._deadline_of):
                # every fg run at rate 1: the lean loop (vmctl.sim.engine_lean; the same run, pass by pass)
                self._run_lean(on_progress, every, accepts_fast)
                return self._finish(on_progress)
            return self._run(on_progress, every)
        finally:
            if was_enabled:
                gc.enable()

    def _run(self, on_progress: ProgressCallback | None, every: int) -> SimResult:
        n = self.n
        submit = self._submit
        heap = self._heap
        ai = 0
        policy = self.policy
        view = self.view
        cpu_info = self.config.cpu_info
        next_report = every
        heappop = heapq.heappop
        rid, procs, estimate, usage = self._rid, self._procs, self._estimate, self._usage
        priority, user_name = self._priority, self._user_name
        complete, enqueue, decide = self._complete, self._enqueue, policy.decide
        # the two-tier engine applies decisions of starts on free slots directly (``accepts_fast``, whose
        # effects are known: ``tests/unit/test_effects.py``); every other decision is committed from the
        # checker's overlay, whose effects say what each action did
        fast: Callable[[ClusterView, Decision, float], bool] | None = None if self._leveled else accepts_fast
        apply_starts, commit = self._apply_starts, self._apply_leveled if self._leveled else self._commit_effects
        queue, qkey, qjobs = self._queue, self._qkey, self._qjobs
        # model-internal events (time-slice boundaries ...): asked on every turn only when the model has any
        events = self.model.has_events
        next_event, on_event = self.model.next_event, self.model.on_event
        te = _INF
        done0 = ai0 = 0
        cannot_act = policy.cannot_act
        dirty = self._dirty
        make_job = _make_job
        # a compact usage column: tuples built a block ahead of the arrivals (``fill`` = the first job without)
        usage_col = self._usage_col
        fill = 0 if usage_col is not None else n
        if self._shared:  # a job's CPU need (vcsched) is its processes' peak usage, when the policy may know it
            def make_job(jid: str, submit: float, procs: int, estimate: float,
                         usage: tuple[float, ...] | None, priority: int, user: str) -> Job:
                job = _make_job(jid, submit, procs, estimate, usage, priority, user)
                if usage is not None:
                    object.__setattr__(job, "cpu_need", max(usage))
                return job
        if self._deadline_of:  # a workload that gives deadlines: the policy sees them as ``Job.deadline``
            deadline_of, plain_make = self._deadline_of, make_job

            def make_job(jid: str, submit: float, procs: int, estimate: float,
                         usage: tuple[float, ...] | None, priority: int, user: str) -> Job:
                job = plain_make(jid, submit, procs, estimate, usage, priority, user)
                d = deadline_of.get(jid)
                if d is not None:
                    object.__setattr__(job, "deadline", d)
                return job
        while True:
            # next event time
            while heap and heap[0][2].version != heap[0][1]:
                heappop(heap)
            t = heap[0][0] if heap else _INF
            if ai < n and submit[ai] < t:
                t = submit[ai]
            wake = self._wake
            if wake is not None and wake < t:
                t = wake
            if events:
                te = next_event()
                if te < t:
                    t = te
                done0, ai0 = self._done, ai
            if t == _INF:
                break
            if t > self.now:
                self.now = t
            now = self.now
            # (1) completions
            due = now + _EPS
            while heap and heap[0][0] <= due:
                _, ver, r = heappop(heap)
                if r.version == ver:
                    complete(r)
            if events and te <= due:  # the model's own event, after the completions due now
                for r in on_event(now):
                    dirty[r.idx] = r
            if dirty:
                self._flush_dirty()
            # (2) arrivals: ``_enqueue``, its usual case (after the queue's last job) inlined
            while ai < n and submit[ai] <= now:
                if ai >= fill:
                    fill = min(ai + 4096, n)
                    usage[ai:fill] = usage_col.block(ai, fill)  # type: ignore[union-attr]
                jid = str(rid[ai])
                job = make_job(jid, submit[ai], procs[ai], estimate[ai], usage[ai] if cpu_info else None,
                               priority[ai], user_name[ai])
                key = (submit[ai], ai)
                if queue and qkey[queue[-1].id] > key:
                    enqueue(ai, job)
                else:
                    qkey[jid] = key
                    qjobs[jid] = job
                    queue.append(job)
                ai += 1
            if events and self._done == done0 and ai == ai0 and (wake is None or wake > due) and not self._released:
                continue  # a model event alone: the policy is not called (it asks with wake_at), unless
                # it freed a slot (a Resize gave it up, or a task bag's worker has no task left: the dispatcher
                # hands the freed worker on, paper 001)
            self._released = False
            # (3) one scheduling pass (a due wake-up is consumed by it: the decision sets the next one)
            self._decisions += 1
            if cannot_act(view):
                # By the contract of ``cannot_act`` the decision would have no actions and no wake_at:
                # applying it would only flush the dirty state and clear the wake-up.
                self._skipped += 1
                if self._dirty:
                    self._flush_dirty()
                self._wake = None
            else:
                decision = decide(view, now)
                if fast is not None and fast(view, decision, now):
                    apply_starts(decision)
                else:
                    commit(decision, check_decision(view, decision, now))
                w = decision.wake_at
                self._wake = w if w is not None and w > due else None
            if on_progress is not None and self._done >= next_report:
                on_progress(self._done, n)
                next_report = self._done + every
        return self._finish(on_progress)

    def _finish(self, on_progress: ProgressCallback | None) -> SimResult:
        """After the loop: nothing may be left waiting or running; the result."""
        policy = self.policy
        if self._queue or self._runs:
            raise SimulationError(
                time=self.now,
                problem=f"policy {policy.name!r} left {len(self._queue)} job(s) waiting and {len(self._runs)} "
                f"running with nothing left to happen (first waiting: {self._queue[0].id if self._queue else '-'})",
            )
        if on_progress is not None:
            on_progress(self._done, self.n)
        return self._result()

    def _result(self) -> SimResult:
        n = self.n
        arrays = {
            "submit": np.asarray(self._submit, dtype=np.float64),
            "first_start": np.frombuffer(self._first_start, dtype=np.float64) if n else np.zeros(0),
            "end": np.frombuffer(self._end, dtype=np.float64) if n else np.zeros(0),
            "run": np.asarray(self._work if self._span is None else self._span, dtype=np.float64),
            "procs": np.asarray(self._width, dtype=np.float64),
        }
        held = self._held
        core_time = None if held is None else np.asarray(
            [held[i] if flag else math.nan for i, flag in enumerate(self._resized)], dtype=np.float64)
        m = metrics_mod.compute(**arrays, cores=self.cores, batches=self.config.batches, core_time=core_time)
        gang = None
        # paper 004 sec. 3, for time-sliced runs (one row is a dedicated machine: its results are the one-tier
        # results, unchanged); T is the schedule's period at the end
        if isinstance(self.model, TimeSliceModel) and self.model.levels >= 2:
            mpl = self.policy.params.get("mpl", self.model.levels)
            gang = metrics_mod.gang(**arrays, cores=self.cores, slice_s=self.model.schedule.period,
                                    mpl=int(mpl), capacity_lost=self._migration_loss, migrations=self._migrations)
        return SimResult(
            policy=self.policy.name,
            params=self.policy.reported_params(),
            cores=self.cores,
            jobs=m.jobs,
            dropped=dict(self.dropped),
            metrics=m,
            migrations=self._migrations,
            estimate_kills=int(sum(self._est_killed)),
            policy_kills=self._policy_kills,
            decisions=self._decisions,
            skipped_passes=self._skipped,
            wasted_work=self._wasted,
            seed=self.config.seed,
            source=self.source,
            gang=gang,
        )

    # ------------------------------------------------------------------ per-job outcomes (tests, reports)

    def outcome(self, job_id: str) -> tuple[float, float]:
        """(first start, end) of a job after ``run``; NaN when it never started / ended."""
        if self._index_map is None:
            self._index_map = dict(zip(map(str, self._rid), range(self.n), strict=True))
        i = self._index_map[job_id]
        return self._first_start[i], self._end[i]

    def job_rows(self) -> Iterator[dict[str, Any]]:
        """One record per job after ``run``, in workload order (what Batsim writes as ``jobs.csv``):
        id, user, submit, start (first start), end, width (processes), wait (start - submit), first tier,
        tier changes, migrations, policy kills (each a restart from scratch) and ``killed``: ``estimate``
        (stopped at its estimate: the trace's run time was longer), ``policy`` (killed for good by the
        policy) or empty. Times are simulation seconds; a job that never started has NaN times."""
        src = self._src
        users = src.user.tolist() if isinstance(src, JobTable) else None
        for i in range(self.n):
            start, end = self._first_start[i], self._end[i]
            killed = "policy" if self._dropped_by_policy[i] else ("estimate" if self._est_killed[i] else "")
            yield {
                "id": str(self._rid[i]),
                "user": users[i] if users is not None else int(getattr(src[i], "user", -1)),
                "submit": self._submit[i],
                "start": start,
                "end": end,
                "width": self._width[i],
                "wait": start - self._submit[i],
                "first_tier": ("fg", "bg", "shared")[self._first_bg[i]],
                "tier_changes": self._tier_changes[i],
                "migrations": self._job_migrations[i],
                "policy_kills": self._job_kills[i],
                "killed": killed,
            }


def simulate(
    jobs: Iterable[WorkloadJobLike],
    cores: int,
    policy: SchedulingPolicy,
    config: SimConfig | None = None,
    source: str = "",
    dropped: Mapping[str, int] | None = None,
    on_progress: ProgressCallback | None = None,
) -> SimResult:
    """Convenience wrapper: build a :class:`Simulator` and run it."""
    return Simulator(jobs, cores, policy, config, source, dropped).run(on_progress)
