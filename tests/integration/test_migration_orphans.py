"""No VM outlives its job, also across migrations (issue 22 item 1), with a real vmctld process (HTTPS on
loopback, killed with SIGKILL where the case says so) and in-process HTTP agents on mock hosts (their
journals are the hosts' process logs): migrate a job, then (a) it ends, (b) it is cancelled during the
migration, (c) it is requeued during the migration, (d) vmctld is killed -9 mid-migration; no VM of the
job is left on either host. Then a race: hold / release / requeue / cancel while migrations run (about
60 s): from the hosts' journals, two runs of one job never ran at the same time, and no VM of a job is
left at the end."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon_crash import Agent, Vmctld
from tests.support.hosts import job_vms_left, wait_job_vms_gone
from vmctl.agents.backends.mock import MockBackend, MockFabric
from vmctl.daemon.state import parse_vm_name

LOOP = "{tick_s: 0.2, heartbeat_s: 0.5, node_timeout_s: 10, fence_s: 30, node_down_s: 60, estimate_grace_s: 600}"
NODES = ("n1", "n2")


@contextmanager
def cluster(tmp: Path, cores: int, migration_seconds: float) -> Iterator[tuple[Vmctld, list[Agent]]]:
    d = Vmctld(tmp, loop=LOOP)
    d.start()
    fabric = MockFabric()
    peers = {n: f"mock://{n}" for n in NODES}
    agents = [Agent(n, cores, d, fabric, peers, migration_seconds=migration_seconds) for n in NODES]
    for a in agents:
        a.start()
    try:
        yield d, agents
    finally:
        for a in agents:
            a.stop()
        d.stop()


def _wait(what: str, cond: Any, limit: float = 60.0) -> Any:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _job(d: Vmctld, jid: str) -> dict[str, Any]:
    s, doc = d.try_call("GET", f"/v1/jobs/{jid}")
    return doc["job"] if s == 200 else {}


def _moving(agents: list[Agent], name: str) -> bool:
    return any(v.name == name and v.power.value == "migrating" for a in agents for v in a.backend.list_vms())


@pytest.mark.slow
@pytest.mark.parametrize("case", ["ends", "cancel", "requeue", "kill9"])
def test_no_vm_of_a_migrated_job_is_left_on_either_host(tmp_path: Path, case: str) -> None:
    with cluster(tmp_path, cores=1, migration_seconds=1.5) as (d, agents):
        backends = [a.backend for a in agents]
        work = 4.0 if case == "ends" else 600.0
        s, doc = d.call("POST", "/v1/jobs", {"name": case, "procs": 1, "estimate": 900,
                                             "tasks": [{"work_seconds": work, "cpu_usage": 1.0}]})
        assert s == 201, doc
        jid = doc["job"]["id"]
        job = _wait("the job to run", lambda: (j := _job(d, jid)).get("state") == "running" and j)
        src = job["placement"][0]["node"]
        dst = "n2" if src == "n1" else "n1"
        name = f"j{jid}-r1-p0"
        _wait("the process to start", lambda: any(v.name == name for v in backends[NODES.index(src)].list_vms()))
        s, doc = d.call("POST", f"/v1/jobs/{jid}/migrate", {"to_node": dst})
        assert s == 202, doc
        _wait("the VM to be moving", lambda: _moving(agents, name), 30)
        if case == "cancel":
            assert d.call("DELETE", f"/v1/jobs/{jid}")[0] == 200
        elif case == "requeue":
            s, doc = d.call("POST", f"/v1/jobs/{jid}/requeue", {"reason": "test", "hold": True})
            assert s == 200, doc
        elif case == "kill9":
            d.kill9()
            time.sleep(2.0)  # the migration completes while no vmctld runs
            d.start()
            assert d.wait_leader(), "the restarted vmctld never took the lease"
            _wait("the restarted vmctld to close the migration",
                  lambda: (j := _job(d, jid)).get("state") == "running" and not j.get("migrating"), 60)
            assert d.call("DELETE", f"/v1/jobs/{jid}")[0] == 200
        else:
            _wait("the job to end on its new host", lambda: _job(d, jid).get("state") == "done", 60)
        left = wait_job_vms_gone(backends, 20)
        assert not left, f"{case}: job VMs left on the hosts: {left}"
        # the process of the run ran on one host at a time, and nothing of it runs now
        assert not job_vms_left(backends)
        if case == "requeue":  # released, it runs again (once) and nothing of either run is left
            s, doc = d.call("DELETE", f"/v1/jobs/{jid}")
            assert s == 200, doc
        s, doc = d.call("GET", "/v1/vms")
        assert s == 200 and not [v for v in doc["vms"] if v["name"].startswith(f"j{jid}-")], doc


def _runs(backends: list[MockBackend]) -> dict[str, dict[int, list[tuple[float, float, str]]]]:
    """From the hosts' journals: job -> run -> intervals (start, end, host) in which a VM of that run had
    its process on a host (from ``start_process`` or ``migration_arrived`` until ``kill_process``,
    ``stop``, ``checkpoint``, ``undefine`` or ``migration_completed``; a process that exited on its own is
    counted until its VM went, which only widens an interval). An interval still open ends at +inf."""
    out: dict[str, dict[int, list[tuple[float, float, str]]]] = {}
    opens = ("start_process", "migration_arrived", "restore")
    closes = ("kill_process", "stop", "checkpoint", "undefine", "migration_completed")
    for b in backends:
        open_at: dict[str, float] = {}
        for e in b.journal:
            if not e.ok:
                continue
            parsed = parse_vm_name(e.vm)
            if parsed is None:
                continue
            if e.operation in opens and e.vm not in open_at:
                open_at[e.vm] = e.time
            elif e.operation in closes and e.vm in open_at:
                out.setdefault(parsed[0], {}).setdefault(parsed[1], []).append((open_at.pop(e.vm), e.time, b.uri))
        for vm, t in open_at.items():
            parsed = parse_vm_name(vm)
            assert parsed is not None
            out.setdefault(parsed[0], {}).setdefault(parsed[1], []).append((t, float("inf"), b.uri))
    return out


def overlapping_runs(backends: list[MockBackend]) -> list[str]:
    """Pairs of runs of one job whose processes ran at the same time (on any hosts)."""
    bad = []
    for jid, runs in _runs(backends).items():
        spans = {r: (min(s for s, _e, _h in iv), max(e for _s, e, _h in iv)) for r, iv in runs.items()}
        order = sorted(spans)
        for first, second in pairwise(order):
            if spans[first][1] > spans[second][0]:
                bad.append(f"job {jid}: run {first} {spans[first]} and run {second} {spans[second]}")
    return bad


#: seconds of operator actions racing migrations
RACE_S = float(__import__('os').environ.get('VMCTL_RACE_S', '60'))


@pytest.mark.slow
def test_operator_actions_racing_migrations_never_run_a_job_twice(tmp_path: Path) -> None:
    rng = random.Random(22)
    with cluster(tmp_path, cores=2, migration_seconds=0.8) as (d, agents):
        backends = [a.backend for a in agents]
        jobs: list[str] = []
        counts = {"migrate": 0, "hold": 0, "release": 0, "requeue": 0, "cancel": 0}
        # at least RACE_S, and on until enough migrations and requeues raced (progress, not a wall-time
        # window: a loaded machine gets fewer of them into RACE_S), within a generous bound
        end, hard_end = time.monotonic() + RACE_S, time.monotonic() + 10 * RACE_S

        def raced_enough() -> bool:
            return counts["migrate"] >= 12 and counts["requeue"] >= 6

        while time.monotonic() < end or (not raced_enough() and time.monotonic() < hard_end):
            if (len(jobs) < 40 or (not raced_enough() and len(jobs) < 160)) and rng.random() < 0.4:
                s, doc = d.try_call("POST", "/v1/jobs", {"procs": rng.choice([1, 1, 2]), "estimate": 900,
                                                         "work_seconds": rng.uniform(2, 8)})
                if s == 201:
                    jobs.append(doc["job"]["id"])
            s, doc = d.try_call("GET", "/v1/jobs?limit=1000")
            if s != 200:
                continue
            by_state: dict[str, list[dict[str, Any]]] = {}
            for j in doc["jobs"]:
                by_state.setdefault(j["state"], []).append(j)
            running = by_state.get("running", [])
            if running:
                j = rng.choice(running)
                here = {p["node"] for p in j["placement"]}
                if not j.get("migrating") and len(here) == 1:
                    to = "n2" if "n1" in here else "n1"
                    if d.try_call("POST", f"/v1/jobs/{j['id']}/migrate", {"to_node": to})[0] == 202:
                        counts["migrate"] += 1
                time.sleep(rng.uniform(0.05, 0.6))  # into the migration
                act = rng.choice(["requeue", "requeue", "cancel", "hold", "none"])
                if act == "requeue" and d.try_call("POST", f"/v1/jobs/{j['id']}/requeue", {"reason": "race"})[0] == 200:
                    counts["requeue"] += 1
                elif act == "cancel" and rng.random() < 0.3 and \
                        d.try_call("DELETE", f"/v1/jobs/{j['id']}")[0] == 200:
                    counts["cancel"] += 1
            queued = [j for j in by_state.get("queued", []) if not j.get("held")]
            if queued and rng.random() < 0.3:
                j = rng.choice(queued)
                if d.try_call("POST", f"/v1/jobs/{j['id']}/hold", {"reason": "race"})[0] == 200:
                    counts["hold"] += 1
            for j in [j for j in by_state.get("queued", []) if j.get("held")]:
                if rng.random() < 0.5 and d.try_call("POST", f"/v1/jobs/{j['id']}/release")[0] == 200:
                    counts["release"] += 1
            time.sleep(rng.uniform(0.0, 0.3))
        # let everything finish: release the held, wait for the rest to end
        for _ in range(3):
            s, doc = d.call("GET", "/v1/jobs?limit=1000")
            for j in doc["jobs"]:
                if j.get("held"):
                    d.try_call("POST", f"/v1/jobs/{j['id']}/release")
            time.sleep(0.5)
        final = ("done", "failed", "killed", "cancelled")
        def unfinished() -> list[tuple[Any, ...]]:
            return [(j["id"], j["state"], j.get("reason"), j.get("migrating"), j.get("run"))
                    for j in d.call("GET", "/v1/jobs?limit=1000")[1]["jobs"] if j["state"] not in final]

        deadline = time.monotonic() + 180
        while unfinished() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not unfinished(), (f"jobs that never ended: {unfinished()}; hosts: {job_vms_left(backends)}; "
                                  f"agents: {[a.diagnose() for a in agents]}")
        left = wait_job_vms_gone(backends, 30)
        twice = overlapping_runs(backends)
        print(f"race: {len(jobs)} jobs, actions {counts}, runs that overlapped {len(twice)}, "
              f"job VMs left {sum(len(v) for v in left.values())}")
        assert counts["migrate"] >= 10 and counts["requeue"] >= 5, counts
        assert not twice, f"two runs of one job ran at the same time: {twice}"
        assert not left, f"job VMs left on the hosts: {left}"
