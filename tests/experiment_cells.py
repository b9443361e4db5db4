"""Cell functions for the experiment runner's tests (importable by Dask workers as ``tests.experiment_cells``).

Every cell that takes ``count_dir`` creates one new file there per execution, named after its inputs, so a
test counts how many times each cell really ran (across processes, workers and killed runs).

``python -m tests.experiment_cells TABLE COUNT_DIR GATE N [--workers W] [--scheduler ADDR]`` runs the grid
``slow_square(i)`` for i < N with the runner: cells with i >= 4 wait until the file GATE exists, so a test can
kill the command while the grid is certainly unfinished.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from pathlib import Path

from vmctl.experiments.runner import grid, run_grid


def _count(count_dir: str, name: str) -> None:
    Path(count_dir, f"{name}.{uuid.uuid4().hex}").touch()


def executions(count_dir: str | Path, name: str) -> int:
    return sum(1 for p in Path(count_dir).iterdir() if p.name.split(".")[0] == name)


def square(x: int, count_dir: str) -> dict[str, float]:
    _count(count_dir, f"sq{x}")
    return {"y": float(x * x), "ci_y": 0.5}


def fail_on(x: int, bad: int, count_dir: str) -> dict[str, int]:
    _count(count_dir, f"f{x}")
    if x == bad:
        raise ValueError(f"cell {x} is bad")
    return {"y": x + 1}


def slow_square(i: int, count_dir: str, gate: str) -> dict[str, int]:
    if i >= 4:
        while not Path(gate).exists():
            time.sleep(0.05)
    _count(count_dir, f"s{i}")
    return {"y": i * i}


def crash_once(x: int, marker_dir: str, count_dir: str) -> dict[str, int]:
    """Kills its worker process the first time it runs (a worker lost mid-cell), then succeeds."""
    _count(count_dir, f"c{x}")
    marker = Path(marker_dir, f"crashed{x}")
    if not marker.exists():
        marker.touch()
        os._exit(3)
    return {"y": x}


def not_a_mapping(x: int) -> list[int]:
    return [x]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("table")
    ap.add_argument("count_dir")
    ap.add_argument("gate")
    ap.add_argument("n", type=int)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--scheduler")
    a = ap.parse_args()
    res = run_grid(grid(slow_square, {"count_dir": a.count_dir, "gate": a.gate}, i=list(range(a.n))), a.table,
                   workers=a.workers, scheduler=a.scheduler, progress=False)
    print(f"ran {res.ran} skipped {res.skipped} failed {len(res.failed)}")


if __name__ == "__main__":
    main()
