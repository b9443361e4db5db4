"""Retention of finished jobs (config ``retention:``): the config keys, the choice of the jobs to prune
(order, bounds, what is never pruned), the store's archive on SQLite and PostgreSQL, and the daemon's
housekeeping pruning through the real decision loop (in-process agents, virtual clock)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_daemon_core import Cluster
from vmctl.daemon.config import DaemonConfig, RetentionConfig, load_config, parse_config
from vmctl.daemon.state import ClusterState
from vmctl.errors import ConfigError, LeaseLost, StoreError
from vmctl.store import JobRecord, OperationRecord, WriteBatch
from vmctl.store.base import Store

EXAMPLE = Path(__file__).resolve().parents[2] / "etc" / "vmctld.yaml"


# ----------------------------------------------------------------------------------------------- config


def test_retention_defaults_and_the_example_file() -> None:
    d = DaemonConfig().retention
    assert d == RetentionConfig(enabled=True, keep_s=7 * 86400.0, keep_count=10000, archive=True, max_per_pass=1000)
    assert load_config(EXAMPLE).retention == d  # the example states the defaults
    assert parse_config("{}").retention == d
    cfg = parse_config("retention: {keep_s: 60, keep_count: 0, archive: false, max_per_pass: 5, enabled: false}")
    assert cfg.retention == RetentionConfig(enabled=False, keep_s=60.0, keep_count=0, archive=False, max_per_pass=5)


@pytest.mark.parametrize(("text", "key", "problem"), [
    ("retention: {keep_s: .nan}", "keep_s", "finite"),
    ("retention: {keep_s: .inf}", "keep_s", "finite"),
    ("retention: {keep_s: -1}", "keep_s", ">= 0"),
    ("retention: {keep_s: soon}", "keep_s", "must be float"),
    ("retention: {keep_count: -1}", "keep_count", ">= 0"),
    ("retention: {keep_count: 1.5}", "keep_count", "must be int"),
    ("retention: {keep_count: true}", "keep_count", "boolean"),
    ("retention: {max_per_pass: 0}", "max_per_pass", ">= 1"),
    ("retention: {archive: 'yes'}", "archive", "must be bool"),
    ("retention: {keep_days: 3}", "keep_days", "unknown key"),
])
def test_bad_retention_values_name_the_key(text: str, key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "bad.yaml")
    msg = str(exc.value)
    assert f"bad.yaml: retention.{key}" in msg and problem in msg
    assert exc.value.reference == "config-invalid"


# ----------------------------------------------------------------------------------------------- state


def _rec(i: int, state: str, end: float | None = None, **kw: Any) -> JobRecord:
    return JobRecord(id=str(i), seq=i, name=f"j{i}", spec={"procs": 2, "estimate": 10.0}, state=state,
                     submit_time=float(i), end_time=end, **kw)


class NoScan(dict[str, JobRecord]):
    """The jobs map, refusing to be walked: pruning must not look at every job."""

    def values(self) -> Any:
        raise AssertionError("scan of all jobs")

    def items(self) -> Any:
        raise AssertionError("scan of all jobs")

    def __iter__(self) -> Any:
        raise AssertionError("scan of all jobs")


def _state(recs: list[JobRecord], ops: Sequence[OperationRecord] = ()) -> ClusterState:
    s = ClusterState()
    s.load(recs, [], ops, {})
    return s


def test_prune_order_is_by_end_time_and_counts_only_finished_jobs() -> None:
    # ends out of submission order; queued/running/suspended jobs are never candidates
    recs = [_rec(1, "done", 50.0), _rec(2, "killed", 10.0), _rec(3, "queued"), _rec(4, "failed", 30.0),
            _rec(5, "running"), _rec(6, "cancelled", 20.0), _rec(7, "suspended"), _rec(8, "done", 40.0),
            _rec(9, "queued")]
    s = _state(recs)
    assert s.finished_count() == 5
    # by count: keep the 2 most recent ends (50, 40), prune 10, 20, 30 in that order
    got = s.select_prunable(now=100.0, keep_s=1e9, keep_count=2, limit=100)
    assert [r.id for r in got] == ["2", "6", "4"]
    s.forget_jobs(got)
    assert s.finished_count() == 2 and set(s.jobs) == {"1", "3", "5", "7", "8", "9"}
    assert s.select_prunable(now=100.0, keep_s=1e9, keep_count=2, limit=100) == []
    # by age: pruned once it ended keep_s or more before now (ends 40 and 50 left)
    assert s.select_prunable(now=100.0, keep_s=60.5, keep_count=100, limit=100) == []
    got = s.select_prunable(now=100.0, keep_s=60.0, keep_count=100, limit=100)
    assert [r.id for r in got] == ["8"]  # 40 + 60 <= 100; 50 stays
    s.forget_jobs(got)
    assert set(s.jobs) == {"1", "3", "5", "7", "9"}


def test_prune_is_bounded_per_pass_and_never_scans_all_jobs() -> None:
    n = 20000
    recs = [_rec(i, "done", float(i)) for i in range(1, n + 1)] + [_rec(n + 1, "queued")]
    s = _state(recs)
    s.jobs = NoScan(s.jobs)
    total = 0
    passes = 0
    while True:
        got = s.select_prunable(now=1e9, keep_s=1e9, keep_count=100, limit=1000)
        assert len(got) <= 1000
        if not got:
            break
        assert [r.end_time for r in got] == sorted(r.end_time for r in got)  # type: ignore[type-var]
        s.forget_jobs(got)
        total += len(got)
        passes += 1
    assert total == n - 100 and passes == math.ceil((n - 100) / 1000)
    assert s.finished_count() == 100 and len(s.jobs) == 101
    assert s.queue_length() == 1


def test_never_pruned_open_operation_migrating_skipped_and_the_newest_submission() -> None:
    op = OperationRecord(id="op1", kind="checkpoint", job_id="2", state="pending", created=0, updated=0)
    closed = OperationRecord(id="op2", kind="migrate", job_id="3", state="done", created=0, updated=0)
    recs = [_rec(1, "done", 1.0), _rec(2, "done", 2.0), _rec(3, "done", 3.0), _rec(4, "done", 4.0, migrating="op9"),
            _rec(5, "done", 5.0), _rec(6, "done", 0.5)]
    s = _state(recs, [op, closed])
    got = s.select_prunable(now=100.0, keep_s=0.0, keep_count=0, limit=100, skip={"5"})
    # 2: an open operation refers to it; 4: migrating; 5: changed by the event in hand; 6: the newest
    assert sorted(r.id for r in got) == ["1", "3"]
    s.forget_jobs(got)
    op.state = "done"
    got = s.select_prunable(now=100.0, keep_s=0.0, keep_count=0, limit=100)
    assert sorted(r.id for r in got) == ["2", "5"]  # the deferred ones came back into the index
    s.forget_jobs(got)
    assert set(s.jobs) == {"4", "6"}


def test_unselect_puts_jobs_back_and_forget_drops_every_cache() -> None:
    recs = [_rec(1, "done", 1.0, run=2, tasks=[{"index": 0}, {"index": 1}]), _rec(2, "done", 2.0), _rec(3, "queued")]
    s = _state(recs)
    s.job_obj(recs[0])
    for name in ("j1-r1-p0", "j1-r2-p1", "j3-r1-p0"):
        s._util[name] = 0.5
    got = s.select_prunable(now=10.0, keep_s=0.0, keep_count=0, limit=10)
    assert [r.id for r in got] == ["1", "2"]
    s.unselect(got)  # e.g. the store write failed: still in memory and chosen again next time
    assert [r.id for r in s.select_prunable(now=10.0, keep_s=0.0, keep_count=0, limit=10)] == ["1", "2"]
    s.forget_jobs(got)
    assert set(s.jobs) == {"3"} and "1" not in s._job_cache
    assert set(s._util) == {"j3-r1-p0"}


def test_a_job_leaving_the_finished_states_is_no_candidate() -> None:
    recs = [_rec(1, "done", 1.0), _rec(2, "done", 2.0), _rec(3, "queued")]
    s = _state(recs)
    recs[0].state = "queued"  # (no path does this today; the index must follow any change)
    recs[0].end_time = None
    s.reindex(recs[0])
    assert [r.id for r in s.select_prunable(now=10.0, keep_s=0.0, keep_count=0, limit=10)] == ["2"]


def _scratch_survivors(recs: list[JobRecord], now: float, keep_s: float, keep_count: int) -> set[str]:
    """What must stay, computed from scratch: finished jobs by (end, seq) are pruned oldest first while
    they ended keep_s ago or more than keep_count stay, except the newest submission."""
    fin = sorted((r for r in recs if r.state in ("done", "killed", "failed", "cancelled")),
                 key=lambda r: (r.end_time, r.seq))
    newest = max(r.seq for r in recs)
    left = {r.id for r in fin}
    for r in fin:
        if r.seq == newest:
            continue
        assert r.end_time is not None
        if r.end_time <= now - keep_s or len(left) > keep_count:
            left.discard(r.id)
    return left | {r.id for r in recs if r.state not in ("done", "killed", "failed", "cancelled")}


@settings(max_examples=150, deadline=None)
@given(jobs=st.lists(st.tuples(st.sampled_from(["queued", "running", "done", "killed", "failed", "cancelled"]),
                               st.integers(0, 30)), min_size=1, max_size=40),
       now=st.integers(0, 40), keep_s=st.integers(0, 40), keep_count=st.integers(0, 10), limit=st.integers(1, 7))
def test_repeated_passes_leave_what_a_scratch_computation_keeps(jobs: list[tuple[str, int]], now: int, keep_s: int,
                                                                keep_count: int, limit: int) -> None:
    recs = [_rec(i + 1, state, float(end) if state not in ("queued", "running") else None)
            for i, (state, end) in enumerate(jobs)]
    want = _scratch_survivors(recs, now, keep_s, keep_count)
    s = _state(recs)
    for _ in range(len(recs) + 1):
        got = s.select_prunable(float(now), float(keep_s), keep_count, limit)
        assert len(got) <= limit
        s.forget_jobs(got)
    assert set(s.jobs) == want


# ----------------------------------------------------------------------------------------------- store


def test_store_archives_or_deletes_pruned_jobs(store: Store) -> None:
    epoch = store.acquire_lease("a", 10, 0)
    assert epoch is not None
    recs = [_rec(i, "done" if i % 2 else "killed", float(i), tasks=[{"index": 0, "exit_status": 0, "error": None}])
            for i in range(1, 7)]
    store.write(epoch, WriteBatch(jobs={r.id: r for r in recs}))
    store.prune_jobs(epoch, recs[:4], archive=True)
    store.prune_jobs(epoch, recs[4:5], archive=False)
    assert [j.id for j in store.load_jobs()] == ["6"]
    assert store.count_archived_jobs() == 4
    assert store.get_archived_job("3") == recs[2]
    assert store.get_archived_job("5") is None and store.get_archived_job("nope") is None
    assert [j.id for j in store.list_archived_jobs()] == ["4", "3", "2", "1"]  # newest submission first
    assert [j.id for j in store.list_archived_jobs("killed", limit=1)] == ["4"]
    assert [j.id for j in store.list_archived_jobs("done")] == ["3", "1"]
    store.prune_jobs(epoch, [], archive=True)  # nothing to do: no transaction needed


def test_store_prune_with_a_stale_epoch_changes_nothing(store: Store) -> None:
    e1 = store.acquire_lease("a", 1, 0)
    assert e1 is not None
    rec = _rec(1, "done", 1.0)
    store.write(e1, WriteBatch(jobs={"1": rec}))
    assert store.acquire_lease("b", 10, 5) == e1 + 1
    with pytest.raises(LeaseLost):
        store.prune_jobs(e1, [rec], archive=True)
    assert [j.id for j in store.load_jobs()] == ["1"] and store.count_archived_jobs() == 0


def test_a_corrupt_archive_row_is_named(store: Store) -> None:
    from vmctl.store.sql import SqlStore

    assert isinstance(store, SqlStore)
    with store._transaction() as cur:
        store._exec(cur, "INSERT INTO job_archive (id, seq, state, end_time, doc) VALUES (?, ?, ?, ?, ?)",
                    ("7", 7, "done", 1.0, "{not json"))
    with pytest.raises(StoreError, match=r"table job_archive, row id='7'"):
        store.get_archived_job("7")
    with pytest.raises(StoreError, match=r"table job_archive, row id='7'"):
        store.list_archived_jobs()


# ----------------------------------------------------------------------------------------------- daemon


def _ended(c: Cluster, jid: str) -> bool:
    """Whether the job finished: in memory, archived, or deleted by retention (numbers below the next one)."""
    rec = c.daemon.state.jobs.get(jid) or c.daemon.store.get_archived_job(jid)
    if rec is None:
        return int(jid) < c.daemon.state.next_seq
    return rec.state in ("done", "killed", "failed", "cancelled")


def _finished_in_memory(c: Cluster) -> list[str]:
    return sorted((j.id for j in c.daemon.state.jobs.values() if j.end_time is not None), key=int)


def test_daemon_prunes_by_count_and_archived_jobs_survive_restarts(tmp_path: Path, store_url: str) -> None:
    c = Cluster(tmp_path, {"n1": 4}, store_url=store_url, retention=RetentionConfig(keep_count=3, keep_s=1e9))
    try:
        ids = [c.submit(1, 100, 5) for _ in range(10)]
        c.run_until(lambda: all(_ended(c, j) for j in ids))
        c.step()
        assert c.daemon.state.finished_count() == 3
        kept = _finished_in_memory(c)
        assert len(kept) == 3 and ids[-1] in kept  # the most recent ends (the newest submission among them)
        store = c.daemon.store
        assert store.count_archived_jobs() == 7
        assert {j.id for j in store.load_jobs()} == set(kept)
        old = store.get_archived_job(ids[0])
        assert old is not None and old.state == "done" and old.end_time is not None
        assert all(t["exit_status"] == 0 for t in old.tasks)
        c.restart()  # pruned jobs are not loaded again; numbering continues after the newest
        assert _finished_in_memory(c) == kept
        new = c.submit(1, 100, 5)
        assert int(new) == int(ids[-1]) + 1 and store is not c.daemon.store
        assert c.daemon.store.get_archived_job(new) is None
    finally:
        c.close()


def test_numbering_continues_when_every_finished_job_but_the_newest_is_pruned(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 4}, retention=RetentionConfig(keep_count=0, keep_s=0.0, archive=False))
    try:
        ids = [c.submit(2, 100, 3) for _ in range(4)]
        c.run_until(lambda: all(_ended(c, j) for j in ids))
        c.step()
        assert _finished_in_memory(c) == [ids[-1]]  # the newest submission is kept: numbering goes on from it
        assert c.daemon.store.count_archived_jobs() == 0  # archive: false deletes
        c.restart()
        assert int(c.submit(1, 10, 1)) == int(ids[-1]) + 1
    finally:
        c.close()


def test_daemon_prunes_by_age_and_never_running_or_queued_jobs(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2}, retention=RetentionConfig(keep_count=1000, keep_s=50.0))
    try:
        short = c.submit(1, 100, 5)
        long = c.submit(1, 500, 300)
        waiting = [c.submit(2, 100, 5) for _ in range(2)]  # queued behind the long job
        c.run_until(lambda: _ended(c, short))
        end = c.daemon.job(short).end_time
        assert end is not None
        c.run_until(lambda: c.clock.now() >= end + 49.0)
        assert short in c.daemon.state.jobs  # not yet keep_s
        c.run_until(lambda: short not in c.daemon.state.jobs, limit=5)
        assert c.daemon.store.get_archived_job(short) is not None
        assert c.state(long) == "running" and all(c.state(w) == "queued" for w in waiting)
    finally:
        c.close()


def test_a_store_error_while_pruning_keeps_the_jobs_and_a_lost_lease_steps_down(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                                  ) -> None:
    c = Cluster(tmp_path, {"n1": 4}, retention=RetentionConfig(keep_count=1, keep_s=1e9))
    try:
        ids = [c.submit(1, 100, 5) for _ in range(3)]
        store = c.daemon.store
        real = store.prune_jobs
        calls: list[int] = []

        def broken(epoch: int, jobs: Any, archive: bool) -> None:
            calls.append(len(jobs))
            raise StoreError(backend="sqlite", problem="disk I/O error")

        monkeypatch.setattr(store, "prune_jobs", broken)
        c.run_until(lambda: all(_ended(c, j) for j in ids))
        c.step()
        assert calls and c.daemon.state.finished_count() == 3  # nothing lost from memory, tried each pass
        monkeypatch.setattr(store, "prune_jobs", real)
        c.step()
        assert c.daemon.state.finished_count() == 1 and store.count_archived_jobs() == 2

        def lost(epoch: int, jobs: Any, archive: bool) -> None:
            raise LeaseLost(epoch=epoch, current=epoch + 1)

        monkeypatch.setattr(store, "prune_jobs", lost)
        c.submit(1, 100, 5)  # once it ends, the earlier newest submission is due (2 finished, keep_count 1)
        with pytest.raises(LeaseLost):
            c.run_until(lambda: False, limit=50)
        assert not c.daemon.leader
    finally:
        c.close()
