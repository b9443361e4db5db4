"""The operator CLI against a real vmctld (subprocess on loopback, SQLite in tmp, HTTPS with its CA):
every command group end to end, roles, and exit codes of real error answers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.livedaemon import live_daemon, run_cli
from vmctl.localcluster import DaemonProcess


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    yield from live_daemon(tmp_path_factory.mktemp("cli"), policy="easy", tick_s=0.2)


@pytest.fixture()
def env(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> DaemonProcess:
    monkeypatch.setenv("VMCTL_URL", daemon.url)
    monkeypatch.setenv("VMCTL_TOKEN", daemon.token())
    monkeypatch.setenv("VMCTL_CA", str(daemon.ca_path))
    return daemon


run = run_cli


def test_job_lifecycle(env: DaemonProcess, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "job", "submit", "-n", "2", "-t", "60", "--name", "live-a", "-o", "json")
    assert code == 0, err
    submitted = json.loads(out)
    job = submitted["jobs"][0]
    assert job["name"] == "live-a" and job["state"] == "queued" and job["procs"] == 2
    jid = str(job["id"])
    # one envelope convention (docs/operations.md "JSON envelopes"): job show's key reads a submission too
    assert submitted["job"] == job and submitted["warnings"] == []
    code, out, _ = run(capsys, "job", "show", jid, "-o", "json")
    assert code == 0 and set(json.loads(out)) == {"job"} and json.loads(out)["job"]["id"] == submitted["job"]["id"]
    code, out, _ = run(capsys, "job", "list", "--state", "queued")
    assert code == 0 and "live-a" in out
    code, out, _ = run(capsys, "job", "show", jid)
    assert code == 0 and "live-a" in out and "queued" in out
    code, out, _ = run(capsys, "job", "explain", jid)
    assert code == 0 and f"job {jid} is queued" in out and "reason:" in out  # no nodes: it waits
    code, out, _ = run(capsys, "job", "cancel", jid)
    assert code == 0 and out.strip() == f"job {jid}: cancelled"
    code, out, _ = run(capsys, "job", "cancel", jid)  # idempotent
    assert code == 0 and "cancelled" in out


def test_batch_file(env: DaemonProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    f = tmp_path / "jobs.yaml"
    f.write_text("jobs:\n  - {name: b1, procs: 1, estimate: 5}\n  - {name: b2, procs: 3, estimate: 9}\n")
    code, out, err = run(capsys, "job", "submit", "-f", str(f), "-o", "json")
    assert code == 0, err
    assert [j["name"] for j in json.loads(out)["jobs"]] == ["b1", "b2"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n  - {name: ok, procs: 1, estimate: 5}\n  - {name: bad, procs: 0, estimate: 5}\n")
    code, _, err = run(capsys, "job", "submit", "-f", str(bad))
    assert code == 2 and err.startswith("error: validation-failed: ")  # the daemon's 422
    code, out, _ = run(capsys, "job", "list", "-o", "json")
    assert "ok" not in [j["name"] for j in json.loads(out)["jobs"]]  # all or nothing


def test_errors_from_the_daemon(env: DaemonProcess, capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    code, _, err = run(capsys, "job", "show", "no-such-job")
    assert code == 3 and err.startswith("error: not-found: ")
    code, _, err = run(capsys, "node", "drain", "ghost")
    assert code == 3
    code, _, err = run(capsys, "vm", "show", "ghost-c0-fg")
    assert code == 3
    code, _, err = run(capsys, "policy", "set", "no-such-policy")
    assert code == 2, err
    monkeypatch.setenv("VMCTL_TOKEN", "wrong")
    code, _, err = run(capsys, "job", "list")
    assert code == 5 and err.startswith("error: unauthenticated: ")
    monkeypatch.delenv("VMCTL_CA")
    code, _, err = run(capsys, "job", "list")
    assert code == 6 and "TLS" in err  # the cluster CA is not in the system store


def test_read_token_cannot_write(env: DaemonProcess, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = run(capsys, "token", "issue", "--name", "viewer", "--role", "read", "--ttl", "600", "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["role"] == "read" and doc["token"]
    monkeypatch.setenv("VMCTL_TOKEN", doc["token"])
    assert run(capsys, "job", "list")[0] == 0
    code, _, err = run(capsys, "job", "submit", "-n", "1", "-t", "5")
    assert code == 5 and err.startswith("error: forbidden: ")


def test_revoking_the_token_in_use_needs_force(env: DaemonProcess, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 25 item 5: revoking the token the command itself sends succeeded silently and every later
    command failed with 'unknown token'; now it is refused (exit 4, saying why) unless --force."""
    code, out, err = run(capsys, "token", "issue", "--name", "self-admin", "--role", "admin", "-o", "json")
    assert code == 0, err
    mine = json.loads(out)["token"]
    code, out, err = run(capsys, "token", "issue", "--name", "other-read", "--role", "read", "-o", "json")
    assert code == 0, err
    monkeypatch.setenv("VMCTL_TOKEN", mine)
    listed = json.loads(run(capsys, "token", "list", "-o", "json")[1])["tokens"]
    my_id = next(t["id"] for t in listed if t["name"] == "self-admin")
    for key in ("self-admin", my_id):  # by name and by id
        code, out, err = run(capsys, "token", "revoke", key)
        assert code == 4 and out == "", (code, out, err)
        assert err.startswith(f"error: conflict: token {my_id} (self-admin, admin): is the token this command uses")
        assert "every later command with it fails with 'unknown token'" in err and "--force" in err
    assert run(capsys, "job", "list")[0] == 0  # still valid
    # another token is revoked without --force
    code, out, err = run(capsys, "token", "revoke", "other-read")
    assert code == 0 and out.startswith("revoked token ") and "this command used" not in out, err
    code, out, err = run(capsys, "token", "revoke", "self-admin", "--force")
    assert code == 0 and "(the token this command used: later commands need another one)" in out, err
    code, _, err = run(capsys, "job", "list")
    assert code == 5 and err.startswith("error: unauthenticated: "), err


def test_policy_nodes_vms_certs(env: DaemonProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "policy", "show", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["name"] == "easy" and "fcfs" in doc["available"]
    code, out, err = run(capsys, "policy", "set", "fcfs", "-o", "json")
    assert code == 0, err
    assert json.loads(run(capsys, "policy", "show", "-o", "json")[1])["name"] == "fcfs"
    assert run(capsys, "policy", "set", "easy")[0] == 0
    code, out, _ = run(capsys, "node", "list", "-o", "json")
    assert code == 0 and json.loads(out) == {"nodes": []}
    code, out, _ = run(capsys, "vm", "list", "-o", "json")
    assert code == 0 and json.loads(out) == {"vms": []}
    code, out, err = run(capsys, "cert", "issue", "n9", "--out-dir", str(tmp_path))
    assert code == 0, err
    pem = (tmp_path / "n9.crt").read_text()
    assert pem.startswith("-----BEGIN CERTIFICATE-----")
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem.encode())
    assert cert.subject.rfc4514_string() == "CN=node:n9"
    # serials print 40 hex digits wide (a random serial's leading zero digits were dropped: 37-40 wide);
    # revoke takes the printed form
    serial = next(c["serial"] for c in json.loads(run(capsys, "cert", "list", "-o", "json")[1])["certs"]
                  if c["node"] == "n9")
    assert int(serial, 16) == cert.serial_number  # the API: canonical, no leading zeros
    wide = f"{cert.serial_number:040X}"
    code, out, _ = run(capsys, "cert", "list")
    assert code == 0 and re.search(rf"\b{wide}\b.*\bn9\b", out), out
    code, out, err = run(capsys, "cert", "revoke", wide)
    assert code == 0 and out.strip() == f"revoked certificate {wide} of node n9", err


def test_connection_errors_say_what_is_wrong(daemon: DaemonProcess, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """http:// to the HTTPS listener, no --ca, and a --ca that does not exist each get their own message."""
    monkeypatch.setenv("VMCTL_TOKEN", daemon.token())
    monkeypatch.delenv("VMCTL_CA", raising=False)
    monkeypatch.delenv("VMCTL_URL", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-system-cas.pem"))  # no system CA signs it anyway
    plain = daemon.url.replace("https://", "http://")
    code, _, err = run(capsys, "node", "list", "--url", plain)
    assert code == 6 and "vmctld serves HTTPS only: use https://" in err, err
    code, _, err = run(capsys, "node", "list", "--url", daemon.url)
    assert code == 6 and err.startswith("error: tls-untrusted: cannot verify vmctld at"), err
    assert "no --ca was given" in err and "hint: pass --ca" in err and "is vmctld running" not in err
    missing = tmp_path / "nonexistent.pem"
    code, _, err = run(capsys, "node", "list", "--url", daemon.url, "--ca", str(missing))
    assert code == 2 and f"the CA file {missing} does not exist" in err, err
    other = tmp_path / "other-ca.pem"
    from vmctl.auth import ClusterCA

    other.write_text(ClusterCA.create().cert_pem)
    code, _, err = run(capsys, "node", "list", "--url", daemon.url, "--ca", str(other))
    assert code == 6 and f"not signed by the CA in {other}" in err, err


def test_ca_show_rotate_and_finish(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``vmctl ca`` on its own vmctld (a rotation changes the CA the other tests' clients trust)."""
    gen = live_daemon(tmp_path / "state", policy="easy", tick_s=0.2)
    d = next(gen)
    try:
        monkeypatch.setenv("VMCTL_URL", d.url)
        monkeypatch.setenv("VMCTL_TOKEN", d.token())
        monkeypatch.setenv("VMCTL_CA", str(d.ca_path))
        assert run(capsys, "cert", "issue", "n1", "--out-dir", str(tmp_path / "pki"))[0] == 0
        # a name that cannot fit a certificate subject: named, exit 2, no traceback, nothing written
        code, _, err = run(capsys, "cert", "issue", "a" * 60, "--out-dir", str(tmp_path / "long"))
        assert code == 2 and err.startswith("error: validation-failed: NODE: ") and "at most 59" in err, err
        assert not (tmp_path / "long").exists()
        code, out, err = run(capsys, "ca", "show")
        assert code == 0 and out.startswith("CA ") and "previous CA" not in out, err
        # one row per node: holds a current-CA certificate, never presented it (no agent runs), no old-CA one
        assert re.search(r"^NODE\s+CURRENT CA CERT\s+PRESENTED\s+OLD CA CERT$", out, re.M), out
        assert re.search(r"^n1\s+yes\s+-\s+no$", out, re.M), out
        code, out, err = run(capsys, "ca", "rotate", "-o", "json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["previous"] and doc["server_ca"] == doc["previous"] and doc["fingerprint"] != doc["previous"]
        code, _, err = run(capsys, "ca", "rotate")
        assert code == 4 and "a rotation is in progress" in err
        # n1's agent never renewed: finish is refused naming it (exit 4), --force drops the old CA anyway
        code, _, err = run(capsys, "ca", "finish")
        assert code == 4 and "n1" in err and "did not renew" in err, err
        code, out, err = run(capsys, "ca", "finish", "--force")
        assert code == 0 and "retired 1 certificate(s) of the previous CA" in out, err
        code, out, _ = run(capsys, "cert", "list")
        assert code == 0 and "retired" in out and "its CA rotated out" in out
        code, _, err = run(capsys, "ca", "finish")
        assert code == 4 and "no rotation is in progress" in err
    finally:
        next(gen, None)
