"""Cluster routes: health, metrics, nodes (drain, remove), VMs and their priority, the policy, plans (paper 001)."""

from __future__ import annotations

import logging
import math
from typing import Any

from aiohttp import web

from vmctl.api import schemas
from vmctl.api.documents import node_json, vms_json, workers_json
from vmctl.api.planning import PlanBusy
from vmctl.api.plumbing import PRINCIPAL, error_response, json_response, read_body, read_json
from vmctl.api.routes.base import Routes
from vmctl.daemon.gang import matrix_doc
from vmctl.daemon.removal import remove_node
from vmctl.errors import Conflict, NotFound, ValidationError
from vmctl.wire import layout_from_json

log = logging.getLogger("vmctld.api")


def json_params(params: dict[str, Any]) -> dict[str, Any]:
    """Policy parameters as strict JSON: a non-finite number (the gang policies' ``quota`` = inf, unlimited)
    as its text."""
    return {k: str(v) if isinstance(v, float) and not math.isfinite(v) else v for k, v in params.items()}


class ClusterRoutes(Routes):
    async def health(self, request: web.Request) -> web.Response:
        damaged = self.d.damaged_error()
        if damaged is not None:  # an operator's view: what is damaged and how to restore (503)
            raise damaged
        return json_response({"status": "ok", "leader": self.d.leader, "epoch": self.d.epoch})

    async def healthz(self, request: web.Request) -> web.Response:
        """Unauthenticated liveness: the process answers, and whether it leads (a standby is alive too);
        503 ``store-damaged`` once its store was found damaged (it serves nothing and leads nothing);
        ``waiting`` when the leader's policy waits (for nodes in its layout, or a policy switch). Answered
        on the front loop, not the daemon's (``DaemonServer.health``, ``vmctl.api.front``)."""
        status, doc = self.s.health()
        return json_response(doc, status=status)

    async def metrics(self, request: web.Request) -> web.Response:
        body, ctype = self.s.render_metrics()
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = ctype
        return resp

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
        self.rt.kick()
        return json_response({"node": node_json(self.d, rec)})

    async def confirm_cores(self, request: web.Request) -> web.Response:
        """``POST /v1/nodes/<name>/cores`` ``{"cores": N}``: an operator confirms the node's core count
        (an agent's registration with a different count is refused until then)."""
        self._leader()
        body = schemas.obj(await read_json(request), ("cores",))
        cores = schemas.integer(body, "cores", "", required=True, lo=1, hi=4096)
        assert cores is not None
        rec = self.d.confirm_cores(request.match_info["name"], cores)
        self.rt.kick()
        return json_response({"node": node_json(self.d, rec)})

    async def remove_node(self, request: web.Request) -> web.Response:
        self._leader()
        name = request.match_info["name"]
        rec = remove_node(self.d, name)
        log.warning("node %s removed by an operator (was %s)", name, rec.state)
        self.rt.kick()
        return json_response({"node": {"name": rec.name, "state": "removed", "was": rec.state}})

    async def list_vms(self, request: web.Request) -> web.Response:
        self._leader()
        node = request.query.get("node")
        if node is not None:
            self.d.node(node)
        return json_response({"vms": vms_json(self.d, node)})

    async def list_workers(self, request: web.Request) -> web.Response:
        """``GET /v1/workers[?node=N]``: paper 001's workers (one per VM slot) and their states."""
        self._leader()
        node = request.query.get("node")
        if node is not None:
            self.d.node(node)
        return json_response({"workers": workers_json(self.d, node)})

    async def gang(self, request: web.Request) -> web.Response:
        """``GET /v1/gang``: the gang matrix of a timeslice cluster (rows x nodes, the active row, holes)."""
        self._leader()
        return json_response({"gang": matrix_doc(self.d.state, self.d.clock.now())})

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
        self.rt.kick()
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

        d = self.d
        p = d.policy
        levels, discipline = d.state.cluster_levels()
        sw = d.switch_status()
        if sw is not None:
            sw = {**sw, "params": json_params(sw["params"]), "from_params": json_params(sw["from_params"])}
        return {"name": p.name if p else None, "params": json_params(p.reported_params()) if p else {},
                "available": sorted(available_policies()),
                "needs": p.needs.to_json() if p else None,
                "layout": {"discipline": discipline.value, "levels": levels,
                           "set_by": "vmctld" if d.state.cluster_layout is not None else "agents"},
                "waiting": d.policy_waiting(), "switch": sw}

    async def get_policy(self, request: web.Request) -> web.Response:
        self._leader()
        return json_response(self._policy_json())

    async def put_policy(self, request: web.Request) -> web.Response:
        self._leader()
        body = schemas.obj(await read_json(request), ("name", "params", "relayout", "layout"))
        name = schemas.string(body, "name", "", required=True, max_len=100, name=True)
        params = body.get("params")
        if params is None:
            params = {}
        elif not isinstance(params, dict):  # an empty array is no object either
            raise ValidationError(field="params", problem=f"must be an object, got {schemas.type_name(params)}")
        relayout = body.get("relayout", False)
        if not isinstance(relayout, bool):
            raise ValidationError(field="relayout", problem=f"must be a boolean, got {schemas.type_name(relayout)}")
        layout = None if body.get("layout") is None else layout_from_json(body["layout"], "layout.")
        assert name is not None
        if relayout or layout is not None:
            self.d.start_switch(name, params, layout)
        else:
            self.d.set_policy(name, params)
        self.rt.kick()
        return json_response(self._policy_json())

    async def cancel_switch(self, request: web.Request) -> web.Response:
        """``DELETE /v1/policy/switch``: end the switch in progress (the old policy goes on)."""
        self._leader()
        self.d.cancel_switch()
        self.rt.kick()
        return json_response(self._policy_json())

    # paper 001's decision maker, asked without applying anything (sec. II-B-3)
    async def plan(self, request: web.Request) -> web.Response:
        """``POST /v1/plan``: the instance document of ``vmctl plan`` (workers, jobs) plus ``policy``
        and optional ``params``; answers the plan and applies nothing. Every bad field is a 422 naming it.
        Parsed and planned in a worker process, a bounded number per token (``vmctl.api.planning``)."""
        raw = await read_body(request)
        who = request[PRINCIPAL]
        try:
            who_s = f"token {who.name}" if who.kind == "operator" else f"agent {who.name}"
            return json_response(await self.s.planner.run(who_s, raw))
        except PlanBusy as exc:
            resp = error_response(exc)
            resp.headers["Retry-After"] = str(exc.fields["retry_after"])
            return resp
