"""State store of vmctld: ``Store`` protocol, SQLite (default) and PostgreSQL backends."""

from __future__ import annotations

from vmctl.errors import ConfigError
from vmctl.store.base import JobRecord, Lease, NodeRecord, OperationRecord, Store, TokenRecord, WriteBatch

__all__ = ["JobRecord", "Lease", "NodeRecord", "OperationRecord", "Store", "TokenRecord", "WriteBatch", "is_postgres",
           "open_store", "sqlite_path"]


def is_postgres(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://")) or url.startswith("host=")


def sqlite_path(url: str, *, config_path: str = "<config>") -> str | None:
    """The file of a SQLite store URL (``sqlite:///abs/path.db`` / ``sqlite:relative.db`` / a plain
    path), or None for PostgreSQL."""
    if is_postgres(url):
        return None
    if url.startswith("sqlite:"):
        path = url[len("sqlite:"):]
        if path.startswith("///"):
            return "/" + path.lstrip("/")  # sqlite:///abs and sqlite:////abs (f"sqlite:///{state_dir}")
        if path.startswith("//"):
            raise ConfigError(path=config_path, where="store.url", problem=f"use sqlite:///ABS/PATH, got {url!r}")
        return path
    if "://" in url:
        raise ConfigError(path=config_path, where="store.url",
                          problem=f"unsupported scheme in {url!r} (use sqlite:///PATH or postgresql://...)")
    return url


def open_store(url: str, *, config_path: str = "<config>", must_exist: bool = False) -> Store:
    """``sqlite:///abs/path.db`` / ``sqlite:relative.db`` / a plain path, or ``postgresql://...``.
    ``must_exist``: refuse (``StoreError``) instead of creating a SQLite file that is not there."""
    path = sqlite_path(url, config_path=config_path)
    if path is None:
        from vmctl.store.postgres import PostgresStore

        return PostgresStore(url)
    from vmctl.store.sqlite import SqliteStore

    return SqliteStore(path, must_exist=must_exist)
