"""``vmctl demo``: the workload it builds, the summary it computes, and a short real run (vmctld + 3
mock agents, ~15 s) that must finish jobs and leave no process behind."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vmctl.cli.demo.summary import BSLD_TAU, summarize
from vmctl.cli.demo.workload import build_demo_workload


def test_workload_is_in_model_time_and_fits() -> None:
    jobs, info = build_demo_workload(30, 12, speed=100, duration=60, seed=3)
    assert len(jobs) == 30 and info["model"] == "feitelson96" and not info["compressed"]
    assert all(j.spec["procs"] <= 12 for j in jobs)
    assert max(j.at for j in jobs) <= 30.0 + 1e-6  # arrivals (real seconds) in the first half of the duration
    assert [j.at for j in jobs] == sorted(j.at for j in jobs)
    for j in jobs:
        tasks = j.spec["tasks"]
        assert len(tasks) == j.spec["procs"]
        run = tasks[0]["work_seconds"]  # model seconds: the daemon and the agents run at 100x
        assert 0 < run <= 2000.0 + 1e-6  # capped at a third of the duration (20 real s = 2000 model s)
        assert j.spec["estimate"] >= run
        if 20.0 < run < 2000.0:
            assert run == pytest.approx(j.model_run_time, abs=2e-3)
    again, _ = build_demo_workload(30, 12, speed=100, duration=60, seed=3)
    assert [j.spec for j in again] == [j.spec for j in jobs]  # seeded
    # a real-time daemon (--backend libvirt): the job times are compressed instead
    comp, info = build_demo_workload(30, 12, speed=100, duration=60, seed=3, compress=True)
    assert info["compressed"] and [j.at for j in comp] == [j.at for j in jobs]
    for a, b in zip(jobs, comp, strict=True):
        assert b.spec["tasks"][0]["work_seconds"] == pytest.approx(a.spec["tasks"][0]["work_seconds"] / 100, abs=1e-3)
        assert b.spec["estimate"] == pytest.approx(a.spec["estimate"] / 100, abs=1e-3)


def test_small_samples_need_no_estimate_workaround() -> None:
    """feitelson96, seed 2, 12 jobs: TModel's default maximal estimate used to be too small."""
    jobs, _ = build_demo_workload(12, 12, speed=100, duration=60, seed=2)
    assert len(jobs) == 12 and all(j.spec["estimate"] >= j.spec["tasks"][0]["work_seconds"] for j in jobs)


def test_migration_counts_agree_and_say_what_aborted_means() -> None:
    """issue 25 item 6: the summary said "migrations: 4 (jobs' counters, same-host re-pins included); between
    nodes: aborted 4, completed 4", counts that did not add up, and never what "aborted" means."""
    from vmctl.cli.demo.summary import Summary, count_moves, migration_lines

    ops = [{"kind": "migrate", "state": "done", "origin": "policy"} for _ in range(4)]
    ops += [{"kind": "migrate", "state": "aborted", "origin": "policy", "note": "job done"} for _ in range(3)]
    ops += [{"kind": "migrate", "state": "aborted", "origin": "operator", "note": "job killed"},
            {"kind": "migrate", "state": "rolled_back", "origin": "policy", "note": "agent reported failed"},
            {"kind": "checkpoint", "state": "done"}]
    m = count_moves(ops)
    assert (m.started, m.by_operator, m.completed, m.aborted, m.failed, m.pending) == (9, 1, 4, 4, 1, 0)
    assert m.why == {"done": 3, "killed": 1}
    lines = migration_lines(Summary(migrations=5), m)
    assert lines == [
        "  migrations between nodes: 9 started (8 by the policy, 1 by an operator): 4 completed, 4 aborted because "
        "the job ended while moving (3 done, 1 killed), 1 failed and rolled back (the job ran on where it was)",
        "  jobs' migration counters (MIG in vmctl job list): 5 = 4 completed between nodes + 1 re-pin(s) to other "
        "cores of the same node",
    ]
    # the numbers add up: started = completed + aborted + failed (+ still moving); counters = completed + re-pins
    assert m.started == m.completed + m.aborted + m.failed + m.pending
    none = migration_lines(Summary(migrations=0), count_moves([]))
    assert none[0].startswith("  migrations between nodes: 0 started (0 by the policy, 0 by an operator): 0 completed")


def test_event_feed_orders_a_measy_move_and_names_it() -> None:
    """issue 25 item 6: a MEASY migration read "migrating A -> B" then "promoted bg -> fg" at the same instant:
    one move from bg on one node to fg on another is one event, and a promotion is only one in place."""
    from vmctl.cli.demo.view import EventFeed

    def job(jid: str, state: str, tier: str | None, nodes: list[str], migs: int = 0, runs: int = 1) -> dict[str, Any]:
        return {"id": jid, "state": state, "tier": tier, "migrations": migs, "runs": runs,
                "placement": [{"node": n, "core": 0} for n in nodes]}

    feed = EventFeed()
    feed.update([job("3", "running", "bg", ["node2"]), job("4", "running", "bg", ["node1"]),
                 job("5", "running", "bg", ["node3"])], 1.0)
    feed.update([job("3", "running", "fg", ["node1"]), job("4", "running", "fg", ["node1"]),
                 job("5", "running", "fg", ["node2"])], 2.0)
    feed.update([job("3", "running", "fg", ["node1"], migs=1), job("4", "running", "fg", ["node1"]),
                 job("5", "done", "fg", ["node2"])], 3.0)
    assert feed.lines == [
        "   1.0s  job 3 started in the bg tier on node2",
        "   1.0s  job 4 started in the bg tier on node1",
        "   1.0s  job 5 started in the bg tier on node3",
        "   2.0s  job 3 migrating node2 -> node1 (bg -> fg)",
        "   2.0s  job 4 promoted bg -> fg in place on node1",
        "   2.0s  job 5 migrating node3 -> node2 (bg -> fg)",
        "   3.0s  job 3 migration done, on node1",
        "   3.0s  job 5 done while moving: its migration is aborted",
    ]
    # a counter that grows without a move between nodes is a re-pin; KEASY's kill and restart is no migration
    feed.update([job("4", "running", "fg", ["node1"], migs=1), job("6", "running", "bg", ["node3"])], 4.0)
    feed.update([job("6", "running", "fg", ["node1"], runs=2)], 5.0)
    assert feed.lines[-3:] == ["   4.0s  job 4 re-pinned to other cores of node1",
                               "   4.0s  job 6 started in the bg tier on node3",
                               "   5.0s  job 6 restarted (run 2) in the fg tier on node1"]


def test_summary_in_model_time() -> None:
    jobs = [
        {"id": "1", "state": "done", "submit_time": 100.0, "start_time": 101.0, "end_time": 103.0, "migrations": 1,
         "tier": None},
        {"id": "2", "state": "done", "submit_time": 100.0, "start_time": 100.0, "end_time": 100.05,
         "migrations": 0, "tier": None},
        {"id": "3", "state": "killed", "submit_time": 100.0, "start_time": 100.0, "end_time": 109.0,
         "migrations": 0, "tier": None},
        {"id": "4", "state": "queued", "submit_time": 100.0, "start_time": None, "end_time": None, "migrations": 0},
    ]
    s = summarize(jobs, speed=10)
    assert s.by_state == {"done": 2, "killed": 1, "queued": 1} and s.migrations == 1
    # job 1: response 30 model-s, run 20 -> bsld 1.5; job 2: response 0.5, run 0.5 -> max(1, 0.5/tau) = 1
    assert s.mean_response == pytest.approx((30 + 0.5) / 2)
    assert s.mean_wait == pytest.approx(5.0)
    assert s.mean_bsld == pytest.approx((1.5 + 1.0) / 2) and s.max_bsld == pytest.approx(1.5)
    assert BSLD_TAU == 10.0
    assert math.isnan(summarize([], speed=1).mean_response)


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid:
            out.add(int(entry.name))
    return out


@pytest.mark.slow
def test_short_demo_run(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = dict(os.environ)
    env.pop("VMCTL_URL", None)
    env.pop("VMCTL_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmctl.cli.main", "demo", "--duration", "14", "--jobs", "10", "--nodes", "3",
         "--cores", "2", "--no-live", "--state-dir", str(state), "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"demo did not finish in 120 s\n{out}\n{err}")
    assert proc.returncode == 0, f"{out}\n{err}"
    assert "summary (10 feitelson96 jobs" in out
    m = re.search(r"jobs by state: (.*)", out)
    assert m and "done" in m.group(1)
    assert re.search(r"mean response time: [\d,.]+ s", out), out
    assert re.search(r"bounded slowdown \(tau=10 s\): mean [\d,.]+", out), out
    assert re.search(r"migrations between nodes: (\d+) started \(\d+ by the policy, 0 by an operator\): "
                     r"(\d+) completed, (\d+) aborted because the job ended while moving", out), out
    m = re.search(r"migrations between nodes: (\d+) started .*: (\d+) completed, (\d+) aborted .* (\d+) failed", out)
    assert m and int(m.group(1)) >= int(m.group(2)) + int(m.group(3)) + int(m.group(4)), out
    assert re.search(r"jobs' migration counters \(MIG in vmctl job list\): \d+ = \d+ completed between nodes \+ "
                     r"\d+ re-pin", out), out
    # --no-live says where the metrics are and which token reads them
    assert re.search(r"metrics https://127\.0\.0\.1:\d+/metrics with the bearer token in \S+/admin\.token", out), out
    assert "daemon clock at 1000x" in out  # vmctld and the agents ran on the accelerated clock
    pids = [int(p) for p in re.findall(r"pid (\d+)", out)] + [
        int(p) for p in re.search(r"pids ([\d, ]+)\)", out).group(1).split(",")]  # type: ignore[union-attr]
    assert len(pids) == 4
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid
    assert not _children(proc.pid)
    assert (state / "vmctld.log").exists() and (state / "vmctld.db").exists()


@pytest.mark.slow
def test_sigterm_ends_the_demo_and_its_daemons(tmp_path: Path) -> None:
    """``kill PID`` of a running demo stops vmctld and the agents it started, as Ctrl-C does."""
    env = dict(os.environ)
    env.pop("VMCTL_URL", None)
    env.pop("VMCTL_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vmctl.cli.main", "demo", "--duration", "600", "--jobs", "50", "--nodes", "2",
         "--cores", "2", "--no-live", "--state-dir", str(tmp_path / "state"), "--seed", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # the demo names its processes once they run
            lines.append(line)
            if "agents (pids" in line:
                break
        started = "".join(lines)
        assert "agents (pids" in started, started
        pids = [int(p) for p in re.findall(r"pid (\d+)", started)] + [
            int(p) for p in re.search(r"pids ([\d, ]+)\)", started).group(1).split(",")]  # type: ignore[union-attr]
        assert len(pids) == 3
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.communicate()
    left = [pid for pid in pids
            if Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]]
    for pid in left:  # the demo's own processes, left by a failure: end them, then fail
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"left running after SIGTERM: {left}"
    assert proc.returncode != 0
    assert "Traceback" not in rest, rest


def test_operator_migration_picks_a_fitting_target(tmp_path: Path) -> None:

    from vmctl import errors
    from vmctl.cli.demo.command import Demo, DemoOptions

    class FakeApi:
        def __init__(self) -> None:
            self.calls: list[tuple[str, str]] = []

        def migrate_job(self, job_id: str, to_node: str) -> dict[str, Any]:
            self.calls.append((job_id, to_node))
            if job_id == "1":
                raise errors.Conflict(what="job 1", problem="is migrating")
            return {"id": "op7", "kind": "migrate", "state": "pending"}

    demo = Demo(DemoOptions(state_dir=str(tmp_path), migrate=True), echo=lambda *_: None)
    state = {
        "nodes": [{"name": "n1", "cores": 4, "fg_busy": 4, "state": "ready"},
                  {"name": "n2", "cores": 4, "fg_busy": 3, "state": "ready"},
                  {"name": "n3", "cores": 4, "fg_busy": 1, "state": "ready"},
                  {"name": "n4", "cores": 4, "fg_busy": 0, "state": "drained"}],
        "jobs": [
            {"id": "0", "state": "running", "tier": "bg", "procs": 1, "placement": [{"node": "n1", "core": 0}]},
            {"id": "1", "state": "running", "tier": "fg", "procs": 2,
             "placement": [{"node": "n1", "core": 0}, {"node": "n1", "core": 1}]},
            {"id": "2", "state": "running", "tier": "fg", "procs": 2,
             "placement": [{"node": "n1", "core": 2}, {"node": "n2", "core": 3}]},
            {"id": "3", "state": "running", "tier": "fg", "procs": 3,
             "placement": [{"node": "n1", "core": 2}, {"node": "n1", "core": 3}, {"node": "n1", "core": 1}]},
        ],
    }
    api = FakeApi()
    assert demo.operator_migration(api, state, 5.0)  # type: ignore[arg-type]
    # job 0 is bg, job 2 spans two nodes; job 1 is refused by the daemon; job 3 fits on n3 (3 idle fg cores)
    assert api.calls == [("1", "n3"), ("3", "n3")]
    assert "conflict" in demo.events[0] and "operation op7 pending" in demo.events[1]
    assert not demo.operator_migration(api, {"nodes": state["nodes"], "jobs": []}, 6.0)  # type: ignore[arg-type]
