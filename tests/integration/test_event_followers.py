"""Event-log followers are woken in paced batches (``DaemonRuntime._events_written``, issue 23 item 4):
every one of them still gets the event, and one that disconnects frees its request at once."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import InProcessDaemon
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.runtime import FOLLOWER_WAKE_BATCH

FOLLOWERS = 6 * FOLLOWER_WAKE_BATCH + 3


def _wait(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), policy_name="easy",
                       policy_explicit=True, tick_s=0.5, holder="followers")
    with InProcessDaemon(cfg) as d:
        yield d


def _last_seq(d: InProcessDaemon) -> int:
    status, doc = d.request("GET", "/v1/events?limit=1")
    assert status == 200
    return int(doc["last_seq"])


def test_every_follower_gets_the_event(daemon: InProcessDaemon) -> None:
    after = _last_seq(daemon)
    answers: list[Any] = []
    lock = threading.Lock()

    def follow() -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", daemon.server.port, timeout=120,
                                           context=ssl.create_default_context(cafile=daemon.ca_file))
        try:
            conn.request("GET", f"/v1/events?after={after}&wait=60",
                         headers={"Authorization": f"Bearer {daemon.admin_token}"})
            resp = conn.getresponse()
            doc = json.loads(resp.read())
            with lock:
                answers.append((resp.status, doc))
        finally:
            conn.close()

    threads = [threading.Thread(target=follow, daemon=True) for _ in range(FOLLOWERS)]
    for t in threads:
        t.start()
    _wait(lambda: len(daemon.server.runtime._log_waiters) == FOLLOWERS, f"{FOLLOWERS} followers are parked")
    status, doc = daemon.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60, "work_seconds": 60})
    assert status in (200, 201), doc
    for t in threads:
        t.join(120)
    assert len(answers) == FOLLOWERS
    for status, doc in answers:
        assert status == 200 and doc["events"], doc
        assert doc["events"][0]["seq"] == after + 1 and doc["last_seq"] > after


def test_a_follower_that_disconnects_frees_its_request(daemon: InProcessDaemon) -> None:
    ctx = ssl.create_default_context(cafile=daemon.ca_file)
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", daemon.server.port), timeout=30),
                        server_hostname="127.0.0.1")
    s.sendall((f"GET /v1/events?after={_last_seq(daemon)}&wait=60 HTTP/1.1\r\nHost: x\r\n"
               f"Authorization: Bearer {daemon.admin_token}\r\n\r\n").encode())
    _wait(lambda: len(daemon.server.runtime._log_waiters) == 1, "the follower is parked")
    s.close()
    # cancelled with its connection, not 60 s later at the end of its wait
    _wait(lambda: not daemon.server.runtime._log_waiters, "the follower's request is gone", timeout=30)
