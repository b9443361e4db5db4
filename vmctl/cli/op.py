"""``vmctl op``: list and show the daemon's operations (migrations, checkpoints, restores)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from vmctl.cli.connect import _client, _complete, api_options, wide_api_options
from vmctl.cli.render import Grid, fmt_column_time, fmt_names, fmt_when, show


@click.group("op")
def op() -> None:
    """Operations the daemon follows (a migration: `vmctl migrate` prints its id)."""


def _moves(o: Mapping[str, Any], limit: int = 4) -> str:
    parts = [f"{m.get('from')} -> {m.get('to')}" for m in o.get("moves") or () if isinstance(m, Mapping)]
    return fmt_names(parts, limit) if parts else "-"


def op_table(ops: Sequence[Mapping[str, Any]], wide: bool = False) -> Grid:
    return Grid(
        ("ID", "KIND", "JOB", "STATE", "BY", "CREATED", "MOVES", "NOTE"),
        [(str(o.get("id", "")), str(o.get("kind", "")), str(o.get("job_id", "")), str(o.get("state", "")),
          str(o.get("origin") or "-"), fmt_column_time(o.get("created"), wide), _moves(o), str(o.get("note") or ""))
         for o in ops],
        cut=("NOTE", "MOVES", "BY"),
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
@wide_api_options
def op_list(job_id: str | None, state: str | None, limit: int | None, url: str | None, token: str | None,
            ca: str | None, output: str) -> None:
    """List operations, newest first."""
    ops = _client(url, token, ca).list_operations(job_id, state, limit)
    show({"operations": ops}, output, lambda: op_table(ops, wide=output == "wide"))


@op.command("show")
@click.argument("op_id", metavar="OP")
@api_options
def op_show(op_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """One operation: what it moves (node:core), who asked, how it ended and why."""
    o = _client(url, token, ca).get_operation(op_id)
    show({"operation": o}, output, lambda: op_text(o))
