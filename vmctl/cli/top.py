"""``vmctl top``: the policy, the nodes' cores and the running VMs at a glance (``--watch`` to repeat)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import click

from vmctl.cli.connect import _client, api_options
from vmctl.cli.render import _now, fmt_node_state, fmt_reason, fmt_start, fmt_time, show


def core_rows(nodes: Sequence[Mapping[str, Any]], vms: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per node: its state and, per core, the job in its fg and its bg slot (``5/12``: job 5
    fg, job 12 bg; ``-`` a free slot)."""
    slots: dict[tuple[str, int], dict[str, str]] = {}
    for v in vms:
        if v.get("managed") is False or not v.get("job_id"):
            continue
        core = v.get("core")
        if isinstance(core, int) and core >= 0:
            slots.setdefault((str(v.get("node")), core), {})[str(v.get("role"))] = str(v.get("job_id"))
    width = max((len(str(n.get("name", ""))) for n in nodes), default=4)
    lines = []
    for n in nodes:
        name = str(n.get("name", ""))
        cells = []
        for c in range(int(n.get("cores") or 0)):
            s = slots.get((name, c), {})
            cells.append(f"{s.get('fg', '-')}/{s.get('bg', '-')}")
        lines.append(f"{name.ljust(width)}  {fmt_node_state(n):<10} fg {n.get('fg_busy')} bg {n.get('bg_busy')}  "
                     + " ".join(cells))
    return lines


def top_text(policy: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], vms: Sequence[Mapping[str, Any]],
             queued: Sequence[Mapping[str, Any]], recent: Sequence[Mapping[str, Any]], events: int = 10) -> str:
    """``vmctl top``: nodes and cores with their fg/bg jobs, the queued jobs with their reasons, and the
    latest events of the jobs' histories."""
    running = sum(1 for v in vms if v.get("job_id"))
    lines = [f"vmctl top  {fmt_time(_now())}  policy {policy.get('name')}  "
             f"queued {len(queued)}  VMs with a job {running}",
             "", "NODE / cores as fg-job/bg-job:"]
    lines.extend(core_rows(nodes, vms) or ["(no nodes)"])
    lines += ["", "queued jobs (first in the queue first; their reasons say what they wait for):"]
    for j in queued[:5]:
        start = f", starts {fmt_start(j)}" if j.get("expected_start") is not None else ""
        lines.append(f"  {j.get('id')} {j.get('name')} procs {j.get('procs')}{start}: {fmt_reason(j.get('reason'))}")
    if not queued:
        lines.append("  (empty)")
    hist = sorted(((float(h.get("time") or 0), str(j.get("id")), h) for j in recent for h in j.get("history") or ()
                   if isinstance(h, Mapping)), key=lambda x: x[0])[-events:]
    lines += ["", "recent events:"]
    for t, jid, h in hist:
        detail = f": {fmt_reason(h.get('detail'))}" if h.get("detail") else ""
        lines.append(f"  {fmt_time(t)}  job {jid} {h.get('event')}{detail}")
    if not hist:
        lines.append("  (none)")
    return "\n".join(lines)


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
        show(doc, output, functools.partial(top_text, policy, nodes, vms, queued, recent))
        if watch is None:
            return
        _time.sleep(watch)
