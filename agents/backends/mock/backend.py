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
allocation. Migrations (in one process and between processes) are ``fabric.py``'s; the state file
that lets guests outlive the agent process, and checkpoint files, are ``store.py``'s.

Faults: ``Fault(operation, vm_glob, times, error)`` makes the next ``times`` matching calls raise
(``times=None``: every call). ``operation`` is a method name (``"list_vms"``, ``"start"``, ...) or
``"*"``. The journal records every state-changing call (not reads) with its time and result.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import math
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from vmctl.agents.backends.base import (
    WEIGHT_MAX,
    WEIGHT_MIN,
    BackendEvent,
    Capability,
    EventCallback,
    HostInfo,
    MigrationState,
    MigrationStatus,
    ProcessStatus,
    VmInfo,
    VmSpec,
)
from vmctl.agents.backends.mock.fabric import FabricMigrations, inbox_name
from vmctl.agents.backends.mock.host import EPS, KILLED_EXIT, MockFabric, MockMigration, MockProcess, MockVm
from vmctl.agents.backends.mock.store import HostStateFile, vm_from_state, vm_state, write_json
from vmctl.clock import Clock, VirtualClock
from vmctl.cpushare import share_core
from vmctl.errors import (
    HypervisorError,
    MigrationError,
    OperationNotSupported,
    OutOfRange,
    VmctlError,
    VmNotFound,
    VmStateError,
)
from vmctl.nodedoc import PowerState, ProcessSpec


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


@dataclass
class Hold:
    """Make matching calls wait (a slow hypervisor call: libvirt's destroy of a starved guest) until
    ``release`` is set, without holding the backend's lock; ``entered`` is set once a call waits.
    ``times=None`` holds every matching call."""

    operation: str
    vm_glob: str = "*"
    release: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    times: int | None = 1

    def take(self, operation: str, vm: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.operation not in ("*", operation) or not fnmatch.fnmatchcase(vm, self.vm_glob):
            return False
        if self.times is not None:
            self.times -= 1
        return True


@dataclass(frozen=True, slots=True)
class JournalEntry:
    time: float
    operation: str
    vm: str
    detail: str = ""
    ok: bool = True


class MockBackend(FabricMigrations, HostStateFile):
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
        #: calls that wait for a test's word (``Hold``): fault injection of a slow hypervisor
        self.holds: list[Hold] = []
        self.uri = uri or f"mock://{hostname}"
        self.migration_seconds = migration_seconds
        self.fabric = fabric
        self.journal: list[JournalEntry] = []
        self._caps = frozenset(Capability) if capabilities is None else frozenset(capabilities)
        self._vms: dict[str, MockVm] = {}
        self._migrations: dict[str, MockMigration] = {}
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

    def _emit(self, vm: str, kind: str, detail: str = "") -> None:
        ev = BackendEvent(vm=vm, kind=kind, detail=detail)
        for cb in list(self._callbacks):
            cb(ev)

    def _vm(self, name: str) -> MockVm:
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
        by_core: dict[int, list[MockVm]] = {}
        unpinned: list[MockVm] = []
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
            while self._t < now - EPS:
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
            self._vms[spec.name] = MockVm(spec=spec)
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

    def _held(self, operation: str, vm: str) -> None:
        """Wait while a ``Hold`` matches this call (outside the lock: other calls go on meanwhile)."""
        with self._lock:
            holds = [h for h in self.holds if h.take(operation, vm)]
        for h in holds:
            h.entered.set()
            h.release.wait()

    def stop(self, name: str, force: bool = True) -> None:
        self._held("stop", name)
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
            state = vm_state(vm, self.hostname, self._t)
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                write_json(Path(path), state)
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
            restored = vm_from_state(state, path)
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
            self._migrations[name] = MockMigration(name=name, target=target, started=self._t,
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
            frac = 1.0 if mig.state is MigrationState.COMPLETED else min(1.0, elapsed / max(mig.duration, EPS))
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
            vm.process = MockProcess(spec=spec, started=self._t)
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
