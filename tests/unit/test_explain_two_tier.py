"""issue 25 item 2: ``vmctl job explain`` (and the reason ``job list`` and ``top`` show) under MEASY with
a running bg job ahead of the queued one, and a requeued, held job's explain after a migration of its
earlier run. The in-process daemon and agents of test_daemon_core (virtual clock, mock backend)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import job_json
from vmctl.cli.job import explain_text
from vmctl.cli.top import top_text
from vmctl.policies.registry import create_policy


def test_explain_under_measy_with_a_running_bg_job_agrees_with_itself_and_the_list(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2}, policy=create_policy("measy"))
    fg = c.submit(2, 500, 400, cpu_usage=[0.5, 0.5])
    c.step()
    bg = c.submit(2, 500, 400)
    c.run_until(lambda: c.daemon.job(bg).tier == "bg")
    q = c.submit(2, 500, 400)
    c.step()
    assert c.daemon.job(fg).tier == "fg" and c.state(q) == "queued"
    doc = c.daemon.explain(q)
    assert doc["queue_position"] == 0 and doc["reservation"] is None and doc["migrations"] == []
    text = explain_text(doc)
    # the first queued job, waiting for fg cores that the running bg job gets first: no "head" it is
    # behind, no claim that it is the head, no "none blocks it"
    assert text.splitlines() == [
        f"job {q} is queued, position 1 in the queue (no queued job ahead of it)",
        f"reason: waiting for fg cores (none idle): bg job {bg}, running and submitted earlier, goes to fg before it",
        "reservation: none held now (no job has cores reserved for it)",
    ]
    # job list and top show the same reason
    listed = job_json(c.daemon.job(q))
    assert listed["reason"] == doc["reason"]
    top = top_text({"name": "measy"}, [], [], [listed], [])
    assert f"{q} {listed['name']} procs 2: {doc['reason']}" in top
    c.close()


def test_a_requeued_held_job_explains_its_next_run_without_the_last_run_s_migration(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2}, policy=create_policy("measy"))
    c.submit(2, 500, 400, cpu_usage=[0.5, 0.5])
    short = c.submit(2, 500, 20)
    c.step()
    b = c.submit(2, 500, 400)
    c.run_until(lambda: c.daemon.job(b).tier == "bg")
    # the short fg job ends: MEASY migrates B to its cores on the other node
    c.run_until(lambda: c.state(short) == "done" and c.daemon.job(b).tier == "fg" and not c.daemon.job(b).migrating)
    # the history names the tier change as a migration, and its completion after it (not a promotion)
    hist = [(h["event"], h["detail"]) for h in c.daemon.job(b).history]
    moved = [d for e, d in hist if e == "migrated"]
    assert len(moved) == 1 and ("tier", f"bg -> fg by policy measy, migrating {moved[0]}") in hist
    assert [e for e, _d in hist].index("tier") < [e for e, _d in hist].index("migrated")
    running = c.daemon.explain(b)
    assert [m["state"] for m in running["migrations"]] == ["done"]
    assert "migration op" in explain_text(running)
    c.daemon.requeue(b, "new input", hold=True)
    doc = c.daemon.explain(b)
    assert doc["migrations"] == [] and doc["run"] == 1 and doc["held"]
    text = explain_text(doc)
    assert "migration" not in text and "reservation" not in text
    assert "run 1 ended (requeued); its next start is run 2, from the beginning" in text
    # released, it runs again and a migration of the new run would be listed (none yet)
    c.daemon.release(b)
    c.run_until(lambda: c.state(b) == "running")
    assert c.daemon.explain(b)["migrations"] == []
    c.close()
