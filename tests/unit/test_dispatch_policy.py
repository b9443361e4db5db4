"""The ``dispatch-*`` simulator policies (paper 001, ``vmctl.policies.dispatch_policy``) on task bags in
``vmctl sim``: hand-checked timelines, the task-boundary rule for shrinks, levels, bad parameters."""

from __future__ import annotations

from typing import Any

import pytest

from vmctl.errors import PolicyParameterError
from vmctl.model import ClusterView, Decision, JobShape, Resize, Start
from vmctl.policies.dispatch_policy import DispatchPolicy
from vmctl.policies.registry import available_policies, create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.exec_taskbag import TaskBagModel
from vmctl.sim.workloads import WorkloadJob

NAMES = ("dispatch-priority", "dispatch-proportion", "dispatch-workload", "dispatch-deadline")


def bag(jid: int, submit: float, tasks: list[float], priority: int = 0) -> tuple[WorkloadJob, JobShape]:
    """A task bag whose record runs exactly its forecast: recorded at 1 processor (never wider than the
    machine), run time = estimate = its time on one worker, the sum of its tasks."""
    shape = JobShape.task_bag(tasks)
    return WorkloadJob(jid, submit, shape.work, 1, shape.work, None, priority=priority), shape


class Recorder:
    """Wraps a policy and records each decision's actions by time."""

    def __init__(self, inner: DispatchPolicy) -> None:
        self.inner = inner
        self.seen: list[tuple[float, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def decide(self, view: ClusterView, now: float) -> Decision:
        d = self.inner.decide(view, now)
        self.seen.append((now, d.actions))
        return d


def simulate(jobs: list[tuple[WorkloadJob, JobShape]], cores: int, policy: str, speeds: list[float] | None = None,
             levels: int = 1, **params: Any) -> tuple[Simulator, Recorder]:
    pol = Recorder(create_policy(policy, **params))  # type: ignore[arg-type]
    shapes = {str(j.id): s for j, s in jobs}
    model = TaskBagModel(shapes, speeds=speeds or (), levels=levels)
    sim = Simulator([j for j, _ in jobs], cores, pol, SimConfig(execution=lambda: model))  # type: ignore[arg-type]
    sim.run()
    return sim, pol


def ends(sim: Simulator, *ids: str) -> list[float]:
    return [sim.outcome(i)[1] for i in ids]


def test_the_four_policies_are_registered() -> None:
    known = available_policies()
    for name in NAMES:
        assert name in known
        assert set(known[name].parameters) >= {"conserving", "deadline_walltimes"}
    assert "r" in known["dispatch-priority"].parameters
    assert "horizon" in known["dispatch-workload"].parameters


# 10 workers; A (priority 3, 20 tasks of 10 s), B (2, 5 tasks of 12 s), C (1, 5 tasks of 13 s) at 0.
# priority r = 0.2: A gets floor(0.8 * 10) = 8 workers, B and C one each; A ends at 30 (8 + 8 + 4 tasks).
# At 30 (A done) B has task 2 running (24-36) and 2 not started: 3 unfinished -> B, now the top job,
# grows to 3; its new workers take tasks 3 and 4 at 30 -> B ends at 42. C gets one worker (literal
# Algorithm 1) and has 3 unfinished (26-39 running): at 42, C is top with 2 unfinished (task 3 39-52,
# task 4 not started) and grows to 2: task 4 at 42-55 -> C ends at 55. (The literal policy gives nothing
# more to B and C when A's workers go idle at 20.) Conserving, with idle workers leaving at once (vmctld's
# dispatcher; issue 28): at 20 A's 4 workers without a task leave and the policy runs: B (4 unfinished)
# grows by 3 (tasks 2-4 at 20-32), C by the last free one (task 2 at 20-33); at 24 B's first worker has
# no task left and leaves: C grows (task 3 at 24-37); at 26 C's first worker takes task 4 (26-39). So B
# ends at 32 and C at 39 (42 and 43 when the idle workers kept their slots until A's end at 30).
def abc() -> list[tuple[WorkloadJob, JobShape]]:
    return [bag(1, 0, [10.0] * 20, 3), bag(2, 0, [12.0] * 5, 2), bag(3, 0, [13.0] * 5, 1)]


def test_priority_r_02_with_ten_workers_and_three_jobs_by_hand() -> None:
    sim, pol = simulate(abc(), 10, "dispatch-priority", r=0.2)
    first = pol.seen[0][1]
    assert [(a.job_id, len(a.cores)) for a in first] == [("1", 8), ("2", 1), ("3", 1)]
    assert all(isinstance(a, Start) for a in first)
    assert ends(sim, "1", "2", "3") == pytest.approx([30.0, 42.0, 55.0])


def test_the_work_conserving_variant_by_hand() -> None:
    sim, pol = simulate(abc(), 10, "dispatch-priority", r=0.2, conserving=True)
    assert ends(sim, "1", "2", "3") == pytest.approx([30.0, 32.0, 39.0])
    at = dict(pol.seen)
    assert {a.job_id: len(a.cores) for a in at[20.0]} == {"2": 4, "3": 2}  # the pass when A's workers idle
    assert [(a.job_id, len(a.cores)) for a in at[24.0]] == [("3", 3)]


def test_an_idle_worker_leaves_its_bag_and_the_policy_hands_its_slot_on() -> None:
    # vmctld's dispatcher (issue 28): a worker with no task left leaves at once and vmctld decides.
    # 2 workers, r = 0, conserving: A (priority 2, tasks of 10 and 30 s) takes both at 0; B (priority 1,
    # 1 task of 10 s) arrives at 5 and waits. At 10 A's first worker has no task left: it leaves and the
    # pass starts B on its slot at 10 (ends 20). Before, the idle worker kept its slot until A ended at 30.
    a = JobShape.task_bag([10.0, 30.0])  # recorded at 2 processors for its time there, 30 s: runs as given
    jobs = [(WorkloadJob(1, 0.0, 30.0, 2, 30.0, None, priority=2), a), bag(2, 5, [10.0], 1)]
    sim, pol = simulate(jobs, 2, "dispatch-priority", r=0.0, conserving=True)
    assert sim.outcome("2") == (10.0, pytest.approx(20.0))
    assert ends(sim, "1") == pytest.approx([30.0])
    assert dict(pol.seen)[10.0] == (Start("2", (0,), 0),)


def test_priority_r_05_keeps_half_the_workers_from_the_top_job() -> None:
    sim, pol = simulate(abc(), 10, "dispatch-priority", r=0.5)
    assert [len(a.cores) for a in pol.seen[0][1]] == [5, 1, 1]
    assert ends(sim, "1")[0] == pytest.approx(40.0)  # 20 tasks of 10 s on 5 workers


def test_proportion_by_hand() -> None:
    # 10 workers, remaining work 600 / 300 / 100: 6, 3, 1 workers
    jobs = [bag(1, 0, [100.0] * 6), bag(2, 0, [100.0] * 3), bag(3, 0, [100.0])]
    sim, pol = simulate(jobs, 10, "dispatch-proportion")
    assert [(a.job_id, len(a.cores)) for a in pol.seen[0][1]] == [("1", 6), ("2", 3), ("3", 1)]
    assert ends(sim, "1", "2", "3") == pytest.approx([100.0, 100.0, 100.0])


def test_workload_takes_the_fastest_workers_until_the_horizon_is_met() -> None:
    # speeds 2, 1, 1, 1; one bag of 4 tasks of 100 s (work 400); horizon 100: 2 + 1 + 1 = 4 >= 4 ->
    # the speed-2 worker and two speed-1 ones (cores 0, 1, 2). Tasks 0 on the fast worker (0-50),
    # 1, 2 on the others (0-100); task 3 on the fast worker at 50 -> ends at 100.
    sim, pol = simulate([bag(1, 0, [100.0] * 4)], 4, "dispatch-workload", speeds=[2.0, 1.0, 1.0, 1.0],
                        horizon=100.0)
    assert pol.seen[0][1] == (Start("1", (0, 1, 2), 0),)
    assert ends(sim, "1") == pytest.approx([100.0])


def test_deadline_takes_enough_workers_for_the_deadline() -> None:
    # one bag of 6 tasks of 10 s (work 60), deadline 30 s after submission (deadline_walltimes 0.5 x its
    # estimate, the work on one worker, 60): 60 / 30 = 2 workers (of 6), which end it at 30: met exactly.
    sim, pol = simulate([bag(1, 0, [10.0] * 6)], 6, "dispatch-deadline", deadline_walltimes=0.5)
    assert [len(a.cores) for a in pol.seen[0][1]] == [2]
    assert ends(sim, "1") == pytest.approx([30.0])


def test_a_shrink_waits_for_the_task_boundary_and_hands_the_slot_on() -> None:
    # 4 workers, r = 0: A (priority 1, 8 tasks of 10 s) takes all 4 at 0. B (priority 5, 2 tasks of 10 s)
    # arrives at 5: the plan gives B 2 and A 1. A keeps core 0; cores 1-3 run A's tasks until 10 (not
    # killed), so B cannot start at 5. At 10 the freed slots call the policy, which starts B on 2 of them
    # (ends at 20) and keeps A at 1 worker... A then has tasks 4-7 (4 on core 0 at 10-20 ...).
    jobs = [bag(1, 0, [10.0] * 8, 1), bag(2, 5, [10.0] * 2, 5)]
    sim, pol = simulate(jobs, 4, "dispatch-priority", r=0.0)
    at5 = dict(pol.seen)[5.0]
    assert at5 == (Resize("1", (0,), 0),)
    at10 = dict(pol.seen)[10.0]
    assert Start("2", (1, 2), 0) in at10
    assert sim.outcome("2")[0] == 10.0
    assert ends(sim, "2") == pytest.approx([20.0])
    # A: core 0 runs tasks 4 (10-20); at 20 B ends and A grows back to min(3 unfinished, 4) = 3 workers:
    # tasks 5, 6, 7 at 20-30 -> A ends at 30
    assert ends(sim, "1") == pytest.approx([30.0])


def test_the_plan_respects_the_bags_max_workers() -> None:
    shape = JobShape.task_bag([10.0] * 6, max_workers=2)
    job = WorkloadJob(1, 0.0, shape.work, 1, shape.work, None)
    sim, pol = simulate([(job, shape)], 6, "dispatch-priority", r=0.0, conserving=True)
    assert [len(a.cores) for a in pol.seen[0][1]] == [2]
    assert ends(sim, "1") == pytest.approx([30.0])


def test_two_shared_levels_give_two_workers_per_core() -> None:
    # the paper's testbed: single-core nodes with 2 workers each. 2 cores x 2 levels; bags A and B of 2
    # tasks of 10 s at 0 under proportion: 2 workers each, A on level 0 of both cores and B on level 1;
    # each core is shared by 2 runs (speed 1/2): every task takes 20 s -> both end at 20.
    jobs = [bag(1, 0, [10.0] * 2), bag(2, 0, [10.0] * 2)]
    sim, pol = simulate(jobs, 2, "dispatch-proportion", levels=2)
    assert pol.seen[0][1] == (Start("1", (0, 1), 0), Start("2", (0, 1), 1))
    assert ends(sim, "1", "2") == pytest.approx([20.0, 20.0])


def test_tasks_left_is_in_the_view() -> None:
    seen: dict[float, int | None] = {}

    class Look(DispatchPolicy):
        name = "look"
        planner = "proportion"
        parameters = DispatchPolicy._COMMON

        def decide(self, view: ClusterView, now: float) -> Decision:
            if "1" in view.running:
                seen[now] = view.running["1"].tasks_left
            return super().decide(view, now)

    jobs = [bag(1, 0, [10.0] * 5), bag(2, 15, [1.0])]
    model = TaskBagModel({str(j.id): s for j, s in jobs})
    pol = Look()
    sim = Simulator([j for j, _ in jobs], 1, pol, SimConfig(execution=lambda: model))
    sim.run()
    assert seen[15.0] == 4  # task 0 done at 10, task 1 running, 2-4 not started


@pytest.mark.parametrize(("params", "field"), [
    ({"r": 1.5}, "r"), ({"r": -0.1}, "r"), ({"deadline_walltimes": -1.0}, "deadline_walltimes"),
    ({"horizon": 0.0}, "horizon"), ({"bogus": 1}, "bogus"),
])
def test_bad_parameters_name_the_field(params: dict[str, Any], field: str) -> None:
    name = "dispatch-workload" if "horizon" in params else "dispatch-priority"
    with pytest.raises(PolicyParameterError) as err:
        create_policy(name, **params)
    assert field in str(err.value)


def test_rigid_jobs_wait_with_a_reason() -> None:
    from tests.viewbuilder import job, view

    v = view(4, queue=[job("r1", 2, 10.0)])
    d = create_policy("dispatch-priority").decide(v, 0.0)
    assert d.actions == ()
    assert "not a task bag" in d.reason_for("r1")


@pytest.mark.parametrize(("observed", "resized"),
                         [(None, (0, 1)), ({(0, 0): 2.0}, None), ({(0, 0): 0.5}, (0, 1, 2, 3))])
def test_the_observed_throughput_feeds_the_plan(observed: dict[tuple[int, int], float] | None,
                                                resized: tuple[int, ...] | None) -> None:
    """A running bag's observed throughput (``RunningJob.throughput``, vmctld's status checker) replaces
    the worker's speed in the plan: 4 tasks of 100 s left, deadline in 200 s; at speed 1 the bag needs 2
    workers (400 s of work), grown from its one core by a Resize; where its worker was seen doing 2 work
    seconds per second, that one worker meets the deadline and nothing changes. Seen at 0.5, the bag's
    profile factor (0.5) applies to the workers it has not run on too, so it needs all 4 (without the
    profile: 0.5 + 1 + 1 = 2.5 >= 2 on 3 workers)."""
    from vmctl.model import Discipline, Job, RunningJob, Tier

    job = Job(id="a", submit_time=0.0, procs=4, estimate=400.0, deadline=200.0)
    rj = RunningJob(job=job, tier=Tier.FG, cores=(0,), start_time=0.0, tier_since=0.0, level=0, tasks_left=4,
                    throughput=observed)
    view = ClusterView.leveled(4, [], {"a": rj}, [["a", None, None, None]], [{1, 2, 3}], Discipline.SHARED,
                               [0.0] * 4, [True] * 4, shapes={"a": JobShape.task_bag([100.0] * 4)})
    d = create_policy("dispatch-deadline").decide(view, 0.0)
    got = [tuple(sorted(a.cores)) for a in d.actions if isinstance(a, Resize)]
    assert got == ([] if resized is None else [resized]), d.actions


def test_a_bad_profile_is_named() -> None:
    from vmctl.errors import ValidationError
    from vmctl.policies.dispatch import PlanJob

    with pytest.raises(ValidationError) as err:
        PlanJob("j", 1, 10.0, profile=0.0)
    assert "job j.profile" in str(err.value)


def test_a_rigid_policy_keeps_a_bags_idle_workers_on_their_slots() -> None:
    # EASY (paper 001's baseline) runs a bag rigidly: the same two jobs, the first worker idles from 10 on
    # its slot and the second job starts when the first ends at 30
    a = JobShape.task_bag([10.0, 30.0])
    jobs = [(WorkloadJob(1, 0.0, 30.0, 2, 30.0, None), a), (WorkloadJob(2, 5.0, 10.0, 1, 10.0, None),
                                                            JobShape.task_bag([10.0]))]
    shapes = {str(j.id): s for j, s in jobs}
    model = TaskBagModel(shapes)
    sim = Simulator([j for j, _ in jobs], 2, create_policy("easy"), SimConfig(execution=lambda: model))
    sim.run()
    assert sim.outcome("2") == (30.0, pytest.approx(40.0))
