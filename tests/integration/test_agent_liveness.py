"""Node liveness with real vmctld processes (issue 9, "Work lost" 2): heartbeats separate from the full
relist, lost (unschedulable, jobs kept) vs down (jobs requeued), and the agents' self-fencing.

- A real ``vmctl-agent`` process, stopped with SIGSTOP for half the node timeout under the shipped
  defaults (heartbeat 5 s, node timeout 30 s, resync 30 s): no job restarts, the node is never lost.
- An in-process agent cut off from vmctld (a loopback proxy that stops forwarding) past the node
  timeout and back before the down timeout: the node was lost meanwhile and keeps its job (run 1).
- The same past the down timeout: the agent paused its job VM (fence) before the daemon requeued the
  job and the new run started on the other node; when it is back, the old run's VM is removed."""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_daemon_crash import Agent, Vmctld
from vmctl.agents.backends.mock import MockFabric
from vmctl.nodedoc import PowerState

pytestmark = pytest.mark.slow


def wait_for(cond: Callable[[], bool], limit: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {limit} s waiting for {what}"
        time.sleep(step)


def node_states(d: Vmctld) -> dict[str, str]:
    s, doc = d.try_call("GET", "/v1/nodes")
    return {n["name"]: n["state"] for n in doc["nodes"]} if s == 200 else {}


def job(d: Vmctld, jid: str) -> dict[str, Any]:
    """The job as the API shows it, plus ``run``: the run number in its VMs' names (j<id>-r<run>-p<i>)."""
    s, doc = d.try_call("GET", f"/v1/jobs/{jid}")
    if s != 200:
        return {}
    out = dict(doc["job"])
    s, vms = d.try_call("GET", "/v1/vms")
    runs = {int(m.group(1)) for v in (vms["vms"] if s == 200 else [])
            if (m := re.match(rf"^j{re.escape(jid)}-r(\d+)-p\d+$", v["name"]))}
    out["run"] = max(runs) if runs else None
    return out


# ---------------------------------------------------------------------------- SIGSTOP a real agent


class AgentProcess:
    """``python -m vmctl.agents.main`` for one node (mock backend), as a service would run it."""

    def __init__(self, d: Vmctld, name: str, cores: int) -> None:
        s, doc = d.call("POST", "/v1/certs", {"node": name})
        assert s == 201
        base = d.tmp / f"agent-{name}"
        base.mkdir()
        files = {}
        for key in ("cert_pem", "key_pem", "ca_pem"):
            (base / key).write_text(doc[key])
            files[key] = str(base / key)
        cfg = {"node": name, "log_level": "info", "backend": {"kind": "mock", "cores": cores},
               "daemon": {"url": f"https://127.0.0.1:{d.port}", "cert_file": files["cert_pem"],
                          "key_file": files["key_pem"], "ca_file": files["ca_pem"]}}
        (base / "agent.yaml").write_text(yaml.safe_dump(cfg))
        self.log_path = base / "agent.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "vmctl.agents.main", "--config",
                                          str(base / "agent.yaml")], stdout=subprocess.DEVNULL, stderr=log)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def test_an_agent_paused_for_half_the_node_timeout_restarts_nothing(tmp_path: Path) -> None:
    # the shipped liveness defaults (heartbeat 5 s, node timeout 30 s, the agent's resync 30 s); a short
    # tick only so that a lost node would be noticed within the pause
    d = Vmctld(tmp_path, loop="{tick_s: 0.5}")
    d.start()
    agents: list[AgentProcess] = []
    try:
        agents = [AgentProcess(d, n, 2) for n in ("n1", "n2")]
        wait_for(lambda: node_states(d) == {"n1": "ready", "n2": "ready"}, 60, "both agents registered")
        s, doc = d.call("POST", "/v1/jobs", {"name": "long", "procs": 2, "estimate": 100000, "work_seconds": 100000})
        assert s == 201
        jid = doc["job"]["id"]
        wait_for(lambda: job(d, jid).get("state") == "running", 30, "the job running")
        started = time.monotonic()
        node = job(d, jid)["placement"][0]["node"]
        victim = next(a for a, n in zip(agents, ("n1", "n2"), strict=True) if n == node)
        # the agent's last full report was at the start of the job; its next one is due 30 s later. Pause
        # it when that report is 17 s old: a daemon that only counts full reports would lose the node
        # 13 s into the pause
        time.sleep(max(0.0, started + 17 - time.monotonic()))
        seen: set[str] = set()
        os.kill(victim.proc.pid, signal.SIGSTOP)
        try:
            pause_end = time.monotonic() + 15  # half of loop.node_timeout_s
            while time.monotonic() < pause_end:
                seen.add(node_states(d).get(node, "?"))
                time.sleep(0.5)
        finally:
            os.kill(victim.proc.pid, signal.SIGCONT)
        # the agent's next heartbeat after the pause
        s, doc = d.call("GET", "/v1/nodes")
        before = next(n["last_seen"] for n in doc["nodes"] if n["name"] == node)
        wait_for(lambda: next(n["last_seen"] for n in d.call("GET", "/v1/nodes")[1]["nodes"]
                              if n["name"] == node) > before, 20, "a heartbeat after the pause", step=0.2)
        seen.add(node_states(d)[node])
        j = job(d, jid)
        assert seen == {"ready"}, f"node {node} was {seen - {'ready'}} during a 15 s pause of its agent"
        assert j["state"] == "running" and j["run"] == 1, f"the job restarted: {j['state']} run {j['run']}"
        assert "requeued" not in (j["reason"] or "")
    finally:
        for a in agents:
            a.stop()
        d.stop()


# ---------------------------------------------------------------------------- cut an agent off


class CuttableProxy:
    """A loopback TCP proxy in front of vmctld for one agent. ``cut()`` drops the open connections and
    then accepts new ones without ever forwarding a byte (a network partition: requests hang until the
    agent's timeouts); ``heal()`` forwards again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.cut_off = threading.Event()
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._open.extend(socks)

    def _drop_all(self) -> None:
        with self._lock:
            socks, self._open = self._open, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if self.cut_off.is_set():
                self._track(client)  # held open, never answered
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            self._track(client, upstream)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                ready, _, _ = select.select([src], [], [], 0.5)
                if self.closed.is_set():
                    return
                if not ready:
                    continue
                data = src.recv(65536)
                if not data or self.cut_off.is_set():
                    return
                dst.sendall(data)
        except (OSError, ValueError):  # ValueError: cut()/heal() closed src under select() (fd -1)
            return
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.cut_off.set()
        self._drop_all()

    def heal(self) -> None:
        self.cut_off.clear()
        self._drop_all()  # the held connections fail now; the agent reconnects

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        self._drop_all()


#: short liveness periods (real seconds): node timeout 6 heartbeats, fence after 4 s without contact,
#: down (jobs requeued) after 8 s >= fence + 2 heartbeats
LIVENESS = "{tick_s: 0.2, heartbeat_s: 0.25, node_timeout_s: 1.5, fence_s: 4, node_down_s: 8}"


@contextlib.contextmanager
def proxied_cluster(tmp: Path) -> Iterator[tuple[Vmctld, dict[str, Agent], dict[str, CuttableProxy]]]:
    d = Vmctld(tmp, loop=LIVENESS)
    d.start()
    proxies = {n: CuttableProxy(d.port) for n in ("n1", "n2")}
    fabric = MockFabric()
    peers = {n: f"mock://{n}" for n in proxies}
    agents: dict[str, Agent] = {}
    try:
        for n, p in proxies.items():
            agents[n] = Agent(n, 2, d, fabric, peers, url=p.url, resync_seconds=2.0)
            agents[n].start()
        wait_for(lambda: node_states(d) == {"n1": "ready", "n2": "ready"}, 30, "both agents registered")
        yield d, agents, proxies
    finally:
        for p in proxies.values():
            p.heal()
        for a in agents.values():
            a.stop()
        for p in proxies.values():
            p.close()
        d.stop()


def _start_job(d: Vmctld, work: float) -> tuple[str, str]:
    s, doc = d.call("POST", "/v1/jobs", {"procs": 2, "estimate": 1000, "work_seconds": work})
    assert s == 201
    jid = str(doc["job"]["id"])
    wait_for(lambda: job(d, jid).get("state") == "running", 30, "the job running")
    return jid, str(job(d, jid)["placement"][0]["node"])


def _vm_power(a: Agent, name: str) -> PowerState | None:
    return next((v.power for v in a.backend.list_vms() if v.name == name), None)


def test_a_node_away_past_the_node_timeout_keeps_its_jobs(tmp_path: Path) -> None:
    with proxied_cluster(tmp_path) as (d, agents, proxies):
        jid, node = _start_job(d, 1000)
        vm = f"j{jid}-r1-p0"
        wait_for(lambda: _vm_power(agents[node], vm) is PowerState.RUNNING, 10, "the job's VM running")
        proxies[node].cut()
        wait_for(lambda: node_states(d).get(node) == "lost", 20, f"{node} lost")
        other = "n2" if node == "n1" else "n1"
        s, doc = d.call("POST", "/v1/jobs", {"procs": 1, "estimate": 1000, "work_seconds": 1000})
        assert s == 201
        wait_for(lambda: job(d, doc["job"]["id"]).get("state") == "running", 10, "a new job running")
        assert job(d, doc["job"]["id"])["placement"][0]["node"] == other, "a lost node got new work"
        j = job(d, jid)
        assert (j["state"], j["run"]) == ("running", 1), "a lost node's job was requeued"
        proxies[node].heal()
        wait_for(lambda: node_states(d).get(node) == "ready", 20, f"{node} back")
        j = job(d, jid)
        assert (j["state"], j["run"]) == ("running", 1)
        # its guest never stopped: the same VM (run 1) runs, its process started once
        wait_for(lambda: _vm_power(agents[node], vm) is PowerState.RUNNING, 10, "the job's VM running")
        assert [e.vm for e in agents[node].backend.operations("start_process")].count(vm) == 1
        assert not [e for e in agents[node].backend.operations("stop", "undefine") if e.vm.startswith(f"j{jid}-")]


def test_a_cut_off_agent_pauses_its_job_before_the_daemon_requeues_it(tmp_path: Path) -> None:
    with proxied_cluster(tmp_path) as (d, agents, proxies):
        jid, node = _start_job(d, 8)
        other = "n2" if node == "n1" else "n1"
        old_vm = f"j{jid}-r1-p0"
        wait_for(lambda: _vm_power(agents[node], old_vm) is PowerState.RUNNING, 10, "the job's VM running")
        proxies[node].cut()
        # the daemon keeps the job (lost) until node_down_s, then requeues it: run 2 on the other node
        wait_for(lambda: job(d, jid).get("run") == 2 and job(d, jid).get("state") == "running", 30,
                 "the job requeued and restarted elsewhere")
        assert node_states(d)[node] == "down"
        wait_for(lambda: bool([e for e in agents[other].backend.operations("start_process")
                               if e.vm.startswith(f"j{jid}-r2-")]), 10, "run 2 started")
        new_starts = [e.time for e in agents[other].backend.operations("start_process")
                      if e.vm.startswith(f"j{jid}-r2-")]
        # fenced: every VM of run 1 was paused before run 2 started (both backends on the wall clock)
        paused = {e.vm: e.time for e in agents[node].backend.operations("suspend") if e.vm.startswith(f"j{jid}-r1-")}
        assert set(paused) == {f"j{jid}-r1-p0", f"j{jid}-r1-p1"}, agents[node].backend.operations()
        assert max(paused.values()) < min(new_starts), (paused, new_starts)
        for i in (0, 1):
            assert _vm_power(agents[node], f"j{jid}-r1-p{i}") is PowerState.PAUSED
        # back: the old run is removed (the new generation no longer lists it), never resumed
        proxies[node].heal()
        wait_for(lambda: node_states(d).get(node) == "ready", 20, f"{node} back")
        wait_for(lambda: not [v for v in agents[node].backend.list_vms() if v.name.startswith(f"j{jid}-r1-")], 20,
                 "the old run's VMs removed")
        assert not [e for e in agents[node].backend.operations("resume") if e.vm.startswith(f"j{jid}-r1-")]
        wait_for(lambda: job(d, jid).get("state") == "done", 30, "run 2 done")
