"""Properties of plan + reconcile over the mock backend, for random pairs of valid desired states:

- one cycle converges (no errors, the next plan is empty, generation applied);
- the host then matches the desired state (power, pinning, weight, cap, job process);
- while moving from one valid state to the next, no core ever has two VMs at the fg weight;
- a restarted agent changes nothing.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.agents import swap_tiers
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.plan import Observed, plan
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.nodedoc import NodeDesired, PowerState, ProcessSpec, VmDesired, VmRole

LAYOUT = Layout("p", (0, 1, 2))
FG_W = LAYOUT.fg_weight

caps = st.one_of(st.none(), st.sampled_from([0.1, 0.25, 0.5, 0.75, 1.0]))
powers = st.sampled_from([PowerState.RUNNING, PowerState.RUNNING, PowerState.PAUSED, PowerState.SHUTOFF])


@st.composite
def desired_states(draw: st.DrawFn, generation: int) -> NodeDesired:
    d = LAYOUT.base_desired(generation)
    for core in range(LAYOUT.size):
        if draw(st.booleans()):
            d = swap_tiers(d, core, generation=generation)
    vms = []
    for v in d.vms:
        power = draw(powers)
        proc = None
        if power is PowerState.RUNNING and draw(st.booleans()):
            proc = ProcessSpec(job_id=f"j{draw(st.integers(0, 3))}", index=0, work_seconds=1e6,
                               cpu_usage=draw(st.sampled_from([0.3, 1.0])))
        vms.append(replace(v, cap=draw(caps), power=power, process=proc))
    for i in range(draw(st.integers(0, 2))):
        vms.append(VmDesired(name=f"p-shared-{i}", core=draw(st.integers(-1, LAYOUT.size - 1)), role=VmRole.SHARED,
                             weight=draw(st.integers(2, 9999)), cap=draw(caps),
                             power=draw(st.sampled_from([PowerState.RUNNING, PowerState.ABSENT]))))
    return NodeDesired("p", generation, tuple(vms))


def fg_weight_pairs(backend: MockBackend) -> list[int]:
    """Cores on which two VMs hold the fg weight right now."""
    by_core: dict[int, int] = {}
    for v in backend.list_vms():
        if v.pinned_cores and v.weight == FG_W:
            by_core[v.pinned_cores[0]] = by_core.get(v.pinned_cores[0], 0) + 1
    return [c for c, n in by_core.items() if n > 1]


class WatchedBackend(MockBackend):
    """Checks the fg-weight invariant after every weight change."""

    violations: list[str]

    def set_cpu_tune(self, name: str, weight: int | None = None, cap: float | None = None,
                     clear_cap: bool = False) -> None:
        super().set_cpu_tune(name, weight, cap, clear_cap)
        bad = fg_weight_pairs(self)
        if bad:
            self.violations.append(f"after tuning {name}: cores {bad} have two fg-weight VMs")

    def pin_vcpus(self, name: str, cores: tuple[int, ...]) -> None:
        super().pin_vcpus(name, cores)
        bad = fg_weight_pairs(self)
        if bad:
            self.violations.append(f"after pinning {name}: cores {bad} have two fg-weight VMs")


@settings(max_examples=40, deadline=None)
@given(first=desired_states(1), second=desired_states(2))
def test_reconcile_converges_safely_between_random_states(first: NodeDesired, second: NodeDesired) -> None:
    clock = VirtualClock(0.0)
    backend = WatchedBackend("p", cores=3, clock=clock)
    backend.violations = []
    source = MemorySource(first)
    rec = Reconciler(backend, LAYOUT, source, MemoryReporter(), clock=clock, runner=MockProcessRunner(backend))
    for d in (first, second):
        source.set(d)
        res = rec.run_once()
        assert res.converged and not res.errors, res.errors
        assert res.observed is not None and res.observed.generation_applied == d.generation
        full = LAYOUT.complete(d)
        observed = Observed.of(backend.list_vms(), {v.name: backend.process_status(v.name)
                                                    for v in backend.list_vms() if v.power is PowerState.RUNNING})
        assert plan(full, observed, LAYOUT) == []
        have = {v.name: v for v in backend.list_vms()}
        for v in full.vms:
            if v.power is PowerState.ABSENT:
                assert v.name not in have
                continue
            h = have[v.name]
            assert h.power is v.power, v.name
            assert h.weight == v.weight and h.cap == v.cap
            if v.core >= 0:
                assert h.pinned_cores == (LAYOUT.physical(v.core),)
            if v.process is not None and v.power is PowerState.RUNNING:
                ps = backend.process_status(v.name)
                assert ps is not None and (ps.job_id, ps.index) == (v.process.job_id, v.process.index)
        clock.advance(1.0)
    assert backend.violations == []
    n = len(backend.journal)
    again = Reconciler(backend, LAYOUT, source, MemoryReporter(), clock=clock, runner=MockProcessRunner(backend))
    assert again.run_once().applied == ()
    assert len(backend.journal) == n
