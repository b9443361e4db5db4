"""The store's side of issue 9, items 5, 6 and 10: a row that cannot be read back names its table and
row (SQLite and PostgreSQL); the SQLite files are 0600 whatever the umask; tokens are minted without
the lease; backup and restore (the end-to-end run is tests/integration/test_daemon_trust_state.py)."""

from __future__ import annotations

import os
import sqlite3
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import PostgresServer
from vmctl.errors import StoreError
from vmctl.store import JobRecord, NodeRecord, OperationRecord, TokenRecord, WriteBatch, open_store, sqlite_path
from vmctl.store.base import CorruptRecord, LeaseHeld, Store
from vmctl.store.sql import SqlStore
from vmctl.store.sqlite import SqliteStore


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/s.db"
    else:
        pg: PostgresServer = request.getfixturevalue("postgres")
        url = pg.create_db("t" + uuid.uuid4().hex[:12])
    s = open_store(url)
    s.migrate()
    yield s
    s.close()


def _fill(s: Store) -> int:
    epoch = s.acquire_lease("a", 10, 0)
    assert epoch is not None
    s.write(epoch, WriteBatch(
        jobs={"7": JobRecord(id="7", seq=7, name="j", spec={"procs": 1, "estimate": 1.0}, state="queued",
                             submit_time=0.0)},
        nodes={"n1": NodeRecord(name="n1", cores=2)},
        desired={"n1": (3, {"vms": []})},
        operations={"op1": OperationRecord(id="op1", kind="migrate", job_id="7", state="pending", created=0.0,
                                           updated=0.0)},
        kv={"policy": {"name": "fcfs"}},
    ))
    return epoch


def _corrupt(s: Store, sql: str, *params: object) -> None:
    assert isinstance(s, SqlStore)
    with s._transaction() as cur:
        s._exec(cur, sql, params)


@pytest.mark.parametrize(("sql", "load", "table", "row"), [
    ("UPDATE jobs SET doc = ? WHERE id = '7'", "load_jobs", "jobs", "id='7'"),
    ("UPDATE nodes SET doc = ? WHERE name = 'n1'", "load_nodes", "nodes", "name='n1'"),
    ("UPDATE desired SET doc = ? WHERE node = 'n1'", "load_desired", "desired", "node='n1'"),
    ("UPDATE operations SET doc = ? WHERE id = 'op1'", "load_operations", "operations", "id='op1'"),
])
@pytest.mark.parametrize("bad", ['{"id": "7", ', "[1, 2]", '{"unknown_field": 1}'])
def test_an_unreadable_row_names_its_table_and_row(store: Store, sql: str, load: str, table: str, row: str,
                                                   bad: str) -> None:
    _fill(store)
    _corrupt(store, sql, bad)
    if table == "desired" and bad == '{"unknown_field": 1}':
        getattr(store, load)()  # a JSON object: the desired document is checked by the daemon (wire)
        return
    with pytest.raises(CorruptRecord) as exc:
        getattr(store, load)()
    msg = str(exc.value)
    assert f"table {table}, row {row}" in msg and store.location() in msg, msg
    assert exc.value.reference == "store-corrupt" and exc.value.http_status < 500


def test_an_unreadable_kv_value_names_its_key(store: Store) -> None:
    _fill(store)
    _corrupt(store, "UPDATE kv SET value = ? WHERE key = 'policy'", "{nope")
    with pytest.raises(CorruptRecord, match=r"table kv, row key='policy'"):
        store.get_kv("policy")


def test_tokens_are_minted_without_the_lease(store: Store) -> None:
    _fill(store)  # another holder has the lease
    rec = TokenRecord(hash="h" * 64, name="ops", role="admin", created=1.0, expires=None)
    store.insert_token(rec)
    assert store.find_token("h" * 64) == rec


def test_sqlite_files_are_private_under_umask_022(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        s = open_store(f"sqlite:///{tmp_path}/new/s.db")
        s.migrate()
        _fill(s)
        files = [tmp_path / "new" / n for n in ("s.db", "s.db-wal", "s.db-shm")]
        assert all(f.exists() for f in files)
        for f in files:
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
        s.close()
    finally:
        os.umask(old)


def test_an_empty_sqlite_file_stays_empty_until_migrate(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    db.write_bytes(b"")
    s = open_store(str(db))
    assert s.schema_version() == 0
    s.close()
    assert db.stat().st_size == 0
    with pytest.raises(StoreError, match="no database at"):
        open_store(str(tmp_path / "missing.db"), must_exist=True)
    assert not (tmp_path / "missing.db").exists()


def test_sqlite_url_forms() -> None:
    assert sqlite_path("sqlite:////var/lib/vmctl/vmctld.db") == "/var/lib/vmctl/vmctld.db"
    assert sqlite_path("sqlite:///var/lib/vmctl/vmctld.db") == "/var/lib/vmctl/vmctld.db"
    assert sqlite_path("sqlite:rel.db") == "rel.db"
    assert sqlite_path("/abs.db") == "/abs.db"
    assert sqlite_path("postgresql://u@h/db") is None


def test_backup_and_restore(tmp_path: Path) -> None:
    src = SqliteStore(tmp_path / "a.db")
    src.migrate()
    epoch = _fill(src)
    src.write(epoch, WriteBatch(kv={"ca": {"cert_pem": "c", "key_pem": "k"}}))
    backup = tmp_path / "b.db"
    src.backup(backup)
    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        src.backup(backup)
    # the live store moves on, with its lease held
    src.write(epoch, WriteBatch(jobs={"8": JobRecord(id="8", seq=8, name="j", spec={"procs": 1, "estimate": 1.0},
                                                     state="queued", submit_time=0.0)}))
    with pytest.raises(LeaseHeld, match="holds the leader lease"):
        src.restore(backup, now=5.0)
    src.release_lease("a", epoch)
    src.restore(backup, now=5.0)
    assert [j.id for j in src.load_jobs()] == ["7"]
    lease = src.lease()
    assert lease.holder is None and lease.epoch > epoch
    assert src.acquire_lease("b", 10, 6.0) == lease.epoch + 1
    src.close()
    # not a backup
    junk = tmp_path / "junk.db"
    with sqlite3.connect(junk) as c:
        c.execute("CREATE TABLE t (x)")
    c.close()
    other = SqliteStore(tmp_path / "c.db")
    with pytest.raises(StoreError, match="not a vmctld backup"):
        other.restore(junk)
    other.close()
