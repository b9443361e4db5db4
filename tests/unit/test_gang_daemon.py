"""issue 11, "On real hosts": vmctld runs the gang policies on a timeslice cluster of mock agents (the real
reconciler on the mock backend, a virtual clock). Job records carry their row and replicas; a node's
desired state carries its rows (VM levels) and the slice schedule; the agents switch rows on their own
clock, with no new generation per slice; the schedule survives a vmctld restart and an agent restart
keeps the phase; suspended time does not count against the run-time limit; a failed migration leaves
the job in its row; bad input (MPL above the levels, T <= 0, Q < 0, a priority cluster) is refused
naming the parameter, with nothing applied."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.daemon.actuator import Changes
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.daemon.gang import matrix_doc
from vmctl.errors import PolicyNeedsUnmet, PolicyParameterError
from vmctl.model import Decision, Discipline, JobState, Move, PowerState, SliceSchedule
from vmctl.store import open_store
from vmctl.wire import desired_from_json, desired_to_json

SLICE = 10.0
NODES = ("a", "b")


def _daemon(tmp: Path, clock: VirtualClock, params: dict[str, object] | None = None, **cfg: object) -> Daemon:
    config = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0, holder="gang-test",
                          checkpoint_dir=str(tmp / "ckpt"), policy_name="gs-m",
                          policy_params=params if params is not None else {"mpl": 3, "slice": SLICE}, **cfg)
    d = Daemon(config, open_store(config.store_url), clock=clock)
    assert d.start()
    return d


class Cluster:
    """vmctld and one mock agent per node, stepped by hand on one virtual clock."""

    def __init__(self, tmp: Path, levels: int = 3, inactive: str = "pause", fabric: MockFabric | None = None,
                 **cfg: object) -> None:
        self.tmp, self.clock, self.levels, self.inactive = tmp, VirtualClock(1000.0), levels, inactive
        self.d = _daemon(tmp, self.clock, **cfg)
        self.agents: dict[str, Reconciler] = {}
        self.peers = {n: f"mock://{n}" for n in NODES} if fabric is not None else {}
        for n in NODES:
            self.d.register_node(n, 2, n, "mock", levels=levels, discipline=Discipline.TIMESLICE)
            self.agents[n] = self.agent(n, MockBackend(hostname=n, cores=2, clock=self.clock, fabric=fabric,
                                                       uri=f"mock://{n}", migration_seconds=2.0))

    def agent(self, node: str, backend: MockBackend) -> Reconciler:
        lay = Layout(host=node, cores=(0, 1), levels=self.levels, discipline=Discipline.TIMESLICE,
                     inactive=self.inactive)
        return Reconciler(backend, lay, MemorySource(), MemoryReporter(), clock=self.clock,
                          runner=MockProcessRunner(backend), peers={p: u for p, u in self.peers.items() if p != node})

    def step(self, dt: float = 0.0) -> None:
        self.clock.advance(dt)
        self.d.run_once()
        for n, rec in self.agents.items():
            rec.source.set(self.d.desired(n))  # type: ignore[attr-defined]
            res = rec.run_once()
            assert not res.errors, res.errors
            assert res.observed is not None
            self.d.report(res.observed)

    def power(self) -> dict[str, PowerState]:
        """Power state of every job VM, over both agents."""
        return {v.name: v.power for rec in self.agents.values() for v in rec.backend.list_vms()
                if v.name.startswith("j")}


def _job(work: float, procs: int, estimate: float = 500.0) -> dict[str, object]:
    return {"procs": procs, "estimate": estimate, "work_seconds": work}


def test_gang_rows_end_to_end_with_agents_switching_rows_on_their_clock(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    d = c.d
    a, b, x = d.submit([_job(30, 4), _job(30, 2), _job(30, 3)])
    c.step()
    # three jobs of 4, 2 and 3 processes on 4 cores: one row each, the rows' VMs at their levels
    rows = {j.id: j.level for j in (a, b, x)}
    assert sorted(rows.values()) == [0, 1, 2] and all(j.state == JobState.RUNNING for j in (a, b, x))
    sched = d.state.slices
    assert sched == SliceSchedule(SLICE, (0, 1, 2), 0.0)
    for n in NODES:
        doc = d.desired(n)
        assert doc.slices == sched  # the slice clock travels with the node's desired state
        assert desired_from_json(desired_to_json(doc)) == doc
        for v in doc.vms:
            job = d.state.jobs[v.process.job_id] if v.process else None
            assert job is not None and v.level == job.level
    matrix = matrix_doc(d.state, c.clock.now())
    assert matrix["rows_in_use"] == [0, 1, 2] and matrix["holes"] == 3  # b leaves 2 cells, x 1

    gens = {n: d.state.generation[n] for n in NODES}
    seen_rows = []
    for _ in range(6):  # three rows, two slices each: every row runs in turn, only its VMs run
        c.step(SLICE / 2)
        active = sched.active_row(c.clock.now())
        assert all(rec.active_row == active for rec in c.agents.values())
        running = {name.split("-")[0][1:] for name, p in c.power().items() if p is PowerState.RUNNING}
        paused = {name.split("-")[0][1:] for name, p in c.power().items() if p is PowerState.PAUSED}
        owner = next(j.id for j in (a, b, x) if j.level == active)
        assert running == {owner} and owner not in paused
        seen_rows.append(active)
    assert set(seen_rows) == {0, 1, 2}
    assert {n: d.state.generation[n] for n in NODES} == gens  # no new generation per slice
    assert [h["detail"] for h in x.history if h["event"] == "started"] == [f"run 1 as row {x.level} on a:0, a:1, b:0"]
    assert all(rec.row_switches >= 2 and rec.switch_seconds for rec in c.agents.values())
    # each job advanced in its slices only: a third of the wall time
    for j in (a, b, x):
        assert d.state.progress(j, c.clock.now()) == pytest.approx((c.clock.now() - j.tier_since) / 3
                                                                  + j.progress_base)
    for _ in range(30):
        c.step(SLICE / 2)
    assert all(j.state == JobState.DONE for j in (a, b, x)), [(j.id, j.state, j.reason) for j in (a, b, x)]


def test_suspended_slices_do_not_count_against_the_run_time_limit(tmp_path: Path) -> None:
    # estimate 40 s + 5 s grace; 30 s of work at a third of the slices takes ~90 s of wall time
    c = Cluster(tmp_path, estimate_grace_s=5.0)
    d = c.d
    jobs = d.submit([_job(30, 4, estimate=40.0), _job(30, 4, estimate=40.0), _job(30, 4, estimate=40.0)])
    for _ in range(24):
        c.step(SLICE / 2)
    assert all(j.state == JobState.DONE for j in jobs), [(j.id, j.state, j.reason) for j in jobs]
    # a job that really overruns its active time is killed all the same
    (over,) = d.submit([_job(200, 4, estimate=20.0)])
    for _ in range(20):
        c.step(SLICE / 2)
    assert over.state == JobState.KILLED and "past its estimate" in (over.reason or "")


def test_the_schedule_survives_a_vmctld_restart_and_an_agent_restart_keeps_the_phase(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.d.submit([_job(500, 4), _job(500, 2)])
    c.step()
    c.step(SLICE * 1.5)  # mid-slice of row 1
    sched = c.d.state.slices
    gens = {n: c.d.state.generation[n] for n in NODES}
    docs = {n: c.d.desired(n) for n in NODES}
    c.d.close()
    c.d = _daemon(tmp_path, c.clock)  # a restarted (or failed-over) vmctld loads the same schedule
    assert c.d.state.slices == sched
    assert {n: c.d.desired(n) for n in NODES} == docs and {n: c.d.state.generation[n] for n in NODES} == gens
    c.step()
    assert {n: c.d.state.generation[n] for n in NODES} == gens  # its first decision changes nothing
    # an agent restarted mid-slice (a new process over the same hypervisor) resumes the active row at once
    old = c.agents["a"]
    c.agents["a"] = c.agent("a", old.backend)  # type: ignore[arg-type]
    c.step(1.0)
    assert c.agents["a"].active_row == sched.active_row(c.clock.now()) == 1
    assert c.agents["a"].row_switches == 1  # from its initial row 0 to the schedule's


def test_soak_keeps_inactive_rows_running_at_the_lowest_weight(tmp_path: Path) -> None:
    c = Cluster(tmp_path, inactive="soak")
    c.d.submit([_job(500, 4), _job(500, 4)])
    c.step()
    c.step(SLICE / 2)
    weights = {v.name: (v.power, v.weight) for v in c.agents["a"].backend.list_vms() if v.name.startswith("j")}
    assert {p for p, _w in weights.values()} == {PowerState.RUNNING}
    assert sorted(w for _p, w in weights.values()) == [1, 1, 10000, 10000]


def test_a_failed_migration_leaves_the_job_in_its_row(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    d = c.d
    (j,) = d.submit([_job(500, 1)])
    c.step()
    assert j.placement == [("a", 0)] and j.level == 0
    view = d.view()
    target = view.node_of_core.index("b")
    ch = Changes()
    res = d.actuator.apply(Decision(actions=(Move(j.id, (target,), 1, 5.0),)), view, d.state.layout(),
                           c.clock.now(), ch)
    d.commit(ch)
    assert not res.skipped and j.migrating and j.level == 1 and j.placement == [("b", 0)]
    assert j.migrated_at == c.clock.now()
    op = d.state.ops[j.migrating]
    assert op.detail["from_level"] == 0 and op.detail["moves"][0]["mode"] == "live"
    # the leaving VM keeps its old row on the source until it is gone; the target expects it in row 1
    (src,) = [v for v in d.desired("a").vms if v.name == j.vm_name(0)]
    (dst,) = [v for v in d.desired("b").vms if v.name == j.vm_name(0)]
    assert (src.level, src.core, dst.level, dst.core) == (0, 0, 1, 0) and dst.migration is not None
    # the mock hosts share no migration fabric: the migration fails on the agents, and the job is back in
    # row 0 of a:0 (its source slot stayed reserved meanwhile)
    assert d.view().slot_job[0][view.node_of_core.index("a")] == j.id
    for _ in range(6):
        c.clock.advance(1.0)
        for n, rec in c.agents.items():
            rec.source.set(d.desired(n))  # type: ignore[attr-defined]
            res = rec.run_once()
            assert res.observed is not None
            d.report(res.observed)
    assert j.migrating is None and j.level == 0 and j.placement == [("a", 0)]
    assert d.state.ops[op.id].state == "rolled_back"
    assert d.view().slot_job[0][view.node_of_core.index("a")] == j.id


def test_a_gang_job_migrates_to_another_node_and_row(tmp_path: Path) -> None:
    c = Cluster(tmp_path, fabric=MockFabric())
    d = c.d
    (j,) = d.submit([_job(500, 1)])
    c.step()
    view = d.view()
    ch = Changes()
    res = d.actuator.apply(Decision(actions=(Move(j.id, (view.node_of_core.index("b"),), 1, 5.0),)), view,
                           d.state.layout(), c.clock.now(), ch)
    d.commit(ch)
    assert not res.skipped and j.migrating
    for _ in range(8):  # the agents carry it out (2 s on the mock fabric) and report
        c.clock.advance(1.0)
        for n, rec in c.agents.items():
            rec.source.set(d.desired(n))  # type: ignore[attr-defined]
            out = rec.run_once()
            assert out.observed is not None
            d.report(out.observed)
    assert j.migrating is None and j.migrations == 1 and (j.level, j.placement) == (1, [("b", 0)])
    assert j.vm_name(0) in {v.name for v in c.agents["b"].backend.list_vms()}
    assert j.vm_name(0) not in {v.name for v in c.agents["a"].backend.list_vms()}
    assert d.view().slot_job[1][view.node_of_core.index("b")] == j.id
    assert d.view().slot_job[0][view.node_of_core.index("a")] is None  # the source slot is free again


@pytest.mark.parametrize(("params", "param", "error"), [
    ({"mpl": 5, "slice": SLICE}, r"mpl: 5 rows need 5 timeslice levels per core, but the registered agents carry 3",
     PolicyParameterError),
    ({"mpl": 3, "slice": 0.0}, "slice", PolicyParameterError),
    ({"mpl": 3, "slice": -5.0}, "slice", PolicyParameterError),
    ({"mpl": 3, "quota": -1.0}, "quota", PolicyParameterError),
])
def test_bad_gang_parameters_are_refused_naming_them(tmp_path: Path, params: dict[str, object], param: str,
                                                     error: type[Exception]) -> None:
    c = Cluster(tmp_path)
    c.d.submit([_job(30, 2)])
    c.step()
    before = (c.d.policy, {n: c.d.state.generation[n] for n in NODES}, c.d.state.slices)
    with pytest.raises(error, match=param):
        c.d.set_policy("gs", params)
    assert before == (c.d.policy, {n: c.d.state.generation[n] for n in NODES}, c.d.state.slices)


def test_a_gang_policy_on_a_priority_cluster_is_refused(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    d = _daemon(tmp_path, clock)  # no node yet: the first registration decides
    with pytest.raises(PolicyNeedsUnmet, match="the timeslice discipline"):
        d.register_node("p", 2, "p", "mock", levels=2, discipline=Discipline.PRIORITY)
    assert "p" not in d.state.nodes
    d.register_node("t", 2, "t", "mock", levels=3, discipline=Discipline.TIMESLICE)
    with pytest.raises(PolicyParameterError, match="mpl"):
        d.set_policy("bgs", {"mpl": 4})
    assert d.policy is not None and d.policy.name == "gs-m"
