"""Translation of libvirt errors into vmctl errors: done ONCE, here, with the cause chained.

=================================================  ============================
libvirt error code                                 vmctl error
=================================================  ============================
VIR_ERR_NO_DOMAIN                                  VmNotFound
VIR_ERR_NO_SUPPORT, ARGUMENT_UNSUPPORTED,          OperationNotSupported
OPERATION_UNSUPPORTED
VIR_ERR_NO_CONNECT, SYSTEM_ERROR/RPC (socket),     HypervisorUnavailable (retryable; the backend
AUTH_FAILED, INTERNAL "client socket is closed"    reopens the connection on the next call)
anything during a migration                        MigrationError
everything else                                    HypervisorError (retryable)
=================================================  ============================
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import libvirt

from vmctl.errors import (
    HypervisorError,
    HypervisorUnavailable,
    MigrationError,
    OperationNotSupported,
    VmctlError,
    VmNotFound,
)

BACKEND = "libvirt"

_UNSUPPORTED = {
    libvirt.VIR_ERR_NO_SUPPORT,
    libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
    libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
}
_CONNECTION = {
    libvirt.VIR_ERR_NO_CONNECT,
    libvirt.VIR_ERR_AUTH_FAILED,
    libvirt.VIR_ERR_RPC,
    libvirt.VIR_ERR_INVALID_CONN,
}
_CONNECTION_DOMAINS = {libvirt.VIR_FROM_RPC, libvirt.VIR_FROM_REMOTE}


def is_connection_error(exc: libvirt.libvirtError) -> bool:
    """True when ``exc`` means the connection to libvirtd is gone (not a per-operation fault)."""
    code, domain = exc.get_error_code(), exc.get_error_domain()
    if code in _CONNECTION:
        return True
    if code == libvirt.VIR_ERR_SYSTEM_ERROR and domain in _CONNECTION_DOMAINS:
        return True
    msg = (exc.get_error_message() or "").lower()
    return "client socket is closed" in msg or "connection reset" in msg or "end of file while reading" in msg


def translate(
    exc: libvirt.libvirtError,
    *,
    operation: str,
    name: str | None = None,
    uri: str = "",
    migration_target: str | None = None,
) -> VmctlError:
    """The vmctl error for a libvirt error (raise it ``from exc``)."""
    code = exc.get_error_code()
    msg = exc.get_error_message() or str(exc)
    if code == libvirt.VIR_ERR_NO_DOMAIN and name is not None:
        return VmNotFound(backend=BACKEND, name=name)
    if code in _UNSUPPORTED:
        return OperationNotSupported(backend=f"{BACKEND} ({uri})" if uri else BACKEND, operation=operation, detail=msg)
    if is_connection_error(exc):
        return HypervisorUnavailable(backend=BACKEND, uri=uri or "libvirt", problem=f"{operation}: {msg}")
    if migration_target is not None:
        return MigrationError(name=name or "?", target=migration_target, problem=msg)
    return HypervisorError(backend=BACKEND, operation=f"{operation} {name}" if name else operation, problem=msg)


@contextmanager
def translated(
    operation: str, *, name: str | None = None, uri: str = "", migration_target: str | None = None
) -> Iterator[None]:
    """``with translated("start", name=vm): dom.create()`` raises vmctl errors only."""
    try:
        yield
    except libvirt.libvirtError as exc:
        raise translate(exc, operation=operation, name=name, uri=uri, migration_target=migration_target) from exc
