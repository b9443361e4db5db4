"""A damaged or rolled-back store is never served (issue 23, items 1 and 2), on real ``vmctld``
processes (loopback HTTPS, SQLite in a temporary state directory; PostgreSQL started by the test),
each stopped or killed by its pid.

- Garbage in an index page of ``events``: the start is refused (exit 2, ``store-damaged`` naming the
  file and the table), every file left as it was. Before: vmctld started, ``/healthz`` said ok, and
  ``POST /v1/jobs`` / ``GET /v1/events`` answered 500.
- The same damage found while vmctld runs: ``/healthz`` 503, the lease given up, every request 503
  ``store-damaged`` (no 500); after a restore from a backup, vmctld starts again.
- A WAL lost after kill -9 (main file 47 of 64 acknowledged jobs): refused (exit 2, ``state-conflict``
  naming the missing jobs), every file byte-identical; ``vmctld accept-rollback`` accepts it with an event.
  Before: vmctld started silently and served 47 jobs.
- An older copy of the database put in place is refused; ``vmctld restore`` of the same backup is not.
- PostgreSQL: an older dump restored with ``pg_restore`` is refused by both daemons' state directories;
  the documented procedure (``pg_restore``, then ``vmctld accept-rollback``) is not.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.integration.test_daemon_api import check_openapi
from tests.integration.test_daemon_trust_state import Vmctld, digest, submit, vmctld_cmd, write_config
from tests.support.daemon import PostgresServer


def snapshot(state: Path) -> dict[str, str]:
    """Every file of the state directory and its digest."""
    return {p.name: digest(p) for p in sorted(state.iterdir())}


def damage_index_page(db: Path, index: str = "events_time") -> int:
    """Garbage over the page header of ``index``'s root page (a leaf while the log is small), as a disk
    or a stray write would leave it; returns the page number."""
    with sqlite3.connect(db) as c:
        root = int(c.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (index,)).fetchone()[0])
        size = int(c.execute("PRAGMA page_size").fetchone()[0])
    c.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\x00" + bytes(range(7, 207)))
        f.flush()
        os.fsync(f.fileno())
    return root


def lease_holder(db: Path) -> str | None:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as c:
        holder = c.execute("SELECT holder FROM lease WHERE id = 1").fetchone()[0]
    c.close()
    return None if holder is None else str(holder)


def event_kinds(d: Vmctld) -> list[str]:
    status, body = d.request("GET", "/v1/events?limit=1000")
    assert status == 200, body
    return [e["kind"] for e in body["events"]]


@pytest.fixture
def daemon(tmp_path: Path) -> Vmctld:
    d = Vmctld(write_config(tmp_path / "etc" / "vmctld.yaml", tmp_path / "state"), tmp_path / "vmctld.log")
    yield d  # type: ignore[misc]
    d.stop()


# ------------------------------------------------------------------------------------- item 1


def test_damaged_index_page_is_refused_at_start_naming_the_file(daemon: Vmctld) -> None:
    state = daemon.state_dir
    daemon.start_ready()
    submit(daemon, 5)
    assert daemon.stop() == 0
    db = state / "vmctld.db"
    page = damage_index_page(db)
    before = snapshot(state)
    r = vmctld_cmd("--config", str(daemon.config))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert f"error: store-damaged: sqlite: {db}: the database is damaged" in r.stderr, r.stderr
    assert "table events" in r.stderr and f"Page {page}" in r.stderr, r.stderr
    assert "vmctld restore" in r.stderr, r.stderr
    assert snapshot(state) == before  # nothing written, nothing created (no -wal, no -shm left)


def test_damage_found_at_run_time_gives_up_the_lease_and_answers_503(tmp_path: Path, daemon: Vmctld) -> None:
    state = daemon.state_dir
    db = state / "vmctld.db"
    daemon.start_ready()
    before = submit(daemon, 3)
    backup = tmp_path / "backup.db"
    assert vmctld_cmd("backup", str(backup), "--config", str(daemon.config)).returncode == 0
    assert daemon.stop() == 0  # checkpointed: the pages are in the main file
    daemon.start_ready()  # sound at start
    assert daemon.request("GET", "/healthz") == (200, {"status": "ok", "leader": True})
    damage_index_page(db)
    # another process writes to the database (an offline token), so the daemon reads its pages anew
    r = vmctld_cmd("token", "create", "--config", str(daemon.config), "--name", "ops")
    assert r.returncode == 0, r.stderr
    status, body = daemon.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60})
    assert status == 503 and body["error"]["reference"] == "store-damaged", body
    assert str(db) in body["error"]["message"] and "malformed" in body["error"]["message"], body
    assert daemon.request("GET", "/healthz") == (503, {"status": "store-damaged", "leader": False})
    check_openapi("GET", "/healthz", 503, {"status": "store-damaged", "leader": False})
    for method, path in (("GET", "/v1/health"), ("GET", "/v1/events"), ("GET", "/v1/jobs"), ("POST", "/v1/jobs")):
        status, body = daemon.request(method, path, {"procs": 1, "estimate": 60} if method == "POST" else None)
        assert status == 503 and body["error"]["reference"] == "store-damaged", (method, path, body)
        check_openapi(method, path, status, body)
    assert lease_holder(db) is None  # given up at once, not left to expire
    log = daemon.log_path.read_text()
    assert "released the leader lease" in log and "Traceback" not in log, log
    assert daemon.proc is not None and daemon.proc.poll() is None  # alive, for the operator to see
    assert daemon.stop() == 0
    r = vmctld_cmd("--config", str(daemon.config))  # a restart is refused
    assert r.returncode == 2 and "error: store-damaged" in r.stderr, r.stderr
    # the way out the message names: restore the backup, start
    r = vmctld_cmd("restore", str(backup), "--config", str(daemon.config))
    assert r.returncode == 0, r.stderr
    daemon.start_ready()
    assert daemon.job_ids() == sorted(before)
    assert daemon.request("GET", "/healthz") == (200, {"status": "ok", "leader": True})
    assert "store.restored" in event_kinds(daemon)


# ------------------------------------------------------------------------------------- item 2


def test_lost_wal_after_kill9_is_refused_with_what_is_missing(daemon: Vmctld) -> None:
    state = daemon.state_dir
    daemon.start_ready()
    kept = submit(daemon, 47)
    assert daemon.stop() == 0  # a clean stop checkpoints: the main file holds these 47
    daemon.start_ready()
    lost = submit(daemon, 17)
    daemon.kill9()  # the last 17 acknowledged jobs are in the WAL only
    wal = state / "vmctld.db-wal"
    assert wal.stat().st_size > 0
    wal.unlink()
    # the shared-memory index of the lost WAL: SQLite drops it when its last connection closes
    (state / "vmctld.db-shm").unlink(missing_ok=True)
    before = snapshot(state)
    assert set(before) == {"vmctld.db", "store.highwater", "ca.pem", "admin.token"}
    for _ in range(2):  # refused, and refused again: the refusal changes nothing
        r = vmctld_cmd("--config", str(daemon.config))
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr
        assert "error: state-conflict" in r.stderr and "is older than what this state directory last saw" in r.stderr
        assert f"job(s) {len(kept) + 1} to {len(kept) + len(lost)}" in r.stderr, r.stderr
        assert str(state / "store.highwater") in r.stderr and "vmctld accept-rollback" in r.stderr, r.stderr
        assert "vmctld restore" in r.stderr, r.stderr
        assert snapshot(state) == before  # vmctld.db and store.highwater byte-identical, no -wal created

    # the operator accepts the loss explicitly: an event says what was lost
    r = vmctld_cmd("accept-rollback", "--config", str(daemon.config))
    assert r.returncode == 0, r.stderr
    assert "rollback accepted" in r.stdout and f"job(s) {len(kept) + 1} to {len(kept) + len(lost)}" in r.stdout
    daemon.start_ready()
    assert daemon.job_ids() == sorted(kept)
    status, body = daemon.request("GET", "/v1/events?limit=1000")
    assert status == 200, body
    accepted = [e for e in body["events"] if e["kind"] == "store.rollback_accepted"]
    assert len(accepted) == 1 and "lost" in accepted[0]["message"], accepted
    assert accepted[0]["actor"] == "operator (vmctld accept-rollback)"
    # the job numbers go on from the store's: a new job is 48, not 65
    assert submit(daemon, 1) == [str(len(kept) + 1)]
    # a second accept-rollback has nothing to accept
    assert daemon.stop() == 0
    r = vmctld_cmd("accept-rollback", "--config", str(daemon.config))
    assert r.returncode == 0 and "nothing to accept" in r.stdout, r.stdout


def test_older_copy_of_the_store_is_refused_but_restore_of_it_is_not(tmp_path: Path, daemon: Vmctld) -> None:
    state = daemon.state_dir
    daemon.start_ready()
    old = submit(daemon, 3)
    backup = tmp_path / "backup.db"
    assert vmctld_cmd("backup", str(backup), "--config", str(daemon.config)).returncode == 0
    submit(daemon, 2)
    assert daemon.stop() == 0
    # the backup copied over the database by hand: an older store
    saved = tmp_path / "newer.db"
    shutil.copyfile(state / "vmctld.db", saved)
    shutil.copyfile(backup, state / "vmctld.db")
    r = vmctld_cmd("--config", str(daemon.config))
    assert r.returncode == 2 and "error: state-conflict" in r.stderr and "job(s) 4 to 5" in r.stderr, r.stderr
    # the documented procedure (vmctld restore) is a deliberate rollback: accepted
    shutil.copyfile(saved, state / "vmctld.db")
    r = vmctld_cmd("restore", str(backup), "--config", str(daemon.config))
    assert r.returncode == 0, r.stderr
    daemon.start_ready()
    assert daemon.job_ids() == sorted(old)
    kinds = event_kinds(daemon)
    assert kinds.count("store.restored") == 1 and "store.rollback_accepted" not in kinds
    assert daemon.stop() == 0


# ------------------------------------------------------------------------------------- PostgreSQL


@pytest.mark.postgres
def test_postgres_older_dump_is_refused_and_the_documented_restore_is_not(tmp_path: Path,
                                                                           postgres: PostgresServer) -> None:
    """Two daemons (leader and standby, each with its own state directory) on one database: a dump
    restored with ``pg_restore`` is refused by both; the procedure of docs/operations.md (``pg_restore``,
    then ``vmctld accept-rollback`` on one host) is accepted by both."""
    assert postgres.bin is not None
    dsn = postgres.create_db("r" + uuid.uuid4().hex[:12])
    a = Vmctld(write_config(tmp_path / "a.yaml", tmp_path / "a", store={"url": dsn},
                            lease={"holder": "host-a"}),
               tmp_path / "a.log")
    b = Vmctld(write_config(tmp_path / "b.yaml", tmp_path / "b", store={"url": dsn},
                            lease={"holder": "host-b"}),
               tmp_path / "b.log")
    try:
        a.start_ready()
        old = submit(a, 3)
        dump = tmp_path / "vmctl.dump"
        r = subprocess.run([str(postgres.bin / "pg_dump"), "--format=custom", f"--file={dump}", dsn],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        submit(a, 2)
        b.start_ready()  # a standby: its state directory sees the store too
        assert a.stop() == 0 and b.stop() == 0
        r = subprocess.run([str(postgres.bin / "pg_restore"), "--clean", "--if-exists", f"--dbname={dsn}", str(dump)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        for d in (a, b):
            r = vmctld_cmd("--config", str(d.config))
            assert r.returncode == 2 and "error: state-conflict" in r.stderr, r.stderr
            assert "job(s) 4 to 5" in r.stderr and "vmctld accept-rollback" in r.stderr, r.stderr
        r = vmctld_cmd("accept-rollback", "--config", str(a.config))
        assert r.returncode == 0, r.stderr
        a.start_ready()
        assert a.job_ids() == sorted(old)
        assert "store.rollback_accepted" in event_kinds(a)
        b.start_ready()  # the other host accepts the new timeline
        assert "restored or rolled back deliberately" in b.log_path.read_text()
    finally:
        a.stop()
        b.stop()


def test_a_damaged_high_water_mark_is_refused_until_accepted(daemon: Vmctld) -> None:
    mark = daemon.state_dir / "store.highwater"
    daemon.start_ready()
    ids = submit(daemon, 2)
    assert daemon.stop() == 0
    text = mark.read_text()
    mark.write_text(text.replace("commits=0", "commits=9", 1))  # edited: its CRC no longer matches
    r = vmctld_cmd("--config", str(daemon.config))
    assert r.returncode == 2 and "error: state-conflict" in r.stderr and str(mark) in r.stderr, r.stderr
    assert "not a store high-water mark vmctld wrote" in r.stderr, r.stderr
    r = vmctld_cmd("accept-rollback", "--config", str(daemon.config))
    assert r.returncode == 0 and "the high-water mark was unreadable" in r.stdout, r.stdout
    daemon.start_ready()
    assert daemon.job_ids() == sorted(ids)
    assert daemon.stop() == 0
    mark.unlink()  # a state directory that saw nothing: nothing to accept, nothing changed
    r = vmctld_cmd("accept-rollback", "--config", str(daemon.config))
    assert r.returncode == 0 and "nothing to accept" in r.stdout and not mark.exists(), r.stdout
