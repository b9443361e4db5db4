"""Rendering of simulation results: a rich table for people, one JSON object for programs."""

from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.table import Table

from vmctl.sim.engine import SimResult
from vmctl.sim.metrics import Interval


def _secs(x: float) -> str:
    return f"{x:,.1f} s"


def _ci(i: Interval | None, fmt: str = "{:,.1f}") -> str:
    return "" if i is None else "± " + fmt.format(i.half_width)


def result_table(result: SimResult, title: str | None = None) -> Table:
    m = result.metrics
    table = Table(title=title or f"{result.policy} on {result.source or 'workload'} ({result.cores} cores)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95 % CI (batch means)", justify="right")
    table.add_row("jobs", f"{result.jobs:,}", "")
    if result.dropped:
        table.add_row("dropped", ", ".join(f"{k}: {v:,}" for k, v in sorted(result.dropped.items())), "")
    table.add_row("average wait", _secs(m.avg_wait), _ci(m.ci_wait))
    table.add_row("average response", _secs(m.avg_response), _ci(m.ci_response))
    table.add_row("average bounded slowdown", f"{m.avg_bounded_slowdown:,.2f}", _ci(m.ci_bounded_slowdown, "{:,.2f}"))
    table.add_row("utilization", f"{m.utilization:.3f}", "")
    table.add_row("makespan", _secs(m.makespan), "")
    table.add_row("migrations", f"{result.migrations:,}", "")
    table.add_row("kills at estimate", f"{result.estimate_kills:,}", "")
    table.add_row("kills by the policy", f"{result.policy_kills:,}", "")
    table.add_row("scheduling passes", f"{result.decisions:,}", "")
    return table


def print_table(result: SimResult, console: Console | None = None) -> None:
    (console or Console()).print(result_table(result))


def to_json(result: SimResult, extra: dict[str, Any] | None = None) -> str:
    doc = result.to_dict()
    if extra:
        doc.update(extra)
    return json.dumps(doc, sort_keys=True)
