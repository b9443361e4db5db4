"""The decision loop with a virtual clock, a SQLite store in a temp dir and in-process agents: the
real agent reconciler on the mock backend, fed with the daemon's desired state and reporting back."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig, MigrationLimits, parse_config
from vmctl.daemon.core import Daemon
from vmctl.daemon.desired import desired_vms
from vmctl.daemon.view import build_view
from vmctl.errors import ConfigError, Conflict, InvariantViolation, LeaseLost, NotFound
from vmctl.model import Checkpoint, ClusterView, Decision, Discipline, Migrate, Restore, StartFg, Tier
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.registry import create_policy
from vmctl.store import open_store


class Cluster:
    def __init__(self, tmp: Path, nodes: dict[str, int], policy: SchedulingPolicy | None = None,
                 shared_levels: int | None = None, **cfg: Any) -> None:
        """``shared_levels``: the agents run a ``shared`` layout of that many workers per core (task
        bags); default the priority fg/bg pair."""
        self.tmp = tmp
        self.clock = VirtualClock(1000.0)
        base = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0, node_timeout_s=30.0,
                            holder="test-a", checkpoint_dir=str(tmp / "ckpt"))
        self.config = replace(base, **cfg)
        self.policy = policy or create_policy("easy")
        self.daemon = self._new_daemon()
        assert self.daemon.start()
        self.fabric = MockFabric()
        self.agents: dict[str, tuple[Reconciler, MemorySource, MemoryReporter, MockBackend]] = {}
        peers = {n: f"mock://{n}" for n in nodes}
        for name, cores in nodes.items():
            be = MockBackend(hostname=name, cores=cores, clock=self.clock, fabric=self.fabric, uri=f"mock://{name}",
                             migration_seconds=2.0)
            src, rep = MemorySource(None), MemoryReporter()
            lay = Layout(host=name, cores=tuple(range(cores))) if shared_levels is None else \
                Layout(host=name, cores=tuple(range(cores)), levels=shared_levels, discipline=Discipline.SHARED)
            rec = Reconciler(be, lay, src, rep, clock=self.clock,
                             runner=MockProcessRunner(be), peers=peers, migrate_uris=peers)
            self.agents[name] = (rec, src, rep, be)
            self.daemon.register_node(name, cores, name, "mock", levels=lay.levels, discipline=lay.discipline)
        self.down: set[str] = set()

    def _new_daemon(self) -> Daemon:
        return Daemon(self.config, open_store(self.config.store_url), clock=self.clock, policy=self.policy)

    def step(self, dt: float = 1.0) -> None:
        self.clock.advance(dt)
        self.daemon.run_once()
        for name, (rec, src, rep, _be) in self.agents.items():
            if name in self.down:
                continue
            src.set(self.daemon.desired(name))
            rec.run_once()
            assert rep.last is not None
            self.daemon.report(rep.last)
        self.daemon.run_once()

    def run_until(self, cond: Any, limit: float = 500.0, dt: float = 1.0) -> float:
        t = 0.0
        while not cond():
            assert t < limit, "condition not reached"
            self.step(dt)
            t += dt
        return t

    def submit(self, procs: int, estimate: float, work: float, **kw: Any) -> str:
        spec = {"procs": procs, "estimate": estimate, "work_seconds": work, **kw}
        return self.daemon.submit([spec])[0].id

    def state(self, jid: str) -> str:
        return self.daemon.job(jid).state

    def close(self) -> None:
        self.daemon.store.close()

    def restart(self) -> None:
        """A crash: the in-memory state is gone, a new daemon loads the store."""
        self.daemon.store.close()
        self.daemon = self._new_daemon()
        self.clock.advance(self.config.lease_ttl_s + 1)  # the old lease runs out
        assert self.daemon.start()


def _start_what_fits(view: ClusterView) -> tuple[list[Any], list[int]]:
    """StartFg for every queued job, in queue order, that fits the idle fg cores left (lowest first);
    returns the actions and the cores still idle after them."""
    acts: list[Any] = []
    free = sorted(view.idle_fg)
    for j in view.queue:
        if len(free) >= j.procs:
            acts.append(StartFg(j.id, tuple(free[: j.procs])))
            free = free[j.procs:]
    return acts, free


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, {"n1": 4, "n2": 4})


def test_jobs_run_to_completion_through_the_agents(cluster: Cluster) -> None:
    a = cluster.submit(4, 100, 20)
    b = cluster.submit(2, 100, 10)
    cluster.step()
    assert cluster.state(a) == "running" and cluster.state(b) == "running"
    desired = cluster.daemon.desired(cluster.daemon.job(a).placement[0][0])
    assert desired.generation >= 1
    vm = next(v for v in desired.vms if v.process and v.process.job_id == a)
    assert vm.role.value == "fg" and vm.weight == cluster.config.fg_weight
    assert vm.process is not None and vm.process.work_seconds == 20
    cluster.run_until(lambda: cluster.state(a) == "done" and cluster.state(b) == "done")
    job = cluster.daemon.job(a)
    assert job.end_time is not None and job.start_time is not None
    assert 19 <= job.end_time - job.start_time <= 24
    assert all(t["exit_status"] == 0 for t in job.tasks)
    # the VMs of finished jobs are gone from desired state
    for n in ("n1", "n2"):
        assert not [v for v in cluster.daemon.desired(n).vms if v.process is not None]


def test_queue_waits_and_reasons_are_recorded(cluster: Cluster) -> None:
    big = cluster.submit(8, 50, 10)
    waiting = cluster.submit(8, 50, 10)
    cluster.step()
    assert cluster.state(big) == "running"
    assert cluster.state(waiting) == "queued"
    ex = cluster.daemon.explain(waiting)
    assert ex["queue_position"] == 0 and ex["reason"]
    cluster.run_until(lambda: cluster.state(waiting) == "done")


def test_nonzero_exit_fails_the_job(cluster: Cluster) -> None:
    jid = cluster.submit(2, 50, 5)
    cluster.step()
    job = cluster.daemon.job(jid)
    (n0, c0), (n1, c1) = job.placement
    assert n0 == n1
    vms = (VmObserved(job.vm_name(0), PowerState.RUNNING, core=c0, process_job=jid, process_index=0,
                      process_exit=0),
           VmObserved(job.vm_name(1), PowerState.RUNNING, core=c1, process_job=jid, process_index=1,
                      process_exit=3))
    cluster.daemon.report(NodeObserved(node=n0, generation_applied=1, cores=4, vms=vms))
    assert cluster.state(jid) == "failed"
    assert [t["exit_status"] for t in cluster.daemon.job(jid).tasks] == [0, 3]
    # a report about an older run of the job is ignored
    other = cluster.submit(1, 50, 5)
    cluster.step()
    rec = cluster.daemon.job(other)
    stale = VmObserved(f"j{other}-r{rec.run + 5}-p0", PowerState.RUNNING, process_exit=1)
    cluster.daemon.report(NodeObserved(node=rec.placement[0][0], generation_applied=1, cores=4, vms=(stale,)))
    assert cluster.state(other) == "running"


def test_restart_loses_nothing_and_starts_nothing_twice(cluster: Cluster) -> None:
    ids = [cluster.submit(2, 100, 15) for _ in range(6)]  # 12 procs on 8 cores: some wait
    cluster.step()
    running = {j for j in ids if cluster.state(j) == "running"}
    runs = {j: cluster.daemon.job(j).run for j in running}
    gens = {n: cluster.daemon.desired(n).generation for n in ("n1", "n2")}
    cluster.restart()
    assert {j for j in ids if cluster.state(j) == "running"} == running
    assert {n: cluster.daemon.desired(n).generation for n in ("n1", "n2")} == gens
    cluster.run_until(lambda: all(cluster.state(j) == "done" for j in ids))
    for j in running:
        assert cluster.daemon.job(j).run == runs[j], "a running job was started again after the restart"
    started = [e for _rec, _s, _r, be in cluster.agents.values() for e in be.operations("start_process")]
    assert len(started) == sum(cluster.daemon.job(j).spec["procs"] for j in ids)


def test_lost_node_requeues_its_jobs(cluster: Cluster) -> None:
    jid = cluster.submit(4, 100, 60)
    cluster.step()
    node = cluster.daemon.job(jid).placement[0][0]
    cluster.down.add(node)
    cluster.run_until(lambda: cluster.daemon.node(node).state == "lost", limit=60)
    assert cluster.state(jid) == "running" and cluster.daemon.job(jid).run == 1  # lost keeps its jobs
    # down (loop.node_down_s): requeued and restarted on the other node (a new run)
    cluster.run_until(lambda: cluster.daemon.node(node).state == "down", limit=400)
    cluster.run_until(lambda: cluster.state(jid) == "running")
    job = cluster.daemon.job(jid)
    assert job.run == 2 and {n for n, _c in job.placement} == ({"n1", "n2"} - {node})


def test_drain_keeps_running_jobs_and_stops_new_ones(cluster: Cluster) -> None:
    first = cluster.submit(4, 100, 10)
    cluster.step()
    node = cluster.daemon.job(first).placement[0][0]
    assert cluster.daemon.set_node_state(node, drain=True).state == "draining"
    more = [cluster.submit(4, 100, 10) for _ in range(2)]
    cluster.step()
    assert cluster.state(first) == "running"
    cluster.run_until(lambda: cluster.state(first) == "done")
    used: set[str] = set()

    def finished() -> bool:
        for j in more:
            used.update(n for n, _c in cluster.daemon.job(j).placement)
        return all(cluster.state(j) == "done" for j in more)

    cluster.run_until(finished)
    assert used and node not in used, "a draining node got new work"
    assert cluster.daemon.node(node).state == "drained"
    assert cluster.daemon.set_node_state(node, drain=False).state == "ready"


def test_kill_at_estimate(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2}, estimate_grace_s=2.0)
    jid = c.submit(1, 10, 1000)  # asks for 10 s, needs 1000
    c.run_until(lambda: c.state(jid) != "queued" and c.state(jid) != "running", limit=40)
    assert c.state(jid) == "killed"
    assert "estimate" in (c.daemon.job(jid).reason or "")


def test_cancel_is_idempotent_and_removes_vms(cluster: Cluster) -> None:
    jid = cluster.submit(2, 100, 50)
    cluster.step()
    node = cluster.daemon.job(jid).placement[0][0]
    assert cluster.daemon.cancel(jid).state == "cancelled"
    assert cluster.daemon.cancel(jid).state == "cancelled"
    assert not [v for v in cluster.daemon.desired(node).vms if v.process]
    with pytest.raises(NotFound):
        cluster.daemon.cancel("nope")


def test_operator_migration_completes_through_both_agents(cluster: Cluster) -> None:
    jid = cluster.submit(2, 200, 60)
    cluster.step()
    src = cluster.daemon.job(jid).placement[0][0]
    dst = "n2" if src == "n1" else "n1"
    op = cluster.daemon.migrate_job(jid, dst)
    assert op.state == "pending"
    # two-phase: the target learns of the incoming VM first; the source starts only after the target
    # applied that generation (otherwise the target would prune the arriving VM)
    assert any(v.migration is not None for v in cluster.daemon.desired(dst).vms)
    assert not any(v.migration is not None for v in cluster.daemon.desired(src).vms)
    cluster.step(0.1)
    assert cluster.daemon.state.ops[op.id].detail["stage"] == "go"
    assert any(v.migration is not None for v in cluster.daemon.desired(src).vms)
    cluster.run_until(lambda: cluster.daemon.state.ops[op.id].state != "pending", limit=60)
    assert cluster.daemon.state.ops[op.id].state == "done"
    job = cluster.daemon.job(jid)
    assert {n for n, _c in job.placement} == {dst} and job.migrations == 1
    assert not [v for v in cluster.daemon.desired(src).vms if v.process]
    cluster.run_until(lambda: cluster.state(jid) == "done", limit=200)
    with pytest.raises(Conflict):
        cluster.daemon.migrate_job(jid, src)


def test_migration_rolls_back_when_not_confirmed(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2}, migration=MigrationLimits(timeout_s=5.0))
    jid = c.submit(1, 200, 100)
    c.step()
    src = c.daemon.job(jid).placement[0]
    dst = "n2" if src[0] == "n1" else "n1"
    c.down.add(dst)  # the target agent never confirms
    op = c.daemon.migrate_job(jid, dst)
    c.run_until(lambda: c.daemon.state.ops[op.id].state != "pending", limit=20)
    assert c.daemon.state.ops[op.id].state == "rolled_back"
    assert c.daemon.job(jid).placement == [src]


def test_migration_safety_limits_and_dry_run(tmp_path: Path) -> None:
    class Mover(SchedulingPolicy):
        """Starts everything it can on fg, then moves every running job to the other node."""

        name = "mover"

        def decide(self, view: ClusterView, now: float) -> Decision:
            acts, free = _start_what_fits(view)
            for rj in view.running.values():
                tgt = [c for c in free if view.node_of_core[c] != view.node_of_core[rj.cores[0]]]
                if len(tgt) >= rj.job.procs:
                    acts.append(Migrate(rj.id, tuple(tgt[: rj.job.procs]), Tier.FG, cost=1.0))
                    free = [c for c in free if c not in tgt[: rj.job.procs]]
            return Decision(actions=tuple(acts))

    c = Cluster(tmp_path, {"n1": 4, "n2": 4}, policy=Mover(), migration=MigrationLimits(max_per_host=1,
                                                                                         max_per_cluster=1))
    a, b = c.submit(1, 100, 50), c.submit(1, 100, 50)
    c.step()
    c.clock.advance(c.config.tick_s)  # the periodic tick runs the policy again
    c.daemon.run_once()
    pending = [o for o in c.daemon.state.ops.values() if o.kind == "migrate" and o.state == "pending"]
    assert len(pending) == 1, "max_per_cluster=1 allows one migration at a time"
    assert c.daemon.skipped_total >= 1
    assert any("migration limit" in why for _a, why in (c.daemon.last_result.skipped if c.daemon.last_result else []))
    moving = c.daemon.job(pending[0].job_id)
    assert moving.migrating == pending[0].id and {a, b} >= {moving.id}

    d = Cluster(tmp_path / "dry", {"n1": 4}, policy=Mover(), migration=MigrationLimits(dry_run=True))
    x = d.submit(1, 100, 5)
    d.step()
    d.step(5.0)
    assert d.state(x) == "queued", "dry-run acts on nothing"
    assert d.daemon.last_result is not None and d.daemon.last_result.skipped


def test_invariant_violations_are_caught(tmp_path: Path) -> None:
    class Broken(SchedulingPolicy):
        name = "broken"

        def decide(self, view: ClusterView, now: float) -> Decision:
            return Decision(actions=tuple(StartFg(j.id, (0,) * j.procs) for j in view.queue))

    c = Cluster(tmp_path, {"n1": 2}, policy=Broken())
    c.submit(2, 10, 1)
    with pytest.raises(InvariantViolation):
        c.daemon.decide(c.clock.now())
    assert all(j.state == "queued" for j in c.daemon.state.jobs.values())


def test_second_daemon_is_standby_and_stale_leader_cannot_write(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    other = Daemon(replace(c.config, holder="test-b"), open_store(c.config.store_url), clock=c.clock,
                   policy=c.policy)
    assert other.start() is False and not other.leader
    c.clock.advance(c.config.lease_ttl_s + 1)  # leader a stops renewing
    assert other.try_lead() and other.epoch == c.daemon.epoch + 1
    with pytest.raises(LeaseLost):
        c.daemon.submit([{"procs": 1, "estimate": 5}])
    assert not c.daemon.leader
    assert [j.id for j in other.store.load_jobs()] == []


def test_report_for_unknown_node_is_not_found(cluster: Cluster) -> None:
    with pytest.raises(NotFound):
        cluster.daemon.report(NodeObserved(node="ghost", generation_applied=0, cores=1))


def test_config_rejects_bad_values_with_location(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"migration\.max_per_host"):
        parse_config("migration: {max_per_host: -1}", "d.yaml")
    with pytest.raises(ConfigError, match="unknown key"):
        parse_config("loop: {tick: 1}", "d.yaml")
    with pytest.raises(ConfigError, match="policy"):
        parse_config("policy: {name: nosuch}", "d.yaml")
    cfg = parse_config("policy: {name: easy}\nmigration: {dry_run: true}", "d.yaml")
    assert cfg.policy_name == "easy" and cfg.migration.dry_run


def test_vcsched_mode_runs_shared_capped_vms(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2}, policy=create_policy("vcsched-mcb8"))
    jobs = [c.submit(1, 500, 5) for _ in range(3)]
    c.step()
    assert all(c.state(j) == "running" for j in jobs)
    vms = [v for n in ("n1", "n2") for v in c.daemon.desired(n).vms if v.process is not None]
    assert len(vms) == 3 and all(v.role.value == "shared" and v.core == -1 for v in vms)
    assert all(v.cap is not None and 0 < v.cap <= 1 for v in vms)
    c.run_until(lambda: all(c.state(j) == "done" for j in jobs), limit=100)


def test_vcsched_on_a_4_core_node_caps_at_the_need_and_paces_at_the_yield(tmp_path: Path) -> None:
    """issue 22, on the model clock: one 4-core node. 4 VMs needing 0.4 of a core get caps of 0.4 (yield
    1): their mock processes (using 0.4 of a core each) do 10 s of work in 10 s, and vmctld's progress
    goes at the same pace. Then 5 VMs needing a whole core: 5 cores of need on 4, caps 0.8 each (never
    above one core; the node's caps sum to 4): 8 s of work take 10 s, and vmctld's progress says 0.8/s."""
    c = Cluster(tmp_path, {"n1": 4}, policy=create_policy("vcsched-mcb8"))
    small = c.submit(4, 500, 10, cpu_need=0.4)
    c.step()
    rec = c.daemon.job(small)
    assert rec.state == "running" and rec.cap == pytest.approx(0.4)
    vms = [v for v in c.daemon.desired("n1").vms if v.process is not None]
    assert len(vms) == 4 and all(v.cap == pytest.approx(0.4) and v.process.cpu_usage == pytest.approx(0.4)
                                 for v in vms if v.process is not None)
    start = c.clock.now()
    c.step(5.0)
    assert c.daemon.state.progress(c.daemon.job(small), c.clock.now()) == pytest.approx(c.clock.now() - start)
    c.run_until(lambda: c.state(small) == "done", limit=30)
    assert c.clock.now() - start <= 10.0 + 2.0  # 10 s of work at full pace, plus a step or two of reporting
    big = c.submit(5, 500, 8, cpu_need=1.0)
    c.step()
    rec = c.daemon.job(big)
    assert rec.state == "running" and rec.cap == pytest.approx(0.8)
    be = c.agents["n1"][3]
    caps = [v.cap for v in be.list_vms() if v.cap is not None]
    assert len(caps) == 5 and sum(caps) == pytest.approx(4.0) and max(caps) <= 1.0
    start = c.clock.now()
    c.step(5.0)
    assert c.daemon.state.progress(c.daemon.job(big), c.clock.now()) == pytest.approx(0.8 * (c.clock.now() - start))
    c.run_until(lambda: c.state(big) == "done", limit=30)
    assert 10.0 - 1.0 <= c.clock.now() - start <= 10.0 + 2.0


def test_checkpoint_and_restore_through_the_agents(tmp_path: Path) -> None:
    class CheckpointOnce(SchedulingPolicy):
        """Starts jobs on fg; checkpoints the first one after 2 s of work, restores it 3 s later."""

        name = "checkpoint-once"

        def __init__(self) -> None:
            super().__init__()
            self.saved_at: float | None = None
            self.restored = False
            self.seen: set[tuple[bool, bool]] = set()  # (suspended, checkpointed) of the views' jobs

        def decide(self, view: ClusterView, now: float) -> Decision:
            acts, _free = _start_what_fits(view)
            for rj in view.running.values():
                self.seen.add((rj.suspended, rj.checkpointed))
                if self.saved_at is None and not rj.suspended and rj.progress >= 2:
                    acts.append(Checkpoint(rj.id))
                    self.saved_at = now
                elif rj.suspended and not self.restored and self.saved_at is not None and now >= self.saved_at + 3:
                    acts.append(Restore(rj.id, rj.cores, Tier.FG))
                    self.restored = True
            return Decision(actions=tuple(acts))

    policy = CheckpointOnce()
    c = Cluster(tmp_path, {"n1": 2}, policy=policy)
    jid = c.submit(1, 100, 8)
    c.run_until(lambda: any(o.kind == "checkpoint" for o in c.daemon.state.ops.values()), limit=20)
    ck = next(o for o in c.daemon.state.ops.values() if o.kind == "checkpoint")
    assert c.state(jid) == "suspended"
    vm = next(v for v in c.daemon.desired("n1").vms if v.process is not None)
    assert vm.power is PowerState.SAVED and vm.checkpoint_path
    c.run_until(lambda: c.daemon.state.ops[ck.id].state == "done", limit=20)
    c.run_until(lambda: any(o.kind == "restore" and o.state == "done" for o in c.daemon.state.ops.values()),
                limit=30)
    c.run_until(lambda: c.state(jid) == "done", limit=60)
    job = c.daemon.job(jid)
    assert job.run == 1 and job.tasks[0]["exit_status"] == 0
    assert job.end_time is not None and job.start_time is not None
    assert job.end_time - job.start_time >= 8 + 3 - 1  # the work plus the time spent saved
    # vmctld's view tells the checkpointed job (suspended too: it advances nothing) from a running one
    assert policy.seen == {(False, False), (True, True)}


def test_leaving_vm_keeps_its_source_tier_until_gone(cluster: Cluster) -> None:
    """A bg job promoted by moving to fg cores on another node: its source slot stays reserved in the
    bg tier, so the leaving VM must stay a bg VM there (as fg it could collide with a fg job placed on
    that core meanwhile, and the agent would reject the node's whole desired state)."""
    from vmctl.nodedoc import VmRole

    jid = cluster.submit(1, 200, 60)
    cluster.step()
    src = cluster.daemon.job(jid).placement[0][0]
    dst = "n2" if src == "n1" else "n1"
    op = cluster.daemon.migrate_job(jid, dst)
    rec = cluster.daemon.job(jid)
    assert rec.tier == "fg"
    leaving = [v for v in desired_vms(cluster.daemon.state, src) if v.name == rec.vm_name(0)]
    assert [(v.role, v.weight) for v in leaving] == [(VmRole.FG, 10000)]  # same tier: unchanged
    cluster.daemon.state.ops[op.id].detail["from_tier"] = "bg"  # as after a policy's bg -> fg move
    leaving = [v for v in desired_vms(cluster.daemon.state, src) if v.name == rec.vm_name(0)]
    arriving = [v for v in desired_vms(cluster.daemon.state, dst) if v.name == rec.vm_name(0)]
    assert [(v.role, v.weight) for v in leaving] == [(VmRole.BG, 1)]
    assert [(v.role, v.weight) for v in arriving] == [(VmRole.FG, 10000)]


def test_source_slot_stays_reserved_within_the_decision(tmp_path: Path) -> None:
    """A decision that moves a bg job to fg cores on another node and, later in the same decision,
    starts another job in the bg slot the mover is leaving: the start is skipped (the leaving VM still
    runs there), as it would be in the next decision's view."""
    from vmctl.model import Decision, Migrate, StartBg, Tier

    class Scripted(SchedulingPolicy):
        name = "scripted"

        def __init__(self) -> None:
            super().__init__()
            self.script: list[Decision] = []

        def decide(self, view: Any, now: float) -> Decision:
            return self.script.pop(0) if self.script else Decision(actions=())

    pol = Scripted()
    c = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=pol)
    a = c.submit(1, 500, 400)
    b = c.submit(1, 500, 400)
    pol.script.append(Decision(actions=(StartBg(job_id=a, cores=(0,)),)))
    c.step()
    assert c.daemon.job(a).tier == "bg" and c.daemon.job(a).placement == [("n1", 0)]
    pol.script.append(Decision(actions=(Migrate(job_id=a, cores=(1,), tier=Tier.FG), StartBg(job_id=b, cores=(0,)))))
    c.daemon.dirty = True
    c.daemon.run_once()
    assert c.daemon.job(a).migrating and c.daemon.job(a).placement == [("n2", 0)]
    assert c.daemon.job(b).state == "queued"
    assert c.daemon.last_result is not None and any(act.job_id == b for act, _why in c.daemon.last_result.skipped)
    # the leaving VM on n1 is still the bg VM of its reserved slot, and n1's desired state is valid
    from vmctl.agents.plan import validate

    validate(c.daemon.desired("n1"), Layout(host="n1", cores=(0,)))


# ------------------------------------------------------------------ events while the policy decides
# The API server runs ``Daemon.choose`` in a worker thread between ``begin_pass`` and
# ``finish_decision``; these tests put events exactly there, on one thread.


def _pending(cluster: Cluster) -> Any:
    cluster.clock.advance(1)
    pending = cluster.daemon.begin_pass()
    assert pending is not None
    return pending


def test_a_job_cancelled_while_the_policy_decides_is_not_started(cluster: Cluster) -> None:
    a = cluster.submit(2, 100, 10)
    b = cluster.submit(2, 100, 10)
    pending = _pending(cluster)
    decision = cluster.daemon.choose(pending)
    assert {act.job_id for act in decision.actions} == {a, b}
    cluster.daemon.cancel(a)  # an API call served meanwhile
    cluster.daemon.finish_decision(pending, decision)
    assert cluster.state(a) == "cancelled" and cluster.state(b) == "running"
    res = cluster.daemon.last_result
    assert res is not None and [(s.job_id, why) for s, why in res.skipped] == [(a, "job is cancelled, not queued")]
    assert cluster.daemon.dirty  # the cancel is decided on in the next pass


def test_a_node_drained_while_the_policy_decides_gets_no_new_job(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"n1": 4})
    a = cluster.submit(2, 100, 10)
    pending = _pending(cluster)
    decision = cluster.daemon.choose(pending)
    assert [act.job_id for act in decision.actions] == [a]
    cluster.daemon.set_node_state("n1", drain=True)
    cluster.daemon.finish_decision(pending, decision)
    assert cluster.state(a) == "queued"
    assert not [v for v in cluster.daemon.desired("n1").vms if v.process is not None]
    cluster.close()


def test_a_decision_made_before_a_node_joined_is_dropped_and_made_again(cluster: Cluster) -> None:
    a = cluster.submit(4, 100, 10)
    pending = _pending(cluster)
    decision = cluster.daemon.choose(pending)
    assert decision.actions
    cluster.daemon.register_node("n0", 4, "n0", "mock")  # core numbers move: n0 sorts first
    cluster.daemon.finish_decision(pending, decision)
    assert cluster.state(a) == "queued" and cluster.daemon.dirty
    res = cluster.daemon.last_result
    assert res is not None and not res.applied
    cluster.daemon.run_once()  # decided again on the new layout
    assert cluster.state(a) == "running"
    view = cluster.daemon.view()
    assert sorted(view.running[a].cores) == sorted(
        view.node_of_core.index(n) + c for n, c in cluster.daemon.job(a).placement
    )


def test_a_decision_made_before_a_reload_is_dropped(cluster: Cluster) -> None:
    a = cluster.submit(2, 100, 10)
    pending = _pending(cluster)
    decision = cluster.daemon.choose(pending)
    cluster.daemon.load()  # e.g. after a failed store write
    cluster.daemon.finish_decision(pending, decision)
    assert cluster.state(a) == "queued" and cluster.daemon.dirty
    cluster.daemon.run_once()
    assert cluster.state(a) == "running"


def test_the_two_step_pass_commits_what_run_once_commits(tmp_path: Path) -> None:
    """With no event in between, begin_pass + choose + finish_decision is run_once."""
    results = []
    for split in (False, True):
        c = Cluster(tmp_path / str(split), {"n1": 4, "n2": 4})
        for procs in (4, 2, 2, 8, 1):
            c.submit(procs, 100, 10)
        c.clock.advance(1)
        if split:
            p = c.daemon.begin_pass()
            assert p is not None
            c.daemon.finish_decision(p, c.daemon.choose(p))
        else:
            c.daemon.run_once()
        results.append({j.id: (j.state, tuple(j.placement)) for j in c.daemon.state.jobs.values()})
        c.close()
    assert results[0] == results[1]


def test_the_view_holds_the_state_as_the_pass_began(cluster: Cluster) -> None:
    """The view is read from the state on the event loop (``begin_pass``) and built in the worker thread
    (``choose``): changes served in between (a running job cancelled, a submission) are not in it."""
    a = cluster.submit(2, 100, 10)
    cluster.clock.advance(1)
    cluster.daemon.run_once()
    assert cluster.state(a) == "running"
    cluster.submit(1, 100, 10)
    pending = _pending(cluster)
    before, _lay = build_view(cluster.daemon.state, pending.now, full=True)
    cluster.daemon.cancel(a)  # served while the policy decides
    cluster.submit(1, 100, 10)
    view = pending.built_view()
    assert view.running == before.running and a in view.running
    assert [j.id for j in view.queue] == [j.id for j in before.queue]
