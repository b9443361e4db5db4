"""One runner for every sweep and evaluation: a grid of pure cells run on Dask distributed.

A :class:`Cell` is a pure function (named ``"package.module:function"`` so that any worker can import
it) and its inputs (scalars). :func:`run_grid` runs the cells of a grid on a Dask cluster -- a
``LocalCluster`` of ``workers`` processes on this machine by default, or an existing cluster given by
``scheduler`` (``tcp://HOST:PORT`` or a scheduler file) -- and records one row per cell in a
:class:`ResultTable`:

``cell``
    a stable hash of the function name and the inputs (the resume key);
``function``, then the inputs, then the metrics the cell returned
    (confidence intervals are metrics too, by the convention ``ci_<metric>`` = half width);
``wall_s``, ``host``, ``vmctl_version``
    the cell's run time in seconds, the worker's host name and the vmctl version that computed it;
``error``
    empty when the cell succeeded, else ``"Type: message (at file.py:LINE)"`` (the metrics are empty).

Durability: each finished cell is appended to a journal next to the table (``NAME.partial.jsonl``,
written through to the kernel per row, fsync'ed at most every second) and the journal is folded into
the table (Parquet or CSV, written to a temporary file and renamed) at the end of the run and every
``flush_interval`` seconds. A run killed with ``kill -9`` therefore loses at most the cells in flight
(a crash of the whole machine: also the last second's); the next run folds the journal in first.

Resume: cells whose key is already in the table are skipped (``retry_failed``: except those that
failed). A cell that raises is recorded with its error and does not stop the grid. A worker lost while
running a cell has the cell rescheduled by Dask on another worker (``distributed.scheduler.allowed-
failures`` times, default 3); after that the cell is recorded as failed with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import itertools
import json
import logging
import math
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

from vmctl.errors import ClusterUnavailable, Conflict, ValidationError
from vmctl.sigterm import sigterm_as_interrupt

if TYPE_CHECKING:
    from distributed import Client

Scalar = str | int | float | bool | None
TableFormat = Literal["parquet", "csv"]

#: columns the runner writes itself; inputs and metrics may not use these names
HEAD_COLUMNS = ("cell", "function")
TAIL_COLUMNS = ("wall_s", "host", "vmctl_version", "error")
RESERVED = frozenset(HEAD_COLUMNS + TAIL_COLUMNS)


def _check_scalar(where: str, value: object) -> Scalar:
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, str | bytes):
        value = value.item()  # numpy scalars
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value
    raise ValidationError(field=where, problem=f"must be a string, number, bool or None, not {type(value).__name__}")


def _check_name(where: str, name: object) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise ValidationError(field=where, problem=f"{name!r} is not a valid column name (a Python identifier)")
    if name in RESERVED:
        raise ValidationError(field=where, problem=f"{name!r} is a column the runner writes itself")
    return name


@dataclass(frozen=True, slots=True)
class Cell:
    """A pure function and its inputs. ``function`` is ``"package.module:qualified.name"``."""

    function: str
    inputs: Mapping[str, Scalar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        mod, sep, name = self.function.partition(":")
        if not sep or not mod or not name or "<" in name or mod == "__main__":
            raise ValidationError(field="cell.function", problem=f"{self.function!r} is not an importable "
                                  "'package.module:function' (no lambdas, local functions or __main__)")
        for k, v in self.inputs.items():
            _check_name(f"cell.inputs.{k}", k)
            val = _check_scalar(f"cell.inputs.{k}", v)
            if isinstance(val, float) and not math.isfinite(val):
                raise ValidationError(field=f"cell.inputs.{k}", problem=f"{v} is not a finite number")

    @property
    def key(self) -> str:
        """A stable hash of the function name and the inputs (independent of the inputs' order)."""
        doc = json.dumps({"function": self.function, "inputs": dict(self.inputs)}, sort_keys=True,
                         separators=(",", ":"))
        return hashlib.sha256(doc.encode("utf-8")).hexdigest()[:20]


def function_name(fn: Callable[..., Any]) -> str:
    """``module:qualname``; a function of a module run with ``python -m pkg.mod`` gets ``pkg.mod``."""
    module = fn.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else module
    return f"{module}:{fn.__qualname__}"


def cell(fn: Callable[..., Mapping[str, Any]], **inputs: Scalar) -> Cell:
    """The cell that calls ``fn(**inputs)``."""
    return Cell(function_name(fn), dict(inputs))


def grid(fn: Callable[..., Mapping[str, Any]], fixed: Mapping[str, Scalar] | None = None,
         **axes: Sequence[Scalar]) -> list[Cell]:
    """The cross product of ``axes`` (the first axis varies slowest), each cell with ``fixed`` too."""
    names = list(axes)
    return [cell(fn, **dict(zip(names, values, strict=True)), **(fixed or {}))
            for values in itertools.product(*(axes[n] for n in names))]


# ------------------------------------------------------------------------------------ on the worker


def resolve(function: str) -> Callable[..., Mapping[str, Any]]:
    mod, _, name = function.partition(":")
    obj: Any = importlib.import_module(mod)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValidationError(field="cell.function", problem=f"{function} is not callable")
    return obj  # type: ignore[no-any-return]


def describe_error(exc: BaseException) -> str:
    """``Type: message (at file.py:LINE)``, the line being the innermost frame that raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    ref = getattr(exc, "reference", None)
    kind = f"{type(exc).__name__}[{ref}]" if isinstance(ref, str) else type(exc).__name__
    return f"{kind}: {exc}{where}"


def execute(function: str, inputs: Mapping[str, Scalar]) -> dict[str, Any]:
    """Run one cell (on a worker) and return its metrics, run time, host, version and error; never raises
    for the cell's own errors, so that one bad cell does not stop the grid."""
    from vmctl import __version__

    t0 = time.perf_counter()
    metrics: dict[str, Scalar] = {}
    error: str | None = None
    try:
        out = resolve(function)(**inputs)
        if not isinstance(out, Mapping):
            raise ValidationError(field=function, problem=f"returned {type(out).__name__}, not a mapping of metrics")
        for k, v in out.items():
            _check_name(f"{function} metric", k)
            if k in inputs:
                raise ValidationError(field=f"{function} metric {k}", problem="has the name of an input")
            metrics[k] = _check_scalar(f"{function} metric {k}", v)
    except Exception as exc:
        metrics, error = {}, describe_error(exc)
    return {"metrics": metrics, "wall_s": round(time.perf_counter() - t0, 6), "host": socket.gethostname(),
            "vmctl_version": __version__, "error": error}


def make_row(c: Cell, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"cell": c.key, "function": c.function, **c.inputs, **result["metrics"],
            "wall_s": result["wall_s"], "host": result["host"], "vmctl_version": result["vmctl_version"],
            "error": result["error"]}


# ------------------------------------------------------------------------------------- the table


def writable_dir(path: str | Path, option: str = "--out") -> Path:
    """The directory ``path``, created if needed; a clear error (no traceback) when it cannot be written."""
    out = Path(path)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".vmctl-write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ValidationError(field=option, problem=f"cannot write to {path}: {exc.strerror or exc}") from exc
    return out


def table_format(path: Path, fmt: str | None = None) -> TableFormat:
    name = fmt or path.suffix.lstrip(".").lower()
    if name in ("parquet", "pq"):
        return "parquet"
    if name == "csv":
        return "csv"
    raise ValidationError(field=str(path), problem="a results table is .parquet or .csv")


def _columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    seen: dict[str, None] = dict.fromkeys(HEAD_COLUMNS)
    for r in rows:
        seen.update((k, None) for k in r if k not in RESERVED)
    seen.update(dict.fromkeys(TAIL_COLUMNS))
    return list(seen)


def _arrow_array(values: list[Any]) -> Any:
    """One typed column: bool, int64, float64 (ints and floats mixed) or string (anything else mixed)."""
    import pyarrow as pa

    present = [v for v in values if v is not None]
    if not present:
        return pa.array(values, type=pa.string())
    if all(isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.bool_())
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.int64())
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return pa.array([None if v is None else float(v) for v in values], type=pa.float64())
    return pa.array([None if v is None else str(v) for v in values], type=pa.string())


def to_arrow(rows: Sequence[Mapping[str, Any]]) -> Any:
    import pyarrow as pa

    cols = _columns(rows)
    return pa.table({c: _arrow_array([r.get(c) for r in rows]) for c in cols})


def read_table(path: Path, fmt: str | None = None) -> list[dict[str, Any]]:
    """The rows of a results table (empty when the file does not exist)."""
    if not path.exists():
        return []
    try:
        if table_format(path, fmt) == "parquet":
            import pyarrow.parquet as pq

            tbl = pq.read_table(path)
        else:
            import pyarrow.csv as pacsv

            tbl = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    except OSError as exc:  # pyarrow's ArrowInvalid is a ValueError, its IO errors OSErrors
        raise ValidationError(field=str(path), problem=f"cannot read the results table: {exc}") from exc
    except ValueError as exc:
        raise ValidationError(field=str(path), problem=f"not a results table: {exc}") from exc
    if "cell" not in tbl.column_names:
        raise ValidationError(field=str(path), problem="not a results table (no 'cell' column)")
    rows: list[dict[str, Any]] = tbl.to_pylist()
    return rows


def write_table(rows: Sequence[Mapping[str, Any]], path: Path, fmt: str | None = None) -> None:
    """Write ``rows`` to ``path`` atomically (a temporary file in the same folder, fsync'ed, renamed)."""
    kind = table_format(path, fmt)
    tmp = path.with_name(f".{path.name}.tmp")
    tbl = to_arrow(rows)
    if kind == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(tbl, tmp)
    else:
        import pyarrow.csv as pacsv

        pacsv.write_csv(tbl, tmp)
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class ResultTable:
    """A results table with its journal; one writer at a time (an exclusive lock on the journal)."""

    def __init__(self, path: str | Path, fmt: str | None = None) -> None:
        self.path = Path(path)
        self.fmt = table_format(self.path, fmt)
        self.journal = self.path.with_name(self.path.name + ".partial.jsonl")
        self.rows: dict[str, dict[str, Any]] = {}
        self._fh: IO[str] | None = None
        self._flushed = self._synced = time.monotonic()
        #: seconds between fsyncs of the journal (a machine crash may lose the rows of the last interval)
        self.sync_interval = 1.0

    def open(self) -> ResultTable:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = self.journal.open("a+", encoding="utf-8")
        except OSError as exc:
            raise ValidationError(field=str(self.path), problem=f"cannot write the results table there: "
                                  f"{exc.strerror or exc}") from exc
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            raise Conflict(what=str(self.path), problem="another run is writing this table; wait for it "
                           "or choose another output") from exc
        self._fh = fh
        try:
            self._load(fh)
        except BaseException:
            self._fh = None
            if self.journal.stat().st_size == 0:
                self.journal.unlink()
            fh.close()
            raise
        return self

    def _load(self, fh: IO[str]) -> None:
        for r in read_table(self.path, self.fmt):
            self.rows[str(r["cell"])] = r
        fh.seek(0)
        pending = 0
        for line in fh:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a run killed while writing it
            if isinstance(row, dict) and "cell" in row:
                self.rows[str(row["cell"])] = row
                pending += 1
        if pending:
            self.flush()

    def append(self, row: dict[str, Any], flush_interval: float | None = None) -> None:
        assert self._fh is not None, "ResultTable.open() first"
        self._fh.write(json.dumps(row, separators=(",", ":")) + "\n")
        self._fh.flush()  # in the kernel now: a killed process loses nothing written
        if time.monotonic() - self._synced >= self.sync_interval:  # and on disk, for a crash of the machine
            os.fsync(self._fh.fileno())
            self._synced = time.monotonic()
        self.rows[str(row["cell"])] = row
        if flush_interval is not None and time.monotonic() - self._flushed >= flush_interval:
            self.flush()

    def flush(self, first: Sequence[str] = ()) -> None:
        """Fold the journal into the table; rows whose keys are in ``first`` come first, in that order."""
        assert self._fh is not None, "ResultTable.open() first"
        order = [k for k in first if k in self.rows]
        chosen = set(order)
        order += [k for k in self.rows if k not in chosen]
        cols = _columns(list(self.rows.values()))
        self.rows = {k: {c: self.rows[k].get(c) for c in cols} for k in order}
        write_table(list(self.rows.values()), self.path, self.fmt)
        self._fh.truncate(0)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._flushed = time.monotonic()

    def close(self, first: Sequence[str] = ()) -> None:
        if self._fh is None:
            return
        try:
            self.flush(first)
        finally:
            fh, self._fh = self._fh, None
            with contextlib.suppress(OSError):
                self.journal.unlink()
            fh.close()


# ------------------------------------------------------------------------------------- the cluster


def _connect(scheduler: str, timeout: float) -> Client:
    from distributed import Client

    if "://" in scheduler:
        kwargs: dict[str, Any] = {"address": scheduler}
    elif Path(scheduler).is_file():
        kwargs = {"scheduler_file": scheduler}
    else:
        raise ValidationError(field="--scheduler", problem=f"{scheduler!r} is neither an address "
                              "(tcp://HOST:PORT) nor an existing scheduler file")
    try:
        return Client(timeout=timeout, set_as_default=False, **kwargs)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ClusterUnavailable(address=scheduler, problem=str(exc) or type(exc).__name__) from exc


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None,
                connect_timeout: float = 30.0) -> Iterator[Client]:
    """A client of the existing cluster at ``scheduler``, or of a new local cluster of ``workers``
    single-threaded worker processes (default: one per core), closed on exit."""
    if scheduler:
        client = _connect(scheduler, connect_timeout)
        try:
            yield client
        finally:
            client.close()
        return
    from distributed import Client, LocalCluster

    n = workers or os.cpu_count() or 1
    if n < 1:
        raise ValidationError(field="--workers", problem=f"{n} must be at least 1")
    import dask

    # the cluster's scratch space in a directory of its own, removed with the cluster (Dask's default,
    # TMPDIR/dask-scratch-space, outlives every run)
    scratch = tempfile.TemporaryDirectory(prefix="vmctl-dask-")
    # a SIGTERM (kill, systemd, a CI timeout) closes the cluster and removes the scratch space as Ctrl-C
    # does; without this the process died at once and left both behind
    stop = contextlib.ExitStack()
    stop.enter_context(sigterm_as_interrupt())
    try:
        with dask.config.set({"temporary-directory": scratch.name}):
            try:
                cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                                       silence_logs=logging.ERROR, local_directory=scratch.name)
            except (OSError, TimeoutError, RuntimeError) as exc:  # RuntimeError: "Nanny failed to start"
                raise ClusterUnavailable(address="a local cluster",
                                         problem=str(exc) or type(exc).__name__) from exc
            try:
                with Client(cluster, set_as_default=False) as client:
                    yield client
            finally:
                cluster.close()
    finally:
        scratch.cleanup()
        stop.close()


# ------------------------------------------------------------------------------------- the runner


@dataclass(slots=True)
class GridResult:
    """What :func:`run_grid` did: the rows of the grid's cells (grid order) and the counts."""

    rows: list[dict[str, Any]]
    ran: int
    skipped: int
    wall_s: float
    workers: int

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("error")]


def unique_cells(cells: Iterable[Cell]) -> list[Cell]:
    out: dict[str, Cell] = {}
    for c in cells:
        out.setdefault(c.key, c)
    return list(out.values())


def _progress(enabled: bool) -> Any:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn(), TextColumn("ETA"),
                    TimeRemainingColumn(), console=Console(stderr=True), disable=not enabled)


def run_grid(
    cells: Iterable[Cell],
    table: str | Path,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    fmt: str | None = None,
    retry_failed: bool = False,
    progress: bool = True,
    label: str = "cells",
    on_row: Callable[[dict[str, Any]], None] | None = None,
    flush_interval: float = 30.0,
    batch: int = 1,
) -> GridResult:
    """Run the cells not yet in ``table`` and return every cell's row (see the module docstring).

    ``batch``: cells per Dask task, for cells of a few milliseconds where the per-task cost of Dask
    (about a millisecond of scheduler time and a round trip) would dominate; a killed run then loses
    at most the batches in flight."""
    if batch < 1:
        raise ValidationError(field="batch", problem=f"{batch} must be at least 1")
    todo_all = unique_cells(cells)
    keys = [c.key for c in todo_all]
    t0 = time.perf_counter()
    results = ResultTable(table, fmt).open()
    n_workers = 0
    try:
        todo = [c for c in todo_all if c.key not in results.rows
                or (retry_failed and results.rows[c.key].get("error"))]
        if todo:
            tasks = math.ceil(len(todo) / batch)
            with dask_client(min(workers or os.cpu_count() or 1, tasks) if not scheduler else None,
                             scheduler) as client, _progress(progress) as bar:
                n_workers = len(client.nthreads())
                task = bar.add_task(label, total=len(todo), failed=0)
                n_failed = 0
                for c, res in _results(client, todo, batch):
                    row = make_row(c, res)
                    results.append(row, flush_interval)
                    n_failed += bool(row["error"])
                    bar.update(task, advance=1, failed=n_failed)
                    if on_row is not None:
                        on_row(row)
    finally:
        results.close(first=keys)
    return GridResult(rows=[results.rows[k] for k in keys], ran=len(todo), skipped=len(todo_all) - len(todo),
                      wall_s=time.perf_counter() - t0, workers=n_workers)


def execute_batch(cells: Sequence[tuple[str, Mapping[str, Scalar]]]) -> list[dict[str, Any]]:
    """:func:`execute` for several cells in one Dask task (cells of a few milliseconds)."""
    return [execute(function, inputs) for function, inputs in cells]


def _results(client: Client, todo: Sequence[Cell], batch: int) -> Iterator[tuple[Cell, dict[str, Any]]]:
    """Submit the cells, ``batch`` per Dask task, and yield (cell, result) as they finish; the cells of a
    task whose workers kept dying are yielded with the reason as their error."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    from vmctl import __version__

    futures = {}
    for i in range(0, len(todo), batch):
        part = list(todo[i:i + batch])
        name = part[0].key if len(part) == 1 else hashlib.sha256("".join(c.key for c in part).encode()).hexdigest()[:20]
        fut = client.submit(execute_batch, [(c.function, dict(c.inputs)) for c in part], key=f"vmctl-cells-{name}",
                            pure=False)
        futures[fut] = part
    for fut in as_completed(list(futures), loop=client.loop):
        part = futures.pop(fut)
        try:
            got: list[dict[str, Any]] = fut.result()
        except KilledWorker as exc:
            got = [{"metrics": {}, "wall_s": None, "host": None, "vmctl_version": __version__,
                    "error": f"KilledWorker: the workers running this cell died: {exc}"}] * len(part)
        fut.release()
        yield from zip(part, got, strict=True)
