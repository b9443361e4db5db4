"""State store of vmctld: ``Store`` protocol, SQLite (default) and PostgreSQL backends."""

from __future__ import annotations

from vmctl.errors import ConfigError
from vmctl.store.base import JobRecord, Lease, NodeRecord, OperationRecord, Store, TokenRecord, WriteBatch

__all__ = ["JobRecord", "Lease", "NodeRecord", "OperationRecord", "Store", "TokenRecord", "WriteBatch", "open_store"]


def open_store(url: str, *, config_path: str = "<config>") -> Store:
    """``sqlite:///abs/path.db`` / ``sqlite:relative.db`` / a plain path, or ``postgresql://...``."""
    if url.startswith(("postgresql://", "postgres://")) or url.startswith("host="):
        from vmctl.store.postgres import PostgresStore

        return PostgresStore(url)
    if url.startswith("sqlite:"):
        path = url[len("sqlite:"):]
        if path.startswith("///"):
            path = path[2:]
        elif path.startswith("//"):
            raise ConfigError(path=config_path, where="store.url", problem=f"use sqlite:///ABS/PATH, got {url!r}")
    elif "://" in url:
        raise ConfigError(path=config_path, where="store.url",
                          problem=f"unsupported scheme in {url!r} (use sqlite:///PATH or postgresql://...)")
    else:
        path = url
    from vmctl.store.sqlite import SqliteStore

    return SqliteStore(path)
