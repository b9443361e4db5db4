"""The daemon's HTTP API v1 on aiohttp (contract: ``vmctl/api/openapi.yaml``).

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
import json
import logging
import re
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from vmctl import auth
from vmctl.api import schemas
from vmctl.api.listener import BoundedSite
from vmctl.daemon import statedir
from vmctl.daemon.core import Daemon, NotLeader
from vmctl.daemon.history import requeues
from vmctl.daemon.lease import LeaseHolder
from vmctl.daemon.removal import remove_node
from vmctl.daemon.state import ACTIVE
from vmctl.errors import (
    Conflict,
    Forbidden,
    LeaseLost,
    NotFound,
    RequestTooLarge,
    Unauthenticated,
    ValidationError,
    VmctlError,
)
from vmctl.model import JobState, VmObserved
from vmctl.store.base import JobRecord, NodeRecord, OperationRecord, TokenRecord, WriteBatch
from vmctl.timefmt import iso, rewrite_times
from vmctl.wire import desired_to_json, observed_from_json

log = logging.getLogger("vmctld.api")
#: one INFO line per change an operator asks for (method, path, token name and role, answer status)
audit = logging.getLogger("vmctld.audit")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
DAEMON: web.AppKey[Daemon] = web.AppKey("daemon", Daemon)
#: the one route answered without credentials: ``{"status": "ok", "leader": bool}`` and nothing else
HEALTHZ = "/healthz"
METRICS: web.AppKey[Any] = web.AppKey("metrics", object)


# ------------------------------------------------------------------------------ JSON forms


def job_json(r: JobRecord, expected_start: float | None = None) -> dict[str, Any]:
    """``expected_start``: when the policy's reservation starts this queued job at the latest (only
    the job holding the reservation has one, as with ``squeue --start``)."""
    return {
        "id": r.id, "name": r.name, "state": r.state, "procs": int(r.spec["procs"]),
        "estimate": float(r.spec["estimate"]), "priority": int(r.spec.get("priority", 0)),
        "deadline": r.spec.get("deadline"), "user": str(r.spec.get("user", "")),
        "account": str(r.spec.get("account", "")),
        "submit_time": r.submit_time, "start_time": r.start_time,
        "end_time": r.end_time, "tier": r.tier if r.state in ACTIVE else None,
        "placement": [{"node": n, "core": c} for n, c in r.placement],
        "reason": _reason(r.reason),
        "tasks": [{"index": t["index"], "exit_status": t["exit_status"], "error": t["error"]} for t in r.tasks],
        "migrations": r.migrations, "runs": r.run, "requeues": requeues(r),
        "history": [{"time": h.get("time"), "event": h.get("event"), "detail": h.get("detail")} for h in r.history],
        # vcsched virtual-cluster fields: requested needs and the CPU cap currently allocated per VM
        "cpu_need": float(r.spec.get("cpu_need", 1.0)), "mem": float(r.spec.get("mem", 0.0)), "cap": r.cap,
        "expected_start": expected_start if r.state == JobState.QUEUED else None,
        # moldable / task-bag jobs: the shape as submitted (canonical form, vmctl.shapes; None = rigid) and
        # the width the policy chose (processes placed; None until it starts)
        "shape": r.spec.get("shape"), "width": len(r.placement) if r.placement else None,
    }


def expected_starts(d: Daemon) -> dict[str, float]:
    """job id -> the start time the policy's last reservation promises it (the queue head's)."""
    dec = d.last_decision
    res = dec.reservation if dec is not None else None
    return {} if res is None else {res.job_id: res.shadow_time}


def _reason(reason: str | None) -> str | None:
    """A reason as the API answers it: epoch times the policy wrote as ``t=<seconds>`` in ISO 8601 (UTC)."""
    return None if reason is None else rewrite_times(reason, lambda t: iso(t, utc=True))


def node_json(d: Daemon, n: NodeRecord) -> dict[str, Any]:
    fg_busy = bg_busy = 0
    for j in d.state.jobs_on(n.name):
        if j.checkpointed:
            continue
        k = sum(1 for node, _c in j.placement if node == n.name)
        if j.tier == "fg":
            fg_busy += k
        else:
            bg_busy += k
    obs = d.state.observed.get(n.name)
    err_time, errs = d.state.agent_errors.get(n.name, (None, ()))
    last_report = d.observed_at.get(n.name)
    return {"name": n.name, "cores": n.cores, "state": n.state, "drain_reason": n.drain_reason,
            "last_seen": n.last_seen,
            "speed": n.speed, "group": n.group, "memory_mib": n.memory_mib,
            "generation": d.state.generation.get(n.name, 0), "fg_busy": fg_busy, "bg_busy": bg_busy,
            # what its agent applied, and when it last sent a full report (heartbeats only move last_seen)
            "generation_applied": obs.generation_applied if obs else None,
            "last_report": last_report,
            "report_age_s": None if last_report is None else max(0.0, (d.clock.now() - last_report) / d.speed),
            "utilization": obs.host_utilization if obs else 0.0,
            # migration reachability as the agent registered it (null: not restricted / shared storage)
            "peers": n.peers, "checkpoint_peers": n.checkpoint_peers,
            # the agent's latest report with errors (it may be older than the latest report)
            "errors": list(errs), "errors_time": err_time,
            "refusals": [{"vm": r.vm, "migration_id": r.migration_id, "target_node": r.target_node,
                          "reason": r.reason} for r in (obs.refusals if obs else ())]}


def _slot(v: Any) -> str:
    """A ``[node, core]`` pair of an operation's move as ``node:core`` (``node`` for an unpinned VM)."""
    if isinstance(v, list | tuple) and len(v) == 2:
        node, core = v
        return str(node) if isinstance(core, int) and core < 0 else f"{node}:{core}"
    return str(v)


def op_json(o: OperationRecord) -> dict[str, Any]:
    """An operation (``vmctl op show``): what it moves, who asked, how it ended and why."""
    det = o.detail
    moves = [{"index": int(m.get("index", i)), "from": _slot(m.get("from")), "to": _slot(m.get("to")),
              "mode": str(m.get("mode", "live"))}
             for i, m in enumerate(det.get("moves") or ()) if isinstance(m, dict)]
    origin, note, stage = det.get("origin"), det.get("note"), det.get("stage")
    return {"id": o.id, "kind": o.kind, "job_id": o.job_id, "state": o.state, "created": o.created,
            "updated": o.updated, "origin": str(origin) if origin is not None else None,
            "note": str(note) if note is not None else None, "stage": str(stage) if stage is not None else None,
            "moves": moves}


#: a token's id in lists: the start of its SHA-256 (the token itself is never stored or shown again)
TOKEN_ID_LEN = 12


def token_json(t: TokenRecord) -> dict[str, Any]:
    return {"id": t.hash[:TOKEN_ID_LEN], "name": t.name, "role": t.role, "created": t.created, "expires": t.expires}


def _node_names(body: dict[str, Any], key: str) -> list[str] | None:
    """An optional list of node names in a request body (null or absent: None)."""
    raw = body.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > 10_000:
        raise ValidationError(field=key, problem="must be an array of at most 10000 node names (or null)")
    return [auth.check_node_name(n, f"{key}[{i}]") for i, n in enumerate(raw)]


def _vm_observed(o: VmObserved | None, node: str) -> dict[str, Any] | None:
    """What the node's agent last reported of one VM (None: it reported no such VM)."""
    if o is None:
        return None
    return {"node": node, "power": o.power.value, "core": o.core, "weight": o.weight, "cap": o.cap,
            "job_id": o.process_job, "utilization": o.utilization, "migration_phase": o.migration_phase}


#: desired field -> observed field compared for ``differs`` (a VM the agent did not report differs in power)
_COMPARED = ("power", "core", "weight", "cap")


def _differs(want: dict[str, Any], seen: dict[str, Any] | None) -> list[str]:
    if seen is None:
        return ["power"]
    out = []
    for k in _COMPARED:
        w, o = want[k], seen[k]
        if k == "core" and (w < 0 or o is None):
            continue  # unpinned (vcsched shared VMs) or the agent does not report pinning
        if k == "weight" and o is None:
            continue  # the backend does not report weights
        if k == "cap" and w is not None and o is not None and abs(w - o) < 1e-6:
            continue
        if w != o:
            out.append(k)
    return out


def _idle_role(name: str) -> str:
    """The slot of a VM the daemon does not manage, from the layout's ``{host}-c{core}-{tier}`` names."""
    for tier in ("fg", "bg"):
        if name.endswith(f"-{tier}"):
            return tier
    return "idle"


def vms_json(d: Daemon, node: str | None) -> list[dict[str, Any]]:
    """The VMs of the cluster (or of one node): every VM of desired state (its desired fields at the top,
    what its agent reported under ``observed``, ``differs`` naming the fields where the two disagree)
    and every VM the agents report that desired state does not hold (``managed: false``: a core's idle
    fg/bg VM of the agent's layout, or a VM vmctld no longer wants), with the reported fields at the top."""
    out: list[dict[str, Any]] = []
    names = [node] if node is not None else sorted(d.state.nodes)
    # a VM is listed once, under the node desired state puts it on: the copy a migration left on its
    # source until that agent's next report is not a VM of its own
    desired_anywhere = {v.name for vms in d.state.desired.values() for v in vms}
    for n in names:
        obs = d.state.observed.get(n)
        seen = {o.name: o for o in obs.vms} if obs is not None else {}
        wanted: set[str] = set()
        for v in d.state.desired.get(n, ()):
            wanted.add(v.name)
            if v.migration is not None and v.migration.target_node != n:
                continue  # the source copy of a migrating VM is listed under its target
            o_node, o = n, seen.get(v.name)
            if o is None and v.migration is not None:  # not arrived yet: as its source reports it
                src = d.state.observed.get(v.migration.source_node)
                o_node = v.migration.source_node
                o = next((x for x in src.vms if x.name == v.name), None) if src is not None else None
            u = d.state.vm_util(v.name)
            doc: dict[str, Any] = {
                "name": v.name, "node": n, "core": v.core, "role": v.role.value, "weight": v.weight,
                "cap": v.cap, "power": v.power.value, "job_id": v.process.job_id if v.process else None,
                "utilization": 0.0 if u is None else u, "managed": True, "observed": _vm_observed(o, o_node)}
            doc["differs"] = _differs(doc, doc["observed"])
            out.append(doc)
        for name in sorted(set(seen) - wanted - desired_anywhere):
            o = seen[name]
            out.append({"name": name, "node": n, "core": -1 if o.core is None else o.core, "role": _idle_role(name),
                        "weight": o.weight, "cap": o.cap, "power": o.power.value, "job_id": o.process_job,
                        "utilization": o.utilization, "managed": False, "observed": _vm_observed(o, n),
                        "differs": []})
    return out


def error_body(exc: VmctlError) -> dict[str, Any]:
    fld = exc.fields.get("field")
    return {"error": {"reference": exc.reference, "message": exc.message,
                      "field": fld if isinstance(fld, str) else None}}


def json_dumps(data: Any) -> bytes:
    """Strict JSON as UTF-8: a NaN or an infinity is an error here (ValueError, a 500 that is logged),
    never ``NaN`` on the wire; a lone surrogate in a stored string (from before requests were
    checked) leaves as U+FFFD."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATES.sub("\ufffd", text).encode("utf-8")


_SURROGATES = re.compile("[\ud800-\udfff]")


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=json_dumps(data), status=status, content_type="application/json", charset="utf-8")


def error_response(exc: VmctlError) -> web.Response:
    return json_response(error_body(exc), exc.http_status)


# ------------------------------------------------------------------------------ middleware


class _HttpError(VmctlError):
    template = "{problem}"

    def __init__(self, status: int, reference: str, problem: str) -> None:
        super().__init__(problem=problem)
        self.http_status = status  # type: ignore[misc]
        self.reference = reference  # type: ignore[misc]


@web.middleware
async def errors_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
    resp = await _errors(request, handler)
    metrics = request.app.get(METRICS)
    if metrics is not None:
        parts = request.path.split("/")
        group = "/".join(parts[:3]) if len(parts) > 2 else request.path
        if group.startswith("/v1/jobs"):
            group = "/v1/jobs"
        metrics.api_request(group if group in _GROUPS else "other", resp.status)
    return resp


_GROUPS = frozenset({"/v1/jobs", "/v1/operations", "/v1/nodes", "/v1/vms", "/v1/policy", "/v1/tokens", "/v1/certs",
                     "/v1/agent", "/v1/health", "/metrics", HEALTHZ})


async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except VmctlError as exc:
        if exc.http_status >= 500:
            log.error("%s %s: %s", request.method, _log_path(request), exc)
        return error_response(exc)
    except web.HTTPRequestEntityTooLarge as exc:
        size = getattr(exc, "actual_size", None) or request.content_length or 0
        return error_response(RequestTooLarge(size=size, limit=getattr(exc, "max_size", request.app._client_max_size)))
    except web.HTTPNotFound:
        return error_response(_HttpError(404, "not-found", f"no route {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(_HttpError(405, "method-not-allowed", f"{request.method} not allowed on {request.path}"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(_HttpError(exc.status, "http-error", exc.reason))
    except Exception:
        log.exception("internal error in %s %s", request.method, _log_path(request))
        return error_response(_HttpError(500, "internal-error", "internal error (see the daemon log)"))


def _log_path(request: web.Request) -> str:
    """The path as sent (still percent-encoded: a decoded %0A would forge a log line), shortened."""
    raw = request.raw_path
    return raw if len(raw) <= 200 else f"{raw[:200]}... ({len(raw)} characters)"


def _authenticate(request: web.Request) -> auth.Principal:
    d = request.app[DAEMON]
    transport = request.transport
    peercert = transport.get_extra_info("peercert") if transport is not None else None
    node = auth.node_from_peercert(peercert)
    if node is not None:
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
    if p.role != "admin":
        raise Forbidden(principal=p.describe(), action=f"{request.method} {path} (needs role admin)")


def make_auth_mw(max_body: int) -> Any:
    @web.middleware
    async def auth_mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == HEALTHZ:  # liveness for load balancers and systemd: no credentials, no data
            return await handler(request)
        who = _authenticate(request)
        _authorize(request, who)
        cl = request.content_length
        if cl is not None and cl > max_body:
            raise RequestTooLarge(size=cl, limit=max_body)
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
            audit.info("%s %s by token %r (%s): %d", request.method, _log_path(request), who.name, who.role, status)

    return auth_mw


async def read_json(request: web.Request) -> Any:
    """The request body as JSON: the one reader of every handler. ``Content-Type`` must be
    ``application/json`` (UTF-8) or the answer is 415; the document is bounded and checked by
    ``schemas.parse_body`` (422 naming the field)."""
    ctype = request.content_type
    charset = (request.charset or "utf-8").lower()
    if ctype != "application/json" or charset not in ("utf-8", "utf8"):
        got = request.headers.get("Content-Type", "")
        raise _HttpError(415, "unsupported-media-type",
                         f"send the body as Content-Type: application/json (UTF-8), got {got[:100]!r}")
    return schemas.parse_body(await request.read())


# ------------------------------------------------------------------------------ handlers


class Api:
    def __init__(self, server: DaemonServer) -> None:
        self.s = server

    @property
    def d(self) -> Daemon:
        return self.s.daemon

    def _leader(self) -> None:
        if not self.d.leader:
            raise NotLeader(holder=self.d.store.lease().holder or "none")

    async def health(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok", "leader": self.d.leader, "epoch": self.d.epoch})

    async def healthz(self, request: web.Request) -> web.Response:
        """Unauthenticated liveness: the process answers, and whether it leads (a standby is alive too)."""
        return json_response({"status": "ok", "leader": self.d.leader})

    async def metrics(self, request: web.Request) -> web.Response:
        body, ctype = self.s.render_metrics()
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = ctype
        return resp

    # jobs
    def _fits_the_cluster(self, specs: list[dict[str, Any]], batch: bool) -> None:
        """A job wider than every core of the cluster (drained and lost nodes counted) would wait forever:
        refused at submission. Not before the first node registered, and not under a policy that places
        capped shared VMs (vcsched: VMs share cores there)."""
        nodes = self.d.state.nodes
        policy = self.d.policy
        if not nodes or (policy is not None and policy.needs.shared_vms):
            return
        total = sum(n.cores for n in nodes.values())
        for i, spec in enumerate(specs):
            if int(spec["procs"]) > total:
                raise ValidationError(field=f"jobs[{i}].procs" if batch else "procs", problem=(
                    f"{spec['procs']} processes need {spec['procs']} cores, and the whole cluster has {total} "
                    f"({len(nodes)} nodes): it could never start"))

    async def submit(self, request: web.Request) -> web.Response:
        self._leader()
        spec = schemas.job_spec(await read_json(request))
        self._fits_the_cluster([spec], batch=False)
        rec = self.d.submit([spec])[0]
        self.s.kick()
        return json_response({"job": job_json(rec)}, 201)

    async def submit_batch(self, request: web.Request) -> web.Response:
        self._leader()
        specs = schemas.job_batch(await read_json(request))
        self._fits_the_cluster(specs, batch=True)
        recs = self.d.submit(specs)
        self.s.kick()
        return json_response({"jobs": [job_json(r) for r in recs]}, 201)

    async def list_jobs(self, request: web.Request) -> web.Response:
        self._leader()
        q = request.query
        state = q.get("state")
        allowed = tuple(s.value for s in JobState)
        if state is not None and state not in allowed:
            raise ValidationError(field="state", problem=f"must be one of {', '.join(allowed)}")
        limit = _query_int(q.get("limit"), "limit", 1, 100000, 1000)
        archived = q.get("archived", "false")
        if archived not in ("true", "false"):
            raise ValidationError(field="archived", problem=f"must be true or false, got {archived!r}")
        if archived == "true":  # jobs pruned from memory by retention (newest first), from the store
            recs = self.d.store.list_archived_jobs(state, limit)
            return json_response({"jobs": [{**job_json(r), "archived": True} for r in recs]})
        order = q.get("order", "oldest")
        if order not in ("oldest", "newest"):
            raise ValidationError(field="order", problem=f"must be oldest or newest, got {order[:40]!r}")
        out = []
        jobs = self.d.state.jobs.values()
        starts = expected_starts(self.d)
        for r in (reversed(jobs) if order == "newest" else jobs):
            if state is None or r.state == state:
                out.append(job_json(r, starts.get(r.id)))
                if len(out) >= limit:
                    break
        return json_response({"jobs": out})

    async def get_job(self, request: web.Request) -> web.Response:
        self._leader()
        jid = request.match_info["id"]
        if jid not in self.d.state.jobs and _job_id_like(jid):
            old = self.d.store.get_archived_job(jid)  # pruned by retention: still answers, from the store
            if old is not None:
                return json_response({"job": {**job_json(old), "archived": True}})
        return json_response({"job": job_json(self.d.job(jid), expected_starts(self.d).get(jid))})

    async def cancel_job(self, request: web.Request) -> web.Response:
        self._leader()
        jid = request.match_info["id"]
        if jid not in self.d.state.jobs and _job_id_like(jid):
            old = self.d.store.get_archived_job(jid)  # an archived job finished long ago: nothing to cancel
            if old is not None:
                return json_response({"job": {**job_json(old), "archived": True}})
        rec = self.d.cancel(jid)
        self.s.kick()
        return json_response({"job": job_json(rec)})

    async def explain(self, request: web.Request) -> web.Response:
        self._leader()
        doc = self.d.explain(request.match_info["id"])
        doc["reason"] = _reason(doc.get("reason"))
        return json_response(doc)

    async def migrate(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("to_node",))
        to = auth.check_node_name(body.get("to_node"), "to_node")
        op = self.d.migrate_job(request.match_info["id"], to)
        self.s.kick()
        return json_response({"operation": {"id": op.id, "kind": op.kind, "state": op.state}}, 202)

    # operations (vmctl migrate prints their id)
    async def list_ops(self, request: web.Request) -> web.Response:
        self._leader()
        q = request.query
        job = q.get("job")
        state = q.get("state")
        limit = _query_int(q.get("limit"), "limit", 1, 100000, 1000)
        ops = sorted(self.d.state.ops.values(), key=lambda o: (o.created, len(o.id), o.id), reverse=True)
        out = [op_json(o) for o in ops if (job is None or o.job_id == job) and (state is None or o.state == state)]
        return json_response({"operations": out[:limit]})

    async def get_op(self, request: web.Request) -> web.Response:
        self._leader()
        oid = request.match_info["id"]
        o = self.d.state.ops.get(oid)
        if o is None:
            raise NotFound(kind="operation", name=oid)
        return json_response({"operation": op_json(o)})

    # nodes and vms
    async def list_nodes(self, request: web.Request) -> web.Response:
        self._leader()
        return json_response({"nodes": [node_json(self.d, n) for _k, n in sorted(self.d.state.nodes.items())]})

    async def drain(self, request: web.Request) -> web.Response:
        self._leader()
        drain = request.path.endswith("/drain")
        reason: str | None = None
        if drain and request.can_read_body:  # optional {"reason": "..."}
            body = schemas.obj(await read_json(request), ("reason",))
            reason = schemas.string(body, "reason", "", max_len=500, name=True)
        rec = self.d.set_node_state(request.match_info["name"], drain, reason)
        self.s.kick()
        return json_response({"node": node_json(self.d, rec)})

    async def remove_node(self, request: web.Request) -> web.Response:
        self._leader()
        name = request.match_info["name"]
        rec = remove_node(self.d, name)
        log.warning("node %s removed by an operator (was %s)", name, rec.state)
        self.s.kick()
        return json_response({"node": {"name": rec.name, "state": "removed", "was": rec.state}})

    async def list_vms(self, request: web.Request) -> web.Response:
        self._leader()
        node = request.query.get("node")
        if node is not None:
            self.d.node(node)
        return json_response({"vms": vms_json(self.d, node)})

    async def get_vm(self, request: web.Request) -> web.Response:
        self._leader()
        name = request.match_info["name"]
        for v in vms_json(self.d, None):
            if v["name"] == name:
                return json_response({"vm": v})
        raise NotFound(kind="vm", name=name)

    async def vm_priority(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("tier", "weight", "cap", "pin"))
        tier = schemas.string(body, "tier", "")
        if tier is not None and tier not in ("fg", "bg"):
            raise ValidationError(field="tier", problem=f"must be fg or bg, got {tier!r}")
        weight = schemas.integer(body, "weight", "", lo=1, hi=10000)
        cap_given = "cap" in body
        cap = schemas.number(body, "cap", "", lo=0.0, lo_open=True, hi=1.0)
        pin = schemas.integer(body, "pin", "", lo=0, hi=4095)
        if tier is None and weight is None and not cap_given and pin is None:
            raise ValidationError(field="body", problem="give at least one of tier, weight, cap, pin")
        name = request.match_info["name"]
        idle = next((v for v in vms_json(self.d, None) if v["name"] == name and not v["managed"]), None)
        if idle is not None:
            raise Conflict(what=f"VM {name} on node {idle['node']}", problem=(
                "no job runs in it (an idle core VM of the agent's layout, or one vmctld no longer wants): "
                "vmctld sets the priority of job VMs only; an idle VM keeps the weight and cap of the "
                "agent's layout (vmctl-agent.yaml)"))
        self.d.set_vm_priority(name, tier, weight, cap, cap_given, pin)
        self.s.kick()
        vms = vms_json(self.d, None)
        for v in vms:
            if v["name"] == name:
                # tier, weight and cap are the job's (all its VMs); a pin moves this VM alone
                job_wide = tier is not None or weight is not None or cap_given
                applied = sorted({x["name"] for x in vms if x["managed"] and x["job_id"] == v["job_id"]}) \
                    if job_wide else [name]
                return json_response({"vm": v, "applied_to": applied})
        raise NotFound(kind="vm", name=name)

    # policy
    def _policy_json(self) -> dict[str, Any]:
        from vmctl.policies.registry import available_policies

        p = self.d.policy
        return {"name": p.name if p else None, "params": dict(p.params) if p else {},
                "available": sorted(available_policies())}

    async def get_policy(self, request: web.Request) -> web.Response:
        self._leader()
        return json_response(self._policy_json())

    async def put_policy(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("name", "params"))
        name = schemas.string(body, "name", "", required=True, max_len=100, name=True)
        params = body.get("params")
        if params is None:
            params = {}
        elif not isinstance(params, dict):  # an empty array is no object either
            raise ValidationError(field="params", problem=f"must be an object, got {schemas.type_name(params)}")
        assert name is not None
        self.d.set_policy(name, params)
        self.s.kick()
        return json_response(self._policy_json())

    # tokens and certs
    async def create_token(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("name", "role", "ttl_s"))
        name = schemas.string(body, "name", "", required=True, max_len=100, name=True)
        role = schemas.string(body, "role", "", required=True)
        if role not in auth.ROLES:
            raise ValidationError(field="role", problem=f"must be one of {', '.join(auth.ROLES)}, got {role!r}")
        ttl = schemas.number(body, "ttl_s", "", lo=1.0, hi=schemas.MAX_SECONDS)
        assert name is not None and role is not None
        token, rec = self.s.add_token(name, role, ttl)
        return json_response({"token": token, "name": rec.name, "role": rec.role, "expires": rec.expires}, 201)

    async def list_tokens(self, request: web.Request) -> web.Response:
        self._leader()
        return json_response({"tokens": [token_json(t) for t in self.d.store.list_tokens()]})

    async def revoke_token(self, request: web.Request) -> web.Response:
        """Revoke by id (the first 12 hex digits of its hash, as listed) or by name when one token has it."""
        self._leader()
        key = request.match_info["id"]
        tokens = self.d.store.list_tokens()
        hit = [t for t in tokens if t.hash[:TOKEN_ID_LEN] == key] or [t for t in tokens if t.name == key]
        if not hit:
            raise NotFound(kind="token", name=key)
        if len(hit) > 1:
            ids = ", ".join(t.hash[:TOKEN_ID_LEN] for t in hit)
            raise Conflict(what=f"token name {key!r}", problem=f"{len(hit)} tokens have it: revoke one by id ({ids})")
        t = hit[0]
        now = time.time()
        admins = [x for x in tokens if x.role == "admin" and (x.expires is None or x.expires > now)]
        if t.role == "admin" and admins == [t]:
            raise Conflict(what=f"token {t.name!r}", problem="it is the last admin token: issue another one first")
        self.d.store.write(self.d.epoch, WriteBatch(delete_tokens=[t.hash]))
        log.info("token %r (%s, id %s) revoked", t.name, t.role, t.hash[:TOKEN_ID_LEN])
        return json_response({"token": token_json(t)})

    async def create_cert(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("node",))
        node = auth.check_node_name(body.get("node"), "node")
        cert, key = self.s.ca.issue(auth.NODE_CN_PREFIX + node)
        return json_response({"cert_pem": cert, "key_pem": key, "ca_pem": self.s.ca.cert_pem}, 201)

    # agents
    async def register(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("cores", "hostname", "backend", "peers", "checkpoint_peers",
                                                      "speed", "group", "memory_mib"))
        cores = schemas.integer(body, "cores", "", required=True, lo=1, hi=4096)
        hostname = schemas.string(body, "hostname", "", max_len=255, default="") or ""
        backend = schemas.string(body, "backend", "", max_len=64, default="") or ""
        assert cores is not None
        peers, ck_peers = _node_names(body, "peers"), _node_names(body, "checkpoint_peers")
        speed, group, memory_mib = schemas.node_host(body)
        rec = self.d.register_node(request.match_info["node"], cores, hostname, backend, peers, ck_peers,
                                   speed=speed, group=group, memory_mib=memory_mib)
        self.s.kick()
        return json_response({"node": node_json(self.d, rec)})

    async def desired(self, request: web.Request) -> web.StreamResponse:
        self._leader()
        node = request.match_info["node"]
        self.d.node(node)
        after = _query_int(request.query.get("after"), "after", -1, 2**62, -1)
        wait = _query_float(request.query.get("wait"), "wait", 0.0, 60.0, 0.0)
        deadline = time.monotonic() + wait
        while True:
            gen = self.d.state.generation.get(node, 0)
            if gen > after:
                return json_response(desired_to_json(self.d.desired(node)))
            left = deadline - time.monotonic()
            if left <= 0:
                return web.Response(status=304)
            ev = self.s.desired_event(node)
            self.s.poll_parked(node, +1)
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(ev.wait(), timeout=left)
            finally:
                self.s.poll_parked(node, -1)
            if self.s.stopping:  # shutting down: answer now instead of holding the shutdown up to `wait`
                return web.Response(status=304)
            if not self.d.leader:
                raise NotLeader(holder=self.d.store.lease().holder or "none")

    async def heartbeat(self, request: web.Request) -> web.Response:
        self._leader()
        schemas.obj(await read_json(request), ())
        out = self.d.heartbeat(request.match_info["node"])
        if self.d.dirty:
            self.s.kick()
        return json_response(out)

    async def observed(self, request: web.Request) -> web.Response:
        self._leader()
        node = request.match_info["node"]
        obs = observed_from_json(await read_json(request))
        if obs.node != node:
            raise ValidationError(field="node", problem=f"report names node {obs.node!r} on the route of {node!r}")
        self.d.report(obs)
        if self.d.dirty:
            self.s.kick()
        return web.Response(status=204)


def _job_id_like(v: str) -> bool:
    """Whether ``v`` can be a job id (the decimal submission number): only those are looked up in the archive."""
    return 0 < len(v) <= 20 and v.isascii() and v.isdigit()


def _query_int(v: str | None, name: str, lo: int, hi: int, default: int) -> int:
    if v is None:
        return default
    try:
        x = int(v)
    except ValueError as exc:
        raise ValidationError(field=name, problem=f"must be an integer, got {v[:40]!r}") from exc
    if not lo <= x <= hi:
        raise ValidationError(field=name, problem=f"must be in {lo}..{hi}, got {x}")
    return x


def _query_float(v: str | None, name: str, lo: float, hi: float, default: float) -> float:
    if v is None:
        return default
    try:
        x = float(v)
    except ValueError as exc:
        raise ValidationError(field=name, problem=f"must be a number, got {v[:40]!r}") from exc
    if not lo <= x <= hi:
        raise ValidationError(field=name, problem=f"must be in [{lo}, {hi}], got {x}")
    return x


# ------------------------------------------------------------------------------ the server


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
        self.ca: auth.ClusterCA
        self.ssl: ssl.SSLContext | None = None
        self.site: BoundedSite | None = None
        self.stopping = False
        daemon.on_desired = self._desired_changed
        # the lease is held on the daemon side; the server reacts to a change of leadership
        self.lease = LeaseHolder(daemon, on_gained=self._became_leader, on_lost=self._wake_all_waiters)
        from vmctl.metrics import DaemonMetrics

        self.metrics = DaemonMetrics(self._snapshot)
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

    def _wake_all_waiters(self) -> None:
        for n in list(self._events):
            self._desired_changed({n})

    def _became_leader(self) -> None:
        """A standby took the lease: its bootstrap token (if none yet) and a decision pass now."""
        self._bootstrap_token()
        self.kick()

    # security material
    def _load_ca(self) -> auth.ClusterCA:
        """The cluster CA from the store, created on the first start only: never over the ``ca.pem``
        or the admin token of an earlier cluster (``statedir.refuse_new_cluster``). ``ca.pem``
        (the certificate only, no key) is written when missing and must match the store's CA."""
        d = self.daemon
        cfg = self.config
        saved = d.store.get_kv("ca")
        pem_path = cfg.ca_pem_path
        if isinstance(saved, dict) and "cert_pem" in saved and "key_pem" in saved:
            ca = auth.load_stored_ca(saved, d.store)
            on_disk = statedir.read_text(pem_path, "state_dir", cfg.path)
            if on_disk is not None and on_disk.strip() != ca.cert_pem.strip():
                raise statedir.StateConflict(problem=(
                    f"{pem_path} is not the CA of the cluster in the store ({d.store.location()}): the store "
                    f"or the state directory belongs to another cluster. Restore the matching backup, or remove "
                    f"{pem_path} deliberately (vmctld writes the store's CA there)"))
        else:
            if not d.leader:
                raise NotLeader(holder=d.store.lease().holder or "none")
            statedir.refuse_new_cluster(cfg, d.store)
            ca = auth.ClusterCA.create()
            d.store.write(d.epoch, WriteBatch(kv={"ca": {"cert_pem": ca.cert_pem, "key_pem": ca.key_pem}}))
            log.info("created the cluster CA (kept in the store)")
            on_disk = None
        fixed = statedir.private_dir(Path(cfg.state_dir), "state_dir", cfg.path)
        if fixed:
            log.warning("%s: made it 0700", fixed)
        if on_disk is None:
            statedir.write_public(pem_path, ca.cert_pem, "state_dir", cfg.path)
        return ca

    def add_token(self, name: str, role: str, ttl: float | None) -> tuple[str, TokenRecord]:
        d = self.daemon
        token = auth.new_token()
        now = time.time()
        rec = TokenRecord(hash=auth.hash_token(token), name=name, role=role, created=now,
                          expires=None if ttl is None else now + ttl)
        d.store.write(d.epoch, WriteBatch(tokens=[rec]))
        return token, rec

    def _bootstrap_token(self) -> None:
        """The first start writes an admin token to ``api.bootstrap_token_file`` (default
        ``<state_dir>/admin.token``, mode 0600); an existing file is never overwritten."""
        d = self.daemon
        cfg = self.config
        p = statedir.token_file(cfg)
        if not d.leader:
            return
        admins = [t for t in d.store.list_tokens() if t.role == "admin"]
        text = statedir.read_text(p, "api.bootstrap_token_file", cfg.path)
        if text is not None:
            token = text.strip()
            if admins or d.store.find_token(auth.hash_token(token)) is not None:
                log.info("the bootstrap admin token is in %s", p)
            elif auth.looks_like_token(token):
                # written by a start that stopped before its store write: the file is the only copy
                rec = TokenRecord(hash=auth.hash_token(token), name="bootstrap-admin", role="admin",
                                  created=time.time(), expires=None)
                d.store.write(d.epoch, WriteBatch(tokens=[rec]))
                log.warning("the store had no admin token: registered the one in %s", p)
            else:
                log.error("%s holds no vmctl token and the store has no admin token: mint one with "
                          "`vmctld token create --config %s --name NAME --role admin`", p, cfg.path)
            return
        if admins:
            log.info("no admin token file at %s (the store has admin tokens); mint another one with "
                     "`vmctld token create --config %s --name NAME --role admin`", p, cfg.path)
            return
        token = auth.new_token()
        statedir.write_secret_file(p, token + "\n", "api.bootstrap_token_file", cfg.path)
        rec = TokenRecord(hash=auth.hash_token(token), name="bootstrap-admin", role="admin", created=time.time(),
                          expires=None)
        try:
            d.store.write(d.epoch, WriteBatch(tokens=[rec]))
        except BaseException:
            p.unlink(missing_ok=True)  # a token the store does not know is no token
            raise
        log.info("wrote the bootstrap admin token to %s", p)

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
                               vms=vms_json(d, None))

    # app
    def make_app(self) -> web.Application:
        app = web.Application(middlewares=[errors_mw, make_auth_mw(self.config.max_body_bytes)],
                              client_max_size=self.config.max_body_bytes)
        app[DAEMON] = self.daemon
        app[METRICS] = self.metrics
        a = Api(self)
        r = app.router
        r.add_get("/v1/health", a.health)
        r.add_get(HEALTHZ, a.healthz)
        r.add_get("/metrics", a.metrics)
        r.add_post("/v1/jobs", a.submit)
        r.add_post("/v1/jobs:batch", a.submit_batch)
        r.add_get("/v1/jobs", a.list_jobs)
        r.add_get("/v1/jobs/{id}", a.get_job)
        r.add_delete("/v1/jobs/{id}", a.cancel_job)
        r.add_get("/v1/jobs/{id}/explain", a.explain)
        r.add_post("/v1/jobs/{id}/migrate", a.migrate)
        r.add_get("/v1/operations", a.list_ops)
        r.add_get("/v1/operations/{id}", a.get_op)
        r.add_get("/v1/nodes", a.list_nodes)
        r.add_delete("/v1/nodes/{name}", a.remove_node)
        r.add_post("/v1/nodes/{name}/drain", a.drain)
        r.add_post("/v1/nodes/{name}/undrain", a.drain)
        r.add_get("/v1/vms", a.list_vms)
        r.add_get("/v1/vms/{name}", a.get_vm)
        r.add_put("/v1/vms/{name}/priority", a.vm_priority)
        r.add_get("/v1/policy", a.get_policy)
        r.add_put("/v1/policy", a.put_policy)
        r.add_post("/v1/tokens", a.create_token)
        r.add_get("/v1/tokens", a.list_tokens)
        r.add_delete("/v1/tokens/{id}", a.revoke_token)
        r.add_post("/v1/certs", a.create_cert)
        r.add_post("/v1/agent/nodes/{node}/register", a.register)
        r.add_get("/v1/agent/nodes/{node}/desired", a.desired)
        r.add_post("/v1/agent/nodes/{node}/observed", a.observed)
        r.add_post("/v1/agent/nodes/{node}/heartbeat", a.heartbeat)
        return app

    async def start(self) -> None:
        d = self.daemon
        d.start()
        self.ca = self._load_ca()
        self._bootstrap_token()
        self.ssl = self.ca.server_context(self.config.server_names, Path(self.config.state_dir))
        # idle and unauthenticated clients are bounded: connections open at once, TLS handshake time,
        # idle keep-alive time (vmctl.api.listener)
        self._runner = web.AppRunner(self.make_app(), access_log=None, handle_signals=False,
                                     keepalive_timeout=self.config.keepalive_timeout_s)
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
