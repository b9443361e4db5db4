"""The lease task outlives an unexpected error: a standby whose campaign died would stay a standby
forever after the leader is gone (seen once as a hang in the kill -9 test on a loaded machine)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from vmctl.daemon.lease import LeaseHolder


def test_an_unexpected_error_does_not_end_the_campaign() -> None:
    tries: list[int] = []

    def try_lead() -> bool:
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("database is locked (untranslated)")
        return True

    gained: list[int] = []
    daemon = SimpleNamespace(config=SimpleNamespace(lease_ttl_s=0.03), leader=False, try_lead=try_lead)
    holder = LeaseHolder(daemon, on_gained=lambda: (gained.append(1), holder.stop()), on_lost=lambda: None)  # type: ignore[arg-type]

    asyncio.run(asyncio.wait_for(holder.run(), timeout=5))
    assert len(tries) == 2 and gained == [1]
