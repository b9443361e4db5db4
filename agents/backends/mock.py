"""An in-memory hypervisor: deterministic, with fault injection and a journal of what it did.

It is a real backend (the contract suite runs against it) and it models CPU sharing well enough for
the demo and the daemon's tests:

- Every running VM may run one mock job process (``ProcessSpec.work_seconds``, ``cpu_usage``). A
  process *demands* ``cpu_usage`` of a core; a VM without a process demands nothing (an idle guest).
- On each physical core, the VMs pinned there are served in order of decreasing weight (strict
  priority, as the fg/bg tiers of MEASY sec. 2.1 intend): the highest-weight VM gets its demand,
  limited by its cap, the next one gets what is left, and so on. VMs of equal weight share what is
  left max-min fairly (equal shares, water-filling). Unpinned VMs then share the capacity that the
  pinned ones left on all cores, by the same rule (:func:`vmctl.cpushare.share_core`, which the
  simulator's task-bag model shares, so a mock testbed and the simulator split a core alike).
- A process progresses at ``allocation / cpu_usage x speed`` standard-core seconds per second and
  exits with status 0 once it has done ``work_seconds`` (work on a standard core, speed 1.0, as every
  shape's work is counted: a rigid job's ``work_seconds``, a moldable job's time at its width, a task
  bag's task). ``speed`` is the host's (agent config ``host.speed``, the speed it registers with
  vmctld): on a core of its own a process ends after ``work_seconds / speed``; a core's allocation and
  the VMs' CPU time stay in physical-core seconds, so only the work done per second changes. One rule
  for every shape, as in the simulator (``vmctl.sim.exec_moldable`` / ``exec_taskbag``: a process runs
  at its share of the core times the core's speed). A process that migrates goes on at its new host's
  speed. Killing it gives status 137.

Time comes from a ``Clock``; the model integrates lazily, piece by piece between process exits, on
every call. Per-VM ``cpu_time_s`` is what ``list_vms`` reports; ``utilization(name)`` is the current
allocation. Two ``MockBackend`` objects that share a ``MockFabric`` can migrate VMs between them
(live: the VM keeps running on the source for ``migration_seconds`` and then moves with its process;
or by checkpoint file and restore). Checkpoints are small JSON files holding the VM's state.

Between processes (one agent per mock host, as in ``vmctl demo``) the fabric is a shared directory,
``fabric_dir``: every backend owns an inbox ``<fabric_dir>/<uri as a file name>/``. A live migration
to a host that is not in this process runs on the source for ``migration_seconds`` and then hands
off: the source writes the VM's state (spec, pinning, weight, cap, CPU time, job process progress)
atomically to ``<target inbox>/<vm>.json`` and freezes the VM (still MIGRATING). The target picks it
up on its next call (or poll, ``poll_seconds``): it claims the file by renaming it and adopts the VM,
running; or, if it already has a live VM of that name or cannot read the file, it answers with
``<vm>.rejected`` (the reason) and deletes the offer. The source then sees the offer gone: COMPLETED
(VM removed here) or, with a ``.rejected`` answer, FAILED (the VM runs on here). ``start_migration(...,
metadata=...)`` entries are merged into the metadata of the copy the target adopts (in-process and in
the offer file), so the VM names its new host from its arrival; ``set_metadata`` merges entries into a
VM's metadata (kept in the state file). ``abort_migration``
deletes an unclaimed offer; a claimed one completes. With ``poll_seconds`` a thread settles the
model that often and emits events for arrivals, hand-offs and process exits, so agents wake at once.

Guests outlive the agent process, as real ones do, when the backend has a ``state_file`` (agent
config ``backend.state_file``; by default ``<fabric_dir>/<inbox>.state`` when there is a fabric
directory): the host's state -- VMs (power, pinning, weight, cap, CPU time, checkpoint file), job
processes (spec, model start time, work done, exit status) and migrations -- is written there
atomically (temporary file, fsync, rename; mode 0600) after every change, stamped with the model
time. A new ``MockBackend`` with the same file takes the host over: the model integrates from the
stamped time to now, so a process kept running while no agent was there and the agent re-adopts it
(``start_process`` of the same job and index is a no-op). The file is created at once when missing (a
new, empty host); an unreadable, empty or corrupt file is ``MockStateError`` (nothing is started, so
nothing runs twice; delete the file to replace the host by an empty one -- its guests are then gone).
If the clock is behind the stamped time (an accelerated clock without ``epoch``), the host resumes
from now and the dead interval counts as zero. Without a state file the host lives in this process
only: a new agent process finds an empty host (like a host that rebooted).

Faults: ``Fault(operation, vm_glob, times, error)`` makes the next ``times`` matching calls raise
(``times=None``: every call). ``operation`` is a method name (``"list_vms"``, ``"start"``, ...) or
``"*"``. The journal records every state-changing call (not reads) with its time and result.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmctl.agents.backends.base import (
    WEIGHT_MAX,
    WEIGHT_MIN,
    BackendEvent,
    Capability,
    EventCallback,
    HostInfo,
    HypervisorBackend,
    MigrationState,
    MigrationStatus,
    ProcessStatus,
    VmInfo,
    VmSpec,
)
from vmctl.clock import Clock, VirtualClock
from vmctl.cpushare import share_core
from vmctl.errors import (
    Conflict,
    HypervisorError,
    HypervisorUnavailable,
    MigrationError,
    OperationNotSupported,
    OutOfRange,
    VmctlError,
    VmNotFound,
    VmStateError,
)
from vmctl.nodedoc import PowerState, ProcessSpec

KILLED_EXIT = 137
CHECKPOINT_FORMAT = "vmctl-mock-checkpoint/1"
HOST_STATE_FORMAT = "vmctl-mock-host/1"
_EPS = 1e-9

log = logging.getLogger("vmctl.agent.mock")


class MockStateError(HypervisorUnavailable):
    """The mock host's state file cannot be read or written: the host cannot be taken over."""

    reference = "mock-state-unreadable"
    template = "{backend}: host {uri}: {problem}"
    hint = ("the mock host keeps its guests in backend.state_file; fix or restore the file, or delete it to "
            "start this host empty (its guests are then gone)")


@dataclass
class Fault:
    """Make matching calls fail. ``times=None`` fails forever; ``error=None`` raises a retryable
    ``HypervisorError``."""

    operation: str
    vm_glob: str = "*"
    times: int | None = 1
    error: VmctlError | None = None

    def matches(self, operation: str, vm: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        return (self.operation in ("*", operation)) and fnmatch.fnmatchcase(vm, self.vm_glob)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    time: float
    operation: str
    vm: str
    detail: str = ""
    ok: bool = True


@dataclass
class _Process:
    spec: ProcessSpec
    done: float = 0.0
    exit_code: int | None = None
    started: float = 0.0  # model time of the start (carried through migrations and restarts)


@dataclass
class _Migration:
    name: str
    target: MockBackend | None  # None: a host in another process, reached through the fabric directory
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
class _Vm:
    spec: VmSpec
    power: PowerState = PowerState.SHUTOFF
    pinned: tuple[int, ...] | None = None
    weight: int = 100
    cap: float | None = None
    cpu_time: float = 0.0
    alloc: float = 0.0
    process: _Process | None = None
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
        self._backends: dict[str, MockBackend] = {}
        self._lock = self.lock = threading.RLock()

    def attach(self, backend: MockBackend) -> None:
        with self._lock:
            if backend.uri in self._backends and self._backends[backend.uri] is not backend:
                raise Conflict(what=f"mock fabric uri {backend.uri}", problem="already attached")
            self._backends[backend.uri] = backend

    def lookup(self, uri: str) -> MockBackend | None:
        with self._lock:
            return self._backends.get(uri)

    def backends(self) -> list[MockBackend]:
        with self._lock:
            return list(self._backends.values())


class MockBackend(HypervisorBackend):
    name = "mock"

    def __init__(
        self,
        hostname: str = "mock",
        cores: int = 2,
        memory_mib: int = 16384,
        clock: Clock | None = None,
        faults: Iterable[Fault] = (),
        fabric: MockFabric | None = None,
        uri: str | None = None,
        migration_seconds: float = 1.0,
        capabilities: Iterable[Capability] | None = None,
        fabric_dir: str | os.PathLike[str] | None = None,
        poll_seconds: float | None = None,
        state_file: str | os.PathLike[str] | None = None,
        speed: float = 1.0,
    ) -> None:
        if cores <= 0:
            raise OutOfRange(what="cores", value=cores, allowed="> 0")
        if not (math.isfinite(speed) and speed > 0):
            raise OutOfRange(what="speed", value=speed, allowed="> 0 (relative to a standard core)")
        #: standard-core seconds of work one core does per second (the agent's ``host.speed``)
        self.speed = float(speed)
        self.hostname = hostname
        self.cores = cores
        self.memory_mib = memory_mib
        self.clock: Clock = clock if clock is not None else VirtualClock()
        self.faults: list[Fault] = list(faults)
        self.uri = uri or f"mock://{hostname}"
        self.migration_seconds = migration_seconds
        self.fabric = fabric
        self.journal: list[JournalEntry] = []
        self._caps = frozenset(Capability) if capabilities is None else frozenset(capabilities)
        self._vms: dict[str, _Vm] = {}
        self._migrations: dict[str, _Migration] = {}
        self._callbacks: list[EventCallback] = []
        # one lock for the whole fabric (see MockFabric): a call here also advances the other backends
        self._lock = fabric.lock if fabric is not None else threading.RLock()
        self._t = self.clock.now()
        self._dirty = True
        self._closed = False
        self._exits = 0  # process exits so far (the poll thread turns new ones into events)
        if fabric is not None:
            fabric.attach(self)
        self.fabric_dir = Path(fabric_dir) if fabric_dir is not None else None
        self.inbox: Path | None = None
        if self.fabric_dir is not None:
            self.inbox = self.fabric_dir / inbox_name(self.uri)
            try:
                self.inbox.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise HypervisorError(backend=self.name, operation="connect",
                                      problem=f"cannot create the fabric inbox {self.inbox}: {exc}") from exc
        self.state_file = Path(state_file) if state_file is not None else None
        self._unsaved: str | None = None  # why the last write of the state file failed (None: saved)
        if self.state_file is not None:
            self._take_over(self.state_file)
        self._poll_stop = threading.Event()
        self._poller: threading.Thread | None = None
        if poll_seconds is not None and poll_seconds > 0:
            self._poller = threading.Thread(target=self._poll, args=(poll_seconds,), name=f"mock-{hostname}-poll",
                                            daemon=True)
            self._poller.start()

    # ------------------------------------------------------------------ helpers

    def _check(self, operation: str, vm: str = "", capability: Capability | None = None) -> None:
        if self._closed:
            raise HypervisorError(backend=self.name, operation=operation, problem="connection closed")
        if self._unsaved is not None and not self._save():
            raise HypervisorError(backend=self.name, operation=operation,
                                  problem=f"cannot write the host state: {self._unsaved}")
        if capability is not None and capability not in self._caps:
            raise OperationNotSupported(backend=self.name, operation=operation)
        for f in self.faults:
            if f.matches(operation, vm):
                if f.times is not None:
                    f.times -= 1
                err = f.error or HypervisorError(backend=self.name, operation=operation,
                                                 problem=f"injected fault on {vm or self.hostname}")
                self._log(operation, vm, f"fault: {err}", ok=False)
                raise err
        self._settle()

    def _log(self, operation: str, vm: str, detail: str = "", ok: bool = True) -> None:
        """Journal a change (every change of the host's state is journalled) and persist the state."""
        self.journal.append(JournalEntry(self._t, operation, vm, detail, ok))
        if self.state_file is not None:
            self._save()

    # ------------------------------------------------------------------ the state file

    def _host_state(self) -> dict[str, Any]:
        """Everything that outlives the agent process (the model at ``self._t``)."""
        migrations = []
        for m in self._migrations.values():
            migrations.append({"name": m.name, "target_uri": m.target_uri, "started": m.started,
                               "duration": m.duration, "state": m.state.value, "error": m.error,
                               "finished": m.finished, "offer": None if m.offer is None else str(m.offer),
                               "metadata": dict(m.metadata)})
        return {"format": HOST_STATE_FORMAT, "hostname": self.hostname, "uri": self.uri, "cores": self.cores,
                "time": self._t,
                "vms": [{**_vm_state(vm, self.hostname, self._t), "power": vm.power.value,
                         "saved_to": vm.saved_to, "frozen": vm.frozen} for vm in self._vms.values()],
                "migrations": migrations}

    def _save(self) -> bool:
        """Write the state file atomically; on failure remember why (the next call retries and fails
        while it cannot be written) and log it once. Never raises: the poll thread calls it too."""
        assert self.state_file is not None
        with self._lock:
            try:
                _write_text(self.state_file, json.dumps(self._host_state(), indent=1), private=True)
            except (OSError, ValueError) as exc:
                if self._unsaved is None:
                    log.error("mock host %s: cannot write its state file %s: %s", self.uri, self.state_file, exc)
                self._unsaved = f"{self.state_file}: {exc}"
                return False
            if self._unsaved is not None:
                log.info("mock host %s: state file %s written again", self.uri, self.state_file)
            self._unsaved = None
            return True

    def _state_error(self, path: Path, problem: str) -> MockStateError:
        return MockStateError(backend=self.name, uri=self.uri, problem=f"state file {path}: {problem}")

    def _take_over(self, path: Path) -> None:
        """Adopt the host recorded in ``path`` (or create the file for a new, empty host)."""
        text: str | None
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = None
        except (OSError, UnicodeDecodeError) as exc:
            raise self._state_error(path, f"cannot be read: {exc}") from exc
        if text is None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self._state_error(path, f"cannot create its directory: {exc}") from exc
            if not self._save():
                raise self._state_error(path, f"cannot be written: {self._unsaved}")
            log.info("mock host %s: new, empty host (state file %s)", self.uri, path)
            return
        if not text.strip():
            raise self._state_error(path, "is empty (no host state in it)")
        try:
            state = json.loads(text)
        except ValueError as exc:
            raise self._state_error(path, f"is not valid JSON (corrupt?): {exc}") from exc
        try:
            t, vms, migrations = self._parse_host_state(state, str(path))
        except (KeyError, TypeError, ValueError, AttributeError, HypervisorError) as exc:
            raise self._state_error(path, f"is not a mock host state: {exc}") from exc
        now = self.clock.now()
        shift = 0.0
        if now < t:
            shift = now - t  # the clock is behind the file (no clock.epoch): resume from now
            log.warning("mock host %s: the clock (%.3f) is behind the state file's time (%.3f): the host resumes "
                        "from now (give the clock an epoch so that model time survives a restart)", self.uri, now, t)
        for m in migrations.values():
            m.started += shift
            if m.finished is not None:
                m.finished += shift
        for vm in vms.values():
            if vm.process is not None:
                vm.process.started += shift
        self._vms, self._migrations, self._t = vms, migrations, t + shift
        self._dirty = True
        self._advance(max(self._t, now))  # the guests ran on while no agent was there
        self._adopt_claimed()  # frozen since their hand-off, as if claimed now
        running = sum(1 for v in vms.values() if v.process is not None and v.process.exit_code is None)
        log.info("mock host %s: took over %d VM(s), %d job process(es) running, from %s (model time %.3f, "
                 "%.3f s ago)", self.uri, len(vms), running, path, self._t, max(0.0, now - self._t))
        self._save()

    def _parse_host_state(self, state: Any, where: str) -> tuple[float, dict[str, _Vm], dict[str, _Migration]]:
        if not isinstance(state, dict):
            raise ValueError(f"expected an object, got {type(state).__name__}")
        if state.get("format") != HOST_STATE_FORMAT:
            raise ValueError(f"format {state.get('format')!r} is not {HOST_STATE_FORMAT}")
        if state["uri"] != self.uri:
            raise ValueError(f"it belongs to the mock host {state['uri']!r}, not {self.uri!r}")
        t = float(state["time"])
        if not math.isfinite(t):
            raise ValueError(f"time {t} is not a finite number")
        vms: dict[str, _Vm] = {}
        for i, raw in enumerate(state["vms"]):
            vm = _vm_from_state(raw, f"{where}: vms[{i}]")
            if vm.spec.name in vms:
                raise ValueError(f"VM {vm.spec.name!r} is listed twice")
            vm.power = PowerState(raw["power"])
            saved_to, frozen = raw["saved_to"], raw["frozen"]
            if not (saved_to is None or isinstance(saved_to, str)) or not isinstance(frozen, bool):
                raise ValueError(f"vms[{i}]: saved_to must be a path or null and frozen a boolean")
            vm.saved_to, vm.frozen = saved_to, frozen
            if vm.pinned is not None and max(vm.pinned, default=0) >= self.cores:
                vm.pinned = None  # the host has fewer cores now
            vms[vm.spec.name] = vm
        migrations: dict[str, _Migration] = {}
        for i, raw in enumerate(state["migrations"]):
            target_uri = str(raw["target_uri"])
            target = self.fabric.lookup(target_uri) if self.fabric is not None else None
            finished, offer = raw["finished"], raw["offer"]
            mig = _Migration(name=str(raw["name"]), target=target, started=float(raw["started"]),
                             duration=float(raw["duration"]), state=MigrationState(raw["state"]),
                             error=str(raw["error"]), finished=None if finished is None else float(finished),
                             target_uri=target_uri, offer=None if offer is None else Path(str(offer)),
                             metadata={str(k): str(v) for k, v in (raw.get("metadata") or {}).items()})
            if mig.state is MigrationState.RUNNING and target is None and self.fabric_dir is None:
                # an in-process target that is not here any more: the VM stays (as a failed migration)
                mig.state, mig.error, mig.finished = MigrationState.FAILED, "the target left with the old agent", t
                moving = vms.get(mig.name)
                if moving is not None and moving.power is PowerState.MIGRATING:
                    moving.power, moving.frozen = PowerState.RUNNING, False
            migrations[mig.name] = mig
            if not all(math.isfinite(x) for x in (mig.started, mig.duration)):
                raise ValueError(f"migrations[{i}]: times must be finite")
        return t, vms, migrations

    def _adopt_claimed(self) -> None:
        """An earlier life of this host claimed a migration offer (renamed it) and died before it had
        saved the VM: adopt the VM now (the source already considers it gone; it made no progress
        since the hand-off, as while an offer waits)."""
        if self.inbox is None:
            return
        try:
            leftovers = sorted(self.inbox.glob("*.json.claimed-*"))
        except OSError:
            return
        for claimed in leftovers:
            name = claimed.name.split(".json.claimed-", 1)[0]
            if name not in self._vms:
                try:
                    vm = _vm_from_state(json.loads(claimed.read_text(encoding="utf-8")), str(claimed))
                except (OSError, ValueError, HypervisorError) as exc:
                    log.error("mock host %s: cannot adopt the claimed migration %s: %s", self.uri, claimed, exc)
                    continue
                if vm.pinned is not None and max(vm.pinned) >= self.cores:
                    vm.pinned = None
                vm.power = PowerState.RUNNING
                self._vms[vm.spec.name] = vm
                self._dirty = True
                self._log("migration_arrived", vm.spec.name, f"claimed by an earlier agent ({claimed.name})")
            with contextlib.suppress(OSError):
                claimed.unlink()

    def _emit(self, vm: str, kind: str, detail: str = "") -> None:
        ev = BackendEvent(vm=vm, kind=kind, detail=detail)
        for cb in list(self._callbacks):
            cb(ev)

    def _vm(self, name: str) -> _Vm:
        vm = self._vms.get(name)
        if vm is None:
            raise VmNotFound(backend=self.name, name=name)
        return vm

    def _settle(self) -> None:
        """Integrate the CPU model up to now, then complete due migrations (on every backend of
        the fabric, so both ends see the same world)."""
        now = self.clock.now()
        peers = self.fabric.backends() if self.fabric is not None else [self]
        for b in peers:
            b._advance(now)
        for b in peers:
            b._finish_migrations(now)
        if self.inbox is not None:
            self._receive(now)

    def _finish_migrations(self, now: float) -> None:
        in_process: list[_Migration] = []
        with self._lock:
            for mig in self._migrations.values():
                if mig.state is not MigrationState.RUNNING or now < mig.started + mig.duration:
                    continue
                vm = self._vms.get(mig.name)
                if vm is None:
                    mig.state, mig.error = MigrationState.FAILED, "VM vanished"
                elif mig.target is None:
                    self._remote_step(mig, vm, now)
                else:
                    in_process.append(mig)
        for mig in in_process:
            self._hand_over(mig, now)

    def _hand_over(self, mig: _Migration, now: float) -> None:
        """Move a migrated VM to an in-process target, under the fabric's one lock (both backends
        share it). Events go out after the lock."""
        target = mig.target
        assert target is not None
        with self._lock:
            vm = self._vms.get(mig.name)
            if mig.state is not MigrationState.RUNNING or vm is None:
                return  # settled meanwhile (aborted, or handled by a concurrent pass)
            target._advance(now)
            if mig.name in target._vms:
                mig.state, mig.error = MigrationState.FAILED, "target already has a VM of that name"
                vm.power = PowerState.RUNNING
                return
            del self._vms[mig.name]
            vm.power = PowerState.RUNNING
            vm.alloc = 0.0
            if mig.metadata:  # it names its new host from the moment it is there
                vm.spec = replace(vm.spec, metadata={**vm.spec.metadata, **mig.metadata})
            if vm.pinned is not None and max(vm.pinned) >= target.cores:
                vm.pinned = None
            target._vms[mig.name] = vm
            mig.state, mig.finished = MigrationState.COMPLETED, now
            self._invalidate()
            self._log("migration_completed", mig.name, target.uri)
            target._log("migration_arrived", mig.name, self.uri)
            target._invalidate()
        self._emit(mig.name, "migrated", f"to {target.uri}")
        target._emit(mig.name, "started", f"migrated from {self.uri}")

    # ------------------------------------------------------------------ the fabric directory

    def _remote_step(self, mig: _Migration, vm: _Vm, now: float) -> None:
        """A migration to another process: hand the VM off once its time is up, then wait for the
        target's answer (offer claimed: completed; ``.rejected``: failed)."""
        assert self.fabric_dir is not None
        target_dir = self.fabric_dir / inbox_name(mig.target_uri)
        if mig.offer is None:
            offer = target_dir / f"{mig.name}.json"
            try:
                handed = _vm_state(vm, self.hostname, now)
                if mig.metadata:  # the copy on the target names its new host; this one stays as it was
                    handed["spec"] = {**handed["spec"], "metadata": {**handed["spec"]["metadata"], **mig.metadata}}
                _write_json(offer, {**handed, "migration": {"from": self.uri, "to": mig.target_uri, "time": now}})
            except OSError as exc:
                mig.state, mig.error, mig.finished = MigrationState.FAILED, f"cannot hand off to {offer}: {exc}", now
                vm.power = PowerState.RUNNING
                self._invalidate()
                self._log("migration_failed", mig.name, mig.error, ok=False)
                self._emit(mig.name, "migration_failed", mig.error)
                return
            mig.offer = offer
            vm.frozen = True
            self._invalidate()
            self._log("migration_handoff", mig.name, str(offer))
            return
        if mig.offer.exists():
            return  # not picked up yet
        rejected = mig.offer.with_suffix(".rejected")
        if rejected.exists():
            try:
                why = rejected.read_text(encoding="utf-8").strip() or "rejected"
                rejected.unlink()
            except OSError as exc:
                why = f"rejected (unreadable answer: {exc})"
            mig.state, mig.error, mig.finished = MigrationState.FAILED, f"{mig.target_uri}: {why}", now
            vm.frozen = False
            vm.power = PowerState.RUNNING
            self._invalidate()
            self._log("migration_failed", mig.name, mig.error, ok=False)
            self._emit(mig.name, "migration_failed", mig.error)
            return
        del self._vms[mig.name]
        mig.state, mig.finished = MigrationState.COMPLETED, now
        self._invalidate()
        self._log("migration_completed", mig.name, mig.target_uri)
        self._emit(mig.name, "migrated", f"to {mig.target_uri}")

    def _receive(self, now: float) -> None:
        """Adopt the VMs other processes handed to this host (see the module docstring)."""
        assert self.inbox is not None
        try:
            offers = sorted(self.inbox.glob("*.json"))
        except OSError:
            return
        for offer in offers:
            name = offer.stem
            with self._lock:
                try:
                    state = json.loads(offer.read_text(encoding="utf-8"))
                    vm = _vm_from_state(state, str(offer))
                except FileNotFoundError:
                    continue  # withdrawn (aborted) meanwhile
                except (OSError, ValueError, HypervisorError) as exc:
                    self._reject(offer, f"cannot read the migration state: {exc}")
                    continue
                existing = self._vms.get(name)
                if vm.spec.name != name:
                    self._reject(offer, f"the offer holds VM {vm.spec.name!r}, not {name!r}")
                    continue
                if existing is not None and existing.power in (PowerState.RUNNING, PowerState.PAUSED,
                                                               PowerState.MIGRATING):
                    self._reject(offer, f"{self.hostname} already has a {existing.power.value} VM {name}")
                    continue
                claimed = offer.with_name(f"{offer.name}.claimed-{os.getpid()}")
                try:
                    os.rename(offer, claimed)
                except FileNotFoundError:
                    continue  # the source aborted first
                except OSError as exc:
                    self._log("migration_arrived", name, f"cannot claim {offer}: {exc}", ok=False)
                    continue
                self._advance(now)
                if vm.pinned is not None and max(vm.pinned) >= self.cores:
                    vm.pinned = None
                vm.power = PowerState.RUNNING
                self._vms[name] = vm
                self._invalidate()
                source = str(state.get("migration", {}).get("from", "?"))
                self._log("migration_arrived", name, source)  # saved before the claimed offer goes
                if self._unsaved is None:  # else a restarted agent adopts it from the claimed file
                    with contextlib.suppress(OSError):
                        claimed.unlink()
            self._emit(name, "started", f"migrated from {source}")

    def _reject(self, offer: Path, why: str) -> None:
        try:
            _write_text(offer.with_suffix(".rejected"), why)
            offer.unlink()
        except FileNotFoundError:  # the source withdrew the offer meanwhile: no answer needed
            with contextlib.suppress(OSError):
                offer.with_suffix(".rejected").unlink()
            return
        except OSError:
            return
        self._log("migration_rejected", offer.stem, why, ok=False)

    def _poll(self, seconds: float) -> None:
        seen = (0, 0)
        while not self._poll_stop.wait(seconds):
            with self._lock:
                if self._closed:
                    continue
                self._settle()
                now_seen = (self._exits, len(self._migrations))
            if now_seen[0] > seen[0]:
                self._emit("", "process_exited")
            seen = now_seen

    def _invalidate(self) -> None:
        self._dirty = True
        self._rates()

    def _rates(self) -> None:
        """Recompute every VM's allocation from the current state (only after a change)."""
        if not self._dirty:
            return
        self._dirty = False
        by_core: dict[int, list[_Vm]] = {}
        unpinned: list[_Vm] = []
        for vm in self._vms.values():
            vm.alloc = 0.0
            if vm.demand() <= 0.0:
                continue
            if vm.pinned:
                by_core.setdefault(vm.pinned[0], []).append(vm)
            else:
                unpinned.append(vm)
        spare = 0.0
        for core in range(self.cores):
            vms = by_core.get(core, [])
            alloc = share_core([(v.weight, v.demand()) for v in vms], 1.0)
            for v, a in zip(vms, alloc, strict=True):
                v.alloc = a
            spare += max(0.0, 1.0 - sum(alloc))
        for core, vms in by_core.items():
            if core >= self.cores:  # pinned to a core this host lacks: it cannot run
                for v in vms:
                    v.alloc = 0.0
        if unpinned:
            unpinned.sort(key=lambda v: v.spec.name)
            alloc = share_core([(v.weight, v.demand()) for v in unpinned], spare)
            for v, a in zip(unpinned, alloc, strict=True):
                v.alloc = a

    def _advance(self, now: float) -> None:
        with self._lock:
            while self._t < now - _EPS:
                self._rates()
                # time until the next process exit at current rates
                step = now - self._t
                for vm in self._vms.values():
                    p = vm.process
                    if p is None or p.exit_code is not None or vm.alloc <= 0.0:
                        continue
                    rate = vm.alloc / p.spec.cpu_usage * self.speed
                    step = min(step, max(0.0, (p.spec.work_seconds - p.done) / rate))
                for vm in self._vms.values():
                    vm.cpu_time += vm.alloc * step
                    p = vm.process
                    if p is not None and p.exit_code is None and vm.alloc > 0.0:
                        p.done += vm.alloc / p.spec.cpu_usage * self.speed * step
                self._t += step
                for name, vm in self._vms.items():
                    p = vm.process
                    if p is not None and p.exit_code is None and p.done >= p.spec.work_seconds - 1e-7:
                        p.done = p.spec.work_seconds
                        p.exit_code = 0
                        self._exits += 1
                        self._dirty = True
                        self._log("process_exited", name, f"{p.spec.job_id}[{p.spec.index}] status 0")
                if step <= 0.0:  # a zero-work process just ended; loop again with new rates
                    continue
            self._t = max(self._t, now)
            self._rates()

    # ------------------------------------------------------------------ interface

    def capabilities(self) -> frozenset[Capability]:
        return self._caps

    def host_info(self) -> HostInfo:
        with self._lock:
            self._check("host_info")
            used = sum(vm.alloc for vm in self._vms.values())
            return HostInfo(hostname=self.hostname, cores=self.cores, memory_mib=self.memory_mib,
                            hypervisor="mock", uri=self.uri, utilization=min(1.0, used / self.cores))

    def list_vms(self) -> list[VmInfo]:
        with self._lock:
            self._check("list_vms")
            return [
                VmInfo(name=n, power=vm.power, pinned_cores=vm.pinned, weight=vm.weight, cap=vm.cap,
                       cpu_time_s=vm.cpu_time, metadata=dict(vm.spec.metadata))
                for n, vm in sorted(self._vms.items())
            ]

    def define(self, spec: VmSpec) -> None:
        with self._lock:
            self._check("define", spec.name, Capability.DEFINE)
            if not spec.name:
                raise OutOfRange(what="vm name", value="''", allowed="a non-empty name")
            if spec.vcpus < 1:
                raise OutOfRange(what=f"{spec.name}.vcpus", value=spec.vcpus, allowed=">= 1")
            if spec.memory_mib < 1:
                raise OutOfRange(what=f"{spec.name}.memory_mib", value=spec.memory_mib, allowed=">= 1")
            vm = self._vms.get(spec.name)
            if vm is not None:
                if vm.spec == spec:
                    return
                if vm.power in (PowerState.RUNNING, PowerState.PAUSED, PowerState.MIGRATING):
                    # like libvirt: a redefinition takes effect at the next boot
                    vm.spec = spec
                    self._log("define", spec.name, "redefined (takes effect at next boot)")
                    return
                vm.spec = spec
                self._log("define", spec.name, "redefined")
                return
            self._vms[spec.name] = _Vm(spec=spec)
            self._log("define", spec.name)
        self._emit(spec.name, "defined")

    def undefine(self, name: str) -> None:
        with self._lock:
            self._check("undefine", name, Capability.DEFINE)
            vm = self._vm(name)
            if vm.power in (PowerState.RUNNING, PowerState.PAUSED, PowerState.MIGRATING):
                raise VmStateError(backend=self.name, name=name, state=vm.power.value, operation="undefine")
            del self._vms[name]
            self._log("undefine", name)
        self._emit(name, "undefined")

    def start(self, name: str) -> None:
        with self._lock:
            self._check("start", name, Capability.LIFECYCLE)
            vm = self._vm(name)
            if vm.power in (PowerState.RUNNING, PowerState.MIGRATING):
                return
            if vm.power is PowerState.PAUSED:
                raise VmStateError(backend=self.name, name=name, state="paused", operation="start (resume it)")
            vm.power = PowerState.RUNNING
            vm.process = None  # a fresh boot: no job process inside
            vm.saved_to = None
            self._invalidate()
            self._log("start", name)
        self._emit(name, "started")

    def stop(self, name: str, force: bool = True) -> None:
        with self._lock:
            self._check("stop", name, Capability.LIFECYCLE)
            vm = self._vm(name)
            if vm.power in (PowerState.SHUTOFF, PowerState.SAVED):
                return
            if vm.power is PowerState.MIGRATING:
                raise VmStateError(backend=self.name, name=name, state="migrating", operation="stop")
            vm.power = PowerState.SHUTOFF
            if vm.process is not None and vm.process.exit_code is None:
                vm.process.exit_code = KILLED_EXIT
            self._invalidate()
            self._log("stop", name, "force" if force else "shutdown")
        self._emit(name, "stopped")

    def suspend(self, name: str) -> None:
        with self._lock:
            self._check("suspend", name, Capability.SUSPEND)
            vm = self._vm(name)
            if vm.power is PowerState.PAUSED:
                return
            if vm.power is not PowerState.RUNNING:
                raise VmStateError(backend=self.name, name=name, state=vm.power.value, operation="suspend")
            vm.power = PowerState.PAUSED
            self._invalidate()
            self._log("suspend", name)
        self._emit(name, "suspended")

    def resume(self, name: str) -> None:
        with self._lock:
            self._check("resume", name, Capability.SUSPEND)
            vm = self._vm(name)
            if vm.power is PowerState.RUNNING:
                return
            if vm.power is not PowerState.PAUSED:
                raise VmStateError(backend=self.name, name=name, state=vm.power.value, operation="resume")
            vm.power = PowerState.RUNNING
            self._invalidate()
            self._log("resume", name)
        self._emit(name, "resumed")

    def pin_vcpus(self, name: str, cores: tuple[int, ...]) -> None:
        with self._lock:
            self._check("pin_vcpus", name, Capability.PIN)
            vm = self._vm(name)
            if len(cores) != vm.spec.vcpus:
                raise OutOfRange(what=f"{name} pinning", value=list(cores),
                                 allowed=f"one core per VCPU ({vm.spec.vcpus})")
            for c in cores:
                if not 0 <= c < self.cores:
                    raise OutOfRange(what=f"{name} core", value=c, allowed=f"0..{self.cores - 1}")
            if vm.pinned == tuple(cores):
                return
            vm.pinned = tuple(cores)
            self._invalidate()
            self._log("pin_vcpus", name, ",".join(map(str, cores)))

    def set_cpu_tune(self, name: str, weight: int | None = None, cap: float | None = None,
                     clear_cap: bool = False) -> None:
        with self._lock:
            if weight is not None:
                self._check("set_cpu_tune", name, Capability.CPU_WEIGHT)
            if cap is not None or clear_cap:
                self._check("set_cpu_tune", name, Capability.CPU_CAP)
            if weight is None and cap is None and not clear_cap:
                self._check("set_cpu_tune", name)
            vm = self._vm(name)
            if weight is not None and not WEIGHT_MIN <= weight <= WEIGHT_MAX:
                raise OutOfRange(what=f"{name} weight", value=weight, allowed=f"{WEIGHT_MIN}..{WEIGHT_MAX}")
            if cap is not None and not (0.0 < cap <= 1.0 and math.isfinite(cap)):
                raise OutOfRange(what=f"{name} cap", value=cap, allowed="(0, 1]")
            new_weight = vm.weight if weight is None else weight
            new_cap = None if clear_cap else (vm.cap if cap is None else cap)
            if (new_weight, new_cap) == (vm.weight, vm.cap):
                return
            vm.weight, vm.cap = new_weight, new_cap
            self._invalidate()
            self._log("set_cpu_tune", name, f"weight={new_weight} cap={new_cap}")

    def checkpoint(self, name: str, path: str) -> None:
        with self._lock:
            self._check("checkpoint", name, Capability.CHECKPOINT)
            vm = self._vm(name)
            if vm.power not in (PowerState.RUNNING, PowerState.PAUSED):
                raise VmStateError(backend=self.name, name=name, state=vm.power.value, operation="checkpoint")
            state = _vm_state(vm, self.hostname, self._t)
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                _write_json(Path(path), state)
            except OSError as exc:
                raise HypervisorError(backend=self.name, operation="checkpoint",
                                      problem=f"cannot write {path}: {exc}") from exc
            vm.power = PowerState.SAVED
            vm.saved_to = path
            self._invalidate()
            self._log("checkpoint", name, path)
        self._emit(name, "saved", path)

    def restore(self, path: str) -> str:
        with self._lock:
            self._check("restore", "", Capability.CHECKPOINT)
            try:
                with open(path, encoding="utf-8") as fh:
                    state = json.load(fh)
            except FileNotFoundError as exc:
                raise HypervisorError(backend=self.name, operation="restore",
                                      problem=f"no checkpoint file {path}") from exc
            except (OSError, ValueError) as exc:
                raise HypervisorError(backend=self.name, operation="restore",
                                      problem=f"cannot read checkpoint {path}: {exc}") from exc
            restored = _vm_from_state(state, path)
            spec, pinned = restored.spec, restored.pinned
            existing = self._vms.get(spec.name)
            if existing is not None and existing.power in (PowerState.RUNNING, PowerState.PAUSED,
                                                           PowerState.MIGRATING):
                raise VmStateError(backend=self.name, name=spec.name, state=existing.power.value,
                                   operation=f"restore from {path}")
            if pinned is not None and max(pinned) >= self.cores:
                pinned = None
            restored.pinned = pinned
            self._vms[spec.name] = restored
            self._invalidate()
            self._log("restore", spec.name, path)
        self._emit(spec.name, "restored", path)
        return spec.name

    def start_migration(self, name: str, dest_uri: str, migrate_uri: str | None = None,
                        peer_to_peer: bool = True, metadata: Mapping[str, str] | None = None) -> None:
        with self._lock:
            self._check("start_migration", name, Capability.MIGRATION)
            vm = self._vm(name)
            mig = self._migrations.get(name)
            if mig is not None and mig.state is MigrationState.RUNNING:
                if mig.target_uri == dest_uri:
                    return
                raise VmStateError(backend=self.name, name=name, state="migrating",
                                   operation=f"migrate to {dest_uri}")
            if vm.power is not PowerState.RUNNING:
                raise VmStateError(backend=self.name, name=name, state=vm.power.value, operation="migrate")
            target = self.fabric.lookup(dest_uri) if self.fabric is not None else None
            if dest_uri == self.uri or target is self:
                raise MigrationError(backend=self.name, name=name, target=dest_uri,
                                     problem="source and destination are the same host")
            if target is None and self.fabric_dir is not None:
                inbox = self.fabric_dir / inbox_name(dest_uri)
                if not inbox.is_dir():
                    raise MigrationError(backend=self.name, name=name, target=dest_uri,
                                         problem=f"no such host on the mock fabric (no inbox {inbox})")
                if (inbox / f"{name}.json").exists():
                    raise MigrationError(backend=self.name, name=name, target=dest_uri,
                                         problem="an offer of that VM is already waiting there")
                with contextlib.suppress(FileNotFoundError):
                    (inbox / f"{name}.rejected").unlink()  # a stale answer to an earlier offer
            elif target is None:
                raise MigrationError(backend=self.name, name=name, target=dest_uri,
                                     problem="no such host on the mock fabric")
            elif name in target._vms:
                raise MigrationError(backend=self.name, name=name, target=dest_uri,
                                     problem="destination already has a VM of that name")
            vm.power = PowerState.MIGRATING
            self._migrations[name] = _Migration(name=name, target=target, started=self._t,
                                                duration=self.migration_seconds, target_uri=dest_uri,
                                                metadata=dict(metadata or {}))
            self._log("start_migration", name, dest_uri)

    def migration_status(self, name: str) -> MigrationStatus:
        with self._lock:
            self._check("migration_status", name, Capability.MIGRATION)
            mig = self._migrations.get(name)
            if mig is None:
                self._vm(name)
                raise VmStateError(backend=self.name, name=name, state="not migrating",
                                   operation="report migration status")
            total = max(1, self._vms[name].spec.memory_mib if name in self._vms else 1) * 1024 * 1024
            end = mig.finished if mig.finished is not None else self._t
            elapsed = max(0.0, end - mig.started)
            frac = 1.0 if mig.state is MigrationState.COMPLETED else min(1.0, elapsed / max(mig.duration, _EPS))
            return MigrationStatus(state=mig.state, data_total_bytes=total,
                                   data_remaining_bytes=int(total * (1.0 - frac)), elapsed_s=elapsed,
                                   error=mig.error)

    def abort_migration(self, name: str) -> None:
        with self._lock:
            self._check("abort_migration", name, Capability.MIGRATION)
            mig = self._migrations.get(name)
            if mig is None:
                self._vm(name)
                raise VmStateError(backend=self.name, name=name, state="not migrating", operation="abort migration")
            if mig.state is not MigrationState.RUNNING:
                return
            if mig.offer is not None:
                try:
                    mig.offer.unlink()  # withdraw the offer; too late once the target claimed it
                except FileNotFoundError:
                    self._settle()
                    self._log("abort_migration", name, "too late: the target answered", ok=False)
                    return
                except OSError as exc:
                    raise HypervisorError(backend=self.name, operation="abort_migration",
                                          problem=f"cannot withdraw {mig.offer}: {exc}") from exc
            mig.state = MigrationState.ABORTED
            mig.finished = self._t
            vm = self._vms.get(name)
            if vm is not None:
                vm.power = PowerState.RUNNING
                vm.frozen = False
                self._invalidate()
            self._log("abort_migration", name)

    def set_metadata(self, name: str, metadata: Mapping[str, str]) -> None:
        with self._lock:
            self._check("set_metadata", name)
            vm = self._vm(name)
            merged = {**vm.spec.metadata, **{str(k): str(v) for k, v in metadata.items()}}
            if merged == vm.spec.metadata:
                return
            vm.spec = replace(vm.spec, metadata=merged)
            self._log("set_metadata", name, " ".join(f"{k}={v}" for k, v in sorted(metadata.items())))

    def subscribe(self, callback: EventCallback) -> None:
        self._check("subscribe", "", Capability.EVENTS)
        with self._lock:
            self._callbacks.append(callback)

    def close(self) -> None:
        self._poll_stop.set()
        with self._lock:
            self._closed = True
            self._callbacks.clear()
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join(timeout=5)

    def reopen(self) -> None:
        """Reconnect after ``close`` (the VMs were never gone: a hypervisor outlives its clients)."""
        with self._lock:
            self._closed = False

    # ------------------------------------------------------------------ mock-only: processes, model

    def start_process(self, name: str, spec: ProcessSpec) -> None:
        with self._lock:
            self._check("start_process", name)
            vm = self._vm(name)
            if vm.power is not PowerState.RUNNING:
                raise VmStateError(backend=self.name, name=name, state=vm.power.value, operation="start a process")
            if not 0.0 < spec.cpu_usage <= 1.0:
                raise OutOfRange(what=f"{name} process cpu_usage", value=spec.cpu_usage, allowed="(0, 1]")
            if spec.work_seconds < 0 or not math.isfinite(spec.work_seconds):
                raise OutOfRange(what=f"{name} process work_seconds", value=spec.work_seconds, allowed=">= 0")
            p = vm.process
            if p is not None and (p.spec.job_id, p.spec.index) == (spec.job_id, spec.index):
                return
            if p is not None and p.exit_code is None:
                raise VmStateError(backend=self.name, name=name, state=f"running {p.spec.job_id}[{p.spec.index}]",
                                   operation=f"start {spec.job_id}[{spec.index}]")
            vm.process = _Process(spec=spec, started=self._t)
            self._dirty = True
            self._log("start_process", name, f"{spec.job_id}[{spec.index}]")
            self._advance(self._t)  # a zero-work process ends at once

    def process_status(self, name: str) -> ProcessStatus | None:
        with self._lock:
            self._check("process_status", name)
            p = self._vm(name).process
            if p is None:
                return None
            return ProcessStatus(vm=name, job_id=p.spec.job_id, index=p.spec.index, running=p.exit_code is None,
                                 exit_code=p.exit_code, work_done=p.done)

    def kill_process(self, name: str) -> None:
        with self._lock:
            self._check("kill_process", name)
            vm = self._vm(name)
            p = vm.process
            if p is None:
                return
            killed = p.exit_code is None
            if killed:
                p.exit_code = KILLED_EXIT
            vm.process = None
            self._invalidate()
            if killed:
                self._log("kill_process", name, f"{p.spec.job_id}[{p.spec.index}]")
            elif self.state_file is not None:
                self._save()

    def utilization(self, name: str) -> float:
        """The VM's current CPU allocation (fraction of one core)."""
        with self._lock:
            self._settle()
            return self._vm(name).alloc

    def operations(self, *ops: str, ok_only: bool = True) -> list[JournalEntry]:
        """Journal entries of the given operations (all when none given)."""
        return [e for e in self.journal if (not ops or e.operation in ops) and (e.ok or not ok_only)]


def inbox_name(uri: str) -> str:
    """The fabric-directory inbox of a host URI (``mock://node2`` -> ``mock_node2``)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in uri.replace("://", "_")) or "_"


def _write_text(path: Path, text: str, private: bool = False) -> None:
    """Atomically: a temporary file in the same directory, then rename. ``private``: mode 0600 (whatever
    the umask), and durable (the file is fsynced before the rename, the directory after it)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if private:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fd, 0o600)  # a leftover temporary file keeps its mode otherwise
                fh.write(text)
                fh.flush()
                os.fsync(fd)
        else:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if private:
        with contextlib.suppress(OSError):
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def _write_json(path: Path, state: dict[str, Any]) -> None:
    _write_text(path, json.dumps(state, indent=1))


def _vm_state(vm: _Vm, host: str, t: float) -> dict[str, Any]:
    """The VM as a checkpoint (also the migration hand-off's payload)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "host": host,
        "time": t,
        "spec": {"name": vm.spec.name, "vcpus": vm.spec.vcpus, "memory_mib": vm.spec.memory_mib,
                 "image": vm.spec.image, "metadata": dict(vm.spec.metadata)},
        "paused": vm.power is PowerState.PAUSED,
        "pinned": list(vm.pinned) if vm.pinned is not None else None,
        "weight": vm.weight,
        "cap": vm.cap,
        "cpu_time": vm.cpu_time,
        "process": None if vm.process is None else {
            "job_id": vm.process.spec.job_id, "index": vm.process.spec.index,
            "command": vm.process.spec.command, "work_seconds": vm.process.spec.work_seconds,
            "cpu_usage": vm.process.spec.cpu_usage, "done": vm.process.done,
            "exit_code": vm.process.exit_code, "started": vm.process.started,
        },
    }


def _vm_from_state(state: Any, where: str) -> _Vm:
    """Parse :func:`_vm_state`'s output; HypervisorError naming ``where`` when it is not one."""
    try:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"format {state.get('format')!r} is not {CHECKPOINT_FORMAT}")
        s = state["spec"]
        spec = VmSpec(name=str(s["name"]), vcpus=int(s["vcpus"]), memory_mib=int(s["memory_mib"]),
                      image=s["image"], metadata={str(k): str(v) for k, v in s["metadata"].items()})
        pinned = tuple(int(c) for c in state["pinned"]) if state["pinned"] is not None else None
        proc = state["process"]
        process = None if proc is None else _Process(
            spec=ProcessSpec(job_id=str(proc["job_id"]), index=int(proc["index"]),
                             command=str(proc["command"]), work_seconds=float(proc["work_seconds"]),
                             cpu_usage=float(proc["cpu_usage"])),
            done=float(proc["done"]), exit_code=_exit_code(proc["exit_code"]),
            started=float(proc.get("started", 0.0)))
        weight, cap, cpu_time = int(state["weight"]), state["cap"], float(state["cpu_time"])
        paused = bool(state["paused"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HypervisorError(backend="mock", operation="restore",
                              problem=f"{where} is not a mock checkpoint: {exc}") from exc
    return _Vm(spec=spec, power=PowerState.PAUSED if paused else PowerState.RUNNING, pinned=pinned,
               weight=weight, cap=None if cap is None else float(cap), cpu_time=cpu_time, process=process)


def _exit_code(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"exit_code must be an integer or null, got {value!r}")
    return value


class MockProcessRunner:
    """The ``ProcessRunner`` of a MockBackend: job processes live in the backend's CPU model."""

    def __init__(self, backend: MockBackend) -> None:
        self.backend = backend

    def start(self, vm: str, spec: ProcessSpec) -> None:
        self.backend.start_process(vm, spec)

    def status(self, vm: str) -> ProcessStatus | None:
        return self.backend.process_status(vm)

    def kill(self, vm: str) -> None:
        self.backend.kill_process(vm)


__all__ = ["Fault", "JournalEntry", "MockBackend", "MockFabric", "MockProcessRunner", "MockStateError", "inbox_name",
           "share_core"]
