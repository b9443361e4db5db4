"""``vmctl worker list``: the task workers of the running task bags."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from vmctl.cli.connect import _client, _complete, api_options
from vmctl.cli.render import Grid, fmt_speed, show


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
