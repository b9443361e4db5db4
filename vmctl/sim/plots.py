"""PNG plots of sweep results, like the MEASY paper's figures 6-14 (matplotlib, Agg backend).

- ``response_vs_load.png`` / ``slowdown_vs_load.png``: average response time / bounded slowdown per
  policy against the offered load (figures 6, 7, 9-12);
- ``migrations_vs_load.png``: migrations per policy against the load (figure 8);
- ``migration_cost.png``: response time and bounded slowdown of the policies that take a migration
  cost, against that cost, with the other policies as horizontal references (figures 13, 14).

Values are averaged over seeds, with the 95 % intervals of the runs as error bars (response time and
bounded slowdown). A policy swept over several migration costs has one line per cost in the "vs load"
plots. Series that lie on top of each other stay visible (own marker and line style, shrinking markers)
and a series that is 0 everywhere says so in the legend.
Rows come from :func:`vmctl.experiments.sweep.sweep` (or ``results.csv``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

#: the metric -> the column with the half width of its 95 % interval (batch means, per run)
CI_COLUMNS = {"avg_response": "ci_response", "avg_bounded_slowdown": "ci_bounded_slowdown"}
MARKERS = "osD^vP*Xh<>"
LINESTYLES = ("-", "--", "-.", ":")


def _num(x: Any) -> float | None:
    if x is None or x == "":
        return None
    return float(x)


Series = dict[str, dict[float, tuple[float, float | None]]]


def _series(rows: Sequence[Mapping[str, Any]], key: str, metric: str, by_cost: bool = False) -> Series:
    """label -> x -> (mean over seeds, half width of its 95 % interval or None).

    The label is the policy, or ``policy, cost C s`` for the rows of a policy run at several migration
    costs when ``by_cost``. The interval of a mean over n seeds combines the runs' own half widths as
    independent estimates: sqrt(sum h_i^2) / n."""
    several = {str(r["policy"]) for r in rows if by_cost and _num(r.get("migration_cost")) is not None}
    several = {p for p in several
               if len({_num(r.get("migration_cost")) for r in rows if str(r["policy"]) == p}) > 1}
    acc: dict[str, dict[float, list[tuple[float, float | None]]]] = defaultdict(lambda: defaultdict(list))
    ci_col = CI_COLUMNS.get(metric)
    for r in rows:
        x = _num(r[key])
        if x is None:
            continue
        label = str(r["policy"])
        if label in several:
            label = f"{label}, cost {_num(r['migration_cost']):g} s"
        acc[label][x].append((float(r[metric]), _num(r.get(ci_col)) if ci_col else None))
    out: Series = {}
    # series in the order they first appear in the rows (the sweep's --policies order)
    for label, d in acc.items():
        pts: dict[float, tuple[float, float | None]] = {}
        for x, vals in sorted(d.items()):
            hs = [h for _, h in vals]
            ci = None if any(h is None for h in hs) else math.sqrt(sum(h * h for h in hs if h is not None)) / len(hs)
            pts[x] = (sum(v for v, _ in vals) / len(vals), ci)
        out[label] = pts
    return out


def _draw(ax: Any, series: Series) -> None:
    """One line per series with its interval as error bars; every series has its own marker and line
    style, and the markers shrink from the first series to the last, so that series lying on top of
    each other (every policy without migrations at 0) all stay visible. A series that is 0 everywhere
    says so in the legend."""
    n = max(1, len(series))
    for i, (label, pts) in enumerate(series.items()):
        xs = list(pts)
        ys = [v for v, _ in pts.values()]
        errs = [h for _, h in pts.values()]
        yerr = None if all(h is None for h in errs) else [0.0 if h is None else h for h in errs]
        if ys and all(y == 0 for y in ys):
            label += " (0 everywhere)"
        ax.errorbar(xs, ys, yerr=yerr, marker=MARKERS[i % len(MARKERS)], linestyle=LINESTYLES[i % len(LINESTYLES)],
                    markersize=4 + 6 * (n - 1 - i) / max(1, n - 1), markerfacecolor="none", capsize=3,
                    linewidth=1.2, label=label)


def plot_results(rows: Sequence[Mapping[str, Any]], out: Path, title: str = "") -> list[Path]:
    """Write the plots that the rows allow; return their paths."""
    written: list[Path] = []
    if any(_num(r.get("load")) is not None for r in rows):
        for metric, ylabel, fname in (
            ("avg_response", "average response time (s)", "response_vs_load.png"),
            ("avg_bounded_slowdown", "average bounded slowdown", "slowdown_vs_load.png"),
            ("migrations", "migrations", "migrations_vs_load.png"),
        ):
            fig, ax = plt.subplots(figsize=(6.4, 4.4))
            _draw(ax, _series(rows, "load", metric, by_cost=True))
            ax.set_xlabel("offered load")
            ax.set_ylabel(ylabel + (" (bars: 95 % interval)" if metric in CI_COLUMNS else ""))
            ax.set_title(title)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / fname
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    costed = [r for r in rows if _num(r.get("migration_cost")) is not None]
    if len({_num(r["migration_cost"]) for r in costed}) > 1:
        others = [r for r in rows if _num(r.get("migration_cost")) is None]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, metric, ylabel in (
            (axes[0], "avg_response", "average response time (s)"),
            (axes[1], "avg_bounded_slowdown", "average bounded slowdown"),
        ):
            _draw(ax, _series(costed, "migration_cost", metric))
            for k, pol in enumerate(sorted({str(r["policy"]) for r in others})):
                vals = [float(r[metric]) for r in others if r["policy"] == pol]
                ax.axhline(sum(vals) / len(vals), linestyle="--", linewidth=1, label=f"{pol} (no migration)",
                           color=f"C{(k + 3) % 10}")
            ax.set_xlabel("migration cost (s)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"{title}: migration cost" if title else "migration cost")
        fig.tight_layout()
        path = out / "migration_cost.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
