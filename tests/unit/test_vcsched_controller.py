"""The virtual-cluster controller end to end on the mock backend through the agents' reconciler."""

from __future__ import annotations

import pytest

from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.errors import Conflict, NotFound, ValidationError
from vmctl.model import PowerState, VmRole
from vmctl.vcsched_controller import VcRequest, VcschedController


class Cluster:
    def __init__(self, nodes: tuple[str, ...] = ("n1", "n2")) -> None:
        self.clock = VirtualClock(0.0)
        fabric = MockFabric()
        self.backends = {
            n: MockBackend(n, cores=1, clock=self.clock, fabric=fabric, migration_seconds=2.0) for n in nodes
        }
        self.sources = {n: MemorySource() for n in nodes}
        self.reporters = {n: MemoryReporter() for n in nodes}
        self.agents = {
            n: Reconciler(
                b,
                Layout(n, (0,)),
                self.sources[n],
                self.reporters[n],
                clock=self.clock,
                runner=MockProcessRunner(b),
                peers={m: self.backends[m].uri for m in nodes if m != n},
            )
            for n, b in self.backends.items()
        }

    def push(self, ctl: VcschedController) -> None:
        for n, src in self.sources.items():
            src.set(ctl.desired(n))

    def reconcile(self, ctl: VcschedController) -> None:
        self.push(ctl)
        for agent in self.agents.values():
            res = agent.run_once()
            assert not res.errors, res.errors
            assert res.observed is not None
            ctl.observe(res.observed)

    def shared(self, node: str) -> dict[str, float | None]:
        """Shared VMs on a node as the hypervisor reports them: name -> cap."""
        return {
            v.name: v.cap
            for v in self.backends[node].list_vms()
            if v.name.startswith("vc-") and v.power is PowerState.RUNNING
        }


def test_requests_become_capped_shared_vms() -> None:
    c = Cluster()
    ctl = VcschedController(["n1", "n2"], algorithm="mcb8")
    ctl.submit(VcRequest("a", 2, 0.6, 0.3))
    ctl.submit(VcRequest("b", 1, 0.6, 0.3))
    alloc = ctl.run_once()
    assert alloc.status == "ok" and alloc.min_yield == pytest.approx(0.5 / 0.6)
    assert alloc.waiting == () and alloc.migrations == ()
    d1, d2 = ctl.desired("n1"), ctl.desired("n2")
    assert all(v.role is VmRole.SHARED and v.core == -1 for v in d1.vms + d2.vms)
    assert all(v.memory_mib == round(0.3 * 16384) for v in d1.vms + d2.vms)
    c.reconcile(ctl)
    caps = {**c.shared("n1"), **c.shared("n2")}
    assert sorted(caps) == ["vc-a-0", "vc-a-1", "vc-b-0"]
    assert sorted(v for v in caps.values() if v is not None) == pytest.approx([0.5, 0.5, 0.6])
    # the VMs of cluster a get equal caps (sec. 5)
    assert caps["vc-a-0"] == pytest.approx(caps["vc-a-1"])
    per_node = [sum(v or 0.0 for v in c.shared(n).values()) for n in ("n1", "n2")]
    assert max(per_node) <= 1.0 + 1e-9


def test_workload_change_migrates_within_budget() -> None:
    c = Cluster()
    ctl = VcschedController(["n1", "n2"], algorithm="mcb8", migration_budget=0.5)
    ctl.submit(VcRequest("a", 2, 0.5, 0.4))  # both fit on n1 at full speed
    first = ctl.run_once()
    assert set(first.placement.values()) == {"n1"} and first.min_yield == 1.0
    c.reconcile(ctl)
    assert set(c.shared("n1")) == {"vc-a-0", "vc-a-1"}
    # the cluster now needs 0.8 per VM: together 1.6 on n1; moving one VM (0.4 memory) restores yield 1
    ctl.update(VcRequest("a", 2, 0.8, 0.4))
    second = ctl.run_once()
    assert second.min_yield == 1.0 and second.moved_mem == pytest.approx(0.4)
    (mig,) = second.migrations
    assert (mig.source_node, mig.target_node) == ("n1", "n2")
    moving = next(v for v in ctl.desired("n2").vms if v.migration is not None)
    assert moving.name == mig.migration_id.rsplit("-m", 1)[0]
    c.reconcile(ctl)  # source starts the live migration
    c.clock.advance(3.0)
    c.reconcile(ctl)  # target adopts it, source reports completed -> controller completes it
    c.reconcile(ctl)
    assert ctl.pending == {}
    assert set(c.shared("n1")) | set(c.shared("n2")) == {"vc-a-0", "vc-a-1"}
    assert len(c.shared("n1")) == 1 and len(c.shared("n2")) == 1
    assert all(v.migration is None for n in ("n1", "n2") for v in ctl.desired(n).vms)
    assert list(c.shared("n2").values()) == [pytest.approx(0.8)]
    # the moved VM stays unpinned on its new host, like every shared VM (it is not tied to one core)
    assert mig.target_core == -1
    assert all(v.pinned_cores is None for n in ("n1", "n2") for v in c.backends[n].list_vms()
               if v.name.startswith("vc-"))


def test_zero_budget_keeps_vms_and_lowers_caps() -> None:
    c = Cluster()
    ctl = VcschedController(["n1", "n2"], migration_budget=0.0)
    ctl.submit(VcRequest("a", 2, 0.5, 0.4))
    ctl.run_once()
    c.reconcile(ctl)
    ctl.update(VcRequest("a", 2, 0.8, 0.4))
    alloc = ctl.run_once()
    assert alloc.migrations == () and alloc.min_yield == pytest.approx(1 / 1.6)
    c.reconcile(ctl)
    assert sorted(v or 0.0 for v in c.shared("n1").values()) == pytest.approx([0.5, 0.5])  # 0.8 * 0.625


def test_admission_waits_and_removal_frees_room() -> None:
    ctl = VcschedController(["n1", "n2"])
    ctl.submit(VcRequest("big", 2, 0.5, 0.8))
    ctl.submit(VcRequest("late", 1, 0.5, 0.5))
    alloc = ctl.run_once()
    assert alloc.admitted == ("big",) and alloc.waiting == ("late",)
    ctl.remove("big")
    alloc = ctl.run_once()
    assert alloc.admitted == ("late",) and alloc.waiting == ()
    assert [v.name for n in ("n1", "n2") for v in ctl.desired(n).vms] == ["vc-late-0"]


def test_bad_requests() -> None:
    ctl = VcschedController(["n1"])
    with pytest.raises(ValidationError, match=r"request x.cpu: must be in \(0, 1\]"):
        VcRequest("x", 1, 1.5, 0.1)
    with pytest.raises(ValidationError):
        VcRequest("a b", 1, 0.5, 0.1)
    ctl.submit(VcRequest("x", 1, 0.5, 0.1))
    with pytest.raises(Conflict):
        ctl.submit(VcRequest("x", 1, 0.5, 0.1))
    with pytest.raises(NotFound):
        ctl.remove("nope")
    with pytest.raises(ValidationError):
        VcschedController(["n1"], algorithm="best")
