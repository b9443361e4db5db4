"""Job and operation routes: submit, list, show, cancel, explain, migrate, hold, release, requeue, update; the
operations migrate starts."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from vmctl import auth, timefmt
from vmctl.api import schemas
from vmctl.api.documents import expected_starts, job_json, op_json, reason_json
from vmctl.api.plumbing import job_id_like, json_response, query_int, read_json
from vmctl.api.routes.base import Routes
from vmctl.daemon.gang import active_share
from vmctl.errors import NotFound, ValidationError
from vmctl.model import JobState
from vmctl.store.base import JobRecord


class JobRoutes(Routes):
    def _fits_the_cluster(self, specs: list[dict[str, Any]], batch: bool) -> None:
        """A job wider than every core of the cluster (drained and lost nodes counted) would wait forever:
        refused at submission. Not before the first node registered, not under a policy that places
        capped shared VMs (vcsched: VMs share cores there), and not for a task bag (``procs`` is the most
        workers it may hold)."""
        nodes = self.d.state.nodes
        policy = self.d.policy
        if not nodes or (policy is not None and policy.needs.shared_vms):
            return
        total = sum(n.cores for n in nodes.values())
        for i, spec in enumerate(specs):
            if (spec.get("shape") or {}).get("kind") == "task-bag":
                continue  # a task bag runs on any number of workers, from one
            if int(spec["procs"]) > total:
                raise ValidationError(field=f"jobs[{i}].procs" if batch else "procs", problem=(
                    f"{spec['procs']} processes need {spec['procs']} cores, and the whole cluster has {total} "
                    f"({len(nodes)} nodes): it could never start"))

    async def submit(self, request: web.Request) -> web.Response:
        self._leader()
        spec = schemas.job_spec(await read_json(request))
        self._fits_the_cluster([spec], batch=False)
        rec = self.d.submit([spec], batch=False)[0]
        self.rt.kick()
        doc = self._job(rec)  # one job: under ``job`` (as GET /v1/jobs/{id}) and ``jobs`` (as a batch answers)
        return json_response({"job": doc, "jobs": [doc], "warnings": self.d.ignored_fields([spec])}, 201)

    async def submit_batch(self, request: web.Request) -> web.Response:
        """``POST /v1/jobs:batch``: all or nothing. The answer has every job's document, or with ``Prefer:
        return=minimal`` (RFC 7240) only each job's id, name and state (``Preference-Applied`` says so): the
        documents were a third of the server's time per job in a batch of 100 (issue 27)."""
        self._leader()
        specs = schemas.job_batch(await read_json(request))
        self._fits_the_cluster(specs, batch=True)
        recs = self.d.submit(specs)
        self.rt.kick()
        warnings = self.d.ignored_fields(specs)
        if prefers_minimal(request.headers.get("Prefer")):
            resp = json_response({"jobs": [{"id": r.id, "name": r.name, "state": str(r.state)} for r in recs],
                                  "warnings": warnings}, 201)
            resp.headers["Preference-Applied"] = "return=minimal"
            return resp
        blocking = self.d.node_blocker()
        return json_response({"jobs": [job_json(r, None, blocking(r)) for r in recs], "warnings": warnings}, 201)

    async def list_jobs(self, request: web.Request) -> web.Response:
        self._leader()
        q = request.query
        state = q.get("state")
        allowed = tuple(s.value for s in JobState)
        if state is not None and state not in allowed:
            raise ValidationError(field="state", problem=f"must be one of {', '.join(allowed)}")
        limit = query_int(q.get("limit"), "limit", 1, 100000, 1000)
        archived = q.get("archived", "false")
        if archived not in ("true", "false"):
            raise ValidationError(field="archived", problem=f"must be true or false, got {archived!r}")
        if archived == "true":  # jobs pruned from memory by retention (newest first), from the store
            recs = self.d.store.list_archived_jobs(state, limit)
            return json_response({"jobs": [{**job_json(r, bag_tasks=False), "archived": True} for r in recs]})
        order = q.get("order", "oldest")
        if order not in ("oldest", "newest"):
            raise ValidationError(field="order", problem=f"must be oldest or newest, got {order[:40]!r}")
        out = []
        jobs = self.d.state.jobs.values()
        starts = expected_starts(self.d)
        blocking = self.d.node_blocker()
        for r in (reversed(jobs) if order == "newest" else jobs):
            if state is None or r.state == state:
                out.append(job_json(r, starts.get(r.id), blocking(r), bag_tasks=False))
                if len(out) >= limit:
                    break
        return json_response({"jobs": out})

    async def history(self, request: web.Request) -> web.Response:
        """The finished jobs (done, killed, failed, cancelled) submitted in ``[since, until)``, the job
        archive included, oldest submit first (``vmctl history export``; docs/operations.md). Each is
        the job document plus what a replay needs: ``first_start`` (the first run's start, from the
        job's history), ``width`` (the processes of its last run, also once it has ended), ``work_seconds``
        and ``cpu_usage`` as submitted (None when not given)."""
        self._leader()
        q = request.query
        since = _query_time(q.get("since"), "since")
        until = _query_time(q.get("until"), "until")
        if since is not None and until is not None and until <= since:
            raise ValidationError(field="until", problem=f"{until:.3f} is not after since={since:.3f}: an empty range")
        limit = query_int(q.get("limit"), "limit", 1, 1_000_000, 1_000_000)
        finished = (JobState.DONE, JobState.KILLED, JobState.FAILED, JobState.CANCELLED)

        def wanted(r: JobRecord) -> bool:
            return r.state in finished and (since is None or r.submit_time >= since) and \
                (until is None or r.submit_time < until)

        live = [r for r in self.d.state.jobs.values() if wanted(r)]
        seen = {r.id for r in live}
        archive = self.d.store.list_archived_jobs(None, limit)  # the newest ``limit`` archived jobs
        old = [r for r in archive if r.id not in seen and wanted(r)]
        recs = sorted([*((r, False) for r in live), *((r, True) for r in old)],
                      key=lambda x: (x[0].submit_time, len(x[0].id), x[0].id))
        truncated = len(recs) > limit or len(archive) >= limit  # older archived jobs may be left out
        return json_response({"since": since, "until": until, "now": self.d.clock.now(),
                              "truncated": truncated, "jobs": [_history_json(r, a) for r, a in recs[:limit]]})

    async def get_job(self, request: web.Request) -> web.Response:
        self._leader()
        jid = request.match_info["id"]
        if jid not in self.d.state.jobs and job_id_like(jid):
            old = self.d.store.get_archived_job(jid)  # pruned by retention: still answers, from the store
            if old is not None:
                return json_response({"job": {**job_json(old), "archived": True}})
        return json_response({"job": self._job(self.d.job(jid))})

    async def cancel_job(self, request: web.Request) -> web.Response:
        self._leader()
        jid = request.match_info["id"]
        if jid not in self.d.state.jobs and job_id_like(jid):
            old = self.d.store.get_archived_job(jid)  # an archived job finished long ago: nothing to cancel
            if old is not None:
                return json_response({"job": {**job_json(old), "archived": True}})
        rec = self.d.cancel(jid)
        self.rt.kick()
        return json_response({"job": job_json(rec)})

    async def explain(self, request: web.Request) -> web.Response:
        self._leader()
        doc = self.d.explain(request.match_info["id"])
        doc["reason"] = reason_json(doc.get("reason"))
        return json_response(doc)

    async def migrate(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("to_node",))
        to = auth.check_node_name(body.get("to_node"), "to_node")
        op = self.d.migrate_job(request.match_info["id"], to)
        self.rt.kick()
        return json_response({"operation": {"id": op.id, "kind": op.kind, "state": op.state}}, 202)

    # hold, release, requeue, update
    async def _reason_body(self, request: web.Request, allowed: tuple[str, ...]) -> dict[str, Any]:
        """An optional JSON body (absent: no reason)."""
        return schemas.obj(await read_json(request), allowed) if request.can_read_body else {}

    async def hold(self, request: web.Request) -> web.Response:
        self._leader()
        body = await self._reason_body(request, ("reason",))
        reason = schemas.string(body, "reason", "", max_len=500, name=True)
        rec = self.d.hold(request.match_info["id"], reason)
        self.rt.kick()
        return json_response({"job": self._job(rec)})

    async def release(self, request: web.Request) -> web.Response:
        self._leader()
        await self._reason_body(request, ())
        rec = self.d.release(request.match_info["id"])
        self.rt.kick()
        return json_response({"job": self._job(rec)})

    async def requeue(self, request: web.Request) -> web.Response:
        self._leader()
        body = await self._reason_body(request, ("reason", "hold"))
        reason = schemas.string(body, "reason", "", max_len=500, name=True)
        rec = self.d.requeue(request.match_info["id"], reason, hold=schemas.flag(body, "hold"))
        self.rt.kick()
        return json_response({"job": self._job(rec)})

    async def update(self, request: web.Request) -> web.Response:
        self._leader()
        changes = schemas.job_update(await read_json(request))
        rec = self.d.update(request.match_info["id"], changes)
        self.rt.kick()
        return json_response({"job": self._job(rec)})

    def _job(self, rec: JobRecord) -> dict[str, Any]:
        return job_json(rec, expected_starts(self.d).get(rec.id), self.d.node_blocker()(rec),
                        active_share(rec, self.d.state, self.d.clock.now()))

    # operations (vmctl migrate prints their id)
    async def list_ops(self, request: web.Request) -> web.Response:
        self._leader()
        q = request.query
        job = q.get("job")
        state = q.get("state")
        limit = query_int(q.get("limit"), "limit", 1, 100000, 1000)
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


def _query_time(raw: str | None, name: str) -> float | None:
    """A time of the query string: epoch seconds or ISO 8601 (without a zone: UTC); 422 naming it."""
    if raw is None:
        return None
    try:
        return timefmt.parse_time(raw, local=False)
    except ValueError as exc:
        raise ValidationError(field=name, problem=str(exc)) from exc


def _history_json(r: JobRecord, archived: bool) -> dict[str, Any]:
    """A finished job as ``GET /v1/history`` answers it (see ``JobRoutes.history``)."""
    first = next((h.get("time") for h in r.history if h.get("event") == "started"), None)
    usage = r.spec.get("cpu_usage")
    doc = job_json(r, bag_tasks=False)
    if doc["width"] is None and r.bag is None and r.tasks and first is not None:
        doc["width"] = len(r.tasks)  # a finished job's placement is gone; its last run had one task per process
    return {**doc, "archived": archived,
            "first_start": first if first is not None else r.start_time,
            "work_seconds": r.spec.get("work_seconds"),
            "cpu_usage": [float(u) for u in usage] if isinstance(usage, list) else None}


def prefers_minimal(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header (RFC 7240: preferences separated by commas, each ``token[=value]`` with
    optional ``; parameters``, tokens case-insensitive) asks for ``return=minimal``."""
    if not prefer:
        return False
    for pref in prefer.split(","):
        token, _eq, value = pref.split(";", 1)[0].partition("=")
        if token.strip().lower() == "return" and value.strip().strip('"').lower() == "minimal":
            return True
    return False
