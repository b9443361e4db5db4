"""Crash safety: real ``vmctld`` processes (loopback HTTPS, SQLite file) and two agents (the real
reconciler on the mock backend, talking HTTP with client certificates) run a workload while the test
kills the daemon with SIGKILL again and again (by pid) and restarts it.

Afterwards: every job whose submission was acknowledged (201) finished; no process of any job was
started twice; the migration that was open at one of the kills was finished or rolled back."""

from __future__ import annotations

import http.client
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, HttpReporter, HttpSource
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.clock import SystemClock
from vmctl.daemon.testing import admin_request
from vmctl.model import NodeObserved
from vmctl.store import open_store

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Vmctld:
    """One vmctld process at a time on a fixed port."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.config = tmp / "vmctld.yaml"
        self.config.write_text(
            f"state_dir: {tmp}/state\n"
            f"store: {{url: 'sqlite:///{tmp}/state/vmctld.db'}}\n"
            f"api: {{listen: 127.0.0.1, port: {self.port}, bootstrap_token_file: {tmp}/state/admin.token}}\n"
            "policy: {name: easy}\n"
            "loop: {tick_s: 0.5, node_timeout_s: 60}\n"
            "lease: {ttl_s: 1.5}\n"
            "log_level: warning\n"
        )
        self.proc: subprocess.Popen[str] | None = None
        self.kills = 0

    def start(self) -> None:
        with open(self.tmp / "vmctld.log", "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "vmctl.daemon.main", "--config", str(self.config)],
                                         stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout is not None
        # Bounded: a daemon that never says "ready" fails the test instead of hanging it.
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        if not ready:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            log = (self.tmp / "vmctld.log").read_text()[-2000:]
            raise AssertionError(f"vmctld printed nothing for 60 s; its log ends:\n{log}")
        line = self.proc.stdout.readline()
        assert "vmctld ready" in line, f"vmctld did not start: {line!r} (see {self.tmp}/vmctld.log)"

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.kills += 1

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    @property
    def token(self) -> str:
        return (self.tmp / "state" / "admin.token").read_text().strip()

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10) -> tuple[int, Any]:
        return admin_request(self.port, str(self.tmp / "state" / "ca.pem"), self.token, method, path, body, timeout)

    def try_call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            return self.call(method, path, body)
        except (OSError, http.client.HTTPException):
            return 0, None


class _RecordingReporter(HttpReporter):
    """Keeps every distinct error the agent reported (for the failure message)."""

    def __init__(self, ep: AgentEndpoint) -> None:
        super().__init__(ep)
        self.errors: list[str] = []

    def report(self, observed: NodeObserved) -> None:
        for e in observed.errors:
            if e not in self.errors:
                self.errors.append(e)
        super().report(observed)


class Agent:
    def __init__(self, name: str, cores: int, d: Vmctld, fabric: MockFabric, peers: dict[str, str]) -> None:
        s, doc = d.call("POST", "/v1/certs", {"node": name})
        assert s == 201
        cdir = d.tmp / "agents"
        cdir.mkdir(exist_ok=True)
        for key in ("cert_pem", "key_pem", "ca_pem"):
            (cdir / f"{name}.{key}").write_text(doc[key])
        ep = AgentEndpoint(f"https://127.0.0.1:{d.port}", name, str(cdir / f"{name}.cert_pem"),
                           str(cdir / f"{name}.key_pem"), str(cdir / f"{name}.ca_pem"), timeout_s=5)
        self.backend = MockBackend(hostname=name, cores=cores, clock=SystemClock(), fabric=fabric,
                                   uri=f"mock://{name}", migration_seconds=0.5)
        self.source = HttpSource(ep, wait_s=2)
        self.source.register(cores=cores, hostname=name, backend="mock")
        self.reporter = _RecordingReporter(ep)
        self.rec = Reconciler(self.backend, Layout(host=name, cores=tuple(range(cores))), self.source, self.reporter,
                              runner=MockProcessRunner(self.backend), peers=peers, migrate_uris=peers,
                              resync_seconds=0.2)
        self.rec.backoff.maximum = 0.5
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.rec.run, args=(self.stop_ev,), daemon=True)

    def start(self) -> None:
        self.source.start(on_change=self.rec.wake)
        self.thread.start()

    def diagnose(self) -> dict[str, Any]:
        desired = self.source.fetch()
        return {"errors": self.reporter.errors[-5:], "applied_gen": self.rec._generation_applied,
                "vms": [(v.name, v.power.value) for v in self.backend.list_vms() if v.name.startswith("j")],
                "generation": desired.generation if desired else None,
                "reported": [(v.name, v.power.value, v.migration_phase) for v in self.rec._last_vms
                             if v.name.startswith("j")]}

    def stop(self) -> None:
        self.stop_ev.set()
        self.rec.wake()
        self.thread.join(10)
        self.source.stop()
        self.reporter.close()


@contextmanager
def two_node_cluster(d: Vmctld, cores: int) -> Iterator[tuple[Vmctld, list[Agent]]]:
    """Start ``d`` and two HTTP agents (n1, n2) on mock backends sharing one fabric; stop all after."""
    d.start()
    fabric = MockFabric()
    peers = {"n1": "mock://n1", "n2": "mock://n2"}
    agents = [Agent("n1", cores, d, fabric, peers), Agent("n2", cores, d, fabric, peers)]
    for a in agents:
        a.start()
    try:
        yield d, agents
    finally:
        for a in agents:
            a.stop()
        d.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Vmctld, list[Agent]]]:
    with two_node_cluster(Vmctld(tmp_path), cores=4) as c:
        yield c


def test_kill9_during_a_workload_loses_nothing_and_runs_nothing_twice(
        cluster: tuple[Vmctld, list[Agent]]) -> None:
    d, agents = cluster
    rng = random.Random(7)
    acked: list[str] = []
    lock = threading.Lock()

    def submit_some(n: int) -> None:
        for _ in range(n):
            procs = rng.choice([1, 1, 2, 3, 4])
            body = {"procs": procs, "estimate": 60, "work_seconds": rng.uniform(0.5, 2.5)}
            s, doc = d.try_call("POST", "/v1/jobs", body)
            if s == 201:
                with lock:
                    acked.append(doc["job"]["id"])

    s, doc = d.call("POST", "/v1/jobs", {"name": "long", "procs": 1, "estimate": 60, "work_seconds": 20})
    assert s == 201
    long_id = doc["job"]["id"]
    acked.append(long_id)
    submit_some(8)
    migrated: str | None = None
    for cycle in range(5):
        time.sleep(rng.uniform(0.4, 1.2))
        submit_some(4)
        if cycle == 1 and migrated is None:
            # open a migration and kill the daemon right after it was accepted. The target node may
            # be full for a while (4 cores, jobs of up to 4 processes) and the daemon restarted in the
            # previous cycle answers 503 until the dead one's lease has expired: keep trying while the
            # long job runs, and say what the daemon answered if it never worked
            tried: list[tuple[int, object]] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                s, doc = d.try_call("GET", f"/v1/jobs/{long_id}")
                if s == 200 and doc["job"]["state"] == "running":
                    src = doc["job"]["placement"][0]["node"]
                    s2, doc2 = d.try_call("POST", f"/v1/jobs/{long_id}/migrate",
                                          {"to_node": "n2" if src == "n1" else "n1"})
                    if s2 == 202:
                        migrated = long_id
                        break
                    tried.append((s2, doc2))
                else:
                    tried.append((s, doc and doc.get("job", {}).get("state")))
                time.sleep(0.2)
            assert migrated is not None, f"could not open a migration; last answers: {tried[-5:]}"
        d.kill9()
        d.start()
        # while the new daemon waits for the dead one's lease to expire it answers 503
    # everything acknowledged finishes (the time for that counts from the last restart, not from before
    # the five kill/restart cycles, which take long on a loaded machine)
    t_end = time.monotonic() + 90
    pending = set(acked)
    while pending and time.monotonic() < t_end:
        s, doc = d.try_call("GET", "/v1/jobs?limit=100000")
        if s == 200:
            states = {j["id"]: j["state"] for j in doc["jobs"]}
            missing = [j for j in pending if j not in states]
            assert not missing, f"acknowledged jobs lost after kill -9: {missing}"
            pending = {j for j in pending if states[j] not in ("done", "failed", "killed", "cancelled")}
        time.sleep(0.3)
    assert not pending, f"jobs never finished: {sorted(pending)}; agents: {[a.diagnose() for a in agents]}"
    s, doc = d.call("GET", "/v1/jobs?limit=100000")
    by_id = {j["id"]: j for j in doc["jobs"]}
    assert all(by_id[j]["state"] == "done" for j in acked), {j: by_id[j]["state"] for j in acked}
    assert d.kills == 5 and len(acked) >= 20

    diag = [a.diagnose() for a in agents]
    (d.tmp / "agents.json").write_text(json.dumps(diag, default=str, indent=1))  # kept for post-mortems
    # no process was started twice: each (job, index) appears once in the backends' journals
    starts: dict[str, int] = {}
    for a in agents:
        for e in a.backend.operations("start_process"):
            starts[e.detail] = starts.get(e.detail, 0) + 1
    twice = {k: v for k, v in starts.items() if v > 1}
    assert not twice, f"processes started more than once: {twice}"
    expected = {f"{j}[{i}]" for j in acked for i in range(by_id[j]["procs"])}
    assert expected <= set(starts)

    # stored state agrees: one run per job, no operation left open
    d.stop()
    store = open_store(f"sqlite:///{d.tmp}/state/vmctld.db")
    try:
        runs = {j.id: j.run for j in store.load_jobs()}
        assert all(runs[j] == 1 for j in acked), {j: runs[j] for j in acked if runs[j] != 1}
        ops = store.load_operations()
        assert all(o.state != "pending" for o in ops), [(o.id, o.state) for o in ops]
        mig_ops = [o for o in ops if o.job_id == migrated and o.kind == "migrate"]
        # finished, rolled back, or moot because the job itself finished first (then it is done, above)
        assert mig_ops and (mig_ops[0].state in ("done", "rolled_back") or (
            mig_ops[0].state == "aborted" and mig_ops[0].detail.get("note") == "job done")), (
            [(o.id, o.state, o.detail) for o in mig_ops], diag)
    finally:
        store.close()
