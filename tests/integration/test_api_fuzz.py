"""Fuzz the daemon API with schemathesis, from ``vmctl/api/openapi.yaml``, against a real vmctld on
loopback (subprocess, SQLite in tmp, TLS with its own CA, the bootstrap admin token).

Every operation of the document gets up to ``MAX_EXAMPLES`` generated requests (positive and negative
data). Checked on every answer: no 5xx, the status code is one the document declares, the content
type and the body match the document. Agent routes are fuzzed with the operator's bearer token, so
they must answer with their documented 401/403 - never a 5xx. Bounded: the whole test stays well
under two minutes on two idle cores; the time budget below only catches a run-away (a loaded CI
machine may take several times as long without anything being wrong).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.livedaemon import live_daemon
from vmctl.cli.demo import DaemonProcess

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "vmctl" / "api" / "openapi.yaml"
MAX_EXAMPLES = 30
TIME_BUDGET_S = 600.0  # below pytest's 900 s timeout: the failure names the operations left


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    yield from live_daemon(tmp_path_factory.mktemp("fuzz"), policy="easy", tick_s=0.5)


def _load_schema() -> Any:
    if not OPENAPI.exists():
        pytest.skip(f"{OPENAPI.relative_to(ROOT)} not written yet (daemon-core)")
    schemathesis = pytest.importorskip("schemathesis", reason="schemathesis not installed (pip install -e .[dev])")
    return schemathesis.openapi.from_path(str(OPENAPI))


def test_openapi_document_covers_the_contract() -> None:
    schema = _load_schema()
    ops = {(op.method.upper(), op.path) for op in (r.ok() for r in schema.get_all_operations())}
    for expected in [("POST", "/v1/jobs"), ("POST", "/v1/jobs:batch"), ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{id}"),
                     ("DELETE", "/v1/jobs/{id}"), ("GET", "/v1/jobs/{id}/explain"), ("POST", "/v1/jobs/{id}/migrate"),
                     ("GET", "/v1/nodes"), ("GET", "/v1/vms"), ("PUT", "/v1/vms/{name}/priority"),
                     ("GET", "/v1/policy"), ("PUT", "/v1/policy"), ("POST", "/v1/tokens"), ("POST", "/v1/certs"),
                     ("GET", "/v1/health")]:
        assert expected in ops, f"{expected} missing from openapi.yaml"


@pytest.mark.slow
def test_fuzz_every_operation(daemon: DaemonProcess) -> None:
    schema = _load_schema()
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    checks = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
    headers = {"Authorization": f"Bearer {daemon.token()}"}
    base_url = daemon.url
    verify = str(daemon.ca_path)
    started = time.monotonic()
    failures: list[str] = []
    calls = 0
    operations = [r.ok() for r in schema.get_all_operations()]
    assert operations
    for op in operations:
        if time.monotonic() - started > TIME_BUDGET_S:
            failures.append(f"time budget of {TIME_BUDGET_S:.0f} s used up before {op.method.upper()} {op.path}")
            break
        label = f"{op.method.upper()} {op.path}"

        @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def run(case: Any) -> None:
            nonlocal calls
            calls += 1
            if "wait" in (case.query or {}):
                case.query["wait"] = 0  # the desired-state long-poll: never hold the fuzzer for a minute
            response = case.call(base_url=base_url, headers=headers, verify=verify, timeout=20)
            case.validate_response(response, checks=checks)

        try:
            run()
        except Exception as exc:  # collect every operation's failure, then report them all
            text = str(exc).strip().splitlines()
            failures.append(f"{label}: {type(exc).__name__}: {' | '.join(text[:12])}")
    assert daemon.alive(), f"vmctld died during the fuzzing:{daemon.tail(30)}"
    assert not failures, f"{len(failures)} operations failed ({calls} requests):\n" + "\n".join(failures)
    assert calls >= len(operations)
