"""issue 25 item 5: one JSON envelope convention for the API and ``vmctl ... -o json`` (the rules open
vmctl/api/openapi.yaml and docs/operations.md "JSON envelopes"): every operator answer is an object;
one resource is under its kind's singular name, a list of them under the plural; a submission answers
``jobs``, and a one-job submission also ``job``, as ``job show`` prints it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "vmctl" / "api" / "openapi.yaml"

#: the resource schemas and the key that holds one of them (a list: the key + "s")
RESOURCES = {"Job": "job", "Node": "node", "Vm": "vm", "Operation": "operation", "TokenInfo": "token",
             "AgentCert": "cert", "Event": "event"}
#: lists named by what the call did to them, documented per route
VERB_LISTS = {("delete", "/v1/certs/{key}", "revoked")}
#: keys with a resource's name that hold something else, documented per route: a new token's secret
NOT_RESOURCES = {("post", "/v1/tokens", "token")}


class _UniqueKeys(yaml.SafeLoader):
    """A YAML loader that refuses a mapping key given twice (PyYAML keeps the last one silently)."""


def _mapping(loader: _UniqueKeys, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: set[Any] = set()
    for k, _v in node.value:
        key = loader.construct_object(k, deep=deep)
        assert key not in seen, f"openapi.yaml line {k.start_mark.line + 1}: key {key!r} given twice"
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _spec() -> dict[str, Any]:
    return yaml.load(OPENAPI.read_text(encoding="utf-8"), Loader=_UniqueKeys)  # a SafeLoader


def _ref(s: Any) -> str | None:
    return s["$ref"].rsplit("/", 1)[-1] if isinstance(s, dict) and "$ref" in s else None


def _answers(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, schema) of every 2xx JSON answer of an operator route (the agents' routes carry
    the wire protocol, vmctl/wire.py)."""
    schemas = spec["components"]["schemas"]
    out = []
    for path, ops in spec["paths"].items():
        if path.startswith("/v1/agent/"):
            continue
        for method, op in ops.items():
            if not isinstance(op, dict):
                continue
            for code, r in op.get("responses", {}).items():
                body = (r.get("content") or {}).get("application/json") if str(code).startswith("2") else None
                if body is None:
                    continue
                out.append((method, path, _resolved(body["schema"], schemas)))
    return out


def _resolved(s: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """``s`` with its ``$ref`` followed and an ``allOf`` of objects merged into one object."""
    while (name := _ref(s)) is not None:
        s = schemas[name]
    if "allOf" in s:
        parts = [_resolved(p, schemas) for p in s["allOf"]]
        kinds = {p.get("type") for p in parts}
        return {"type": kinds.pop() if len(kinds) == 1 else None,
                "properties": {k: v for p in parts for k, v in (p.get("properties") or {}).items()},
                "required": [k for p in parts for k in p.get("required") or ()]}
    return s


def test_openapi_has_no_key_given_twice() -> None:
    _spec()  # the loader asserts (Operation was defined twice; the first was silently dropped)


def test_every_operator_answer_follows_the_envelope_rules() -> None:
    answers = _answers(_spec())
    assert len(answers) > 30
    for method, path, s in answers:
        where = f"{method.upper()} {path}"
        assert s.get("type") == "object", f"{where}: an answer is an object, not {s.get('type')}"
        for key, prop in (s.get("properties") or {}).items():
            one = _ref(prop)
            many = _ref(prop.get("items")) if isinstance(prop, dict) and prop.get("type") == "array" else None
            if one in RESOURCES:
                assert key == RESOURCES[one], f"{where}: one {one} is under {RESOURCES[one]!r}, not {key!r}"
            elif many in RESOURCES and (method, path, key) not in VERB_LISTS:
                assert key == RESOURCES[many] + "s", f"{where}: {many} list under {key!r}"
            elif key in RESOURCES.values() and (method, path, key) not in NOT_RESOURCES:
                assert prop.get("type") == "object", f"{where}: {key!r} holds one {key}"


def test_submissions_answer_jobs_and_one_job_also_job() -> None:
    by_route = {(m, p): s for m, p, s in _answers(_spec())}
    one = by_route[("post", "/v1/jobs")]
    batch = by_route[("post", "/v1/jobs:batch")]
    show = by_route[("get", "/v1/jobs/{id}")]
    assert set(one["required"]) == {"job", "jobs", "warnings"} and set(batch["required"]) == {"jobs", "warnings"}
    assert _ref(one["properties"]["job"]) == _ref(show["properties"]["job"]) == "Job"
    assert one["properties"]["jobs"]["maxItems"] == 1
