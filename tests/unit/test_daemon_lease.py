"""vmctld's lease holder (``vmctl.daemon.lease``): a standby takes the lease once the leader stops
renewing and says so (``on_gained``); the old leader's next renewal fails and says so (``on_lost``)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from tests.unit.test_daemon_core import Cluster
from vmctl.daemon.core import Daemon
from vmctl.daemon.lease import LeaseHolder
from vmctl.store import open_store


async def _until(cond: object, timeout: float = 5.0) -> None:
    assert callable(cond)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_standby_takes_the_lease_and_the_old_leader_learns_it_lost_it(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2}, lease_ttl_s=0.15)  # renew/campaign every 0.05 real seconds
    standby = Daemon(replace(c.config, holder="test-b"), open_store(c.config.store_url), clock=c.clock,
                     policy=c.policy)
    events: list[str] = []

    async def scenario() -> None:
        assert standby.start() is False
        b = LeaseHolder(standby, on_gained=lambda: events.append("b gained"), on_lost=lambda: events.append("b lost"))
        tb = asyncio.create_task(b.run())
        await asyncio.sleep(0.2)  # the leader's lease is still valid on the (virtual) lease clock
        assert events == [] and not standby.leader
        c.clock.advance(c.config.lease_ttl_s + 1)  # the leader (no holder running) stopped renewing
        await _until(lambda: events == ["b gained"])
        assert standby.leader and standby.epoch == c.daemon.epoch + 1
        a = LeaseHolder(c.daemon, on_gained=lambda: events.append("a gained"), on_lost=lambda: events.append("a lost"))
        ta = asyncio.create_task(a.run())
        await _until(lambda: "a lost" in events)
        assert not c.daemon.leader
        await asyncio.sleep(0.2)  # b keeps renewing: a stays standby, b never lost it
        assert events == ["b gained", "a lost"] and standby.leader
        a.stop()
        b.stop()
        for t in (ta, tb):
            t.cancel()
        await asyncio.gather(ta, tb, return_exceptions=True)

    try:
        asyncio.run(scenario())
    finally:
        standby.store.close()
        c.close()
