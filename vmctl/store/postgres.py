"""PostgreSQL store (psycopg 3) for bigger deployments and for a standby daemon on another host.

Same SQL as SQLite (``vmctl.store.sql``); write transactions lock the lease row with
``SELECT ... FOR UPDATE`` so that writes are serialized and the epoch check is race-free.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from vmctl.errors import StoreError, VmctlError
from vmctl.store.base import StoreDamaged
from vmctl.store.sql import SqlStore

#: SQLSTATEs of a damaged database: data_corrupted, index_corrupted (class XX, internal error)
DAMAGED_SQLSTATES = ("XX001", "XX002")


class PostgresStore(SqlStore):
    backend = "postgres"

    def __init__(self, dsn: str, *, connect_timeout_s: int = 10) -> None:
        try:
            import psycopg
        except ImportError as exc:  # pragma: no cover - psycopg is a dependency
            raise StoreError(backend=self.backend, problem="psycopg is not installed") from exc
        self._psycopg = psycopg
        self.dsn = dsn
        try:
            self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout_s)
        except psycopg.Error as exc:
            raise StoreError(backend=self.backend, problem=f"cannot connect: {exc}") from exc
        self._lock = threading.RLock()

    def _q(self, sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def _for_update(self) -> str:
        return " FOR UPDATE"

    def _damage_problem(self, exc: BaseException) -> str | None:
        if getattr(exc, "sqlstate", None) in DAMAGED_SQLSTATES:
            return str(exc).strip()
        return None

    def _translate(self, exc: Exception, what: str = "") -> StoreError:
        if self._damage_problem(exc) is None:
            return StoreError(backend=self.backend, problem=f"{what}{str(exc).strip()}")
        return super()._translate(exc, what)

    @contextmanager
    def _transaction(self, lock: bool = True) -> Iterator[Any]:
        pg = self._psycopg
        try:
            with self._lock:
                try:
                    tx = self._conn.transaction()
                    tx.__enter__()
                except pg.Error as exc:
                    raise self._translate(exc, "cannot begin: ") from exc
                cur = self._conn.cursor()
                try:
                    yield _Translating(cur, self)
                except BaseException as exc:
                    with suppress(pg.Error):
                        tx.__exit__(type(exc), exc, exc.__traceback__)
                    if isinstance(exc, pg.Error):
                        raise self._translate(exc) from exc
                    raise
                else:
                    try:
                        tx.__exit__(None, None, None)
                    except pg.Error as exc:
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

    def location(self) -> str:
        info = self._conn.info
        return f"database {info.dbname!r} on {info.host or 'localhost'}:{info.port}"

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _Translating:
    def __init__(self, cur: Any, store: PostgresStore) -> None:
        self._cur = cur
        self._store = store

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg

        try:
            return self._cur.execute(sql, params)
        except psycopg.Error as exc:
            if isinstance(exc, VmctlError):  # pragma: no cover
                raise
            raise self._store._translate(exc) from exc

    def executemany(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> Any:
        import psycopg

        try:
            return self._cur.executemany(sql, rows)
        except psycopg.Error as exc:
            if isinstance(exc, VmctlError):  # pragma: no cover
                raise
            raise self._store._translate(exc) from exc

    def fetchone(self) -> Any:
        import psycopg

        try:
            return self._cur.fetchone()
        except psycopg.Error as exc:
            raise self._store._translate(exc) from exc

    def fetchall(self) -> list[Any]:
        import psycopg

        try:
            return list(self._cur.fetchall())
        except psycopg.Error as exc:
            raise self._store._translate(exc) from exc
