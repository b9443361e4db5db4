"""Per-node boots of task-bag workers in the what-if replay (issue 28): vmctld's ``running`` entry of a bag
lists each worker's node and start delay (``workers``), the export's header-level ``node_boots`` (median per
node), and the replay under a task-bag policy gives each worker the boot of the node it is placed on
(:class:`vmctl.sim.exec_taskbag.TaskBagModel`'s ``boots``) instead of the bag's mean on every worker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_daemon_core import Cluster
from tests.unit.test_whatif import T0, job
from vmctl.policies.registry import create_policy
from vmctl.sim.workloads.swf import read_side_file, read_swf
from vmctl.whatif.export import build_trace, node_boots, worker_boots, write_trace
from vmctl.whatif.replay import actual, replay

#: 4 nodes of 1 core, shared/2: ``slow`` is a real host whose guests boot for a minute, the others mock hosts
NODES = [{"name": n, "cores": 1, "speed": 1.0, "group": "default", "levels": 2, "discipline": "shared",
          "state": "ready"} for n in ("f1", "f2", "f3", "slow")]
POLICY = {"name": "dispatch-priority", "params": {}, "layout": {"discipline": "shared", "levels": 2}}
SLOW, FAST = 60.0, 2.0


def bag(jid: str, submit: float, start: float, end: float, on: list[tuple[str, float]],
        workers: bool = True) -> dict[str, Any]:
    """A finished bag of 8 tasks of 100 s on 4 workers, started at ``start``; ``on``: each worker's node
    and start delay (the ``running`` entry's ``workers``; left out when ``workers`` is False)."""
    mean = sum(d for _n, d in on) / len(on)
    running: dict[str, Any] = {"time": T0 + start + max(d for _n, d in on), "event": "running",
                               "detail": "4 workers running", "boot": mean}
    if workers:
        running["workers"] = [[n, d] for n, d in on]
    hist = [{"time": T0 + submit, "event": "submitted", "detail": None},
            {"time": T0 + start, "event": "started", "detail": "run 1"}, running,
            {"time": T0 + end, "event": "done", "detail": "finished"}]
    return job(jid, submit, start, end, procs=4, work_seconds=None, history=hist, estimate=800.0,
               shape={"kind": "task-bag", "tasks": [100.0] * 8, "max_workers": 4, "task_usage": 0.01})


def history(workers: bool = True) -> list[dict[str, Any]]:
    """One bag alone on the 4 cores, as vmctld ran it: the 3 fast workers run tasks 0-2 in [2, 102) and
    4-6 in [102, 202), the slow one task 3 in [60, 160) and task 7 in [160, 260): the bag ends at 260.
    Its mean boot is 16.5 s: on every worker the bag would end at 16.5 + 200 = 216.5."""
    on = [("f1", FAST), ("f2", FAST), ("f3", FAST), ("slow", SLOW)]
    return [bag("1", 0.0, 0.0, 260.0, on, workers)]


def export(tmp_path: Path, jobs: list[dict[str, Any]]) -> Path:
    path = tmp_path / "h.swf"
    write_trace(build_trace(jobs, NODES, POLICY), path)
    return path


def test_the_export_gives_each_nodes_median_worker_boot(tmp_path: Path) -> None:
    assert worker_boots(history()[0]) == [("f1", 2.0), ("f2", 2.0), ("f3", 2.0), ("slow", 60.0)]
    second = bag("2", 300.0, 300.0, 560.0, [("f1", 4.0), ("f2", 2.0), ("f3", 2.0), ("slow", 50.0)])
    assert node_boots([*history(), second]) == {"f1": 3.0, "f2": 2.0, "f3": 2.0, "slow": 55.0}
    side = read_side_file(export(tmp_path, history()))
    assert side is not None and side["node_boots"] == {"f1": 2.0, "f2": 2.0, "f3": 2.0, "slow": 60.0}
    assert side["jobs"]["1"]["boot"] == 16.5  # the bag's mean stays (older readers use it)


def test_a_history_without_worker_boots_has_no_node_boots_and_replays_as_before(tmp_path: Path) -> None:
    path = export(tmp_path, history(workers=False))
    side = read_side_file(path)
    assert side is not None and "node_boots" not in side
    assert replay(path, "dispatch-priority", {}) == replay(path, "dispatch-priority", {}, boot="bag")
    assert read_swf(path, boot="node").jobs[0].run_time == read_swf(path, boot="none").jobs[0].run_time


def test_the_replay_gives_each_worker_its_nodes_boot(tmp_path: Path) -> None:
    """The per-node replay reproduces the live bag (the slow node's worker takes 2 tasks after its minute
    of boot, the fast ones 2 each after 2 s); the bag's mean on every worker ends it 43.5 s early (-17 %).
    Fails without per-node boots."""
    path = export(tmp_path, history())
    live = json.loads(actual(path)["jobs_json"])
    t = live["1"][0]  # the trace's time 0 is the whole second before the first submit
    assert live["1"] == pytest.approx([t, t + 260.0], abs=1e-6)
    per_node = json.loads(replay(path, "dispatch-priority", {})["jobs_json"])
    assert per_node["1"] == pytest.approx(live["1"], abs=1e-6)
    per_bag = json.loads(replay(path, "dispatch-priority", {}, boot="bag")["jobs_json"])
    assert per_bag["1"] == pytest.approx([t, t + 216.5], abs=1e-6)


def test_vmctld_lists_each_workers_node_and_delay(tmp_path: Path) -> None:
    b = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=create_policy("dispatch-proportion"), shared_levels=2)
    jid = b.daemon.submit([{"shape": {"kind": "task-bag", "tasks": [5.0] * 6}, "procs": 6, "estimate": 30.0}])[0].id
    b.run_until(lambda: b.state(jid) == "done", limit=2000)
    hist = b.daemon.job(jid).history
    running = next(h for h in hist if h["event"] == "running")
    started = next(h["time"] for h in hist if h["event"] == "started")
    ws = running["workers"]
    assert ws and {n for n, _d in ws} <= {"n1", "n2"}, running
    assert all(0.0 <= d <= running["time"] - started + 1e-6 for _n, d in ws)
    assert running["boot"] == pytest.approx(sum(d for _n, d in ws) / len(ws), abs=0.01)
    # the API's job document (GET /v1/history's) keeps them: the export reads it
    from vmctl.api.documents import job_json

    doc = job_json(b.daemon.job(jid))
    assert next(h for h in doc["history"] if h["event"] == "running")["boot"] == running["boot"]
    assert worker_boots(doc) == [(n, d) for n, d in ws]
    b.close()


def test_a_worker_a_bag_gains_later_boots_on_its_node(tmp_path: Path) -> None:
    """Bag 2 (6 tasks of 100 s, up to 4 workers) starts at 1 on the one free core (f2: tasks 0, 1 after a
    2 s boot, to 203); when bag 1 (one 200 s task on f1) ends at 202, the policy grows bag 2 onto f1, f3
    and slow: their workers boot 2, 2 and 60 s before tasks 2, 3, 4 (f1 and f3 end at 304, slow at 362)
    and f2 takes task 5 (303): the bag ends at 362, its new workers' boots counted in its work (the
    engine's ``grown_work``; without it the bag would end when its first work is done)."""
    def one(jid: str, submit: float, end: float, on: list[tuple[str, float]], tasks: list[float],
            width: int) -> dict[str, Any]:
        d = bag(jid, submit, submit, end, on)
        d.update(procs=width, shape={"kind": "task-bag", "tasks": tasks, "max_workers": width, "task_usage": 0.01})
        return d

    path = export(tmp_path, [one("1", 0.0, 202.0, [("f1", FAST)], [200.0], 1),
                             one("2", 1.0, 362.0, [("f2", FAST), ("f3", FAST), ("slow", SLOW)], [100.0] * 6, 4)])
    live = json.loads(actual(path)["jobs_json"])
    t = live["1"][0]
    sim = json.loads(replay(path, "dispatch-priority", {})["jobs_json"])
    assert sim["1"] == pytest.approx([t, t + 202.0], abs=1e-6)
    assert sim["2"] == pytest.approx([t + 1.0, t + 1.0 + 2.0 + 200.0 - 1.0 + 60.0 + 100.0], abs=1e-6)


def test_vmctl_whatif_says_the_workers_boot_on_their_node(tmp_path: Path) -> None:
    from vmctl.whatif.report import render, run_whatif

    path = export(tmp_path, history())
    doc = run_whatif(path, ["dispatch-priority"], {}, POLICY, 1, tmp_path / "w.csv")
    assert doc["boot"]["node_boots"] == {"f1": 2.0, "f2": 2.0, "f3": 2.0, "slow": 60.0}
    assert abs(doc["error_in_force"]["avg_response_relative"]) < 1e-6
    assert "a task bag's workers the boot of the node they run on (f1 2.0 s" in render(doc)
    bag = run_whatif(path, ["dispatch-priority"], {}, POLICY, 1, tmp_path / "b.csv", boot="bag")
    assert bag["error_in_force"]["avg_response_relative"] < -0.1 and "(--boot bag)" in render(bag)
