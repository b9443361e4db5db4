"""A task bag's per-task results in their own table (schema 006, ``task_results``; issue 12).

A task bag's record (``JobRecord`` with ``bag`` set) is stored in three parts, so that a task end costs
O(1) rows and not a rewrite of a document that holds every task:

- the job document (``jobs.doc``) without ``tasks`` and ``bag``: the spec (which lists every task's
  work), times, placement, history; written when the job itself changes (start, resize, a worker
  leaving, its end), not at every task end;
- the bag's dispatcher state (``jobs.bag``, JSON: worker numbers, the task each runs, who leaves,
  throughput; O(workers)): written at every task end (``WriteBatch.bags``, ``UPDATE jobs SET bag``);
- one row per task of the current run (``task_results``: worker, start, end, exit status, error):
  only the rows of the tasks that changed (``JobRecord.changed_tasks``, kept by the dispatcher) are
  written; a task never handed out has no row and reads back as :func:`new_task`.

Every part is written in the one transaction of the event, with the desired state it implies.
Rows belong to a run: a full write of a bag deletes the rows of its other runs (a requeue that keeps
the results re-writes them under the new run, ``vmctl.daemon.dispatcher.start``); a full write of a
task-bag job that holds no bag (requeued from scratch) deletes them all; deleting a job from the store
(retention without archive) deletes its rows, and archiving keeps them (``job_archive.bag``).

Upgrade: a database of schema 005 holds a bag's results in its job document. Migration 006 moves them
out in the transaction that adds the table (:func:`move_out`), in ``jobs`` and ``job_archive``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from vmctl.store.base import dumps

#: the columns of a task row after the key (job_id, run, task), and the task fields they hold
COLUMNS = ("worker", "started", "ended", "exit_status", "error")
FIELDS = ("worker", "start", "end", "exit_status", "error")

UPSERT = ("INSERT INTO task_results (job_id, run, task, worker, started, ended, exit_status, error) "
          "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (job_id, run, task) DO UPDATE SET "
          + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS))
SELECT = "SELECT task, " + ", ".join(COLUMNS) + " FROM task_results WHERE job_id = ? AND run = ? ORDER BY task"


def new_task(k: int) -> dict[str, Any]:
    """Task ``k`` of a bag before it was handed out."""
    return {"index": k, "exit_status": None, "error": None, "worker": None, "start": None, "end": None}


def is_bag_spec(spec: dict[str, Any]) -> bool:
    shape = spec.get("shape")
    return isinstance(shape, dict) and shape.get("kind") == "task-bag"


def task_count(spec: dict[str, Any]) -> int:
    """The tasks of a task bag's spec (its shape's)."""
    return len(spec["shape"]["tasks"])


def row_params(job_id: str, run: int, k: int, t: dict[str, Any]) -> tuple[Any, ...]:
    return (job_id, run, k, *(t.get(f) for f in FIELDS))


def rows_of(job_id: str, run: int, tasks: Sequence[dict[str, Any]], which: Iterable[int]) -> list[tuple[Any, ...]]:
    return [row_params(job_id, run, k, tasks[k]) for k in sorted(which)]


def has_content(t: dict[str, Any]) -> bool:
    """A task that was handed out or has a result (one never handed out needs no row)."""
    return any(t.get(f) is not None for f in FIELDS)


def tasks_from_rows(count: int, rows: Iterable[Sequence[Any]]) -> list[dict[str, Any]]:
    """A bag's ``count`` tasks from its rows (task, worker, started, ended, exit_status, error)."""
    tasks = [new_task(k) for k in range(count)]
    for row in rows:
        k = int(row[0])
        if not 0 <= k < count:
            raise ValueError(f"task {k} outside the bag's {count} tasks")
        worker, start, end, status, error = row[1:6]
        tasks[k].update(worker=None if worker is None else str(worker), start=None if start is None else float(start),
                        end=None if end is None else float(end), exit_status=None if status is None else int(status),
                        error=None if error is None else str(error))
    return tasks


def split_doc(doc: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A job document as stored: a task bag's (``bag`` set) without ``tasks`` and ``bag``, which go to
    their rows and the ``bag`` column (returned as JSON); any other job's unchanged, and None."""
    bag = doc.get("bag")
    if bag is None:
        return doc, None
    doc = {k: v for k, v in doc.items() if k not in ("tasks", "bag")}
    return doc, dumps(bag)


def move_out(exec_: Any, cur: Any, table: str) -> int:
    """Migration 006: every task bag of ``table`` (``jobs`` or ``job_archive``) stored with its results in
    its document gets its rows and its ``bag`` column, and a document without them. A document that
    cannot be read is left as it is (the loader names it). Returns how many jobs were moved."""
    exec_(cur, f"SELECT id, doc FROM {table}")
    moved = 0
    for job_id, raw in cur.fetchall():
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("bag") is None:
                continue
            run, tasks = int(doc.get("run", 0)), list(doc.get("tasks") or [])
            rows = [row_params(str(job_id), run, k, t) for k, t in enumerate(tasks)
                    if isinstance(t, dict) and has_content(t)]
        except (ValueError, TypeError):
            continue
        stored, bag = split_doc(doc)
        for row in rows:
            exec_(cur, UPSERT, row)
        exec_(cur, f"UPDATE {table} SET doc = ?, bag = ? WHERE id = ?",
              (dumps(stored), bag, job_id))
        moved += 1
    return moved
