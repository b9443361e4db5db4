"""Fixtures shared by every test folder."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import PostgresServer
from vmctl.store import open_store
from vmctl.store.base import Store


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One throw-away PostgreSQL cluster for the whole run (tests create their own databases in it);
    skipped with the reason when PostgreSQL is not installed."""
    pg = PostgresServer(tmp_path_factory.mktemp("pg"))
    problem = pg.unavailable()
    if problem:
        pytest.skip(problem)
    pg.start()
    yield pg
    pg.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh empty store of each kind: a SQLite file, or a new database in the session's PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/s.db"
    pg: PostgresServer = request.getfixturevalue("postgres")
    return pg.create_db("t" + uuid.uuid4().hex[:12])


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open, migrated store of each kind (see ``store_url``)."""
    s = open_store(store_url)
    s.migrate()
    yield s
    s.close()
