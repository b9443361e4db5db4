"""vmctld gives a task bag worker slots on several levels of a core (issue 12: paper 001's testbed runs 2
workers per single-core node, and a job may hold any of them): the dispatcher's workers are (core, level)
pairs, persisted in the bag's record, and the desired VMs, the job answer's ``workers`` and the worker list
show them. A virtual clock, a SQLite store and in-process agents (the real reconciler on the mock backend,
a ``shared`` layout of 2 workers per core), as in ``test_dispatcher_daemon.py``."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import workers_json
from vmctl.cli.render import fmt_workers
from vmctl.cli.worker import worker_table
from vmctl.daemon import dispatcher
from vmctl.metrics import ClusterSnapshot, DaemonMetrics
from vmctl.policies.registry import create_policy
from vmctl.store.base import Slot, dumps


def _bag(cluster: Cluster, tasks: list[float]) -> str:
    spec = {"shape": {"kind": "task-bag", "tasks": tasks}, "procs": len(tasks), "estimate": sum(tasks)}
    return cluster.daemon.submit([spec])[0].id


def _starts(cluster: Cluster) -> Counter[str]:
    """How often each ``job[task]`` process was started, over every host."""
    return Counter(e.detail for _r, _s, _p, be in cluster.agents.values() for e in be.operations("start_process"))


def _done(cluster: Cluster, jid: str) -> int:
    return sum(t["exit_status"] is not None for t in cluster.daemon.job(jid).tasks)


def test_a_lone_bag_gets_every_worker_and_every_task_runs_once_across_a_kill(tmp_path: Path) -> None:
    """2 agents x 1 core x 2 shared levels, one bag of 12 tasks: it holds all 4 workers (it held 2, one
    level, before bags held several levels); a kill -9 mid-run loses no result and starts no task twice."""
    cluster = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=create_policy("dispatch-proportion"), shared_levels=2)
    a = _bag(cluster, [10.0] * 12)
    cluster.step()
    rec = cluster.daemon.job(a)
    ids = sorted(w["id"] for w in dispatcher.workers_doc(rec))
    assert ids == ["n1/0.0", "n1/0.1", "n2/0.0", "n2/0.1"]
    assert sorted(dispatcher.slot_levels(rec)) == [0, 0, 1, 1] and "level" not in (rec.bag or {})
    # the view, the desired VMs and the worker list say the same
    rj = cluster.daemon.view().running[a]
    assert sorted(rj.slots) == [(0, 0), (0, 1), (1, 0), (1, 1)] and rj.slot_levels is not None
    for node in ("n1", "n2"):
        assert sorted(v.slot_level for v in cluster.daemon.desired(node).vms) == [0, 1]
    cluster.step()
    workers = workers_json(cluster.daemon)
    states = {w["id"]: (w["state"], w["job_id"]) for w in workers}
    assert states == {w: ("busy", a) for w in ids}, states
    # what `vmctl job show`, `vmctl worker list` and the vmctl_workers gauge print of it
    shown = fmt_workers(dispatcher.workers_doc(cluster.daemon.job(a)))
    assert all(w in shown for w in ids), shown
    assert all(w in worker_table(workers).to_text() for w in ids)
    text = DaemonMetrics(lambda: ClusterSnapshot(workers=workers)).exposition()[0].decode()
    gauge = {(s.labels["node"], s.labels["state"]): s.value for fam in text_string_to_metric_families(text)
             if fam.name == "vmctl_workers" for s in fam.samples}
    assert gauge[("n1", "busy")] == gauge[("n2", "busy")] == 2 and gauge[("n1", "available")] == 0
    # a kill -9 while tasks run: the agents move on (tasks end) while nobody listens, then a new daemon
    cluster.run_until(lambda: _done(cluster, a) >= 4)
    before = {k: t["exit_status"] for k, t in enumerate(cluster.daemon.job(a).tasks)}
    for name, (agent, src, _rep, _be) in cluster.agents.items():
        src.set(cluster.daemon.desired(name))
        agent.run_once()
    cluster.clock.advance(12.0)
    for agent, _src, _rep, _be in cluster.agents.values():
        agent.run_once()
    cluster.restart()
    assert sorted(w["id"] for w in dispatcher.workers_doc(cluster.daemon.job(a))) == ids
    assert {k: t["exit_status"] for k, t in enumerate(cluster.daemon.job(a).tasks)
            if before[k] is not None} == {k: v for k, v in before.items() if v is not None}
    cluster.run_until(lambda: cluster.state(a) == "done", limit=2000)
    rec = cluster.daemon.job(a)
    assert [t["exit_status"] for t in rec.tasks] == [0] * 12
    assert {t["worker"] for t in rec.tasks} == set(ids)  # every worker ran tasks
    assert _starts(cluster) == Counter({f"{a}[{k}]": 1 for k in range(12)})
    assert all(w["state"] == "available" for w in workers_json(cluster.daemon))


def test_a_bag_record_of_the_old_form_loads_and_runs_after_an_upgrade(tmp_path: Path) -> None:
    """A record written before placement became slots (schema 008) and before bags held several levels
    has its placement in ``placement``/``tier`` and one ``level`` for all its workers in its bag column: a
    vmctld of this version migrates the store, loads it with its workers' slots (level 0 of n1 and n2),
    hands out the rest of its tasks on the same workers and every task runs exactly once."""
    cluster = Cluster(tmp_path, {"n1": 1, "n2": 1}, policy=create_policy("dispatch-priority", r=0.5),
                      shared_levels=2)
    a = _bag(cluster, [10.0] * 6)
    cluster.run_until(lambda: _done(cluster, a) >= 2)
    rec = cluster.daemon.job(a)
    assert rec.bag is not None and dispatcher.slot_levels(rec) == [0, 0]  # r = 0.5: 2 workers of 4, level 0
    # the store as the version before slots wrote it: {"level": 0} in the bag, tier and placement in the doc
    cluster.daemon.store.close()
    db = sqlite3.connect(tmp_path / "d.db")
    doc = json.loads(db.execute("SELECT doc FROM jobs WHERE id = ?", (a,)).fetchone()[0])
    bag = json.loads(db.execute("SELECT bag FROM jobs WHERE id = ?", (a,)).fetchone()[0])
    assert "levels" not in bag and "tier" not in doc
    doc["tier"], doc["placement"] = "fg", [[s[0], s[1]] for s in doc.pop("slots")]
    doc.pop("gang", None)  # a freshly stored document leaves its defaults out (issue 27)
    bag["level"] = 0
    db.execute("UPDATE jobs SET doc = ?, bag = ? WHERE id = ?", (dumps(doc), dumps(bag), a))
    db.execute("DELETE FROM schema_version WHERE version >= 8")
    db.commit()
    db.close()
    cluster.clock.advance(cluster.config.lease_ttl_s + 1)
    cluster.daemon = cluster._new_daemon()
    assert cluster.daemon.start()
    rec = cluster.daemon.job(a)
    assert rec.bag is not None and "level" not in rec.bag and rec.slots == [Slot("n1", 0, 0), Slot("n2", 0, 0)]
    assert sorted(w["id"] for w in dispatcher.workers_doc(rec)) == ["n1/0.0", "n2/0.0"]
    assert sorted(v.slot_level for v in cluster.daemon.desired("n1").vms) == [0]
    cluster.run_until(lambda: cluster.state(a) == "done", limit=2000)
    rec = cluster.daemon.job(a)
    assert [t["exit_status"] for t in rec.tasks] == [0] * 6
    assert {t["worker"] for t in rec.tasks} == {"n1/0.0", "n2/0.0"}
    assert rec.bag is not None and "level" not in rec.bag and rec.slots == []
    assert _starts(cluster) == Counter({f"{a}[{k}]": 1 for k in range(6)})
