"""VCSCHED problem instances and solutions (Casanova et al., RR-6692, sec. 2.3 and sec. 5.1).

An instance has ``H`` identical hosts and a list of tasks. Task ``i`` needs ``cpu[i]`` (alpha_i,
the fraction of one host's CPU it would use alone, in (0, 1]) and ``mem[i]`` (m_i, the fraction
of one host's memory it needs, in [0, 1]). Tasks belong to jobs (``job[i]``); a sequential
workload has one task per job, a parallel job (sec. 5) has several tasks with the same needs, and
all tasks of a job must receive the same CPU allocation.

A solution places every task on one host (``hosts[i]``) and gives it a CPU fraction
``alloc[i] <= cpu[i]``; host ``j`` must hold ``sum alloc <= 1`` and ``sum mem <= 1``. The yield of
a job is its allocation divided by its need; VCSCHED maximizes the minimum yield.

Tiny example (sec. 2.3): 2 hosts, 3 tasks of cpu 0.6: two tasks share a host at 0.5 each, the
third is alone at 0.6; minimum yield 0.5 / 0.6 = 0.833.

This module is pure: ``instance_from_dict`` validates an already-parsed JSON document and names
the JSON path of what is wrong; reading the file is the caller's job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from vmctl.errors import InstanceFormatError

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Status = Literal["ok", "infeasible", "timeout"]

#: numerical slack on capacity checks (sums of float fractions)
EPS = 1e-9


@dataclass(frozen=True)
class Instance:
    hosts: int
    cpu: tuple[float, ...]
    mem: tuple[float, ...]
    #: job index of each task; jobs are numbered 0..n_jobs-1 and a job's tasks share cpu and mem
    job: tuple[int, ...] = ()
    _arrays: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.cpu) != len(self.mem):
            raise ValueError("cpu and mem must have the same length")
        if not self.job:
            object.__setattr__(self, "job", tuple(range(len(self.cpu))))
        elif len(self.job) != len(self.cpu):
            raise ValueError("job must have one entry per task")

    # -- sizes
    @property
    def n_tasks(self) -> int:
        return len(self.cpu)

    @property
    def n_jobs(self) -> int:
        return (max(self.job) + 1) if self.job else 0

    @property
    def is_parallel(self) -> bool:
        return self.n_jobs != self.n_tasks

    # -- numpy views (cached; the dataclass is frozen so they never go stale)
    def _arr(self, name: str) -> Any:
        cached = self._arrays.get(name)
        if cached is None:
            if name == "cpu":
                cached = np.asarray(self.cpu, dtype=np.float64)
            elif name == "mem":
                cached = np.asarray(self.mem, dtype=np.float64)
            else:
                cached = np.asarray(self.job, dtype=np.int64)
            cached.setflags(write=False)
            self._arrays[name] = cached
        return cached

    @property
    def cpu_a(self) -> FloatArray:
        arr: FloatArray = self._arr("cpu")
        return arr

    @property
    def mem_a(self) -> FloatArray:
        arr: FloatArray = self._arr("mem")
        return arr

    @property
    def job_a(self) -> IntArray:
        arr: IntArray = self._arr("job")
        return arr

    def job_tasks(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.n_jobs)]
        for i, j in enumerate(self.job):
            out[j].append(i)
        return out

    def to_dict(self) -> dict[str, Any]:
        if not self.is_parallel:
            return {
                "hosts": self.hosts,
                "tasks": [{"cpu": c, "mem": m} for c, m in zip(self.cpu, self.mem, strict=True)],
            }
        jobs = []
        for tasks in self.job_tasks():
            first = tasks[0]
            jobs.append({"tasks": len(tasks), "cpu": self.cpu[first], "mem": self.mem[first]})
        return {"hosts": self.hosts, "jobs": jobs}

    @staticmethod
    def sequential(hosts: int, cpu: Sequence[float], mem: Sequence[float]) -> Instance:
        return Instance(hosts=hosts, cpu=tuple(float(c) for c in cpu), mem=tuple(float(m) for m in mem))

    @staticmethod
    def parallel(hosts: int, jobs: Sequence[tuple[int, float, float]]) -> Instance:
        """``jobs`` holds (tasks, cpu, mem) per job."""
        cpu: list[float] = []
        mem: list[float] = []
        job: list[int] = []
        for j, (k, c, m) in enumerate(jobs):
            cpu += [float(c)] * k
            mem += [float(m)] * k
            job += [j] * k
        return Instance(hosts=hosts, cpu=tuple(cpu), mem=tuple(mem), job=tuple(job))


@dataclass(frozen=True)
class Solution:
    """Result of one algorithm on one instance.

    ``status`` is ``ok`` (every task placed), ``infeasible`` (the algorithm found no allocation; for
    the exact MILP this proves none exists) or ``timeout`` (the time limit stopped the solver; the
    best allocation found so far, if any, is kept in ``hosts``/``alloc``). ``hosts[i]`` is -1 and
    yields are 0 when nothing was found.
    """

    algorithm: str
    status: Status
    hosts: tuple[int, ...]
    alloc: tuple[float, ...]
    min_yield: float
    avg_yield: float
    #: number of placement attempts, LP/MILP nodes or yield probes, for diagnostics
    work: int = 0

    @property
    def placed(self) -> bool:
        return bool(self.hosts) and all(h >= 0 for h in self.hosts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "status": self.status,
            "min_yield": self.min_yield,
            "avg_yield": self.avg_yield,
            "placement": [
                {"task": i, "host": h, "cpu": a} for i, (h, a) in enumerate(zip(self.hosts, self.alloc, strict=True))
            ]
            if self.placed
            else [],
        }


def failed(algorithm: str, inst: Instance, status: Status = "infeasible", work: int = 0) -> Solution:
    n = inst.n_tasks
    return Solution(algorithm, status, (-1,) * n, (0.0,) * n, 0.0, 0.0, work)


def placement_yield(inst: Instance, hosts: npt.NDArray[np.int64]) -> float:
    """Best minimum yield of a fixed placement: every task gets ``Y * cpu``, so host j needs
    ``Y * load_j <= 1``; Y = min(1, min_j 1 / load_j). Returns -1 when memory is exceeded."""
    load = np.bincount(hosts, weights=inst.cpu_a, minlength=inst.hosts)
    memuse = np.bincount(hosts, weights=inst.mem_a, minlength=inst.hosts)
    if memuse.size and float(memuse.max()) > 1.0 + EPS:
        return -1.0
    peak = float(load.max()) if load.size else 0.0
    return 1.0 if peak <= 1.0 else 1.0 / peak


def yields(inst: Instance, alloc: FloatArray) -> tuple[float, float]:
    """(minimum, average) per-job yield of an allocation (per-job: total alloc / total need)."""
    need = np.bincount(inst.job_a, weights=inst.cpu_a, minlength=inst.n_jobs)
    got = np.bincount(inst.job_a, weights=alloc, minlength=inst.n_jobs)
    y = got / need
    return float(y.min()), float(y.mean())


def check_solution(inst: Instance, sol: Solution, tol: float = 1e-7) -> list[str]:
    """Every violated constraint of a placed solution, as text (empty = valid). Used by tests and
    by the evaluation runner as a guard against a buggy algorithm."""
    problems: list[str] = []
    if not sol.placed:
        return problems
    hosts = np.asarray(sol.hosts, dtype=np.int64)
    alloc = np.asarray(sol.alloc, dtype=np.float64)
    if hosts.min() < 0 or hosts.max() >= inst.hosts:
        problems.append("host index out of range")
        return problems
    if (alloc < -tol).any():
        problems.append("negative allocation")
    if (alloc > inst.cpu_a + tol).any():
        problems.append("allocation above the task's need")
    cpu = np.bincount(hosts, weights=alloc, minlength=inst.hosts)
    mem = np.bincount(hosts, weights=inst.mem_a, minlength=inst.hosts)
    for j in np.flatnonzero(cpu > 1.0 + tol):
        problems.append(f"host {j}: cpu {cpu[j]:.6f} > 1")
    for j in np.flatnonzero(mem > 1.0 + tol):
        problems.append(f"host {j}: memory {mem[j]:.6f} > 1")
    for tasks in inst.job_tasks():
        a = alloc[tasks]
        if a.max() - a.min() > tol:
            problems.append(f"job of task {tasks[0]}: unequal allocations {a.min():.6f}..{a.max():.6f}")
    lo, avg = yields(inst, alloc)
    if abs(lo - sol.min_yield) > 1e-6 or abs(avg - sol.avg_yield) > 1e-6:
        problems.append(f"reported yields ({sol.min_yield}, {sol.avg_yield}) differ from actual ({lo}, {avg})")
    return problems


# ----------------------------------------------------------------------------- JSON documents


def _number(value: Any, source: str, where: str, lo: float, hi: float, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InstanceFormatError(path=source, where=where, problem=f"must be a number, got {value!r}")
    v = float(value)
    ok = math.isfinite(v) and (v > lo if lo_open else v >= lo) and v <= hi
    if not ok:
        interval = f"({lo:g}, {hi:g}]" if lo_open else f"[{lo:g}, {hi:g}]"
        raise InstanceFormatError(path=source, where=where, problem=f"must be in {interval}, got {value!r}")
    return v


def _keys(obj: Any, source: str, where: str, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise InstanceFormatError(path=source, where=where, problem=f"must be an object, got {type(obj).__name__}")
    for k in obj:
        if k not in allowed:
            raise InstanceFormatError(
                path=source,
                where=f"{where}.{k}" if where != "$" else k,
                problem=f"unknown key (allowed: {', '.join(sorted(allowed))})",
            )
    for k in sorted(required):
        if k not in obj:
            raise InstanceFormatError(path=source, where=where, problem=f"missing key {k!r}")
    return obj


def instance_from_dict(doc: Any, source: str = "<instance>", max_tasks: int = 1_000_000) -> Instance:
    """Validate ``{"hosts": H, "tasks": [{"cpu", "mem"}...]}`` or ``{"hosts": H, "jobs": [{"tasks", "cpu",
    "mem"}...]}``; raise ``InstanceFormatError`` naming ``source`` and the JSON path."""
    obj = _keys(doc, source, "$", {"hosts", "tasks", "jobs"}, {"hosts"})
    hosts = obj["hosts"]
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise InstanceFormatError(path=source, where="hosts", problem=f"must be an integer >= 1, got {hosts!r}")
    has_tasks, has_jobs = "tasks" in obj, "jobs" in obj
    if has_tasks == has_jobs:
        raise InstanceFormatError(path=source, where="$", problem="needs exactly one of 'tasks' or 'jobs'")
    key = "tasks" if has_tasks else "jobs"
    items = obj[key]
    if not isinstance(items, list) or not items:
        raise InstanceFormatError(path=source, where=key, problem="must be a non-empty list")
    if has_tasks:
        cpu: list[float] = []
        mem: list[float] = []
        for i, t in enumerate(items):
            w = f"tasks[{i}]"
            t = _keys(t, source, w, {"cpu", "mem"}, {"cpu", "mem"})
            cpu.append(_number(t["cpu"], source, f"{w}.cpu", 0.0, 1.0, lo_open=True))
            mem.append(_number(t["mem"], source, f"{w}.mem", 0.0, 1.0))
        if len(cpu) > max_tasks:
            raise InstanceFormatError(path=source, where="tasks", problem=f"more than {max_tasks} tasks")
        return Instance.sequential(hosts, cpu, mem)
    jobs: list[tuple[int, float, float]] = []
    total = 0
    for i, t in enumerate(items):
        w = f"jobs[{i}]"
        t = _keys(t, source, w, {"tasks", "cpu", "mem"}, {"tasks", "cpu", "mem"})
        k = t["tasks"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InstanceFormatError(path=source, where=f"{w}.tasks", problem=f"must be an integer >= 1, got {k!r}")
        total += k
        if total > max_tasks:
            raise InstanceFormatError(path=source, where=f"{w}.tasks", problem=f"more than {max_tasks} tasks in all")
        jobs.append(
            (
                k,
                _number(t["cpu"], source, f"{w}.cpu", 0.0, 1.0, lo_open=True),
                _number(t["mem"], source, f"{w}.mem", 0.0, 1.0),
            )
        )
    return Instance.parallel(hosts, jobs)
