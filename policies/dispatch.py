"""The decision maker of paper 001: how many (and which) workers each job of independent tasks holds.

Paper: Lin, Liu, Lin, Shih, Huang, "Job Dispatching and Scheduling under Heterogeneous Clusters",
sec. III (policies) and sec. II-A/B (job, task and worker model). A *job* is a bag of independent
tasks; a *worker* is one VM slot that runs one task at a time; workers differ in speed. The decision
maker is passive: it runs when a job is submitted or finishes, over the workers it is given, and
returns a plan ``job -> workers``. This module is pure: the daemon's dispatcher applies a plan (a
job's worker count changes only at task boundaries), ``vmctl plan`` prints one for an instance file.

Inputs. A :class:`PlanWorker` has an id, a node and a speed (relative to a standard core). A
:class:`PlanJob` has its unfinished task count ``tasks``, its remaining work ``work`` (seconds on a
standard core), a priority (higher first), an optional absolute ``deadline``, a FCFS key ``order``,
and optionally a throughput per worker (work seconds per second; default: the worker's speed times
the job's ``profile``, 1 unless the daemon has learnt it; the daemon corrects both from observed task
durations). Ties in priority go to the lower ``order``, then id.
Workers are considered fastest first (ties: id) wherever the listing says "the first c workers".

The listings are garbled; each policy below says how we read it.

``priority`` (Algorithm 1, reservation rate ``r``). The prose: the top job uses "at most the 1 - r of
all workers", every other job gets one worker, in priority order, while workers last. Line 3 of the
listing gives the top job ``m - floor((1 - r) m)`` workers, the *reserved* share instead: we follow the
prose, ``c = min(tasks, floor((1 - r) * m))`` (and at least 1 when m >= 1, so that r = 1 does not
starve the top job: reading). The prose's ``x = max(idle, tasks)`` means ``min``. Example: r = 0.2,
10 workers, jobs A (priority 3, 20 tasks), B (2), C (1): A gets 8, B 1, C 1. With A of 3 tasks, A gets
3, B and C one each, and 5 workers stay idle: the literal algorithm is not work conserving.

``proportion`` (Algorithm 2, fair share by remaining work). Job i gets ``min(ceil(m * work_i / W),
workers left, tasks_i)`` (the listing drops the multiplication by m; a job never holds more workers
than it has unfinished tasks), jobs in priority order. Example: 10 workers, work 600/300/100: 6, 3, 1.

``workload`` (Algorithm 3, greedy on heterogeneous workers). For each job in priority order, sort
the remaining workers by their throughput for it and take the top k until their throughput finishes
the job's remaining work within ``horizon`` seconds (``sum th * horizon >= work``), at most ``tasks``
workers. Reading: the listing compares a throughput sum to a workload with no time unit and returns
``workerSet[0..i]`` where ``k`` is meant; ``horizon`` (default 3,600 s) supplies the unit. A job
gets at least one worker while workers last (its tasks must run even if its work estimate is 0).

``deadline`` (Algorithm 4). The same greedy with the deadline as the horizon: take workers until
``sum 1/T_k >= 1 / (deadline - now)``, where ``T_k = work / th_k`` is the time worker k alone needs,
i.e. ``sum th_k * (deadline - now) >= work``; at most ``tasks`` workers. A job whose deadline has
passed wants as many workers as it has tasks; a job without a deadline wants one worker. Readings:
the listing's loop bound ``1/w_i.execTime`` is the reciprocal of the time left; the condition is the
fluid one (it ignores that a task cannot be split across workers; the dispatcher's task granularity
can make a job finish up to one task length later).

``conserving`` (our addition, every policy): after the policy, idle workers go, fastest first, to
the jobs in priority order, each up to its unfinished tasks; under ``priority`` the top job is served
last and stays within ``floor((1 - r) m)`` while a lower job still has a task without a worker. So no
worker idles while any job has a task without a worker.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmctl.errors import PolicyParameterError, UnknownPolicyError, ValidationError

#: policy name -> its parameters (name -> (type, default, help))
DISPATCH_POLICIES: dict[str, dict[str, tuple[type, Any, str]]] = {
    "priority": {"r": (float, 0.2, "reservation rate: the share of workers kept for lower-priority jobs")},
    "proportion": {},
    "workload": {"horizon": (float, 3600.0, "seconds in which a job's assigned throughput should finish it")},
    "deadline": {},
}
_COMMON: dict[str, tuple[type, Any, str]] = {
    "conserving": (bool, False, "give workers the policy leaves idle to jobs with tasks waiting"),
}


@dataclass(frozen=True, slots=True)
class PlanWorker:
    id: str
    node: str = ""
    speed: float = 1.0

    def __post_init__(self) -> None:
        if not self.id:
            raise ValidationError(field="worker.id", problem="must not be empty")
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ValidationError(field=f"worker {self.id}.speed",
                                  problem=f"must be a positive number, got {self.speed}")


@dataclass(frozen=True, slots=True)
class PlanJob:
    id: str
    tasks: int
    work: float
    priority: int = 0
    deadline: float | None = None
    order: float = 0.0
    throughput: Mapping[str, float] = field(default_factory=dict)
    #: the job's speed on a worker relative to the worker's nominal speed, for workers not in
    #: ``throughput`` (the daemon learns it from the workers it has observed the job on; default 1)
    profile: float = 1.0

    def __post_init__(self) -> None:
        if not (self.profile > 0 and math.isfinite(self.profile)):
            raise ValidationError(field=f"job {self.id}.profile",
                                  problem=f"must be a positive number, got {self.profile}")
        if self.tasks < 1:
            raise ValidationError(field=f"job {self.id}.tasks",
                                  problem=f"must be >= 1 unfinished task, got {self.tasks}")
        if not (self.work >= 0 and math.isfinite(self.work)):
            raise ValidationError(field=f"job {self.id}.work", problem=f"must be a finite number >= 0, got {self.work}")
        for w, th in self.throughput.items():
            if not (th > 0 and math.isfinite(th)):
                raise ValidationError(field=f"job {self.id}.throughput.{w}",
                                      problem=f"must be a positive number, got {th}")


@dataclass(frozen=True, slots=True)
class Plan:
    """``assignment``: job -> worker ids (every job of the input, possibly empty); ``unassigned``:
    the workers no job holds."""

    assignment: dict[str, list[str]]
    unassigned: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"assignment": {j: list(ws) for j, ws in self.assignment.items()},
                "unassigned_workers": list(self.unassigned)}


def policy_params(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The policy's parameters with defaults, type-checked; ``UnknownPolicyError`` /
    ``PolicyParameterError`` name what is wrong."""
    if name not in DISPATCH_POLICIES:
        raise UnknownPolicyError(name=name, known=", ".join(sorted(DISPATCH_POLICIES)))
    spec = {**DISPATCH_POLICIES[name], **_COMMON}
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key not in spec:
            raise PolicyParameterError(policy=name, param=key, problem=f"unknown (known: {', '.join(sorted(spec))})")
        kind = spec[key][0]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            raise PolicyParameterError(policy=name, param=key, problem=f"must be {kind.__name__}, got {value!r}")
        out[key] = value
    for key, (_kind, default, _help) in spec.items():
        out.setdefault(key, default)
    r = out.get("r")
    if r is not None and not 0.0 <= r <= 1.0:
        raise PolicyParameterError(policy=name, param="r", problem=f"must be in [0, 1], got {r}")
    horizon = out.get("horizon")
    if horizon is not None and not (horizon > 0 and math.isfinite(horizon)):
        raise PolicyParameterError(policy=name, param="horizon", problem=f"must be > 0 seconds, got {horizon}")
    return out


def _check(workers: Sequence[PlanWorker], jobs: Sequence[PlanJob]) -> None:
    ids = [w.id for w in workers]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValidationError(field=f"worker {dup}", problem="listed twice")
    known = set(ids)
    seen: set[str] = set()
    for j in jobs:
        if j.id in seen:
            raise ValidationError(field=f"job {j.id}", problem="listed twice")
        seen.add(j.id)
        unknown = sorted(set(j.throughput) - known)
        if unknown:
            raise ValidationError(field=f"job {j.id}.throughput", problem=f"names unknown worker {unknown[0]!r}")


class _Planner:
    """The free workers are one list, fastest first (ties: id), consumed from the front; a worker taken
    out of order (a job's observed throughput ranks it earlier) is skipped later, so a pass costs
    O(workers) once plus, per job, the workers it takes and its observed ones, not a sort of the pool."""

    def __init__(self, workers: Sequence[PlanWorker], jobs: Sequence[PlanJob], now: float) -> None:
        self.now = now
        self.speed = {w.id: w.speed for w in workers}
        self.order = [w.id for w in sorted(workers, key=lambda w: (-w.speed, w.id))]
        self.head = 0  # every worker before ``head`` in ``order`` is taken
        self.taken: set[str] = set()
        self.nfree = len(self.order)
        self.jobs = sorted(jobs, key=lambda j: (-j.priority, j.order, j.id))
        self.out: dict[str, list[str]] = {j.id: [] for j in jobs}

    def _free(self, observed: Mapping[str, float]) -> Iterator[str]:
        """The free workers not in ``observed``, fastest first."""
        taken, order = self.taken, self.order
        for i in range(self.head, len(order)):
            w = order[i]
            if w not in taken and w not in observed:
                yield w

    def _mark(self, job: PlanJob, got: list[str]) -> None:
        self.taken.update(got)
        self.nfree -= len(got)
        self.out[job.id].extend(got)
        order, taken = self.order, self.taken
        while self.head < len(order) and order[self.head] in taken:
            self.head += 1

    def take(self, job: PlanJob, count: int) -> None:
        """The ``count`` fastest free workers (by speed) to ``job``."""
        got: list[str] = []
        if count > 0:
            for w in self._free({}):
                got.append(w)
                if len(got) == count:
                    break
        self._mark(job, got)

    def greedy(self, job: PlanJob, enough: float) -> None:
        """Algorithms 3/4: the fastest workers for ``job`` until their throughput reaches ``enough``
        (work seconds per second), at least one and at most ``job.tasks`` of them. A worker's rank for
        the job is its observed throughput, else its speed x the job's profile (the same order as its
        speed, ties: id); the observed ones are merged into the speed order."""
        taken, profile, speed = self.taken, job.profile, self.speed
        seen = sorted((-th, w) for w, th in job.throughput.items() if w not in taken)
        rest = self._free(job.throughput)
        nxt = next(rest, None)
        i = 0
        got: list[str] = []
        total = 0.0
        while len(got) < job.tasks and (total < enough or not got):
            if nxt is not None and (i >= len(seen) or (-speed[nxt] * profile, nxt) < seen[i]):
                w, th = nxt, speed[nxt] * profile
                nxt = next(rest, None)
            elif i < len(seen):
                th, w = -seen[i][0], seen[i][1]
                i += 1
            else:
                break
            got.append(w)
            total += th
        self._mark(job, got)

    def conserve(self, cap: Mapping[str, int]) -> None:
        """Idle workers to the jobs in priority order, each up to its unfinished tasks; a capped job
        (the top job under ``priority``) comes last and stays within its cap while another job still
        has a task without a worker."""
        for job in [j for j in self.jobs if j.id not in cap] + [j for j in self.jobs if j.id in cap]:
            if not self.nfree:
                return
            room = job.tasks - len(self.out[job.id])
            limit = cap.get(job.id)
            if limit is not None and any(len(self.out[o.id]) < o.tasks for o in self.jobs if o.id != job.id):
                room = min(room, limit - len(self.out[job.id]))
            if room > 0:
                self.take(job, room)


def plan(policy: str, workers: Sequence[PlanWorker], jobs: Sequence[PlanJob], now: float = 0.0,
         params: Mapping[str, Any] | None = None) -> Plan:
    """Run one of the four policies (``priority``, ``proportion``, ``workload``, ``deadline``)."""
    p = policy_params(policy, params or {})
    _check(workers, jobs)
    pl = _Planner(workers, jobs, now)
    m = len(workers)
    cap: dict[str, int] = {}
    if policy == "priority":
        if pl.jobs:
            top = pl.jobs[0]
            limit = max(1, math.floor((1.0 - p["r"]) * m)) if m else 0
            cap[top.id] = limit
            pl.take(top, min(top.tasks, limit))
            for job in pl.jobs[1:]:
                if not pl.nfree:
                    break
                pl.take(job, 1)
    elif policy == "proportion":
        total = sum(j.work for j in pl.jobs)
        for job in pl.jobs:
            if not pl.nfree:
                break
            share = math.ceil(m * job.work / total) if total > 0 else 1
            pl.take(job, min(share, pl.nfree, job.tasks))
    elif policy == "workload":
        for job in pl.jobs:
            if not pl.nfree:
                break
            pl.greedy(job, job.work / p["horizon"])
    else:  # deadline
        for job in pl.jobs:
            if not pl.nfree:
                break
            if job.deadline is None:
                pl.greedy(job, 0.0)
            elif job.deadline <= now:
                pl.greedy(job, math.inf)
            else:
                pl.greedy(job, job.work / (job.deadline - now))
    if p["conserving"]:
        pl.conserve(cap)
    return Plan(assignment=pl.out, unassigned=[w.id for w in workers if w.id not in pl.taken])


def load_instance(doc: Any, where: str = "instance") -> tuple[list[PlanWorker], list[PlanJob]]:
    """Workers and jobs from an instance document (``vmctl plan``, ``POST /v1/plan``)::

        {"workers": [{"id", "node", "speed"}...],
         "jobs": [{"id", "tasks", "work", "priority", "deadline", "throughput": {worker: value}}...]}

    ``deadline`` is seconds from now (the plan's time 0). Every error names the field."""
    if not isinstance(doc, dict):
        raise ValidationError(field=where, problem="must be an object with 'workers' and 'jobs'")
    unknown = sorted(set(doc) - {"workers", "jobs", "now"})
    if unknown:
        raise ValidationError(field=f"{where}.{unknown[0]}", problem="unknown key (known: workers, jobs)")
    raw_workers, raw_jobs = doc.get("workers"), doc.get("jobs")
    if not isinstance(raw_workers, list):
        raise ValidationError(field=f"{where}.workers", problem="must be a list")
    if not isinstance(raw_jobs, list):
        raise ValidationError(field=f"{where}.jobs", problem="must be a list")
    workers = [_worker(w, f"{where}.workers[{i}]") for i, w in enumerate(raw_workers)]
    jobs = [_job(j, i, f"{where}.jobs[{i}]") for i, j in enumerate(raw_jobs)]
    _check(workers, jobs)
    return workers, jobs


def _number(value: Any, field_name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field=field_name, problem=f"must be a number, got {value!r}")
    return float(value)


def _fields(raw: Any, where: str, allowed: set[str], required: set[str]) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValidationError(field=where, problem="must be an object")
    extra = sorted(set(raw) - allowed)
    if extra:
        raise ValidationError(field=f"{where}.{extra[0]}", problem=f"unknown key (known: {', '.join(sorted(allowed))})")
    missing = sorted(required - set(raw))
    if missing:
        raise ValidationError(field=f"{where}.{missing[0]}", problem="is required")
    return raw


def _worker(raw: Any, where: str) -> PlanWorker:
    d = _fields(raw, where, {"id", "node", "speed"}, {"id"})
    if not isinstance(d["id"], str):
        raise ValidationError(field=f"{where}.id", problem="must be a string")
    speed = _number(d.get("speed", 1.0), f"{where}.speed")
    if not (speed > 0 and math.isfinite(speed)):
        raise ValidationError(field=f"{where}.speed", problem=f"must be a positive number, got {speed}")
    return PlanWorker(d["id"], str(d.get("node", "")), speed)


def _job(raw: Any, index: int, where: str) -> PlanJob:
    d = _fields(raw, where, {"id", "tasks", "work", "priority", "deadline", "throughput"}, {"id", "tasks", "work"})
    if not isinstance(d["id"], str) or not d["id"]:
        raise ValidationError(field=f"{where}.id", problem="must be a non-empty string")
    tasks = d["tasks"]
    if isinstance(tasks, bool) or not isinstance(tasks, int) or tasks < 1:
        raise ValidationError(field=f"{where}.tasks",
                              problem=f"must be an integer >= 1 (a job with no tasks runs nothing), got {tasks!r}")
    work = _number(d["work"], f"{where}.work")
    if work < 0 or not math.isfinite(work):
        raise ValidationError(field=f"{where}.work", problem=f"must be a finite number >= 0, got {work}")
    priority = d.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValidationError(field=f"{where}.priority", problem=f"must be an integer, got {priority!r}")
    deadline = d.get("deadline")
    if deadline is not None:
        deadline = _number(deadline, f"{where}.deadline")
        if deadline <= 0:
            raise ValidationError(field=f"{where}.deadline",
                                  problem=f"must be > 0 seconds from now (it is in the past), got {deadline}")
    raw_th = d.get("throughput", {})
    if not isinstance(raw_th, dict):
        raise ValidationError(field=f"{where}.throughput", problem="must be an object worker -> value")
    th: dict[str, float] = {}
    for w, v in raw_th.items():
        value = _number(v, f"{where}.throughput.{w}")
        if not (value > 0 and math.isfinite(value)):
            raise ValidationError(field=f"{where}.throughput.{w}",
                                  problem="must be a positive number (a worker with throughput 0 never finishes "
                                  f"a task), got {value}")
        th[w] = value
    return PlanJob(d["id"], tasks, work, priority, deadline, float(index), th)
