"""Checkpoint (save to a path) and restore on real QEMU: the guest's in-memory counter keeps going,
pinning and tuning survive, and bad paths fail with vmctl errors."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import counter, spawn, wait_counter_above, wait_counting
from tests.support.libvirt import domain_id, scheduler_parameters
from vmctl.errors import HypervisorError, ValidationError, VmStateError
from vmctl.nodedoc import PowerState

pytestmark = pytest.mark.libvirt


def test_checkpoint_then_restore_keeps_the_guest_running(qemu: Any, images: Path, tmp_path: Path) -> None:
    name = spawn(qemu, "ckpt", images / "spin.img", 0, weight=5000, cap=0.75)
    before = wait_counter_above(qemu, name, wait_counting(qemu, name))  # counting for a while
    path = tmp_path / "ckpt.save"
    t0 = time.monotonic()
    qemu.checkpoint(name, str(path))
    save_s = time.monotonic() - t0
    assert path.stat().st_size > 0
    v = {x.name: x for x in qemu.list_vms()}[name]
    assert v.power is PowerState.SAVED
    with pytest.raises(VmStateError):
        qemu.checkpoint(name, str(tmp_path / "again.save"))  # not running any more
    t0 = time.monotonic()
    assert qemu.restore(str(path)) == name
    restore_s = time.monotonic() - t0
    after = counter(qemu, name)
    # a reboot would have reset the counter to 0; a restore continues from where it was saved
    assert after >= before, f"counter went back from {before} to {after}: the guest rebooted"
    wait_counter_above(qemu, name, after)  # the restored guest runs
    v = {x.name: x for x in qemu.list_vms()}[name]
    assert v.power is PowerState.RUNNING and v.pinned_cores == (0,)
    assert v.weight == 5000 and v.cap == pytest.approx(0.75)
    with pytest.raises(VmStateError):
        qemu.restore(str(path))  # already running
    print(f"save {save_s:.2f} s, restore {restore_s:.2f} s, file {path.stat().st_size} bytes")
    qemu.stop(name)
    qemu.undefine(name)


def test_bad_checkpoint_paths(qemu: Any, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="checkpoint path"):
        qemu.restore("relative/file.save")
    with pytest.raises(HypervisorError, match="no checkpoint file"):
        qemu.restore(str(tmp_path / "missing.save"))
    garbage = tmp_path / "garbage.save"
    garbage.write_bytes(b"not a libvirt save image" * 10)
    with pytest.raises(HypervisorError) as info:
        qemu.restore(str(garbage))
    assert info.value.__cause__ is not None  # the libvirt error is chained


def test_pinning_and_tuning_are_live_and_persistent(qemu: Any, images: Path) -> None:
    name = spawn(qemu, "persist", images / "idle.img", 0, weight=100)
    dom_id = domain_id(qemu, name)
    qemu.pin_vcpus(name, (1,))
    qemu.set_cpu_tune(name, weight=9000, cap=0.25)
    live = {x.name: x for x in qemu.list_vms()}[name]
    assert (live.pinned_cores, live.weight, live.cap) == ((1,), 9000, 0.25)
    assert domain_id(qemu, name) == dom_id  # applied live, no restart
    qemu.stop(name)  # the persistent definition must carry the same
    cold = {x.name: x for x in qemu.list_vms()}[name]
    assert cold.power is PowerState.SHUTOFF
    assert (cold.pinned_cores, cold.weight, cold.cap) == ((1,), 9000, 0.25)
    qemu.set_cpu_tune(name, clear_cap=True)  # and a change while it is off applies at the next start
    qemu.start(name)
    again = {x.name: x for x in qemu.list_vms()}[name]
    assert (again.pinned_cores, again.weight, again.cap) == ((1,), 9000, None)
    assert scheduler_parameters(qemu, name)["vcpu_quota"] < 0
    qemu.stop(name)
    qemu.undefine(name)
