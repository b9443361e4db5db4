"""Who may call what: the bearer token or the agent's client certificate (``vmctl.auth``), the role
checks, and the audit log line of every change an operator asks for (logger ``vmctld.audit``).
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any

from aiohttp import web

from vmctl import auth
from vmctl.api.plumbing import CERTS, DAEMON, HEALTHZ, PRINCIPAL, Handler, log_path
from vmctl.daemon import events
from vmctl.errors import Forbidden, RequestTooLarge, Unauthenticated, VmctlError

#: one INFO line per change an operator asks for (method, path, token name and role, answer status)
audit = logging.getLogger("vmctld.audit")


#: (serial, registry entry) of the client certificate the request being handled was authenticated
#: with (agents only; set by the middleware for the duration of the request)
AGENT_CERT: contextvars.ContextVar[tuple[str, dict[str, object]] | None] = contextvars.ContextVar(
    "vmctl_agent_cert", default=None)


def _authenticate(request: web.Request) -> auth.Principal:
    d = request.app[DAEMON]
    transport = request.transport
    peercert = transport.get_extra_info("peercert") if transport is not None else None
    node = auth.node_from_peercert(peercert)
    if node is not None:
        # the handshake proved a cluster CA signed it; only a certificate vmctld issued and still
        # accepts is an agent (an allow-list: vmctl.api.security.CertRegistry)
        serial = auth.serial_from_peercert(peercert)
        certs = request.app.get(CERTS)
        if certs is None or serial is None:
            raise Unauthenticated(problem=f"the client certificate of node {node} has no serial")
        sslobj = transport.get_extra_info("ssl_object") if transport is not None else None
        der = sslobj.getpeercert(binary_form=True) if sslobj is not None else None
        not_before = peercert.get("notBefore", "") if isinstance(peercert, dict) else ""
        AGENT_CERT.set((serial, certs.accept(node, serial, der, str(not_before))))
        return auth.Principal("agent", node, "agent")
    header = request.headers.get("Authorization", "")
    if not header:
        raise Unauthenticated(problem="no credentials: send 'Authorization: Bearer <token>' or a client certificate")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated(problem="Authorization header must be 'Bearer <token>'")
    rec = d.store.find_token(auth.hash_token(token.strip()))
    if rec is None:
        raise Unauthenticated(problem="unknown token")
    if rec.expires is not None and rec.expires < time.time():
        raise Unauthenticated(problem=f"token {rec.name!r} expired")
    return auth.Principal("operator", rec.name, rec.role)


def _authorize(request: web.Request, p: auth.Principal) -> None:
    path = request.path
    if path.startswith("/v1/agent/"):
        parts = path.split("/")  # ['', 'v1', 'agent', 'nodes', NAME, ...]
        target = parts[4] if len(parts) > 4 else ""
        if p.kind != "agent":
            raise Forbidden(principal=p.describe(), action=f"call agent route {path}")
        if p.name != target:
            raise Forbidden(principal=p.describe(), action=f"act for node {target!r}")
        return
    if p.kind == "agent":
        raise Forbidden(principal=p.describe(), action=f"{request.method} {path}")
    if request.method in ("GET", "HEAD") and not path.startswith("/v1/tokens"):
        return  # the token list (names, roles) is for admins only
    if request.method == "POST" and path == "/v1/plan":
        return  # a plan changes nothing (paper 001: any framework may ask the decision maker)
    if p.role != "admin":
        raise Forbidden(principal=p.describe(), action=f"{request.method} {path} (needs role admin)")


def make_auth_mw(max_body: int) -> Any:
    @web.middleware
    async def auth_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == HEALTHZ:  # liveness for load balancers and systemd: no credentials, no data
            return await handler(request)
        cert = AGENT_CERT.set(None)
        try:
            who = _authenticate(request)  # sets AGENT_CERT for an agent
            _authorize(request, who)
            request[PRINCIPAL] = who
            cl = request.content_length
            if cl is not None and cl > max_body:
                raise RequestTooLarge(size=cl, limit=max_body)
            # the event log names who caused each event (vmctl.daemon.events.ACTOR, during this request)
            actor = events.ACTOR.set(f"token {who.name}" if who.kind == "operator" else f"agent {who.name}")
            try:
                return await _audited(request, handler, who)
            finally:
                events.ACTOR.reset(actor)
        finally:
            AGENT_CERT.reset(cert)

    return auth_mw


async def _audited(request: web.Request, handler: Handler, who: auth.Principal) -> web.StreamResponse:
    if who.kind != "operator" or request.method in ("GET", "HEAD"):
        return await handler(request)
    # the audit trail: every change an operator asks for, with the token's name, and its outcome
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    except VmctlError as exc:
        status = exc.http_status
        raise
    finally:
        audit.info("%s %s by token %r (%s): %d", request.method, log_path(request), who.name, who.role, status)
