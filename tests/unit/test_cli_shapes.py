"""issue 25 items 1, 3 and 4: ``job show`` prints its history as lines, ``job list``/``job show`` speak
each shape's language (rigid, moldable, task bag, gang, shared vcsched VM) and the tables fit 100 columns
(``-o wide`` for the rest), at the width ``COLUMNS`` gives when stdout is no terminal."""

from __future__ import annotations

from typing import Any

import pytest

from tests.livedaemon import run_cli

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
