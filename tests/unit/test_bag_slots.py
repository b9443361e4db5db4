"""A task bag holding worker slots on several levels of a core (issue 12; ``slot_levels`` on
``Start``/``Resize``/``RunningJob``): the one occupancy model's rules per (core, level) slot, the checker
(its fast path refuses exactly what the replay refuses on such decisions too), the simulator's task-bag
model (rates per slot) and the dispatch policies' slot rule, by hand."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_dispatch_policy import bag, ends, simulate
from vmctl.errors import InvariantViolation
from vmctl.model import (
    Action,
    ClusterView,
    Decision,
    Discipline,
    Job,
    JobShape,
    Kill,
    Move,
    Resize,
    RunningJob,
    Start,
    Tier,
)
from vmctl.policies import invariants
from vmctl.policies.invariants import check_decision
from vmctl.policies.occupancy import Occupancy

NOW = 10.0


def _job(jid: str, procs: int = 2) -> Job:
    return Job(id=jid, submit_time=0.0, procs=procs, estimate=100.0)


def _view(cores: int, levels: int, slots: list[list[str | None]] | None = None, queue: tuple[Job, ...] = (),
          running: dict[str, RunningJob] | None = None, discipline: Discipline = Discipline.SHARED,
          bags: tuple[str, ...] = ("t", "u", "v")) -> ClusterView:
    slots = slots or [[None] * cores for _ in range(levels)]
    idle = [{c for c in range(cores) if row[c] is None} for row in slots]
    return ClusterView.leveled(cores, list(queue), running or {}, slots, idle, discipline, [0.0] * cores,
                               [True] * cores, shapes={b: JobShape.task_bag([10.0] * 4) for b in bags})


def _refused(v: ClusterView, *actions: Action) -> str:
    try:
        check_decision(v, Decision(actions=actions, default_reason="w"), NOW)
    except InvariantViolation as exc:
        return str(exc)
    return "ok"


def test_a_bag_takes_both_levels_of_a_core() -> None:
    v = _view(2, 2, queue=(_job("t"),))
    act = Start("t", (0, 0, 1), slot_levels=(0, 1, 1))
    assert _refused(v, act) == "ok"
    occ = Occupancy(v, {"t": v.queue[0]}, NOW)
    occ.apply(act)
    assert [occ.slot(lv, c) for c, lv in ((0, 0), (0, 1), (1, 0), (1, 1))] == ["t", "t", None, "t"]
    assert occ.slots("t") == ((0, 0), (0, 1), (1, 1))
    # all on one level: placed as any job is (no per-slot levels kept)
    occ2 = Occupancy(v, {"t": v.queue[0]}, NOW)
    occ2.apply(Start("t", (0, 1), 5, slot_levels=(1, 1)))
    assert occ2.placed["t"] == (1, (0, 1)) and "t" not in occ2.multi


@pytest.mark.parametrize(("actions", "rule"), [
    ((Start("t", (0, 0), slot_levels=(0, 0)),), "cores-distinct"),  # one slot twice
    ((Start("t", (0, 1), slot_levels=(0,)),), "slot-levels"),  # one level for two cores
    ((Start("t", (0, 1), slot_levels=(0, 2)),), "level-range"),
    ((Start("r", (0, 1), slot_levels=(0, 1)),), "slot-levels"),  # not a task bag
    ((Start("t", (0, 0), slot_levels=(0, 1)), Start("u", (0,), 1)), "two-bg"),  # double-booked
    ((Start("t", (0, 0), slot_levels=(0, 1)), Move("t", (1, 1), 0)), "slot-levels"),
])
def test_illegal_multi_level_placements_name_the_rule(actions: tuple[Action, ...], rule: str) -> None:
    v = _view(2, 2, queue=(_job("t"), _job("u", 1), _job("r")))
    assert _refused(v, *actions).startswith(f"{rule}:"), _refused(v, *actions)


def test_only_a_shared_cluster_gives_a_bag_several_levels() -> None:
    for discipline in (Discipline.PRIORITY, Discipline.TIMESLICE):
        v = _view(2, 2, queue=(_job("t"),), discipline=discipline)
        got = _refused(v, Start("t", (0, 0), slot_levels=(0, 1)))
        assert got.startswith("slot-levels:") and discipline.value in got


def test_resize_kill_and_capacity_per_slot() -> None:
    """A running bag on (0, 0), (0, 1), (1, 1); u holds level 0 of core 1."""
    rj = RunningJob(job=_job("t", 3), tier=Tier.FG, cores=(0, 0, 1), start_time=0.0, tier_since=0.0,
                    slot_levels=(0, 1, 1))
    assert rj.level == 0 and rj.slots == ((0, 0), (0, 1), (1, 1))
    urj = RunningJob(job=_job("u", 1), tier=Tier.FG, cores=(1,), start_time=0.0, tier_since=0.0)
    slots: list[list[str | None]] = [["t", "u"], ["t", "t"]]
    v = _view(2, 2, slots, queue=(_job("v", 1),), running={"t": rj, "u": urj})
    # shrink to level 1 of core 0: the given-up slots are free for others in the same decision (an executor
    # keeps a slot whose worker still runs a task: tests/unit/test_sim_shapes.py, the dispatcher's tests)
    assert _refused(v, Resize("t", (0,), slot_levels=(1,)), Start("v", (0,), 0)) == "ok"
    assert _refused(v, Resize("t", (0,), slot_levels=(1,)), Start("v", (1,), 1)) == "ok"
    # a grow onto a slot another job holds is refused; one onto its own slots is not
    assert _refused(v, Resize("t", (0, 1), slot_levels=(0, 0))).startswith("two-fg:")
    assert _refused(v, Resize("t", (0, 0, 1), slot_levels=(1, 0, 1))) == "ok"
    # a kill frees every slot of the bag
    occ = Occupancy(v, {}, NOW)
    occ.apply(Kill("t"))
    assert [occ.slot(lv, c) for c, lv in ((0, 0), (0, 1), (1, 0), (1, 1))] == [None, None, "u", None]
    assert _refused(v, Start("v", (0,), 1)).startswith("two-bg:")


@st.composite
def multi_cases(draw: st.DrawFn) -> tuple[ClusterView, Decision]:
    """Decisions of starts with and without slot levels, on shared (and other) views with task bags."""
    n = draw(st.integers(1, 3))
    levels = draw(st.integers(1, 3))
    discipline = draw(st.sampled_from([Discipline.SHARED] * 4 + [Discipline.TIMESLICE]))
    slots: list[list[str | None]] = [[f"r{lv}{c}" if draw(st.integers(0, 3)) == 0 else None for c in range(n)]
                                     for lv in range(levels)]
    queue = [_job(f"q{i}", draw(st.integers(1, 2 * n))) for i in range(draw(st.integers(1, 3)))]
    bags = tuple(j.id for j in queue if draw(st.integers(0, 3)) > 0)
    v = _view(n, levels, slots, queue=tuple(queue), discipline=discipline, bags=bags)
    actions: list[Action] = []
    for _ in range(draw(st.integers(1, 3))):
        jid = draw(st.sampled_from([j.id for j in queue]))
        width = draw(st.integers(0, 2 * n + 1))
        cores = tuple(draw(st.integers(-1, n)) for _ in range(width))
        lv = tuple(draw(st.integers(0, levels)) for _ in range(width + draw(st.sampled_from([0, 0, 0, 1]))))
        actions.append(Start(jid, cores, draw(st.integers(0, levels - 1)),
                             slot_levels=draw(st.sampled_from([lv, lv, None]))))
    return v, Decision(actions=tuple(actions), default_reason="w")


def _outcome(fn: object, v: ClusterView, d: Decision) -> str:
    try:
        fn(v, d, NOW)  # type: ignore[operator]
    except InvariantViolation as exc:
        return str(exc)
    return "ok"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=multi_cases())
def test_the_checker_refuses_exactly_what_the_replay_refuses_on_multi_level_starts(
        case: tuple[ClusterView, Decision]) -> None:
    v, d = case
    general = _outcome(invariants._check_general, v, d)
    assert _outcome(check_decision, v, d) == general
    if invariants.accepts_fast(v, d, NOW):
        assert general == "ok"


def test_the_multi_level_cases_reach_acceptance_and_each_rule() -> None:
    seen: set[str] = set()

    @settings(max_examples=1500, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=multi_cases())
    def probe(case: tuple[ClusterView, Decision]) -> None:
        v, d = case
        out = _outcome(invariants._check_general, v, d)
        if out == "ok" and any(isinstance(a, Start) and a.slot_levels is not None
                               and len(set(a.slot_levels)) > 1 for a in d.actions):
            seen.add("ok-multi")
        seen.add(out.split(":")[0])

    probe()
    assert {"ok-multi", "slot-levels", "cores-distinct", "level-range", "two-fg", "two-bg"} <= seen, seen


# ------------------------------------------------------------------ the simulator and the slot rule

def test_a_lone_bag_uses_every_worker_on_the_papers_testbed() -> None:
    """10 single-core nodes x 2 shared levels (20 workers), one bag of 20 tasks of 10 s: it gets all 20
    workers (one level, as before: 10). By hand: every core runs 2 tasks at once at half its speed, so all
    20 end at 20 s; on one level, 10 tasks at full speed end at 10 and the next 10 at 20: the same makespan
    (the tasks are CPU-bound; a core's speed is shared by its busy levels)."""
    sim, pol = simulate([bag(1, 0, [10.0] * 20)], 10, "dispatch-proportion", levels=2)
    [start] = pol.seen[0][1]
    assert isinstance(start, Start) and len(start.cores) == 20
    assert sorted(start.slots) == [(c, lv) for c in range(10) for lv in (0, 1)]
    assert ends(sim, "1") == pytest.approx([20.0])
    one, pol1 = simulate([bag(1, 0, [10.0] * 20)], 10, "dispatch-proportion", levels=1)
    assert len(pol1.seen[0][1][0].cores) == 10 and ends(one, "1") == pytest.approx([20.0])


def test_the_slot_rule_spreads_before_doubling_and_two_bags_split_by_the_plan() -> None:
    # 15 tasks of 10 s: level 0 of the 10 cores first (no other busy level), then level 1 of cores 0-4.
    # Cores 0-4 run 2 tasks at half speed (both end at 20); cores 5-9 end their task at 10 and take none
    # (every task is running): the bag ends at 20.
    sim, pol = simulate([bag(1, 0, [10.0] * 15)], 10, "dispatch-proportion", levels=2)
    [start] = pol.seen[0][1]
    assert sorted(start.slots) == sorted([(c, 0) for c in range(10)] + [(c, 1) for c in range(5)])
    assert ends(sim, "1") == pytest.approx([20.0])
    # two bags of 10 tasks at once: proportion splits the 20 workers 10 / 10; the first takes level 0 of
    # every core, the second level 1 (ties: lower core, lower level)
    sim, pol = simulate([bag(1, 0, [10.0] * 10), bag(2, 0, [10.0] * 10)], 10, "dispatch-proportion", levels=2)
    assert pol.seen[0][1] == (Start("1", tuple(range(10)), 0), Start("2", tuple(range(10)), 1))
    assert ends(sim, "1", "2") == pytest.approx([20.0, 20.0])


def test_a_shrink_keeps_the_best_slots_and_holds_a_busy_one_until_its_task_ends() -> None:
    # 1 core x 2 levels. A (priority 1, 6 tasks of 10 s) takes both workers at 0 (two tasks at half speed,
    # ending at 20). B (priority 5, 2 tasks of 10 s) arrives at 5; r = 0: the plan gives B 1 worker and A 1.
    # A keeps level 0 (ties: lower level) and gives level 1 up with a Resize; its worker there runs task 1
    # until 20 (never killed), then the slot goes to B: B's tasks share the core with A's (half speed),
    # 20-40 and 40-60 -> B ends at 60.
    sim, pol = simulate([bag(1, 0, [10.0] * 6, 1), bag(2, 5, [10.0] * 2, 5)], 1, "dispatch-priority",
                        levels=2, r=0.0)
    seen = dict(pol.seen)
    assert seen[0.0] == (Start("1", (0, 0), 0, slot_levels=(0, 1)),)
    assert seen[5.0] == (Resize("1", (0,), 0),)
    assert Start("2", (0,), 1) in seen[20.0]
    assert sim.outcome("2") == (20.0, pytest.approx(60.0))
