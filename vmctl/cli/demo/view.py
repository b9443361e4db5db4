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


#: states that end a job's run: a migration under way is aborted (``job queued``: requeued)
_ENDED = (JobState.DONE, JobState.KILLED, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED)


class EventFeed:
    """The demo's event lines, from what two polls of the job list show changed: a start in the bg tier,
    a promotion in place (bg -> fg on its own cores), a migration (the daemon moves a job to cores of other
    nodes at once and the agents then carry the move out; MEASY's move from bg to fg is one), its end,
    a re-pin to other cores of the same node, a restart (KEASY kills a bg job and starts it again in fg)
    and a job that ended while moving (what the summary counts as an aborted migration)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._nodes: dict[str, str] = {}
        self._tier: dict[str, str] = {}
        self._migs: dict[str, int] = {}
        self._runs: dict[str, int] = {}
        self._moving: set[str] = set()

    def update(self, jobs: list[dict[str, Any]], now: float) -> None:
        for j in jobs:
            jid = str(j["id"])
            say = self._job(j, jid)
            self.lines.extend(f"{now:6.1f}s  job {jid} {s}" for s in say)

    def _job(self, j: dict[str, Any], jid: str) -> list[str]:
        out: list[str] = []
        running = j["state"] == JobState.RUNNING
        nodes = fmt_nodes(j)
        tier = str(j.get("tier") or "")
        migs, runs = int(j.get("migrations") or 0), int(j.get("runs") or 0)
        before, was = self._nodes.get(jid), self._tier.get(jid)
        restarted = runs > self._runs.get(jid, runs)
        if running and restarted and was is not None:
            out.append(f"restarted (run {runs}) in the {tier} tier on {nodes}")
            self._moving.discard(jid)
        elif running and before and nodes not in ("-", before):
            out.append(f"migrating {before} -> {nodes}" + (" (bg -> fg)" if (was, tier) == ("bg", "fg") else ""))
            self._moving.add(jid)
        elif running and (was, tier) == ("bg", "fg"):
            out.append(f"promoted bg -> fg in place on {nodes}")
        elif running and tier == "bg" and was is None:
            out.append(f"started in the bg tier on {nodes}")
        if migs > self._migs.get(jid, 0):
            where = before if nodes == "-" and before else nodes  # a job that also ended: where it last ran
            out.append(f"migration done, on {where}" if jid in self._moving else f"re-pinned to other cores of {where}")
            self._moving.discard(jid)
        if jid in self._moving and j["state"] in _ENDED:
            out.append(f"{j['state']} while moving: its migration is aborted")
            self._moving.discard(jid)
        self._migs[jid] = migs
        self._runs[jid] = runs
        if nodes != "-":
            self._nodes[jid] = nodes
        if running and tier:
            self._tier[jid] = tier
        return out
