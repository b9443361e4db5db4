"""Actual CPU usage of every process (MEASY sec. 3.1 and 3.5.2).

The models and traces carry no CPU usage, so the MEASY paper assigns it:

- ``paper`` (sec. 3.1): a one-process job uses 100 % of its core; each process of a multi-process job
  uses U(40 %, 100 %) of its core (communication and synchronisation leave idle cycles);
- ``full`` (sec. 3.5.2, "all jobs use 100 % CPU"): every process uses 1.0.

Whether the *policy* may see these numbers (sec. 3.5.1 runs without CPU information) is decided by
the simulator (``SimConfig.cpu_info``, ``vmctl.sim.engine``); this module produces the actual usage.

Memory: a Feitelson workload of 200,000 jobs has about 4.7 million processes. A float object per
process would cost ~110 MB, so the U(0.40, 1.00) draw is made on a grid of 1e-4 (6,001 values) and
every tuple refers to the same 6,001 shared float objects: ~40 MB of tuple slots instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from vmctl.errors import OutOfRange
from vmctl.sim.workloads.core import JobTable, UsageColumn, Workload, WorkloadJob, gc_paused, make_job

UsageMode = Literal["paper", "full"]
USAGE_MODES: tuple[str, ...] = get_args(UsageMode)

USAGE_LOW = 0.40
USAGE_HIGH = 1.00
USAGE_STEP = 1e-4
_N_STEPS = round((USAGE_HIGH - USAGE_LOW) / USAGE_STEP)  # 6000 -> 6001 grid points
#: the shared float objects every usage tuple points to
_GRID: list[float] = [round(USAGE_LOW + i * USAGE_STEP, 4) for i in range(_N_STEPS + 1)]
_ONE: tuple[float, ...] = (1.0,)
IntArray = npt.NDArray[np.int64]


_GRID_OBJECTS = np.array(_GRID, dtype=object)


def usage_tuples(
    procs: Sequence[int] | IntArray, rng: np.random.Generator, mode: str = "paper"
) -> list[tuple[float, ...]]:
    """The per-process CPU usage of jobs with these process counts (see :func:`assign_cpu_usage`)."""
    if mode not in USAGE_MODES:
        raise OutOfRange(what="cpu usage mode", value=mode, allowed=" | ".join(USAGE_MODES))
    counts = np.asarray(procs, dtype=np.int64)
    if mode == "full":
        cache: dict[int, tuple[float, ...]] = {}
        out_full = []
        for p in counts.tolist():
            usage = cache.get(p)
            if usage is None:
                usage = cache[p] = (1.0,) * p
            out_full.append(usage)
        return out_full
    col = usage_column(counts, rng)
    n = len(counts)
    out: list[tuple[float, ...]] = []
    with gc_paused():  # a block at a time: the gather's temporaries stay small (issue 27)
        for k in range(0, n, 8192):
            out += col.block(k, min(k + 8192, n))
    return out


def usage_column(procs: Sequence[int] | IntArray, rng: np.random.Generator) -> UsageColumn:
    """The ``paper`` usage of :func:`usage_tuples` (the same draws), compact: 2 bytes a process
    instead of a tuple per job (:class:`~vmctl.sim.workloads.core.UsageColumn`)."""
    counts = np.asarray(procs, dtype=np.int64)
    draws = np.where(counts > 1, counts, 0)
    total = int(draws.sum())
    ends = np.cumsum(draws)
    # one draw for every process, in job order (the stream fixes the result); kept as grid indices
    codes = rng.integers(0, _N_STEPS, size=total, endpoint=True).astype(np.uint16)
    return UsageColumn(_GRID_OBJECTS, codes, ends - draws, ends)


def assign_cpu_usage(jobs: Sequence[WorkloadJob], rng: np.random.Generator, mode: str = "paper") -> list[WorkloadJob]:
    """Return copies of ``jobs`` with ``cpu_usage`` set (one entry per process) according to ``mode``.

    ``paper``: 1-process jobs -> (1.0,); each process of a wider job ~ U(0.40, 1.00) (1e-4 grid).
    ``full``: every process 1.0. Draws come from ``rng`` only, in job order, so a seed fixes the result.
    """
    usage = usage_tuples(np.fromiter((j.procs for j in jobs), dtype=np.int64, count=len(jobs)), rng, mode)
    with gc_paused():
        return [
            make_job(j.id, j.submit, j.run_time, j.procs, j.estimate, u, j.user, j.priority, j.deadline)
            for j, u in zip(jobs, usage, strict=True)
        ]


def with_cpu_usage(workload: Workload, rng: np.random.Generator, mode: str = "paper") -> Workload:
    """:func:`assign_cpu_usage` on a whole workload (a new Workload; the input is not changed). A
    columnar workload (``JobTable``, what ``read_swf`` gives) stays columnar: the same draws become its
    usage column, with no record per job (issue 27: ``vmctl sim run --trace`` over HPC2N)."""
    jobs = workload.jobs
    return Workload(
        jobs=(jobs.with_usage(usage_column(jobs.procs, rng) if mode == "paper" else usage_tuples(jobs.procs, rng, mode))
              if isinstance(jobs, JobTable) else assign_cpu_usage(jobs, rng, mode)),
        max_procs=workload.max_procs,
        source=workload.source,
        dropped=dict(workload.dropped),
        shapes=dict(workload.shapes),
        header={**workload.header, "CpuUsage": mode},
    )
