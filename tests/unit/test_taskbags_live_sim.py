"""The live testbed's simulator side (``vmctl.experiments.taskbags_live.simulate``) runs every task of a bag,
as vmctld does: a bag that needs longer than its deadline is not cut short there (it was when the deadline
travelled as the run-time estimate), and the policy sees the bag's own deadline as ``Job.deadline``."""

from __future__ import annotations

from vmctl.experiments.taskbags_live import Bag, simulate
from vmctl.model import Job
from vmctl.sim.engine import Simulator
from vmctl.sim.workloads.core import WorkloadJob


def test_a_bag_past_its_deadline_runs_all_its_tasks() -> None:
    # 20 tasks of 317,407 s on 10 workers: two rounds, 634,814 s, against a deadline of 360,000 s
    got = simulate([Bag("2165", 0.0, (317407.0,) * 20, 1, 360000.0)], 10, "dispatch-priority", {"conserving": True})
    assert got["2165"]["end"] == 634814.0
    assert got["2165"]["deadline"] == 360000.0


def test_a_workload_deadline_reaches_the_policy() -> None:
    seen: dict[str, float | None] = {}

    class Spy:
        def __init__(self) -> None:
            from vmctl.policies.registry import create_policy
            self.inner = create_policy("fcfs")

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def decide(self, view, now):  # type: ignore[no-untyped-def]
            for job in view.queue:
                seen[job.id] = job.deadline
            return self.inner.decide(view, now)

    jobs = [WorkloadJob(id=1, submit=0.0, run_time=10.0, procs=1, estimate=10.0, cpu_usage=None, deadline=50.0),
            WorkloadJob(id=2, submit=1.0, run_time=10.0, procs=1, estimate=10.0, cpu_usage=None)]
    Simulator(jobs, 1, Spy()).run()  # type: ignore[arg-type]
    assert seen == {"1": 50.0, "2": None}
    assert Job.__dataclass_fields__["deadline"].default is None
