"""What every group of handlers shares: the server, its daemon, and the leader check."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vmctl.daemon.base import NotLeader
from vmctl.daemon.core import Daemon

if TYPE_CHECKING:
    from vmctl.api.server import DaemonServer


class Routes:
    """The handlers of one group of routes, bound to the running server."""

    def __init__(self, server: DaemonServer) -> None:
        self.s = server

    @property
    def d(self) -> Daemon:
        return self.s.daemon

    def _leader(self) -> None:
        damaged = self.d.damaged_error()
        if damaged is not None:
            raise damaged
        if not self.d.leader:
            raise NotLeader(holder=self.d.store.lease().holder or "none")
