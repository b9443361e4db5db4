"""The mock host's shared parts: its records (a VM, its job process, a migration), ``MockFabric`` (the
backends of one process that can migrate VMs to each other) and ``MockHost``, the base the three parts
of ``MockBackend`` build on (``backend.py``, ``fabric.py``, ``store.py``): the state they share, and
the hooks one part calls in another, declared here for the type checker."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from vmctl.agents.backends.base import HypervisorBackend, MigrationState, VmSpec
from vmctl.clock import Clock
from vmctl.errors import Conflict
from vmctl.nodedoc import PowerState, ProcessSpec

KILLED_EXIT = 137
EPS = 1e-9


@dataclass
class MockProcess:
    spec: ProcessSpec
    done: float = 0.0
    exit_code: int | None = None
    started: float = 0.0  # model time of the start (carried through migrations and restarts)


@dataclass
class MockMigration:
    name: str
    target: MockHost | None  # None: a host in another process, reached through the fabric directory
    started: float
    duration: float
    state: MigrationState = MigrationState.RUNNING
    error: str = ""
    finished: float | None = None
    target_uri: str = ""
    offer: Path | None = None  # remote: the state file handed to the target (written at the hand-off)
    #: entries the VM's metadata carries on the target (``start_migration(metadata=...)``: its new node)
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class MockVm:
    spec: VmSpec
    power: PowerState = PowerState.SHUTOFF
    pinned: tuple[int, ...] | None = None
    weight: int = 100
    cap: float | None = None
    cpu_time: float = 0.0
    alloc: float = 0.0
    process: MockProcess | None = None
    saved_to: str | None = None
    frozen: bool = False  # handed off to a remote target: no longer runs here

    def demand(self) -> float:
        if self.power not in (PowerState.RUNNING, PowerState.MIGRATING) or self.frozen:
            return 0.0
        p = self.process
        if p is None or p.exit_code is not None:
            return 0.0
        limit = min(1.0, p.spec.cpu_usage)
        if self.cap is not None:
            limit = min(limit, self.cap)
        return limit


class MockFabric:
    """Connects MockBackends so that VMs can migrate between them (``uri`` -> backend).

    The backends of one fabric share one lock (``lock``): every call settles the model on every
    backend of the fabric (``_settle``), so a call on one backend takes the others' state too. With a
    lock per backend, two threads calling two backends at once each held its own lock and waited for
    the other's (an ABBA deadlock: agents' reconcilers in one process hung forever in ``list_vms``)."""

    def __init__(self) -> None:
        self._backends: dict[str, MockHost] = {}
        self._lock = self.lock = threading.RLock()

    def attach(self, backend: MockHost) -> None:
        with self._lock:
            if backend.uri in self._backends and self._backends[backend.uri] is not backend:
                raise Conflict(what=f"mock fabric uri {backend.uri}", problem="already attached")
            self._backends[backend.uri] = backend

    def lookup(self, uri: str) -> MockHost | None:
        with self._lock:
            return self._backends.get(uri)

    def backends(self) -> list[MockHost]:
        with self._lock:
            return list(self._backends.values())


class MockHost(HypervisorBackend):
    """The state every part of a mock host reads and writes (set up by ``MockBackend.__init__``), under
    ``_lock`` (the fabric's one lock when the host is on a ``MockFabric``)."""

    hostname: str
    uri: str
    cores: int
    speed: float
    clock: Clock
    fabric: MockFabric | None
    fabric_dir: Path | None
    inbox: Path | None
    state_file: Path | None
    _vms: dict[str, MockVm]
    _migrations: dict[str, MockMigration]
    _lock: threading.RLock
    _t: float
    _dirty: bool
    _unsaved: str | None

    if TYPE_CHECKING:  # the hooks one part calls in another (defined by backend.py, fabric.py, store.py)
        def _log(self, operation: str, vm: str, detail: str = "", ok: bool = True) -> None: ...

        def _emit(self, vm: str, kind: str, detail: str = "") -> None: ...

        def _advance(self, now: float) -> None: ...

        def _invalidate(self) -> None: ...

        def _save(self) -> bool: ...

        def _adopt_claimed(self) -> None: ...

        def _finish_migrations(self, now: float) -> None: ...
