"""The scheduler's view of a workload job, written plainly: the tests' oracle for what the simulator
builds on the fly (``vmctl.sim.engine._make_job``, which skips ``Job.__post_init__`` for speed)."""

from __future__ import annotations

from vmctl.model import Job
from vmctl.sim.workloads import WorkloadJob


def to_model_job(w: WorkloadJob, usage_known: bool) -> Job:
    """The scheduler's view of a workload job: id as a string, the estimate (not the run time), the CPU
    usage only when ``usage_known`` (MEASY sec. 3.5.1 runs the policies without it), the user id as a
    string ("" when unknown), the priority and the deadline (None unless the source gave one)."""
    return Job(
        id=str(w.id),
        submit_time=w.submit,
        procs=w.procs,
        estimate=w.estimate,
        cpu_usage=w.cpu_usage if usage_known else None,
        user=str(w.user) if w.user >= 0 else "",
        priority=w.priority,
        deadline=w.deadline,
    )
