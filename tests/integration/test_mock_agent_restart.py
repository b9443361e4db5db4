"""A ``vmctl-agent`` process on the mock backend is killed (kill -9, by pid) while its guests run job
processes, and started again with the same config: the guests outlived the agent, as real ones do.
Each job process is started exactly once, its progress went on while the agent was dead (model time
from start to exit is the work, not the work plus the time before the kill), and the first report of
the new agent shows the same VMs and processes."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from vmctl.localcluster import ManagedProcess

SPEED = 10.0  # model seconds per real second
WORK = 100.0  # model seconds of work per process: 10 real seconds
LEAD = 40.0  # model seconds of progress before the kill
TOL = 10.0  # model seconds (1 real s): report latency (observe -> report) on a loaded machine
JOBS = {"n1-c0-fg": ("j1", 0), "n1-c1-fg": ("j2", 0)}


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not written yet (the reporter replaces it atomically)
        return None
    return data if isinstance(data, dict) else None


def _vms(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(v["name"]): v for v in report.get("vms", [])}


def _wait(what: str, cond: Any, proc: ManagedProcess, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        assert proc.alive(), f"{proc.name} died{proc.tail(20)}"
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}{proc.tail(20)}")


def _starts(log: Path, vm: str) -> int:
    """How often the agent (all its lives) applied StartProcess to ``vm`` (its INFO log says so)."""
    text = log.read_text(encoding="utf-8", errors="replace")
    return text.count(f"apply StartProcess(vm='{vm}'")


@pytest.mark.slow
def test_killed_mock_agent_readopts_its_running_guests(tmp_path: Path) -> None:
    epoch = time.time()
    desired = {"node": "n1", "generation": 1, "vms": [
        {"name": vm, "core": i, "role": "fg", "weight": 10000,
         "process": {"job_id": job, "index": idx, "work_seconds": WORK, "cpu_usage": 1.0}}
        for i, (vm, (job, idx)) in enumerate(JOBS.items())]}
    (tmp_path / "desired.yaml").write_text(yaml.safe_dump(desired), encoding="utf-8")
    report_path = tmp_path / "report.json"
    cfg = {"node": "n1", "log_level": "info",
           # the state file defaults to one next to the fabric inbox (backend.state_file)
           "backend": {"kind": "mock", "cores": 2, "fabric_dir": str(tmp_path / "fabric"), "poll_seconds": 0.05},
           "clock": {"speed": SPEED, "epoch": epoch},
           "reconcile": {"resync_seconds": 0.2, "backoff_initial_seconds": 0.1, "backoff_max_seconds": 0.5},
           "desired": {"file": str(tmp_path / "desired.yaml")},
           "report": {"file": str(report_path)}}
    cfg_path = tmp_path / "agent.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    log = tmp_path / "agent.log"
    argv = [sys.executable, "-m", "vmctl.agents.main", "--config", str(cfg_path)]

    def reports_running(r: dict[str, Any] | None) -> bool:
        vms = _vms(r) if r else {}
        return all(n in vms and vms[n]["power"] == "running" and vms[n]["process_job"] == JOBS[n][0]
                   and vms[n]["process_exit"] is None for n in JOBS)

    first = ManagedProcess("agent-1", argv, log)
    second: ManagedProcess | None = None
    try:
        first.start()
        r0 = _wait("both processes running", lambda: (r := _read_report(report_path)) and reports_running(r) and r,
                   first)
        # a process on a core of its own progresses in real (model) time from its start, and an idle guest
        # uses no CPU: the start of each process is the report's time minus the VM's CPU time
        began = {n: float(r0["time"]) - float(v["cpu_time_s"]) for n, v in _vms(r0).items() if n in JOBS}
        before = _wait(f"{LEAD} model s of progress",
                       lambda: (r := _read_report(report_path)) and reports_running(r)
                       and all(_vms(r)[n]["cpu_time_s"] >= LEAD for n in JOBS) and r, first)
        assert first.proc is not None
        os.kill(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        first.stop()
        report_path.unlink()  # only reports of the new agent from here on

        second = ManagedProcess("agent-2", argv, log)
        second.start()
        after = _wait("the first report of the restarted agent",
                      lambda: (r := _read_report(report_path)) and r, second)
        # the same VMs and the same processes, still running, with their progress (not reset)
        vms = _vms(after)
        for n, (job, idx) in JOBS.items():
            assert n in vms, after
            assert vms[n]["power"] == "running", vms[n]
            assert (vms[n]["process_job"], vms[n]["process_index"]) == (job, idx), vms[n]
            assert vms[n]["cpu_time_s"] >= _vms(before)[n]["cpu_time_s"], (vms[n], _vms(before)[n])
            if vms[n]["process_exit"] is None:
                # the guest kept running while the agent was dead: progress = model time since the start
                assert abs(float(after["time"]) - float(vms[n]["cpu_time_s"]) - began[n]) <= TOL, (after, began)
        done = _wait("both processes to exit",
                     lambda: (r := _read_report(report_path)) and all(
                         _vms(r).get(n, {}).get("process_exit") is not None for n in JOBS) and r, second)
        for n in JOBS:
            v = _vms(done)[n]
            assert v["process_exit"] == 0, v
            assert v["cpu_time_s"] == pytest.approx(WORK, abs=0.01), v
        # model time from start to exit is the work: the process ended at began + WORK, and its exit was
        # reported promptly (the poll thread wakes the agent on an exit); a re-run would end LEAD later
        assert float(done["time"]) - max(began.values()) >= WORK - TOL, (done, began)
        assert float(done["time"]) - min(began.values()) < WORK + LEAD, (done, began)
        for n in JOBS:
            assert _starts(log, n) == 1, f"{n} started {_starts(log, n)} times"
    finally:
        first.stop()
        if second is not None:
            second.stop()
