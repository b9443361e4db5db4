"""Job shapes over HTTPS end to end: a moldable job and a task bag submitted to a live vmctld (EASY)
with ``vmctl job submit --shape`` and over the API, started on a mock agent (the real reconciler on
the mock backend, stepped by hand), and shown by ``vmctl job show`` with their shape and the width
the policy chose; every answer is checked against vmctl/api/openapi.yaml."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_daemon_api import check_openapi
from tests.livedaemon import run_cli
from tests.support.daemon import InProcessDaemon, cli_daemon, wait_for
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, HttpReporter, HttpSource
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.daemon.desired import desired_vms
from vmctl.model import JobShape


@pytest.fixture()
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessDaemon]:
    with cli_daemon(tmp_path, monkeypatch, "shapes-live") as d:
        yield d


def test_a_moldable_job_and_a_task_bag_round_trip(live: InProcessDaemon, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    d = live
    cert, key = d.agent_cert("node1", tmp_path / "certs")
    ep = AgentEndpoint(d.url, "node1", cert, key, d.ca_file)
    source, reporter = HttpSource(ep, wait_s=1.0), HttpReporter(ep)
    backend = MockBackend(hostname="node1", cores=6, uri="mock://node1")
    agent = Reconciler(backend, Layout(host="node1", cores=tuple(range(6))), source, reporter,
                       runner=MockProcessRunner(backend))
    try:
        source.register(6, "node1", "mock")
        shape = '{"kind": "moldable", "table": {"2": 100, "4": 60}}'
        code, out, err = run_cli(capsys, "job", "submit", "--shape", shape, "--work-seconds", "5000", "-o", "json")
        assert code == 0, err
        mold = str(json.loads(out)["jobs"][0]["id"])
        status, body = d.request("POST", "/v1/jobs", {"shape": {"kind": "task-bag", "tasks": [10, 10, 10],
                                                                 "max_workers": 2}, "work_seconds": 5000})
        check_openapi("POST", "/v1/jobs", status, body)
        assert status == 201, body
        bag = str(body["job"]["id"])
        assert body["job"]["procs"] == 2 and body["job"]["estimate"] == 20.0  # 3 tasks of 10 s on 2 workers

        # without work_seconds, a moldable job's mock processes do its time at the width it starts with
        status, body = d.request("POST", "/v1/jobs", {"shape": {"kind": "moldable", "table": {"2": 100, "4": 60}}})
        assert status == 201, body
        plain = str(body["job"]["id"])

        def started() -> bool:
            agent.run_once()
            return all(d.request("GET", f"/v1/jobs/{j}")[1]["job"]["placement"] for j in (mold, bag, plain))

        wait_for(started, "both jobs to start on node1")
        vms = d.call(lambda: desired_vms(d.daemon.state, "node1"))  # what node1's agent is told to run
        work = {v.process.job_id: v.process.work_seconds for v in vms if v.process is not None}
        assert (work[mold], work[bag], work[plain]) == (5000.0, 5000.0, 100.0)
        status, body = d.request("GET", f"/v1/jobs/{mold}")
        check_openapi("GET", f"/v1/jobs/{mold}", status, body)
        job = body["job"]
        assert job["shape"] == {"kind": "moldable", "widths": [2, 4], "times": [100.0, 60.0]}
        assert job["width"] == 2  # EASY knows only rigid jobs: it starts the job at procs, its smallest width
        assert d.call(lambda: d.daemon.view().shapes) == {mold: JobShape.moldable({2: 100.0, 4: 60.0}),
                                                          bag: JobShape.task_bag([10.0] * 3, 2),
                                                          plain: JobShape.moldable({2: 100.0, 4: 60.0})}

        code, out, err = run_cli(capsys, "job", "show", mold)
        assert code == 0, err
        shown = {k: v.strip() for k, v in ([*ln.split(None, 1), ""][:2] for ln in out.splitlines() if ln.strip())}
        assert shown["shape"] == "moldable widths 2, 4 (times 100 s, 60 s)", out
        assert shown["width"] == "2 of widths 2,4, 100s at that width", out  # the chosen width, its time there
        code, out, err = run_cli(capsys, "job", "show", bag)
        assert code == 0, err
        assert "task bag of 3 tasks (30 s of work), at most 2 workers" in out

        # bad input over HTTP: 422 naming the field, nothing submitted
        status, body = d.request("POST", "/v1/jobs", {"shape": {"kind": "moldable", "table": {"2": 100}}, "procs": 3})
        check_openapi("POST", "/v1/jobs", status, body)
        assert status == 422 and body["error"]["field"] == "procs", body
        status, body = d.request("GET", "/v1/jobs")
        assert sorted(str(j["id"]) for j in body["jobs"]) == sorted([mold, bag, plain])
    finally:
        source.stop()
        reporter.close()
        backend.close()
