"""Gang scheduling in the simulator (paper 004): a job in several rows (Replicate/Unreplicate) through
the occupancy model, the invariant checker, the engine and the time-slice model; the policies gs,
gs-m, bgs, bgs-m on hand-checked timelines (migration cost, quota Q per slice); sec. 3 metrics; bad
input; determinism."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest
from test_sim_support import Scripted, wj

from tests.livedaemon import run_cli
from vmctl.errors import InvariantViolation, PolicyNeedsUnmet, PolicyParameterError
from vmctl.model import (
    Action,
    Checkpoint,
    ClusterView,
    Decision,
    Discipline,
    Job,
    Kill,
    Move,
    Replicate,
    RunningJob,
    SliceSchedule,
    Start,
    Tier,
    Unreplicate,
    tier_of_level,
)
from vmctl.policies.base import Needs
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.timeslice import TimeSliceModel
from vmctl.sim.workloads.registry import generate_model


class Gang(Scripted):
    """The scripted test policy on the timeslice discipline."""

    name: ClassVar[str] = "scripted-gang"
    needs: ClassVar[Needs] = Needs(levels=2, disciplines=frozenset({Discipline.TIMESLICE}))


def run(jobs: list, cores: int, policy: object, levels: int, period: float) -> tuple[Simulator, object]:  # type: ignore[type-arg]
    sim = Simulator(jobs, cores, policy, SimConfig(execution=lambda: TimeSliceModel(levels, period)))  # type: ignore[arg-type]
    return sim, sim.run()


def ends(sim: Simulator, n: int) -> list[float]:
    return [sim.outcome(str(i))[1] for i in range(1, n + 1)]


def tview(cores: int, levels: int, placed: Sequence[tuple[Job, int, tuple[int, ...], tuple[int, ...]]],
          queue: Sequence[Job] = (), discipline: Discipline = Discipline.TIMESLICE,
          migrated: dict[str, float] | None = None) -> ClusterView:
    """A view of ``levels`` rows: ``placed`` holds (job, level, cores, replica levels)."""
    slots: list[list[str | None]] = [[None] * cores for _ in range(levels)]
    running: dict[str, RunningJob] = {}
    for j, level, cs, extra in placed:
        for lv in (level, *extra):
            for c in cs:
                assert slots[lv][c] is None
                slots[lv][c] = j.id
        running[j.id] = RunningJob(job=j, tier=tier_of_level(level), cores=cs, start_time=0.0, tier_since=0.0,
                                   level=level, replicas=extra,
                                   migrated_at=(migrated or {}).get(j.id, -math.inf))
    idle = [{c for c in range(cores) if slots[lv][c] is None} for lv in range(levels)]
    return ClusterView.leveled(cores, list(queue), running, slots, idle, discipline, [0.0] * cores, [True] * cores)


def job(jid: str, procs: int, estimate: float = 100.0, submit: float = 0.0) -> Job:
    return Job(id=jid, submit_time=submit, procs=procs, estimate=estimate)


# ------------------------------------------------------------------------------ replication by hand

def test_a_replicated_job_advances_in_every_row_it_is_in() -> None:
    # T = 10, 2 rows, 2 cores. A (1 process, 28 s) on core 0 of row 0, replicated into row 1 at 0;
    # B (1 process, 15 s) on core 1 of row 1. A advances in every slice: 15 at 15, when its row-1
    # replica is dropped; then only row 0: [20, 30) -> 25, [40, 43) -> 28: ends at 43.
    # B runs in row 1 only: [10, 20) and [30, 35): ends at 35.
    jobs = [wj(1, 0, 28, 1), wj(2, 0, 15, 1)]
    pol = Gang({0.0: [Start("1", (0,), 0), Replicate("1", 1), Start("2", (1,), 1)],
                15.0: [Unreplicate("1", 1)]})
    sim, _ = run(jobs, 2, pol, 2, 10.0)
    assert ends(sim, 2) == [pytest.approx(43.0), pytest.approx(35.0)]


def test_a_job_in_both_rows_ends_as_on_a_dedicated_core() -> None:
    # replicated into both rows of 2: 25 s of work end at 25; the view shows its replica and an
    # expected end that the model computes over both rows
    seen: list[RunningJob] = []

    def look(view: ClusterView, now: float) -> list[Action]:
        seen.append(view.running["1"])
        return []

    pol = Gang({0.0: [Start("1", (0, 1), 0), Replicate("1", 1)], 1.0: look})
    sim, _ = run([wj(1, 0, 25, 2)], 2, pol, 2, 10.0)
    assert ends(sim, 1) == [pytest.approx(25.0)]
    assert seen[0].level == 0 and seen[0].replicas == (1,)
    assert seen[0].expected_end == pytest.approx(25.0)


def test_expected_end_over_two_of_three_rows() -> None:
    # rows 0, 1, 2 in turn, T = 10; A (25 s) in rows 0 and 2: [0,10) -> 10, [20,30) -> 20, [30,35) -> 25
    seen: list[float] = []
    pol = Gang({0.0: [Start("1", (0,), 2), Replicate("1", 0)],
                1.0: lambda view, now: seen.append(view.running["1"].expected_end) or []})
    sim, _ = run([wj(1, 0, 25, 1)], 1, pol, 3, 10.0)
    assert ends(sim, 1) == [pytest.approx(35.0)]
    assert seen == [pytest.approx(35.0)]


def test_unreplicating_the_level_makes_the_lowest_replica_the_level() -> None:
    seen: list[RunningJob] = []

    def look(view: ClusterView, now: float) -> list[Action]:
        seen.append(view.running["1"])
        return []

    pol = Gang({0.0: [Start("1", (0,), 0), Replicate("1", 2), Replicate("1", 1)], 1.0: [Unreplicate("1", 0)],
                2.0: look})
    run([wj(1, 0, 25, 1)], 1, pol, 3, 10.0)
    assert (seen[0].level, seen[0].replicas) == (1, (2,))


def test_completion_and_kill_and_checkpoint_free_every_row() -> None:
    # A (2 cores, 10 s) in both rows ends at 10; C then takes row 1 of the same cores (it must be free)
    pol = Gang({0.0: [Start("1", (0, 1), 0), Replicate("1", 1)], 10.0: [Start("2", (0, 1), 1)]})
    sim, _ = run([wj(1, 0, 10, 2), wj(2, 10, 5, 2)], 2, pol, 2, 10.0)
    assert ends(sim, 2) == [pytest.approx(10.0), pytest.approx(15.0)]  # row 1 is active in [10, 20)
    # Kill frees both rows: B starts on row 1 at once
    pol = Gang({0.0: [Start("1", (0,), 0), Replicate("1", 1)],
                5.0: [Kill("1", requeue=False), Start("2", (0,), 1)]})
    sim, _ = run([wj(1, 0, 50, 1), wj(2, 5, 5, 1)], 1, pol, 2, 10.0)
    assert sim.outcome("2") == (5.0, pytest.approx(15.0))  # row 1 active in [10, 20)
    # Checkpoint frees both rows; a Move restores it onto one row
    pol = Gang({0.0: [Start("1", (0,), 0), Replicate("1", 1)],
                5.0: [Checkpoint("1"), Start("2", (0,), 1), Move("1", (0,), 0)]})
    sim, _ = run([wj(1, 0, 20, 1), wj(2, 5, 5, 1)], 1, pol, 2, 10.0)
    # A: 5 s by 5, then row 0 only: [5,10) -> 10, [20,30) -> 20: ends at 30; B: row 1 [10,15)
    assert ends(sim, 2) == [pytest.approx(30.0), pytest.approx(15.0)]


# ------------------------------------------------------------------------------ the rules of replication

def test_replication_rules() -> None:
    a, b = job("a", 2), job("b", 1)
    v = tview(3, 3, [(a, 0, (0, 1), ()), (b, 1, (1,), ())])
    ok = Decision(actions=(Replicate("a", 2), Unreplicate("a", 0), Replicate("a", 0)))
    check_decision(v, ok, 0.0)
    bad: list[tuple[Action, str]] = [
        (Replicate("a", 1), "two-bg"),  # b holds core 1 of level 1
        (Replicate("a", 0), "replicate-twice"),
        (Replicate("a", 3), "level-range"),
        (Replicate("z", 2), "not-running"),
        (Unreplicate("a", 0), "unreplicate-last-row"),
        (Unreplicate("a", 2), "unreplicate-absent"),
    ]
    for act, rule in bad:
        with pytest.raises(InvariantViolation, match=rule):
            check_decision(v, Decision(actions=(act,)), 0.0)
    rep = tview(3, 3, [(a, 0, (0, 1), (2,))])
    for act in (Move("a", (1, 2), 0), Move("a", None, 1)):
        with pytest.raises(InvariantViolation, match="replicated"):
            check_decision(rep, Decision(actions=(act,)), 0.0)
    check_decision(rep, Decision(actions=(Unreplicate("a", 2), Move("a", (1, 2), 0, 5.0))), 0.0)
    # a replica takes the same cores on its level: the slot of another row is then taken
    queued = tview(3, 3, [(a, 0, (0, 1), (2,))], queue=[job("q", 1)])
    with pytest.raises(InvariantViolation, match="two-on-level"):
        check_decision(queued, Decision(actions=(Start("q", (1,), 2),)), 0.0)
    check_decision(queued, Decision(actions=(Start("q", (2,), 2),)), 0.0)
    prio = ClusterView.leveled(2, [], {"a": RunningJob(job=a, tier=Tier.FG, cores=(0, 1), start_time=0.0,
                                                       tier_since=0.0)},
                               [["a", "a"], [None, None]], [set(), {0, 1}], Discipline.PRIORITY, [1.0, 1.0],
                               [True, True])
    with pytest.raises(InvariantViolation, match="replicate-discipline"):
        check_decision(prio, Decision(actions=(Replicate("a", 1),)), 0.0)


# ------------------------------------------------------------------------------ the policies by hand

def jobs4() -> list:  # type: ignore[type-arg]
    # 3 cores, MPL 2, T = 10: A (2 processes, 100 s), D (1, 5 s), B (1, 50 s), E (1, 100 s), all at 0
    return [wj(1, 0, 100, 2), wj(2, 0, 5, 1), wj(3, 0, 50, 1), wj(4, 0, 100, 1)]


def test_gs_by_hand() -> None:
    # A (2 processes, 25 s) takes row 0, B (1 process, 15 s) opens row 1 on core 0; nothing can be
    # replicated. A: [0,10), [20,30) -> 20 at 30; B: [10,20), [30,35) -> ends at 35. Then row 1 is
    # empty and left out of the cycle: A runs without a break and ends at 40.
    sim, res = run([wj(1, 0, 25, 2), wj(2, 0, 15, 1)], 2, create_policy("gs", mpl=2, slice=10.0), 2, 10.0)
    assert ends(sim, 2) == [pytest.approx(40.0), pytest.approx(35.0)]
    assert res.migrations == 0  # type: ignore[attr-defined]


def test_gs_m_by_hand_and_its_sec3_metrics() -> None:
    # t = 0: row 0 = A{0,1} D{2}; row 1 = B{0} E{1}; D is replicated into row 1 (core 2 is free there).
    # t = 5 (D ends; A has 5 s): compaction finds nothing (rows tie; row 0 comes first, and a job
    # only moves to a later row). Expansion, FCFS: A cannot clear 2 cores of row 1; B into row 0 by
    # option 1: A migrates to cores {1,2} of row 0, B is replicated onto core 0 of row 0. B now runs
    # in every slice and ends at 55. t = 55: row 1 holds E alone; compaction moves E to core 0 of row
    # 0 (option 2: 1 task < 2), row 1 empties. A had 30 s at 55 (rows 0 slices), E 25 s: A ends at
    # 125, E at 130.
    sim, res = run(jobs4(), 3, create_policy("gs-m", mpl=2, slice=10.0), 2, 10.0)
    assert ends(sim, 4) == [pytest.approx(x) for x in (125.0, 5.0, 55.0, 130.0)]
    g = res.gang  # type: ignore[attr-defined]
    assert res.migrations == 2 and g.migrations_per_job == pytest.approx(0.5)  # type: ignore[attr-defined]
    # slowdown max(response, T) / max(execution, T): A 1.25, D 10/10 = 1, B 55/50 = 1.1, E 1.3
    assert g.avg_slowdown == pytest.approx((1.25 + 1.0 + 1.1 + 1.3) / 4)
    work = 2 * 100 + 5 + 50 + 100
    assert g.utilization == pytest.approx(work / (3 * 130)) and g.utilization_eq3 == pytest.approx(work / (3 * 130 * 2))
    assert g.capacity_lost == 0.0 and g.avg_wait == 0.0 and g.slice_s == 10.0 and g.mpl == 2


def test_a_migration_cost_delays_the_job_by_c_of_its_slices() -> None:
    # the same run with C = 4: A (migrated at 5) pays 4 s of its own active time, E (at 55) too; both
    # run without a break at the end, so both end exactly 4 s later; B and D do not move
    sim, res = run(jobs4(), 3, create_policy("gs-m", mpl=2, slice=10.0, cost=4.0), 2, 10.0)
    assert ends(sim, 4) == [pytest.approx(x) for x in (129.0, 5.0, 55.0, 134.0)]
    assert res.gang.capacity_lost == pytest.approx(4 * 2 + 4 * 1)  # type: ignore[attr-defined]


def test_q_limits_the_tasks_migrated_in_a_slice() -> None:
    # Q = 1: at 5 clearing A (2 tasks) is refused, so B stays in row 1 only ([10,20) ... [90,100):
    # ends at 100). At 100 E moves by option 2 (1 task; option 1 would move A's 2): A and E, 50 s
    # each by then, share row 0 and end at 150.
    sim, res = run(jobs4(), 3, create_policy("gs-m", mpl=2, slice=10.0, quota=1.0), 2, 10.0)
    assert ends(sim, 4) == [pytest.approx(x) for x in (150.0, 5.0, 100.0, 150.0)]
    assert res.migrations == 1  # type: ignore[attr-defined]
    # Q = 0: no migration at all, as gs: A and E keep alternating with each other to the end
    sim0, res0 = run(jobs4(), 3, create_policy("gs-m", mpl=2, slice=10.0, quota=0.0), 2, 10.0)
    gs, _ = run(jobs4(), 3, create_policy("gs", mpl=2, slice=10.0), 2, 10.0)
    assert ends(sim0, 4) == ends(gs, 4) == [pytest.approx(x) for x in (190.0, 5.0, 100.0, 200.0)]
    assert res0.migrations == 0  # type: ignore[attr-defined]


def test_q_counts_the_tasks_already_migrated_in_this_slice() -> None:
    # row 0: a{0,1}; row 1: b{0} c{3,4}. Compaction takes row 0 first (2 tasks < 3) and moves a into
    # row 1 by option 1: b migrates to core 2 of row 1 (1 task; option 2 would move a's 2), row 0
    # empties. With Q = 2 and the 2-task job c migrated earlier in this slice [200, 400), nothing is
    # left and nothing moves; a migration in the previous slice does not count.
    a, b, c = job("a", 2), job("b", 1), job("c", 2)
    pol = create_policy("gs-m", mpl=2, quota=2.0)
    for when, moved in ((250.0, False), (150.0, True)):
        v = tview(5, 2, [(a, 0, (0, 1), ()), (b, 1, (0,), ()), (c, 1, (3, 4), ())], migrated={"c": when})
        d = pol.decide(v, 300.0)
        assert any(isinstance(x, Move) and x.job_id == "b" and x.cores == (2,) for x in d.actions) is moved
        # gs-m emits the rows in use as the slice schedule, with its T and epoch 0
        assert d.schedule == SliceSchedule(200.0, (1,) if moved else (0, 1), 0.0)


def test_bgs_backfills_past_the_blocked_head() -> None:
    # 2 cores, MPL 1 (one row): A (1 process, 100 s) runs; H (2 processes) cannot start; S (1 process,
    # 10 s estimate) ends before A: backfilled by bgs, not by gs (FCFS stops at H)
    a, h, s = job("a", 1, 100.0), job("h", 2, 50.0, 1.0), job("s", 1, 10.0, 2.0)
    v = tview(2, 1, [(a, 0, (0,), ())], queue=[h, s])
    starts = {x.job_id for x in create_policy("bgs", mpl=1).decide(v, 3.0).actions if isinstance(x, Start)}
    assert starts == {"s"}
    assert not create_policy("gs", mpl=1).decide(v, 3.0).actions
    d = create_policy("bgs", mpl=1).decide(v, 3.0)
    assert d.reasons["h"].startswith("head of queue: reserved in row 0")


def test_conservative_bgs_reserves_for_every_blocked_job() -> None:
    # 3 cores, MPL 1: A (2 processes, 100 s) runs; H (3 processes, 50 s) and J (2, 30 s) cannot start;
    # S (1 process, 500 s) fits the free core but would still run when H's reservation begins
    a, h = job("a", 2, 100.0), job("h", 3, 50.0, 1.0)
    j, s = job("j", 2, 30.0, 2.0), job("s", 1, 500.0, 3.0)
    v = tview(3, 1, [(a, 0, (0, 1), ())], queue=[h, j, s])
    d = create_policy("bgs", mpl=1, backfill="conservative").decide(v, 3.0)
    assert not [x for x in d.actions if isinstance(x, Start)]
    assert set(d.reasons) == {"h", "j", "s"} and d.reasons["j"].startswith("reserved in row 0")
    # depth 0: no reservation at all, S takes the free core at once (greedy backfilling)
    d = create_policy("bgs", mpl=1, backfill="conservative", depth=0).decide(v, 3.0)
    assert {x.job_id for x in d.actions if isinstance(x, Start)} == {"s"}


# ------------------------------------------------------------------------------ bad input

def test_bad_parameters_name_the_parameter() -> None:
    for name in ("gs", "gs-m", "bgs", "bgs-m"):
        for params, param in (({"mpl": 0}, "mpl"), ({"slice": 0.0}, "slice"), ({"slice": -5.0}, "slice"),
                              ({"quota": -1.0}, "quota"), ({"quota": 1.5}, "quota"), ({"cost": -1.0}, "cost"),
                              ({"slice": math.inf}, "slice")):
            with pytest.raises(PolicyParameterError, match=f"parameter {param}"):
                create_policy(name, **params)
    for name in ("bgs", "bgs-m"):
        with pytest.raises(PolicyParameterError, match="parameter backfill: must be one of easy, conservative"):
            create_policy(name, backfill="lazy")
        with pytest.raises(PolicyParameterError, match="parameter depth"):
            create_policy(name, backfill="conservative", depth=-1.0)
    with pytest.raises(PolicyParameterError, match="parameter backfill: unknown"):
        create_policy("gs", backfill="conservative")


def test_mpl_above_the_levels_and_other_disciplines_are_refused() -> None:
    with pytest.raises(PolicyNeedsUnmet, match="needs 5 VM levels per core"):
        run([wj(1, 0, 10, 1)], 2, create_policy("gs"), 3, 10.0)  # default MPL 5 on 3 levels
    run([wj(1, 0, 10, 1)], 2, create_policy("gs", mpl=3), 3, 10.0)  # fits
    with pytest.raises(PolicyNeedsUnmet, match="needs the timeslice discipline"):
        Simulator([wj(1, 0, 10, 1)], 2, create_policy("bgs-m", mpl=2))  # type: ignore[list-item]  # two-tier
    # on a view (vmctld's path): refused in decide, nothing returned
    v = tview(2, 2, [])
    with pytest.raises(PolicyNeedsUnmet, match="needs 3 VM levels"):
        create_policy("gs-m", mpl=3).decide(v, 0.0)


# ------------------------------------------------------------------------------ a real workload

@pytest.mark.parametrize("name", ["gs", "gs-m", "bgs", "bgs-m", "bgs/conservative", "bgs-m/conservative"])
def test_jann97_runs_are_deterministic_and_checked(name: str) -> None:
    wl = generate_model("jann97", 150, 64, 5, 0.9, usage="paper")
    name, _, mode = name.partition("/")
    extra = {"backfill": mode} if mode else {}

    def once() -> dict[str, object]:
        sim = Simulator(wl.jobs, 64, create_policy(name, mpl=3, cost=10.0, **extra),
                        SimConfig(seed=5, execution=lambda: TimeSliceModel(3)))
        return sim.run().to_dict()

    a, b = once(), once()
    assert a == b
    assert a["jobs"] == 150
    gang = a["gang"]
    assert isinstance(gang, dict) and 0 < gang["utilization"] <= 1 and gang["avg_slowdown"] >= 1
    if not name.endswith("-m"):
        assert a["migrations"] == 0 and gang["capacity_lost"] == 0


# ------------------------------------------------------------------------------ vmctl sim run

def test_sim_run_with_a_gang_policy(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("sim", "run", "--model", "jann97", "--jobs", "150", "--load", "0.9", "--policy", "gs-m", "--discipline",
            "timeslice")
    code, out, err = run_cli(capsys, *base, "--param", "cost=20", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    # the levels default to the policy's MPL, the model's slice to its T
    assert doc["execution"] == {"model": "timeslice", "discipline": "timeslice", "levels": 5, "slice_s": 200.0}
    assert doc["params"] == {"mpl": 5, "slice": 200.0, "cost": 20.0, "quota": "inf"}  # strict JSON
    assert "Infinity" not in out
    gang = doc["gang"]
    assert gang["slice_s"] == 200.0 and gang["mpl"] == 5
    assert gang["capacity_lost"] > 0 and doc["migrations"] > 0
    assert gang["migrations_per_job"] == pytest.approx(doc["migrations"] / doc["jobs"])
    code, out, err = run_cli(capsys, *base, "--slice", "100", "-o", "json")  # --slice sets the policy's T too
    assert code == 0, err
    assert json.loads(out)["params"]["slice"] == 100.0 and json.loads(out)["gang"]["slice_s"] == 100.0
    for extra, text in ((("--slice", "100", "--param", "slice=200"), "--slice: 100 s is not the policy's slice=200"),
                        (("--levels", "3"), "needs 5 VM levels per core (it has 3)"),
                        (("--param", "mpl=0"), "parameter mpl: must be >= 1"),
                        (("--param", "quota=-1"), "parameter quota: must be a whole number")):
        code, out, err = run_cli(capsys, *base, *extra)
        assert code == 2 and text in err, err
    code, out, err = run_cli(capsys, *base[:-2], "--discipline", "priority")  # the default two-tier cluster
    assert code == 2 and "needs 5 VM levels per core (it has 2); the timeslice discipline" in err, err


# ------------------------------------------------------------------------------ the evidence's helpers

def test_loads_for_targets_reads_the_calibration_curve() -> None:
    from vmctl.experiments.gang import loads_for_targets

    curve = [(0.5, 0.45), (0.6, 0.55), (0.7, 0.5), (0.8, 0.65)]  # not monotone: the envelope is used
    assert loads_for_targets(curve, [0.4, 0.5, 0.55, 0.6, 0.9]) == [0.5, 0.55, 0.6, 0.75, 0.8]


def test_table1_markdown_puts_ours_beside_the_papers() -> None:
    from vmctl.experiments.gang import PAPER_TABLE1, table1_markdown

    rows = {(0, p): {"utilization": 0.5, "avg_slowdown": s} for p, s in
            (("bgs", 2.0), ("bgs-m", 1.5), ("gs", 4.0), ("gs-m", 1.0))}
    doc = table1_markdown(rows, [0.6])
    assert "| 0 | 0.600 | 0.50 | 2.0 | 0.50 | 1.5 | 25.0 % | 0.50 | 4.0 | 0.50 | 1.0 | 75.0 % |" in doc
    # the paper's rows with its own "% s better" columns (from its unrounded slowdowns)
    assert "| 0 | 0.55 | 2.5 | 0.55 | 2.4 | 5.3 % | 0.55 | 2.8 | 0.55 | 2.5 | 11.7 % |" in doc
    assert PAPER_TABLE1[6]["gs"] == (0.84, 650.8)


def test_gang_cell_is_the_simulators_result() -> None:
    from vmctl.experiments.gang import gang_cell

    a = gang_cell("gs-m", 0.9, 40, 64, 3, 200.0, 0.0, 0, 1)  # Q = 0: no migration, as gs
    b = gang_cell("gs", 0.9, 40, 64, 3, 200.0, 0.0, -1, 1)
    for k in ("utilization", "avg_slowdown", "avg_wait", "migrations_per_job"):
        assert a[k] == b[k], k
    assert a["migrations_per_job"] == 0 and a["jobs_done"] == 40
    assert a["utilization_eq3"] == pytest.approx(a["utilization"] / 3)


def test_the_module_headers_example() -> None:
    # policies/gang.py and docs/gang.md: compaction migrates b (option 2), c opens row 1, expansion
    # clears a's cores of row 1 for its replica, so c (not started yet) starts on cores 2-3 instead
    a, b, c = job("a", 2), job("b", 1), job("c", 2, submit=1.0)
    v = tview(4, 2, [(a, 0, (0, 1), ()), (b, 1, (0,), ())], queue=[c])
    d = create_policy("gs-m", mpl=2, cost=10.0).decide(v, 5.0)
    assert d.actions == (Move("b", (2,), 0, 10.0), Start("c", (2, 3), 1), Replicate("a", 1))
    assert d.schedule == SliceSchedule(200.0, (0, 1), 0.0)
    check_decision(v, d, 5.0)


# ------------------------------------------------------------------------------ the job-size study (issue 26)

def test_steady_utilization_trims_the_warm_up_and_the_drain() -> None:
    from vmctl.experiments.gang import steady_utilization

    # 11 arrivals at 0, 10, ..., 100 on 1 core; job i runs [10 i, 10 i + 10) except the first, which runs
    # [0, 5) (a warm-up job), and the last, which drains until 200
    rows = [{"id": str(i), "submit": 10.0 * i, "start": 10.0 * i, "end": 10.0 * i + 10, "width": 1} for i in range(11)]
    rows[0]["end"] = 5.0
    rows[-1]["end"] = 200.0
    work = {str(i): 10.0 for i in range(11)}
    work["0"] = 5.0
    # window [10, 100] (arrival int(0.1 x 10) = 1 to the last arrival): jobs 1..9 fill it; job 10 adds nothing
    assert steady_utilization(rows, work, 1) == pytest.approx(1.0)
    # without trimming the warm-up, the window starts at 0 and holds job 0's 5 s of work in 10 s
    assert steady_utilization(rows, work, 1, warmup=0.0) == pytest.approx(95 / 100)
    assert steady_utilization(rows[:1], work, 1) == 0.0


def test_the_parallel_jann97_mix_has_no_serial_job_and_its_load() -> None:
    from vmctl.errors import OutOfRange
    from vmctl.experiments.gang import study_jobs
    from vmctl.sim.workloads.core import Workload
    from vmctl.sim.workloads.load import offered_load

    jobs, source = study_jobs("jann97-par", 200, 64, 0.8, 3)
    assert len(jobs) == 200 and min(j.procs for j in jobs) >= 2 and "serial jobs left out" in source
    assert offered_load(Workload(jobs=jobs, max_procs=64, source=source), 64) == pytest.approx(0.8, rel=1e-6)
    serial = [j for j in study_jobs("jann97", 200, 64, 0.8, 3)[0] if j.procs == 1]
    assert serial  # the plain mix has them
    with pytest.raises(OutOfRange, match="study model"):
        study_jobs("feitelson", 10, 64, 0.8, 1)


def test_calibration_curves_interpolate_and_say_when_a_policy_saturates_below() -> None:
    from vmctl.experiments.gang import interp_curve, load_for

    curve = [(0.5, 0.5), (1.0, 0.8), (1.5, 0.78)]
    assert load_for(curve, 0.65) == pytest.approx(0.75)
    assert load_for(curve, 0.85) is None
    assert interp_curve([(0.5, 2.0), (1.0, 4.0)], 0.75) == pytest.approx(3.0)
    assert interp_curve([(0.5, 2.0), (1.0, 4.0)], 2.0) == 4.0


def test_gang_study_refuses_bad_input_naming_the_option(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "study")
    for args, option in ((("--jobs", "0"), "--jobs"), (("--seeds", "1"), "--seeds"), (("--loads", "0.5,-1"), "--loads"),
                         (("--models", "jann97,feitelson96"), "--models"), (("--workers", "0"), "--workers")):
        code, _out, err = run_cli(capsys, "sim", "gang-study", "--out", out, *args)
        assert code == 2 and option in err and "Traceback" not in err, (args, err)


@pytest.mark.parametrize("name", ["gs", "bgs-m"])
def test_the_metered_utilization_over_the_whole_run_is_eq3s(name: str) -> None:
    """The meter (busy processors of the active row at every boundary and decision) integrates to the
    work of the run: over [first arrival, last end] it equals the sec. 3 utilization."""
    from vmctl.experiments.gang import MeteredTimeSlice, metered_utilization, steady_window

    wl = generate_model("jann97", 150, 64, 5, 1.2, usage="full")
    models: list[MeteredTimeSlice] = []

    def make() -> MeteredTimeSlice:
        models.append(MeteredTimeSlice(3, 200.0))
        return models[-1]

    sim = Simulator(wl.jobs, 64, create_policy(name, mpl=3), SimConfig(seed=5, execution=make))
    res = sim.run()
    rows = list(sim.job_rows())
    span = (min(r["submit"] for r in rows), max(r["end"] for r in rows))
    assert res.gang is not None
    assert metered_utilization(models[-1].samples, 64, span) == pytest.approx(res.gang.utilization, rel=1e-9)
    lo, hi = steady_window([r["submit"] for r in rows])
    assert span[0] < lo < hi < span[1]
    assert 0 < metered_utilization(models[-1].samples, 64, (lo, hi)) <= 1


def test_gang_study_runs_a_tiny_grid_and_resumes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out = str(tmp_path / "study")
    args = ("sim", "gang-study", "--jobs", "30", "--seeds", "1,2", "--models", "jann97", "--loads", "0.8,1.5",
            "--workers", "1", "--out", out)
    code, text, err = run_cli(capsys, *args)
    assert code == 0, err
    assert "### Saturation utilization" in text and "| jann97 | " in text and "BGS-cons" in text
    assert (tmp_path / "study" / "study.md").read_text(encoding="utf-8") == text
    # a rerun takes every cell from the table: the same report
    code, again, _err = run_cli(capsys, *args)
    assert code == 0 and again == text
