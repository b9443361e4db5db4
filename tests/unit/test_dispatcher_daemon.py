"""vmctld's dispatcher of task bags with a virtual clock, a SQLite store and in-process agents (the
real reconciler on the mock backend, a ``shared`` layout of 2 workers per core): every task runs
exactly once, results survive a restart (kill -9: the in-memory state is lost, the store kept), the
status checker corrects each worker's throughput from observed durations, and worker states follow."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import workers_json
from vmctl.daemon import dispatcher
from vmctl.policies.registry import create_policy


def _bag(cluster: Cluster, tasks: list[float], **kw: object) -> str:
    spec = {"shape": {"kind": "task-bag", "tasks": tasks}, "procs": len(tasks), "estimate": sum(tasks), **kw}
    return cluster.daemon.submit([spec])[0].id


def _starts(cluster: Cluster) -> Counter[str]:
    """How often each ``job[task]`` process was started, over every host."""
    return Counter(e.detail for _r, _s, _p, be in cluster.agents.values() for e in be.operations("start_process"))


def test_every_task_runs_once_across_a_restart(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=create_policy("dispatch-proportion"), shared_levels=2)
    a = _bag(cluster, [10.0] * 9)
    b = _bag(cluster, [4.0] * 5)
    cluster.run_until(lambda: sum(t["exit_status"] is not None for t in cluster.daemon.job(a).tasks) >= 2)
    before = {k: t["exit_status"] for k, t in enumerate(cluster.daemon.job(a).tasks)}
    # a kill -9 between an agent's report and its commit: the agents move on (a task may end) and report
    # nothing, the daemon's memory is lost; the new daemon hears the re-reports
    running = [k for k in cluster.daemon.job(a).bag["task"] if k is not None]
    assert running and all(before[k] is None for k in running)
    for name, (rec, src, _rep, _be) in cluster.agents.items():  # the agents start what they were told ...
        src.set(cluster.daemon.desired(name))
        rec.run_once()
    cluster.clock.advance(12.0)  # ... and, longer than a task later, see it end while nobody listens
    for rec, _src, _rep, _be in cluster.agents.values():
        rec.run_once()
    cluster.restart()
    assert {k: t["exit_status"] for k, t in enumerate(cluster.daemon.job(a).tasks)
            if before[k] is not None} == {k: v for k, v in before.items() if v is not None}
    cluster.step()  # the agents re-report the processes that ended: recorded now, the workers move on
    assert all(cluster.daemon.job(a).tasks[k]["exit_status"] == 0 for k in running)
    cluster.run_until(lambda: cluster.state(a) == "done" and cluster.state(b) == "done", limit=2000)
    for jid, n in ((a, 9), (b, 5)):
        rec = cluster.daemon.job(jid)
        assert [t["exit_status"] for t in rec.tasks] == [0] * n
        assert all(t["worker"] and t["end"] >= t["start"] for t in rec.tasks)
        assert rec.placement == [] and dispatcher.tasks_left(rec) == 0
    starts = _starts(cluster)
    assert starts == Counter({f"{a}[{k}]": 1 for k in range(9)} | {f"{b}[{k}]": 1 for k in range(5)}), starts


def test_throughput_is_corrected_from_observed_durations_and_workers_follow(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"n1": 1}, policy=create_policy("dispatch-priority"), shared_levels=2)
    a = _bag(cluster, [6.0] * 4)
    cluster.step()
    states = {w["id"]: w["state"] for w in workers_json(cluster.daemon)}
    assert states["n1/0.0"] in ("busy", "occupied") and states["n1/0.1"] == "available", states
    cluster.run_until(lambda: cluster.daemon.job(a).tasks[0]["exit_status"] is not None)
    # the policy's view carries the corrected throughput of the slot the bag holds (RunningJob.throughput)
    rj = cluster.daemon.view().running[a]
    assert rj.tasks_left == 3 and rj.throughput is not None and set(rj.throughput) == {(0, 0)}, rj
    cluster.run_until(lambda: cluster.state(a) == "done")
    rec = cluster.daemon.job(a)
    # one worker alone on its core (the other level idle): 6 s of work take about 6 s (+ the 1 s steps)
    [rate] = rec.bag["rate"].values()
    assert 0.6 < rate <= 1.0, rate
    assert all(w["state"] == "available" for w in workers_json(cluster.daemon))


@pytest.mark.parametrize(("tasks", "runs"), [(12, 2), (60, 1)])
def test_a_down_node_loses_its_workers_not_the_bag(tmp_path: Path, tasks: int, runs: int) -> None:
    """A node goes down (no heartbeat past ``loop.node_down_s``): the bag keeps its results; the tasks
    that ran on the dead node go back and are handed out again first, so every task still ends with one
    result (a rigid job would be requeued from scratch). With 60 tasks the bag keeps running on its
    other workers (run 1); with 12 its other tasks are done before the node is down, it holds only the
    lost worker then, and it is requeued with its results and restarted elsewhere (run 2)."""
    cluster = Cluster(tmp_path, {"n1": 1, "n2": 1, "n3": 1}, policy=create_policy("dispatch-priority", r=0.0),
                      shared_levels=1)
    a = _bag(cluster, [20.0] * tasks)
    cluster.run_until(lambda: sum(t["exit_status"] is not None for t in cluster.daemon.job(a).tasks) >= 3)
    rec = cluster.daemon.job(a)
    assert len(rec.placement) == 3
    done_before = {k for k, t in enumerate(rec.tasks) if t["exit_status"] is not None}
    node = "n2"
    on_node = [k for i, k in enumerate(rec.bag["task"]) if rec.placement[i][0] == node and k is not None]
    assert on_node
    cluster.down.add(node)
    cluster.run_until(lambda: cluster.daemon.node(node).state == "lost", limit=100)
    rec = cluster.daemon.job(a)
    assert rec.state == "running" and rec.run == 1 and node in {n for n, _c in rec.placement}
    # the other workers go on while the node is lost (300 s)
    cluster.run_until(lambda: cluster.daemon.node(node).state == "down", limit=400)
    rec = cluster.daemon.job(a)
    assert node not in {n for n, _c in rec.placement}
    assert {k for k, t in enumerate(rec.tasks) if t["exit_status"] is not None} >= done_before
    cluster.run_until(lambda: cluster.state(a) == "done", limit=2000)
    rec = cluster.daemon.job(a)
    assert [t["exit_status"] for t in rec.tasks] == [0] * tasks
    assert rec.run == runs
    for k in on_node:  # the lost tasks ran again elsewhere
        assert rec.tasks[k]["worker"] is not None and not rec.tasks[k]["worker"].startswith(node)


def test_cancelling_a_running_bag_frees_its_workers_and_keeps_its_results(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=create_policy("dispatch-priority"), shared_levels=2)
    a = _bag(cluster, [10.0] * 8)
    cluster.run_until(lambda: sum(t["exit_status"] is not None for t in cluster.daemon.job(a).tasks) >= 2)
    done = [k for k, t in enumerate(cluster.daemon.job(a).tasks) if t["exit_status"] == 0]
    running = [k for k in cluster.daemon.job(a).bag["task"] if k is not None]
    rec = cluster.daemon.cancel(a)
    assert rec.state == "cancelled" and rec.placement == []
    assert dispatcher.tasks_left(rec) == 8 - len(done)  # the ones cut short and those never started
    assert [k for k, t in enumerate(rec.tasks) if t["exit_status"] == 0] == done
    assert all(rec.tasks[k]["exit_status"] is None and rec.tasks[k]["error"] == "stopped: job cancelled"
               for k in running) and running
    cluster.step()
    assert all(not cluster.daemon.desired(n).vms for n in ("n1", "n2"))  # the agents stop the workers' VMs
    assert all(w["state"] == "available" for w in workers_json(cluster.daemon))
