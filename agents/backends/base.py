"""The HypervisorBackend interface: everything a node agent may ask of a hypervisor.

One contract test suite (tests/contract) runs against every implementation: the in-memory mock,
libvirt's ``test:///default`` driver and real QEMU/KVM. An operation a backend cannot do raises
``OperationNotSupported`` and is absent from ``capabilities()``.

Weights are backend-neutral integers 1..10000 (``WEIGHT_MIN``..``WEIGHT_MAX``); each backend maps
them to its own knob (cgroup v1 ``cpu_shares`` 2..262144, cgroup v2 ``cpu.weight`` 1..10000, Xen
credit ``weight`` 1..65535) with a pure, table-tested function. Caps are fractions of one physical
core in (0, 1], or None for uncapped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from vmctl.errors import OperationNotSupported
from vmctl.nodedoc import PowerState, ProcessSpec

WEIGHT_MIN = 1
WEIGHT_MAX = 10000


class Capability(StrEnum):
    DEFINE = "define"
    LIFECYCLE = "lifecycle"  # start / stop
    SUSPEND = "suspend"
    PIN = "pin"
    CPU_WEIGHT = "cpu_weight"
    CPU_CAP = "cpu_cap"
    CHECKPOINT = "checkpoint"
    MIGRATION = "migration"
    EVENTS = "events"
    CPU_STATS = "cpu_stats"


@dataclass(frozen=True, slots=True)
class HostInfo:
    hostname: str
    cores: int
    memory_mib: int
    hypervisor: str  # "mock", "qemu", "kvm", "xen", "test"
    uri: str = ""
    utilization: float = 0.0  # host CPU utilization 0..1 over the last interval


@dataclass(frozen=True, slots=True)
class VmSpec:
    """What ``define`` needs. ``metadata`` is stored with the VM (libvirt: a <metadata> element) so
    an agent can adopt VMs it made after a restart."""

    name: str
    vcpus: int = 1
    memory_mib: int = 64
    image: str | None = None  # path of a disk image (read-only boot disk); None = mock / no disk
    metadata: dict[str, str] = field(default_factory=dict)
    kernel: str | None = None  # direct kernel boot (libvirt <kernel>): a kernel image path
    initrd: str | None = None  # its initramfs (libvirt <initrd>)
    cmdline: str = ""  # its command line (the backend adds vmctl.hostname=<name>)
    ssh_port: int | None = None  # QEMU user networking, host 127.0.0.1:ssh_port forwarded to the guest's port 22


@dataclass(frozen=True, slots=True)
class VmInfo:
    """One VM as the hypervisor reports it (``list_vms`` returns one consistent relist)."""

    name: str
    power: PowerState
    pinned_cores: tuple[int, ...] | None  # per VCPU; None = not pinned
    weight: int | None
    cap: float | None
    cpu_time_s: float
    metadata: dict[str, str] = field(default_factory=dict)


class MigrationState(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    state: MigrationState
    data_total_bytes: int = 0
    data_remaining_bytes: int = 0
    elapsed_s: float = 0.0
    error: str = ""


@dataclass(frozen=True, slots=True)
class BackendEvent:
    """A lifecycle event: ``kind`` is started, stopped, suspended, resumed, saved, restored,
    migrated, crashed, defined or undefined."""

    vm: str
    kind: str
    detail: str = ""


EventCallback = Callable[[BackendEvent], None]


class HypervisorBackend(ABC):
    """About fifteen typed operations. All are idempotent where the name allows (start of a running
    VM, stop of a stopped one, pinning to the current pinning) and raise ``VmNotFound`` for unknown
    VMs, ``OutOfRange`` for bad arguments, ``HypervisorError`` (retryable) for hypervisor faults."""

    name: str = "abstract"
    #: a forced ``stop`` can take long (libvirt: seconds to minutes on a loaded host): the agent runs it
    #: off its reconcile pass (``Reconciler.background_stops``); an in-memory backend's stop is instant
    slow_stops: bool = False

    @abstractmethod
    def capabilities(self) -> frozenset[Capability]: ...

    @abstractmethod
    def host_info(self) -> HostInfo: ...

    @abstractmethod
    def list_vms(self) -> list[VmInfo]: ...

    @abstractmethod
    def define(self, spec: VmSpec) -> None: ...

    @abstractmethod
    def undefine(self, name: str) -> None: ...

    @abstractmethod
    def start(self, name: str) -> None: ...

    @abstractmethod
    def stop(self, name: str, force: bool = True) -> None: ...

    @abstractmethod
    def suspend(self, name: str) -> None: ...

    @abstractmethod
    def resume(self, name: str) -> None: ...

    @abstractmethod
    def pin_vcpus(self, name: str, cores: tuple[int, ...]) -> None:
        """Pin VCPU i to physical core ``cores[i]``, live and persistent."""

    @abstractmethod
    def set_cpu_tune(self, name: str, weight: int | None = None, cap: float | None = None,
                     clear_cap: bool = False) -> None:
        """Set the weight and/or the cap live and persistent. ``cap=None`` leaves the cap alone unless
        ``clear_cap`` is True (then the VM becomes uncapped)."""

    @abstractmethod
    def checkpoint(self, name: str, path: str) -> None:
        """Save the running VM's memory and device state to ``path`` and stop it."""

    @abstractmethod
    def restore(self, path: str) -> str:
        """Restore a VM from a checkpoint file; returns its name. It runs afterwards."""

    @abstractmethod
    def start_migration(self, name: str, dest_uri: str, migrate_uri: str | None = None,
                        peer_to_peer: bool = True, metadata: Mapping[str, str] | None = None) -> None:
        """Begin a live migration to the hypervisor at ``dest_uri`` (returns at once). ``metadata``:
        entries that the VM's metadata carries *on the destination* (merged into what it had), so the
        VM names its new host the moment it arrives (``vmctl.node``), whoever then owns it."""

    def set_metadata(self, name: str, metadata: Mapping[str, str]) -> None:
        """Merge ``metadata`` into the VM's metadata, live and persistent (an agent claims a VM that
        arrived with another node's name). Backends that cannot raise ``OperationNotSupported``."""
        raise OperationNotSupported(backend=self.name, operation="set_metadata")

    @abstractmethod
    def migration_status(self, name: str) -> MigrationStatus: ...

    @abstractmethod
    def abort_migration(self, name: str) -> None: ...

    @abstractmethod
    def subscribe(self, callback: EventCallback) -> None:
        """Call ``callback`` for every lifecycle event (from any thread)."""

    @abstractmethod
    def close(self) -> None: ...


# ------------------------------------------------------------------------------ job processes
# Added after the first version (additive): how an agent runs a job process inside a guest. The
# mock backend simulates processes in its CPU model; ``vmctl.agents.remote.ParamikoRunner`` runs
# them over SSH in real guests.


@dataclass(frozen=True, slots=True)
class ProcessStatus:
    """The job process of one VM as the runner last saw it. ``exit_code`` is None while it runs;
    137 means it was killed. ``work_done`` is the work done so far, in standard-core seconds (a core
    of speed 1.0; the mock backend counts it at its host's ``speed``), where known."""

    vm: str
    job_id: str
    index: int
    running: bool
    exit_code: int | None = None
    output_tail: str = ""
    work_done: float = 0.0
    #: False while the runner is still connecting to start it (a guest the agent just booted: its SSH
    #: server is not up yet); True once the process runs in the guest or ended
    started: bool = True
    #: real seconds since the runner saw the process start (None: it does not know; the agent then takes
    #: the time it first sees ``started``)
    started_ago_s: float | None = None


class ProcessRunner(Protocol):
    """Starts, observes and kills the (single) job process of a VM. ``start`` of the process that
    is already there (same job and index) is a no-op; ``kill`` of no process is a no-op."""

    def start(self, vm: str, spec: ProcessSpec) -> None: ...

    def status(self, vm: str) -> ProcessStatus | None: ...

    def kill(self, vm: str) -> None: ...


@runtime_checkable
class BootAware(Protocol):
    """A ``ProcessRunner`` that wants to know when the agent booted a VM from shut off: no process it
    does not know of runs there (nothing to adopt), and the guest may need a while until it answers."""

    def booted(self, vm: str) -> None: ...
