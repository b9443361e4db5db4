"""An agent with L = 3 VM levels per core on a real hypervisor (TCG guests on the system libvirtd).

Timeslice (gang rows): the Reconciler builds one VM per (core, row); only the active row runs, at the
highest weight, and the other rows' VMs are paused at the lowest (the ``cpu_shares`` libvirt holds
are checked directly, and the guests' in-memory counters show that a paused row does not run).
Switching the row resumes the new row and pauses the old one, live (no guest restarted). Priority with
3 levels gets three falling weights (10000, 100, 1) in ``cpu_shares``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import PREFIX, cleanup, counter, wait_counter_above
from tests.support.libvirt import domain_id
from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.model import Discipline
from vmctl.nodedoc import PowerState

pytestmark = pytest.mark.libvirt

URI = "qemu:///system"


@pytest.fixture
def backend(system_host: Any) -> Iterator[Any]:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    b = LibvirtBackend(URI, domain_type="qemu")
    try:
        if b.host_info().cores < 2:
            pytest.skip("needs 2 host cores")
        yield b
    finally:
        cleanup(b)
        b.close()


def _shares(name: str) -> int:
    """The ``cpu_shares`` libvirt holds for a domain (what it wrote into the cgroup)."""
    import libvirt

    conn = libvirt.open(URI)
    try:
        return int(conn.lookupByName(name).schedulerParameters()["cpu_shares"])
    finally:
        conn.close()


def _mine(b: Any, layout: Layout) -> dict[str, Any]:
    return {v.name: v for v in b.list_vms() if v.name.startswith(layout.host)}


def test_timeslice_three_rows_only_the_active_row_runs(backend: Any, images: Path) -> None:
    from vmctl.agents.backends.libvirt.tuning import weight_to_shares

    # idle guests (their counters tick at 18.2 Hz while they run): six spinning TCG guests would starve a
    # small, shared test machine
    layout = Layout(host=f"{PREFIX}ts", cores=(0, 1), memory_mib=32, image=str(images / "idle.img"), levels=3,
                    discipline=Discipline.TIMESLICE)
    rec = Reconciler(backend, layout, MemorySource(None), MemoryReporter(), max_passes=6)
    res = rec.run_once()
    assert res.converged, res.errors

    def check(active: int) -> None:
        vms = _mine(backend, layout)
        assert sorted(vms) == sorted(layout.vm_name(k, r) for k in range(2) for r in range(3))
        for k in range(2):
            for r in range(3):
                v = vms[layout.vm_name(k, r)]
                power, weight = (PowerState.RUNNING, WEIGHT_MAX) if r == active else (PowerState.PAUSED, WEIGHT_MIN)
                assert (v.power, v.weight, v.pinned_cores) == (power, weight, (k,)), v
                assert _shares(v.name) == weight_to_shares(weight, backend.cgroup)
                assert v.metadata["vmctl.level"] == str(r)

    check(0)
    ids = {n: domain_id(backend, n) for n in _mine(backend, layout)}
    row0, row2 = layout.vm_name(0, 0), layout.vm_name(0, 2)
    c0 = wait_counter_above(backend, row0, 0)  # the active row runs
    before2 = counter(backend, row2)
    time.sleep(0.5)
    assert counter(backend, row2) == before2, "a paused row ran"

    rec.switch_row(2)
    res = rec.run_once()
    assert res.converged, res.errors
    check(2)
    wait_counter_above(backend, row2, before2)  # the new row runs ...
    held = counter(backend, row0)
    assert held >= c0
    time.sleep(0.5)
    assert counter(backend, row0) == held, "row 0 ran after it was switched out"  # ... and the old one is held
    assert {n: domain_id(backend, n) for n in _mine(backend, layout)} == ids, "a row switch restarted a guest"


def test_priority_three_levels_get_falling_shares(backend: Any, images: Path) -> None:
    from vmctl.agents.backends.libvirt.tuning import weight_to_shares

    layout = Layout(host=f"{PREFIX}pr", cores=(1,), memory_mib=32, image=str(images / "idle.img"), levels=3)
    rec = Reconciler(backend, layout, MemorySource(None), MemoryReporter(), max_passes=6)
    res = rec.run_once()
    assert res.converged, res.errors
    vms = _mine(backend, layout)
    weights = [vms[layout.vm_name(0, lvl)].weight for lvl in range(3)]
    assert weights == [10000, 100, 1]
    shares = [_shares(layout.vm_name(0, lvl)) for lvl in range(3)]
    assert shares == [weight_to_shares(w, backend.cgroup) for w in weights] and shares[0] > shares[1] > shares[2]
    assert all(v.power is PowerState.RUNNING and v.pinned_cores == (1,) for v in vms.values())
