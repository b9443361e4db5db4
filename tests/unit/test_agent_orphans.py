"""Every VM on a host is accounted for (issue 22 item 1): a VM that arrives by migration names its new
host, so the agent there owns it; a VM no desired state wants is stopped and removed within one
reconcile, reported as an orphan, logged as an event naming its job and run; a queued job does not
start again while a host still has a VM of it. Backend and plan level here, then vmctld with in-process
agents on the mock backend (migrate, then the job ends / is cancelled / is requeued / vmctld restarts
mid-migration). The same over agent processes and on real libvirt: tests/integration/test_migration_orphans.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vmctl.agents.backends.base import MigrationState, MigrationStatus, VmInfo, VmSpec
from vmctl.agents.backends.mock import Fault, MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.layout import META_NODE, Layout
from vmctl.agents.plan import AbortMigration, Claim, Observed, RestoreVm, StartMigration, Stop, Undefine, plan
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.api.documents import node_json, vms_json
from vmctl.cli.render import node_table, vm_table
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig, MigrationLimits
from vmctl.daemon.core import Daemon
from vmctl.metrics import AgentMetrics
from vmctl.nodedoc import MigrationSpec, NodeDesired, NodeObserved, PowerState, ProcessSpec, VmDesired, VmRole
from vmctl.policies.registry import create_policy
from vmctl.store import open_store
from vmctl.wire import observed_from_json, observed_to_json

META_A = {"vmctl.managed": "1", "vmctl.node": "a", "vmctl.role": "fg", "vmctl.core": "0"}


def _up(b: MockBackend, name: str, meta: dict[str, str] | None = None) -> None:
    b.define(VmSpec(name=name, metadata=dict(META_A if meta is None else meta)))
    b.pin_vcpus(name, (0,))
    b.start(name)
    b.start_process(name, ProcessSpec(job_id="7", index=0, work_seconds=1e6, cpu_usage=1.0))


# ------------------------------------------------------------------------------ the mock backend


def test_mock_migration_rewrites_the_metadata_on_arrival_in_process_and_through_the_fabric_dir(tmp_path: Path) -> None:
    clock = VirtualClock(0.0)
    fab = MockFabric()
    a = MockBackend("a", clock=clock, fabric=fab, migration_seconds=1.0)
    b = MockBackend("b", clock=clock, fabric=fab)
    _up(a, "v")
    a.start_migration("v", b.uri, metadata={META_NODE: "b"})
    assert a.list_vms()[0].metadata[META_NODE] == "a"  # still on a, still a's
    clock.advance(1.5)
    (got,) = b.list_vms()
    assert got.name == "v" and got.metadata == {**META_A, META_NODE: "b"}
    # between processes: the offer carries the new name, the source keeps its own until the target claims it
    c = MockBackend("c", clock=clock, fabric_dir=tmp_path / "fab", migration_seconds=1.0)
    d = MockBackend("d", clock=clock, fabric_dir=tmp_path / "fab", state_file=tmp_path / "d.state")
    _up(c, "w")
    c.start_migration("w", d.uri, metadata={META_NODE: "d"})
    clock.advance(1.5)
    c.list_vms()  # hand-off
    offer = json.loads((tmp_path / "fab" / "mock_d" / "w.json").read_text())
    assert offer["spec"]["metadata"][META_NODE] == "d"
    assert c.list_vms()[0].metadata[META_NODE] == "a"
    assert d.list_vms()[0].metadata[META_NODE] == "d"
    # set_metadata merges, is journalled, and outlives the agent process (state file)
    d.set_metadata("w", {"vmctl.core": "3"})
    assert [e.operation for e in d.operations("set_metadata")] == ["set_metadata"]
    again = MockBackend("d", clock=clock, fabric_dir=tmp_path / "fab", state_file=tmp_path / "d.state")
    assert again.list_vms()[0].metadata == {**META_A, META_NODE: "d", "vmctl.core": "3"}


# ------------------------------------------------------------------------------ the plan

L = Layout("b", (0, 1))


def _info(name: str, power: PowerState = PowerState.RUNNING, node: str = "b") -> VmInfo:
    return VmInfo(name=name, power=power, pinned_cores=(0,), weight=10000, cap=None, cpu_time_s=0.0,
                  metadata={"vmctl.managed": "1", "vmctl.node": node})


def _want(name: str, **kw: Any) -> VmDesired:
    return VmDesired(name=name, core=0, role=VmRole.FG, weight=10000, **kw)


def test_plan_calls_back_an_unwanted_vm_that_is_leaving_and_removes_it_once_back() -> None:
    desired = L.complete(NodeDesired("b", 2, ()))
    running = MigrationStatus(state=MigrationState.RUNNING, data_total_bytes=1, data_remaining_bytes=1, elapsed_s=0.1)
    got = plan(desired, Observed.of([_info("j1-r1-p0", PowerState.MIGRATING)], migrations={"j1-r1-p0": running}), L)
    assert [a for a in got if a.vm == "j1-r1-p0"] == [AbortMigration("j1-r1-p0")]
    # handed off already (no running migration to call back): left alone until it is gone or back
    got = plan(desired, Observed.of([_info("j1-r1-p0", PowerState.MIGRATING)]), L)
    assert [a for a in got if a.vm == "j1-r1-p0"] == []
    got = plan(desired, Observed.of([_info("j1-r1-p0")]), L)
    assert [a for a in got if a.vm == "j1-r1-p0"] == [Stop("j1-r1-p0"), Undefine("j1-r1-p0")]
    # another node's VM on a shared hypervisor is never touched
    got = plan(desired, Observed.of([_info("j1-r1-p0", node="c")]), L)
    assert [a for a in got if a.vm == "j1-r1-p0"] == []


def test_plan_names_the_target_and_claims_what_desired_state_puts_here() -> None:
    m = MigrationSpec("m1", source_node="b", target_node="c", target_core=1, phase="requested")
    (act,) = [a for a in plan(NodeDesired("b", 1, (_want("j1-r1-p0", migration=m),)),
                              Observed.of([_info("j1-r1-p0")]), L, peers={"c": "mock://c"})
              if isinstance(a, StartMigration)]
    assert act.node == "c"
    # arrived with the source's name while the migration is still open: not claimed yet (vmctld confirms first)
    inbound = MigrationSpec("m1", source_node="a", target_node="b", target_core=1, phase="running")
    got = plan(NodeDesired("b", 1, (_want("j1-r1-p0", migration=inbound),)), Observed.of([_info("j1-r1-p0", node="a")]),
               L)
    assert not [a for a in got if isinstance(a, Claim)]
    # confirmed (no migration any more): claimed, with this node's metadata for the VM's core
    got = plan(NodeDesired("b", 2, (_want("j1-r1-p0"),)), Observed.of([_info("j1-r1-p0", node="a")]), L)
    (claim,) = [a for a in got if isinstance(a, Claim)]
    assert dict(claim.metadata) == {"vmctl.managed": "1", "vmctl.node": "b", "vmctl.role": "fg", "vmctl.core": "0"}
    assert not [a for a in plan(NodeDesired("b", 2, (_want("j1-r1-p0"),)), Observed.of([_info("j1-r1-p0")]), L)
                if isinstance(a, Claim)]
    # a checkpoint restored here is rewritten to this node at once
    ck = MigrationSpec("m2", source_node="a", target_node="b", target_core=1, phase="running", mode="checkpoint")
    got = plan(NodeDesired("b", 1, (_want("j1-r1-p0", migration=ck, checkpoint_path="/ck/x"),)),
               Observed(vms={}, files=frozenset({"/ck/x"})), L)
    (restore,) = [a for a in got if isinstance(a, RestoreVm)]
    assert dict(restore.metadata)[META_NODE] == "b" and dict(restore.metadata)["vmctl.core"] == "1"


def test_reconciler_reports_an_orphan_it_removed_and_the_metric_counts_what_is_left() -> None:
    clock = VirtualClock(0.0)
    be = MockBackend("b", cores=2, clock=clock)
    _up(be, "j9-r2-p0", {"vmctl.managed": "1", "vmctl.node": "b"})
    src, rep = MemorySource(NodeDesired("b", 1, ())), MemoryReporter()
    rec = Reconciler(be, L, src, rep, clock=clock, runner=MockProcessRunner(be))
    res = rec.run_once()
    assert res.observed is not None
    assert "j9-r2-p0" not in {v.name for v in be.list_vms()}
    (gone,) = [v for v in res.observed.vms if v.name == "j9-r2-p0"]
    assert gone.orphan and gone.power is PowerState.ABSENT
    # it travels (one codec: the agent's report file and --once output are vmctld's documents)
    assert observed_from_json(observed_to_json(res.observed)) == res.observed
    # one that cannot be removed stays reported (present) as an orphan, and the agent metric counts it
    _up(be, "j9-r3-p0", {"vmctl.managed": "1", "vmctl.node": "b"})
    be.faults.append(Fault("stop", "j9-r3-p0", None))
    res = rec.run_once()
    assert res.observed is not None
    (left,) = [v for v in res.observed.vms if v.name == "j9-r3-p0"]
    assert left.orphan and left.power is PowerState.RUNNING
    metrics = AgentMetrics(lambda: res.observed)
    body = metrics.exposition()[0].decode()
    assert 'vmctl_agent_orphan_vms{node="b"} 1.0' in body


# ------------------------------------------------------------------------------ vmctld with in-process agents


class Cluster:
    """vmctld + one in-process mock agent per node (a MockFabric between them), on one virtual clock."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.clock = VirtualClock(1000.0)
        self.config = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0,
                                   node_timeout_s=600.0, holder="orphans-test", checkpoint_dir=str(tmp / "ckpt"),
                                   migration=MigrationLimits(timeout_s=600.0))
        self.daemon = self._daemon()
        self.fabric = MockFabric()
        self.agents: dict[str, tuple[Reconciler, MemorySource, MemoryReporter, MockBackend]] = {}
        for name in ("node1", "node2"):
            be = MockBackend(hostname=name, cores=1, clock=self.clock, fabric=self.fabric, uri=f"mock://{name}",
                             migration_seconds=4.0)
            other = "node2" if name == "node1" else "node1"
            uris = {other: f"mock://{other}"}
            src, rep = MemorySource(None), MemoryReporter()
            rec = Reconciler(be, Layout(host=name, cores=(0,)), src, rep, clock=self.clock,
                             runner=MockProcessRunner(be), peers=uris, migrate_uris=uris)
            self.agents[name] = (rec, src, rep, be)
            self.daemon.register_node(name, 1, name, "mock", rec.peers, rec.checkpoint_peers)

    def _daemon(self) -> Daemon:
        d = Daemon(self.config, open_store(self.config.store_url), clock=self.clock, policy=create_policy("fcfs"))
        assert d.start()
        return d

    def restart_daemon(self) -> None:
        """A new vmctld on the same store, the old one never told (as after kill -9)."""
        self.daemon = self._daemon()

    def agent_cycle(self, name: str) -> NodeObserved:
        rec, src, rep, _be = self.agents[name]
        src.set(self.daemon.desired(name))
        rec.run_once()
        assert rep.last is not None
        obs = observed_from_json(observed_to_json(rep.last))
        self.daemon.report(obs)
        return obs

    def step(self, dt: float = 1.0) -> None:
        self.clock.advance(dt)
        self.daemon.run_once()
        for name in self.agents:
            self.agent_cycle(name)
        self.daemon.run_once()

    def run_until(self, cond: Any, what: str, limit: int = 300) -> None:
        for _ in range(limit):
            if cond():
                return
            self.step()
        raise AssertionError(f"{what}: not within {limit} steps")

    def job_vms(self, jid: str) -> dict[str, list[str]]:
        """The VMs of job ``jid`` (any run) defined on each host."""
        return {n: sorted(v.name for v in be.list_vms() if v.name.startswith(f"j{jid}-"))
                for n, (_r, _s, _p, be) in self.agents.items()}

    def running_job(self) -> tuple[str, str, str]:
        jid = self.daemon.submit([{"procs": 1, "estimate": 5000, "work_seconds": 100}])[0].id
        self.run_until(lambda: self.daemon.job(jid).state == "running", "the job to run")
        self.step()
        src = self.daemon.job(jid).placement[0][0]
        return jid, src, "node2" if src == "node1" else "node1"

    def close(self) -> None:
        self.daemon.store.close()


def _no_vm_left(c: Cluster, jid: str) -> None:
    """One reconcile of each agent on vmctld's current desired state: no VM of the job on either host."""
    c.daemon.run_once()
    for name in c.agents:
        c.agent_cycle(name)
    assert c.job_vms(jid) == {"node1": [], "node2": []}


def test_a_migrated_job_that_ends_leaves_no_vm_on_its_new_host(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    jid, _src, dst = c.running_job()
    c.daemon.migrate_job(jid, dst)
    c.run_until(lambda: not c.daemon.job(jid).migrating, "the migration to complete")
    assert c.daemon.job(jid).placement[0][0] == dst
    (vm,) = [v for v in c.agents[dst][3].list_vms() if v.name.startswith(f"j{jid}-")]
    assert vm.metadata[META_NODE] == dst  # it names its new host
    c.run_until(lambda: c.daemon.job(jid).state == "done", "the job to end")
    _no_vm_left(c, jid)
    c.close()


@pytest.mark.parametrize("when", ["moving", "arrived"])
@pytest.mark.parametrize("how", ["cancel", "requeue", "restart"])
def test_a_job_stopped_during_its_migration_leaves_no_vm_on_either_host(tmp_path: Path, how: str, when: str) -> None:
    """Cancelled, requeued (held, so it does not start again at once) or vmctld restarted mid-migration;
    ``when``: the agents' next cycle comes while the VM still moves (the source calls it back), or only
    after it arrived (the target removes it: it names the target)."""
    c = Cluster(tmp_path)
    jid, src, dst = c.running_job()
    c.daemon.migrate_job(jid, dst)
    c.run_until(lambda: any(v.power is PowerState.MIGRATING for v in c.agents[src][3].list_vms()),
                "the migration to start")
    run = c.daemon.job(jid).run
    if how == "cancel":
        c.daemon.cancel(jid)
    elif how == "requeue":
        c.daemon.requeue(jid, "test", hold=True)
    else:
        c.restart_daemon()
    c.clock.advance(0.5 if when == "moving" else 10.0)
    if how == "restart":  # the new vmctld carries the migration on; the job then ends while its VM is on the target
        c.run_until(lambda: not c.daemon.job(jid).migrating, "the migration to complete after the restart")
        c.daemon.cancel(jid)
    _no_vm_left(c, jid)
    # vmctld heard of it: an event naming the job and its run (the agent that removed it reported it)
    events = [e for e in c.daemon.store.list_events(limit=1000) if e.kind.startswith("vm.orphan")] \
        if hasattr(c.daemon.store, "list_events") else []
    if when == "arrived" and how != "restart":
        assert events and any(f"job {jid} run {run}" in e.message and e.job_id == jid for e in events), events
    if how == "requeue":  # released: it runs again, once, and ends; nothing of it is left anywhere
        c.daemon.release(jid)
        c.run_until(lambda: c.daemon.job(jid).state == "done", "the requeued job to end")
        assert c.daemon.job(jid).run == run + 1
        _no_vm_left(c, jid)
    c.close()


def test_vmctld_shows_and_counts_an_orphan_until_it_is_gone_and_holds_back_its_job(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    jid, src, _dst = c.running_job()
    be = c.agents[src][3]
    be.faults.append(Fault("stop", f"j{jid}-*", None))
    c.daemon.requeue(jid, "test")  # not held: it would start again at once if vmctld did not wait
    c.step()
    c.step()
    rows = [v for v in vms_json(c.daemon, None) if v["name"].startswith(f"j{jid}-")]
    assert [(r["node"], r["role"], r["orphan"], r["job_id"]) for r in rows] == [(src, "orphan", True, jid)]
    assert vm_table(rows).rows[0][3] == "orphan"
    n = node_json(c.daemon, c.daemon.node(src))
    wide = node_table([n], wide=True)
    assert n["orphans"] == 1 and wide.rows[0][wide.headers.index("ORPHANS")] == "1"
    assert node_table([n]).rows[0][-1].startswith("1 orphan VM")  # the default table: beside the errors
    assert c.daemon.job(jid).state == "queued", "a run must not start while the last one's VM runs"
    assert jid in c.daemon.state.lingering()
    be.faults.clear()
    c.step()
    assert not [v for v in vms_json(c.daemon, None) if v["name"].startswith(f"j{jid}-r1-")]
    assert node_json(c.daemon, c.daemon.node(src))["orphans"] == 0
    c.run_until(lambda: c.daemon.job(jid).state == "running", "the job to start again once its VM is gone")
    assert c.daemon.job(jid).run == 2
    c.close()


def test_libvirt_destination_xml_carries_the_new_node_and_nothing_else_changes() -> None:
    from vmctl.agents.backends.libvirt.xml import domain_xml, metadata_element, parse_domain_xml, with_metadata

    src = domain_xml(VmSpec(name="j1-r1-p0", memory_mib=64, metadata=dict(META_A)), "qemu")
    dest = with_metadata(src, {**META_A, META_NODE: "b"})
    before, after = parse_domain_xml(src), parse_domain_xml(dest)
    assert after.metadata == {**META_A, META_NODE: "b"}
    assert (after.name, after.domain_type, after.vcpus, after.memory_mib, after.cputune) == \
        (before.name, before.domain_type, before.vcpus, before.memory_mib, before.cputune)
    assert metadata_element({"vmctl.node": "b"}) == '<vm><entry key="vmctl.node">b</entry></vm>'
