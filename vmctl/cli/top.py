"""``vmctl top``: the policy, the nodes' cores and the running VMs at a glance (``--watch`` to repeat)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import click

from vmctl import timefmt
from vmctl.cli.connect import _client, api_options
from vmctl.cli.render import (
    _now,
    cut_text,
    flow,
    fmt_node_state,
    fmt_reason,
    fmt_start,
    fmt_time,
    fmt_width,
    job_kind,
    screen_width,
    show,
)

#: the mark of a slot whose VM vmctld wants but its host did not report as wanted (``vmctl vm list``: differs)
UNSEEN = "*"


def _cell_job(v: Mapping[str, Any]) -> str:
    """A slot's job as vmctld wants it, marked ``*`` where the host's last report differs (not started
    there yet, another core, paused, or a lost node's VM last seen otherwise)."""
    return str(v.get("job_id")) + (UNSEEN if v.get("differs") else "")


def _node_head_state(n: Mapping[str, Any]) -> str:
    """The node's state; a lost or down node adds its last report's age: its slots are vmctld's, not live."""
    state = fmt_node_state(n)
    if n.get("state") in ("lost", "down"):
        age = n.get("report_age_s")
        state += f", report {timefmt.fmt_duration(age)} old" if isinstance(age, (int, float)) else ", no report"
    return state


def core_rows(nodes: Sequence[Mapping[str, Any]], vms: Sequence[Mapping[str, Any]],
              width: int | None = None) -> list[str]:
    """A line per node: its state and, per core, the job in its fg and its bg slot (``5/12``: job 5 fg,
    job 12 bg; ``-`` a free slot; ``5*``: vmctld wants job 5 there, the host's last report differs); a
    node whose cores do not fit ``width`` goes on over lines indented under its first core."""
    slots: dict[tuple[str, int], dict[str, str]] = {}
    for v in vms:
        if v.get("managed") is False or not v.get("job_id"):
            continue
        core = v.get("core")
        if isinstance(core, int) and core >= 0:
            slots.setdefault((str(v.get("node")), core), {})[str(v.get("role"))] = _cell_job(v)
    name_w = max((len(str(n.get("name", ""))) for n in nodes), default=4)
    lines = []
    for n in nodes:
        name = str(n.get("name", ""))
        cells = []
        for c in range(int(n.get("cores") or 0)):
            s = slots.get((name, c), {})
            cells.append(f"{s.get('fg', '-')}/{s.get('bg', '-')}")
        state = cut_text(_node_head_state(n), 32)
        head = f"{name.ljust(name_w)}  {state:<10} fg {n.get('fg_busy')} bg {n.get('bg_busy')}  "
        lines.extend(flow(head, cells, width))
    return lines


def top_text(policy: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], vms: Sequence[Mapping[str, Any]],
             queued: Sequence[Mapping[str, Any]], recent: Sequence[Mapping[str, Any]], events: int = 10,
             width: int | None = None) -> str:
    """``vmctl top``: nodes and cores with their fg/bg jobs, the queued jobs with their reasons, and the
    latest events of the jobs' histories; laid out for ``width`` (cores over several lines, a queued job's
    reason and an event cut with an ellipsis), None: no limit."""
    running = sum(1 for v in vms if v.get("job_id"))
    lines = [f"vmctl top  {fmt_time(_now())}  policy {policy.get('name')}  "
             f"queued {len(queued)}  VMs with a job {running}",
             "", "NODE / cores as fg-job/bg-job:"]
    lines.extend(core_rows(nodes, vms, width) or ["(no nodes)"])
    if any(v.get("managed") is not False and v.get("job_id") and v.get("differs") for v in vms):
        lines.append(_fit(f"  {UNSEEN}: wanted by vmctld, the host's last report differs "
                          "(vmctl vm list shows both)", width))
    lines += ["", "queued jobs (first in the queue first; their reasons say what they wait for):"]
    for j in queued[:5]:
        start = f", starts {fmt_start(j, short=True)}" if j.get("expected_start") is not None else ""
        reason = fmt_reason(j.get("reason"), short=True)
        lines.append(_fit(f"  {j.get('id')} {j.get('name')} {_needs(j)}{start}: {reason}", width))
    if not queued:
        lines.append("  (empty)")
    hist = sorted(((float(h.get("time") or 0), str(j.get("id")), h) for j in recent for h in j.get("history") or ()
                   if isinstance(h, Mapping)), key=lambda x: x[0])[-events:]
    lines += ["", "recent events:"]
    for t, jid, h in hist:
        detail = f": {fmt_reason(h.get('detail'), short=True)}" if h.get("detail") else ""
        lines.append(_fit(f"  {timefmt.short(t)}  job {jid} {h.get('event')}{detail}", width))
    if not hist:
        lines.append("  (none)")
    return "\n".join(lines)


def _needs(j: Mapping[str, Any]) -> str:
    """What a queued job asks for in its shape's terms: ``procs 4``, ``widths 1,2,4,8``, ``<=4 workers``."""
    kind = job_kind(j)
    if kind == "rigid":
        return f"procs {j.get('procs')}"
    return f"widths {fmt_width(j)}" if kind == "moldable" else fmt_width(j)


def _fit(line: str, width: int | None) -> str:
    return line if width is None else cut_text(line, width)


@click.command()
@click.option("--watch", type=click.FloatRange(min=0.5), default=None, metavar="SECONDS",
              help="Refresh every SECONDS until Ctrl-C (default: print once).")
@api_options
def top(watch: float | None, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """The cluster at a glance: nodes and cores with the job in each fg and bg slot, the queue head and
    its reservation, and the latest events (starts, tier changes, migrations, requeues)."""
    import time as _time

    c = _client(url, token, ca)
    while True:
        policy, nodes, vms = c.get_policy(), c.list_nodes(), c.list_vms()
        queued = c.list_jobs("queued", 1000)
        recent = c.list_jobs(None, 50, order="newest")
        doc = {"policy": policy, "nodes": nodes, "vms": vms, "queued": queued, "recent": recent}
        if watch is not None and output != "json":
            click.clear()
        show(doc, output, functools.partial(top_text, policy, nodes, vms, queued, recent, width=screen_width()))
        if watch is None:
            return
        _time.sleep(watch)
