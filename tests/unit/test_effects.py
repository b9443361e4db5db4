"""What ``Occupancy.apply`` returns (``vmctl.policies.effects``): one effect per action, in order, in view
coordinates, whatever the action's name; and ``check_decision`` returns the overlay that holds them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import numpy as np
import pytest
from test_sim_support import WJ, Scripted, wj

from tests.viewbuilder import job, view
from vmctl.errors import InvariantViolation
from vmctl.model import (
    Action,
    Checkpoint,
    ClusterView,
    Decision,
    Demote,
    Discipline,
    JobShape,
    Kill,
    Migrate,
    Move,
    PlaceShared,
    Promote,
    Replicate,
    Resize,
    Restore,
    Resume,
    RunningJob,
    SetCap,
    Start,
    StartBg,
    StartFg,
    Suspend,
    Tier,
    Unreplicate,
)
from vmctl.policies.effects import Effect, EffectKind, Placement
from vmctl.policies.invariants import check_decision
from vmctl.policies.occupancy import Occupancy
from vmctl.policies.registry import create_policy
from vmctl.sim import engine as engine_mod
from vmctl.sim.engine import SimConfig, Simulator

K = EffectKind


def effects(v: ClusterView, *actions: Action) -> list[Effect]:
    return check_decision(v, Decision(actions=actions), 10.0).effects


def test_priority_actions_say_what_they_did() -> None:
    a, b, f = job("a", 1, 10), job("b", 2, 10), job("f", 1, 10)
    v = view(4, queue=[a, b], running=[(f, Tier.FG, (0,), 0.0)])
    got = effects(v, StartBg("a", (0,)), StartFg("b", (1, 2)), Kill("f", requeue=True), Promote("a"),
                  Migrate("b", (3, 1), Tier.BG, 7.0), Demote("a"))
    assert [(e.kind, e.job_id) for e in got] == [(K.STARTED, "a"), (K.STARTED, "b"), (K.STOPPED, "f"),
                                                 (K.MOVED, "a"), (K.MOVED, "b"), (K.MOVED, "a")]
    start_a, start_b, kill, promote, migrate, demote = got
    assert start_a.before is None and start_a.after == Placement(1, (0,))
    assert start_a.after.slots == ((0, 1),)
    assert start_b.after == Placement(0, (1, 2))
    assert kill.before == Placement(0, (0,)) and kill.after is None and kill.requeue
    assert promote.before == Placement(1, (0,)) and promote.after == Placement(0, (0,))
    assert promote.same_cores and promote.cost == 0.0
    # the source of a move stays on the effect (a migration needs it), with the action's cost
    assert migrate.before == Placement(0, (1, 2)) and migrate.after == Placement(1, (3, 1))
    assert migrate.cost == 7.0 and not migrate.same_cores
    assert demote.before == Placement(0, (0,)) and demote.after == Placement(1, (0,))
    assert isinstance(migrate.action, Migrate)


def test_general_actions_give_the_same_effects_as_their_priority_names() -> None:
    a, r = job("a", 1, 10), job("r", 1, 10)
    v = view(3, queue=[a], running=[(r, Tier.BG, (1,), 0.0)])
    prio = effects(v, StartFg("a", (0,)), Promote("r"), Migrate("r", (2,), Tier.BG, 3.0))
    general = effects(v, Start("a", (0,), 0), Move("r", None, 0), Move("r", (2,), 1, 3.0))
    assert [(e.kind, e.after, e.before, e.cost) for e in prio] == [(e.kind, e.after, e.before, e.cost)
                                                                   for e in general]


def test_checkpoint_restore_suspend_resume() -> None:
    v = view(4, running=[(job("a", 2, 10), Tier.FG, (0, 1), 0.0), (job("s", 1, 10), Tier.FG, (3,), 0.0)])
    ck, rs = effects(v, Checkpoint("a"), Restore("a", (2, 3), Tier.BG))
    assert (ck.kind, ck.before, ck.after) == (K.CHECKPOINTED, Placement(0, (0, 1)), None)
    assert (rs.kind, rs.before, rs.after) == (K.RESTORED, None, Placement(1, (2, 3)))
    _, mv = effects(v, Checkpoint("a"), Move("a", (1, 2), level=0, cost=4.0))
    assert (mv.kind, mv.after, mv.cost) == (K.RESTORED, Placement(0, (1, 2)), 4.0)
    sus, res = effects(v, Suspend("s"), Resume("s"))
    assert (sus.kind, sus.before, sus.after) == (K.SUSPENDED, Placement(0, (3,)), Placement(0, (3,)))
    assert (res.kind, res.after) == (K.RESUMED, Placement(0, (3,)))
    # a checkpointed job of the view is killed from nowhere
    ckv = dataclasses.replace(v, running={"a": dataclasses.replace(v.running["a"], suspended=True,
                                                                   checkpointed=True)},
                              fg_job=[None, None, None, "s"], idle_fg={0, 1, 2})
    (kill,) = effects(ckv, Kill("a", requeue=False))
    assert (kill.kind, kill.before, kill.after, kill.requeue) == (K.STOPPED, None, None, False)


def test_rows_of_a_time_sliced_job() -> None:
    slots: list[list[str | None]] = [[None] * 2 for _ in range(3)]
    slots[0][0] = slots[0][1] = "r"
    r = RunningJob(job("r", 2, 100), Tier.FG, (0, 1), 0.0, 0.0, level=0)
    v = ClusterView.leveled(2, [], {"r": r}, slots, [set(), {0, 1}, {0, 1}], Discipline.TIMESLICE, [0.0] * 2,
                            [True] * 2)
    rep, rep2, unrep = effects(v, Replicate("r", 2), Replicate("r", 1), Unreplicate("r", 0))
    assert (rep.kind, rep.before) == (K.REPLICATED, Placement(0, (0, 1)))
    assert rep.after == Placement(0, (0, 1), replicas=(2,))
    assert rep2.after == Placement(0, (0, 1), replicas=(1, 2))
    assert rep2.after is not None and rep2.after.all_slots == ((0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2))
    assert (unrep.kind, unrep.after) == (K.UNREPLICATED, Placement(1, (0, 1), replicas=(2,)))


def test_a_task_bag_resized_onto_two_levels() -> None:
    bag = job("t", 1, 100)
    shape = JobShape.task_bag([10.0] * 4)
    v = ClusterView.leveled(1, [bag], {}, [[None], [None]], [{0}, {0}], Discipline.SHARED, [0.0], [True],
                            queue_index={"t": bag}, shapes={"t": shape})
    start, resize = effects(v, Start("t", (0, 0), slot_levels=(0, 1)), Resize("t", (0,), slot_levels=(1,)))
    assert (start.kind, start.after) == (K.STARTED, Placement(0, (0, 0), (0, 1)))
    assert start.after is not None and start.after.slots == ((0, 0), (0, 1))
    assert (resize.kind, resize.before, resize.after) == (K.RESIZED, start.after, Placement(1, (0,)))


def test_shared_vms_placed_capped_and_moved() -> None:
    new, old = job("new", 1, 10), job("old", 1, 10)
    run = RunningJob(old, Tier.FG, (0,), 0.0, 0.0, cap=0.5, shared_nodes=("a",))
    v = dataclasses.replace(view(2, queue=[new]), running={"old": run}, node_of_core=["a", "b"],
                            node_names=["a", "b"], queue_index={"new": new})
    place, cap, move = effects(v, PlaceShared("new", ("b",), 0.3), SetCap("old", 0.2), PlaceShared("old", ("b",), 0.4))
    assert (place.kind, place.before, place.after) == (K.PLACED_SHARED, None, Placement(-1, (), nodes=("b",), cap=0.3))
    assert place.after is not None and place.after.shared and place.after.slots == ()
    assert (cap.kind, cap.before, cap.after) == (K.CAPPED, Placement(-1, (), nodes=("a",), cap=0.5),
                                                  Placement(-1, (), nodes=("a",), cap=0.2))
    assert (move.kind, move.before.nodes if move.before else None, move.after) == (
        K.PLACED_SHARED, ("a",), Placement(-1, (), nodes=("b",), cap=0.4))


def test_a_refused_action_adds_no_effect() -> None:
    v = view(2, queue=[job("a", 1, 10)])
    occ = Occupancy(v, {"a": v.queue[0]}, 10.0)
    occ.apply(StartFg("a", (0,)))
    with pytest.raises(InvariantViolation):
        occ.apply(StartFg("a", (1,)))
    assert [e.kind for e in occ.effects] == [K.STARTED]
    assert occ.effects[0] is not None and occ.placement("a") == Placement(0, (0,))


# ----------------------------------------------------------------------------- the simulator commits them


def _jobs(n: int, seed: int) -> list[WJ]:
    rng = np.random.default_rng(seed)
    out, t = [], 0.0
    for i in range(n):
        t += float(rng.exponential(20.0))
        procs = int(rng.choice([1, 1, 2, 3, 4, 8]))
        run = float(rng.exponential(300.0)) + 1.0
        usage = tuple(float(u) for u in rng.uniform(0.3, 1.0, procs))
        out.append(wj(i + 1, t, run, procs, run * float(rng.uniform(0.8, 3.0)), usage))
    return out


@pytest.mark.parametrize("policy", ["easy", "keasy", "measy", "measy-cost", "reasy", "vcsched-mcb8"])
def test_the_two_tier_fast_path_agrees_with_the_effects(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two-tier engine applies the decisions ``accepts_fast`` accepts directly, and commits the
    effects of every other: over seeded random workloads, a run with the fast path switched off (every
    decision committed from the checker's effects) gives the very same results, job by job."""
    fast_starts = 0
    kinds: set[tuple[EffectKind, bool]] = set()  # (kind, keeps its cores)
    name, params = ("measy", {"migration_cost": 30.0}) if policy == "measy-cost" else (policy, {})
    for seed in range(8):
        jobs = _jobs(50, seed)
        fast = Simulator(jobs, 8, create_policy(name, **params), SimConfig(seed=seed))
        fast.lean_loop = False  # the two-tier engine's own fast path (the lean loop's: tests/unit/test_sim_lean.py)
        applied = fast._apply_starts

        def count_fast(decision: Decision, applied: Callable[[Decision], None] = applied) -> None:
            nonlocal fast_starts
            fast_starts += len(decision.actions)
            applied(decision)

        fast._apply_starts = count_fast  # type: ignore[method-assign]
        fast_result = fast.run()
        with monkeypatch.context() as m:
            m.setattr(engine_mod, "accepts_fast", lambda view, decision, now: False)
            slow = Simulator(jobs, 8, create_policy(name, **params), SimConfig(seed=seed))
            committed = slow._commit_effects

            def count_kinds(decision: Decision, occ: Occupancy,
                            committed: Callable[[Decision, Occupancy], None] = committed) -> None:
                kinds.update((e.kind, e.same_cores) for e in occ.effects)
                committed(decision, occ)

            slow._commit_effects = count_kinds  # type: ignore[method-assign]
            slow_result = slow.run()
        assert json.dumps(slow_result.to_dict(), sort_keys=True) == json.dumps(fast_result.to_dict(), sort_keys=True)
        assert repr(list(slow.job_rows())) == repr(list(fast.job_rows()))
    assert fast_starts > 0 or policy.startswith("vcsched")  # both paths ran (vcsched places shared VMs only)
    # the effects went beyond starts: kills, promotions (in place), migrations (other cores), shared VMs
    expected = {"easy": {K.STARTED}, "reasy": {K.STARTED}, "keasy": {K.STARTED, K.STOPPED},
                "measy": {K.STARTED, K.MOVED}, "measy-cost": {K.STARTED, K.MOVED},
                "vcsched-mcb8": {K.PLACED_SHARED}}[policy]
    assert expected <= {kind for kind, _same in kinds}, kinds
    if policy.startswith("measy"):
        assert {(K.MOVED, True), (K.MOVED, False)} <= kinds, kinds


def test_the_two_tier_engine_moves_in_place_or_onto_other_cores_as_the_effect_says() -> None:
    """A move that keeps its cores is a change of tier in place (its cost, if any, paid as time without
    progress; no migration); one onto other cores is a migration, whatever the action's name."""
    cfg = SimConfig(two_tier=False)  # no fg loss: a job advances at 1 in fg
    jobs = [wj(1, 0, 100, 1), wj(2, 0, 20, 1)]

    def run(moves: list[Action]) -> Simulator:
        sim = Simulator(jobs, 2, Scripted({0.0: [StartFg("2", (0,)), StartBg("1", (0,))], 20.0: moves}), cfg)
        sim.run()
        return sim

    free = run([Promote("1")])
    paid = run([Move("1", None, level=0, cost=5.0)])
    moved = run([Move("1", (1,), level=0, cost=5.0)])
    for sim in (free, paid, moved):
        assert next(r for r in sim.job_rows() if r["id"] == "1")["tier_changes"] == 1
    start_free, end_free = free.outcome("1")
    assert paid.outcome("1") == (start_free, end_free + 5.0)
    assert moved.outcome("1") == (start_free, end_free + 5.0)
    assert [next(r for r in s.job_rows() if r["id"] == "1")["migrations"] for s in (free, paid, moved)] == [0, 0, 1]
