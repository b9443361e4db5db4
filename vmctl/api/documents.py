"""The JSON documents the API answers: jobs, nodes, VMs (desired beside observed), operations, tokens."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from vmctl.daemon import dispatcher
from vmctl.daemon.core import Daemon
from vmctl.daemon.history import requeues, slot_text
from vmctl.daemon.state import ACTIVE, parse_vm_name
from vmctl.errors import ValidationError
from vmctl.model import JobShape, JobState
from vmctl.nodedoc import PowerState, VmDesired, VmObserved
from vmctl.shapes import job_shape
from vmctl.store.base import EventRecord, JobRecord, NodeRecord, OperationRecord, TokenRecord
from vmctl.timefmt import iso, rewrite_times


def _history_entry(h: Mapping[str, Any]) -> dict[str, Any]:
    """A history entry as the API shows it: time, event, detail, and a task bag's ``running`` entry's
    ``boot`` (its workers' mean start delay) and ``workers`` ([node, delay] each) when it has them (the
    export reads them: ``vmctl.whatif.export``)."""
    out = {"time": h.get("time"), "event": h.get("event"), "detail": h.get("detail")}
    for key in ("boot", "workers"):
        if key in h:
            out[key] = h[key]
    return out


def job_json(r: JobRecord, expected_start: float | None = None,
             blocked_by: Sequence[NodeRecord] = (), times: tuple[float, float] | None = None,
             bag_tasks: bool = True) -> dict[str, Any]:
    """``expected_start``: when the policy's reservation starts this queued job at the latest (only
    the job holding the reservation has one, as with ``squeue --start``); ``blocked_by``: the nodes out
    of service that alone keep this queued job waiting (``Daemon.node_blocker``). ``bag_tasks=False``
    (the job list): a task bag's ``tasks`` are left out (empty; ``tasks_left`` counts them), so a list
    costs O(jobs), not O(tasks), and reads no task row of an archived bag."""
    return {
        "id": r.id, "name": r.name, "state": str(r.state), "procs": int(r.spec["procs"]),
        "estimate": float(r.spec["estimate"]), "priority": int(r.spec.get("priority", 0)),
        "deadline": r.spec.get("deadline"), "user": str(r.spec.get("user", "")),
        "account": str(r.spec.get("account", "")),
        "submit_time": r.submit_time, "start_time": r.start_time,
        "end_time": r.end_time, "tier": r.tier if r.state in ACTIVE else None,
        "placement": [{"node": n, "core": c} for n, c in r.placement],
        "reason": reason_json(r.reason),
        "tasks": [task_json(t) for t in r.tasks] if bag_tasks or r.bag is None else [],
        "migrations": r.migrations, "runs": r.run, "requeues": requeues(r),
        "history": [_history_entry(h) for h in r.history],
        # vcsched virtual-cluster fields: requested needs and the CPU cap currently allocated per VM
        "cpu_need": float(r.spec.get("cpu_need", 1.0)), "mem": float(r.spec.get("mem", 0.0)), "cap": r.cap,
        "expected_start": expected_start if r.state == JobState.QUEUED else None,
        "held": r.held,
        "blocked_by": [{"node": n.name, "state": n.state} for n in blocked_by],
        # moldable / task-bag jobs: the shape as submitted (canonical form, vmctl.shapes; None = rigid)
        "shape": r.spec.get("shape"),
        # why the policy chose that width and place (the moldable policy says; None: no reason given)
        "width_reason": reason_json(r.width_reason),
        # a task bag: the workers it holds (the dispatcher's, with the corrected throughput) and its
        # unfinished tasks; for other jobs: none and None
        "workers": dispatcher.workers_doc(r),
        "tasks_left": dispatcher.tasks_left(r) if r.bag is not None else None,
        # what `vmctl job list` shows per shape: the width (kept after the end), a moldable job's time at
        # it, a task bag's tasks done of all and its work left
        **shape_fields(r),
        # gang jobs (timeslice): the row, its replicas, and of the run's wall time the part its rows were
        # active (``times``, vmctl.daemon.gang.active_share): the run-time limit counts active time only
        **({} if r.level is None else {"gang": {
            "row": r.level, "replicas": list(r.replicas),
            "run_s": None if times is None else times[0], "active_s": None if times is None else times[1]}}),
    }


def shape_fields(r: JobRecord) -> dict[str, Any]:
    """The fields of a job document that read its shape (``vmctl.shapes.job_shape``):

    - ``width``: the processes (moldable width, task-bag workers) placed now; once a moldable or rigid
      job's run ended (or its VMs were checkpointed), the processes of that run (its ``tasks``: one per
      process); None before its first start and while queued again after a requeue;
    - ``width_time``: a moldable job's time at ``width`` by its shape (standard cores), None otherwise;
    - ``tasks_total``, ``tasks_done``, ``work_left``: a task bag's tasks, those that ended (well or not)
      and the work of the others in seconds on a standard core (a running task counted whole); None for
      other jobs. They read the bag's dispatcher state, not its task rows (the job list has none).

    The shape is parsed once per job (``_shape_of``): a job list stays O(jobs + workers)."""
    width = len(r.slots) if r.slots else len(r.tasks) if r.bag is None and r.tasks else None
    out: dict[str, Any] = {"width": width, "width_time": None, "tasks_total": None, "tasks_done": None,
                           "work_left": None}
    if r.spec.get("shape") is None:
        return out
    parsed = _shape_of(r)
    if parsed is None:
        return out
    shape, suffix = parsed
    if shape.kind == "moldable":
        out["width_time"] = shape.time_at(width) if width is not None and shape.allows(width) else None
        return out
    out["width"] = len(r.slots) if r.slots else None  # a bag's workers: only while it holds them
    n = len(shape.tasks)
    bag = r.bag
    if bag is None:  # not started (or requeued without its results): every task is left
        left, work = n, suffix[0]
    else:
        nxt = min(int(bag["next"]), n)
        others = [int(k) for k in (*(k for k in bag["task"] if k is not None), *bag.get("retry", ()))]
        left, work = n - nxt + len(others), suffix[nxt] + sum(shape.tasks[k] for k in others)
    out.update(tasks_total=n, tasks_done=n - left, work_left=float(work))
    return out


#: job id -> (its spec, its shape and a task bag's suffix sums of work): parsed once per job; bounded
_SHAPES: OrderedDict[str, tuple[dict[str, Any], JobShape, list[float]]] = OrderedDict()
_SHAPES_MAX = 20_000
_SHAPES_LOCK = threading.Lock()


def _shape_of(r: JobRecord) -> tuple[JobShape, list[float]] | None:
    """The job's shape (``job_shape``) and, for a task bag, ``suffix[k]``: the work of tasks k.. (so the
    work left costs O(workers)); cached while the record keeps the same spec object. None: no shape
    this reader knows (a document stored by a daemon that read shapes otherwise)."""
    with _SHAPES_LOCK:  # documents may be built on several threads
        hit = _SHAPES.get(r.id)
        if hit is not None and hit[0] is r.spec:
            _SHAPES.move_to_end(r.id)
            return hit[1], hit[2]
    try:
        shape = job_shape(r.spec, f"job {r.id}")
    except ValidationError:
        return None
    if shape is None:
        return None
    suffix = [0.0] * (len(shape.tasks) + 1)
    for k in range(len(shape.tasks) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + shape.tasks[k]
    with _SHAPES_LOCK:
        _SHAPES[r.id] = (r.spec, shape, suffix)
        if len(_SHAPES) > _SHAPES_MAX:
            _SHAPES.popitem(last=False)
    return shape, suffix


def task_json(t: dict[str, Any]) -> dict[str, Any]:
    """One process (rigid job) or task (task bag: also the worker that ran it and when, as the
    dispatcher recorded it) of a job."""
    out = {"index": t["index"], "exit_status": t["exit_status"], "error": t["error"]}
    if "worker" in t:
        out.update(worker=t["worker"], start=t["start"], end=t["end"])
    return out


def expected_starts(d: Daemon) -> dict[str, float]:
    """job id -> the start time the policy's last reservation promises it (the queue head's). Called
    before the job documents are built from the records (a job list, a job): the queued jobs' records
    get the last decision's default reason first (``ClusterState.render_queue_reasons``: a decision
    leaves it unwritten; at most one pass over the queue per decision, here)."""
    d.state.render_queue_reasons()
    dec = d.last_decision
    res = dec.reservation if dec is not None else None
    return {} if res is None else {res.job_id: res.shadow_time}


def reason_json(reason: str | None) -> str | None:
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
            # a different core count its agent registered (refused until confirmed), and one an operator
            # confirmed ahead of the agent (vmctl node cores)
            "cores_pending": n.cores_pending, "cores_confirmed": n.cores_confirmed,
            "last_seen": n.last_seen,
            "speed": n.speed, "group": n.group, "memory_mib": n.memory_mib,
            "levels": n.levels, "discipline": n.discipline,
            # the layout its desired state asks for, where it differs from the one it has (a re-layout pending)
            "layout_wanted": _wanted(d, n.name),
            "generation": d.state.generation.get(n.name, 0), "fg_busy": fg_busy, "bg_busy": bg_busy,
            # VMs its agent reports that no desired state wants, not removed yet (``vmctl vm list``: orphan)
            "orphans": orphan_count(d, n.name),
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


def op_json(o: OperationRecord) -> dict[str, Any]:
    """An operation (``vmctl op show``): what it moves, who asked, how it ended and why."""
    det = o.detail
    moves = [{"index": int(m.get("index", i)), "from": slot_text(m.get("from")), "to": slot_text(m.get("to")),
              "mode": str(m.get("mode", "live"))}
             for i, m in enumerate(det.get("moves") or ()) if isinstance(m, dict)]
    origin, note, stage = det.get("origin"), det.get("note"), det.get("stage")
    return {"id": o.id, "kind": o.kind, "job_id": o.job_id, "state": o.state, "created": o.created,
            "updated": o.updated, "origin": str(origin) if origin is not None else None,
            "note": str(note) if note is not None else None, "stage": str(stage) if stage is not None else None,
            "moves": moves}


#: a token's id in lists: the start of its SHA-256 (the token itself is never stored or shown again)
TOKEN_ID_LEN = 12


def cert_json(serial: str, e: Mapping[str, Any]) -> dict[str, Any]:
    """An agent certificate of the registry (``vmctl cert list``): no key, no PEM."""
    return {"serial": serial, "node": e.get("node"), "issued": e.get("issued"), "expires": e.get("expires"),
            "revoked": e.get("revoked"), "key_from": e.get("key_from"), "ca": e.get("ca"),
            "retired": e.get("retired"), "fingerprint": e.get("fingerprint")}


def token_json(t: TokenRecord) -> dict[str, Any]:
    return {"id": t.hash[:TOKEN_ID_LEN], "name": t.name, "role": t.role, "created": t.created, "expires": t.expires}



def _vm_observed(o: VmObserved | None, node: str) -> dict[str, Any] | None:
    """What the node's agent last reported of one VM (None: it reported no such VM)."""
    if o is None:
        return None
    return {"node": node, "power": o.power.value, "core": o.core, "weight": o.weight, "cap": o.cap,
            "job_id": o.process_job, "utilization": o.utilization, "migration_phase": o.migration_phase,
            **({"stopping": True} if o.stopping else {})}


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
            if o.orphan and o.power is PowerState.ABSENT:
                continue  # its agent removed it in the cycle of that report
            parsed = parse_vm_name(name) if o.orphan else None
            out.append({"name": name, "node": n, "core": -1 if o.core is None else o.core,
                        "role": "orphan" if o.orphan else _idle_role(name),
                        "weight": o.weight, "cap": o.cap, "power": o.power.value,
                        "job_id": o.process_job or (parsed[0] if parsed is not None else None),
                        "utilization": o.utilization, "managed": False, "orphan": o.orphan,
                        "observed": _vm_observed(o, n), "differs": []})
    return out


def orphan_count(d: Daemon, node: str) -> int:
    """VMs the node's agent last reported as orphans (no desired state wants them) and still has."""
    obs = d.state.observed.get(node)
    return sum(1 for v in obs.vms if v.orphan and v.power is not PowerState.ABSENT) if obs is not None else 0


def workers_json(d: Daemon, node: str | None = None) -> list[dict[str, Any]]:
    """Every worker of the cluster (or of one node): one per level of each core, in node, core, level
    order, with its state (``vmctl.model.WORKER_STATES``) and the job that holds it."""
    out: list[dict[str, Any]] = []
    names = [node] if node is not None else sorted(d.state.nodes)
    for n in names:
        rec = d.state.nodes[n]
        obs = d.state.observed.get(n)
        seen = {o.name: o for o in obs.vms} if obs is not None else {}
        held: dict[tuple[int, int], VmDesired] = {}
        for vm in d.state.desired.get(n, ()):
            level = vm.slot_level
            if level is not None and vm.process is not None and vm.core >= 0:
                held[(vm.core, level)] = vm
        for core in range(rec.cores):
            for level in range(rec.levels):
                v = held.get((core, level))
                job = v.process.job_id if v is not None and v.process is not None else None
                if v is not None:
                    o = seen.get(v.name)
                    running = (o is not None and o.power.value == "running" and o.process_job == job
                               and o.process_exit is None)
                    state = "busy" if running else "occupied"
                elif rec.state == "ready":
                    state = "available"
                else:
                    state = "down"
                out.append({"id": f"{n}/{core}.{level}", "node": n, "core": core, "level": level,
                            "speed": rec.speed / rec.levels, "state": state, "job_id": job,
                            "vm": v.name if v is not None else None})
    return out


def event_json(e: EventRecord) -> dict[str, Any]:
    """One event of the log (``vmctl events``); times in its message in ISO 8601 (UTC)."""
    return {"seq": e.seq, "time": e.time, "kind": e.kind, "message": reason_json(e.message), "job_id": e.job_id,
            "node": e.node, "actor": e.actor}


def _wanted(d: Any, name: str) -> dict[str, Any] | None:
    """The layout node ``name``'s desired state asks for when it differs from the one it has, else None."""
    want = d.state.desired_layout.get(name)
    if want is None or want == d.state.node_layout(name):
        return None
    return {"discipline": want.discipline.value, "levels": want.levels}
