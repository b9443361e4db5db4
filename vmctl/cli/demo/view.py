"""The demo's live view (rich): nodes with fg/bg occupancy, running jobs with tier and placement,
recent events and where the API and metrics are."""

from __future__ import annotations

from typing import Any

from vmctl.model import JobState


def render(client_state: dict[str, Any], info: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    from vmctl.cli.render import fmt_pct, fmt_placement

    nodes = client_state.get("nodes", [])
    jobs = client_state.get("jobs", [])
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j["state"]] = counts.get(j["state"], 0) + 1
    running = [j for j in jobs if j["state"] == JobState.RUNNING]
    migs = sum(int(j.get("migrations") or 0) for j in jobs)
    n_fg = sum(1 for j in running if j.get("tier") == "fg")
    head = (
        f"[bold]vmctl demo[/] {info['elapsed']:.0f}/{info['duration']:.0f} s   speed {info['speed']:g}x   "
        f"policy {info['policy']}   submitted {info['submitted']}/{info['total']}\n"
        f"queued {counts.get(JobState.QUEUED, 0)}  running {len(running)} "
        f"(fg {n_fg}, bg {len(running) - n_fg})"
        f"  done {counts.get(JobState.DONE, 0)}  killed {counts.get(JobState.KILLED, 0)}"
        f"  failed {counts.get(JobState.FAILED, 0)}"
        f"   migrations {migs}\n"
        f"API {info['url']}   metrics {info['url']}/metrics (token in {info['token_path']})"
        + (f"\nagent metrics: {info['agent_metrics']}" if info.get("agent_metrics") else "")
    )
    nt = Table(title="nodes", expand=False)
    for c in ("node", "state", "cores", "fg busy", "bg busy", "util"):
        nt.add_column(c)
    for n in nodes:
        nt.add_row(str(n["name"]), str(n["state"]), str(n["cores"]), str(n["fg_busy"]), str(n["bg_busy"]),
                   fmt_pct(n.get("utilization")))
    jt = Table(title=f"running jobs ({len(running)})", expand=False)
    for c in ("id", "name", "tier", "procs", "placement", "mig"):
        jt.add_column(c)
    for j in running[:12]:
        jt.add_row(str(j["id"]), str(j.get("name") or ""), str(j.get("tier") or "-"), str(j["procs"]),
                   fmt_placement(j.get("placement")), str(j.get("migrations", 0)))
    events = info.get("events", [])[-5:]
    parts: list[Any] = [Panel(head), nt, jt]
    if events:
        parts.append(Panel("\n".join(events), title="events"))
    return Group(*parts)


def fmt_nodes(job: dict[str, Any]) -> str:
    nodes = sorted({str(p.get("node")) for p in job.get("placement") or [] if isinstance(p, dict)})
    return ",".join(nodes) or "-"
