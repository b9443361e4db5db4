"""A live migration between two ``vmctl-agent`` processes on the mock backend, driven by a real
``vmctld`` on loopback (both on an accelerated clock): the VM moves through the shared fabric
directory with its job's progress, and the daemon sees the migration complete."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from vmctl.files import write_cert_files
from vmctl.localcluster import DaemonProcess, ManagedProcess, agent_config, free_port

SPEED = 20.0  # model seconds per real second
WORK = 400.0  # model seconds of work: 20 real seconds
LEAD = 160.0  # model seconds of progress on the source before the migration: 8 real seconds


def _wait(what: str, cond: Any, timeout: float, procs: list[ManagedProcess]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        for p in procs:
            assert p.alive(), f"{p.name} died{p.tail(20)}"
        time.sleep(0.1)
    tails = "".join(p.tail(15) for p in procs)
    pytest.fail(f"timed out waiting for {what}{tails}")


@pytest.mark.slow
def test_live_migration_between_agent_processes(tmp_path: Path) -> None:
    epoch = time.time()
    clock = {"speed": SPEED, "epoch": epoch}

    def model(t: float) -> float:  # the model time of wall-clock instant t, as every process computes it
        return epoch + (t - epoch) * SPEED

    daemon = DaemonProcess(tmp_path / "state", policy="fcfs",
                           extra={"clock": clock, "migration": {"timeout_s": 30.0}})
    agents: list[ManagedProcess] = []
    try:
        daemon.start_and_wait(timeout=60)
        client = daemon.client()
        for node in ("node1", "node2"):
            crt, key, ca = write_cert_files(tmp_path / "pki", node, client.issue_cert(node))
            cfg = agent_config(node, daemon.url, {"cert": str(crt), "key": str(key), "ca": str(ca)}, backend="mock",
                               cores=1, libvirt_uri="", metrics_port=free_port(), peers=["node1", "node2"],
                               fabric_dir=str(tmp_path / "fabric"), clock=clock, migration_seconds=10.0)
            path = tmp_path / f"{node}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            a = ManagedProcess(node, [sys.executable, "-m", "vmctl.agents.main", "--config", str(path)],
                               tmp_path / f"{node}.log")
            a.start()
            agents.append(a)
        procs = [daemon, *agents]
        _wait("two ready nodes", lambda: len([n for n in client.list_nodes() if n["state"] == "ready"]) == 2, 60,
              procs)
        submitted = time.time()
        job = client.submit_job({"name": "mover", "procs": 1, "estimate": 3 * WORK,
                                 "tasks": [{"work_seconds": WORK, "cpu_usage": 1.0}]})
        jid = str(job["id"])
        running = _wait("the job to run", lambda: (j := client.get_job(jid))["state"] == "running" and j, 60, procs)
        seen = time.time()
        src = running["placement"][0]["node"]
        dst = "node2" if src == "node1" else "node1"
        # daemon timestamps are model seconds: SPEED x the real time since the epoch; the job started between
        # the submission and the answer that said so (the lower bound allows the daemon's clock to have been
        # set up to one real second late: it reads the wall clock, then the monotonic clock)
        assert model(submitted) - SPEED <= running["start_time"] <= model(seen), (submitted, running, seen)
        start = float(running["start_time"])
        time.sleep(max(0.0, (start + LEAD - model(time.time())) / SPEED))  # LEAD model seconds of progress
        asked = time.time()
        op = client.migrate_job(jid, dst)
        assert op["kind"] == "migrate"
        moved = _wait("the migration to complete",
                      lambda: (j := client.get_job(jid))["migrations"] >= 1 and j, 60, procs)
        assert moved["state"] == "running" and moved["placement"][0]["node"] == dst
        mine = [v for v in client.list_vms(node=dst) if str(v["name"]).startswith(f"j{jid}-")]
        assert len(mine) == 1 and mine[0]["power"] == "running", mine
        assert not [v for v in client.list_vms(node=src) if str(v["name"]).startswith(f"j{jid}-")]
        done = _wait("the job to finish", lambda: (j := client.get_job(jid))["state"] in
                     ("done", "failed", "killed") and j, 60, procs)
        assert done["state"] == "done", done
        took = done["end_time"] - done["start_time"]
        assert took >= WORK - 1, took
        # the progress moved with the VM: a restart on the target could not have begun before the migration
        # was asked for, so it would end WORK model seconds after that at the earliest (LEAD = 160 model
        # seconds later than this job, which finished within the delays of starting, moving and reporting it)
        assert done["end_time"] < model(asked) - SPEED + WORK, (done, model(asked))
        assert list((tmp_path / "fabric").rglob("*.json")) == []
        assert 'vmctl_migrations_total{outcome="completed"} 1.0' in client.metrics_text()
    finally:
        for a in agents:
            a.stop()
        daemon.stop()
