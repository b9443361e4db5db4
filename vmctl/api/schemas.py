"""Validation of API request bodies. Every problem is a ``ValidationError`` naming the field by its
dotted path (``jobs[2].cpu_usage[0]``), answered as 422 by the server."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from vmctl.errors import ValidationError
from vmctl.model import MAX_NODE_SPEED, Discipline, group_name_problem
from vmctl.shapes import default_procs, job_shape, shape_summary, shape_to_json

MAX_PROCS = 1_000_000
MAX_BATCH = 10_000
#: bounds of every request body (``parse_body``): nesting depth, integer magnitude (what a 64-bit
#: store column holds), and the longest name (jobs, tokens, users)
MAX_DEPTH = 32
MAX_INT = 2**63 - 1
MAX_NAME = 200
#: upper bounds of durations (seconds) and of points in time (epoch seconds) in a request
MAX_SECONDS = 1e10
MAX_TIME = 1e12


# --------------------------------------------------------------------------- the JSON body


class _Refused:
    """A number the parser refused (too large, NaN, Infinity); named by its path after parsing."""

    __slots__ = ("problem",)

    def __init__(self, problem: str) -> None:
        self.problem = problem


def _abbrev(text: str) -> str:
    return text if len(text) <= 24 else f"{text[:12]}...{text[-6:]} ({len(text)} characters)"


def _parse_int(text: str) -> Any:
    if len(text.lstrip("-")) > 19 or abs(int(text)) > MAX_INT:  # never int() a 5,000-digit string
        return _Refused(f"integer {_abbrev(text)} is out of range (at most 2^63-1 in magnitude)")
    return int(text)


def _parse_float(text: str) -> Any:
    v = float(text)
    if not math.isfinite(v):
        return _Refused(f"number {_abbrev(text)} is too large for a 64-bit float")
    return v


def _parse_constant(text: str) -> Any:
    return _Refused(f"{text} is not a JSON number")


_STRING_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = frozenset(b"[]{}")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_EMPTY_PAIRS = re.compile(rb"\[\]|\{\}")
#: what may hide a number the plain parser would take (long digit runs, 3-digit exponents, NaN, Infinity)
_SUSPECT_NUMBER = re.compile(rb"[0-9]{16}|[eE][+-]?0*[0-9]{3}|NaN|Infinity")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def nesting_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of the JSON text ``raw`` (brackets inside strings do not count), or
    ``limit + 1`` when it is deeper than ``limit``. Unbalanced brackets (not JSON: the parser says
    why) count as 0. Each pass deletes the innermost pairs everywhere, in C: ``limit`` passes at most."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return 0  # cannot be deeper than the limit
    brackets = _STRING_TOKEN.sub(b"", raw).translate(None, _NOT_BRACKETS)
    for depth in range(limit + 1):
        if not brackets:
            return depth
        inner = _EMPTY_PAIRS.sub(b"", brackets)
        if len(inner) == len(brackets):
            return 0
        brackets = inner
    return limit + 1


def has_surrogate(s: str) -> bool:
    """``s`` holds a lone UTF-16 surrogate (not Unicode: it cannot be stored, printed or encoded)."""
    return _SURROGATE.search(s) is not None


def _field_text(key: str) -> str:
    return key.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")


def _first_problem(v: Any, where: str) -> tuple[str, str] | None:
    if isinstance(v, _Refused):
        return where or "body", v.problem
    if isinstance(v, str):
        if has_surrogate(v):
            return where or "body", "contains a lone UTF-16 surrogate (\\ud800-\\udfff): not a Unicode string"
        return None
    if isinstance(v, dict):
        for k, x in v.items():
            if has_surrogate(k):
                return _path(where, _field_text(k)), "the field name contains a lone UTF-16 surrogate"
            found = _first_problem(x, _path(where, k))
            if found:
                return found
    elif isinstance(v, list):
        for i, x in enumerate(v):
            found = _first_problem(x, f"{where or 'body'}[{i}]" if not where else f"{where}[{i}]")
            if found:
                return found
    return None


def parse_body(raw: bytes) -> Any:
    """A request body as JSON, refusing what no handler can take: empty bodies, text that is not
    UTF-8 or not JSON, nesting deeper than ``MAX_DEPTH``, integers beyond 64 bits, numbers beyond a
    float, ``NaN``/``Infinity`` and strings holding lone surrogates. Each is a ``ValidationError``
    naming the field (``jobs[0].estimate``) or ``body``."""
    if not raw.strip():
        raise ValidationError(field="body", problem="is empty: send a JSON document")
    depth = nesting_depth(raw)
    if depth > MAX_DEPTH:
        raise ValidationError(field="body", problem=f"is nested deeper than {MAX_DEPTH} levels")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(field="body", problem=f"is not UTF-8: {exc}") from exc
    strict = _SUSPECT_NUMBER.search(raw) is not None
    try:
        if strict:
            doc = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant)
        else:
            doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        raise ValidationError(field="body", problem=f"not valid JSON: {exc}") from exc
    if strict or _SURROGATE_ESCAPE.search(raw) is not None:
        found = _first_problem(doc, "")
        if found is not None:
            raise ValidationError(field=found[0], problem=found[1])
    return doc


def _obj(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValidationError(field=where or "body", problem=f"must be a JSON object, got {_tname(raw)}")
    return raw


def type_name(v: Any) -> str:
    """The JSON name of ``v``'s type (for messages)."""
    return _tname(v)


def _tname(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(v), type(v).__name__)


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def unknown_keys(d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for k in d:
        if k not in allowed:
            raise ValidationError(field=_path(where, str(k)), problem=f"unknown field (allowed: {', '.join(allowed)})")


def number(d: dict[str, Any], key: str, where: str, *, required: bool = False, lo: float | None = None,
           lo_open: bool = False, hi: float | None = None, default: float | None = None) -> float | None:
    if key not in d or d[key] is None:
        if required:
            raise ValidationError(field=_path(where, key), problem="is required")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValidationError(field=_path(where, key), problem=f"must be a number, got {_tname(v)}")
    try:
        v = float(v)
    except OverflowError:
        v = math.inf
    if not math.isfinite(v):
        raise ValidationError(field=_path(where, key), problem="must be finite")
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ValidationError(field=_path(where, key), problem=f"must be {'>' if lo_open else '>='} {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValidationError(field=_path(where, key), problem=f"must be <= {hi}, got {v}")
    return v


def integer(d: dict[str, Any], key: str, where: str, *, required: bool = False, lo: int | None = None,
            hi: int | None = None, default: int | None = None) -> int | None:
    if key not in d or d[key] is None:
        if required:
            raise ValidationError(field=_path(where, key), problem="is required")
        return default
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValidationError(field=_path(where, key), problem=f"must be an integer, got {_tname(v)}")
    if lo is not None and v < lo:
        raise ValidationError(field=_path(where, key), problem=f"must be >= {lo}, got {v}")
    if hi is not None and v > hi:
        raise ValidationError(field=_path(where, key), problem=f"must be <= {hi}, got {v}")
    return v


def string(d: dict[str, Any], key: str, where: str, *, required: bool = False, max_len: int = 4096,
           default: str | None = None, name: bool = False) -> str | None:
    """A string field: at most ``max_len`` characters, no NUL and no lone surrogate; a ``name`` (of a
    job, token, user, ...) is also non-empty and printable (no control or format characters, no
    line breaks: it is shown in tables and logs as it is)."""
    if key not in d or d[key] is None:
        if required:
            raise ValidationError(field=_path(where, key), problem="is required")
        return default
    v = d[key]
    if not isinstance(v, str):
        raise ValidationError(field=_path(where, key), problem=f"must be a string, got {_tname(v)}")
    if len(v) > max_len:
        raise ValidationError(field=_path(where, key), problem=f"longer than {max_len} characters")
    if "\x00" in v or has_surrogate(v):
        raise ValidationError(field=_path(where, key), problem="contains a NUL character or a lone surrogate")
    if name and not (v and v.isprintable()):
        bad = next((c for c in v if not c.isprintable()), "")
        problem = "must not be empty" if not v else f"must be printable, but holds {bad!a}"
        raise ValidationError(field=_path(where, key), problem=problem)
    return v


def _usage_list(raw: Any, procs: int, where: str) -> list[float]:
    """One CPU use per process: a list of ``procs`` numbers, or one number for every process (as
    ``vmctl job submit --cpu-usage 0.5`` takes it)."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        raw = [raw] * procs
    if not isinstance(raw, list):
        raise ValidationError(field=where, problem=f"must be an array, got {_tname(raw)}")
    if len(raw) != procs:
        raise ValidationError(field=where, problem=f"has {len(raw)} entries for {procs} processes")
    out: list[float] = []
    for i, u in enumerate(raw):
        if isinstance(u, bool) or not isinstance(u, int | float) or not 0.0 < float(u) <= 1.0:
            raise ValidationError(field=f"{where}[{i}]", problem=f"must be a number in (0, 1], got {u!r}")
        out.append(float(u))
    return out


def _put(target: dict[str, Any], key: str, value: Any) -> None:
    """Set an optional field only when the request gave it."""
    if value is not None:
        target[key] = value


JOB_KEYS = ("name", "procs", "estimate", "cpu_usage", "priority", "deadline", "command", "work_seconds", "tasks",
            "user", "account", "cpu_need", "mem", "shape")
TASK_KEYS = ("command", "work_seconds", "cpu_usage")


def job_spec(raw: Any, where: str = "") -> dict[str, Any]:
    """A normalized job spec (only known keys, checked types and ranges)."""
    d = _obj(raw, where)
    unknown_keys(d, JOB_KEYS, where)
    # a moldable or task-bag job (vmctl.shapes): ``procs`` defaults to the width a policy that knows
    # only rigid jobs gives it, and must be one of its widths
    shape = job_shape(d, where)
    procs = integer(d, "procs", where, required=shape is None, lo=1, hi=MAX_PROCS,
                    default=None if shape is None else default_procs(shape))
    assert procs is not None
    if shape is not None and not shape.allows(procs):
        raise ValidationError(field=_path(where, "procs"),
                              problem=f"{procs} is not a width its shape allows ({shape_summary(shape)})")
    # a shaped job's estimate defaults to its time at ``procs`` on standard resources
    estimate = number(d, "estimate", where, required=shape is None, lo=0.0, lo_open=True, hi=MAX_SECONDS)
    if estimate is None:
        assert shape is not None
        estimate = min(MAX_SECONDS, max(shape.time_at(procs), 1e-3))
    spec: dict[str, Any] = {"procs": procs, "estimate": estimate}
    # the optional fields, each checked only when given (issue 27: a batch of 1,000 plain jobs called a
    # checker per absent field, 10 per job); the keys keep this order in the spec
    get = d.get
    if get("name") is not None:
        spec["name"] = string(d, "name", where, max_len=MAX_NAME, name=True)
    if get("cpu_usage") is not None:
        spec["cpu_usage"] = _usage_list(d["cpu_usage"], procs, _path(where, "cpu_usage"))
    spec["priority"] = 0 if get("priority") is None else \
        integer(d, "priority", where, lo=-1_000_000, hi=1_000_000)
    if get("deadline") is not None:
        spec["deadline"] = number(d, "deadline", where, lo=0.0, hi=MAX_TIME)
    if get("command") is not None:
        spec["command"] = string(d, "command", where, max_len=65536)
    if get("work_seconds") is not None:
        spec["work_seconds"] = number(d, "work_seconds", where, lo=0.0, hi=MAX_SECONDS)
    if get("user") is not None:
        spec["user"] = string(d, "user", where, max_len=MAX_NAME, name=True)
    if get("account") is not None:  # Slurm's --account
        spec["account"] = string(d, "account", where, max_len=MAX_NAME, name=True)
    # vcsched virtual-cluster request: CPU need per VM (fraction of one host's core) and memory need
    # (fraction of one host's memory); absent = a full core and no memory constraint
    if get("cpu_need") is not None:
        spec["cpu_need"] = number(d, "cpu_need", where, lo=0.0, lo_open=True, hi=1.0)
    if get("mem") is not None:
        spec["mem"] = number(d, "mem", where, lo=0.0, hi=1.0)
    if get("tasks") is not None:
        tw = _path(where, "tasks")
        tasks = d["tasks"]
        if not isinstance(tasks, list):
            raise ValidationError(field=tw, problem=f"must be an array, got {_tname(tasks)}")
        if shape is not None and shape.kind == "task-bag":  # a bag's tasks: one entry per task of its shape
            if len(tasks) != len(shape.tasks):
                raise ValidationError(field=tw, problem=f"has {len(tasks)} entries for the {len(shape.tasks)} tasks "
                                                        f"of its shape")
        elif len(tasks) != procs:
            raise ValidationError(field=tw, problem=f"has {len(tasks)} entries for {procs} processes")
        out = []
        for i, t in enumerate(tasks):
            w = f"{tw}[{i}]"
            td = _obj(t, w)
            unknown_keys(td, TASK_KEYS, w)
            item: dict[str, Any] = {}
            _put(item, "command", string(td, "command", w, max_len=65536))
            _put(item, "work_seconds", number(td, "work_seconds", w, lo=0.0, hi=MAX_SECONDS))
            _put(item, "cpu_usage", number(td, "cpu_usage", w, lo=0.0, lo_open=True, hi=1.0))
            out.append(item)
        spec["tasks"] = out
    if shape is not None:
        spec["shape"] = shape_to_json(shape)
    return spec


def job_batch(raw: Any) -> list[dict[str, Any]]:
    d = _obj(raw, "")
    unknown_keys(d, ("jobs",), "")
    jobs = d.get("jobs")
    if not isinstance(jobs, list):
        raise ValidationError(field="jobs", problem=f"must be an array, got {_tname(jobs)}")
    if not jobs:
        raise ValidationError(field="jobs", problem="must not be empty")
    if len(jobs) > MAX_BATCH:
        raise ValidationError(field="jobs", problem=f"at most {MAX_BATCH} jobs per batch, got {len(jobs)}")
    return [job_spec(j, f"jobs[{i}]") for i, j in enumerate(jobs)]


def obj(raw: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    d = _obj(raw, "")
    unknown_keys(d, allowed, "")
    return d


def node_levels(body: dict[str, Any]) -> tuple[int | None, Discipline | None]:
    """``levels`` and ``discipline`` of an agent's registration (its VM level layout), each None when
    absent: levels 1..64, discipline priority | timeslice | shared."""
    levels = integer(body, "levels", "", lo=1, hi=64)
    discipline = string(body, "discipline", "", max_len=32)
    choices = [d.value for d in Discipline]
    if discipline is not None and discipline not in choices:
        raise ValidationError(field="discipline",
                              problem=f"must be one of {', '.join(choices)}, got {discipline[:40]!r}")
    return levels, None if discipline is None else Discipline(discipline)


def node_host(body: dict[str, Any]) -> tuple[float | None, str | None, int | None]:
    """``speed``, ``group`` and ``memory_mib`` of an agent's registration, each None when absent:
    speed a finite number in (0, 1000], group a short printable name, memory MiB >= 1."""
    speed = number(body, "speed", "", lo=0.0, lo_open=True, hi=MAX_NODE_SPEED)
    group = string(body, "group", "", max_len=256)
    if group is not None:
        problem = group_name_problem(group)
        if problem is not None:
            raise ValidationError(field="group", problem=f"{problem}, got {group[:40]!r}")
    return speed, group, integer(body, "memory_mib", "", lo=1, hi=1 << 40)


#: what ``PATCH /v1/jobs/{id}`` may change (of a queued job)
JOB_UPDATE_KEYS = ("estimate", "priority", "deadline")


def job_update(raw: Any) -> dict[str, Any]:
    """The changes of a queued job's ``estimate``, ``priority`` and ``deadline`` (null: no deadline),
    checked as at submission; at least one."""
    d = obj(raw, JOB_UPDATE_KEYS)
    out: dict[str, Any] = {}
    if "estimate" in d:
        out["estimate"] = number(d, "estimate", "", required=True, lo=0.0, lo_open=True, hi=MAX_SECONDS)
    if "priority" in d:
        out["priority"] = integer(d, "priority", "", required=True, lo=-1_000_000, hi=1_000_000)
    if "deadline" in d:
        out["deadline"] = number(d, "deadline", "", lo=0.0, hi=MAX_TIME)
    if not out:
        raise ValidationError(field="body", problem=f"give at least one of {', '.join(JOB_UPDATE_KEYS)}")
    return out


def flag(d: dict[str, Any], key: str, default: bool = False) -> bool:
    """An optional boolean field."""
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ValidationError(field=key, problem=f"must be true or false, got {_tname(v)}")
    return v
