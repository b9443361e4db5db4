"""Operator commands: ``vmctl vm|job|node|migrate|op|policy|token|cert``.

They talk to the daemon's HTTP API only (``vmctl.apiclient``), never to its store. Every command takes
``--url`` / ``--token`` / ``--ca`` (env ``VMCTL_URL``, ``VMCTL_TOKEN``, ``VMCTL_CA``) and
``--output table|json``: human tables by default (rich), JSON for scripts (the API object itself, so a
script sees the same fields as the API documents). Errors are vmctl errors, printed by
``vmctl.cli.main`` as ``error: <reference>: message`` with the exit code of their class.

Shell completion: ``eval "$(_VMCTL_COMPLETE=bash_source vmctl)"`` (zsh: ``zsh_source``, fish:
``fish_source``); job ids, node names and VM names complete from the daemon when it is reachable.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from vmctl import errors, timefmt
from vmctl.apiclient import ApiClient
from vmctl.auth import write_cert_files
from vmctl.model import JobState
from vmctl.timefmt import fmt_duration

F = TypeVar("F", bound=Callable[..., Any])

JOB_STATES = tuple(s.value for s in JobState)  # queued, running, suspended, done, killed, failed, cancelled


# ----------------------------------------------------------------------------- common options


def api_options(f: F) -> F:
    """``--url``, ``--token``, ``--ca``, ``--output`` on a leaf command (env vars as fallbacks)."""
    f = click.option(
        "--output", "-o", "output", type=click.Choice(["table", "json"]), default="table", show_default=True,
        help="Human table or JSON for scripts.",
    )(f)
    f = click.option("--ca", envvar="VMCTL_CA", default=None, metavar="PEM",
                     help="CA bundle to verify an https:// daemon [env VMCTL_CA].")(f)
    f = click.option("--token", envvar="VMCTL_TOKEN", default=None, metavar="TOKEN",
                     help="Bearer token [env VMCTL_TOKEN].")(f)
    f = click.option("--url", envvar="VMCTL_URL", default=None, metavar="URL",
                     help="Daemon URL, default https://127.0.0.1:8443 [env VMCTL_URL].")(f)
    return f


def _client(url: str | None, token: str | None, ca: str | None) -> ApiClient:
    return ApiClient(url, token, ca=ca)


def _completion_client(ctx: click.Context) -> ApiClient:
    p = ctx.params
    return ApiClient(p.get("url") or os.environ.get("VMCTL_URL"), p.get("token"), ca=p.get("ca"), timeout=2.0)


def _complete(kind: str) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            c = _completion_client(ctx)
            if kind == "job":
                names = [str(j.get("id")) for j in c.list_jobs(limit=200, order="newest")]
            elif kind == "node":
                names = [str(n.get("name")) for n in c.list_nodes()]
            else:
                names = [str(v.get("name")) for v in c.list_vms()]
        except errors.VmctlError:
            return []
        return [CompletionItem(n) for n in names if n.startswith(incomplete)]

    return complete


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


# ----------------------------------------------------------------------------- formatting


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


def node_text(n: Mapping[str, Any]) -> str:
    """``vmctl node show``: one node, with the nodes it can migrate to and its agent's last errors."""
    lines = [f"node {n.get('name')}: {fmt_node_state(n)}, {n.get('cores')} cores, "
             f"last seen {fmt_when(n.get('last_seen'))}",
             f"generation: desired {n.get('generation')}, applied by its agent {fmt_applied_only(n)}; last full "
             f"report {fmt_report_age(n)} (agents report every 30 s and heartbeat every 5 s)",
             f"group {n.get('group') or '-'}; core speed {fmt_speed(n.get('speed'))} a standard core; "
             f"memory {fmt_mem(n.get('memory_mib')) if n.get('memory_mib') else 'not known'}",
             f"VM levels per core: {fmt_levels(n)}",
             f"busy: {n.get('fg_busy')} fg, {n.get('bg_busy')} bg; utilization {fmt_pct(n.get('utilization'))}"
             + (f"; {n.get('orphans')} orphan VM(s) being removed" if n.get("orphans") else ""),
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


# ----------------------------------------------------------------------------- vm


@click.group()
def vm() -> None:
    """Inspect VMs and change their CPU priority (tier, weight, cap, pinning)."""


@vm.command("list")
@click.option("--node", default=None, help="Only VMs of this node.", shell_complete=_complete("node"))
@api_options
def vm_list(node: str | None, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List VMs as their agents report them (desired beside, where it differs): the job VMs and the
    idle VMs of each core's fg and bg slot (with libvirt layouts)."""
    vms = _client(url, token, ca).list_vms(node)
    show({"vms": vms}, output, lambda: vm_table(vms))


@click.group()
def worker() -> None:
    """Paper 001's workers: one per VM slot (a level of a core), and their states."""


def worker_table(workers: Sequence[Mapping[str, Any]]) -> Grid:
    return Grid(("WORKER", "NODE", "CORE", "LEVEL", "SPEED", "STATE", "JOB"),
                [(str(w.get("id", "")), str(w.get("node", "")), str(w.get("core", "")), str(w.get("level", "")),
                  fmt_speed(w.get("speed")), str(w.get("state", "")), str(w.get("job_id") or "-")) for w in workers])


@worker.command("list")
@click.option("--node", default=None, help="Only the workers of this node.", shell_complete=_complete("node"))
@api_options
def worker_list(node: str | None, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List workers: available (free, node ready), occupied (held by a job, no process running there),
    busy (running a job's process) or down (node lost, or drained and the slot free)."""
    workers = _client(url, token, ca).list_workers(node)
    show({"workers": workers}, output, lambda: worker_table(workers))


@vm.command("show")
@click.argument("name", shell_complete=_complete("vm"))
@api_options
def vm_show(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Show one VM."""
    v = _client(url, token, ca).get_vm(name)
    show({"vm": v}, output, lambda: vm_text(v))


@vm.group("priority")
def vm_priority() -> None:
    """CPU priority of a VM."""


def parse_cap(value: str | None) -> tuple[bool, float | None]:
    """``--cap`` is a percentage of one core in (0, 100], or ``none`` to uncap. Returns (given, cap)."""
    if value is None:
        return False, None
    if value.strip().lower() in ("none", "off", "unlimited"):
        return True, None
    try:
        pct = float(value.rstrip("%"))
    except ValueError as exc:
        raise errors.UserError(where="--cap", problem=f"{value!r} is not a percentage or 'none'") from exc
    if not 0 < pct <= 100:
        raise errors.OutOfRange(what="--cap", value=value, allowed="0 < PCT <= 100, or 'none'")
    return True, pct / 100.0


@vm_priority.command("set")
@click.argument("name", shell_complete=_complete("vm"))
@click.option("--tier", type=click.Choice(["fg", "bg"]), default=None,
              help="Move the VM's job (all its VMs) to the fg or bg tier.")
@click.option("--weight", type=click.IntRange(1, 10000), default=None,
              help="CPU weight 1..10000 of every VM of the job.")
@click.option("--cap", "cap", default=None, metavar="PCT",
              help="CPU cap of every VM of the job, in percent of one core, or 'none'.")
@click.option("--pin", type=click.IntRange(min=0), default=None, metavar="CORE",
              help="Move VM NAME alone to this local core of its node.")
@api_options
def vm_priority_set(
    name: str, tier: str | None, weight: int | None, cap: str | None, pin: int | None,
    url: str | None, token: str | None, ca: str | None, output: str,
) -> None:
    """Change the CPU priority of the job VM NAME runs, or pin VM NAME.

    A job's processes share one tier, weight and cap, so --tier, --weight and --cap apply to every VM
    of the job (the output lists them); --pin moves VM NAME alone. Idle core VMs (no job) keep the
    priority of the agent's layout: changing one is a conflict (exit 4)."""
    body = build_priority_body(tier, weight, cap, pin)
    doc = _client(url, token, ca).set_vm_priority_doc(name, body)
    v = doc.get("vm") or {}
    applied = [str(x) for x in doc.get("applied_to") or ()]

    def text() -> str:
        out = vm_text(v)
        if applied:
            out += f"\napplied to {len(applied)} VM(s): {fmt_names(applied)}"
        return out

    show(doc, output, text)


def fmt_names(names: Sequence[str], limit: int = 8) -> str:
    if len(names) > limit:
        return ", ".join(names[:limit]) + f" (+{len(names) - limit})"
    return ", ".join(names)


def build_priority_body(tier: str | None, weight: int | None, cap: str | None, pin: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if tier is not None:
        body["tier"] = tier
    if weight is not None:
        body["weight"] = weight
    given, capv = parse_cap(cap)
    if given:
        body["cap"] = capv
    if pin is not None:
        body["pin"] = pin
    if not body:
        raise errors.UserError(where="vm priority set", problem="give at least one of --tier, --weight, --cap, --pin")
    return body


# ----------------------------------------------------------------------------- job


@click.group()
def job() -> None:
    """Submit, list, inspect, cancel and explain jobs."""


def parse_cpu_usage(value: str | None, procs: int | None) -> list[float] | None:
    if value is None:
        return None
    try:
        usage = [float(x) for x in value.split(",") if x.strip()]
    except ValueError as exc:
        raise errors.UserError(
            where="--cpu-usage", problem=f"{value!r} is not a comma-separated list of numbers"
        ) from exc
    if procs is not None and len(usage) == 1 and procs > 1:
        usage = usage * procs
    for u in usage:
        if not 0 < u <= 1:
            raise errors.OutOfRange(what="--cpu-usage", value=u, allowed="0 < u <= 1")
    if procs is not None and len(usage) != procs:
        raise errors.UserError(where="--cpu-usage", problem=f"{len(usage)} values for {procs} processes")
    return usage


def parse_shape_option(text: str) -> dict[str, Any]:
    """``--shape``: a job shape as JSON (the API's form, docs/workloads.md), or ``@FILE`` holding it
    (JSON or YAML); checked here so that a mistake is named before anything is sent."""
    import yaml

    from vmctl.shapes import shape_from_json, shape_to_json

    where = "--shape"
    if text.startswith("@"):
        where = text[1:]
        try:
            text = Path(where).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.ConfigError(path=where, where="file", problem=f"cannot be read: {exc}") from exc
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.UserError(where=where, problem="not valid JSON/YAML (e.g. '{\"kind\": \"moldable\", "
                                                    "\"table\": {\"2\": 100, \"4\": 60}}')") from exc
    return shape_to_json(shape_from_json(raw, "--shape"))


def build_job_spec(
    *, procs: int | None, estimate: float | None, name: str | None = None, priority: int | None = None,
    deadline: float | None = None, cpu_usage: str | None = None, command: str | None = None,
    work_seconds: float | None = None, cpu_need: float | None = None, mem: float | None = None,
    user: str | None = None, account: str | None = None, shape: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body for the command-line options (only the given optional fields). A
    shaped job (``shape``, from ``--shape``) may leave out procs and estimate (the daemon derives them)."""
    if shape is None and (procs is None or estimate is None):
        raise errors.UserError(where="job submit", problem="--procs and --estimate are required (or --shape, "
                                                           "or --file)")
    if procs is not None and procs < 1:
        raise errors.OutOfRange(what="--procs", value=procs, allowed=">= 1")
    if estimate is not None and not estimate > 0:
        raise errors.OutOfRange(what="--estimate", value=estimate, allowed="> 0 seconds")
    spec: dict[str, Any] = {}
    if procs is not None:
        spec["procs"] = procs
    if estimate is not None:
        spec["estimate"] = estimate
    if shape is not None:
        spec["shape"] = shape
    if name is not None:
        spec["name"] = name
    if priority is not None:
        spec["priority"] = priority
    if deadline is not None:
        spec["deadline"] = deadline
    if user is not None:
        spec["user"] = user
    if account is not None:
        spec["account"] = account
    usage = parse_cpu_usage(cpu_usage, procs)
    if usage is not None:
        spec["cpu_usage"] = usage
    if command is not None:
        spec["command"] = command
    if work_seconds is not None:
        if work_seconds < 0:
            raise errors.OutOfRange(what="--work-seconds", value=work_seconds, allowed=">= 0")
        spec["work_seconds"] = work_seconds
    if cpu_need is not None:
        if not 0 < cpu_need <= 1:
            raise errors.OutOfRange(what="--cpu-need", value=cpu_need, allowed="0 < x <= 1 (fraction of one host core)")
        spec["cpu_need"] = cpu_need
    if mem is not None:
        if not 0 <= mem <= 1:
            raise errors.OutOfRange(what="--mem", value=mem, allowed="0 <= x <= 1 (fraction of one host's memory)")
        spec["mem"] = mem
    return spec


def load_job_file(path: str) -> list[dict[str, Any]]:
    """A job spec file: YAML or JSON holding one spec, a list of specs, or ``{"jobs": [...]}``."""
    import yaml

    if path == "-":
        text = sys.stdin.read()
        path = "<stdin>"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise errors.ConfigError(path=path, where="file", problem="does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.ConfigError(path=path, where="file", problem=f"cannot be read: {exc}") from exc
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "document"
        raise errors.ConfigError(path=path, where=where, problem="not valid YAML/JSON") from exc
    if isinstance(doc, dict) and "jobs" in doc:
        doc = doc["jobs"]
    specs = [doc] if isinstance(doc, dict) else doc
    if not isinstance(specs, list) or not specs:
        raise errors.ConfigError(
            path=path, where="top level", problem="expected a job spec, a list of them or {jobs: [...]}"
        )
    for i, s in enumerate(specs):
        if not isinstance(s, dict):
            problem = f"must be a mapping, got {type(s).__name__}"
            raise errors.ConfigError(path=path, where=f"jobs[{i}]", problem=problem)
        if ("procs" not in s or "estimate" not in s) and "shape" not in s:
            raise errors.ConfigError(path=path, where=f"jobs[{i}]", problem="needs 'procs' and 'estimate' (or a "
                                                                           "'shape')")
    return [dict(s) for s in specs]


@job.command("submit")
@click.option("--procs", "-n", type=int, default=None, help="Number of processes (one core each).")
@click.option("--estimate", "-t", type=float, default=None, help="Run-time estimate in seconds (killed after).")
@click.option("--name", default=None)
@click.option("--priority", type=int, default=None)
@click.option("--deadline", type=float, default=None, help="Deadline, epoch seconds.")
@click.option("--user", default=None, help="The user the job runs for (a printable name).")
@click.option("--account", default=None, help="The account (project) charged, like Slurm's --account.")
@click.option("--cpu-usage", default=None, help="Estimated CPU use per process, e.g. 0.5 or 0.5,0.9.")
@click.option("--command", "command_", default=None, help="Command each process runs in its VM.")
@click.option("--work-seconds", type=float, default=None, help="Mock backend: work per process in seconds.")
@click.option("--cpu-need", type=float, default=None,
              help="vcsched: CPU need per VM, fraction of one host core (0 < x <= 1).")
@click.option("--mem", type=float, default=None, help="vcsched: memory need per VM, fraction of one host (0..1).")
@click.option("--shape", "shape_", default=None, metavar="JSON|@FILE",
              help="A moldable job or a task bag, e.g. '{\"kind\": \"moldable\", \"table\": {\"2\": 100, \"4\": 60}}' "
                   "or '{\"kind\": \"task-bag\", \"tasks\": [10, 10, 10], \"max_workers\": 2}' "
                   "(docs/workloads.md); --procs and --estimate then default from it.")
@click.option("--file", "-f", "file_", default=None, metavar="PATH",
              help="YAML/JSON job spec(s) ('-' for stdin); several are submitted as one batch.")
@api_options
def job_submit(
    procs: int | None, estimate: float | None, name: str | None, priority: int | None, deadline: float | None,
    cpu_usage: str | None, command_: str | None, work_seconds: float | None, cpu_need: float | None,
    mem: float | None, user: str | None, account: str | None, shape_: str | None, file_: str | None,
    url: str | None, token: str | None, ca: str | None, output: str,
) -> None:
    """Submit a job (options) or jobs (--file)."""
    client = _client(url, token, ca)
    if file_ is not None:
        if procs is not None or estimate is not None or shape_ is not None:
            raise errors.UserError(where="job submit",
                                   problem="give either --file or --procs/--estimate/--shape, not both")
        specs = load_job_file(file_)
    else:
        spec = build_job_spec(
            procs=procs, estimate=estimate, name=name, priority=priority, deadline=deadline, cpu_usage=cpu_usage,
            command=command_, work_seconds=work_seconds, cpu_need=cpu_need, mem=mem, user=user, account=account,
            shape=None if shape_ is None else parse_shape_option(shape_),
        )
        specs = [spec]
    jobs, warnings = client.submit(specs)
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    doc: dict[str, Any] = {"jobs": jobs, "warnings": warnings} if warnings else {"jobs": jobs}
    show(doc, output, lambda: job_table(jobs, title="submitted"))


@job.command("list")
@click.option("--state", type=click.Choice(JOB_STATES), default=None)
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="At most this many jobs: the newest ones (--oldest: the oldest ones).")
@click.option("--oldest", is_flag=True, help="With --limit, keep the oldest jobs instead of the newest.")
@api_options
def job_list(
    state: str | None, limit: int | None, oldest: bool, url: str | None, token: str | None, ca: str | None,
    output: str,
) -> None:
    """List jobs in submission order (oldest first); --limit N keeps the newest N."""
    if oldest:
        jobs = _client(url, token, ca).list_jobs(state, limit)
    else:
        jobs = list(reversed(_client(url, token, ca).list_jobs(state, limit, order="newest")))
    title = None
    if limit is not None and len(jobs) >= limit:
        other = "" if oldest else " (--oldest for the oldest)"
        title = f"the {'oldest' if oldest else 'newest'} {limit} jobs{other}"
    show({"jobs": jobs}, output, lambda: job_table(jobs, title=title))


JOB_KEYS = ("id", "name", "user", "account", "state", "tier", "procs", "shape", "width", "width_reason", "estimate",
            "priority", "deadline",
            "submit_time", "start_time", "end_time", "placement", "runs", "requeues", "migrations", "reason", "tasks")


def history_text(history: Any) -> str:
    """A job's history, one line per entry: time, event, detail."""
    entries = [h for h in history or () if isinstance(h, Mapping)]
    if not entries:
        return "history: none recorded"
    lines = ["history:"]
    for h in entries:
        detail = f": {h['detail']}" if h.get("detail") else ""
        lines.append(f"  {fmt_when(h.get('time'))}  {h.get('event')}{fmt_reason(detail)}")
    return "\n".join(lines)


def shape_text(raw: Any) -> str:
    """A job's shape as ``job show`` prints it: ``rigid`` or one line (``vmctl.shapes.shape_summary``);
    a shape this client cannot read is printed as it came."""
    if raw is None:
        return "rigid"
    from vmctl.shapes import shape_from_json, shape_summary

    try:
        return shape_summary(shape_from_json(raw))
    except errors.ValidationError:
        return str(raw)


def gang_text(g: Mapping[str, Any]) -> str:
    """A gang job's row and times: ``row 1 (+ rows 2); run 1 h 20 min, of which active 32 min; the
    limit (estimate) counts active time``."""
    reps = [str(r) for r in g.get("replicas") or []]
    rows = f"row {g.get('row')}" + (f" (+ row{'s' if len(reps) > 1 else ''} {', '.join(reps)})" if reps else "")
    if g.get("run_s") is None:
        return rows
    return (f"{rows}; run {fmt_duration(g['run_s'])}, of which active {fmt_duration(g.get('active_s') or 0)}; "
            "the limit (estimate) counts active time")


@job.command("show")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@api_options
def job_show(job_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Show one job."""
    j = _client(url, token, ca).get_job(job_id)
    keys = [k for k in JOB_KEYS if k in j] + [k for k in j if k not in JOB_KEYS and k != "history"]

    def render() -> Any:
        shown = {**j, "shape": shape_text(j.get("shape"))} if "shape" in j else j
        if isinstance(j.get("gang"), Mapping):
            shown = {**shown, "gang": gang_text(j["gang"])}
        if "history" not in j:
            return kv_table(shown, keys)
        return Group(kv_table(shown, keys), Text(safe_text(history_text(j.get("history")))))

    show({"job": j}, output, render)


def _job_verb(name: str, help_text: str, call: Callable[[ApiClient, str], dict[str, Any]],
              said: Callable[[Mapping[str, Any]], str]) -> None:
    """A ``vmctl job NAME JOB`` command that calls the daemon once and says what became of the job."""

    @job.command(name, help=help_text)
    @click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
    @api_options
    def verb(job_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
        j = call(_client(url, token, ca), job_id)
        show({"job": j}, output, lambda: said(j))


_job_verb("cancel", "Cancel a job (idempotent).", ApiClient.cancel_job,
          lambda j: f"job {j.get('id')}: {j.get('state')}")
_job_verb("release", "Release a held job back to its place in the queue.", ApiClient.release_job,
          lambda j: f"job {j.get('id')}: released")


@job.command("hold")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--reason", default=None, metavar="TEXT", help="Why (shown as the job's reason and in the events).")
@api_options
def job_hold(job_id: str, reason: str | None, url: str | None, token: str | None, ca: str | None,
             output: str) -> None:
    """Hold a queued job: it stays queued but does not start until released (kept across daemon restarts)."""
    j = _client(url, token, ca).hold_job(job_id, reason)
    show({"job": j}, output, lambda: f"job {j.get('id')}: held" + (f" ({reason})" if reason else ""))


@job.command("requeue")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--reason", default=None, metavar="TEXT", help="Why (shown as the job's reason and in the events).")
@click.option("--hold", is_flag=True, help="Hold it as it goes back (it does not start until released).")
@api_options
def job_requeue(job_id: str, reason: str | None, hold: bool, url: str | None, token: str | None, ca: str | None,
                output: str) -> None:
    """Put a running or suspended job back in the queue. Its VMs are removed and its progress is LOST: the
    next start is a new run from the beginning. It keeps its place in the queue (its submit time)."""
    j = _client(url, token, ca).requeue_job(job_id, reason, hold)
    show({"job": j}, output, lambda: f"job {j.get('id')}: requeued{' and held' if hold else ''} "
                                     f"(run {j.get('runs')} ended; its progress is lost, the next run starts over)")


@job.command("update")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--estimate", "-t", type=float, default=None, help="New run-time estimate in seconds.")
@click.option("--priority", type=int, default=None, help="New priority.")
@click.option("--deadline", default=None, metavar="TIME",
              help="New deadline: epoch seconds or ISO 8601 (local zone unless given); 'none' removes it.")
@api_options
def job_update(job_id: str, estimate: float | None, priority: int | None, deadline: str | None, url: str | None,
               token: str | None, ca: str | None, output: str) -> None:
    """Change the estimate, priority or deadline of a queued job (a running job: requeue it first)."""
    changes: dict[str, Any] = {}
    if estimate is not None:
        changes["estimate"] = estimate
    if priority is not None:
        changes["priority"] = priority
    if deadline is not None:
        try:
            changes["deadline"] = None if deadline.strip().lower() == "none" else timefmt.parse_time(deadline)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--deadline") from exc
    if not changes:
        raise errors.UserError(where="job update", problem="give at least one of --estimate, --priority, --deadline")
    j = _client(url, token, ca).update_job(job_id, changes)
    show({"job": j}, output, lambda: kv_table(j, ["id", "name", "state", "estimate", "priority", "deadline",
                                                   "reason"]))


def explain_text(doc: Mapping[str, Any]) -> str:
    """A sentence or three on why a job waits."""
    job_id = doc.get("job_id")
    state = doc.get("state")
    lines = [f"job {job_id} is {state}"]
    pos = doc.get("queue_position")
    if isinstance(pos, int) and not isinstance(pos, bool):  # the API counts from 0 (the head)
        ahead = "the head of the queue" if pos == 0 else f"{pos} job(s) ahead"
        lines[0] += f", position {pos + 1} in the queue ({ahead})"
    if doc.get("reason"):
        lines.append(f"reason: {fmt_reason(doc['reason'])}")
    if doc.get("held"):
        lines.append(f"held: it does not start until released (vmctl job release {job_id})")
    blocked = fmt_blocked(doc.get("blocked_by"))
    if blocked:
        lines.append(f"nodes: only {blocked} keep it waiting: the ready nodes have too few cores for it; it can "
                     f"start once enough of them are back (vmctl node undrain, or their agents report again)")
    res = doc.get("reservation")
    if isinstance(res, dict) and res:
        holder = res.get("job_id")
        who = "this job holds" if str(holder) == str(job_id) else f"job {holder} holds"
        lines.append(
            f"reservation: {who} the reservation; it starts at the latest at {fmt_when(res.get('shadow_time'))} "
            f"(shadow time); {res.get('extra_cores')} extra core(s) may be backfilled until then"
        )
    elif state == JobState.QUEUED:
        lines.append("reservation: none blocks it")
    for m in doc.get("migrations") or ():
        if isinstance(m, Mapping):
            to = ", ".join(str(t) for t in m.get("to") or ()) or "-"
            note = f": {m['note']}" if m.get("note") else ""
            lines.append(f"migration {m.get('id')} to {to} ({m.get('origin') or 'policy'}): {m.get('state')}{note}")
    return "\n".join(lines)


@job.command("explain")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@api_options
def job_explain(job_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Why is a job waiting, and which reservation blocks it."""
    doc = _client(url, token, ca).explain_job(job_id)
    show(doc, output, lambda: explain_text(doc))


# ----------------------------------------------------------------------------- node


@click.group()
def node() -> None:
    """List and show nodes; drain a node before maintenance and undrain it after."""


@node.command("list")
@api_options
def node_list(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List nodes with their fg/bg occupancy, migration peers and the count of their agents' last errors."""
    nodes = _client(url, token, ca).list_nodes()
    show({"nodes": nodes}, output, lambda: node_table(nodes))


@node.command("show")
@click.argument("name", shell_complete=_complete("node"))
@api_options
def node_show(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """One node: state, the nodes it can migrate to, and its agent's last errors (a refused migration)."""
    n = next((x for x in _client(url, token, ca).list_nodes() if x.get("name") == name), None)
    if n is None:
        raise errors.NotFound(kind="node", name=name)
    show({"node": n}, output, lambda: node_text(n))


@node.command("drain")
@click.argument("name", shell_complete=_complete("node"))
@click.option("--reason", default=None, metavar="TEXT", help="Why (shown in node list and node show).")
@api_options
def node_drain(name: str, reason: str | None, url: str | None, token: str | None, ca: str | None,
               output: str) -> None:
    """Stop placing new work on NAME (running jobs finish or are migrated by the policy)."""
    n = _client(url, token, ca).drain_node(name, reason)
    show({"node": n}, output, lambda: node_table([n]))


@node.command("remove")
@click.argument("name", shell_complete=_complete("node"))
@api_options
def node_remove(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Forget NAME for good: only a lost, down or drained node that holds no process (exit 4 otherwise).
    Its agent registering again brings it back."""
    n = _client(url, token, ca).remove_node(name)
    show({"node": n}, output, lambda: f"node {n.get('name')} removed (was {n.get('was')})")


@node.command("cores")
@click.argument("name", shell_complete=_complete("node"))
@click.argument("cores", type=click.IntRange(1, 4096))
@api_options
def node_cores(name: str, cores: int, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Confirm that NAME has CORES cores. A registered node's core count changes only this way: its
    agent's registration with another count is refused (node show: pending) until an operator confirms
    it. The count the agent asked for applies at once, another one when the agent registers it; NAME's
    current count declines what its agent asked for. Each is an event (vmctl events --node NAME)."""
    n = _client(url, token, ca).confirm_cores(name, cores)
    if n.get("cores") == cores:
        note = f"node {name} has {cores} cores"
    else:
        note = f"node {name} has {n.get('cores')} cores; {cores} applies when its agent registers that count"
    show({"node": n}, output, lambda: note)


@node.command("undrain")
@click.argument("name", shell_complete=_complete("node"))
@api_options
def node_undrain(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Make NAME schedulable again."""
    n = _client(url, token, ca).undrain_node(name)
    show({"node": n}, output, lambda: node_table([n]))


# ----------------------------------------------------------------------------- top


def _now() -> float:
    import time as _time

    return _time.time()


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
    """``vmctl top``: nodes and cores with their fg/bg jobs, the queue head and its reservation, and the
    latest events of the jobs' histories."""
    running = sum(1 for v in vms if v.get("job_id"))
    lines = [f"vmctl top  {fmt_time(_now())}  policy {policy.get('name')}  "
             f"queued {len(queued)}  VMs with a job {running}",
             "", "NODE / cores as fg-job/bg-job:"]
    lines.extend(core_rows(nodes, vms) or ["(no nodes)"])
    lines += ["", "queue (head first):"]
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


# ----------------------------------------------------------------------------- migrate


@click.command()
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--to", "to_node", required=True, metavar="NODE", help="Target node.", shell_complete=_complete("node"))
@api_options
def migrate(job_id: str, to_node: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Migrate a running JOB to NODE (asynchronous: prints the operation)."""
    op = _client(url, token, ca).migrate_job(job_id, to_node)
    show({"operation": op}, output,
         lambda: f"operation {op.get('id')}: {op.get('kind')} {op.get('state')} (job {job_id} -> {to_node}); "
                 f"follow it with `vmctl op show {op.get('id')}`")


# ----------------------------------------------------------------------------- op


@click.group("op")
def op() -> None:
    """Operations the daemon follows (a migration: `vmctl migrate` prints its id)."""


def _moves(o: Mapping[str, Any], limit: int = 4) -> str:
    parts = [f"{m.get('from')} -> {m.get('to')}" for m in o.get("moves") or () if isinstance(m, Mapping)]
    return fmt_names(parts, limit) if parts else "-"


def op_table(ops: Sequence[Mapping[str, Any]]) -> Grid:
    return Grid(
        ("ID", "KIND", "JOB", "STATE", "BY", "CREATED", "MOVES", "NOTE"),
        [(str(o.get("id", "")), str(o.get("kind", "")), str(o.get("job_id", "")), str(o.get("state", "")),
          str(o.get("origin") or "-"), fmt_time(o.get("created")), _moves(o), str(o.get("note") or ""))
         for o in ops],
    )


def op_text(o: Mapping[str, Any]) -> str:
    lines = [f"operation {o.get('id')}: {o.get('kind')} of job {o.get('job_id')}, {o.get('state')}"
             + (f" (stage {o['stage']})" if o.get("stage") and o.get("state") == "pending" else ""),
             f"asked by: {o.get('origin') or 'not recorded'}",
             f"created {fmt_when(o.get('created'))}; last change {fmt_when(o.get('updated'))}"]
    for m in o.get("moves") or ():
        if isinstance(m, Mapping):
            lines.append(f"process {m.get('index')}: {m.get('from')} -> {m.get('to')} ({m.get('mode')})")
    if o.get("note"):
        lines.append(f"note: {o['note']}")
    return "\n".join(lines)


@op.command("list")
@click.option("--job", "job_id", default=None, metavar="JOB", help="Only the operations of this job.",
              shell_complete=_complete("job"))
@click.option("--state", default=None, help="pending, done, failed, rolled_back, aborted.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many (the newest).")
@api_options
def op_list(job_id: str | None, state: str | None, limit: int | None, url: str | None, token: str | None,
            ca: str | None, output: str) -> None:
    """List operations, newest first."""
    ops = _client(url, token, ca).list_operations(job_id, state, limit)
    show({"operations": ops}, output, lambda: op_table(ops))


@op.command("show")
@click.argument("op_id", metavar="OP")
@api_options
def op_show(op_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """One operation: what it moves (node:core), who asked, how it ended and why."""
    o = _client(url, token, ca).get_operation(op_id)
    show({"operation": o}, output, lambda: op_text(o))


# ----------------------------------------------------------------------------- policy


@click.group()
def policy() -> None:
    """Show or change the daemon's scheduling policy."""


def _layout_text(lay: Mapping[str, Any] | None) -> str:
    if not lay:
        return "-"
    n = lay.get("levels")
    return f"{n} {lay.get('discipline')} level{'s' if n != 1 else ''} per core"


def _needs_text(needs: Mapping[str, Any] | None) -> str:
    if not needs:
        return "-"
    n = needs.get("levels")
    parts = [f"{n} level{'s' if n != 1 else ''}", "/".join(needs.get("disciplines") or []) or "any discipline",
             "/".join(needs.get("shapes") or [])]
    if needs.get("shared_vms"):
        parts.append("shared VMs")
    return ", ".join(parts)


def _params_text(params: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((params or {}).items())) or "-"


def switch_line(sw: Mapping[str, Any]) -> str:
    """One line of a switch's progress: ``draining 42 s: waiting for ...``."""
    return f"{sw.get('phase')} {fmt_duration(float(sw.get('elapsed_s') or 0.0))}: {sw.get('waiting_for')}"


def policy_text(doc: Mapping[str, Any]) -> str:
    """``vmctl policy show``: the policy, the cluster's layout, what the policy needs and waits for, and a
    switch in progress with each node's layout."""
    lay = doc.get("layout") or {}
    lines = [f"policy   {doc.get('name')} ({_params_text(doc.get('params'))})",
             f"layout   {_layout_text(lay)}" + (f" (set by {lay.get('set_by')})" if lay.get("set_by") else ""),
             f"needs    {_needs_text(doc.get('needs'))}; laid out in "
             f"{_layout_text((doc.get('needs') or {}).get('layout'))}",
             f"waiting  {doc.get('waiting') or '-'}"]
    sw = doc.get("switch")
    if sw:
        lines.append(f"switch   {sw.get('from_policy')} -> {sw.get('policy')} ({_params_text(sw.get('params'))}) on "
                     f"{_layout_text(sw.get('layout'))}: {switch_line(sw)}")
        grid = Grid(("NODE", "STATE", "LAYOUT", "RE-LAID OUT", "WAITING FOR"),
                    [(str(n.get("name")), str(n.get("state")), _layout_text(n.get("layout")),
                      "yes" if n.get("relaid") else "no", str(n.get("waiting_for") or "-"))
                     for n in sw.get("nodes") or []])
        lines += ["", grid.to_text()]
        lines.append("cancel it with: vmctl policy cancel")
    return "\n".join(lines)


@policy.command("show")
@api_options
def policy_show(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """The active policy and its parameters, the cluster's layout, what the policy needs, what it waits
    for, and a policy switch in progress (its phase, the jobs it waits for, each node's layout)."""
    doc = _client(url, token, ca).get_policy()
    show(doc, output, lambda: policy_text(doc))


@policy.command("cancel")
@api_options
def policy_cancel(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Cancel the policy switch in progress: the old policy goes on, and nodes already re-laid out are
    laid out as before."""
    doc = _client(url, token, ca).cancel_policy_switch()
    show(doc, output, lambda: policy_text(doc))


def policy_catalog() -> list[dict[str, Any]]:
    """The registered policies with their summary, parameters (name, type, default, help) and needs (with
    the layout vmctld lays the hosts out in for them, at their default parameters): read from this
    installation, no daemon needed (the simulator takes the same names)."""
    from vmctl.policies.registry import available_policies, create_policy

    out = []
    for name, cls in sorted(available_policies().items()):
        params = [{"name": k, "type": kind.__name__, "default": default, "help": help_}
                  for k, (kind, default, help_) in sorted(cls.parameters.items())]
        try:
            needs = create_policy(name).needs.to_json()
        except errors.VmctlError:
            needs = cls.needs.to_json()
        out.append({"name": name, "summary": str(cls.summary or ""), "params": params, "needs": needs})
    return out


@policy.command("list")
@click.option("--output", "-o", "output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Human table or JSON for scripts.")
def policy_list(output: str) -> None:
    """The policies vmctld and `vmctl sim run --policy` know, with their needs (VM levels per core,
    discipline, job shapes), the host layout vmctld lays the cluster out in for them
    (`vmctl policy set NAME --relayout`) and their parameters (`-p KEY=VALUE`). Offline: lists this
    installation's registry."""
    pols = policy_catalog()
    show({"policies": pols}, output, lambda: Grid(
        ("NAME", "NEEDS", "LAYOUT", "SUMMARY", "PARAMETERS"),
        [(p["name"], _needs_text(p["needs"]), _layout_text(p["needs"].get("layout")), p["summary"],
          ", ".join(f"{q['name']}={q['default']}" for q in p["params"]) or "-")
         for p in pols]))


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are read as YAML scalars (``3`` int, ``0.5`` float, ``true``)."""
    out: dict[str, Any] = {}
    import yaml

    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise errors.UserError(where="--param", problem=f"{item!r} is not KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def parse_layout(text: str) -> dict[str, Any]:
    """``--layout DISCIPLINE:LEVELS`` (``timeslice:3``) as the API's layout object."""
    disc, sep, levels = text.partition(":")
    choices = ("priority", "timeslice", "shared")
    if not sep or disc not in choices or not levels.isdigit():
        raise errors.UserError(where="--layout", problem=f"{text!r} is not DISCIPLINE:LEVELS with DISCIPLINE one of "
                                                          f"{', '.join(choices)} (e.g. timeslice:3)")
    return {"discipline": disc, "levels": int(levels)}


@policy.command("set")
@click.argument("name")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Policy parameter (repeat).")
@click.option("--relayout", is_flag=True,
              help="Switch family: drain (running jobs end, nothing is killed, queued jobs wait), re-lay the hosts "
                   "out in the layout the policy needs, then switch.")
@click.option("--layout", "layout", default=None, metavar="DISCIPLINE:LEVELS",
              help="The layout to re-lay the hosts out in (default: the policy's, `vmctl policy list`); implies "
                   "--relayout.")
@click.option("--wait/--no-wait", "wait", default=True, show_default=True,
              help="With --relayout: follow the switch until it is done, printing what it waits for.")
@click.option("--poll", "poll", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Seconds between looks at the switch's progress.")
@api_options
def policy_set(
    name: str, params: tuple[str, ...], relayout: bool, layout: str | None, wait: bool, poll: float, url: str | None,
    token: str | None, ca: str | None, output: str,
) -> None:
    """Switch to policy NAME (applies from the next scheduling cycle). A policy of another family needs
    another host layout (MEASY: 2 priority levels; gang: MPL timeslice rows; vcsched and task bags:
    shared): `--relayout` drains, re-lays out and switches in one command, showing what it waits for
    (Ctrl-C stops following, not the switch: `vmctl policy show`, `vmctl policy cancel`)."""
    client = _client(url, token, ca)
    lay = parse_layout(layout) if layout is not None else None
    doc = client.set_policy(name, parse_params(params), relayout=relayout or lay is not None, layout=lay)
    sw = doc.get("switch")
    if not sw or not wait:
        show(doc, output, lambda: policy_text(doc))
        return
    import time

    target = sw.get("policy")
    click.echo(f"switching {sw.get('from_policy')} -> {target} on {_layout_text(sw.get('layout'))}", err=True)
    last = ""
    try:
        while doc.get("switch"):
            line = switch_line(doc["switch"])
            if line.split(": ", 1)[-1] != last.split(": ", 1)[-1]:
                click.echo(line, err=True)
            last = line
            time.sleep(poll)
            doc = client.get_policy()
    except KeyboardInterrupt:
        click.echo("stopped following; the switch goes on in vmctld: `vmctl policy show` follows it, "
                   "`vmctl policy cancel` ends it", err=True)
        sys.exit(130)
    if doc.get("name") != target:
        raise errors.Conflict(what="policy switch", problem=f"ended without switching to {target} (cancelled?); "
                                                            f"the policy is {doc.get('name')}")
    click.echo(f"switched to {target} on {_layout_text(doc.get('layout'))}", err=True)
    show(doc, output, lambda: policy_text(doc))


# ----------------------------------------------------------------------------- token, cert


@click.group()
def token() -> None:
    """API tokens for operators and scripts."""


@token.command("issue")
@click.option("--name", required=True, help="Who or what the token is for.")
@click.option("--role", type=click.Choice(["read", "admin"]), default="read", show_default=True)
@click.option("--ttl", "ttl", type=click.FloatRange(min=0, min_open=True), default=None, help="Lifetime in seconds.")
@api_options
def token_issue(
    name: str, role: str, ttl: float | None, url: str | None, token: str | None, ca: str | None, output: str,
) -> None:
    """Issue a bearer token (needs an admin token). The token is shown once."""
    doc = _client(url, token, ca).issue_token(name, role, ttl)
    show(doc, output, lambda: kv_table(doc, [k for k in ("token", "name", "role", "expires") if k in doc]))


def token_table(tokens: Sequence[Mapping[str, Any]]) -> Grid:
    return Grid(("ID", "NAME", "ROLE", "CREATED", "EXPIRES"),
                [(str(t.get("id", "")), str(t.get("name", "")), str(t.get("role", "")), fmt_time(t.get("created")),
                  "never" if t.get("expires") is None else fmt_time(t.get("expires"))) for t in tokens])


@token.command("list")
@api_options
def token_list(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List the API tokens (needs an admin token): id, name, role, expiry; never the tokens themselves."""
    tokens = _client(url, token, ca).list_tokens()
    show({"tokens": tokens}, output, lambda: token_table(tokens))


@token.command("revoke")
@click.argument("token_id", metavar="ID|NAME")
@api_options
def token_revoke(token_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Revoke a token by its id (from `token list`) or its name (when one token has it). The last
    admin token cannot be revoked (exit 4): issue another one first."""
    t = _client(url, token, ca).revoke_token(token_id)
    show({"token": t}, output, lambda: f"revoked token {t.get('id')} ({t.get('name')}, {t.get('role')})")


@click.group()
def cert() -> None:
    """Client certificates for node agents (from the cluster CA)."""


@cert.command("issue")
@click.argument("node_name", metavar="NODE")
@click.option("--out-dir", type=click.Path(file_okay=False), default=None,
              help="Write NODE.crt, NODE.key (mode 0600; not with --csr) and ca.crt here.")
@click.option("--csr", "csr_file", type=click.Path(dir_okay=False), default=None,
              help="Sign this certificate signing request (PEM, made on the node: its key stays there) "
                   "instead of making a key here.")
@api_options
def cert_issue(
    node_name: str, out_dir: str | None, csr_file: str | None, url: str | None, token: str | None, ca: str | None,
    output: str,
) -> None:
    """Issue a client certificate for the agent of NODE (CN=node:NODE). The private key is made here
    (or, with --csr, on the node) and only a signing request goes to vmctld: the key never travels."""
    if out_dir is None and output != "json":
        raise errors.UserError(where="cert issue", problem="give --out-dir DIR (or --output json to print the PEMs)")
    from vmctl import auth

    auth.check_node_name(node_name, "NODE")  # the rule vmctld applies: a name that fits CN=node:<name>
    key_pem: str | None = None
    if csr_file is not None:
        try:
            csr_pem = Path(csr_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.UserError(where=f"--csr {csr_file}", problem=f"cannot read it: {exc}") from exc
    else:
        csr_pem, key_pem = auth.new_csr(node_name)
    doc = _client(url, token, ca).issue_cert(node_name, csr_pem)
    doc.pop("key_pem", None)
    if key_pem is not None:
        doc["key_pem"] = key_pem
    if out_dir is None:
        emit_json(doc)
        return
    written = write_cert_files(Path(out_dir), node_name, doc)
    show({"files": [str(p) for p in written]}, output, lambda: "\n".join(f"wrote {p}" for p in written))


def cert_table(certs: Sequence[Mapping[str, Any]]) -> Grid:
    now = _now()

    def state(c: Mapping[str, Any]) -> str:
        if c.get("revoked") is not None:
            return f"revoked {fmt_time(c.get('revoked'))}"
        if c.get("retired") is not None:
            return f"retired {fmt_time(c.get('retired'))} (its CA rotated out)"
        expires = c.get("expires")
        return "expired" if isinstance(expires, int | float) and expires < now else "valid"

    return Grid(("SERIAL", "NODE", "ISSUED", "EXPIRES", "STATE", "KEY MADE BY"),
                [(str(c.get("serial", "")), str(c.get("node", "")), fmt_time(c.get("issued")),
                  fmt_time(c.get("expires")), state(c), str(c.get("key_from") or "-")) for c in certs])


@cert.command("list")
@api_options
def cert_list(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List the agent certificates vmctld issued: serial, node, validity, revoked or not (never a key)."""
    certs = _client(url, token, ca).list_certs()
    show({"certs": certs}, output, lambda: cert_table(certs))


@cert.command("revoke")
@click.argument("key", metavar="SERIAL|NODE")
@api_options
def cert_revoke(key: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Revoke one certificate by its serial (from `cert list`), or every valid certificate of NODE. Its
    agent is refused from then on (401) until it gets a new certificate (`cert issue NODE`)."""
    revoked = _client(url, token, ca).revoke_cert(key)
    show({"revoked": revoked}, output, lambda: "\n".join(
        f"revoked certificate {c.get('serial')} of node {c.get('node')}" for c in revoked) or "nothing to revoke")


@click.group("ca")
def ca_group() -> None:
    """The cluster CA: show it, and replace it (a leaked key) without stopping a job.

    \b
    1. vmctl ca rotate   a new CA signs from now on; both are trusted; agents renew by themselves
    2. copy STATE_DIR/ca.pem (both CAs) to every client's --ca, and wait until `vmctl ca show`
       lists every node on the new CA
    3. vmctl ca finish   the old CA is dropped: its certificates are refused from then on
    """


def ca_text(doc: Mapping[str, Any]) -> str:
    lines = [f"CA           {doc.get('fingerprint')}"]
    if doc.get("previous"):
        lines.append(f"previous CA  {doc.get('previous')} (rotation since {fmt_time(doc.get('rotating_since'))}; "
                     f"the server certificate is still of it; 'vmctl ca finish' drops it)")
    for r in doc.get("retired") or []:
        lines.append(f"retired CA   {r.get('fingerprint')} ({fmt_time(r.get('retired'))})")
    nodes = doc.get("nodes") or []
    if nodes:
        grid = Grid(("NODE", "CURRENT CA CERT", "PRESENTED", "OLD CA CERT"),
                    [(str(n.get("node")), "yes" if n.get("current_ca") else "no",
                      "-" if n.get("seen_current_s") is None else f"{float(n['seen_current_s']):.0f} s ago",
                      "yes" if n.get("other_ca") else "no") for n in nodes])
        lines += ["", grid.to_text()]
    if doc.get("retired_certs"):
        lines.append(f"retired {len(doc['retired_certs'])} certificate(s) of the previous CA")
    return "\n".join(lines)


@ca_group.command("show")
@api_options
def ca_show(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """The cluster CA's fingerprint, a rotation in progress, and per node whether its agent holds (and
    presented) a certificate of the current CA."""
    doc = _client(url, token, ca).ca_info()
    show(doc, output, lambda: ca_text(doc))


@ca_group.command("rotate")
@api_options
def ca_rotate(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Start replacing the cluster CA: a new CA signs every certificate from now on, certificates of
    both are accepted, and each agent renews its own over its connection (its heartbeat tells it)."""
    doc = _client(url, token, ca).rotate_ca()
    show(doc, output, lambda: ca_text(doc) + "\nnext: copy STATE_DIR/ca.pem (both CAs) to the clients' --ca; "
                                             "when every node shows a current CA certificate: vmctl ca finish")


@ca_group.command("finish")
@click.option("--force", is_flag=True, help="Drop the old CA even though some nodes did not renew (their agents "
                                            "are refused until they get a new certificate).")
@api_options
def ca_finish(force: bool, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Finish a rotation: vmctld presents a server certificate of the new CA and refuses every
    certificate of the old one; agents replace their CA bundle by the new CA alone."""
    doc = _client(url, token, ca).finish_ca(force)
    show(doc, output, lambda: ca_text(doc))
