"""Moldable and task-bag shapes derived from rigid workload jobs (``vmctl sim run --shapes``).

Traces and the classic models record rigid jobs: ``procs`` processors for ``run_time`` seconds. The
moldable-job and task-bag papers (HSRET, paper 002; Lin, Liu et al., paper 001) need jobs of another
shape, so a rule turns each rigid job into one, keeping the recorded run at its recorded size:

- ``moldable``: the allowed widths are ``procs // 4``, ``procs // 2``, ``procs`` and ``2 * procs``
  (each at least 1 and at most the machine, duplicates removed: a one-processor job may run on 1 or
  2). Times follow Downey's speedup model (:class:`vmctl.speedup.Downey`) with average parallelism
  ``A = procs`` (the size the user asked for is taken as the program's average parallelism) and
  ``sigma = 1`` (moderate variance, between Downey's low- and high-variance families), scaled so that
  the time at ``procs`` is the user's ``estimate`` (the shape is the forecast the policy sees, as the
  estimate is for a rigid job): ``time(w) = estimate * S(procs) / S(w)``. A serial job (``procs = 1``,
  so ``A = 1``) gains nothing from a second processor.
- ``task-bag``: one task per processor, each of the job's ``estimate`` seconds of work (paper 001's
  jobs are bags of independent tasks; issue 12 suggests this reading of a trace), holding at most
  ``procs`` workers. At full width it runs as the rigid job did; on ``k`` workers, ``ceil(procs / k)``
  rounds of tasks.

The execution models run each job as long as its record says at ``procs`` (``min(run_time,
estimate)``) and in proportion to the shape at other widths (:mod:`vmctl.sim.exec_moldable`,
"Forecasts"), so a policy that knows only rigid jobs gives the same results on a shaped workload as on
the rigid one.
- ``rigid`` (the default): no shapes.

The shapes go into ``Workload.shapes`` beside the job records (job id -> shape); the job records,
``procs`` included, stay as they were, so a policy that knows only rigid jobs runs the job at
``procs`` (one of its widths under both rules).
"""

from __future__ import annotations

from typing import Literal

from vmctl.errors import ValidationError
from vmctl.model import JobShape
from vmctl.sim.workloads.core import Workload, WorkloadJob
from vmctl.speedup import Downey

ShapeRule = Literal["rigid", "moldable", "task-bag"]
SHAPE_RULES: tuple[ShapeRule, ...] = ("rigid", "moldable", "task-bag")
#: Downey's variance of the ``moldable`` rule (its average parallelism is each job's ``procs``)
MOLDABLE_SIGMA = 1.0


def moldable_widths(procs: int, max_procs: int) -> tuple[int, ...]:
    """``procs // 4``, ``procs // 2``, ``procs``, ``2 * procs`` within [1, max_procs], increasing."""
    return tuple(sorted({min(max(1, w), max_procs) for w in (procs // 4, procs // 2, procs, 2 * procs)}))


def derive_shape(job: WorkloadJob, rule: ShapeRule, max_procs: int) -> JobShape | None:
    """The shape ``rule`` gives a rigid job (None for ``rigid``, and for a job wider than the
    machine, which the simulator drops anyway)."""
    procs = job.procs
    if rule == "rigid" or procs > max_procs:
        return None
    if rule == "task-bag":
        return JobShape("task-bag", (procs,), tasks=(job.estimate,) * procs)
    if rule != "moldable":
        raise ValidationError(field="--shapes", problem=f"must be one of {', '.join(SHAPE_RULES)}, got {rule!r}")
    model = Downey(A=float(procs), sigma=MOLDABLE_SIGMA)
    at_procs = job.estimate * model.speedup(procs)
    widths = moldable_widths(procs, max_procs)
    times = tuple(job.estimate if w == procs else at_procs / model.speedup(w) for w in widths)
    return JobShape("moldable", widths, times, speedup=model)


def with_shapes(workload: Workload, rule: ShapeRule) -> Workload:
    """A new Workload whose ``shapes`` hold ``rule``'s shape of every job (the jobs are shared)."""
    if rule not in SHAPE_RULES:
        raise ValidationError(field="--shapes", problem=f"must be one of {', '.join(SHAPE_RULES)}, got {rule!r}")
    shapes: dict[int, JobShape] = {}
    for job in workload.jobs:
        shape = derive_shape(job, rule, workload.max_procs)
        if shape is not None:
            shapes[job.id] = shape
    return Workload(jobs=workload.jobs, max_procs=workload.max_procs, source=workload.source,
                    dropped=dict(workload.dropped), header={**workload.header, "Shapes": rule}, shapes=shapes)
