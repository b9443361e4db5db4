"""issue 9 item 4 end to end over HTTPS: agents register their migration peers with a live vmctld, an
operator migration toward a node missing from the source's ``peers`` is refused (409 naming the
missing entry), and when an agent that did not register its peers refuses a migration, vmctld rolls
it back on that report and ``vmctl node show`` / ``vmctl job explain`` say why.

The agents are the real reconciler on the mock backend with the HTTP source and reporter, stepped by
hand (one cycle = fetch, reconcile, report); every wait is on a condition."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.livedaemon import run_cli
from tests.support.daemon import InProcessDaemon, cli_daemon, wait_for
from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, HttpReporter, HttpSource
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.daemon.config import MigrationLimits


class Agent:
    def __init__(self, d: InProcessDaemon, name: str, cores: int, peers: list[str], fabric: MockFabric,
                 tmp: Path) -> None:
        cert, key = d.agent_cert(name, tmp / "certs")
        ep = AgentEndpoint(d.url, name, cert, key, d.ca_file)
        self.source = HttpSource(ep, wait_s=1.0)
        self.reporter = HttpReporter(ep)
        be = MockBackend(hostname=name, cores=cores, fabric=fabric, uri=f"mock://{name}")
        uris = {p: f"mock://{p}" for p in peers}
        self.rec = Reconciler(be, Layout(host=name, cores=tuple(range(cores))), self.source, self.reporter,
                              runner=MockProcessRunner(be), peers=uris, migrate_uris=uris)
        self.name, self.cores, self.backend = name, cores, be

    def register(self, with_peers: bool = True) -> dict[str, object]:
        if with_peers:
            return self.source.register(self.cores, self.name, "mock", self.rec.peers, self.rec.checkpoint_peers)
        return self.source.register(self.cores, self.name, "mock")  # as an agent from before peers were sent

    def cycle(self) -> None:
        self.rec.run_once()

    def close(self) -> None:
        self.source.stop()
        self.reporter.close()
        self.backend.close()


@pytest.fixture()
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessDaemon]:
    with cli_daemon(tmp_path, monkeypatch, "peers-live", migration=MigrationLimits(timeout_s=600.0)) as d:
        yield d


def test_peers_reach_vmctld_and_a_refusal_reaches_the_operator(live: InProcessDaemon, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    d = live
    fabric = MockFabric()
    node3 = Agent(d, "node3", 2, [], fabric, tmp_path)  # node3's config lists no peer
    node4 = Agent(d, "node4", 1, ["node3"], fabric, tmp_path)
    try:
        assert node3.register()["peers"] == []
        status, body = d.request("POST", "/v1/jobs", {"procs": 1, "estimate": 5000, "work_seconds": 4000})
        assert status == 201
        jid = str(body["job"]["id"])

        def placed() -> bool:
            node3.cycle()
            return bool(d.request("GET", f"/v1/jobs/{jid}")[1]["job"]["placement"])

        wait_for(placed, "the job to start on node3")
        node3.cycle()
        assert node4.register()["peers"] == ["node3"]
        node4.cycle()

        # the operator sees each node's peers
        code, out, err = run_cli(capsys, "node", "list", "-o", "json")
        assert code == 0, err
        peers = {n["name"]: n["peers"] for n in json.loads(out)["nodes"]}
        assert peers == {"node3": [], "node4": ["node3"]}
        code, out, err = run_cli(capsys, "node", "show", "node3")
        assert code == 0, err
        assert "migrates to (live, peers): none" in out and "agent errors: none reported" in out

        # an operator migration node3 -> node4: 409 naming the missing entry, nothing planned
        status, body = d.request("POST", f"/v1/jobs/{jid}/migrate", {"to_node": "node4"})
        assert status == 409, body
        assert "node3 cannot reach node4" in body["error"]["message"]
        assert "peers.node4" in body["error"]["message"]
        code, _out, err = run_cli(capsys, "migrate", jid, "--to", "node4")
        assert code != 0 and "peers.node4" in err

        # node3's agent re-registers without saying its peers (an older agent): vmctld accepts the
        # migration; the agent refuses it alone and vmctld rolls it back on that report
        assert node3.register(with_peers=False)["peers"] is None
        status, body = d.request("POST", f"/v1/jobs/{jid}/migrate", {"to_node": "node4"})
        assert status == 202, body
        op = body["operation"]["id"]
        node4.cycle()  # the target applies the generation that expects the VM: the source may go

        def asked() -> bool:
            doc = node3.source.fetch()
            return doc is not None and any(v.migration is not None for v in doc.vms)

        wait_for(asked, "node3's desired state to ask for the migration")
        node3.cycle()  # one cycle: the refusal is in its report
        status, job = d.request("GET", f"/v1/jobs/{jid}")
        assert status == 200 and [p["node"] for p in job["job"]["placement"]] == ["node3"]
        code, out, err = run_cli(capsys, "job", "explain", jid)
        assert code == 0, err
        assert f"migration {op} to node4 (operator): rolled_back: the agent of node3 refused it: " \
               "unknown peer 'node4'" in out
        code, out, err = run_cli(capsys, "node", "show", "node3")
        assert code == 0, err
        assert f"refused migration {op}" in out and "unknown peer 'node4'" in out
        assert "migrates to (live, peers): any node (its agent did not say)" in out
        code, out, err = run_cli(capsys, "node", "list")
        assert code == 0, err
        assert "ERRORS" in out and "PEERS" not in out  # the default fits 100 columns: peers under -o wide
        code, out, err = run_cli(capsys, "node", "list", "-o", "wide")
        assert code == 0, err
        assert "PEERS" in out and "ERRORS" in out and "1 migration(s) refused" in out
        code, _out, err = run_cli(capsys, "node", "show", "node9")
        assert code != 0 and "node9" in err
    finally:
        node3.close()
        node4.close()


def test_register_rejects_bad_peer_lists(live: InProcessDaemon, tmp_path: Path) -> None:
    cert, key = live.agent_cert("n1", tmp_path / "certs")
    src = HttpSource(AgentEndpoint(live.url, "n1", cert, key, live.ca_file))
    try:
        from vmctl.errors import ApiError

        for key, bad, where in (("peers", "node4", "peers"), ("peers", [1], "peers[0]"),
                                ("peers", ["a b"], "peers[0]"), ("checkpoint_peers", {}, "checkpoint_peers")):
            with pytest.raises(ApiError) as ei:
                src._conn.request("POST", "/v1/agent/nodes/n1/register", {"cores": 1, key: bad})
            assert ei.value.fields["status"] == 422 and where in str(ei.value)
        assert src.register(1, "n1", "mock", ["n2", "n1"], None)["peers"] == ["n2"]  # itself is implied
    finally:
        src.stop()
