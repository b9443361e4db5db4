"""Retention on a real vmctld (aiohttp, TLS on loopback, SQLite): with ``retention.keep_count: 3`` a
daemon that finishes 10 jobs keeps only 3 finished jobs in memory, and the archived ones still answer
``GET /v1/jobs/{id}``, ``GET /v1/jobs?archived=true`` and ``DELETE`` (idempotent cancel); every answer is
checked against vmctl/api/openapi.yaml."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon_api import Client
from tests.support.daemon import InProcessDaemon
from vmctl.daemon.config import DaemonConfig, RetentionConfig


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), policy_name="fcfs",
                       policy_explicit=True, tick_s=0.5, holder="retention-test",
                       retention=RetentionConfig(keep_count=3, keep_s=1e9))
    with InProcessDaemon(cfg) as d:
        yield d


def _wait(what: str, cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_keep_count_3_keeps_3_finished_jobs_and_archived_ones_still_answer(daemon: InProcessDaemon,
                                                                           tmp_path: Path) -> None:
    client = Client(daemon, tmp_path / "cli")
    admin = daemon.admin_token
    s, _ = client.call("POST", "/v1/agent/nodes/n1/register", {"cores": 4, "hostname": "n1", "backend": "mock"},
                       node="n1")
    assert s == 200
    s, doc = client.call("POST", "/v1/jobs:batch", {"jobs": [{"name": f"r{i}", "procs": 1, "estimate": 60,
                                                                "work_seconds": 1} for i in range(10)]}, token=admin)
    assert s == 201
    ids = [j["id"] for j in doc["jobs"]]
    states: dict[str, str] = {}

    def all_done() -> bool:
        # the node's agent: whatever job VMs its desired state holds have run and exited 0
        s, desired = client.call("GET", "/v1/agent/nodes/n1/desired?after=-1", node="n1")
        assert s == 200
        vms = [{"name": v["name"], "power": "running", "core": v["core"], "process_job": v["process"]["job_id"],
                "process_index": v["process"]["index"], "process_exit": 0}
               for v in desired["vms"] if v.get("process")]
        s, _ = client.call("POST", "/v1/agent/nodes/n1/observed",
                           {"node": "n1", "generation_applied": desired["generation"], "cores": 4, "vms": vms},
                           node="n1")
        assert s == 204
        for jid in ids:
            s, d = client.call("GET", f"/v1/jobs/{jid}", token=admin)
            assert s == 200, (jid, d)  # in memory or archived: every job answers at every moment
            states[jid] = d["job"]["state"]
        return all(st == "done" for st in states.values())

    _wait("10 jobs done", all_done)
    _wait("3 finished jobs left in memory", lambda: daemon.call(lambda: daemon.daemon.state.finished_count()) == 3)
    in_memory = set(daemon.call(lambda: list(daemon.daemon.state.jobs)))
    assert len(in_memory) == 3 and ids[-1] in in_memory
    archived_ids = [j for j in ids if j not in in_memory]
    assert len(archived_ids) == 7
    for jid in archived_ids:
        s, d = client.call("GET", f"/v1/jobs/{jid}", token=admin)
        assert s == 200 and d["job"]["archived"] is True and d["job"]["state"] == "done"
        assert d["job"]["end_time"] is not None and d["job"]["tasks"][0]["exit_status"] == 0
        s, d = client.call("DELETE", f"/v1/jobs/{jid}", token=admin)  # idempotent cancel: unchanged
        assert s == 200 and d["job"]["state"] == "done"
    for jid in in_memory:
        s, d = client.call("GET", f"/v1/jobs/{jid}", token=admin)
        assert s == 200 and "archived" not in d["job"]
    s, d = client.call("GET", "/v1/jobs?archived=true", token=admin)
    assert s == 200 and [j["id"] for j in d["jobs"]] == sorted(archived_ids, key=int, reverse=True)
    s, d = client.call("GET", "/v1/jobs?archived=true&state=done&limit=2", token=admin)
    assert [j["id"] for j in d["jobs"]] == sorted(archived_ids, key=int, reverse=True)[:2]
    s, d = client.call("GET", "/v1/jobs?archived=true&state=killed", token=admin)
    assert s == 200 and d["jobs"] == []
    s, d = client.call("GET", "/v1/jobs", token=admin)
    assert sorted(j["id"] for j in d["jobs"]) == sorted(in_memory)
    s, d = client.call("GET", "/v1/jobs?archived=maybe", token=admin)
    assert s == 422 and d["error"]["field"] == "archived"
    s, d = client.call("GET", "/v1/jobs/424242", token=admin)
    assert s == 404
