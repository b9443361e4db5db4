"""The HypervisorBackend contract, run against every registered backend (see conftest.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from vmctl.agents.backends.base import (
    WEIGHT_MAX,
    WEIGHT_MIN,
    BackendEvent,
    Capability,
    HostInfo,
    MigrationState,
)
from vmctl.errors import HypervisorError, OperationNotSupported, OutOfRange, UserError, VmctlError, VmNotFound
from vmctl.nodedoc import PowerState


def need(h: Any, *caps: Capability) -> None:
    missing = [c.value for c in caps if c not in h.backend.capabilities()]
    if missing:
        pytest.skip(f"backend lacks {', '.join(missing)}")


def vm(h: Any, name: str) -> Any:
    found = [v for v in h.backend.list_vms() if v.name == name]
    return found[0] if found else None


def up(h: Any, name: str) -> None:
    h.backend.define(h.spec(name))
    h.backend.start(name)


def test_capabilities_and_host_info(harness: Any) -> None:
    caps = harness.backend.capabilities()
    assert isinstance(caps, frozenset) and all(isinstance(c, Capability) for c in caps)
    info = harness.backend.host_info()
    assert isinstance(info, HostInfo)
    assert info.cores >= 1 and info.memory_mib > 0 and info.hostname
    assert 0.0 <= info.utilization <= 1.0


def test_define_is_idempotent_and_keeps_metadata(harness: Any) -> None:
    need(harness, Capability.DEFINE)
    spec = harness.spec("ct-def")
    harness.backend.define(spec)
    harness.backend.define(spec)
    v = vm(harness, "ct-def")
    assert v is not None and v.power is PowerState.SHUTOFF
    for k, val in spec.metadata.items():
        assert v.metadata.get(k) == val
    assert [x.name for x in harness.backend.list_vms()].count("ct-def") == 1


def test_start_and_stop_are_idempotent(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE)
    up(harness, "ct-life")
    harness.backend.start("ct-life")
    assert vm(harness, "ct-life").power is PowerState.RUNNING
    harness.backend.stop("ct-life")
    harness.backend.stop("ct-life")
    assert vm(harness, "ct-life").power is PowerState.SHUTOFF
    harness.backend.undefine("ct-life")
    assert vm(harness, "ct-life") is None


@pytest.mark.parametrize("op", ["start", "stop", "suspend", "resume", "pin", "tune", "undefine", "checkpoint"])
def test_unknown_vm_is_vm_not_found(harness: Any, op: str, tmp_path: Path) -> None:
    b = harness.backend
    calls = {
        "start": (Capability.LIFECYCLE, lambda: b.start("ct-nope")),
        "stop": (Capability.LIFECYCLE, lambda: b.stop("ct-nope")),
        "suspend": (Capability.SUSPEND, lambda: b.suspend("ct-nope")),
        "resume": (Capability.SUSPEND, lambda: b.resume("ct-nope")),
        "pin": (Capability.PIN, lambda: b.pin_vcpus("ct-nope", (0,))),
        "tune": (Capability.CPU_WEIGHT, lambda: b.set_cpu_tune("ct-nope", weight=5)),
        "undefine": (Capability.DEFINE, lambda: b.undefine("ct-nope")),
        "checkpoint": (Capability.CHECKPOINT, lambda: b.checkpoint("ct-nope", str(tmp_path / "x.img"))),
    }
    cap, call = calls[op]
    need(harness, cap)
    with pytest.raises(VmNotFound) as ei:
        call()
    assert not ei.value.retryable and "ct-nope" in str(ei.value)


def test_suspend_and_resume(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.SUSPEND)
    up(harness, "ct-sus")
    harness.backend.suspend("ct-sus")
    harness.backend.suspend("ct-sus")
    assert vm(harness, "ct-sus").power is PowerState.PAUSED
    harness.backend.resume("ct-sus")
    harness.backend.resume("ct-sus")
    assert vm(harness, "ct-sus").power is PowerState.RUNNING
    harness.backend.stop("ct-sus")


def test_pinning_live_and_out_of_range(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.PIN)
    cores = harness.backend.host_info().cores
    up(harness, "ct-pin")
    last = cores - 1
    harness.backend.pin_vcpus("ct-pin", (last,))
    harness.backend.pin_vcpus("ct-pin", (last,))
    assert vm(harness, "ct-pin").pinned_cores == (last,)
    with pytest.raises(OutOfRange):
        harness.backend.pin_vcpus("ct-pin", (cores + 7,))
    with pytest.raises(UserError):
        harness.backend.pin_vcpus("ct-pin", (0, 0))  # two cores for one VCPU
    assert vm(harness, "ct-pin").pinned_cores == (last,)
    assert vm(harness, "ct-pin").power is PowerState.RUNNING
    harness.backend.stop("ct-pin")


def test_weight_live_and_out_of_range(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.CPU_WEIGHT)
    up(harness, "ct-w")
    for w in (WEIGHT_MAX, WEIGHT_MIN, 5000):
        harness.backend.set_cpu_tune("ct-w", weight=w)
        assert vm(harness, "ct-w").weight == w
    for bad in (0, WEIGHT_MAX + 1, -3):
        with pytest.raises(OutOfRange):
            harness.backend.set_cpu_tune("ct-w", weight=bad)
    assert vm(harness, "ct-w").weight == 5000
    assert vm(harness, "ct-w").power is PowerState.RUNNING  # live: never a restart
    harness.backend.stop("ct-w")


def test_cap_set_clear_and_out_of_range(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.CPU_CAP)
    up(harness, "ct-cap")
    harness.backend.set_cpu_tune("ct-cap", cap=0.25)
    assert vm(harness, "ct-cap").cap == pytest.approx(0.25, abs=1e-3)
    harness.backend.set_cpu_tune("ct-cap", weight=None, cap=None)  # leaves the cap alone
    assert vm(harness, "ct-cap").cap == pytest.approx(0.25, abs=1e-3)
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(OutOfRange):
            harness.backend.set_cpu_tune("ct-cap", cap=bad)
    assert vm(harness, "ct-cap").cap == pytest.approx(0.25, abs=1e-3)
    harness.backend.set_cpu_tune("ct-cap", clear_cap=True)
    assert vm(harness, "ct-cap").cap is None
    harness.backend.stop("ct-cap")


def test_checkpoint_and_restore(harness: Any, tmp_path: Path) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.CHECKPOINT)
    up(harness, "ct-ck")
    path = str(tmp_path / "ct-ck.img")
    harness.backend.checkpoint("ct-ck", path)
    assert os.path.getsize(path) > 0
    v = vm(harness, "ct-ck")
    assert v is None or v.power in (PowerState.SAVED, PowerState.SHUTOFF)
    assert harness.backend.restore(path) == "ct-ck"
    assert vm(harness, "ct-ck").power is PowerState.RUNNING
    harness.backend.stop("ct-ck")


def test_checkpoint_of_a_stopped_vm_fails_cleanly(harness: Any, tmp_path: Path) -> None:
    need(harness, Capability.DEFINE, Capability.CHECKPOINT)
    harness.backend.define(harness.spec("ct-ck2"))
    with pytest.raises(VmctlError):
        harness.backend.checkpoint("ct-ck2", str(tmp_path / "never.img"))
    assert vm(harness, "ct-ck2").power is PowerState.SHUTOFF


def test_restore_of_a_missing_file_fails_cleanly(harness: Any, tmp_path: Path) -> None:
    need(harness, Capability.CHECKPOINT)
    with pytest.raises(HypervisorError):
        harness.backend.restore(str(tmp_path / "missing.img"))


def test_lifecycle_events(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.EVENTS)
    got: list[BackendEvent] = []
    seen = threading.Event()

    def cb(ev: BackendEvent) -> None:
        if ev.vm == "ct-ev":
            got.append(ev)
            if ev.kind == "stopped":
                seen.set()

    harness.backend.subscribe(cb)
    up(harness, "ct-ev")
    harness.backend.stop("ct-ev")
    for _ in range(600):  # up to a minute on a real host (events come from libvirt's event thread)
        if seen.wait(0.05):
            break
        harness.wait(0.05)
    kinds = [e.kind for e in got]
    assert "started" in kinds and "stopped" in kinds
    assert kinds.index("started") < kinds.index("stopped")


def test_cpu_time_grows_for_a_busy_vm(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.CPU_STATS)
    if not getattr(harness, "cpu_stats_real", False) or harness.busy_spec("ct-busy") is None:
        pytest.skip("this backend reports no real CPU time")
    harness.backend.define(harness.busy_spec("ct-busy"))
    harness.backend.start("ct-busy")
    getattr(harness, "make_busy", lambda name: None)("ct-busy")
    t0 = vm(harness, "ct-busy").cpu_time_s
    t1 = t0
    for _ in range(120):  # a spinning guest gains CPU time; on a loaded host it may take a while (up to a minute)
        harness.wait(0.5)
        t1 = vm(harness, "ct-busy").cpu_time_s
        if t1 - t0 >= 0.3:
            break
    assert t1 - t0 >= 0.3
    harness.backend.stop("ct-busy")


def test_live_migration_moves_the_running_vm(harness: Any) -> None:
    need(harness, Capability.DEFINE, Capability.LIFECYCLE, Capability.MIGRATION)
    if harness.peer is None:
        pytest.skip("no second host for this backend")
    up(harness, "ct-mig")
    harness.backend.start_migration("ct-mig", harness.peer_uri, harness.migrate_uri)
    state = MigrationState.RUNNING
    for _ in range(600):
        state = harness.backend.migration_status("ct-mig").state
        if state is not MigrationState.RUNNING:
            break
        harness.wait(0.1)
    assert state is MigrationState.COMPLETED
    assert vm(harness, "ct-mig") is None or vm(harness, "ct-mig").power is not PowerState.RUNNING
    on_peer = [v for v in harness.peer.list_vms() if v.name == "ct-mig"]
    assert on_peer and on_peer[0].power is PowerState.RUNNING
    harness.peer.stop("ct-mig")


def test_unsupported_operations_raise_operation_not_supported(harness: Any, tmp_path: Path) -> None:
    b = harness.backend
    caps = b.capabilities()
    if Capability.DEFINE in caps and Capability.LIFECYCLE in caps:
        up(harness, "ct-uns")
    probes = {
        Capability.SUSPEND: lambda: b.suspend("ct-uns"),
        Capability.PIN: lambda: b.pin_vcpus("ct-uns", (0,)),
        Capability.CPU_WEIGHT: lambda: b.set_cpu_tune("ct-uns", weight=10),
        Capability.CPU_CAP: lambda: b.set_cpu_tune("ct-uns", cap=0.5),
        Capability.CHECKPOINT: lambda: b.checkpoint("ct-uns", str(tmp_path / "u.img")),
        Capability.MIGRATION: lambda: b.start_migration("ct-uns", "mock://nowhere"),
        Capability.EVENTS: lambda: b.subscribe(lambda ev: None),
    }
    missing = [c for c in probes if c not in caps]
    if not missing:
        pytest.skip("backend supports every probed operation")
    for cap in missing:
        with pytest.raises(OperationNotSupported) as ei:
            probes[cap]()
        assert not ei.value.retryable
