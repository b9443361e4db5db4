"""Agent certificates on a real vmctld (TLS on loopback, SQLite), every answer checked against
vmctl/api/openapi.yaml: node names that fit a certificate, the registry as an allow-list (a certificate
the CA signed but vmctld did not register is refused, with a log line and a ``cert.refused`` event),
entries registered before fingerprints pinned at their first use, and the CA rotation's API: renewal
over the agent's own connection, ``finish`` refused while a node did not renew, a restart in the middle
of a rotation, and ``ca.pem`` of an earlier step rewritten while a foreign one is refused."""

from __future__ import annotations

import datetime as dt
import hashlib
import http.client
import json
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.integration.test_daemon_api import check_openapi
from tests.support.daemon import InProcessDaemon
from vmctl import auth
from vmctl.api.security import CERTS_KEY
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.statedir import StateConflict
from vmctl.store.base import WriteBatch


def _config(tmp: Path) -> DaemonConfig:
    return DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp / "state"), policy_name="easy",
                        policy_explicit=True, tick_s=0.5, holder="certs-test")


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[InProcessDaemon]:
    with InProcessDaemon(_config(tmp_path)) as d:
        yield d


def call(d: InProcessDaemon, method: str, path: str, body: Any = None, *, token: str | None = None,
         cert: tuple[str, str] | None = None, ca_file: str | None = None) -> tuple[int, Any]:
    ctx = ssl.create_default_context(cafile=ca_file or d.ca_file)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    conn = http.client.HTTPSConnection("127.0.0.1", d.server.port, context=ctx, timeout=20)
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    doc = json.loads(raw) if raw else None
    check_openapi(method, path, resp.status, doc)
    return resp.status, doc


def admin(d: InProcessDaemon, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    return call(d, method, path, body, token=d.admin_token)


def write_pair(directory: Path, name: str, cert_pem: str, key_pem: str) -> tuple[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    c, k = directory / f"{name}.crt", directory / f"{name}.key"
    c.write_text(cert_pem)
    k.write_text(key_pem)
    k.chmod(0o600)
    return str(c), str(k)


def issue(d: InProcessDaemon, node: str, directory: Path) -> tuple[tuple[str, str], str]:
    """A certificate through ``POST /v1/certs`` (the key made here): ((cert, key) files, serial)."""
    csr, key_pem = auth.new_csr(node)
    s, doc = admin(d, "POST", "/v1/certs", {"node": node, "csr_pem": csr})
    assert s == 201, doc
    return write_pair(directory, f"{node}-{doc['serial']}", doc["cert_pem"], key_pem), str(doc["serial"])


def mint(ca: auth.ClusterCA, node: str, serial: int | None = None) -> tuple[str, str]:
    """A client certificate signed with ``ca``'s key that vmctld never issued (a leaked key),
    optionally under a given serial: (cert PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"node:{node}")]))
            .issuer_name(ca.cert.subject).public_key(key.public_key())
            .serial_number(serial or x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=30))
            .sign(ca.key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM).decode(),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode())


def heartbeat(d: InProcessDaemon, node: str, cert: tuple[str, str], ca_file: str | None = None) -> tuple[int, Any]:
    return call(d, "POST", f"/v1/agent/nodes/{node}/heartbeat", {}, cert=cert, ca_file=ca_file)


def register(d: InProcessDaemon, node: str, cert: tuple[str, str]) -> None:
    s, doc = call(d, "POST", f"/v1/agent/nodes/{node}/register", {"cores": 2}, cert=cert)
    assert s == 200, doc


# ----------------------------------------------------------------------------------------- names


def test_every_valid_node_name_gets_a_certificate_and_a_longer_one_is_named(daemon: InProcessDaemon,
                                                                           tmp_path: Path) -> None:
    longest = "n" * auth.NODE_NAME_MAX  # 59: CN=node:<59> is 64 characters, the X.509 bound
    (cert, key), _serial = issue(daemon, longest, tmp_path)
    assert x509.load_pem_x509_certificate(Path(cert).read_bytes()).subject.rfc4514_string() == f"CN=node:{longest}"
    register(daemon, longest, (cert, key))
    assert heartbeat(daemon, longest, (cert, key))[0] == 200
    for name in ("n" * 60, "n" * 128, "x" * 129):  # 60-128 passed the old check and got a 500 here
        for body in ({"node": name}, {"node": name, "csr_pem": auth.new_csr("x")[0]}):
            s, doc = admin(daemon, "POST", "/v1/certs", body)
            assert s == 422 and doc["error"]["field"] == "node", doc
            assert f"at most {auth.NODE_NAME_MAX}" in doc["error"]["message"]
    # the same rule for a name in a request body elsewhere (migration peers of a registration)
    s, doc = call(daemon, "POST", f"/v1/agent/nodes/{longest}/register", {"cores": 2, "peers": ["p" * 60]},
                  cert=(cert, key))
    assert s == 422 and doc["error"]["field"] == "peers[0]", doc


# ------------------------------------------------------------------------------------- allow-list


def test_a_certificate_the_ca_signed_but_vmctld_did_not_register_is_refused(
        daemon: InProcessDaemon, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (cert, key), serial = issue(daemon, "n1", tmp_path)
    register(daemon, "n1", (cert, key))
    ca = daemon.server.ca
    caplog.set_level(logging.WARNING, logger="vmctld.api")
    # minted with the CA's key (leaked, or a vmctld older than the registry): never registered
    stray = write_pair(tmp_path, "stray", *mint(ca, "n1"))
    s, doc = heartbeat(daemon, "n1", stray)
    assert s == 401 and doc["error"]["reference"] == "unauthenticated"
    msg = doc["error"]["message"]
    assert "not in vmctld's registry" in msg and "vmctl cert issue n1" in msg, msg
    # minted under the serial of a registered certificate: the fingerprint tells them apart
    twin = write_pair(tmp_path, "twin", *mint(ca, "n1", int(serial, 16)))
    s, doc = heartbeat(daemon, "n1", twin)
    assert s == 401 and "not the certificate registered under that serial" in doc["error"]["message"], doc
    # the certificate vmctld issued still works, and the refusals are in the log and the event log
    assert heartbeat(daemon, "n1", (cert, key))[0] == 200
    assert sum("refused an agent certificate" in r.getMessage() for r in caplog.records) == 2
    s, doc = admin(daemon, "GET", "/v1/events?limit=100")
    refused = [e for e in doc["events"] if e["kind"] == "cert.refused"]
    assert refused and refused[0]["node"] == "n1" and "not in vmctld's registry" in refused[0]["message"]


def test_a_registry_from_an_older_vmctld_is_upgraded_at_start_and_pinned_at_first_use(tmp_path: Path) -> None:
    """An upgrade: the registry has the serial, node and validity of each certificate, not its
    fingerprint nor its CA. The start records the only CA there was (no agent is told to renew); the
    first presentation pins the certificate, and another one under that serial is refused from then on."""
    cfg = _config(tmp_path)
    with InProcessDaemon(cfg) as d:
        (cert, key), serial = issue(d, "n2", tmp_path)

        def strip() -> None:
            doc = {s: dict(e) for s, e in d.store.get_kv(CERTS_KEY).items()}
            for e in doc.values():
                for k in ("fingerprint", "ca", "retired"):
                    e.pop(k, None)
            d.store.write(d.daemon.epoch, WriteBatch(kv={CERTS_KEY: doc}))

        d.call(strip)
    with InProcessDaemon(cfg) as d:
        entry = d.call(lambda: dict(d.store.get_kv(CERTS_KEY)[serial]))
        assert entry["ca"] == d.server.ca.fingerprint() and "fingerprint" not in entry
        register(d, "n2", (cert, key))
        s, hb = heartbeat(d, "n2", (cert, key))
        assert s == 200 and hb["renew_cert"] is False
        pinned = d.call(lambda: d.store.get_kv(CERTS_KEY)[serial]["fingerprint"])
        der = x509.load_pem_x509_certificate(Path(cert).read_bytes()).public_bytes(serialization.Encoding.DER)
        assert pinned == hashlib.sha256(der).hexdigest()
        twin = write_pair(tmp_path, "twin", *mint(d.server.ca, "n2", int(serial, 16)))
        assert heartbeat(d, "n2", twin)[0] == 401
        assert heartbeat(d, "n2", (cert, key))[0] == 200


# --------------------------------------------------------------------------------------- rotation


def test_rotation_api_renewal_finish_guard_and_restart(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with InProcessDaemon(cfg) as d:
        old_fp = d.server.ca.fingerprint()
        old_ca_file = str(tmp_path / "old-ca.pem")
        Path(old_ca_file).write_text(Path(d.ca_file).read_text())
        n1, _ = issue(d, "n1", tmp_path / "pki")
        n2, _ = issue(d, "n2", tmp_path / "pki")
        for node, cert in (("n1", n1), ("n2", n2)):
            register(d, node, cert)
        s, doc = heartbeat(d, "n1", n1)
        assert s == 200 and doc["renew_cert"] is False
        assert doc["ca_sha256"] == hashlib.sha256(Path(d.ca_file).read_bytes()).hexdigest()
        s, doc = call(d, "POST", "/v1/agent/nodes/n1/cert", {"csr_pem": auth.new_csr("n1")[0]}, cert=n1)
        assert s == 409, doc  # nothing to renew: the registry does not grow on request
        s, doc = admin(d, "POST", "/v1/ca/finish", {})
        assert s == 409 and "no rotation" in doc["error"]["message"]
        # a read token sees the state, only an admin rotates
        s, read = admin(d, "POST", "/v1/tokens", {"name": "viewer", "role": "read"})
        assert call(d, "GET", "/v1/ca", token=read["token"])[0] == 200
        assert call(d, "POST", "/v1/ca/rotate", {}, token=read["token"])[0] == 403

        s, doc = admin(d, "POST", "/v1/ca/rotate", {})
        assert s == 200 and doc["previous"] == old_fp and doc["server_ca"] == old_fp
        new_fp = doc["fingerprint"]
        assert admin(d, "POST", "/v1/ca/rotate", {})[0] == 409  # one rotation at a time
        # old clients keep working (the server certificate is still of the old CA); agents are told to renew
        s, hb = heartbeat(d, "n1", n1, ca_file=old_ca_file)
        assert s == 200 and hb["renew_cert"] is True
        bundle = Path(d.ca_file).read_text()
        assert hb["ca_sha256"] == hashlib.sha256(bundle.encode()).hexdigest()
        assert [auth.ca_fingerprint(c) for c in auth.pem_certificates(bundle)] == [new_fp, old_fp]
        # n1 renews over its own connection; n2 does not
        csr, key_pem = auth.new_csr("n1")
        s, doc = call(d, "POST", "/v1/agent/nodes/n1/cert", {"csr_pem": csr}, cert=n1)
        assert s == 201 and doc["ca_pem"] == bundle, doc
        n1_new = write_pair(tmp_path / "pki", "n1-new", doc["cert_pem"], key_pem)
        s, hb = heartbeat(d, "n1", n1_new)
        assert s == 200 and hb["renew_cert"] is False
        s, doc = admin(d, "GET", "/v1/ca")
        nodes = {n["node"]: n for n in doc["nodes"]}
        assert nodes["n1"]["current_ca"] and nodes["n1"]["seen_current_s"] is not None
        assert not nodes["n2"]["current_ca"] and nodes["n2"]["other_ca"]
        s, doc = admin(d, "POST", "/v1/ca/finish", {})
        assert s == 409 and "n2" in doc["error"]["message"] and "n1" not in doc["error"]["message"], doc

    # vmctld restarts in the middle of the rotation: it still presents the old CA's server certificate
    # and accepts the registered certificates of both CAs
    with InProcessDaemon(cfg) as d:
        assert heartbeat(d, "n2", n2, ca_file=old_ca_file)[0] == 200
        assert heartbeat(d, "n1", n1_new, ca_file=old_ca_file)[0] == 200
        s, doc = admin(d, "POST", "/v1/ca/finish", {"force": "yes"})
        assert s == 422 and doc["error"]["field"] == "force"
        s, doc = admin(d, "POST", "/v1/ca/finish", {"force": True})  # n2 never renewed: forced
        assert s == 200 and doc["previous"] is None and doc["server_ca"] == new_fp and len(doc["retired_certs"]) == 2
        assert Path(d.ca_file).read_text() == d.server.ca.cert_pem
        # from now on: the new CA's server certificate; the old CA's certificates refused as retired
        with pytest.raises(ssl.SSLError):
            heartbeat(d, "n1", n1_new, ca_file=old_ca_file)
        s, hb = heartbeat(d, "n1", n1_new)
        assert s == 200 and hb["ca_sha256"] == hashlib.sha256(d.server.ca.cert_pem.encode()).hexdigest()
        for node, cert in (("n1", n1), ("n2", n2)):
            s, doc = heartbeat(d, node, cert)
            assert s == 401 and "retired" in doc["error"]["message"], doc
        s, doc = admin(d, "GET", "/v1/certs")
        states = {c["serial"]: c for c in doc["certs"]}
        assert sum(c["retired"] is not None for c in states.values()) == 2
        s, doc = admin(d, "GET", "/v1/events?limit=100")
        kinds = [e["kind"] for e in doc["events"]]
        assert kinds.count("ca.rotation_started") == 1 and kinds.count("ca.rotation_finished") == 1
        assert kinds.count("cert.renewed") == 1

    # after the restart the old CA is gone from the TLS context too: not even a handshake
    with InProcessDaemon(cfg) as d:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            heartbeat(d, "n2", n2)
        assert heartbeat(d, "n1", n1_new)[0] == 200


def test_ca_pem_of_an_earlier_rotation_step_is_rewritten_and_a_foreign_one_refused(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with InProcessDaemon(cfg) as d:
        before = Path(d.ca_file).read_text()
        assert admin(d, "POST", "/v1/ca/rotate", {})[0] == 200
        bundle = Path(d.ca_file).read_text()
    Path(cfg.ca_pem_path).write_text(before)  # a crash between the store write and ca.pem's
    with InProcessDaemon(cfg) as d:
        assert Path(d.ca_file).read_text() == bundle
    Path(cfg.ca_pem_path).write_text(auth.ClusterCA.create().cert_pem)  # another cluster's
    d = InProcessDaemon(cfg)
    try:
        with pytest.raises(StateConflict, match="not the CA of the cluster"):
            d.start()
    finally:
        d.stop()


def test_a_standby_that_takes_the_lease_serves_the_rotation_the_leader_started(tmp_path: Path) -> None:
    """Two vmctld on one store: the leader starts a rotation; the standby (which loaded the CA before)
    takes the lease when the leader stops and serves the rotation's step -- it tells the agent to renew,
    accepts both CAs' registered certificates and finishes it."""
    import time
    from dataclasses import replace

    cfg = replace(_config(tmp_path), lease_ttl_s=1.0)
    a = InProcessDaemon(replace(cfg, holder="vmctld-a"))
    a.start()
    b = InProcessDaemon(replace(cfg, holder="vmctld-b"))
    try:
        n1, _ = issue(a, "n1", tmp_path / "pki")
        register(a, "n1", n1)
        b.start()
        assert not b.daemon.leader and b.server.ca_state.previous is None
        s, doc = admin(a, "POST", "/v1/ca/rotate", {})
        assert s == 200
        new_fp = doc["fingerprint"]
        a.stop()
        deadline = time.monotonic() + 30
        while not b.call(lambda: b.daemon.leader) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert b.call(lambda: b.daemon.leader), "the standby did not take the lease"
        assert b.server.ca_state.current.fingerprint() == new_fp and b.server.ca_state.previous is not None
        s, hb = heartbeat(b, "n1", n1)
        assert s == 200 and hb["renew_cert"] is True
        csr, key_pem = auth.new_csr("n1")
        s, doc = call(b, "POST", "/v1/agent/nodes/n1/cert", {"csr_pem": csr}, cert=n1)
        assert s == 201
        renewed = write_pair(tmp_path / "pki", "n1-renewed", doc["cert_pem"], key_pem)
        assert heartbeat(b, "n1", renewed)[0] == 200  # the standby trusts the new CA it loaded
        s, doc = admin(b, "POST", "/v1/ca/finish", {})
        assert s == 200 and doc["server_ca"] == new_fp
        assert heartbeat(b, "n1", n1)[0] == 401 and heartbeat(b, "n1", renewed)[0] == 200
    finally:
        b.stop()
        a.stop()
