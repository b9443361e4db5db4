"""``GET /v1/history``, ``vmctl history export`` and ``vmctl whatif`` on a real vmctld (aiohttp, TLS on
loopback, SQLite) whose one node is driven through the agent API as a mock agent: finished jobs from
memory and from the job archive (retention keeps 2 in memory), answers checked against
vmctl/api/openapi.yaml, bad ranges refused with 422 naming the parameter (never 5xx), the CLI's export
read back by vmctl's SWF reader, its errors (exit 2), and the what-if table of the tiny history."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon_api import Client
from tests.livedaemon import run_cli
from tests.support.daemon import InProcessDaemon
from vmctl.daemon.config import DaemonConfig, RetentionConfig
from vmctl.sim.workloads.swf import read_side_file, read_swf


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), policy_name="fcfs",
                       policy_explicit=True, tick_s=0.2, holder="history-test",
                       retention=RetentionConfig(keep_count=2, keep_s=1e9))
    with InProcessDaemon(cfg) as d:
        yield d


def _run_jobs(d: InProcessDaemon, client: Client, n: int) -> list[str]:
    """Submit ``n`` one-process jobs to a 2-core node and play its agent until all are done (each job's
    process exits at the agent's next report after it started, so starts and ends spread out)."""
    admin = d.admin_token
    s, _ = client.call("POST", "/v1/agent/nodes/n1/register", {"cores": 2, "hostname": "n1", "backend": "mock"},
                       node="n1")
    assert s == 200
    s, doc = client.call("POST", "/v1/jobs:batch", {"jobs": [
        {"name": f"r{i}", "procs": 1, "estimate": 60, "work_seconds": 1, "priority": i % 2, "user": "ana"}
        for i in range(n)]}, token=admin)
    assert s == 201
    ids = [j["id"] for j in doc["jobs"]]
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while True:
        s, desired = client.call("GET", "/v1/agent/nodes/n1/desired?after=-1", node="n1")
        assert s == 200
        vms = [{"name": v["name"], "power": "running", "core": v["core"], "process_job": v["process"]["job_id"],
                "process_index": v["process"]["index"], "process_exit": 0 if v["name"] in seen else None}
               for v in desired["vms"] if v.get("process")]
        seen |= {v["name"] for v in vms}
        s, _ = client.call("POST", "/v1/agent/nodes/n1/observed",
                           {"node": "n1", "generation_applied": desired["generation"], "cores": 2, "vms": vms},
                           node="n1")
        assert s == 204
        s, hist = client.call("GET", "/v1/history", token=admin)
        assert s == 200
        if len(hist["jobs"]) == n:
            return ids
        assert time.monotonic() < deadline, f"only {len(hist['jobs'])} of {n} jobs finished"
        time.sleep(0.1)


def _cli(d: InProcessDaemon, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    return run_cli(capsys, *argv, "--url", d.url, "--token", d.admin_token, "--ca", d.ca_file)


def test_history_export_and_whatif_on_a_live_daemon(daemon: InProcessDaemon, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    client = Client(daemon, tmp_path / "cli")
    admin = daemon.admin_token
    ids = _run_jobs(daemon, client, 5)
    # retention moved all but 2 finished jobs to the archive: the history has them all, oldest first
    deadline = time.monotonic() + 30
    while daemon.call(lambda: daemon.daemon.state.finished_count()) > 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    s, hist = client.call("GET", "/v1/history", token=admin)
    assert s == 200 and [j["id"] for j in hist["jobs"]] == ids and not hist["truncated"]
    assert sum(j["archived"] for j in hist["jobs"]) == 3
    assert all(j["state"] == "done" and j["first_start"] is not None and j["work_seconds"] == 1 for j in hist["jobs"])
    first, last = hist["jobs"][0]["submit_time"], hist["jobs"][-1]["submit_time"]
    s, part = client.call("GET", f"/v1/history?since={first}&until={first + 1e-3}", token=admin)
    assert s == 200 and [j["id"] for j in part["jobs"]] == [j["id"] for j in hist["jobs"]
                                                             if j["submit_time"] < first + 1e-3]
    s, cut = client.call("GET", "/v1/history?limit=2", token=admin)
    assert s == 200 and cut["truncated"] is True and len(cut["jobs"]) == 2
    s, none = client.call("GET", f"/v1/history?since={last + 10}", token=admin)
    assert s == 200 and none["jobs"] == []
    for query, field in ((f"since={last}&until={first}", "until"), ("since=yesterday", "since"),
                         ("until=2026-13-45", "until"), ("limit=0", "limit"), ("limit=abc", "limit"),
                         ("since=nan", "since"), ("since=1e400", "since"), ("until=-5", "until")):
        s, err = client.call("GET", f"/v1/history?{query}", token=admin)
        assert s == 422 and err["error"]["field"] == field, (query, err)

    # vmctl history export: SWF + side file, read back by vmctl's reader
    swf = tmp_path / "h.swf"
    code, out, err = _cli(daemon, capsys, "history", "export", "--swf", str(swf))
    assert code == 0, err
    assert "wrote 5 finished jobs" in out
    wl = read_swf(swf)
    assert len(wl.jobs) == 5 and wl.max_procs == 2 and [j.priority for j in wl.jobs] == [0, 1, 0, 1, 0]
    side = read_side_file(swf)
    assert side is not None and [e["vmctl_id"] for e in side["jobs"].values()] == ids
    assert side["cluster"]["policy"]["name"] == "fcfs" and side["cluster"]["nodes"][0]["cores"] == 2
    assert all(e["work"] == 1.0 for e in side["jobs"].values())
    # errors: an empty range, a range that ends before it starts, a time that is no time (exit 2)
    code, _, err = _cli(daemon, capsys, "history", "export", "--swf", str(tmp_path / "x.swf"),
                        "--since", str(last + 3600))
    assert code == 2 and "no finished job submitted in" in err and not (tmp_path / "x.swf").exists()
    code, _, err = _cli(daemon, capsys, "history", "export", "--swf", str(tmp_path / "x.swf"),
                        "--since", "2026-11-25T05:00Z", "--until", "2026-11-25T04:00Z")
    assert code == 2 and "--until" in err and "not after" in err
    code, _, err = _cli(daemon, capsys, "whatif", "--policies", "easy,nosuch")
    assert code == 2 and "unknown policy 'nosuch'" in err

    # vmctl whatif: each policy replayed beside what happened, the error on the policy in force (fcfs)
    code, out, err = _cli(daemon, capsys, "whatif", "--policies", "easy,fcfs", "--workers", "1", "-o", "json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    assert [p["policy"] for p in doc["policies"]] == ["easy", "fcfs"]
    assert [p["in_force"] for p in doc["policies"]] == [False, True]
    assert all(p["jobs"] == 5 and p["family"] == "easy" for p in doc["policies"])
    assert doc["actual"]["policy"] == "fcfs" and doc["actual"]["jobs"] == 5
    e = doc["error_in_force"]
    assert e["jobs_compared"] == 5 and e["start"]["max_abs"] is not None
    assert [pj["vmctl_id"] for pj in e["per_job"]] == ids
    code, out, err = _cli(daemon, capsys, "whatif", "--policies", "fcfs", "--workers", "1")
    assert code == 0, err
    assert "fcfs (in force)" in out and "actual (fcfs)" in out and "simulator vs actual on fcfs" in out
