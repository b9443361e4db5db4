"""The decision loop (``DaemonRuntime._loop``) passes again when an event wakes it (``kick``) or its tick is
due, and at no other time, also while no decision may be made: a policy switch waiting for its nodes to be
re-laid out, a policy waiting for nodes. Such a pass leaves ``dirty`` set and ``next_pass_at`` in the past;
the loop used to go round again at once, for as long as the switch lasted: a thread of vmctld at ~94 % CPU,
which starved the API's front loop, the agents and an in-process CLI of the interpreter lock (``vmctl policy
show`` took 11-15 s in tests/integration/test_policy_switch_live.py).

Progress is counted, not time: the tick is an hour and the virtual clock stands still, so every pass is one
the test asked for with ``kick``; in between, the test gives the event loop a hundred turns and counts the
passes made meanwhile (a spinning loop makes at least one per turn)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.daemon.decisions import PendingDecision
from vmctl.daemon.runtime import DaemonRuntime
from vmctl.model import Decision, Discipline
from vmctl.store import open_store

TURNS = 100


class Passes:
    """Counts the decision loop's passes (``Daemon.housekeeping_pass`` starts each one)."""

    def __init__(self, d: Daemon) -> None:
        self.n = 0
        real = d.housekeeping_pass

        def counted() -> float | None:
            self.n += 1
            return real()

        d.housekeeping_pass = counted  # type: ignore[method-assign]

    async def reach(self, n: int, what: str) -> None:
        for _ in range(3000):  # (generous: 30 s)
            if self.n >= n:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"the decision loop made {self.n} pass(es), not {n}, after {what}")

    async def idle(self) -> int:
        """Give the event loop TURNS turns with nothing to wake the decision loop; the passes made meanwhile."""
        before = self.n
        for _ in range(TURNS):
            await asyncio.sleep(0.002)
        return self.n - before


def _daemon(tmp: Path, policy: str, params: dict[str, object]) -> Daemon:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=3600.0, holder="loop-waits",
                       checkpoint_dir=str(tmp / "ckpt"), policy_name=policy, policy_params=params,
                       policy_explicit=True)
    return Daemon(cfg, open_store(cfg.store_url), clock=VirtualClock(1000.0))


def _run(d: Daemon, body: Callable[[DaemonRuntime, Passes], Awaitable[None]],
         setup: Callable[[Daemon], None] = lambda d: None) -> None:
    async def main() -> None:
        rt = DaemonRuntime(d)
        rt.open()  # (starts the daemon: it leads)
        setup(d)
        passes = Passes(d)
        rt.run()
        try:
            await body(rt, passes)
        finally:
            await rt.halt()
            rt.close()

    asyncio.run(main())


async def _each_pass_is_asked_for(rt: DaemonRuntime, passes: Passes) -> None:
    await passes.reach(1, "starting")
    for kicks in range(1, 4):
        assert rt.daemon.dirty, "no decision may be made: the event that asked for one stays unanswered"
        assert await passes.idle() == 0, "the decision loop went round again with nothing to wake it"
        rt.kick()
        await passes.reach(1 + kicks, "a kick")
    assert await passes.idle() == 0


def test_no_pass_without_an_event_while_a_switch_waits_for_its_nodes(tmp_path: Path) -> None:
    def setup(d: Daemon) -> None:
        d.register_node("n1", 2, "n1", "mock", memory_mib=4096, levels=2, discipline=Discipline.PRIORITY)
        d.start_switch("gs-m", {"mpl": 3})  # n1 is laid out in 2 priority levels: nobody re-lays it out here
        assert d.switch is not None and d.decision_due() is False

    async def body(rt: DaemonRuntime, passes: Passes) -> None:
        await _each_pass_is_asked_for(rt, passes)
        assert rt.waiting is not None and "switching to policy gs-m" in rt.waiting

    _run(_daemon(tmp_path, "measy", {}), body, setup)


def test_no_pass_without_an_event_while_the_policy_waits_for_nodes(tmp_path: Path) -> None:
    d = _daemon(tmp_path, "gs-m", {"mpl": 3})

    async def body(rt: DaemonRuntime, passes: Passes) -> None:
        await _each_pass_is_asked_for(rt, passes)
        assert rt.waiting is not None and "waits for nodes" in rt.waiting

    _run(d, body)


def test_a_decision_with_events_behind_it_is_followed_by_another_at_once(tmp_path: Path) -> None:
    """What the loop still does without a kick: a decision during which events came in (``dirty`` again)
    is followed by another pass at once."""
    d = _daemon(tmp_path, "fcfs", {})

    async def body(rt: DaemonRuntime, passes: Passes) -> None:
        await passes.reach(1, "starting")
        await passes.idle()
        decisions = rt.daemon.decisions
        real = rt.daemon.finish_decision

        def then_an_event(pending: PendingDecision, decision: Decision) -> Decision:
            out = real(pending, decision)
            if rt.daemon.decisions == decisions + 1:
                rt.daemon.dirty = True  # (as a submission served while the policy decided leaves it)
            return out

        rt.daemon.finish_decision = then_an_event  # type: ignore[method-assign]
        rt.daemon.dirty = True
        rt.kick()
        for _ in range(3000):
            if rt.daemon.decisions >= decisions + 2:
                break
            await asyncio.sleep(0.01)
        assert rt.daemon.decisions == decisions + 2, "no second decision after one with events behind it"
        assert await passes.idle() == 0

    _run(d, body)
