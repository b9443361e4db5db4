"""SQLite store: the default, one file, WAL journal, ``BEGIN IMMEDIATE`` write transactions."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vmctl.errors import StoreError, VmctlError
from vmctl.store.base import LeaseHeld, StoreDamaged
from vmctl.store.sql import SqlStore

SECRET_MODE = 0o600
#: SQLite's primary result codes that mean the file itself is damaged: SQLITE_CORRUPT ("database disk
#: image is malformed") and SQLITE_NOTADB ("file is not a database")
DAMAGED_CODES = (11, 26)
#: the tables checked first at start (what vmctld reads to run), then the ones that grow with history
CHECK_ORDER = ("schema_version", "lease", "kv", "tokens", "nodes", "desired", "operations", "jobs", "task_results",
               "events", "job_archive")


class IntegrityReport:
    """What ``SqliteStore.check`` found: the problems (empty: none), the tables checked and, when its time
    ran out, the tables it did not reach."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.checked: list[str] = []
        self.unchecked: list[str] = []
        self.seconds = 0.0


class SqliteStore(SqlStore):
    backend = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0, must_exist: bool = False) -> None:
        self.path = str(path)
        try:
            if self.path != ":memory:":
                if must_exist and not Path(self.path).is_file():
                    raise StoreError(backend=self.backend, problem=f"no database at {self.path}")
                Path(self.path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                # the database holds the CA's private key: 0600 whatever the umask (SQLite gives its
                # -wal, -shm and -journal files the mode of the database file)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, SECRET_MODE)
                try:
                    if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
                        os.fchmod(fd, SECRET_MODE)
                finally:
                    os.close(fd)
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False)
            if self.path == ":memory:" or os.path.getsize(self.path) > 0:
                # an empty file stays empty until migrate(): a store refused at start changes nothing
                self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(backend=self.backend, problem=f"cannot open {self.path}: {exc}") from exc
        self._lock = threading.RLock()

    def _damage_problem(self, exc: BaseException) -> str | None:
        if isinstance(exc, sqlite3.DatabaseError) and (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in DAMAGED_CODES:
            return str(exc)
        return None

    @contextmanager
    def _transaction(self, lock: bool = True) -> Iterator[Any]:
        try:
            with self._lock:
                cur = self._conn.cursor()
                try:
                    cur.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    raise self._translate(exc, "cannot begin: ") from exc
                try:
                    yield _Translating(cur, self)
                except VmctlError:
                    self._conn.rollback()
                    raise
                except sqlite3.Error as exc:
                    self._conn.rollback()
                    raise self._translate(exc) from exc
                except BaseException:
                    self._conn.rollback()
                    raise
                try:
                    self._conn.commit()
                except sqlite3.Error as exc:
                    raise self._translate(exc, "commit failed: ") from exc
                finally:
                    cur.close()
        except StoreDamaged as exc:
            self._report_damage(exc)
            raise

    @contextmanager
    def _read(self) -> Iterator[Any]:
        try:
            with self._lock:
                cur = self._conn.cursor()
                try:
                    yield _Translating(cur, self)
                finally:
                    cur.close()
        except StoreDamaged as exc:
            self._report_damage(exc)
            raise

    def _translate(self, exc: Exception, what: str = "") -> StoreError:
        if self._damage_problem(exc) is not None:
            return super()._translate(exc, what)
        return StoreError(backend=self.backend, problem=f"{self.path}: {what}{exc}")

    def check(self, budget_s: float) -> IntegrityReport:
        """SQLite's ``PRAGMA quick_check`` (every page of every table and index: the b-tree structure,
        the cells, the records; not whether an index matches its table, which ``integrity_check`` adds at
        ~4x the time) table by table in ``CHECK_ORDER``, interrupted when ``budget_s`` real seconds have
        passed (``budget_s`` <= 0: no limit; SQLite looks at the interrupt between pages). A file that
        cannot be read at all is one problem."""
        report = IntegrityReport()
        start = time.monotonic()
        with self._lock:
            try:
                tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            except sqlite3.Error as exc:
                report.problems.append(str(exc))
                return report
            order = [t for t in CHECK_ORDER if t in tables] + sorted(tables - set(CHECK_ORDER))
            timer = threading.Timer(budget_s, self._conn.interrupt) if budget_s > 0 else None
            if timer is not None:
                timer.daemon = True
                timer.start()
            try:
                for i, table in enumerate(order):
                    if timer is not None and time.monotonic() - start >= budget_s:
                        # the timer fired between two tables (an interrupt with no statement running is a
                        # no-op in SQLite): the budget is spent all the same
                        report.unchecked = order[i:]
                        break
                    try:
                        rows = self._conn.execute(f'PRAGMA quick_check("{table}")').fetchall()
                    except sqlite3.OperationalError as exc:
                        if timer is not None and time.monotonic() - start >= budget_s and "interrupt" in str(exc):
                            report.unchecked = order[i:]
                            break
                        report.problems.append(f"table {table}: {exc}")
                        continue
                    except sqlite3.Error as exc:
                        report.problems.append(f"table {table}: {exc}")
                        continue
                    found = [str(r[0]).replace("*** in database main ***", "") for r in rows if str(r[0]) != "ok"]
                    report.problems += [f"table {table}: {' '.join(f.split())}" for f in found]
                    report.checked.append(table)
            finally:
                if timer is not None:
                    timer.cancel()
                    timer.join()
        report.seconds = time.monotonic() - start
        return report

    def location(self) -> str:
        return self.path

    def migrate(self) -> int:
        with self._lock:
            try:
                self._conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.Error as exc:
                raise StoreError(backend=self.backend, problem=f"{self.path}: {exc}") from exc
        return super().migrate()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---------------------------------------------------------------- backup and restore
    def backup(self, dest: str | Path) -> None:
        """A consistent copy of the whole database (SQLite's online backup API: safe while a daemon
        writes) into the new file ``dest``, created with mode 0600; never overwrites."""
        dest = Path(dest)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_MODE)
        os.fchmod(fd, SECRET_MODE)
        os.close(fd)
        try:
            target = sqlite3.connect(str(dest), isolation_level=None)
            try:
                with self._lock:
                    self._conn.backup(target)
                target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file, no -wal
                check = target.execute("PRAGMA integrity_check").fetchone()
            finally:
                target.close()
            if not check or check[0] != "ok":
                raise StoreError(backend=self.backend, problem=f"{dest}: the copy fails its integrity check: {check}")
        except sqlite3.Error as exc:
            dest.unlink(missing_ok=True)
            raise StoreError(backend=self.backend, problem=f"backup of {self.path} to {dest}: {exc}") from exc
        except BaseException:
            dest.unlink(missing_ok=True)
            raise

    def restore(self, source: str | Path, *, now: float | None = None) -> None:
        """Replace the whole database by the backup ``source`` (through the backup API, so the WAL
        and every open reader stay consistent). Refused with ``LeaseHeld`` while a daemon holds the
        lease. The restored lease is free, with an epoch above both the backup's and the current one."""
        now = time.time() if now is None else now
        src_path = Path(source)
        if not src_path.is_file():
            raise StoreError(backend=self.backend, problem=f"no backup file at {source}")
        lease = self.lease() if self.schema_version() > 0 else None
        if lease is not None and lease.holder is not None and lease.expires >= now:
            raise LeaseHeld(holder=lease.holder, path=self.path, seconds=lease.expires - now)
        current_epoch = lease.epoch if lease is not None else 0
        try:
            src = sqlite3.connect(f"file:{src_path}?mode=ro", uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(backend=self.backend, problem=f"cannot open {source}: {exc}") from exc
        try:
            check = src.execute("PRAGMA integrity_check").fetchone()
            if not check or check[0] != "ok":
                raise StoreError(backend=self.backend, problem=f"{source} fails its integrity check: {check}")
            tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"schema_version", "kv", "lease", "jobs", "tokens"} <= tables or src.execute(
                    "SELECT 1 FROM kv WHERE key = 'ca'").fetchone() is None:
                raise StoreError(backend=self.backend, problem=f"{source} is not a vmctld backup (no cluster in it)")
            with self._lock:
                src.backup(self._conn)
                self._conn.execute("PRAGMA journal_mode=WAL")
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    row = self._conn.execute("SELECT epoch FROM lease WHERE id = 1").fetchone()
                    epoch = max(int(row[0]) if row else 0, current_epoch) + 1
                    self._conn.execute("UPDATE lease SET holder = NULL, epoch = ?, expires = 0 WHERE id = 1",
                                       (epoch,))
                    self._conn.commit()
                except BaseException:
                    self._conn.rollback()
                    raise
        except sqlite3.Error as exc:
            raise StoreError(backend=self.backend, problem=f"restore of {source} into {self.path}: {exc}") from exc
        finally:
            src.close()


class _Translating:
    """A cursor whose sqlite errors become ``StoreError`` (``StoreDamaged`` for a damaged file); rows are
    read lazily, so fetching translates too."""

    def __init__(self, cur: sqlite3.Cursor, store: SqliteStore) -> None:
        self._cur = cur
        self._store = store

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        try:
            return self._cur.execute(sql, params)
        except sqlite3.Error as exc:
            raise self._store._translate(exc) from exc

    def executemany(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> Any:
        try:
            return self._cur.executemany(sql, rows)
        except sqlite3.Error as exc:
            raise self._store._translate(exc) from exc

    def fetchone(self) -> Any:
        try:
            return self._cur.fetchone()
        except sqlite3.Error as exc:
            raise self._store._translate(exc) from exc

    def fetchall(self) -> list[Any]:
        try:
            return self._cur.fetchall()
        except sqlite3.Error as exc:
            raise self._store._translate(exc) from exc
