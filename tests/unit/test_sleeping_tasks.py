"""Tasks that sleep (issue 12: paper 001's testbed tasks sleep for their length): a task bag's
``task_usage`` u in (0, 1]; a core is split among its busy workers' demands max-min fairly, as the mock
backend splits it (one function, :func:`vmctl.cpushare.share_core`), and a task progresses at its
allocation over u. By hand in the simulator, the mock agents and the simulator agreeing under vmctld,
and bad input named."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_sim_shapes import Bagger, run
from test_sim_support import wj

from tests.unit.test_daemon_core import Cluster
from vmctl.agents.backends import mock
from vmctl.api.schemas import job_spec
from vmctl.client import Job, Profile, Task
from vmctl.cpushare import share_core
from vmctl.daemon import dispatcher
from vmctl.errors import ValidationError
from vmctl.experiments import taskbags_live
from vmctl.model import Discipline, JobShape, Start
from vmctl.policies.base import Needs
from vmctl.policies.registry import create_policy
from vmctl.shapes import shape_from_json, shape_summary, shape_to_json
from vmctl.sim.exec_taskbag import TaskBagModel
from vmctl.store.base import JobRecord


class SharedBagger(Bagger):
    """The scripted test policy for task bags on a core of 2 shared levels."""

    name: ClassVar[str] = "scripted-shared-bagger"
    needs: ClassVar[Needs] = Needs(levels=2, disciplines=frozenset({Discipline.SHARED}),
                                   shapes=frozenset({"rigid", "task-bag"}))


def _two_bags(u0: float, u1: float, work: float = 10.0) -> tuple[float, float]:
    """Two one-task bags of ``work`` s on levels 0 and 1 of one core of speed 1: their ends."""
    shapes = {"1": JobShape.task_bag([work], task_usage=u0), "2": JobShape.task_bag([work], task_usage=u1)}
    pol = SharedBagger({0.0: [Start("1", (0,), 0), Start("2", (0,), 1)]})
    sim = run([wj(1, 0, work, 1), wj(2, 0, work, 1)], 1, pol, TaskBagModel(shapes, levels=2))
    return sim.outcome("1")[1], sim.outcome("2")[1]


@pytest.mark.parametrize(("u0", "u1", "ends"), [
    (0.01, 0.01, (10.0, 10.0)),  # two sleeping tasks: each at its length
    (1.0, 1.0, (20.0, 20.0)),  # two CPU-bound: half the core each, twice as long
    (0.5, 0.5, (10.0, 10.0)),  # 0.5 + 0.5 fit the core: full speed
    (1.0, 0.25, (12.5, 10.0)),  # 0.75 and 0.25: 7.5 s of work by 10, then the rest alone at full speed
    (0.25, 1.0, (10.0, 12.5)),
])
def test_two_tasks_on_one_core_by_hand(u0: float, u1: float, ends: tuple[float, float]) -> None:
    assert _two_bags(u0, u1) == pytest.approx(ends)


def test_node_speed_scales_the_allocation() -> None:
    # speed 2: 1.0 + 0.25 -> 0.75 x 2 = 1.5 and 0.25 / 0.25 x 2 = 2: B ends at 5; A did 7.5 by then, the
    # last 2.5 alone at 2: 6.25
    shapes = {"1": JobShape.task_bag([10.0]), "2": JobShape.task_bag([10.0], task_usage=0.25)}
    pol = SharedBagger({0.0: [Start("1", (0,), 0), Start("2", (0,), 1)]})
    sim = run([wj(1, 0, 10, 1), wj(2, 0, 10, 1)], 1, pol, TaskBagModel(shapes, speeds=[2.0], levels=2))
    assert (sim.outcome("1")[1], sim.outcome("2")[1]) == pytest.approx((6.25, 5.0))


@pytest.mark.parametrize(("usage", "end"), [(1.0, 50.0), (0.01, 30.0)])
def test_one_bag_on_both_slots_of_a_core(usage: float, end: float) -> None:
    # 5 tasks of 10 s on both levels of one core: CPU-bound, two at a time at half speed (20, 40) and the
    # last alone at full speed (the idle worker demands nothing): 50; sleeping, two at a time at full
    # speed: 10, 20, 30
    bag = JobShape.task_bag([10.0] * 5, 2, usage)
    pol = SharedBagger({0.0: [Start("1", (0, 0), slot_levels=(0, 1))]})
    sim = run([wj(1, 0, 50, 1)], 1, pol, TaskBagModel({"1": bag}, levels=2))
    assert sim.outcome("1") == (0.0, pytest.approx(end))


def test_a_rigid_job_beside_a_sleeping_worker() -> None:
    # a rigid job of 10 s demands the whole core: beside a sleeping task (0.01) it gets 0.99 until the
    # task ends at 10, then all of it: 10 - 9.9 = 0.1 s left -> 10.1
    shapes = {"2": JobShape.task_bag([10.0], task_usage=0.01)}
    pol = SharedBagger({0.0: [Start("1", (0,), 0), Start("2", (0,), 1)]})
    sim = run([wj(1, 0, 10, 1), wj(2, 0, 10, 1)], 1, pol, TaskBagModel(shapes, levels=2))
    assert sim.outcome("2")[1] == pytest.approx(10.0)
    assert sim.outcome("1")[1] == pytest.approx(10.1)


def test_the_mock_backend_and_the_simulator_share_one_rule() -> None:
    assert mock.share_core is share_core
    assert share_core([(1, 1.0), (1, 0.25)], 1.0) == pytest.approx([0.75, 0.25])
    assert share_core([(1, 0.01), (1, 0.01)], 1.0) == pytest.approx([0.01, 0.01])


# ------------------------------------------------------------------ vmctld + mock agents against the simulator

def _bag_spec(u: float, work: float) -> dict[str, Any]:
    return job_spec({"shape": {"kind": "task-bag", "tasks": [work], "task_usage": u}})


@pytest.mark.parametrize(("u0", "u1"), [(0.01, 0.01), (1.0, 1.0), (1.0, 0.25)])
def test_mock_agents_under_vmctld_agree_with_the_simulator(tmp_path: Path, u0: float, u1: float) -> None:
    """Two one-task bags of 100 s on one host of 1 core x 2 shared workers: vmctld gives each task's
    process the bag's task usage, the mock backend splits the core, and the bags end where the
    simulator ends them (within the 1 s steps of the agents' loop)."""
    cluster = Cluster(tmp_path, {"n1": 1}, policy=create_policy("dispatch-proportion"), shared_levels=2)
    t0 = cluster.clock.now()
    a, b = (cluster.daemon.submit([_bag_spec(u, 100.0)])[0].id for u in (u0, u1))
    cluster.step()
    desired = {vm.process.job_id: vm.process.cpu_usage for vm in cluster.daemon.desired("n1").vms
               if vm.process is not None}
    assert desired == {a: u0, b: u1}
    cluster.run_until(lambda: cluster.state(a) == "done" and cluster.state(b) == "done", limit=400)
    got = [cluster.daemon.job(j).end_time - t0 for j in (a, b)]  # type: ignore[operator]
    want = _two_bags(u0, u1, 100.0)
    assert got == pytest.approx(want, abs=3.0), (got, want)


# ------------------------------------------------------------------ the shape, the client and the dispatcher

def test_task_usage_in_json_and_the_summary() -> None:
    shape = JobShape.task_bag([10.0, 10.0], 2, 0.01)
    doc = shape_to_json(shape)
    assert doc == {"kind": "task-bag", "tasks": [10.0, 10.0], "max_workers": 2, "task_usage": 0.01}
    assert shape_from_json(doc) == shape
    assert "task_usage" not in shape_to_json(JobShape.task_bag([10.0]))  # CPU-bound: the former form
    assert shape_summary(shape).endswith("each task at 0.01 of a core")


@pytest.mark.parametrize(("make", "field"), [
    (lambda: JobShape.task_bag([10.0], task_usage=0.0), "shape.task_usage"),
    (lambda: JobShape.task_bag([10.0], task_usage=1.5), "shape.task_usage"),
    (lambda: JobShape("moldable", (2,), (10.0,), task_usage=0.5), "shape.task_usage"),
    (lambda: shape_from_json({"kind": "task-bag", "tasks": [1], "task_usage": "low"}, "jobs[0].shape"),
     "jobs[0].shape.task_usage"),
    (lambda: job_spec({"shape": {"kind": "task-bag", "tasks": [1], "task_usage": -1}}), "shape.task_usage"),
    (lambda: job_spec({"shape": {"kind": "task-bag", "tasks": [1]}, "tasks": [{"cpu_usage": 0}]}),
     "tasks[0].cpu_usage"),
])
def test_bad_task_usage_names_the_field(make: Any, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        make()
    assert err.value.fields["field"] == field


def test_the_client_sends_the_tasks_usage() -> None:
    job = Job("b", max_workers=2, tasks=[Task(work_seconds=5.0, cpu_usage=0.01)] * 3)
    spec = job.to_spec()
    assert spec["shape"]["task_usage"] == 0.01 and [t["cpu_usage"] for t in spec["tasks"]] == [0.01] * 3
    # a profile's usage applies to the tasks without their own; mixed usages stay per task
    job = Job("p", max_workers=2, profile=Profile(runtime_s=5.0, cpu_usage=0.5), tasks=[Task(), Task(cpu_usage=1.0)])
    spec = job.to_spec()
    assert "task_usage" not in spec["shape"] and [t["cpu_usage"] for t in spec["tasks"]] == [0.5, 1.0]
    assert job_spec(spec)["shape"] == spec["shape"]


def test_the_dispatcher_gives_each_process_its_usage() -> None:
    shape = JobShape.task_bag([5.0, 5.0], 2, 0.01)
    rec = JobRecord(id="7", seq=1, name="b", submit_time=0.0, state="running",
                    spec={"shape": shape_to_json(shape), "tasks": [{}, {"cpu_usage": 0.5}]})
    rec.bag = {"task": [0, 1]}
    assert [dispatcher.process(rec, i, shape, 1.0).cpu_usage for i in (0, 1)] == [0.01, 0.5]  # type: ignore[union-attr]
    cpu_bound = JobShape.task_bag([5.0, 5.0], 2)  # no task_usage: the job's usage, as before
    assert dispatcher.process(rec, 0, cpu_bound, 0.3).cpu_usage == 0.3  # type: ignore[union-attr]


# ------------------------------------------------------------------ the live testbed's option

def test_the_testbed_default_is_sleeping_tasks_on_both_sides() -> None:
    # two one-task bags on one host (1 core x 2 workers): sleeping, both end at their length; CPU-bound
    # (--task-usage 1), both at twice it
    two = [taskbags_live.Bag("a", 0.0, (100.0,), 0, 1000.0), taskbags_live.Bag("b", 0.0, (100.0,), 0, 1000.0)]
    sleeping = taskbags_live.simulate(two, 1, "dispatch-priority", {"conserving": True})
    assert [sleeping[k]["end"] for k in "ab"] == pytest.approx([100.0, 100.0])
    cpu = taskbags_live.simulate(two, 1, "dispatch-priority", {"conserving": True}, 1.0)
    assert [cpu[k]["end"] for k in "ab"] == pytest.approx([200.0, 200.0])


def test_the_testbed_refuses_a_bad_task_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert taskbags_live.main(["--task-usage", "0", "--jobs", "1", "--hosts", "1"]) == 2
    assert "--task-usage" in capsys.readouterr().err

