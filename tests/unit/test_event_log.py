"""The daemon's event log (vmctl events): what is recorded, in order, written with the change it
records, numbered across restarts, pruned with the retention of finished jobs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl import timefmt
from vmctl.daemon.config import RetentionConfig
from vmctl.daemon.events import ACTOR
from vmctl.daemon.removal import remove_node
from vmctl.errors import StoreError
from vmctl.store.base import EventRecord


def kinds(events: list[EventRecord]) -> list[str]:
    return [e.kind for e in events]


def test_job_and_node_lifecycle_is_one_ordered_stream(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2})
    a = c.submit(2, 100, 5)
    c.run_until(lambda: c.state(a) == "done")
    c.daemon.set_node_state("n2", True, "bios update")
    c.daemon.set_policy("fcfs", {})
    evs = c.daemon.store.list_events()
    got = kinds(evs)
    assert got[:2] == ["node.joined", "node.joined"]
    assert got.index("job.submitted") < got.index("job.started") < got.index("job.done") < \
        got.index("node.drained") < got.index("policy.changed")
    assert [e.seq for e in evs] == sorted(e.seq for e in evs) and len({e.seq for e in evs}) == len(evs)
    started = next(e for e in evs if e.kind == "job.started")
    detail = next(h["detail"] for h in c.daemon.job(a).history if h["event"] == "started")
    assert started.job_id == a and started.message == f"job {a} started: {detail}"
    assert detail.startswith("run 1 as fg on n2:")
    drained = next(e for e in evs if e.kind == "node.drained")
    assert drained.node == "n2" and drained.message == "node n2 drained: bios update"
    pol = next(e for e in evs if e.kind == "policy.changed")
    assert pol.message == "policy easy -> fcfs" and pol.actor == "vmctld"  # no request: vmctld itself
    c.close()


def test_the_actor_of_a_request_is_named(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    token = ACTOR.set("token alice")
    try:
        jid = c.submit(1, 100, 50)
        c.daemon.cancel(jid)
    finally:
        ACTOR.reset(token)
    evs = [e for e in c.daemon.store.list_events() if e.job_id == jid]
    assert [(e.kind, e.actor) for e in evs] == [("job.submitted", "token alice"), ("job.cancelled", "token alice")]
    assert evs[1].message == f"job {jid} cancelled: cancelled by an operator"
    c.close()


def test_node_lost_down_back_and_removed(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2}, node_timeout_s=10.0, node_down_s=20.0)
    c.down.add("n2")
    c.run_until(lambda: c.daemon.node("n2").state == "down", limit=100)
    c.down.discard("n2")
    c.step()
    assert c.daemon.node("n2").state == "ready"
    c.down.add("n2")
    c.run_until(lambda: c.daemon.node("n2").state == "down", limit=100)
    remove_node(c.daemon, "n2")
    n2 = [(e.kind, e.message) for e in c.daemon.store.list_events() if e.node == "n2"]
    assert [k for k, _m in n2] == ["node.joined", "node.lost", "node.down", "node.back", "node.lost", "node.down",
                                   "node.removed"]
    assert n2[3][1] == "node n2 back (was down)" and n2[-1][1] == "node n2 removed (was down)"
    c.close()


def test_migration_operations_are_events(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2})
    a = c.submit(2, 400, 200)
    c.run_until(lambda: c.state(a) == "running")
    src = c.daemon.job(a).placement[0][0]
    dst = "n1" if src == "n2" else "n2"
    op = c.daemon.migrate_job(a, dst)
    c.run_until(lambda: c.daemon.state.ops[op.id].state != "pending")
    evs = [e for e in c.daemon.store.list_events() if e.kind.startswith("operation.")]
    assert [e.kind for e in evs] == ["operation.started", f"operation.{c.daemon.state.ops[op.id].state}"]
    moves = evs[0].message.removeprefix(f"migrate {op.id} of job {a} started: ").split(", ")
    assert len(moves) == 2 and all(m.startswith(f"{src}:") and f" -> {dst}:" in m for m in moves)
    assert any(e.kind == "job.migrated" for e in c.daemon.store.list_events())
    c.close()


def test_numbering_continues_after_a_restart_and_a_failed_write_leaves_no_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    c.submit(1, 100, 50)
    last = c.daemon.store.list_events()[-1].seq
    c.restart()
    c.submit(1, 100, 50)
    assert c.daemon.store.list_events()[-1].seq == last + 1

    def fail(*_a: object, **_k: object) -> None:
        raise StoreError(backend="sqlite", problem="disk full")

    monkeypatch.setattr(c.daemon.store, "write", fail)
    with pytest.raises(StoreError):
        c.daemon.set_node_state("n1", True)
    monkeypatch.undo()
    assert "node.drained" not in kinds(c.daemon.store.list_events())
    c.daemon.set_node_state("n1", True, "now")  # the next change writes its own event only
    assert kinds(c.daemon.store.list_events())[-1] == "node.drained"
    assert sum(1 for e in c.daemon.store.list_events() if e.kind == "node.drained") == 1
    c.close()


def test_events_older_than_the_retention_are_pruned(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2}, retention=RetentionConfig(keep_s=100.0))
    c.submit(1, 10, 1)
    first = c.daemon.store.list_events()
    assert first
    c.clock.advance(150.0)
    c.daemon.set_node_state("n1", True, "later")
    c.step()
    left = c.daemon.store.list_events()
    assert {e.seq for e in first}.isdisjoint(e.seq for e in left)
    assert "node.drained" in kinds(left)
    c.close()


def test_events_are_kept_when_retention_is_off(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2}, retention=replace(RetentionConfig(), enabled=False, keep_s=1.0))
    c.submit(1, 10, 1)
    n = len(c.daemon.store.list_events())
    c.clock.advance(50.0)
    c.step()
    assert len(c.daemon.store.list_events()) >= n
    c.close()


def test_store_lists_the_newest_or_follows_after_a_seq(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2})
    for _ in range(5):
        c.submit(1, 10, 1)
    s = c.daemon.store
    every = s.list_events()
    assert [e.seq for e in s.list_events(limit=2, newest=True)] == [e.seq for e in every[-2:]]
    assert [e.seq for e in s.list_events(after=every[1].seq, limit=2)] == [e.seq for e in every[2:4]]
    assert s.list_events(since=c.clock.now() + 1) == []
    c.close()


@pytest.mark.parametrize(("text", "expect"), [
    ("90s", 1000.0 - 90), ("10m", 1000.0 - 600), ("2h", 1000.0 - 7200), ("1d", 1000.0 - 86400),
    ("1795460000", 1795460000.0), ("2026-11-25T04:05:06Z", 1795579506.0),
    ("2026-11-25T04:05:06+01:00", 1795579506.0 - 3600),
])
def test_parse_since(text: str, expect: float) -> None:
    assert timefmt.parse_since(text, now=1000.0) == pytest.approx(expect)


@pytest.mark.parametrize("text", ["yesterday", "5 parsecs", "-5m", "nan", "inf", "2026-13-40"])
def test_parse_since_refuses_what_is_no_time(text: str) -> None:
    with pytest.raises(ValueError, match="neither a duration"):
        timefmt.parse_since(text, now=1000.0)


def test_events_and_held_jobs_persist_on_both_stores(tmp_path: Path, store_url: str) -> None:
    """Schema 005 and the held flag on SQLite and PostgreSQL: written, read back after a restart,
    followed after a seq, pruned."""
    c = Cluster(tmp_path, {"n1": 2}, store_url=store_url, retention=RetentionConfig(keep_s=100.0))
    try:
        a = c.submit(2, 100, 10)
        c.daemon.hold(a, "maintenance")
        before = c.daemon.store.list_events()
        assert kinds(before)[-2:] == ["job.submitted", "job.held"]
        c.restart()
        assert c.daemon.job(a).held and c.daemon.store.list_events() == before
        assert [e.seq for e in c.daemon.store.list_events(after=before[-2].seq)] == [before[-1].seq]
        assert c.daemon.store.event_bounds() == (before[-1].seq, before[0].time)
        c.clock.advance(200.0)
        c.daemon.release(a)
        c.step()
        left = c.daemon.store.list_events()
        assert left and all(e.time >= c.clock.now() - 100.0 for e in left)
        assert "job.released" in kinds(left) and "job.held" not in kinds(left)
    finally:
        c.close()
