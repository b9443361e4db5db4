"""How the operator commands print: JSON for scripts, rich tables (plain text past ``RICH_MAX_ROWS``)
and key-value views for people, and the formatters of the fields the API answers (times, reasons,
placements, nodes, VMs, workers, jobs)."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vmctl import timefmt
from vmctl.timefmt import fmt_duration


def _console() -> Console:
    # Wide enough for the job table when piped; rich picks the terminal width on a TTY.
    return Console(width=None if os.isatty(1) else 140, highlight=False, soft_wrap=False)


def emit_json(doc: Any) -> None:
    click.echo(json.dumps(json_safe(doc), indent=2, sort_keys=True, allow_nan=False))


def json_safe(doc: Any) -> Any:
    """``doc`` as strict JSON can hold it, whatever a daemon stored or sent: a lone surrogate in a string
    or key becomes U+FFFD, a NaN or an infinity null (``json.dumps`` would print ``"\\ud800"`` and
    ``NaN``, which strict parsers refuse)."""
    if isinstance(doc, str):
        return _SURROGATES.sub("\ufffd", doc)
    if isinstance(doc, float):
        return doc if math.isfinite(doc) else None
    if isinstance(doc, Mapping):
        return {json_safe(str(k)): json_safe(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [json_safe(v) for v in doc]
    return doc


_SURROGATES = re.compile("[\ud800-\udfff]")


def safe_text(s: str) -> str:
    """``s`` for a terminal: control and format characters and lone surrogates are shown as escapes
    (``\\x1b``, ``\\ud800``), so a stored name can neither break the output's encoding nor drive the
    terminal."""
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)


def fmt_time(t: Any) -> str:
    """A time in a table: ISO 8601 with the local time zone (``TZ``)."""
    return timefmt.iso(t)


def fmt_when(t: Any) -> str:
    """A time where there is room: ISO 8601 with the zone and how long ago (or ahead) it is."""
    return timefmt.human(t)


def fmt_reason(reason: Any) -> str:
    """A waiting reason with its epoch times (``t=1.79546e+09`` from an older daemon) made readable."""
    return "" if not reason else timefmt.rewrite_times(str(reason), timefmt.human)


def fmt_pct(x: Any) -> str:
    if x is None:
        return "-"
    try:
        return f"{float(x) * 100:.0f}%"
    except (TypeError, ValueError):
        return str(x)


def fmt_cap(cap: Any) -> str:
    return "none" if cap is None else fmt_pct(cap)


def fmt_placement(placement: Any, limit: int = 4) -> str:
    if not placement:
        return "-"
    parts = [f"{p.get('node')}:{p.get('core')}" for p in placement if isinstance(p, dict)]
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f" (+{len(parts) - limit})"
    return ", ".join(parts)


#: Above this many rows tables are printed as plain aligned text: rich needs ~2.5 ms per row, which
#: makes ``vmctl vm list`` on a 100 x 32-core cluster (6400 VMs) take 16 s (bench/metrics_scrape.py).
RICH_MAX_ROWS = 300


@dataclass(frozen=True)
class Grid:
    """A table as data: rendered with rich when small, as plain aligned text when large."""

    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]
    title: str | None = None

    def to_rich(self) -> Table:
        t = Table(title=self.title)
        for col in self.headers:
            t.add_column(col, overflow="fold")
        for row in self.rows:
            t.add_row(*(Text(safe_text(cell)) for cell in row))  # Text: a "[/x]" in a name is no markup
        return t

    def to_text(self) -> str:
        widths = [len(h) for h in self.headers]
        rows = [tuple(safe_text(cell) for cell in row) for row in self.rows]
        for row in rows:
            for i, cell in enumerate(row):
                if len(cell) > widths[i]:
                    widths[i] = len(cell)
        lines = [] if self.title is None else [self.title]
        for row in (self.headers, *rows):
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        return "\n".join(lines)

    def render(self) -> Any:
        return self.to_rich() if len(self.rows) <= RICH_MAX_ROWS else self.to_text()


def fmt_user(j: Mapping[str, Any]) -> str:
    """``alice`` or ``alice (proj7)`` with the account; ``-`` when neither was given."""
    user, account = str(j.get("user") or ""), str(j.get("account") or "")
    if account:
        return f"{user or '-'} ({account})"
    return user or "-"


def fmt_start(j: Mapping[str, Any]) -> str:
    """When a job started, or for the queued job holding the reservation when it will start at the latest
    (``<= 2026-...``, like ``squeue --start``); ``-`` when not known."""
    if j.get("start_time") is not None:
        return fmt_time(j.get("start_time"))
    if j.get("expected_start") is not None:
        return f"<= {fmt_time(j.get('expected_start'))}"
    return "-"


def fmt_blocked(blocked: Any) -> str:
    """The out-of-service nodes that alone keep a queued job waiting: ``n2 (drained), n3 (lost)``."""
    return ", ".join(f"{b.get('node')} ({b.get('state')})" for b in blocked or () if isinstance(b, Mapping))


def fmt_job_reason(j: Mapping[str, Any]) -> str:
    """A job's reason, and when only drained or lost nodes keep it waiting, which ones."""
    reason = fmt_reason(j.get("reason"))
    blocked = fmt_blocked(j.get("blocked_by"))
    if not blocked:
        return reason
    return f"{reason}; waits for nodes {blocked}" if reason else f"waits for nodes {blocked}"


def job_table(jobs: Sequence[Mapping[str, Any]], title: str | None = None) -> Grid:
    return Grid(
        ("ID", "NAME", "USER", "STATE", "TIER", "PROCS", "PRIO", "EST", "SUBMITTED", "START", "PLACEMENT", "MIG",
         "REASON"),
        [(str(j.get("id", "")), str(j.get("name") or "-"), fmt_user(j),
          str(j.get("state", "")) + (" (held)" if j.get("held") else ""),
          str(j.get("tier") or "-"), str(j.get("procs", "")), str(j.get("priority", 0)),
          fmt_duration(j.get("estimate")), fmt_time(j.get("submit_time")), fmt_start(j),
          fmt_placement(j.get("placement")), str(j.get("migrations", 0)), fmt_job_reason(j))
         for j in jobs],
        title,
    )


def fmt_peers(peers: Any, unset: str = "any", limit: int = 4) -> str:
    """A node's migration peers: ``unset`` when its agent did not restrict them (null), "none" for an
    empty list."""
    if peers is None:
        return unset
    if not isinstance(peers, list) or not peers:
        return "none"
    names = [str(p) for p in peers]
    if len(names) > limit:
        return ", ".join(names[:limit]) + f" (+{len(names) - limit})"
    return ", ".join(names)


def fmt_speed(speed: Any) -> str:
    """A node's core speed relative to a standard core: ``1x``, ``2.5x``."""
    return f"{speed:g}x" if isinstance(speed, int | float) and not isinstance(speed, bool) else "-"


def fmt_mem(mib: Any) -> str:
    """A node's memory: ``512M``, ``16G``, ``1.5T``; ``-`` when not known (0 or absent)."""
    if isinstance(mib, bool) or not isinstance(mib, int | float) or mib <= 0:
        return "-"
    for unit, size in (("T", 1 << 20), ("G", 1 << 10)):
        if mib >= size:
            return f"{mib / size:.3g}{unit}"
    return f"{mib:g}M"


def fmt_applied(n: Mapping[str, Any]) -> str:
    """The generation a node's agent applied, with the desired one beside when it is behind:
    ``7``, ``4 (want 9)``; ``- (want 3)`` before its first report."""
    want, got = n.get("generation"), n.get("generation_applied")
    if "generation_applied" not in n:  # a daemon from before the applied generation was served
        return str(want if want is not None else "")
    shown = "-" if got is None else str(got)
    return shown if got == want else f"{shown} (want {want})"


def fmt_report_age(n: Mapping[str, Any]) -> str:
    """Age of the agent's last full report (not of its heartbeat): ``12s ago``, ``never``."""
    if "report_age_s" not in n:
        return "-"
    age = n.get("report_age_s")
    return "never" if age is None else f"{fmt_duration(age)} ago"


def _last_error(n: Mapping[str, Any]) -> str:
    errs = [str(e) for e in n.get("errors") or ()]
    refused = len(n.get("refusals") or ())
    if not errs and not refused:
        return "-"
    text = errs[-1] if errs else ""
    if len(text) > 60:
        text = text[:57] + "..."
    more = [f"+{len(errs) - 1} more"] if len(errs) > 1 else []
    if refused:
        more.append(f"{refused} migration(s) refused")
    return text + (f" ({', '.join(more)})" if more else "") if text else ", ".join(more)


def fmt_node_state(n: Mapping[str, Any]) -> str:
    """``drained (disk swap)`` when an operator gave a reason."""
    st = str(n.get("state", ""))
    return f"{st} ({n['drain_reason']})" if n.get("drain_reason") else st


def fmt_levels(n: Mapping[str, Any]) -> str:
    """A node's VM level layout: ``2 priority`` (fg/bg), ``3 timeslice`` ...; ``-`` from a vmctld that
    does not report it."""
    levels, discipline = n.get("levels"), n.get("discipline")
    if levels is None:
        return "-"
    want = n.get("layout_wanted")  # a re-layout vmctld asked for and the agent has not reported yet
    return f"{levels} {discipline or '?'}" + (f" -> {want.get('levels')} {want.get('discipline')}" if want else "")


def node_table(nodes: Sequence[Mapping[str, Any]]) -> Grid:
    return Grid(
        ("NAME", "STATE", "GROUP", "CORES", "LEVELS", "SPEED", "MEM", "FG BUSY", "BG BUSY", "ORPHANS", "UTIL", "GEN",
         "REPORT", "LAST SEEN", "PEERS", "ERRORS"),
        [(str(n.get("name", "")), fmt_node_state(n), str(n.get("group") or "-"), str(n.get("cores", "")),
          fmt_levels(n), fmt_speed(n.get("speed")), fmt_mem(n.get("memory_mib")), str(n.get("fg_busy", "")),
          str(n.get("bg_busy", "")), str(n.get("orphans", 0)), fmt_pct(n.get("utilization")), fmt_applied(n),
          fmt_report_age(n), fmt_time(n.get("last_seen")), fmt_peers(n.get("peers")), _last_error(n))
         for n in nodes],
    )


def node_text(n: Mapping[str, Any], vms: Sequence[Mapping[str, Any]] | None = None) -> str:
    """``vmctl node show``: one node, with the nodes it can migrate to and its agent's last errors.
    ``vms``: the node's VMs (``vm list --node``), for what a node out of contact last reported."""
    lines = [f"node {n.get('name')}: {fmt_node_state(n)}, {n.get('cores')} cores, "
             f"last seen {fmt_when(n.get('last_seen'))}",
             f"generation: desired {n.get('generation')}, applied by its agent {fmt_applied_only(n)}; last full "
             f"report {fmt_report_age(n)} (agents report every 30 s and heartbeat every 5 s)",
             f"group {n.get('group') or '-'}; core speed {fmt_speed(n.get('speed'))} a standard core; "
             f"memory {fmt_mem(n.get('memory_mib')) if n.get('memory_mib') else 'not known'}",
             f"VM levels per core: {fmt_levels(n)}",
             *node_busy_lines(n, vms),
             "migrates to (live, peers): " + fmt_peers(n.get("peers"), "any node (its agent did not say)", 50),
             "sends checkpoints to: " + fmt_peers(n.get("checkpoint_peers"), "any node (shared storage)", 50)]
    if n.get("cores_pending") is not None:
        lines.append(f"its agent registers {n.get('cores_pending')} cores: refused until an operator confirms "
                     f"(vmctl node cores {n.get('name')} {n.get('cores_pending')})")
    if n.get("cores_confirmed") is not None:
        lines.append(f"an operator confirmed {n.get('cores_confirmed')} cores: applied when its agent registers them")
    refusals = [r for r in n.get("refusals") or () if isinstance(r, Mapping)]
    for r in refusals:
        lines.append(f"refused migration {r.get('migration_id')} of {r.get('vm')} to {r.get('target_node')}: "
                     f"{r.get('reason')}")
    errs = [str(e) for e in n.get("errors") or ()]
    if errs:
        lines.append(f"agent errors (its latest report with errors, at {fmt_when(n.get('errors_time'))}):")
        lines.extend(f"  {e}" for e in errs)
    else:
        lines.append("agent errors: none reported")
    return "\n".join(lines)


def node_busy_lines(n: Mapping[str, Any], vms: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """How busy a node is. A node in contact: its slots held by jobs and the utilization it reports. A
    lost or down node's agent is silent: what it last observed (with the report's age: not live) and,
    beside it, what vmctld holds for it (desired)."""
    orphans = f"; {n.get('orphans')} orphan VM(s) being removed" if n.get("orphans") else ""
    held = f"{n.get('fg_busy')} fg, {n.get('bg_busy')} bg"
    if n.get("state") not in ("lost", "down"):
        return [f"busy: {held}; utilization {fmt_pct(n.get('utilization'))}{orphans}"]
    silent = f"{n.get('state')}: its agent has not been heard from since {fmt_when(n.get('last_seen'))}"
    if n.get("last_report") is None:
        seen = "last observed: nothing (its agent sent no report to this vmctld)"
    else:
        with_job = [v for v in vms or () if isinstance(v.get("observed"), Mapping) and v["observed"].get("job_id")]
        tiers = {t: sum(1 for v in with_job if v.get("role") == t) for t in ("fg", "bg")}
        # the tier is the desired one: known while vmctld still wants the VM (not for a requeued job's)
        split = f" ({tiers['fg']} fg, {tiers['bg']} bg)" if sum(tiers.values()) == len(with_job) else ""
        count = "" if vms is None else f", {len(with_job)} VM(s) running a job{split}"
        seen = (f"last observed (its agent's last report, {fmt_report_age(n)}; not live): utilization "
                f"{fmt_pct(n.get('utilization'))}{count}")
    then = ("its jobs are requeued elsewhere" if n.get("state") == "down" else
            "its jobs keep their slots until it is back, or down (loop.node_down_s): then they are requeued")
    return [silent, seen, f"desired (held for it by vmctld): {held}; {then}{orphans}"]


def fmt_applied_only(n: Mapping[str, Any]) -> str:
    got = n.get("generation_applied")
    if "generation_applied" not in n:
        return "not known"
    if got is None:
        return "none yet (no report to this daemon)"
    behind = n.get("generation")
    return str(got) if got == behind else f"{got} (behind)"


def _observed_vs_desired(v: Mapping[str, Any], key: str, fmt: Callable[[Any], str]) -> str:
    """One field of a VM as its agent reported it, with the desired value beside it where they differ
    (``absent (want running)``); ``not reported`` when its agent has not reported the VM."""
    if "observed" not in v:  # a daemon from before observed state was served
        return fmt(v.get(key))
    o = v.get("observed")
    if not isinstance(o, Mapping):
        seen = "not reported"
    elif key == "core" and o.get("core") is None:
        seen = "-"
    else:
        seen = fmt(o.get(key))
    if v.get("managed") is False or key not in (v.get("differs") or ()):
        return seen
    return f"{seen} (want {fmt(v.get(key))})"


def _fmt_core(c: Any) -> str:
    return "-" if c is None or (isinstance(c, int) and c < 0) else str(c)


def vm_table(vms: Sequence[Mapping[str, Any]]) -> Grid:
    """VMs as their agents report them (desired beside where it differs); idle VMs have no job."""
    return Grid(
        ("NAME", "NODE", "CORE", "ROLE", "WEIGHT", "CAP", "POWER", "JOB", "UTIL"),
        [(str(v.get("name", "")), str(v.get("node", "")), _observed_vs_desired(v, "core", _fmt_core),
          str(v.get("role", "")), _observed_vs_desired(v, "weight", lambda w: "-" if w is None else str(w)),
          _observed_vs_desired(v, "cap", fmt_cap), _observed_vs_desired(v, "power", str),
          str(v.get("job_id") or ("-" if v.get("managed", True) else "- (idle)")),
          fmt_pct(v.get("utilization"))) for v in vms],
    )


def vm_text(v: Mapping[str, Any]) -> str:
    """``vmctl vm show``: what its agent reports and what vmctld wants."""
    o = v.get("observed")
    head = f"vm {v.get('name')} on {v.get('node')}"
    if v.get("orphan"):
        lines = [f"{head}: orphan of job {v.get('job_id') or '-'}: no desired state wants it (its job ended or "
                 f"moved on); its agent is stopping and removing it"]
    elif v.get("managed") is False:
        lines = [f"{head}: not in vmctld's desired state (an idle core VM of the agent's layout, or one being "
                 f"removed); its priority is the layout's"]
    else:
        lines = [f"{head}: job {v.get('job_id') or '-'}, tier {v.get('role')}",
                 f"desired:  power {v.get('power')}, core {_fmt_core(v.get('core'))}, weight {v.get('weight')}, "
                 f"cap {fmt_cap(v.get('cap'))}"]
    if isinstance(o, Mapping):
        w = o.get("weight")
        lines.append(f"observed: power {o.get('power')}, core {_fmt_core(o.get('core'))}, "
                     f"weight {'-' if w is None else w}, cap {fmt_cap(o.get('cap'))}, "
                     f"utilization {fmt_pct(o.get('utilization'))} (reported by {o.get('node')})")
    else:
        lines.append("observed: not reported by its agent (not defined there yet)")
    diff = [str(k) for k in v.get("differs") or ()]
    if diff:
        lines.append("differs in: " + ", ".join(diff) + " (the agent has not applied it yet, or refuses: see "
                     "`vmctl node show`)")
    return "\n".join(lines)


def fmt_workers(workers: Sequence[Any]) -> str:
    """A task bag's workers as ``job show`` prints them: ``n1/0.0 task 3 (0.91/s), n2/0.0 task 4 leaving``."""
    parts = []
    for w in workers:
        if not isinstance(w, Mapping):
            continue
        task = "idle" if w.get("task") is None else f"task {w.get('task')}"
        rate = w.get("throughput")
        parts.append(f"{w.get('id')} {task}" + (f" ({rate:.2f}/s)" if isinstance(rate, int | float) else "")
                     + (" leaving" if w.get("leaving") else ""))
    return ", ".join(parts) or "none"


def fmt_bag_tasks(tasks: Sequence[Any]) -> str:
    """A task bag's tasks in one line: how many ended (and how), run, wait (``-o json`` has each)."""
    ended = [t for t in tasks if isinstance(t, Mapping) and t.get("exit_status") is not None]
    failed = sum(1 for t in ended if t.get("exit_status") != 0)
    running = sum(1 for t in tasks if isinstance(t, Mapping) and t.get("exit_status") is None and t.get("worker"))
    waiting = len(tasks) - len(ended) - running
    return (f"{len(tasks)}: {len(ended) - failed} done, {failed} failed, {running} running, {waiting} waiting "
            f"(each task's worker and times: -o json)")


def kv_table(doc: Mapping[str, Any], keys: Sequence[str] | None = None) -> Table:
    t = Table(show_header=False, box=None)
    t.add_column("key", style="bold")
    t.add_column("value", overflow="fold")
    for k in keys if keys is not None else list(doc):
        v = doc.get(k)
        if k.endswith("_time") or k in ("deadline", "last_seen", "expires"):
            s = fmt_when(v)
        elif k == "reason":
            s = fmt_reason(v) or "-"
        elif k == "placement":
            s = fmt_placement(v, limit=64)
        elif k == "blocked_by":
            s = fmt_blocked(v) or "-"
        elif k in ("cap",):
            s = fmt_cap(v)
        elif k == "utilization":
            s = fmt_pct(v)
        elif k == "workers" and isinstance(v, list):
            s = fmt_workers(v)
        elif k == "tasks" and isinstance(v, list) and doc.get("tasks_left") is not None:  # a task bag
            s = fmt_bag_tasks(v)
        elif isinstance(v, dict | list):
            s = json.dumps(v)
        else:
            s = "-" if v is None else str(v)
        t.add_row(Text(safe_text(k)), Text(safe_text(s)))
    return t


def show(doc: Any, output: str, render: Callable[[], Any]) -> None:
    if output == "json":
        emit_json(doc)
        return
    out = render()
    if isinstance(out, Grid):
        out = out.render()
    if isinstance(out, str):
        click.echo("\n".join(safe_text(line) for line in out.split("\n")))
    else:
        _console().print(out)


def fmt_names(names: Sequence[str], limit: int = 8) -> str:
    if len(names) > limit:
        return ", ".join(names[:limit]) + f" (+{len(names) - limit})"
    return ", ".join(names)


def _now() -> float:
    import time as _time

    return _time.time()
