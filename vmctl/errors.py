"""One error tree for all of vmctl.

Every error has a kebab-case ``reference`` (stable, printed by the CLI and returned by the API), a
``retryable`` flag and a message ``template`` filled from keyword fields. Foreign errors (libvirt,
sqlite, HTTP, YAML, ...) are translated once, at the boundary, with the cause chained
(``raise TraceFormatError(...) from exc``).

    >>> e = TraceFormatError(path="a.swf", line=3, problem="expected 18 fields, got 7")
    >>> str(e)
    'a.swf:3: expected 18 fields, got 7'
    >>> e.reference
    'trace-format'

Classes map to process exit codes in one place (``EXIT_CODES`` / ``exit_code_for`` at the end of this
module), used by ``vmctl`` and ``vmctl-agent`` alike.
"""

from __future__ import annotations

from typing import Any, ClassVar


class VmctlError(Exception):
    """Base of every error vmctl raises on purpose."""

    reference: ClassVar[str] = "vmctl-error"
    retryable: ClassVar[bool] = False
    template: ClassVar[str] = "{detail}"
    #: HTTP status the API answers with when this error reaches it.
    http_status: ClassVar[int] = 500
    hint: ClassVar[str] = ""

    def __init__(self, **fields: Any) -> None:
        self.fields: dict[str, Any] = fields
        try:
            message = self.template.format(**fields)
        except (KeyError, IndexError):
            message = f"{self.template} {fields}"
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form used by the API and ``--output json``."""
        out: dict[str, Any] = {"reference": self.reference, "message": self.message, "retryable": self.retryable}
        for k, v in self.fields.items():
            if isinstance(v, str | int | float | bool) or v is None:
                out[k] = v
            else:
                out[k] = str(v)
        return out


# ----------------------------------------------------------------------------- user input


class UserError(VmctlError):
    """Bad input from a person or a file: never a traceback, nothing half-applied."""

    reference = "invalid-input"
    http_status = 400
    template = "{where}: {problem}"


class ConfigError(UserError):
    reference = "config-invalid"
    template = "{path}: {where}: {problem}"
    hint = "check the file against the commented example in etc/"


class TraceFormatError(UserError):
    """``line`` is 1-based; 0 means the problem concerns the whole file (missing, unreadable)."""

    reference = "trace-format"
    template = "{path}:{line}: {problem}"

    def __init__(self, **fields: Any) -> None:
        super().__init__(**fields)
        if not fields.get("line"):
            self.args = (f"{fields.get('path')}: {fields.get('problem')}",)


class InstanceFormatError(UserError):
    reference = "instance-format"
    template = "{path}: {where}: {problem}"


class ValidationError(UserError):
    """A request or job spec field is wrong. ``field`` is a dotted path into the document."""

    reference = "validation-failed"
    template = "{field}: {problem}"
    http_status = 422


class RequestTooLarge(UserError):
    reference = "request-too-large"
    template = "request body of {size} bytes exceeds the limit of {limit} bytes"
    http_status = 413


class UnknownPolicyError(UserError):
    reference = "unknown-policy"
    template = "unknown policy {name!r}; known policies: {known}"


class PolicyParameterError(UserError):
    reference = "policy-parameter"
    template = "policy {policy}: parameter {param}: {problem}"


class PolicyNeedsUnmet(UserError):
    """A policy needs more of the cluster than it offers (``SchedulingPolicy.needs``): VM levels per
    core, a level discipline, job shapes or capped shared VMs. Raised by the simulator and vmctld
    before the policy runs."""

    reference = "policy-needs-unmet"
    template = "policy {policy} cannot run on {where}: {problem}"
    hint = "pick a policy this cluster can serve (`vmctl policy list`), or give the cluster what it needs"


class OutOfRange(UserError):
    reference = "out-of-range"
    template = "{what} = {value} is out of range ({allowed})"


# ----------------------------------------------------------------------------- lookups and state


class NotFound(VmctlError):
    reference = "not-found"
    template = "{kind} {name!r} not found"
    http_status = 404


class Conflict(VmctlError):
    reference = "conflict"
    template = "{what}: {problem}"
    http_status = 409


class InvariantViolation(VmctlError):
    """A scheduling decision broke a rule of ``vmctl.policies.invariants`` (a bug, not user error)."""

    reference = "invariant-violated"
    template = "{rule}: {detail}"


# ----------------------------------------------------------------------------- auth


class Unauthenticated(VmctlError):
    reference = "unauthenticated"
    template = "{problem}"
    http_status = 401
    hint = "pass --token or set VMCTL_TOKEN; agents need a client certificate"


class Forbidden(VmctlError):
    reference = "forbidden"
    template = "{principal} may not {action}"
    http_status = 403


# ----------------------------------------------------------------------------- hypervisors and agents


class HypervisorError(VmctlError):
    reference = "hypervisor-error"
    retryable = True
    template = "{backend}: {operation}: {problem}"
    http_status = 502


class GuestImageError(VmctlError):
    """The SSH guest image (kernel + initramfs from Debian packages) cannot be built."""

    reference = "guest-image-error"
    template = "guest image: {step}: {problem}"


class HypervisorUnavailable(HypervisorError):
    reference = "hypervisor-unavailable"
    template = "{backend}: cannot reach {uri}: {problem}"
    hint = "is libvirtd running? (see README, 'real libvirt')"


class OperationNotSupported(HypervisorError):
    reference = "operation-not-supported"
    retryable = False
    template = "{backend} does not support {operation}"
    http_status = 501


class VmNotFound(HypervisorError):
    reference = "vm-not-found"
    retryable = False
    template = "{backend}: no VM named {name!r}"
    http_status = 404


class MigrationError(HypervisorError):
    reference = "migration-failed"
    template = "migration of {name!r} to {target}: {problem}"


class RemoteExecError(VmctlError):
    reference = "remote-exec-failed"
    retryable = True
    template = "{host}: {problem}"


class RemoteHostKeyError(RemoteExecError):
    """The guest's SSH host key is unknown or does not match the known_hosts file."""

    reference = "remote-host-key"
    retryable = False
    hint = "add the guest's host key to the agent's known_hosts file (ssh.known_hosts)"


class VmStateError(HypervisorError):
    """An operation that the VM's current power state does not allow (checkpoint of a stopped VM)."""

    reference = "vm-state"
    retryable = False
    template = "{backend}: {name!r} is {state}: cannot {operation}"
    http_status = 409


# ----------------------------------------------------------------------------- daemon and store


class StoreError(VmctlError):
    reference = "store-error"
    retryable = True
    template = "{backend}: {problem}"


class SchemaVersionError(StoreError):
    reference = "schema-version"
    retryable = False
    template = "{backend}: database schema version {found} is newer than this vmctl ({supported})"


class LeaseLost(StoreError):
    reference = "lease-lost"
    retryable = False
    template = "leader lease lost: epoch {epoch} superseded by {current}"


class DaemonUnavailable(VmctlError):
    reference = "daemon-unavailable"
    retryable = True
    template = "cannot reach vmctld at {url}: {problem}"
    hint = "is vmctld running? check --url / VMCTL_URL"


class TlsUntrusted(DaemonUnavailable):
    """The daemon's certificate is not signed by a CA the client trusts (no ``--ca``, or another CA)."""

    reference = "tls-untrusted"
    retryable = False
    template = "cannot verify vmctld at {url}: {problem}"
    hint = "pass --ca with the cluster CA (vmctld writes it to <state_dir>/ca.pem) or set VMCTL_CA"


class ApiError(VmctlError):
    """An error answer from the daemon, re-raised on the client side."""

    reference = "api-error"
    template = "{status}: {reference_text}: {problem}"


class WaitTimeout(VmctlError):
    """The client library's ``wait_all(timeout)`` ran out of time (the jobs keep running)."""

    reference = "wait-timeout"
    retryable = True
    template = "{what} not finished after {timeout} s"


class LocalClusterError(VmctlError):
    """A process of a local cluster (``vmctl.localcluster``: vmctld or an agent) died or never got ready."""

    reference = "local-cluster-failed"
    template = "{what}: {problem}"


class DemoError(LocalClusterError):
    """``vmctl demo`` cannot go on (its options, its guests, its workload, its processes)."""

    reference = "demo-failed"


# ----------------------------------------------------------------------------- solvers


class SolverError(VmctlError):
    reference = "solver-error"
    template = "{solver}: {problem}"


class SimulationError(VmctlError):
    """The simulator cannot go on: an action it does not model, or a policy that leaves jobs waiting
    forever (nothing running, nothing arriving, no wake-up asked for)."""

    reference = "simulation-failed"
    template = "simulation at t={time}: {problem}"


# ----------------------------------------------------------------------------- experiments


class ClusterUnavailable(VmctlError):
    """The experiment runner cannot start or reach its Dask cluster."""

    reference = "cluster-unavailable"
    retryable = True
    template = "cannot reach the Dask scheduler at {address}: {problem}"
    hint = "is `dask scheduler` running there? see docs/experiments.md"


class CellsFailed(VmctlError):
    """Some cells of an experiment grid raised; the others' results are written, the failed cells'
    inputs and errors are in the results table."""

    reference = "cells-failed"
    template = "{failed} of {total} cells failed (first: {first}); inputs and errors are in {table}"
    hint = "fix the cause and rerun the same command: finished cells are skipped (--retry-failed reruns these)"


# ----------------------------------------------------------------------------- exit codes

#: first match wins, so subclasses come before their bases. 0 ok; 1 internal error (a bug); 2 usage /
#: bad input; 3 not found; 4 conflict; 5 authentication or permission; 6 daemon, cluster or hypervisor
#: unavailable; 7 solver or operation failed. ``vmctl`` and ``vmctl-agent`` exit with these.
EXIT_CODES: list[tuple[type[VmctlError], int]] = [
    (NotFound, 3),
    (VmNotFound, 3),
    (Conflict, 4),
    (Unauthenticated, 5),
    (Forbidden, 5),
    (DaemonUnavailable, 6),
    (ClusterUnavailable, 6),
    (HypervisorUnavailable, 6),
    (UserError, 2),
    (SolverError, 7),
    (HypervisorError, 7),
    (VmctlError, 7),
]


def exit_code_for(exc: VmctlError) -> int:
    """The process exit code for an error vmctl raised on purpose (``EXIT_CODES``); 1 for anything else."""
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return 1
