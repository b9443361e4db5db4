"""``vmctl gang show``: the gang matrix of a timeslice cluster (paper 004) from ``GET /v1/gang``.

One line per node, one column per row (level); a cell lists the job on each core of the node in that
row (``-``: a hole). The active row's column is marked ``*``; below, the slice schedule (period, row
order, when the active row ends) and the rows in use and holes. Example (MPL 3, two 2-core nodes)::

    NODE  r0   r1*  r2
    a     1 1  2 2  3 3
    b     1 1  - -  3 -
    schedule: T 10 s, rows 0 1 2 in turn; row 1 active, switch to row 2 in 4 s
    rows in use: 3 of 3; holes: 3 of 12 cells

A table wider than the screen (32-core nodes) writes a cell's runs as ``JOBxN`` (``1x16 2x16``: job 1
on 16 cores, then job 2 on 16), and when that is still too wide, each node's rows go on lines of their
own, folded at the screen's width; ``-o wide`` always prints every core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from vmctl.cli.connect import _client, wide_api_options
from vmctl.cli.render import Grid, flow, screen_width, show
from vmctl.timefmt import fmt_duration


@click.group()
def gang() -> None:
    """Gang scheduling (timeslice clusters): the matrix of rows x nodes."""


def _runs(jobs: list[Any]) -> list[str]:
    """A row's cores as runs: ``[1, 1, 1, None]`` -> ``["1x3", "-"]``."""
    out: list[str] = []
    i = 0
    while i < len(jobs):
        j = i
        while j + 1 < len(jobs) and jobs[j + 1] == jobs[i]:
            j += 1
        name = "-" if jobs[i] is None else str(jobs[i])
        out.append(name if j == i else f"{name}x{j - i + 1}")
        i = j + 1
    return out


def _cells(jobs: list[Any], compact: bool) -> list[str]:
    return _runs(jobs) if compact else ["-" if j is None else str(j) for j in jobs]


def _row_heads(doc: Mapping[str, Any]) -> list[str]:
    return [f"r{r['row']}{'*' if r.get('active') else ''}" for r in doc.get("rows") or []]


def gang_grid(doc: Mapping[str, Any], compact: bool = False) -> Grid:
    """The matrix as a table: a line per node, a column per row (``*``: the active row); ``compact``: a
    cell's cores as runs (``1x16``)."""
    rows = list(doc.get("rows") or [])
    lines: list[tuple[str, ...]] = []
    for node in doc.get("nodes") or []:
        cells = [" ".join(_cells(list((r.get("cells") or {}).get(node, [])), compact)) for r in rows]
        lines.append((str(node), *cells))
    return Grid(("NODE", *_row_heads(doc)), lines)


def gang_text(doc: Mapping[str, Any], width: int | None) -> str:
    """The matrix fitted to ``width`` (module docstring): the table; else the table with runs; else a
    node's rows on lines of their own, folded. None: the table with every core."""
    full = gang_grid(doc).to_text()
    if width is None or max(map(len, full.splitlines())) <= width:
        return full
    compact = gang_grid(doc, compact=True).to_text()
    if max(map(len, compact.splitlines())) <= width:
        return compact
    lines: list[str] = []
    heads = _row_heads(doc)
    pad = max(map(len, heads), default=0)
    for node in doc.get("nodes") or []:
        lines.append(str(node))
        for head, r in zip(heads, doc.get("rows") or [], strict=True):
            lines += flow(f"  {head.ljust(pad)}  ", _cells(list((r.get("cells") or {}).get(node, [])), True), width)
    return "\n".join(lines)


def gang_summary(doc: Mapping[str, Any], now: float | None = None) -> str:
    """The schedule, the active row and the holes, in words."""
    if doc.get("discipline") != "timeslice":
        return (f"this cluster's agents register {doc.get('levels')} {doc.get('discipline')} levels per core: "
                "no gang rows (gang policies need layout.discipline: timeslice)")
    sched = doc.get("schedule")
    if sched is None:
        head = "schedule: none yet (no gang policy has decided): the agents keep row 0 active"
    else:
        order = [int(r) for r in sched.get("rows", [])]
        active = int(sched.get("active_row", 0))
        nxt = order[(order.index(active) + 1) % len(order)] if active in order else order[0]
        when = "" if now is None else f" in {fmt_duration(max(0.0, float(sched['next_switch']) - now))}"
        head = (f"schedule: T {fmt_duration(float(sched['period_s']))}, rows {' '.join(map(str, order))} in turn; "
                f"row {active} active, switch to row {nxt}{when}")
    in_use = doc.get("rows_in_use") or []
    cells = int(doc.get("cells_per_row") or 0) * len(in_use)
    return f"{head}\nrows in use: {len(in_use)} of {doc.get('levels')}; holes: {doc.get('holes')} of {cells} cells"


@gang.command("show")
@wide_api_options
def gang_show(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Show the gang matrix: which job's VM holds which row of which core, the active row, the holes."""
    import time

    doc = _client(url, token, ca).gang()

    def text() -> str:
        width = None if output == "wide" else screen_width()
        grid = gang_text(doc, width) if doc.get("discipline") == "timeslice" else ""
        return (grid + "\n" if grid else "") + gang_summary(doc, time.time())

    show({"gang": doc}, output, text)
