"""Instance generator of sec. 4.1 and the Lublin-Feitelson job-size model used in sec. 5.

Sequential instances: ``hosts`` hosts, ``tasks`` tasks; CPU needs drawn from a normal distribution
with mean 0.5 and coefficient of variation ``cv_cpu``; memory needs from a normal with mean
``hosts * (1 - slack) / tasks`` and coefficient of variation ``cv_mem``; both truncated to (0, 1] by
redrawing the values outside (the paper: "truncated so that values are between 0 and 1"). The
instance is not guaranteed to be feasible.

Parallel instances (sec. 5): job sizes from the Lublin & Feitelson (2003) model, whole-sample
parameters (SerialProb 0.244, Pow2Prob 0.576, ULow 0.8, UProb 0.86) with UHi = log2(max size) and
UMed = UHi - 2.5 as the model's authors advise when rescaling (``../shared/notes``, sec. 3.1):
u ~ U(0,1); u <= SerialProb gives a serial job; otherwise log2(size) is two-stage uniform
(U(ULow, UMed) with probability UProb, else U(UMed, UHi)) and rounded to an integer when
u <= SerialProb + Pow2Prob; size = round(2^x) clipped to [1, max]. Jobs are drawn until the task
count is reached (the last job is cut to fit). Each job draws one CPU and one memory need for all of
its tasks, with the same distributions (memory mean per task as above).

All draws come from the ``numpy.random.Generator`` passed in: same seed, same instances.
"""

from __future__ import annotations

import math

import numpy as np

from vmctl.policies.vcsched.instance import FloatArray, Instance

MEAN_CPU = 0.5

# Lublin & Feitelson whole-sample size parameters
SERIAL_PROB = 0.244
POW2_PROB = 0.576
U_LOW = 0.8
U_PROB = 0.86


def truncated_normal(rng: np.random.Generator, mean: float, cv: float, size: int) -> FloatArray:
    """Normal(mean, (cv*mean)^2) redrawn until in (0, 1]."""
    if not mean > 0.0:
        raise ValueError(f"mean must be > 0, got {mean}")
    if cv <= 0:
        return np.full(size, min(mean, 1.0))
    out = np.empty(size)
    todo = np.arange(size)
    for _ in range(1000):
        draw = rng.normal(mean, cv * mean, todo.size)
        ok = (draw > 0.0) & (draw <= 1.0)
        out[todo[ok]] = draw[ok]
        todo = todo[~ok]
        if todo.size == 0:
            return out
    out[todo] = min(max(mean, 1e-6), 1.0)  # distribution almost entirely outside (0, 1]
    return out


def _check(hosts: int, tasks: int, slack: float, cv_mem: float, cv_cpu: float) -> None:
    if hosts < 1 or tasks < 1:
        raise ValueError("hosts and tasks must be >= 1")
    if not 0.0 <= slack < 1.0:
        raise ValueError(f"slack must be in [0, 1), got {slack}")
    if cv_mem < 0 or cv_cpu < 0:
        raise ValueError("coefficients of variation must be >= 0")


def generate(hosts: int, tasks: int, slack: float, cv_mem: float, cv_cpu: float, rng: np.random.Generator) -> Instance:
    _check(hosts, tasks, slack, cv_mem, cv_cpu)
    mem = truncated_normal(rng, hosts * (1.0 - slack) / tasks, cv_mem, tasks)
    cpu = truncated_normal(rng, MEAN_CPU, cv_cpu, tasks)
    return Instance.sequential(hosts, cpu.tolist(), mem.tolist())


def lublin_sizes(n: int, max_size: int, rng: np.random.Generator) -> list[int]:
    """``n`` job sizes in 1..max_size from the Lublin-Feitelson two-stage log-uniform model."""
    if max_size < 1:
        raise ValueError("max_size must be >= 1")
    u_hi = math.log2(max_size)
    u_med = max(U_LOW, u_hi - 2.5)
    sizes: list[int] = []
    for _ in range(n):
        u = rng.random()
        if u <= SERIAL_PROB or max_size == 1:
            sizes.append(1)
            continue
        x = rng.uniform(U_LOW, u_med) if rng.random() <= U_PROB else rng.uniform(u_med, u_hi)
        if u <= SERIAL_PROB + POW2_PROB:
            x = round(x)
        sizes.append(int(min(max(round(2.0**x), 1), max_size)))
    return sizes


def generate_parallel(
    hosts: int,
    tasks: int,
    slack: float,
    cv_mem: float,
    cv_cpu: float,
    rng: np.random.Generator,
    max_job_size: int = 64,
) -> Instance:
    _check(hosts, tasks, slack, cv_mem, cv_cpu)
    jobs: list[tuple[int, float, float]] = []
    total = 0
    mean_mem = hosts * (1.0 - slack) / tasks
    while total < tasks:
        k = min(lublin_sizes(1, max_job_size, rng)[0], tasks - total)
        c = float(truncated_normal(rng, MEAN_CPU, cv_cpu, 1)[0])
        m = float(truncated_normal(rng, mean_mem, cv_mem, 1)[0])
        jobs.append((k, c, m))
        total += k
    return Instance.parallel(hosts, jobs)
