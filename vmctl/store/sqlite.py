"""SQLite store: the default, one file, WAL journal, ``BEGIN IMMEDIATE`` write transactions."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from vmctl.errors import StoreError, VmctlError
from vmctl.store.sql import SqlStore


class SqliteStore(SqlStore):
    backend = "sqlite"

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 10.0) -> None:
        self.path = str(path)
        try:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None,
                                         check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(backend=self.backend, problem=f"cannot open {self.path}: {exc}") from exc
        self._lock = threading.RLock()

    @contextmanager
    def _transaction(self, lock: bool = True) -> Iterator[Any]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise StoreError(backend=self.backend, problem=f"{self.path}: cannot begin: {exc}") from exc
            try:
                yield cur
            except VmctlError:
                self._conn.rollback()
                raise
            except sqlite3.Error as exc:
                self._conn.rollback()
                raise StoreError(backend=self.backend, problem=f"{self.path}: {exc}") from exc
            except BaseException:
                self._conn.rollback()
                raise
            try:
                self._conn.commit()
            except sqlite3.Error as exc:
                raise StoreError(backend=self.backend, problem=f"{self.path}: commit failed: {exc}") from exc
            finally:
                cur.close()

    @contextmanager
    def _read(self) -> Iterator[Any]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                yield _Translating(cur, self)
            finally:
                cur.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _Translating:
    """A cursor whose sqlite errors become ``StoreError``."""

    def __init__(self, cur: sqlite3.Cursor, store: SqliteStore) -> None:
        self._cur = cur
        self._store = store

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        try:
            return self._cur.execute(sql, params)
        except sqlite3.Error as exc:
            raise StoreError(backend="sqlite", problem=f"{self._store.path}: {exc}") from exc

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()
