"""Fixtures shared by every test folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.daemon import PostgresServer


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
