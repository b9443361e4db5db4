"""Holding vmctld's leader lease while the process runs (daemon side; no HTTP).

``Daemon.start`` takes the lease once; afterwards ``LeaseHolder.run`` (an asyncio task of the vmctld
process) keeps it: every third of the lease TTL, the leader renews it (``Daemon.renew``) and a
standby tries to take it (``Daemon.try_lead``, which reloads the state when it succeeds). The process
that hosts the daemon says what happens around a change of leadership: ``on_gained`` after a standby
became leader (the HTTP server writes its bootstrap token and wakes the decision loop), ``on_lost``
when the lease was lost (the HTTP server releases the agents' parked long polls, which then answer
"not leader"). A store error is logged and retried at the next period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from vmctl.daemon.core import Daemon
from vmctl.errors import LeaseLost, VmctlError

log = logging.getLogger("vmctld.lease")


class LeaseHolder:
    def __init__(self, daemon: Daemon, *, on_gained: Callable[[], None], on_lost: Callable[[], None]) -> None:
        self.daemon = daemon
        self.on_gained = on_gained
        self.on_lost = on_lost
        self.period = daemon.config.lease_ttl_s / 3  # real seconds
        self.stopping = False

    def stop(self) -> None:
        """No renewal or campaign after the current sleep (the task is also cancelled by its owner)."""
        self.stopping = True

    async def run(self) -> None:
        d = self.daemon
        while not self.stopping:
            await asyncio.sleep(self.period)
            try:
                if d.leader:
                    d.renew()
                elif d.try_lead():
                    self.on_gained()
            except LeaseLost:
                self.on_lost()
            except VmctlError as exc:
                log.error("lease: %s", exc)
            except Exception:
                # an untranslated store error (or a bug) must not end the task: a standby whose lease task
                # died would stay a standby forever after the leader is gone
                log.exception("lease: unexpected error; trying again in %.1f s", self.period)
