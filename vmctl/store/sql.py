"""The SQL shared by the SQLite and PostgreSQL stores.

Both backends run the same statements (written with ``?`` placeholders; the PostgreSQL backend turns
them into ``%s``). ``_transaction`` is the only backend-specific piece: SQLite takes the database
write lock with ``BEGIN IMMEDIATE``; PostgreSQL locks the lease row with ``SELECT ... FOR UPDATE``.
Either way the epoch read inside the transaction is the one the write commits against, so a daemon
that lost its lease can never commit (``LeaseLost``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from vmctl.errors import LeaseLost, SchemaVersionError, StoreError
from vmctl.model import Discipline, group_name_problem
from vmctl.store import tasks as task_rows
from vmctl.store.base import (
    CorruptRecord,
    EventRecord,
    JobRecord,
    Lease,
    LeaseHeld,
    NodeRecord,
    OperationRecord,
    StoreDamaged,
    StorePosition,
    TokenRecord,
    WriteBatch,
    dumps,
    upgrade_job_doc,
)

SCHEMA_DIR = Path(__file__).parent / "schema"
_T = TypeVar("_T")
_UPSERT_JOB = ("INSERT INTO jobs (id, seq, state, doc, bag) VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
               "SET state = excluded.state, doc = excluded.doc, bag = excluded.bag")


def migrations() -> list[tuple[int, str]]:
    """(version, SQL text) of every migration file ``NNN_name.sql``, in order."""
    out: list[tuple[int, str]] = []
    for path in sorted(SCHEMA_DIR.glob("[0-9][0-9][0-9]_*.sql")):
        out.append((int(path.name[:3]), path.read_text(encoding="utf-8")))
    return out


def split_statements(sql: str) -> list[str]:
    lines = [ln for ln in sql.splitlines() if not ln.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


SUPPORTED_VERSION = max(v for v, _ in migrations())


def _task_results_out(store: SqlStore, cur: Any) -> None:
    """Migration 006: task bags stored with their results in their documents get their rows."""
    for table in ("jobs", "job_archive"):
        task_rows.move_out(store._exec, cur, table)


def _slots_in(store: SqlStore, cur: Any) -> None:
    """Migration 008: job documents stored with ``tier``/``placement``/``level`` (and a bag's per-worker
    levels in its ``bag`` column) rewritten with their ``slots`` (``vmctl.store.base.upgrade_job_doc``)."""
    for table in ("jobs", "job_archive"):
        store._exec(cur, f"SELECT id, doc, bag FROM {table}")
        for job_id, raw, raw_bag in cur.fetchall():
            try:
                doc = json.loads(raw)
                bag = json.loads(raw_bag) if raw_bag is not None else None
                if isinstance(bag, dict):  # the workers' levels live in the bag column since schema 006
                    doc["bag"] = bag
                new = upgrade_job_doc(doc)
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise CorruptRecord(backend=store.backend, where=store.location(), table=table,
                                    row=f"id={job_id!r}", problem=f"cannot rewrite the job document with its "
                                    f"slots (migration 008; {type(exc).__name__}: {exc}); restore a backup or "
                                    f"repair the row") from exc
            if new is doc:
                continue
            new_bag = new.pop("bag", None) if isinstance(bag, dict) else None
            store._exec(cur, f"UPDATE {table} SET doc = ?, bag = ? WHERE id = ?",
                        (dumps(new), raw_bag if new_bag is None else dumps(new_bag), job_id))


#: data moved by a migration after its statements, in its transaction: version -> step(store, cursor)
DATA_STEPS: dict[int, Callable[[SqlStore, Any], None]] = {6: _task_results_out, 8: _slots_in}

#: the schema that keeps the store's position (``StorePosition``) in the lease row
POSITION_SCHEMA = 7


def node_columns_problem(speed: Any, group: Any, memory: Any) -> str | None:
    """Why the stored speed, group and memory of a node (schema 003) cannot be read back, or None."""
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not (math.isfinite(speed) and speed > 0):
        return f"column speed must be a finite number > 0, got {speed!r}"
    if not isinstance(group, str) or group_name_problem(group) is not None:
        return f"column node_group {group_name_problem(group) if isinstance(group, str) else 'must be text'}, " \
               f"got {group!r}"
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 0:
        return f"column memory_mib must be an integer >= 0, got {memory!r}"
    return None


def node_layout_problem(levels: Any, discipline: Any) -> str | None:
    """Why the stored level layout of a node (schema 004) cannot be read back, or None."""
    if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
        return f"column levels must be an integer >= 1, got {levels!r}"
    if discipline not in {d.value for d in Discipline}:
        return f"column discipline must be one of {', '.join(d.value for d in Discipline)}, got {discipline!r}"
    return None


class SqlStore:
    """Backend-neutral implementation; subclasses provide ``_transaction`` and ``_read``."""

    backend = "sql"
    #: ``Store.on_damaged`` / ``Store.on_commit`` (set by the daemon)
    on_damaged: Callable[[StoreDamaged], None] | None = None
    on_commit: Callable[[StorePosition], None] | None = None
    #: the first damage found (``StoreDamaged``), None while none was
    damaged: StoreDamaged | None = None
    #: the position after this process's last commit (None: none yet; read from the store at the first)
    _position: StorePosition | None = None

    # ---------------------------------------------------------------- damage
    def _damage_problem(self, exc: BaseException) -> str | None:
        """What is damaged when ``exc`` (a driver error) says the database itself is, else None."""
        return None

    def _translate(self, exc: Exception, what: str = "") -> StoreError:
        """A driver error as a ``StoreError``: ``StoreDamaged`` when the database itself is damaged."""
        problem = self._damage_problem(exc)
        if problem is not None:
            return StoreDamaged(backend=self.backend, where=self.location(), problem=f"{what}{problem}")
        return StoreError(backend=self.backend, problem=f"{what}{exc}".strip())

    def _report_damage(self, exc: StoreDamaged) -> None:
        """Called outside any transaction and lock: the first damage is kept and passed to ``on_damaged``."""
        if self.damaged is not None:
            return
        self.damaged = exc
        if self.on_damaged is not None:
            self.on_damaged(exc)

    # ---------------------------------------------------------------- backend hooks
    def _transaction(self, lock: bool = True) -> AbstractContextManager[Any]:  # pragma: no cover
        raise NotImplementedError

    def _read(self) -> AbstractContextManager[Any]:  # pragma: no cover
        raise NotImplementedError

    def _q(self, sql: str) -> str:
        return sql

    def _exec(self, cur: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        return cur.execute(self._q(sql), tuple(params))

    def _execmany(self, cur: Any, sql: str, rows: Sequence[Sequence[Any]]) -> Any:
        """``sql`` once per row of ``rows``, in one driver call (a batch of jobs or events)."""
        return cur.executemany(self._q(sql), [tuple(r) for r in rows])

    def close(self) -> None:  # pragma: no cover
        raise NotImplementedError

    # ---------------------------------------------------------------- schema
    def schema_version(self) -> int:
        with self._read() as cur:
            try:
                self._exec(cur, "SELECT MAX(version) FROM schema_version")
            except StoreError:
                return 0
            row = cur.fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def migrate(self) -> int:
        with self._transaction(lock=False) as cur:
            self._exec(cur, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied TEXT)")
            self._exec(cur, "SELECT MAX(version) FROM schema_version")
            row = cur.fetchone()
            current = int(row[0]) if row and row[0] is not None else 0
            if current > SUPPORTED_VERSION:
                raise SchemaVersionError(backend=self.backend, found=current, supported=SUPPORTED_VERSION)
            for version, sql in migrations():
                if version <= current:
                    continue
                for stmt in split_statements(sql):
                    self._exec(cur, stmt)
                step = DATA_STEPS.get(version)
                if step is not None:
                    step(self, cur)
                self._exec(cur, "INSERT INTO schema_version (version, applied) VALUES (?, ?)",
                           (version, f"migration {version:03d}"))
                current = version
        return current

    # ---------------------------------------------------------------- position (schema 007)
    def position(self) -> StorePosition | None:
        if self.schema_version() < POSITION_SCHEMA:
            return None
        with self._read() as cur:
            self._exec(cur, "SELECT timeline, commits FROM lease WHERE id = 1")
            row = cur.fetchone()
            if row is None:
                return None
            self._exec(cur, "SELECT MAX(seq) FROM jobs")
            jobs = cur.fetchone()
            self._exec(cur, "SELECT MAX(seq) FROM job_archive")
            archived = cur.fetchone()
            self._exec(cur, "SELECT MAX(seq) FROM events")
            events = cur.fetchone()
        job = max(int(jobs[0] or 0) if jobs else 0, int(archived[0] or 0) if archived else 0)
        return StorePosition(int(row[0]), int(row[1]), job=job, event=int(events[0] or 0) if events else 0)

    def _leader_tx(self, cur: Any, epoch: int) -> tuple[int, int]:
        """In a leader's write transaction: the epoch check (``LeaseLost``) and one more commit; returns
        (timeline, commits) as they will be once it commits."""
        self._exec(cur, "SELECT holder, epoch, expires, timeline, commits FROM lease WHERE id = 1" + self._for_update())
        row = cur.fetchone()
        if row is None:
            raise StoreError(backend=self.backend, problem="lease row missing: schema not migrated")
        if int(row[1]) != epoch:
            raise LeaseLost(epoch=epoch, current=int(row[1]))
        commits = int(row[4]) + 1
        self._exec(cur, "UPDATE lease SET commits = ? WHERE id = 1", (commits,))
        return int(row[3]), commits

    def _committed(self, timeline: int, commits: int, jobs: Sequence[JobRecord] = (),
                   events: Sequence[EventRecord] = ()) -> None:
        """After a leader's commit: the position it reached, passed to ``on_commit``."""
        last = self._position
        if last is None or last.timeline != timeline:
            last = self.position() or StorePosition(timeline, commits)
        pos = StorePosition(timeline, commits, job=max([last.job, *(j.seq for j in jobs)]),
                            event=max([last.event, *(e.seq for e in events)]))
        self._position = pos
        if self.on_commit is not None:
            self.on_commit(pos)

    def fork_timeline(self, at_least: int, kind: str, message: str, actor: str, now: float) -> StorePosition:
        with self._transaction(lock=False) as cur:
            self._exec(cur, "SELECT holder, expires, timeline, commits FROM lease WHERE id = 1" + self._for_update())
            row = cur.fetchone()
            if row is None:
                raise StoreError(backend=self.backend, problem="lease row missing: schema not migrated")
            if row[0] is not None and float(row[1]) >= now:
                raise LeaseHeld(holder=row[0], path=self.location(), seconds=float(row[1]) - now)
            timeline, commits = max(int(row[2]), at_least) + 1, int(row[3]) + 1
            self._exec(cur, "UPDATE lease SET holder = NULL, expires = 0, timeline = ?, commits = ? WHERE id = 1",
                       (timeline, commits))
            self._exec(cur, "SELECT MAX(seq) FROM events")
            last = cur.fetchone()
            seq = int(last[0] or 0) + 1 if last else 1
            ev = EventRecord(seq=seq, time=now, kind=kind, message=message, actor=actor)
            self._exec(cur, "INSERT INTO events (seq, time, kind, doc) VALUES (?, ?, ?, ?)",
                       (ev.seq, ev.time, ev.kind, dumps(ev.to_doc())))
        self._position = None
        pos = self.position()
        assert pos is not None
        return pos

    # ---------------------------------------------------------------- lease
    def lease(self) -> Lease:
        with self._read() as cur:
            self._exec(cur, "SELECT holder, epoch, expires FROM lease WHERE id = 1")
            row = cur.fetchone()
        if row is None:
            return Lease(None, 0, 0.0)
        return Lease(row[0], int(row[1]), float(row[2]))

    def acquire_lease(self, holder: str, ttl: float, now: float) -> int | None:
        with self._transaction(lock=False) as cur:
            row = self._lease_row(cur)
            cur_holder, epoch, expires = row[0], int(row[1]), float(row[2])
            if cur_holder == holder and expires >= now:
                self._exec(cur, "UPDATE lease SET expires = ? WHERE id = 1", (now + ttl,))
                return epoch
            if cur_holder is not None and expires >= now:
                return None
            epoch += 1
            self._exec(cur, "UPDATE lease SET holder = ?, epoch = ?, expires = ? WHERE id = 1",
                       (holder, epoch, now + ttl))
            return epoch

    def renew_lease(self, holder: str, epoch: int, ttl: float, now: float) -> None:
        with self._transaction(lock=False) as cur:
            row = self._lease_row(cur)
            if row[0] != holder or int(row[1]) != epoch:
                raise LeaseLost(epoch=epoch, current=int(row[1]))
            self._exec(cur, "UPDATE lease SET expires = ? WHERE id = 1", (now + ttl,))

    def release_lease(self, holder: str, epoch: int) -> None:
        with self._transaction(lock=False) as cur:
            row = self._lease_row(cur)
            if row[0] == holder and int(row[1]) == epoch:
                self._exec(cur, "UPDATE lease SET holder = NULL, expires = 0 WHERE id = 1")

    def _lease_row(self, cur: Any) -> Any:
        self._exec(cur, "SELECT holder, epoch, expires FROM lease WHERE id = 1" + self._for_update())
        row = cur.fetchone()
        if row is None:
            raise StoreError(backend=self.backend, problem="lease row missing: schema not migrated")
        return row

    def _for_update(self) -> str:
        return ""

    # ---------------------------------------------------------------- reads
    def location(self) -> str:
        """Where the data is, for messages (no credentials)."""
        return self.backend

    def _decode(self, table: str, key: str, value: Any, make: Callable[[Any], _T] | None, raw: Any) -> Any:
        """One stored value read back: ``make(json document)`` (``int``: the column as a number;
        None: the JSON value). A row that cannot be read back is a ``CorruptRecord`` naming the table
        and the row, never a traceback."""
        try:
            if make is int:
                return int(raw)
            doc = json.loads(raw)
            if make is None:
                return doc
            if not isinstance(doc, dict):
                raise TypeError(f"expected a JSON object, got {type(doc).__name__}")
            return make(doc)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
            raise CorruptRecord(backend=self.backend, where=self.location(), table=table, row=f"{key}={value!r}",
                                problem=f"cannot read the stored record ({type(exc).__name__}: {exc}); restore a "
                                        f"backup or repair the row") from exc

    def load_jobs(self) -> list[JobRecord]:
        with self._read() as cur:
            self._exec(cur, "SELECT id, doc, bag FROM jobs ORDER BY seq")
            rows = cur.fetchall()
            # the task rows of the live bags, every run (those of the job's current run are kept)
            self._exec(cur, "SELECT t.job_id, t.run, t.task, " + ", ".join(f"t.{c}" for c in task_rows.COLUMNS)
                       + " FROM task_results t JOIN jobs j ON j.id = t.job_id WHERE j.bag IS NOT NULL")
            trows = cur.fetchall()
        by_run: dict[tuple[str, int], list[Any]] = {}
        for r in trows:
            by_run.setdefault((str(r[0]), int(r[1])), []).append(r[2:])
        out: list[JobRecord] = []
        for job_id, doc, bag in rows:
            rec: JobRecord = self._decode("jobs", "id", job_id, JobRecord.from_doc, doc)
            if bag is not None:
                self._with_bag("jobs", rec, bag, by_run.get((rec.id, rec.run), []))
            out.append(rec)
        return out

    def _with_bag(self, table: str, rec: JobRecord, bag: Any, rows: list[Any] | None) -> None:
        """A task bag's dispatcher state (its ``bag`` column) and, unless ``rows`` is None, its tasks (its
        rows of ``task_results``, schema 006) put back into ``rec``; a value that cannot be read back is a
        ``CorruptRecord`` naming the job."""
        rec.adopt_bag(self._decode(table, "id", rec.id, dict, bag))
        if rows is None:
            return
        try:
            rec.tasks = task_rows.tasks_from_rows(task_rows.task_count(rec.spec), rows)
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptRecord(backend=self.backend, where=self.location(), table="task_results",
                                row=f"job_id={rec.id!r}, run={rec.run}",
                                problem=f"cannot read the task rows back ({type(exc).__name__}: {exc}); restore a "
                                        f"backup or repair the rows") from exc

    def _task_rows(self, cur: Any, job_id: str, run: int) -> list[Any]:
        self._exec(cur, task_rows.SELECT, (job_id, run))
        return list(cur.fetchall())

    def load_nodes(self) -> list[NodeRecord]:
        with self._read() as cur:
            self._exec(cur, "SELECT name, doc, speed, node_group, memory_mib, levels, discipline FROM nodes "
                            "ORDER BY name")
            rows = cur.fetchall()
        out: list[NodeRecord] = []
        for name, doc, speed, group, memory, levels, discipline in rows:
            rec: NodeRecord = self._decode("nodes", "name", name, NodeRecord.from_doc, doc)
            problem = node_columns_problem(speed, group, memory) or node_layout_problem(levels, discipline)
            if problem is not None:
                raise CorruptRecord(backend=self.backend, where=self.location(), table="nodes", row=f"name={name!r}",
                                    problem=f"{problem}; restore a backup or repair the row")
            rec.speed, rec.group, rec.memory_mib = float(speed), str(group), int(memory)
            rec.levels, rec.discipline = int(levels), str(discipline)
            out.append(rec)
        return out

    def load_desired(self) -> dict[str, tuple[int, dict[str, Any]]]:
        with self._read() as cur:
            self._exec(cur, "SELECT node, generation, doc FROM desired")
            rows = cur.fetchall()
        return {r[0]: (self._decode("desired", "node", r[0], int, r[1]),
                       self._decode("desired", "node", r[0], dict, r[2])) for r in rows}

    def load_operations(self) -> list[OperationRecord]:
        with self._read() as cur:
            self._exec(cur, "SELECT id, doc FROM operations ORDER BY id")
            rows = cur.fetchall()
        return [self._decode("operations", "id", r[0], OperationRecord.from_doc, r[1]) for r in rows]

    def get_kv(self, key: str) -> Any:
        with self._read() as cur:
            self._exec(cur, "SELECT value FROM kv WHERE key = ?", (key,))
            row = cur.fetchone()
        return None if row is None else self._decode("kv", "key", key, None, row[0])

    def insert_token(self, rec: TokenRecord) -> None:
        """Add one token outside the leader's transactions (tokens are not part of the state the
        leader acts on): ``vmctld token create`` mints one offline, also while a daemon runs."""
        with self._transaction(lock=False) as cur:
            self._exec(cur, "INSERT INTO tokens (hash, name, role, created, expires) VALUES (?, ?, ?, ?, ?)",
                       (rec.hash, rec.name, rec.role, rec.created, rec.expires))

    def find_token(self, token_hash: str) -> TokenRecord | None:
        with self._read() as cur:
            self._exec(cur, "SELECT hash, name, role, created, expires FROM tokens WHERE hash = ?", (token_hash,))
            row = cur.fetchone()
        return None if row is None else TokenRecord(row[0], row[1], row[2], float(row[3]),
                                                    None if row[4] is None else float(row[4]))

    def list_tokens(self) -> list[TokenRecord]:
        with self._read() as cur:
            self._exec(cur, "SELECT hash, name, role, created, expires FROM tokens ORDER BY created")
            rows = cur.fetchall()
        return [TokenRecord(r[0], r[1], r[2], float(r[3]), None if r[4] is None else float(r[4])) for r in rows]

    # ---------------------------------------------------------------- writes
    def write(self, epoch: int, batch: WriteBatch) -> None:
        if batch.empty():
            return
        with self._transaction(lock=True) as cur:
            timeline, commits = self._leader_tx(cur, epoch)
            plain: list[tuple[Any, ...]] = []  # the jobs with no task rows: one statement for all of them
            for j in batch.jobs.values():
                doc, bag = task_rows.split_doc(j.to_doc())
                row = (j.id, j.seq, str(j.state), dumps(doc), bag)
                if bag is None and not task_rows.is_bag_spec(j.spec):
                    plain.append(row)
                    continue
                self._exec(cur, _UPSERT_JOB, row)
                if bag is not None:  # the rows of the bag's other runs go (a kept result is written again)
                    self._exec(cur, "DELETE FROM task_results WHERE job_id = ? AND run <> ?", (j.id, j.run))
                    self._write_task_rows(cur, j)
                elif task_rows.is_bag_spec(j.spec):  # a bag requeued from scratch: its results go
                    self._exec(cur, "DELETE FROM task_results WHERE job_id = ?", (j.id,))
            if plain:
                self._execmany(cur, _UPSERT_JOB, plain)
            for j in batch.bags.values():  # a task end: the bag's dispatcher state and its changed tasks
                if j.id not in batch.jobs and j.bag is not None:
                    self._exec(cur, "UPDATE jobs SET bag = ? WHERE id = ?", (dumps(j.bag), j.id))
                    self._write_task_rows(cur, j)
            for n in batch.nodes.values():
                self._exec(cur, "INSERT INTO nodes (name, doc, speed, node_group, memory_mib, levels, discipline) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?) "
                                "ON CONFLICT (name) DO UPDATE SET doc = excluded.doc, speed = excluded.speed, "
                                "node_group = excluded.node_group, memory_mib = excluded.memory_mib, "
                                "levels = excluded.levels, discipline = excluded.discipline",
                           (n.name, dumps(n.to_doc()), n.speed, n.group, n.memory_mib, n.levels, n.discipline))
            for node, (gen, doc) in batch.desired.items():
                self._exec(cur, "INSERT INTO desired (node, generation, doc) VALUES (?, ?, ?) ON CONFLICT (node) "
                                "DO UPDATE SET generation = excluded.generation, doc = excluded.doc",
                           (node, gen, dumps(doc)))
            for op in batch.operations.values():
                self._exec(cur, "INSERT INTO operations (id, state, doc) VALUES (?, ?, ?) ON CONFLICT (id) "
                                "DO UPDATE SET state = excluded.state, doc = excluded.doc",
                           (op.id, op.state, dumps(op.to_doc())))
            for key, value in batch.kv.items():
                self._exec(cur, "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                                "SET value = excluded.value", (key, dumps(value)))
            for t in batch.tokens:
                self._exec(cur, "INSERT INTO tokens (hash, name, role, created, expires) VALUES (?, ?, ?, ?, ?)",
                           (t.hash, t.name, t.role, t.created, t.expires))
            for h in batch.delete_tokens:
                self._exec(cur, "DELETE FROM tokens WHERE hash = ?", (h,))
            for name in batch.delete_nodes:
                self._exec(cur, "DELETE FROM nodes WHERE name = ?", (name,))
            if batch.events:  # the event log: one statement per batch
                self._execmany(cur, "INSERT INTO events (seq, time, kind, doc) VALUES (?, ?, ?, ?)",
                               [(e.seq, e.time, e.kind, dumps(e.to_doc())) for e in batch.events])
        for j in (*batch.jobs.values(), *batch.bags.values()):
            j.changed_tasks.clear()
        self._committed(timeline, commits, list(batch.jobs.values()), batch.events)

    def _write_task_rows(self, cur: Any, j: JobRecord) -> None:
        for row in task_rows.rows_of(j.id, j.run, j.tasks, j.changed_tasks):
            self._exec(cur, task_rows.UPSERT, row)


    # ---------------------------------------------------------------- job retention (schema 002)
    def prune_jobs(self, epoch: int, jobs: Sequence[JobRecord], archive: bool) -> None:
        if not jobs:
            return
        with self._transaction(lock=True) as cur:
            timeline, commits = self._leader_tx(cur, epoch)
            for j in jobs:
                if archive:  # a bag's task rows stay, under its id (schema 006)
                    doc, bag = task_rows.split_doc(j.to_doc())
                    self._exec(
                        cur,
                        "INSERT INTO job_archive (id, seq, state, end_time, doc, bag) VALUES (?, ?, ?, ?, ?, ?) "
                        "ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, state = excluded.state, "
                        "end_time = excluded.end_time, doc = excluded.doc, bag = excluded.bag",
                        (j.id, j.seq, str(j.state), j.end_time, dumps(doc), bag),
                    )
                    if bag is not None:
                        self._write_task_rows(cur, j)
                else:
                    self._exec(cur, "DELETE FROM task_results WHERE job_id = ?", (j.id,))
                self._exec(cur, "DELETE FROM jobs WHERE id = ?", (j.id,))
        for j in jobs:
            j.changed_tasks.clear()
        self._committed(timeline, commits)

    def _archived(self, rows: list[Any], cur: Any = None) -> list[JobRecord]:
        """Archived jobs from their rows (id, doc, bag); a bag's tasks are read with ``cur``, and left
        out (``tasks`` empty) without it: a job list does not read every task row."""
        out: list[JobRecord] = []
        for job_id, doc, bag in rows:
            rec: JobRecord = self._decode("job_archive", "id", job_id, JobRecord.from_doc, doc)
            if bag is not None:
                self._with_bag("job_archive", rec, bag, None if cur is None else self._task_rows(cur, rec.id, rec.run))
            out.append(rec)
        return out

    def get_archived_job(self, job_id: str) -> JobRecord | None:
        with self._read() as cur:
            self._exec(cur, "SELECT id, doc, bag FROM job_archive WHERE id = ?", (job_id,))
            row = cur.fetchone()
            return None if row is None else self._archived([row], cur)[0]

    def list_archived_jobs(self, state: str | None = None, limit: int = 1000) -> list[JobRecord]:
        with self._read() as cur:
            if state is None:
                self._exec(cur, "SELECT id, doc, bag FROM job_archive ORDER BY seq DESC LIMIT ?", (limit,))
            else:
                self._exec(cur, "SELECT id, doc, bag FROM job_archive WHERE state = ? ORDER BY seq DESC LIMIT ?",
                           (state, limit))
            rows = cur.fetchall()
        return self._archived(rows)

    def count_archived_jobs(self) -> int:
        with self._read() as cur:
            self._exec(cur, "SELECT COUNT(*) FROM job_archive")
            row = cur.fetchone()
        return int(row[0]) if row else 0

    # ---------------------------------------------------------------- the event log (schema 005)
    def list_events(self, after: int = 0, since: float | None = None, limit: int = 1000,
                    newest: bool = False) -> list[EventRecord]:
        where = "seq > ?" + ("" if since is None else " AND time >= ?")
        params: list[Any] = [after] if since is None else [after, since]
        order = "DESC" if newest else "ASC"
        with self._read() as cur:
            self._exec(cur, f"SELECT seq, time, kind, doc FROM events WHERE {where} ORDER BY seq {order} LIMIT ?",
                       (*params, limit))
            rows = cur.fetchall()
        out: list[EventRecord] = []
        for seq, time, kind, doc in rows:
            make: Callable[[dict[str, Any]], EventRecord] = partial(EventRecord.from_row, seq, time, kind)
            out.append(self._decode("events", "seq", seq, make, doc))
        return out[::-1] if newest else out

    def event_bounds(self) -> tuple[int, float | None]:
        with self._read() as cur:
            self._exec(cur, "SELECT MAX(seq), MIN(time) FROM events")
            row = cur.fetchone()
        if row is None or row[0] is None:
            return 0, None
        return int(row[0]), float(row[1])

    def prune_events(self, epoch: int, before: float) -> int:
        with self._transaction(lock=True) as cur:
            timeline, commits = self._leader_tx(cur, epoch)
            res = self._exec(cur, "DELETE FROM events WHERE time < ?", (before,))
            deleted = max(0, int(getattr(res, "rowcount", 0) or 0))
        self._committed(timeline, commits)
        return deleted
