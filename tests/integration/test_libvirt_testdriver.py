"""The libvirt backend against libvirt's in-process test driver (``test:///default``): no daemon is
needed, so these run in every test run. Lifecycle events, adoption by metadata, error translation
with the cause chained, and capabilities() matching what raises OperationNotSupported."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vmctl.agents.backends.base import BackendEvent, Capability, VmSpec
from vmctl.errors import HypervisorUnavailable, OperationNotSupported, ValidationError, VmNotFound, VmStateError
from vmctl.nodedoc import PowerState

NAME = "td-vm"


@pytest.fixture
def td() -> Iterator[Any]:
    try:
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError as exc:
        pytest.skip(f"libvirt-python is not installed: {exc}")
    b = LibvirtBackend("test:///default")
    try:
        yield b
    finally:
        for v in b.list_vms():
            if v.name.startswith("td-"):
                b.stop(v.name)
                b.undefine(v.name)
        b.close()


def test_lifecycle_events_in_order(td: Any, tmp_path: Path) -> None:
    got: list[BackendEvent] = []
    done = threading.Event()

    def cb(ev: BackendEvent) -> None:
        if ev.vm == NAME:
            got.append(ev)
            if ev.kind == "undefined":
                done.set()

    td.subscribe(cb)
    td.define(VmSpec(name=NAME))
    td.start(NAME)
    td.suspend(NAME)
    td.resume(NAME)
    td.checkpoint(NAME, str(tmp_path / "td.save"))
    td.restore(str(tmp_path / "td.save"))
    td.stop(NAME)
    td.undefine(NAME)
    assert done.wait(5.0), f"events so far: {got}"
    assert [e.kind for e in got] == [
        "defined", "started", "suspended", "resumed", "saved", "restored", "stopped", "undefined",
    ]


def test_a_new_backend_adopts_vms_by_metadata(td: Any) -> None:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    td.define(VmSpec(name="td-adopt", metadata={"vmctl.node": "n1", "vmctl.role": "fg"}))
    td.start("td-adopt")
    td.pin_vcpus("td-adopt", (2,))
    again = LibvirtBackend("test:///default")  # an agent restart: a new connection, no memory
    try:
        v = {x.name: x for x in again.list_vms()}["td-adopt"]
        assert v.metadata == {"vmctl.node": "n1", "vmctl.role": "fg"}
        assert v.power is PowerState.RUNNING and v.pinned_cores == (2,)
    finally:
        again.close()


def test_redefine_keeps_pinning_and_updates_metadata(td: Any) -> None:
    td.define(VmSpec(name="td-re", metadata={"a": "1"}))
    td.start("td-re")
    td.pin_vcpus("td-re", (1,))
    td.define(VmSpec(name="td-re", metadata={"a": "2"}))
    v = {x.name: x for x in td.list_vms()}["td-re"]
    assert v.power is PowerState.RUNNING and v.pinned_cores == (1,)
    td.stop("td-re")
    v = {x.name: x for x in td.list_vms()}["td-re"]
    assert v.metadata == {"a": "2"}


def test_errors_are_translated_with_the_cause_chained(td: Any) -> None:
    with pytest.raises(VmNotFound) as info:
        td.start("td-missing")
    assert type(info.value.__cause__).__name__ == "libvirtError"
    assert "td-missing" in str(info.value) and not info.value.retryable
    td.define(VmSpec(name="td-err"))
    with pytest.raises(VmStateError):
        td.suspend("td-err")  # not running
    td.start("td-err")
    with pytest.raises(VmStateError):
        td.undefine("td-err")  # running
    td.suspend("td-err")
    with pytest.raises(VmStateError):
        td.start("td-err")  # paused: resume it instead
    td.resume("td-err")
    with pytest.raises(ValidationError, match=r"vm\.name"):
        td.define(VmSpec(name="bad/name"))


def test_capabilities_match_operation_not_supported(td: Any) -> None:
    caps = td.capabilities()
    assert Capability.CPU_WEIGHT not in caps and Capability.CPU_CAP not in caps
    assert Capability.MIGRATION not in caps and Capability.PIN in caps and Capability.CHECKPOINT in caps
    td.define(VmSpec(name="td-ns"))
    td.start("td-ns")
    probes = {
        Capability.CPU_WEIGHT: lambda: td.set_cpu_tune("td-ns", weight=100),
        Capability.CPU_CAP: lambda: td.set_cpu_tune("td-ns", cap=0.5),
        Capability.MIGRATION: lambda: td.start_migration("td-ns", "test:///default"),
    }
    for cap, call in probes.items():
        with pytest.raises(OperationNotSupported) as info:
            call()
        assert cap.value.split("_")[-1] in str(info.value) or "migration" in str(info.value)
    with pytest.raises(OperationNotSupported):
        td.migration_status("td-ns")
    with pytest.raises(OperationNotSupported):
        td.abort_migration("td-ns")


def test_cpu_stats_are_read(td: Any) -> None:
    td.define(VmSpec(name="td-cpu"))
    td.start("td-cpu")
    v = {x.name: x for x in td.list_vms()}["td-cpu"]
    assert v.cpu_time_s > 0  # the test driver's (fixed) numbers come through getCPUStats
    assert td.host_info().hypervisor == "test" and td.host_info().cores == 8


@pytest.mark.parametrize(
    ("uri", "error"),
    [
        ("lxc:///system", ValidationError),  # not a hypervisor vmctl drives
        ("qemu+unix:///system?socket=/nonexistent/vmctl-no-daemon", HypervisorUnavailable),
        ("xen:///system", HypervisorUnavailable),  # no Xen host here
    ],
)
def test_unusable_uris_fail_with_vmctl_errors(uri: str, error: type[Exception]) -> None:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    t0 = time.monotonic()
    with pytest.raises(error) as info:
        LibvirtBackend(uri)
    assert time.monotonic() - t0 < 10
    if error is HypervisorUnavailable:
        assert info.value.retryable and uri in str(info.value)


@pytest.mark.parametrize(("mode", "usable"), [(0o20600, False), (0o20660, True), (0o20666, True), (0o20640, False)])
def test_kvm_device_usable(mode: int, usable: bool) -> None:
    from vmctl.agents.backends.libvirt.backend import kvm_device_usable

    assert kvm_device_usable(mode) is usable
