"""The state store suite, run against SQLite and PostgreSQL (started by the test in a temp dir)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmctl.errors import LeaseLost, SchemaVersionError, StoreError
from vmctl.store import JobRecord, NodeRecord, OperationRecord, TokenRecord, WriteBatch, open_store
from vmctl.store.base import Slot, Store
from vmctl.store.sql import SUPPORTED_VERSION


def _job(i: int, state: str = "queued") -> JobRecord:
    return JobRecord(id=str(i), seq=i, name=f"j{i}", spec={"procs": 2, "estimate": 10.0}, state=state,
                     submit_time=float(i), slots=[Slot("n1", 0, 0), Slot("n1", 1, 0)] if state == "running" else [])


def test_migrate_is_idempotent_and_versioned(store_url: str) -> None:
    s = open_store(store_url)
    assert s.schema_version() == 0
    assert s.migrate() == SUPPORTED_VERSION
    assert s.migrate() == SUPPORTED_VERSION
    assert s.schema_version() == SUPPORTED_VERSION
    s.close()


def test_newer_schema_is_refused(store: Store) -> None:
    epoch = store.acquire_lease("a", 10, 0)
    assert epoch is not None
    # simulate a database written by a newer vmctl
    from vmctl.store.sql import SqlStore

    assert isinstance(store, SqlStore)
    with store._transaction() as cur:
        store._exec(cur, "INSERT INTO schema_version (version, applied) VALUES (?, ?)", (SUPPORTED_VERSION + 5, "x"))
    with pytest.raises(SchemaVersionError, match="newer"):
        store.migrate()


def test_lease_is_exclusive_until_it_expires(store: Store) -> None:
    e1 = store.acquire_lease("a", ttl=10, now=100)
    assert e1 == 1
    assert store.acquire_lease("b", ttl=10, now=105) is None
    assert store.acquire_lease("a", ttl=10, now=105) == 1  # the holder keeps its epoch
    store.renew_lease("a", 1, ttl=10, now=109)  # now expires at 119
    assert store.acquire_lease("b", ttl=10, now=118) is None
    e2 = store.acquire_lease("b", ttl=10, now=120)
    assert e2 == 2
    with pytest.raises(LeaseLost):
        store.renew_lease("a", 1, ttl=10, now=121)
    lease = store.lease()
    assert (lease.holder, lease.epoch) == ("b", 2)
    store.release_lease("b", 2)
    assert store.acquire_lease("c", ttl=10, now=121) == 3


def test_write_with_a_stale_epoch_changes_nothing(store: Store) -> None:
    e1 = store.acquire_lease("a", 1, 0)
    assert e1 is not None
    store.write(e1, WriteBatch(jobs={"1": _job(1)}))
    e2 = store.acquire_lease("b", 1, 10)
    assert e2 == e1 + 1
    with pytest.raises(LeaseLost, match="superseded"):
        store.write(e1, WriteBatch(jobs={"2": _job(2)}, kv={"x": 1}))
    assert [j.id for j in store.load_jobs()] == ["1"]
    assert store.get_kv("x") is None


def test_batch_round_trip(store: Store) -> None:
    e = store.acquire_lease("a", 10, 0)
    assert e is not None
    run = _job(7, "running")
    run.tasks = [{"index": 0, "exit_status": None, "error": None}, {"index": 1, "exit_status": 0, "error": None}]
    node = NodeRecord(name="n1", cores=4, generation=3, hostname="h1", backend="mock")
    op = OperationRecord(id="op1", kind="migrate", job_id="7", state="pending", created=1.0, updated=1.0,
                         detail={"moves": [{"index": 0, "from": ["n1", 0], "to": ["n2", 1]}]})
    tok = TokenRecord(hash="ab" * 32, name="ops", role="read", created=5.0, expires=None)
    store.write(e, WriteBatch(jobs={"7": run, "1": _job(1)}, nodes={"n1": node},
                              desired={"n1": (3, {"node": "n1", "generation": 3, "vms": []})},
                              operations={"op1": op}, kv={"policy": {"name": "easy", "params": {}}}, tokens=[tok]))
    jobs = store.load_jobs()
    assert [j.id for j in jobs] == ["1", "7"]  # by sequence
    assert jobs[1] == run
    assert jobs[1].placement == [("n1", 0), ("n1", 1)]
    assert store.load_nodes() == [node]
    assert store.load_desired() == {"n1": (3, {"node": "n1", "generation": 3, "vms": []})}
    assert store.load_operations() == [op]
    assert store.get_kv("policy") == {"name": "easy", "params": {}}
    assert store.find_token("ab" * 32) == tok
    assert store.find_token("cd" * 32) is None
    # upsert
    run.state = "done"
    store.write(e, WriteBatch(jobs={"7": run}, delete_tokens=[tok.hash]))
    assert store.load_jobs()[1].state == "done"
    assert store.list_tokens() == []


def test_a_failing_batch_is_rolled_back_whole(store: Store) -> None:
    e = store.acquire_lease("a", 10, 0)
    assert e is not None
    tok = TokenRecord(hash="ff" * 32, name="t", role="admin", created=1.0, expires=None)
    store.write(e, WriteBatch(tokens=[tok]))
    with pytest.raises(StoreError):
        # the duplicate token hash fails after the job was written in the same transaction
        store.write(e, WriteBatch(jobs={"9": _job(9)}, tokens=[tok]))
    assert store.load_jobs() == []
    # the store is still usable afterwards
    store.write(e, WriteBatch(jobs={"9": _job(9)}))
    assert [j.id for j in store.load_jobs()] == ["9"]


def test_bad_store_url_names_the_key() -> None:
    from vmctl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"store\.url"):
        open_store("mysql://x/y", config_path="d.yaml")


def test_sqlite_unwritable_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot open"):
        open_store(f"sqlite:///{blocker}/sub/s.db")
