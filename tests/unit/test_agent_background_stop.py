"""A forced stop runs off the reconcile pass (libvirt's destroy of a starved guest took 46-89 s on this
machine, ``python -m bench.libvirt_stop``): while the mock backend's stop is held (fault injection:
``Hold``), the agent's passes go on -- other VMs' changes are applied and reports sent -- the VM is
reported ``stopping``, nothing is stopped twice, no other VM of its core is raised to its weight, and
the generation is not applied until the VM is gone. An agent killed during such a stop leaves the VM to
the next agent, which stops and removes it."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from tests.support.agents import swap_tiers
from vmctl.agents.backends.mock import Hold, MockBackend, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.plan import Observed, Stop, Tune, Undefine, plan
from vmctl.agents.reconciler import Reconciler, ReconcileResult
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.nodedoc import NodeDesired, NodeObserved, PowerState, ProcessSpec, VmDesired, VmObserved, VmRole

LAYOUT = Layout("n1", (0, 1))
FG0 = LAYOUT.vm_name(0, "fg")
JOB = "j1-r1-p0"
BOUND_S = 60.0  # generous: a pass that waits for the held stop never returns within it


def gen2() -> NodeDesired:
    """A job VM takes core 0's fg slot (its placeholder is stopped and removed) and core 1's tiers swap."""
    d = swap_tiers(LAYOUT.base_desired(2), core=1, generation=2)
    job = VmDesired(name=JOB, core=0, role=VmRole.FG, weight=LAYOUT.fg_weight,
                    process=ProcessSpec(job_id="1", index=0, work_seconds=1e6))
    return replace(d, vms=(*[v for v in d.vms if v.name != FG0], job))


def run_bounded(rec: Reconciler) -> ReconcileResult:
    """One cycle on a thread; fails (instead of hanging) when the cycle waits for the held stop."""
    out: list[ReconcileResult] = []
    t = threading.Thread(target=lambda: out.append(rec.run_once()), daemon=True)
    t.start()
    t.join(BOUND_S)
    assert out, f"the reconcile cycle did not return within {BOUND_S:.0f} s: it waits for the stop"
    return out[0]


def vm(o: NodeObserved | None, name: str) -> VmObserved:
    assert o is not None
    return next(v for v in o.vms if v.name == name)


def wait_no_stop(rec: Reconciler) -> None:
    deadline = time.monotonic() + BOUND_S
    while rec.stops_under_way():
        assert time.monotonic() < deadline, f"stops still under way: {sorted(rec.stops_under_way())}"
        time.sleep(0.01)


def fg_pairs(b: MockBackend) -> list[int]:
    by_core: dict[int, int] = {}
    for v in b.list_vms():
        if v.pinned_cores and v.weight == LAYOUT.fg_weight and v.power is PowerState.RUNNING:
            by_core[v.pinned_cores[0]] = by_core.get(v.pinned_cores[0], 0) + 1
    return [c for c, n in by_core.items() if n > 1]


def test_the_pass_goes_on_while_a_stop_is_held_and_nothing_is_stopped_twice() -> None:
    clock = VirtualClock(100.0)
    b = MockBackend("n1", cores=2, clock=clock)
    source, reporter = MemorySource(LAYOUT.base_desired(1)), MemoryReporter()
    rec = Reconciler(b, LAYOUT, source, reporter, clock=clock, runner=MockProcessRunner(b), background_stops=True)
    assert rec.run_once().converged
    stops: list[str] = []
    real_stop = b.stop

    def counted_stop(name: str, force: bool = True) -> None:
        stops.append(name)
        real_stop(name, force)

    b.stop = counted_stop  # type: ignore[method-assign]
    hold = Hold("stop", FG0)
    b.holds.append(hold)
    try:
        source.set(gen2())
        res = run_bounded(rec)
        assert hold.entered.is_set() and Stop(FG0) in res.applied
        have = {v.name: v for v in b.list_vms()}
        # core 1's swap was applied while core 0's placeholder is being stopped
        assert have[LAYOUT.vm_name(1, "bg")].weight == LAYOUT.fg_weight
        assert have[LAYOUT.vm_name(1, "fg")].weight == LAYOUT.bg_weight
        # the job VM is there, but not raised to the weight of the VM still stopping on its core
        assert JOB in have and have[JOB].weight != LAYOUT.fg_weight and fg_pairs(b) == []
        assert not res.converged and res.observed is not None and res.observed.generation_applied == 1
        fg0 = vm(reporter.last, FG0)
        assert fg0.stopping and fg0.power is PowerState.RUNNING  # reported: still there, being stopped
        n_reports = len(reporter.reports)
        res = run_bounded(rec)  # another cycle while the stop is still held: reported again, no second stop
        assert len(reporter.reports) == n_reports + 1 and vm(reporter.last, FG0).stopping
        assert Stop(FG0) not in res.applied and Undefine(FG0) not in res.applied and stops == [FG0]
    finally:
        hold.release.set()
    wait_no_stop(rec)
    res = rec.run_once()
    assert res.converged and not res.errors, res.errors
    have = {v.name: v for v in b.list_vms()}
    assert FG0 not in have and have[JOB].weight == LAYOUT.fg_weight and have[JOB].power is PowerState.RUNNING
    assert res.observed is not None and res.observed.generation_applied == 2
    assert all(not v.stopping for v in res.observed.vms) and stops == [FG0]


def test_a_stop_that_fails_off_the_pass_is_reported_and_tried_again() -> None:
    from vmctl.agents.backends.mock import Fault

    clock = VirtualClock(100.0)
    b = MockBackend("n1", cores=2, clock=clock)
    source, reporter = MemorySource(LAYOUT.base_desired(1)), MemoryReporter()
    rec = Reconciler(b, LAYOUT, source, reporter, clock=clock, runner=MockProcessRunner(b), background_stops=True)
    assert rec.run_once().converged
    b.faults.append(Fault("stop", FG0, times=1))
    source.set(gen2())
    rec.run_once()
    wait_no_stop(rec)
    res = rec.run_once()  # reports the failure, and stops it again
    assert any(e.startswith(f"stop {FG0}:") for e in res.errors) and Stop(FG0) in res.failed and res.retry
    wait_no_stop(rec)
    res = rec.run_once()
    assert res.converged and FG0 not in {v.name for v in b.list_vms()}


def test_an_agent_killed_during_a_stop_leaves_it_to_the_next_one(tmp_path: Path) -> None:
    state = tmp_path / "n1.json"
    clock = VirtualClock(100.0)
    first = MockBackend("n1", cores=2, clock=clock, state_file=state)
    source = MemorySource(LAYOUT.base_desired(1))
    rec = Reconciler(first, LAYOUT, source, MemoryReporter(), clock=clock, runner=MockProcessRunner(first),
                     background_stops=True)
    assert rec.run_once().converged
    hold = Hold("stop", FG0)
    first.holds.append(hold)
    source.set(gen2())
    run_bounded(rec)
    assert hold.entered.is_set() and rec.stops_under_way() == {FG0}
    # kill -9: the process (its backend connection with it) is gone before the stop took effect
    first.close()
    hold.release.set()
    wait_no_stop(rec)
    backend = MockBackend("n1", cores=2, clock=clock, state_file=state)
    assert backend.list_vms() and FG0 in {v.name for v in backend.list_vms()}  # still there after the "kill"
    again = Reconciler(backend, LAYOUT, source, MemoryReporter(), clock=clock, runner=MockProcessRunner(backend),
                       background_stops=True)
    deadline = time.monotonic() + BOUND_S
    while True:
        res = again.run_once()
        if res.converged:
            break
        assert time.monotonic() < deadline, res.errors
        wait_no_stop(again)
    assert FG0 not in {v.name for v in backend.list_vms()}
    assert FG0 not in {v.name for v in MockBackend("n1", cores=2, clock=clock, state_file=state).list_vms()}


def test_the_plan_leaves_a_stopping_vm_alone_and_raises_nothing_to_its_weight() -> None:
    b = MockBackend("n1", cores=2, clock=VirtualClock(0.0))
    rec = Reconciler(b, LAYOUT, MemorySource(LAYOUT.base_desired(1)), MemoryReporter(), clock=b.clock)
    assert rec.run_once().converged
    target = LAYOUT.complete(swap_tiers(LAYOUT.base_desired(2), core=0, generation=2))
    target = replace(target, vms=tuple(replace(v, power=PowerState.ABSENT) if v.name == FG0 else v for v in target.vms))
    bg0 = LAYOUT.vm_name(0, "bg")
    free = plan(target, Observed.of(b.list_vms()), LAYOUT)
    assert Stop(FG0) in free and Undefine(FG0) in free
    assert any(isinstance(a, Tune) and a.vm == bg0 and a.weight == LAYOUT.fg_weight for a in free)
    held = plan(target, Observed.of(b.list_vms(), stopping=frozenset({FG0})), LAYOUT)
    assert not [a for a in held if a.vm == FG0]
    assert not any(isinstance(a, Tune) and a.vm == bg0 and a.weight == LAYOUT.fg_weight for a in held)
