"""Operator verbs over loopback HTTPS on an in-process vmctld (every answer checked against
vmctl/api/openapi.yaml) and through the CLI: the event log (GET /v1/events, vmctl events), job hold,
release, requeue and update, the warnings at submission and the nodes a queued job waits for."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_daemon_api import Client
from tests.livedaemon import run_cli
from tests.support.daemon import InProcessDaemon
from vmctl.apiclient import ApiClient
from vmctl.cli.events import follow
from vmctl.daemon.config import DaemonConfig


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessDaemon]:
    tmp = tmp_path_factory.mktemp("ops")
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp / "state"), policy_name="easy",
                       policy_explicit=True, tick_s=0.5, holder="ops-test", node_timeout_s=3600.0,
                       node_down_s=7200.0)
    with InProcessDaemon(cfg) as d:
        yield d


@pytest.fixture(scope="module")
def client(daemon: InProcessDaemon, tmp_path_factory: pytest.TempPathFactory) -> Client:
    c = Client(daemon, tmp_path_factory.mktemp("certs"))
    for node in ("n1", "n2"):
        s, _ = c.call("POST", f"/v1/agent/nodes/{node}/register", {"cores": 2, "hostname": node, "backend": "mock"},
                      node=node)
        assert s == 200
    return c


@pytest.fixture()
def admin(daemon: InProcessDaemon) -> str:
    return daemon.admin_token


@pytest.fixture()
def env(daemon: InProcessDaemon, admin: str, monkeypatch: pytest.MonkeyPatch) -> InProcessDaemon:
    monkeypatch.setenv("VMCTL_URL", daemon.url)
    monkeypatch.setenv("VMCTL_TOKEN", admin)
    monkeypatch.setenv("VMCTL_CA", daemon.ca_file)
    return daemon


def events(client: Client, admin: str, query: str = "") -> dict[str, Any]:
    s, doc = client.call("GET", f"/v1/events{query}", token=admin)
    assert s == 200, doc
    return dict(doc)


# ----------------------------------------------------------------------------- the event log


def test_events_name_what_happened_and_who_caused_it(client: Client, admin: str) -> None:
    s, doc = client.call("POST", "/v1/jobs", {"procs": 1, "estimate": 60, "name": "ev-a"}, token=admin)
    assert s == 201
    jid = doc["job"]["id"]
    s, _ = client.call("POST", "/v1/nodes/n2/drain", {"reason": "disk swap"}, token=admin)
    assert s == 200
    s, _ = client.call("POST", "/v1/nodes/n2/undrain", token=admin)
    assert s == 200
    evs = events(client, admin)["events"]
    by_kind = {(e["kind"], e["job_id"] or e["node"]): e for e in evs}
    joined = by_kind[("node.joined", "n1")]
    assert joined["actor"] == "agent n1" and joined["message"] == "node n1 joined (2 cores)"
    sub = by_kind[("job.submitted", jid)]
    assert sub["actor"] == "token bootstrap-admin" and sub["message"] == f"job {jid} (ev-a) submitted"
    drained = next(e for e in evs if e["node"] == "n2" and e["kind"] in ("node.drained", "node.draining"))
    assert drained["message"] == f"node n2 {drained['kind'][5:]}: disk swap"
    assert drained["actor"] == "token bootstrap-admin"
    assert by_kind[("node.undrained", "n2")]["seq"] > drained["seq"]
    assert [e["seq"] for e in evs] == sorted(e["seq"] for e in evs)
    client.call("DELETE", f"/v1/jobs/{jid}", token=admin)


def test_events_since_limit_and_bad_queries(client: Client, admin: str) -> None:
    every = events(client, admin)["events"]
    assert len(every) >= 3
    tail = events(client, admin, "?limit=2")
    assert [e["seq"] for e in tail["events"]] == [e["seq"] for e in every[-2:]]
    assert tail["last_seq"] == every[-1]["seq"]
    assert events(client, admin, "?since=2999-01-01T00:00:00Z")["events"] == []
    newest = every[-1]["time"]
    assert [e["seq"] for e in events(client, admin, f"?since={newest}")["events"]] == \
        [e["seq"] for e in every if e["time"] >= newest]
    for query, field in [("?since=yesterday", "since"), ("?since=nan", "since"), ("?limit=0", "limit"),
                         ("?after=-1", "after"), ("?wait=5", "wait"), ("?after=1&wait=61", "wait")]:
        s, doc = client.call("GET", f"/v1/events{query}", token=admin)
        assert s == 422 and doc["error"]["field"] == field, (query, doc)
    s, _ = client.call("GET", "/v1/events")
    assert s == 401


def test_follow_answers_as_soon_as_an_event_happens(client: Client, admin: str) -> None:
    last = events(client, admin, "?limit=1")["last_seq"]
    got: dict[str, Any] = {}

    def poll() -> None:
        got["doc"] = events(client, admin, f"?after={last}&wait=20")
        got["t"] = time.monotonic()

    t = threading.Thread(target=poll)
    t.start()
    time.sleep(0.5)  # parked
    assert "doc" not in got
    s, doc = client.call("POST", "/v1/jobs", {"procs": 1, "estimate": 60}, token=admin)
    sent = time.monotonic()
    assert s == 201
    t.join(20)
    assert got["t"] - sent < 5.0
    kinds = [e["kind"] for e in got["doc"]["events"]]
    assert kinds[0] == "job.submitted" and got["doc"]["events"][0]["seq"] == last + 1
    assert got["doc"]["last_seq"] == got["doc"]["events"][-1]["seq"]
    # nothing new: the poll answers empty after its wait, with the same cursor
    idle = events(client, admin, f"?after={got['doc']['last_seq'] + 1000}&wait=0.2")
    assert idle == {"events": [], "last_seq": got["doc"]["last_seq"] + 1000}
    client.call("DELETE", f"/v1/jobs/{doc['job']['id']}", token=admin)


def test_cli_events_table_json_and_follow(env: InProcessDaemon, client: Client, admin: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "events", "--since", "1h")
    assert code == 0, err
    assert "node.joined" in out and "node n1 joined (2 cores)" in out and "agent n1" in out
    code, out, _ = run_cli(capsys, "events", "--limit", "1", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and len(doc["events"]) == 1
    code, _, err = run_cli(capsys, "events", "--since", "last tuesday")
    assert code == 2 and "--since" in err and "neither a duration" in err
    # follow: the events after a cursor, as they come
    api = ApiClient(env.url, admin, ca=env.ca_file)
    start = api.events(limit=1)["last_seq"]
    client.call("POST", "/v1/jobs", {"procs": 1, "estimate": 60, "name": "followed"}, token=admin)
    seen: list[dict[str, Any]] = []
    polls = iter(range(3))
    last = follow(api, start, lambda e: seen.append(dict(e)), keep_going=lambda: next(polls, None) is not None,
                  wait=0.5)
    assert seen and seen[0]["kind"] == "job.submitted" and "followed" in seen[0]["message"]
    assert last == seen[-1]["seq"]
    client.call("DELETE", f"/v1/jobs/{seen[0]['job_id']}", token=admin)


def test_events_survive_a_restart(tmp_path: Path) -> None:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"),
                       policy_name="easy", policy_explicit=True, tick_s=0.5, holder="restart-a")
    with InProcessDaemon(cfg) as d:
        s, _ = d.request("POST", "/v1/jobs", {"procs": 1, "estimate": 5})
        assert s == 201
        s, before = d.request("GET", "/v1/events")
    with InProcessDaemon(cfg) as d:
        s, after = d.request("GET", "/v1/events")
        s, _ = d.request("POST", "/v1/jobs", {"procs": 1, "estimate": 5})
        s, more = d.request("GET", "/v1/events")
    assert after["events"] == before["events"] and before["events"]
    assert more["events"][-1]["seq"] == before["last_seq"] + 1


# ----------------------------------------------------------------------------- hold, release, requeue, update


def _submit(client: Client, admin: str, **spec: Any) -> dict[str, Any]:
    s, doc = client.call("POST", "/v1/jobs", {"procs": 1, "estimate": 600, **spec}, token=admin)
    assert s == 201, doc
    return dict(doc)


def _wait_state(client: Client, admin: str, jid: str, state: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        _s, doc = client.call("GET", f"/v1/jobs/{jid}", token=admin)
        if doc["job"]["state"] == state:
            return dict(doc["job"])
        assert time.monotonic() < deadline, f"job {jid} is {doc['job']['state']}, not {state}"
        time.sleep(0.05)


def test_hold_release_requeue_update_over_http(client: Client, admin: str) -> None:
    run = _submit(client, admin, name="runner")["job"]["id"]
    _wait_state(client, admin, run, "running")
    wide = _submit(client, admin, procs=4, name="wide")["job"]["id"]  # waits for the runner's core
    s, doc = client.call("POST", f"/v1/jobs/{wide}/hold", {"reason": "input not staged"}, token=admin)
    assert s == 200 and doc["job"]["held"] is True and doc["job"]["reason"] == "held: input not staged"
    s, doc = client.call("GET", f"/v1/jobs/{wide}/explain", token=admin)
    assert doc["held"] is True and doc["queue_position"] is None
    s, listed = client.call("GET", "/v1/jobs?state=queued", token=admin)
    from vmctl.cli.render import job_table

    grid = job_table([j for j in listed["jobs"] if j["id"] == wide])
    assert dict(zip(grid.headers, grid.rows[0], strict=True))["STATE"] == "queued (held)"
    s, doc = client.call("PATCH", f"/v1/jobs/{wide}", {"estimate": 1200, "priority": 3, "deadline": None},
                         token=admin)
    assert s == 200 and (doc["job"]["estimate"], doc["job"]["priority"], doc["job"]["deadline"]) == (1200, 3, None)
    s, doc = client.call("POST", f"/v1/jobs/{wide}/release", token=admin)
    assert s == 200 and doc["job"]["held"] is False
    s, doc = client.call("POST", f"/v1/jobs/{wide}/release", token=admin)
    assert s == 409 and doc["error"]["message"] == f"job {wide}: is not held"
    # a running job: hold and update say what to do instead; requeue puts it back
    s, doc = client.call("POST", f"/v1/jobs/{run}/hold", token=admin)
    assert s == 409 and f"vmctl job requeue {run} --hold" in doc["error"]["message"]
    s, doc = client.call("PATCH", f"/v1/jobs/{run}", {"estimate": 5}, token=admin)
    assert s == 409 and "requeue it first" in doc["error"]["message"] and "progress is lost" in doc["error"]["message"]
    s, doc = client.call("POST", f"/v1/jobs/{run}/requeue", {"reason": "bad node", "hold": True}, token=admin)
    assert s == 200 and doc["job"]["state"] == "queued" and doc["job"]["held"] and doc["job"]["runs"] == 1
    assert doc["job"]["requeues"] == 1 and doc["job"]["placement"] == []
    s, doc = client.call("POST", f"/v1/jobs/{run}/requeue", token=admin)
    assert s == 409 and "only a running or suspended job can be requeued" in doc["error"]["message"]
    kinds = [e["kind"] for e in events(client, admin)["events"] if e["job_id"] in (run, wide)]
    for k in ("job.held", "job.updated", "job.released", "job.requeued"):
        assert k in kinds
    for jid in (run, wide):
        client.call("DELETE", f"/v1/jobs/{jid}", token=admin)


@pytest.mark.parametrize(("method", "path", "body", "field"), [
    ("PATCH", "/v1/jobs/{id}", {}, "body"),
    ("PATCH", "/v1/jobs/{id}", {"estimate": -1}, "estimate"),
    ("PATCH", "/v1/jobs/{id}", {"estimate": "long"}, "estimate"),
    ("PATCH", "/v1/jobs/{id}", {"priority": 1.5}, "priority"),
    ("PATCH", "/v1/jobs/{id}", {"deadline": -3}, "deadline"),
    ("PATCH", "/v1/jobs/{id}", {"procs": 2}, "procs"),
    ("PATCH", "/v1/jobs/{id}", [1], "body"),
    ("POST", "/v1/jobs/{id}/hold", {"reason": 7}, "reason"),
    ("POST", "/v1/jobs/{id}/hold", {"reason": "a\nb"}, "reason"),
    ("POST", "/v1/jobs/{id}/requeue", {"hold": "yes"}, "hold"),
    ("POST", "/v1/jobs/{id}/release", {"why": "x"}, "why"),
])
def test_bad_job_changes_name_the_field(client: Client, admin: str, method: str, path: str, body: Any,
                                        field: str) -> None:
    jid = _submit(client, admin, procs=4)["job"]["id"]  # the body is checked before the job's state
    s, doc = client.call(method, path.format(id=jid), body, token=admin)
    assert s == 422 and doc["error"]["field"] == field, doc
    client.call("DELETE", f"/v1/jobs/{jid}", token=admin)


def test_unknown_job_is_404_and_readers_may_not_change_jobs(client: Client, admin: str) -> None:
    for method, path in [("POST", "/v1/jobs/999999/hold"), ("POST", "/v1/jobs/999999/release"),
                         ("POST", "/v1/jobs/999999/requeue")]:
        s, doc = client.call(method, path, token=admin)
        assert s == 404 and doc["error"]["reference"] == "not-found"
    s, _ = client.call("PATCH", "/v1/jobs/999999", {"priority": 1}, token=admin)
    assert s == 404
    s, doc = client.call("POST", "/v1/tokens", {"name": "reader-x", "role": "read"}, token=admin)
    reader = doc["token"]
    s, _ = client.call("POST", "/v1/jobs/1/hold", token=reader)
    assert s == 403
    client.call("DELETE", "/v1/tokens/reader-x", token=admin)


# ----------------------------------------------------------------------------- what a submission is told


def test_submission_warns_when_the_policy_ignores_priority_or_deadline(client: Client, admin: str) -> None:
    doc = _submit(client, admin, procs=4, priority=5, deadline=4102444800)
    assert doc["warnings"] == [
        "policy easy does not use job priorities: the job's priority has no effect on when it starts "
        "(vmctl policy set easy -p queue_order=multifactor makes it count)",
        "policy easy does not use deadlines: the job's deadline is neither considered nor enforced"]
    plain = _submit(client, admin, procs=4)
    assert plain["warnings"] == []
    s, batch = client.call("POST", "/v1/jobs:batch", {"jobs": [{"procs": 4, "estimate": 5, "priority": 2},
                                                               {"procs": 4, "estimate": 5}]}, token=admin)
    assert s == 201 and batch["warnings"] == [
        "policy easy does not use job priorities: the priority of 1 job(s) has no effect on when it starts "
        "(vmctl policy set easy -p queue_order=multifactor makes it count)"]
    for jid in [doc["job"]["id"], plain["job"]["id"], *(j["id"] for j in batch["jobs"])]:
        client.call("DELETE", f"/v1/jobs/{jid}", token=admin)


def test_a_job_blocked_only_by_drained_nodes_says_which(client: Client, admin: str, env: InProcessDaemon,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    s, _ = client.call("POST", "/v1/nodes/n2/drain", {"reason": "firmware"}, token=admin)
    assert s == 200
    try:
        jid = _submit(client, admin, procs=3, name="needs-n2")["job"]["id"]
        s, doc = client.call("GET", f"/v1/jobs/{jid}", token=admin)
        assert doc["job"]["blocked_by"] == [{"node": "n2", "state": "drained"}]
        s, exp = client.call("GET", f"/v1/jobs/{jid}/explain", token=admin)
        assert exp["blocked_by"] == [{"node": "n2", "state": "drained"}]
        code, out, _ = run_cli(capsys, "job", "explain", jid)
        assert code == 0 and "nodes: only n2 (drained) keep it waiting" in out
        code, out, _ = run_cli(capsys, "job", "list", "--state", "queued", "-o", "json")
        listed = next(j for j in json.loads(out)["jobs"] if j["id"] == jid)
        assert listed["blocked_by"] == [{"node": "n2", "state": "drained"}]
        from vmctl.cli.render import job_table

        row = dict(zip(job_table([listed], wide=True).headers, job_table([listed], wide=True).rows[0], strict=True))
        assert row["REASON"].endswith("waits for nodes n2 (drained)")
        row = dict(zip(job_table([listed]).headers, job_table([listed]).rows[0], strict=True))
        assert row["NODES (REASON)"].endswith("waits for nodes n2 (drained)")  # queued: no placement
    finally:
        client.call("POST", "/v1/nodes/n2/undrain", token=admin)
    s, doc = client.call("GET", f"/v1/jobs/{jid}", token=admin)
    assert doc["job"]["blocked_by"] == []
    client.call("DELETE", f"/v1/jobs/{jid}", token=admin)


def test_cli_job_verbs(env: InProcessDaemon, client: Client, admin: str, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = _submit(client, admin, name="blocker")["job"]["id"]
    _wait_state(client, admin, blocker, "running")  # the 4-core job below stays queued
    code, out, err = run_cli(capsys, "job", "submit", "-n", "4", "-t", "60", "--priority", "4", "-o", "json")
    assert code == 0 and "warning: policy easy does not use job priorities" in err
    doc = json.loads(out)
    jid = doc["jobs"][0]["id"]
    assert doc["warnings"] and "priorit" in doc["warnings"][0]
    code, out, _ = run_cli(capsys, "job", "hold", jid, "--reason", "wait")
    assert code == 0 and out.strip() == f"job {jid}: held (wait)"
    code, out, _ = run_cli(capsys, "job", "update", jid, "--estimate", "90", "--deadline", "2030-01-01T00:00:00Z",
                           "-o", "json")
    assert code == 0 and json.loads(out)["job"]["estimate"] == 90 and json.loads(out)["job"]["deadline"] == 1893456000
    code, _, err = run_cli(capsys, "job", "update", jid, "--deadline", "soon")
    assert code == 2 and "--deadline" in err
    code, _, err = run_cli(capsys, "job", "update", jid)
    assert code == 2 and "at least one of" in err
    code, out, _ = run_cli(capsys, "job", "release", jid)
    assert code == 0 and out.strip() == f"job {jid}: released"
    code, _, err = run_cli(capsys, "job", "requeue", jid)
    assert code == 4 and "only a running or suspended job can be requeued" in err
    run_cli(capsys, "job", "cancel", jid)
    code, out, _ = run_cli(capsys, "job", "requeue", blocker, "--reason", "test")
    assert code == 0 and "requeued" in out and "progress is lost" in out
    run_cli(capsys, "job", "cancel", blocker)


def test_cli_node_cores_confirms_a_new_core_count(env: InProcessDaemon, client: Client, admin: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``vmctl node cores``: node show says what its agent asks for and how to confirm it; the verb
    applies it; the events say both (issue 23 item 7)."""
    s, _ = client.call("POST", "/v1/agent/nodes/n9/register", {"cores": 2, "backend": "mock"}, node="n9")
    assert s == 200
    s, doc = client.call("POST", "/v1/agent/nodes/n9/register", {"cores": 6, "backend": "mock"}, node="n9")
    assert s == 409, doc
    code, out, _ = run_cli(capsys, "node", "show", "n9")
    assert code == 0 and "2 cores" in out and "its agent registers 6 cores: refused until an operator confirms " \
        "(vmctl node cores n9 6)" in out, out
    code, out, _ = run_cli(capsys, "node", "cores", "n9", "6")
    assert code == 0 and out.strip() == "node n9 has 6 cores", out
    code, out, _ = run_cli(capsys, "node", "cores", "n9", "8")
    assert code == 0 and out.strip() == "node n9 has 6 cores; 8 applies when its agent registers that count", out
    code, _, err = run_cli(capsys, "node", "cores", "n9", "0")
    assert code == 2 and "CORES" in err
    code, _, err = run_cli(capsys, "node", "cores", "nowhere", "4")
    assert code != 0 and "nowhere" in err
    kinds = [e["kind"] for e in events(client, admin, "?limit=1000")["events"] if e.get("node") == "n9"]
    assert {"node.cores_held", "node.cores_changed", "node.cores_confirmed"} <= set(kinds), kinds
    client.call("POST", "/v1/nodes/n9/drain", token=admin)
    assert client.call("DELETE", "/v1/nodes/n9", token=admin)[0] == 200
