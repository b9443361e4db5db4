"""The one occupancy model (``vmctl.policies.occupancy``) through the invariant checker: levels,
the general start/move actions, suspend/resume rules, time-slice schedules and node capacity counted
against the shared VMs already placed."""

from __future__ import annotations

import dataclasses

import pytest

from tests.viewbuilder import job, view
from vmctl.errors import InvariantViolation
from vmctl.model import (
    Action,
    Checkpoint,
    ClusterView,
    Decision,
    Discipline,
    Job,
    Kill,
    Move,
    PlaceShared,
    Promote,
    Restore,
    Resume,
    RunningJob,
    SetCap,
    SliceSchedule,
    Start,
    StartBg,
    StartFg,
    Suspend,
    Tier,
)
from vmctl.policies.invariants import check_decision


def check(v: ClusterView, *actions: Action, schedule: SliceSchedule | None = None) -> None:
    check_decision(v, Decision(actions=actions, schedule=schedule), 10.0)


def rule_of(v: ClusterView, *actions: Action, schedule: SliceSchedule | None = None) -> str:
    with pytest.raises(InvariantViolation) as exc:
        check(v, *actions, schedule=schedule)
    return str(exc.value.fields["rule"])


def gang(levels: int = 3, cores: int = 4, queue: list[Job] | None = None) -> ClusterView:
    slots: list[list[str | None]] = [[None] * cores for _ in range(levels)]
    running: dict[str, RunningJob] = {}
    r = job("r", 2, 100)
    slots[2][0] = slots[2][1] = "r"
    running["r"] = RunningJob(r, Tier.BG, (0, 1), 0.0, 0.0, level=2)
    idle = [{c for c in range(cores) if slots[k][c] is None} for k in range(levels)]
    q = queue or []
    return ClusterView.leveled(cores, q, running, slots, idle, Discipline.TIMESLICE, [0.0] * cores,
                               [True] * cores, queue_index={j.id: j for j in q})


# ----------------------------------------------------------------------------- levels and general actions


def test_start_on_any_level_and_move_between_rows() -> None:
    v = gang(queue=[job("a", 2, 50), job("b", 1, 50)])
    check(v, Start("a", (0, 1), level=0), Start("b", (2,), level=2), Move("r", None, level=1))
    assert rule_of(v, Start("a", (0, 1), level=2)) == "two-on-level"
    assert rule_of(v, Start("a", (0, 1), level=3)) == "level-range"
    assert rule_of(v, Start("a", (0,), level=0)) == "cores-count"  # rigid: width == procs
    assert rule_of(v, Move("r", (2, 3), level=2, cost=-1.0)) == "migrate-cost"
    check(v, Move("r", (2, 3), level=2, cost=5.0), Start("a", (0, 1), level=2))


def test_start_bg_on_a_one_level_cluster_is_refused() -> None:
    v = ClusterView.leveled(2, [job("a", 1, 5)], {}, [[None, None]], [{0, 1}], Discipline.SHARED, [0.0, 0.0],
                            [True, True])
    check(v, StartFg("a", (0,)))
    assert rule_of(v, StartBg("a", (0,))) == "level-range"


def test_promote_is_a_move_with_the_priority_rules() -> None:
    a = job("a", 1, 10)
    v = view(2, queue=[a], running=[(job("f", 1, 10), Tier.FG, (0,), 0.0)])
    assert rule_of(v, StartBg("a", (0,)), Promote("a")) == "promote-fg-busy"
    check(v, StartBg("a", (0,)), Kill("f", requeue=False), Promote("a"))


def test_checkpoint_then_restore_elsewhere() -> None:
    v = view(4, running=[(job("a", 2, 10), Tier.FG, (0, 1), 0.0)])
    check(v, Checkpoint("a"), Restore("a", (2, 3), Tier.BG))
    check(v, Checkpoint("a"), Move("a", (2, 3), level=0))
    assert rule_of(v, Restore("a", (2, 3), Tier.FG)) == "restore-not-checkpointed"
    assert rule_of(v, Checkpoint("a"), Move("a", None, level=0)) == "restore-cores"


def test_a_checkpointed_job_of_the_view_is_restored_not_resumed() -> None:
    # the view says which suspended job is checkpointed (it holds no slot): Resume is refused naming
    # the rule, Restore/Move onto cores and Kill are accepted, anything that needs its slots is refused
    a = job("a", 2, 10)
    ck = RunningJob(a, Tier.FG, (0, 1), 0.0, 0.0, progress=4.0, suspended=True, checkpointed=True)
    v = view(4)
    v = dataclasses.replace(v, running={"a": ck}, fg_job=[None] * 4, idle_fg={0, 1, 2, 3})
    assert rule_of(v, Resume("a")) == "resume-checkpointed"
    check(v, Restore("a", (2, 3), Tier.FG))
    check(v, Move("a", (0, 1), level=1))
    check(v, Kill("a", requeue=False))
    assert rule_of(v, Move("a", None, level=0)) == "restore-cores"
    assert rule_of(v, Suspend("a")) == "checkpointed"
    assert rule_of(v, Checkpoint("a")) == "checkpointed"
    # a suspended job that keeps its slots is still resumed
    sus = dataclasses.replace(ck, checkpointed=False)
    v2 = dataclasses.replace(v, running={"a": sus}, fg_job=["a", "a", None, None], idle_fg={2, 3})
    check(v2, Resume("a"))


# ----------------------------------------------------------------------------- suspend and resume


def test_no_double_suspend_and_no_resume_of_a_running_job() -> None:
    v = view(2, running=[(job("a", 1, 10), Tier.FG, (0,), 0.0)])
    check(v, Suspend("a"))
    check(v, Suspend("a"), Resume("a"))
    assert rule_of(v, Suspend("a"), Suspend("a")) == "double-suspend"
    assert rule_of(v, Resume("a")) == "resume-not-suspended"
    suspended = dataclasses.replace(v, running={"a": dataclasses.replace(v.running["a"], suspended=True)})
    check(suspended, Resume("a"))
    assert rule_of(suspended, Suspend("a")) == "double-suspend"


# ----------------------------------------------------------------------------- time-slice schedule


def test_time_slice_schedule_rules() -> None:
    v = gang()
    check(v, schedule=SliceSchedule(period=200.0, order=(0, 2, 1)))
    assert rule_of(v, schedule=SliceSchedule(period=0.0, order=(0,))) == "schedule-period"
    assert rule_of(v, schedule=SliceSchedule(period=10.0, order=(0, 0))) == "schedule-order"
    assert rule_of(v, schedule=SliceSchedule(period=10.0, order=(3,))) == "schedule-order"
    assert rule_of(view(2), schedule=SliceSchedule(period=10.0, order=(0,))) == "schedule-discipline"


# ----------------------------------------------------------------------------- node capacity (vcsched)


def vjob(jid: str, cpu: float = 1.0, mem: float = 0.0) -> Job:
    return Job(id=jid, submit_time=0.0, procs=1, estimate=100.0, cpu_need=cpu, mem=mem)


def shared_view(queue: list[Job], placed: list[tuple[Job, str, float | None]], cores: int = 1) -> ClusterView:
    """Two nodes a, b of ``cores`` cores (the CPU capacity of their shared VMs' caps, issue 22); ``placed``
    holds shared VMs already running (job, node, cap)."""
    v = view(2 * cores, queue=queue)
    running = {
        j.id: RunningJob(j, Tier.FG, (0 if node == "a" else cores,), 0.0, 0.0, cap=cap, shared_nodes=(node,))
        for j, node, cap in placed
    }
    return dataclasses.replace(v, running=running, node_of_core=["a"] * cores + ["b"] * cores,
                               local_core=list(range(cores)) * 2, node_names=["a", "b"])


def test_setcap_plus_place_shared_overrun_is_refused() -> None:
    """The issue's case: SetCap 1.0 on a running shared job plus PlaceShared 1.0 of a new job on the
    same node. The old check summed only the decision's PlaceShared actions and accepted it."""
    v = shared_view([vjob("new")], [(vjob("old"), "a", 0.5)])
    assert rule_of(v, SetCap("old", 1.0), PlaceShared("new", ("a",), 1.0)) == "node-cpu"
    check(v, SetCap("old", 0.4), PlaceShared("new", ("a",), 0.6))
    check(v, SetCap("old", 1.0), PlaceShared("new", ("b",), 1.0))
    # on 2-core nodes the same node holds both at 1.0 (2 cores of caps), and no third
    v = shared_view([vjob("new"), vjob("third")], [(vjob("old"), "a", 0.5)], cores=2)
    check(v, SetCap("old", 1.0), PlaceShared("new", ("a",), 1.0))
    assert rule_of(v, SetCap("old", 1.0), PlaceShared("new", ("a",), 1.0),
                   PlaceShared("third", ("a",), 0.1)) == "node-cpu"


def test_capacity_counts_what_is_already_placed() -> None:
    v = shared_view([vjob("new", cpu=0.6, mem=0.5)], [(vjob("old", cpu=0.6, mem=0.6), "a", None)])
    # the uncapped running VM may take its whole need, 0.6: 0.6 + 0.6 > 1 on node a
    assert rule_of(v, PlaceShared("new", ("a",), 0.6)) == "node-cpu"
    assert rule_of(v, PlaceShared("new", ("a",), 0.3)) == "node-memory"  # 0.6 + 0.5 of memory
    check(v, PlaceShared("new", ("b",), 0.6))
    # moving the running VM away first frees its node (end state counts, so a swap is legal too)
    check(v, PlaceShared("old", ("b",), 0.4), PlaceShared("new", ("a",), 0.6))
    check(v, PlaceShared("new", ("a",), 0.6), PlaceShared("old", ("b",), 0.4))
    # killing it frees the node as well
    check(v, Kill("old", requeue=False), PlaceShared("new", ("a",), 0.6))


# ----------------------------------------------------------------------------- general actions in the executors


def test_priority_form_of_the_general_actions() -> None:
    from vmctl.model import Demote, Migrate
    from vmctl.policies.occupancy import priority_form

    assert priority_form(Start("a", (0, 1), level=0)) == StartFg("a", (0, 1))
    assert priority_form(Start("a", (0,), level=1)) == StartBg("a", (0,))
    assert priority_form(Move("a", None, level=0)) == Promote("a")
    assert priority_form(Move("a", None, level=1)) == Demote("a")
    assert priority_form(Move("a", (2,), level=1, cost=5.0)) == Migrate("a", (2,), Tier.BG, 5.0)
    assert priority_form(Move("a", (2,), level=0), checkpointed=True) == Restore("a", (2,), Tier.FG)
    assert priority_form(Start("a", (0,), level=2)) == Start("a", (0,), level=2)  # no priority name


def test_simulator_runs_start_and_move_like_the_priority_actions() -> None:
    from test_sim_support import Scripted, wj

    from vmctl.progress import ProgressModel
    from vmctl.sim.engine import SimConfig, Simulator

    fixed = ProgressModel(loss_low=0.02, loss_high=0.02, beta_single_low=0.9, beta_single_high=0.9,
                          beta_multi_low=0.9, beta_multi_high=0.9)
    cfg = SimConfig(progress=fixed, two_tier=True)
    jobs = [wj(1, 0, 49, 1, usage=0.5), wj(2, 0, 71.5, 1, usage=1.0)]
    old = Simulator(jobs, 1, Scripted({0.0: [StartFg("1", (0,)), StartBg("2", (0,))], 60.0: [Promote("2")]}), cfg)
    new = Simulator(jobs, 1, Scripted({0.0: [Start("1", (0,), 0), Start("2", (0,), 1)], 60.0: [Move("2", None, 0)]}),
                    cfg)
    assert old.run().to_dict() == new.run().to_dict()
    assert old.outcome("2") == new.outcome("2")


# ----------------------------------------------------------------------------- shapes


def test_width_follows_the_shape() -> None:
    from vmctl.model import JobShape, Resize

    mold, bag, rigid = job("m", 4, 10), job("t", 1, 10), job("r", 2, 10)
    v = dataclasses.replace(view(8, queue=[mold, bag, rigid]),
                            shapes={"m": JobShape.moldable({2: 10.0, 4: 6.0}), "t": JobShape.task_bag([5.0] * 3)})
    check(v, StartFg("m", (0, 1)), StartFg("t", (2, 3, 4)), StartFg("r", (5, 6)))  # widths 2 (of 2, 4) and 3
    assert rule_of(v, StartFg("m", (0, 1, 2))) == "cores-count"  # 3 is not a width of m
    assert rule_of(v, StartFg("t", (0, 1, 2, 3))) == "cores-count"  # at most 3 workers
    assert rule_of(v, StartFg("r", (0,))) == "cores-count"  # rigid: width == procs
    running = dataclasses.replace(v, running={"t": RunningJob(bag, Tier.FG, (2, 3), 0.0, 0.0)},
                                  fg_job=[None, None, "t", "t", None, None, None, None])
    check(running, Resize("t", (2, 3, 4)))  # grows at a task boundary, keeping its own cores
    check(running, Resize("t", (7,)))
    assert rule_of(running, Resize("t", (1, 2, 3, 4))) == "cores-count"
    assert rule_of(v, Resize("m", (0, 1))) == "resize-not-task-bag"
    assert rule_of(v, Resize("t", (0,))) == "not-running"
