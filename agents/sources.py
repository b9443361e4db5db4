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
serve in-process use (tests, the demo). The documents are the ones vmctld serves, in one codec:
``vmctl.wire`` (``desired_from_json``/``desired_to_json``, ``observed_to_json``/``observed_from_json``).

Document format (YAML or JSON; a key the codec does not know is an error)::

    node: n1
    generation: 7
    layout: {discipline: priority, levels: 2}     # optional: the layout to take
    slices: {epoch: 0.0, period_s: 30.0, rows: [0, 1]}   # optional: a gang node's time-slice schedule
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
      - {name: j4-r1-p0, core: 1, role: bg, weight: 1, level: 2, replicas: [0]}   # a gang row's VM
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from vmctl.config import parse_yaml
from vmctl.errors import ConfigError, ValidationError
from vmctl.nodedoc import NodeDesired, NodeObserved
from vmctl.wire import desired_from_json, observed_to_json


class DesiredStateSource(Protocol):
    def fetch(self) -> NodeDesired | None: ...


class Reporter(Protocol):
    def report(self, observed: NodeObserved) -> None: ...


# ------------------------------------------------------------------------------------ documents


def desired_from_document(data: Any, path: str) -> NodeDesired:
    """A desired-state document read from ``path`` (YAML or JSON), decoded by ``vmctl.wire`` (the codec
    vmctld serves it with); every problem is a ``ConfigError`` naming ``path`` and the dotted key."""
    try:
        return desired_from_json(data)
    except ValidationError as exc:
        where = exc.fields.get("field", "top level")
        raise ConfigError(path=path, where="top level" if where == "body" else where,
                          problem=exc.fields.get("problem", str(exc))) from exc


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
        desired = desired_from_document(data, str(self.path))
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
            tmp.write_text(json.dumps(observed_to_json(observed), indent=1) + "\n", encoding="utf-8")
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
