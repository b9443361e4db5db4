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

import http.client
import json
import re
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.livedaemon import live_daemon
from vmctl.localcluster import DaemonProcess

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
                     ("GET", "/v1/health"), ("POST", "/v1/plan"), ("GET", "/v1/workers")]:
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


# ------------------------------------------------------------------------------ hostile input
# schemathesis draws from the document, which never holds what an attacker sends: integers beyond
# 64 bits, numbers beyond a float, NaN/Infinity, 100,000 levels of nesting, lone UTF-16 surrogates.
# These tests send exactly that to every operation of the document (bodies, path segments, query
# values) and require an answer below 500 that is strict JSON; where the reader must refuse the
# body, a 422 naming the field.

#: (label, JSON text) of values no request may carry; the reader refuses each one (422)
REFUSED: list[tuple[str, bytes]] = [
    ("integer 10^400", b"1" + b"0" * 400),
    ("integer of 5,000 digits", b"9" * 5000),
    ("integer 2^63", b"9223372036854775808"),
    ("integer -2^63-1", b"-9223372036854775809"),
    ("number 1e400", b"1e400"),
    ("number -1.0e+400", b"-1.0e+400"),
    ("number of 400 digits", b"1" + b"0" * 400 + b".5"),
    ("NaN", b"NaN"),
    ("Infinity", b"Infinity"),
    ("-Infinity", b"-Infinity"),
    ("lone high surrogate", b'"\\ud800"'),
    ("lone low surrogate", b'"x\\udfffy"'),
    ("reversed surrogate pair", b'"\\udc00\\ud800"'),
]
#: values nested too deep: refused as a whole ("body")
TOO_DEEP: list[tuple[str, bytes]] = [
    ("arrays 33 deep", b"[" * 33 + b"]" * 33),
    ("arrays 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
    ("objects 1,000 deep", b'{"a":' * 1000 + b"1" + b"}" * 1000),
]
#: values the reader takes; handlers must refuse or accept them, never fail
ODD: list[tuple[str, bytes]] = [
    ("number 1e308", b"1e308"), ("number -1e308", b"-1e308"), ("number 5e-324", b"5e-324"), ("-0.0", b"-0.0"),
    ("integer 2^63-1", b"9223372036854775807"), ("integer -(2^63-1)", b"-9223372036854775807"),
    ("NUL", b'"a\\u0000b"'), ("escape sequence", b'"\\u001b[2J"'), ("rich markup", b'"[/x]"'),
    ("line break", b'"a\\nb"'), ("zero-width space", b'"\\u200b"'), ("emoji pair", b'"\\ud83d\\ude00"'),
    ("string of 100,000", b'"' + b"x" * 100_000 + b'"'), ("empty string", b'""'), ("null", b"null"),
    ("true", b"true"), ("empty array", b"[]"), ("empty object", b"{}"), ("array of nulls", b"[null,null]"),
]
#: hostile path segments and query values (already percent-encoded)
SEGMENTS = ["%ED%A0%80", "%00", "%FF%FE", "x" * 5000, "..", "%2F", "9" * 5000, "NaN", "-1", "%5B%2Fx%5D"]
QUERY_VALUES = ["9" * 5000, "1e400", "nan", "inf", "-inf", "%ED%A0%80", "%00", "-1", "1.5", "", "x" * 5000]
#: a valid base body per operation (so that each field is reached), JSON text per field
BASE: dict[tuple[str, str], dict[str, bytes]] = {
    ("POST", "/v1/jobs"): {"procs": b"1", "estimate": b"10"},
    ("POST", "/v1/jobs/{id}/migrate"): {"to_node": b'"fz"'},
    ("PUT", "/v1/vms/{name}/priority"): {"weight": b"5"},
    ("PUT", "/v1/policy"): {"name": b'"easy"'},
    ("POST", "/v1/tokens"): {"name": b'"fuzz"', "role": b'"read"'},
    ("POST", "/v1/certs"): {"node": b'"fz2"'},
    ("POST", "/v1/nodes/{name}/cores"): {"cores": b"2"},
    ("POST", "/v1/agent/nodes/{node}/register"): {"cores": b"2"},
    ("POST", "/v1/agent/nodes/{node}/observed"): {"node": b'"fz"', "generation_applied": b"0", "cores": b"2"},
}
AGENT = "fz"


def _obj(fields: dict[str, bytes]) -> bytes:
    return b"{" + b",".join(json.dumps(k).encode() + b":" + v for k, v in fields.items()) + b"}"


def _strict(raw: bytes) -> Any:
    """The answer as strict JSON: UTF-8, no NaN/Infinity, no lone surrogate anywhere."""

    def refuse(const: str) -> Any:
        raise AssertionError(f"the answer holds {const}, which is not JSON")

    doc = json.loads(raw.decode("utf-8"), parse_constant=refuse)
    stack = [doc]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            assert not any("\ud800" <= c <= "\udfff" for c in v), f"lone surrogate in the answer: {v!a}"
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return doc


class Hostile:
    """Raw HTTPS requests to the fuzzed daemon, as the admin (operator routes) or as agent ``fz``."""

    def __init__(self, daemon: DaemonProcess, tmp: Path) -> None:
        self.d = daemon
        self.token = daemon.token()
        self.requests = 0
        self.operator = ssl.create_default_context(cafile=str(daemon.ca_path))
        status, doc = self.send("POST", "/v1/certs", _obj({"node": json.dumps(AGENT).encode()}))
        assert status == 201, doc
        (tmp / "fz.crt").write_text(doc["cert_pem"])
        (tmp / "fz.key").write_text(doc["key_pem"])
        self.agent = ssl.create_default_context(cafile=str(daemon.ca_path))
        self.agent.load_cert_chain(str(tmp / "fz.crt"), str(tmp / "fz.key"))
        status, doc = self.send("POST", f"/v1/agent/nodes/{AGENT}/register", b'{"cores":2}')
        assert status == 200, doc

    def send(self, method: str, target: str, body: bytes | None = None,
             ctype: str | None = "application/json") -> tuple[int, Any]:
        agent = target.startswith("/v1/agent/")
        conn = http.client.HTTPSConnection("127.0.0.1", self.d.port, context=self.agent if agent else self.operator,
                                           timeout=60)
        headers = {} if agent else {"Authorization": f"Bearer {self.token}"}
        if ctype is not None:
            headers["Content-Type"] = ctype
        try:
            conn.request(method, target, body=body, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        self.requests += 1
        label = f"{method} {target[:80]} with {(body or b'')[:60]!r}"
        assert resp.status < 500, f"{label}: {resp.status} {raw[:300]!r}"
        if not raw:
            return resp.status, None
        if (resp.getheader("Content-Type") or "").startswith("application/json"):
            return resp.status, _strict(raw)
        return resp.status, raw


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    doc = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    out = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in ("get", "post", "put", "delete"):
                out.append((method.upper(), path, op))
    assert len(out) >= 20
    return out


def _fill(path: str, segment: str = "1") -> str:
    """The path with its parameters filled: ``{node}`` is the fuzzing agent (else the route is refused
    before the body is read), any other with ``segment``."""
    return re.sub(r"\{([^}]+)\}", lambda m: AGENT if m.group(1) == "node" else segment, path)


@pytest.fixture(scope="module")
def hostile(daemon: DaemonProcess, tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return Hostile(daemon, tmp_path_factory.mktemp("hostile"))


@pytest.mark.slow
def test_every_operation_refuses_hostile_numbers_nesting_and_surrogates(daemon: DaemonProcess,
                                                                         hostile: Hostile) -> None:
    """Each refused value in each field of each body (and as the whole body, and inside a batch):
    422 naming the field; each odd value: any answer below 500; hostile path segments and query
    values on every operation: below 500. Every answer strict JSON."""
    for method, path, _op in _operations():
        target = _fill(path)
        base = BASE.get((method, path), {})
        # the whole body (every operation: those that read no body must ignore it)
        for label, value in REFUSED + TOO_DEEP:
            status, doc = hostile.send(method, target, value)
            if method in ("GET", "DELETE") or path.endswith(("/drain", "/undrain")):
                continue
            assert status == 422 and doc["error"]["field"] == "body", (method, path, label, status, doc)
        for _label, value in ODD:
            hostile.send(method, target, value)
        # each field of the body (plus an unknown one), and a field name with a lone surrogate
        if method in ("POST", "PUT") and not path.endswith(("/drain", "/undrain")):
            for field in [*base, "extra"]:
                for label, value in REFUSED:
                    status, doc = hostile.send(method, target, _obj({**base, field: value}))
                    assert status == 422 and doc["error"]["field"] == field, (method, path, field, label, doc)
                for label, value in TOO_DEEP:
                    status, doc = hostile.send(method, target, _obj({**base, field: value}))
                    assert status == 422 and doc["error"]["field"] == "body", (method, path, field, label, doc)
                for _label, value in ODD:
                    hostile.send(method, target, _obj({**base, field: value}))
            status, doc = hostile.send(method, target, b'{"\\ud800":1}')
            assert status == 422 and "surrogate" in doc["error"]["message"], (method, path, doc)
            # the same body as text/plain, or without a type: 415 before it is read
            for ctype in ("text/plain", None, "application/json; charset=latin-1"):
                status, doc = hostile.send(method, target, _obj(base) if base else b"{}", ctype=ctype)
                assert status == 415, (method, path, ctype, status, doc)
        # path segments and query values
        if "{" in path:
            for seg in SEGMENTS:
                hostile.send(method, _fill(path, seg), _obj(base) if base else None)
        for param in ("limit", "state", "after", "wait", "node", "archived", "x"):
            for qv in QUERY_VALUES:
                hostile.send(method, f"{target}?{param}={qv}", None)
    # inside a batch: the field is named with its place in the batch
    job = BASE[("POST", "/v1/jobs")]
    for field in [*job, "name", "deadline", "work_seconds", "priority"]:
        for label, value in REFUSED:
            body = b'{"jobs":[' + _obj(job) + b"," + _obj({**job, field: value}) + b"]}"
            status, doc = hostile.send("POST", "/v1/jobs:batch", body)
            assert status == 422 and doc["error"]["field"] == f"jobs[1].{field}", (field, label, doc)
    assert hostile.requests > 2000
    assert daemon.alive(), f"vmctld died:{daemon.tail(30)}"
    log = daemon.log_path.read_text(encoding="utf-8", errors="replace")
    assert "internal error" not in log and "Traceback" not in log, log[-3000:]


def _lone_text(s: str) -> tuple[bytes, bool]:
    """``s`` as a JSON string, and whether it still holds a lone surrogate once decoded (a high one
    followed by a low one decodes as one character)."""
    text = json.dumps(s)
    return text.encode(), any("\ud800" <= c <= "\udfff" for c in json.loads(text))


def _hostile_json(max_leaves: int = 12) -> Any:
    """A hypothesis strategy of (JSON text, whether it holds a value the reader refuses) with hostile
    and odd values at random places (in values and in field names)."""
    from hypothesis import strategies as st

    def leaf(refused: bool) -> Any:
        return lambda v: (v, refused)

    texts = st.text(max_size=20).map(lambda t: (json.dumps(t).encode(), False))
    lone = st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3)
    leaves = st.one_of(
        st.sampled_from([v for _l, v in REFUSED]).map(leaf(True)),
        st.sampled_from([v for _l, v in ODD]).map(leaf(False)),
        st.integers(-(2**63 - 1), 2**63 - 1).map(lambda i: (str(i).encode(), False)),
        st.integers(min_value=2**63).map(lambda i: (str(i).encode(), True)),
        st.floats(allow_nan=False, allow_infinity=False).map(lambda f: (json.dumps(f).encode(), False)),
        texts,
        st.tuples(st.text(max_size=5), lone).map(lambda t: _lone_text(t[0] + t[1])),
    )
    keys = st.sampled_from(["procs", "estimate", "name", "jobs", "params", "cores", "vms", "node", "to_node", "tier",
                            "weight", "cap", "pin", "role", "ttl_s", "tasks", "cpu_usage", "\\ud800", "x"])

    def array(items: list[tuple[bytes, bool]]) -> tuple[bytes, bool]:
        return b"[" + b",".join(v for v, _r in items) + b"]", any(r for _v, r in items)

    def obj(d: dict[str, tuple[bytes, bool]]) -> tuple[bytes, bool]:
        body = b"{" + b",".join(b'"' + k.encode() + b'":' + v for k, (v, _r) in d.items()) + b"}"
        return body, any(r for _v, r in d.values()) or any("\\ud" in k for k in d)

    def extend(children: Any) -> Any:
        return st.lists(children, max_size=4).map(array) | st.dictionaries(keys, children, max_size=5).map(obj)

    return st.recursive(leaves, extend, max_leaves=max_leaves)


@pytest.mark.slow
def test_fuzz_hostile_documents_on_every_operation(daemon: DaemonProcess, hostile: Hostile) -> None:
    """Random documents built from hostile and odd values, merged into each operation's valid body
    or sent as the whole body: never a 5xx, always strict JSON back, and a 422 whenever the body
    holds a value the reader refuses (anywhere, however deep in the document)."""
    sent = hostile.requests
    operations = _operations()
    for method, path, _op in operations:
        reads_body = method in ("POST", "PUT") and not path.endswith(("/drain", "/undrain"))
        _fuzz_operation(hostile, method, _fill(path), BASE.get((method, path), {}), reads_body)
    assert hostile.requests - sent >= 30 * len(operations)
    assert daemon.alive(), f"vmctld died:{daemon.tail(30)}"


def _fuzz_operation(hostile: Hostile, method: str, target: str, base: dict[str, bytes], reads_body: bool) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(doc=_hostile_json(), field=st.sampled_from([*base, "extra", None]), deep=st.booleans())
    def run(doc: tuple[bytes, bool], field: str | None, deep: bool) -> None:
        text, refused = doc
        body = text if field is None else _obj({**base, field: text})
        if deep:  # wrapped deeper than the reader takes
            body = b"[" * 33 + body + b"]" * 33
        status, answer = hostile.send(method, target, body)
        if reads_body and (refused or deep):
            assert status == 422, (method, target, body[:200], status, answer)

    run()
