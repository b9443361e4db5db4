"""User run-time estimates: the Tsafrir-Etsion-Feitelson model ("TModel", JSSPP 2005), as the MEASY
paper uses it (sec. 3.1) to give the model workloads their estimates.

Real users pick estimates from a few "round" values, and the maximum allowed estimate is the most
popular one. The model builds a histogram of estimates and deals it out to the jobs:

1. **K distinct values**, piecewise-linear in the number of jobs N through (0,0), (20,10), (200,20),
   (1000,35), (10000,90), (70000,340), (250000,565); 565 above 250,000 jobs.
2. **Head: the 20 most popular values.** The maximum M; then those of 5, 10, 15, 20, 30 min and
   1, 2, 3, 4, 5, 6, 8, 10, 12, 18 h that are below M; then multiples of 200 h, 100 h, 50 h, 10 h,
   5 h, 2 h, 1 h, 20 min, 10 min, 5 min (each multiplier in turn, from the largest multiple <= M
   down, skipping duplicates) until there are 20.
3. **Head sizes** (% of jobs) by popularity rank x = 2..20: s(x) = 14.0491 e^(-0.177531 x) + 0.462513;
   rank 1 gets 89 - sum, so the head holds 89 % of the jobs. M always has rank 1; the other head
   values, taken in time order, get popularity ranks drawn from the ranks the same time-rank had in
   four real logs (table below: SDSC-SP2, CTC, KTH, SDSC-BLUE): at each time-rank the candidate ranks
   of that row join a pool; a rank that is "due" (the last time-rank at which it occurs in the table
   has come) is taken first, smallest first; otherwise two ranks are drawn from the pool uniformly and
   the smaller (more popular) one is kept.
4. **Tail** (ranks 21..K): sizes 795.6 x^-2.267, rescaled to total 11 %; times y M for x = i/T
   (i = 1..T), y = (A-1) x / (A-x), A = 1 + 12.1039 K^-0.6026, rounded to a whole minute and shifted
   by 0, +30, -30, +20, -20, +10, -10 s to avoid duplicates (a value that still collides, or falls
   outside (0, M), is left out). Tail sizes are matched to tail times at random.
5. **Jobs per value** = max(1, round(percent N / 100)); the rounding residue is removed from (or added
   to) the most popular non-empty values, one job each, largest first, until the total is N (when
   N < K some values end up with no job).
6. **Assignment** keeping estimate >= run time: run times above M are truncated to M (the caller is
   told how many); jobs sorted by run time descending and the estimates descending; the j-th job draws
   uniformly among the unused estimates at positions j..hi (hi = the last estimate >= its run time)
   and that estimate is swapped into position j. If a run time exceeds the j-th largest estimate the
   model cannot work (M too small for these jobs) and an error says so.

Sources: the paper (Tsafrir, Etsion, Feitelson, "Modeling user runtime estimates", JSSPP 2005,
LNCS 3834) and the constants of its authors' published model (shared/notes/workload-models.md 3.2);
the implementation is ours. Stand-in: step 5's equalisation is simpler than the original heuristic
(which first spreads the residue proportionally); both end with exactly N estimates.

Tiny example: N = 20 jobs, M = 1 h: K = 10, so only the head exists (20 values, K < 20: some get
no job); M = 3600 s gets about 21.7 % of the jobs, i.e. 4 of them, the rest share 5 min .. 55 min.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from vmctl.errors import OutOfRange
from vmctl.sim.workloads.core import WorkloadJob, gc_paused, make_job

FloatArray = npt.NDArray[np.float64]

MIN = 60
HOUR = 3600
TOP = 20
HEAD_SHARE = 89.0  # percent of jobs in the head
HEAD_PARAMS = (14.0491, -0.177531, 0.462513)  # s(x) = a e^(b x) + c, x = popularity rank 2..20
TAIL_PARAMS = (795.6, -2.267)  # s(x) = a x^b, x = popularity rank 21..K
BINTIM_PARAMS = (12.1039, -0.6026)  # A = 1 + a K^b
KNOTS = ((0, 0), (20, 10), (200, 20), (1000, 35), (10000, 90), (70000, 340), (250000, 565))

#: estimates found among the 20 most popular in all four logs the model was built from
JOINT = (5 * MIN, 10 * MIN, 15 * MIN, 20 * MIN, 30 * MIN, *(h * HOUR for h in (1, 2, 3, 4, 5, 6, 8, 10, 12, 18)))
#: "round" multipliers used to complete the head
ROUND = (200 * HOUR, 100 * HOUR, 50 * HOUR, 10 * HOUR, 5 * HOUR, 2 * HOUR, 1 * HOUR, 20 * MIN, 10 * MIN, 5 * MIN)
#: popularity rank that the t-th shortest head estimate (t = 0 is the maximum) had in the logs
#: SDSC-SP2, CTC, KTH and SDSC-BLUE (data from the model's authors)
TIMRNK_TO_POPRNK: tuple[tuple[int, int, int, int], ...] = (
    (3, 1, 1, 1), (1, 3, 4, 6), (4, 4, 10, 5), (17, 2, 14, 3), (13, 12, 20, 7),
    (7, 9, 2, 2), (8, 8, 3, 18), (18, 18, 7, 19), (2, 6, 12, 4), (6, 7, 6, 11),
    (16, 11, 19, 20), (10, 20, 5, 9), (5, 16, 18, 10), (15, 5, 16, 14), (14, 14, 9, 13),
    (19, 13, 17, 16), (11, 10, 15, 15), (12, 15, 13, 17), (9, 17, 8, 8), (20, 19, 11, 12),
)  # fmt: skip
TAIL_OFFSETS = (0, 30, -30, 20, -20, 10, -10)


def n_distinct_estimates(n_jobs: int) -> int:
    """K, the number of distinct estimate values for ``n_jobs`` jobs (piecewise linear model)."""
    if n_jobs >= KNOTS[-1][0]:
        return KNOTS[-1][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(KNOTS):
        if n_jobs <= x1:
            return y0 + round((n_jobs - x0) * (y1 - y0) / (x1 - x0))
    raise AssertionError("unreachable")  # pragma: no cover


def head_times(max_estimate: int) -> list[int]:
    """The head values: ``[M]`` followed by the other head values in ascending order."""
    v = [max_estimate] + [e for e in JOINT if e < max_estimate]
    for mul in ROUND:
        if len(v) >= TOP:
            break
        est = (max_estimate // mul) * mul
        while est > 0 and len(v) < TOP:
            if est not in v:
                v.append(est)
            est -= mul
    return [v[0], *sorted(v[1:])]


def head_sizes(n: int) -> list[float]:
    """Percent of jobs per popularity rank 1..n (n <= 20), descending; they sum to 89."""
    a, b, c = HEAD_PARAMS
    rest = [a * math.exp(b * rank) + c for rank in range(2, n + 1)]
    return sorted([HEAD_SHARE - math.fsum(rest), *rest], reverse=True)


def popularity_ranks(n: int, rng: np.random.Generator) -> list[int]:
    """Popularity rank (1..n) of each head time-rank 0..n-1 (time-rank 0 = the maximum -> rank 1)."""
    bound: dict[int, int] = {}  # popularity rank -> last time-rank at which it appears in the table
    for ttr in range(TOP - 1, -1, -1):
        for pr in TIMRNK_TO_POPRNK[ttr]:
            bound.setdefault(pr, ttr)
    chosen: set[int] = set()
    pool: list[int] = []
    mapping: list[int] = []
    for ttr in range(n):
        pool.extend(pr for pr in TIMRNK_TO_POPRNK[ttr] if pr not in chosen and pr <= n)
        pick = -1
        if ttr == 0:
            pick = 1
        else:
            due = [pr for pr in range(1, n + 1) if bound[pr] <= ttr and pr not in chosen]
            if due:
                pick = due[0]
            elif pool:
                a, b = rng.integers(0, len(pool), size=2)
                pick = min(pool[int(a)], pool[int(b)])
            else:  # only when n < 20 truncated the table: take the most popular rank left
                pick = min(pr for pr in range(1, n + 1) if pr not in chosen)
        mapping.append(pick)
        chosen.add(pick)
        pool = [pr for pr in pool if pr != pick]
    return mapping


def tail_times(max_estimate: int, head: Sequence[int], n_tail: int, k: int) -> list[int]:
    a = 1.0 + BINTIM_PARAMS[0] * k ** BINTIM_PARAMS[1]
    taken = set(head)
    out: list[int] = []
    for i in range(1, n_tail + 1):
        x = i / n_tail
        y = (a - 1.0) * x / (a - x)
        sec = round(y * max_estimate / 60.0) * 60
        for off in TAIL_OFFSETS:
            s = sec + off
            if s not in taken and 0 < s < max_estimate:
                taken.add(s)
                out.append(s)
                break
    return sorted(out)


def estimate_histogram(n_jobs: int, max_estimate: int, rng: np.random.Generator) -> dict[int, int]:
    """Estimate value (s) -> number of jobs; the counts add up to ``n_jobs``."""
    if max_estimate < HOUR:
        raise OutOfRange(what="max_estimate", value=max_estimate, allowed="at least 3600 s (the model's minimum)")
    k = n_distinct_estimates(n_jobs)
    head = head_times(max_estimate)
    sizes = head_sizes(len(head))
    ranks = popularity_ranks(len(head), rng)
    percent: dict[int, float] = {t: sizes[r - 1] for t, r in zip(head, ranks, strict=True)}
    tail = tail_times(max_estimate, head, max(0, k - len(head)), k)
    if tail:
        a, b = TAIL_PARAMS
        raw = [a * float(rank) ** b for rank in range(TOP + 1, TOP + 1 + len(tail))]
        scale = (100.0 - HEAD_SHARE) / math.fsum(raw)
        tail_sizes = [s * scale for s in raw]
        for t, s in zip(rng.permutation(np.array(tail)).tolist(), tail_sizes, strict=True):
            percent[int(t)] = s
    counts = {t: max(1, round(p * n_jobs / 100.0)) for t, p in percent.items()}
    diff = n_jobs - sum(counts.values())
    # equalise: largest values first, one job each per round, never below 0 (1 while possible)
    order = sorted(counts, key=lambda t: (-counts[t], t))
    floor = 1
    while diff != 0:
        step = 1 if diff > 0 else -1
        moved = False
        for t in order:
            if diff == 0:
                break
            if step < 0 and counts[t] <= floor:
                continue
            counts[t] += step
            diff -= step
            moved = True
        if not moved:
            floor = 0  # N < number of values: some values get no job
    return {t: c for t, c in counts.items() if c > 0}


def tmodel_estimates(
    run_times: FloatArray, max_estimate: int, rng: np.random.Generator
) -> tuple[FloatArray, FloatArray, int]:
    """Array form of the assignment: (estimates, run times truncated to ``max_estimate``, number of
    truncated run times), in the order of ``run_times``."""
    n = len(run_times)
    if n == 0:
        return np.empty(0), np.empty(0), 0
    hist = estimate_histogram(n, max_estimate, rng)
    ests = np.sort(np.repeat(np.array(list(hist), dtype=np.float64), list(hist.values())))[::-1].copy()
    runtimes = np.asarray(run_times, dtype=np.float64)
    truncated = int((runtimes > max_estimate).sum())
    runtimes = np.minimum(runtimes, float(max_estimate))
    order = np.argsort(-runtimes, kind="stable")
    sr = runtimes[order]
    short = np.flatnonzero(sr > ests)
    if short.size:
        j = int(short[0])
        raise OutOfRange(
            what="max_estimate",
            value=max_estimate,
            allowed=f"too small for these run times: the {j + 1}-th longest run time {sr[j]:.0f} s exceeds the "
            f"{j + 1}-th largest model estimate {ests[j]:.0f} s (raise the maximal estimate)",
        )
    # hi[j]: last position whose estimate is >= the j-th run time (estimates descending)
    hi_list = (np.searchsorted(-ests, -sr, side="right") - 1).tolist()
    u_list = rng.random(n).tolist()
    est_list = ests.tolist()
    chosen = [0.0] * n
    for j in range(n):
        k = j + int(u_list[j] * (hi_list[j] - j + 1))
        est_list[j], est_list[k] = est_list[k], est_list[j]
        chosen[j] = est_list[j]
    estimate_of = np.empty(n, dtype=np.float64)
    estimate_of[order] = chosen
    return estimate_of, runtimes, truncated


def assign_estimates_counted(
    jobs: Sequence[WorkloadJob], max_estimate: int, rng: np.random.Generator
) -> tuple[list[WorkloadJob], int]:
    """:func:`assign_estimates` plus the number of run times truncated to ``max_estimate``."""
    run = np.fromiter((j.run_time for j in jobs), dtype=np.float64, count=len(jobs))
    est, run, truncated = tmodel_estimates(run, max_estimate, rng)
    with gc_paused():
        out = [
            make_job(jb.id, jb.submit, r, jb.procs, e, jb.cpu_usage, jb.user, jb.priority, jb.deadline)
            for jb, r, e in zip(jobs, run.tolist(), est.tolist(), strict=True)
        ]
    return out, truncated


def assign_estimates(jobs: Sequence[WorkloadJob], max_estimate: int, rng: np.random.Generator) -> list[WorkloadJob]:
    """Copies of ``jobs`` with TModel estimates (every estimate >= the job's run time; run times above
    ``max_estimate`` are truncated to it, as the model does). ``max_estimate`` in seconds, >= 1 h."""
    return assign_estimates_counted(jobs, max_estimate, rng)[0]


def default_max_estimate(run_times: Sequence[float] | FloatArray) -> int:
    """Stand-in for the site's maximal estimate when a model gives none: the longest run time rounded
    up to a whole hour (at least 1 h), so that no run time is truncated."""
    longest = float(np.max(run_times)) if len(run_times) else 0.0
    return max(HOUR, math.ceil(longest / HOUR) * HOUR)


def _feasible(run_times: FloatArray, max_estimate: int, rng: np.random.Generator) -> bool:
    """Whether the histogram drawn from ``rng`` (a copy: the caller's stream does not move) gives
    the j-th longest run time an estimate at least as long, for every j (step 6's precondition)."""
    hist = estimate_histogram(len(run_times), max_estimate, copy.deepcopy(rng))
    ests = np.sort(np.repeat(np.array(list(hist), dtype=np.float64), list(hist.values())))[::-1]
    sr = np.sort(np.minimum(run_times, float(max_estimate)))[::-1]
    return bool(np.all(sr <= ests))


def feasible_max_estimate(run_times: Sequence[float] | FloatArray, rng: np.random.Generator,
                          max_steps: int = 400) -> int:
    """The default maximal estimate: the smallest whole hour, at least the longest run time (no run
    time is truncated), for which the model can give every job an estimate >= its run time with the
    histogram that ``rng`` will draw (``tmodel_estimates(run_times, M, rng)`` then cannot fail).

    :func:`default_max_estimate` alone is not enough: with few jobs the histogram may hold fewer long
    estimates than there are long run times (e.g. two jobs of 50 min but one estimate above 30 min).
    Candidates go up one hour at a time for a day, then by a quarter each step."""
    run = np.asarray(run_times, dtype=np.float64)
    m = default_max_estimate(run)
    if len(run) == 0:
        return m
    for step in range(max_steps):
        if _feasible(run, m, rng):
            return m
        m = m + HOUR if step < 24 else math.ceil(m * 1.25 / HOUR) * HOUR
    raise OutOfRange(what="max_estimate", value=m,
                     allowed=f"a maximal estimate for which TModel can cover these run times (none found in "
                     f"{max_steps} steps from {default_max_estimate(run)} s)")
