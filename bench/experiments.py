"""Benchmark: the experiment runner with 1 and 2 local Dask workers on the same 24-cell grid.

    python -m bench.experiments [--jobs 3000] [--out DIR]

The grid is 3 policies (easy, keasy, measy) x 2 loads (0.7, 0.9) x 4 seeds of a Feitelson-96 model
workload (320 cores, ``--jobs`` jobs), each cell one full simulation. Each grid is run into a fresh
table (nothing to resume), first with one worker, then with two, and once more in this process without
Dask (the serial baseline: the sum of the cells' own times).

Prints per run: wall time, the sum of the cells' own run times (``wall_s`` of the table), the speed-up
against one worker, and the runner's overhead per cell = (wall x workers - sum of cell times) / cells,
i.e. the worker time not spent inside a cell (cluster start-up, scheduling, result transfer, the
journal's fsync), also without the cluster's start and stop (timed alone just before). On a machine
shared with other work compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from vmctl.experiments.runner import Cell, dask_client, execute, grid, run_grid
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, simulate
from vmctl.sim.workloads import generate_model


def sim_cell(policy: str, load: float, seed: int, jobs: int) -> dict[str, Any]:
    """One simulation: ``policy`` over a Feitelson-96 workload of ``jobs`` jobs at ``load``."""
    w = generate_model("feitelson96", jobs, 320, seed, load)
    res = simulate(w.jobs, w.max_procs, create_policy(policy), SimConfig(seed=seed), source=w.source)
    m = res.metrics
    return {"avg_bounded_slowdown": m.avg_bounded_slowdown, "utilization": m.utilization,
            "ci_bounded_slowdown": None if m.ci_bounded_slowdown is None else m.ci_bounded_slowdown.half_width}


def cells(jobs: int) -> list[Cell]:
    return grid(sim_cell, {"jobs": jobs}, policy=["easy", "keasy", "measy"], load=[0.7, 0.9], seed=[1, 2, 3, 4])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.experiments")
    ap.add_argument("--jobs", type=int, default=3000, help="jobs per simulated workload (default 3000)")
    ap.add_argument("--out", type=Path, help="keep the tables in this folder (default: a temporary one)")
    a = ap.parse_args(argv)
    grid_cells = cells(a.jobs)
    base = a.out or Path(tempfile.mkdtemp(prefix="bench-experiments-"))
    base.mkdir(parents=True, exist_ok=True)
    print(f"grid: {len(grid_cells)} cells (3 policies x 2 loads x 4 seeds), feitelson96, {a.jobs} jobs, 320 cores")

    t0 = time.perf_counter()
    serial = [execute(c.function, c.inputs) for c in grid_cells]
    serial_wall = time.perf_counter() - t0
    assert all(r["error"] is None for r in serial), [r["error"] for r in serial if r["error"]]
    print(f"in-process, no Dask : wall {serial_wall:7.2f} s  (sum of cells {sum(r['wall_s'] for r in serial):.2f} s)")

    walls: dict[int, float] = {}
    for workers in (1, 2):
        table = base / f"w{workers}.parquet"
        table.unlink(missing_ok=True)
        t0 = time.perf_counter()
        with dask_client(workers):
            pass
        startup = time.perf_counter() - t0
        t0 = time.perf_counter()
        res = run_grid(grid_cells, table, workers=workers, progress=False)
        wall = walls[workers] = time.perf_counter() - t0
        if res.failed:
            print(f"{len(res.failed)} cells failed: {res.failed[0]['error']}")
            return 1
        busy = sum(float(r["wall_s"]) for r in res.rows)
        overhead = (wall * workers - busy) / len(res.rows)
        running = ((wall - startup) * workers - busy) / len(res.rows)
        print(f"Dask, {workers} worker{'s' if workers > 1 else ' '}   : wall {wall:7.2f} s  (sum of cells {busy:.2f} s)"
              f"  speed-up vs 1 worker x{walls[1] / wall:.2f}  vs in-process x{serial_wall / wall:.2f}\n"
              f"                      overhead {overhead * 1000:.0f} ms/cell = {overhead / (busy / len(res.rows)):.1%}"
              f" of a cell; without the cluster's start and stop ({startup:.2f} s): {running * 1000:.0f} ms/cell"
              f" = {running / (busy / len(res.rows)):.1%}")
    same = [r["metrics"]["avg_bounded_slowdown"] for r in serial] == [
        r["avg_bounded_slowdown"] for r in run_grid(grid_cells, base / "w2.parquet", progress=False).rows]
    print(f"tables identical to the in-process results: {same}")
    if a.out is None:
        shutil.rmtree(base)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
