"""The running daemon: the decision loop, the leader lease and the waiters, on an asyncio event loop.

``DaemonRuntime`` is what turns the synchronous ``Daemon`` into a process that keeps deciding: a
decision pass whenever an event arrives, at the next tick, or at a decision's ``wake_at``; the leader
lease (``vmctl.daemon.lease.LeaseHolder``: renewed every third of its TTL, a standby polls for it);
and the waiters that long polls park on (an agent waiting for its node's desired state to change, a
follower of the event log waiting for the next events). It knows nothing of HTTP: the API
(``vmctl.api.server.DaemonServer``) builds its app on it, and reacts to a change of leadership through
``on_leader``.

Everything here runs on the event loop's thread, so the decision loop and the API's handlers never
interleave inside a change; only the policy itself (``Daemon.choose``, which reads nothing but its own
view) runs in a worker thread meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import sys
import time
from collections.abc import Callable

from vmctl.daemon.core import Daemon
from vmctl.daemon.lease import LeaseHolder
from vmctl.errors import LeaseLost, VmctlError

log = logging.getLogger("vmctld.runtime")

#: event-log followers (``GET /v1/events?wait=``) woken at a time when events are written (_events_written)
FOLLOWER_WAKE_BATCH = 8
#: the longest pause between two such batches
FOLLOWER_PAUSE_MAX_S = 0.1
#: the interpreter's thread switch interval while vmctld runs (Python's default: 5 ms). While the policy
#: decides in its worker thread, the event loop's thread waits up to one interval for the interpreter lock
#: each time it wants it back (after every socket read or write): at 5 ms, a ``GET /healthz`` took tens of
#: ms during a decision; at 1 ms it takes about what it takes idle (issue 27, ``python -m bench.daemon``)
SWITCH_INTERVAL_S = 0.001


def freeze_loaded_state() -> None:
    """Move every object alive now (the state just loaded from the store: a record, its spec, its slots per
    job, millions of objects at 100,000 jobs) out of the cyclic garbage collector's reach (``gc.freeze``).
    A full collection walked all of them, on the event loop's thread: 200-400 ms during which no request
    was answered (issue 27). What is created later is collected as usual; a frozen object is still freed
    when its last reference goes, only a reference cycle among frozen objects is never collected."""
    gc.freeze()


class DaemonRuntime:
    """The decision loop, the lease and the waiters of one ``Daemon``. ``open()`` starts the daemon,
    ``run()`` the loop and the lease, ``await halt()`` stops them and answers every waiter, ``close()``
    closes the daemon."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.config = daemon.config
        self._events: dict[str, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.stopping = False
        #: called on the event loop when this daemon becomes the leader (after a standby took the lease)
        self.on_leader: list[Callable[[], None]] = []
        daemon.on_desired = self._desired_changed
        #: the event-log long polls (followers) parked now, and those woken but not yet told (_wake_followers)
        self._log_waiters: dict[asyncio.Future[None], None] = {}
        self._to_wake: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waking = False
        self._log_loop: asyncio.AbstractEventLoop | None = None
        daemon.on_events = self._events_written
        #: what the policy in force waits for (``Daemon.policy_waiting``) as of the last pass or request this
        #: loop served: ``GET /healthz`` reads it from another thread (``publish_health``)
        self.waiting: str | None = None
        # the lease is held on the daemon side; the runtime reacts to a change of leadership
        self.lease = LeaseHolder(daemon, on_gained=self._became_leader, on_lost=self.wake_all_waiters)

    # the decision loop
    def kick(self) -> None:
        """A decision pass soon (an event arrived)."""
        self._wake.set()

    def publish_health(self) -> None:
        """Publish what ``GET /healthz`` tells beside the leadership and the store's damage (which it reads
        as they are): the policy's ``waiting``, computed here on the loop's thread (one reference
        assignment: a reader in another thread sees the old text or the new one)."""
        d = self.daemon
        try:
            self.waiting = d.policy_waiting() if d.leader and d.damaged is None else None
        except Exception:  # never let the health answer break a pass or a request
            log.exception("policy_waiting failed")

    # waiters
    def desired_event(self, node: str) -> asyncio.Event:
        """Set once the desired state of ``node`` changes (an agent's long poll waits on it)."""
        ev = self._events.get(node)
        if ev is None:
            ev = self._events[node] = asyncio.Event()
        return ev

    def _desired_changed(self, nodes: set[str]) -> None:
        for n in nodes:
            ev = self._events.pop(n, None)
            if ev is not None:
                ev.set()

    def log_event(self) -> asyncio.Future[None]:
        """Done once events are written after this call (``GET /v1/events?wait=``); pass it to
        ``log_unwatch`` when done waiting."""
        self._log_loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = self._log_loop.create_future()
        self._log_waiters[fut] = None
        return fut

    def log_unwatch(self, fut: asyncio.Future[None]) -> None:
        self._log_waiters.pop(fut, None)

    def _events_written(self) -> None:
        """Wake the followers, ``FOLLOWER_WAKE_BATCH`` at a time, at most half of the event loop's time.

        Every follower answers and asks again at once: waking 1,000 in one step put a second of work
        ahead of every other request (``/healthz`` p50 625 ms, issue 23). After each batch has run, the
        loop serves everything else for as long as the batch took before the next one is woken; a
        follower woken late gets every event written meanwhile in one answer."""
        if not self._log_waiters:
            return
        loop = self._log_loop
        assert loop is not None
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is not loop:  # a store write outside the event loop's thread: wake them from there
            loop.call_soon_threadsafe(self._events_written)
            return
        self._to_wake.extend(self._log_waiters)
        self._log_waiters = {}
        if not self._waking:
            self._waking = True
            asyncio.get_running_loop().call_soon(self._wake_followers)

    def _wake_followers(self) -> None:
        loop = asyncio.get_running_loop()
        n = FOLLOWER_WAKE_BATCH if not self.stopping else len(self._to_wake)
        while n > 0 and self._to_wake:
            fut = self._to_wake.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1
        if self._to_wake:
            # the woken handlers run in the next step of the loop, before this callback
            loop.call_soon(self._after_batch, loop.time())
        else:
            self._waking = False

    def _after_batch(self, woken_at: float) -> None:
        loop = asyncio.get_running_loop()
        busy = loop.time() - woken_at
        loop.call_later(0.0 if self.stopping else min(busy, FOLLOWER_PAUSE_MAX_S), self._wake_followers)

    def wake_all_waiters(self) -> None:
        """Answer every parked long poll now (leadership lost, shutting down)."""
        for n in list(self._events):
            self._desired_changed({n})
        self._events_written()

    def _became_leader(self) -> None:
        freeze_loaded_state()  # (the state was loaded from the store)
        for hook in self.on_leader:
            hook()
        self.publish_health()
        self.kick()

    # lifecycle
    def open(self) -> None:
        """Start the daemon (load its state, take the lease if free) on the running event loop."""
        loop = asyncio.get_running_loop()

        # a leader that stops on its own (a damaged store) answers its parked long polls at once
        def stepped_down() -> None:
            loop.call_soon_threadsafe(self.wake_all_waiters)

        self.daemon.on_step_down = stepped_down
        self.daemon.start()
        freeze_loaded_state()

    def run(self) -> None:
        """Start the decision loop and the lease holder as tasks of the running event loop."""
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self._tasks.append(asyncio.create_task(self._loop(), name="vmctld-loop"))
        self._tasks.append(asyncio.create_task(self.lease.run(), name="vmctld-lease"))

    async def halt(self) -> None:
        """Stop the lease holder and the decision loop, and answer every waiter."""
        self.stopping = True
        self.lease.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.wake_all_waiters()

    def close(self) -> None:
        self.daemon.close()

    async def _loop(self) -> None:
        d = self.daemon
        while not self.stopping:
            self._wake.clear()
            # bursts of events (many submissions) are decided together: at most one decision per
            # loop.min_interval_s while events keep coming
            gap = (d.last_decide_at - d.clock.now()) / d.speed + self.config.min_interval_s  # real seconds
            if d.dirty and 0 < gap <= self.config.min_interval_s:
                await asyncio.sleep(gap)
            nxt: float | None = None
            decided = False
            began = d.clock.now()
            try:
                # the policy runs in a worker thread: a long decision (a large cluster, MEASY) must not
                # hold up the API, the agents' long polls or the lease renewal (see vmctl.daemon.core)
                # housekeeping, the view's reading of the state, and actuation + commit hold the loop; the
                # loop serves what came in between them, and the view's building (O(running jobs)) and the
                # policy run in the worker thread
                due = d.housekeeping_pass()
                if due is not None:
                    await asyncio.sleep(0)
                    if d.decision_due():
                        pending = d.begin_decision(max(due, d.clock.now()), defer=True)
                        decision = await asyncio.to_thread(d.choose, pending)
                        d.finish_decision(pending, decision)
                        decided = True
                nxt = d.next_pass_at()
            except LeaseLost:
                self.wake_all_waiters()
            except VmctlError as exc:
                log.error("decision loop: %s: %s", exc.reference, exc)
                d.dirty = False
            except Exception:
                log.exception("decision loop failed; retrying at the next tick")
                d.dirty = False
            self.publish_health()
            if d.dirty and decided:  # events came in while the policy decided: decide again
                await asyncio.sleep(0)
                continue
            # A pass that was due (``dirty``, or the tick) but made no decision: none may be made now (a
            # policy switch drains, the policy waits for nodes, the lease was lost), ``dirty`` stays set and
            # ``next_pass_at`` stays in the past. The next pass is at the next event (``kick``) or tick:
            # going round again at once spun this thread for as long as a switch drained, and starved
            # every other thread of the process of the interpreter lock (the API's front loop; in an
            # in-process test, the agents' and the CLI's threads).
            if nxt is None or (not decided and nxt <= began):
                delay = self.config.tick_s
            else:
                delay = max(0.0, (nxt - d.clock.now()) / d.speed)
            # a decision was put off: its reasons are written at ``reasons_due`` (only a time still ahead:
            # one already past that no pass could decide at waits for the event or tick, as above)
            wait_reasons = None if d.reasons_due is None else d.reasons_due - time.monotonic()
            if wait_reasons is not None and wait_reasons > 0:
                delay = min(delay, wait_reasons)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.001, delay))
