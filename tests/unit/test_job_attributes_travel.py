"""issue 10: "Priority, deadline and user travel from traces, the API and the client library to the
view". One test per path: the SWF reader (priority from the queue number on request; SWF has no
deadline), the simulator's view, the API's job answers, the store and vmctld's view across a restart,
``vmctl.client`` and ``vmctl job submit/list/show``. The live API is in
tests/integration/test_daemon_api.py (``test_job_lifecycle_over_http``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.livedaemon import run_cli
from tests.support.daemon import queued_daemon
from tests.support.workloads import to_model_job
from tests.unit.test_cli_ops import JOB, Recorder, server  # noqa: F401 - the recording HTTP server fixture
from vmctl.api.documents import job_json
from vmctl.client import Job as ClientJob
from vmctl.client import Task
from vmctl.clock import VirtualClock
from vmctl.daemon.core import Daemon
from vmctl.errors import TraceFormatError, ValidationError
from vmctl.experiments.sweep import WorkloadSpec, build_workload
from vmctl.model import ClusterView, Decision, Job
from vmctl.policies.easy_family import FcfsPolicy
from vmctl.sim.engine import Simulator
from vmctl.sim.workloads import Workload, WorkloadJob, read_swf, write_swf

HEADER = "; Version: 2.2\n; MaxProcs: 8\n; Queue: 1 low\n; Queue: 5 high\n"


def _rec(job: int, submit: float, user: int, queue: Any) -> str:
    f = [job, submit, 5, 100, 2, -1, -1, 2, 200, -1, 1, user, 4, -1, queue, 2, -1, -1]
    return " ".join(str(x) for x in f)


def _trace(tmp_path: Path, *records: str) -> Path:
    p = tmp_path / "t.swf"
    p.write_text(HEADER + "\n".join(records) + "\n")
    return p


# ------------------------------------------------------------------------------ SWF


def test_swf_priority_comes_from_the_queue_only_on_request(tmp_path: Path) -> None:
    p = _trace(tmp_path, _rec(1, 0, 7, 5), _rec(2, 10, 8, 1), _rec(3, 20, -1, -1))
    plain = read_swf(p)
    assert [(j.user, j.priority) for j in plain.jobs] == [(7, 0), (8, 0), (-1, 0)]
    asked = read_swf(p, priority_from_queue=True)
    assert [(j.user, j.priority) for j in asked.jobs] == [(7, 5), (8, 1), (-1, 0)]  # -1: unknown queue
    model = [to_model_job(j, usage_known=False) for j in asked.jobs]
    assert [(m.user, m.priority, m.deadline) for m in model] == [("7", 5, None), ("8", 1, None), ("", 0, None)]


def test_swf_queue_is_strict_only_when_read(tmp_path: Path) -> None:
    p = _trace(tmp_path, _rec(1, 0, 7, 5), _rec(2, 10, 8, 1.5))
    assert len(read_swf(p).jobs) == 2
    with pytest.raises(TraceFormatError) as err:
        read_swf(p, priority_from_queue=True)
    assert "t.swf:6: field 15 (queue) must be an integer" in str(err.value)


def test_swf_writes_a_priority_back_as_the_queue(tmp_path: Path) -> None:
    jobs = [WorkloadJob(1, 0.0, 10.0, 1, 20.0, None, 3, 4), WorkloadJob(2, 1.0, 10.0, 1, 20.0, None, 3, 0)]
    out = tmp_path / "w.swf"
    write_swf(Workload(jobs=jobs, max_procs=4, source="test"), out)
    assert read_swf(out, priority_from_queue=True).jobs == jobs
    assert [j.priority for j in read_swf(out).jobs] == [0, 0]


def test_sim_run_spec_reads_the_queue_and_refuses_it_for_a_model(tmp_path: Path) -> None:
    p = _trace(tmp_path, _rec(1, 0, 7, 5), _rec(2, 10, 8, 1))
    built = build_workload(WorkloadSpec(trace=str(p), priority_from_queue=True, cpu_usage="full"))
    assert [getattr(j, "priority", None) for j in built.jobs] == [5, 1]
    with pytest.raises(ValidationError) as err:
        build_workload(WorkloadSpec(model="lublin99", jobs=10, priority_from_queue=True))
    assert err.value.fields["field"] == "--priority-from-queue"


# ------------------------------------------------------------------------------ the simulator's view


class _Recording(FcfsPolicy):
    """FCFS that notes what it sees of each queued job."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, tuple[str, int, float | None]] = {}

    def decide(self, view: ClusterView, now: float) -> Decision:
        for j in view.queue:
            self.seen[j.id] = (j.user, j.priority, j.deadline)
        return super().decide(view, now)


def test_the_simulator_shows_the_policy_user_and_priority() -> None:
    jobs = [WorkloadJob(1, 0.0, 10.0, 4, 20.0, None, 7, 3), WorkloadJob(2, 0.0, 10.0, 4, 20.0, None, -1, 0),
            WorkloadJob(3, 1.0, 10.0, 4, 20.0, None, 7, -2)]
    pol = _Recording()
    Simulator(jobs, 4, pol).run()
    assert pol.seen == {"1": ("7", 3, None), "2": ("", 0, None), "3": ("7", -2, None)}


# ------------------------------------------------------------------------------ API, store, vmctld


def _daemon(tmp: Path, clock: VirtualClock) -> Daemon:
    d: Daemon = queued_daemon(tmp, clock, "travel-test")
    return d


def test_priority_deadline_and_user_reach_the_view_and_survive_a_restart(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    d = _daemon(tmp_path, clock)  # no node: the jobs stay queued
    (a, b) = d.submit([{"procs": 1, "estimate": 10.0, "priority": 5, "deadline": 5000.0, "user": "alice"},
                       {"procs": 2, "estimate": 10.0}])
    doc = job_json(d.job(a.id))
    assert (doc["priority"], doc["deadline"], doc["user"]) == (5, 5000.0, "alice")
    assert (job_json(d.job(b.id))["user"], job_json(d.job(b.id))["deadline"]) == ("", None)
    d.close()
    again = _daemon(tmp_path, clock)
    queue = {j.id: j for j in again.view().queue}
    assert (queue[a.id].priority, queue[a.id].deadline, queue[a.id].user) == (5, 5000.0, "alice")
    assert (queue[b.id].priority, queue[b.id].deadline, queue[b.id].user) == (0, None, "")
    assert isinstance(queue[a.id], Job)
    again.close()


# ------------------------------------------------------------------------------ the client library


def test_the_client_library_sends_the_user() -> None:
    j = ClientJob("j", estimate=10, priority=2, deadline=99.0, user="bob", tasks=[Task()])
    spec = j.to_spec()
    assert (spec["priority"], spec["deadline"], spec["user"]) == (2, 99.0, "bob")
    assert "user" not in ClientJob("k", estimate=10, tasks=[Task()]).to_spec()


# ------------------------------------------------------------------------------ the CLI


def test_job_submit_user_and_list_show_columns(server: tuple[str, Recorder],  # noqa: F811
                                               capsys: pytest.CaptureFixture[str]) -> None:
    url, rec = server
    job = {**JOB, "priority": 4, "deadline": 1795000600.0, "user": "carol"}
    rec.answer("POST", "/v1/jobs", 201, {"job": job})
    code, _, _ = run_cli(capsys, "job", "submit", "--url", url, "-n", "2", "-t", "600", "--user", "carol",
                         "--priority", "4", "--deadline", "1795000600", "-o", "json")
    assert code == 0
    assert rec.requests[-1]["body"] == {"procs": 2, "estimate": 600.0, "priority": 4, "deadline": 1795000600.0,
                                        "user": "carol"}
    rec.answer("GET", "/v1/jobs", 200, {"jobs": [job]})
    code, out, _ = run_cli(capsys, "job", "list", "--url", url, "-o", "json")
    assert code == 0 and json.loads(out)["jobs"][0]["user"] == "carol"
    from vmctl.cli.render import job_table

    grid = job_table([job], wide=True)  # the priority: -o wide (the default table fits 100 columns)
    row = dict(zip(grid.headers, grid.rows[0], strict=True))
    assert (row["USER"], row["PRIO"]) == ("carol", "4")
    rec.answer("GET", "/v1/jobs/17", 200, {"job": job})
    code, out, _ = run_cli(capsys, "job", "show", "17", "--url", url)
    assert code == 0
    shown = {k: v.strip() for k, v in ([*line.split(None, 1), ""][:2] for line in out.splitlines() if line.strip())}
    assert (shown["user"], shown["priority"]) == ("carol", "4") and shown["deadline"] != "-", out
