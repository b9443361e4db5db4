"""Rendering of simulation results: a rich table for people, one JSON object for programs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from vmctl.sim.engine import SimResult
from vmctl.sim.metrics import Interval


def _secs(x: float) -> str:
    """Seconds, with the span in hours or days beside when it is long: ``12,345.0 s (3.4h)``."""
    from vmctl.timefmt import fmt_duration

    return f"{x:,.1f} s" if abs(x) < 120 else f"{x:,.1f} s ({fmt_duration(x)})"


def _ci(i: Interval | None, fmt: str = "{:,.1f}") -> str:
    return "" if i is None else "± " + fmt.format(i.half_width)


def _short_source(source: str | None) -> str:
    """The trace's file name (not its whole path, which made the title wrap and split "16 cores")."""
    if not source:
        return "workload"
    name = Path(source).name or source
    return name if len(name) <= 40 else name[:37] + "..."


def result_table(result: SimResult, title: str | None = None, execution: dict[str, Any] | None = None) -> Table:
    """The metrics as a table; ``execution`` (how ``vmctl sim run`` names its execution model) adds a
    row when the model is not the default two-tier one."""
    m = result.metrics
    table = Table(title=title or f"{result.policy} on {_short_source(result.source)} ({result.cores} cores)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95 % CI (batch means)", justify="right")
    table.add_row("machine", f"{result.cores:,} cores", "")
    if execution and execution.get("model") != "two-tier":
        slice_s = execution.get("slice_s")
        table.add_row("execution model", f"{execution['model']}, {execution['levels']} levels"
                      + (f", slice {slice_s:g} s" if slice_s is not None else ""), "")
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
    g = result.gang
    if g is not None:  # paper 004 sec. 3
        table.add_row(f"slowdown (T = {g.slice_s:g} s)", f"{g.avg_slowdown:,.2f}", "")
        table.add_row("utilization, eq. (3) / MPL " + str(g.mpl), f"{g.utilization_eq3:.3f}", "")
        table.add_row("capacity lost to migration", f"{g.capacity_lost:,.0f} core-s ({g.capacity_lost_fraction:.2%})",
                      "")
        table.add_row("migrations per job", f"{g.migrations_per_job:.2f}", "")
    return table


def print_table(result: SimResult, console: Console | None = None, execution: dict[str, Any] | None = None) -> None:
    (console or Console()).print(result_table(result, execution=execution))


def to_json(result: SimResult, extra: dict[str, Any] | None = None) -> str:
    """One JSON object (strict JSON: an infinite parameter, such as the gang policies' default quota,
    is written as the string ``"inf"``)."""
    doc = result.to_dict()
    params = doc.get("params")
    if isinstance(params, dict):
        doc["params"] = {k: (("inf" if v > 0 else "-inf") if isinstance(v, float) and math.isinf(v) else v)
                         for k, v in params.items()}
    if extra:
        doc.update(extra)
    return json.dumps(doc, sort_keys=True)


def compare_markdown(rows: list[dict[str, str]], baseline: str = "easy") -> str:
    """A markdown table from sweep rows (``results.csv``): per workload and load (and migration cost),
    each policy's average response time and bounded slowdown, and its improvement over ``baseline``
    on the same workload/load/seed in % (positive = better than the baseline). Seeds are averaged."""
    from collections import defaultdict

    def key(r: dict[str, str]) -> tuple[str, str, str]:
        return (r["workload"], r["load"], r.get("migration_cost", ""))

    acc: dict[tuple[str, str, str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for r in rows:
        acc[(*key(r), r["policy"])].append(
            (float(r["avg_response"]), float(r["avg_bounded_slowdown"]), float(r["migrations"]))
        )
    mean = {k: tuple(sum(x[i] for x in v) / len(v) for i in range(3)) for k, v in acc.items()}
    seen: dict[str, None] = {}
    for r in rows:
        seen.setdefault(r["policy"], None)
    policies = sorted(seen, key=lambda p: p != baseline)  # baseline first, then the sweep's order
    lines = ["| workload | load | cost (s) | policy | avg response (s) | vs " + baseline
             + " | avg bounded slowdown | vs " + baseline + " | migrations |",
             "|---|---|---|---|---:|---:|---:|---:|---:|"]
    base_by_wl_load = {(k[0], k[1]): v for k, v in mean.items() if k[3] == baseline}
    gains: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for wl, load, cost, pol in sorted(mean, key=lambda k: (k[0], float(k[1] or 0), float(k[2] or 0),
                                                           policies.index(k[3]))):
        resp, bsld, mig = mean[(wl, load, cost, pol)]
        base = base_by_wl_load.get((wl, load))
        if base is not None and pol != baseline:
            g_resp, g_bsld = 100 * (base[0] - resp) / base[0], 100 * (base[1] - bsld) / base[1]
            gains[(wl, pol if not cost else f"{pol} (cost {cost} s)")].append((g_resp, g_bsld))
            d_resp, d_bsld = f"{g_resp:+.1f} %", f"{g_bsld:+.1f} %"
        else:
            d_resp = d_bsld = ""
        lines.append(f"| {wl} | {load or '-'} | {cost or '-'} | {pol} | {resp:,.0f} | {d_resp} | {bsld:,.2f} | "
                     f"{d_bsld} | {mig:,.0f} |")
    if any(len(g) > 1 for g in gains.values()):  # a summary only when there is something to summarize
        lines += ["", f"| workload | policy | response vs {baseline}: mean / best | bounded slowdown vs {baseline}: "
                  "mean / best |", "|---|---|---:|---:|"]
        for (wl, pol), g in gains.items():
            rg = [x[0] for x in g]
            bg = [x[1] for x in g]
            lines.append(f"| {wl} | {pol} | {sum(rg) / len(rg):+.1f} % / {max(rg):+.1f} % | "
                         f"{sum(bg) / len(bg):+.1f} % / {max(bg):+.1f} % |")
    return "\n".join(lines)
