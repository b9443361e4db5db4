"""Crash safety: real ``vmctld`` processes (loopback HTTPS, SQLite file, the two-tier MEASY policy) and
three agents (the real reconciler on the mock backend, talking HTTP with client certificates, heartbeats
and self-fencing as ``vmctl-agent`` wires them) run a workload of 100 jobs on an accelerated clock while
the test kills the daemon with SIGKILL 30+ times (by pid) and restarts it -- some kills at the very
moment a restarted daemon has taken the lease, before the agents' first report.

Afterwards: every job whose submission was acknowledged (201) ended ``done``: none killed "ran past its
estimate" although its work was shorter than the estimate, whether it ended while no daemon was
running or ran in bg across restarts and was promoted right after one (issue 23: the estimate counts
what the hosts accounted, not modelled bg progress); no process of any job was started twice and every
job has run 1; no operation is left open; the migration that was open at one of the kills was finished
or rolled back.

The test waits for progress, not for a wall-time window (issue 23 item 8: under a load average of ~10
on 2 cores jobs did not finish in a fixed 90 s): it fails only when no job finished and no job VM
received CPU time for ``STALL_S``. Its diagnostics cannot hang it: each agent's is taken in a thread
with a time limit (they once blocked forever in ``MockBackend.list_vms``, on a lock that two
backends of one fabric took in opposite orders -- a deadlock of the mock backend, fixed there)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import select
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import admin_request
from tests.support.hosts import wait_job_vms_gone
from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, Heartbeat, HttpReporter, HttpSource, Liveness
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.clock import Clock, SystemClock, accelerated_clock
from vmctl.nodedoc import NodeObserved
from vmctl.store import open_store

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Vmctld:
    """One vmctld process at a time on a fixed port."""

    def __init__(self, tmp: Path, loop: str = "{tick_s: 0.5, node_timeout_s: 60}", extra: str = "",
                 policy: str = "easy") -> None:
        self.tmp = tmp
        self.port = _free_port()
        self.config = tmp / "vmctld.yaml"
        self.config.write_text(
            f"state_dir: {tmp}/state\n"
            f"store: {{url: 'sqlite:///{tmp}/state/vmctld.db'}}\n"
            f"api: {{listen: 127.0.0.1, port: {self.port}, bootstrap_token_file: {tmp}/state/admin.token}}\n"
            f"policy: {{name: {policy}}}\n"
            f"loop: {loop}\n"
            "lease: {ttl_s: 1.5}\n"
            "log_level: warning\n" + extra
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

    def lease_holder(self) -> str | None:
        """The lease holder in the SQLite file (read-only; ``hostname:pid`` of the leader)."""
        db = sqlite3.connect(f"file:{self.tmp}/state/vmctld.db?mode=ro", uri=True, timeout=5)
        try:
            row = db.execute("SELECT holder FROM lease WHERE id = 1").fetchone()
        finally:
            db.close()
        return None if row is None else row[0]

    def wait_leader(self, limit: float = 30) -> bool:
        """Wait until the running daemon holds the lease (it polls for it every ttl/3 after a kill)."""
        assert self.proc is not None
        me = f":{self.proc.pid}"
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            with contextlib.suppress(sqlite3.Error):
                if (self.lease_holder() or "").endswith(me):
                    return True
            time.sleep(0.005)
        return False

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

    def __init__(self, ep: AgentEndpoint, liveness: Liveness | None = None) -> None:
        super().__init__(ep, liveness)
        self.errors: list[str] = []

    def report(self, observed: NodeObserved) -> None:
        for e in observed.errors:
            if e not in self.errors:
                self.errors.append(e)
        super().report(observed)


class Agent:
    """An agent wired as ``vmctl-agent`` serves: long-poll, reports, heartbeats and self-fencing
    (``url``: reach vmctld there instead, e.g. through a proxy that can cut the agent off)."""

    def __init__(self, name: str, cores: int, d: Vmctld, fabric: MockFabric, peers: dict[str, str],
                 clock: Clock | None = None, url: str | None = None, resync_seconds: float = 0.2,
                 migration_seconds: float = 0.5) -> None:
        s, doc = d.call("POST", "/v1/certs", {"node": name})
        assert s == 201
        cdir = d.tmp / "agents"
        cdir.mkdir(exist_ok=True)
        for key in ("cert_pem", "key_pem", "ca_pem"):
            (cdir / f"{name}.{key}").write_text(doc[key])
        ep = AgentEndpoint(url or f"https://127.0.0.1:{d.port}", name, str(cdir / f"{name}.cert_pem"),
                           str(cdir / f"{name}.key_pem"), str(cdir / f"{name}.ca_pem"), timeout_s=5)
        self.backend = MockBackend(hostname=name, cores=cores, clock=clock or SystemClock(), fabric=fabric,
                                   uri=f"mock://{name}", migration_seconds=migration_seconds)
        self.source = HttpSource(ep, wait_s=2)
        self.source.register(cores=cores, hostname=name, backend="mock")
        self.liveness = Liveness()
        self.reporter = _RecordingReporter(ep, self.liveness)
        self.rec = Reconciler(self.backend, Layout(host=name, cores=tuple(range(cores))), self.source, self.reporter,
                              clock=self.backend.clock, runner=MockProcessRunner(self.backend), peers=peers,
                              migrate_uris=peers, resync_seconds=resync_seconds, fence=self.liveness.fenced)
        self.rec.backoff.maximum = 0.5

        def fence() -> None:
            self.rec.fence_vms()
            self.rec.wake()

        self.heartbeat = Heartbeat(ep, self.liveness, on_fence=fence, on_contact=self.rec.wake)
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.rec.run, args=(self.stop_ev,), daemon=True)

    def start(self) -> None:
        self.source.start(on_change=self.rec.wake)
        self.heartbeat.beat()
        self.heartbeat.start()
        self.thread.start()

    def _diagnose(self) -> dict[str, Any]:
        desired = self.source.fetch()
        return {"errors": self.reporter.errors[-5:], "applied_gen": self.rec._generation_applied,
                "vms": [(v.name, v.power.value) for v in self.backend.list_vms() if v.name.startswith("j")],
                "generation": desired.generation if desired else None,
                "reported": [(v.name, v.power.value, v.migration_phase) for v in self.rec._last_vms
                             if v.name.startswith("j")]}

    def diagnose(self, limit: float = 15) -> dict[str, Any]:
        """What the agent knows, taken in a thread for at most ``limit`` s: a diagnosis that blocks (a
        hung backend, an unanswered fetch) says so, with where each of the agent's threads stands,
        instead of hanging the test."""
        out: dict[str, Any] = {}

        def take() -> None:
            try:
                out.update(self._diagnose())
            except Exception as exc:  # a diagnosis says what failed rather than failing the report
                out["error"] = repr(exc)

        t = threading.Thread(target=take, daemon=True)
        t.start()
        t.join(limit)
        if t.is_alive():
            frames = sys._current_frames()
            stacks = {th.name: "".join(traceback.format_stack(frames[th.ident]))[-1500:]
                      for th in threading.enumerate() if th.ident in frames}
            return {"node": self.backend.hostname, "diagnose": f"did not answer within {limit:g} s", "stacks": stacks}
        return {"node": self.backend.hostname, **out}

    def cpu_seconds(self) -> float:
        """The CPU time of the job VMs in the agent's last report (no lock: a copy of a tuple)."""
        return sum(v.cpu_time_s for v in self.rec._last_vms if v.name.startswith("j"))

    def stop(self) -> None:
        self.stop_ev.set()
        self.rec.wake()
        self.thread.join(10)
        self.heartbeat.stop()
        self.source.stop()
        self.reporter.close()


@contextmanager
def agent_cluster(d: Vmctld, names: list[str], cores: int,
                  clock: Any = None) -> Iterator[tuple[Vmctld, list[Agent]]]:
    """Start ``d`` and one HTTP agent per name on mock backends sharing one fabric (``clock()``: a
    fresh clock for each backend); stop all after."""
    d.start()
    fabric = MockFabric()
    peers = {n: f"mock://{n}" for n in names}
    agents = [Agent(n, cores, d, fabric, peers, clock=clock() if clock else None) for n in names]
    for a in agents:
        a.start()
    try:
        yield d, agents
    finally:
        for a in agents:
            a.stop()
        d.stop()


@contextmanager
def two_node_cluster(d: Vmctld, cores: int) -> Iterator[tuple[Vmctld, list[Agent]]]:
    """Start ``d`` and two HTTP agents (n1, n2) on mock backends sharing one fabric; stop all after."""
    with agent_cluster(d, ["n1", "n2"], cores) as c:
        yield c


#: model seconds per real second in the kill -9 test: a job of 4-15 model s runs 0.2-0.75 real s, so
#: jobs end while a killed daemon is down (its lease takes 1.5 s to expire), long past their estimate
#: + grace (20 + 5 model s) in the model of a daemon that acts before it has heard the agents
SPEED = 20.0
#: the final wait fails when no acknowledged job finished and no job VM received CPU time for this long
#: (real seconds): it measures progress, so a loaded machine only makes it slower
STALL_S = 120.0
CRASH_LOOP = ("{tick_s: 0.5, heartbeat_s: 0.5, node_timeout_s: 10, fence_s: 30, node_down_s: 60, "
              "estimate_grace_s: 5}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Vmctld, list[Agent]]]:
    epoch = time.time()
    # MEASY: jobs also run in bg across restarts and are promoted right after one (issue 23 item 3)
    d = Vmctld(tmp_path, loop=CRASH_LOOP, extra=f"clock: {{speed: {SPEED:g}, epoch: {epoch!r}}}\n", policy="measy")
    with agent_cluster(d, ["n1", "n2", "n3"], cores=4, clock=lambda: accelerated_clock(SPEED, epoch)) as c:
        yield c


def test_kill9_during_a_workload_loses_nothing_and_runs_nothing_twice(
        cluster: tuple[Vmctld, list[Agent]]) -> None:
    d, agents = cluster
    rng = random.Random(7)
    acked: list[str] = []

    def submit_some(n: int) -> None:
        assert d.wait_leader(120), "the restarted vmctld never took the lease"
        for _ in range(n):
            procs = rng.choice([1, 1, 2, 3, 4])
            # shorter than the estimate: none of these may end "killed: ran past its estimate"
            body = {"procs": procs, "estimate": 20, "work_seconds": rng.uniform(4, 15)}
            s, doc = d.try_call("POST", "/v1/jobs", body)
            if s == 201:
                acked.append(doc["job"]["id"])

    s, doc = d.call("POST", "/v1/jobs", {"name": "long", "procs": 1, "estimate": 1600, "work_seconds": 700})
    assert s == 201
    long_id = doc["job"]["id"]
    acked.append(long_id)
    submit_some(4)
    migrated: str | None = None
    at_lease = 0
    for cycle in range(24):
        submit_some(4)
        time.sleep(rng.uniform(0.15, 0.5))  # some of them run now and end while no daemon runs
        if cycle == 1 and migrated is None:
            # open a migration and kill the daemon right after it was accepted. The target node may
            # be full for a while (4 cores, jobs of up to 4 processes): keep trying while the long job
            # runs, and say what the daemon answered if it never worked
            tried: list[tuple[int, object]] = []
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                s, doc = d.try_call("GET", f"/v1/jobs/{long_id}")
                if s == 200 and doc["job"]["state"] == "running":
                    src = doc["job"]["placement"][0]["node"]
                    for to in sorted({"n1", "n2", "n3"} - {src}):
                        s2, doc2 = d.try_call("POST", f"/v1/jobs/{long_id}/migrate", {"to_node": to})
                        if s2 == 202:
                            migrated = long_id
                            break
                        tried.append((s2, doc2))
                    if migrated:
                        break
                else:
                    tried.append((s, doc and doc.get("job", {}).get("state")))
                time.sleep(0.1)
            assert migrated is not None, f"could not open a migration; last answers: {tried[-5:]}"
        d.kill9()
        d.start()
        if cycle % 3 == 0:
            # kill the restarted daemon the moment it has taken the lease: it loaded the state, the
            # agents have not reported to it yet
            assert d.wait_leader(120), "the restarted vmctld never took the lease"
            d.kill9()
            d.start()
            at_lease += 1
    # everything acknowledged finishes: waited for as long as jobs finish or their VMs get CPU time
    pending = set(acked)
    seen = (len(pending), -1.0)
    last_progress = time.monotonic()
    while pending and time.monotonic() - last_progress < STALL_S:
        s, doc = d.try_call("GET", "/v1/jobs?limit=100000")
        if s == 200:
            states = {j["id"]: j["state"] for j in doc["jobs"]}
            missing = [j for j in pending if j not in states]
            assert not missing, f"acknowledged jobs lost after kill -9: {missing}"
            pending = {j for j in pending if states[j] not in ("done", "failed", "killed", "cancelled")}
        now_seen = (len(pending), sum(a.cpu_seconds() for a in agents))
        if now_seen[0] < seen[0] or now_seen[1] > seen[1]:
            last_progress = time.monotonic()
        seen = now_seen
        time.sleep(0.3)
    assert not pending, (f"jobs made no progress for {STALL_S:g} s: {sorted(pending)}; "
                         f"agents: {[a.diagnose() for a in agents]}")
    s, doc = d.call("GET", "/v1/jobs?limit=100000")
    by_id = {j["id"]: j for j in doc["jobs"]}
    overran = {j: by_id[j]["reason"] for j in acked if "past its estimate" in (by_id[j]["reason"] or "")}
    assert not overran, f"jobs killed for running past their estimate (their work was shorter): {overran}"
    bad = {j: (by_id[j]["state"], by_id[j]["reason"]) for j in acked if by_id[j]["state"] != "done"}
    assert not bad, f"jobs that did not end done: {bad}"
    assert d.kills >= 30 and at_lease >= 8 and len(acked) >= 90, (d.kills, at_lease, len(acked))
    # the campaign covers issue 23's case: jobs that ran in bg (across kills) and were promoted to fg
    promoted = [j for j in acked if any(h["event"] == "tier" and (h["detail"] or "").startswith("bg -> fg")
                                        for h in by_id[j]["history"])]
    assert len(promoted) >= 10, f"only {len(promoted)} jobs ran in bg and were promoted: the test lost its point"
    (d.tmp / "campaign.json").write_text(json.dumps({  # what the campaign did (kept for post-mortems)
        "kills": d.kills, "at_lease": at_lease, "jobs": len(acked), "promoted_bg_to_fg": len(promoted)}))

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
    assert not (left := wait_job_vms_gone([a.backend for a in agents])), f"job VMs left on the hosts: {left}"
    # the agents never had to fence themselves (the daemon was never away for fence_s): nothing paused
    assert not [e for a in agents for e in a.backend.operations("suspend")]

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
