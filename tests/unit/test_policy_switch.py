"""issue 22 item 4, "Switching family is one command": vmctld lays the cluster out for a policy (the layout
travels in ``NodeDesired.layout``), the agents re-lay their hosts out once they hold no job VM, and
``start_switch`` drains, re-lays out and switches with jobs running -- nothing killed, requeued or lost.
The real reconciler on the mock backend, stepped by hand on one virtual clock (the HTTP version with real
agent loops and the CLI is tests/integration/test_policy_switch_live.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig, load_config
from vmctl.daemon.core import Daemon
from vmctl.errors import Conflict, NotFound, PolicyNeedsUnmet, PolicyParameterError, UnknownPolicyError
from vmctl.model import Discipline, JobState, NodeLayout
from vmctl.nodedoc import NodeDesired, NodeObserved, VmDesired, VmRole
from vmctl.policies.registry import create_policy
from vmctl.store import open_store
from vmctl.wire import desired_from_json, desired_to_json, observed_from_json, observed_to_json

PRIORITY2 = NodeLayout(Discipline.PRIORITY, 2)
TIMESLICE3 = NodeLayout(Discipline.TIMESLICE, 3)
SHARED1 = NodeLayout(Discipline.SHARED, 1)
NODES = ("n1", "n2")


class Family:
    """vmctld and one mock agent per node (2 cores, priority 2 in their configs), stepped by hand."""

    def __init__(self, tmp: Path, policy: str = "measy", params: dict[str, Any] | None = None,
                 memory_mib: int = 4096, register: bool = True) -> None:
        self.tmp, self.clock = tmp, VirtualClock(1000.0)
        self.config = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0,
                                   holder="family", checkpoint_dir=str(tmp / "ckpt"), policy_name=policy,
                                   policy_params=params or {}, policy_explicit=True)
        self.d = self.daemon()
        self.memory_mib = memory_mib
        self.agents: dict[str, Reconciler] = {}
        self.backends: dict[str, MockBackend] = {}
        if register:
            for n in NODES:
                self.add(n)

    def daemon(self) -> Daemon:
        d = Daemon(self.config, open_store(self.config.store_url), clock=self.clock)
        assert d.start()
        return d

    def add(self, node: str) -> None:
        backend = MockBackend(hostname=node, cores=2, clock=self.clock, uri=f"mock://{node}",
                              memory_mib=self.memory_mib)
        lay = Layout(host=node, cores=(0, 1), levels=2, discipline=Discipline.PRIORITY)
        self.backends[node] = backend
        self.agents[node] = Reconciler(backend, lay, MemorySource(), MemoryReporter(), clock=self.clock,
                                       runner=MockProcessRunner(backend))
        self.d.register_node(node, 2, node, "mock", memory_mib=self.memory_mib, levels=2,
                             discipline=Discipline.PRIORITY)

    def step(self, dt: float = 0.0, errors_ok: bool = False) -> None:
        self.clock.advance(dt)
        self.d.run_once()
        for n, rec in self.agents.items():
            rec.source.set(self.d.desired(n))  # type: ignore[attr-defined]
            res = rec.run_once()
            assert errors_ok or not res.errors, res.errors
            assert res.observed is not None
            self.d.report(res.observed)

    def layouts(self) -> dict[str, NodeLayout]:
        return {n: NodeLayout(r.layout.discipline, r.layout.levels) for n, r in self.agents.items()}

    def job_vms(self) -> dict[str, list[str]]:
        return {n: sorted(v.name for v in b.list_vms() if v.name.startswith("j")) for n, b in self.backends.items()}

    def starts(self) -> list[str]:
        """``job[index]`` of every process start in the backends' journals."""
        return [e.detail for b in self.backends.values() for e in b.operations("start_process")]


def _job(work: float, procs: int, estimate: float = 5000.0, **extra: Any) -> dict[str, Any]:
    return {"procs": procs, "estimate": estimate, "work_seconds": work, **extra}


def _run_until(f: Family, cond: Any, what: str, dt: float = 5.0, steps: int = 400) -> None:
    for _ in range(steps):
        if cond():
            return
        f.step(dt)
    raise AssertionError(f"not reached after {steps} steps: {what}")


def test_layout_travels_on_the_wire() -> None:
    d = NodeDesired(node="n1", generation=3, layout=TIMESLICE3)
    assert desired_from_json(desired_to_json(d)) == d
    assert "layout" not in desired_to_json(NodeDesired(node="n1", generation=3))
    o = NodeObserved(node="n1", generation_applied=3, cores=2, layout=SHARED1, layout_memory_mib=128)
    assert observed_from_json(observed_to_json(o)) == o
    for bad, field in (({"discipline": "round-robin", "levels": 2}, "layout.discipline"),
                       ({"discipline": "shared", "levels": 9}, "layout.levels"),
                       ({"discipline": "shared", "levels": 0}, "layout.levels"),
                       ({"discipline": "shared", "levels": 2, "mpl": 3}, "layout.mpl")):
        with pytest.raises(Exception) as err:
            desired_from_json({"node": "n1", "generation": 1, "vms": [], "layout": bad})
        assert err.value.fields["field"] == field, err.value  # type: ignore[attr-defined]


def test_each_family_has_its_layout() -> None:
    assert create_policy("measy").needs.layout() == PRIORITY2
    assert create_policy("easy").needs.layout() == PRIORITY2
    assert create_policy("gs-m", mpl=3).needs.layout() == TIMESLICE3
    assert create_policy("vcsched-mcb8").needs.layout() == SHARED1
    assert create_policy("dispatch-priority").needs.layout() == NodeLayout(Discipline.SHARED, 2)


def test_config_naming_a_gang_policy_loads_and_a_layout_no_agent_carries_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vmctld.yaml"
    path.write_text(f"state_dir: {tmp_path}\npolicy: {{name: gs-m, params: {{mpl: 3, slice: 60}}}}\n")
    cfg = load_config(str(path))
    assert (cfg.policy_name, cfg.policy_params["mpl"]) == ("gs-m", 3)
    path.write_text(f"state_dir: {tmp_path}\npolicy: {{name: gs-m, params: {{mpl: 9}}}}\n")
    with pytest.raises(Exception, match=r"policy: policy gs-m: parameter mpl: needs 9 VM levels per core, but an "
                                        r"agent carries at most 8"):
        load_config(str(path))


def test_switch_measy_gang_vcsched_measy_with_jobs_running(tmp_path: Path) -> None:
    f = Family(tmp_path)
    d = f.d
    f.step()
    assert f.layouts() == {n: PRIORITY2 for n in NODES} and d.state.cluster_layout is None
    long, short = d.submit([_job(400, 2), _job(100, 2)])
    f.step(1)
    assert long.state == short.state == JobState.RUNNING

    # measy -> gs-m (mpl 3): drains; the node whose job ends first is re-laid out while the other still runs
    d.start_switch("gs-m", {"mpl": 3, "slice": 20.0})
    queued, = d.submit([_job(50, 4)])
    f.step(1)
    st = d.switch_status()
    assert st is not None and st["phase"] == "draining" and d.policy is not None and d.policy.name == "measy"
    assert {j["id"] for j in st["jobs"]} == {long.id, short.id}
    assert "waiting for 2 running job(s) to end" in st["waiting_for"], st["waiting_for"]
    assert d.policy_waiting() is not None and "switching to policy gs-m" in str(d.policy_waiting())
    nodes_of = {long.id: {n for n, _c in long.placement}, short.id: {n for n, _c in short.placement}}
    _run_until(f, lambda: short.state == JobState.DONE, "the short job to end")
    f.step(1)
    if nodes_of[short.id] != nodes_of[long.id]:
        free = next(iter(nodes_of[short.id]))
        assert f.layouts()[free] == TIMESLICE3, "an empty node is re-laid out while the others drain"
        assert d.switch_status()["nodes"][NODES.index(free)]["relaid"] is True  # type: ignore[index]
    assert queued.state == JobState.QUEUED and long.state == JobState.RUNNING
    _run_until(f, lambda: d.switch is None, "the switch to gs-m")
    assert long.state == JobState.DONE and d.policy.name == "gs-m" and d.state.cluster_layout == TIMESLICE3
    assert f.layouts() == {n: TIMESLICE3 for n in NODES}
    assert all(f.agents[n].relayouts == 1 for n in NODES)

    # gang jobs in rows, then -> vcsched-mcb8 (shared, 1 level: no placeholder VMs at all)
    gangs = d.submit([_job(60, 4), _job(60, 4)])
    _run_until(f, lambda: all(j.state == JobState.RUNNING for j in [queued, *gangs]), "three gang jobs in rows")
    assert sorted(j.level for j in [queued, *gangs]) == [0, 1, 2]  # type: ignore[type-var]
    d.start_switch("vcsched-mcb8", {})
    _run_until(f, lambda: d.switch is None, "the switch to vcsched")
    assert all(j.state == JobState.DONE for j in [queued, *gangs])
    assert d.policy.name == "vcsched-mcb8" and f.layouts() == {n: SHARED1 for n in NODES}
    assert all(not b.list_vms() for b in f.backends.values()), "shared hosts keep no placeholder VMs"
    vjobs = d.submit([_job(80, 2, cpu_need=0.5), _job(80, 2, cpu_need=0.5)])
    _run_until(f, lambda: all(j.state == JobState.RUNNING for j in vjobs), "the vcsched jobs")

    # -> measy again: back to the fg/bg pair
    d.start_switch("measy", {})
    _run_until(f, lambda: d.switch is None, "the switch back to measy")
    assert d.policy.name == "measy" and f.layouts() == {n: PRIORITY2 for n in NODES}
    last = d.submit([_job(30, 4)])
    _run_until(f, lambda: all(j.state == JobState.DONE for j in d.state.jobs.values()), "every job done")
    jobs = list(d.state.jobs.values())
    assert len(jobs) == 8 and all(j.state == JobState.DONE and j.run == 1 for j in jobs), \
        [(j.id, j.state, j.run) for j in jobs]
    starts = f.starts()
    assert len(starts) == len(set(starts)) == sum(int(j.spec["procs"]) for j in jobs), \
        "each process started exactly once"
    assert last[0].state == JobState.DONE


def test_switch_to_the_layout_the_cluster_has_is_immediate_and_set_policy_names_the_way_out(tmp_path: Path) -> None:
    f = Family(tmp_path)
    d = f.d
    f.step()
    with pytest.raises(PolicyNeedsUnmet, match=r"vmctl policy set gs-m \.\.\. --relayout"):
        d.set_policy("gs-m", {"mpl": 3})
    d.start_switch("easy", {})  # easy runs on the fg/bg pair the cluster has: no drain
    assert d.switch is None and d.policy is not None and d.policy.name == "easy"
    assert d.state.cluster_layout == PRIORITY2


def test_bad_input_changes_nothing(tmp_path: Path) -> None:
    f = Family(tmp_path, memory_mib=300)
    d = f.d
    f.step()
    (job,) = d.submit([_job(100, 2)])
    f.step(1)
    gen = dict(d.state.generation)
    for args, exc, text in (
            (("no-such", {}), UnknownPolicyError, "no-such"),
            (("gs-m", {"mpl": "three"}), PolicyParameterError, "mpl"),
            (("gs-m", {"mpl": 9}), PolicyParameterError, "at most 8"),
            (("gs-m", {"mpl": 3, "bogus": 1}), PolicyParameterError, "bogus"),
            # 3 levels x 2 cores x 64 MiB = 384 MiB of VMs on hosts of 300 MiB
            (("gs-m", {"mpl": 3}), PolicyNeedsUnmet, r"n1: 3 levels x 2 cores x 64 MiB = 384 MiB > 300 MiB"),
    ):
        with pytest.raises(exc, match=text):
            d.start_switch(*args)  # type: ignore[arg-type]
        assert d.switch is None and d.policy is not None and d.policy.name == "measy"
        assert d.state.generation == gen and d.state.cluster_layout is None
    with pytest.raises(PolicyNeedsUnmet, match="priority discipline has 2 levels"):
        d.start_switch("easy", {}, NodeLayout(Discipline.PRIORITY, 3))
    with pytest.raises(PolicyNeedsUnmet, match="needs the priority discipline"):
        d.start_switch("measy", {}, NodeLayout(Discipline.SHARED, 2))
    with pytest.raises(PolicyParameterError, match=r"mpl: needs more levels than the layout asked for \(2 timeslice"):
        d.start_switch("gs-m", {"mpl": 3}, NodeLayout(Discipline.TIMESLICE, 2))
    with pytest.raises(NotFound):
        d.cancel_switch()
    d.start_switch("gs-m", {"mpl": 2})  # 2 x 2 x 64 = 256 MiB fits
    with pytest.raises(Conflict, match=r"a switch to gs-m .* is in progress"):
        d.start_switch("vcsched-mcb8", {})
    with pytest.raises(Conflict, match="a switch to gs-m"):
        d.set_policy("easy", {})
    with pytest.raises(Conflict, match="cannot move while the policy switch"):
        d.migrate_job(job.id, "n2")
    del job


def test_cancel_lays_the_cluster_back_out_and_the_old_policy_goes_on(tmp_path: Path) -> None:
    f = Family(tmp_path)
    d = f.d
    f.step()
    (job,) = d.submit([_job(200, 2)])
    f.step(1)
    busy = next(iter({n for n, _c in job.placement}))
    free = next(n for n in NODES if n != busy)
    d.start_switch("gs-m", {"mpl": 3})
    # until its agent reports the new layout, the free node shows both (`vmctl node list`: 2 priority -> 3 timeslice)
    from vmctl.api.documents import node_json
    from vmctl.cli.render import fmt_levels

    assert fmt_levels(node_json(d, d.state.nodes[free])) == "2 priority -> 3 timeslice"
    assert fmt_levels(node_json(d, d.state.nodes[busy])) == "2 priority"
    f.step(1)
    assert f.layouts() == {busy: PRIORITY2, free: TIMESLICE3}
    assert fmt_levels(node_json(d, d.state.nodes[free])) == "3 timeslice"
    (waiting,) = d.submit([_job(20, 1)])
    f.step(1)
    assert waiting.state == JobState.QUEUED  # nothing is decided during the switch
    d.cancel_switch()
    f.step(1)
    assert d.policy is not None and d.policy.name == "measy" and d.switch is None
    assert f.layouts() == {n: PRIORITY2 for n in NODES}
    _run_until(f, lambda: job.state == waiting.state == JobState.DONE, "both jobs done under measy")


def test_vmctld_killed_mid_switch_resumes_it(tmp_path: Path) -> None:
    f = Family(tmp_path)
    f.step()
    (job,) = f.d.submit([_job(100, 4)])
    f.step(1)
    f.d.start_switch("gs-m", {"mpl": 3})
    f.step(1)
    # a new vmctld on the same store: every change was one committed transaction, so this is what a vmctld
    # killed here finds (the real kill -9 of a vmctld process: tests/integration/test_policy_switch_live.py)
    f.d.close()
    f.d = f.daemon()
    assert f.d.switch is not None and f.d.switch.policy == "gs-m" and f.d.switch.layout == TIMESLICE3
    assert f.d.policy is not None and f.d.policy.name == "measy"
    _run_until(f, lambda: f.d.switch is None, "the resumed switch")
    assert f.d.state.jobs[job.id].state == JobState.DONE and f.d.state.jobs[job.id].run == 1
    assert f.d.policy.name == "gs-m" and f.layouts() == {n: TIMESLICE3 for n in NODES}


def test_a_configured_gang_policy_waits_for_nodes_and_lays_them_out(tmp_path: Path) -> None:
    f = Family(tmp_path, policy="gs-m", params={"mpl": 3, "slice": 20.0}, register=False)
    d = f.d
    assert d.policy is not None and d.policy.name == "gs-m"
    waiting = d.policy_waiting()
    assert waiting is not None and "no node registered yet" in waiting and "3 timeslice levels" in waiting
    (job,) = d.submit([_job(30, 3)])
    f.step()
    for n in NODES:
        f.add(n)  # agents configured with the default layout (priority 2): not refused
    assert "n1 (2 priority levels per core, ready)" in str(d.policy_waiting())
    _run_until(f, lambda: job.state == JobState.DONE, "the gang job on re-laid out nodes")
    assert f.layouts() == {n: TIMESLICE3 for n in NODES} and d.policy_waiting() is None
    assert d.state.cluster_layout == TIMESLICE3


def test_an_agent_restarted_with_its_config_layout_takes_vmctlds_at_once(tmp_path: Path) -> None:
    f = Family(tmp_path)
    d = f.d
    f.step()
    d.start_switch("gs-m", {"mpl": 3, "slice": 20.0})
    _run_until(f, lambda: d.switch is None, "the switch")
    (job,) = d.submit([_job(200, 4)])
    _run_until(f, lambda: job.state == JobState.RUNNING, "the gang job")
    f.step(5)
    before = f.job_vms()
    # n1's agent restarts with its config (priority 2): it registers that layout and is not refused; its
    # first desired state lists the job's VMs (placed in 3 timeslice levels): it takes that layout at once
    backend = f.backends["n1"]
    f.agents["n1"] = Reconciler(backend, Layout(host="n1", cores=(0, 1), levels=2), MemorySource(), MemoryReporter(),
                                clock=f.clock, runner=MockProcessRunner(backend))
    d.register_node("n1", 2, "n1", "mock", memory_mib=4096, levels=2, discipline=Discipline.PRIORITY)
    f.step(1)
    assert f.layouts()["n1"] == TIMESLICE3 and f.job_vms() == before
    _run_until(f, lambda: job.state == JobState.DONE, "the gang job")
    assert job.run == 1


def test_an_agent_refuses_a_layout_its_host_memory_cannot_hold(tmp_path: Path) -> None:
    backend = MockBackend(hostname="n1", cores=2, memory_mib=300, uri="mock://n1")
    rec = Reconciler(backend, Layout(host="n1", cores=(0, 1)), MemorySource(), MemoryReporter())
    rec.source.set(NodeDesired(node="n1", generation=1, layout=TIMESLICE3))  # type: ignore[attr-defined]
    res = rec.run_once()
    assert any("layout: refused 3 timeslice levels per core (keeping 2 priority): 3 levels x 2 cores x 64 MiB = "
               "384 MiB" in e for e in res.errors), res.errors
    assert res.observed is not None and res.observed.layout == PRIORITY2
    # a job VM on the host that desired state does not list keeps the host in its layout until it is gone
    rec.source.set(NodeDesired(node="n1", generation=2, layout=SHARED1))  # type: ignore[attr-defined]
    backend.define(rec.layout.spec_for(VmDesired(name="j9-r1-p0", core=0, role=VmRole.FG, weight=10000)))
    assert rec._unlisted_job_vms(NodeDesired(node="n1", generation=2)) == ["j9-r1-p0"]
    res = rec.run_once()
    assert res.observed is not None and res.observed.layout in (PRIORITY2, SHARED1)
    rec.run_once()
    assert NodeLayout(rec.layout.discipline, rec.layout.levels) == SHARED1 and not backend.list_vms()


def test_a_document_its_own_layout_does_not_validate_leaves_the_host_as_it_was() -> None:
    backend = MockBackend(hostname="n1", cores=2, uri="mock://n1")
    rec = Reconciler(backend, Layout(host="n1", cores=(0, 1)), MemorySource(), MemoryReporter())
    bad = VmDesired(name="j1-r1-p0", core=0, role=VmRole.FG, weight=10000, level=5)  # row 5 of 3
    rec.source.set(NodeDesired(node="n1", generation=1, vms=(bad,), layout=TIMESLICE3))  # type: ignore[attr-defined]
    res = rec.run_once()
    assert any("level 5" in e or "out of range" in e for e in res.errors), res.errors
    assert NodeLayout(rec.layout.discipline, rec.layout.levels) == PRIORITY2 and rec.relayouts == 0
    assert sorted(v.name for v in backend.list_vms()) == ["n1-c0-bg", "n1-c0-fg", "n1-c1-bg", "n1-c1-fg"]
