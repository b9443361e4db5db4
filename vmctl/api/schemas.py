"""Validation of API request bodies. Every problem is a ``ValidationError`` naming the field by its
dotted path (``jobs[2].cpu_usage[0]``), answered as 422 by the server."""

from __future__ import annotations

import math
from typing import Any

from vmctl.errors import ValidationError

MAX_PROCS = 1_000_000
MAX_BATCH = 10_000


def _obj(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ValidationError(field=where or "body", problem=f"must be a JSON object, got {_tname(raw)}")
    return raw


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
    v = float(v)
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
           default: str | None = None) -> str | None:
    if key not in d or d[key] is None:
        if required:
            raise ValidationError(field=_path(where, key), problem="is required")
        return default
    v = d[key]
    if not isinstance(v, str):
        raise ValidationError(field=_path(where, key), problem=f"must be a string, got {_tname(v)}")
    if len(v) > max_len:
        raise ValidationError(field=_path(where, key), problem=f"longer than {max_len} characters")
    return v


def _usage_list(raw: Any, procs: int, where: str) -> list[float]:
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
            "user", "cpu_need", "mem")
TASK_KEYS = ("command", "work_seconds", "cpu_usage")


def job_spec(raw: Any, where: str = "") -> dict[str, Any]:
    """A normalized job spec (only known keys, checked types and ranges)."""
    d = _obj(raw, where)
    unknown_keys(d, JOB_KEYS, where)
    procs = integer(d, "procs", where, required=True, lo=1, hi=MAX_PROCS)
    assert procs is not None
    spec: dict[str, Any] = {"procs": procs, "estimate": number(d, "estimate", where, required=True, lo=0.0,
                                                                lo_open=True)}
    _put(spec, "name", string(d, "name", where, max_len=200))
    if d.get("cpu_usage") is not None:
        spec["cpu_usage"] = _usage_list(d["cpu_usage"], procs, _path(where, "cpu_usage"))
    spec["priority"] = integer(d, "priority", where, lo=-1_000_000, hi=1_000_000, default=0)
    _put(spec, "deadline", number(d, "deadline", where, lo=0.0))
    _put(spec, "command", string(d, "command", where, max_len=65536))
    _put(spec, "work_seconds", number(d, "work_seconds", where, lo=0.0))
    _put(spec, "user", string(d, "user", where, max_len=200))
    # vcsched virtual-cluster request: CPU need per VM (fraction of one host's core) and memory need
    # (fraction of one host's memory); absent = a full core and no memory constraint
    _put(spec, "cpu_need", number(d, "cpu_need", where, lo=0.0, lo_open=True, hi=1.0))
    _put(spec, "mem", number(d, "mem", where, lo=0.0, hi=1.0))
    if d.get("tasks") is not None:
        tw = _path(where, "tasks")
        tasks = d["tasks"]
        if not isinstance(tasks, list):
            raise ValidationError(field=tw, problem=f"must be an array, got {_tname(tasks)}")
        if len(tasks) != procs:
            raise ValidationError(field=tw, problem=f"has {len(tasks)} entries for {procs} processes")
        out = []
        for i, t in enumerate(tasks):
            w = f"{tw}[{i}]"
            td = _obj(t, w)
            unknown_keys(td, TASK_KEYS, w)
            item: dict[str, Any] = {}
            _put(item, "command", string(td, "command", w, max_len=65536))
            _put(item, "work_seconds", number(td, "work_seconds", w, lo=0.0))
            _put(item, "cpu_usage", number(td, "cpu_usage", w, lo=0.0, lo_open=True, hi=1.0))
            out.append(item)
        spec["tasks"] = out
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
