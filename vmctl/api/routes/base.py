"""What every group of handlers shares: the server they run in (as the ``ApiHost`` protocol of what
they use of it, so that no route group imports ``vmctl.api.server``, which wires them), its daemon,
and the leader check."""

from __future__ import annotations

from typing import Any, Protocol

from vmctl.api.planning import Planner
from vmctl.api.security import CaState, CertRegistry
from vmctl.daemon.base import NotLeader
from vmctl.daemon.core import Daemon
from vmctl.daemon.runtime import DaemonRuntime


class ApiHost(Protocol):
    """What the handlers use of the running server (``vmctl.api.server.DaemonServer``)."""

    daemon: Daemon
    #: the decision loop (``kick``) and the waiters long polls park on (``desired_event``, ``log_event``)
    runtime: DaemonRuntime
    certs: CertRegistry
    #: the cluster CAs served with now (a rotation replaces it through ``apply_ca``)
    ca_state: CaState
    planner: Planner

    def apply_ca(self, state: CaState) -> None: ...

    def render_metrics(self) -> tuple[bytes, str]: ...

    def poll_parked(self, node: str, delta: int) -> None: ...

    def health(self) -> tuple[int, dict[str, Any]]: ...


class Routes:
    """The handlers of one group of routes, bound to the running server."""

    def __init__(self, server: ApiHost) -> None:
        self.s = server

    @property
    def d(self) -> Daemon:
        return self.s.daemon

    @property
    def rt(self) -> DaemonRuntime:
        return self.s.runtime

    def _leader(self) -> None:
        damaged = self.d.damaged_error()
        if damaged is not None:
            raise damaged
        if not self.d.leader:
            raise NotLeader(holder=self.d.store.lease().holder or "none")
