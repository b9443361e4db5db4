"""The reconcile loop over the mock backend: convergence, adoption, faults and backoff, reports,
migration between two agents."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.agents import swap_tiers
from vmctl.agents.backends.base import VmSpec
from vmctl.agents.backends.mock import Fault, MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Backoff, Reconciler, ReconcileResult
from vmctl.agents.sources import FileSource, MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.errors import HypervisorError, StoreError
from vmctl.nodedoc import MigrationSpec, NodeDesired, NodeObserved, PowerState, ProcessSpec, VmDesired, VmRole
from vmctl.wire import desired_to_json

LAYOUT = Layout("n1", (0, 1))


class Rig:
    def __init__(self, faults: list[Fault] | None = None, backoff: Backoff | None = None) -> None:
        self.clock = VirtualClock(100.0)
        self.backend = MockBackend("n1", cores=2, clock=self.clock, faults=faults or [])
        self.source = MemorySource(None)
        self.reporter = MemoryReporter()
        self.backoff = backoff
        self.rec = self.new_reconciler()

    def new_reconciler(self) -> Reconciler:
        return Reconciler(self.backend, LAYOUT, self.source, self.reporter, clock=self.clock,
                          runner=MockProcessRunner(self.backend), backoff=self.backoff or Backoff(0.5, 2.0, 4.0),
                          resync_seconds=30.0)

    def ops(self, *names: str) -> list[str]:
        return [f"{e.operation} {e.vm}" for e in self.backend.operations(*names)]


def with_processes(d: NodeDesired, **procs: ProcessSpec) -> NodeDesired:
    vms = tuple(replace(v, process=procs.get(v.name.replace("-", "_"), v.process)) for v in d.vms)
    return replace(d, vms=vms)


def vm_of(o: NodeObserved | None, name: str) -> object:
    assert o is not None
    return next(v for v in o.vms if v.name == name)


def test_converges_from_an_empty_host_in_one_cycle() -> None:
    r = Rig()
    r.source.set(LAYOUT.base_desired(3))
    res = r.rec.run_once()
    assert res.converged and not res.errors and not res.retry
    assert res.delay == 30.0
    assert len(r.ops("start")) == 4
    assert res.observed is not None and res.observed.generation_applied == 3
    assert {(v.name, v.core, v.weight) for v in res.observed.vms} == {
        ("n1-c0-fg", 0, 10000), ("n1-c0-bg", 0, 1), ("n1-c1-fg", 1, 10000), ("n1-c1-bg", 1, 1)}
    again = r.rec.run_once()
    assert again.applied == () and again.converged


def test_without_desired_state_the_bare_layout_is_kept_and_nothing_pruned() -> None:
    r = Rig()
    r.backend.define(VmSpec(name="n1-leftover", metadata={"vmctl.managed": "1", "vmctl.node": "n1"}))
    res = r.rec.run_once()
    assert res.converged and res.generation is None
    assert "n1-leftover" in [v.name for v in r.backend.list_vms()]
    assert res.observed is not None and res.observed.generation_applied == 0


def test_restart_adopts_running_vms_and_changes_nothing() -> None:
    r = Rig()
    d = with_processes(LAYOUT.base_desired(5), n1_c0_fg=ProcessSpec("j1", 0, work_seconds=50, cpu_usage=0.7),
                       n1_c1_bg=ProcessSpec("j2", 1, work_seconds=50))
    r.source.set(d)
    assert r.rec.run_once().converged
    r.clock.advance(10)
    before = len(r.backend.journal)
    fresh = r.new_reconciler()  # the agent restarted: no memory, same hypervisor
    res = fresh.run_once()
    assert res.applied == () and res.converged
    assert len(r.backend.journal) == before, r.backend.journal[before:]
    assert r.ops("start", "stop", "start_process", "kill_process").count("start_process n1-c0-fg") == 1
    assert res.observed is not None and res.observed.generation_applied == 5


def test_promote_is_a_live_weight_swap() -> None:
    r = Rig()
    base = LAYOUT.base_desired(1)
    r.source.set(base)
    r.rec.run_once()
    n = len(r.backend.journal)
    r.source.set(swap_tiers(base, 1))
    res = r.rec.run_once()
    assert res.converged
    new = [(e.operation, e.vm, e.detail) for e in r.backend.journal[n:]]
    assert new == [("set_cpu_tune", "n1-c1-fg", "weight=1 cap=None"),
                   ("set_cpu_tune", "n1-c1-bg", "weight=10000 cap=None")]


def test_invalid_desired_state_is_rejected_as_a_whole() -> None:
    r = Rig()
    good = LAYOUT.base_desired(1)
    r.source.set(good)
    r.rec.run_once()
    n = len(r.backend.journal)
    vms = list(good.vms)
    vms[0] = replace(vms[0], cap=0.5)  # a valid change ...
    vms[3] = replace(vms[3], weight=0)  # ... and an invalid one in the same document
    r.source.set(NodeDesired(node="n1", generation=2, vms=tuple(vms)))
    res = r.rec.run_once()
    assert len(r.backend.journal) == n  # nothing applied, not even the valid part
    assert not res.retry
    assert res.observed is not None and res.observed.generation_applied == 1
    assert any("desired[n1 gen 2].vms[3]" in e and "weight" in e for e in res.observed.errors)
    r.source.set(replace(r.source.fetch(), vms=(*tuple(vms[:3]), replace(vms[3], weight=1))))  # type: ignore[arg-type]
    res = r.rec.run_once()
    assert res.converged and not res.errors and res.observed is not None
    assert res.observed.generation_applied == 2


def test_a_failing_vm_does_not_block_the_others_and_backoff_grows() -> None:
    r = Rig(faults=[Fault("start", "n1-c0-*", times=4)])  # two VMs: fails twice each
    r.source.set(LAYOUT.base_desired(1))
    first = r.rec.run_once()
    assert first.retry and first.delay == 0.5 and not first.converged
    assert sorted(r.ops("start")) == ["start n1-c1-bg", "start n1-c1-fg"]
    assert len(first.errors) == 2 and all("hypervisor-error" in e for e in first.errors)
    assert first.observed is not None and first.observed.generation_applied == 0
    second = r.rec.run_once()
    assert second.retry and second.delay == 1.0
    third = r.rec.run_once()
    assert third.converged and not third.retry and third.delay == 30.0
    assert third.observed is not None and third.observed.generation_applied == 1
    assert r.rec.backoff.failures == 0


def test_backend_down_backs_off_to_the_cap_and_recovers() -> None:
    down = Fault("list_vms", times=None)
    r = Rig(faults=[down], backoff=Backoff(initial=0.5, factor=2.0, maximum=2.0))
    r.source.set(LAYOUT.base_desired(1))
    delays = []
    for _ in range(4):
        res = r.rec.run_once()
        assert res.retry and res.observed is not None
        assert any(e.startswith("observe: hypervisor-error") for e in res.observed.errors)
        delays.append(res.delay)
    assert delays == [0.5, 1.0, 2.0, 2.0]
    assert r.backend.operations("define") == []
    down.times = 0
    res = r.rec.run_once()
    assert res.converged and res.observed is not None and res.observed.generation_applied == 1


def test_unknown_process_state_never_double_starts_a_job() -> None:
    r = Rig()
    d = with_processes(LAYOUT.base_desired(1), n1_c0_fg=ProcessSpec("j1", 0, work_seconds=50))
    r.source.set(d)
    r.rec.run_once()
    r.backend.faults.append(Fault("process_status", "*", times=1))
    r.backend.kill_process("n1-c0-fg")  # the process vanished ...
    res = r.rec.run_once()  # ... but its state cannot be read: do nothing this time
    assert res.retry and r.ops("start_process") == ["start_process n1-c0-fg"]
    res = r.rec.run_once()
    assert r.ops("start_process") == ["start_process n1-c0-fg", "start_process n1-c0-fg"]


def test_report_has_fg_utilization_and_process_exit() -> None:
    r = Rig()
    d = with_processes(LAYOUT.base_desired(1), n1_c0_fg=ProcessSpec("j1", 0, work_seconds=6, cpu_usage=0.6),
                       n1_c0_bg=ProcessSpec("j2", 0, work_seconds=100, cpu_usage=1.0))
    r.source.set(d)
    r.rec.run_once()
    r.clock.advance(5)
    obs = r.rec.run_once().observed
    fg, bg = vm_of(obs, "n1-c0-fg"), vm_of(obs, "n1-c0-bg")
    assert fg.utilization == pytest.approx(0.6)  # type: ignore[attr-defined]
    assert bg.utilization == pytest.approx(0.4)  # type: ignore[attr-defined]
    assert fg.process_job == "j1" and fg.process_exit is None  # type: ignore[attr-defined]
    assert obs is not None and obs.host_utilization == pytest.approx(0.5)
    r.clock.advance(5)
    obs = r.rec.run_once().observed
    fg = vm_of(obs, "n1-c0-fg")
    assert fg.process_exit == 0  # type: ignore[attr-defined]
    assert fg.utilization == pytest.approx(0.12)  # type: ignore[attr-defined]  # ran 1 s of the last 5 at 60 %
    assert r.reporter.last is obs


def test_prunes_managed_orphans_but_never_foreign_vms() -> None:
    r = Rig()
    r.backend.define(VmSpec(name="n1-old", metadata={"vmctl.managed": "1", "vmctl.node": "n1"}))
    r.backend.start("n1-old")
    r.backend.define(VmSpec(name="not-ours"))
    r.backend.start("not-ours")
    r.source.set(LAYOUT.base_desired(1))
    res = r.rec.run_once()
    assert res.converged
    names = {v.name: v.power for v in r.backend.list_vms()}
    assert "n1-old" not in names and names["not-ours"] is PowerState.RUNNING
    assert res.observed is not None and "not-ours" not in [v.name for v in res.observed.vms]


def test_file_source_errors_keep_the_last_good_state(tmp_path: Path) -> None:
    import json

    path = tmp_path / "desired.json"
    r = Rig()
    r.rec.source = FileSource(path)
    path.write_text(json.dumps(desired_to_json(LAYOUT.base_desired(4))))
    assert r.rec.run_once().converged
    path.write_text('{"node": "n1", "generation": 5, "vms": '
                    '[{"name": "x", "core": 0, "role": "fg", "weight": 3, "wieght": 3}]}')
    res = r.rec.run_once()
    assert not res.retry and res.observed is not None
    assert any(str(path) in e and "vms[0].wieght" in e for e in res.observed.errors)
    assert res.observed.generation_applied == 4
    assert res.converged  # still holding the last good state


def test_source_down_is_retried_with_backoff() -> None:
    class Down:
        def fetch(self) -> NodeDesired | None:
            raise StoreError(backend="http", problem="daemon unreachable")

    r = Rig()
    r.rec.source = Down()
    res = r.rec.run_once()
    assert res.retry and res.delay == 0.5
    assert res.converged  # the bare layout was still enforced
    assert any("daemon unreachable" in e for e in res.errors)


def test_reporter_failure_is_retried() -> None:
    class Broken:
        def report(self, observed: NodeObserved) -> None:
            raise HypervisorError(backend="report", operation="post", problem="503")

    r = Rig()
    r.rec.reporter = Broken()
    res = r.rec.run_once()
    assert res.retry and res.observed is None


def test_checkpoint_then_restore_through_desired_state(tmp_path: Path) -> None:
    r = Rig()
    ck = str(tmp_path / "fg0.ckpt")
    d = with_processes(LAYOUT.base_desired(1), n1_c0_fg=ProcessSpec("j1", 0, work_seconds=10, cpu_usage=1.0))
    r.source.set(d)
    r.rec.run_once()
    r.clock.advance(4)
    vms = tuple(replace(v, power=PowerState.SAVED, checkpoint_path=ck) if v.name == "n1-c0-fg" else v
                for v in d.vms)
    r.source.set(replace(d, generation=2, vms=vms))
    res = r.rec.run_once()
    assert res.converged and vm_of(res.observed, "n1-c0-fg").power is PowerState.SAVED  # type: ignore[attr-defined]
    r.clock.advance(100)
    vms = tuple(replace(v, power=PowerState.RUNNING) if v.name == "n1-c0-fg" else v for v in vms)
    r.source.set(replace(d, generation=3, vms=vms))
    res = r.rec.run_once()
    assert res.converged and "restore n1-c0-fg" in r.ops("restore")
    r.clock.advance(5.9)
    assert r.backend.process_status("n1-c0-fg").running  # type: ignore[union-attr]  # 4 + 5.9 < 10
    r.clock.advance(0.2)
    assert r.backend.process_status("n1-c0-fg").exit_code == 0  # type: ignore[union-attr]


def _two_agents(mode: str, tmp_path: Path) -> tuple[VirtualClock, Reconciler, Reconciler, MemorySource, MemorySource]:
    clock = VirtualClock(0.0)
    fabric = MockFabric()
    a = MockBackend("n1", cores=2, clock=clock, fabric=fabric, migration_seconds=3.0)
    b = MockBackend("n2", cores=2, clock=clock, fabric=fabric)
    sa, sb = MemorySource(), MemorySource()
    la, lb = Layout("n1", (0, 1)), Layout("n2", (0, 1))
    ra = Reconciler(a, la, sa, MemoryReporter(), clock=clock, runner=MockProcessRunner(a), peers={"n2": b.uri})
    rb = Reconciler(b, lb, sb, MemoryReporter(), clock=clock, runner=MockProcessRunner(b), peers={"n1": a.uri})
    return clock, ra, rb, sa, sb


def test_live_migration_between_two_agents(tmp_path: Path) -> None:
    clock, ra, rb, sa, sb = _two_agents("live", tmp_path)
    job = ProcessSpec("j9", 0, work_seconds=100)
    v = VmDesired(name="vc-j9", core=0, role=VmRole.SHARED, weight=500, cap=0.5, process=job)
    sa.set(NodeDesired("n1", 1, (v,)))
    sb.set(NodeDesired("n2", 1, ()))
    assert ra.run_once().converged and rb.run_once().converged
    clock.advance(10)
    mig = MigrationSpec("m1", source_node="n1", target_node="n2", target_core=1)
    sa.set(NodeDesired("n1", 2, (replace(v, migration=mig),)))
    sb.set(NodeDesired("n2", 2, (replace(v, migration=mig, core=1),)))
    res = ra.run_once()
    assert [a.kind for a in res.applied] == ["start_migration"]
    assert vm_of(res.observed, "vc-j9").migration_phase == "running"  # type: ignore[attr-defined]
    assert rb.run_once().applied == ()  # waiting for it
    clock.advance(3.5)
    res_b = rb.run_once()
    assert [a.kind for a in res_b.applied] == ["pin"]  # arrived: pinned to the target core
    assert vm_of(res_b.observed, "vc-j9").core == 1  # type: ignore[attr-defined]
    assert vm_of(res_b.observed, "vc-j9").process_job == "j9"  # type: ignore[attr-defined]
    res_a = ra.run_once()
    assert res_a.applied == () and vm_of(res_a.observed, "vc-j9").migration_phase == "completed"  # type: ignore[attr-defined]
    # a restarted source agent never re-creates the VM that left
    ra2 = Reconciler(ra.backend, ra.layout, sa, MemoryReporter(), clock=clock, runner=ra.runner, peers=ra.peers)
    assert ra2.run_once().applied == ()
    assert "vc-j9" not in [x.name for x in ra.backend.list_vms()]
    assert rb.backend.process_status("vc-j9").work_done == pytest.approx(6.75)  # type: ignore[attr-defined]


def test_checkpoint_migration_between_two_agents(tmp_path: Path) -> None:
    clock, ra, rb, sa, sb = _two_agents("checkpoint", tmp_path)
    ck = str(tmp_path / "shared" / "vc.ckpt")
    v = VmDesired(name="vc-1", core=0, role=VmRole.SHARED, weight=500, process=ProcessSpec("j1", 0, work_seconds=50))
    sa.set(NodeDesired("n1", 1, (v,)))
    sb.set(NodeDesired("n2", 1, ()))
    ra.run_once()
    rb.run_once()
    clock.advance(5)
    mig = MigrationSpec("m2", source_node="n1", target_node="n2", target_core=0, mode="checkpoint")
    sa.set(NodeDesired("n1", 2, (replace(v, migration=mig, checkpoint_path=ck),)))
    sb.set(NodeDesired("n2", 2, (replace(v, migration=mig, checkpoint_path=ck),)))
    res = ra.run_once()
    assert vm_of(res.observed, "vc-1").migration_phase == "checkpointed"  # type: ignore[attr-defined]
    assert rb.run_once().applied == ()  # phase still "requested": the target waits for the daemon
    running = replace(mig, phase="running")
    sb.set(NodeDesired("n2", 3, (replace(v, migration=running, checkpoint_path=ck),)))
    res_b = rb.run_once()
    assert next(a.kind for a in res_b.applied) == "restore"
    assert rb.backend.process_status("vc-1").work_done == pytest.approx(5.0)  # type: ignore[attr-defined]


def test_run_loop_wakes_on_events_and_stops() -> None:
    r = Rig()
    r.rec.resync_seconds = 60.0
    stop = threading.Event()
    finished: list[ReconcileResult | None] = []  # one entry per cycle the loop completed

    def idle() -> int | None:
        """The number of cycles once the loop went to sleep: its last cycle is complete and changed nothing
        (so it caused no event), hence only an outside event or the 60 s resync starts another."""
        n = len(finished)
        if n and r.rec.cycles == n and finished[-1] is not None and not finished[-1].applied:
            return n
        return None

    def wait_idle(after: int = 0) -> int:
        """Wait until the loop has completed more than ``after`` cycles and sleeps."""
        deadline = time.monotonic() + 30  # well below the resync: a wake-up within it came from an event
        while (n := idle()) is None or n <= after:
            assert time.monotonic() < deadline, f"the loop did not settle: {r.rec.cycles} cycles, {finished}"
            time.sleep(0.01)
        return n

    th = threading.Thread(target=r.rec.run, args=(stop,), kwargs={"on_cycle": lambda res, _s: finished.append(res)},
                          daemon=True)
    th.start()
    n = wait_idle()  # the agent's own events (starting the layout's VMs) wake it once more
    assert 1 <= n <= 3, finished
    r.backend.define(VmSpec(name="someone-else"))  # a lifecycle event wakes the loop
    assert wait_idle(after=n) == n + 1  # exactly one more cycle, and the loop sleeps again
    assert r.rec.cycles == n + 1
    stop.set()
    r.rec.wake()
    th.join(timeout=5)
    assert not th.is_alive()


def test_backoff_arithmetic() -> None:
    b = Backoff(initial=1.0, factor=3.0, maximum=20.0)
    assert [b.next_delay() for _ in range(5)] == [1.0, 3.0, 9.0, 20.0, 20.0]
    b.reset()
    assert b.next_delay() == 1.0


def test_checkpoint_migration_copies_the_file_to_the_target_host(tmp_path: Path) -> None:
    from vmctl.errors import RemoteExecError

    _, ra, _, sa, _ = _two_agents("checkpoint", tmp_path)
    calls: list[tuple[str, str, str]] = []
    fail = {"n": 1}

    def transfer(src: str, node: str, dst: str) -> int:
        if fail["n"] > 0:
            fail["n"] -= 1
            raise RemoteExecError(host=node, problem="connection reset")
        calls.append((src, node, dst))
        return Path(src).stat().st_size

    ra.transfer = transfer
    ck = str(tmp_path / "vc.ckpt")
    v = VmDesired(name="vc-2", core=0, role=VmRole.SHARED, weight=500)
    sa.set(NodeDesired("n1", 1, (v,)))
    ra.run_once()
    mig = MigrationSpec("m5", source_node="n1", target_node="n2", target_core=0, mode="checkpoint")
    sa.set(NodeDesired("n1", 2, (replace(v, migration=mig, checkpoint_path=ck),)))
    res = ra.run_once()
    assert res.retry and vm_of(res.observed, "vc-2").migration_phase == "saved"  # type: ignore[attr-defined]
    assert calls == []
    res = ra.run_once()
    assert res.converged and vm_of(res.observed, "vc-2").migration_phase == "checkpointed"  # type: ignore[attr-defined]
    assert calls == [(ck, "n2", ck)]
    assert ra.run_once().applied == ()  # copied once
