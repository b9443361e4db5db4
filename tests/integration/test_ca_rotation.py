"""Replacing a leaked cluster CA with jobs running (``vmctl ca rotate``, ``vmctl ca finish``): a real
``vmctld`` process over HTTPS on loopback and two ``vmctl-agent`` processes (mock backend, shipped
heartbeat and liveness defaults), a job running across both steps.

The agents renew their own certificates over their mTLS connection when their heartbeat answer says
so, reconnect with them, and after ``finish`` replace their CA bundle by the new CA alone; the job keeps
running (never requeued, no node lost) and ends ``done``; the old CA's certificates -- an agent's old
one, and one minted with the old CA's key (the leak) -- are refused afterwards, and a certificate
minted with the new CA's key but never issued by vmctld is refused too (the registry is an allow-list)."""

from __future__ import annotations

import http.client
import json
import sqlite3
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from vmctl import auth
from vmctl.apiclient import ApiClient
from vmctl.files import write_cert_files
from vmctl.localcluster import DaemonProcess, ManagedProcess, agent_config, free_port

SPEED = 20.0  # model seconds per real second
WORK = 1200.0  # model seconds of work: 60 real seconds, longer than the whole rotation
NODES = ("node1", "node2")


def _wait(what: str, cond: Any, timeout: float, procs: list[ManagedProcess]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        for p in procs:
            assert p.alive(), f"{p.name} died{p.tail(20)}"
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}" + "".join(p.tail(15) for p in procs))


def _as_agent(port: int, ca_file: str, cert: str, key: str, node: str) -> tuple[int, dict[str, Any]]:
    """A heartbeat of ``node`` presenting ``cert``: (status, answer)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.load_cert_chain(cert, key)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)
    try:
        conn.request("POST", f"/v1/agent/nodes/{node}/heartbeat", body="{}",
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def _mint(ca: auth.ClusterCA, node: str, directory: Path, name: str) -> tuple[str, str]:
    """A certificate for ``node`` signed with ``ca``'s key, never issued by vmctld (what a holder of a
    leaked key can make)."""
    cert, key = ca.issue(f"node:{node}")
    c, k = directory / f"{name}.crt", directory / f"{name}.key"
    c.write_text(cert)
    k.write_text(key)
    k.chmod(0o600)
    return str(c), str(k)


def _stored_ca(db: Path) -> auth.ClusterCA:
    """The current CA with its key, from the store (what a leak gives away)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (value,) = con.execute("SELECT value FROM kv WHERE key = 'ca'").fetchone()
    finally:
        con.close()
    doc = json.loads(value)
    return auth.ClusterCA.from_pem(doc["cert_pem"], doc["key_pem"])


def _issued_by(cert_file: str, ca: auth.ClusterCA) -> bool:
    cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
    try:
        cert.verify_directly_issued_by(ca.cert)
    except Exception:  # InvalidSignature, or another issuer
        return False
    return True


@pytest.mark.slow
def test_ca_rotation_keeps_jobs_running_and_refuses_the_old_ca(tmp_path: Path) -> None:
    clock = {"speed": SPEED, "epoch": time.time()}
    daemon = DaemonProcess(tmp_path / "state", policy="fcfs", extra={"clock": clock})
    agents: list[ManagedProcess] = []
    files: dict[str, tuple[str, str, str]] = {}
    try:
        daemon.start_and_wait(timeout=60)
        client = daemon.client()
        for node in NODES:
            crt, key, ca = write_cert_files(tmp_path / "pki" / node, node, client.issue_cert(node))
            files[node] = (str(crt), str(key), str(ca))
            cfg = agent_config(node, daemon.url, {"cert": str(crt), "key": str(key), "ca": str(ca)}, backend="mock",
                               cores=1, libvirt_uri="", metrics_port=free_port(), clock=clock)
            path = tmp_path / f"{node}.yaml"
            path.write_text(yaml.safe_dump(cfg))
            a = ManagedProcess(node, [sys.executable, "-m", "vmctl.agents.main", "--config", str(path)],
                               tmp_path / f"{node}.log")
            a.start()
            agents.append(a)
        procs: list[ManagedProcess] = [daemon, *agents]
        _wait("two ready nodes", lambda: len([n for n in client.list_nodes() if n["state"] == "ready"]) == 2, 60,
              procs)
        job = client.submit_job({"name": "through-rotation", "procs": 2, "estimate": 3 * WORK,
                                 "tasks": [{"work_seconds": WORK, "cpu_usage": 1.0}] * 2})
        jid = str(job["id"])
        _wait("the job to run", lambda: client.get_job(jid)["state"] == "running", 60, procs)

        old_ca = _stored_ca(daemon.state_dir / "vmctld.db")  # the leaked CA, key included
        old_pem = daemon.ca_path.read_text()
        saved = tmp_path / "saved"
        saved.mkdir()
        old_crt, old_key = saved / "node1-old.crt", saved / "node1-old.key"
        old_crt.write_bytes(Path(files["node1"][0]).read_bytes())
        old_key.write_bytes(Path(files["node1"][1]).read_bytes())
        old_key.chmod(0o600)
        # before any rotation: a certificate the CA signed that vmctld never issued is refused
        minted = _mint(old_ca, "node1", saved, "minted-before")
        status, doc = _as_agent(daemon.port, str(daemon.ca_path), *minted, "node1")
        assert status == 401 and "not in vmctld's registry" in doc["error"]["message"], doc

        # 1. rotate: a new CA; the server certificate is still of the old one (old clients keep working)
        t_rotate = time.monotonic()
        rotated = client.rotate_ca()
        assert rotated["previous"] == old_ca.fingerprint() and rotated["fingerprint"] != old_ca.fingerprint()
        assert rotated["server_ca"] == old_ca.fingerprint()
        bundle = [auth.ca_fingerprint(c) for c in auth.pem_certificates(daemon.ca_path.read_text())]
        assert bundle == [rotated["fingerprint"], old_ca.fingerprint()]  # ca.pem: both CAs
        (tmp_path / "old-ca.pem").write_text(old_pem)
        assert ApiClient(daemon.url, daemon.token(), ca=str(tmp_path / "old-ca.pem"), timeout=30).get_job(jid)

        # 2. each agent renews over its own connection within a heartbeat or two and presents the new one
        def renewed() -> bool:
            nodes = {n["node"]: n for n in client.ca_info()["nodes"]}
            return all(nodes.get(n, {}).get("current_ca") and nodes[n].get("seen_current_s") is not None
                       for n in NODES)

        _wait("both agents to renew and reconnect", renewed, 60, procs)
        took_renew = time.monotonic() - t_rotate
        new_ca = _stored_ca(daemon.state_dir / "vmctld.db")
        assert new_ca.fingerprint() == rotated["fingerprint"]
        for node in NODES:
            assert _issued_by(files[node][0], new_ca), f"{node}'s certificate file was not renewed"
            assert len(auth.pem_certificates(Path(files[node][2]).read_text())) == 2  # trusts both meanwhile
        assert client.get_job(jid)["state"] == "running"

        # 3. finish: the old CA is dropped while the job runs
        client = ApiClient(daemon.url, daemon.token(), ca=str(daemon.ca_path), timeout=30)  # the bundle
        t_finish = time.monotonic()
        finished = client.finish_ca()
        assert finished["previous"] is None and finished["server_ca"] == new_ca.fingerprint()
        assert len(finished["retired_certs"]) >= 2
        assert client.get_job(jid)["state"] == "running"
        new_only = new_ca.cert_pem
        assert daemon.ca_path.read_text() == new_only
        # the agents replace their bundle by the new CA alone, and keep talking to vmctld
        _wait("both agents to drop the old CA", lambda: all(Path(files[n][2]).read_text() == new_only for n in NODES),
              60, procs)
        took_ca = time.monotonic() - t_finish
        # the agents noticed within a heartbeat or two (loop.heartbeat_s: 5 s by default)
        print(f"\nrotation: both agents renewed and reconnected {took_renew:.1f} s after rotate, "
              f"dropped the old CA {took_ca:.1f} s after finish")
        assert took_renew < 30 and took_ca < 30

        # the job was never interrupted: it ends done, with no requeue and no node lost or down
        done = _wait("the job to finish", lambda: (j := client.get_job(jid))["state"] in
                     ("done", "failed", "killed") and j, 120, procs)
        assert done["state"] == "done", done
        kinds = [e["kind"] for e in client.call("GET", "/v1/events?limit=1000")["events"]]
        assert "job.requeued" not in kinds and "node.lost" not in kinds and "node.down" not in kinds, kinds
        assert {"ca.rotation_started", "ca.rotation_finished", "cert.renewed", "cert.refused"} <= set(kinds)
        assert kinds.count("cert.renewed") == 2
        for node in NODES:
            assert (tmp_path / f"{node}.log").read_text().count("renewed the agent's certificate") == 1

        # 4. afterwards: the old CA's certificates are refused, an agent's and one minted with the leaked key
        ca_file = str(daemon.ca_path)
        status, doc = _as_agent(daemon.port, ca_file, str(old_crt), str(old_key), "node1")
        assert status == 401 and "retired" in doc["error"]["message"], doc
        status, doc = _as_agent(daemon.port, ca_file, *_mint(old_ca, "node1", saved, "minted-after"), "node1")
        assert status == 401 and "not in vmctld's registry" in doc["error"]["message"], doc
        # and a certificate of the new CA that vmctld did not issue (the allow-list holds for it too)
        status, doc = _as_agent(daemon.port, ca_file, *_mint(new_ca, "node2", saved, "minted-new"), "node2")
        assert status == 401 and "not in vmctld's registry" in doc["error"]["message"], doc
        # while the renewed agents' own certificates are accepted
        status, doc = _as_agent(daemon.port, ca_file, files["node2"][0], files["node2"][1], "node2")
        assert status == 200 and doc["renew_cert"] is False, doc
        assert "refused an agent certificate" in (daemon.state_dir / "vmctld.log").read_text()
        for p in procs:
            assert p.alive(), p.tail(20)
    finally:
        for a in agents:
            a.stop()
        daemon.stop()
