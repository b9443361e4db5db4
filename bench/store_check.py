"""What the store's safety checks cost (``python -m bench.store_check [--mb N] [--quick]``).

1. The start-up integrity check (``statedir.refuse_damaged`` -> ``SqliteStore.check``: ``PRAGMA
   quick_check`` table by table) on a large store: ``--mb`` MB (default 1,024) of archived jobs and events
   written into a SQLite file in a temp dir. Timed from the page cache (warm: the file was just read) and
   from disk (cold: the file's pages dropped from the page cache with ``posix_fadvise(DONTNEED)``, which
   touches no other file), with no limit and with the default budget (``store.check_timeout_s``, 30 s),
   which interrupts it and names the tables it did not reach.
2. The cost per commit of the store position (schema 007: one more UPDATE in each leader transaction) and
   of the state directory's high-water mark (``statedir.HighWater``: a ``pwrite`` of one line after each
   commit, an fsync at most once a second): ``store.write`` of one job, 3,000 times, without and with the
   mark attached.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from vmctl.daemon import statedir
from vmctl.daemon.config import DaemonConfig
from vmctl.model import JobState
from vmctl.store import JobRecord, WriteBatch
from vmctl.store.sqlite import SqliteStore


def build(path: Path, mb: int) -> int:
    """A migrated store grown to ``mb`` MB with archived jobs and events; returns the rows of each."""
    s = SqliteStore(path)
    s.migrate()
    s.close()
    c = sqlite3.connect(path)
    c.execute("PRAGMA synchronous=OFF")
    history = [{"time": 1.0, "event": "started", "detail": f"node-{i} core {i}"} for i in range(12)]
    doc = json.dumps({"id": "x", "spec": {"procs": 4, "estimate": 3600, "user": "alice"}, "history": history})
    ev = json.dumps({"message": "job 123456 (a-job-name) started on node-17 cores 0-3", "job_id": "123456",
                     "node": "node-17", "actor": "vmctld"})
    n = 0
    while os.path.getsize(path) < mb * 2**20:
        c.execute("BEGIN")
        c.executemany("INSERT INTO job_archive (id, seq, state, end_time, doc) VALUES (?, ?, 'done', ?, ?)",
                      ((str(n + k), n + k, float(n + k), doc) for k in range(20000)))
        c.executemany("INSERT INTO events (seq, time, kind, doc) VALUES (?, ?, 'job.started', ?)",
                      ((n + k, float(n + k), ev) for k in range(20000)))
        c.execute("COMMIT")
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        n += 20000
    c.close()
    return n


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def check_times(path: Path, budget: float) -> None:
    size = os.path.getsize(path) / 2**20
    s = SqliteStore(path)
    try:
        for cold, limit in ((False, 0.0), (False, budget), (True, 0.0), (True, budget)):
            if cold:
                drop_cache(path)
            else:
                s.check(0)  # read once: the pages are cached
            r = s.check(limit)
            left = f"not reached: {', '.join(r.unchecked)}" if r.unchecked else "complete"
            print(f"  {'cold' if cold else 'warm'} cache, {'no limit' if limit <= 0 else f'budget {limit:g} s'}: "
                  f"{r.seconds:.2f} s for {size:.0f} MB ({size / max(r.seconds, 1e-9):.0f} MB/s), {left}, "
                  f"{len(r.problems)} problem(s)")
    finally:
        s.close()


def commit_cost(tmp: Path, commits: int) -> None:
    def job(i: int) -> JobRecord:
        return JobRecord(id=str(i), seq=i, name=f"j{i}", spec={"procs": 1, "estimate": 10.0},
                         state=JobState.QUEUED, submit_time=float(i))

    for mark in (False, True):
        d = Path(tempfile.mkdtemp(dir=tmp))
        s = SqliteStore(d / "s.db")
        s.migrate()
        hw = statedir.HighWater(DaemonConfig(state_dir=str(d)))
        if mark:
            hw.attach(s)
        epoch = s.acquire_lease("bench", 3600.0, time.time())
        assert epoch is not None
        took = []
        for i in range(1, commits + 1):
            t = time.perf_counter()
            s.write(epoch, WriteBatch(jobs={str(i): job(i)}))
            took.append(time.perf_counter() - t)
        hw.close()
        s.close()
        took.sort()
        print(f"  store.write of one job, {'with' if mark else 'without'} the high-water mark: "
              f"p50 {statistics.median(took) * 1e6:.0f} us, p99 {took[int(len(took) * 0.99)] * 1e6:.0f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=1024, help="size of the large store (MB)")
    ap.add_argument("--budget", type=float, default=DaemonConfig().store_check_timeout_s)
    ap.add_argument("--quick", action="store_true", help="a 64 MB store and 500 commits")
    args = ap.parse_args()
    mb, commits = (64, 500) if args.quick else (args.mb, 3000)
    with tempfile.TemporaryDirectory(prefix="vmctl-bench-store-") as tmp:
        path = Path(tmp) / "vmctld.db"
        t = time.perf_counter()
        rows = build(path, mb)
        print(f"store of {os.path.getsize(path) / 2**20:.0f} MB ({rows:,} archived jobs and {rows:,} events, "
              f"built in {time.perf_counter() - t:.0f} s); load average {os.getloadavg()[0]:.1f}")
        print("start-up integrity check (PRAGMA quick_check, table by table):")
        check_times(path, args.budget)
        print("cost per commit:")
        commit_cost(Path(tmp), commits)


if __name__ == "__main__":
    main()
