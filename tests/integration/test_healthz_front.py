"""``GET /healthz`` is answered on the API's front loop (``vmctl.api.front``), not on the daemon's event
loop: it answers while that loop is held (a long decision step), and still tells the truth (issue 27).
Progress is counted, not time: /healthz answers again and again while an authenticated request, which
needs the daemon's loop, cannot finish until the loop is let go."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import InProcessDaemon
from vmctl.daemon.config import DaemonConfig


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), holder="healthz",
                       policy_name="fcfs", policy_explicit=True, tick_s=3600)
    with InProcessDaemon(cfg) as d:
        yield d


def _hold_the_loop(d: InProcessDaemon) -> threading.Event:
    """Block the daemon's event loop thread (as a long step of a decision does) until the event is set."""
    assert d.loop is not None
    held, release = threading.Event(), threading.Event()

    def block() -> None:
        held.set()
        release.wait(120)

    d.loop.call_soon_threadsafe(block)
    assert held.wait(30)
    return release


def test_healthz_answers_while_the_daemon_loop_is_held(daemon: InProcessDaemon) -> None:
    release = _hold_the_loop(daemon)
    try:
        slow: dict[str, Any] = {}
        th = threading.Thread(target=lambda: slow.update(answer=daemon.request("GET", "/v1/health", timeout=60)))
        th.start()
        for _ in range(5):
            assert daemon.request("GET", "/healthz", timeout=20) == (200, {"status": "ok", "leader": True})
        # the request that needs the daemon's loop is still waiting: /healthz did not go through that loop
        assert "answer" not in slow and th.is_alive()
    finally:
        release.set()
    th.join(60)
    status, doc = slow["answer"]
    assert status == 200 and doc["leader"] is True


def test_healthz_tells_the_truth_without_the_daemon_loop(daemon: InProcessDaemon) -> None:
    """Leadership lost and a damaged store show at once, also while the daemon's loop is held; the policy's
    ``waiting`` as the loop last published it (after the request that changed it)."""
    assert daemon.request("GET", "/healthz")[1] == {"status": "ok", "leader": True}
    status, _doc = daemon.request("PUT", "/v1/policy", {"name": "gs-m"})
    assert status == 200
    status, doc = daemon.request("GET", "/healthz")
    assert status == 200 and doc["leader"] is True and "waits for nodes" in doc["waiting"]
    release = _hold_the_loop(daemon)
    try:
        daemon.daemon.leader = False  # as a lost lease leaves it (plain attributes, read as they are)
        assert daemon.request("GET", "/healthz", timeout=20) == (200, {"status": "ok", "leader": False})
        daemon.daemon.leader = True
        daemon.daemon.damaged = object()
        assert daemon.request("GET", "/healthz", timeout=20) == (503, {"status": "store-damaged", "leader": False})
        daemon.daemon.damaged = None
    finally:
        release.set()
