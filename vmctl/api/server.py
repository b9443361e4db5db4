"""The daemon's HTTP API v1 on aiohttp (contract: ``vmctl/api/openapi.yaml``).

This module wires it: the route table (handlers in ``vmctl.api.routes``: jobs, cluster, admin, agents),
the middlewares (``plumbing.errors_mw``, ``access.make_auth_mw``), the security material
(``vmctl.api.security``) and the running server below. The JSON answers are ``vmctl.api.documents``.

Every request is authenticated (``vmctl.auth``) before its body is read; bodies are limited in
size (413) and validated (422 naming the field); every error is ``{"error": {"reference", "message",
"field"}}``. Handlers call the synchronous ``Daemon`` on the event loop thread, so the decision loop
and the API never interleave inside a change; only the policy itself (``Daemon.choose``, which reads
nothing but its own view) runs in a worker thread meanwhile.

``DaemonServer`` runs it all: the TLS listener, the decision loop (a pass whenever an event
arrives, at the next tick, or at a decision's ``wake_at``) and the long-poll waiters of the agents.
The leader lease (renewed every third of its TTL; a standby polls for it) is held on the daemon side
by ``vmctl.daemon.lease.LeaseHolder``, which the server starts and which tells it when leadership is
gained or lost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web

from vmctl import auth
from vmctl.api.access import make_auth_mw
from vmctl.api.documents import node_json, vms_json, workers_json
from vmctl.api.listener import BoundedSite
from vmctl.api.planning import Planner
from vmctl.api.plumbing import CERTS, DAEMON, HEALTHZ, METRICS, errors_mw
from vmctl.api.routes.admin import AdminRoutes
from vmctl.api.routes.agents import AgentRoutes
from vmctl.api.routes.cluster import ClusterRoutes
from vmctl.api.routes.events import EventRoutes
from vmctl.api.routes.jobs import JobRoutes
from vmctl.api.security import CaState, CertRegistry, bootstrap_token, load_ca, read_ca_state
from vmctl.daemon import statedir
from vmctl.daemon.core import Daemon
from vmctl.daemon.lease import LeaseHolder
from vmctl.errors import LeaseLost, VmctlError

log = logging.getLogger("vmctld.api")

#: event-log followers (``GET /v1/events?wait=``) woken at a time when events are written (DaemonServer._events_written)
FOLLOWER_WAKE_BATCH = 8
#: the longest pause between two such batches
FOLLOWER_PAUSE_MAX_S = 0.1


class DaemonServer:
    """The running daemon: API + decision loop, with the lease held by a ``LeaseHolder``.
    ``await start()``, ``await stop()``."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.config = daemon.config
        self._events: dict[str, asyncio.Event] = {}
        #: node -> agent long-polls parked right now, waiting for its desired state to change
        self.polls_waiting: collections.Counter[str] = collections.Counter()
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.port: int = 0
        self.ca: auth.ClusterCA  # the current cluster CA (signs agent certificates)
        self.ca_state: CaState
        self._trusted: set[str] = set()  # fingerprints of the CAs self.ssl verifies client certificates with
        self.ssl: ssl.SSLContext | None = None
        self.site: BoundedSite | None = None
        self.stopping = False
        daemon.on_desired = self._desired_changed
        #: the event-log long polls (followers) parked now, and those woken but not yet told (_wake_followers)
        self._log_waiters: dict[asyncio.Future[None], None] = {}
        self._to_wake: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waking = False
        self._log_loop: asyncio.AbstractEventLoop | None = None
        daemon.on_events = self._events_written
        # the lease is held on the daemon side; the server reacts to a change of leadership
        self.lease = LeaseHolder(daemon, on_gained=self._became_leader, on_lost=self._wake_all_waiters)
        from vmctl.metrics import DaemonMetrics

        self.metrics = DaemonMetrics(self._snapshot)
        self.certs = CertRegistry(daemon)
        self.planner = Planner(self.config.plan_workers, self.config.plan_per_token, self.config.plan_queue)
        daemon.attach_metrics(self.metrics)

    # events
    def kick(self) -> None:
        self._wake.set()

    def desired_event(self, node: str) -> asyncio.Event:
        ev = self._events.get(node)
        if ev is None:
            ev = self._events[node] = asyncio.Event()
        return ev

    def poll_parked(self, node: str, delta: int) -> None:
        self.polls_waiting[node] += delta
        if self.polls_waiting[node] <= 0:
            del self.polls_waiting[node]
        self.metrics.polls_waiting.inc(delta)

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

    def _wake_all_waiters(self) -> None:
        for n in list(self._events):
            self._desired_changed({n})
        self._events_written()

    def _became_leader(self) -> None:
        """A standby took the lease: its bootstrap token (if none yet), the CAs as the store has them now
        (a rotation may have started or finished while it waited), and a decision pass now."""
        bootstrap_token(self.daemon)
        state = read_ca_state(self.daemon)
        if state is not None and self.ssl is not None and state.doc() != self.ca_state.doc():
            self.apply_ca(state)
        self.certs.upgrade(self.ca_state)
        self.kick()

    def apply_ca(self, state: CaState) -> None:
        """Serve with the CAs of ``state`` from the next connection on: trust the client certificates
        of its CAs (a CA dropped stays in the TLS context until a restart, but the registry refuses its
        certificates), present a server certificate of its signer, and write ``ca.pem``."""
        assert self.ssl is not None
        for ca in (state.current, state.previous):
            if ca is not None and ca.fingerprint() not in self._trusted:
                self.ssl.load_verify_locations(cadata=ca.cert_pem)
                self._trusted.add(ca.fingerprint())
        if state.signer.fingerprint() != self.ca_state.signer.fingerprint():
            state.signer.load_server_cert(self.ssl, self.config.server_names, Path(self.config.state_dir))
            log.warning("the server certificate is now signed by CA %s", state.signer.fingerprint())
        self.ca_state, self.ca = state, state.current
        statedir.write_public(self.config.ca_pem_path, state.bundle_pem(), "state_dir", self.config.path)

    # security material
    def render_metrics(self) -> tuple[bytes, str]:
        d = self.daemon
        self.metrics.set_leader(d.leader, d.epoch)
        if d.leader:  # gauges from the state as it is now (a scrape need not wait for a decision)
            self.metrics.set_queue_length(d.state.queue_length())
            active = d.state.active()
            self.metrics.set_running("fg", sum(1 for j in active if j.tier == "fg"))
            self.metrics.set_running("bg", sum(1 for j in active if j.tier == "bg"))
        body, ctype = self.metrics.exposition()
        return bytes(body), str(ctype)

    def _snapshot(self) -> Any:
        from vmctl.metrics import ClusterSnapshot

        d = self.daemon
        if not d.leader:
            return None
        return ClusterSnapshot(nodes=[node_json(d, n) for _k, n in sorted(d.state.nodes.items())],
                               vms=vms_json(d, None), workers=workers_json(d))

    # app
    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[errors_mw, make_auth_mw(self.config.max_body_bytes)],
                              client_max_size=self.config.max_body_bytes)
        app[DAEMON] = self.daemon
        app[METRICS] = self.metrics
        app[CERTS] = self.certs
        c, j, a, g = ClusterRoutes(self), JobRoutes(self), AdminRoutes(self), AgentRoutes(self)
        e = EventRoutes(self)
        r = app.router
        r.add_get("/v1/health", c.health)
        r.add_get(HEALTHZ, c.healthz)
        r.add_get("/metrics", c.metrics)
        r.add_post("/v1/jobs", j.submit)
        r.add_post("/v1/jobs:batch", j.submit_batch)
        r.add_get("/v1/jobs", j.list_jobs)
        r.add_get("/v1/history", j.history)
        r.add_get("/v1/jobs/{id}", j.get_job)
        r.add_delete("/v1/jobs/{id}", j.cancel_job)
        r.add_get("/v1/jobs/{id}/explain", j.explain)
        r.add_post("/v1/jobs/{id}/migrate", j.migrate)
        r.add_patch("/v1/jobs/{id}", j.update)
        r.add_post("/v1/jobs/{id}/hold", j.hold)
        r.add_post("/v1/jobs/{id}/release", j.release)
        r.add_post("/v1/jobs/{id}/requeue", j.requeue)
        r.add_get("/v1/events", e.list_events)
        r.add_get("/v1/operations", j.list_ops)
        r.add_get("/v1/operations/{id}", j.get_op)
        r.add_get("/v1/nodes", c.list_nodes)
        r.add_delete("/v1/nodes/{name}", c.remove_node)
        r.add_post("/v1/nodes/{name}/drain", c.drain)
        r.add_post("/v1/nodes/{name}/undrain", c.drain)
        r.add_post("/v1/nodes/{name}/cores", c.confirm_cores)
        r.add_get("/v1/vms", c.list_vms)
        r.add_get("/v1/workers", c.list_workers)
        r.add_get("/v1/gang", c.gang)
        r.add_get("/v1/vms/{name}", c.get_vm)
        r.add_put("/v1/vms/{name}/priority", c.vm_priority)
        r.add_get("/v1/policy", c.get_policy)
        r.add_put("/v1/policy", c.put_policy)
        r.add_delete("/v1/policy/switch", c.cancel_switch)
        r.add_post("/v1/plan", c.plan)
        r.add_post("/v1/tokens", a.create_token)
        r.add_get("/v1/tokens", a.list_tokens)
        r.add_delete("/v1/tokens/{id}", a.revoke_token)
        r.add_post("/v1/certs", a.create_cert)
        r.add_get("/v1/certs", a.list_certs)
        r.add_delete("/v1/certs/{key}", a.revoke_cert)
        r.add_get("/v1/ca", a.get_ca)
        r.add_post("/v1/ca/rotate", a.rotate_ca)
        r.add_post("/v1/ca/finish", a.finish_ca)
        r.add_post("/v1/agent/nodes/{node}/register", g.register)
        r.add_get("/v1/agent/nodes/{node}/desired", g.desired)
        r.add_post("/v1/agent/nodes/{node}/observed", g.observed)
        r.add_post("/v1/agent/nodes/{node}/heartbeat", g.heartbeat)
        r.add_post("/v1/agent/nodes/{node}/cert", g.renew_cert)
        r.add_get("/v1/agent/nodes/{node}/ca", g.ca_bundle)
        return app

    async def start(self) -> None:
        d = self.daemon
        loop = asyncio.get_running_loop()
        # a leader that stops on its own (a damaged store) answers its parked long polls at once

        def stepped_down() -> None:
            loop.call_soon_threadsafe(self._wake_all_waiters)

        d.on_step_down = stepped_down
        d.start()
        self.ca_state = load_ca(self.daemon)
        self.ca = self.ca_state.current
        self.certs.upgrade(self.ca_state)  # a registry from an older vmctld (vmctl.api.security)
        bootstrap_token(self.daemon)
        others = (self.ca_state.current,) if self.ca_state.previous is not None else ()
        self.ssl = self.ca_state.signer.server_context(self.config.server_names, Path(self.config.state_dir),
                                                       also_trust=others)
        self._trusted = {ca.fingerprint() for ca in (self.ca_state.current, self.ca_state.previous) if ca is not None}
        # idle and unauthenticated clients are bounded: connections open at once, TLS handshake time,
        # idle keep-alive time (vmctl.api.listener). A request whose client went away is cancelled: a
        # long poll (an event follower, an agent's desired state) does not hold its request for up to a
        # minute after its connection closed. Handlers change state only after their last await (the
        # body read), so a cancellation never leaves a change half made.
        self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False,
                                     keepalive_timeout=self.config.keepalive_timeout_s, handler_cancellation=True)
        await self._runner.setup()
        site = BoundedSite(self._runner, self.config.listen, self.config.port, ssl_context=self.ssl,
                           max_connections=self.config.max_connections,
                           handshake_timeout_s=self.config.handshake_timeout_s)
        self.site = site
        try:
            await site.start()
        except OSError as exc:  # taken since the preflight check, or an in-process start
            await self._runner.cleanup()
            self._runner = None
            raise statedir.bind_error(self.config, self.config.listen, exc) from exc
        self.port = site.port
        self._tasks.append(asyncio.create_task(self._loop(), name="vmctld-loop"))
        self._tasks.append(asyncio.create_task(self.lease.run(), name="vmctld-lease"))
        log.info("vmctld listening on https://%s:%d (leader=%s)", self.config.listen, self.port, d.leader)

    async def stop(self) -> None:
        self.stopping = True
        self.lease.stop()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._wake_all_waiters()
        if self._runner is not None:
            await self._runner.cleanup()
        await asyncio.to_thread(self.planner.close)
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
            try:
                # the policy runs in a worker thread: a long decision (a large cluster, MEASY) must not
                # hold up the API, the agents' long polls or the lease renewal (see vmctl.daemon.core)
                pending = d.begin_pass()
                if pending is not None:
                    decision = await asyncio.to_thread(d.choose, pending)
                    d.finish_decision(pending, decision)
                nxt = d.next_pass_at()
            except LeaseLost:
                self._wake_all_waiters()
            except VmctlError as exc:
                log.error("decision loop: %s: %s", exc.reference, exc)
                d.dirty = False
            except Exception:
                log.exception("decision loop failed; retrying at the next tick")
                d.dirty = False
            if d.dirty:
                await asyncio.sleep(0)
                continue
            delay = self.config.tick_s if nxt is None else max(0.0, (nxt - d.clock.now()) / d.speed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.001, delay))
