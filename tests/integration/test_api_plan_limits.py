"""``POST /v1/plan`` is bounded per token and in all (issue 23 item 5; ``vmctl.api.planning``).

A real vmctld (in process, TLS on loopback). To hold plans "in progress" without racing the clock,
the planner's worker pool is replaced by a thread pool whose plans wait at a gate the test opens: the
admission (429 with ``Retry-After`` beyond ``api.plan_per_token`` or ``api.plan_queue``) and the
answers are vmctld's own. The plans themselves run in the real process pool in
``test_a_plan_is_answered_by_a_worker_process`` and in tests/unit/test_client_live.py.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon_api import check_openapi
from tests.support.daemon import InProcessDaemon
from vmctl.api.planning import Planner
from vmctl.daemon.config import DaemonConfig
from vmctl.policies.dispatch import load_instance, plan

INSTANCE = {"policy": "priority", "params": {"r": 0.2},
            "workers": [{"id": f"w{i}", "node": f"n{i // 4}"} for i in range(16)],
            "jobs": [{"id": "a", "tasks": 8, "work": 10.0, "priority": 2}, {"id": "b", "tasks": 8, "work": 5.0}]}


class GatedPool(concurrent.futures.ThreadPoolExecutor):
    """Runs each plan in a thread once ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__(max_workers=8)
        self.gate = threading.Event()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        def gated() -> Any:
            self.gate.wait(60)
            return fn(*args, **kwargs)

        return super().submit(gated)


def _wait(cond: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), policy_name="easy",
                       policy_explicit=True, tick_s=0.5, holder="plan-test", max_body_bytes=64 * 1024,
                       plan_per_token=1, plan_queue=3)
    with InProcessDaemon(cfg) as d:
        yield d


def _post(d: InProcessDaemon, token: str, body: bytes) -> tuple[int, dict[str, str], Any]:
    ctx = ssl.create_default_context(cafile=d.ca_file)
    conn = http.client.HTTPSConnection("127.0.0.1", d.server.port, context=ctx, timeout=60)
    try:
        conn.request("POST", "/v1/plan", body=body,
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        check_openapi("POST", "/v1/plan", resp.status, doc)
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, doc
    finally:
        conn.close()


def _read_token(d: InProcessDaemon, name: str) -> str:
    status, doc = d.request("POST", "/v1/tokens", {"name": name, "role": "read"})
    assert status == 201, doc
    return str(doc["token"])


def _in_background(d: InProcessDaemon, token: str, out: list[Any]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(_post(d, token, json.dumps(INSTANCE).encode())), daemon=True)
    t.start()
    return t


def test_a_second_plan_of_a_token_is_refused_with_retry_after_and_others_are_served(daemon: InProcessDaemon) -> None:
    pool = GatedPool()
    planner: Planner = daemon.server.planner
    planner._pool = pool  # the gate stands in for a long plan
    alice, bob = _read_token(daemon, "alice"), _read_token(daemon, "bob")
    answers: list[Any] = []
    first = _in_background(daemon, alice, answers)
    _wait(lambda: planner.in_progress == 1, "alice's plan is in progress")

    status, headers, doc = _post(daemon, alice, json.dumps(INSTANCE).encode())
    assert status == 429, doc
    assert doc["error"]["reference"] == "plan-busy"
    assert "api.plan_per_token" in doc["error"]["message"] and "token alice" in doc["error"]["message"]
    assert int(headers["retry-after"]) >= 1

    second = _in_background(daemon, bob, answers)  # another token is not held up by alice's
    _wait(lambda: planner.in_progress == 2, "bob's plan is in progress too")
    pool.gate.set()
    first.join(60)
    second.join(60)
    assert sorted(a[0] for a in answers) == [200, 200]
    assert all(set(a[2]["assignment"]) == {"a", "b"} for a in answers)
    # the slots are free again: alice may ask once more
    assert _post(daemon, alice, json.dumps(INSTANCE).encode())[0] == 200
    pool.shutdown()


def test_plans_beyond_the_queue_are_refused_whoever_asks(daemon: InProcessDaemon) -> None:
    pool = GatedPool()
    planner: Planner = daemon.server.planner
    planner._pool = pool
    tokens = [_read_token(daemon, f"t{i}") for i in range(4)]
    answers: list[Any] = []
    held = []
    for i, tok in enumerate(tokens[:3]):
        held.append(_in_background(daemon, tok, answers))
        _wait(lambda n=i + 1: planner.in_progress == n, f"{i + 1} plans in progress")
    status, headers, doc = _post(daemon, tokens[3], json.dumps(INSTANCE).encode())
    assert status == 429 and "api.plan_queue" in doc["error"]["message"], doc
    assert int(headers["retry-after"]) >= 1
    pool.gate.set()
    for t in held:
        t.join(60)
    assert [a[0] for a in answers] == [200, 200, 200]
    assert planner.in_progress == 0
    pool.shutdown()


def test_a_plan_is_answered_by_a_worker_process(daemon: InProcessDaemon) -> None:
    """The shipped pool: the plan and its errors come back from another process, unchanged."""
    token = _read_token(daemon, "reader")
    status, _h, doc = _post(daemon, token, json.dumps(INSTANCE).encode())
    assert status == 200, doc
    workers, jobs = load_instance({k: v for k, v in INSTANCE.items() if k in ("workers", "jobs")})
    expected = plan("priority", workers, jobs, 0.0, {"r": 0.2}).to_dict()
    assert doc["assignment"] == expected["assignment"] and len(doc["assignment"]["a"]) == 8
    pool = daemon.server.planner._pool
    assert isinstance(pool, concurrent.futures.ProcessPoolExecutor)
    assert all(pid != os.getpid() for pid in pool._processes)  # type: ignore[attr-defined]
    bad = {**INSTANCE, "jobs": [{"id": "a", "tasks": 0, "work": 1.0}]}
    status, _h, doc = _post(daemon, token, json.dumps(bad).encode())
    assert status == 422 and doc["error"]["field"] == "body.jobs[0].tasks", doc
    status, _h, doc = _post(daemon, token, json.dumps({**INSTANCE, "policy": "nope"}).encode())
    assert status == 400 and doc["error"]["reference"] == "unknown-policy", doc


def test_a_plan_body_beyond_the_limit_is_413_naming_it(daemon: InProcessDaemon) -> None:
    token = _read_token(daemon, "big")
    big = {**INSTANCE, "workers": [{"id": f"worker-{i:06d}", "node": f"node-{i:06d}"} for i in range(5000)]}
    body = json.dumps(big).encode()
    assert len(body) > 64 * 1024
    status, _h, doc = _post(daemon, token, body)
    assert status == 413, doc
    assert doc["error"]["reference"] == "request-too-large" and "65536 bytes" in doc["error"]["message"]
    assert daemon.server.planner.in_progress == 0


def test_large_bodies_sent_at_once_on_two_connections_arrive_intact(tmp_path: Path) -> None:
    """Two 10,000-worker plans (~0.4 MB each, many TLS records) uploaded at the same time on two
    connections: the listener's TLS reads share one buffer per thread (``vmctl.api.listener``), and
    each plan must come back with its own jobs, planned by the worker processes."""
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), policy_name="easy",
                       policy_explicit=True, tick_s=0.5, holder="plan-big", max_body_bytes=2 << 20)
    with InProcessDaemon(cfg) as d:
        answers: dict[str, Any] = {}

        def ask(tag: str) -> None:
            doc = {"policy": "proportion",
                   "workers": [{"id": f"{tag}-w{i}", "node": f"{tag}-n{i // 32}"} for i in range(10000)],
                   "jobs": [{"id": f"{tag}-j{k}", "tasks": 4000, "work": 10.0 + k} for k in range(3)]}
            answers[tag] = _post(d, _read_token(d, tag), json.dumps(doc).encode())

        threads = [threading.Thread(target=ask, args=(tag,), daemon=True) for tag in ("left", "right")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        for tag in ("left", "right"):
            status, _h, doc = answers[tag]
            assert status == 200, doc
            assert set(doc["assignment"]) == {f"{tag}-j0", f"{tag}-j1", f"{tag}-j2"}
            placed = [w for ws in doc["assignment"].values() for w in ws]
            assert len(placed) == 10000 and all(w.startswith(f"{tag}-w") for w in placed)
