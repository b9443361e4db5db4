"""The job-submission library (paper 001, sec. III-A-1 "Client").

A user builds ``Job`` s of ``Task`` s, gives them a priority, a deadline and an execution profile from
previous experience, and submits several at once through a ``Client``. ``start()`` submits and follows
the jobs in a background thread so the caller can do other work; ``wait_all(timeout)`` is the
synchronisation point that blocks until every job has finished, and returns a result (exit status or
error) per task. The paper's example, in Python (it runs as written against a vmctld that serves its
default ``https://HOST:8443`` with the CA of ``/etc/vmctl/ca.pem`` and a token in ``VMCTL_TOKEN``)::

    import os
    import time

    from vmctl.client import Client, Job, Profile, Task

    URL, CA, TOKEN = "https://vmctld:8443", "/etc/vmctl/ca.pem", os.environ["VMCTL_TOKEN"]
    j1 = Job("Job1", profile=Profile(runtime_s=600)).add_task(Task(command="./solve a"))
    j2 = Job("Job2", profile=Profile(runtime_s=900)).add_task(Task(command="./solve b"))
    j1.deadline = j2.deadline = time.time() + 200.0
    c12 = Client([j1, j2], url=URL, token=TOKEN, ca=CA)   # submitted together: one batch
    c12.start()                      # background
    # ... other time-consuming work
    c3 = Client(Job("Job3", estimate=60).add_task(Task(command="./pre")), url=URL, token=TOKEN, ca=CA)
    c3.start()
    c3.wait_all()                    # the rest cannot run before j3 is done
    results = c12.wait_all(timeout=3600)

A job's processes are its tasks (one core each, ``procs = len(tasks)``); they start together (a
parallel job), which is how vmctld schedules. ``estimate`` is the run-time limit the scheduler uses
(the job is killed after it); when absent it comes from the profile.

A job may have a shape (:class:`vmctl.model.JobShape`): moldable (the policy picks its width from a
table or a speedup model) or a task bag (per-task work; the policy sets its workers)::

    Job("wrf", shape=JobShape.moldable({2: 100.0, 4: 60.0}))
    Job("sweep", shape=JobShape.task_bag([10.0] * 1000, max_workers=20))

Independent tasks (paper 001's jobs): ``Job(..., independent=True)`` makes the job a task bag of its
tasks (each task's work is its ``work_seconds``, or the profile's run time); vmctld's dispatcher hands
them one at a time to the workers the policy grants the job (at most ``max_workers``), so 1,000 tasks
run on however many workers there are, and ``wait_all`` returns one result per task, with its exit
status, the worker that ran it and when (``TaskResult.worker``, ``start``, ``end``)::

    sweep = Job("sweep", independent=True, priority=2, deadline=time.time() + 3600)
    for i in range(1000):
        sweep.add_task(Task(command=f"./solve {i}", work_seconds=30))
    results = Client(sweep, url=URL, token=TOKEN, ca=CA).wait_all()
    assert len(results[0].tasks) == 1000

A shaped job needs no tasks and no estimate: vmctld gives it the width a policy that knows only
rigid jobs would use (``procs``: the smallest moldable width, the task bag's most workers) and its
time at that width as the estimate, unless the job says otherwise.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmctl import errors
from vmctl.apiclient import ApiClient
from vmctl.model import JobShape, JobState

TERMINAL_STATES = frozenset({JobState.DONE, JobState.KILLED, JobState.FAILED, JobState.CANCELLED})


@dataclass
class Task:
    """One process of a job. ``command`` runs in the job's VM; ``work_seconds`` and ``cpu_usage``
    describe the work for the mock backend (and ``cpu_usage`` is the scheduler's utilization hint)."""

    command: str | None = None
    work_seconds: float | None = None
    cpu_usage: float | None = None

    def __post_init__(self) -> None:
        if self.cpu_usage is not None and not 0 < self.cpu_usage <= 1:
            raise errors.OutOfRange(what="Task.cpu_usage", value=self.cpu_usage, allowed="0 < u <= 1")
        if self.work_seconds is not None and not (self.work_seconds >= 0 and math.isfinite(self.work_seconds)):
            raise errors.OutOfRange(what="Task.work_seconds", value=self.work_seconds, allowed=">= 0")

    def to_spec(self) -> dict[str, Any]:
        return {k: v for k, v in (("command", self.command), ("work_seconds", self.work_seconds),
                                  ("cpu_usage", self.cpu_usage)) if v is not None}


@dataclass(frozen=True)
class Profile:
    """Execution profile from previous runs: typical run time and CPU utilization per task."""

    runtime_s: float
    cpu_usage: float | None = None
    margin: float = 1.2  # estimate = runtime_s * margin when the job gives no estimate

    def __post_init__(self) -> None:
        if not (self.runtime_s > 0 and math.isfinite(self.runtime_s)):
            raise errors.OutOfRange(what="Profile.runtime_s", value=self.runtime_s, allowed="> 0")
        if self.cpu_usage is not None and not 0 < self.cpu_usage <= 1:
            raise errors.OutOfRange(what="Profile.cpu_usage", value=self.cpu_usage, allowed="0 < u <= 1")
        if self.margin < 1:
            raise errors.OutOfRange(what="Profile.margin", value=self.margin, allowed=">= 1")


@dataclass(frozen=True)
class TaskResult:
    """One task's result. For independent tasks (a task bag) also the worker that ran it
    (``node/core.level``) and when it was handed to it and ended (epoch seconds, vmctld's clock)."""

    index: int
    exit_status: int | None
    error: str | None
    worker: str | None = None
    start: float | None = None
    end: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_status in (0, None)


@dataclass(frozen=True)
class JobResult:
    name: str
    id: str
    state: str
    tasks: tuple[TaskResult, ...]
    error: str | None = None  # client-side failure (the job could not be followed)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def ok(self) -> bool:
        return self.state == JobState.DONE and self.error is None and all(t.ok for t in self.tasks)


class Job:
    """A parallel job: a name, tasks, a priority, a deadline (epoch seconds), the user it runs for and
    an estimate/profile."""

    def __init__(
        self,
        name: str,
        *,
        estimate: float | None = None,
        priority: int = 0,
        deadline: float | None = None,
        profile: Profile | None = None,
        tasks: Iterable[Task] = (),
        cpu_need: float | None = None,
        mem: float | None = None,
        user: str | None = None,
        account: str | None = None,
        shape: JobShape | None = None,
        independent: bool = False,
        max_workers: int | None = None,
    ) -> None:
        if (independent or max_workers is not None) and shape is not None:
            raise errors.ValidationError(field=f"job {name!r}.shape",
                                         problem="independent tasks make the job's shape (a task bag): give one or "
                                                 "the other")
        if max_workers is not None and max_workers < 1:
            raise errors.ValidationError(field=f"job {name!r}.max_workers", problem=f"must be >= 1, got {max_workers}")
        #: independent tasks (paper 001): the job is a task bag whose tasks vmctld hands to the workers it
        #: is granted, one at a time each (at most ``max_workers``; default: one per task)
        self.independent = independent or max_workers is not None
        self.max_workers = max_workers
        self.name = name
        self.shape = shape  # moldable or task bag (None: rigid, one process per task)
        self.user = user  # who the job runs for (None: not said)
        self.account = account  # the account (project) charged (None: not said)
        self.cpu_need = cpu_need  # vcsched: CPU need per VM, fraction of one host core
        self.mem = mem  # vcsched: memory need per VM, fraction of one host's memory
        self.estimate = estimate
        self.priority = priority
        self.deadline = deadline
        self.profile = profile
        self.tasks: list[Task] = list(tasks)
        self.id: str | None = None
        self.state: str | None = None
        self.info: dict[str, Any] = {}

    def add_task(self, task: Task) -> Job:
        if self.id is not None:
            raise errors.Conflict(what=f"job {self.name!r}", problem="already submitted; tasks cannot be added")
        self.tasks.append(task)
        return self

    def _task_usage(self) -> list[float | None]:
        """Each task's CPU usage: its own ``cpu_usage``, else the profile's (None: not said)."""
        default = self.profile.cpu_usage if self.profile is not None else None
        return [t.cpu_usage if t.cpu_usage is not None else default for t in self.tasks]

    def bag_shape(self) -> JobShape:
        """The task bag of independent tasks: each task's work is its ``work_seconds``, else the
        profile's run time (a task without either is refused, naming it). Its ``task_usage`` is the
        tasks' CPU usage when every task has the same one (its own or the profile's; tasks that sleep
        have a usage near 0), else 1.0: each task's own usage still reaches its process (``tasks``)."""
        work: list[float] = []
        for i, t in enumerate(self.tasks):
            w = t.work_seconds if t.work_seconds is not None else \
                self.profile.runtime_s if self.profile is not None else None
            if w is None:
                raise errors.ValidationError(field=f"job {self.name!r}.tasks[{i}].work_seconds",
                                             problem="an independent task needs its work (or the job a profile)")
            work.append(w)
        usage = set(self._task_usage())
        one = usage.pop() if len(usage) == 1 else None
        return JobShape.task_bag(work, self.max_workers or len(work), 1.0 if one is None else one)

    def to_spec(self) -> dict[str, Any]:
        """The ``POST /v1/jobs`` body."""
        if self.independent:
            if not self.tasks:
                raise errors.ValidationError(field=f"job {self.name!r}.tasks", problem="a job needs at least one task")
            return self._bag_spec()
        shaped = self.shape is not None
        if not self.tasks and not shaped:
            raise errors.ValidationError(field=f"job {self.name!r}.tasks", problem="a job needs at least one task")
        estimate = self.estimate
        if estimate is None and self.profile is not None:
            estimate = self.profile.runtime_s * self.profile.margin
        if estimate is None and not shaped:
            raise errors.ValidationError(field=f"job {self.name!r}.estimate", problem="give an estimate or a profile")
        if estimate is not None and not (estimate > 0 and math.isfinite(estimate)):
            raise errors.ValidationError(field=f"job {self.name!r}.estimate", problem=f"must be > 0, got {estimate}")
        spec: dict[str, Any] = {"name": self.name, "priority": int(self.priority)}
        if self.tasks:
            spec["procs"] = len(self.tasks)
        if estimate is not None:
            spec["estimate"] = float(estimate)
        if self.shape is not None:
            from vmctl.shapes import shape_to_json

            spec["shape"] = shape_to_json(self.shape)
        if self.deadline is not None:
            spec["deadline"] = float(self.deadline)
        if self.user is not None:
            spec["user"] = str(self.user)
        if self.account is not None:
            spec["account"] = str(self.account)
        if self.cpu_need is not None:
            if not 0 < self.cpu_need <= 1:
                raise errors.ValidationError(field=f"job {self.name!r}.cpu_need",
                                             problem=f"must be in (0, 1], got {self.cpu_need}")
            spec["cpu_need"] = float(self.cpu_need)
        if self.mem is not None:
            if not 0 <= self.mem <= 1:
                raise errors.ValidationError(field=f"job {self.name!r}.mem",
                                             problem=f"must be in [0, 1], got {self.mem}")
            spec["mem"] = float(self.mem)
        usage = self._task_usage()
        if self.tasks and all(u is not None for u in usage):
            spec["cpu_usage"] = usage
        if self.tasks:
            spec["tasks"] = [t.to_spec() for t in self.tasks]
        return spec

    def _bag_spec(self) -> dict[str, Any]:
        from vmctl.shapes import shape_to_json

        shape = self.bag_shape()
        tasks = [t.to_spec() | ({"cpu_usage": u} if u is not None else {})
                 for t, u in zip(self.tasks, self._task_usage(), strict=True)]
        spec: dict[str, Any] = {"name": self.name, "priority": int(self.priority), "shape": shape_to_json(shape),
                                "tasks": tasks}
        if self.deadline is not None:
            spec["deadline"] = float(self.deadline)
        for key in ("user", "account"):
            if getattr(self, key) is not None:
                spec[key] = str(getattr(self, key))
        return spec

    @property
    def workers(self) -> list[dict[str, Any]]:
        """The workers vmctld's dispatcher says the job holds now (independent tasks; as last polled)."""
        return list(self.info.get("workers") or [])

    def __repr__(self) -> str:
        return f"Job({self.name!r}, tasks={len(self.tasks)}, id={self.id!r}, state={self.state!r})"


def result_of(job: Job, doc: dict[str, Any]) -> JobResult:
    tasks = []
    for i, t in enumerate(doc.get("tasks") or []):
        if isinstance(t, dict):
            status = t.get("exit_status")
            err = t.get("error")
            tasks.append(TaskResult(index=int(t.get("index", i)), exit_status=None if status is None else int(status),
                                    error=None if err is None else str(err), worker=t.get("worker"),
                                    start=t.get("start"), end=t.get("end")))
    return JobResult(name=job.name, id=str(doc.get("id", job.id)), state=str(doc.get("state")), tasks=tuple(tasks),
                     raw=doc)


class Client:
    """Submits jobs to vmctld and follows them.

    ``submit()`` sends every job not yet submitted in ONE ``POST /v1/jobs:batch`` request (all or
    nothing). ``start()`` does that in a background thread and then polls until every job is in a
    final state. ``wait_all(timeout)`` waits for that thread (starting it if needed) and returns the
    results in the order the jobs were given; it raises the submission error if the batch was
    rejected, and ``WaitTimeout`` if time runs out (the jobs keep running; call it again)."""

    def __init__(
        self,
        jobs: Job | Sequence[Job] = (),
        *,
        url: str | None = None,
        token: str | None = None,
        ca: str | None = None,
        api: ApiClient | None = None,
        poll_interval: float = 0.5,
        max_poll_interval: float = 5.0,
    ) -> None:
        self.jobs: list[Job] = [jobs] if isinstance(jobs, Job) else list(jobs)
        self.api = api if api is not None else ApiClient(url, token, ca=ca)
        self.poll_interval = poll_interval
        self.max_poll_interval = max_poll_interval
        self._results: dict[int, JobResult] = {}
        self._error: errors.VmctlError | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------------ synchronous

    def submit(self, jobs: Job | Sequence[Job] | None = None) -> list[Job]:
        """Submit ``jobs`` (added to this client) and every earlier job not yet submitted, as one batch.
        Returns the jobs submitted now, with ``id`` and ``state`` set."""
        if jobs is not None:
            self.jobs.extend([jobs] if isinstance(jobs, Job) else jobs)
        pending = [j for j in self.jobs if j.id is None]
        if not pending:
            return []
        specs = [j.to_spec() for j in pending]  # validates every job before anything is sent
        answers = self.api.submit_jobs(specs)
        if len(answers) != len(pending):
            raise errors.ApiError(status=201, reference_text="bad-response",
                                  problem=f"batch of {len(pending)} answered with {len(answers)} jobs")
        for j, doc in zip(pending, answers, strict=True):
            j.id = str(doc["id"])
            j.state = str(doc.get("state"))
            j.info = dict(doc)
        return pending

    def poll(self) -> bool:
        """Refresh every unfinished job once; True when all are finished."""
        all_done = True
        for i, j in enumerate(self.jobs):
            if i in self._results:
                continue
            if j.id is None:
                all_done = False
                continue
            doc = self.api.get_job(j.id)
            j.state = str(doc.get("state"))
            j.info = doc
            if j.state in TERMINAL_STATES:
                with self._lock:
                    self._results[i] = result_of(j, doc)
            else:
                all_done = False
        return all_done

    def cancel(self) -> None:
        """Stop following the jobs, then cancel every unfinished one (idempotent). The follower thread
        is stopped first and waited for: a poll still in flight would otherwise overwrite the states
        the cancellations answered with older ones."""
        self._stop.set()
        th = self._thread
        if th is not None and th is not threading.current_thread():
            th.join()
        for i, j in enumerate(self.jobs):
            if j.id is not None and j.state not in TERMINAL_STATES:
                doc = self.api.cancel_job(j.id)
                j.state = str(doc.get("state"))
                j.info = doc
                if j.state in TERMINAL_STATES:
                    with self._lock:
                        self._results[i] = result_of(j, doc)

    # ------------------------------------------------------------------------ background

    def start(self) -> Client:
        """Submit and follow in a background thread; returns at once."""
        if self._thread is None:
            self._done.clear()
            self._thread = threading.Thread(target=self._run, name="vmctl-client", daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.submit()
            interval = self.poll_interval
            failures = 0
            while not self._stop.is_set():
                try:
                    if self.poll():
                        break
                    failures = 0
                except errors.VmctlError as exc:
                    if not exc.retryable or failures >= 20:
                        raise
                    failures += 1
                self._stop.wait(interval)
                interval = min(self.max_poll_interval, interval * 1.5)
        except errors.VmctlError as exc:
            self._error = exc
        except Exception as exc:  # a bug: keep it for wait_all instead of dying silently in a thread
            self._error = errors.VmctlError(detail=f"client thread failed: {exc!r}")
            self._error.__cause__ = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait_all(self, timeout: float | None = None) -> list[JobResult]:
        """Block until every job is finished; results in job order."""
        self.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done.wait(0.2 if deadline is None else max(0.0, min(0.2, deadline - time.monotonic()))):
            if deadline is not None and time.monotonic() >= deadline:
                unfinished = [j.name for j in self.jobs if j.state not in TERMINAL_STATES]
                raise errors.WaitTimeout(what=f"jobs {', '.join(unfinished)}", timeout=timeout)
        if self._error is not None:
            raise self._error
        with self._lock:
            out = []
            for i, j in enumerate(self.jobs):
                if i in self._results:
                    out.append(self._results[i])
                else:  # stopped (cancel) before the job finished
                    out.append(JobResult(name=j.name, id=str(j.id), state=str(j.state), tasks=(),
                                         error="not followed to the end (cancelled or stopped)"))
            return out

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
