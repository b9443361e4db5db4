"""Where the agent gets its desired state and where it reports what it observed.

The seams are two small protocols, so the daemon helper can feed the agent over HTTP without the
agent knowing about HTTP:

- ``DesiredStateSource.fetch() -> NodeDesired | None`` (None: nothing desired yet; the agent then keeps
  the bare two-tier layout and removes nothing). It may raise a ``VmctlError``: a retryable one
  (daemon down) makes the agent back off and retry; a user error (bad document) is reported and the
  agent keeps the last good state.
- ``Reporter.report(NodeObserved)``.

``FileSource`` reads a YAML or JSON document (the ``--desired FILE`` seam, and tests);
``FileReporter`` writes the observation as JSON (atomically). ``MemorySource``/``MemoryReporter``
serve in-process use (tests, the demo). The dict forms (``desired_from_dict``, ``desired_to_dict``,
``observed_to_dict``, ``observed_from_dict``) are the wire format the daemon uses too.

Document format (YAML or JSON)::

    node: n1
    generation: 7
    vms:
      - {name: n1-c0-fg, core: 0, role: fg, weight: 10000}
      - name: n1-c0-bg
        core: 0
        role: bg
        weight: 1
        cap: 0.5                       # fraction of one core; null = uncapped
        power: running                 # running | paused | shutoff | saved | absent
        process: {job_id: j1, index: 0, command: "./a.out", work_seconds: 60, cpu_usage: 0.8}
        checkpoint_path: /var/lib/vmctl/ckpt/n1-c0-bg.img
        migration: {migration_id: m1, source_node: n1, target_node: n2, target_core: 0,
                    phase: requested, mode: live}
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from vmctl.config import Section, parse_yaml
from vmctl.errors import ConfigError, ValidationError
from vmctl.model import MAX_LAYOUT_LEVELS, Discipline, NodeLayout
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

_PHASES = ("requested", "running", "completed", "failed", "aborted")
_MODES = ("live", "checkpoint")
_DESIRED_POWER = ("running", "paused", "shutoff", "saved", "absent")


class DesiredStateSource(Protocol):
    def fetch(self) -> NodeDesired | None: ...


class Reporter(Protocol):
    def report(self, observed: NodeObserved) -> None: ...


# ------------------------------------------------------------------------------------ dict forms


def desired_from_dict(data: Mapping[str, Any], path: str = "<desired>") -> NodeDesired:
    """Build a NodeDesired; every problem is a ``ConfigError`` naming ``path`` and the key."""
    top = Section(data, path)
    node = top.get("node", str, required=True)
    generation = top.integer("generation", lo=0, required=True)
    raw = top.get("vms", list, [])
    layout = None
    if top.has("layout") and data["layout"] is not None:  # the layout to take (docs/agent.md, "Re-laying out")
        ls = top.section("layout")
        try:
            layout = NodeLayout(Discipline(ls.choice("discipline", tuple(d.value for d in Discipline))),
                                ls.integer("levels", required=True, lo=1, hi=MAX_LAYOUT_LEVELS))
        except ValidationError as exc:
            raise ls.error("levels", exc.fields["problem"]) from exc
        ls.finish()
    else:
        top.get("layout", dict, None)
    top.finish()
    vms = []
    for i, item in enumerate(raw):
        vms.append(_vm_from_dict(item, path, f"vms[{i}]"))
    try:
        return NodeDesired(node=node, generation=generation, vms=tuple(vms), layout=layout)
    except ValidationError as exc:  # pragma: no cover - model has no checks on these today
        raise ConfigError(path=path, where="top level", problem=str(exc)) from exc


def _vm_from_dict(item: Any, path: str, where: str) -> VmDesired:
    s = Section(item, path, where)
    name = s.get("name", str, required=True)
    core = s.integer("core", required=True, lo=-1)
    role = VmRole(s.choice("role", tuple(r.value for r in VmRole)))
    weight = s.integer("weight", required=True)
    cap = s.get("cap", float, None)
    power = PowerState(s.choice("power", _DESIRED_POWER, "running"))
    memory = s.integer("memory_mib", 64, lo=1)
    level = s.integer("level", -1, lo=0) if s.has("level") else -1  # absent: follows role (fg 0, bg 1)
    ckpt = s.get("checkpoint_path", str, None)
    process = None
    if s.has("process") and item["process"] is not None:
        ps = s.section("process")
        process = ProcessSpec(job_id=ps.get("job_id", str, required=True), index=ps.integer("index", 0, lo=0),
                              command=ps.get("command", str, ""),
                              work_seconds=ps.number("work_seconds", 0.0, lo=0.0),
                              cpu_usage=ps.number("cpu_usage", 1.0, lo=0.0, hi=1.0))
        if process.cpu_usage <= 0:
            raise ps.error("cpu_usage", "must be > 0")
        ps.finish()
    else:
        s.get("process", dict, None)
    migration = None
    if s.has("migration") and item["migration"] is not None:
        ms = s.section("migration")
        migration = MigrationSpec(
            migration_id=ms.get("migration_id", str, required=True),
            source_node=ms.get("source_node", str, required=True),
            target_node=ms.get("target_node", str, required=True),
            target_core=ms.integer("target_core", required=True, lo=-1),  # -1: unpinned (shared VMs)
            phase=ms.choice("phase", _PHASES, "requested"),  # type: ignore[arg-type]
            mode=ms.choice("mode", _MODES, "live"),  # type: ignore[arg-type]
        )
        ms.finish()
    else:
        s.get("migration", dict, None)
    s.finish()
    return VmDesired(name=name, core=core, role=role, weight=weight, cap=cap, power=power, process=process,
                     checkpoint_path=ckpt, migration=migration, memory_mib=memory, level=level)


def desired_to_dict(d: NodeDesired) -> dict[str, Any]:
    vms: list[dict[str, Any]] = []
    for v in d.vms:
        out: dict[str, Any] = {"name": v.name, "core": v.core, "role": v.role.value, "weight": v.weight,
                               "cap": v.cap, "power": v.power.value, "memory_mib": v.memory_mib}
        if v.level >= 0:
            out["level"] = v.level
        if v.checkpoint_path is not None:
            out["checkpoint_path"] = v.checkpoint_path
        if v.process is not None:
            p = v.process
            out["process"] = {"job_id": p.job_id, "index": p.index, "command": p.command,
                              "work_seconds": p.work_seconds, "cpu_usage": p.cpu_usage}
        if v.migration is not None:
            m = v.migration
            out["migration"] = {"migration_id": m.migration_id, "source_node": m.source_node,
                                "target_node": m.target_node, "target_core": m.target_core, "phase": m.phase,
                                "mode": m.mode}
        vms.append(out)
    doc: dict[str, Any] = {"node": d.node, "generation": d.generation, "vms": vms}
    if d.layout is not None:
        doc["layout"] = {"discipline": d.layout.discipline.value, "levels": d.layout.levels}
    return doc


_OBS_VM_FIELDS = ("name", "power", "core", "weight", "cap", "cpu_time_s", "utilization", "process_job",
                  "process_index", "process_exit", "migration_phase", "orphan")


def observed_to_dict(o: NodeObserved) -> dict[str, Any]:
    vms = []
    for v in o.vms:
        d = {k: getattr(v, k) for k in _OBS_VM_FIELDS}
        d["power"] = v.power.value
        vms.append(d)
    return {"node": o.node, "generation_applied": o.generation_applied, "cores": o.cores, "vms": vms,
            "host_utilization": o.host_utilization, "errors": list(o.errors), "time": o.time,
            "refusals": [{"vm": r.vm, "migration_id": r.migration_id, "target_node": r.target_node,
                          "reason": r.reason} for r in o.refusals]}


def observed_from_dict(data: Mapping[str, Any], path: str = "<observed>") -> NodeObserved:
    top = Section(data, path)
    node = top.get("node", str, required=True)
    gen = top.integer("generation_applied", required=True)
    cores = top.integer("cores", required=True, lo=0)
    raw = top.get("vms", list, [])
    host_util = top.number("host_utilization", 0.0)
    errs = top.get("errors", list, [])
    t = top.number("time", 0.0)
    raw_refusals = top.get("refusals", list, [])
    top.finish()
    refusals = []
    for i, item in enumerate(raw_refusals):
        s = Section(item, path, f"refusals[{i}]")
        refusals.append(MigrationRefusal(vm=s.get("vm", str, required=True),
                                         migration_id=s.get("migration_id", str, required=True),
                                         target_node=s.get("target_node", str, required=True),
                                         reason=s.get("reason", str, required=True)))
        s.finish()
    vms = []
    for i, item in enumerate(raw):
        s = Section(item, path, f"vms[{i}]")
        vms.append(VmObserved(
            name=s.get("name", str, required=True),
            power=PowerState(s.choice("power", tuple(p.value for p in PowerState))),
            core=s.get("core", int, None), weight=s.get("weight", int, None), cap=s.get("cap", float, None),
            cpu_time_s=s.number("cpu_time_s", 0.0), utilization=s.number("utilization", 0.0),
            process_job=s.get("process_job", str, None), process_index=s.get("process_index", int, None),
            process_exit=s.get("process_exit", int, None), migration_phase=s.get("migration_phase", str, None),
            orphan=s.get("orphan", bool, False)))
        s.finish()
    return NodeObserved(node=node, generation_applied=gen, cores=cores, vms=tuple(vms), host_utilization=host_util,
                        errors=tuple(str(e) for e in errs), time=t, refusals=tuple(refusals))


# ------------------------------------------------------------------------------------ files


class FileSource:
    """Reads the desired state from a YAML or JSON file; re-parses only when the file changed.
    A missing file means "nothing desired yet" (None)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._cached: NodeDesired | None = None

    def fetch(self) -> NodeDesired | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._cached = None, None
            return None
        except OSError as exc:
            raise ConfigError(path=str(self.path), where="file", problem=f"cannot be read: {exc}") from exc
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return self._cached
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(path=str(self.path), where="file", problem=f"cannot be read: {exc}") from exc
        data = parse_yaml(text, str(self.path))  # JSON is YAML
        desired = desired_from_dict(data, str(self.path))
        self._stamp, self._cached = stamp, desired
        return desired


class FileReporter:
    """Writes each observation as JSON to ``path`` (write to a temporary file, then rename)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def report(self, observed: NodeObserved) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(observed_to_dict(observed), indent=1) + "\n", encoding="utf-8")
            os.replace(tmp, self.path)
        except OSError as exc:
            raise ConfigError(path=str(self.path), where="report file", problem=f"cannot be written: {exc}") from exc


class MemorySource:
    """A desired state held in memory (tests, the demo, an in-process daemon)."""

    def __init__(self, desired: NodeDesired | None = None) -> None:
        self._desired = desired
        self._lock = threading.Lock()

    def set(self, desired: NodeDesired | None) -> None:
        with self._lock:
            self._desired = desired

    def fetch(self) -> NodeDesired | None:
        with self._lock:
            return self._desired


class MemoryReporter:
    """Keeps the last ``keep`` observations (tests, the demo, an in-process daemon)."""

    def __init__(self, keep: int = 1000) -> None:
        self.reports: list[NodeObserved] = []
        self.keep = keep

    def report(self, observed: NodeObserved) -> None:
        self.reports.append(observed)
        if len(self.reports) > self.keep:
            del self.reports[: len(self.reports) - self.keep]

    @property
    def last(self) -> NodeObserved | None:
        return self.reports[-1] if self.reports else None
