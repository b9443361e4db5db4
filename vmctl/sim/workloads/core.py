"""The workload record shared by the SWF reader, the workload models and the simulator.

A :class:`WorkloadJob` is what the simulator knows about a job *including* its future: the actual run
time on dedicated cores and the actual CPU usage of each process (MEASY sec. 3.1). The scheduler sees
only the :class:`vmctl.model.Job` the simulator makes of it (estimate instead of run time, CPU usage
only when the experiment says the policy may know it, MEASY sec. 3.5.1; ``vmctl.sim.engine``).

Memory: a 200,000-job workload is 200,000 slotted objects (no per-job ``__dict__``) and the CPU usage
tuples share their float objects (see :mod:`vmctl.sim.workloads.usage`), so a Feitelson workload with
~4.7 million processes stays around 60 MB.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from vmctl.model import JobShape

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    """One job of a workload.

    - ``submit``: submit time in seconds (trace time: not shifted to 0).
    - ``run_time``: actual run time in seconds on dedicated cores (> 0).
    - ``procs``: number of processes, one per core (> 0).
    - ``estimate``: the user's run-time estimate in seconds (> 0; may be below ``run_time`` in real
      traces: the simulator decides whether such a job is killed or overruns).
    - ``cpu_usage``: actual CPU utilization of each process on a dedicated core, in (0, 1], one entry
      per process; None when not assigned yet (SWF traces carry none).
    - ``user``: SWF user id, -1 when unknown.
    - ``priority``: the scheduling priority the policy sees (``Job.priority``, higher first); 0 unless
      the source gives one (SWF has no priority field: ``read_swf(..., priority_from_queue=True)`` takes
      the queue number, docs/workloads.md).
    - ``deadline``: the time (same base as ``submit``) the job should end by (``Job.deadline``), None
      when the source gives none (SWF has none; a policy may derive one from the estimate).
    """

    id: int
    submit: float
    run_time: float
    procs: int
    estimate: float
    cpu_usage: tuple[float, ...] | None
    user: int = -1
    priority: int = 0
    deadline: float | None = None


@dataclass(frozen=True, slots=True)
class Workload:
    """A list of jobs sorted by (submit, id) for a machine of ``max_procs`` processors.

    ``source`` says where the jobs came from (a path or a model name with its seed), ``dropped`` counts
    the records left out by reason, ``header`` holds the SWF header comments (``MaxProcs`` -> ``"128"``;
    repeated keys are joined with newlines). ``shapes`` maps a job id to its ``JobShape`` when the job
    is moldable or a task bag (absent = rigid; :mod:`vmctl.sim.workloads.shapes` derives them from
    rigid jobs); the shape lives beside the job record, so rigid workloads carry nothing extra.
    """

    jobs: list[WorkloadJob]
    max_procs: int
    source: str
    dropped: dict[str, int] = field(default_factory=dict)
    header: dict[str, str] = field(default_factory=dict)
    shapes: dict[int, JobShape] = field(default_factory=dict)

    @property
    def first_submit(self) -> float:
        """Submit time of the first job (0.0 for an empty workload). Cleaned traces do not start at 0."""
        return self.jobs[0].submit if self.jobs else 0.0

    @property
    def last_submit(self) -> float:
        return self.jobs[-1].submit if self.jobs else 0.0

    def __len__(self) -> int:
        return len(self.jobs)


_new_object = object.__new__
_SETTERS: tuple[Any, ...] = tuple(WorkloadJob.__dict__[f.name].__set__ for f in fields(WorkloadJob))
(_set_id, _set_submit, _set_run, _set_procs, _set_est, _set_usage, _set_user, _set_priority,
 _set_deadline) = _SETTERS


def make_job(
    id: int, submit: float, run_time: float, procs: int, estimate: float, cpu_usage: tuple[float, ...] | None,
    user: int, priority: int = 0, deadline: float | None = None,
) -> WorkloadJob:
    """Bulk constructor: the same object as ``WorkloadJob(...)``, built through the slot descriptors
    instead of the frozen dataclass ``__init__`` (which routes every field through
    ``object.__setattr__``): about 1.6x faster, which matters for 200,000-job workloads."""
    job: WorkloadJob = _new_object(WorkloadJob)
    _set_id(job, id)
    _set_submit(job, submit)
    _set_run(job, run_time)
    _set_procs(job, procs)
    _set_est(job, estimate)
    _set_usage(job, cpu_usage)
    _set_user(job, user)
    _set_priority(job, priority)
    _set_deadline(job, deadline)
    return job


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small objects (none of them cyclic):
    it otherwise rescans the growing job list again and again and triples the build time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(frozen=True, slots=True)
class JobArrays:
    """A workload as parallel arrays, sorted by submit time (what the models produce before estimates
    and CPU usage are added; building the job objects once at the end is what keeps a 200,000-job
    model workload quick). Job ids are 1..n in this order."""

    submit: FloatArray
    run_time: FloatArray
    procs: IntArray
    max_procs: int
    source: str
    header: dict[str, str]

    def __len__(self) -> int:
        return len(self.submit)

    def to_workload(
        self, estimate: FloatArray | None = None, cpu_usage: list[tuple[float, ...]] | None = None
    ) -> Workload:
        """Job objects with ids 1..n; the estimate defaults to the run time (perfect estimates)."""
        n = len(self.submit)
        est = self.run_time if estimate is None else estimate
        usage: list[tuple[float, ...] | None] = [None] * n if cpu_usage is None else list(cpu_usage)
        with gc_paused():
            jobs = list(
                map(
                    make_job,
                    range(1, n + 1),
                    self.submit.tolist(),
                    self.run_time.tolist(),
                    self.procs.tolist(),
                    est.tolist(),
                    usage,
                    [-1] * n,
                )
            )
        return Workload(jobs=jobs, max_procs=self.max_procs, source=self.source, header=dict(self.header))
