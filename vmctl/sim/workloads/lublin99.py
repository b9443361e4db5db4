"""The Lublin-Feitelson workload model (U. Lublin and D. G. Feitelson, "The workload on parallel
supercomputers: modeling the characteristics of rigid jobs", JPDC 63(11), 2003; "m_lublin99").

Two job classes, batch and interactive, each with its own parameters and its own arrival stream; the
next job is taken from the class whose next arrival comes first. Per job (gamma(a, b) = shape a,
scale b; parameters in :data:`PARAMS`, from the authors' published generator, see
shared/notes/workload-models.md 3.1):

1. **Size**: u ~ U(0,1); u <= SerialProb -> 1 process. Otherwise par ~ two-stage uniform in log2
   units (with probability UProb U(ULow, UMed), else U(UMed, UHi)); if u <= SerialProb + Pow2Prob,
   par is rounded to an integer (a power-of-two job); size = round(2^par), at most the machine.
2. **Run time** correlated with size: p = pa * size + pb clamped to [0, 1]; with probability p
   g ~ gamma(a1, b1), else gamma(a2, b2), redrawn while g > 12; run time = e^g seconds (whole
   seconds, at least 1 s: SWF traces record whole seconds).
3. **Arrivals** with a daily cycle: 48 half-hour buckets weighted by a gamma(anum, bnum) density
   (cycle starting at bucket 11), normalised to mean 1. Each arrival draws g ~ gamma(aarr * arar,
   barr) (redrawn while g > 13) and adds e^g / 1800 "points" to its class's balance; the balance pays
   each bucket's weight in turn (1800 s per bucket); the remainder is the position inside the bucket.
   The day starts at 0:00 at time 0.

Machine size: the published UHi = 7 (batch, whole sample) is log2 of the 128-node machine the model
was fitted to. For a machine of P processors UHi and UMed of every class move by log2(P) - 7 (so
UMed - UHi is kept, as the authors' code advises, and interactive jobs stay smaller than batch
jobs); ULow stays (clipped below UMed).

Classes: ``generate`` uses the single-class "whole sample" parameters by default. The two-class mode
(``classes=("batch", "interactive")``) is implemented as described, but with these parameters the
interactive stream arrives ~6x as often as the batch one, so 86 % of the jobs are interactive, 8 %
run longer than 5,000 s and the mean gap is 540 s on 256 processors, while the whole-sample fit of
the same data gives 32 % and 890 s; a 10,000-job sample produced by the authors' generator for 256
nodes (``lublin_256.swf`` in DIR-LAB/deep-batch-scheduler: one job class, about 37 % of jobs above
5,000 s, mean gap ~830 s over its first 250 jobs) agrees with the whole-sample mode. The class mix of
the original two-class generator could therefore not be validated; use it knowingly.

Tiny example: on 128 processors about 29 % of batch jobs are serial; a batch job of 32 processes is
in the short run-time branch with probability 0.6986 - 0.003 * 32 = 0.60 (median e^5.4 ~ 4 min),
else in the long one (median e^10 ~ 6 h).

:func:`lublin_sizes` exposes step 1 alone (vcsched uses it for task counts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from vmctl.errors import OutOfRange
from vmctl.sim.workloads.core import JobArrays, Workload

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ClassParams:
    serial_prob: float
    pow2_prob: float
    ulow: float
    umed: float
    uhi: float
    uprob: float
    a1: float
    b1: float
    a2: float
    b2: float
    pa: float
    pb: float
    aarr: float
    barr: float
    anum: float
    bnum: float
    arar: float


PARAMS: dict[str, ClassParams] = {
    "batch": ClassParams(
        .2927, .6686, 1.2, 5, 7, .875, 6.57, .823, 639.1, .0156, -.003, .6986, 6.0415, .8531, 6.1271, 5.2740, 1.0519
    ),
    "interactive": ClassParams(
        .1541, .625, 1, 3, 5.5, .705, 3.8351, .6605, 7.073, .6856, -.0118, .9156, 6.5510, .6621, 8.9186, 3.6680, .9797
    ),
    "whole": ClassParams(
        .244, .576, .8, 4.5, 7, .86, 4.2, .94, 312, .03, -.0054, .78, 10.2303, .4871, 8.1737, 3.9631, 1.0225
    ),
}  # fmt: skip

FITTED_LOG2_MACHINE = 7.0  # the model was fitted to a 128-node machine
MAX_LOG_RUNTIME = 12.0
MAX_LOG_INTERARRIVAL = 13.0
BUCKETS = 48
BUCKET_SECONDS = 1800.0
CYCLE_START = 11


def _size_params(p: ClassParams, max_size: int) -> tuple[float, float, float]:
    shift = math.log2(max_size) - FITTED_LOG2_MACHINE
    uhi = max(0.0, p.uhi + shift)
    umed = min(uhi, max(0.0, p.umed + shift))
    ulow = min(p.ulow, umed)
    return ulow, umed, uhi


def _sizes(p: ClassParams, n: int, max_size: int, rng: np.random.Generator) -> IntArray:
    if max_size < 1:
        raise OutOfRange(what="max_size", value=max_size, allowed="at least 1 processor")
    ulow, umed, uhi = _size_params(p, max_size)
    u = rng.random(n)
    low_stage = rng.random(n) < p.uprob
    par = np.where(low_stage, rng.uniform(ulow, umed, n), rng.uniform(umed, uhi, n))
    par = np.where(u <= p.serial_prob + p.pow2_prob, np.rint(par), par)
    size = np.rint(np.exp2(par)).astype(np.int64)
    size[u <= p.serial_prob] = 1
    return np.clip(size, 1, max_size)


def lublin_sizes(n: int, max_size: int, rng: np.random.Generator, job_class: str = "batch") -> IntArray:
    """``n`` job sizes (1..max_size) from the model's two-stage log-uniform size distribution."""
    if job_class not in PARAMS:
        raise OutOfRange(what="job class", value=job_class, allowed=" | ".join(PARAMS))
    return _sizes(PARAMS[job_class], n, max_size, rng)


def _bounded_gamma(shape: float, scale: float, cap: float, n: int, rng: np.random.Generator) -> FloatArray:
    """gamma(shape, scale) draws, each redrawn while above ``cap``."""
    g = rng.gamma(shape, scale, n)
    bad = g > cap
    while bad.any():
        g[bad] = rng.gamma(shape, scale, int(bad.sum()))
        bad = g > cap
    return g


def _runtimes(p: ClassParams, sizes: IntArray, rng: np.random.Generator) -> FloatArray:
    n = len(sizes)
    prob_first = np.clip(p.pa * sizes + p.pb, 0.0, 1.0)
    first = rng.random(n) < prob_first
    g = np.where(
        first,
        _bounded_gamma(p.a1, p.b1, MAX_LOG_RUNTIME, n, rng),
        _bounded_gamma(p.a2, p.b2, MAX_LOG_RUNTIME, n, rng),
    )
    return np.maximum(1.0, np.rint(np.exp(g)))


def daily_weights(p: ClassParams) -> list[float]:
    """Relative arrival intensity of the 48 half-hour buckets of a day (mean 1)."""
    # Imported here: scipy.stats costs over a second to import, and every `vmctl sim` run reading a
    # trace imports this package.
    from scipy import stats

    w = [0.0] * BUCKETS
    for i in range(CYCLE_START, CYCLE_START + BUCKETS):
        w[(i - 1) % BUCKETS] = float(stats.gamma.cdf(i + 0.5, p.anum, scale=p.bnum)) - float(
            stats.gamma.cdf(i - 0.5, p.anum, scale=p.bnum)
        )
    mean = sum(w) / BUCKETS
    return [x / mean for x in w]


def _arrivals(p: ClassParams, n: int, rng: np.random.Generator, arrival_scale: float) -> FloatArray:
    w = daily_weights(p)
    g = _bounded_gamma(p.aarr * p.arar, p.barr, MAX_LOG_INTERARRIVAL, n, rng)
    gaps = (np.exp(g) * arrival_scale / BUCKET_SECONDS).tolist()
    out = np.empty(n, dtype=np.float64)
    bucket = 0
    bucket_start = 0.0
    points = 0.0
    for i, gap in enumerate(gaps):
        points += gap
        while points > w[bucket]:
            points -= w[bucket]
            bucket = (bucket + 1) % BUCKETS
            bucket_start += BUCKET_SECONDS
        out[i] = bucket_start + BUCKET_SECONDS * points / w[bucket]
    return out


def generate(
    n_jobs: int,
    max_procs: int,
    seed: int,
    *,
    classes: tuple[str, ...] = ("whole",),
    arrival_scale: float = 1.0,
) -> Workload:
    """``n_jobs`` jobs for a machine of ``max_procs`` processors. ``classes`` are the job classes with
    their own arrival streams (default: the single-class "whole sample" parameters; see the module
    docstring about ``("batch", "interactive")``). ``arrival_scale`` multiplies the inter-arrival times (load knob).
    Run times and sizes only (estimate = run time, no CPU usage);
    :func:`vmctl.sim.workloads.generate_model` adds TModel estimates and CPU usage."""
    return sample(n_jobs, max_procs, seed, classes=classes, arrival_scale=arrival_scale).to_workload()


def sample(
    n_jobs: int,
    max_procs: int,
    seed: int,
    *,
    classes: tuple[str, ...] = ("whole",),
    arrival_scale: float = 1.0,
) -> JobArrays:
    """:func:`generate` as arrays."""
    if n_jobs < 0:
        raise OutOfRange(what="n_jobs", value=n_jobs, allowed=">= 0")
    if max_procs < 1:
        raise OutOfRange(what="max_procs", value=max_procs, allowed="at least 1 processor")
    for c in classes:
        if c not in PARAMS:
            raise OutOfRange(what="job class", value=c, allowed=" | ".join(PARAMS))
    rng = np.random.default_rng(seed)
    submits: list[FloatArray] = []
    sizes: list[IntArray] = []
    runs: list[FloatArray] = []
    for c in classes:
        p = PARAMS[c]
        # each stream generates n_jobs candidates; the merge keeps the n_jobs earliest overall
        s = _sizes(p, n_jobs, max_procs, rng)
        sizes.append(s)
        runs.append(_runtimes(p, s, rng))
        submits.append(_arrivals(p, n_jobs, rng, arrival_scale))
    submit = np.concatenate(submits)
    size = np.concatenate(sizes)
    run = np.concatenate(runs)
    order = np.argsort(submit, kind="stable")[:n_jobs]
    return JobArrays(
        submit=submit[order],
        run_time=run[order],
        procs=size[order].astype(np.int64),
        max_procs=max_procs,
        source=f"lublin99(n_jobs={n_jobs}, procs={max_procs}, seed={seed}, classes={'+'.join(classes)})",
        header={"Computer": "Lublin-Feitelson 2003 model (m_lublin99)"},
    )
