"""issue 11 on real hosts, over the wire: an in-process vmctld (loopback HTTPS, SQLite) runs ``gs`` with
MPL 2 and 1 s slices on two mock agents that talk HTTP and run their own reconcile loops. The agents switch
rows on their own clock (no new generation per slice); ``GET /v1/gang`` and ``GET /v1/jobs/<id>`` answer
as vmctl/api/openapi.yaml documents them; ``vmctl gang show`` prints the matrix and ``vmctl job show`` a
gang job's active time; /metrics carries the rows in use and holes."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_daemon_api import check_openapi
from tests.livedaemon import run_cli
from tests.support.daemon import InProcessDaemon, wait_for
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, HttpReporter, HttpSource
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.daemon.config import DaemonConfig
from vmctl.metrics import AgentMetrics
from vmctl.model import Discipline
from vmctl.nodedoc import PowerState

SLICE = 1.0


def promtool_check(text: str) -> None:
    """``promtool check metrics`` on an exposition (skipped without promtool)."""
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/install-system-deps.sh)")
    r = subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_agent_row_switch_metrics() -> None:
    m = AgentMetrics(lambda: None)
    for took in (0.004, 0.02):
        m.row_switch(took)
    text = m.exposition()[0].decode()
    assert re.search(r"^vmctl_agent_row_switch_seconds_count 2\.0$", text, re.MULTILINE), text
    assert re.search(r'^vmctl_agent_row_switch_seconds_bucket\{le="0\.005"\} 1\.0$', text, re.MULTILINE)
    promtool_check(text)


@pytest.fixture()
def gang_daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessDaemon]:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), tick_s=0.2,
                       holder="gang-live", policy_name="gs", policy_params={"mpl": 2, "slice": SLICE},
                       policy_explicit=True)
    with InProcessDaemon(cfg) as d:
        monkeypatch.setenv("VMCTL_URL", d.url)
        monkeypatch.setenv("VMCTL_TOKEN", d.admin_token)
        monkeypatch.setenv("VMCTL_CA", d.ca_file)
        yield d


def test_gang_rows_switch_on_the_agents_clock_over_http(gang_daemon: InProcessDaemon, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    d = gang_daemon
    stop = threading.Event()
    agents: dict[str, Reconciler] = {}
    closers: list[tuple[HttpSource, HttpReporter, MockBackend]] = []
    threads: list[threading.Thread] = []
    try:
        for node in ("n1", "n2"):
            cert, key = d.agent_cert(node, tmp_path / "certs")
            ep = AgentEndpoint(d.url, node, cert, key, d.ca_file)
            source, reporter = HttpSource(ep, wait_s=1.0), HttpReporter(ep)
            backend = MockBackend(hostname=node, cores=2, uri=f"mock://{node}")
            rec = Reconciler(backend, Layout(host=node, cores=(0, 1), levels=2, discipline=Discipline.TIMESLICE),
                             source, reporter, runner=MockProcessRunner(backend), resync_seconds=0.5)
            source.register(2, node, "mock", levels=2, discipline="timeslice")
            source.start(on_change=rec.wake)
            agents[node] = rec
            closers.append((source, reporter, backend))
            t = threading.Thread(target=rec.run, args=(stop,), kwargs={"max_wait": 0.5}, daemon=True)
            t.start()
            threads.append(t)
        ids = []
        for _ in range(2):
            status, body = d.request("POST", "/v1/jobs", {"procs": 4, "estimate": 3600, "work_seconds": 3600})
            assert status == 201, body
            ids.append(str(body["job"]["id"]))

        def both_running() -> bool:
            return all(d.request("GET", f"/v1/jobs/{j}")[1]["job"]["state"] == "running" for j in ids)

        wait_for(both_running, "both gang jobs to start")
        status, body = d.request("GET", "/v1/gang")
        check_openapi("GET", "/v1/gang", status, body)
        g = body["gang"]
        assert (g["discipline"], g["levels"], g["rows_in_use"], g["holes"]) == ("timeslice", 2, [0, 1], 0)
        assert g["schedule"]["period_s"] == SLICE and g["schedule"]["rows"] == [0, 1]
        owner = {r["row"]: r["cells"]["n1"][0] for r in g["rows"]}
        assert sorted(owner.values()) == sorted(ids)
        gens = {n: d.call(lambda n=n: d.daemon.state.generation[n]) for n in agents}

        # over four slices: the VMs of one row run, the other row's are paused, and the rows take turns
        running_rows: set[int] = set()
        end = time.monotonic() + 4 * SLICE
        while time.monotonic() < end:
            for rec in agents.values():
                power = {v.name: v.power for v in rec.backend.list_vms() if v.name.startswith("j")}
                on = {n.split("-")[0][1:] for n, p in power.items() if p is PowerState.RUNNING}
                if len(on) == 1:
                    running_rows.add(next(r for r, j in owner.items() if j in on))
            time.sleep(0.05)
        assert running_rows == {0, 1}
        assert all(rec.row_switches >= 2 for rec in agents.values()), [r.row_switches for r in agents.values()]
        assert {n: d.call(lambda n=n: d.daemon.state.generation[n]) for n in agents} == gens  # none per slice

        status, body = d.request("GET", f"/v1/jobs/{ids[0]}")
        check_openapi("GET", f"/v1/jobs/{ids[0]}", status, body)
        gj = body["job"]["gang"]
        assert gj["row"] in (0, 1) and gj["replicas"] == [] and 0 < gj["active_s"] < gj["run_s"]

        code, out, err = run_cli(capsys, "gang", "show")
        assert code == 0, err
        assert re.search(r"^NODE\s+r0\*?\s+r1\*?$", out, re.MULTILINE), out
        assert re.search(rf"^n1\s+{owner[0]} {owner[0]}\s+{owner[1]} {owner[1]}$", out, re.MULTILINE), out
        assert "rows 0 1 in turn" in out and "holes: 0 of 8 cells" in out, out
        code, out, err = run_cli(capsys, "job", "show", ids[0])
        assert code == 0, err
        assert "of which active" in out and "the limit (estimate) counts active time" in out, out
        metrics = d.call(lambda: d.server.render_metrics()[0]).decode()  # what GET /metrics serves
        assert re.search(r"^vmctl_gang_rows_in_use 2\.0$", metrics, re.MULTILINE), metrics[:2000]
        assert re.search(r"^vmctl_gang_holes 0\.0$", metrics, re.MULTILINE)
        promtool_check(metrics)
    finally:
        stop.set()
        for rec in agents.values():
            rec.wake()
        for t in threads:
            t.join(timeout=10)
        for source, reporter, backend in closers:
            source.stop()
            reporter.close()
            backend.close()
