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
import operator
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from itertools import repeat
from typing import Any, overload

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

    jobs: Sequence[WorkloadJob]
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


_JOB_COLUMNS = ("id", "submit", "run_time", "procs", "estimate", "user", "priority")

_ONE: tuple[float, ...] = (1.0,)


class UsageColumn(Sequence[tuple[float, ...]]):
    """The CPU usage of a columnar workload's jobs, compact (issue 27): the usage of every process of
    a multi-process job as a 2-byte index into ``grid`` (the shared float objects of
    :mod:`vmctl.sim.workloads.usage`), job ``i``'s processes at ``codes[starts[i]:ends[i]]``; a job
    with ``starts[i] == ends[i]`` has one process at 100 % (``(1.0,)``). Indexing builds the tuple
    (equal to the one a list of tuples would hold); ``block(lo, hi)`` builds many at once. Over HPC2N
    this is ~5 MB where the tuples are ~16 MB: the simulator builds a job's tuple when it arrives and
    drops it when it ends."""

    __slots__ = ("codes", "ends", "grid", "starts")

    def __init__(self, grid: Any, codes: Any, starts: IntArray, ends: IntArray) -> None:
        self.grid = grid  # numpy object array of the shared floats
        self.codes = codes  # uint16 indices into grid, every process of the multi-process jobs
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.ends = np.ascontiguousarray(ends, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ends)

    def block(self, lo: int, hi: int) -> list[tuple[float, ...]]:
        """The usage tuples of jobs ``lo`` to ``hi - 1``."""
        if hi <= lo:
            return []
        starts, ends = self.starts[lo:hi], self.ends[lo:hi]
        multi = ends > starts
        if not multi.any():
            return [_ONE] * (hi - lo)
        sel = np.flatnonzero(multi)
        counts = ends[sel] - starts[sel]
        # the processes of the block's multi-process jobs, gathered in one go
        offsets = np.repeat(starts[sel] - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        values = self.grid[self.codes[offsets]].tolist()
        out = [_ONE] * (hi - lo)
        b = 0
        for j, c in zip(sel.tolist(), counts.tolist(), strict=True):
            out[j] = tuple(values[b:b + c])
            b += c
        return out

    @overload
    def __getitem__(self, i: int) -> tuple[float, ...]: ...

    @overload
    def __getitem__(self, i: slice) -> UsageColumn: ...

    def __getitem__(self, i: int | slice) -> tuple[float, ...] | UsageColumn:
        if isinstance(i, slice):
            return self.select(i)
        n = len(self.ends)
        k = operator.index(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("UsageColumn index out of range")
        return self.block(k, k + 1)[0]

    def select(self, which: Any) -> UsageColumn:
        """The jobs a slice, a boolean mask or an index array picks (the process indices shared)."""
        return UsageColumn(self.grid, self.codes, self.starts[which], self.ends[which])

    def __iter__(self) -> Iterator[tuple[float, ...]]:
        step = 4096
        for k in range(0, len(self.ends), step):
            yield from self.block(k, min(k + step, len(self.ends)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"UsageColumn({len(self)} jobs)"


class JobTable(Sequence[WorkloadJob]):
    """A workload's jobs as columns (issue 27): one numpy array per field instead of one
    :class:`WorkloadJob` per record, for jobs without CPU usage and deadline (what ``read_swf`` reads
    from a trace without a side file). It is a read-only sequence of ``WorkloadJob``: indexing or
    iterating builds the records (equal to the ones a list would hold), slicing and ``select`` give
    tables again, and the simulator reads the columns directly (``columns()``), so a 200,000-job trace
    holds ~11 MB of arrays instead of ~41 MB of objects.

    ``id``, ``procs``, ``user`` and ``priority`` are int64, ``submit``, ``run_time`` and ``estimate``
    float64, all of one length. ``cpu_usage`` is None (no job has one) or one usage tuple per job: a
    :class:`UsageColumn` (``with_cpu_usage`` on a table, ``vmctl sim run --trace``, issue 27) or a list."""

    __slots__ = ("cpu_usage", "estimate", "id", "priority", "procs", "run_time", "submit", "user")

    def __init__(self, id: IntArray, submit: FloatArray, run_time: FloatArray, procs: IntArray,
                 estimate: FloatArray, user: IntArray, priority: IntArray | None = None,
                 cpu_usage: Sequence[tuple[float, ...]] | None = None) -> None:
        n = len(id)
        self.cpu_usage = cpu_usage
        self.id = np.ascontiguousarray(id, dtype=np.int64)
        self.submit = np.ascontiguousarray(submit, dtype=np.float64)
        self.run_time = np.ascontiguousarray(run_time, dtype=np.float64)
        self.procs = np.ascontiguousarray(procs, dtype=np.int64)
        self.estimate = np.ascontiguousarray(estimate, dtype=np.float64)
        self.user = np.ascontiguousarray(user, dtype=np.int64)
        self.priority = (np.zeros(n, dtype=np.int64) if priority is None
                         else np.ascontiguousarray(priority, dtype=np.int64))
        if any(len(getattr(self, name)) != n for name in _JOB_COLUMNS) or (cpu_usage is not None
                                                                           and len(cpu_usage) != n):
            raise ValueError("JobTable: columns of different lengths")

    def __len__(self) -> int:
        return len(self.id)

    def _row(self, i: int) -> WorkloadJob:
        return make_job(int(self.id[i]), float(self.submit[i]), float(self.run_time[i]), int(self.procs[i]),
                        float(self.estimate[i]), None if self.cpu_usage is None else self.cpu_usage[i],
                        int(self.user[i]), int(self.priority[i]))

    @overload
    def __getitem__(self, i: int) -> WorkloadJob: ...

    @overload
    def __getitem__(self, i: slice) -> JobTable: ...

    def __getitem__(self, i: int | slice) -> WorkloadJob | JobTable:
        if isinstance(i, slice):
            return self.select(i)
        n = len(self.id)
        k = operator.index(i)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("JobTable index out of range")
        return self._row(k)

    def select(self, which: Any) -> JobTable:
        """The rows a slice, a boolean mask or an index array picks, as a table."""
        usage = self.cpu_usage
        if usage is not None:
            if isinstance(usage, UsageColumn):
                usage = usage.select(which)
            elif isinstance(which, slice):
                usage = usage[which]
            else:
                rows = np.arange(len(usage))[which]
                usage = list(map(usage.__getitem__, rows.tolist()))
        return _table({name: getattr(self, name)[which] for name in _JOB_COLUMNS}, usage)

    def with_usage(self, cpu_usage: Sequence[tuple[float, ...]] | None) -> JobTable:
        """The same jobs (the columns shared, not copied) with this CPU usage column."""
        return _table({name: getattr(self, name) for name in _JOB_COLUMNS}, cpu_usage)

    def with_submit(self, submit: FloatArray) -> JobTable:
        """The same jobs (the other columns shared) submitted at ``submit``."""
        cols = {name: getattr(self, name) for name in _JOB_COLUMNS}
        cols["submit"] = submit
        return _table(cols, self.cpu_usage)

    def columns(self) -> dict[str, list[Any]]:
        """Every column as a list of Python numbers (what the simulator keeps per job)."""
        return {name: getattr(self, name).tolist() for name in _JOB_COLUMNS}

    def __iter__(self) -> Iterator[WorkloadJob]:
        step = 4096  # records built a block at a time: no list of every record at once
        for k in range(0, len(self.id), step):
            cols = [getattr(self, name)[k:k + step].tolist() for name in _JOB_COLUMNS]
            usage: Any = repeat(None) if self.cpu_usage is None else self.cpu_usage[k:k + step]
            yield from map(make_job, cols[0], cols[1], cols[2], cols[3], cols[4], usage, cols[5], cols[6])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, JobTable):
            return (all(np.array_equal(getattr(self, n), getattr(other, n)) for n in _JOB_COLUMNS)
                    and (self.cpu_usage is None) == (other.cpu_usage is None)
                    and (self.cpu_usage is None or list(self.cpu_usage) == list(other.cpu_usage or ())))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"JobTable({len(self)} jobs)"


def _table(cols: dict[str, Any], usage: Sequence[tuple[float, ...]] | None) -> JobTable:
    return JobTable(cols["id"], cols["submit"], cols["run_time"], cols["procs"], cols["estimate"], cols["user"],
                    cols["priority"], usage)
