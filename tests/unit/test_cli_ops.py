"""The operator CLI against a recording HTTP server on loopback: request building (method, path, query,
body, bearer token), output formatting (tables and JSON) and the mapping of API errors to exit codes."""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.livedaemon import run_cli
from vmctl import errors, timefmt
from vmctl.apiclient import ApiClient, error_from_response
from vmctl.cli.job import explain_text
from vmctl.cli.render import RICH_MAX_ROWS, fmt_placement, fmt_reason, fmt_time, node_table, node_text, vm_table
from vmctl.cli.vm import parse_cap
from vmctl.errors import exit_code_for
from vmctl.timefmt import fmt_duration

JOB = {
    "id": "17", "name": "sim-a", "state": "running", "procs": 2, "estimate": 600.0, "priority": 0,
    "deadline": None, "submit_time": 1795000000.0, "start_time": 1795000010.0, "end_time": None, "tier": "bg",
    "placement": [{"node": "n1", "core": 0}, {"node": "n1", "core": 1}], "reason": None,
    "tasks": [{"index": 0, "exit_status": None, "error": None}], "migrations": 1,
}
NODE = {"name": "n1", "cores": 4, "state": "ready", "last_seen": 1795000100.0, "generation": 12, "fg_busy": 3,
        "bg_busy": 1, "utilization": 0.8125}
VM = {"name": "n1-c0-fg", "node": "n1", "core": 0, "role": "fg", "weight": 10000, "cap": None, "power": "running",
      "job_id": "17", "utilization": 0.97}


class Recorder:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.routes: dict[tuple[str, str], tuple[int, Any]] = {}

    def answer(self, method: str, path: str, status: int, body: Any) -> None:
        self.routes[(method, path)] = (status, body)


@pytest.fixture()
def server() -> Iterator[tuple[str, Recorder]]:
    rec = Recorder()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _handle(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            path, _, query = self.path.partition("?")
            rec.requests.append({
                "method": self.command, "path": path, "query": query,
                "auth": self.headers.get("Authorization"), "body": json.loads(raw) if raw else None,
            })
            status, body = rec.routes.get((self.command, path), (404, {"error": {
                "reference": "not-found", "message": f"no route {path}", "field": None}}))
            data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _handle

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", rec
    finally:
        srv.shutdown()
        srv.server_close()


run = run_cli


def test_job_submit_builds_body_and_sends_token(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("POST", "/v1/jobs", 201, {"job": JOB})
    code, out, _ = run(capsys, "job", "submit", "--url", url, "--token", "s3cret", "-n", "2", "-t", "600",
                       "--name", "sim-a", "--cpu-usage", "0.5", "--priority", "3", "-o", "json")
    assert code == 0
    req = rec.requests[-1]
    assert req["method"] == "POST" and req["auth"] == "Bearer s3cret"
    assert req["body"] == {"procs": 2, "estimate": 600.0, "name": "sim-a", "cpu_usage": [0.5, 0.5], "priority": 3}
    # one job by options: under job (as job show prints it) and jobs (as any submission), with warnings
    assert json.loads(out) == {"job": JOB, "jobs": [JOB], "warnings": []}


def test_job_submit_file_uses_batch(server: tuple[str, Recorder], capsys: Any, tmp_path: Path) -> None:
    url, rec = server
    rec.answer("POST", "/v1/jobs:batch", 201, {"jobs": [JOB, {**JOB, "id": "18"}]})
    f = tmp_path / "jobs.yaml"
    f.write_text("jobs:\n  - {procs: 1, estimate: 10}\n  - {procs: 4, estimate: 20, work_seconds: 5}\n")
    code, out, _ = run(capsys, "job", "submit", "--url", url, "-f", str(f))
    assert code == 0, out
    assert rec.requests[-1]["body"] == {"jobs": [{"procs": 1, "estimate": 10},
                                                 {"procs": 4, "estimate": 20, "work_seconds": 5}]}
    assert "18" in out and "submitted" in out
    code, out, _ = run(capsys, "job", "submit", "--url", url, "-f", str(f), "-o", "json")
    assert code == 0 and json.loads(out) == {"jobs": [JOB, {**JOB, "id": "18"}], "warnings": []}
    # a file of one job is a batch too: jobs, and no job key (a script reads the same shape for any file)
    rec.answer("POST", "/v1/jobs", 201, {"job": JOB, "warnings": ["policy easy does not use job priorities"]})
    f.write_text("{procs: 1, estimate: 10, priority: 2}\n")
    code, out, _ = run(capsys, "job", "submit", "--url", url, "-f", str(f), "-o", "json")
    assert code == 0 and json.loads(out) == {"jobs": [JOB], "warnings": ["policy easy does not use job priorities"]}


def test_job_submit_bad_file_is_located_error(capsys: Any, tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("- {procs: 1}\n")
    code, _, err = run(capsys, "job", "submit", "--url", "http://127.0.0.1:9", "-f", str(f))
    assert code == 2
    assert err.startswith("error: config-invalid: ") and "jobs[0]" in err and "estimate" in err
    code, _, err = run(capsys, "job", "submit", "--url", "http://127.0.0.1:9", "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err


def test_job_submit_option_validation(capsys: Any) -> None:
    code, _, err = run(capsys, "job", "submit", "--url", "http://127.0.0.1:9", "-n", "2", "-t", "5",
                       "--cpu-usage", "0.5,0.5,0.5")
    assert code == 2 and "error: invalid-input: --cpu-usage: 3 values for 2 processes" in err
    code, _, err = run(capsys, "job", "submit", "--url", "http://127.0.0.1:9", "-n", "2", "-t", "-5")
    assert code == 2 and "out-of-range" in err
    code, _, err = run(capsys, "job", "submit", "--url", "http://127.0.0.1:9", "-n", "2")
    assert code == 2 and "--estimate" in err


def test_job_list_table_and_query(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("GET", "/v1/jobs", 200, {"jobs": [JOB]})
    code, out, _ = run(capsys, "job", "list", "--url", url, "--state", "running", "--limit", "5")
    assert code == 0
    assert rec.requests[-1]["query"] == "state=running&limit=5&order=newest"  # --limit keeps the newest
    lines = out.splitlines()
    header = next(line for line in lines if "ID" in line and "STATE" in line)
    assert "NODES (REASON)" in header  # where it runs (its reason when it runs nowhere)
    row = next(line for line in lines if "sim-a" in line)
    assert "running" in row and "bg" in row and "n1:0-1" in row and "10.0m" in row  # cores as ranges per node


def test_env_vars_supply_url_and_token(server: tuple[str, Recorder], capsys: Any,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url, rec = server
    rec.answer("GET", "/v1/nodes", 200, {"nodes": [NODE]})
    monkeypatch.setenv("VMCTL_URL", url)
    monkeypatch.setenv("VMCTL_TOKEN", "from-env")
    code, out, _ = run(capsys, "node", "list")
    assert code == 0 and rec.requests[-1]["auth"] == "Bearer from-env"
    row = next(line for line in out.splitlines() if "n1" in line)
    assert "ready" in row and "81%" in row


@pytest.mark.parametrize(
    ("status", "reference", "code", "cls"),
    [
        (404, "not-found", 3, errors.NotFound),
        (409, "conflict", 4, errors.Conflict),
        (401, "unauthenticated", 5, errors.Unauthenticated),
        (403, "forbidden", 5, errors.Forbidden),
        (422, "validation-failed", 2, errors.ValidationError),
        (413, "request-too-large", 2, errors.RequestTooLarge),
        (503, "daemon-unavailable", 6, errors.DaemonUnavailable),
        (500, "store-error", 7, errors.StoreError),
        (418, "", 7, errors.ApiError),
    ],
)
def test_api_errors_map_to_exit_codes(server: tuple[str, Recorder], capsys: Any, status: int, reference: str,
                                      code: int, cls: type[errors.VmctlError]) -> None:
    url, rec = server
    body = {"error": {"reference": reference, "message": "it went wrong", "field": "spec.x" if status == 422 else None}}
    rec.answer("GET", "/v1/jobs/42", status, body if reference else None)
    got, _, err = run(capsys, "job", "show", "42", "--url", url)
    assert got == code
    first = err.splitlines()[0]
    if reference:
        assert first.startswith(f"error: {cls.reference}: ")
        assert "it went wrong" in first
    if status == 422:
        assert "spec.x: it went wrong" in first
    exc = error_from_response(status, json.dumps(body).encode() if reference else b"")
    assert isinstance(exc, cls) and exit_code_for(exc) == code


def test_unreachable_daemon_exit_6(capsys: Any) -> None:
    code, _, err = run(capsys, "node", "list", "--url", "http://127.0.0.1:9")
    assert code == 6 and err.startswith("error: daemon-unavailable: cannot reach vmctld at http://127.0.0.1:9")


def test_bad_url_is_usage_error(capsys: Any) -> None:
    code, _, err = run(capsys, "node", "list", "--url", "ftp://x")
    assert code == 2 and "--url" in err


def test_vm_priority_set_body(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("PUT", "/v1/vms/n1-c0-fg/priority", 200, {"vm": {**VM, "cap": 0.25, "weight": 50}})
    code, out, _ = run(capsys, "vm", "priority", "set", "n1-c0-fg", "--url", url, "--tier", "bg", "--weight", "50",
                       "--cap", "25", "--pin", "3")
    assert code == 0
    assert rec.requests[-1]["body"] == {"tier": "bg", "weight": 50, "cap": 0.25, "pin": 3}
    assert "25%" in out
    run(capsys, "vm", "priority", "set", "n1-c0-fg", "--url", url, "--cap", "none")
    assert rec.requests[-1]["body"] == {"cap": None}
    code, _, err = run(capsys, "vm", "priority", "set", "n1-c0-fg", "--url", url, "--cap", "150")
    assert code == 2 and "out-of-range" in err
    code, _, err = run(capsys, "vm", "priority", "set", "n1-c0-fg", "--url", url)
    assert code == 2 and "at least one" in err
    code, _, err = run(capsys, "vm", "priority", "set", "n1-c0-fg", "--url", url, "--weight", "0")
    assert code == 2


def test_vm_priority_show_views_what_set_changes(server: tuple[str, Recorder], capsys: Any) -> None:
    """issue 25 item 5: `vm priority` had only `set`; `show` views the same fields, desired and observed."""
    url, rec = server
    observed = {"node": "n1", "power": "running", "core": 0, "weight": 100, "cap": 0.5, "utilization": 0.4}
    rec.answer("GET", "/v1/vms/j17-r0-p0", 200, {"vm": {**VM, "name": "j17-r0-p0", "cap": 0.25, "weight": 50,
                                                        "managed": True, "observed": observed,
                                                        "differs": ["weight", "cap"]}})
    code, out, err = run(capsys, "vm", "priority", "show", "j17-r0-p0", "--url", url)
    assert code == 0, err
    assert rec.requests[-1]["method"] == "GET" and rec.requests[-1]["path"] == "/v1/vms/j17-r0-p0"
    lines = out.splitlines()
    assert lines[0] == "vm j17-r0-p0 on n1: job 17"
    assert lines[1] == "desired:  tier fg, weight 50, cap 25%, core 0"
    assert lines[2].startswith("observed: weight 100, cap 50%, core 0")
    assert lines[3].startswith("differs in: weight, cap")
    assert "vmctl vm priority set j17-r0-p0 --tier fg|bg" in out
    code, out, _ = run(capsys, "vm", "priority", "show", "j17-r0-p0", "--url", url, "-o", "json")
    assert code == 0 and json.loads(out)["vm"]["weight"] == 50  # the VM document, as vm show prints it
    rec.answer("GET", "/v1/vms/n1-c1-bg", 200, {"vm": {**VM, "name": "n1-c1-bg", "role": "bg", "job_id": None,
                                                       "managed": False, "observed": None}})
    code, out, _ = run(capsys, "vm", "priority", "show", "n1-c1-bg", "--url", url)
    assert code == 0 and "no job; its priority is the agent's layout's (bg slot)" in out
    code, out, _ = run(capsys, "vm", "priority", "--help")
    assert code == 0 and "show" in out and "set" in out


def test_vm_list_and_show(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("GET", "/v1/vms", 200, {"vms": [VM]})
    rec.answer("GET", "/v1/vms/n1-c0-fg", 200, {"vm": VM})
    code, out, _ = run(capsys, "vm", "list", "--node", "n1", "--url", url)
    assert code == 0 and rec.requests[-1]["query"] == "node=n1"
    assert "n1-c0-fg" in out and "97%" in out and "none" in out
    code, out, _ = run(capsys, "vm", "show", "n1-c0-fg", "--url", url, "-o", "json")
    assert json.loads(out) == {"vm": VM}


def test_explain_names_the_reservation(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("GET", "/v1/jobs/20/explain", 200, {
        "job_id": "20", "state": "queued", "reason": "waiting for 8 cores", "queue_position": 2,
        "reservation": {"job_id": "19", "shadow_time": 1795003600.0, "extra_cores": 1}})
    code, out, _ = run(capsys, "job", "explain", "20", "--url", url)
    assert code == 0
    assert "position 3 in the queue (2 queued job(s) ahead of it)" in out and "waiting for 8 cores" in out  # from 1
    assert "job 19 holds the reservation" in out and "2026-11-18" in out and "1 extra core" in out


def test_cancel_drain_undrain_migrate_policy(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("DELETE", "/v1/jobs/17", 200, {"job": {**JOB, "state": "cancelled"}})
    rec.answer("POST", "/v1/nodes/n1/drain", 200, {"node": {**NODE, "state": "draining"}})
    rec.answer("POST", "/v1/nodes/n1/undrain", 200, {"node": NODE})
    op = {"id": "op-1", "kind": "migrate", "state": "requested"}
    rec.answer("POST", "/v1/jobs/17/migrate", 202, {"operation": op})
    pol = {"name": "measy", "params": {"threshold": 0.9}, "available": ["easy", "measy"]}
    rec.answer("PUT", "/v1/policy", 200, pol)
    assert run(capsys, "job", "cancel", "17", "--url", url)[1].strip() == "job 17: cancelled"
    assert "draining" in run(capsys, "node", "drain", "n1", "--url", url)[1]
    assert "ready" in run(capsys, "node", "undrain", "n1", "--url", url)[1]
    code, out, _ = run(capsys, "migrate", "17", "--to", "n2", "--url", url)
    assert code == 0 and rec.requests[-1]["body"] == {"to_node": "n2"} and "op-1" in out
    code, out, _ = run(capsys, "policy", "set", "measy", "-p", "threshold=0.9", "-p", "name=x", "--url", url)
    assert rec.requests[-1]["body"] == {"name": "measy", "params": {"threshold": 0.9, "name": "x"}}
    code, _, err = run(capsys, "policy", "set", "measy", "-p", "oops", "--url", url)
    assert code == 2 and "KEY=VALUE" in err


def test_token_and_cert_issue(server: tuple[str, Recorder], capsys: Any, tmp_path: Path) -> None:
    url, rec = server
    rec.answer("POST", "/v1/tokens", 201, {"token": "tok-abc", "name": "ci", "role": "read", "expires": None})
    rec.answer("POST", "/v1/certs", 201, {"cert_pem": "CERT\n", "key_pem": "KEY\n", "ca_pem": "CA\n"})
    code, out, _ = run(capsys, "token", "issue", "--name", "ci", "--ttl", "3600", "--url", url)
    assert code == 0 and "tok-abc" in out
    assert rec.requests[-1]["body"] == {"name": "ci", "role": "read", "ttl_s": 3600.0}
    code, _, err = run(capsys, "cert", "issue", "n1", "--url", url)
    assert code == 2 and "--out-dir" in err
    code, out, _ = run(capsys, "cert", "issue", "n1", "--url", url, "--out-dir", str(tmp_path / "pki"))
    # the key is made here: only a signing request for CN=node:n1 goes to vmctld, and the key file is
    # the local key that request was signed with (the answer's key_pem, if any, is not used)
    body = rec.requests[-1]["body"]
    assert code == 0 and set(body) == {"node", "csr_pem"} and body["node"] == "n1"
    csr = x509.load_pem_x509_csr(body["csr_pem"].encode())
    assert csr.is_signature_valid and csr.subject.rfc4514_string() == "CN=node:n1"
    key = tmp_path / "pki" / "n1.key"
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    local = serialization.load_pem_private_key(key.read_bytes(), password=None)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert local.public_key().public_bytes(*spki) == csr.public_key().public_bytes(*spki)
    assert (tmp_path / "pki" / "ca.crt").read_text() == "CA\n"


def test_cert_issue_signs_a_request_made_on_the_node(server: tuple[str, Recorder], capsys: Any,
                                                    tmp_path: Path) -> None:
    from vmctl.auth import new_csr

    url, rec = server
    rec.answer("POST", "/v1/certs", 201, {"cert_pem": "CERT\n", "ca_pem": "CA\n", "serial": "AB"})
    csr, _key = new_csr("n2")
    (tmp_path / "n2.csr").write_text(csr)
    code, _, _ = run(capsys, "cert", "issue", "n2", "--csr", str(tmp_path / "n2.csr"), "--url", url,
                       "--out-dir", str(tmp_path / "pki"))
    assert code == 0 and rec.requests[-1]["body"] == {"node": "n2", "csr_pem": csr}
    assert sorted(p.name for p in (tmp_path / "pki").iterdir()) == ["ca.crt", "n2.crt"]  # no key: it is on n2
    code, _, err = run(capsys, "cert", "issue", "n2", "--csr", str(tmp_path / "missing.csr"), "--url", url,
                       "--out-dir", str(tmp_path / "pki"))
    assert code == 2 and "--csr" in err and "missing.csr" in err


def test_formatters(monkeypatch: pytest.MonkeyPatch) -> None:
    assert fmt_duration(59) == "59s" and fmt_duration(600) == "10.0m" and fmt_duration(None) == "-"
    assert fmt_duration(86400 * 3) == "3.0d"
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    assert fmt_time(0) == "1970-01-01T00:00:00+00:00"  # ISO 8601 with the zone
    assert fmt_placement([{"node": "a", "core": i} for i in range(6)], limit=2) == "a:0, a:1 (+4)"
    assert parse_cap("50%") == (True, 0.5) and parse_cap(None) == (False, None)
    with pytest.raises(errors.UserError):
        parse_cap("fast")


def test_client_url_and_path_quoting(server: tuple[str, Recorder]) -> None:
    url, rec = server
    rec.answer("GET", "/v1/jobs/a%2Fb", 200, {"job": JOB})
    c = ApiClient(url + "/", token=None)
    assert c.get_job("a/b")["id"] == "17"
    assert rec.requests[-1]["path"] == "/v1/jobs/a%2Fb" and rec.requests[-1]["auth"] is None
    rec.answer("GET", "/v1/health", 200, ["not", "an", "object"])
    assert c.health() == {}
    rec.answer("GET", "/v1/nodes", 200, {"unexpected": 1})
    with pytest.raises(errors.ApiError, match="no 'nodes'"):
        c.list_nodes()


def test_shell_completion(server: tuple[str, Recorder]) -> None:
    import subprocess
    import sys

    url, rec = server
    rec.answer("GET", "/v1/jobs", 200, {"jobs": [JOB, {**JOB, "id": "170"}, {**JOB, "id": "9"}]})
    env = {**os.environ, "_VMCTL_COMPLETE": "bash_complete", "VMCTL_URL": url}

    def complete(words: str, cword: int) -> list[str]:
        r = subprocess.run([sys.executable, "-m", "vmctl.cli.main"], env={**env, "COMP_WORDS": words,
                           "COMP_CWORD": str(cword)}, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return [line.split(",", 1)[1] for line in r.stdout.splitlines() if "," in line]

    assert complete("vmctl jo", 1) == ["job"]
    assert complete("vmctl job ex", 2) == ["explain"]
    assert complete("vmctl job show 17", 3) == ["17", "170"]  # ids from the daemon
    script = subprocess.run([sys.executable, "-m", "vmctl.cli.main"], env={**os.environ,
                            "_VMCTL_COMPLETE": "bash_source"}, capture_output=True, text=True, timeout=30)
    assert "_vmctl_completion" in script.stdout


def test_operator_code_talks_only_to_the_api() -> None:
    import ast

    root = Path(__file__).resolve().parents[2]
    groups = ("vm", "worker", "job", "node", "top", "migrate", "op", "policy", "token", "cert", "ca", "connect",
              "render")
    for rel in (*(f"vmctl/cli/{g}.py" for g in groups), "vmctl/apiclient.py", "vmctl/client.py"):
        tree = ast.parse((root / rel).read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                top = ".".join(n.split(".")[:2])
                assert top not in ("vmctl.daemon", "vmctl.store", "vmctl.agents", "vmctl.api"), (rel, n)


def test_large_tables_print_as_plain_text(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    vms = [{**VM, "name": f"n1-c{i}-fg", "core": i} for i in range(RICH_MAX_ROWS + 1)]
    rec.answer("GET", "/v1/vms", 200, {"vms": vms})
    code, out, _ = run(capsys, "vm", "list", "--url", url)
    lines = out.splitlines()
    assert code == 0 and len(lines) == len(vms) + 1  # header + one line per VM, no box drawing
    assert lines[0].split() == ["NAME", "NODE", "CORE", "ROLE", "WEIGHT", "CAP", "POWER", "JOB", "UTIL"]
    assert lines[1].split() == ["n1-c0-fg", "n1", "0", "fg", "10000", "none", "running", "17", "97%"]
    assert lines[0].index("NODE") == lines[-1].index("n1 ")  # aligned columns


def test_job_submit_vcsched_needs(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("POST", "/v1/jobs", 201, {"job": JOB})
    code, _, _ = run(capsys, "job", "submit", "--url", url, "-n", "2", "-t", "60", "--cpu-need", "0.4", "--mem",
                     "0.25", "-o", "json")
    assert code == 0
    assert rec.requests[-1]["body"] == {"procs": 2, "estimate": 60.0, "cpu_need": 0.4, "mem": 0.25}
    for opt, val in (("--cpu-need", "0"), ("--cpu-need", "1.5"), ("--mem", "-0.1"), ("--mem", "2")):
        code, _, err = run(capsys, "job", "submit", "--url", url, "-n", "1", "-t", "60", opt, val)
        assert code == 2 and "out-of-range" in err and opt in err


def test_vm_list_shows_observed_with_desired_beside(server: tuple[str, Recorder], capsys: Any) -> None:
    """The table is what the agent reports; the desired value is shown beside where they differ, and the
    idle VMs of the layout are listed without a job."""
    url, rec = server
    never = {**VM, "name": "j17-r0-p0", "managed": True, "observed": None, "differs": ["power"]}
    paused = {**VM, "name": "j17-r0-p1", "managed": True, "differs": ["power", "weight"],
              "observed": {"node": "n1", "power": "paused", "core": 0, "weight": 5, "cap": None, "job_id": "17",
                           "utilization": 0.0, "migration_phase": None}}
    idle = {**VM, "name": "n1-c5-bg", "role": "bg", "job_id": None, "weight": 1, "power": "running",
            "managed": False, "differs": [],
            "observed": {"node": "n1", "power": "running", "core": 5, "weight": 1, "cap": None, "job_id": None,
                         "utilization": 0.0, "migration_phase": None}}
    rec.answer("GET", "/v1/vms", 200, {"vms": [never, paused, idle]})
    code, out, _ = run(capsys, "vm", "list", "--url", url)
    assert code == 0 and "j17-r0-p0" in out and "n1-c5-bg" in out
    rows = {line.split()[0]: line for line in vm_table([never, paused, idle]).to_text().splitlines()}
    assert "not reported (want running)" in rows["j17-r0-p0"]
    assert "paused (want running)" in rows["j17-r0-p1"] and "5 (want 10000)" in rows["j17-r0-p1"]
    assert "(idle)" in rows["n1-c5-bg"] and "want" not in rows["n1-c5-bg"]
    rec.answer("GET", "/v1/vms/n1-c5-bg", 200, {"vm": idle})
    code, out, _ = run(capsys, "vm", "show", "n1-c5-bg", "--url", url)
    assert code == 0 and "idle core VM" in out and "observed: power running, core 5" in out


def test_node_list_and_show_give_applied_generation_report_age_and_last_error() -> None:
    n = {**NODE, "generation": 9, "generation_applied": 4, "report_age_s": 95.0,
         "errors": ["plan: generation refused: core 9 out of range"], "errors_time": 1.0,
         "refusals": [{"vm": "j1-r0-p0", "migration_id": "op1", "target_node": "n2", "reason": "no peer"}]}
    row = dict(zip(node_table([n]).headers, node_table([n]).rows[0], strict=True))
    assert row["GEN"] == "4 (want 9)" and row["REPORT"] == "95s ago"
    assert row["ERRORS"] == "plan: generation refused: core 9 out of range (1 migration(s) refused)"
    text = node_text(n)
    assert "generation: desired 9, applied by its agent 4 (behind); last full report 95s ago" in text
    assert "refused migration op1 of j1-r0-p0 to n2: no peer" in text
    fresh = {**n, "generation_applied": None, "report_age_s": None, "errors": [], "refusals": []}
    row = dict(zip(node_table([fresh]).headers, node_table([fresh]).rows[0], strict=True))
    assert (row["GEN"], row["REPORT"], row["ERRORS"]) == ("- (want 9)", "never", "-")


def test_vm_priority_set_says_it_applies_to_the_whole_job(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("PUT", "/v1/vms/j17-r0-p0/priority", 200,
               {"vm": {**VM, "name": "j17-r0-p0", "cap": 0.25}, "applied_to": ["j17-r0-p0", "j17-r0-p1"]})
    code, out, _ = run(capsys, "vm", "priority", "set", "j17-r0-p0", "--url", url, "--cap", "25")
    assert code == 0 and "applied to 2 VM(s): j17-r0-p0, j17-r0-p1" in out
    code, out, _ = run(capsys, "vm", "priority", "set", "--help")
    assert "every VM of the job" in " ".join(out.split())


def test_times_are_iso_8601_with_zone_and_relative(monkeypatch: pytest.MonkeyPatch) -> None:
    """Times carry their zone (the local one, TZ), show how long ago they are, and the reasons' raw
    ``t=<epoch>`` become readable; the simulator's small model times stay as they are."""
    monkeypatch.setenv("TZ", "EST5")
    time.tzset()
    try:
        assert fmt_time(0) == "1969-12-31T19:00:00-05:00"
        assert timefmt.iso(1795460000, utc=True) == "2026-11-23T18:53:20Z"
        assert timefmt.relative(1000.0, now=1300.0) == "5.0m ago" and timefmt.relative(1300.0, now=1000.0) == "in 5.0m"
        now = time.time()
        text = fmt_reason(f"head of queue: reservation at t={now + 600:.1f} needs 4 cores")
        assert "t=" not in text and "-05:00 (in 10.0m)" in text, text
        assert fmt_reason("head of queue: reservation at t=10 needs 4 cores").endswith("at t=10 needs 4 cores")
        explain = explain_text({"job_id": "3", "state": "queued", "queue_position": 0, "reason": None,
                                    "reservation": None})
        assert "position 1 in the queue (no queued job ahead of it)" in explain
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_job_list_limit_shows_the_newest_and_offers_the_oldest(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    newest_first = [{**JOB, "id": "9", "name": "nine"}, {**JOB, "id": "8", "name": "eight"}]
    rec.answer("GET", "/v1/jobs", 200, {"jobs": newest_first})
    code, out, _ = run(capsys, "job", "list", "--url", url, "--limit", "2")
    assert code == 0 and "order=newest" in rec.requests[-1]["query"]
    assert "the newest 2 jobs (--oldest for the oldest)" in out
    assert out.index("eight") < out.index("nine")  # shown in submission order
    code, out, _ = run(capsys, "job", "list", "--url", url, "--limit", "2", "--oldest", "-o", "json")
    assert code == 0 and "order" not in rec.requests[-1]["query"]


def test_policy_list_is_offline_and_names_the_parameters(capsys: Any) -> None:
    """``vmctl policy list`` exists (etc/vmctld.yaml and ``sim run --help`` point to it) and needs no daemon."""
    code, out, _ = run(capsys, "policy", "list", "-o", "json", "--output", "json")
    pols = {p["name"]: p for p in json.loads(out)["policies"]}
    assert code == 0 and {"fcfs", "easy", "measy"} <= set(pols)
    assert all(isinstance(q["name"], str) and "default" in q for p in pols.values() for q in p["params"])
    code, out, _ = run(capsys, "policy", "list")
    assert code == 0 and "measy" in out and "NAME" in out
    cfg = (Path(__file__).resolve().parents[2] / "etc" / "vmctld.yaml").read_text()
    assert "vmctl policy list" in cfg


def test_top_shows_cores_queue_and_recent_events(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("GET", "/v1/policy", 200, {"name": "measy", "params": {}, "available": ["measy"]})
    rec.answer("GET", "/v1/nodes", 200, {"nodes": [{**NODE, "cores": 2, "fg_busy": 1, "bg_busy": 1}]})
    vms = [{**VM, "name": "j5-r1-p0", "core": 0, "role": "fg", "job_id": "5", "managed": True},
           {**VM, "name": "j7-r1-p0", "core": 0, "role": "bg", "job_id": "7", "managed": True},
           {**VM, "name": "n1-c1-bg", "core": 1, "role": "bg", "job_id": None, "managed": False}]
    rec.answer("GET", "/v1/vms", 200, {"vms": vms})
    head = {**JOB, "id": "9", "name": "wide", "state": "queued", "procs": 2, "expected_start": 1795003600.0,
            "start_time": None, "reason": "head of queue: reservation at 2026-11-18T09:06:40Z needs 2 cores",
            "history": [{"time": 1795000000.0, "event": "submitted", "detail": None}]}
    started = {**JOB, "id": "5",
               "history": [{"time": 1795000100.0, "event": "started", "detail": "run 1 as fg on n1:0"}]}
    rec.answer("GET", "/v1/jobs", 200, {"jobs": [head, started]})
    code, out, _ = run(capsys, "top", "--url", url)
    assert code == 0, out
    assert "policy measy" in out
    assert "5/7 -/-" in out  # core 0: job 5 fg, job 7 bg; core 1: free (its idle VM has no job)
    # the reservation's time in the short form of the tables (the clock time, or the day when not today)
    at = timefmt.short(timefmt.parse_time("2026-11-18T09:06:40Z"))
    assert "9 wide procs 2, starts <= " in out and f"reservation at {at} needs 2 cores" in out
    events = out[out.index("recent events:"):]
    assert events.index("job 9 submitted") < events.index("job 5 started: run 1 as fg on n1:0")


def test_job_submit_sends_the_account(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    rec.answer("POST", "/v1/jobs", 201, {"job": {**JOB, "user": "alice", "account": "proj7"}})
    code, out, _ = run(capsys, "job", "submit", "-n", "1", "-t", "5", "--user", "alice", "--account", "proj7",
                       "--url", url)
    assert code == 0 and rec.requests[-1]["body"]["account"] == "proj7" and "proj7" in out


def test_job_show_prints_a_task_bag_in_one_line_each() -> None:
    """``vmctl job show`` of a task bag: its workers (task, corrected throughput, leaving) and a count of
    its tasks instead of every task's record (``-o json`` keeps those)."""
    from vmctl.cli.render import fmt_bag_tasks, fmt_workers

    workers = [{"id": "n1/0.0", "task": 3, "throughput": 0.912, "leaving": False},
               {"id": "n2/0.1", "task": 4, "throughput": None, "leaving": True}]
    assert fmt_workers(workers) == "n1/0.0 task 3 (0.91/s), n2/0.1 task 4 leaving"
    assert fmt_workers([]) == "none"
    tasks = [{"exit_status": 0, "worker": "n1/0.0"}, {"exit_status": 1, "worker": "n1/0.0"},
             {"exit_status": None, "worker": "n2/0.1"}, {"exit_status": None, "worker": None}]
    assert fmt_bag_tasks(tasks).startswith("4: 1 done, 1 failed, 1 running, 1 waiting")


def test_node_show_of_a_lost_node_is_no_live_claim(server: tuple[str, Recorder], capsys: Any) -> None:
    url, rec = server
    lost = {**NODE, "state": "lost", "fg_busy": 4, "bg_busy": 0, "utilization": 1.0, "last_report": 1795000070.0,
            "report_age_s": 95.0}
    rec.answer("GET", "/v1/nodes", 200, {"nodes": [lost]})
    rec.answer("GET", "/v1/vms", 200, {"vms": [{**VM, "observed": {"job_id": "17", "power": "running"}}]})
    code, out, err = run(capsys, "node", "show", "n1", "--url", url)
    assert code == 0, err
    assert rec.requests[-1]["path"] == "/v1/vms" and "node=n1" in rec.requests[-1]["query"]
    assert "busy: 4 fg" not in out
    assert ("last observed (its agent's last report, 95s ago; not live): utilization 100%, 1 VM(s) running "
            "a job (1 fg, 0 bg)") in out, out
    assert "desired (held for it by vmctld): 4 fg, 0 bg" in out
    # -o json is the node document alone (no extra call)
    n = len(rec.requests)
    code, out, _ = run(capsys, "node", "show", "n1", "--url", url, "-o", "json")
    assert code == 0 and json.loads(out) == {"node": lost} and len(rec.requests) == n + 1


def test_certificate_serials_print_at_one_width(server: tuple[str, Recorder], capsys: Any) -> None:
    """issue 25 item 5: a serial with leading zero digits printed 37 hex digits wide (the API's canonical
    form drops them); the CLI prints every serial 40 digits wide (20 bytes)."""
    from vmctl.cli.cert import fmt_serial

    url, rec = server
    short = "5D1F0A3B9C0E2D4F6A8B1C3D5E7F9A0B1C2AB"  # 37 digits: three leading zeros dropped
    assert len(short) == 37
    full = "7" * 40
    entry = {"node": "n1", "issued": 1795000000.0, "expires": 1826536000.0, "revoked": None, "key_from": "csr"}
    rec.answer("GET", "/v1/certs", 200, {"certs": [{**entry, "serial": short}, {**entry, "serial": full}]})
    code, out, _ = run(capsys, "cert", "list", "--url", url)
    assert code == 0 and re.findall(r"\b[0-9A-F]{37,40}\b", out) == ["000" + short, full], out
    code, out, _ = run(capsys, "cert", "list", "--url", url, "-o", "json")
    assert json.loads(out)["certs"][0]["serial"] == short  # -o json: the API's answer as it came
    rec.answer("DELETE", "/v1/certs/n1", 200, {"revoked": [{**entry, "serial": short}]})
    code, out, _ = run(capsys, "cert", "revoke", "n1", "--url", url)
    assert code == 0 and out.strip() == f"revoked certificate 000{short} of node n1"
    assert fmt_serial("0a") == "0" * 38 + "0A" and fmt_serial(None) == "-" and fmt_serial("node-7") == "node-7"
