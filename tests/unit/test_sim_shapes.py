"""Job shapes end to end in the simulator: the speedup models (hand-checked values of Downey 1997 and
Amdahl), ``JobShape`` and its JSON forms with bad input, the rules that derive shapes from a rigid
trace (``vmctl sim run --shapes``), and the moldable and task-bag execution models on hand-checked
timelines (``vmctl.sim.exec_moldable``, ``vmctl.sim.exec_taskbag``)."""

from __future__ import annotations

import itertools
import math
from typing import Any, ClassVar

import pytest
from test_sim_support import Scripted, wj

from vmctl.errors import PolicyNeedsUnmet, SimulationError, ValidationError
from vmctl.experiments.sweep import WorkloadSpec, build_workload, run_one
from vmctl.model import ClusterView, Discipline, JobShape, Resize, Start
from vmctl.policies.base import Needs
from vmctl.shapes import default_procs, shape_from_json, shape_summary, shape_to_json
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.exec_moldable import MoldableModel
from vmctl.sim.exec_taskbag import TaskBagModel
from vmctl.sim.workloads import WorkloadJob
from vmctl.sim.workloads.shapes import derive_shape, moldable_widths
from vmctl.speedup import Amdahl, Downey

# ------------------------------------------------------------------------------ speedup models


def test_downey_low_variance_by_hand() -> None:
    m = Downey(A=4, sigma=0.5)
    assert m.speedup(1) == pytest.approx(1.0)
    assert m.speedup(2) == pytest.approx(4 * 2 / (4 + 0.5 * 1 / 2))  # 1 <= n <= A
    assert m.speedup(4) == pytest.approx(16 / (4 + 0.5 * 3 / 2))
    assert m.speedup(6) == pytest.approx(4 * 6 / (0.5 * 3.5 + 6 * 0.75))  # A <= n <= 2A - 1
    assert m.speedup(7) == pytest.approx(4.0)  # n = 2A - 1: the plateau A
    assert m.speedup(100) == 4.0
    assert Downey(A=8, sigma=0).speedup(5) == pytest.approx(5.0)  # no variance: linear up to A


def test_downey_high_variance_by_hand() -> None:
    m = Downey(A=4, sigma=2)
    assert m.speedup(2) == pytest.approx(2 * 4 * 3 / (2 * (2 + 3) + 4))  # 24 / 14
    assert m.speedup(10) == pytest.approx(4.0)  # n = A + A sigma - sigma
    assert m.speedup(50) == 4.0


@pytest.mark.parametrize("sigma", [0.0, 0.3, 1.0, 1.7, 3.0])
def test_downey_is_continuous_and_never_decreasing(sigma: float) -> None:
    m = Downey(A=10, sigma=sigma)
    values = [m.speedup(1 + k / 100) for k in range(4000)]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(values))
    assert max(abs(b - a) for a, b in itertools.pairwise(values)) < 0.05  # no jump at a boundary
    assert values[-1] == pytest.approx(10.0)


def test_the_two_variance_families_agree_at_sigma_one() -> None:
    low, high = Downey(A=6, sigma=1.0), Downey(A=6, sigma=1.0 + 1e-12)
    for n in (1, 2, 5, 6, 9, 11, 20):
        assert low.speedup(n) == pytest.approx(high.speedup(n), rel=1e-9)


def test_amdahl_by_hand() -> None:
    assert Amdahl(serial=0.1).speedup(10) == pytest.approx(1 / (0.1 + 0.09))
    assert Amdahl(serial=0.0).speedup(16) == pytest.approx(16.0)
    assert Amdahl(serial=1.0).speedup(16) == pytest.approx(1.0)


@pytest.mark.parametrize(("make", "field"), [
    (lambda: Downey(A=0.5, sigma=1), "shape.speedup.A"),
    (lambda: Downey(A=4, sigma=-1), "shape.speedup.sigma"),
    (lambda: Downey(A=math.nan, sigma=1), "shape.speedup.A"),
    (lambda: Amdahl(serial=1.5), "shape.speedup.serial"),
])
def test_bad_model_parameters_name_the_field(make: Any, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        make()
    assert err.value.fields["field"] == field


# ------------------------------------------------------------------------------ JobShape


def test_a_moldable_shape_from_a_table_and_from_a_model() -> None:
    t = JobShape.moldable({4: 60.0, 2: 100.0})
    assert (t.widths, t.times, t.min_width, t.max_width) == ((2, 4), (100.0, 60.0), 2, 4)
    assert t.time_at(4) == 60.0 and t.allows(2) and not t.allows(3)
    m = JobShape.moldable_model([2, 4, 8], Downey(A=4, sigma=0), 100.0)
    assert m.times == pytest.approx((100.0, 50.0, 50.0))  # linear to A = 4, flat after
    a = JobShape.moldable_model([1, 10], Amdahl(serial=0.1), 100.0)
    assert a.time_at(10) == pytest.approx(19.0)  # 100 * S(1) / S(10)


def test_a_task_bag_runs_its_tasks_in_order_on_its_workers() -> None:
    bag = JobShape.task_bag([10.0] * 5, max_workers=2)
    assert bag.time_at(2) == 30.0 and bag.time_at(1) == 50.0 and bag.work == 50.0
    assert JobShape.task_bag([5.0, 1.0, 1.0, 1.0]).time_at(2) == 5.0  # three short ones beside the long one
    assert bag.allows(1) and bag.allows(2) and not bag.allows(3) and bag.min_width == 1


@pytest.mark.parametrize(("make", "field", "words"), [
    (lambda: JobShape.moldable({2: 100.0, 4: -1.0}), "shape.times[1]", "positive"),
    (lambda: JobShape.moldable({2: 100.0, 4: math.inf}), "shape.times[1]", "positive"),
    (lambda: JobShape.moldable({}), "shape.table", "at least one"),
    (lambda: JobShape.moldable({0: 5.0}), "shape.widths", "in [1, "),
    (lambda: JobShape("moldable", (4, 2), (1.0, 2.0)), "shape.widths", "increasing"),
    (lambda: JobShape("moldable", (2, 4), (1.0,)), "shape.times", "one per width"),
    (lambda: JobShape.task_bag([]), "shape.tasks", "at least one task"),
    (lambda: JobShape.task_bag([1.0, -2.0]), "shape.tasks[1]", "seconds"),
    (lambda: JobShape.task_bag([1.0, 2.0], max_workers=3), "shape.max_workers", "one per task"),
    (lambda: JobShape.task_bag([1.0], max_workers=0), "shape.widths", "in [1, "),
])
def test_bad_shapes_name_the_field(make: Any, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        make()
    assert err.value.fields["field"] == field
    assert words in str(err.value)


def test_time_at_a_width_the_shape_does_not_allow() -> None:
    with pytest.raises(ValidationError) as err:
        JobShape.moldable({2: 100.0, 4: 60.0}).time_at(3)
    assert err.value.fields["field"] == "width" and "2..4" in str(err.value)


# ------------------------------------------------------------------------------ JSON forms


@pytest.mark.parametrize("raw", [
    {"kind": "moldable", "table": {"2": 100, "4": 60}},
    {"kind": "moldable", "widths": [4, 2], "times": [60, 100]},
    {"kind": "moldable", "widths": [2, 4, 8], "time_at_min": 100, "speedup": {"name": "downey", "A": 6, "sigma": 1}},
    {"kind": "moldable", "min_width": 2, "max_width": 16, "time_at_min": 100,
     "speedup": {"name": "amdahl", "serial": 0.05}},
    {"kind": "task-bag", "tasks": [10, 10, 12], "max_workers": 2},
])
def test_every_json_form_reads_back_from_the_canonical_form(raw: dict[str, Any]) -> None:
    shape = shape_from_json(raw)
    assert shape_from_json(shape_to_json(shape)) == shape


def test_the_json_forms_by_hand() -> None:
    assert shape_from_json({"kind": "moldable", "table": {"2": 100, "4": 60}}) == JobShape.moldable({2: 100.0,
                                                                                                    4: 60.0})
    ranged = shape_from_json({"kind": "moldable", "min_width": 2, "max_width": 5, "time_at_min": 80,
                              "speedup": {"name": "downey", "A": 3, "sigma": 0}})
    assert ranged.widths == (2, 3, 4, 5) and ranged.times == pytest.approx((80.0, 160 / 3, 160 / 3, 160 / 3))
    assert shape_from_json({"kind": "task-bag", "tasks": [1, 2]}).max_workers == 2
    assert default_procs(ranged) == 2 and default_procs(JobShape.task_bag([1.0] * 4, 3)) == 3
    assert shape_summary(JobShape.moldable({2: 100.0, 4: 60.0})) == "moldable widths 2, 4 (times 100 s, 60 s)"
    assert shape_summary(ranged) == "moldable widths 2..5 (downey A=3 sigma=0, 80 s at 2)"
    assert shape_summary(JobShape.task_bag([10.0] * 5, 2)) == "task bag of 5 tasks (50 s of work), at most 2 workers"


@pytest.mark.parametrize(("raw", "field"), [
    ([1, 2], "jobs[0].shape"),
    ({"kind": "malleable"}, "jobs[0].shape.kind"),
    ({"kind": "moldable", "table": {"2": 100}, "tasks": [1]}, "jobs[0].shape.tasks"),
    ({"kind": "moldable", "table": {"two": 100}}, "jobs[0].shape.table.two"),
    ({"kind": "moldable", "table": {"2": 0}}, "jobs[0].shape.times[0]"),
    ({"kind": "moldable", "table": {"8": 10}, "min_width": 2, "max_width": 4}, "jobs[0].shape.widths"),
    ({"kind": "moldable", "widths": [1, 2], "times": [1, 2, 3]}, "jobs[0].shape.times"),
    ({"kind": "moldable", "widths": [2, 2], "times": [1, 1]}, "jobs[0].shape.widths"),
    ({"kind": "moldable", "widths": [2, 4]}, "jobs[0].shape.times"),
    ({"kind": "moldable", "min_width": 4, "max_width": 2}, "jobs[0].shape.max_width"),
    ({"kind": "moldable", "widths": [2], "speedup": {"name": "downey", "A": 4, "sigma": 1}},
     "jobs[0].shape.time_at_min"),
    ({"kind": "moldable", "widths": [2], "time_at_min": 5, "speedup": {"name": "gustafson"}},
     "jobs[0].shape.speedup.name"),
    ({"kind": "moldable", "widths": [2], "time_at_min": 5, "speedup": {"name": "amdahl", "serial": 2}},
     "jobs[0].shape.speedup.serial"),
    ({"kind": "task-bag", "tasks": []}, "jobs[0].shape.tasks"),
    ({"kind": "task-bag", "tasks": [1, -1]}, "jobs[0].shape.tasks[1]"),
    ({"kind": "task-bag", "tasks": [1], "max_workers": 2}, "jobs[0].shape.max_workers"),
    ({"kind": "task-bag", "tasks": "many"}, "jobs[0].shape.tasks"),
])
def test_bad_json_names_the_field_under_its_path(raw: Any, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        shape_from_json(raw, "jobs[0].shape")
    assert err.value.fields["field"] == field, err.value


# ------------------------------------------------------------------------------ shapes from a rigid trace


def test_the_moldable_rule_by_hand() -> None:
    job = WorkloadJob(1, 0.0, 90.0, 8, 100.0, None)
    shape = derive_shape(job, "moldable", 64)
    assert shape is not None and shape.widths == (2, 4, 8, 16)
    assert shape.time_at(8) == 100.0  # the forecast at procs is the user's estimate
    s = Downey(A=8, sigma=1)
    assert shape.time_at(2) == pytest.approx(100 * s.speedup(8) / s.speedup(2))
    assert shape.time_at(16) == pytest.approx(100 * s.speedup(8) / 8)  # 16 > 2A - 1: the plateau A
    assert moldable_widths(1, 64) == (1, 2) and moldable_widths(40, 64) == (10, 20, 40, 64)
    assert derive_shape(job, "moldable", 4) is None  # wider than the machine: dropped anyway
    assert derive_shape(job, "rigid", 64) is None


def test_the_task_bag_rule_by_hand() -> None:
    shape = derive_shape(WorkloadJob(1, 0.0, 90.0, 3, 100.0, None), "task-bag", 64)
    assert shape == JobShape.task_bag([100.0] * 3, 3)


def test_build_workload_carries_the_shapes() -> None:
    built = build_workload(WorkloadSpec(model="lublin99", jobs=50, procs=32, shapes="task-bag"))
    assert set(built.shapes) == {str(j.id) for j in built.jobs}
    assert all(s.kind == "task-bag" for s in built.shapes.values())
    assert not build_workload(WorkloadSpec(model="lublin99", jobs=50, procs=32)).shapes


@pytest.mark.parametrize("rule", ["moldable", "task-bag"])
def test_a_rigid_policy_gives_the_same_results_on_a_shaped_workload(rule: str) -> None:
    """EASY knows only rigid jobs: it runs every job at procs, where each shape's time is the job's."""
    spec = WorkloadSpec(model="lublin99", jobs=600, procs=64, load=0.85, cpu_usage="full")
    rigid = run_one(spec, "easy").to_dict()
    shaped = run_one(WorkloadSpec(**{**{f: getattr(spec, f) for f in spec.__slots__}, "shapes": rule}),
                     "easy").to_dict()
    assert shaped == rigid


# ------------------------------------------------------------------------------ execution by hand


class Molder(Scripted):
    """The scripted test policy for moldable jobs on one level."""

    name: ClassVar[str] = "scripted-molder"
    needs: ClassVar[Needs] = Needs(levels=1, shapes=frozenset({"rigid", "moldable"}))


class Bagger(Scripted):
    """The scripted test policy for task bags on one level."""

    name: ClassVar[str] = "scripted-bagger"
    needs: ClassVar[Needs] = Needs(levels=1, shapes=frozenset({"rigid", "task-bag"}))


def run(jobs: list[Any], cores: int, policy: Scripted, model: Any) -> Simulator:
    sim = Simulator(jobs, cores, policy, SimConfig(execution=lambda: model))
    sim.run()
    return sim


def test_a_moldable_job_at_width_4_on_fast_nodes() -> None:
    # table {2: 100, 4: 60}; started at width 4 on speed-1.5 nodes: 60 / 1.5 = 40
    shape = JobShape.moldable({2: 100.0, 4: 60.0})
    pol = Molder({0.0: [Start("1", (0, 1, 2, 3))]})
    sim = run([wj(1, 0, 100, 2)], 4, pol, MoldableModel({"1": shape}, speeds=[1.5] * 4, cores_per_node=2))
    assert sim.outcome("1") == (0.0, pytest.approx(40.0))
    assert sim.job_rows().__next__()["width"] == 4


def test_the_slowest_node_sets_a_moldable_jobs_pace() -> None:
    # width 2 on a speed-2 node and a speed-0.5 node: 100 / 0.5 = 200
    shape = JobShape.moldable({2: 100.0, 4: 60.0})
    sim = run([wj(1, 0, 100, 2)], 2, Molder({0.0: [Start("1", (0, 1))]}),
              MoldableModel({"1": shape}, speeds=[2.0, 0.5]))
    assert sim.outcome("1") == (0.0, pytest.approx(200.0))


def test_a_moldable_job_runs_as_its_record_says_against_the_forecast() -> None:
    # the record ran 110 s at procs 2 where the shape forecast 100: 10 % longer at every width
    shape = JobShape.moldable({2: 100.0, 4: 60.0})
    seen: dict[str, float] = {}

    def look(view: ClusterView, now: float) -> list[Any]:
        seen["end"] = view.running["1"].expected_end  # what the policy is told: the forecast
        return []

    sim = run([wj(1, 0, 110, 2)], 4, Molder({0.0: [Start("1", (0, 1, 2, 3))], 10.0: look}), MoldableModel({"1": shape}))
    assert sim.outcome("1") == (0.0, pytest.approx(66.0))
    assert seen["end"] == pytest.approx(60.0)


def test_the_view_shows_node_speed_group_and_shapes() -> None:
    shape = JobShape.moldable({1: 10.0})
    seen: dict[str, Any] = {}

    def look(view: ClusterView, now: float) -> list[Any]:
        seen.update(nodes=list(view.node_of_core), speed=[view.speed_of(view.node(c)) for c in range(4)],
                    group=view.group_of("n1"), shape=view.shapes.get("1"), levels=view.levels,
                    discipline=view.discipline)
        return [Start("1", (0,))]

    run([wj(1, 0, 10, 1)], 4, Molder({0.0: look}),
        MoldableModel({"1": shape}, speeds=[1.0, 1.0, 0.8, 0.8], cores_per_node=2, groups=["a", "b"]))
    assert seen == {"nodes": ["n0", "n0", "n1", "n1"], "speed": [1.0, 1.0, 0.8, 0.8], "group": "b", "shape": shape,
                    "levels": 1, "discipline": Discipline.SHARED}


def test_a_width_the_shape_does_not_allow_is_refused() -> None:
    from vmctl.errors import InvariantViolation

    shape = JobShape.moldable({2: 100.0, 4: 60.0})
    with pytest.raises(InvariantViolation) as err:
        run([wj(1, 0, 100, 2)], 4, Molder({0.0: [Start("1", (0, 1, 2))]}), MoldableModel({"1": shape}))
    assert err.value.fields["rule"] == "cores-count"
    assert "a width its moldable shape does not allow (2, 4)" in str(err.value)


def test_a_task_bag_of_five_tasks_on_two_workers() -> None:
    bag = JobShape.task_bag([10.0] * 5, max_workers=2)
    sim = run([wj(1, 0, 30, 2)], 2, Bagger({0.0: [Start("1", (0, 1))]}), TaskBagModel({"1": bag}))
    assert sim.outcome("1") == (0.0, pytest.approx(30.0))


def test_task_bag_workers_at_their_node_speed() -> None:
    # speeds 2 and 1, tasks of 10 s: the fast worker ends tasks at 5, 10, 15; the slow one at 10.
    # Tasks 0 (fast, 5), 1 (slow, 10), 2 (fast, 10), 3 (fast at 10 -> 15), 4 (slow at 10 -> 20): ends at 20
    bag = JobShape.task_bag([10.0] * 5, max_workers=2)
    sim = run([wj(1, 0, 30, 2)], 2, Bagger({0.0: [Start("1", (0, 1))]}), TaskBagModel({"1": bag}, speeds=[2.0, 1.0]))
    assert sim.outcome("1") == (0.0, pytest.approx(20.0))


def test_a_shrink_waits_for_the_running_task() -> None:
    # 5 tasks of 10 s on 2 workers; at 5 the policy keeps core 0 only. The task on core 1 is not
    # killed: core 1 stays the job's until that task ends at 10. Core 0 then runs tasks 2, 3, 4: 40.
    bag = JobShape.task_bag([10.0] * 5, max_workers=2)
    seen: dict[float, tuple[int, ...]] = {}

    def look(view: ClusterView, now: float) -> list[Any]:
        seen[now] = view.running["1"].cores
        return []

    pol = Bagger({0.0: [Start("1", (0, 1))], 5.0: [Resize("1", (0,))], 7.0: look, 12.0: look})
    sim = run([wj(1, 0, 30, 2)], 2, pol, TaskBagModel({"1": bag}))
    assert sim.outcome("1") == (0.0, pytest.approx(40.0))
    assert seen == {7.0: (0, 1), 12.0: (0,)}  # held until the task ended at 10, then given up


def test_a_grow_takes_tasks_at_once() -> None:
    # 6 tasks of 10 s on 1 worker; at 5 a second worker joins and takes task 1 at once (ends 15);
    # worker 0: task 0 to 10, task 2 to 20, task 4 to 30; worker 1: task 1 to 15, task 3 to 25, task 5 to 35
    bag = JobShape.task_bag([10.0] * 6, max_workers=2)
    pol = Bagger({0.0: [Start("1", (0,))], 5.0: [Resize("1", (0, 1))]})
    sim = run([wj(1, 0, 60, 1)], 2, pol, TaskBagModel({"1": bag}))
    assert sim.outcome("1") == (0.0, pytest.approx(35.0))


def test_the_utilization_counts_the_cores_a_resized_bag_held() -> None:
    # shrink (the case above): 2 cores held over [0, 10) (the given-up one until its task ends), 1 over
    # [10, 40): 20 + 30 = 50 core-seconds of 2 x 40 -> 0.625 (span at the start width x the last width
    # said 30 x 1 = 30 -> 0.375)
    bag = JobShape.task_bag([10.0] * 5, max_workers=2)
    pol = Bagger({0.0: [Start("1", (0, 1))], 5.0: [Resize("1", (0,))]})
    res = Simulator([wj(1, 0, 30, 2)], 2, pol, SimConfig(execution=lambda: TaskBagModel({"1": bag}))).run()
    assert res.metrics.makespan == pytest.approx(40.0)
    assert res.metrics.utilization == pytest.approx(50.0 / 80.0)
    # grow (6 tasks of 10 s, 1 worker, a second at 5, ends at 35): 1 x 5 + 2 x 25 + 1 x 5 = 60 of 2 x 35;
    # worker 0 has no task left at 30 and leaves its slot (vmctld's dispatcher; it idled there until 35
    # before issue 28: 65 of 70; span x last width said 60 x 2 = 120: a utilization above 1)
    bag6 = JobShape.task_bag([10.0] * 6, max_workers=2)
    pol = Bagger({0.0: [Start("1", (0,))], 5.0: [Resize("1", (0, 1))]})
    res = Simulator([wj(1, 0, 60, 1)], 2, pol, SimConfig(execution=lambda: TaskBagModel({"1": bag6}))).run()
    assert res.metrics.utilization == pytest.approx(60.0 / 70.0)
    # 5 tasks on 2 workers, never resized: worker 1 has no task left at 20 and leaves (2 x 20 + 1 x 10 = 50
    # of 2 x 30; span x width, 30 x 2, before issue 28)
    pol = Bagger({0.0: [Start("1", (0, 1))]})
    res = Simulator([wj(1, 0, 30, 2)], 2, pol, SimConfig(execution=lambda: TaskBagModel({"1": bag}))).run()
    assert res.metrics.utilization == pytest.approx(50.0 / 60.0)


def test_a_shrink_that_gives_the_busy_core_away_at_once_is_refused() -> None:
    bag = JobShape.task_bag([10.0] * 5, max_workers=2)
    pol = Bagger({0.0: [Start("1", (0, 1))], 5.0: [Resize("1", (0,)), Start("2", (1,))]})
    with pytest.raises(SimulationError) as err:
        run([wj(1, 0, 30, 2), wj(2, 1, 10, 1)], 2, pol, TaskBagModel({"1": bag}))
    assert "task boundaries" in str(err.value)


def test_models_offer_their_shapes() -> None:
    with pytest.raises(PolicyNeedsUnmet) as err:
        Simulator([wj(1, 0, 10, 1)], 1, Bagger({}), SimConfig(execution=lambda: MoldableModel()))
    assert "task-bag" in str(err.value)
    with pytest.raises(ValidationError) as verr:
        MoldableModel({"1": JobShape.task_bag([1.0])})
    assert verr.value.fields["field"] == "job 1.shape"


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"speeds": [1.0, 0.0]}, "speeds[1]"),
    ({"speeds": [1.0]}, "speeds"),
    ({"speeds": [1.0, 2.0], "cores_per_node": 2}, "speeds"),
    ({"groups": ["a", "b", "c"]}, "groups"),
    ({"groups": ["a b", "c"]}, "groups[0]"),
    ({"levels": 0}, "levels"),
])
def test_bad_model_parameters(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        Simulator([wj(1, 0, 10, 1)], 2, Molder({}), SimConfig(execution=lambda: MoldableModel(**kwargs)))
    assert err.value.fields["field"] == field


def test_two_levels_share_a_core() -> None:
    # two rigid jobs of 10 s on levels 0 and 1 of one core (shared discipline, 2 levels): each gets
    # half the core while both run, so both end at 20
    pol = Molder({0.0: [Start("1", (0,), 0), Start("2", (0,), 1)]})
    sim = run([wj(1, 0, 10, 1), wj(2, 0, 10, 1)], 1, pol, MoldableModel(levels=2))
    assert sim.outcome("1") == (0.0, pytest.approx(20.0))
    assert sim.outcome("2") == (0.0, pytest.approx(20.0))


def test_a_moved_task_bag_keeps_its_tasks_progress_and_pays_the_cost() -> None:
    # 3 tasks of 10 s on 1 worker; at 5 the bag moves to core 1 with a cost of 2 s: task 0 has 5 s
    # left and resumes at 7 (ends 12), tasks 1 and 2 follow: the job ends at 32
    from vmctl.model import Move

    bag = JobShape.task_bag([10.0] * 3, max_workers=1)
    pol = Bagger({0.0: [Start("1", (0,))], 5.0: [Move("1", (1,), 0, cost=2.0)]})
    sim = run([wj(1, 0, 30, 1)], 2, pol, TaskBagModel({"1": bag}))
    assert sim.outcome("1") == (0.0, pytest.approx(32.0))


def test_a_suspended_task_bag_stops_its_tasks() -> None:
    # 3 tasks of 10 s on 1 worker, suspended in [5, 10): every task waits, the job ends at 35
    from vmctl.model import Resume, Suspend

    bag = JobShape.task_bag([10.0] * 3, max_workers=1)
    pol = Bagger({0.0: [Start("1", (0,))], 5.0: [Suspend("1")], 10.0: [Resume("1")]})
    sim = run([wj(1, 0, 30, 1)], 1, pol, TaskBagModel({"1": bag}))
    assert sim.outcome("1") == (0.0, pytest.approx(35.0))


def test_a_task_bag_runs_as_its_record_says_against_the_forecast() -> None:
    # forecast: 4 tasks of 10 s, 20 s on 2 workers; the record ran 30 s at procs 2 (x 1.5): each task
    # takes 15 s and the bag ends at 30 on 2 workers
    bag = JobShape.task_bag([10.0] * 4, max_workers=2)
    sim = run([wj(1, 0, 30, 2)], 2, Bagger({0.0: [Start("1", (0, 1))]}), TaskBagModel({"1": bag}))
    assert sim.outcome("1") == (0.0, pytest.approx(30.0))


def test_sim_run_shapes_option(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from tests.livedaemon import run_cli

    base = ["sim", "run", "--model", "lublin99", "--jobs", "200", "--procs", "16", "--policy", "easy", "-o", "json"]
    code, out, err = run_cli(capsys, *base)
    assert code == 0, err
    rigid = json.loads(out)
    for rule in ("moldable", "task-bag"):
        code, out, err = run_cli(capsys, *base, "--shapes", rule)
        assert code == 0, err
        doc = json.loads(out)
        assert doc["execution"] == {"model": rule, "discipline": "shared", "levels": 1}
        assert (doc["avg_response"], doc["utilization"]) == (rigid["avg_response"], rigid["utilization"])
    code, _, err = run_cli(capsys, *base, "--shapes", "moldable", "--discipline", "timeslice")
    assert code != 0 and "--shapes" in err and "Traceback" not in err
