"""A decision holds Python's cyclic collector paused from reading the view (``begin_decision``) to its
commit (``finish_decision``), and drops its view before the pause ends: the view's objects (one tuple
and one ``RunningJob`` per running job) die by reference counting instead of being scanned by a
collection between the decision's steps (issue 27: 30-60 ms of a 10,000-node event). The collector
must come back whether the decision is finished, dropped unfinished, or fails while reading."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.daemon import decisions


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    assert decisions._gc_holders == 0
    if not was:
        gc.disable()


def _pending(c: Cluster) -> decisions.PendingDecision:
    c.clock.advance(1)
    p = c.daemon.begin_pass()
    assert p is not None
    return p


def test_the_collector_is_paused_from_the_view_to_the_commit(tmp_path: Path, collector_on: None) -> None:
    c = Cluster(tmp_path, {"n1": 4})
    a = c.submit(2, 100, 10)
    p = _pending(c)
    assert not gc.isenabled()  # between the steps, where the loop serves requests
    decision = c.daemon.choose(p)
    assert not gc.isenabled()
    c.daemon.finish_decision(p, decision)
    assert gc.isenabled()
    assert p.view is None and not p.holds_gc  # the view went before the pause ended
    assert c.state(a) == "running"
    c.close()


def test_a_decision_dropped_unfinished_gives_the_collector_back(tmp_path: Path, collector_on: None) -> None:
    c = Cluster(tmp_path, {"n1": 4})
    c.submit(2, 100, 10)
    p = _pending(c)
    c.daemon.choose(p)
    assert not gc.isenabled()
    del p  # e.g. the runtime's loop caught an error from the worker thread
    assert gc.isenabled()
    c.close()


def test_a_failed_view_read_gives_the_collector_back(
    tmp_path: Path, collector_on: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster(tmp_path, {"n1": 4})
    c.submit(2, 100, 10)

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("view")

    monkeypatch.setattr(decisions, "prepare_view", broken)
    c.clock.advance(1)
    with pytest.raises(RuntimeError):
        c.daemon.begin_pass()
    assert gc.isenabled()
    c.close()


def test_run_once_leaves_the_collector_as_it_found_it(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 4})
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            c.submit(1, 100, 10)
            c.clock.advance(1)
            c.daemon.run_once()
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
        c.close()
