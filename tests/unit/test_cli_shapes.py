"""issue 25 items 1, 3 and 4: ``job show`` prints its history as lines, ``job list``/``job show`` speak
each shape's language (rigid, moldable, task bag, gang, shared vcsched VM) and the tables fit 100 columns
(``-o wide`` for the rest), at the width ``COLUMNS`` gives when stdout is no terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.livedaemon import run_cli
from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import job_json
from vmctl.api.schemas import job_spec
from vmctl.policies.registry import create_policy

NOW = 1795000000.0

RIGID = {
    "id": "17", "name": "sim-a", "state": "running", "procs": 2, "estimate": 600.0, "priority": 0,
    "deadline": None, "user": "alice", "account": "", "submit_time": NOW - 60, "start_time": NOW - 50,
    "end_time": None, "tier": "bg", "placement": [{"node": "n1", "core": 0}, {"node": "n1", "core": 1}],
    "reason": None, "tasks": [{"index": 0, "exit_status": None, "error": None}], "migrations": 1,
    "history": [{"time": NOW - 60, "event": "submitted", "detail": None},
                {"time": NOW - 50, "event": "started", "detail": "run 1 as bg on n1:0, n1:1"}],
}


class FakeClient:
    """What ``vmctl job`` asks of the API client, answered from documents."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs

    def get_job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in self.jobs if j["id"] == job_id)

    def list_jobs(self, state: str | None = None, limit: int | None = None, order: str = "oldest") -> list[Any]:
        return list(reversed(self.jobs)) if order == "newest" else list(self.jobs)


@pytest.fixture()
def serve(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(*jobs: dict[str, Any]) -> None:
        monkeypatch.setattr("vmctl.cli.job._client", lambda url, token, ca: FakeClient(list(jobs)))

    return use


def test_job_show_prints_its_history_one_line_per_entry(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    serve(RIGID)
    code, out, _ = run_cli(capsys, "job", "show", "17")
    assert code == 0
    assert "\\n" not in out, out
    lines = out.splitlines()
    at = lines.index("history:")
    assert "submitted" in lines[at + 1] and "started: run 1 as bg on n1:0, n1:1" in lines[at + 2], out


def test_a_line_break_inside_a_history_detail_stays_in_its_entry() -> None:
    from vmctl.cli.job import history_text

    text = history_text([{"time": NOW, "event": "requeued", "detail": "node n1\nlost"}])
    assert text.count("\n") == 1 and "node n1\\nlost" in text


# ------------------------------------------------------------------------------ the job document


def test_a_moldable_job_keeps_its_width_and_its_time_there_after_it_ends(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 4}, policy=create_policy("moldable"))
    spec = job_spec({"shape": {"kind": "moldable", "table": {"1": 40, "2": 24, "4": 12}}, "work_seconds": 6})
    jid = c.daemon.submit([spec])[0].id
    c.run_until(lambda: c.state(jid) == "running")
    running = job_json(c.daemon.job(jid))
    assert running["procs"] == 1  # the spec's procs: the smallest width, which a rigid policy would give it
    width = running["width"]
    assert width == len(running["placement"]) and width in (1, 2, 4)
    assert running["width_time"] == {1: 40.0, 2: 24.0, 4: 12.0}[width]
    c.run_until(lambda: c.state(jid) == "done", limit=200)
    done = job_json(c.daemon.job(jid))
    assert done["placement"] == [] and (done["width"], done["width_time"]) == (width, running["width_time"])
    assert done["tasks_total"] is None and done["work_left"] is None
    c.close()


def test_a_task_bag_counts_tasks_done_and_work_left(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 1}, policy=create_policy("dispatch-priority"), shared_levels=2)
    spec = {"shape": {"kind": "task-bag", "tasks": [4.0, 4.0, 4.0, 8.0, 8.0]}, "procs": 2, "estimate": 28.0}
    jid = c.daemon.submit([spec])[0].id
    queued = job_json(c.daemon.job(jid), bag_tasks=False)
    assert (queued["tasks_done"], queued["tasks_total"], queued["work_left"], queued["width"]) == (0, 5, 28.0, None)
    c.run_until(lambda: sum(t["exit_status"] is not None for t in c.daemon.job(jid).tasks) >= 2)
    doc = job_json(c.daemon.job(jid), bag_tasks=False)  # the job list's form: no task rows
    done = [k for k, t in enumerate(c.daemon.job(jid).tasks) if t["exit_status"] is not None]
    assert doc["tasks"] == [] and doc["tasks_done"] == len(done) and doc["tasks_total"] == 5
    assert doc["work_left"] == 28.0 - sum(spec["shape"]["tasks"][k] for k in done)  # type: ignore[index]
    assert doc["width"] == len(doc["workers"]) >= 1
    c.run_until(lambda: c.state(jid) == "done", limit=500)
    end = job_json(c.daemon.job(jid), bag_tasks=False)
    assert (end["tasks_done"], end["work_left"], end["width"]) == (5, 0.0, None)
    c.close()
