"""The node agent's Reconciler driving the real libvirt backend: it builds the two-tier layout
(fg + bg pinned per core), and an agent that dies in the middle of a reconcile is replaced by a new
one (new process, new connection) that finishes the job without touching what was already right:
no guest restarted, no redundant action."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PREFIX, cleanup
from tests.support.agents import swap_tiers
from tests.support.libvirt import domain_id
from vmctl.agents.layout import META_MANAGED, META_NODE, Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.nodedoc import PowerState

pytestmark = pytest.mark.libvirt


class AgentDied(BaseException):
    """Stands for the agent process being killed (not a VmctlError: nothing catches it)."""


@pytest.fixture
def agent_backend(system_host: Any) -> Iterator[Any]:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    b = LibvirtBackend("qemu:///system", domain_type="qemu")
    try:
        yield b
    finally:
        cleanup(b)
        b.close()


def _fresh_backend() -> Any:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    return LibvirtBackend("qemu:///system", domain_type="qemu")


def test_restart_mid_reconcile_changes_nothing_already_right(agent_backend: Any, images: Path) -> None:
    layout = Layout(host=f"{PREFIX}agent", cores=(0, 1), memory_mib=32, image=str(images / "idle.img"))
    source = MemorySource(layout.base_desired(1))
    first = Reconciler(agent_backend, layout, source, MemoryReporter(), max_passes=6)
    res = first.run_once()
    assert res.converged, res.errors
    vms = {v.name: v for v in agent_backend.list_vms() if v.name.startswith(layout.host)}
    assert len(vms) == 4 and all(v.power is PowerState.RUNNING for v in vms.values())
    for core in (0, 1):
        fg, bg = vms[layout.vm_name(core, "fg")], vms[layout.vm_name(core, "bg")]
        assert fg.pinned_cores == bg.pinned_cores == (core,)
        assert fg.weight == layout.fg_weight and bg.weight == layout.bg_weight
        for v in (fg, bg):  # adoptable after a restart: the domain XML carries the layout's metadata
            assert v.metadata[META_NODE] == layout.host and v.metadata[META_MANAGED] == "1"
    ids = {n: domain_id(agent_backend, n) for n in vms}

    # promote on core 0 (weight swap); the agent dies after the first of the two tunes
    source.set(swap_tiers(source.fetch() or layout.base_desired(1), core=0))
    real_tune = agent_backend.set_cpu_tune
    calls: list[str] = []

    def dying_tune(name: str, weight: int | None = None, cap: float | None = None, clear_cap: bool = False) -> None:
        if calls:
            raise AgentDied(name)
        calls.append(name)
        real_tune(name, weight=weight, cap=cap, clear_cap=clear_cap)

    agent_backend.set_cpu_tune = dying_tune
    with pytest.raises(AgentDied):
        first.run_once()
    assert len(calls) == 1

    # the restarted agent: new backend connection, new reconciler, same desired state
    backend2 = _fresh_backend()
    try:
        second = Reconciler(backend2, layout, source, MemoryReporter(), max_passes=6)
        res = second.run_once()
        assert res.converged, res.errors
        kinds = [a.kind for a in res.applied]
        assert kinds == ["tune"], f"the restarted agent did more than the missing tune: {res.applied}"
        assert res.applied[0].vm != calls[0]
        after = {v.name: v for v in backend2.list_vms() if v.name.startswith(layout.host)}
        assert {n: domain_id(backend2, n) for n in after} == ids, "a guest was restarted"
        assert after[layout.vm_name(0, "fg")].weight == layout.bg_weight  # swapped
        assert after[layout.vm_name(0, "bg")].weight == layout.fg_weight
        # and a third agent finds nothing to do at all
        third = Reconciler(_fresh_backend(), layout, source, MemoryReporter())
        try:
            res3 = third.run_once()
            assert res3.converged and res3.applied == ()
        finally:
            third.backend.close()
    finally:
        backend2.close()
