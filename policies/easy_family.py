"""The EASY family: FCFS, EASY, SJF (one tier) and KEASY, REASY, MEASY (two tiers).

Source: the MEASY paper (``../shared/seeds/000_2116516f63e5bc7c.txt``), sec. 2.2 (KEASY,
Algorithms 1 and 2), sec. 2.3.1 (REASY, Algorithm 3), sec. 2.3.2 (MEASY), sec. 3.5.1 (no CPU usage
information). The symbols of the algorithm listings were lost in conversion; they are reconstructed
here from the prose and the Figure 1 example (reproduced in ``tests/unit/test_policies_easy_figure1.py``).

One tier
--------
``fcfs``  start queued jobs in queue order on idle fg slots while they fit; stop at the first one that
          does not fit (it blocks everything behind it).
``easy``  FCFS, then a reservation for the first job that does not fit (the *head*): walk the fg jobs in
          ascending ``expected_end``, adding their cores to the idle ones, until the head fits; that
          end is the *shadow time* and the surplus is the *extra* cores. A later job is backfilled when
          it fits now and either ends by the shadow time (``now + estimate <= shadow``) or needs no more
          than the extra cores (which it then consumes). Example, 5 cores, J1 (2 cores, 10 s) running:
          head J2 needs 4 -> shadow 10, extra 1; J3 (2 cores, 5 s) ends at 5 <= 10 -> start; J4 (1 core,
          11 s) ends after 10 but 1 <= extra -> start, extra 0.
``sjf``   shortest estimate first (ties by arrival), start every job that fits, no reservation. This is
          the paper's bg-tier rule (Algorithm 1 step 3) used on the fg tier alone; it can starve wide
          jobs and exists as a baseline.

Two tiers (Algorithm 1, with Deploy/Dispatch of Algorithm 2)
------------------------------------------------------------
The *merged list* holds the queued jobs and the jobs running in the bg tier, in arrival order
(submit time, then id). Every call of ``decide`` runs three steps:

1. FCFS over the merged list onto fg slots: while the next job fits the idle fg count, Deploy it.
2. Reservation for the first job that could not be deployed (EASY shadow/extra as above), then backfill
   the rest of the merged list through Deploy.
3. SJF over the jobs still *queued*: a job goes to bg slots only if all its processes fit into bg slots
   that are empty and whose core's fg utilization is under ``bg_util_threshold`` (0.96, sec. 2.1 (3)).

Deploy(j): a bg job whose own cores all have idle fg slots is promoted in place (fg/bg priorities
swapped, progress kept). Otherwise KEASY kills it and dispatches it to fg from scratch (``Kill`` then
``StartFg``), REASY cannot deploy it (the job is pinned to its cores), MEASY migrates it to fg slots
(``Migrate`` with ``migration_cost`` seconds without progress). A queued job is dispatched to fg.
MEASY migrates a job only to cores of nodes that every node it runs on can migrate to
(``ClusterView.can_migrate``; vmctld fills it from the agents' ``peers``, the simulator does not
restrict it).

Dispatch(tier, j): j's processes sorted by descending estimated CPU usage are paired with candidate
cores sorted by ascending utilization. For the bg tier the utilization of a core is its fg
utilization; for the fg tier (all candidates have an idle fg slot) it is the estimated usage of the bg
process on the core (0 when the bg slot is empty), so the heaviest fg processes land where they starve
no bg process.

Readings chosen where the paper is ambiguous
--------------------------------------------
* Tie-break of equally utilized cores: descending core index. Figure 1 fills from the top: J1 lands
  on P4-5 at t=0 and, at t=5, J6 restarts on P3 rather than P2 (both idle, both carrying a 100 % bg
  process); this order reproduces every placement of the example. One-tier policies use the same
  order, so ``easy`` and ``keasy`` place fg jobs identically when no bg job exists.
* Which bg job KEASY kills: only the job being backfilled, which restarts itself in fg; no other job
  is ever killed. Candidates are considered in merged-list order.
* When SJF is called: the paper calls KEASY on fg arrivals/departures and SJF on bg departures. A
  policy cannot know which event woke it and a pass that finds nothing to do is harmless, so every
  call runs all three steps (a job promoted or moved out of bg also frees bg slots, Figure 1 t=5).
* bg jobs and the extra cores: bg processes do not hold fg slots, so they never count when computing
  the shadow time or the extra cores. A bg job deployed to fg during this call counts like any fg
  start.
* The backfill test ``t + r <= shadow`` uses r = the job's full estimate even for a bg job that keeps
  its progress (promote, migrate): Figure 1 at t=8 says "J8 cannot be backfilled as its original
  execution time is 4" although J8 had progressed. MEASY adds ``migration_cost`` to r so a migration
  can never delay the reservation. The end used by later reservations in the same call is the
  expected one: ``now + remaining`` (promote), ``now + cost + remaining`` (migrate), ``now + estimate``
  (KEASY restart).
* Step 1 stops at the first merged-list job that cannot be deployed now, even when enough fg slots are
  idle (a REASY bg job whose own fg slots are busy): it becomes the head of step 2, which is exactly
  the case sec. 2.3.1's special reservation is for.
* REASY reservation for a head h running in bg (sec. 2.3.1, Figure 5): shadow = the latest expected end
  of the fg jobs on h's cores; extra = idle fg slots that are not h's cores. A backfilled job that ends
  after the shadow time is placed only on cores outside h's, so the reservation holds.
* A job that can never fit (one-tier: wider than the usable cores; two-tier: no reservation exists
  for it) is not made the head: it waits with its own reason and the next job is tried.
* The extra cores count every fg job that ends exactly at the shadow time, not only the one that
  made the head fit (ties in expected_end must not shrink the extra by accident of order).
* ``easy`` computes the reservation only when some later job fits the idle cores now (otherwise it
  changes nothing); the head's reason then says "needs N cores, M idle" and
  ``Decision.reservation`` is None. With no idle fg core at all, no policy computes it.
* ``use_cpu_info=False`` (sec. 3.5.1): every process usage is taken as 1.0 and every busy fg slot as fully
  utilized (the measured ``fg_util`` is CPU usage information too), so bg processes go only to cores
  whose fg slot is idle.
* Jobs whose submit time is after ``now`` are not candidates (they wait with their own reason).

Cost: every step stops scanning as soon as no idle slot remains; ``view.running`` is walked only to
build the reservation (fg jobs) or the merged list (bg jobs, two-tier policies only).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence, Set
from itertools import compress, islice, repeat
from operator import attrgetter, countOf, lt
from typing import Any, ClassVar, Literal

from vmctl.errors import PolicyParameterError
from vmctl.model import (
    Action,
    ClusterView,
    Decision,
    Discipline,
    Job,
    Kill,
    Migrate,
    Promote,
    Reservation,
    RunningJob,
    StartBg,
    StartFg,
    Tier,
)
from vmctl.policies.base import Needs, SchedulingPolicy
from vmctl.policies.registry import register

__all__ = ["EasyPolicy", "FcfsPolicy", "KeasyPolicy", "MeasyPolicy", "ReasyPolicy", "SjfPolicy"]

# Enum members cached at module level: ``Tier.FG`` is a slow class-attribute lookup on Python 3.11.
_FG = Tier.FG
_BG = Tier.BG
# The answer when nothing waits: shared (Decision is frozen and nobody may mutate its reasons).
_NOTHING = Decision()
_EXPECTED_END = attrgetter("expected_end")
_JOB_ARRIVAL = attrgetter("job.submit_time", "job.id")  # a running job's ``_arrival(rj.job)``, in C


def _arrival(job: Job) -> tuple[float, str]:
    return (job.submit_time, job.id)


#: the queue-order parameters of fcfs, easy, keasy, reasy and measy (not sjf: its order is its rule)
QUEUE_ORDER_PARAMS: dict[str, tuple[type, Any, str]] = {
    "queue_order": (str, "submit", "submit: arrival order (the paper's); multifactor: weighted age, priority "
                                   "and size, highest first (like Slurm's priority/multifactor)"),
    "age_weight": (float, 1.0, "multifactor: weight of the age factor min(wait / age_max_s, 1)"),
    "priority_weight": (float, 1.0, "multifactor: weight of the priority factor (the job's priority scaled "
                                    "to [0, 1] over the jobs waiting)"),
    "size_weight": (float, 0.0, "multifactor: weight of the size factor procs / total cores (negative "
                                "favours small jobs)"),
    "age_max_s": (float, 604800.0, "multifactor: the wait at which the age factor reaches 1 (seconds)"),
}


def _check_queue_order(policy: SchedulingPolicy) -> bool:
    """Validate the queue-order parameters; True when the order is multifactor. A multifactor order
    with a priority weight declares ``job_fields`` (vmctld then stops warning that priorities are
    ignored at submission)."""
    p = policy.params
    order = p["queue_order"]
    if order not in ("submit", "multifactor"):
        raise PolicyParameterError(policy=policy.name, param="queue_order",
                                   problem=f"must be submit or multifactor, got {order!r}")
    for key in ("age_weight", "priority_weight", "size_weight"):
        if not math.isfinite(p[key]):
            raise PolicyParameterError(policy=policy.name, param=key, problem=f"must be finite, got {p[key]}")
    if not (p["age_max_s"] > 0 and math.isfinite(p["age_max_s"])):
        raise PolicyParameterError(policy=policy.name, param="age_max_s", problem=f"must be > 0, got {p['age_max_s']}")
    multi = bool(order == "multifactor")
    if multi and p["priority_weight"] != 0:
        policy.job_fields = frozenset({"priority"})
    return multi


def _multifactor_key(params: dict[str, Any], queue: Sequence[Job], now: float, total: int) -> Any:
    """Sort key of the multifactor order: the highest score first, ties by arrival. score = age_weight
    x min(wait / age_max_s, 1) + priority_weight x (priority - lowest) / (highest - lowest) over
    ``queue`` (0 when all are equal) + size_weight x procs / total cores. Example (weights 1, 1, 0):
    a job waiting 1 day (age 1/7) with the highest priority (1) comes before one waiting 6 days (6/7)
    with the lowest (0)."""
    wa, wp, ws, amax = params["age_weight"], params["priority_weight"], params["size_weight"], params["age_max_s"]
    lo = min((j.priority for j in queue), default=0)
    span = max((j.priority for j in queue), default=0) - lo

    def key(job: Job) -> tuple[float, float, str]:
        age = now - job.submit_time
        score = wa * (min(age / amax, 1.0) if age > 0 else 0.0) + ws * job.procs / total
        if span:
            score += wp * (job.priority - lo) / span
        return (-score, job.submit_time, job.id)

    return key


def _fmt(t: float) -> str:
    return f"{t:.15g}"  # exact to the microsecond at epoch times (".6g" was off by up to an hour)


def _usable_count(view: ClusterView) -> int:
    # ``usable`` holds bools: counting the True ones is an identity test per core (counting the False
    # ones, which are rare, would call the comparison on every core)
    return view.usable.count(True)


def _future_reason(job: Job) -> str:
    return f"not submitted yet (submit time {_fmt(job.submit_time)})"


def _unreachable(view: ClusterView, rj: RunningJob) -> frozenset[int]:
    """Cores a migration of ``rj`` may not go to: on nodes that some node it runs on cannot migrate
    to (vmctld: no ``peers`` entry in that agent's config). Empty when nothing is restricted (the
    simulator)."""
    if view.migration_targets is None:
        return frozenset()
    sources = {view.node(c) for c in rj.cores}
    barred = {n for n in view.node_names if not all(view.can_migrate(s, n) for s in sources)}
    if not barred:
        return frozenset()
    return frozenset(c for c in range(view.total_cores) if view.node_of_core[c] in barred)


def _never_fits_reason(job: Job, capacity: int) -> str:
    return f"needs {job.procs} cores, only {capacity} fg cores are usable"


def _head_reason(job: Job, shadow: float) -> str:
    return f"head of queue: reservation at t={_fmt(shadow)} needs {job.procs} cores"


def _reservation(
    view: ClusterView, extra_ends: Sequence[tuple[float, int]], need: int, free: int, now: float
) -> tuple[float, int] | None:
    """EASY shadow time and extra cores for a head needing ``need`` fg cores when ``free`` are idle.

    ``extra_ends`` holds (end, procs) of jobs placed on fg during this call. Returns None when the
    head cannot fit even after every fg job has ended. The running jobs are sorted by their expected
    end with a C-level key (no tuple per job) and walked, merged with ``extra_ends``, only until the
    head fits: the shadow time is the first end by which enough cores are free, whatever the order
    among equal ends, and the extra cores count every job ending at that instant."""
    fg = _FG
    jobs = sorted(view.running.values(), key=_EXPECTED_END)
    placed = sorted(extra_ends) if extra_ends else ()
    n, m = len(jobs), len(placed)
    i = k = 0
    avail = free
    while True:
        if k < m and (i >= n or placed[k][0] <= jobs[i].expected_end):
            end, procs = placed[k]
            k += 1
        elif i < n:
            rj = jobs[i]
            i += 1
            if rj.tier is not fg:  # bg jobs hold no fg slot
                continue
            end, procs = rj.expected_end, rj.job.procs
        else:
            return None
        avail += procs
        if avail >= need:
            while k < m and placed[k][0] <= end:  # every job ending at the shadow time frees its cores
                avail += placed[k][1]
                k += 1
            while i < n and jobs[i].expected_end <= end:
                rj = jobs[i]
                i += 1
                if rj.tier is fg:
                    avail += rj.job.procs
            return (end if end > now else now, avail - need)


# ------------------------------------------------------------------------------------ one tier


class _QueueOrdered(SchedulingPolicy):
    """The queue order the EASY family's ``queue_order`` parameter sets (``validate_params`` sets ``_multi``)."""

    _multi = False

    def queue_order(self, queue: list[Job], now: float, total_cores: int) -> list[Job]:
        """Arrival order, or the multifactor order under ``queue_order=multifactor`` (as ``decide``)."""
        if self._multi and queue:
            return sorted(queue, key=_multifactor_key(self.params, queue, now, total_cores))
        return queue


class _OneTier(_QueueOrdered):
    """Shared core picking for the one-tier policies: idle fg cores by descending index."""

    needs: ClassVar[Needs] = Needs(levels=1)  # level 0 (fg) only, under any discipline

    @staticmethod
    def _pick(pool: list[int], job: Job) -> tuple[int, ...]:
        # pool is sorted ascending; take from the top (descending core index, see module header).
        k = job.procs
        taken = pool[-k:]
        del pool[-k:]
        taken.reverse()
        return tuple(taken)

    def cannot_act(self, view: ClusterView) -> bool:
        """No idle usable fg core, or no queued job: nothing can start. FCFS, EASY and SJF emit only
        ``StartFg`` (of a queued job, on idle fg cores, ``procs >= 1``) and never set ``wake_at``, so
        their decision has no actions and no wake-up whatever ``now`` is."""
        return not view.idle_fg or not view.queue


@register
class FcfsPolicy(_OneTier):
    name: ClassVar[str] = "fcfs"
    summary: ClassVar[str] = "first come, first served on the fg tier; the first job that does not fit blocks"
    parameters: ClassVar[dict[str, tuple[type, Any, str]]] = QUEUE_ORDER_PARAMS
    quiet_params: ClassVar[frozenset[str]] = frozenset(QUEUE_ORDER_PARAMS)

    def validate_params(self) -> None:
        self._multi = _check_queue_order(self)

    def decide(self, view: ClusterView, now: float) -> Decision:
        queue = view.queue
        if self._multi and queue:
            queue = sorted(queue, key=_multifactor_key(self.params, queue, now, view.total_cores))
        if not queue:
            return _NOTHING
        free = len(view.idle_fg)
        actions: list[Action] = []
        reasons: dict[str, str] = {}
        pool: list[int] | None = None
        usable = -1
        for job in queue:
            if job.submit_time > now:
                reasons[job.id] = _future_reason(job)
                continue
            if job.procs > free:
                if usable < 0:
                    usable = _usable_count(view)
                if job.procs > usable:  # would block the queue forever
                    reasons[job.id] = _never_fits_reason(job, usable)
                    continue
                reasons[job.id] = f"head of queue: needs {job.procs} cores, {free} idle"
                break
            if pool is None:
                pool = sorted(view.idle_fg)
            actions.append(StartFg(job.id, self._pick(pool, job)))
            free -= job.procs
        return Decision(actions=tuple(actions), reasons=reasons, default_reason="waiting behind the queue head (FCFS)")


@register
class EasyPolicy(_OneTier):
    name: ClassVar[str] = "easy"
    summary: ClassVar[str] = "FCFS with EASY backfilling (reservation for the queue head) on the fg tier"
    parameters: ClassVar[dict[str, tuple[type, Any, str]]] = QUEUE_ORDER_PARAMS
    quiet_params: ClassVar[frozenset[str]] = frozenset(QUEUE_ORDER_PARAMS)

    def validate_params(self) -> None:
        self._multi = _check_queue_order(self)

    def decide(self, view: ClusterView, now: float) -> Decision:
        queue = view.queue
        if self._multi and queue:
            queue = sorted(queue, key=_multifactor_key(self.params, queue, now, view.total_cores))
        if not queue:
            return _NOTHING
        free = len(view.idle_fg)
        actions: list[Action] = []
        reasons: dict[str, str] = {}
        started_ends: list[tuple[float, int]] = []
        pool: list[int] | None = None  # the idle fg cores not taken yet, ascending
        n = len(queue)
        i = 0
        head: Job | None = None
        # Step 1: FCFS until the first job that does not fit (the head).
        while i < n:
            job = queue[i]
            i += 1
            if job.submit_time > now:
                reasons[job.id] = _future_reason(job)
                continue
            procs = job.procs
            if procs <= free:
                if pool is None:
                    pool = sorted(view.idle_fg)
                # the top ``procs`` cores, by descending index (see the module header)
                actions.append(StartFg(job.id, tuple(pool[-1:-procs - 1:-1])))
                del pool[-procs:]
                free -= procs
                started_ends.append((now + job.estimate, procs))
                continue
            # with no idle core the head's fit is moot, unless it is wider than the machine
            if (free > 0 or procs > view.total_cores) and procs > (usable := _usable_count(view)):
                reasons[job.id] = _never_fits_reason(job, usable)
                continue
            head = job
            break
        if head is None:
            return Decision(actions=tuple(actions), reasons=reasons)
        # Step 2: backfill. The reservation is computed when the first job that fits now is met (it
        # decides nothing otherwise), so a pass with nothing to backfill never walks view.running.
        idle_at_head = free
        reservation: Reservation | None = None
        shadow = -math.inf
        extra = 0
        if free > 0:
            # Only jobs no wider than the cores idle now can ever be backfilled in this pass (``free``
            # only shrinks): one comprehension picks them, instead of testing every job in Python code.
            computed = False
            for job in [j for j in islice(queue, i, n) if j.procs <= free]:
                procs = job.procs
                if procs > free or job.submit_time > now:
                    if free <= 0:
                        break
                    continue
                if not computed:
                    computed = True
                    res = _reservation(view, started_ends, head.procs, idle_at_head, now)
                    if res is not None:  # None only for an inconsistent view: then nothing is backfilled
                        shadow, extra = res
                        reservation = Reservation(head.id, shadow, extra)
                if now + job.estimate <= shadow:
                    pass
                elif procs <= extra:
                    extra -= procs
                else:
                    continue
                if pool is None:
                    pool = sorted(view.idle_fg)
                actions.append(StartFg(job.id, tuple(pool[-1:-procs - 1:-1])))
                del pool[-procs:]
                free -= procs
        if reservation is None:
            reasons[head.id] = f"head of queue: needs {head.procs} cores, {idle_at_head} idle"
            default = f"waiting behind the head {head.id}"
        else:
            at = _fmt(shadow)
            reasons[head.id] = f"head of queue: reservation at t={at} needs {head.procs} cores"
            default = f"does not fit, or would delay the reservation of {head.id} at t={at}"
        return Decision(actions=tuple(actions), reasons=reasons, default_reason=default, reservation=reservation)


def _fg_held(view: ClusterView) -> int:
    return sum(rj.job.procs for rj in view.running.values() if rj.tier is _FG)


def _held(ends: Sequence[tuple[float, int]]) -> int:
    return sum(p for _e, p in ends)


@register
class SjfPolicy(_OneTier):
    name: ClassVar[str] = "sjf"
    summary: ClassVar[str] = "shortest estimate first on the fg tier, no reservation (can starve wide jobs)"

    def queue_order(self, queue: list[Job], now: float, total_cores: int) -> list[Job]:
        """Shortest estimate first, ties by arrival (``decide``'s candidate order)."""
        return sorted(queue, key=lambda j: (j.estimate, j.submit_time, j.id))

    def decide(self, view: ClusterView, now: float) -> Decision:
        queue = view.queue
        if not queue:
            return _NOTHING
        free = len(view.idle_fg)
        reasons: dict[str, str] = {}
        for job in queue:
            if job.submit_time > now:
                reasons[job.id] = _future_reason(job)
        if free == 0:
            return Decision(reasons=reasons, default_reason="waiting for free cores (SJF)")
        actions: list[Action] = []
        cand = [(job.estimate, job.submit_time, job.id, job) for job in queue if job.procs <= free]
        heapq.heapify(cand)
        pool: list[int] | None = None
        while cand and free > 0:
            job = heapq.heappop(cand)[3]
            if job.procs > free or job.submit_time > now:
                continue
            if pool is None:
                pool = sorted(view.idle_fg)
            actions.append(StartFg(job.id, self._pick(pool, job)))
            free -= job.procs
        return Decision(actions=tuple(actions), reasons=reasons, default_reason="waiting for free cores (SJF)")


# ------------------------------------------------------------------------------------ two tiers

Mode = Literal["K", "R", "M"]


class _Pass:
    """Scratch state of one two-tier ``decide`` call: an overlay of the slots this call changes."""

    __slots__ = (
        "actions",
        "bg_freed",
        "bg_jobs",
        "bg_usage",
        "empty_desc",
        "empty_pos",
        "fg_owner",
        "fg_taken",
        "free",
        "new_ends",
        "now",
        "util_over",
        "view",
    )

    def __init__(self, view: ClusterView, now: float) -> None:
        self.view = view
        self.now = now
        self.actions: list[Action] = []
        self.free = len(view.idle_fg)
        self.fg_taken: set[int] = set()
        self.fg_owner: dict[int, tuple[str, float]] = {}  # core -> (job, expected end) placed now
        self.bg_freed: set[int] = set()
        self.util_over: dict[int, float] = {}
        self.new_ends: list[tuple[float, int]] = []
        self.bg_jobs: list[RunningJob] = []  # the bg jobs of the view, in arrival order
        self.bg_usage: dict[int, float] | None = None  # core -> usage of its bg process (built lazily)
        self.empty_desc: list[int] | None = None  # idle_fg & idle_bg by descending index (built lazily)
        self.empty_pos = 0  # empty_desc[:empty_pos] are taken (``_TwoTier._empty_first``)

    def fg_idle(self, core: int) -> bool:
        return core in self.view.idle_fg and core not in self.fg_taken


class _TwoTier(_QueueOrdered):
    needs: ClassVar[Needs] = Needs(levels=2, disciplines=frozenset({Discipline.PRIORITY}))  # fg above bg
    mode: ClassVar[Mode] = "K"
    quiet_params: ClassVar[frozenset[str]] = frozenset(QUEUE_ORDER_PARAMS)
    parameters: ClassVar[dict[str, tuple[type, Any, str]]] = {
        "bg_util_threshold": (
            float,
            0.96,
            "a bg slot takes a process only while its core's fg utilization is below this (sec. 2.1)",
        ),
        "use_cpu_info": (
            bool,
            True,
            "use estimated process CPU usage and measured fg utilization; False = unknown, 1.0 (sec. 3.5.1)",
        ),
        **QUEUE_ORDER_PARAMS,
    }

    def validate_params(self) -> None:
        thr = self.params["bg_util_threshold"]
        if not (0.0 <= thr <= 1.0):
            raise PolicyParameterError(policy=self.name, param="bg_util_threshold", problem=f"{thr} not in [0, 1]")
        cost = self.params.get("migration_cost")
        if cost is not None and not (cost >= 0.0 and math.isfinite(cost)):
            raise PolicyParameterError(policy=self.name, param="migration_cost", problem=f"{cost} must be >= 0")
        self._threshold: float = thr
        self._info: bool = self.params["use_cpu_info"]
        self._cost: float = 0.0 if cost is None else float(cost)
        self._multi = _check_queue_order(self)
        # why a running bg job comes before the queued jobs in the merged list (their waiting reason)
        self._ahead = "ahead of it in the multifactor order" if self._multi else "submitted earlier"

    # -------------------------------------------------------------------------- usage helpers

    def _proc_order(self, job: Job) -> list[int]:
        """Process indices by descending estimated usage (stable: index order among equals)."""
        if not self._info or job.cpu_usage is None:
            return list(range(job.procs))
        # descending usage with a C-level key: ``reverse=True`` keeps equal keys in index order (the sort
        # stays stable), so this is ``sorted(range(procs), key=lambda p: -usage[p])`` without a call per process
        return sorted(range(job.procs), key=job.cpu_usage.__getitem__, reverse=True)

    def _bg_usage_map(self, st: _Pass) -> dict[int, float]:
        """core -> estimated usage of the bg process on it, for every bg process of the view
        (suspended ones included: they still hold their slots)."""
        m = st.bg_usage
        if m is None:
            m = {}
            for rj in st.view.running.values():
                if rj.tier is not _BG:
                    continue
                usage = rj.job.cpu_usage
                if usage is None:
                    m.update(dict.fromkeys(rj.cores, 1.0))
                else:
                    m.update(zip(rj.cores, usage, strict=True))
            st.bg_usage = m
        return m

    # -------------------------------------------------------------------------- dispatch

    def _fg_cores(self, st: _Pass, job: Job, mover: RunningJob | None, avoid: frozenset[int]) -> tuple[int, ...] | None:
        """Dispatch(FG): choose cores for ``job``; cores[i] carries process i. None if too few.

        Candidates are the idle fg cores by ascending usage of their bg process, then descending
        index. Cores with an empty bg slot (usage 0) always come first; they are found with set
        operations, and only the cores with a bg process are keyed one by one, when needed."""
        view = st.view
        k = job.procs
        vacated = st.bg_freed if mover is None else st.bg_freed.union(mover.cores)
        if not avoid:
            if st.free < k:  # st.free == len(idle_fg - fg_taken)
                return None
            chosen = self._empty_first(st, vacated, k)
            if len(chosen) == k:
                return self._pair(job, chosen)
            # too few cores with an empty bg slot: ``chosen`` holds all of them, in order
            cands = view.idle_fg - st.fg_taken if st.fg_taken else view.idle_fg
            empty: Set[int] = set(chosen)
        else:
            cands = (view.idle_fg - st.fg_taken if st.fg_taken else view.idle_fg) - avoid
            if len(cands) < k:
                return None
            empty = cands & view.idle_bg
            if vacated:
                empty = empty | (cands & vacated)
            chosen = sorted(empty, reverse=True)
            if len(empty) >= k:
                return self._pair(job, chosen[:k])
        busy = cands - empty
        if not self._info:  # every bg process counts as 1.0: only the index decides
            chosen.extend(sorted(busy, reverse=True)[: k - len(chosen)])
        else:
            # descending index, then a stable sort by usage (a C-level key: no per-core call)
            ordered = sorted(busy, reverse=True)
            # a busy bg slot without a bg job in the view (held for a migration in flight) counts
            # as fully used
            usage_of = self._bg_usage_map(st)
            if busy <= usage_of.keys():  # (the usual case: no migration in flight) the same keys, in C
                ordered.sort(key=usage_of.__getitem__)
            else:
                ordered.sort(key=lambda c: usage_of.get(c, 1.0))
            chosen.extend(ordered[: k - len(chosen)])
        return self._pair(job, chosen)

    def _pair(self, job: Job, chosen: list[int]) -> tuple[int, ...]:
        """cores[i] for process i: the processes by descending usage take ``chosen`` in order."""
        out = [0] * job.procs
        for slot, p in enumerate(self._proc_order(job)):
            out[p] = chosen[slot]
        return tuple(out)

    @staticmethod
    def _empty_first(st: _Pass, vacated: Set[int], k: int) -> list[int]:
        """The first ``k`` (or all, if fewer) idle fg cores not taken in this pass whose bg slot is empty
        (``idle_bg``) or vacated in this pass, by descending index: ``sorted(empty, reverse=True)[:k]``
        of the set formulation, without its O(cluster) set operations and sort per job. The cores of
        ``idle_fg & idle_bg`` are sorted once per pass; taken cores are skipped, and a pointer moves past
        the taken ones at its front for good (without ``avoid``, a pass takes only a prefix of what is
        left of it)."""
        view = st.view
        lst = st.empty_desc
        if lst is None:
            lst = st.empty_desc = sorted(view.idle_fg & view.idle_bg, reverse=True)
        taken = st.fg_taken
        n = len(lst)
        i = st.empty_pos
        while i < n and lst[i] in taken:
            i += 1
        st.empty_pos = i
        # vacated cores whose bg slot is not in idle_bg (those in it are in the list already)
        idle_fg, idle_bg = view.idle_fg, view.idle_bg
        vac = sorted((c for c in vacated if c not in idle_bg and c in idle_fg and c not in taken), reverse=True)
        out: list[int] = []
        j, nv = 0, len(vac)
        while len(out) < k:
            while i < n and lst[i] in taken:
                i += 1
            if i < n:
                if j < nv and vac[j] > lst[i]:
                    out.append(vac[j])
                    j += 1
                else:
                    out.append(lst[i])
                    i += 1
            elif j < nv:
                out.append(vac[j])
                j += 1
            else:
                break
        return out

    def _occupy_fg(self, st: _Pass, job: Job, cores: tuple[int, ...], end: float) -> None:
        st.fg_taken.update(cores)
        st.fg_owner.update(dict.fromkeys(cores, (job.id, end)))
        if not self._info or job.cpu_usage is None:
            st.util_over.update(dict.fromkeys(cores, 1.0))
        else:
            st.util_over.update(zip(cores, job.cpu_usage, strict=True))
        st.free -= job.procs
        st.new_ends.append((end, job.procs))

    # -------------------------------------------------------------------------- deploy

    def _plan(self, st: _Pass, item: Job | RunningJob) -> tuple[str, float, float] | None:
        """How ``item`` would be deployed to fg now: (how, end for the backfill test, expected end).
        None if it cannot be deployed. The backfill test uses the full estimate (Algorithm 1 line 27,
        and Figure 1 at t=8: "J8 cannot be backfilled as its original execution time is 4"); the
        expected end, used by later reservations, credits the progress a promote or migrate keeps."""
        now = st.now
        if isinstance(item, Job):
            end = now + item.estimate
            return ("start", end, end)
        est = item.job.estimate
        cores = item.cores
        if st.fg_taken.isdisjoint(cores) and all(map(st.view.idle_fg.__contains__, cores)):  # all ``st.fg_idle``
            return ("promote", now + est, now + item.remaining_estimate)
        if self.mode == "R":
            return None
        if self.mode == "K":
            return ("kill", now + est, now + est)
        return ("migrate", now + self._cost + est, now + self._cost + item.remaining_estimate)

    def _deploy(
        self, st: _Pass, item: Job | RunningJob, how: str, end: float, avoid: frozenset[int] = frozenset()
    ) -> bool:
        if isinstance(item, Job):
            cores = self._fg_cores(st, item, None, avoid)
            if cores is None:
                return False
            st.actions.append(StartFg(item.id, cores))
            self._occupy_fg(st, item, cores, end)
            return True
        job = item.job
        if how == "promote":
            st.actions.append(Promote(job.id))
            cores = item.cores
        else:
            if how == "migrate":
                avoid = avoid | _unreachable(st.view, item)
            found = self._fg_cores(st, job, item, avoid)
            if found is None:
                return False
            cores = found
            if how == "kill":
                st.actions.append(Kill(job.id, requeue=True, reason="restarted in the fg tier (KEASY)"))
                st.actions.append(StartFg(job.id, cores))
            else:
                st.actions.append(Migrate(job.id, cores, Tier.FG, self._cost))
        for c in item.cores:
            st.bg_freed.add(c)
        self._occupy_fg(st, job, cores, end)
        return True

    # -------------------------------------------------------------------------- reservation

    def _reserve(self, st: _Pass, head: Job | RunningJob) -> tuple[float, int, frozenset[int]] | None:
        """(shadow, extra, cores that long backfills must avoid) for the head; None if it never fits."""
        if isinstance(head, RunningJob) and self.mode == "R":
            # sec. 2.3.1: the head is pinned to its own cores.
            own = frozenset(head.cores)
            view = st.view
            owner = st.fg_owner
            fgj = view.fg_job
            shadow = st.now
            occupants = {fgj[c] for c in own if c not in owner}
            occupants.discard(None)
            for occ in occupants:
                rj = view.running.get(occ) if occ is not None else None
                end = rj.expected_end if rj is not None else math.inf
                if end > shadow:
                    shadow = end
            for c in own & owner.keys():
                if owner[c][1] > shadow:
                    shadow = owner[c][1]
            idle_now = view.idle_fg - st.fg_taken if st.fg_taken else view.idle_fg
            extra = len(idle_now) - len(idle_now & own)
            return (shadow, extra, own)
        need = head.procs if isinstance(head, Job) else head.job.procs
        res = _reservation(st.view, st.new_ends, need, st.free, st.now)
        if res is None:
            return None
        return (res[0], res[1], frozenset())

    # -------------------------------------------------------------------------- decide

    def _merged(
        self, view: ClusterView, now: float, reasons: dict[str, str], bg: list[RunningJob]
    ) -> Iterator[Job | RunningJob]:
        """The queued jobs and the bg jobs (``bg``, in arrival order) in arrival order: the queue is
        already in that order; the bg jobs, usually few, are slotted in by comparing keys only until
        the last one is out. Under ``queue_order=multifactor`` both are in the multifactor order."""
        if self._multi:
            ready = []
            for job in view.queue:
                if job.submit_time > now:
                    reasons[job.id] = _future_reason(job)
                else:
                    ready.append(job)
            key = _multifactor_key(self.params, [*ready, *(rj.job for rj in bg)], now, view.total_cores)
            merged: list[Job | RunningJob] = [*ready, *bg]
            yield from sorted(merged, key=lambda x: key(x.job if isinstance(x, RunningJob) else x))
            return
        bi, nb = 0, len(bg)
        nxt = _arrival(bg[0].job) if bg else None
        for job in view.queue:
            if nxt is not None:
                key = (job.submit_time, job.id)
                while nxt is not None and nxt < key:
                    yield bg[bi]
                    bi += 1
                    nxt = _arrival(bg[bi].job) if bi < nb else None
            if job.submit_time > now:
                reasons[job.id] = _future_reason(job)
                continue
            yield job
        while bi < nb:
            yield bg[bi]
            bi += 1

    def decide(self, view: ClusterView, now: float) -> Decision:
        has_bg = len(view.idle_bg) < view.total_cores  # cheap: any bg slot busy (or unusable)
        if not view.queue and not has_bg:
            return _NOTHING
        st = _Pass(view, now)
        reasons: dict[str, str] = {}
        started: set[str] = set()
        st.bg_jobs = sorted(
            (rj for rj in view.running.values() if rj.tier is _BG and not rj.suspended),
            key=_JOB_ARRIVAL,
        )
        merged = self._merged(view, now, reasons, st.bg_jobs)
        default_reason = "waiting for free cores"

        # Step 1: FCFS onto fg. Step 2: reservation for the head, then backfill.
        shadow = -math.inf
        extra = 0
        avoid: frozenset[int] = frozenset()
        reservation: Reservation | None = None
        for item in merged:
            procs = item.procs if isinstance(item, Job) else item.job.procs
            plan = self._plan(st, item) if procs <= st.free else None
            if plan is not None and self._deploy(st, item, plan[0], plan[2]):
                if isinstance(item, Job):
                    started.add(item.id)
                continue
            if plan is not None and plan[0] == "migrate":
                # enough fg cores are idle, but not on nodes its nodes can migrate to (only under vmctld's
                # reachability limits): it runs on in bg and is not made the head (a reservation for it
                # would hold the idle cores it cannot use)
                continue
            if st.free == 0:
                if isinstance(item, Job):
                    reasons[item.id] = f"head of queue: needs {procs} cores, none idle in fg"
                    default_reason = f"waiting behind the head {item.id}"
                else:  # a running bg job goes to fg first: the queued jobs wait for fg cores behind it
                    default_reason = (f"waiting for fg cores (none idle): bg job {item.job.id}, running and "
                                      f"{self._ahead}, goes to fg before it")
                break
            res = self._reserve(st, item)
            if res is None:
                if isinstance(item, Job):
                    reasons[item.id] = _never_fits_reason(item, st.free + _fg_held(view) + _held(st.new_ends))
                continue
            shadow, extra, avoid = res
            reservation = Reservation(item.id, shadow, extra)
            if isinstance(item, Job):
                reasons[item.id] = _head_reason(item, shadow)
                default_reason = f"does not fit, or would delay the reservation of {item.id} at t={_fmt(shadow)}"
            else:
                default_reason = (f"does not fit, or would delay the reservation of {item.job.id} at t={_fmt(shadow)} "
                                  f"(bg job {item.job.id}, running and {self._ahead}, goes to fg by then)")
            for cand in merged:
                if st.free == 0:
                    break
                if type(cand) is Job:  # (``_plan`` of a queued job inlined: the loop may walk the whole queue)
                    cprocs = cand.procs
                    if cprocs > st.free:
                        continue
                    end = now + cand.estimate
                    if end <= shadow:
                        ok = self._deploy(st, cand, "start", end)
                    elif cprocs <= extra:
                        ok = self._deploy(st, cand, "start", end, avoid)
                        if ok:
                            extra -= cprocs
                    else:
                        continue
                    if ok:
                        started.add(cand.id)
                    continue
                cprocs = cand.procs if isinstance(cand, Job) else cand.job.procs
                if cprocs > st.free:
                    continue
                plan = self._plan(st, cand)
                if plan is None:
                    continue
                how, test_end, end = plan
                if test_end <= shadow:
                    ok = self._deploy(st, cand, how, end)
                elif cprocs <= extra:
                    ok = self._deploy(st, cand, how, end, avoid)
                    if ok:
                        extra -= cprocs
                else:
                    ok = False
                if ok and isinstance(cand, Job):
                    started.add(cand.id)
            break

        # Step 3: SJF over the remaining queued jobs into bg slots.
        for jid in self._fill_bg(st, view, now, started):
            reasons.pop(jid, None)
        return Decision(
            actions=tuple(st.actions), reasons=reasons, default_reason=default_reason, reservation=reservation
        )

    def _fill_bg(self, st: _Pass, view: ClusterView, now: float, started: set[str]) -> list[str]:
        """Step 3; returns the ids of the jobs started in bg."""
        out: list[str] = []
        queue = view.queue
        if len(queue) <= len(started):
            return out
        base: Set[int] = view.idle_bg
        if st.bg_freed:
            usable = view.usable
            base = base | {c for c in st.bg_freed if usable[c]}
        if not base:
            return out
        thr = self._threshold
        pairs: list[tuple[float, int]] | None
        low: list[int] = []
        over: dict[int, float] = {}
        util = view.fg_util
        if not self._info:
            # unknown usage: a busy fg slot counts as 1.0 >= any threshold; an idle one as 0.
            idle_fg = view.idle_fg - st.fg_taken if st.fg_taken else view.idle_fg
            pairs = [(0.0, -c) for c in base & idle_fg] if thr > 0.0 else []
            free = len(pairs)
        else:
            over = st.util_over
            # the cores under the threshold picked in C (idle_bg spans the cluster: 320,000 cores); the few
            # cores whose fg slot this pass filled (``over``) take their new utilization instead. Only
            # their number is needed to pick the candidate jobs; the pairs are built when one fits (most
            # passes have none: the pairs would be a tuple per free bg slot for nothing).
            low = list(compress(base, map(lt, map(util.__getitem__, base), repeat(thr))))
            free = len(low)
            if over:
                # ``over``'s cores leave ``low`` (those in it: in ``base`` and under the threshold before) and
                # come back with their new utilization when it is under the threshold
                mine = over.keys() & base
                free += countOf(map(lt, map(over.__getitem__, mine), repeat(thr)), True)
                free -= countOf(map(lt, map(util.__getitem__, mine), repeat(thr)), True)
            pairs = None
        if free == 0:
            return out
        # the candidates after the slots: a job wider than the free bg slots never starts (the loop below
        # skips it), so the O(queue) list holds only the jobs that fit, and none is built when no slot is free
        cand = [
            (job.estimate, job.submit_time, job.id, job)
            for job in queue
            if job.procs <= free and job.submit_time <= now and job.id not in started
        ]
        if not cand:
            return out
        if pairs is None:
            pairs = [(util[c], -c) for c in low if c not in over] if over else [(util[c], -c) for c in low]
            if over:
                pairs += [(u, -c) for c, u in over.items() if c in base and u < thr]
        pairs.sort()
        slots = [-nc for _u, nc in pairs]
        heapq.heapify(cand)
        pos = 0
        while cand and free > 0:
            job = heapq.heappop(cand)[3]
            if job.procs > free:
                continue
            cores = [0] * job.procs
            for k, p in enumerate(self._proc_order(job)):
                cores[p] = slots[pos + k]
            pos += job.procs
            free -= job.procs
            st.actions.append(StartBg(job.id, tuple(cores)))
            out.append(job.id)
        return out


@register
class KeasyPolicy(_TwoTier):
    name: ClassVar[str] = "keasy"
    summary: ClassVar[str] = "two-tier EASY; a bg job backfilled off its own cores is killed and restarted in fg"
    mode: ClassVar[Mode] = "K"


@register
class ReasyPolicy(_TwoTier):
    name: ClassVar[str] = "reasy"
    summary: ClassVar[str] = "two-tier EASY without kills; a bg job reaches fg only on its own cores (reservation)"
    mode: ClassVar[Mode] = "R"


@register
class MeasyPolicy(_TwoTier):
    name: ClassVar[str] = "measy"
    summary: ClassVar[str] = "two-tier EASY; a bg job backfilled off its own cores migrates to fg (with a cost)"
    mode: ClassVar[Mode] = "M"
    parameters: ClassVar[dict[str, tuple[type, Any, str]]] = {
        **_TwoTier.parameters,
        "migration_cost": (float, 20.0, "seconds without progress when a bg job migrates to fg (sec. 3)"),
    }
