"""Job shapes as JSON: what the API, the client library, ``vmctl job submit --shape`` and the
daemon's store exchange (the shape itself is :class:`vmctl.model.JobShape`).

Accepted forms (``shape`` of a job spec)::

    {"kind": "moldable", "table": {"2": 100, "4": 60}}                 measured: width -> seconds
    {"kind": "moldable", "widths": [2, 4], "times": [100, 60]}         the same, as two arrays
    {"kind": "moldable", "widths": [2, 4, 8], "time_at_min": 100,
     "speedup": {"name": "downey", "A": 6, "sigma": 1}}                a model (vmctl.speedup)
    {"kind": "moldable", "min_width": 2, "max_width": 16, "time_at_min": 100,
     "speedup": {"name": "amdahl", "serial": 0.05}}                    every width in [min, max]
    {"kind": "task-bag", "tasks": [10, 10, 12], "max_workers": 2}      per-task work, seconds
    {"kind": "task-bag", "tasks": [10, 10], "task_usage": 0.01}        tasks that mostly sleep (CPU usage
                                                                       of each, (0, 1]; default 1.0)

``min_width``/``max_width`` also bound a table or a width list: a width outside [min, max] is refused.
Times and work are seconds on standard resources (speed 1.0). :func:`shape_to_json` writes the
canonical form (``widths`` and ``times``, plus ``speedup`` and ``time_at_min`` when a model gave them;
``tasks`` and ``max_workers``, and ``task_usage`` when it is not 1.0), which :func:`shape_from_json`
reads back to an equal shape; :func:`job_shape` reads the shape of a job spec (request or stored).
Every problem is a ``ValidationError`` naming the field by its path (``jobs[0].shape.times[1]``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from vmctl.errors import ValidationError
from vmctl.model import MAX_SHAPE_WIDTHS, JobShape
from vmctl.speedup import SPEEDUP_MODELS, Amdahl, Downey, Speedup

SHAPE_KEYS = ("kind", "table", "widths", "times", "min_width", "max_width", "speedup", "time_at_min", "tasks",
              "max_workers", "task_usage")
_KIND_KEYS = {
    "moldable": {"kind", "table", "widths", "times", "min_width", "max_width", "speedup", "time_at_min"},
    "task-bag": {"kind", "tasks", "max_workers", "task_usage"},
}


def _path(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _tname(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(type(v), type(v).__name__)


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValidationError(field=where, problem=f"must be an integer >= 1, got {v!r}")
    return v


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ValidationError(field=where, problem=f"must be a number, got {v!r}")
    return float(v)


def _list(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValidationError(field=where, problem=f"must be an array, got {_tname(v)}")
    return v


def _speedup(raw: Any, where: str) -> Speedup:
    if not isinstance(raw, dict):
        raise ValidationError(field=where, problem=f"must be an object, got {_tname(raw)}")
    name = raw.get("name")
    if name not in SPEEDUP_MODELS:
        raise ValidationError(field=_path(where, "name"),
                              problem=f"must be one of {', '.join(SPEEDUP_MODELS)}, got {name!r}")
    keys = {"downey": ("name", "A", "sigma"), "amdahl": ("name", "serial")}[name]
    extra = sorted(set(raw) - set(keys))
    if extra:
        raise ValidationError(field=_path(where, extra[0]), problem=f"unknown key for the {name} model "
                                                                   f"(known: {', '.join(keys)})")
    missing = [k for k in keys if k not in raw]
    if missing:
        raise ValidationError(field=_path(where, missing[0]), problem="required")
    if name == "downey":
        return Downey(A=_num(raw["A"], _path(where, "A")), sigma=_num(raw["sigma"], _path(where, "sigma")))
    return Amdahl(serial=_num(raw["serial"], _path(where, "serial")))


def _moldable(d: Mapping[str, Any], where: str) -> JobShape:
    lo = _int(d["min_width"], _path(where, "min_width")) if d.get("min_width") is not None else None
    hi = _int(d["max_width"], _path(where, "max_width")) if d.get("max_width") is not None else None
    if lo is not None and hi is not None and hi < lo:
        raise ValidationError(field=_path(where, "max_width"), problem=f"{hi} is below min_width {lo}")
    table, widths_raw, times_raw, model = d.get("table"), d.get("widths"), d.get("times"), d.get("speedup")
    if table is not None and (widths_raw is not None or times_raw is not None or model is not None):
        raise ValidationError(field=_path(where, "table"), problem="give a table, or widths with times, or a speedup "
                                                                   "model; not several")
    if table is not None:
        if not isinstance(table, dict) or not table:
            raise ValidationError(field=_path(where, "table"), problem="must be a non-empty object width -> seconds")
        widths: list[int] = []
        for key in table:
            try:
                widths.append(_int(int(key), f"{_path(where, 'table')}.{key}"))
            except ValueError:
                raise ValidationError(field=f"{_path(where, 'table')}.{key}",
                                      problem="a width must be an integer >= 1") from None
        times = [_num(table[k], f"{_path(where, 'table')}.{k}") for k in table]
        pairs = sorted(zip(widths, times, strict=True))
        widths, times = [w for w, _ in pairs], [t for _, t in pairs]
    else:
        if widths_raw is None:
            if lo is None or hi is None:
                raise ValidationError(field=_path(where, "widths"),
                                      problem="required (or a table, or min_width and max_width)")
            if hi - lo + 1 > MAX_SHAPE_WIDTHS:
                raise ValidationError(field=_path(where, "max_width"),
                                      problem=f"[{lo}, {hi}] holds more than {MAX_SHAPE_WIDTHS} widths")
            widths = list(range(lo, hi + 1))
        else:
            widths = [_int(w, f"{_path(where, 'widths')}[{i}]")
                      for i, w in enumerate(_list(widths_raw, _path(where, "widths")))]
        if model is None:
            if times_raw is None:
                raise ValidationError(field=_path(where, "times"), problem="required (one per width), or a speedup "
                                                                           "model with time_at_min")
            times = [_num(t, f"{_path(where, 'times')}[{i}]")
                     for i, t in enumerate(_list(times_raw, _path(where, "times")))]
    for w in widths:
        if (lo is not None and w < lo) or (hi is not None and w > hi):
            raise ValidationError(field=_path(where, "widths"),
                                  problem=f"width {w} is outside [{lo if lo is not None else 1}, "
                                          f"{hi if hi is not None else 'any'}]")
    try:
        if model is not None:
            if d.get("time_at_min") is None:
                raise ValidationError(field="shape.time_at_min", problem="required with a speedup model")
            shape = JobShape.moldable_model(widths, _speedup(model, _path(where, "speedup")),
                                            _num(d["time_at_min"], _path(where, "time_at_min")))
            if times_raw is not None:  # the canonical form carries the times too: they must agree
                given = [_num(t, f"{_path(where, 'times')}[{i}]")
                         for i, t in enumerate(_list(times_raw, _path(where, "times")))]
                if len(given) != len(shape.times) or any(
                        not math.isclose(a, b, rel_tol=1e-9) for a, b in zip(given, shape.times, strict=False)):
                    raise ValidationError(field="shape.times", problem="do not follow the speedup model (give "
                                                                       "the model or the times, not both)")
            return shape
        if len(set(widths)) != len(widths):
            raise ValidationError(field="shape.widths", problem=f"lists a width twice: {widths}")
        order = sorted(range(len(widths)), key=widths.__getitem__)
        if len(times) != len(widths):
            raise ValidationError(field="shape.times",
                                  problem=f"has {len(times)} times for {len(widths)} widths (one per width)")
        return JobShape("moldable", tuple(widths[i] for i in order), tuple(times[i] for i in order))
    except ValidationError as exc:
        raise _under(exc, where) from None


def _under(exc: ValidationError, where: str) -> ValidationError:
    """``exc`` with its ``shape.`` field path moved under ``where`` (``jobs[0].shape``)."""
    name = str(exc.fields.get("field", ""))
    if name.startswith("shape.") and where != "shape":
        name = where + name[len("shape"):]
    return ValidationError(field=name, problem=exc.fields.get("problem", ""))


def _task_bag(d: Mapping[str, Any], where: str) -> JobShape:
    tasks = [_num(t, f"{_path(where, 'tasks')}[{i}]") for i, t in enumerate(_list(d.get("tasks"), _path(where,
                                                                                                         "tasks")))]
    workers = _int(d["max_workers"], _path(where, "max_workers")) if d.get("max_workers") is not None else None
    usage = _num(d["task_usage"], _path(where, "task_usage")) if d.get("task_usage") is not None else 1.0
    try:
        return JobShape.task_bag(tasks, workers, usage)
    except ValidationError as exc:
        raise _under(exc, where) from None


def shape_from_json(raw: Any, where: str = "shape") -> JobShape:
    """Parse one of the forms of the module docstring; errors name the field under ``where``."""
    if not isinstance(raw, dict):
        raise ValidationError(field=where, problem=f"must be an object, got {_tname(raw)}")
    kind = raw.get("kind")
    if kind not in _KIND_KEYS:
        raise ValidationError(field=_path(where, "kind"), problem=f"must be moldable or task-bag, got {kind!r}")
    extra = sorted(set(raw) - _KIND_KEYS[kind])
    if extra:
        raise ValidationError(field=_path(where, extra[0]),
                              problem=f"unknown key for a {kind} shape (known: {', '.join(sorted(_KIND_KEYS[kind]))})")
    return _moldable(raw, where) if kind == "moldable" else _task_bag(raw, where)


def job_shape(spec: Mapping[str, Any], where: str = "") -> JobShape | None:
    """The shape of a job spec (its ``shape``, one of the forms above), or None for a rigid job. The one
    reader of a spec's shape between the request and the view: the API's request check
    (``vmctl.api.schemas.job_spec``), the daemon's submission checks (``vmctl.daemon.jobs``) and the
    daemon's view of its jobs (``JobShape`` per queued or active job) all call it. ``where`` is the
    job's path (``jobs[0]``, ``job 7``; empty for a lone job): errors name ``<where>.shape.<field>``."""
    raw = spec.get("shape")
    return None if raw is None else shape_from_json(raw, _path(where, "shape"))


def shape_to_json(shape: JobShape) -> dict[str, Any]:
    """The canonical JSON form (read back by :func:`shape_from_json`)."""
    if shape.kind == "task-bag":
        bag: dict[str, Any] = {"kind": shape.kind, "tasks": list(shape.tasks), "max_workers": shape.max_workers}
        if shape.task_usage != 1.0:
            bag["task_usage"] = shape.task_usage
        return bag
    out: dict[str, Any] = {"kind": shape.kind, "widths": list(shape.widths), "times": list(shape.times)}
    if shape.speedup is not None:
        out["speedup"] = shape.speedup.to_json()
        out["time_at_min"] = shape.times[0]
    return out


def default_procs(shape: JobShape) -> int:
    """The width a policy that knows only rigid jobs gives a shaped job (its ``procs``): a moldable
    job's smallest width, a task bag's most workers."""
    return shape.widths[0] if shape.kind == "moldable" else shape.max_workers


def shape_summary(shape: JobShape) -> str:
    """One line for ``vmctl job show``: ``moldable widths 2, 4 (times 100 s, 60 s)``,
    ``moldable widths 2..16 (downey A=6 sigma=1, 100 s at 2)``, ``task bag of 5 tasks (50 s of work),
    at most 2 workers`` (``, each task at 0.01 of a core`` when its tasks' usage is not 1)."""
    if shape.kind == "task-bag":
        n = len(shape.tasks)
        usage = f", each task at {shape.task_usage:.3g} of a core" if shape.task_usage != 1.0 else ""
        return (f"task bag of {n} task{'s' if n != 1 else ''} ({shape.work:g} s of work), at most "
                f"{shape.max_workers} worker{'s' if shape.max_workers != 1 else ''}{usage}")
    ws = shape.widths
    contiguous = len(ws) > 2 and ws[-1] - ws[0] + 1 == len(ws)
    widths = f"{ws[0]}..{ws[-1]}" if contiguous else ", ".join(str(w) for w in ws)
    model = shape.speedup
    if model is None:
        detail = "times " + ", ".join(f"{t:g} s" for t in shape.times) if len(ws) <= 8 else \
            f"{shape.times[0]:g} s at {ws[0]} .. {shape.times[-1]:g} s at {ws[-1]}"
    else:
        params = " ".join(f"{k}={v:g}" for k, v in model.to_json().items() if k != "name")
        detail = f"{model.name} {params}, {shape.times[0]:g} s at {ws[0]}"
    return f"moldable widths {widths} ({detail})"
