"""VCSCHED caps on real libvirt: the virtual-cluster controller's desired state, reconciled by the
agent through the libvirt backend, lands as each shared VM's CFS quota (``vcpu_quota`` /
``vcpu_period`` in libvirt's scheduler parameters), and a workload change re-caps the running VMs
live. One node (the system libvirtd, TCG guests that idle: only the parameters are checked here;
cap accuracy under load is measured by test_libvirt_tiers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PREFIX, cleanup, vcpu_cap
from vmctl.model import PowerState
from vmctl.vcsched_controller import VcRequest, VcschedController

pytestmark = pytest.mark.libvirt


@pytest.fixture
def agent(system_host: Any, images: Path) -> Iterator[tuple[Any, Any, Any]]:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    from vmctl.agents.layout import Layout
    from vmctl.agents.reconciler import Reconciler
    from vmctl.agents.sources import MemoryReporter, MemorySource

    backend = LibvirtBackend("qemu:///system", domain_type="qemu")
    node = f"{PREFIX}vc"
    source = MemorySource()
    layout = Layout(node, (backend.host_info().cores - 1,), image=str(images / "idle.img"), memory_mib=32)
    rec = Reconciler(backend, layout, source, MemoryReporter())
    try:
        yield backend, rec, source
    finally:
        cleanup(backend)
        backend.close()


def _converge(rec: Any, rounds: int = 3) -> Any:
    """Reconcile until the host matches the desired state (or ``rounds`` passes); no pass may fail."""
    for _ in range(rounds):
        res = rec.run_once()
        assert not res.errors, res.errors
        if res.converged:
            break
    return res


def test_controller_caps_reach_libvirt(agent: tuple[Any, Any, Any]) -> None:
    backend, rec, source = agent
    node = rec.layout.host
    ctl = VcschedController([node], algorithm="mcb8", node_memory_mib=128, vm_prefix=f"{PREFIX}vc-")
    ctl.submit(VcRequest("a", 2, 0.6, 0.25))
    ctl.submit(VcRequest("b", 1, 0.3, 0.25))
    alloc = ctl.run_once()
    # one host, needs 0.6 + 0.6 + 0.3 = 1.5: everything at yield 1/1.5
    assert alloc.min_yield == pytest.approx(1 / 1.5)
    source.set(ctl.desired(node))
    res = _converge(rec)
    assert res.converged
    vms = {v.name: v for v in backend.list_vms()}
    want = {f"{PREFIX}vc-a-0": 0.4, f"{PREFIX}vc-a-1": 0.4, f"{PREFIX}vc-b-0": 0.2}
    for name, cap in want.items():
        assert vms[name].power is PowerState.RUNNING
        assert vms[name].cap == pytest.approx(cap, abs=1e-3)
        assert vcpu_cap("qemu:///system", name) == pytest.approx(cap, abs=1e-3)
    # the workload changes: cluster b leaves, a now needs 0.5 per VM -> both at full need, re-capped live
    ctl.remove("b")
    ctl.update(VcRequest("a", 2, 0.5, 0.25))
    alloc = ctl.run_once()
    assert alloc.min_yield == 1.0
    source.set(ctl.desired(node))
    res = _converge(rec)
    names = {v.name for v in backend.list_vms() if v.power is PowerState.RUNNING}
    assert f"{PREFIX}vc-b-0" not in names
    for name in (f"{PREFIX}vc-a-0", f"{PREFIX}vc-a-1"):
        assert vcpu_cap("qemu:///system", name) == pytest.approx(0.5, abs=1e-3)
