"""How the operator commands print: JSON for scripts, rich tables (plain text past ``RICH_MAX_ROWS``)
and key-value views for people, and the formatters of the fields the API answers (times, reasons,
placements, nodes, VMs, workers, jobs)."""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import click
from rich import box
from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.table import Table
from rich.text import Text

from vmctl import timefmt
from vmctl.timefmt import fmt_duration

#: the width tables fit by default when stdout is no terminal and ``COLUMNS`` is not set
DEFAULT_WIDTH = 100

#: ``-o wide``: no limit, a line per row (long lines are the terminal's to wrap, as ``kubectl -o wide``)
UNLIMITED = 10_000


def screen_width(wide: bool = False) -> int:
    """The width tables are fitted to: ``COLUMNS`` when set (a positive number, whether stdout is a
    terminal or not), else the terminal's width, else ``DEFAULT_WIDTH``; ``UNLIMITED`` for ``-o wide``
    (nothing cut or folded)."""
    if wide:
        return UNLIMITED
    return _known_width() or DEFAULT_WIDTH


def _known_width() -> int | None:
    """``COLUMNS``, else the width of the terminal stdout is; None when neither says (piped output)."""
    raw = os.environ.get("COLUMNS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    out = sys.stdout  # where click.echo and rich write: under a test's capture, no terminal
    if out is not None and out.isatty():
        try:
            return os.get_terminal_size(out.fileno()).columns
        except (OSError, ValueError):
            pass
    return None


def _console(width: int) -> Console:
    return Console(width=width, highlight=False, soft_wrap=False)


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


def safe_lines(s: str) -> str:
    """``s`` line by line through :func:`safe_text`: its line breaks stay line breaks (a history, a
    view of several lines), what else could drive the terminal is escaped."""
    return "\n".join(safe_text(line) for line in s.split("\n"))


def fmt_time(t: Any) -> str:
    """A time in a table: ISO 8601 with the local time zone (``TZ``)."""
    return timefmt.iso(t)


def fmt_column_time(t: Any, wide: bool = False) -> str:
    """A time in a table column: short (``14:05:02`` today, ``Nov 27 14:05`` this year, local zone) so the
    table fits 100 columns; ISO 8601 with the zone under ``-o wide``."""
    return fmt_time(t) if wide else timefmt.short(t)


def fmt_when(t: Any) -> str:
    """A time where there is room: ISO 8601 with the zone and how long ago (or ahead) it is."""
    return timefmt.human(t)


def fmt_reason(reason: Any, short: bool = False) -> str:
    """A waiting reason with its times made readable: the epoch times of an older daemon
    (``t=1.79546e+09``) and the API's ISO 8601 UTC times in the local zone with how far they are
    (``short``: ``14:05:02``, as in a table column)."""
    if not reason:
        return ""
    if not short:
        return timefmt.rewrite_times(str(reason), timefmt.human)
    return timefmt.rewrite_iso(timefmt.rewrite_times(str(reason), timefmt.short), timefmt.short)


def fmt_pct(x: Any) -> str:
    if x is None:
        return "-"
    try:
        return f"{float(x) * 100:.0f}%"
    except (TypeError, ValueError):
        return str(x)


def fmt_cap(cap: Any) -> str:
    return "none" if cap is None else fmt_pct(cap)


def _slot(p: Mapping[str, Any]) -> str:
    """``node:core``; ``node`` alone for an unpinned (shared, vcsched) VM, whose core is -1 on the wire."""
    core = p.get("core")
    return str(p.get("node")) if isinstance(core, int) and core < 0 else f"{p.get('node')}:{core}"


def fmt_placement(placement: Any, limit: int = 4) -> str:
    if not placement:
        return "-"
    parts = [_slot(p) for p in placement if isinstance(p, dict)]
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f" (+{len(parts) - limit})"
    return ", ".join(parts)


def fmt_cores(placement: Any) -> str:
    """A placement in few characters: each node once with its cores as ranges (``n1:0-3 n2:0,2``; a node
    where the job holds several levels of a core says how many slots: ``n1:0-1 (4 slots)``); unpinned
    shared VMs as ``n3`` (one VM) or ``n3x2``; ``-`` for none."""
    nodes: dict[str, list[int]] = {}
    for p in placement or ():
        if isinstance(p, Mapping):
            core = p.get("core")
            nodes.setdefault(str(p.get("node")), []).append(core if isinstance(core, int) else -1)
    parts = []
    for node, cores in nodes.items():
        pinned = [c for c in cores if c >= 0]
        distinct = sorted(set(pinned))
        shared = len(cores) - len(pinned)
        if shared:
            parts.append(node if shared == 1 else f"{node}x{shared}")
        if distinct:
            slots = f" ({len(pinned)} slots)" if len(pinned) > len(distinct) else ""
            parts.append(f"{node}:{_ranges(distinct)}{slots}")
    return " ".join(parts) or "-"


def _ranges(xs: Sequence[int]) -> str:
    """Sorted integers as ``0-3,6,8-9``."""
    out: list[str] = []
    start = prev = xs[0]
    for x in (*xs[1:], None):
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)


def flow(head: str, cells: Sequence[str], width: int | None, sep: str = " ") -> list[str]:
    """``head`` then ``cells`` apart by ``sep``, over as many lines as ``width`` needs, each further line
    indented to the first cell (``vmctl top``'s cores of a node, ``vcsched solve``'s tasks of a host);
    None: one line."""
    lines, line, first = [], head, True
    for cell in cells:
        if width is not None and not first and len(line) + len(sep) + len(cell) > width:
            lines.append(line.rstrip())
            line, first = " " * len(head), True
        line += ("" if first else sep) + cell
        first = False
    lines.append(line.rstrip())
    return lines


#: a cut cell ends with this
ELLIPSIS = "\u2026"
#: a cut column keeps at least this many characters (or its header's)
MIN_CUT = 8


#: Above this many rows tables are printed as plain aligned text: rich needs ~2.5 ms per row, which
#: makes ``vmctl vm list`` on a 100 x 32-core cluster (6400 VMs) take 16 s (bench/metrics_scrape.py).
RICH_MAX_ROWS = 300


#: the space between two columns of a table
GAP = 2


def cut_text(text: str, width: int) -> str:
    """``text`` in at most ``width`` terminal cells, ending in an ellipsis when it was longer."""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1) + ELLIPSIS


@dataclass(frozen=True)
class Grid:
    """A table as data: rendered with rich when small, as plain aligned text when large."""

    headers: tuple[str, ...]
    rows: list[tuple[str, ...]]
    title: str | None = None
    #: the columns whose cells are cut (ending in an ellipsis) when the table is wider than the screen, in
    #: the order they give way (``fit``); other columns keep their width (rich folds what still does not fit)
    cut: tuple[str, ...] = ()

    def widths(self) -> list[int]:
        """Each column's width: its widest cell or header (terminal cells, as displayed)."""
        out = [cell_len(h) for h in self.headers]
        for row in self.rows:
            for i, cell in enumerate(row):
                n = cell_len(safe_text(cell))
                if n > out[i]:
                    out[i] = n
        return out

    def fit(self, width: int) -> Grid:
        """The table with the cells of its ``cut`` columns shortened so that its lines, columns apart
        by two spaces, are at most ``width`` long (as far as those columns can give way)."""
        widths = self.widths()
        excess = sum(widths) + GAP * (len(widths) - 1) - width
        if excess <= 0 or not self.cut:
            return self
        limit: dict[int, int] = {}
        for name in self.cut:
            i = self.headers.index(name)
            give = min(excess, widths[i] - max(MIN_CUT, cell_len(self.headers[i])))
            if give > 0:
                limit[i] = widths[i] - give
                excess -= give
            if excess <= 0:
                break
        rows = [tuple(cut_text(safe_text(c), limit[i]) if i in limit else c for i, c in enumerate(row))
                for row in self.rows]
        return replace(self, rows=rows)

    def to_rich(self) -> Table:
        t = Table(title=self.title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
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
            lines.append((" " * GAP).join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        return "\n".join(lines)

    def render(self) -> Any:
        return self.to_rich() if len(self.rows) <= RICH_MAX_ROWS else self.to_text()


def fmt_user(j: Mapping[str, Any]) -> str:
    """``alice`` or ``alice (proj7)`` with the account; ``-`` when neither was given."""
    user, account = str(j.get("user") or ""), str(j.get("account") or "")
    if account:
        return f"{user or '-'} ({account})"
    return user or "-"


def fmt_start(j: Mapping[str, Any], short: bool = False) -> str:
    """When a job started, or for the queued job holding the reservation when it will start at the latest
    (``<= 2026-...``, like ``squeue --start``); ``-`` when not known. ``short``: relative to now
    (``5.0m ago``, ``<= in 10.0m``)."""
    fmt = timefmt.relative if short else fmt_time
    if j.get("start_time") is not None:
        return fmt(j.get("start_time"))
    if j.get("expected_start") is not None:
        return f"<= {fmt(j.get('expected_start'))}"
    return "-"


def fmt_blocked(blocked: Any) -> str:
    """The out-of-service nodes that alone keep a queued job waiting: ``n2 (drained), n3 (lost)``."""
    return ", ".join(f"{b.get('node')} ({b.get('state')})" for b in blocked or () if isinstance(b, Mapping))


def fmt_job_reason(j: Mapping[str, Any], short: bool = False) -> str:
    """A job's reason, and when only drained or lost nodes keep it waiting, which ones. ``short``: its
    times as ``timefmt.short`` (a table column)."""
    reason = fmt_reason(j.get("reason"), short)
    blocked = fmt_blocked(j.get("blocked_by"))
    if not blocked:
        return reason
    return f"{reason}; waits for nodes {blocked}" if reason else f"waits for nodes {blocked}"


def job_kind(j: Mapping[str, Any]) -> str:
    """``rigid``, ``moldable`` or ``task-bag``: the kind of the job's shape (null: rigid)."""
    shape = j.get("shape")
    return str(shape.get("kind") or "rigid") if isinstance(shape, Mapping) else "rigid"


def fmt_widths(widths: Sequence[Any]) -> str:
    """A moldable job's allowed widths: ``2..16`` (every width between), ``2,4,8``, ``2..64 (7)``."""
    ws = [int(w) for w in widths if isinstance(w, int | float) and not isinstance(w, bool)]
    if not ws:
        return "?"
    if len(ws) > 2 and ws[-1] - ws[0] + 1 == len(ws):
        return f"{ws[0]}..{ws[-1]}"
    if len(ws) > 4:
        return f"{ws[0]}..{ws[-1]} ({len(ws)})"
    return ",".join(str(w) for w in ws)


def fmt_runs_as(j: Mapping[str, Any]) -> str:
    """How the job's VMs run: ``fg``/``bg`` (its tier), ``row 1`` (a gang job's row, ``row 1+2,3`` with its
    replicas), ``cap 50%`` (a shared vcsched VM's CPU cap, a share of one core per VM); ``-``: no VM."""
    gang = j.get("gang")
    if isinstance(gang, Mapping):
        reps = [str(r) for r in gang.get("replicas") or ()]
        return f"row {gang.get('row')}" + (f"+{','.join(reps)}" if reps else "")
    if j.get("tier") == "shared":
        return "shared" if j.get("cap") is None else f"cap {fmt_pct(j.get('cap'))}"
    return str(j.get("tier") or "-")


def fmt_width(j: Mapping[str, Any]) -> str:
    """The job's width in its shape's terms: a rigid job's processes (``4``), a moldable job's chosen
    width of its allowed ones (``4 of 1..8``; ``1..8`` before it starts), a task bag's workers now
    (``3 workers``; ``<=4 workers`` while it holds none)."""
    raw = j.get("shape")
    shape: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    kind, width = job_kind(j), j.get("width")
    if kind == "moldable":
        allowed = fmt_widths(shape.get("widths") or ())
        return allowed if width is None else f"{width} of {allowed}"
    if kind == "task-bag":
        if width:
            return f"{width} worker{'s' if width != 1 else ''}"
        return f"<={shape.get('max_workers', j.get('procs'))} workers"
    return str(j.get("procs", ""))


def fmt_work(j: Mapping[str, Any]) -> str:
    """The job's time in its shape's terms: a rigid job's estimate, a moldable job's time at its width
    (the range over its widths before it starts), a task bag's tasks done of all and its work left
    (``12/20, 52s left``; ``20/20 done``)."""
    kind = job_kind(j)
    if kind == "moldable":
        if j.get("width_time") is not None:
            return fmt_duration(j.get("width_time"))
        shape = j.get("shape") or {}
        times = sorted(float(t) for t in shape.get("times") or () if isinstance(t, int | float))
        if times:
            lo, hi = fmt_duration(times[0]), fmt_duration(times[-1])
            return lo if lo == hi else f"{lo}..{hi}"
    if kind == "task-bag" and j.get("tasks_total") is not None:
        done = f"{j.get('tasks_done')}/{j.get('tasks_total')}"
        left = j.get("work_left")
        return f"{done} done" if not left else f"{done}, {fmt_duration(left)} left"
    return fmt_duration(j.get("estimate"))


def fmt_state(j: Mapping[str, Any], runs_as: bool = False) -> str:
    """``queued (held)``; with ``runs_as`` how its VMs run beside (``running bg``, ``running row 1+2``)."""
    state = str(j.get("state", "")) + (" (held)" if j.get("held") else "")
    how = fmt_runs_as(j) if runs_as else "-"
    return state if how == "-" else f"{state} {how}"


def fmt_where(j: Mapping[str, Any]) -> str:
    """``job list``'s last column: where a job with VMs runs (``fmt_cores``), else why it waits or how it
    ended (its reason), like squeue's NODELIST(REASON)."""
    if j.get("placement"):
        return fmt_cores(j.get("placement"))
    return fmt_job_reason(j, short=True) or "-"


#: ``job list``'s columns (fit 100 columns; ``-o wide``: ``JOB_WIDE``)
JOB_COLUMNS = ("ID", "NAME", "USER", "STATE", "WIDTH", "TIME", "START", "NODES (REASON)")
JOB_WIDE = ("ID", "NAME", "USER", "STATE", "RUNS AS", "WIDTH", "TIME", "PRIO", "SUBMITTED", "START", "END",
            "PLACEMENT", "MIG", "REASON")


def job_table(jobs: Sequence[Mapping[str, Any]], title: str | None = None, wide: bool = False) -> Grid:
    """``vmctl job list``: each job in its shape's terms (``fmt_width``, ``fmt_work``, ``fmt_runs_as`` beside
    its state), start times relative to now and a compact placement, to fit 100 columns; with ``wide``
    every column in full (how it runs apart, priority, submit/start/end times in ISO 8601, migrations,
    the reason beside the placement)."""
    if wide:
        return Grid(JOB_WIDE, [
            (str(j.get("id", "")), str(j.get("name") or "-"), fmt_user(j), fmt_state(j), fmt_runs_as(j),
             fmt_width(j), fmt_work(j), str(j.get("priority", 0)), fmt_time(j.get("submit_time")),
             fmt_start(j), fmt_time(j.get("end_time")), fmt_placement(j.get("placement"), limit=64),
             str(j.get("migrations", 0)), fmt_job_reason(j))
            for j in jobs], title)
    return Grid(JOB_COLUMNS, [
        (str(j.get("id", "")), str(j.get("name") or "-"), fmt_user(j), fmt_state(j, runs_as=True),
         fmt_width(j), fmt_work(j), fmt_start(j, short=True), fmt_where(j))
        for j in jobs], title, cut=("NODES (REASON)", "NAME", "USER"))


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


def fmt_seen(t: Any) -> str:
    """How long ago: ``5s ago``, ``3.0m ago``; ``-`` for none."""
    return timefmt.relative(t) if t is not None else "-"


def fmt_busy(n: Mapping[str, Any]) -> str:
    """A node's cores with a fg and with a bg VM of a job: ``3/1``."""
    return f"{n.get('fg_busy', '')}/{n.get('bg_busy', '')}"


#: ``node list``'s columns (fit 100 columns; ``-o wide``: ``NODE_WIDE``)
NODE_COLUMNS = ("NAME", "STATE", "CORES", "FG/BG", "UTIL", "GEN", "REPORT", "LAST SEEN", "ERRORS")
NODE_WIDE = ("NAME", "STATE", "GROUP", "CORES", "LEVELS", "SPEED", "MEM", "FG BUSY", "BG BUSY", "ORPHANS", "UTIL",
             "GEN", "REPORT", "LAST SEEN", "PEERS", "ERRORS")


def node_table(nodes: Sequence[Mapping[str, Any]], wide: bool = False) -> Grid:
    """``vmctl node list``: state, cores busy with fg/bg VMs, the generation its agent applied, how long
    ago it reported and was seen, its agent's last error (and orphan VMs being removed); ``wide``: also
    the group, VM levels, speed, memory, migration peers, with the last-seen time in full."""
    if wide:
        return Grid(NODE_WIDE, [
            (str(n.get("name", "")), fmt_node_state(n), str(n.get("group") or "-"), str(n.get("cores", "")),
             fmt_levels(n), fmt_speed(n.get("speed")), fmt_mem(n.get("memory_mib")), str(n.get("fg_busy", "")),
             str(n.get("bg_busy", "")), str(n.get("orphans", 0)), fmt_pct(n.get("utilization")), fmt_applied(n),
             fmt_report_age(n), fmt_time(n.get("last_seen")), fmt_peers(n.get("peers")), _last_error(n))
            for n in nodes])
    return Grid(NODE_COLUMNS, [
        (str(n.get("name", "")), fmt_node_state(n), str(n.get("cores", "")), fmt_busy(n),
         fmt_pct(n.get("utilization")), fmt_applied(n), fmt_report_age(n), fmt_seen(n.get("last_seen")),
         _node_notes(n))
        for n in nodes], cut=("ERRORS", "STATE", "NAME"))


def _node_notes(n: Mapping[str, Any]) -> str:
    """The last error column of ``node list``, with the orphan VMs its agent is removing."""
    errs = _last_error(n)
    orphans = int(n.get("orphans") or 0)
    if not orphans:
        return errs
    note = f"{orphans} orphan VM{'s' if orphans != 1 else ''}"
    return note if errs == "-" else f"{note}; {errs}"


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
        if key == "power" and o.get("stopping"):
            seen += ", stopping"  # its agent's forced stop is under way
    if v.get("managed") is False or key not in (v.get("differs") or ()):
        return seen
    return f"{seen} (want {fmt(v.get(key))})"


def _fmt_core(c: Any) -> str:
    return "-" if c is None or (isinstance(c, int) and c < 0) else str(c)


def vm_table(vms: Sequence[Mapping[str, Any]]) -> Grid:
    """VMs as their agents report them (desired beside where it differs); idle VMs have no job. To fit
    the screen the power, cap and weight cells are cut first (``-o wide``: never)."""
    return Grid(
        ("NAME", "NODE", "CORE", "ROLE", "WEIGHT", "CAP", "POWER", "JOB", "UTIL"),
        [(str(v.get("name", "")), str(v.get("node", "")), _observed_vs_desired(v, "core", _fmt_core),
          str(v.get("role", "")), _observed_vs_desired(v, "weight", lambda w: "-" if w is None else str(w)),
          _observed_vs_desired(v, "cap", fmt_cap), _observed_vs_desired(v, "power", str),
          str(v.get("job_id") or ("-" if v.get("managed", True) else "- (idle)")),
          fmt_pct(v.get("utilization"))) for v in vms],
        cut=("POWER", "CAP", "WEIGHT", "CORE", "NAME"),
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
        stopping = " (stopping)" if o.get("stopping") else ""
        lines.append(f"observed: power {o.get('power')}{stopping}, core {_fmt_core(o.get('core'))}, "
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
    """Print ``doc`` as JSON (``-o json``) or what ``render`` makes of it: a string, a rich renderable, or
    a ``Grid`` fitted to the screen (``screen_width``: 100 columns when piped without ``COLUMNS``; ``-o
    wide``: never cut)."""
    if output == "json":
        emit_json(doc)
        return
    wide = output == "wide"
    out = render()
    if isinstance(out, Grid):
        out = (out if wide else out.fit(screen_width())).render()
    if isinstance(out, str):
        click.echo(safe_lines(out))
    else:
        # folded at the screen's width; with no screen to fit (piped, no COLUMNS) nothing is folded:
        # the tables made to fit were fitted to DEFAULT_WIDTH above
        _console(UNLIMITED if wide else _known_width() or UNLIMITED).print(out)


def fmt_names(names: Sequence[str], limit: int = 8) -> str:
    if len(names) > limit:
        return ", ".join(names[:limit]) + f" (+{len(names) - limit})"
    return ", ".join(names)


def _now() -> float:
    import time as _time

    return _time.time()
