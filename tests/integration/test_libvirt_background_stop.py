"""On real libvirt the agent's forced stops run off its reconcile pass: while a destroy is held back
(the real backend's stop waits for the test's word before it calls libvirt), the pass goes on over the
same connection -- the other core's tiers are swapped -- and the VM is reported ``stopping``; then the
real destroy runs and the next pass removes the domain. An agent that dies right after it asked libvirtd
for the destroy leaves the domain to the next agent, whose stop and undefine finish it (libvirt's destroy
of a domain already being destroyed is no error), and no domain is left behind."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PREFIX, cleanup
from tests.support.agents import swap_tiers
from vmctl.agents.layout import Layout
from vmctl.agents.plan import Stop
from vmctl.agents.reconciler import Reconciler, ReconcileResult
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.nodedoc import NodeDesired, PowerState, VmDesired, VmRole

pytestmark = pytest.mark.libvirt

BOUND_S = 120.0


def _backend() -> Any:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    return LibvirtBackend("qemu:///system", domain_type="qemu")


@pytest.fixture
def lv(system_host: Any) -> Iterator[Any]:
    b = _backend()
    try:
        yield b
    finally:
        cleanup(b)
        b.close()


def _job_takes_bg0(layout: Layout, generation: int, swap_core: int | None = None) -> NodeDesired:
    """A job VM takes core 0's bg slot: that placeholder is stopped and removed."""
    d = layout.base_desired(generation)
    if swap_core is not None:
        d = swap_tiers(d, core=swap_core, generation=generation)
    bg0 = layout.vm_name(0, "bg")
    job = VmDesired(name=f"{PREFIX}j1-r1-p0", core=0, role=VmRole.BG, weight=layout.bg_weight)
    return replace(d, vms=(*[v for v in d.vms if v.name != bg0], job))


def _until_converged(rec: Reconciler) -> ReconcileResult:
    deadline = time.monotonic() + BOUND_S
    while True:
        res = rec.run_once()
        if res.converged and not rec.stops_under_way():
            return res
        assert time.monotonic() < deadline, f"not converged within {BOUND_S:.0f} s: {res.errors}"
        deadline_stop = time.monotonic() + BOUND_S
        while rec.stops_under_way() and time.monotonic() < deadline_stop:
            time.sleep(0.05)


def test_a_held_destroy_does_not_hold_the_pass(lv: Any, images: Path) -> None:
    layout = Layout(host=f"{PREFIX}bgstop", cores=(0, 1), memory_mib=32, image=str(images / "idle.img"))
    source, reporter = MemorySource(layout.base_desired(1)), MemoryReporter()
    rec = Reconciler(lv, layout, source, reporter, max_passes=6)
    assert rec.background_stops  # libvirt's stops are slow ones
    assert rec.run_once().converged
    bg0 = layout.vm_name(0, "bg")
    lv.suspend(bg0)  # as an inactive row's VM: the case that took 27-47 s in the gang runs
    release, entered = threading.Event(), threading.Event()
    real_stop = lv.stop

    def held_stop(name: str, force: bool = True) -> None:
        if name == bg0:
            entered.set()
            assert release.wait(BOUND_S)
        real_stop(name, force)

    lv.stop = held_stop
    try:
        source.set(_job_takes_bg0(layout, 2, swap_core=1))
        out: list[ReconcileResult] = []
        t = threading.Thread(target=lambda: out.append(rec.run_once()), daemon=True)
        t.start()
        t.join(BOUND_S)
        assert out, "the reconcile cycle waited for the held destroy"
        res = out[0]
        assert entered.is_set() and Stop(bg0) in res.applied and not res.converged
        have = {v.name: v for v in lv.list_vms() if v.name.startswith(layout.host)}
        assert have[layout.vm_name(1, "bg")].weight == layout.fg_weight  # core 1 swapped meanwhile
        assert have[layout.vm_name(1, "fg")].weight == layout.bg_weight
        assert have[bg0].power is PowerState.PAUSED
        seen = next(v for v in reporter.last.vms if v.name == bg0) if reporter.last else None
        assert seen is not None and seen.stopping and seen.power is PowerState.PAUSED
    finally:
        release.set()
    res = _until_converged(rec)
    assert not res.errors, res.errors
    names = {v.name for v in lv.list_vms()}
    assert bg0 not in names and f"{PREFIX}j1-r1-p0" in names
    assert res.observed is not None and res.observed.generation_applied == 2


def test_a_destroy_an_agent_left_is_finished_by_the_next(lv: Any, images: Path) -> None:
    layout = Layout(host=f"{PREFIX}bgkill", cores=(0,), memory_mib=32, image=str(images / "idle.img"))
    source = MemorySource(layout.base_desired(1))
    rec = Reconciler(lv, layout, source, MemoryReporter(), max_passes=6)
    assert rec.run_once().converged
    bg0 = layout.vm_name(0, "bg")
    lv.suspend(bg0)
    source.set(_job_takes_bg0(layout, 2))
    res = rec.run_once()  # the destroy is asked for on its thread; this agent is then "killed"
    assert Stop(bg0) in res.applied
    second = _backend()
    try:
        again = Reconciler(second, layout, source, MemoryReporter(), max_passes=6)
        res = _until_converged(again)
        assert not [e for e in res.errors if "stop" in e], res.errors
        assert bg0 not in {v.name for v in second.list_vms()}
    finally:
        rec.wait_stops(BOUND_S)  # the first agent's thread: its destroy ended one way or the other
        second.close()
    assert bg0 not in {v.name for v in lv.list_vms()}
