"""The Jann et al. 1997 workload model (J. Jann, P. Pattnaik, H. Franke, F. Wang, J. Skovira,
J. Riordan, "Modeling of workload in MPPs", JSSPP 1997, LNCS 1291), the MEASY paper's JWload
(sec. 3.1: 100,000 jobs, average parallelism 10.5, average run time 11267.0 s, about 40.8 %
single-process jobs).

Structure (from the paper's description on the Parallel Workloads Archive): the model was fitted to
the CTC SP2 batch partition, 25 Jun - 12 Sep 1996 (17,440 jobs). Job sizes are split into ranges;
each range has its own arrival stream and its own service (run) time distribution, each a
Hyper-Erlang distribution of common order (HErD) fitted to the first three moments: with probability
p an Erlang(n, lambda1), else an Erlang(n, lambda2), both with n stages.

Stand-in (the paper's parameter tables could not be retrieved; see docs/workloads.md): we refit the
model the way the paper describes, to the same data. :data:`CTC_MOMENTS` holds the first three raw
moments of the inter-arrival times and of the run times per size range, measured on the first 17,440
jobs of the cleaned CTC-SP2 log (``measure_moments`` recomputes them from the trace; a test checks
they agree), and :func:`fit_herd` turns three moments into HErD parameters (smallest order n that
matches them exactly). Size ranges are the powers of two 1, 2, 3-4, ..., 129-256, 257-max. The size
inside a range (the paper's rule is not available) is uniform by default (mean size 10.0 on 320
processors against MEASY's 10.5); ``size_rule="ctc_pow2"`` instead picks the range's power of two
with the share CTC users chose it in the window (:data:`CTC_POW2_SHARE`, e.g. 84 % of the 3-4 jobs
asked for 4), else uniform over the other sizes: 84 % power-of-two jobs as in CTC, but mean size 11.3
(CTC's non-power-of-two sizes sit low in their ranges).

Generation: one independent renewal stream per range with HErD inter-arrivals (ranges above the
machine are dropped, the top range is clipped to it); the streams are merged and the ``n_jobs``
earliest jobs kept; each job's run time is a HErD draw of its range, in whole seconds (>= 1 s).

Three-moment fit, tiny example: raw moments (1, 3, 15) are matched at order n = 1 by a
hyper-exponential taking branch means 1.707 and 0.293 with probability 1/2 each
(0.5 * 1.707 + 0.5 * 0.293 = 1, 2 * (0.5 * 1.707^2 + 0.5 * 0.293^2) = 3, 6 * (...) = 15).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike

import numpy as np
import numpy.typing as npt

from vmctl.errors import OutOfRange
from vmctl.sim.workloads.core import JobArrays, Workload

FloatArray = npt.NDArray[np.float64]

FIT_WINDOW_JOBS = 17_440
MAX_ORDER = 30

Moments = tuple[float, float, float]
MomentRow = tuple[int, int | None, int, Moments, Moments]

#: (lowest size, highest size or None = the machine, jobs in the window,
#:  inter-arrival moments E[X], E[X^2], E[X^3] (s, s^2, s^3), run-time moments (same units))
#: measured on the first 17,440 jobs of CTC-SP2-1996-3.1-cln (see measure_moments)
CTC_MOMENTS: tuple[MomentRow, ...] = (
    (1, 1, 7268, (871.401, 6705640.0, 129574000000.0), (13503.5, 553386000.0, 27933200000000.0)),
    (2, 2, 1706, (3657.39, 149113000.0, 12219000000000.0), (14284.1, 724536000.0, 41233700000000.0)),
    (3, 4, 2301, (2749.98, 68781000.0, 3279960000000.0), (7436.62, 308885000.0, 15197000000000.0)),
    (5, 8, 1763, (3568.48, 87174600.0, 3631000000000.0), (5261.6, 150110000.0, 6285090000000.0)),
    (9, 16, 2213, (2865.36, 51553800.0, 2167920000000.0), (8603.02, 303208000.0, 13477200000000.0)),
    (17, 32, 1087, (5978.16, 231076000.0, 19620300000000.0), (9221.4, 348203000.0, 16595700000000.0)),
    (33, 64, 759, (8368.45, 290938000.0, 15753600000000.0), (12630.2, 494660000.0, 24526700000000.0)),
    (65, 128, 197, (32189.5, 2734650000.0, 326965000000000.0), (13113.1, 644602000.0, 37035200000000.0)),
    (129, 256, 98, (64403.7, 30652000000.0, 2.11788e16), (1282.81, 8244970.0, 84255500000.0)),
    (257, None, 48, (138632.0, 115466000000.0, 1.99283e17), (9096.4, 435557000.0, 24214200000000.0)),
)

#: share of the jobs of each range (same order) whose size is the range's power of two, measured on
#: the same window (see measure_pow2_shares); CTC users favoured powers of two
CTC_POW2_SHARE: tuple[float, ...] = (1.0, 1.0, 0.841, 0.617, 0.634, 0.568, 0.602, 0.635, 0.204, 0.0)


@dataclass(frozen=True, slots=True)
class HErD:
    """Hyper-Erlang of common order: with probability ``p`` Erlang(order, rate1), else
    Erlang(order, rate2). ``mean1``/``mean2`` are the branch means (order / rate)."""

    p: float
    rate1: float
    rate2: float
    order: int

    @property
    def mean(self) -> float:
        return self.order * (self.p / self.rate1 + (1 - self.p) / self.rate2)

    def moment(self, k: int) -> float:
        c = math.prod(range(self.order, self.order + k))
        return c * (self.p / self.rate1**k + (1 - self.p) / self.rate2**k)

    def sample(self, n: int, rng: np.random.Generator) -> FloatArray:
        first = rng.random(n) < self.p
        scale = np.where(first, 1.0 / self.rate1, 1.0 / self.rate2)
        out: FloatArray = rng.gamma(float(self.order), 1.0, n) * scale
        return out


def fit_herd(m1: float, m2: float, m3: float, max_order: int = MAX_ORDER) -> HErD:
    """HErD matching the raw moments E[X], E[X^2], E[X^3] exactly, with the smallest order that can.

    For order n the normalised moments a_k = m_k / (n (n+1) ... (n+k-1)) must be those of a two-point
    distribution {1/rate1 w.p. p, 1/rate2 w.p. 1-p}; its two points are the roots of
    t^2 + c1 t + c0 with [[1, a1], [a1, a2]] (c0, c1) = -(a2, a3). When no order up to ``max_order``
    fits (data less variable than any two-branch HErD), an Erlang matching mean and variance is
    returned (p = 1) and the third moment is not matched.
    """
    if not (m1 > 0 and m2 > 0 and m3 > 0):
        raise OutOfRange(what="moments", value=(m1, m2, m3), allowed="positive")
    for n in range(1, max_order + 1):
        a1 = m1 / n
        a2 = m2 / (n * (n + 1))
        a3 = m3 / (n * (n + 1) * (n + 2))
        det = a2 - a1 * a1
        if det <= 0:
            continue
        c1 = (a1 * a2 - a3) / det
        c0 = (a1 * a3 - a2 * a2) / det
        disc = c1 * c1 - 4 * c0
        if disc < 0:
            continue
        root = math.sqrt(disc)
        u, v = (-c1 + root) / 2, (-c1 - root) / 2
        if v <= 0 or u <= v:
            continue
        p = (a1 - v) / (u - v)
        if 0 < p < 1:
            return HErD(p=p, rate1=1 / u, rate2=1 / v, order=n)
    cv2 = m2 / (m1 * m1) - 1
    order = max(1, min(max_order, round(1 / cv2))) if cv2 > 0 else max_order
    return HErD(p=1.0, rate1=order / m1, rate2=order / m1, order=order)


@dataclass(frozen=True, slots=True)
class SizeRange:
    low: int
    high: int
    arrival: HErD
    service: HErD
    pow2_share: float = -1.0  # < 0: uniform over the whole range

    def sample_sizes(self, n: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """Sizes inside the range: uniform when ``pow2_share`` < 0; else its power of two with
        probability ``pow2_share`` (when the range holds one) and uniform over the other sizes."""
        if self.pow2_share < 0:
            return rng.integers(self.low, self.high, size=n, endpoint=True)
        sizes = np.arange(self.low, self.high + 1, dtype=np.int64)
        is_pow2 = (sizes & (sizes - 1)) == 0
        others = sizes[~is_pow2]
        if not is_pow2.any() or others.size == 0:
            return rng.choice(sizes, size=n)
        pick_pow2 = rng.random(n) < self.pow2_share
        out: npt.NDArray[np.int64] = np.where(pick_pow2, sizes[is_pow2][0], rng.choice(others, size=n))
        return out


SIZE_RULES = ("uniform", "ctc_pow2")


def size_ranges(
    max_procs: int, table: Sequence[MomentRow] = CTC_MOMENTS, size_rule: str = "uniform"
) -> list[SizeRange]:
    """The fitted ranges for a machine of ``max_procs`` processors (ranges above it dropped, the top
    one clipped). ``size_rule``: ``uniform`` inside a range, or ``ctc_pow2`` (the range's power of
    two with CTC's share, :data:`CTC_POW2_SHARE`, else uniform over the other sizes)."""
    if size_rule not in SIZE_RULES:
        raise OutOfRange(what="size rule", value=size_rule, allowed=" | ".join(SIZE_RULES))
    out = []
    for (low, high, _count, ia, run), share in zip(table, CTC_POW2_SHARE, strict=True):
        if low > max_procs:
            continue
        top = max_procs if high is None else min(high, max_procs)
        out.append(SizeRange(low, top, fit_herd(*ia), fit_herd(*run), share if size_rule == "ctc_pow2" else -1.0))
    return out


def measure_moments(path: str | PathLike[str], n_jobs: int = FIT_WINDOW_JOBS) -> list[MomentRow]:
    """Recompute :data:`CTC_MOMENTS` from a trace (the first ``n_jobs`` jobs), rounded to 6 digits."""
    from vmctl.sim.workloads.swf import read_swf

    jobs = read_swf(path).jobs[:n_jobs]
    sizes = np.array([j.procs for j in jobs])
    runs = np.array([j.run_time for j in jobs])
    submits = np.array([j.submit for j in jobs])
    out: list[MomentRow] = []
    for low, high, _c, _ia, _run in CTC_MOMENTS:
        m = (sizes >= low) & (sizes <= (high if high is not None else sizes.max()))
        ia = np.diff(submits[m])
        rr = runs[m]

        def mom(x: FloatArray) -> Moments:
            return (
                float(f"{np.mean(x):.6g}"),
                float(f"{np.mean(x**2):.6g}"),
                float(f"{np.mean(x**3):.6g}"),
            )

        out.append((low, high, int(m.sum()), mom(ia), mom(rr)))
    return out


def measure_pow2_shares(path: str | PathLike[str], n_jobs: int = FIT_WINDOW_JOBS) -> list[float]:
    """Recompute :data:`CTC_POW2_SHARE` from a trace (the first ``n_jobs`` jobs), rounded to 3 digits."""
    from vmctl.sim.workloads.swf import read_swf

    sizes = np.array([j.procs for j in read_swf(path).jobs[:n_jobs]])
    out = []
    for low, high, _c, _ia, _run in CTC_MOMENTS:
        x = sizes[(sizes >= low) & (sizes <= (high if high is not None else sizes.max()))]
        out.append(round(float(((x & (x - 1)) == 0).mean()), 3) if x.size else 0.0)
    return out


def generate(n_jobs: int, max_procs: int, seed: int, *, size_rule: str = "uniform") -> Workload:
    """``n_jobs`` jobs for ``max_procs`` processors. Run times and sizes only (estimate = run time, no
    CPU usage); :func:`vmctl.sim.workloads.generate_model` adds TModel estimates and CPU usage."""
    return sample(n_jobs, max_procs, seed, size_rule=size_rule).to_workload()


def sample(n_jobs: int, max_procs: int, seed: int, *, size_rule: str = "uniform") -> JobArrays:
    """:func:`generate` as arrays."""
    if n_jobs < 0:
        raise OutOfRange(what="n_jobs", value=n_jobs, allowed=">= 0")
    if max_procs < 1:
        raise OutOfRange(what="max_procs", value=max_procs, allowed="at least 1 processor")
    ranges = size_ranges(max_procs, size_rule=size_rule)
    rng = np.random.default_rng(seed)
    total_rate = sum(1.0 / r.arrival.mean for r in ranges)
    horizon = 1.1 * n_jobs / total_rate + 1.0
    arrivals: list[FloatArray] = [np.empty(0) for _ in ranges]
    while True:
        for i, r in enumerate(ranges):
            # extend each stream past the horizon
            last = float(arrivals[i][-1]) if arrivals[i].size else 0.0
            while last <= horizon:
                chunk = max(64, int((horizon - last) / r.arrival.mean * 1.2) + 16)
                more = last + np.cumsum(r.arrival.sample(chunk, rng))
                arrivals[i] = np.concatenate([arrivals[i], more])
                last = float(more[-1])
        count = sum(int(np.searchsorted(a, horizon, side="right")) for a in arrivals)
        if count >= n_jobs:
            break
        horizon *= 1.5
    submit_parts, size_parts, run_parts = [], [], []
    for r, a in zip(ranges, arrivals, strict=True):
        a = a[a <= horizon]
        submit_parts.append(a)
        size_parts.append(r.sample_sizes(a.size, rng))
        run_parts.append(np.maximum(1.0, np.rint(r.service.sample(a.size, rng))))
    submit = np.concatenate(submit_parts)
    size = np.concatenate(size_parts)
    run = np.concatenate(run_parts)
    order = np.argsort(submit, kind="stable")[:n_jobs]
    return JobArrays(
        submit=submit[order],
        run_time=run[order],
        procs=size[order].astype(np.int64),
        max_procs=max_procs,
        source=f"jann97(n_jobs={n_jobs}, procs={max_procs}, seed={seed}, sizes={size_rule})",
        header={"Computer": "Jann et al. 1997 model (HErD per size range, refitted to CTC-SP2)"},
    )
