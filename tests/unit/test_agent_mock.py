"""The mock backend's CPU-sharing model, faults, journal, checkpoints and migration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmctl.agents.backends.base import BackendEvent, MigrationState, VmSpec
from vmctl.agents.backends.mock import Fault, MockBackend, MockFabric, MockProcessRunner, share_core
from vmctl.clock import VirtualClock
from vmctl.errors import HypervisorError, MigrationError, OutOfRange, VmNotFound, VmStateError
from vmctl.nodedoc import PowerState, ProcessSpec


def host(cores: int = 2, **kw: object) -> tuple[MockBackend, VirtualClock]:
    clock = VirtualClock(0.0)
    return MockBackend("h", cores=cores, clock=clock, **kw), clock  # type: ignore[arg-type]


def vm_up(b: MockBackend, name: str, core: int | None, weight: int, cap: float | None = None,
          usage: float | None = None, work: float = 1e9) -> None:
    b.define(VmSpec(name=name))
    if core is not None:
        b.pin_vcpus(name, (core,))
    b.set_cpu_tune(name, weight=weight, cap=cap)
    b.start(name)
    if usage is not None:
        b.start_process(name, ProcessSpec(job_id=name, index=0, work_seconds=work, cpu_usage=usage))


def cpu(b: MockBackend) -> dict[str, float]:
    return {v.name: v.cpu_time_s for v in b.list_vms()}


@pytest.mark.parametrize(
    ("demands", "capacity", "expected"),
    [
        ([(10000, 1.0), (1, 1.0)], 1.0, [1.0, 0.0]),  # spinning fg starves bg
        ([(10000, 0.3), (1, 1.0)], 1.0, [0.3, 0.7]),  # bg gets the rest
        ([(10000, 0.0), (1, 1.0)], 1.0, [0.0, 1.0]),  # idle fg: bg gets everything
        ([(5, 1.0), (5, 1.0)], 1.0, [0.5, 0.5]),  # equal weights: equal shares
        ([(5, 0.2), (5, 1.0)], 1.0, [0.2, 0.8]),  # water-filling
        ([(9, 0.5), (5, 0.5), (1, 1.0)], 1.0, [0.5, 0.5, 0.0]),
        ([(1, 0.4), (1, 0.4), (1, 0.4)], 2.0, [0.4, 0.4, 0.4]),  # spare capacity
        ([], 1.0, []),
    ],
)
def test_share_core(demands: list[tuple[int, float]], capacity: float, expected: list[float]) -> None:
    assert share_core(demands, capacity) == pytest.approx(expected)


def test_fg_gets_its_usage_and_bg_gets_the_rest() -> None:
    b, clock = host()
    vm_up(b, "fg", 0, 10000, usage=0.6)
    vm_up(b, "bg", 0, 1, usage=1.0)
    clock.advance(10)
    t = cpu(b)
    assert t["fg"] == pytest.approx(6.0)
    assert t["bg"] == pytest.approx(4.0)
    assert b.utilization("fg") == pytest.approx(0.6)
    assert b.host_info().utilization == pytest.approx(0.5)  # one of two cores busy


def test_spinning_fg_starves_bg_and_swap_reverses_it_live() -> None:
    b, clock = host()
    vm_up(b, "a", 1, 10000, usage=1.0)
    vm_up(b, "b", 1, 1, usage=1.0)
    clock.advance(5)
    assert cpu(b) == pytest.approx({"a": 5.0, "b": 0.0})
    b.set_cpu_tune("a", weight=1)
    b.set_cpu_tune("b", weight=10000)
    clock.advance(5)
    assert cpu(b) == pytest.approx({"a": 5.0, "b": 5.0})
    assert not b.operations("start", "stop")[2:]  # only the two initial starts


def test_caps_hold_and_leave_the_rest_to_lower_weights() -> None:
    b, clock = host()
    vm_up(b, "fg", 0, 10000, cap=0.25, usage=1.0)
    vm_up(b, "bg", 0, 1, cap=0.5, usage=1.0)
    clock.advance(8)
    t = cpu(b)
    assert t["fg"] == pytest.approx(2.0)
    assert t["bg"] == pytest.approx(4.0)


def test_different_cores_do_not_interfere() -> None:
    b, clock = host()
    vm_up(b, "x", 0, 10000, usage=1.0)
    vm_up(b, "y", 1, 1, usage=1.0)
    clock.advance(3)
    assert cpu(b) == pytest.approx({"x": 3.0, "y": 3.0})


def test_unpinned_vms_share_what_pinned_ones_leave() -> None:
    b, clock = host(cores=2)
    vm_up(b, "pinned", 0, 10000, usage=1.0)
    vm_up(b, "s1", None, 100, cap=0.5, usage=1.0)
    vm_up(b, "s2", None, 100, usage=1.0)
    clock.advance(10)
    t = cpu(b)
    assert t["pinned"] == pytest.approx(10.0)
    assert t["s1"] == pytest.approx(5.0)  # capped at half a core
    assert t["s2"] == pytest.approx(5.0)  # the spare core's other half


def test_process_finishes_after_its_work_and_frees_the_core() -> None:
    b, clock = host()
    vm_up(b, "fg", 0, 10000, usage=0.5, work=10.0)  # 10 dedicated-core seconds at 50 %
    vm_up(b, "bg", 0, 1, usage=1.0, work=10.0)
    clock.advance(9.0)
    st = b.process_status("fg")
    assert st is not None and st.running and st.work_done == pytest.approx(9.0)
    clock.advance(1.0)
    st = b.process_status("fg")
    assert st is not None and not st.running and st.exit_code == 0
    # bg got 0.5 for 10 s = 5 s of work, then the whole core: done at t = 15
    clock.advance(4.9)
    assert b.process_status("bg").running  # type: ignore[union-attr]
    clock.advance(0.2)
    bg = b.process_status("bg")
    assert bg is not None and bg.exit_code == 0
    assert cpu(b)["bg"] == pytest.approx(10.0)
    assert [e.vm for e in b.operations("process_exited")] == ["fg", "bg"]


def test_host_speed_scales_the_work_done_not_the_cpu_time() -> None:
    """issue 22: a mock host of speed 2 does 2 standard-core seconds of work per second of its core, for a
    process alone (4 s of work in 2 s) and for processes sharing a core (half a core each: 4 s of work in
    4 s, not 8); CPU time stays physical (the core is busy for as long as it runs)."""
    for speed, alone_end, shared_end in ((1.0, 4.0, 8.0), (2.0, 2.0, 4.0), (0.5, 8.0, 16.0)):
        b, clock = host(cores=2, speed=speed)
        vm_up(b, "alone", 0, 100, usage=1.0, work=4.0)
        vm_up(b, "s1", 1, 100, usage=1.0, work=4.0)
        vm_up(b, "s2", 1, 100, usage=1.0, work=4.0)
        clock.advance(alone_end / 2)
        st = b.process_status("alone")
        assert st is not None and st.running and st.work_done == pytest.approx(2.0)
        clock.advance(1000.0)
        b.list_vms()  # the model integrates on every call
        ended = {e.vm: e.time for e in b.operations("process_exited")}
        assert ended == pytest.approx({"alone": alone_end, "s1": shared_end, "s2": shared_end})
        assert cpu(b) == pytest.approx({"alone": alone_end, "s1": shared_end / 2, "s2": shared_end / 2})
    with pytest.raises(OutOfRange, match="speed"):
        host(speed=0.0)


def test_a_migrated_process_goes_on_at_the_target_speed() -> None:
    """4 s of work: 1 s on a speed-1 host (1 s done, plus 1 s of live migration still running there),
    then the remaining 2 s of work at speed 2 on the target: it ends at t = 2 + 1 = 3."""
    clock = VirtualClock(0.0)
    fabric = MockFabric()
    a = MockBackend("a", clock=clock, fabric=fabric, migration_seconds=1.0, speed=1.0)
    b = MockBackend("b", clock=clock, fabric=fabric, speed=2.0)
    vm_up(a, "v", 0, 100, usage=1.0, work=4.0)
    clock.advance(1.0)
    a.start_migration("v", b.uri)
    clock.advance(1.0)
    assert b.list_vms()[0].power is PowerState.RUNNING
    assert b.process_status("v").work_done == pytest.approx(2.0)  # type: ignore[union-attr]
    clock.advance(0.99)
    assert b.process_status("v").running  # type: ignore[union-attr]
    clock.advance(1.0)
    assert b.process_status("v").exit_code == 0  # type: ignore[union-attr]
    assert [e.time for e in b.operations("process_exited")] == pytest.approx([3.0])


def test_bg_progress_depends_on_fg_idle_cycles() -> None:
    """Within one lazy advance the model steps across process exits exactly."""
    b, clock = host()
    vm_up(b, "fg", 0, 10000, usage=1.0, work=2.0)
    vm_up(b, "bg", 0, 1, usage=1.0, work=3.0)
    clock.advance(100)
    assert b.process_status("bg").exit_code == 0  # type: ignore[union-attr]
    assert cpu(b) == pytest.approx({"fg": 2.0, "bg": 3.0})


def test_kill_process_and_stop_give_137() -> None:
    b, _ = host()
    vm_up(b, "v", 0, 10, usage=1.0)
    b.stop("v")
    st = b.process_status("v")
    assert st is not None and st.exit_code == 137
    b.start("v")  # fresh boot: no process
    assert b.process_status("v") is None
    runner = MockProcessRunner(b)
    runner.start("v", ProcessSpec(job_id="j", index=1, work_seconds=5))
    runner.start("v", ProcessSpec(job_id="j", index=1, work_seconds=5))  # idempotent
    with pytest.raises(VmStateError):
        runner.start("v", ProcessSpec(job_id="other", index=0, work_seconds=5))
    runner.kill("v")
    assert runner.status("v") is None
    assert [e.detail for e in b.operations("kill_process")] == ["j[1]"]


def test_process_on_a_stopped_vm_is_refused() -> None:
    b, _ = host()
    b.define(VmSpec(name="v"))
    with pytest.raises(VmStateError, match="shutoff"):
        b.start_process("v", ProcessSpec(job_id="j", index=0))
    b.start("v")
    with pytest.raises(OutOfRange):
        b.start_process("v", ProcessSpec(job_id="j", index=0, cpu_usage=0.0))


def test_paused_vm_gets_no_cpu() -> None:
    b, clock = host()
    vm_up(b, "fg", 0, 10000, usage=1.0)
    vm_up(b, "bg", 0, 1, usage=1.0)
    b.suspend("fg")
    clock.advance(4)
    assert cpu(b) == pytest.approx({"fg": 0.0, "bg": 4.0})


def test_fault_injection_times_glob_and_forever() -> None:
    b, _ = host(faults=[Fault("start", "bad-*", times=2), Fault("list_vms", times=None,
                                                                 error=HypervisorError(backend="mock",
                                                                                       operation="list_vms",
                                                                                       problem="down"))])
    b.faults[1].times = 0  # disabled until re-armed
    b.define(VmSpec(name="bad-1"))
    b.define(VmSpec(name="good"))
    b.start("good")
    for _ in range(2):
        with pytest.raises(HypervisorError, match="injected fault on bad-1") as ei:
            b.start("bad-1")
        assert ei.value.retryable
    b.start("bad-1")
    assert b.list_vms()[0].power is PowerState.RUNNING
    b.faults[1].times = None
    for _ in range(3):
        with pytest.raises(HypervisorError, match="down"):
            b.list_vms()
    failed = [e for e in b.journal if not e.ok]
    assert len(failed) == 5 and failed[0].operation == "start"


def test_journal_records_changes_not_no_ops() -> None:
    b, _ = host()
    b.define(VmSpec(name="v"))
    b.define(VmSpec(name="v"))
    b.start("v")
    b.start("v")
    b.pin_vcpus("v", (1,))
    b.pin_vcpus("v", (1,))
    b.set_cpu_tune("v", weight=7)
    b.set_cpu_tune("v", weight=7)
    assert [e.operation for e in b.journal] == ["define", "start", "pin_vcpus", "set_cpu_tune"]


def test_errors_for_bad_arguments() -> None:
    b, _ = host()
    with pytest.raises(VmNotFound):
        b.start("ghost")
    b.define(VmSpec(name="v"))
    with pytest.raises(OutOfRange):
        b.pin_vcpus("v", (2,))
    with pytest.raises(OutOfRange):
        b.set_cpu_tune("v", weight=10001)
    with pytest.raises(OutOfRange):
        b.set_cpu_tune("v", cap=1.01)
    with pytest.raises(OutOfRange):
        b.define(VmSpec(name="w", vcpus=0))
    b.start("v")
    with pytest.raises(VmStateError):
        b.undefine("v")
    b.close()
    with pytest.raises(HypervisorError, match="closed"):
        b.list_vms()
    b.reopen()
    assert [v.name for v in b.list_vms()] == ["v"]


def test_checkpoint_file_and_restore_on_another_host(tmp_path: Path) -> None:
    clock = VirtualClock(0.0)
    a = MockBackend("a", cores=2, clock=clock)
    b = MockBackend("b", cores=1, clock=clock)
    vm_up(a, "v", 1, 10000, cap=0.5, usage=0.5, work=10.0)
    clock.advance(4)  # 2 s of cpu = 4 s of work
    path = tmp_path / "ck" / "v.json"
    a.checkpoint("v", str(path))
    data = json.loads(path.read_text())
    assert data["process"]["done"] == pytest.approx(4.0) and data["cap"] == 0.5
    assert a.list_vms()[0].power is PowerState.SAVED
    clock.advance(100)
    assert cpu(a)["v"] == pytest.approx(2.0)  # a saved VM gets no CPU
    assert b.restore(str(path)) == "v"
    info = b.list_vms()[0]
    assert info.power is PowerState.RUNNING and info.pinned_cores is None  # core 1 does not exist on b
    assert info.cap == 0.5 and info.cpu_time_s == pytest.approx(2.0)
    clock.advance(12)
    assert b.process_status("v").exit_code == 0  # type: ignore[union-attr]
    with pytest.raises(VmStateError):
        b.restore(str(path))  # already running
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(HypervisorError, match="not a mock checkpoint"):
        b.restore(str(bad))


def test_live_migration_through_a_fabric() -> None:
    clock = VirtualClock(0.0)
    fabric = MockFabric()
    a = MockBackend("a", clock=clock, fabric=fabric, migration_seconds=2.0)
    b = MockBackend("b", clock=clock, fabric=fabric)
    vm_up(a, "v", 0, 10000, usage=1.0, work=100)
    a.start_migration("v", b.uri)
    a.start_migration("v", b.uri)  # idempotent while running
    clock.advance(1.0)
    st = a.migration_status("v")
    assert st.state is MigrationState.RUNNING and 0 < st.data_remaining_bytes < st.data_total_bytes
    assert a.list_vms()[0].power is PowerState.MIGRATING
    assert b.list_vms() == []
    clock.advance(1.5)
    assert b.list_vms()[0].power is PowerState.RUNNING  # the target's relist completes it
    assert a.list_vms() == []
    assert a.migration_status("v").state is MigrationState.COMPLETED
    assert b.process_status("v").work_done == pytest.approx(2.5)  # type: ignore[union-attr]
    with pytest.raises(MigrationError, match="no such host"):
        b.start_migration("v", "mock://nowhere")


def test_crossing_migrations_from_two_threads_do_not_deadlock() -> None:
    """Two hosts finishing migrations towards each other while both relist concurrently: both VMs
    arrive, nothing hangs (the fabric's one lock; the plain relist race is the next test)."""
    import threading

    for round_ in range(30):
        clock = VirtualClock(0.0)
        fabric = MockFabric()
        a = MockBackend("a", clock=clock, fabric=fabric, migration_seconds=1.0)
        b = MockBackend("b", clock=clock, fabric=fabric, migration_seconds=1.0)
        vm_up(a, "va", 0, 10000, usage=1.0, work=100)
        vm_up(b, "vb", 0, 10000, usage=1.0, work=100)
        a.start_migration("va", b.uri)
        b.start_migration("vb", a.uri)
        clock.advance(1.5)
        go = threading.Barrier(2)

        def relist(backend: MockBackend, go: threading.Barrier = go) -> None:
            go.wait()
            for _ in range(20):
                backend.list_vms()

        threads = [threading.Thread(target=relist, args=(x,), daemon=True) for x in (a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert not any(t.is_alive() for t in threads), f"deadlock in round {round_}"
        assert [v.name for v in a.list_vms()] == ["vb"] and [v.name for v in b.list_vms()] == ["va"]


def test_two_threads_calling_two_backends_of_one_fabric_do_not_deadlock() -> None:
    """Issue 23 item 8: each call settles every backend of the fabric. With a lock per backend, a
    thread in ``a.list_vms`` (holding a's lock, waiting for b's) and one in ``b.list_vms`` (holding b's,
    waiting for a's) hung forever -- the crash test's agents under heavy load. With a fast thread
    switch this hung within a second before the fabric got one lock; now both threads finish."""
    import sys
    import threading
    import time

    from vmctl.clock import SystemClock

    fabric = MockFabric()
    backends = [MockBackend(n, clock=SystemClock(), fabric=fabric) for n in ("a", "b")]
    for b in backends:
        vm_up(b, f"v{b.hostname}", 0, 10000, usage=1.0, work=100)
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        stop = time.monotonic() + 1.0

        def relist(backend: MockBackend) -> None:
            while time.monotonic() < stop:
                backend.list_vms()

        threads = [threading.Thread(target=relist, args=(b,), daemon=True) for b in backends]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(old)
    assert not any(t.is_alive() for t in threads), "two backends of one fabric deadlocked"


def test_abort_migration_keeps_the_vm_on_the_source() -> None:
    clock = VirtualClock(0.0)
    fabric = MockFabric()
    a = MockBackend("a", clock=clock, fabric=fabric, migration_seconds=2.0)
    b = MockBackend("b", clock=clock, fabric=fabric)
    vm_up(a, "v", 0, 10000)
    a.start_migration("v", b.uri)
    clock.advance(0.5)
    a.abort_migration("v")
    clock.advance(5)
    assert a.migration_status("v").state is MigrationState.ABORTED
    assert a.list_vms()[0].power is PowerState.RUNNING and b.list_vms() == []


def test_events_are_delivered() -> None:
    b, _ = host()
    got: list[BackendEvent] = []
    b.subscribe(got.append)
    b.define(VmSpec(name="v"))
    b.start("v")
    b.suspend("v")
    b.resume("v")
    b.stop("v")
    b.undefine("v")
    assert [e.kind for e in got] == ["defined", "started", "suspended", "resumed", "stopped", "undefined"]


# ------------------------------------------------------------------ the fabric directory (between processes)


def dir_pair(tmp_path: Path, **kw: object) -> tuple[MockBackend, MockBackend, VirtualClock]:
    """Two backends that share only a directory (no MockFabric): what two agent processes see."""
    clock = VirtualClock(0.0)
    a = MockBackend("a", clock=clock, fabric_dir=tmp_path / "fab", migration_seconds=2.0, **kw)  # type: ignore[arg-type]
    b = MockBackend("b", clock=clock, fabric_dir=tmp_path / "fab")
    return a, b, clock


def test_migration_through_the_fabric_directory_carries_the_process(tmp_path: Path) -> None:
    a, b, clock = dir_pair(tmp_path)
    vm_up(a, "v", 1, 10000, usage=1.0, work=100)
    a.set_cpu_tune("v", cap=0.5)
    a.start_migration("v", b.uri)
    a.start_migration("v", b.uri)  # idempotent while running
    clock.advance(1.0)
    assert a.migration_status("v").state is MigrationState.RUNNING
    clock.advance(1.5)
    assert a.list_vms()[0].power is PowerState.MIGRATING  # handed off: frozen, waiting for the target
    offer = tmp_path / "fab" / "mock_b" / "v.json"
    assert json.loads(offer.read_text())["process"]["done"] == pytest.approx(1.25)  # 2.5 s at cap 0.5
    assert a.migration_status("v").state is MigrationState.RUNNING
    clock.advance(3.0)  # the frozen VM makes no progress while the offer waits
    got = b.list_vms()  # the target's next call adopts it
    assert [(v.name, v.power, v.cap) for v in got] == [("v", PowerState.RUNNING, 0.5)]
    assert not offer.exists() and list(offer.parent.iterdir()) == []
    assert a.migration_status("v").state is MigrationState.COMPLETED and a.list_vms() == []
    assert b.process_status("v").work_done == pytest.approx(1.25)  # type: ignore[union-attr]
    clock.advance(2.0)
    assert b.process_status("v").work_done == pytest.approx(2.25)  # type: ignore[union-attr]
    assert [e.operation for e in a.operations("start_migration", "migration_handoff", "migration_completed")] == [
        "start_migration", "migration_handoff", "migration_completed"]
    assert b.operations("migration_arrived")[0].detail == a.uri


def test_fabric_directory_failures(tmp_path: Path) -> None:
    a, b, clock = dir_pair(tmp_path)
    vm_up(a, "v", 0, 10000, usage=1.0, work=100)
    with pytest.raises(MigrationError, match="no such host"):
        a.start_migration("v", "mock://nowhere")
    with pytest.raises(MigrationError, match="same host"):
        a.start_migration("v", a.uri)
    # the target already runs a VM of that name: it rejects the offer, the VM runs on at the source
    vm_up(b, "v", 0, 10000)
    a.start_migration("v", b.uri)
    clock.advance(2.5)
    a.list_vms()  # hand-off
    b.list_vms()  # rejection
    st = a.migration_status("v")
    assert st.state is MigrationState.FAILED and "already has a running VM v" in st.error
    assert a.list_vms()[0].power is PowerState.RUNNING
    done = a.process_status("v").work_done  # type: ignore[union-attr]
    clock.advance(1.0)
    assert a.process_status("v").work_done == pytest.approx(done + 1.0)  # type: ignore[union-attr]
    assert list((tmp_path / "fab" / "mock_b").iterdir()) == []
    # abort after the hand-off but before the target looked: the offer is withdrawn
    b.stop("v")
    b.undefine("v")
    a.start_migration("v", b.uri)
    clock.advance(2.5)
    a.list_vms()
    a.abort_migration("v")
    assert a.migration_status("v").state is MigrationState.ABORTED
    assert b.list_vms() == [] and a.list_vms()[0].power is PowerState.RUNNING
    # an unreadable offer is answered with a rejection
    (tmp_path / "fab" / "mock_b" / "w.json").write_text("{not json")
    b.list_vms()
    assert "cannot read" in (tmp_path / "fab" / "mock_b" / "w.rejected").read_text()
    # the target's inbox vanished (host gone): the hand-off fails, the VM stays
    a.start_migration("v", b.uri)
    for f in (tmp_path / "fab" / "mock_b").iterdir():
        f.unlink()
    (tmp_path / "fab" / "mock_b").rmdir()
    clock.advance(2.5)
    assert a.list_vms()[0].power is PowerState.RUNNING
    assert "cannot hand off" in a.migration_status("v").error


def test_poll_thread_emits_arrivals(tmp_path: Path) -> None:
    import threading

    from vmctl.clock import SystemClock

    a = MockBackend("a", clock=SystemClock(), fabric_dir=tmp_path, migration_seconds=0.05)
    b = MockBackend("b", clock=SystemClock(), fabric_dir=tmp_path, poll_seconds=0.02)
    try:
        got = threading.Event()
        b.subscribe(lambda ev: got.set() if ev.kind == "started" else None)
        vm_up(a, "v", 0, 10000, usage=1.0, work=100)
        a.start_migration("v", b.uri)
        import time

        deadline = time.monotonic() + 30
        while a.migration_status("v").state is MigrationState.RUNNING and time.monotonic() < deadline:
            time.sleep(0.02)
        assert got.wait(30) and a.migration_status("v").state is MigrationState.COMPLETED
        assert [v.name for v in b.list_vms()] == ["v"]
    finally:
        a.close()
        b.close()
