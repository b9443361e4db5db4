"""The Feitelson 1996 workload model (D. G. Feitelson, "Packing schemes for gang scheduling",
JSSPP 1996, LNCS 1162; "m_feitelson96"), the MEASY paper's FWload (sec. 3.1: 200,000 jobs, average
parallelism 23.4, average run time 2606.6 s, fewer than 18 % single-process jobs).

Structure (from the model's description; its exact hand-tuned constants could not be retrieved, see
docs/workloads.md, so the constants below are *stand-ins calibrated to the MEASY targets* on the
paper's 320-processor machine):

1. **Size**: a harmonic distribution of order 1.5, P(n) ~ n^-1.5 on 1..P, hand-tailored: the weight
   of size 1 is multiplied by ``SERIAL_WEIGHT`` and, with probability ``POW2_EXTRA``, the size is
   instead a power of two 2..P drawn uniformly (extra weight on powers of two). Calibrated so that
   on 320 processors 17.5 % of the jobs are serial and the mean size is 23.4.
2. **Run time**: hyper-exponential. The long branch (mean ``LONG_MEAN``) is taken with a probability
   growing linearly with size, from ``P_LONG_MIN`` for 1 process to ``P_LONG_MAX`` for the whole
   machine (the weak positive size/run-time correlation); else the short branch (mean
   ``SHORT_MEAN``). ``LONG_MEAN`` is calibrated so the mean run time on 320 processors is 2606.6 s.
   Run times are whole seconds, at least 1 s.
3. **Repeated executions**: a job is run k times, k ~ generalised Zipf P(k) ~ k^-2.5 on
   1..``MAX_REPEAT``; every repetition has the same size and run time (the same program) and is
   submitted when the previous run would end on a dedicated machine (previous submit + run time,
   think time 0: the simulator-independent approximation of "submitted when the previous one ends").
4. **Arrivals**: first submissions form a Poisson process; its default rate gives an offered load of
   ``DEFAULT_LOAD`` on the machine (MEASY rescales the load anyway, sec. 3.3).

Tiny example (P = 320): a 64-process job takes the long branch with probability
0.1 + 0.4 * 63/319 = 0.18; it is repeated twice with probability 2^-2.5 / zeta ~ 0.13.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from vmctl.errors import OutOfRange
from vmctl.sim.workloads.core import JobArrays, Workload

FloatArray = npt.NDArray[np.float64]

HARMONIC_ORDER = 1.5
SERIAL_WEIGHT = 0.3714  # stand-in, calibrated: 17.5 % serial jobs on 320 processors
POW2_EXTRA = 0.1178  # stand-in, calibrated: mean size 23.4 on 320 processors
SHORT_MEAN = 180.0  # s, stand-in
P_LONG_MIN = 0.10  # stand-in
P_LONG_MAX = 0.50  # stand-in
LONG_MEAN = 19125.1  # s, calibrated: mean run time 2606.6 s on 320 processors (see calibrate())
ZIPF_EXPONENT = 2.5
MAX_REPEAT = 64  # stand-in
DEFAULT_LOAD = 0.7
CALIBRATION_PROCS = 320
TARGET_MEAN_SIZE = 23.4
TARGET_MEAN_RUNTIME = 2606.6


def size_distribution(max_procs: int) -> FloatArray:
    """P(size = n) for n = 1..max_procs."""
    n = np.arange(1, max_procs + 1, dtype=np.float64)
    h = n**-HARMONIC_ORDER
    h[0] *= SERIAL_WEIGHT
    h /= h.sum()
    n_int = np.arange(1, max_procs + 1)
    pow2 = ((n_int & (n_int - 1)) == 0) & (n_int > 1)
    if not pow2.any():  # a 1-processor machine
        return h
    u = pow2 / pow2.sum()
    out: FloatArray = (1.0 - POW2_EXTRA) * h + POW2_EXTRA * u
    return out


def long_probability(sizes: FloatArray | np.ndarray, max_procs: int) -> FloatArray:
    frac = (np.asarray(sizes, dtype=np.float64) - 1.0) / max(1, max_procs - 1)
    out: FloatArray = P_LONG_MIN + (P_LONG_MAX - P_LONG_MIN) * frac
    return out


def repeat_distribution() -> FloatArray:
    k = np.arange(1, MAX_REPEAT + 1, dtype=np.float64)
    w = k**-ZIPF_EXPONENT
    out: FloatArray = w / w.sum()
    return out


def expected_stats(max_procs: int, long_mean: float = LONG_MEAN) -> dict[str, float]:
    """Model expectations (exact, no sampling): mean size, serial share, mean run time, mean work."""
    d = size_distribution(max_procs)
    n = np.arange(1, max_procs + 1, dtype=np.float64)
    p_long = long_probability(n, max_procs)
    run_n = (1 - p_long) * SHORT_MEAN + p_long * long_mean
    k = np.arange(1, MAX_REPEAT + 1, dtype=np.float64)
    return {
        "mean_size": float((d * n).sum()),
        "serial_share": float(d[0]),
        "mean_run_time": float((d * run_n).sum()),
        "mean_work": float((d * n * run_n).sum()),
        "mean_repeats": float((repeat_distribution() * k).sum()),
    }


def calibrate(max_procs: int = CALIBRATION_PROCS, target: float = TARGET_MEAN_RUNTIME) -> float:
    """The long-branch mean that gives mean run time ``target`` on ``max_procs`` processors
    (how ``LONG_MEAN`` was obtained; rerun it after changing the other constants)."""
    d = size_distribution(max_procs)
    n = np.arange(1, max_procs + 1, dtype=np.float64)
    p_long = float((d * long_probability(n, max_procs)).sum())
    return (target - (1 - p_long) * SHORT_MEAN) / p_long


def generate(n_jobs: int, max_procs: int, seed: int, *, load: float = DEFAULT_LOAD) -> Workload:
    """``n_jobs`` jobs (repetitions included) for ``max_procs`` processors, first submissions Poisson
    at the rate that offers ``load``. Run times and sizes only (estimate = run time, no CPU usage);
    :func:`vmctl.sim.workloads.generate_model` adds TModel estimates and CPU usage."""
    return sample(n_jobs, max_procs, seed, load=load).to_workload()


def sample(n_jobs: int, max_procs: int, seed: int, *, load: float = DEFAULT_LOAD) -> JobArrays:
    """:func:`generate` as arrays."""
    if n_jobs < 0:
        raise OutOfRange(what="n_jobs", value=n_jobs, allowed=">= 0")
    if max_procs < 1:
        raise OutOfRange(what="max_procs", value=max_procs, allowed="at least 1 processor")
    if not (load > 0 and math.isfinite(load)):
        raise OutOfRange(what="load", value=load, allowed="a positive number")
    ex = expected_stats(max_procs)
    # sessions per second so that work arrives at load * max_procs per second
    rate = load * max_procs / (ex["mean_repeats"] * ex["mean_work"])
    size_p = size_distribution(max_procs)
    rep_p = repeat_distribution()
    sessions = max(16, int(n_jobs / ex["mean_repeats"] * 1.2) + 16)
    while True:
        rng = np.random.default_rng(seed)
        starts = np.cumsum(rng.exponential(1.0 / rate, sessions))
        size = rng.choice(np.arange(1, max_procs + 1), size=sessions, p=size_p)
        long_branch = rng.random(sessions) < long_probability(size, max_procs)
        mean = np.where(long_branch, LONG_MEAN, SHORT_MEAN)
        run = np.maximum(1.0, np.rint(rng.exponential(1.0, sessions) * mean))
        reps = rng.choice(np.arange(1, MAX_REPEAT + 1), size=sessions, p=rep_p)
        total = int(reps.sum())
        first_index = np.repeat(np.cumsum(reps) - reps, reps)
        nth = np.arange(total) - first_index
        s_run = np.repeat(run, reps)
        submit = np.repeat(starts, reps) + nth * s_run
        # every job submitted before the last session started is complete (later sessions would
        # only add jobs after it), so the n_jobs earliest of those are exactly the model's
        complete = submit <= starts[-1]
        if int(complete.sum()) >= n_jobs:
            break
        sessions = int(sessions * 1.5) + 16
    sel = np.flatnonzero(complete)
    order = sel[np.argsort(submit[sel], kind="stable")][:n_jobs]
    return JobArrays(
        submit=submit[order],
        run_time=s_run[order],
        procs=np.repeat(size, reps)[order].astype(np.int64),
        max_procs=max_procs,
        source=f"feitelson96(n_jobs={n_jobs}, procs={max_procs}, seed={seed})",
        header={"Computer": "Feitelson 1996 model (m_feitelson96), MEASY-calibrated stand-ins"},
    )
