"""Job hold, release, requeue and update (vmctl job hold/release/requeue/update) in the daemon: the
scheduler skips held jobs, a restart keeps them held, a requeued job starts over, an update reaches
the policy's view; and what a queued job or a submission is told (nodes that block it, fields the
policy ignores)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.errors import Conflict
from vmctl.policies.easy_family import EasyPolicy
from vmctl.policies.registry import create_policy


def test_the_scheduler_skips_a_held_job_until_it_is_released(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    a = c.submit(2, 100, 10)
    c.daemon.hold(a, "waiting for input data")
    b = c.submit(1, 100, 10)
    c.run_until(lambda: c.state(b) == "running")
    assert c.state(a) == "queued" and c.daemon.job(a).held
    assert c.daemon.job(a).reason == "held: waiting for input data"
    assert a not in [j.id for j in c.daemon.view().queue]
    assert c.daemon.explain(a)["queue_position"] is None and c.daemon.explain(a)["held"] is True
    c.daemon.release(a)
    assert a in [j.id for j in c.daemon.view().queue]
    c.run_until(lambda: c.state(a) == "done", limit=300)
    assert [h["event"] for h in c.daemon.job(a).history][:3] == ["submitted", "held", "released"]
    c.close()


def test_a_restart_keeps_a_job_held(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    a = c.submit(1, 100, 10)
    c.daemon.hold(a)
    c.restart()
    assert c.daemon.job(a).held and c.daemon.job(a).reason == "held"
    for _ in range(5):
        c.step()
    assert c.state(a) == "queued" and a not in [j.id for j in c.daemon.view().queue]
    c.daemon.release(a)
    c.run_until(lambda: c.state(a) == "running")
    c.close()


def test_hold_release_requeue_and_update_say_why_they_do_not_apply(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    a = c.submit(1, 100, 50)
    c.run_until(lambda: c.state(a) == "running")
    with pytest.raises(Conflict, match=f"is running: only a queued job can be held; requeue it held instead "
                                       rf"\(vmctl job requeue {a} --hold\)"):
        c.daemon.hold(a)
    with pytest.raises(Conflict, match=r"only a queued job can be updated; requeue it first"):
        c.daemon.update(a, {"estimate": 10.0})
    b = c.submit(1, 100, 50)
    with pytest.raises(Conflict, match="is not held"):
        c.daemon.release(b)
    with pytest.raises(Conflict, match="only a running or suspended job can be requeued; hold it"):
        c.daemon.requeue(b)
    c.daemon.cancel(b)
    with pytest.raises(Conflict, match="is cancelled: only a queued job can be held; it has ended"):
        c.daemon.hold(b)
    c.close()


def test_a_requeued_job_starts_over_as_a_new_run(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    a = c.submit(1, 100, 40)
    c.run_until(lambda: c.state(a) == "running")
    for _ in range(10):
        c.step()
    assert c.daemon.state.progress(c.daemon.job(a), c.clock.now()) > 5
    c.daemon.requeue(a, "node maintenance", hold=True)
    rec = c.daemon.job(a)
    assert rec.state == "queued" and rec.held and rec.placement == [] and rec.progress_base == 0.0
    assert rec.reason == "held: node maintenance"
    for _ in range(3):
        c.step()
    assert c.daemon.desired("n1").vms == ()  # its VMs are gone
    c.daemon.release(a)
    c.run_until(lambda: c.state(a) == "running")
    assert c.daemon.job(a).run == 2
    events = [h["event"] for h in c.daemon.job(a).history]
    assert events[-5:] == ["requeued", "held", "released", "started", "running"]
    assert c.daemon.job(a).history[-5]["detail"] == "requeued by an operator: node maintenance"
    c.close()


def test_update_reaches_the_policy_view_and_the_store(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 1})
    c.submit(1, 1000, 500)
    b = c.submit(1, 100, 10, priority=1, deadline=5000.0)
    c.step()
    c.daemon.update(b, {"estimate": 250.0, "priority": 7, "deadline": None})
    job = next(j for j in c.daemon.view().queue if j.id == b)
    assert (job.estimate, job.priority, job.deadline) == (250.0, 7, None)
    assert c.daemon.job(b).history[-1]["detail"] == "estimate 100 -> 250.0, priority 1 -> 7, deadline 5000.0 -> None"
    c.restart()
    assert c.daemon.job(b).spec["estimate"] == 250.0 and "deadline" not in c.daemon.job(b).spec
    c.close()


def test_nodes_out_of_service_that_alone_block_a_queued_job(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2, "n3": 2})
    a = c.submit(5, 100, 10)
    small = c.submit(1, 100, 10)
    c.daemon.set_node_state("n2", True, "repair")
    c.down.add("n3")
    c.run_until(lambda: c.daemon.node("n3").state == "lost", limit=100)
    blocking = c.daemon.node_blocker()
    assert [(n.name, n.state) for n in blocking(c.daemon.job(a))] == [("n2", "drained"), ("n3", "lost")]
    assert blocking(c.daemon.job(small)) == []  # it fits on the ready nodes
    assert c.daemon.explain(a)["blocked_by"] == [{"node": "n2", "state": "drained"},
                                                 {"node": "n3", "state": "lost"}]
    c.daemon.set_node_state("n2", False)
    assert [n.name for n in c.daemon.node_blocker()(c.daemon.job(a))] == ["n3"]  # 4 ready cores < 5
    c.daemon.hold(a)
    assert c.daemon.node_blocker()(c.daemon.job(a)) == []  # held: that is what keeps it
    c.close()


class _UsesPriority(EasyPolicy):
    job_fields: ClassVar[frozenset[str]] = frozenset({"priority"})


def test_submission_warns_about_fields_the_policy_ignores(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    d = c.daemon
    assert d.ignored_fields([{"procs": 1, "estimate": 5}]) == []
    assert d.ignored_fields([{"procs": 1, "estimate": 5, "priority": 3, "deadline": 99.0}]) == [
        "policy easy does not use job priorities: the job's priority has no effect on when it starts "
        "(vmctl policy set easy -p queue_order=multifactor makes it count)",
        "policy easy does not use deadlines: the job's deadline is neither considered nor enforced"]
    assert d.ignored_fields([{"priority": 1}, {"priority": 0}, {"deadline": 5.0}]) == [
        "policy easy does not use job priorities: the priority of 1 job(s) has no effect on when it starts "
        "(vmctl policy set easy -p queue_order=multifactor makes it count)",
        "policy easy does not use deadlines: the deadline of 1 job(s) is neither considered nor enforced"]
    c.close()
    c2 = Cluster(tmp_path / "b", {"n1": 2}, policy=_UsesPriority())
    assert c2.daemon.ignored_fields([{"priority": 3, "deadline": 5.0}]) == [
        "policy easy does not use deadlines: the job's deadline is neither considered nor enforced"]
    c2.close()


@pytest.mark.parametrize(("policy", "params"), [("easy", {"queue_order": "multifactor", "age_weight": 0.0}),
                                                ("measy", {"queue_order": "multifactor", "age_weight": 0.0}),
                                                ("sjf", {})])
def test_explain_places_a_job_in_the_order_the_policy_considers_the_queue(
        tmp_path: Path, policy: str, params: dict[str, object]) -> None:
    """Under multifactor (priority only here) or SJF a job submitted last can be first: explain's position
    is the policy's order, not arrival order."""
    c = Cluster(tmp_path, {"n1": 2}, policy=create_policy(policy, **params))
    c.submit(2, 1000, 500)  # fills the node: the rest wait
    c.run_until(lambda: len(c.daemon.view().queue) == 0)
    low = c.submit(1, 900, 10, priority=0)
    mid = c.submit(1, 800, 10, priority=5)
    top = c.submit(1, 100, 10, priority=9)
    want = [top, mid, low]  # by priority (multifactor), and by estimate (SJF): the same order here
    assert [c.daemon.explain(j)["queue_position"] for j in want] == [0, 1, 2]
    arrival = create_policy(policy.replace("sjf", "easy"))  # the same queue in arrival order
    assert arrival.queue_order(c.daemon.view().queue, 0.0, 2)[0].id == low
    c.close()
