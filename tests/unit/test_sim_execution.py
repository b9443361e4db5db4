"""Execution models behind one interface (``vmctl.sim.execution``): the time-slice model of gang
scheduling (paper 004) on hand-checked timelines, Suspend/Resume/Checkpoint/Restore and migration
costs on the levelled path, the per-model offer, and bad input."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from typing import ClassVar

import pytest
from test_sim_support import Scripted, TinyFcfs, wj

from tests.livedaemon import run_cli
from vmctl.errors import InvariantViolation, PolicyNeedsUnmet, SimulationError, ValidationError
from vmctl.model import (
    Action,
    Checkpoint,
    ClusterView,
    Decision,
    Discipline,
    JobShape,
    Kill,
    Migrate,
    Move,
    Resize,
    Restore,
    Resume,
    SliceSchedule,
    Start,
    StartFg,
    Suspend,
    Tier,
)
from vmctl.policies.base import Needs, Offer, SchedulingPolicy
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.execution import EngineState, ExecutionModel, Run, TwoTierModel
from vmctl.sim.timeslice import TimeSliceModel
from vmctl.sim.workloads.registry import generate_model


class Gang(Scripted):
    """The scripted test policy on the timeslice discipline."""

    name: ClassVar[str] = "scripted-gang"
    needs: ClassVar[Needs] = Needs(levels=2, disciplines=frozenset({Discipline.TIMESLICE}))


class Solo(Scripted):
    """The scripted test policy on one level of any discipline."""

    name: ClassVar[str] = "scripted-solo"
    needs: ClassVar[Needs] = Needs(levels=1)


def timeslice(levels: int, period: float) -> SimConfig:
    return SimConfig(execution=lambda: TimeSliceModel(levels, period))


def run(jobs: list, cores: int, policy: SchedulingPolicy, config: SimConfig) -> Simulator:  # type: ignore[type-arg]
    sim = Simulator(jobs, cores, policy, config)  # type: ignore[arg-type]
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim


# ------------------------------------------------------------------------------ time slices by hand

def test_two_jobs_in_two_rows_by_hand() -> None:
    # T = 10: row 0 active in [0,10), [20,30), [40,50); row 1 in [10,20), [30,40).
    # A (25 s of work) has 10 at 10, 20 at 30, ends at 45; B (15 s) has 10 at 20, ends at 35.
    jobs = [wj(1, 0, 25, 2), wj(2, 0, 15, 2)]
    pol = Gang({0.0: [Start("1", (0, 1), 0), Start("2", (0, 1), 1)]})
    sim = run(jobs, 2, pol, timeslice(2, 10.0))
    assert sim.outcome("1") == (0.0, pytest.approx(45.0))
    assert sim.outcome("2") == (0.0, pytest.approx(35.0))
    # the policy is called at 0 and at the two completions only, not at the slice boundaries
    assert pol.calls == [0.0, 35.0, 45.0]


def test_the_documented_example_with_a_move_cost() -> None:
    # docs/simulator.md: A moved in place at 12 (row 1 active) with cost 3 pays it in [20,23): ends 48
    jobs = [wj(1, 0, 25, 2), wj(2, 0, 15, 2)]
    pol = Gang({0.0: [Start("1", (0, 1), 0), Start("2", (0, 1), 1)], 12.0: [Move("1", None, 0, 3.0)]})
    sim = run(jobs, 2, pol, timeslice(2, 10.0))
    assert sim.outcome("1")[1] == pytest.approx(48.0)
    assert sim.outcome("2")[1] == pytest.approx(35.0)
    assert sim.result.migrations == 0  # type: ignore[attr-defined]  # same cores: not a migration


def test_a_job_alone_in_its_row_still_waits_for_the_other_rows() -> None:
    # L = 3, T = 10, one job on row 1 needing 15 s: row 1 is active in [10,20) and [40,50): ends at 45
    sim = run([wj(1, 0, 15, 1)], 1, Gang({0.0: [Start("1", (0,), 1)]}), timeslice(3, 10.0))
    assert sim.outcome("1") == (0.0, pytest.approx(45.0))


class LevelTwo(SchedulingPolicy):
    """A tiny gang policy: every queued job goes on level 2 of the lowest free cores there."""

    name: ClassVar[str] = "level-two"
    needs: ClassVar[Needs] = Needs(levels=3, disciplines=frozenset({Discipline.TIMESLICE}))

    def decide(self, view: ClusterView, now: float) -> Decision:
        free = sorted(view.idle[2])
        acts = []
        for job in view.queue:
            if job.procs > len(free):
                break
            acts.append(Start(job.id, tuple(free[: job.procs]), 2))
            free = free[job.procs:]
        return Decision(actions=tuple(acts))


def test_a_policy_starting_on_level_two_runs_in_the_timeslice_model() -> None:
    # L = 3, T = 5: row 2 is active in [10,15), [25,30) ... J1 (8 s, 2 cores) gets 5 s in [10,15) and
    # ends at 28; J2 (1 core, arrives at 1) takes the third core on row 2: 4 s, ends at 14. J3 (2 cores,
    # arrives at 2) waits for J1's cores on level 2 (ends 28): starts at 28 in row 2's slice [25,30),
    # gets 2 s there and its last 1 s in [40,45): ends at 41.
    jobs = [wj(1, 0, 8, 2), wj(2, 1, 4, 1), wj(3, 2, 3, 2)]
    sim = run(jobs, 3, LevelTwo(), timeslice(3, 5.0))
    assert sim.outcome("1") == (0.0, pytest.approx(28.0))
    assert sim.outcome("2") == (1.0, pytest.approx(14.0))
    assert sim.outcome("3") == (28.0, pytest.approx(41.0))
    assert sim.view.levels == 3 and sim.view.discipline is Discipline.TIMESLICE


def test_a_job_started_after_an_idle_spell_gets_the_row_of_its_time() -> None:
    # L = 2, T = 10: J1 (5 s) on row 0 ends at 5; nothing runs until J2 arrives at 32 and starts on row
    # 1, which is active in [30,40): ends at 37. The policy sees row 1's end as J2's expected end.
    seen: list[float] = []

    def start_and_look(view: ClusterView, now: float) -> list[Action]:
        return [Start("2", (0,), 1)]

    def look(view: ClusterView, now: float) -> list[Action]:
        seen.append(view.running["2"].expected_end)
        return []

    pol = Gang({0.0: [Start("1", (0,), 0)], 32.0: start_and_look, 33.0: look})
    sim = run([wj(1, 0, 5, 1), wj(2, 32, 5, 1)], 1, pol, timeslice(2, 10.0))
    assert sim.outcome("1") == (0.0, pytest.approx(5.0))
    assert sim.outcome("2") == (32.0, pytest.approx(37.0))
    assert seen == [pytest.approx(37.0)]
    assert pol.calls == [0.0, 5.0, 32.0, 33.0, 37.0]


def test_jobs_out_rows_on_the_levelled_path() -> None:
    # L = 3, T = 10: J1 starts on row 1, moves to row 2 of another core (a migration and a level change)
    pol = Gang({0.0: [Start("1", (0,), 1)], 12.0: [Move("1", (1,), 2, 0.0)]})
    sim = run([wj(1, 0, 15, 1)], 2, pol, timeslice(3, 10.0))
    (row,) = sim.job_rows()
    assert (row["width"], row["first_tier"], row["tier_changes"], row["migrations"]) == (1, "bg", 1, 1)
    # J1 gets 2 s in row 1's slice [10,12), 10 s in row 2's [20,30) and its last 3 s in [50,53)
    assert row["end"] == pytest.approx(53.0)


def test_a_decision_schedule_changes_the_rotation() -> None:
    # T = 10 rows (0, 1) until t = 5, when the policy's schedule makes row 1 the only active row:
    # J1 on row 0 stops at 5 s of work; J2 on row 1 runs from 5 and ends at 5 + 12 = 17. Row 0 never
    # comes back, so J1 is left running: the engine reports it.
    jobs = [wj(1, 0, 30, 1), wj(2, 0, 12, 1)]

    class Sched(Gang):
        def decide(self, view: ClusterView, now: float) -> Decision:
            d = super().decide(view, now)
            if abs(now - 5.0) < 1e-9:
                return Decision(d.actions, wake_at=d.wake_at, schedule=SliceSchedule(10.0, (1,)))
            return d

    pol = Sched({0.0: [Start("1", (0,), 0), Start("2", (0,), 1)], 5.0: []})
    sim = Simulator(jobs, 1, pol, timeslice(2, 10.0))  # type: ignore[arg-type]
    with pytest.raises(SimulationError, match=r"left 0 job.* and 1 running"):
        sim.run()
    assert sim.outcome("2")[1] == pytest.approx(17.0)
    assert sim.view.running["1"].progress == pytest.approx(5.0)


def test_expected_end_follows_the_rows() -> None:
    # L = 2, T = 10; J1 on row 1 (estimate 15): at t = 0 it will get [10,20) and [30,35): ends at 35
    seen: list[float] = []

    def look(view: ClusterView, now: float) -> list[Action]:
        seen.append(view.running["1"].expected_end)
        return []

    run([wj(1, 0, 15, 1)], 1, Gang({0.0: [Start("1", (0,), 1)], 1.0: look}), timeslice(2, 10.0))
    assert seen == [pytest.approx(35.0)]


# ------------------------------------------------------------------------------ suspend, checkpoint, costs

def test_a_suspended_job_does_not_advance() -> None:
    # one row (L = 1): J1 needs 20 s; suspended from 5 to 15, it ends at 30
    progress: list[float] = []

    def look(view: ClusterView, now: float) -> list[Action]:
        progress.append(view.running["1"].progress)
        assert view.running["1"].suspended and view.slot_job[0][0] == "1"  # slots kept
        return [Resume("1")]

    pol = Solo({0.0: [Start("1", (0,), 0)], 5.0: [Suspend("1")], 15.0: look})
    sim = run([wj(1, 0, 20, 1)], 1, pol, timeslice(1, 10.0))
    assert progress == [pytest.approx(5.0)]
    assert sim.outcome("1") == (0.0, pytest.approx(30.0))


def test_resume_of_a_job_that_is_not_suspended_is_refused() -> None:
    pol = Gang({0.0: [Start("1", (0,), 0)], 1.0: [Resume("1")]})
    with pytest.raises(InvariantViolation, match="resume-not-suspended"):
        run([wj(1, 0, 20, 1)], 1, pol, timeslice(2, 10.0))


def test_a_migration_cost_delays_completion_by_exactly_the_cost() -> None:
    # L = 1: J1 needs 20 s; at 5 it moves to core 1 with cost 3: ends at 23 instead of 20
    base = run([wj(1, 0, 20, 1)], 2, Solo({0.0: [Start("1", (0,), 0)]}), timeslice(1, 10.0))
    moved = run([wj(1, 0, 20, 1)], 2, Solo({0.0: [Start("1", (0,), 0)], 5.0: [Move("1", (1,), 0, 3.0)]}),
                timeslice(1, 10.0))
    assert base.outcome("1")[1] == pytest.approx(20.0)
    assert moved.outcome("1")[1] == pytest.approx(23.0)
    assert (base.result.migrations, moved.result.migrations) == (0, 1)  # type: ignore[attr-defined]


def test_a_migration_cost_is_paid_in_the_jobs_own_slices() -> None:
    # L = 2, T = 10, J1 on row 0 needs 20 s: alone it ends at 30 ([0,10), [20,30)). Moved at 12 (row 1
    # active; 10 s done) to core 1 with cost 3, it pays the cost in [20,23) and has 17 s at 30: its last
    # 3 s come in [40,43).
    jobs = [wj(1, 0, 20, 1)]
    base = run(jobs, 2, Gang({0.0: [Start("1", (0,), 0)]}), timeslice(2, 10.0))
    moved = run(jobs, 2, Gang({0.0: [Start("1", (0,), 0)], 12.0: [Migrate("1", (1,), cost=3.0)]}),
                timeslice(2, 10.0))
    assert base.outcome("1")[1] == pytest.approx(30.0)
    assert moved.outcome("1")[1] == pytest.approx(43.0)


def test_checkpoint_frees_the_slots_and_restore_keeps_the_progress() -> None:
    # L = 1, 1 core. J1 (20 s) checkpointed at 5 (5 s done): J2 (4 s) takes the core 5-9. J1 restored
    # at 9 with a restore cost of 2: 15 s left from 11, ends at 26.
    seen: list[tuple[float, bool, bool, float, tuple[str | None, ...]]] = []

    def look(acts: list[Action]) -> Callable[[ClusterView, float], list[Action]]:
        def f(view: ClusterView, now: float) -> list[Action]:
            rj = view.running["1"]
            seen.append((now, rj.suspended, rj.checkpointed, rj.progress, tuple(view.slot_job[0])))
            return acts
        return f

    jobs = [wj(1, 0, 20, 1), wj(2, 4, 4, 1)]
    pol = Solo({0.0: [Start("1", (0,), 0)], 5.0: look([Checkpoint("1"), Start("2", (0,), 0)]),
                9.0: look([Move("1", (0,), 0, 2.0)])})
    sim = run(jobs, 1, pol, timeslice(1, 10.0))
    # at 9 J1 is checkpointed: shown as a suspended running job that holds no slot
    assert seen == [(5.0, False, False, pytest.approx(5.0), ("1",)), (9.0, True, True, pytest.approx(5.0), (None,))]
    assert sim.outcome("2") == (5.0, pytest.approx(9.0))
    assert sim.outcome("1") == (0.0, pytest.approx(26.0))


def test_restore_onto_another_level() -> None:
    # L = 2, T = 10: J1 (12 s) on row 0 has 5 s at 5, is checkpointed, and restored at 15 onto row 1
    # (active [10,20)) with the priority name Restore: 5 s more by 20, its last 2 s in [30,32)
    pol = Gang({0.0: [Start("1", (0,), 0)], 5.0: [Checkpoint("1")], 15.0: [Restore("1", (0,), Tier.BG)]})
    sim = run([wj(1, 0, 12, 1)], 1, pol, timeslice(2, 10.0))
    assert sim.outcome("1") == (0.0, pytest.approx(32.0))
    assert sim.result.migrations == 0  # type: ignore[attr-defined]


def test_a_level_the_cluster_lacks_is_refused() -> None:
    with pytest.raises(InvariantViolation, match="level-range"):
        run([wj(1, 0, 12, 1)], 1, Gang({0.0: [Start("1", (0,), 2)]}), timeslice(2, 10.0))


def test_resume_of_a_checkpointed_job_is_refused_by_the_checker() -> None:
    # the view tells a checkpointed job from a suspended one, so the checker refuses the Resume (naming
    # the rule) before the engine would have to
    pol = Solo({0.0: [Start("1", (0,), 0)], 1.0: [Checkpoint("1")], 2.0: [Resume("1")]})
    with pytest.raises(InvariantViolation, match="resume-checkpointed"):
        run([wj(1, 0, 20, 1)], 1, pol, timeslice(2, 10.0))


def test_kill_and_restart_on_another_level_loses_the_progress() -> None:
    # L = 2, T = 10: J1 (8 s) on row 0 has 5 s at 5, killed and restarted on row 1: [10,18) -> ends 18
    pol = Gang({0.0: [Start("1", (0,), 0)], 5.0: [Kill("1"), Start("1", (0,), 1)]})
    sim = run([wj(1, 0, 8, 1)], 1, pol, timeslice(2, 10.0))
    assert sim.outcome("1") == (0.0, pytest.approx(18.0))
    assert sim.result.wasted_work == pytest.approx(5.0)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ one level = dedicated cores

@pytest.mark.parametrize("policy", ["fcfs", "easy"])
def test_one_row_gives_the_one_tier_results(policy: str) -> None:
    """With one row (L = 1) the time-slice model is a dedicated machine: the levelled path gives the
    fast path's one-tier results exactly (same starts, ends and passes)."""
    wl = generate_model("feitelson96", 400, 32, 3, 0.85, usage="paper")
    fast = Simulator(wl.jobs, 32, create_policy(policy), SimConfig(seed=3))
    slow = Simulator(wl.jobs, 32, create_policy(policy), SimConfig(seed=3, execution=lambda: TimeSliceModel(1)))
    a, b = fast.run().to_dict(), slow.run().to_dict()
    assert a == b
    assert [fast.outcome(str(j.id)) for j in wl.jobs] == [slow.outcome(str(j.id)) for j in wl.jobs]


def test_easy_on_two_rows_takes_longer_than_on_dedicated_cores() -> None:
    wl = generate_model("feitelson96", 200, 32, 4, 0.5, usage="paper")
    one = Simulator(wl.jobs, 32, create_policy("easy"), SimConfig(seed=4)).run()
    two = Simulator(wl.jobs, 32, create_policy("easy"), SimConfig(seed=4, execution=lambda: TimeSliceModel(2))).run()
    assert two.metrics.avg_response > one.metrics.avg_response


# ------------------------------------------------------------------------------ offers and bad input

def test_the_simulator_offers_what_its_model_offers() -> None:
    with pytest.raises(PolicyNeedsUnmet, match=r"the simulator \(timeslice model\): needs the priority discipline"):
        Simulator([wj(1, 0, 10, 1)], 2, create_policy("measy"), timeslice(2, 10.0))  # type: ignore[list-item]
    with pytest.raises(PolicyNeedsUnmet, match="needs 3 VM levels per core"):
        Simulator([wj(1, 0, 10, 1)], 2, LevelTwo(), timeslice(2, 10.0))  # type: ignore[list-item]
    with pytest.raises(PolicyNeedsUnmet, match="capped shared VMs"):
        Simulator([wj(1, 0, 10, 1)], 2, create_policy("vcsched-mcb8"), timeslice(2, 10.0))  # type: ignore[list-item]
    with pytest.raises(PolicyNeedsUnmet, match="the simulator: needs the timeslice discipline"):
        Simulator([wj(1, 0, 10, 1)], 2, Gang({}))  # type: ignore[list-item]
    assert TwoTierModel().offer().discipline is Discipline.PRIORITY
    assert TimeSliceModel(5).offer().levels == 5


@pytest.mark.parametrize(("args", "field"), [
    ((0,), "timeslice.levels"), ((-1,), "timeslice.levels"), ((2, 0.0), "timeslice.period"),
    ((2, -5.0), "timeslice.period"), ((2, float("inf")), "timeslice.period"), ((2, 10.0, (0, 0)), "timeslice.order"),
    ((2, 10.0, (2,)), "timeslice.order"), ((2, 10.0, ()), "timeslice.order"),
])
def test_bad_timeslice_parameters(args: tuple, field: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        TimeSliceModel(*args)


def test_a_model_serves_one_simulator() -> None:
    model = TimeSliceModel(1)
    make: Callable[[], ExecutionModel] = lambda: model  # noqa: E731
    Simulator([wj(1, 0, 10, 1)], 1, TinyFcfs(), SimConfig(execution=make))  # type: ignore[list-item]
    with pytest.raises(SimulationError, match="already serves a simulator"):
        Simulator([wj(1, 0, 10, 1)], 1, TinyFcfs(), SimConfig(execution=make))  # type: ignore[list-item]


def test_a_schedule_on_the_two_tier_model_is_refused_by_the_checker() -> None:
    class Sched(Scripted):
        def decide(self, view: ClusterView, now: float) -> Decision:
            return Decision((StartFg("1", (0,)),), schedule=SliceSchedule(10.0, (0,)))

    with pytest.raises(InvariantViolation, match="schedule-discipline"):
        Simulator([wj(1, 0, 10, 1)], 1, Sched({})).run()  # type: ignore[list-item]


# ------------------------------------------------------------------------------ vmctl sim run

def test_sim_run_on_time_slices(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")  # the table's layout, whatever terminal runs the tests
    base = ("sim", "run", "--model", "feitelson96", "--jobs", "150", "--procs", "32", "--policy", "easy", "-o", "json")
    code, out, err = run_cli(capsys, *base)
    assert code == 0, err
    dedicated = json.loads(out)
    assert dedicated["execution"] == {"model": "two-tier", "discipline": "priority", "levels": 2}
    code, out, err = run_cli(capsys, *base, "--discipline", "timeslice", "--levels", "3", "--slice", "100")
    assert code == 0, err
    sliced = json.loads(out)
    assert sliced["execution"] == {"model": "timeslice", "discipline": "timeslice", "levels": 3, "slice_s": 100.0}
    assert sliced["jobs"] == dedicated["jobs"] and sliced["avg_response"] > dedicated["avg_response"]
    code, out, err = run_cli(capsys, *base[:-2], "--discipline", "timeslice")
    assert code == 0, err
    assert re.search(r"execution model\s*│\s*timeslice, 2 levels, slice 200 s", out), out


@pytest.mark.parametrize(("extra", "reference", "text"), [
    (("--discipline", "timeslice", "--levels", "0"), "validation-failed", "--levels: must be >= 1, got 0"),
    (("--discipline", "timeslice", "--slice", "0"), "validation-failed", "--slice: must be a positive number"),
    (("--discipline", "timeslice", "--slice", "-5"), "validation-failed", "--slice: must be a positive number"),
    (("--discipline", "timeslice", "--slice", "inf"), "validation-failed", "--slice: must be a positive number"),
    (("--levels", "3",), "validation-failed", "--levels: the priority discipline has 2 levels"),
    (("--slice", "10",), "validation-failed", "--slice: applies to --discipline timeslice only"),
    (("--discipline", "gang",), "", "Invalid value for '--discipline'"),
    (("--policy", "measy", "--discipline", "timeslice"), "policy-needs-unmet",
     "policy measy cannot run on the simulator (timeslice model): needs the priority discipline"),
])
def test_sim_run_bad_execution_options(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], reference: str,
                                       text: str) -> None:
    args = ("sim", "run", "--model", "feitelson96", "--jobs", "50", "--procs", "16")
    if "--policy" not in extra:
        args += ("--policy", "easy")
    code, _out, err = run_cli(capsys, *args, *extra)
    assert code == 2, err
    if reference:
        assert err.startswith(f"error: {reference}: "), err
    assert text in err and "Traceback" not in err


# ------------------------------------------------------------------------------ the hooks a new model uses

class Workers(ExecutionModel):
    """A model written in the test, as the shapes helper will write theirs: every job is a task bag of
    up to 4 workers (``shapes``), its work is ``work_per_worker`` times its first width (``work``), it
    advances at one unit per worker (``rate``), and a resize re-rates it (``on_resize``)."""

    name: ClassVar[str] = "workers-test"

    def __init__(self) -> None:
        super().__init__()
        self.resizes: list[tuple[str, tuple[tuple[int, int], ...], tuple[int, ...]]] = []

    def offer(self) -> Offer:
        return Offer(where=self.where(), levels=1, discipline=Discipline.SHARED,
                     shapes=frozenset({"rigid", "task-bag"}))

    def bind(self, state: EngineState) -> None:
        super().bind(state)
        for record in state.records:
            self.shapes[str(record.id)] = JobShape.task_bag([10.0] * 4)

    def work(self, run: Run) -> float:
        return self.state.job_work[run.idx] * run.width

    def rate(self, run: Run) -> float:
        return float(run.width)

    def on_resize(self, run: Run, old_slots: tuple[tuple[int, int], ...], now: float) -> Iterable[Run]:
        self.resizes.append((run.job.id, old_slots, run.cores))
        return ()


class BagPolicy(Scripted):
    name: ClassVar[str] = "scripted-bags"
    needs: ClassVar[Needs] = Needs(levels=1, shapes=frozenset({"task-bag"}))


def test_a_model_in_its_own_module_uses_work_rate_shapes_and_resize() -> None:
    # J1 (10 s per worker) starts with 2 workers: work 20 at rate 2. At 4 (8 done) it grows to 3
    # workers: 12 left at rate 3, ends at 8. The view carries the model's shapes.
    model = Workers()
    widths: list[int] = []

    def look(view: ClusterView, now: float) -> list[Action]:
        assert view.shapes["1"].kind == "task-bag" and view.discipline is Discipline.SHARED
        widths.append(view.running["1"].width)
        return [Resize("1", (0, 1, 2), 0)]

    pol = BagPolicy({0.0: [Start("1", (0, 1), 0)], 4.0: look})
    sim = run([wj(1, 0, 10, 1)], 4, pol, SimConfig(execution=lambda: model))
    assert sim.outcome("1") == (0.0, pytest.approx(8.0))
    assert widths == [2] and model.resizes == [("1", ((0, 0), (1, 0)), (0, 1, 2))]
    assert next(iter(sim.job_rows()))["width"] == 3


def test_resize_on_a_model_without_task_bags_is_refused() -> None:
    class Fixed(Workers):
        def on_resize(self, run: Run, old_slots: tuple[tuple[int, int], ...], now: float) -> Iterable[Run]:
            return ExecutionModel.on_resize(self, run, old_slots, now)

    pol = BagPolicy({0.0: [Start("1", (0,), 0)], 1.0: [Resize("1", (0, 1), 0)]})
    with pytest.raises(SimulationError, match="does not model resize"):
        run([wj(1, 0, 10, 1)], 2, pol, SimConfig(execution=Fixed))
