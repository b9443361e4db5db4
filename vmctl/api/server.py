"""The daemon's HTTP API v1 on aiohttp (contract: ``vmctl/api/openapi.yaml``).

This module wires it: the route table (handlers in ``vmctl.api.routes``: jobs, cluster, admin, agents),
the middlewares (``plumbing.errors_mw``, ``access.make_auth_mw``), the security material
(``vmctl.api.security``) and the running server below. The JSON answers are ``vmctl.api.documents``.

Every request is authenticated (``vmctl.auth``) before its body is read; bodies are limited in
size (413) and validated (422 naming the field); every error is ``{"error": {"reference", "message",
"field"}}``. Handlers call the synchronous ``Daemon`` on the event loop thread, so the decision loop
and the API never interleave inside a change; only the policy itself (``Daemon.choose``, which reads
nothing but its own view) runs in a worker thread meanwhile (``vmctl.daemon.runtime``).

``DaemonServer`` is built on the daemon's runtime (``vmctl.daemon.runtime.DaemonRuntime``: the
decision loop, the leader lease and the waiters long polls park on) and adds what HTTP needs: the TLS
listener, the cluster CA it serves with (reloaded when this daemon becomes the leader), the bootstrap
token, the metrics exposition and the plan workers.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web

from vmctl import auth
from vmctl.api.access import make_auth_mw
from vmctl.api.documents import node_json, vms_json, workers_json
from vmctl.api.front import FrontThread, make_front_mw
from vmctl.api.listener import BoundedSite
from vmctl.api.planning import Planner
from vmctl.api.plumbing import CERTS, DAEMON, HEALTHZ, METRICS, Handler, errors_mw
from vmctl.api.routes.admin import AdminRoutes
from vmctl.api.routes.agents import AgentRoutes
from vmctl.api.routes.cluster import ClusterRoutes
from vmctl.api.routes.events import EventRoutes
from vmctl.api.routes.jobs import JobRoutes
from vmctl.api.security import CaState, CertRegistry, bootstrap_token, load_ca, read_ca_state
from vmctl.daemon import statedir
from vmctl.daemon.core import Daemon
from vmctl.daemon.runtime import DaemonRuntime

log = logging.getLogger("vmctld.api")


class DaemonServer:
    """The daemon's HTTP API on its runtime (decision loop, lease, waiters). ``await start()``,
    ``await stop()``."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.config = daemon.config
        self.runtime = DaemonRuntime(daemon)
        #: the loop (in a thread of its own) that serves the connections (vmctl.api.front)
        self.front = FrontThread()
        #: node -> agent long-polls parked right now, waiting for its desired state to change
        self.polls_waiting: collections.Counter[str] = collections.Counter()
        self._runner: web.AppRunner | None = None
        self.port: int = 0
        self.ca: auth.ClusterCA  # the current cluster CA (signs agent certificates)
        self.ca_state: CaState
        self._trusted: set[str] = set()  # fingerprints of the CAs self.ssl verifies client certificates with
        self.ssl: ssl.SSLContext | None = None
        self.site: BoundedSite | None = None
        self.runtime.on_leader.append(self._became_leader)
        from vmctl.metrics import DaemonMetrics

        self.metrics = DaemonMetrics(self._snapshot)
        self.certs = CertRegistry(daemon)
        self.planner = Planner(self.config.plan_workers, self.config.plan_per_token, self.config.plan_queue)
        daemon.attach_metrics(self.metrics)

    def poll_parked(self, node: str, delta: int) -> None:
        self.polls_waiting[node] += delta
        if self.polls_waiting[node] <= 0:
            del self.polls_waiting[node]
        self.metrics.polls_waiting.inc(delta)

    def _became_leader(self) -> None:
        """A standby took the lease: its bootstrap token (if none yet) and the CAs as the store has them
        now (a rotation may have started or finished while it waited); the runtime decides next."""
        bootstrap_token(self.daemon)
        state = read_ca_state(self.daemon)
        if state is not None and self.ssl is not None and state.doc() != self.ca_state.doc():
            self.apply_ca(state)
        self.certs.upgrade(self.ca_state)

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

    # metrics
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
    def health(self) -> tuple[int, dict[str, Any]]:
        """``GET /healthz``'s answer, from any thread (the front loop answers it, ``vmctl.api.front``):
        the store's damage and the leadership as they are now (plain attributes), the policy's ``waiting``
        as the daemon's loop last published it (after every pass and every request it served)."""
        d = self.daemon
        if d.damaged is not None:
            return 503, {"status": "store-damaged", "leader": False}
        leader = d.leader
        doc: dict[str, Any] = {"status": "ok", "leader": leader}
        waiting = self.runtime.waiting if leader else None
        if waiting is not None:
            doc["waiting"] = waiting
        return 200, doc

    async def _on_daemon_loop(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A request handed over by the front loop: the middlewares and the handler, on the daemon's loop."""
        try:
            return await errors_mw(request, lambda r: self._auth_mw(r, handler))
        finally:
            self.runtime.publish_health()

    def make_app(self, front: bool = False) -> web.Application:
        """The app; ``front``: for the front loop (``vmctl.api.front``), where one middleware answers
        ``/healthz`` and hands every other request to the daemon's loop (``_on_daemon_loop``)."""
        self._auth_mw = make_auth_mw(self.config.max_body_bytes)
        if front:
            c0 = ClusterRoutes(self)
            mws: list[Any] = [make_front_mw(asyncio.get_running_loop(), self._on_daemon_loop,
                                            lambda r: errors_mw(r, c0.healthz))]
        else:
            mws = [errors_mw, self._auth_mw]
        app = web.Application(middlewares=mws, client_max_size=self.config.max_body_bytes)
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
        self.runtime.open()
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
        # The connections are served on the front loop, in a thread of its own (vmctl.api.front): /healthz
        # answers there while this loop is busy; every other request is handed to this loop.
        self.runtime.publish_health()
        app = self.make_app(front=True)
        self.front.start()
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                     keepalive_timeout=self.config.keepalive_timeout_s, handler_cancellation=True)
        try:
            await self.front.run(self._runner.setup())
            site = BoundedSite(self._runner, self.config.listen, self.config.port, ssl_context=self.ssl,
                               max_connections=self.config.max_connections,
                               handshake_timeout_s=self.config.handshake_timeout_s)
            self.site = site
            await self.front.run(site.start())
        except OSError as exc:  # taken since the preflight check, or an in-process start
            await self.front.run(self._runner.cleanup())
            self._runner = None
            await asyncio.to_thread(self.front.stop)
            raise statedir.bind_error(self.config, self.config.listen, exc) from exc
        self.port = site.port
        self.runtime.run()
        log.info("vmctld listening on https://%s:%d (leader=%s)", self.config.listen, self.port, d.leader)

    async def stop(self) -> None:
        await self.runtime.halt()
        if self._runner is not None:
            await self.front.run(self._runner.cleanup())
        await asyncio.to_thread(self.front.stop)
        await asyncio.to_thread(self.planner.close)
        self.runtime.close()
