"""A task bag's per-task results in their own table (schema 006, ``vmctl.store.tasks``), on SQLite and on
a real PostgreSQL (the ``store``/``store_url`` fixtures; skipped with the reason where it is missing):
the job document holds no task, a task end writes its rows and the bag column and leaves the document
alone, rows belong to the current run, retention archives or deletes them with the job, a bad row is
named, and a database of schema 005 (results inside the job document) is upgraded in place."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_daemon_core import Cluster
from tests.unit.test_dispatcher import _bag as _dispatched
from tests.unit.test_dispatcher import _ended
from tests.unit.test_dispatcher_daemon import _bag as submit_bag
from tests.unit.test_dispatcher_daemon import _starts
from tests.unit.test_node_attributes import _store_at
from vmctl.daemon import dispatcher
from vmctl.errors import LeaseLost, StoreError
from vmctl.policies.registry import create_policy
from vmctl.store import JobRecord, WriteBatch
from vmctl.store.base import Slot, Store, dumps
from vmctl.store.sql import SUPPORTED_VERSION, SqlStore
from vmctl.store.tasks import new_task

WORK = [5.0] * 6


def _task(k: int, worker: str | None = None, start: float | None = None, end: float | None = None,
          status: int | None = None, error: str | None = None) -> dict[str, Any]:
    return {**new_task(k), "worker": worker, "start": start, "end": end, "exit_status": status, "error": error}


def _bag(job_id: str = "1", run: int = 1, state: str = "running") -> JobRecord:
    """A bag of 6 tasks on two workers: 0 and 1 ended, 2 and 3 running, 4 and 5 not handed out."""
    tasks = [_task(0, "n1/0.0", 1.0, 6.0, 0), _task(1, "n2/0.0", 1.0, 7.0, 3), _task(2, "n1/0.0", 6.0),
             _task(3, "n2/0.0", 7.0), new_task(4), new_task(5)]
    rec = JobRecord(id=job_id, seq=int(job_id), name=f"bag{job_id}", state=state, submit_time=0.0, start_time=1.0,
                    spec={"procs": 6, "estimate": 5.0, "shape": {"kind": "task-bag", "tasks": WORK}},
                    slots=[Slot("n1", 0, 0), Slot("n2", 0, 0)], run=run, tasks=tasks,
                    bag={"next": 4, "next_vm": 2, "vms": [0, 1], "task": [2, 3],
                         "release": [False, False], "rate": {"n1/0.0": 1.0}, "retry": []})
    rec.changed_tasks.update(range(4))
    return rec


def _raw(store: Store, table: str, job_id: str) -> tuple[str, str | None]:
    assert isinstance(store, SqlStore)
    with store._read() as cur:
        store._exec(cur, f"SELECT doc, bag FROM {table} WHERE id = ?", (job_id,))
        doc, bag = cur.fetchone()
    return str(doc), bag


def _rows(store: Store, job_id: str | None = None) -> list[tuple[Any, ...]]:
    assert isinstance(store, SqlStore)
    with store._read() as cur:
        where, params = ("", ()) if job_id is None else (" WHERE job_id = ?", (job_id,))
        store._exec(cur, "SELECT job_id, run, task, worker, exit_status FROM task_results" + where
                    + " ORDER BY job_id, run, task", params)
        return [tuple(r) for r in cur.fetchall()]


def _lease(store: Store) -> int:
    epoch = store.acquire_lease("a", 10, 0)
    assert epoch is not None
    return epoch


def _copy(rec: JobRecord) -> JobRecord:
    return JobRecord.from_doc(json.loads(dumps(rec.to_doc())))


def test_a_bag_is_its_document_its_bag_column_and_one_row_per_task_handed_out(store: Store) -> None:
    epoch = _lease(store)
    rec = _bag()
    want = _copy(rec)
    store.write(epoch, WriteBatch(jobs={"1": rec}))
    assert rec.changed_tasks == set()  # written: nothing left to write
    doc, bag = _raw(store, "jobs", "1")
    assert "tasks" not in json.loads(doc) and "bag" not in json.loads(doc)
    assert bag is not None and json.loads(bag) == want.bag
    assert _rows(store) == [("1", 1, 0, "n1/0.0", 0), ("1", 1, 1, "n2/0.0", 3), ("1", 1, 2, "n1/0.0", None),
                            ("1", 1, 3, "n2/0.0", None)]  # tasks 4 and 5 were never handed out: no row
    [got] = store.load_jobs()
    assert got == want and got.tasks[4] == new_task(4)


def test_a_task_end_writes_its_rows_and_the_bag_and_leaves_the_document_alone(store: Store) -> None:
    epoch = _lease(store)
    rec = _bag()
    store.write(epoch, WriteBatch(jobs={"1": rec}))
    doc_before, _bag_before = _raw(store, "jobs", "1")
    # task 2 ends on n1/0.0, which takes task 4 (the dispatcher marks both)
    rec.tasks[2].update(end=11.0, exit_status=0)
    rec.tasks[4].update(worker="n1/0.0", start=11.0)
    assert rec.bag is not None
    rec.bag = {**rec.bag, "next": 5, "task": [4, 3], "rate": {"n1/0.0": 0.9}}
    rec.changed_tasks.update((2, 4))
    rec.name = "renamed in memory only"  # not stored by a task end: the document is not written
    store.write(epoch, WriteBatch(bags={"1": rec}))
    assert _raw(store, "jobs", "1")[0] == doc_before
    [got] = store.load_jobs()
    assert got.tasks == rec.tasks and got.bag == rec.bag and got.name == "bag1"
    rows = _rows(store)
    # the same report twice (a re-report after a restart): the rows are upserted, nothing changes
    rec.changed_tasks.update((2, 4))
    store.write(epoch, WriteBatch(bags={"1": rec}))
    assert _rows(store) == rows and store.load_jobs()[0].tasks == got.tasks


def test_a_light_write_with_a_stale_epoch_changes_nothing(store: Store) -> None:
    e1 = store.acquire_lease("a", 1, 0)
    assert e1 is not None
    rec = _bag()
    store.write(e1, WriteBatch(jobs={"1": rec}))
    assert store.acquire_lease("b", 10, 5) == e1 + 1
    rec.tasks[2].update(end=11.0, exit_status=0)
    rec.changed_tasks.add(2)
    with pytest.raises(LeaseLost):
        store.write(e1, WriteBatch(bags={"1": rec}))
    assert store.load_jobs()[0].tasks[2]["exit_status"] is None


def test_rows_belong_to_the_run_and_a_requeue_from_scratch_drops_them(store: Store) -> None:
    epoch = _lease(store)
    rec, other = _bag("1"), _bag("2")
    store.write(epoch, WriteBatch(jobs={"1": rec, "2": other}))
    # run 2 keeps the two results (as dispatcher.start does after a lost node) and hands out task 2 again
    rec.run = 2
    rec.tasks = [rec.tasks[0], rec.tasks[1], _task(2, "n3/0.0", 20.0), new_task(3), new_task(4), new_task(5)]
    rec.changed_tasks.update((0, 1, 2))
    store.write(epoch, WriteBatch(jobs={"1": rec}))
    assert [r[:3] for r in _rows(store, "1")] == [("1", 2, 0), ("1", 2, 1), ("1", 2, 2)]
    assert store.load_jobs()[0].tasks == rec.tasks
    # requeued from scratch: no bag, no tasks, and no rows (the other bag keeps its own)
    rec.state, rec.bag, rec.tasks, rec.slots = "queued", None, [], []
    store.write(epoch, WriteBatch(jobs={"1": rec}))
    assert _rows(store, "1") == [] and len(_rows(store, "2")) == 4
    got = {j.id: j for j in store.load_jobs()}
    assert got["1"].tasks == [] and got["1"].bag is None and got["2"].tasks == other.tasks


def test_retention_archives_a_bag_with_its_rows_or_deletes_them(store: Store) -> None:
    epoch = _lease(store)
    kept, gone = _bag("1", state="done"), _bag("2", state="failed")
    want = _copy(kept)
    store.write(epoch, WriteBatch(jobs={"1": kept, "2": gone}))
    store.prune_jobs(epoch, [kept], archive=True)
    store.prune_jobs(epoch, [gone], archive=False)
    assert store.load_jobs() == [] and _rows(store, "2") == []
    assert store.get_archived_job("1") == want
    doc, bag = _raw(store, "job_archive", "1")
    assert "tasks" not in json.loads(doc) and bag is not None
    # the archived job list reads no task row: the bag comes back without its tasks
    [listed] = store.list_archived_jobs()
    assert listed.tasks == [] and listed.bag == want.bag and listed.spec == want.spec


def test_bad_task_rows_and_bag_columns_are_named(store: Store) -> None:
    epoch = _lease(store)
    store.write(epoch, WriteBatch(jobs={"1": _bag()}))
    assert isinstance(store, SqlStore)
    with store._transaction() as cur:
        store._exec(cur, "INSERT INTO task_results (job_id, run, task) VALUES (?, ?, ?)", ("1", 1, 6))
    with pytest.raises(StoreError, match=r"table task_results, row job_id='1', run=1: .*task 6 outside the bag's 6"):
        store.load_jobs()
    with store._transaction() as cur:
        store._exec(cur, "DELETE FROM task_results WHERE task = ?", (6,))
        store._exec(cur, "UPDATE jobs SET bag = ? WHERE id = ?", ("[1, 2", "1"))
    with pytest.raises(StoreError, match=r"table jobs, row id='1'"):
        store.load_jobs()


def test_a_schema_5_database_with_results_in_the_documents_is_upgraded(store_url: str) -> None:
    """As vmctld of schema 005 wrote them: a running bag (live) and a finished one (archived), each with
    its tasks and its dispatcher state inside its document; after the upgrade they load the same, their
    documents no longer hold them, and a task end goes on from there."""
    s, epoch = _store_at(store_url, 5)
    live, old = _bag("1"), _bag("2", state="done")
    with s._transaction() as cur:
        s._exec(cur, "INSERT INTO jobs (id, seq, state, doc) VALUES (?, ?, ?, ?)",
                ("1", 1, "running", dumps(live.to_doc())))
        s._exec(cur, "INSERT INTO job_archive (id, seq, state, end_time, doc) VALUES (?, ?, ?, ?, ?)",
                ("2", 2, "done", 9.0, dumps(old.to_doc())))
        s._exec(cur, "INSERT INTO jobs (id, seq, state, doc) VALUES (?, ?, ?, ?)",  # a rigid job: unchanged
                ("3", 3, "done", dumps(JobRecord(id="3", seq=3, name="r", spec={"procs": 1, "estimate": 1.0},
                                                 state="done", submit_time=0.0,
                                                 tasks=[{"index": 0, "exit_status": 0, "error": None}]).to_doc())))
    assert s.migrate() == SUPPORTED_VERSION >= 6
    got = {j.id: j for j in s.load_jobs()}
    assert got["1"] == _copy(live) and got["3"].tasks == [{"index": 0, "exit_status": 0, "error": None}]
    assert s.get_archived_job("2") == _copy(old)
    for table, jid in (("jobs", "1"), ("job_archive", "2")):
        assert "tasks" not in json.loads(_raw(s, table, jid)[0])
    assert _raw(s, "jobs", "3")[1] is None
    assert len(_rows(s, "1")) == 4 and len(_rows(s, "2")) == 4
    rec = got["1"]
    rec.tasks[3].update(end=12.0, exit_status=0)
    rec.changed_tasks.add(3)
    s.write(epoch, WriteBatch(bags={"1": rec}))
    assert {j.id: j for j in s.load_jobs()}["1"].tasks[3]["exit_status"] == 0
    s.close()


# ----------------------------------------------------------------------------------------------- the dispatcher


def test_the_dispatcher_marks_exactly_the_tasks_it_changes() -> None:
    """What a task end, a lost node, a stop and a requeue with kept results leave for the store to write
    (``JobRecord.changed_tasks``): the tasks whose entry changed, and no other."""
    rec = _dispatched(6, [("n1", 0), ("n2", 0), ("n3", 0)])
    assert rec.changed_tasks == {0, 1, 2}  # handed out at the start
    rec.changed_tasks.clear()
    assert _ended(rec, 0, 0, 10.0)
    assert rec.changed_tasks == {0, 3}  # the end, and the worker's next task
    rec.changed_tasks.clear()
    assert not _ended(rec, 0, 0, 11.0) and rec.changed_tasks == set()  # reported twice: nothing
    assert dispatcher.lose_node(rec, "n2") == 1 and rec.changed_tasks == {1}  # handed back
    rec.changed_tasks.clear()
    dispatcher.stop(rec, "stopped: job queued")
    assert rec.changed_tasks == {2, 3}  # cut short: their error
    kept = rec.tasks
    rec.changed_tasks.clear()
    rec.slots = [Slot("n1", 0, 0)]
    dispatcher.start(rec, 20.0, kept)
    assert rec.changed_tasks == {0, 1}  # the kept result (0) is stored again, and task 1 handed out


# ----------------------------------------------------------------------------------------------- vmctld


def test_a_task_end_rewrites_no_job_document(tmp_path: Path, store_url: str) -> None:
    """vmctld on mock agents: of a 40-task bag on 2 workers, the task ends that hand the worker its next
    task store the bag column and the task rows only (``WriteBatch.bags``); the job document is written
    when the job changes: its start, a worker leaving at the end, its end."""
    cluster = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=create_policy("dispatch-priority"), shared_levels=1,
                      store_url=store_url)
    batches: list[WriteBatch] = []
    write = cluster.daemon.store.write

    def spy(epoch: int, batch: WriteBatch) -> None:
        batches.append(batch)
        write(epoch, batch)

    cluster.daemon.store.write = spy  # type: ignore[method-assign]
    a = submit_bag(cluster, [3.0] * 40)
    cluster.run_until(lambda: cluster.state(a) == "done", limit=1000)
    full = sum(1 for b in batches if a in b.jobs)
    light = [b for b in batches if a in b.bags]
    assert len(light) >= 30, len(light)
    assert full <= 8, full  # submit, start, the 2 workers leaving, the end (+ a pass or two)
    assert all(a not in b.jobs for b in light)
    rec = cluster.daemon.job(a)
    assert [t["exit_status"] for t in rec.tasks] == [0] * 40
    cluster.restart()
    assert cluster.daemon.job(a).tasks == rec.tasks
    cluster.close()


def _old_form(store: SqlStore) -> None:
    """Turn a database of this version into one vmctld of schema 005 wrote: every job document with its
    tasks and dispatcher state inside, no bag column, no task table."""
    recs = store.load_jobs()
    with store._transaction() as cur:
        store._exec(cur, "DROP TABLE task_results")
        store._exec(cur, "ALTER TABLE jobs DROP COLUMN bag")
        store._exec(cur, "ALTER TABLE job_archive DROP COLUMN bag")
        store._exec(cur, "DELETE FROM schema_version WHERE version >= 6")
        store._exec(cur, "ALTER TABLE lease DROP COLUMN timeline")  # schema 007, after it
        store._exec(cur, "ALTER TABLE lease DROP COLUMN commits")
        for r in recs:
            store._exec(cur, "UPDATE jobs SET doc = ? WHERE id = ?", (dumps(r.to_doc()), r.id))


def test_a_running_bag_stored_by_the_previous_version_continues(tmp_path: Path, store_url: str) -> None:
    """A kill -9 of the previous vmctld in the middle of a bag, then this version on its database: the
    migration moves the results out, the recorded ends are kept, and every task still runs exactly once."""
    cluster = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=create_policy("dispatch-proportion"), shared_levels=2,
                      store_url=store_url)
    try:
        a = submit_bag(cluster, [10.0] * 9)
        cluster.run_until(lambda: sum(t["exit_status"] is not None for t in cluster.daemon.job(a).tasks) >= 3)
        before = [dict(t) for t in cluster.daemon.job(a).tasks]
        store = cluster.daemon.store
        assert isinstance(store, SqlStore)
        _old_form(store)
        assert store.schema_version() == 5
        cluster.restart()
        assert cluster.daemon.store.schema_version() == SUPPORTED_VERSION
        assert cluster.daemon.job(a).tasks == before
        cluster.run_until(lambda: cluster.state(a) == "done", limit=2000)
        rec = cluster.daemon.job(a)
        assert [t["exit_status"] for t in rec.tasks] == [0] * 9
        assert all(rec.tasks[k] == t for k, t in enumerate(before) if t["exit_status"] is not None)
        assert _starts(cluster) == Counter({f"{a}[{k}]": 1 for k in range(9)})
    finally:
        cluster.close()
