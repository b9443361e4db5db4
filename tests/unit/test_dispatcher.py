"""The dispatcher's bookkeeping on one job record (``vmctl.daemon.dispatcher``), by hand: the module
header's worked example, the stale and crashed reports, a lost node."""

from __future__ import annotations

from vmctl.daemon import dispatcher
from vmctl.model import JobState
from vmctl.nodedoc import PowerState, VmObserved
from vmctl.store.base import JobRecord, Slot


def _bag(n: int, slots: list[tuple[str, int]]) -> JobRecord:
    rec = JobRecord(id="7", seq=7, name="b", spec={"procs": 2, "estimate": 10.0,
                                                    "shape": {"kind": "task-bag", "tasks": [10.0] * n}},
                    state=JobState.RUNNING, submit_time=0.0, run=1, slots=[Slot(n, c, 0) for n, c in slots])
    dispatcher.start(rec, 0.0)
    return rec


def _ended(rec: JobRecord, vm: int, task: int, now: float, code: int = 0) -> bool:
    return dispatcher.observe(rec, vm, VmObserved(name=f"j7-r1-p{vm}", power=PowerState.RUNNING, process_job="7",
                                                  process_index=task, process_exit=code), now)


def test_the_worked_example() -> None:
    """5 tasks on workers A, B: A runs 0, B 1; A's task ends: A runs 2; a resize to [B] while B runs 1
    marks A leaving (it finishes 2 and leaves); B runs 3, then 4; when 4 ends the job is done."""
    a, b = ("n1", 0), ("n2", 0)
    rec = _bag(5, [a, b])
    assert rec.bag is not None and rec.bag["task"] == [0, 1] and dispatcher.tasks_left(rec) == 5
    assert _ended(rec, 0, 0, 10.0)
    assert rec.bag["task"] == [2, 1]
    assert dispatcher.resize(rec, [(*b, 0)], 12.0) == [(*a, 0)]  # A keeps its slot until its task ends
    assert rec.placement == [a, b] and rec.bag["release"] == [True, False]
    assert dispatcher.workers_doc(rec)[0]["leaving"] is True
    assert _ended(rec, 1, 1, 15.0) and rec.bag["task"] == [2, 3]
    assert _ended(rec, 0, 2, 20.0)
    assert rec.placement == [b] and rec.bag["vms"] == [1]  # A left at its task boundary
    assert _ended(rec, 1, 3, 25.0) and rec.bag["task"] == [4]
    assert not dispatcher.finished(rec)
    assert _ended(rec, 1, 4, 35.0) and dispatcher.finished(rec) and rec.placement == []
    assert [t["worker"] for t in rec.tasks] == ["n1/0.0", "n2/0.0", "n1/0.0", "n2/0.0", "n2/0.0"]
    assert rec.bag["rate"]["n1/0.0"] == 1.0  # 10 s of work in 10 s, twice


def test_stale_reports_change_nothing_and_a_crash_fails_the_task() -> None:
    rec = _bag(3, [("n1", 0)])
    assert not _ended(rec, 0, 1, 5.0)  # a report of another task than the worker's (an old run's, say)
    running = VmObserved(name="j7-r1-p0", power=PowerState.RUNNING, process_job="7", process_index=0)
    assert not dispatcher.observe(rec, 0, running, 5.0)  # still running
    assert not _ended(rec, 9, 0, 5.0)  # a worker the bag does not have
    crashed = VmObserved(name="j7-r1-p0", power=PowerState.CRASHED, process_job="7", process_index=0)
    assert dispatcher.observe(rec, 0, crashed, 6.0)
    assert rec.tasks[0]["exit_status"] == -1 and rec.tasks[0]["error"] == "VM crashed"
    assert rec.bag is not None and rec.bag["task"] == [1]  # the worker goes on with the next task
    assert not _ended(rec, 0, 0, 7.0)  # the crashed task's late exit is not taken


def test_a_lost_node_gives_its_tasks_back_first() -> None:
    rec = _bag(6, [("n1", 0), ("n2", 0), ("n3", 0)])
    assert dispatcher.lose_node(rec, "n2") == 1
    assert rec.bag is not None and rec.placement == [("n1", 0), ("n3", 0)] and rec.bag["retry"] == [1]
    assert dispatcher.tasks_left(rec) == 6
    assert _ended(rec, 0, 0, 10.0) and rec.bag["task"] == [1, 2]  # task 1 is handed out again first
    assert rec.tasks[1]["worker"] == "n1/0.0"
