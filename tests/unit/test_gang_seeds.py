"""``vmctl sim gang-seeds``: Table 1 pooled over runs of different seeds, with intervals."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vmctl.errors import ValidationError
from vmctl.experiments.gang import POLICIES, table1_seeds


def fake_run(d: Path, seed: int, slowdown: float, other: dict[str, float] | None = None) -> str:
    """A complete 36-cell run whose every cell has utilization 0.5 and ``slowdown`` (the -m policies: half;
    ``other``: the slowdown of these policies instead)."""
    rows = [{"policy": p, "workload": w, "seed": seed, "jobs": 100, "utilization": 0.5,
             "avg_slowdown": (other or {}).get(p, slowdown / 2 if p.endswith("-m") else slowdown), "error": None}
            for w in range(9) for p in POLICIES]
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), d / "table1.parquet")
    return str(d)


def test_mean_and_student_t_half_width_over_seeds(tmp_path: Path) -> None:
    dirs = [fake_run(tmp_path / f"s{i}", i, s) for i, s in ((1, 2.0), (2, 4.0), (3, 6.0))]
    out = table1_seeds(dirs)
    assert "3 seeds (1, 2, 3)" in out
    # slowdowns 2, 4, 6: mean 4, sd 2, t(0.975, 2) = 4.303: half width 4.303 * 2 / sqrt(3) = 4.97
    row0 = next(line for line in out.splitlines() if line.startswith("| 0 |"))
    half = "| 0.50 +- 0.00 | 4.0 +- 5.0 | 0.50 +- 0.00 | 2.0 +- 2.5 | 50.0 % (3/3) "
    assert row0 == "| 0 " + half + half + "|"


def test_migration_wins_are_counted_per_seed(tmp_path: Path) -> None:
    # seed 2's gs-m is worse than its gs: 2 of 3 seeds where migration lowered s; gs-m's slowdowns 1, 9, 3:
    # mean 4.33, sd 4.16, half width 4.303 * 4.16 / sqrt(3) = 10.3; % better (4 - 4.33) / 4 = -8.3 %
    dirs = [fake_run(tmp_path / f"s{i}", i, s, {"gs-m": 9.0} if i == 2 else None)
            for i, s in ((1, 2.0), (2, 4.0), (3, 6.0))]
    row0 = next(line for line in table1_seeds(dirs).splitlines() if line.startswith("| 0 |"))
    assert row0.endswith("| 50.0 % (3/3) | 0.50 +- 0.00 | 4.0 +- 5.0 | 0.50 +- 0.00 | 4.3 +- 10.3 | -8.3 % (2/3) |")


def test_refuses_one_run_a_repeated_seed_and_an_incomplete_run(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", 1, 2.0)
    with pytest.raises(ValidationError, match="at least two runs"):
        table1_seeds([a])
    with pytest.raises(ValidationError, match="repeats seed 1"):
        table1_seeds([a, fake_run(tmp_path / "b", 1, 3.0)])
    part = tmp_path / "part"
    part.mkdir()
    pq.write_table(pa.Table.from_pylist([{"policy": "gs", "workload": 0, "seed": 5, "jobs": 1, "utilization": 0.5,
                                          "avg_slowdown": 1.0, "error": None}]), part / "table1.parquet")
    with pytest.raises(ValidationError, match="not a complete Table 1 run"):
        table1_seeds([a, str(part)])
