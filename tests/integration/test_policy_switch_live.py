"""issue 22 item 4 over the wire: an in-process vmctld (loopback HTTPS, SQLite) and two mock agents that
register, long-poll and report over HTTP and run their own reconcile loops, all configured with the default
layout (2 priority levels). ``vmctl policy set NAME --relayout`` switches measy -> gs-m (mpl 3) -> vcsched-mcb8
-> measy while jobs run: each switch prints what it waits for and ends switched; every job ends ``done`` with
run 1 and every process started once. ``GET /v1/policy`` and ``/healthz`` answer as openapi.yaml says. A
vmctld configured with ``gs-m`` starts with no node, says so in ``/healthz`` and ``vmctl policy show``, and
runs a gang job once the agents (configured for MEASY) registered and re-laid out."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon_api import check_openapi
from tests.livedaemon import run_cli
from tests.support.daemon import InProcessDaemon, wait_for
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, HttpReporter, HttpSource
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.clock import SystemClock
from vmctl.daemon.config import DaemonConfig

NODES = ("n1", "n2")


class Agents:
    """One mock agent per node over HTTP (2 cores, the default layout: 2 priority levels), each in its thread."""

    def __init__(self, d: InProcessDaemon, tmp: Path) -> None:
        self.d, self.tmp = d, tmp
        self.stop = threading.Event()
        self.recs: dict[str, Reconciler] = {}
        self.backends: dict[str, MockBackend] = {}
        self.closers: list[Any] = []
        self.threads: list[threading.Thread] = []

    def start(self) -> None:
        for node in NODES:
            cert, key = self.d.agent_cert(node, self.tmp / "certs")
            ep = AgentEndpoint(self.d.url, node, cert, key, self.d.ca_file)
            source, reporter = HttpSource(ep, wait_s=1.0), HttpReporter(ep)
            backend = MockBackend(hostname=node, cores=2, uri=f"mock://{node}", memory_mib=2048, clock=SystemClock())
            rec = Reconciler(backend, Layout(host=node, cores=(0, 1)), source, reporter, clock=backend.clock,
                             runner=MockProcessRunner(backend), resync_seconds=0.3, host_memory_mib=2048)
            source.register(2, node, "mock", memory_mib=2048, levels=2, discipline="priority")
            source.start(on_change=rec.wake)
            self.recs[node], self.backends[node] = rec, backend
            self.closers.append((source, reporter, backend))
            t = threading.Thread(target=rec.run, args=(self.stop,), kwargs={"max_wait": 0.3}, daemon=True)
            t.start()
            self.threads.append(t)

    def close(self) -> None:
        self.stop.set()
        for rec in self.recs.values():
            rec.wake()
        for t in self.threads:
            t.join(timeout=10)
        for source, reporter, backend in self.closers:
            source.stop()
            reporter.close()
            backend.close()

    def layouts(self) -> dict[str, tuple[str, int]]:
        return {n: (r.layout.discipline.value, r.layout.levels) for n, r in self.recs.items()}

    def starts(self) -> list[str]:
        return [e.detail for b in self.backends.values() for e in b.operations("start_process")]


@pytest.fixture()
def cli_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def use(d: InProcessDaemon) -> None:
        monkeypatch.setenv("VMCTL_URL", d.url)
        monkeypatch.setenv("VMCTL_TOKEN", d.admin_token)
        monkeypatch.setenv("VMCTL_CA", d.ca_file)

    yield use


def _daemon(tmp: Path, policy: str, params: dict[str, Any] | None = None) -> InProcessDaemon:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp / "state"), tick_s=0.2,
                       holder="switch-live", policy_name=policy, policy_params=params or {}, policy_explicit=True,
                       checkpoint_dir=str(tmp / "ckpt"))
    return InProcessDaemon(cfg)


def _submit(d: InProcessDaemon, **spec: Any) -> str:
    status, body = d.request("POST", "/v1/jobs", {"estimate": 600, **spec})
    assert status == 201, body
    return str(body["job"]["id"])


def _state(d: InProcessDaemon, job: str) -> str:
    return str(d.request("GET", f"/v1/jobs/{job}")[1]["job"]["state"])


def _running(d: InProcessDaemon, jobs: list[str]) -> bool:
    return all(_state(d, j) == "running" for j in jobs)


def test_switch_family_with_jobs_running_over_http(tmp_path: Path, cli_env: Any,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with _daemon(tmp_path, "measy") as d:
        cli_env(d)
        agents = Agents(d, tmp_path)
        try:
            agents.start()
            all_jobs: list[str] = []
            first = [_submit(d, procs=2, work_seconds=3.0) for _ in range(2)]
            all_jobs += first
            wait_for(lambda: _running(d, first), "the measy jobs to run")

            # the switch's progress, as the API answers it while jobs run
            status, body = d.request("PUT", "/v1/policy", {"name": "gs-m", "params": {"mpl": 3, "slice": 1.0},
                                                           "relayout": True})
            check_openapi("PUT", "/v1/policy", status, body)
            assert status == 200 and body["name"] == "measy", body
            sw = body["switch"]
            assert (sw["policy"], sw["phase"], sw["layout"]) == ("gs-m", "draining",
                                                                 {"discipline": "timeslice", "levels": 3})
            assert "waiting for 2 running job(s) to end" in sw["waiting_for"], sw
            status, health = d.request("GET", "/healthz")
            check_openapi("GET", "/healthz", status, health)
            assert "switching to policy gs-m" in health["waiting"], health
            queued = _submit(d, procs=4, work_seconds=1.0)  # waits for the switch, then runs as a gang
            all_jobs.append(queued)
            code, out, err = run_cli(capsys, "policy", "show")
            assert code == 0, err
            assert "switch   measy -> gs-m" in out and "RE-LAID OUT" in out and "vmctl policy cancel" in out, out
            code, out, err = run_cli(capsys, "policy", "set", "gs-m", "-p", "mpl=3", "--relayout")
            assert code == 4 and "a switch to gs-m" in err, (code, err)
            # the CLI follows the switch in progress through `vmctl policy show`; wait for it through the API
            wait_for(lambda: d.request("GET", "/v1/policy")[1]["switch"] is None, "the switch to gs-m", limit=60)
            assert agents.layouts() == {n: ("timeslice", 3) for n in NODES}
            status, body = d.request("GET", "/v1/policy")
            check_openapi("GET", "/v1/policy", status, body)
            assert body["name"] == "gs-m" and body["layout"] == {"discipline": "timeslice", "levels": 3,
                                                                 "set_by": "vmctld"}

            # gang jobs in rows; the one command switches to vcsched while they run, following the switch
            gangs = [_submit(d, procs=4, work_seconds=2.0) for _ in range(2)]
            all_jobs += gangs
            wait_for(lambda: _running(d, gangs), "the gang jobs", limit=60)
            code, out, err = run_cli(capsys, "policy", "set", "vcsched-mcb8", "--relayout", "--poll", "0.1")
            assert code == 0, err
            assert "switching gs-m -> vcsched-mcb8 on 1 shared level per core" in err, err
            assert "draining" in err and "running job(s) to end" in err, err
            assert "switched to vcsched-mcb8" in err and "policy   vcsched-mcb8" in out, (out, err)
            assert agents.layouts() == {n: ("shared", 1) for n in NODES}
            assert all(_state(d, j) == "done" for j in [*first, queued, *gangs])

            shared = [_submit(d, procs=2, work_seconds=2.0, cpu_need=0.5) for _ in range(2)]
            all_jobs += shared
            wait_for(lambda: _running(d, shared), "the vcsched jobs", limit=60)
            code, out, err = run_cli(capsys, "policy", "set", "measy", "--relayout", "--poll", "0.1")
            assert code == 0, err
            assert "switched to measy" in err and agents.layouts() == {n: ("priority", 2) for n in NODES}, err

            last = [_submit(d, procs=2, work_seconds=1.0) for _ in range(3)]
            all_jobs += last
            wait_for(lambda: all(_state(d, j) == "done" for j in all_jobs), "every job done", limit=60)
            runs = {j: d.request("GET", f"/v1/jobs/{j}")[1]["job"]["runs"] for j in all_jobs}
            assert set(runs.values()) == {1}, runs
            starts = agents.starts()
            assert len(starts) == len(set(starts)), "a process was started twice"
            status, events = d.request("GET", "/v1/events?limit=500")
            texts = [e["message"] for e in events["events"]]
            assert sum("policy switch to" in t and " done" in t for t in texts) == 3, texts
        finally:
            agents.close()


def test_a_configured_gang_policy_starts_without_nodes_and_waits_for_them(tmp_path: Path, cli_env: Any,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with _daemon(tmp_path, "gs-m", {"mpl": 3, "slice": 1.0}) as d:
        cli_env(d)
        status, health = d.request("GET", "/healthz")
        check_openapi("GET", "/healthz", status, health)
        assert health["waiting"] == ("policy gs-m waits for nodes: no ready node carries 3 timeslice levels per "
                                     "core (no node registered yet)"), health
        code, out, err = run_cli(capsys, "policy", "show")
        assert code == 0 and "waiting  policy gs-m waits for nodes" in out, (out, err)
        # bad input: a clear error, exit 2 (3: nothing to cancel), no traceback, nothing changed
        for argv, exit_code, text in (
                (("policy", "set", "no-such", "--relayout"), 2, "unknown policy 'no-such'"),
                (("policy", "set", "gs-m", "-p", "mpl=9", "--relayout"), 2,
                 "parameter mpl: needs 9 VM levels per core, but an agent carries at most 8"),
                (("policy", "set", "gs-m", "-p", "mpl=three", "--relayout"), 2, "parameter mpl: must be int"),
                (("policy", "set", "gs-m", "--layout", "gang:3"), 2, "--layout: 'gang:3' is not DISCIPLINE:LEVELS"),
                (("policy", "set", "measy", "--layout", "shared:2"), 2,
                 "policy measy cannot run on vmctld on 2 shared levels per core: needs the priority discipline"),
                (("policy", "cancel"), 3, "policy switch"),
        ):
            code, out, err = run_cli(capsys, *argv)
            assert code == exit_code and text in err and "Traceback" not in err, (argv, code, err)
        status, body = d.request("GET", "/v1/policy")
        assert body["name"] == "gs-m" and body["switch"] is None, body
        job = _submit(d, procs=3, work_seconds=1.0)
        agents = Agents(d, tmp_path)
        try:
            agents.start()  # configured with 2 priority levels: registered, told 3 timeslice rows, re-laid out
            wait_for(lambda: _state(d, job) == "done", "the gang job on re-laid out nodes", limit=60)
            assert agents.layouts() == {n: ("timeslice", 3) for n in NODES}
            status, health = d.request("GET", "/healthz")
            assert "waiting" not in health, health
        finally:
            agents.close()


def test_policy_list_shows_each_policys_needs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "policy", "list")
    assert code == 0, err
    assert "NEEDS" in out and "LAYOUT" in out and "timeslice" in out, out
    code, out, err = run_cli(capsys, "policy", "list", "-o", "json")
    assert code == 0, err
    needs = {p["name"]: p["needs"] for p in json.loads(out)["policies"]}
    assert needs["measy"] == {"levels": 2, "disciplines": ["priority"], "shapes": ["rigid"], "shared_vms": False,
                              "layout": {"discipline": "priority", "levels": 2}}
    assert needs["gs-m"]["layout"] == {"discipline": "timeslice", "levels": 5}  # mpl 5 by default
    assert needs["vcsched-mcb8"]["shared_vms"] and needs["vcsched-mcb8"]["layout"] == {"discipline": "shared",
                                                                                       "levels": 1}
    assert needs["dispatch-priority"]["layout"] == {"discipline": "shared", "levels": 2}


def test_vmctld_killed_mid_switch_resumes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A real vmctld process (SQLite file) killed with SIGKILL while a switch drains, twice: each restarted
    vmctld loads the switch from the store and goes on; the CLI explains the state in between; the running
    job ends ``done`` with run 1, the queued one runs as a gang job once the cluster is re-laid out."""
    from tests.integration.test_daemon_crash import Agent, Vmctld
    from vmctl.agents.backends.mock import MockFabric

    d = Vmctld(tmp_path)
    d.start()
    agents: list[Agent] = []
    try:
        fabric = MockFabric()
        agents = [Agent(n, 2, d, fabric, {}) for n in NODES]
        for a in agents:
            a.start()
        status, body = d.call("POST", "/v1/jobs", {"procs": 2, "estimate": 600, "work_seconds": 6.0})
        assert status == 201, body
        job = str(body["job"]["id"])

        def state(j: str) -> str:
            return str(d.call("GET", f"/v1/jobs/{j}")[1]["job"]["state"])

        wait_for(lambda: state(job) == "running", "the job to run")
        status, body = d.call("PUT", "/v1/policy", {"name": "gs-m", "params": {"mpl": 3, "slice": 1.0},
                                                     "relayout": True})
        assert status == 200 and body["switch"]["phase"] == "draining", body
        status, body = d.call("POST", "/v1/jobs", {"procs": 3, "estimate": 600, "work_seconds": 1.0})
        gang = str(body["job"]["id"])
        resumed = 0
        for _ in range(2):
            d.kill9()
            d.start()
            assert d.wait_leader()
            monkeypatch.setenv("VMCTL_URL", f"https://127.0.0.1:{d.port}")
            monkeypatch.setenv("VMCTL_TOKEN", d.token)
            monkeypatch.setenv("VMCTL_CA", str(tmp_path / "state" / "ca.pem"))
            code, out, err = run_cli(capsys, "policy", "show")
            if "switch   " not in out:  # the job ended and the switch completed while no vmctld ran
                break
            assert code == 0 and "switch   easy -> gs-m" in out and "draining" in out, (out, err)
            resumed += 1
        assert resumed >= 1, "the first restarted vmctld must find the switch still draining (a 6 s job)"
        wait_for(lambda: d.call("GET", "/v1/policy")[1]["switch"] is None, "the resumed switch", limit=60)
        wait_for(lambda: state(gang) == "done", "the gang job", limit=60)
        assert state(job) == "done" and d.call("GET", f"/v1/jobs/{job}")[1]["job"]["runs"] == 1
        assert d.call("GET", "/v1/policy")[1]["name"] == "gs-m"
        assert {(a.rec.layout.discipline.value, a.rec.layout.levels) for a in agents} == {("timeslice", 3)}
        starts = [e.detail for a in agents for e in a.backend.operations("start_process")]
        assert len(starts) == len(set(starts)) == 5, starts
    finally:
        for a in agents:
            a.stop()
            a.backend.close()
        d.stop()
