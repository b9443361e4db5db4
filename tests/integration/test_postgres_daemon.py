"""vmctld on PostgreSQL (started by the test as the unprivileged postgres user): the decision loop
end to end, a restart, and a standby daemon taking over when the leader stops renewing its lease."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from tests.support.daemon import PostgresServer
from tests.unit.test_daemon_core import Cluster
from vmctl.daemon.base import NotLeader
from vmctl.daemon.core import Daemon
from vmctl.errors import LeaseLost
from vmctl.store import open_store

pytestmark = pytest.mark.postgres


@pytest.fixture
def dsn(postgres: PostgresServer) -> str:
    return postgres.create_db("d" + uuid.uuid4().hex[:12])


def test_decision_loop_and_restart_on_postgres(tmp_path: Path, dsn: str) -> None:
    c = Cluster(tmp_path, {"n1": 4, "n2": 4}, store_url=dsn)
    try:
        ids = [c.submit(2, 100, 8) for _ in range(6)]
        c.step()
        running = {j: c.daemon.job(j).run for j in ids if c.state(j) == "running"}
        assert running
        c.restart()
        assert {j: c.daemon.job(j).run for j in ids if c.state(j) == "running"} == running
        c.run_until(lambda: all(c.state(j) == "done" for j in ids))
        assert all(c.daemon.job(j).run == 1 for j in ids)
    finally:
        c.close()


def test_standby_takes_over_and_the_old_leader_cannot_write(tmp_path: Path, dsn: str) -> None:
    c = Cluster(tmp_path, {"n1": 2}, store_url=dsn)
    try:
        _takeover(c, dsn)
    finally:
        c.close()


def _takeover(c: Cluster, dsn: str) -> None:
    first = c.submit(1, 50, 100)
    c.step()
    standby = Daemon(replace(c.config, holder="test-b"), open_store(dsn), clock=c.clock, policy=c.policy)
    try:
        _check_takeover(c, standby, first)
    finally:
        standby.store.close()


def _check_takeover(c: Cluster, standby: Daemon, first: str) -> None:
    assert standby.start() is False
    with pytest.raises(NotLeader):
        standby.submit([{"procs": 1, "estimate": 5}])
    c.clock.advance(c.config.lease_ttl_s + 0.5)  # the leader hangs: no renewals
    assert standby.try_lead()
    assert standby.epoch == c.daemon.epoch + 1
    assert standby.job(first).state == "running"  # the standby loaded the leader's state
    second = standby.submit([{"procs": 1, "estimate": 5}])[0].id
    with pytest.raises(LeaseLost):
        c.daemon.submit([{"procs": 1, "estimate": 5}])
    assert not c.daemon.leader  # it stepped down
    ids = [j.id for j in standby.store.load_jobs()]
    assert ids == [first, second]
