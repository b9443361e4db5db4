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
