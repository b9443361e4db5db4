"""The client library (paper 001's Job/Task/Client) against a small in-memory fake of the API on
loopback: one batch request per submit, background following, wait_all results, timeouts, errors."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from vmctl import errors
from vmctl.client import Client, Job, Profile, Task


class FakeDaemon:
    """Jobs finish after ``polls_to_finish`` GETs; job named 'crash' fails with a task error."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.gets: dict[str, int] = {}
        self.polls_to_finish = 2
        self.reject_batch: dict[str, Any] | None = None
        self.lock = threading.Lock()
        # when set: a job GET, once its answer is made, signals ``get_held`` and waits for this event
        # before it is sent (a poll in flight while something else happens)
        self.hold_gets: threading.Event | None = None
        self.get_held = threading.Event()

    def hold(self, method: str, path: str) -> None:
        gate = self.hold_gets
        if gate is not None and method == "GET" and path.startswith("/v1/jobs/"):
            self.get_held.set()
            gate.wait(30)

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        with self.lock:
            self.requests.append((method, path, body))
            if method == "POST" and path == "/v1/jobs:batch":
                if self.reject_batch is not None:
                    return 422, {"error": self.reject_batch}
                out = []
                for spec in body["jobs"]:
                    jid = str(len(self.jobs) + 1)
                    job = {"id": jid, "name": spec.get("name"), "state": "queued", "procs": spec["procs"],
                           "tasks": [{"index": i, "exit_status": None, "error": None} for i in range(spec["procs"])]}
                    self.jobs[jid] = job
                    out.append(job)
                return 201, {"jobs": out}
            if path.startswith("/v1/jobs/"):
                jid = path.rsplit("/", 1)[1]
                job = self.jobs.get(jid)
                if job is None:
                    msg = f"job {jid!r} not found"
                    return 404, {"error": {"reference": "not-found", "message": msg, "field": None}}
                if method == "DELETE":
                    if job["state"] not in ("done", "failed"):
                        job["state"] = "cancelled"
                    return 200, {"job": job}
                self.gets[jid] = self.gets.get(jid, 0) + 1
                if job["state"] == "queued":
                    job["state"] = "running"
                if job["state"] == "running" and self.gets[jid] >= self.polls_to_finish:
                    failed = job["name"] == "crash"
                    job["state"] = "failed" if failed else "done"
                    for t in job["tasks"]:
                        t["exit_status"] = 1 if failed else 0
                        t["error"] = "segfault" if failed else None
                return 200, {"job": job}
            return 404, {"error": {"reference": "not-found", "message": "no route", "field": None}}


@pytest.fixture()
def fake() -> Iterator[tuple[str, FakeDaemon]]:
    daemon = FakeDaemon()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _handle(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n)) if n else None
            path = self.path.partition("?")[0]
            status, doc = daemon.handle(self.command, path, body)
            data = json.dumps(doc).encode()  # the answer as of now, even if it is held
            daemon.hold(self.command, path)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _handle

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", daemon
    finally:
        srv.shutdown()
        srv.server_close()


def test_spec_from_job_tasks_and_profile() -> None:
    j = Job("j1", priority=5, deadline=1000.0, profile=Profile(runtime_s=100, cpu_usage=0.5))
    j.add_task(Task(command="a")).add_task(Task(work_seconds=3, cpu_usage=0.9))
    assert j.to_spec() == {
        "name": "j1", "procs": 2, "estimate": 120.0, "priority": 5, "deadline": 1000.0, "cpu_usage": [0.5, 0.9],
        "tasks": [{"command": "a"}, {"work_seconds": 3, "cpu_usage": 0.9}],
    }
    j2 = Job("j2", estimate=10, tasks=[Task(), Task(cpu_usage=0.3)])
    assert "cpu_usage" not in j2.to_spec()  # unknown for one task: no hint at all
    with pytest.raises(errors.ValidationError, match="at least one task"):
        Job("empty", estimate=1).to_spec()
    with pytest.raises(errors.ValidationError, match="estimate or a profile"):
        Job("x", tasks=[Task()]).to_spec()
    with pytest.raises(errors.OutOfRange):
        Task(cpu_usage=1.5)
    with pytest.raises(errors.OutOfRange):
        Profile(runtime_s=0)


def test_submit_sends_one_batch(fake: tuple[str, FakeDaemon]) -> None:
    url, daemon = fake
    j1 = Job("Job1", estimate=60).add_task(Task(command="x"))
    j2 = Job("Job2", estimate=60).add_task(Task()).add_task(Task())
    c = Client([j1, j2], url=url, token="t")
    submitted = c.submit()
    assert [r[:2] for r in daemon.requests] == [("POST", "/v1/jobs:batch")]
    assert [s["name"] for s in daemon.requests[0][2]["jobs"]] == ["Job1", "Job2"]
    assert (j1.id, j2.id) == ("1", "2") and submitted == [j1, j2]
    assert c.submit() == []  # nothing left to submit: no request
    assert len(daemon.requests) == 1
    with pytest.raises(errors.Conflict):
        j1.add_task(Task())


def test_start_then_wait_all_paper_example(fake: tuple[str, FakeDaemon]) -> None:
    url, daemon = fake
    j1 = Job("Job1", estimate=60).add_task(Task())
    j2 = Job("Job2", estimate=60).add_task(Task())
    j1.deadline = j2.deadline = time.time() + 200.0
    c12 = Client([j1, j2], url=url, poll_interval=0.01).start()
    j3 = Job("Job3", estimate=60).add_task(Task()).add_task(Task())
    c3 = Client(j3, url=url, poll_interval=0.01)
    c3.start()
    r3 = c3.wait_all(timeout=60)
    assert [r.name for r in r3] == ["Job3"] and r3[0].ok and len(r3[0].tasks) == 2
    r12 = c12.wait_all(timeout=60)
    assert [r.name for r in r12] == ["Job1", "Job2"] and all(r.ok for r in r12)
    assert all(r.tasks[0].exit_status == 0 for r in r12)
    batches = [r for r in daemon.requests if r[0] == "POST"]
    assert len(batches) == 2  # one per client
    assert c12.done() and c3.done()


def test_task_errors_are_reported_per_task(fake: tuple[str, FakeDaemon]) -> None:
    url, _ = fake
    c = Client([Job("ok", estimate=5).add_task(Task()), Job("crash", estimate=5).add_task(Task()).add_task(Task())],
               url=url, poll_interval=0.01)
    ok, crash = c.wait_all(timeout=60)
    assert ok.ok and not crash.ok and crash.state == "failed"
    assert [t.error for t in crash.tasks] == ["segfault", "segfault"]


def test_wait_all_timeout_then_cancel(fake: tuple[str, FakeDaemon]) -> None:
    url, daemon = fake
    daemon.polls_to_finish = 10**9
    c = Client(Job("slow", estimate=5).add_task(Task()), url=url, poll_interval=0.01, max_poll_interval=0.02)
    c.start()
    with pytest.raises(errors.WaitTimeout, match="slow"):
        c.wait_all(timeout=0.3)
    c.cancel()
    (r,) = c.wait_all(timeout=60)
    assert r.state == "cancelled" and not r.ok
    assert daemon.jobs["1"]["state"] == "cancelled"


def test_cancel_is_not_undone_by_a_poll_in_flight(fake: tuple[str, FakeDaemon]) -> None:
    """A follower's GET answered 'running' before the cancel but arriving after it must not turn the
    cancelled job back into a running one."""
    url, daemon = fake
    daemon.polls_to_finish = 10**9
    daemon.hold_gets = threading.Event()
    c = Client(Job("held", estimate=5).add_task(Task()), url=url, poll_interval=0.01)
    c.start()
    assert daemon.get_held.wait(30), "the follower never polled"
    canceller = threading.Thread(target=c.cancel)
    canceller.start()
    # a cancel that did not wait for the poll would have its DELETE answered now, before the poll
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline and not any(m == "DELETE" for m, _p, _b in daemon.requests):
        time.sleep(0.01)
    daemon.hold_gets.set()
    canceller.join(30)
    assert not canceller.is_alive()
    (r,) = c.wait_all(timeout=60)
    assert r.state == "cancelled" and c.jobs[0].state == "cancelled"
    assert daemon.jobs["1"]["state"] == "cancelled"


def test_rejected_batch_raises_the_api_error(fake: tuple[str, FakeDaemon]) -> None:
    url, daemon = fake
    daemon.reject_batch = {"reference": "validation-failed", "message": "must be >= 1", "field": "jobs[0].procs"}
    c = Client(Job("bad", estimate=5).add_task(Task()), url=url).start()
    with pytest.raises(errors.ValidationError, match=r"jobs\[0\]\.procs: must be >= 1"):
        c.wait_all(timeout=60)


def test_unreachable_daemon() -> None:
    c = Client(Job("x", estimate=5).add_task(Task()), url="http://127.0.0.1:9")
    with pytest.raises(errors.DaemonUnavailable):
        c.submit()


def test_job_spec_carries_vcsched_needs() -> None:
    j = Job("vc", estimate=60, cpu_need=0.4, mem=0.25).add_task(Task(command="a")).add_task(Task(command="b"))
    spec = j.to_spec()
    assert spec["procs"] == 2 and spec["cpu_need"] == 0.4 and spec["mem"] == 0.25
    assert "cpu_need" not in Job("plain", estimate=60).add_task(Task(command="a")).to_spec()
    with pytest.raises(errors.ValidationError, match="cpu_need"):
        Job("bad", estimate=60, cpu_need=0.0).add_task(Task(command="a")).to_spec()
    with pytest.raises(errors.ValidationError, match="mem"):
        Job("bad", estimate=60, mem=1.5).add_task(Task(command="a")).to_spec()
