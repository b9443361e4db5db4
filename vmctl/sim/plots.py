"""PNG plots of sweep results, like the MEASY paper's figures 6-14 (matplotlib, Agg backend).

- ``response_vs_load.png`` / ``slowdown_vs_load.png``: average response time / bounded slowdown per
  policy against the offered load (figures 6, 7, 9-12);
- ``migrations_vs_load.png``: migrations per policy against the load (figure 8);
- ``migration_cost.png``: response time and bounded slowdown of the policies that take a migration
  cost, against that cost, with the other policies as horizontal references (figures 13, 14).

Values are averaged over seeds. Rows come from :func:`vmctl.experiments.sweep.sweep` (or ``results.csv``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _num(x: Any) -> float | None:
    if x is None or x == "":
        return None
    return float(x)


def _mean_by(rows: Sequence[Mapping[str, Any]], key: str, metric: str) -> dict[str, dict[float, float]]:
    acc: dict[str, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        x = _num(r[key])
        if x is None:
            continue
        acc[str(r["policy"])][x].append(float(r[metric]))
    # policies in the order they first appear in the rows (the sweep's --policies order)
    return {p: {x: sum(v) / len(v) for x, v in sorted(d.items())} for p, d in acc.items()}


def plot_results(rows: Sequence[Mapping[str, Any]], out: Path, title: str = "") -> list[Path]:
    """Write the plots that the rows allow; return their paths."""
    written: list[Path] = []
    by_load = [r for r in rows if _num(r.get("migration_cost")) is None or _is_default_cost(rows, r)]
    if any(_num(r.get("load")) is not None for r in by_load):
        for metric, ylabel, fname in (
            ("avg_response", "average response time (s)", "response_vs_load.png"),
            ("avg_bounded_slowdown", "average bounded slowdown", "slowdown_vs_load.png"),
            ("migrations", "migrations", "migrations_vs_load.png"),
        ):
            series = _mean_by(by_load, "load", metric)
            fig, ax = plt.subplots(figsize=(6, 4))
            for pol, pts in series.items():
                ax.plot(list(pts), list(pts.values()), marker="o", label=pol)
            ax.set_xlabel("offered load")
            ax.set_ylabel(ylabel)
            ax.set_title(title)
            ax.grid(True, alpha=0.3)
            ax.legend()
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
            for pol, pts in _mean_by(costed, "migration_cost", metric).items():
                ax.plot(list(pts), list(pts.values()), marker="o", label=pol)
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


def _is_default_cost(rows: Sequence[Mapping[str, Any]], row: Mapping[str, Any]) -> bool:
    """With a migration-cost sweep, the load plots use the smallest cost of each policy."""
    costs = [_num(r.get("migration_cost")) for r in rows if r["policy"] == row["policy"]]
    present = [c for c in costs if c is not None]
    return bool(present) and _num(row.get("migration_cost")) == min(present)
