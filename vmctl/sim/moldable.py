"""Slot-stepped simulator of moldable tasks with slot time (HSRET paper sec. 6), running the policies of
``vmctl.policies.moldable`` (HSRET, AFCFS, ALL-EFT, CBSP) unchanged.

**Workload (sec. 6.1-6.2).** ``slots`` slots of ``slot`` minutes; in each, a number of tasks uniform in
[1, 2 * rate - 1] arrives (mean ``rate``), at times uniform within the slot, seen by the policy at the
next slot boundary. Half the tasks (in expectation) follow each profile (the paper's WRF and GRAPES,
whose curves were lost: see :func:`paper_profiles`). A task's length is uniform in [500, 9500] minutes
at its smallest width on standard resources; its deadline is its arrival plus a factor uniform in
[1.5, 5] times that length. ``clusters`` clusters of ``nodes`` nodes each, every node of a cluster of
one speed drawn uniformly from [0.8, 1.2]. Forecast accuracy ``accuracy`` (rho): the policies see
the forecast times; the actual time of a task is its forecast times a factor uniform in
[1, 1 + (1 - rho)] (rho 1.0: exact; 0.95: [1, 1.05]; 0.9: [1, 1.1]), one factor per task.

**Engine.** At each slot boundary the policy gets a :class:`~vmctl.policies.moldable.model.SlotView`
(waiting and active tasks, forecasts only) and answers with the tasks it starts (width and cluster,
fixed from then on) and which active tasks run in this slot; the engine checks the answer (a start of a
task that is not waiting, a width the task does not allow, more nodes than a cluster has: an
``InvariantViolation``), runs the slot and ends every task whose actual run is done (at the end of the
slot: the task holds its nodes to the end of the slot, sec. 3.2). After the arrival slots, it runs
without arrivals until every task has ended or ``drain`` more slots have passed.

**Metrics (sec. 6.2).** Over the tasks that arrive after the warm-up (``warmup`` slots; by default the
longest deadline window, 47,500 minutes: 132 slots of 360 minutes, 66 of 720): AET, the mean of
completion - start (minutes: suspended slots count); AWT, the mean of start - arrival; PUT, the
percentage of tasks not completed by their deadline (a task still unfinished at the end counts as
late); utilization, the node-slots held by running tasks over the node-slots of the measured slots.
Confidence intervals: batch means, ``batches`` batches of consecutive arrival slots, the half width
of the 95 % Student-t interval (``ci_aet``, ``ci_awt``, ``ci_put``).

The same seed gives the same tasks, speeds and forecast errors to every policy (common random
numbers); AFCFS's random choices come from a separate stream of the same seed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vmctl.errors import InvariantViolation, ValidationError
from vmctl.model import JobShape
from vmctl.policies.moldable import MOLDABLE_POLICIES, TARGET_POLICIES, make_policy
from vmctl.policies.moldable.hsret import check_target
from vmctl.policies.moldable.model import EPS, Clusters, Profile, SlotView, check_slot
from vmctl.speedup import Downey

#: runs of more slots than this draw their tasks chunk by chunk (:func:`stream_tasks`) and keep only the
#: tasks still needed in memory (the paper's 1,000,000 slots at rate 150: 150 million tasks)
STREAM_SLOTS = 20_000
CHUNK_SLOTS = 1_000
#: how often :func:`run_slots` reports its progress, in simulated slots
PROGRESS_SLOTS = 1_000
#: the paper's task lengths (minutes at the smallest width) and deadline factors
LENGTH_RANGE = (500.0, 9500.0)
DEADLINE_FACTOR = (1.5, 5.0)
SPEED_RANGE = (0.8, 1.2)


def paper_profiles() -> tuple[Profile, Profile]:
    """Stand-ins for the paper's WRF and GRAPES curves (its Figs. 4-7 were lost), from Downey's (1997)
    model (:mod:`vmctl.speedup`):

    - "WRF": widths 4, 8, ..., 64, Downey A = 48, sigma = 0.5 (low variance: scales well; the time at
      64 is 0.092 of the time at 4, 10.9x faster on 16x the nodes, efficiency 68 %);
    - "GRAPES": widths 4, 6, ..., 32, Downey A = 12, sigma = 2 (high variance: the time at 32 is 0.29
      of the time at 4, 3.4x faster on 8x the nodes, efficiency 43 %).

    Two visibly different curves over different width ranges, as sec. 4.2 says of WRF and GRAPES
    ("different scopes ... different trends ... different scope of parallelism"). The smallest width,
    4, is chosen for the load: at rate 150 per 360-minute slot on 10 x 1,000 nodes, running every task
    at its smallest width needs about 0.85 of the nodes, the "relatively high system load" of sec.
    6.2; wider widths need more (sublinear speedup)."""
    wrf = JobShape.moldable_model(tuple(range(4, 65, 4)), Downey(A=48.0, sigma=0.5), time_at_min=1.0)
    grapes = JobShape.moldable_model(tuple(range(4, 33, 2)), Downey(A=12.0, sigma=2.0), time_at_min=1.0)
    return Profile.from_shape("wrf", wrf), Profile.from_shape("grapes", grapes)


@dataclass(frozen=True)
class MoldableConfig:
    policy: str
    slot: float
    rate: float
    slots: int
    clusters: int = 10
    nodes: int = 1000
    accuracy: float = 0.95
    seed: int = 1
    warmup: int | None = None
    batches: int = 10
    drain: int = 400
    profiles: tuple[Profile, ...] = field(default_factory=paper_profiles)
    #: Getnet's load target (HSRET, its AFCFS-start variant and the load-capped ALL-EFT; the paper's 1)
    target: float = 1.0
    #: the range the cluster speeds are drawn from (the paper's [0.8, 1.2]; (1, 1): equal clusters)
    speed_range: tuple[float, float] = SPEED_RANGE

    def __post_init__(self) -> None:
        check_slot(self.slot)
        if self.policy not in MOLDABLE_POLICIES:
            raise ValidationError(field="policy", problem=f"must be one of {', '.join(MOLDABLE_POLICIES)}, "
                                  f"got {self.policy!r}")
        checks: list[tuple[str, Any, bool, str]] = [
            ("rate", self.rate, isinstance(self.rate, int | float) and math.isfinite(self.rate) and self.rate >= 1,
             "the mean number of arrivals per slot must be >= 1"),
            ("slots", self.slots, isinstance(self.slots, int) and self.slots >= 1, "must be an integer >= 1"),
            ("clusters", self.clusters, isinstance(self.clusters, int) and self.clusters >= 1,
             "must be an integer >= 1"),
            ("nodes", self.nodes, isinstance(self.nodes, int) and self.nodes >= 1, "must be an integer >= 1"),
            ("accuracy", self.accuracy, isinstance(self.accuracy, int | float) and 0 < self.accuracy <= 1,
             "the forecast accuracy rho must be in (0, 1] (0.95: actual time in [1, 1.05] x the forecast)"),
            ("warmup", self.warmup, self.warmup is None or (isinstance(self.warmup, int) and self.warmup >= 0),
             "the warm-up must be a number of slots >= 0"),
            ("batches", self.batches, isinstance(self.batches, int) and self.batches >= 2,
             "at least 2 batches (for a confidence interval)"),
            ("drain", self.drain, isinstance(self.drain, int) and self.drain >= 0, "must be an integer >= 0"),
        ]
        for name, value, ok, problem in checks:
            if isinstance(value, bool) or not ok:
                raise ValidationError(field=name, problem=f"{problem}, got {value!r}")
        if self.target != 1.0 and self.policy not in TARGET_POLICIES:
            raise ValidationError(field="target", problem=f"only {', '.join(TARGET_POLICIES)} take a load target, "
                                  f"not {self.policy}")
        check_target(self.target)
        if not self.profiles:
            raise ValidationError(field="profiles", problem="need at least one speedup profile")
        widest = max(p.minp for p in self.profiles)
        if widest > self.nodes:
            raise ValidationError(field="nodes", problem=f"{self.nodes} nodes per cluster cannot run a task of "
                                  f"minimum width {widest}")
        if self.slots - self.warm_slots < self.batches:
            raise ValidationError(field="slots", problem=f"{self.slots} slots leave fewer measured slots than "
                                  f"{self.batches} batches after a warm-up of {self.warm_slots} slots")

    @property
    def warm_slots(self) -> int:
        """The warm-up: by default the longest deadline window (9,500 min x 5) in slots, after which the
        set of tasks HSRET's load counts (arrived, deadline not passed) is in its steady state."""
        if self.warmup is not None:
            return self.warmup
        return math.ceil(LENGTH_RANGE[1] * DEADLINE_FACTOR[1] / self.slot)


@dataclass
class Tasks:
    """Every task of a run, in arrival order (structure of arrays)."""

    arrival: np.ndarray
    deadline: np.ndarray
    length: np.ndarray
    profile: np.ndarray
    factor: np.ndarray
    arrival_slot: np.ndarray


@dataclass(frozen=True)
class Outcome:
    """Per task of a run: start and finish slot (-1: never), width and cluster (-1: never started)."""

    start: np.ndarray
    finish: np.ndarray
    width: np.ndarray
    cluster: np.ndarray


def generate(cfg: MoldableConfig) -> tuple[Tasks, Clusters]:
    """The tasks and clusters of ``cfg`` (a pure function of its seed and sizes)."""
    task_seq, cluster_seq = np.random.SeedSequence(cfg.seed).spawn(2)
    return draw_tasks(cfg, np.random.default_rng(task_seq), 0, cfg.slots), clusters_of(cfg, cluster_seq)


def clusters_of(cfg: MoldableConfig, seq: np.random.SeedSequence) -> Clusters:
    lo, hi = cfg.speed_range
    if not 0 < lo <= hi:
        raise ValidationError(field="speed_range", problem=f"must be 0 < low <= high, got {cfg.speed_range!r}")
    speeds = np.random.default_rng(seq).uniform(lo, hi, size=cfg.clusters)
    return Clusters(tuple([cfg.nodes] * cfg.clusters), tuple(float(s) for s in speeds))


def draw_tasks(cfg: MoldableConfig, rng: np.random.Generator, first: int, end: int) -> Tasks:
    """The tasks arriving in slots ``first`` .. ``end - 1`` (sec. 6.1-6.2 workload), drawn from ``rng``."""
    hi = max(1, round(2 * cfg.rate - 1))
    counts = rng.integers(1, hi, size=end - first, endpoint=True)
    total = int(counts.sum())
    slot_of = np.repeat(np.arange(first, end, dtype=np.int64), counts)
    offset = rng.random(total)
    arrival = (slot_of + offset) * cfg.slot
    order = np.lexsort((offset, slot_of))
    arrival, slot_of = arrival[order], slot_of[order]
    length = rng.uniform(*LENGTH_RANGE, size=total)
    deadline = arrival + rng.uniform(*DEADLINE_FACTOR, size=total) * length
    profile = rng.integers(0, len(cfg.profiles), size=total)
    factor = 1.0 + rng.uniform(0.0, 1.0 - cfg.accuracy, size=total) if cfg.accuracy < 1 else np.ones(total)
    return Tasks(arrival, deadline, length, profile.astype(np.int64), factor, slot_of)


def stream_tasks(cfg: MoldableConfig) -> Iterator[Tasks]:
    """The tasks of a long run (more than :data:`STREAM_SLOTS` slots) in chunks of :data:`CHUNK_SLOTS`
    arrival slots, chunk k drawn from its own stream of the seed (``SeedSequence(seed).spawn(2)[0]``
    spawning one child per chunk): the same distributions as :func:`generate`, another sample, and
    memory for one chunk at a time instead of every task of the run."""
    task_seq = np.random.SeedSequence(cfg.seed).spawn(2)[0]
    for k, first in enumerate(range(0, cfg.slots, CHUNK_SLOTS)):
        rng = np.random.default_rng(np.random.SeedSequence([*task_seq.generate_state(2), k]))
        yield draw_tasks(cfg, rng, first, min(cfg.slots, first + CHUNK_SLOTS))


def policy_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(3)[2])


def _t975(df: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.975, df))


def batch_means(values: np.ndarray, batch: np.ndarray, batches: int) -> tuple[float, float]:
    """(mean over all values, 95 % half width over the batch means; nan when a batch is empty)."""
    if values.size == 0:
        return math.nan, math.nan
    means = np.array([values[batch == b].mean() if (batch == b).any() else np.nan for b in range(batches)])
    if np.isnan(means).any():
        return float(values.mean()), math.nan
    return float(values.mean()), _t975(batches - 1) * float(means.std(ddof=1)) / math.sqrt(batches)


def simulate(cfg: MoldableConfig, *, reference: bool = False,
             progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run ``cfg``; the metrics dict (see the module docstring). ``reference`` and ``progress``: as in
    :func:`run_slots`."""
    t0 = time.perf_counter()
    tasks: Tasks | Iterator[Tasks]
    if cfg.slots > STREAM_SLOTS:
        tasks, clusters = stream_tasks(cfg), clusters_of(cfg, np.random.SeedSequence(cfg.seed).spawn(2)[1])
    else:
        tasks, clusters = generate(cfg)
    res, _ = run_slots(cfg.policy, cfg.seed, cfg.slot, tasks, clusters, cfg.profiles, slots=cfg.slots,
                    warm=cfg.warm_slots, drain=cfg.drain, batches=cfg.batches, t0=t0, target=cfg.target,
                    reference=reference, progress=progress)
    return {"policy": cfg.policy, "target": cfg.target,
            "slot": cfg.slot, "rate": cfg.rate, "accuracy": cfg.accuracy, "seed": cfg.seed,
            **res, "clusters": cfg.clusters, "nodes": cfg.nodes}


_TASK_FIELDS = ("arrival", "deadline", "length", "profile", "factor", "arrival_slot")
#: per-task engine state and its value before a task starts
_STATE_FIELDS = {"start": -1, "finish": -1, "cluster": -1, "width": 0, "need_f": 0, "need_a": 0, "done": 0}


class _Window(Tasks):
    """The tasks the engine still needs (every task from the oldest one waiting, running or in HSRET's
    load window on): the task fields of :class:`Tasks` and the engine's state, one array each, indexed
    by task id - ``dropped``. A long run appends chunks and drops the finished prefix."""

    start: np.ndarray
    finish: np.ndarray
    cluster: np.ndarray
    width: np.ndarray
    need_f: np.ndarray
    need_a: np.ndarray
    done: np.ndarray

    def __init__(self) -> None:
        for name in _TASK_FIELDS:
            setattr(self, name, np.zeros(0, dtype=np.int64 if name in ("profile", "arrival_slot") else np.float64))
        for name in _STATE_FIELDS:
            setattr(self, name, np.zeros(0, dtype=np.int64))
        self.dropped = 0

    def append(self, tasks: Tasks) -> None:
        n = len(tasks.arrival)
        for name in _TASK_FIELDS:
            setattr(self, name, np.concatenate([getattr(self, name), getattr(tasks, name)]))
        for name, init in _STATE_FIELDS.items():
            setattr(self, name, np.concatenate([getattr(self, name), np.full(n, init, dtype=np.int64)]))

    def drop(self, lo: int, tally: _Tally) -> None:
        """Fold tasks ``0 .. lo - 1`` (all ended) into ``tally`` and forget them."""
        if lo <= 0:
            return
        tally.add(self, slice(0, lo))
        for name in (*_TASK_FIELDS, *_STATE_FIELDS):
            setattr(self, name, getattr(self, name)[lo:])
        self.dropped += lo


class _Tally:
    """The metrics of the module docstring as per-batch sums, so that a long run can fold its ended
    tasks in as it forgets them (the same means and batch-means intervals as over every task at once)."""

    def __init__(self, batches: int, warm: int, slots: int, slot: float) -> None:
        self.batches, self.warm, self.slots, self.slot = batches, warm, slots, slot
        self.sums = {k: np.zeros(batches) for k in ("aet", "awt", "put")}
        self.counts = {k: np.zeros(batches, dtype=np.int64) for k in ("aet", "awt", "put")}
        self.width_sum = 0.0
        self.unfinished = 0

    def add(self, w: _Window, part: slice) -> None:
        arrival_slot, start, finish = w.arrival_slot[part], w.start[part], w.finish[part]
        measured = arrival_slot >= self.warm
        batch = ((arrival_slot - self.warm) * self.batches) // (self.slots - self.warm)
        fin = measured & (finish >= 0)
        begun = measured & (start >= 0)
        late = measured & ((finish < 0) | (finish * self.slot > w.deadline[part] + EPS))
        for key, mask, values in (("aet", fin, (finish - start) * self.slot),
                                  ("awt", begun, start * self.slot - w.arrival[part]),
                                  ("put", measured, 100.0 * late)):
            self.sums[key] += np.bincount(batch[mask], weights=values[mask], minlength=self.batches)
            self.counts[key] += np.bincount(batch[mask], minlength=self.batches)
        self.width_sum += float(w.width[part][begun].sum())
        self.unfinished += int((measured & (finish < 0)).sum())

    def mean_ci(self, key: str) -> tuple[float, float]:
        """(mean over all values, 95 % half width over the batch means; nan when a batch is empty)."""
        n = self.counts[key]
        if n.sum() == 0:
            return math.nan, math.nan
        mean = float(self.sums[key].sum() / n.sum())
        if (n == 0).any():
            return mean, math.nan
        means = self.sums[key] / n
        return mean, _t975(self.batches - 1) * float(means.std(ddof=1)) / math.sqrt(self.batches)


def run_slots(policy_name: str, seed: int, slot: float, tasks: Tasks | Iterable[Tasks], clusters: Clusters,
              profiles: tuple[Profile, ...], *, slots: int, warm: int, drain: int, batches: int,
              t0: float | None = None, target: float = 1.0, reference: bool = False,
              progress: Callable[[int, int], None] | None = None, progress_every: int = PROGRESS_SLOTS
              ) -> tuple[dict[str, Any], Outcome | None]:
    """The slot-stepped engine on given ``tasks`` (sorted by arrival, ``profile`` indexing
    ``profiles``; or consecutive chunks of them, :func:`stream_tasks`) and ``clusters``: ``slots``
    arrival slots of ``slot`` minutes, the first ``warm`` unmeasured, then at most ``drain`` more slots;
    the metrics of the module docstring (the trace evaluation, :mod:`vmctl.experiments.moldable_traces`,
    builds its tasks from a real trace), and each task's :class:`Outcome` (None when chunks were
    dropped on the way). ``reference``: the policies' plain forms (:func:`make_policy`; the same
    result, slower). ``progress(now, last)``: called after every ``progress_every`` simulated
    slots and at the end (``last``: the arrival slots plus the drain, the most the run can take)."""
    t0 = time.perf_counter() if t0 is None else t0
    if reference:
        policy = make_policy(policy_name, policy_rng(seed), target=target, reference=True)
    else:
        policy = make_policy(policy_name, policy_rng(seed)) if target == 1.0 else \
            make_policy(policy_name, policy_rng(seed), target=target)
    chunks = iter([tasks] if isinstance(tasks, Tasks) else tasks)
    pending = next(chunks, None)
    w = _Window()
    tally = _Tally(batches, warm, slots, slot)
    speed = clusters.s
    nodes = clusters.n
    # width_index[profile, width]: the width's index in the profile (-1: not one of its widths);
    # rel[profile, j]: its time there relative to its smallest width
    width_index = np.full((len(profiles), max(p.maxp for p in profiles) + 1), -1, dtype=np.int64)
    rel = np.zeros((len(profiles), max(len(p.widths) for p in profiles)), dtype=np.float64)
    for pi, p in enumerate(profiles):
        width_index[pi, p.w] = np.arange(len(p.widths))
        rel[pi, :len(p.widths)] = p.r
    empty_i = np.zeros(0, dtype=np.int64)
    waiting = empty_i
    active = empty_i
    recent = empty_i  # finished, deadline not passed (HSRET's load counts them)
    seen = 0
    busy = 0
    suspended_slots = 0
    measured_tasks = 0
    cases: dict[int, int] = {}
    now = 0
    last = slots + drain
    while now < last:
        while pending is not None and (pending.arrival_slot.size == 0 or pending.arrival_slot[0] <= now):
            lo = min([seen, *(int(x.min()) for x in (waiting, active, recent) if x.size)])
            w.drop(lo, tally)
            waiting, active, recent, seen = waiting - lo, active - lo, recent - lo, seen - lo
            measured_tasks += int((pending.arrival_slot >= warm).sum())
            w.append(pending)
            pending = next(chunks, None)
        upto = int(np.searchsorted(w.arrival, now * slot, side="left"))
        if upto > seen:
            waiting = np.concatenate([waiting, np.arange(seen, upto, dtype=np.int64)])
            seen = upto
        if now >= slots and waiting.size == 0 and active.size == 0:
            break
        recent = recent[w.deadline[recent] > now * slot]
        view = SlotView(
            now=now, slot=slot, clusters=clusters, profiles=profiles,
            w_id=waiting, w_arrival=w.arrival[waiting], w_deadline=w.deadline[waiting],
            w_length=w.length[waiting], w_profile=w.profile[waiting],
            a_id=active, a_arrival=w.arrival[active], a_deadline=w.deadline[active],
            a_length=w.length[active], a_profile=w.profile[active], a_cluster=w.cluster[active],
            a_width=w.width[active], a_rem=np.maximum(1, w.need_f[active] - w.done[active]),
            f_arrival=w.arrival[recent], f_deadline=w.deadline[recent], f_length=w.length[recent],
            f_profile=w.profile[recent])
        decision = policy.decide(view)
        if "case" in decision.notes:
            k = int(decision.notes["case"])
            cases[k] = cases.get(k, 0) + 1
        running = np.asarray(decision.running, dtype=np.bool_)
        if running.shape != active.shape:
            raise InvariantViolation(rule="moldable-running", detail=f"{policy_name}: running mask of {running.shape}"
                                     f" for {active.shape} active tasks")
        new = np.array([s.task for s in decision.starts], dtype=np.int64)
        if new.size:
            is_waiting = np.zeros(len(w.arrival), dtype=np.bool_)
            is_waiting[waiting] = True
            inside = (new >= 0) & (new < len(w.arrival))
            ordered = np.sort(new)
            if not inside.all() or not is_waiting[new].all() or (ordered[1:] == ordered[:-1]).any():
                raise InvariantViolation(rule="moldable-start", detail=f"{policy_name} started a task that is not "
                                         f"waiting (or twice) at slot {now}")
            cl = np.array([s.cluster for s in decision.starts], dtype=np.int64)
            wd = np.array([s.width for s in decision.starts], dtype=np.int64)
            pr = w.profile[new]
            j = np.full(new.size, -1, dtype=np.int64)
            fits = (wd >= 0) & (wd < width_index.shape[1])
            j[fits] = width_index[pr[fits], wd[fits]]
            bad = np.nonzero((j < 0) | (cl < 0) | (cl >= len(nodes)))[0]
            if bad.size:
                k = int(bad[0])
                p = profiles[int(pr[k])]
                raise InvariantViolation(rule="moldable-start", detail=f"{policy_name}: task {int(new[k]) + w.dropped} "
                                         f"width {int(wd[k])} cluster {int(cl[k])} (allowed widths {list(p.widths)})")
            # the slot counts of every start at once (the same operations as one at a time)
            minutes = w.length[new] * rel[pr, j] / speed[cl]
            w.need_f[new] = np.maximum(1, np.ceil(minutes / slot - EPS)).astype(np.int64)
            w.need_a[new] = np.maximum(1, np.ceil(minutes * w.factor[new] / slot - EPS)).astype(np.int64)
            w.cluster[new], w.width[new], w.start[new] = cl, wd, now
            is_waiting[new] = False
            waiting = waiting[is_waiting[waiting]]
        run = np.concatenate([active[running], new])
        held = np.bincount(w.cluster[run], weights=w.width[run], minlength=len(nodes))
        if (held > nodes).any():
            c = int(np.argmax(held - nodes))
            raise InvariantViolation(rule="moldable-capacity", detail=f"{policy_name} runs {int(held[c])} nodes on "
                                     f"cluster {c} of {int(nodes[c])} at slot {now}")
        if warm <= now < slots:
            busy += int(held.sum())
            suspended_slots += int((~running).sum())
        w.done[run] += 1
        ended = run[w.done[run] >= w.need_a[run]]
        w.finish[ended] = now + 1
        recent = np.concatenate([recent, ended])
        active = np.concatenate([active, new])
        active = active[w.finish[active] < 0]
        now += 1
        if progress is not None and now % progress_every == 0:
            progress(now, last)
    if progress is not None:
        progress(now, last)
    for rest in ([pending] if pending is not None else []) + list(chunks):  # arrivals after a cut-off
        measured_tasks += int((rest.arrival_slot >= warm).sum())
        w.append(rest)
    tally.add(w, slice(0, len(w.arrival)))
    aet, ci_aet = tally.mean_ci("aet")
    awt, ci_awt = tally.mean_ci("awt")
    put, ci_put = tally.mean_ci("put")
    begun = int(tally.counts["awt"].sum())
    wall = time.perf_counter() - t0
    return {
        "tasks": measured_tasks, "aet": aet, "awt": awt, "put": put,
        "utilization": busy / (float(nodes.sum()) * (slots - warm)),
        "slots": slots, "warmup_slots": warm, "simulated_slots": now, "batches": batches,
        "ci_aet": ci_aet, "ci_awt": ci_awt, "ci_put": ci_put,
        "unfinished": tally.unfinished,
        "mean_width": tally.width_sum / begun if begun else math.nan,
        "suspended_task_slots": suspended_slots,
        "hsret_cases": {str(k): v for k, v in sorted(cases.items())},
        "wall_s": wall, "slots_per_s": now / wall if wall > 0 else math.nan,
    }, None if w.dropped else Outcome(w.start, w.finish, w.width, w.cluster)


def sweep_cell(policy: str, slot: float, rate: float, accuracy: float, seed: int, slots: int, clusters: int,
               nodes: int, warmup: int | None = None) -> dict[str, Any]:
    """One cell of ``vmctl moldable sweep`` (for ``vmctl.experiments.runner``): scalar metrics only."""
    res = simulate(MoldableConfig(policy=policy, slot=slot, rate=rate, slots=slots, clusters=clusters, nodes=nodes,
                                  accuracy=accuracy, seed=seed, warmup=warmup))
    keep = ("tasks", "aet", "awt", "put", "utilization", "warmup_slots", "ci_aet", "ci_awt", "ci_put", "unfinished",
            "mean_width", "suspended_task_slots", "simulated_slots", "slots_per_s")
    return {k: res[k] for k in keep}
