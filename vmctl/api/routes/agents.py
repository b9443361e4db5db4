"""The agents' routes: register, the desired state (long poll), reports and heartbeats, and the
renewal of an agent's own certificate (a CA rotation, an expiry near) over its mTLS connection."""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiohttp import web

from vmctl import auth
from vmctl.api import schemas
from vmctl.api.access import AGENT_CERT
from vmctl.api.documents import node_json
from vmctl.api.plumbing import json_response, node_names, query_float, query_int, read_json
from vmctl.api.routes.base import Routes
from vmctl.daemon.base import NotLeader
from vmctl.errors import Conflict, ValidationError
from vmctl.store.base import WriteBatch
from vmctl.wire import desired_to_json, observed_from_json


class AgentRoutes(Routes):
    async def register(self, request: web.Request) -> web.Response:
        self._leader()
        auth.check_node_name(request.match_info["node"], "node")
        body = schemas.obj(await read_json(request), ("cores", "hostname", "backend", "peers", "checkpoint_peers",
                                                      "speed", "group", "memory_mib", "levels", "discipline"))
        cores = schemas.integer(body, "cores", "", required=True, lo=1, hi=4096)
        hostname = schemas.string(body, "hostname", "", max_len=255, default="") or ""
        backend = schemas.string(body, "backend", "", max_len=64, default="") or ""
        assert cores is not None
        peers, ck_peers = node_names(body, "peers"), node_names(body, "checkpoint_peers")
        speed, group, memory_mib = schemas.node_host(body)
        levels, discipline = schemas.node_levels(body)
        rec = self.d.register_node(request.match_info["node"], cores, hostname, backend, peers, ck_peers,
                                   speed=speed, group=group, memory_mib=memory_mib, levels=levels,
                                   discipline=discipline)
        self.rt.kick()
        return json_response({"node": node_json(self.d, rec)})

    async def desired(self, request: web.Request) -> web.StreamResponse:
        self._leader()
        node = request.match_info["node"]
        self.d.node(node)
        after = query_int(request.query.get("after"), "after", -1, 2**62, -1)
        wait = query_float(request.query.get("wait"), "wait", 0.0, 60.0, 0.0)
        deadline = time.monotonic() + wait
        while True:
            gen = self.d.state.generation.get(node, 0)
            if gen > after:
                return json_response(desired_to_json(self.d.desired(node)))
            left = deadline - time.monotonic()
            if left <= 0:
                return web.Response(status=304)
            ev = self.rt.desired_event(node)
            self.s.poll_parked(node, +1)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ev.wait(), timeout=left)
            finally:
                self.s.poll_parked(node, -1)
            if self.rt.stopping:  # shutting down: answer now instead of holding the shutdown up to `wait`
                return web.Response(status=304)
            if not self.d.leader:
                raise NotLeader(holder=self.d.store.lease().holder or "none")

    async def heartbeat(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("fenced_s",))
        fenced_s = schemas.number(body, "fenced_s", "", lo=0.0, hi=1e10)
        out = self.d.heartbeat(request.match_info["node"], fenced_s)
        if self.d.dirty:
            self.rt.kick()
        # what the agent must do about its credentials: renew its certificate (a CA rotation, an expiry
        # near) and hold the CA bundle with this digest as its ca_file
        entry = AGENT_CERT.get()
        out["renew_cert"] = entry is not None and self.s.certs.needs_renewal(entry[1], self.s.ca_state)
        out["ca_sha256"] = self.s.ca_state.bundle_sha256()
        return json_response(out)

    async def renew_cert(self, request: web.Request) -> web.Response:
        """A new certificate for the agent's own key (a signing request made on the node), signed by the
        current CA: allowed while the certificate it presents needs renewal (``renew_cert`` in its
        heartbeat answer), so that a renewal cannot grow the registry without end."""
        self._leader()
        node = auth.check_node_name(request.match_info["node"], "node")
        body = schemas.obj(await read_json(request), ("csr_pem",))
        csr = schemas.string(body, "csr_pem", "", required=True, max_len=20_000)
        assert csr is not None
        entry = AGENT_CERT.get()
        if entry is None or not self.s.certs.needs_renewal(entry[1], self.s.ca_state):
            raise Conflict(what=f"the certificate of node {node}",
                           problem="it is of the current CA and far from expiry: nothing to renew")
        ca = self.s.ca_state.current
        cert = ca.sign_csr(csr, auth.NODE_CN_PREFIX + node)
        serial = self.s.certs.issued(node, cert, "renewal", ca.fingerprint())
        self.d.events.add(self.d.clock.now(), "cert.renewed",
                          f"node {node} renewed its certificate {entry[0]} -> {serial} (CA {ca.fingerprint()})",
                          node=node)
        self.d.store_write(WriteBatch(events=self.d.events.take()))
        return json_response({"cert_pem": cert, "ca_pem": self.s.ca_state.bundle_pem(), "serial": serial}, 201)

    async def ca_bundle(self, request: web.Request) -> web.Response:
        """The CA bundle an agent must trust (its ``ca_file``): the current CA, and the previous one
        during a rotation."""
        self._leader()
        state = self.s.ca_state
        return json_response({"ca_pem": state.bundle_pem(), "ca_sha256": state.bundle_sha256()})

    async def observed(self, request: web.Request) -> web.Response:
        self._leader()
        node = request.match_info["node"]
        obs = observed_from_json(await read_json(request))
        if obs.node != node:
            raise ValidationError(field="node", problem=f"report names node {obs.node!r} on the route of {node!r}")
        self.d.report(obs)
        if self.d.dirty:
            self.rt.kick()
        return web.Response(status=204)
