"""JSON forms of the daemon <-> agent documents (``NodeDesired``, ``NodeObserved``).

One codec beside the model, shared by the daemon (desired state kept in the store), its HTTP API and
the agents' sources (the HTTP source, and the ``--desired FILE`` / ``vmctl-agent --once`` file source
and report file of ``vmctl.agents.sources``, whose YAML or JSON documents are these); neither the
daemon nor the agents import ``vmctl.api``. This module imports only the model and the error tree.
Decoding validates every field (a desired document also its keys: a misspelt key is an error, not
ignored) and raises ``ValidationError`` with a dotted path (``vms[3].power``).
"""

from __future__ import annotations

import math
from typing import Any

from vmctl.errors import ValidationError
from vmctl.model import Discipline, NodeLayout, SliceSchedule
from vmctl.nodedoc import (
    MigrationRefusal,
    MigrationSpec,
    NodeDesired,
    NodeObserved,
    PowerState,
    ProcessSpec,
    VmDesired,
    VmObserved,
    VmRole,
)

#: above any generation vmctld can have issued (one per change of a node's desired state), and below the
#: store's 64-bit integers even after a rollback's resync writes the next one (``NodeEvents._resync_generation``)
MAX_GENERATION = 2**62


def _get(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, *, default: Any = ...,
         nullable: bool = False) -> Any:
    if key not in d:
        if default is ...:
            raise ValidationError(field=f"{where}{key}", problem="is required")
        return default
    v = d[key]
    if v is None:
        if nullable:
            return None
        raise ValidationError(field=f"{where}{key}", problem="must not be null")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if isinstance(v, bool) and bool not in kinds:
        raise ValidationError(field=f"{where}{key}", problem=f"must be {kinds[0].__name__}, got a boolean")
    if not isinstance(v, kinds):
        raise ValidationError(field=f"{where}{key}", problem=f"must be {kinds[0].__name__}, got {type(v).__name__}")
    if isinstance(v, float) and not math.isfinite(v):
        raise ValidationError(field=f"{where}{key}", problem="must be finite")
    return v


def _enum(d: dict[str, Any], key: str, enum: type[Any], where: str, default: Any = ...) -> Any:
    v = _get(d, key, str, where, default=default)
    if not isinstance(v, str):
        return v
    try:
        return enum(v)
    except ValueError as exc:
        allowed = ", ".join(e.value for e in enum)
        raise ValidationError(field=f"{where}{key}", problem=f"must be one of {allowed}, got {v!r}") from exc


def _mapping(v: Any, where: str, known: tuple[str, ...] = ()) -> dict[str, Any]:
    """``v`` as an object; with ``known``, a key outside it is an error naming the key and the known ones."""
    if not isinstance(v, dict):
        raise ValidationError(field=where or "body", problem=f"must be an object, got {type(v).__name__}")
    if known:
        for key in v:
            if key not in known:
                dot = f"{where}." if where else ""
                raise ValidationError(field=f"{dot}{key}", problem=f"unknown key (known: {', '.join(known)})")
    return v


def _ranged(d: dict[str, Any], key: str, kind: type, where: str, *, lo: float | None = None, hi: float | None = None,
            default: Any = ...) -> Any:
    """``_get`` of a number within ``lo`` .. ``hi`` (either may be absent)."""
    v = _get(d, key, kind, where, default=default)
    if v is not None and lo is not None and v < lo:
        raise ValidationError(field=f"{where}{key}", problem=f"must be >= {lo}, got {v}")
    if v is not None and hi is not None and v > hi:
        raise ValidationError(field=f"{where}{key}", problem=f"must be <= {hi}, got {v}")
    return v


# --------------------------------------------------------------------------- desired


def process_to_json(p: ProcessSpec) -> dict[str, Any]:
    return {"job_id": p.job_id, "index": p.index, "command": p.command, "work_seconds": p.work_seconds,
            "cpu_usage": p.cpu_usage}


def migration_to_json(m: MigrationSpec) -> dict[str, Any]:
    return {"migration_id": m.migration_id, "source_node": m.source_node, "target_node": m.target_node,
            "target_core": m.target_core, "phase": m.phase, "mode": m.mode}


def vm_desired_to_json(v: VmDesired) -> dict[str, Any]:
    return {
        "name": v.name, "core": v.core, "role": v.role.value, "weight": v.weight, "cap": v.cap,
        "power": v.power.value, "process": None if v.process is None else process_to_json(v.process),
        "checkpoint_path": v.checkpoint_path,
        "migration": None if v.migration is None else migration_to_json(v.migration),
        "memory_mib": v.memory_mib, **({"level": v.level} if v.level >= 0 else {}),
        **({"replicas": list(v.replicas)} if v.replicas else {}),
    }


def slices_to_json(s: SliceSchedule) -> dict[str, Any]:
    return {"epoch": s.epoch, "period_s": s.period, "rows": list(s.order)}


def layout_to_json(layout: NodeLayout) -> dict[str, Any]:
    return {"discipline": layout.discipline.value, "levels": layout.levels}


def layout_from_json(raw: Any, where: str) -> NodeLayout:
    """A ``{"discipline": ..., "levels": N}`` object; ``where`` is its dotted path with a trailing dot."""
    d = _mapping(raw, where.rstrip("."), ("discipline", "levels"))
    discipline = _enum(d, "discipline", Discipline, where)
    levels = _get(d, "levels", int, where)
    try:
        return NodeLayout(discipline, levels)
    except ValidationError as exc:
        raise ValidationError(field=f"{where}levels", problem=exc.fields["problem"]) from exc


def desired_to_json(d: NodeDesired) -> dict[str, Any]:
    out = {"node": d.node, "generation": d.generation, "vms": [vm_desired_to_json(v) for v in d.vms]}
    if d.slices is not None:
        out["slices"] = slices_to_json(d.slices)
    if d.layout is not None:
        out["layout"] = layout_to_json(d.layout)
    return out


def slices_from_json(raw: Any, where: str) -> SliceSchedule:
    d = _mapping(raw, where.rstrip("."), ("epoch", "period_s", "rows"))
    rows = _get(d, "rows", list, where)
    for i, r in enumerate(rows):
        if isinstance(r, bool) or not isinstance(r, int):
            raise ValidationError(field=f"{where}rows[{i}]", problem=f"must be an integer level, got {r!r}")
    if not rows or len(set(rows)) != len(rows) or min(rows) < 0:
        raise ValidationError(field=f"{where}rows", problem=f"must be distinct levels >= 0, at least one, got {rows}")
    period = _get(d, "period_s", float, where)
    if period <= 0:
        raise ValidationError(field=f"{where}period_s", problem=f"must be a positive number of seconds, got {period}")
    return SliceSchedule(period=period, order=tuple(rows), epoch=_get(d, "epoch", float, where))


def process_from_json(raw: Any, where: str) -> ProcessSpec:
    d = _mapping(raw, where.rstrip("."), ("job_id", "index", "command", "work_seconds", "cpu_usage"))
    usage = _ranged(d, "cpu_usage", float, where, hi=1.0, default=1.0)
    if usage <= 0:
        raise ValidationError(field=f"{where}cpu_usage", problem=f"must be > 0 (a share of one core), got {usage}")
    return ProcessSpec(
        job_id=_get(d, "job_id", str, where), index=_ranged(d, "index", int, where, lo=0),
        command=_get(d, "command", str, where, default=""),
        work_seconds=_ranged(d, "work_seconds", float, where, lo=0.0, default=0.0), cpu_usage=usage,
    )


_PHASES = ("requested", "running", "completed", "failed", "aborted")


def migration_from_json(raw: Any, where: str) -> MigrationSpec:
    d = _mapping(raw, where.rstrip("."), ("migration_id", "source_node", "target_node", "target_core", "phase", "mode"))
    phase = _get(d, "phase", str, where, default="requested")
    if phase not in _PHASES:
        raise ValidationError(field=f"{where}phase", problem=f"must be one of {', '.join(_PHASES)}")
    mode = _get(d, "mode", str, where, default="live")
    if mode not in ("live", "checkpoint"):
        raise ValidationError(field=f"{where}mode", problem="must be live or checkpoint")
    return MigrationSpec(
        migration_id=_get(d, "migration_id", str, where), source_node=_get(d, "source_node", str, where),
        target_node=_get(d, "target_node", str, where),
        target_core=_ranged(d, "target_core", int, where, lo=-1),  # -1: unpinned (shared VMs)
        phase=phase, mode=mode,
    )


_VM_DESIRED_KEYS = ("name", "core", "role", "weight", "cap", "power", "process", "checkpoint_path", "migration",
                    "memory_mib", "level", "replicas")


def vm_desired_from_json(raw: Any, where: str) -> VmDesired:
    d = _mapping(raw, where.rstrip("."), _VM_DESIRED_KEYS)
    proc = d.get("process")
    mig = d.get("migration")
    return VmDesired(
        name=_get(d, "name", str, where), core=_ranged(d, "core", int, where, lo=-1),  # -1: unpinned (shared)
        role=_enum(d, "role", VmRole, where), weight=_get(d, "weight", int, where),
        cap=_get(d, "cap", float, where, default=None, nullable=True),
        power=_desired_power(d, where),
        process=None if proc is None else process_from_json(proc, f"{where}process."),
        checkpoint_path=_get(d, "checkpoint_path", str, where, default=None, nullable=True),
        migration=None if mig is None else migration_from_json(mig, f"{where}migration."),
        memory_mib=_ranged(d, "memory_mib", int, where, lo=1, default=64),
        level=_level(d, where), replicas=_replicas(d, where),
    )


#: what a desired state may ask of a VM (crashed and migrating are only ever observed)
_DESIRED_POWER = (PowerState.RUNNING, PowerState.PAUSED, PowerState.SHUTOFF, PowerState.SAVED, PowerState.ABSENT)


def _desired_power(d: dict[str, Any], where: str) -> PowerState:
    power: PowerState = _enum(d, "power", PowerState, where, default=PowerState.RUNNING)
    if power not in _DESIRED_POWER:
        allowed = ", ".join(p.value for p in _DESIRED_POWER)
        raise ValidationError(field=f"{where}power", problem=f"must be one of {allowed}, got {power.value!r}")
    return power


def _replicas(d: dict[str, Any], where: str) -> tuple[int, ...]:
    rows: list[Any] = _get(d, "replicas", list, where, default=[])
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in rows) or len(set(rows)) != len(rows):
        raise ValidationError(field=f"{where}replicas", problem=f"must be distinct levels >= 0, got {rows}")
    return tuple(rows)


def _level(d: dict[str, Any], where: str) -> int:
    level: int = _get(d, "level", int, where, default=-1)
    if level < -1:
        raise ValidationError(field=f"{where}level", problem=f"must be >= 0 (or absent: follows role), got {level}")
    return level


def desired_from_json(raw: Any) -> NodeDesired:
    """A node's desired state as vmctld serves it and ``desired_to_json`` writes it (every kind: fg/bg
    pairs, shared VMs with caps, gang rows with replicas and a slice schedule, task-bag workers on
    levels, a layout to take)."""
    d = _mapping(raw, "", ("node", "generation", "vms", "slices", "layout"))
    vms = _get(d, "vms", list, "", default=[])
    slices = d.get("slices")
    return NodeDesired(
        node=_get(d, "node", str, ""),
        generation=_ranged(d, "generation", int, "", lo=0, hi=MAX_GENERATION - 1),
        vms=tuple(vm_desired_from_json(v, f"vms[{i}].") for i, v in enumerate(vms)),
        slices=None if slices is None else slices_from_json(slices, "slices."),
        layout=None if d.get("layout") is None else layout_from_json(d["layout"], "layout."),
    )


# --------------------------------------------------------------------------- observed


def vm_observed_to_json(v: VmObserved) -> dict[str, Any]:
    return {
        "name": v.name, "power": v.power.value, "core": v.core, "weight": v.weight, "cap": v.cap,
        "cpu_time_s": v.cpu_time_s, "utilization": v.utilization, "process_job": v.process_job,
        "process_index": v.process_index, "process_exit": v.process_exit, "migration_phase": v.migration_phase,
        "orphan": v.orphan, **({"process_starting": True} if v.process_starting else {}),
        **({"stopping": True} if v.stopping else {}),
        **({"process_started_at": v.process_started_at} if v.process_started_at is not None else {}),
    }


def observed_to_json(o: NodeObserved) -> dict[str, Any]:
    return {
        "node": o.node, "generation_applied": o.generation_applied, "cores": o.cores,
        "vms": [vm_observed_to_json(v) for v in o.vms], "host_utilization": o.host_utilization,
        "errors": list(o.errors), "time": o.time,
        "refusals": [{"vm": r.vm, "migration_id": r.migration_id, "target_node": r.target_node, "reason": r.reason}
                     for r in o.refusals],
        **({"layout": layout_to_json(o.layout), "layout_memory_mib": o.layout_memory_mib}
           if o.layout is not None else {}),
    }


def vm_observed_from_json(raw: Any, where: str) -> VmObserved:
    d = _mapping(raw, where.rstrip("."))
    util = _get(d, "utilization", float, where, default=0.0)
    if not 0.0 <= util <= 1.5:
        raise ValidationError(field=f"{where}utilization", problem=f"must be in [0, 1.5], got {util}")
    return VmObserved(
        name=_get(d, "name", str, where), power=_enum(d, "power", PowerState, where),
        core=_get(d, "core", int, where, default=None, nullable=True),
        weight=_get(d, "weight", int, where, default=None, nullable=True),
        cap=_get(d, "cap", float, where, default=None, nullable=True),
        cpu_time_s=_get(d, "cpu_time_s", float, where, default=0.0), utilization=util,
        process_job=_get(d, "process_job", str, where, default=None, nullable=True),
        process_index=_get(d, "process_index", int, where, default=None, nullable=True),
        process_exit=_get(d, "process_exit", int, where, default=None, nullable=True),
        migration_phase=_get(d, "migration_phase", str, where, default=None, nullable=True),
        orphan=_get(d, "orphan", bool, where, default=False),
        process_starting=_get(d, "process_starting", bool, where, default=False),
        stopping=_get(d, "stopping", bool, where, default=False),
        process_started_at=_get(d, "process_started_at", float, where, default=None, nullable=True),
    )


def refusal_from_json(raw: Any, where: str) -> MigrationRefusal:
    d = _mapping(raw, where.rstrip("."))
    return MigrationRefusal(vm=_get(d, "vm", str, where), migration_id=_get(d, "migration_id", str, where),
                            target_node=_get(d, "target_node", str, where), reason=_get(d, "reason", str, where))


def observed_from_json(raw: Any) -> NodeObserved:
    d = _mapping(raw, "")
    refusals = _get(d, "refusals", list, "", default=[])  # absent from older agents' reports: none
    vms = _get(d, "vms", list, "", default=[])
    errs = _get(d, "errors", list, "", default=[])
    for i, e in enumerate(errs):
        if not isinstance(e, str):
            raise ValidationError(field=f"errors[{i}]", problem="must be a string")
    cores = _get(d, "cores", int, "")
    if cores < 0:
        raise ValidationError(field="cores", problem="must be >= 0")
    applied = _get(d, "generation_applied", int, "")
    if not 0 <= applied < MAX_GENERATION:  # vmctld counts generations up from 0, one per change
        raise ValidationError(field="generation_applied", problem=f"must be >= 0 and < {MAX_GENERATION}")
    return NodeObserved(
        node=_get(d, "node", str, ""), generation_applied=applied, cores=cores,
        vms=tuple(vm_observed_from_json(v, f"vms[{i}].") for i, v in enumerate(vms)),
        host_utilization=_get(d, "host_utilization", float, "", default=0.0),
        errors=tuple(errs), time=_get(d, "time", float, "", default=0.0),
        refusals=tuple(refusal_from_json(r, f"refusals[{i}].") for i, r in enumerate(refusals)),
        layout=None if d.get("layout") is None else layout_from_json(d["layout"], "layout."),
        layout_memory_mib=_layout_memory(d),
    )


def _layout_memory(d: dict[str, Any]) -> int:
    mem: int = _get(d, "layout_memory_mib", int, "", default=0)
    if not 0 <= mem <= 1 << 40:
        raise ValidationError(field="layout_memory_mib", problem=f"must be 0..{1 << 40} MiB, got {mem}")
    return mem
