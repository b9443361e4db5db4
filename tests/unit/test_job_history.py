"""``job show``: runs, requeues and the history of starts, tier changes, migrations and requeues, with
reasons, stored with the job (it survives a daemon restart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import expected_starts, job_json, op_json
from vmctl.cli.job import history_text
from vmctl.cli.op import op_text
from vmctl.cli.render import fmt_start
from vmctl.model import JobState
from vmctl.store.base import JobRecord


def test_requeue_and_restart_are_in_the_history(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2}, node_down_s=60.0)
    jid = c.submit(2, 500, 400)
    c.run_until(lambda: c.state(jid) == "running")
    node = c.daemon.job(jid).placement[0][0]
    c.down.add(node)  # its agent goes silent: the node is lost, then down, and the job is requeued
    c.run_until(lambda: c.daemon.job(jid).run == 2 and c.state(jid) == "running", limit=300)
    doc = job_json(c.daemon.job(jid))
    assert doc["runs"] == 2 and doc["requeues"] == 1
    events = [h["event"] for h in doc["history"]]
    # "running": the agents' first report showing every process of the run started (each run's own)
    assert events == ["submitted", "started", "running", "requeued", "started", "running"], doc["history"]
    assert doc["history"][3]["detail"] == f"requeued: node {node} down"
    assert doc["history"][1]["detail"].startswith(f"run 1 as fg on {node}:")
    assert doc["history"][4]["detail"].startswith("run 2 as fg on ")
    assert doc["history"][5]["detail"].startswith("2 processes running ")
    assert doc["history"][5]["time"] >= doc["history"][4]["time"]
    text = history_text(doc["history"])
    assert f"requeued: requeued: node {node} down" in text
    # stored with the job: a restarted daemon still has it
    c.restart()
    assert [h["event"] for h in c.daemon.job(jid).history] == events
    c.close()


def test_api_reasons_carry_iso_8601_times() -> None:
    """The policy writes ``t=<epoch seconds>``; the API answers ISO 8601 UTC instead."""
    rec = JobRecord(id="2", seq=2, name="b", spec={"procs": 4, "estimate": 60.0}, state=JobState.QUEUED,
                    submit_time=1795460000.0, reason="head of queue: reservation at t=1795460000.0 needs 4 cores")
    assert job_json(rec)["reason"] == "head of queue: reservation at 2026-11-23T18:53:20Z needs 4 cores"
    rec.reason = "does not fit, or would delay the reservation of 1 at t=1.79546e+09"
    assert job_json(rec)["reason"].endswith("reservation of 1 at 2026-11-23T18:53:20Z")


def test_operator_migration_is_an_operation_and_in_the_history(tmp_path: Path) -> None:
    """``vmctl migrate`` prints an operation id that ``vmctl op show`` answers: its moves as node:core,
    who asked and how it ended; the job's history has the migration."""
    c = Cluster(tmp_path, {"n1": 2, "n2": 2})
    jid = c.submit(2, 200, 60)
    c.step()
    src = c.daemon.job(jid).placement[0][0]
    dst = "n2" if src == "n1" else "n1"
    op = c.daemon.migrate_job(jid, dst)
    c.run_until(lambda: c.daemon.state.ops[op.id].state != "pending", limit=60)
    doc = op_json(c.daemon.state.ops[op.id])
    assert doc["id"] == op.id and doc["kind"] == "migrate" and doc["state"] == "done" and doc["job_id"] == jid
    assert doc["origin"] == "operator"
    assert {m["from"].split(":")[0] for m in doc["moves"]} == {src} and all(
        m["to"].startswith(f"{dst}:") for m in doc["moves"])
    text = op_text(doc)
    assert f"operation {op.id}: migrate of job {jid}, done" in text and f"-> {dst}:" in text
    hist = c.daemon.job(jid).history
    assert hist[-1]["event"] == "migrated" and hist[-1]["detail"].startswith(f"{src}:"), hist
    c.close()


def test_the_queue_head_has_its_expected_start(tmp_path: Path) -> None:
    """Like ``squeue --start``: the job holding the policy's reservation says when it starts at the latest."""
    c = Cluster(tmp_path, {"n1": 3})
    a = c.submit(2, 100, 90)
    c.run_until(lambda: c.state(a) == "running")
    b = c.submit(3, 50, 10)
    c.submit(1, 500, 10)  # a backfill candidate: EASY computes the head's reservation for it
    c.step()
    starts = expected_starts(c.daemon)
    ra = c.daemon.job(a)
    assert ra.start_time is not None
    assert starts == {b: pytest.approx(ra.start_time + 100.0)}
    doc = job_json(c.daemon.job(b), starts.get(b))
    assert doc["expected_start"] == starts[b]
    assert fmt_start(doc).startswith("<= ") and fmt_start(job_json(ra, starts.get(a))) != "-"
    assert job_json(ra, 5.0)["expected_start"] is None  # only a queued job has one
    c.close()
