"""The ``moldable`` policy (``policies/moldable_slots.py``): paper 002's methods on a ClusterView of node
groups. Hand-checked: the group and width a method picks and the cores it gets, the reason, the slot
rule (one decision per slot, a pass at the next boundary), rigid jobs as one-width tasks, and the
checks vmctld runs at submission (a time that grows with the width, parameters)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.livedaemon import run_cli
from tests.unit.test_moldable_traces import swf
from vmctl.errors import PolicyParameterError, ValidationError
from vmctl.model import ClusterView, Discipline, Job, JobShape, RunningJob, Start, Suspend, Tier
from vmctl.policies.invariants import check_decision
from vmctl.policies.moldable_slots import duration
from vmctl.policies.registry import create_policy

NODES = ["a"] * 4 + ["b"] * 4  # a: group slow, speed 1; b: group fast, speed 2


def view(queue: list[Job], shapes: dict[str, JobShape], running: dict[str, RunningJob] | None = None) -> ClusterView:
    running = running or {}
    fg: list[str | None] = [None] * 8
    for rj in running.values():
        for c in rj.cores:
            fg[c] = rj.id
    idle = {c for c in range(8) if fg[c] is None}
    return ClusterView.leveled(
        8, queue, running, [fg, [None] * 8], [idle, set(range(8))], Discipline.PRIORITY, [0.0] * 8, [True] * 8,
        node_of_core=NODES, local_core=[0, 1, 2, 3] * 2, node_names=("a", "b"),
        queue_index={j.id: j for j in queue}, node_speed={"a": 1.0, "b": 2.0},
        node_group={"a": "slow", "b": "fast"}, shapes=shapes)


TABLE = JobShape.moldable({2: 8.0, 4: 6.0})


def test_afcfs_picks_the_only_group_that_meets_the_deadline_and_its_smallest_width() -> None:
    # at the boundary 0 (SL 1 s): width 2 needs 8 slots on slow, 4 on fast; width 4 needs 6 on slow, 3
    # on fast. Deadline 5: only fast meets it, and there the smallest width that does is 2.
    pol = create_policy("moldable", method="afcfs", slot=1.0)
    j = Job("j1", submit_time=0.0, procs=2, estimate=8.0, deadline=5.0)
    v = view([j], {"j1": TABLE})
    d = pol.decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert len(d.actions) == 1 and isinstance(d.actions[0], Start)
    start = d.actions[0]
    assert start.cores == (4, 5) and start.level == 0
    assert start.reason.startswith("width 2 of [2, 4] in group fast (speed 2): AFCFS: the smallest width"), \
        start.reason
    assert "4 slot(s) of 1s -> meets the deadline (in 5s) with 1s to spare (deadline)" in start.reason
    assert d.wake_at == 1.0
    # a second pass in the same slot decides nothing and asks for the next boundary
    again = pol.decide(v, 0.5)
    assert again.actions == () and again.wake_at == 1.0 and "next slot boundary (in 0s)" in again.default_reason


def test_a_rigid_job_is_a_task_of_one_width_and_a_job_without_deadline_gets_k_estimates() -> None:
    pol = create_policy("moldable", method="cbsp", slot=10.0, deadline_estimates=2.0)
    j = Job("r", submit_time=0.0, procs=3, estimate=40.0)
    d = pol.decide(view([j], {}), 0.0)
    (start,) = d.actions
    assert isinstance(start, Start) and len(start.cores) == 3 and set(start.cores) <= {4, 5, 6, 7}  # cbsp: fast
    assert "(no deadline given: submit + 2 x estimate)" in start.reason
    assert pol.deadline_of(j) == 80.0


def test_a_running_job_the_method_keeps_running_is_not_suspended() -> None:
    # HSRET runs active tasks earliest deadline first while they fit; a running job is kept running
    pol = create_policy("moldable", method="hsret", slot=1.0)
    j = Job("run", submit_time=0.0, procs=2, estimate=8.0, deadline=100.0)
    rj = RunningJob(job=j, tier=Tier.FG, cores=(4, 5), start_time=0.0, tier_since=0.0, progress=1.0)
    d = pol.decide(view([], {"run": TABLE}, {"run": rj}), 3.0)
    assert not any(isinstance(a, Suspend) for a in d.actions)


def test_the_submission_checks() -> None:
    pol = create_policy("moldable")
    bad = JobShape("moldable", (2, 4), (8.0, 9.0))
    with pytest.raises(ValidationError) as err:
        pol.check_job(Job("x", 0.0, 2, 8.0), bad, "jobs[3]")
    assert err.value.fields["field"] == "jobs[3].shape.times[1]"
    with pytest.raises(ValidationError) as err:
        pol.check_job(Job("x", 0.0, 2, 8.0), bad, "")
    assert err.value.fields["field"] == "shape.times[1]"
    pol.check_job(Job("x", 0.0, 2, 8.0), TABLE, "")
    for params in ({"slot": 0.0}, {"slot": -1.0}, {"deadline_estimates": 0.0}, {"method": "sjf"}):
        with pytest.raises(PolicyParameterError) as perr:
            create_policy("moldable", **params)
        assert next(iter(params)) in str(perr.value)


def test_duration() -> None:
    assert [duration(x) for x in (0, 5, 95, 7260, -61)] == ["0s", "5s", "1m 35s", "2h 1m", "-1m 1s"]


@pytest.mark.parametrize("method", ["afcfs", "hsret-afcfs", "all-eft-cap"])
def test_the_same_policy_runs_in_the_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               method: str) -> None:
    """``vmctl sim run --shapes moldable --policy moldable``: the policy vmctld runs, on the simulator's
    moldable execution model (every decision through the invariant checker); the run ends (an idle
    cluster asks for no more slot wake-ups) with every job done, the first job at a width its shape
    allows. Also the two readings of issue 26 (HSRET from AFCFS's list, the load-capped ALL-EFT)."""
    trace = swf(tmp_path)
    code, out, err = run_cli(capsys, "sim", "run", "--trace", trace, "--shapes", "moldable", "--policy", "moldable",
                             "--param", f"method={method}", "--param", "slot=600", "-o", "json")
    assert code == 0, err
    res = json.loads(out)
    # job 2 ran 3,000 s of a requested 1,800 in the trace: stopped at its estimate, as under any policy
    assert res["jobs"] == 2 and res["kills"] == {"estimate": 1, "policy": 0}, res
    assert res["avg_wait"] <= 600.0  # each job waits at most for the next slot boundary


def test_an_idle_cluster_asks_for_no_wake_up() -> None:
    pol = create_policy("moldable")
    d = pol.decide(view([], {}), 1234.0)
    assert d.actions == () and d.wake_at is None


def test_a_job_queued_before_the_policy_with_a_growing_table_waits_with_a_reason() -> None:
    """Submitted under another policy (no check then), a table whose time grows with the width is not
    a task for the methods: it waits, saying why, and the other jobs are scheduled."""
    pol = create_policy("moldable", method="afcfs", slot=1.0)
    bad = Job("bad", submit_time=0.0, procs=2, estimate=8.0, deadline=100.0)
    good = Job("good", submit_time=0.0, procs=2, estimate=8.0, deadline=100.0)
    v = view([bad, good], {"bad": JobShape("moldable", (2, 4), (8.0, 9.0)), "good": TABLE})
    d = pol.decide(v, 0.0)
    check_decision(v, d, 0.0)
    assert [a.job_id for a in d.actions] == ["good"]
    assert "shape.times[1]" in d.reasons["bad"] and "requeue it" in d.reasons["bad"]
