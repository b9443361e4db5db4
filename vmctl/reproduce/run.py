"""Running a paper: its experiments on the experiment runner (resuming), then its claims."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmctl.errors import CellsFailed
from vmctl.experiments.runner import run_grid, writable_dir
from vmctl.reproduce.base import Outcome, Paper, Results, Size, checked
from vmctl.reproduce.output import RunInfo, write_claims


@dataclass(frozen=True, slots=True)
class ExperimentRun:
    name: str
    table: str
    cells: int
    ran: int
    skipped: int
    wall_s: float


@dataclass(frozen=True, slots=True)
class Reproduction:
    paper: Paper
    size: Size
    experiments: list[ExperimentRun]
    rows: list[dict[str, Any]]
    wall_s: float


def estimate_s(size: Size, workers: int) -> float:
    """The estimated wall time of ``size`` on ``workers`` local workers (CPU seconds / workers)."""
    return size.est_cpu_s / max(1, workers)


def reproduce(paper: Paper, mode: str, out: str | Path, *, workers: int | None = None, scheduler: str | None = None,
              command: str = "", progress: bool = True, say: Callable[[str], None] = print) -> Reproduction:
    """Run ``paper`` at size ``mode`` into ``out``: each experiment into ``out/<name>.parquet`` (a rerun
    skips finished cells), then claims.md and claims.parquet. Cells that failed: the tables are kept,
    no claims are written, CellsFailed is raised."""
    size = paper.size(mode)
    out_dir = writable_dir(out)
    t0 = time.perf_counter()
    results = Results()
    runs: list[ExperimentRun] = []
    tables: dict[str, str] = {}
    for e in paper.experiments:
        cells = e.cells(size, results)
        table = out_dir / f"{e.name}.parquet"
        t1 = time.perf_counter()
        res = run_grid(cells, table, workers=workers, scheduler=scheduler, progress=progress, label=e.name,
                       batch=e.batch)
        runs.append(ExperimentRun(e.name, table.name, len(res.rows), res.ran, res.skipped, time.perf_counter() - t1))
        say(f"{e.name}: {len(res.rows)} cells ({res.ran} run now, {res.skipped} from {table.name}), "
            f"{time.perf_counter() - t1:.0f} s")
        if res.failed:
            first = res.failed[0]
            raise CellsFailed(failed=len(res.failed), total=len(res.rows), table=str(table),
                              first=f"{first['function']}: {first['error']}")
        results.add(e.name, res.rows)
        tables[e.name] = table.name
    outcomes: list[tuple[Any, Outcome]] = [(c, checked(paper, c, c.evaluate(results))) for c in paper.claims]
    wall = time.perf_counter() - t0
    info = RunInfo(size=size, command=command or f"vmctl reproduce {paper.id} --{mode} --out {out}", wall_s=wall)
    rows = write_claims(paper, outcomes, info, results, out_dir, tables)
    return Reproduction(paper, size, runs, rows, wall)
