"""What the libvirt tests and benchmarks ask of a ``LibvirtBackend`` beyond the ``HypervisorBackend``
protocol: libvirt's domain ID (unchanged while a guest keeps running), a domain's CPU time, guest
memory (the boot-sector guests' progress counter, ``tests.support.guests.COUNTER_ADDR``), the raw
scheduler parameters, and waiting for a migration the backend started. The agent needs none of them,
so they live here, on the backend's own connection handling (``_call``: reconnect, error translation)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vmctl.agents.backends.base import MigrationState, MigrationStatus
from vmctl.errors import MigrationError, OutOfRange, VmStateError

if TYPE_CHECKING:  # importing this module needs no libvirt-python: the tests that use it skip without it
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend


def domain_id(backend: LibvirtBackend, name: str) -> int:
    """libvirt's domain ID (-1 when not running): unchanged while a VM keeps running."""
    result: int = backend._call("domain_id", lambda conn: int(backend._dom(conn, name).ID()), name=name)
    return result


def cpu_time_s(backend: LibvirtBackend, name: str) -> float:
    """Cumulative CPU time of a running VM in seconds (``getCPUStats(True)``)."""
    result: float = backend._call("cpu_time", lambda conn: backend._cpu_time(backend._dom(conn, name)), name=name)
    return result


def memory_peek(backend: LibvirtBackend, name: str, address: int, size: int) -> bytes:
    """``size`` bytes of guest-physical memory at ``address`` (``virDomainMemoryPeek``)."""
    if not 0 < size <= 65536 or address < 0:
        raise OutOfRange(what="memory peek", value=f"{size} bytes at {address:#x}", allowed="1..65536 bytes")

    import libvirt

    def go(conn: Any) -> bytes:
        data: bytes = backend._dom(conn, name).memoryPeek(address, size, libvirt.VIR_MEMORY_PHYSICAL)
        return data

    result: bytes = backend._call("memory_peek", go, name=name)
    return result


def scheduler_parameters(backend: LibvirtBackend, name: str) -> dict[str, int]:
    """The raw scheduler parameters libvirt reports for a VM (live when running)."""
    import libvirt

    def go(conn: Any) -> dict[str, int]:
        dom = backend._dom(conn, name)
        flags = libvirt.VIR_DOMAIN_AFFECT_LIVE if dom.isActive() == 1 else libvirt.VIR_DOMAIN_AFFECT_CONFIG
        return {k: int(v) for k, v in dom.schedulerParametersFlags(flags).items()}

    result: dict[str, int] = backend._call("scheduler_parameters", go, name=name)
    return result


def wait_migration(backend: LibvirtBackend, name: str, timeout: float = 60.0) -> MigrationStatus:
    """Block until the migration of ``name`` that ``backend`` started ends; still running after
    ``timeout`` seconds is a ``MigrationError``."""
    from vmctl.agents.backends.libvirt.errors import BACKEND

    with backend._lock:
        mig = backend._migrations.get(name)
    if mig is None:
        raise VmStateError(backend=BACKEND, name=name, state="not migrating", operation="wait for migration")
    if mig.thread is not None:
        mig.thread.join(timeout=timeout)
    status = backend.migration_status(name)
    if status.state is MigrationState.RUNNING:
        raise MigrationError(name=name, target=mig.dest_uri, problem=f"still running after {timeout:.0f} s")
    return status
