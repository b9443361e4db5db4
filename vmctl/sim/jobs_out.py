"""Per-job output of one simulation run (``vmctl sim run --jobs-out FILE``).

One row per job, the columns of :meth:`vmctl.sim.engine.Simulator.job_rows` (Batsim's ``jobs.csv`` is
the model researchers know): CSV by default, Parquet (pyarrow) when the file name ends in
``.parquet``. The file is written next to its final name and renamed into place, so a failed run never
leaves half a file behind."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vmctl.errors import ValidationError

COLUMNS = ("id", "user", "submit", "start", "end", "width", "wait", "first_tier", "tier_changes", "migrations",
           "policy_kills", "killed")


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(v)
    return v


def check_target(path: str | Path, option: str = "--jobs-out") -> Path:
    """Refuse a target that cannot be written before a long run starts, naming the option."""
    target = Path(path)
    if target.is_dir():
        raise ValidationError(field=option, problem=f"{target} is a directory; give a file name")
    if not target.parent.is_dir():
        raise ValidationError(field=option, problem=f"directory {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK):
        raise ValidationError(field=option, problem=f"directory {target.parent} is not writable")
    return target


def write_jobs(rows: Iterable[dict[str, Any]], path: str | Path, option: str = "--jobs-out") -> int:
    """Write the rows to ``path`` (CSV, or Parquet for ``*.parquet``); returns the number of rows."""
    target = check_target(path, option)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    try:
        if target.suffix == ".parquet":
            n = _write_parquet(rows, tmp)
        else:
            n = _write_csv(rows, tmp)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ValidationError(field=option, problem=f"cannot write {target}: {exc.strerror or exc}") from None
    return n


def _write_csv(rows: Iterable[dict[str, Any]], path: Path) -> int:
    n = 0
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([_cell(r[c]) for c in COLUMNS])
            n += 1
    return n


def _write_parquet(rows: Iterable[dict[str, Any]], path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols: dict[str, list[Any]] = {c: [] for c in COLUMNS}
    for r in rows:
        for c in COLUMNS:
            cols[c].append(r[c])
    types = {"id": pa.string(), "user": pa.int64(), "submit": pa.float64(), "start": pa.float64(),
             "end": pa.float64(), "width": pa.int64(), "wait": pa.float64(), "first_tier": pa.string(),
             "tier_changes": pa.int64(), "migrations": pa.int64(), "policy_kills": pa.int64(), "killed": pa.string()}
    table = pa.table({c: pa.array(cols[c], type=types[c]) for c in COLUMNS})
    pq.write_table(table, path)
    return int(table.num_rows)
