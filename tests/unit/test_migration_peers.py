"""issue 9 item 4: a missing ``peers`` entry froze a node for ``migration.timeout_s``.

With node4 added and node3's agent config not listing it, MEASY planned node3 -> node4, node3's agent
refused every new generation ("unknown peer 'node4'") until the migration timed out, and no CLI view
showed it. Here: vmctld learns which nodes each node can migrate to when its agent registers, does
not offer the policy (nor accept from an operator or a policy that ignores the view) a migration
between nodes that cannot reach each other, and when an agent refuses one anyway (an agent that did
not register its peers) the rest of the generation is applied, the refusal reaches vmctld in that
report and the migration is rolled back at once, with the reason in ``explain`` and ``node show``.

A virtual clock, a SQLite store in a temp dir and the real agent reconciler on the mock backend,
stepped by hand (no timing)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.api.documents import node_json
from vmctl.cli.job import explain_text
from vmctl.cli.render import node_table, node_text
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig, MigrationLimits
from vmctl.daemon.core import Daemon
from vmctl.errors import Conflict
from vmctl.model import ClusterView, Decision, Migrate, StartFg, Tier
from vmctl.nodedoc import MigrationRefusal, NodeObserved
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.registry import create_policy
from vmctl.store import open_store
from vmctl.wire import observed_from_json, observed_to_json

TIMEOUT_S = 600.0  # migration.timeout_s: the length of the freeze that was seen


class Cluster:
    """vmctld + one in-process agent per node; ``peers[node]`` is that agent's ``peers:`` config.
    ``register_peers``: whether the agents tell vmctld their peers when they register (False: an
    agent from before this change)."""

    def __init__(self, tmp: Path, policy: SchedulingPolicy, register_peers: bool = True) -> None:
        self.clock = VirtualClock(1000.0)
        self.config = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0,
                                   node_timeout_s=30.0, holder="peers-test", checkpoint_dir=str(tmp / "ckpt"),
                                   migration=MigrationLimits(timeout_s=TIMEOUT_S))
        self.daemon = Daemon(self.config, open_store(self.config.store_url), clock=self.clock, policy=policy)
        assert self.daemon.start()
        self.fabric = MockFabric()
        self.register_peers = register_peers
        self.agents: dict[str, tuple[Reconciler, MemorySource, MemoryReporter, MockBackend]] = {}

    def add_node(self, name: str, cores: int, peers: list[str]) -> None:
        be = MockBackend(hostname=name, cores=cores, clock=self.clock, fabric=self.fabric, uri=f"mock://{name}",
                         migration_seconds=2.0)
        uris = {p: f"mock://{p}" for p in peers}
        src, rep = MemorySource(None), MemoryReporter()
        rec = Reconciler(be, Layout(host=name, cores=tuple(range(cores))), src, rep, clock=self.clock,
                         runner=MockProcessRunner(be), peers=uris, migrate_uris=uris)
        self.agents[name] = (rec, src, rep, be)
        if self.register_peers:
            self.daemon.register_node(name, cores, name, "mock", rec.peers, rec.checkpoint_peers)
        else:
            self.daemon.register_node(name, cores, name, "mock")

    def agent_cycle(self, name: str) -> NodeObserved:
        """One reconcile cycle of ``name``'s agent on its current desired state, and its report (through
        the wire codec, as it travels) handed to vmctld."""
        rec, src, rep, _be = self.agents[name]
        src.set(self.daemon.desired(name))
        rec.run_once()
        assert rep.last is not None
        obs = observed_from_json(observed_to_json(rep.last))
        self.daemon.report(obs)
        return obs

    def step(self, dt: float = 1.0) -> None:
        self.clock.advance(dt)
        self.daemon.run_once()
        for name in self.agents:
            self.agent_cycle(name)
        self.daemon.run_once()

    def run_until(self, cond: Any, what: str, limit: int = 300) -> None:
        for _ in range(limit):
            if cond():
                return
            self.step()
        raise AssertionError(f"{what}: not within {limit} model seconds")

    def submit(self, procs: int, estimate: float, work: float, **kw: Any) -> str:
        return self.daemon.submit([{"procs": procs, "estimate": estimate, "work_seconds": work, **kw}])[0].id

    def migrations(self) -> list[Any]:
        return [o for o in self.daemon.state.ops.values() if o.kind == "migrate"]

    def close(self) -> None:
        self.daemon.store.close()


def _bg_job_on_node3(c: Cluster) -> tuple[str, str]:
    """node3 (1 core) runs A in fg (half a core) and B in bg; returns (A, B)."""
    a = c.submit(1, 5000, 4000, cpu_usage=[0.5])
    c.step()
    b = c.submit(1, 5000, 4000)
    c.step()
    c.step()
    assert c.daemon.job(a).tier == "fg" and c.daemon.job(b).tier == "bg"
    assert c.daemon.job(b).placement == [("node3", 0)]
    return a, b


def test_measy_is_not_offered_a_migration_to_a_node_missing_from_peers(tmp_path: Path) -> None:
    """The reported case: node4 joins, node3's config does not list it. MEASY would move node3's bg job
    to node4's idle fg slot; the view says node3 cannot reach node4, so it does not, and node3 keeps
    taking new generations (a job submitted later runs)."""
    c = Cluster(tmp_path, create_policy("measy"))
    c.add_node("node3", 1, peers=[])  # the agent knows no peers
    _a, b = _bg_job_on_node3(c)
    c.add_node("node4", 1, peers=["node3"])
    for _ in range(5):
        c.step()
    assert c.migrations() == [], "no migration node3 -> node4 may be planned"
    view = c.daemon.view()
    assert not view.can_migrate("node3", "node4") and view.can_migrate("node4", "node3")
    stored = {n.name: n.peers for n in c.daemon.store.load_nodes()}  # a restarted vmctld knows it too
    assert stored == {"node3": [], "node4": ["node3"]}
    assert c.daemon.job(b).tier == "bg" and c.daemon.job(b).placement == [("node3", 0)]
    # node4's idle core is not held for B (which cannot use it): a job submitted now starts there
    d = c.submit(1, 100, 50)
    c.step()
    assert c.daemon.job(d).state == "running" and c.daemon.job(d).placement == [("node4", 0)]
    c.run_until(lambda: c.daemon.job(d).state == "done", "job D to finish")
    assert c.migrations() == []
    # node3 is not frozen: its agent applied every generation and refused nothing
    rep = c.agents["node3"][2].last
    assert rep is not None and rep.generation_applied == c.daemon.state.generation["node3"]
    assert not rep.errors and not rep.refusals
    # the operator sees which nodes node3 can reach
    n3 = node_json(c.daemon, c.daemon.node("node3"))
    assert n3["peers"] == [] and n3["checkpoint_peers"] is None
    assert "none" in node_text(n3) and node_table([n3], wide=True).rows[0][
        node_table([n3], wide=True).headers.index("PEERS")] == "none"
    # once node3's agent lists node4 (it registers again after a config change) MEASY migrates the job
    c.agents["node3"][0].peers["node4"] = "mock://node4"
    c.daemon.register_node("node3", 1, "node3", "mock", c.agents["node3"][0].peers)
    c.step()
    assert [o.job_id for o in c.migrations()] == [b]
    c.run_until(lambda: not c.daemon.job(b).migrating, "the migration to complete")
    assert c.daemon.job(b).tier == "fg" and c.daemon.job(b).placement == [("node4", 0)]
    assert c.migrations()[0].state == "done"
    c.close()


class Scripted(SchedulingPolicy):
    """Returns the decisions it is given, one per call (a policy that ignores ``can_migrate``)."""

    name = "scripted"

    def __init__(self) -> None:
        super().__init__()
        self.script: list[Decision] = []

    def decide(self, view: ClusterView, now: float) -> Decision:
        return self.script.pop(0) if self.script else Decision(actions=())


def test_actuator_and_operator_refuse_a_move_between_nodes_that_cannot_reach_each_other(tmp_path: Path,
                                                                                       caplog: Any) -> None:
    pol = Scripted()
    c = Cluster(tmp_path, pol)
    c.add_node("node3", 2, peers=["node1"])
    c.add_node("node4", 2, peers=["node3"])
    jid = c.submit(1, 500, 400)
    pol.script.append(Decision(actions=(StartFg(jid, (1,)),)))  # node3 core 1
    c.daemon.dirty = True
    c.daemon.run_once()
    assert c.daemon.job(jid).placement == [("node3", 1)]
    # a policy that moves it to node4 anyway: skipped, with the reason logged
    pol.script.append(Decision(actions=(Migrate(jid, (3,), Tier.FG),)))  # node4 core 1
    c.daemon.dirty = True
    with caplog.at_level("INFO", logger="vmctld.actuator"):
        c.daemon.run_once()
    res = c.daemon.last_result
    assert res is not None and not res.applied
    assert [why for _a, why in res.skipped] == ["node node3 cannot reach node4: its agent's config has no peers.node4"]
    assert "peers.node4" in caplog.text
    assert c.migrations() == [] and c.daemon.job(jid).placement == [("node3", 1)]
    # the operator: 409 Conflict naming the missing peer entry
    with pytest.raises(Conflict, match=r"peers\.node4") as ei:
        c.daemon.migrate_job(jid, "node4")
    assert ei.value.http_status == 409
    assert c.migrations() == []
    c.close()


def test_an_agent_refusal_applies_the_rest_and_rolls_the_migration_back_at_once(tmp_path: Path) -> None:
    """node3's agent registered no peers (an agent from before this change), so vmctld lets the operator
    move a job to node4; node3's agent cannot: it refuses that migration alone, applies the rest of the
    same generation (a job placed on node3 meanwhile starts), its next report carries the refusal and
    vmctld rolls the migration back on that report, long before ``migration.timeout_s``."""
    c = Cluster(tmp_path, create_policy("easy"), register_peers=False)
    c.add_node("node3", 2, peers=[])
    b = c.submit(1, 5000, 4000)
    c.step()
    assert c.daemon.job(b).placement == [("node3", 1)]
    c.add_node("node4", 1, peers=[])
    c.step()
    t0 = c.clock.now()
    op = c.daemon.migrate_job(b, "node4")  # accepted: vmctld was not told node3's peers
    c.agent_cycle("node4")  # the target applies the generation that expects the VM: the source may go
    assert c.daemon.state.ops[op.id].detail["stage"] == "go"
    # the same node3 generation that asks for the migration also starts job C on node3
    cjob = c.submit(1, 5000, 4000)
    c.daemon.run_once()
    assert c.daemon.job(cjob).placement[0][0] == "node3"
    desired = c.daemon.desired("node3")
    assert any(v.migration is not None and v.migration.migration_id == op.id for v in desired.vms)
    assert any(v.process is not None and v.process.job_id == cjob for v in desired.vms)

    obs = c.agent_cycle("node3")  # one cycle, one report

    # (b1) the rest of the generation was applied: C runs, the generation is acknowledged
    assert obs.generation_applied == desired.generation
    be = c.agents["node3"][3]
    c_vm = next(v.name for v in desired.vms if v.process is not None and v.process.job_id == cjob)
    assert be.process_status(c_vm) is not None
    # (b2) the refusal reached vmctld in that report ...
    assert [(r.migration_id, r.target_node) for r in obs.refusals] == [(op.id, "node4")]
    assert "unknown peer 'node4'" in obs.refusals[0].reason
    # (b3) ... and the migration was rolled back on it, at once
    rolled = c.daemon.state.ops[op.id]
    assert rolled.state == "rolled_back" and c.clock.now() - t0 < TIMEOUT_S / 100
    assert "node3 refused it: unknown peer 'node4'" in rolled.detail["note"]
    job = c.daemon.job(b)
    assert not job.migrating and job.placement[0][0] == "node3"
    assert not any(v.migration is not None for v in c.daemon.desired("node3").vms)
    # the reason is in explain
    exp = c.daemon.explain(b)
    assert exp["migrations"][-1]["state"] == "rolled_back" and "peers.node4" in exp["migrations"][-1]["note"]
    assert "rolled_back: the agent of node3 refused it" in explain_text(exp)
    # (b4) the operator sees it on the node: the agent's last errors
    text = node_text(node_json(c.daemon, c.daemon.node("node3")))
    assert f"migration {op.id} of {job.vm_name(0)} to node4 refused: unknown peer 'node4'" in text
    # the agent goes on: its next report has nothing refused, and both jobs keep running on node3
    c.step()
    assert not c.agents["node3"][2].last.refusals  # type: ignore[union-attr]
    assert c.daemon.job(b).state == "running" and c.daemon.job(cjob).state == "running"
    # ``node show`` keeps the agent's latest errors after a clean report
    assert "unknown peer 'node4'" in node_text(node_json(c.daemon, c.daemon.node("node3")))
    c.close()


def test_wire_carries_refusals_and_reads_old_reports() -> None:
    obs = NodeObserved(node="n1", generation_applied=3, cores=2,
                       refusals=(MigrationRefusal(vm="j1-r1-p0", migration_id="op7", target_node="n4", reason="x"),))
    assert observed_from_json(observed_to_json(obs)) == obs
    old = observed_to_json(replace(obs, refusals=()))
    del old["refusals"]
    assert observed_from_json(old).refusals == ()
    bad = observed_to_json(obs)
    bad["refusals"][0]["migration_id"] = 7
    with pytest.raises(Exception, match=r"refusals\[0\]\.migration_id"):
        observed_from_json(bad)


def test_measy_migrates_only_where_every_node_of_the_job_reaches_and_holds_nothing_for_it() -> None:
    """The policy alone, on a hand-built view: B runs in bg on node3's two cores under two fg jobs;
    node4's two fg slots are idle. Unrestricted (the simulator), MEASY migrates B there. When node3
    cannot reach node4, B stays in bg and is not the head of a reservation it could never use: the
    queued job D takes node4's cores now."""
    from tests.viewbuilder import job, view

    a1, a2 = job("A1", 1, 1000, usage=0.5), job("A2", 1, 2000, usage=0.5)
    b, d = job("B", 2, 9000, submit=1.0), job("D", 2, 5000, submit=2.0)
    base = view(4, queue=[d], running=[(a1, Tier.FG, (0,), 0.0), (a2, Tier.FG, (1,), 0.0), (b, Tier.BG, (0, 1), 1.0)],
                now=10.0)
    base = replace(base, node_of_core=("node3", "node3", "node4", "node4"), local_core=(0, 1, 0, 1),
                   node_names=("node3", "node4"))
    measy = create_policy("measy")
    free = measy.decide(base, 10.0)
    assert (free.actions[0].kind, free.actions[0].job_id) == ("migrate", "B")
    barred = replace(base, migration_targets={"node3": frozenset(), "node4": frozenset({"node3"})})
    dec = measy.decide(barred, 10.0)
    assert not any(isinstance(a, Migrate) for a in dec.actions)
    assert [(a.kind, a.job_id, sorted(a.cores)) for a in dec.actions] == [("start_fg", "D", [2, 3])]  # type: ignore[union-attr]
    # a job on node3 and node4 may go only to cores of nodes both reach
    assert barred.can_migrate("node4", "node3") and not barred.can_migrate("node3", "node4")
    assert barred.can_migrate("node3", "node3") and replace(base, migration_targets=None).can_migrate("node3", "x")
