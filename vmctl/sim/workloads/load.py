"""Offered load and load scaling (MEASY sec. 3.3, after Feitelson's methodology).

``offered_load = sum(run_time * procs) / (procs_of_machine * span)`` where ``span`` is the time from
the first to the last submission. MEASY changes the load "by multiplying the interarrival times by a
factor": a model producing load 0.45 gets load 0.9 with factor 0.5. Run times and sizes are not
touched, so the job mix stays the same.

Example: two 1-process jobs of 100 s submitted at 0 and 100 on 1 processor: load = 200 / 100 = 2.0;
scaling to 1.0 multiplies the gap by 2 (submits 0 and 200).
"""

from __future__ import annotations

import math

from vmctl.errors import OutOfRange
from vmctl.sim.workloads.core import FloatArray, IntArray, JobTable, Workload, gc_paused, make_job


def _check_machine(procs: int) -> None:
    if procs <= 0:
        raise OutOfRange(what="procs", value=procs, allowed="a positive number of processors")


def _check_target(target_load: float) -> None:
    if not (target_load > 0 and math.isfinite(target_load)):
        raise OutOfRange(what="target load", value=target_load, allowed="a positive number")


def _load(work: float, machine: int, span: float, n: int) -> float:
    if n < 2 or span <= 0:
        raise OutOfRange(
            what="submission span", value=span, allowed="needs at least two jobs submitted at different times"
        )
    return work / (machine * span)


def load_factor(submit: FloatArray, run_time: FloatArray, procs: IntArray, machine: int, target_load: float) -> float:
    """Array form: the factor for the inter-arrival times that makes the offered load ``target_load``
    (``submit`` sorted)."""
    _check_machine(machine)
    _check_target(target_load)
    n = len(submit)
    span = float(submit[-1] - submit[0]) if n else 0.0
    current = _load(math.fsum((run_time * procs).tolist()), machine, span, n)
    return current / target_load


def offered_load(workload: Workload, procs: int | None = None) -> float:
    """Work submitted per unit of machine capacity over the submission span (see module docstring).
    ``procs`` defaults to the workload's machine size."""
    machine = workload.max_procs if procs is None else procs
    _check_machine(machine)
    jobs = workload.jobs
    if isinstance(jobs, JobTable):  # the columns (the same products, summed exactly either way)
        work = math.fsum((jobs.run_time * jobs.procs).tolist())
    else:
        work = math.fsum(j.run_time * j.procs for j in jobs)
    return _load(work, machine, workload.last_submit - workload.first_submit, len(workload.jobs))


def scale_to_load(workload: Workload, target_load: float, procs: int | None = None) -> Workload:
    """A new workload whose inter-arrival times are multiplied by one factor so that
    ``offered_load(result, procs) == target_load``. The first submit time stays where it was."""
    _check_target(target_load)
    current = offered_load(workload, procs)
    factor = current / target_load
    t0 = workload.first_submit
    if isinstance(workload.jobs, JobTable):  # a columnar workload stays columnar (same arithmetic per job)
        table = workload.jobs
        return Workload(
            jobs=table.with_submit(t0 + (table.submit - t0) * factor),
            max_procs=workload.max_procs,
            source=workload.source,
            dropped=dict(workload.dropped),
            shapes=dict(workload.shapes),
            header={**workload.header, "OfferedLoad": f"{target_load:.4g} (inter-arrivals x {factor:.6g})"},
        )
    with gc_paused():
        jobs = [
            make_job(j.id, t0 + (j.submit - t0) * factor, j.run_time, j.procs, j.estimate, j.cpu_usage, j.user,
                     j.priority,
                     # a deadline keeps its slack after the (moved) submission
                     None if j.deadline is None else j.deadline + (t0 + (j.submit - t0) * factor - j.submit))
            for j in workload.jobs
        ]
    return Workload(
        jobs=jobs,
        max_procs=workload.max_procs,
        source=workload.source,
        dropped=dict(workload.dropped),
        shapes=dict(workload.shapes),
        header={**workload.header, "OfferedLoad": f"{target_load:.4g} (inter-arrivals x {factor:.6g})"},
    )
