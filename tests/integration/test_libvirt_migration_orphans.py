"""No VM outlives its job across a real libvirt migration (issue 22 item 1): vmctld (in this process, on
a virtual clock) and two agents, one on the system libvirtd and one on the second libvirtd the suite
starts for migration (tests/integration/libvirt_hosts.py), with TCG guests. Migrate a job from the
first to the second, then (a) the job ends, (b) it is cancelled during the migration, (c) it is
requeued during the migration, (d) vmctld is replaced mid-migration (a new one on the same store, the
old one never told, as after kill -9): within one reconcile of each agent no VM of the job is defined
on either host. The domain that arrives names its new node in its metadata (the destination XML of
the migration), and libvirt keeps it in the persistent definition too.

The job's processes are kept by a runner in this test (the spin guests run no SSH): what is tested is
where the VMs are, which the agents learn from libvirt alone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PREFIX
from tests.integration.libvirt_hosts import PeerHost
from tests.support.hosts import remove_vms
from vmctl.agents.backends.base import ProcessStatus
from vmctl.agents.layout import META_NODE, Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig, MigrationLimits
from vmctl.daemon.core import Daemon
from vmctl.nodedoc import PowerState, ProcessSpec
from vmctl.policies.registry import create_policy
from vmctl.store import open_store
from vmctl.wire import observed_from_json, observed_to_json

pytestmark = pytest.mark.libvirt

N1, N2 = f"{PREFIX}n1", f"{PREFIX}n2"


class Runner:
    """Job processes by VM name, shared by both agents (a process goes where its VM goes)."""

    def __init__(self) -> None:
        self.procs: dict[str, ProcessStatus] = {}

    def start(self, vm: str, spec: ProcessSpec) -> None:
        if vm not in self.procs or (self.procs[vm].job_id, self.procs[vm].index) != (spec.job_id, spec.index):
            self.procs[vm] = ProcessStatus(vm=vm, job_id=spec.job_id, index=spec.index, running=True)

    def status(self, vm: str) -> ProcessStatus | None:
        return self.procs.get(vm)

    def kill(self, vm: str) -> None:
        p = self.procs.get(vm)
        if p is not None and p.running:
            self.procs[vm] = ProcessStatus(vm=vm, job_id=p.job_id, index=p.index, running=False, exit_code=137)

    def finish(self, vm: str) -> None:
        p = self.procs[vm]
        self.procs[vm] = ProcessStatus(vm=vm, job_id=p.job_id, index=p.index, running=False, exit_code=0)


class Cluster:
    def __init__(self, tmp: Path, qemu: Any, peer_qemu: Any, peer: PeerHost, images: Path) -> None:
        self.clock = VirtualClock(1000.0)
        self.config = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0,
                                   node_timeout_s=3600.0, holder="libvirt-orphans", checkpoint_dir=str(tmp / "ck"),
                                   migration=MigrationLimits(timeout_s=3600.0))
        self.daemon = self._daemon()
        self.runner = Runner()
        self.backends = {N1: qemu, N2: peer_qemu}
        self.jobs: list[str] = []
        spin = str(images / "spin.img")
        self.agents: dict[str, tuple[Reconciler, MemorySource, MemoryReporter]] = {}
        for node, core, be, peers in ((N1, 0, qemu, {N2: peer.uri}),
                                      (N2, 1, peer_qemu, {N1: peer.system_uri_from_peer})):
            src, rep = MemorySource(None), MemoryReporter()
            rec = Reconciler(be, Layout(host=node, cores=(core,), memory_mib=32, image=spin), src, rep,
                             clock=self.clock, runner=self.runner, peers=peers,
                             migrate_uris={n: "tcp://127.0.0.1" for n in peers})
            self.agents[node] = (rec, src, rep)

    def _daemon(self) -> Daemon:
        d = Daemon(self.config, open_store(self.config.store_url), clock=self.clock, policy=create_policy("fcfs"))
        assert d.start()
        return d

    def register(self, node: str) -> None:
        rec = self.agents[node][0]
        self.daemon.register_node(node, 1, node, "libvirt", rec.peers, rec.checkpoint_peers)

    def cycle(self, node: str) -> None:
        rec, src, rep = self.agents[node]
        src.set(self.daemon.desired(node))
        rec.run_once()
        assert rep.last is not None
        self.daemon.report(observed_from_json(observed_to_json(rep.last)))

    def step(self) -> None:
        self.clock.advance(1.0)
        self.daemon.run_once()
        for node in self.agents:
            if node in self.daemon.state.nodes:
                self.cycle(node)
        self.daemon.run_once()

    def until(self, cond: Any, what: str, limit: float = 120.0) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if cond():
                return
            self.step()
            time.sleep(0.1)
        reports = {n: (rep.last.errors if rep.last is not None else None) for n, (_r, _s, rep) in self.agents.items()}
        raise AssertionError(f"{what}: not within {limit:.0f} s; the agents' errors: {reports}")

    def job_vms(self, jid: str) -> dict[str, list[str]]:
        return {n: sorted(v.name for v in be.list_vms() if v.name.startswith(f"j{jid}-r"))
                for n, be in self.backends.items()}

    def cleanup(self) -> None:
        for be in self.backends.values():
            remove_vms(be, PREFIX)
            for jid in self.jobs:
                remove_vms(be, f"j{jid}-r")
        self.daemon.store.close()


@pytest.mark.parametrize("case", ["ends", "cancel", "requeue", "restart"])
def test_no_vm_of_a_job_migrated_between_real_libvirt_hosts_is_left(
        tmp_path: Path, qemu: Any, peer_qemu: Any, peer: PeerHost, images: Path, case: str) -> None:
    c = Cluster(tmp_path, qemu, peer_qemu, peer, images)
    try:
        c.register(N1)
        jid = c.daemon.submit([{"procs": 1, "estimate": 100000, "work_seconds": 50000}])[0].id
        c.jobs.append(jid)
        name = f"j{jid}-r1-p0"
        c.until(lambda: c.runner.status(name) is not None, "the job's process to start on n1")
        c.register(N2)
        c.step()
        c.daemon.migrate_job(jid, N2)
        c.until(lambda: any(v.name == name and v.power is PowerState.MIGRATING for v in qemu.list_vms()) or
                any(v.name == name for v in peer_qemu.list_vms()), "the migration to start")
        if case == "ends":
            c.until(lambda: not c.daemon.job(jid).migrating, "the migration to complete")
            (arrived,) = [v for v in peer_qemu.list_vms() if v.name == name]
            assert arrived.metadata[META_NODE] == N2, arrived.metadata  # the destination XML named its new node
            import libvirt

            from vmctl.agents.backends.libvirt.xml import parse_domain_xml

            conn = libvirt.open(peer.uri)
            try:  # ... and so does its persistent definition there
                inactive = conn.lookupByName(name).XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
            finally:
                conn.close()
            assert parse_domain_xml(inactive).metadata[META_NODE] == N2
            assert c.daemon.job(jid).placement[0][0] == N2
            c.runner.finish(name)
            c.until(lambda: c.daemon.job(jid).state == "done", "the job to end")
        elif case == "cancel":
            c.daemon.cancel(jid)
        elif case == "requeue":
            c.daemon.requeue(jid, "test", hold=True)
        else:
            c.daemon = c._daemon()  # the old one is never told (kill -9); the new one carries the move on
            c.until(lambda: not c.daemon.job(jid).migrating, "the migration to complete under the new vmctld")
            c.daemon.cancel(jid)
        # one reconcile of each agent (a live migration in flight ends first: called back, or arrived)
        deadline = time.monotonic() + 60
        while any(v.name == name and v.power is PowerState.MIGRATING for v in qemu.list_vms()) \
                and time.monotonic() < deadline:
            c.cycle(N1)
            time.sleep(0.2)
        c.daemon.run_once()
        c.cycle(N1)
        c.cycle(N2)
        assert c.job_vms(jid) == {N1: [], N2: []}, case
    finally:
        c.cleanup()
