"""Issue 27: a decision no longer writes its default reason (EASY's names the moving shadow time) into
every queued job's record. What operators see must not change: ``vmctl job explain``, the API's job list
and job documents show each queued job's reason by the last decision, also after a crash (``restart``),
and a record stored after a change holds the reason it shows. The in-process daemon of test_daemon_core."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import expected_starts, job_json, reason_json
from vmctl.daemon.core import Daemon


def _shown(d: Daemon, jid: str) -> tuple[str | None, str | None, str | None]:
    """The reason of ``jid`` as explain, the job list (``GET /v1/jobs``) and the stored record show it."""
    starts = expected_starts(d)  # (the routes call it before building the documents)
    listed = next(job_json(r, starts.get(r.id), bag_tasks=False) for r in d.state.jobs.values() if r.id == jid)
    return d.explain(jid)["reason"], listed["reason"], d.job(jid).reason


def test_queued_reasons_follow_the_last_decision_through_a_restart(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 8})
    first = c.submit(4, 50, 10)  # ends well before its estimate: the head behind it starts early
    c.submit(2, 200, 200)
    c.step()
    head = c.submit(6, 50, 30)  # reserved at the first job's estimated end
    behind, last = c.submit(2, 300, 30), c.submit(2, 300, 30)  # fit now, but would delay it
    c.step()
    dec = c.daemon.last_decision
    assert dec is not None and dec.reservation is not None and dec.reservation.job_id == head
    was = dec.default_reason
    assert f"reservation of {head} at t=" in was
    assert [_shown(c.daemon, j)[:2] for j in (behind, last)] == [(was, _iso(was))] * 2
    c.run_until(lambda: c.state(first) == "done" and c.state(head) == "running")
    c.step()
    dec = c.daemon.last_decision
    assert dec is not None and behind in dec.reasons
    now = dec.default_reason
    assert now != was and dec.reason_for(last) == now
    # the decisions did not write the new default into the record of the job left at it (it holds the one
    # before); explain and the job list show the new one, and the list renders it into the record
    assert c.daemon.job(last).reason == was
    assert c.daemon.explain(last)["reason"] == now and c.daemon.state.reason_of(c.daemon.job(last)) == now
    assert _shown(c.daemon, last)[:2] == (now, _iso(now))
    assert c.daemon.job(last).reason == now
    assert _shown(c.daemon, behind)[:2] == (dec.reasons[behind], _iso(dec.reasons[behind]))
    # a crash: the first decision of the new daemon sets every queued job's reason again
    c.restart()
    c.step()
    dec = c.daemon.last_decision
    assert dec is not None
    for j in (behind, last):
        want = dec.reason_for(j)
        assert _shown(c.daemon, j)[:2] == (want, _iso(want))
    c.close()


def _iso(reason: str) -> str | None:
    return reason_json(reason)
