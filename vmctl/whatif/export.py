"""The cluster's finished jobs as a Standard Workload Format trace plus a side file (``vmctl history export``).

Input: the API's documents only -- ``GET /v1/history`` (finished jobs, job archive included),
``GET /v1/nodes`` and ``GET /v1/policy``. Output: the SWF text and the side file's JSON document
(:data:`vmctl.sim.workloads.swf.SIDE_FORMAT`), which :func:`vmctl.sim.workloads.swf.read_swf` reads back.

Readings chosen (docs/operations.md, "The export format", lists them for operators):

- Records are numbered 1..N in submit order (SWF wants integers; the side file maps each number to
  the vmctl job id). Time 0 of the trace is ``UnixStartTime``, the first submit rounded down to a whole
  second; fields 2-4 are whole seconds (submit, wait = first start - submit, run = end - first start,
  at least 1 for a job that ran); the side file keeps the exact times.
- Field 5 (allocated processors) is the width the job ran at (a moldable job's chosen width), field 8
  (requested) the processes asked for; field 9 the estimate; field 11 the status: done 1, failed and
  killed 0, cancelled 5; a job that never started has wait and run -1 (SWF readers drop it).
- Field 12 is the user's number (1-based index into the side file's ``users``), field 13 the account's
  (``accounts``), field 15 the priority when it is positive (vmctl's own SWF convention,
  ``read_swf(priority_from_queue=True)``); 6, 7, 10, 14, 16, 17 and 18 are unknown to vmctl (-1), and
  the header's ``Note`` says so.
- ``work`` in the side file: the dedicated-core seconds a replay runs the job for -- the
  ``work_seconds`` it was submitted with (what a mock or test process runs) when it ended done or
  killed (a cancelled or failed job ran for its run only), else for a moldable job
  or task bag its shape's time at its requested processors (its forecast is exact: vmctld's mock
  processes run a moldable job's time at the width it started with), else its run (end - first start), which counts
  what slowed it down (a bg tier, a migration, time slices) as work: for such jobs a replay is an upper
  bound of the work. A job with a measured ``boot`` (its first run's start delay: vmctld's decision to
  the agents' first report of every process running) has that much less of its measured run as work:
  the replay runs its boot before its work, not twice.
- ``node_boots`` (header level, present only when known): each node's boot, the median first-run boot of
  the task-bag workers that ran there (vmctld's ``running`` entry lists ``[node, delay]`` per worker):
  a replay under a task-bag policy gives each worker its node's boot instead of its bag's mean.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmctl.apiclient import ApiClient
from vmctl.errors import ValidationError
from vmctl.sim.workloads.swf import SIDE_FORMAT

#: SWF status (field 11) of vmctl's final job states
STATUS = {"done": 1, "failed": 0, "killed": 0, "cancelled": 5}
#: the SWF fields vmctl does not know (1-based), written as -1
UNKNOWN_FIELDS = (6, 7, 10, 14, 16, 17, 18)


@dataclass(frozen=True, slots=True)
class ExportedTrace:
    swf: str
    side: dict[str, Any]
    jobs: int
    #: jobs that never started (cancelled in the queue): in the SWF with run -1, not replayable
    never_started: int


def _num(x: Any, default: float | None = None) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return default
    return float(x)


def _work(j: Mapping[str, Any], procs: int) -> float | None:
    """The dedicated-core seconds a replay runs the job for (module docstring); a shaped job's is its
    shape's time at ``procs`` (the record's width), so its actual work is its forecast (factor 1, as
    vmctld's mock processes run it: ``ClusterState.moldable_work``)."""
    shape = j.get("shape")
    if isinstance(shape, dict):
        from vmctl.shapes import shape_from_json

        s = shape_from_json(shape)
        w = min(max(procs, s.min_width), s.max_width)
        return s.time_at(w)
    ws = _num(j.get("work_seconds"))
    if ws is not None and ws > 0 and j.get("state") in ("done", "killed"):
        return ws
    start, end = _num(j.get("first_start")), _num(j.get("end_time"))
    if start is None or end is None:
        return None
    return max(0.0, end - start)


def boot_delay(j: Mapping[str, Any]) -> float | None:
    """The job's first run's start delay, in seconds: from its ``started`` history entry (vmctld's
    decision) to its ``running`` entry (the first agent report showing every process of the run
    started; ``vmctl.daemon.history.note_running``): a real host's guest boot, a mock host's control-loop
    pass; a task bag's is the entry's ``boot``, its workers' mean delay. None when the history has no
    such pair (a job that never started, one stored before vmctld kept ``running``, or a run stopped
    before its processes all ran)."""
    start: float | None = None
    for h in j.get("history") or ():
        ev = h.get("event") if isinstance(h, Mapping) else None
        t = _num(h.get("time")) if isinstance(h, Mapping) else None
        if ev == "started" and start is None:
            start = t
        elif start is not None and ev in ("started", "requeued"):
            return None
        elif start is not None and ev == "running" and t is not None:
            mean = _num(h.get("boot"))  # a task bag's: its workers' mean delay
            return max(0.0, t - start if mean is None else mean)
    return None


def worker_boots(j: Mapping[str, Any]) -> list[tuple[str, float]]:
    """A task bag's first run's boot per worker, ``(node, delay)``: its ``running`` entry's ``workers``
    (``vmctl.daemon.history.note_running``); empty when the entry has none (a rigid job, or a history
    stored before vmctld kept them)."""
    start = False
    for h in j.get("history") or ():
        ev = h.get("event") if isinstance(h, Mapping) else None
        if ev == "started" and not start:
            start = True
        elif start and ev in ("started", "requeued"):
            return []
        elif start and ev == "running":
            out: list[tuple[str, float]] = []
            for w in h.get("workers") or ():
                d = _num(w[1]) if isinstance(w, list | tuple) and len(w) == 2 and w[0] else None
                if d is not None:
                    out.append((str(w[0]), max(0.0, d)))
            return out
    return []


def node_boots(jobs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each node's boot: the median of the first-run boots of the task-bag workers that ran there
    (:func:`worker_boots`), by node name; nodes without such a worker are not listed."""
    per: dict[str, list[float]] = {}
    for j in jobs:
        if _num(j.get("first_start")) is None or _num(j.get("end_time")) is None:
            continue
        for node, d in worker_boots(j):
            per.setdefault(node, []).append(d)
    return {n: round(statistics.median(v), 3) for n, v in sorted(per.items())}


def _measured_work(j: Mapping[str, Any]) -> bool:
    """The job's ``work`` (:func:`_work`) is its measured run (end - first start), which holds its boot."""
    ws = _num(j.get("work_seconds"))
    return not isinstance(j.get("shape"), dict) and not (ws is not None and ws > 0 and j.get("state") in ("done",
                                                                                                        "killed"))


def cluster_doc(nodes: Sequence[Mapping[str, Any]], policy: Mapping[str, Any]) -> dict[str, Any]:
    """The cluster as the side file and ``vmctl whatif`` describe it: nodes (name, cores, speed, group,
    layout, state), the policy in force and its parameters, the layout."""
    return {
        "nodes": [{"name": str(n.get("name")), "cores": int(n.get("cores") or 0), "speed": float(n.get("speed") or 1.0),
                   "group": str(n.get("group") or "default"), "levels": int(n.get("levels") or 1),
                   "discipline": str(n.get("discipline") or "priority"), "state": str(n.get("state", ""))}
                  for n in sorted(nodes, key=lambda n: str(n.get("name")))],
        "policy": {"name": policy.get("name"), "params": dict(policy.get("params") or {})},
        "layout": policy.get("layout"),
    }


def _ctime(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%a %b %d %H:%M:%S %Z %Y")


def build_trace(jobs: Sequence[Mapping[str, Any]], nodes: Sequence[Mapping[str, Any]], policy: Mapping[str, Any],
                source: str = "", since: float | None = None, until: float | None = None) -> ExportedTrace:
    """The SWF text and side file of the finished jobs ``jobs`` (``GET /v1/history``'s documents) of the
    cluster ``nodes`` under ``policy``. No job: a ``ValidationError`` saying that the range is empty."""
    if not jobs:
        where = "" if since is None and until is None else \
            f" submitted in [{'-inf' if since is None else _iso(since)}, {'now' if until is None else _iso(until)})"
        raise ValidationError(field="--since/--until", problem=f"the cluster has no finished job{where}: nothing to "
                                                               "export (is the range right? vmctl job list)")
    from vmctl import __version__

    ordered = sorted(jobs, key=lambda j: (float(j["submit_time"]), str(j["id"])))
    t0 = math.floor(float(ordered[0]["submit_time"]))
    cluster = cluster_doc(nodes, policy)
    max_procs = sum(n["cores"] for n in cluster["nodes"]) or max(int(j["procs"]) for j in ordered)
    users: dict[str, int] = {}
    accounts: dict[str, int] = {}
    lines: list[str] = []
    side_jobs: dict[str, Any] = {}
    never = 0
    last = float(t0)
    for k, j in enumerate(ordered, start=1):
        submit = float(j["submit_time"])
        start, end = _num(j.get("first_start")), _num(j.get("end_time"))
        procs = int(j["procs"])
        width = int(j.get("width") or 0) or procs
        started = start is not None and end is not None
        wait = round(start - submit) if started and start is not None else -1
        run = max(1, round(end - start)) if started and start is not None and end is not None else -1
        never += not started
        last = max(last, end if end is not None else submit)
        user = users.setdefault(str(j.get("user") or ""), len(users) + 1)
        account = accounts.setdefault(str(j.get("account") or ""), len(accounts) + 1)
        prio = int(j.get("priority") or 0)
        estimate = float(j["estimate"])
        req_time = max(1, round(estimate))
        fields = (k, math.floor(submit - t0), wait, run, width if started else -1, -1, -1, procs, req_time, -1,
                  STATUS.get(str(j["state"]), 0), user, account, -1, prio if prio > 0 else -1, -1, -1, -1)
        lines.append(" ".join(str(f) for f in fields))
        work = _work(j, procs)
        deadline = _num(j.get("deadline"))
        entry: dict[str, Any] = {
            "vmctl_id": str(j["id"]), "name": j.get("name"), "state": j["state"], "archived": bool(j.get("archived")),
            "submit": submit - t0, "start": None if start is None else start - t0,
            "end": None if end is None else end - t0, "work": work, "procs": procs, "width": width,
            "estimate": max(estimate, work or 0.0) if j.get("shape") else estimate,
            "priority": prio, "deadline": None if deadline is None else deadline - t0,
            "shape": j.get("shape"), "user": str(j.get("user") or ""), "account": str(j.get("account") or ""),
            "cpu_need": _num(j.get("cpu_need"), 1.0), "mem": _num(j.get("mem"), 0.0),
            "cpu_usage": j.get("cpu_usage"), "migrations": int(j.get("migrations") or 0),
            "requeues": int(j.get("requeues") or 0),
        }
        boot = boot_delay(j) if started else None
        if boot is not None:  # absent: unknown (docs/operations.md, "The export format")
            entry["boot"] = round(boot, 3)
            if work is not None and _measured_work(j):
                entry["work"] = max(0.0, work - entry["boot"])  # its measured run holds its boot: not twice
        side_jobs[str(k)] = entry
    pol = cluster["policy"]
    params = ", ".join(f"{k}={v}" for k, v in sorted(pol["params"].items()))
    node_text = "; ".join(f"{n['name']} {n['cores']} cores speed {n['speed']:g} group {n['group']} "
                          f"{n['discipline']}/{n['levels']}" for n in cluster["nodes"])
    header = [
        ("Version", "2.2"),
        ("Computer", f"vmctl cluster of {len(cluster['nodes'])} nodes"),
        ("Installation", f"vmctld{f' at {source}' if source else ''}"),
        ("Conversion", f"vmctl {__version__} history export on {_ctime(_dt.datetime.now(_dt.UTC).timestamp())}"),
        ("MaxJobs", str(len(ordered))),
        ("MaxRecords", str(len(ordered))),
        ("Preemption", "Yes"),
        ("UnixStartTime", str(t0)),
        ("TimeZoneString", "UTC"),
        ("StartTime", _ctime(t0)),
        ("EndTime", _ctime(last)),
        ("MaxNodes", str(len(cluster["nodes"]))),
        ("MaxProcs", str(max_procs)),
        ("Note", "Preemption: the policies may suspend, requeue or migrate jobs (vmctl job show lists what happened)"),
        ("Note", f"Scheduler: vmctld, policy {pol['name']}{f' ({params})' if params else ''} in force at export"),
        ("Note", f"Nodes (name, cores, speed, group, layout): {node_text or 'none registered'}"),
        ("Note", "Fields vmctl does not know are -1: " + ", ".join(str(f) for f in UNKNOWN_FIELDS)
         + " (average CPU time, used memory, requested memory, executable, partition, preceding job, think time)"),
        ("Note", "Field 12 is the user's and field 13 the account's number (1-based) in the side file's users "
                 "and accounts; field 15 the priority when positive"),
        ("Note", "Shapes, priority, deadline, exact times and work: side file <this file>.vmctl.json "
                 f"({SIDE_FORMAT}; docs/operations.md)"),
    ]
    text = "\n".join([*(f"; {k}: {v}" for k, v in header), *lines]) + "\n"
    side = {"format": SIDE_FORMAT, "unix_start_time": t0, "since": since, "until": until, "source": source,
            "cluster": cluster, "users": list(users), "accounts": list(accounts), "jobs": side_jobs}
    nb = node_boots(ordered)
    if nb:  # absent: no task bag's worker boots known (the side file reads as before)
        side["node_boots"] = nb
    return ExportedTrace(swf=text, side=side, jobs=len(ordered), never_started=never)


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def side_json(side: Mapping[str, Any]) -> str:
    return json.dumps(side, indent=1, sort_keys=False) + "\n"


def fetch_trace(client: ApiClient, since: float | None, until: float | None) -> ExportedTrace:
    """The finished jobs of ``[since, until)`` as an SWF trace and side file, from the daemon's API."""
    query: dict[str, Any] = {}
    if since is not None:
        query["since"] = f"{since:.6f}"
    if until is not None:
        query["until"] = f"{until:.6f}"
    doc = client.call("GET", "/v1/history", query=query)
    nodes = client.list_nodes()
    policy = client.get_policy()
    if doc.get("truncated"):
        raise ValidationError(field="--since", problem=f"more than {len(doc['jobs'])} finished jobs in the "
                                                              "range: export a shorter range (--since/--until)")
    return build_trace(doc["jobs"], nodes, policy, source=client.url, since=since, until=until)


def write_trace(trace: ExportedTrace, path: Path) -> Path:
    """Write the SWF file (gzip when it ends in ``.gz``) and its side file ``FILE.vmctl.json``; returns
    the side file's path."""
    from vmctl.sim.workloads.swf import side_file_path

    side = side_file_path(path)
    try:
        if path.name.endswith(".gz"):
            with open(path, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0) as gz:
                gz.write(trace.swf.encode("ascii", "replace"))
        else:
            path.write_text(trace.swf, encoding="ascii", errors="replace")
        side.write_text(side_json(trace.side), encoding="utf-8")
    except OSError as exc:
        raise ValidationError(field="--swf", problem=f"cannot write {path}: {exc.strerror or exc}") from None
    return side
