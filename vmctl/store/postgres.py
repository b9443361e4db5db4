"""PostgreSQL store (psycopg 3) for bigger deployments and for a standby daemon on another host.

Same SQL as SQLite (``vmctl.store.sql``); write transactions lock the lease row with
``SELECT ... FOR UPDATE`` so that writes are serialized and the epoch check is race-free.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

from vmctl.errors import StoreError, VmctlError
from vmctl.store.sql import SqlStore


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

    @contextmanager
    def _transaction(self, lock: bool = True) -> Iterator[Any]:
        pg = self._psycopg
        with self._lock:
            try:
                tx = self._conn.transaction()
                tx.__enter__()
            except pg.Error as exc:
                raise StoreError(backend=self.backend, problem=f"cannot begin: {exc}") from exc
            cur = self._conn.cursor()
            try:
                yield _Translating(cur)
            except BaseException as exc:
                with suppress(pg.Error):
                    tx.__exit__(type(exc), exc, exc.__traceback__)
                if isinstance(exc, pg.Error):
                    raise StoreError(backend=self.backend, problem=str(exc).strip()) from exc
                raise
            else:
                try:
                    tx.__exit__(None, None, None)
                except pg.Error as exc:
                    raise StoreError(backend=self.backend, problem=f"commit failed: {exc}") from exc
            finally:
                cur.close()

    @contextmanager
    def _read(self) -> Iterator[Any]:
        with self._lock:
            cur = self._conn.cursor()
            try:
                yield _Translating(cur)
            finally:
                cur.close()

    def location(self) -> str:
        info = self._conn.info
        return f"database {info.dbname!r} on {info.host or 'localhost'}:{info.port}"

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _Translating:
    def __init__(self, cur: Any) -> None:
        self._cur = cur

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        import psycopg

        try:
            return self._cur.execute(sql, params)
        except psycopg.Error as exc:
            if isinstance(exc, VmctlError):  # pragma: no cover
                raise
            raise StoreError(backend="postgres", problem=str(exc).strip()) from exc

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._cur.fetchall())
