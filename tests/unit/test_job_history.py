"""``job show``: runs, requeues and the history of starts, tier changes, migrations and requeues, with
reasons, stored with the job (it survives a daemon restart)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_daemon_core import Cluster
from vmctl.api.server import job_json
from vmctl.cli.ops import history_text
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
    assert events == ["submitted", "started", "requeued", "started"], doc["history"]
    assert doc["history"][2]["detail"] == f"requeued: node {node} down"
    assert doc["history"][1]["detail"].startswith(f"run 1 as fg on {node}:")
    assert doc["history"][3]["detail"].startswith("run 2 as fg on ")
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
