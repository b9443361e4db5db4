"""The store's position and the state directory's high-water mark (issue 23, item 2), the bounded
integrity check and a store found damaged while the daemon runs (item 1), on real SQLite files and
PostgreSQL databases (``store_url`` runs each test on both where it applies)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from tests.support.daemon import queued_daemon
from vmctl.clock import VirtualClock
from vmctl.daemon import statedir
from vmctl.daemon.config import DaemonConfig
from vmctl.errors import StoreError
from vmctl.store import JobRecord, TokenRecord, WriteBatch, open_store
from vmctl.store.base import EventRecord, LeaseHeld, Store, StoreDamaged, StorePosition
from vmctl.store.sql import SqlStore
from vmctl.store.sqlite import SqliteStore


def _job(i: int) -> JobRecord:
    return JobRecord(id=str(i), seq=i, name=f"j{i}", spec={"procs": 1, "estimate": 10.0}, state="queued",
                     submit_time=float(i))


def _event(seq: int) -> EventRecord:
    return EventRecord(seq=seq, time=float(seq), kind="job.submitted", message=f"job {seq} submitted")


def test_older_than_compares_timeline_then_commits() -> None:
    seen = StorePosition(2, 10)
    assert StorePosition(2, 9).older_than(seen)
    assert StorePosition(1, 500).older_than(seen)  # an earlier timeline: older whatever its commits
    assert not StorePosition(2, 10).older_than(seen)
    assert not StorePosition(2, 11).older_than(seen)
    assert not StorePosition(3, 0).older_than(seen)  # a deliberate rollback made since


def test_every_leader_commit_advances_the_position(store: Store) -> None:
    seen: list[StorePosition] = []
    store.on_commit = seen.append
    assert store.position() == StorePosition(1, 0)
    epoch = store.acquire_lease("a", 30.0, 100.0)
    assert epoch is not None
    store.renew_lease("a", epoch, 30.0, 101.0)
    assert store.position() == StorePosition(1, 0)  # lease traffic is not a commit
    store.write(epoch, WriteBatch(jobs={"1": _job(1), "2": _job(2)}, events=[_event(1), _event(2)]))
    store.write(epoch, WriteBatch(jobs={"3": _job(3)}))
    store.prune_jobs(epoch, [_job(1)], archive=True)
    store.prune_events(epoch, 1.5)
    assert [p.commits for p in seen] == [1, 2, 3, 4]
    assert seen[-1] == StorePosition(1, 4, job=3, event=2)
    assert store.position() == StorePosition(1, 4, job=3, event=2)
    store.write(epoch, WriteBatch())  # nothing to write: no commit
    assert len(seen) == 4


def test_fork_timeline_is_refused_while_a_lease_runs_and_logs_its_event(store: Store) -> None:
    epoch = store.acquire_lease("a", 30.0, 100.0)
    assert epoch is not None
    store.write(epoch, WriteBatch(jobs={"1": _job(1)}, events=[_event(1)]))
    with pytest.raises(LeaseHeld):
        store.fork_timeline(0, "store.rollback_accepted", "accepted", "operator", 110.0)
    pos = store.fork_timeline(4, "store.rollback_accepted", "accepted", "operator", 200.0)  # the lease expired
    assert (pos.timeline, pos.commits, pos.job, pos.event) == (5, 2, 1, 2)
    assert store.lease().holder is None
    ev = store.list_events(after=1)
    assert [(e.seq, e.kind, e.message, e.actor) for e in ev] == [(2, "store.rollback_accepted", "accepted", "operator")]


def _cfg(tmp_path: Path) -> DaemonConfig:
    return DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"))


def test_highwater_file_is_fixed_width_never_lowered_and_checked(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    (tmp_path / "state").mkdir()
    hw = statedir.HighWater(cfg)
    assert statedir.read_highwater(cfg) is None
    hw.record(StorePosition(1, 7, job=3, event=9))
    size = hw.path.stat().st_size
    hw.record(StorePosition(1, 123456, job=40, event=99))
    hw.record(StorePosition(1, 100))  # lower: ignored
    assert hw.path.stat().st_size == size and hw.path.stat().st_mode & 0o777 == 0o600
    assert statedir.read_highwater(cfg) == StorePosition(1, 123456, job=40, event=99)
    hw.record(StorePosition(2, 1))  # a new timeline is higher
    hw.close()
    assert statedir.read_highwater(cfg) == StorePosition(2, 1)
    text = hw.path.read_text()
    hw.path.write_text(text.replace("commits=00000000000000000001", "commits=00000000000000000009"))
    with pytest.raises(statedir.StateConflict, match="not a store high-water mark vmctld wrote"):
        statedir.read_highwater(cfg)
    hw.path.write_text("")
    with pytest.raises(statedir.StateConflict, match="vmctld accept-rollback"):
        statedir.read_highwater(cfg)


def test_refuse_rollback_names_what_is_missing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(tmp_path)
    (tmp_path / "state").mkdir()
    store = open_store(cfg.store_url)
    try:
        store.migrate()
        assert statedir.refuse_rollback(cfg, store) is None  # no mark: nothing to compare
        epoch = store.acquire_lease("a", 30.0, 100.0)
        assert epoch is not None
        for i in range(1, 4):
            store.write(epoch, WriteBatch(jobs={str(i): _job(i)}, events=[_event(i)]))
        statedir.write_highwater(cfg, StorePosition(1, 5, job=5, event=6))
        with pytest.raises(statedir.StateConflict) as exc:
            statedir.refuse_rollback(cfg, store)
        msg = str(exc.value)
        assert "2 committed change(s) (commits 4 to 5); job(s) 4 to 5; event(s) 4 to 6" in msg, msg
        assert "vmctld accept-rollback" in msg and "vmctld restore" in msg and "-wal" in msg
        statedir.write_highwater(cfg, StorePosition(1, 3, job=3, event=3))
        assert statedir.refuse_rollback(cfg, store) == StorePosition(1, 3, job=3, event=3)
        statedir.write_highwater(cfg, StorePosition(2, 1))  # the store is on an earlier timeline
        with pytest.raises(statedir.StateConflict, match="older than timeline 2"):
            statedir.refuse_rollback(cfg, store)
        store.release_lease("a", epoch)
        store.fork_timeline(2, "store.restored", "restored", "operator", 200.0)  # timeline 3
        with caplog.at_level(logging.WARNING, "vmctld"):
            assert statedir.refuse_rollback(cfg, store) is not None
        assert "restored or rolled back deliberately" in caplog.text
    finally:
        store.close()


def test_a_store_older_than_schema_7_next_to_a_mark_is_refused(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    (tmp_path / "state").mkdir()
    db = tmp_path / "d.db"
    with sqlite3.connect(db) as c:  # a schema-6 store (an old backup copied in)
        c.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied TEXT)")
        c.execute("INSERT INTO schema_version VALUES (6, 'x')")
    c.close()
    statedir.write_highwater(cfg, StorePosition(1, 2))
    store = open_store(cfg.store_url)
    try:
        assert store.position() is None
        with pytest.raises(statedir.StateConflict, match="predates schema 7"):
            statedir.refuse_rollback(cfg, store)
    finally:
        store.close()


# ------------------------------------------------------------------------------------- damage


def test_integrity_check_stops_at_its_time_budget(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "big.db")
    try:
        store.migrate()
        epoch = store.acquire_lease("a", 30.0, 100.0)
        assert epoch is not None
        for k in range(5):  # ~20 MB: its check takes far longer than the budget below
            store.write(epoch, WriteBatch(events=[_event(i) for i in range(k * 40000 + 1, (k + 1) * 40000 + 1)]))
        full = store.check(0)
        assert full.problems == [] and full.unchecked == [] and "events" in full.checked
        cut = store.check(0.001)  # interrupted: the tables it did not reach are named
        assert cut.problems == [] and cut.unchecked and "events" in cut.unchecked + cut.checked
        assert set(cut.checked) | set(cut.unchecked) == set(full.checked)
    finally:
        store.close()


def _damage(db: Path, name: str) -> None:
    with sqlite3.connect(db) as c:
        root = int(c.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)).fetchone()[0])
        size = int(c.execute("PRAGMA page_size").fetchone()[0])
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    c.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\x00" * 64)


def test_a_daemon_whose_store_is_found_damaged_gives_up_the_lease(tmp_path: Path) -> None:
    from vmctl.daemon.base import NotLeader

    clock = VirtualClock(1000.0)
    d = queued_daemon(tmp_path, clock, "h1")
    stepped_down: list[bool] = []
    d.on_step_down = lambda: stepped_down.append(True)
    try:
        d.submit([{"procs": 1, "estimate": 60}])
        db = tmp_path / "d.db"
        _damage(db, "events_time")
        # another connection's write: the daemon's connection reads its pages anew
        other = SqliteStore(db)
        other.insert_token(_token())
        other.close()
        with pytest.raises(StoreDamaged) as exc:
            d.submit([{"procs": 1, "estimate": 60}])
        assert str(db) in str(exc.value) and exc.value.http_status == 503
        assert d.damaged is not None and not d.leader and stepped_down == [True]
        assert d.store.lease().holder is None  # released, not left to expire
        assert not d.try_lead()  # never campaigns again
        with pytest.raises(StoreDamaged):
            d._require_leader()
        with pytest.raises((StoreDamaged, NotLeader)):
            d.submit([{"procs": 1, "estimate": 60}])
        assert len(stepped_down) == 1
        # the store stays damaged at the next start: refused
        with pytest.raises(StoreDamaged, match="PRAGMA quick_check found: table events"):
            statedir.refuse_damaged(d.config, d.store)
    finally:
        d.close()
        d.store.close()


def _token() -> TokenRecord:
    return TokenRecord(hash="h" * 64, name="t", role="read", created=1.0, expires=None)


def test_store_errors_that_are_not_damage_stay_store_errors(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    try:
        store.migrate()
        with pytest.raises(StoreError) as exc, store._read() as cur:
            cur.execute("SELECT nothing FROM nowhere")
        assert not isinstance(exc.value, StoreDamaged) and store.damaged is None
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_damage_errors_are_store_damaged(postgres: object) -> None:
    """PostgreSQL reports a damaged page or index with SQLSTATE XX001/XX002: ``StoreDamaged``, reported
    once to ``on_damaged``; other errors stay ``StoreError``."""
    import uuid

    import psycopg

    from tests.support.daemon import PostgresServer

    assert isinstance(postgres, PostgresServer)
    store = open_store(postgres.create_db("x" + uuid.uuid4().hex[:12]))
    found: list[StoreDamaged] = []
    store.on_damaged = found.append
    try:
        store.migrate()
        assert isinstance(store, SqlStore)
        err = store._translate(psycopg.errors.UniqueViolation("duplicate key"))
        assert type(err) is StoreError
        for exc in (psycopg.errors.IndexCorrupted('index "events_time" contains unexpected zero page at block 3'),
                    psycopg.errors.DataCorrupted('invalid page in block 7 of relation base/16384/16410')):
            with pytest.raises(StoreDamaged) as raised, store._read():
                raise store._translate(exc)
            assert "the database is damaged" in str(raised.value) and raised.value.http_status == 503
        assert len(found) == 1  # the first damage is reported, once
    finally:
        store.close()


def test_agents_ahead_of_a_rolled_back_store_get_a_newer_generation(tmp_path: Path) -> None:
    """After a deliberate rollback the store's desired generations are behind what the agents applied
    (an agent long-polls for generations above its own, so it would ignore the store's): the first report
    of such an agent makes vmctld write its node's desired state again above it, with an event, and the
    VM of the job the store lost is removed."""
    from tests.unit.test_daemon_core import Cluster

    c = Cluster(tmp_path, {"n1": 2})
    try:
        a = c.submit(1, 1000, 500)
        c.run_until(lambda: c.state(a) == "running")
        store = c.daemon.store
        assert isinstance(store, SqliteStore)
        store.write(c.daemon.epoch, WriteBatch(kv={"ca": {"cert_pem": "-"}}))  # restore wants a cluster CA
        backup = tmp_path / "backup.db"
        store.backup(backup)
        b = c.submit(1, 1000, 500)
        c.run_until(lambda: c.state(b) == "running")
        rep, be = c.agents["n1"][2], c.agents["n1"][3]
        assert rep.last is not None
        applied = rep.last.generation_applied
        assert any(v.startswith(f"j{b}-") for v in (x.name for x in be.list_vms()))
        c.daemon.close()
        store.restore(backup, now=c.clock.now())
        store.fork_timeline(0, "store.restored", "restored", "test", c.clock.now())
        c.restart()
        assert c.daemon.state.generation["n1"] < applied and b not in c.daemon.state.jobs
        c.daemon.report(rep.last)  # the agent's next report (it still holds the generation it applied)
        assert c.daemon.state.generation["n1"] > applied
        kinds = [e.kind for e in c.daemon.store.list_events(after=0, limit=10000)]
        assert kinds.count("node.resynced") == 1
        c.step()
        names = [x.name for x in be.list_vms()]
        assert not any(n.startswith(f"j{b}-") for n in names), names  # the lost job's VM is gone
        assert any(n.startswith(f"j{a}-") for n in names)
        assert c.state(a) == "running"
    finally:
        c.close()
