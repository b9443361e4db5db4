"""Regression tests for the bad input of issue 9 item 8, against a real vmctld on loopback: each case
that gave a 500 (or was stored and then broke every ``vmctl job list``) now gets a 4xx naming the
field, and a bad string already in the store is listed, shown and cancelled by the CLI.

The fuzzing of every operation with such input is in ``test_api_fuzz.py``."""

from __future__ import annotations

import http.client
import json
import os
import sqlite3
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.livedaemon import live_daemon
from vmctl.localcluster import DaemonProcess


def _request(d: DaemonProcess, method: str, path: str, body: bytes | None = None,
             ctype: str | None = "application/json") -> tuple[int, Any]:
    conn = http.client.HTTPSConnection("127.0.0.1", d.port, timeout=60,
                                       context=ssl.create_default_context(cafile=str(d.ca_path)))
    headers = {"Authorization": f"Bearer {d.token()}"}
    if ctype is not None:
        headers["Content-Type"] = ctype
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    return resp.status, _strict_json(raw) if raw else None


def _strict_json(raw: bytes) -> Any:
    """Parse as a strict JSON parser would: UTF-8, no NaN/Infinity, no lone surrogate."""

    def refuse(const: str) -> Any:
        raise AssertionError(f"{const} is not JSON")

    doc = json.loads(raw.decode("utf-8"), parse_constant=refuse)
    _no_surrogates(doc)
    return doc


def _no_surrogates(v: Any) -> None:
    if isinstance(v, str):
        assert not any("\ud800" <= c <= "\udfff" for c in v), f"lone surrogate in {v!a}"
    elif isinstance(v, dict):
        for k, x in v.items():
            _no_surrogates(k)
            _no_surrogates(x)
    elif isinstance(v, list):
        for x in v:
            _no_surrogates(x)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    yield from live_daemon(tmp_path_factory.mktemp("badinput"), policy="easy", tick_s=0.5)


def _jobs(d: DaemonProcess) -> list[dict[str, Any]]:
    status, doc = _request(d, "GET", "/v1/jobs")
    assert status == 200
    return list(doc["jobs"])


@pytest.mark.parametrize(("label", "method", "path", "body", "field"), [
    ("estimate = 10^400", "POST", "/v1/jobs", b'{"procs":1,"estimate":1' + b"0" * 400 + b"}", "estimate"),
    ("procs of 5,000 digits", "POST", "/v1/jobs", b'{"procs":' + b"9" * 5000 + b',"estimate":10}', "procs"),
    ("JSON nested 100,000 deep", "POST", "/v1/jobs", b"[" * 100_000 + b"]" * 100_000, "body"),
    ("token name with a lone surrogate", "POST", "/v1/tokens", b'{"name":"\\ud800","role":"read"}', "name"),
    ("job name with a lone surrogate", "POST", "/v1/jobs", b'{"name":"\\ud800","procs":1,"estimate":10}', "name"),
    ("policy params: []", "PUT", "/v1/policy", b'{"name":"easy","params":[]}', "params"),
    ("estimate NaN", "POST", "/v1/jobs", b'{"procs":1,"estimate":NaN}', "estimate"),
    ("estimate -Infinity", "POST", "/v1/jobs", b'{"procs":1,"estimate":-Infinity}', "estimate"),
    ("estimate 1e400", "POST", "/v1/jobs", b'{"procs":1,"estimate":1e400}', "estimate"),
    ("estimate beyond 10^10 s", "POST", "/v1/jobs", b'{"procs":1,"estimate":1e300}', "estimate"),
    ("job name with an escape sequence", "POST", "/v1/jobs", b'{"name":"\\u001b[2J","procs":1,"estimate":10}',
     "name"),
    ("job name with a NUL", "POST", "/v1/jobs", b'{"name":"a\\u0000","procs":1,"estimate":10}', "name"),
    ("token ttl 1e300", "POST", "/v1/tokens", b'{"name":"t","role":"read","ttl_s":1e300}', "ttl_s"),
    ("batch: a surrogate in the second job", "POST", "/v1/jobs:batch",
     b'{"jobs":[{"procs":1,"estimate":1},{"procs":1,"estimate":1,"user":"\\udfff"}]}', "jobs[1].user"),
])
def test_issue_cases_get_422_naming_the_field_and_store_nothing(daemon: DaemonProcess, label: str, method: str,
                                                                path: str, body: bytes, field: str) -> None:
    before = len(_jobs(daemon))
    status, doc = _request(daemon, method, path, body)
    assert status == 422, f"{label}: {status} {doc}"
    assert doc["error"]["reference"] == "validation-failed" and doc["error"]["field"] == field, (label, doc)
    assert len(_jobs(daemon)) == before
    status, policy = _request(daemon, "GET", "/v1/policy")
    assert status == 200 and policy["params"] == {}


def test_text_plain_body_is_415_not_json(daemon: DaemonProcess) -> None:
    before = len(_jobs(daemon))
    for ctype in ("text/plain", None, "application/x-www-form-urlencoded", "application/json; charset=utf-16"):
        status, doc = _request(daemon, "POST", "/v1/jobs", b'{"procs":1,"estimate":10}', ctype=ctype)
        assert status == 415 and doc["error"]["reference"] == "unsupported-media-type", (ctype, status, doc)
    assert len(_jobs(daemon)) == before
    status, doc = _request(daemon, "POST", "/v1/jobs", b'{"procs":1,"estimate":10}',
                           ctype="application/json; charset=UTF-8")
    assert status == 201, doc


def test_query_parameters_and_path_segments(daemon: DaemonProcess) -> None:
    status, doc = _request(daemon, "GET", "/v1/jobs?limit=" + "9" * 5000)
    assert status == 422 and doc["error"]["field"] == "limit"
    for q in ("nan", "inf", "1e400", "-1"):
        status, doc = _request(daemon, "GET", f"/v1/jobs?limit={q}")
        assert status == 422 and doc["error"]["field"] == "limit", (q, doc)
    for seg in ("%ED%A0%80", "%00", "x" * 5000):
        for path in (f"/v1/jobs/{seg}", f"/v1/vms/{seg}", f"/v1/jobs/{seg}/explain"):
            status, doc = _request(daemon, "GET", path)
            assert status == 404, (path[:40], status, doc)
        status, doc = _request(daemon, "DELETE", f"/v1/jobs/{seg}")
        assert status == 404
        status, doc = _request(daemon, "GET", f"/v1/vms?node={seg}")
        assert status in (404, 422), (seg[:20], status, doc)


def _cli(d: DaemonProcess, *argv: str) -> subprocess.CompletedProcess[str]:
    """``vmctl ARGV`` as a process (stdout is a UTF-8 pipe with strict errors, as in a shell)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VMCTL_", "PYTHONIOENCODING"))}
    env.update(VMCTL_URL=d.url, VMCTL_TOKEN=d.token(), VMCTL_CA=str(d.ca_path), PYTHONUTF8="0", LC_ALL="C.UTF-8")
    return subprocess.run([sys.executable, "-m", "vmctl.cli.main", *argv], env=env, capture_output=True, text=True,
                          encoding="utf-8", errors="strict", timeout=120, check=False)


def test_a_bad_name_already_stored_is_listed_shown_and_cancelled(tmp_path: Path) -> None:
    """Rows stored before names were checked (a lone surrogate, rich markup, an escape sequence) break
    neither the API (strict JSON) nor ``vmctl job list/show/cancel`` (table and ``-o json``)."""
    bad = {"surrogate": "\\ud800", "markup": "[/x] [bold]", "escape": "\\u001b[2J\\u0007"}
    d = DaemonProcess(tmp_path, policy="easy", tick_s=0.5)
    try:
        d.start_and_wait(timeout=60)
        ids = {}
        for key in bad:
            status, doc = _request(d, "POST", "/v1/jobs",
                                   json.dumps({"name": f"placeholder-{key}", "procs": 1, "estimate": 1e6}).encode())
            assert status == 201, doc
            ids[key] = doc["job"]["id"]
    finally:
        assert d.stop() == 0
    # as an older vmctld stored them: the JSON text of the row holds the escapes
    db = sqlite3.connect(tmp_path / "vmctld.db")
    try:
        for key, text in bad.items():
            (doc_text,) = db.execute("SELECT doc FROM jobs WHERE id = ?", (ids[key],)).fetchone()
            assert f'"placeholder-{key}"' in doc_text
            db.execute("UPDATE jobs SET doc = ? WHERE id = ?",
                       (doc_text.replace(f'"placeholder-{key}"', f'"{text}"'), ids[key]))
        db.commit()
    finally:
        db.close()
    d = DaemonProcess(tmp_path, policy="easy", tick_s=0.5)
    try:
        d.start_and_wait(timeout=60)
        names = {j["id"]: j["name"] for j in _jobs(d)}  # strict JSON: the surrogate leaves as U+FFFD
        assert names[ids["surrogate"]] == "\ufffd"
        assert names[ids["markup"]] == "[/x] [bold]"
        listed = _cli(d, "job", "list")
        assert listed.returncode == 0, listed.stderr
        assert "[/x] [bold]" in listed.stdout and "\\x1b[2J\\x07" in listed.stdout and "\x1b" not in listed.stdout
        as_json = _cli(d, "job", "list", "-o", "json")
        assert as_json.returncode == 0, as_json.stderr
        listed_names = {j["id"]: j["name"] for j in _strict_json(as_json.stdout.encode())["jobs"]}
        assert listed_names[ids["escape"]] == "\x1b[2J\x07"
        for key in bad:
            shown = _cli(d, "job", "show", ids[key])
            assert shown.returncode == 0, shown.stderr
            cancelled = _cli(d, "job", "cancel", ids[key])
            assert cancelled.returncode == 0, cancelled.stderr
        assert {j["state"] for j in _jobs(d)} == {"cancelled"}
    finally:
        assert d.stop() == 0
