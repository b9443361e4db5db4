"""vcsched daemon mode end to end: a real ``vmctld`` process (loopback HTTPS, SQLite) with the
``vcsched-dynamic`` policy and two agents (the real reconciler on the mock backend, talking HTTP with
client certificates). Virtual-cluster requests (``cpu_need``, ``mem``) are submitted over the API;
the caps the agents applied (their backends' VM state) must equal the allocation; a workload change
(an arrival, then a departure) must re-cap the VMs that stay and, within the migration budget,
move a VM by a live migration that completes. The paper's examples run on one-core nodes (a host is
one unit of CPU there); issue 22's multi-core nodes (a node's capacity is its cores, needs and caps are
fractions of one core) on 4-core nodes at the end."""

from __future__ import annotations

import http.client
import json
import re
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon_crash import Agent, Vmctld, two_node_cluster
from vmctl.cli.main import main
from vmctl.nodedoc import PowerState

pytestmark = pytest.mark.slow


def _config(d: Vmctld, budget: float) -> None:
    tmp = d.tmp
    d.config.write_text(
        f"state_dir: {tmp}/state\n"
        f"store: {{url: 'sqlite:///{tmp}/state/vmctld.db'}}\n"
        f"api: {{listen: 127.0.0.1, port: {d.port}, bootstrap_token_file: {tmp}/state/admin.token}}\n"
        f"policy: {{kind: vcsched, name: vcsched-dynamic, params: {{migration_budget: {budget}}}}}\n"
        "loop: {tick_s: 0.3, node_timeout_s: 60}\n"
        "log_level: warning\n"
    )


@pytest.fixture
def vcluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Vmctld, list[Agent]]]:
    d = Vmctld(tmp_path)
    _config(d, budget=float(getattr(request, "param", 0.5)))
    with two_node_cluster(d, cores=1) as c:
        yield c


@pytest.fixture
def four_core(tmp_path: Path) -> Iterator[tuple[Vmctld, list[Agent]]]:
    d = Vmctld(tmp_path)
    _config(d, budget=0.5)
    with two_node_cluster(d, cores=4) as c:
        yield c


def _wait(what: str, cond: Callable[[], Any], timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _decisions(d: Vmctld) -> float:
    """How many decisions the daemon made so far (``vmctl_scheduler_cycles_total`` on /metrics)."""
    ctx = ssl.create_default_context(cafile=str(d.tmp / "state" / "ca.pem"))
    conn = http.client.HTTPSConnection("127.0.0.1", d.port, context=ctx, timeout=20)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {d.token}"})
        resp = conn.getresponse()
        text = resp.read().decode()
    finally:
        conn.close()
    assert resp.status == 200, text
    m = re.search(r"^vmctl_scheduler_cycles_total (\S+)$", text, re.MULTILINE)
    assert m, "no vmctl_scheduler_cycles_total in /metrics"
    return float(m.group(1))


def _more_decisions(d: Vmctld, n: int) -> None:
    """Wait until the daemon has decided ``n`` more times (it decides at least every tick, 0.3 s): a
    change it was going to make is made by then, however slow the machine."""
    start = _decisions(d)
    _wait(f"{n} more decisions", lambda: _decisions(d) >= start + n)


def _applied(agents: list[Agent]) -> dict[str, tuple[str, float | None]]:
    """VM name -> (node, cap) of the running job VMs, as the agents' backends hold them."""
    out: dict[str, tuple[str, float | None]] = {}
    for a in agents:
        for v in a.backend.list_vms():
            if v.name.startswith("j") and v.power is PowerState.RUNNING:
                out[v.name] = (a.backend.hostname, v.cap)
    return out


def _job(d: Vmctld, jid: str) -> dict[str, Any]:
    s, doc = d.call("GET", f"/v1/jobs/{jid}")
    assert s == 200, doc
    return dict(doc["job"])


def _caps_match(d: Vmctld, agents: list[Agent], want: dict[str, float]) -> bool:
    """Every job's VMs run with the expected cap on the node the daemon placed them on."""
    applied = _applied(agents)
    for jid, cap in want.items():
        job = _job(d, jid)
        if job["state"] != "running" or job["cap"] is None or abs(job["cap"] - cap) > 1e-6:
            return False
        for i, p in enumerate(job["placement"]):
            got = [(n, c) for name, (n, c) in applied.items()
                   if name.startswith(f"j{jid}-") and name.endswith(f"-p{i}")]
            if len(got) != 1 or got[0][0] != p["node"] or got[0][1] is None or abs(got[0][1] - cap) > 1e-6:
                return False
    return True


def _three_clusters(d: Vmctld, agents: list[Agent], capsys: pytest.CaptureFixture[str]) -> dict[str, float]:
    """Submits a, b (then c after a, b run) needing 0.6 CPU each; returns job id -> cap once placed."""
    _wait("two ready nodes", lambda: len([n for n in d.call("GET", "/v1/nodes")[1]["nodes"]
                                          if n["state"] == "ready"]) == 2)
    # validation names the field
    s, doc = d.call("POST", "/v1/jobs", {"procs": 1, "estimate": 60, "cpu_need": 1.5})
    assert s == 422 and doc["error"]["field"] == "cpu_need", doc
    s, doc = d.call("POST", "/v1/jobs", {"procs": 1, "estimate": 60, "mem": -0.1})
    assert s == 422 and doc["error"]["field"] == "mem", doc

    # two 1-VM virtual clusters needing 0.6 CPU each: one per host at full need (yield 1)
    ids = []
    for name in ("a", "b"):
        s, doc = d.call("POST", "/v1/jobs", {"name": name, "procs": 1, "estimate": 600, "work_seconds": 600,
                                             "cpu_need": 0.6, "mem": 0.3})
        assert s == 201, doc
        assert doc["job"]["cpu_need"] == 0.6 and doc["job"]["mem"] == 0.3
        ids.append(doc["job"]["id"])
    a, b = ids
    _wait("caps 0.6 applied", lambda: _caps_match(d, agents, {a: 0.6, b: 0.6}))
    nodes = {jid: _job(d, jid)["placement"][0]["node"] for jid in ids}
    assert nodes[a] != nodes[b]

    # arrival: a third 0.6 cluster -> two share one host at 0.5 each, one keeps 0.6 (yield 0.833);
    # the VMs that stay are re-capped live (no restart: same VM, same node)
    # (submitted with the CLI: vmctl job submit --cpu-need --mem)
    try:
        main(["job", "submit", "--url", f"https://127.0.0.1:{d.port}", "--token", d.token, "--ca",
              str(d.tmp / "state" / "ca.pem"), "--name", "c", "-n", "1", "-t", "600", "--work-seconds", "600",
              "--cpu-need", "0.6", "--mem", "0.3", "-o", "json"])
    except SystemExit as exc:
        assert not exc.code, exc
    out = json.loads(capsys.readouterr().out)
    c = out["jobs"][0]["id"]
    assert out["jobs"][0]["cpu_need"] == 0.6 and out["jobs"][0]["mem"] == 0.3

    def three_placed() -> dict[str, float] | None:
        # one listing = one snapshot of the daemon's state; three GETs could straddle the decision
        # that starts c and re-caps a sharer (a, b read before it, c after: caps 0.6, 0.6, 0.5)
        s, doc = d.call("GET", "/v1/jobs")
        assert s == 200, doc
        jobs = {j["id"]: j for j in doc["jobs"] if j["id"] in (a, b, c)}
        if any(j["state"] != "running" or j["cap"] is None for j in jobs.values()):
            return None
        return {jid: float(j["cap"]) for jid, j in jobs.items()}

    caps: dict[str, float] = _wait("c placed", three_placed)
    assert sorted(caps.values()) == pytest.approx([0.5, 0.5, 0.6])
    _wait("arrival caps applied", lambda: _caps_match(d, agents, caps))
    assert {_job(d, jid)["placement"][0]["node"] for jid in (a, b)} == set(nodes.values())  # a, b did not move
    assert all(_job(d, jid)["migrations"] == 0 for jid in (a, b, c))
    vms = {v["job_id"]: v for v in d.call("GET", "/v1/vms")[1]["vms"] if v["job_id"]}
    assert {jid: vms[jid]["cap"] for jid in caps} == pytest.approx(caps)
    assert all(vms[jid]["role"] == "shared" and vms[jid]["core"] == -1 for jid in caps)
    return caps


def test_virtual_clusters_are_capped_and_repacked_on_workload_change(
        vcluster: tuple[Vmctld, list[Agent]], capsys: pytest.CaptureFixture[str]) -> None:
    d, agents = vcluster
    caps = _three_clusters(d, agents, capsys)

    # departure: the cluster that had a host to itself leaves; the two sharing a host get re-packed,
    # one migrates to the freed host (memory 0.3 <= budget 0.5) and both get their full need
    alone = next(jid for jid, cap in caps.items() if cap == pytest.approx(0.6))
    sharing = [jid for jid in caps if jid != alone]
    s, doc = d.call("DELETE", f"/v1/jobs/{alone}")
    assert s in (200, 202), doc
    _wait("re-packed at full need", lambda: _caps_match(d, agents, {jid: 0.6 for jid in sharing}))
    moved = [_job(d, jid) for jid in sharing]
    assert sum(j["migrations"] for j in moved) == 1, moved
    assert {j["placement"][0]["node"] for j in moved} == {"n1", "n2"}
    assert len(_applied(agents)) == 2  # the cancelled VM is gone, each remaining VM runs exactly once
    # shared VMs are not tied to a core, before and after the move
    assert all(v.pinned_cores is None for a in agents for v in a.backend.list_vms() if v.name.startswith("j"))
    _more_decisions(d, 3)  # the allocation is stable (no migration back and forth)
    assert sum(_job(d, jid)["migrations"] for jid in sharing) == 1
    assert _caps_match(d, agents, {jid: 0.6 for jid in sharing})


@pytest.mark.parametrize("vcluster", [0.0], indirect=True)
def test_zero_migration_budget_keeps_vms_in_place(vcluster: tuple[Vmctld, list[Agent]],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Budget 0: after the departure nothing may move, so the two VMs sharing a host keep 0.5 each."""
    d, agents = vcluster
    caps = _three_clusters(d, agents, capsys)
    alone = next(jid for jid, cap in caps.items() if cap == pytest.approx(0.6))
    sharing = [jid for jid in caps if jid != alone]
    where = {jid: _job(d, jid)["placement"][0]["node"] for jid in sharing}
    s, doc = d.call("DELETE", f"/v1/jobs/{alone}")
    assert s in (200, 202), doc
    _wait("departure", lambda: _job(d, alone)["state"] == "cancelled" and len(_applied(agents)) == 2)
    _more_decisions(d, 5)  # a migration (and the re-cap to 0.6 that comes with it) would have been decided by now
    assert _caps_match(d, agents, {jid: 0.5 for jid in sharing})
    assert {jid: _job(d, jid)["placement"][0]["node"] for jid in sharing} == where
    assert all(_job(d, jid)["migrations"] == 0 for jid in sharing)


def _cli(d: Vmctld, capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    try:
        main([*args, "--url", f"https://127.0.0.1:{d.port}", "--token", d.token, "--ca",
              str(d.tmp / "state" / "ca.pem"), "-o", "json"])
    except SystemExit as exc:
        assert not exc.code, exc
    return json.loads(capsys.readouterr().out)


def test_multicore_nodes_cap_each_vm_at_its_need(four_core: tuple[Vmctld, list[Agent]],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """issue 22: on 4-core nodes, ``vmctl policy set vcsched-mcb8`` and a job of 4 VMs with ``--cpu-need
    0.4`` get caps of 0.4 (yield 1; a one-core reading gave 0.25 each, caps summing to 1.0 per node).
    The agents apply them (the mock backends' caps), the VMs' processes (each using 0.4 of a core) run at
    full pace on the mock hosts. Then 6 VMs needing a whole core
    arrive: 7.6 cores of need on 8, every VM still at its need, no cap above one core and no node's caps
    above its 4 cores (on the agents' backends); the agents report no error."""
    d, agents = four_core
    _wait("two ready nodes", lambda: len([n for n in d.call("GET", "/v1/nodes")[1]["nodes"]
                                          if n["state"] == "ready" and n["cores"] == 4]) == 2)
    assert _cli(d, capsys, "policy", "set", "vcsched-mcb8")["name"] == "vcsched-mcb8"
    out = _cli(d, capsys, "job", "submit", "--name", "vc", "-n", "4", "-t", "600", "--work-seconds", "600",
               "--cpu-need", "0.4")
    vc = str(out["jobs"][0]["id"])
    _wait("caps 0.4 applied", lambda: _caps_match(d, agents, {vc: 0.4}))
    assert _job(d, vc)["cap"] == pytest.approx(0.4)

    # the mock hosts run each VM's process at full pace: it demands its need (0.4 of a core), the cap
    # lets it have all of it, so its work grows as fast as the host's clock
    vms = [(a.backend, v.name) for a in agents for v in a.backend.list_vms() if v.name.startswith(f"j{vc}-")]
    assert len(vms) == 4
    for backend, name in vms:
        assert backend.utilization(name) == pytest.approx(0.4)
    before = [(b.process_status(n), b.clock.now()) for b, n in vms]
    _more_decisions(d, 2)
    after = [(b.process_status(n), b.clock.now()) for b, n in vms]
    for (p0, t0), (p1, t1) in zip(before, after, strict=True):
        assert p0 is not None and p1 is not None and p1.running
        assert (p1.work_done - p0.work_done) / (t1 - t0) == pytest.approx(1.0, abs=0.05)

    # 6 VMs needing a whole core each: 6 + 1.6 = 7.6 cores of need on 8 cores, so everyone runs at its need
    out = _cli(d, capsys, "job", "submit", "--name", "big", "-n", "6", "-t", "600", "--work-seconds", "600",
               "--cpu-need", "1.0")
    big = str(out["jobs"][0]["id"])
    _wait("both clusters at their need", lambda: _caps_match(d, agents, {vc: 0.4, big: 1.0}), timeout=90)
    for a in agents:
        caps = [v.cap for v in a.backend.list_vms() if v.name.startswith("j") and v.power is PowerState.RUNNING]
        assert all(c is not None and 0 < c <= 1.0 for c in caps), caps
        assert sum(c for c in caps if c is not None) <= 4.0 + 1e-6, (a.backend.hostname, caps)
    nodes = d.call("GET", "/v1/nodes")[1]["nodes"]
    assert all(not n.get("errors") for n in nodes), nodes
