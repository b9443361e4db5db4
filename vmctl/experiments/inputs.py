"""What the experiment entry points share around their cells: the real traces found the same way from
any working directory, one error per cause instead of one per cell, the ``python -m`` error handling of
the ``vmctl`` command, and a progress bar with an ETA for long single runs.

**Traces.** A trace option takes a path (absolute, or relative to the working directory) or a bare file
name, looked up in the folder of the real traces: ``$VMCTL_TRACE_DIR``, by default
``../shared/data/traces`` next to the checkout (relative to the repository, never to the working
directory). :func:`trace_ref` checks the file before any cell runs (``ValidationError`` naming the
option and the file: exit 2) and gives what the cell carries: the bare file name for a file of the trace
folder (so a results table holds no path of the machine that made it, and its keys do not depend on where
the command ran), the absolute path otherwise. :func:`trace_file` turns that back into a path where the
cell runs.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from vmctl import errors
from vmctl.errors import ValidationError

TRACE_DIR_ENV = "VMCTL_TRACE_DIR"
#: the repository's checkout (``vmctl/experiments/inputs.py`` -> the folder holding ``vmctl``)
REPO = Path(__file__).resolve().parents[2]


def trace_dir() -> Path:
    """The folder of the real traces: ``$VMCTL_TRACE_DIR``, else ``../shared/data/traces`` relative to the
    repository (not to the working directory)."""
    env = os.environ.get(TRACE_DIR_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return (REPO / ".." / "shared" / "data" / "traces").resolve()


def trace_ref(value: str, option: str) -> str:
    """Check the trace ``value`` of ``option`` (a path, or a file name in :func:`trace_dir`) and return
    what a cell carries (module docstring); ``ValidationError`` naming the file when it is not there."""
    given = Path(value).expanduser()
    if given.is_file():
        path = given.resolve()
    elif len(given.parts) == 1 and (trace_dir() / value).is_file():
        path = trace_dir() / value
    else:
        where = (f"not a file, nor a file of the trace folder {trace_dir()} (${TRACE_DIR_ENV})"
                 if len(given.parts) == 1 else f"no such file ({given.resolve()})")
        raise ValidationError(field=option, problem=f"{value}: {where}")
    return path.name if path.parent == trace_dir() else str(path)


def trace_file(ref: str) -> str:
    """What :func:`trace_ref` gave -> the file's path where the cell runs (a bare name is looked up in
    :func:`trace_dir` of that process; a path is used as it is)."""
    return str(trace_dir() / ref) if len(Path(ref).parts) == 1 else ref


def trace_cells_paths(folder: str | Path | None, names: Sequence[str], option: str = "--trace-dir") -> list[str]:
    """The cells' inputs for the traces ``names`` of ``folder`` (None: :func:`trace_dir`): the bare names
    when it is the trace folder, else the absolute paths; ``ValidationError`` naming the files it lacks."""
    where = trace_dir() if folder is None else Path(folder).expanduser().resolve()
    lacking = [n for n in names if not (where / n).is_file()]
    if lacking:
        more = f" (and {', '.join(lacking[1:])})" if len(lacking) > 1 else ""
        raise ValidationError(field=option, problem=f"no such file: {where / lacking[0]}{more}; give {option} or set "
                                                    f"${TRACE_DIR_ENV} to the folder of the SWF traces")
    return [n if where == trace_dir() else str(where / n) for n in names]


# ------------------------------------------------------------------------------------- failures


def error_groups(rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """The failed rows' errors, identical ones once with their count, in the order they first occur."""
    counts: dict[str, int] = {}
    for r in rows:
        if r.get("error"):
            counts[str(r["error"])] = counts.get(str(r["error"]), 0) + 1
    return list(counts.items())


def failure_summary(rows: Sequence[Mapping[str, Any]]) -> str:
    """``N of M cells failed: K x ERROR; ...``: one line per distinct error (empty when none failed)."""
    groups = error_groups(rows)
    if not groups:
        return ""
    failed = sum(n for _e, n in groups)
    lines = [f"{failed} of {len(rows)} cell(s) failed ({len(groups)} distinct error{'s' if len(groups) > 1 else ''}):"]
    lines += [f"- {n} x {err}" for err, n in groups]
    return "\n".join(lines)


def first_failure(rows: Sequence[Mapping[str, Any]], where: str = "") -> str:
    """The first error (after ``where``, what names its cell), and how many cells share it or failed
    otherwise (for ``CellsFailed``'s ``first``)."""
    groups = error_groups(rows)
    err, n = groups[0]
    err = f"{where}: {err}" if where else err
    more = [f"{n} cells with this error"] if n > 1 else []
    if len(groups) > 1:
        more.append(f"{len(groups) - 1} other distinct error(s)")
    return err + (f" [{'; '.join(more)}]" if more else "")


def raise_failed(rows: Sequence[Mapping[str, Any]], table: str | Path) -> None:
    """``CellsFailed`` (exit 7) when some of ``rows`` failed, its message naming each cause once."""
    groups = error_groups(rows)
    if groups:
        raise errors.CellsFailed(failed=sum(n for _e, n in groups), total=len(rows), first=first_failure(rows),
                                 table=str(table))


def run_main(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a ``python -m vmctl.experiments.X`` entry point as ``vmctl`` runs a command: a vmctl error is
    ``error: <reference>: message`` (and its hint) on stderr and its exit code (2 bad input, 7 failed
    cells, ...), never a traceback."""
    try:
        return main(argv)
    except errors.VmctlError as exc:
        print(f"error: {exc.reference}: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return errors.exit_code_for(exc)


# ------------------------------------------------------------------------------------- progress


@contextlib.contextmanager
def progress_bar(description: str, total: float, unit: str = "jobs", stream: IO[str] | None = None,
                 ) -> Iterator[Callable[[float], None] | None]:
    """A progress bar with elapsed time and ETA on ``stream`` (default stderr) when it is a terminal,
    removed at the end; ``None`` otherwise (nothing is printed: a pipe or a log stays clean). The caller
    reports the amount done so far (of ``total`` ``unit``)."""
    out = sys.stderr if stream is None else stream
    isatty = getattr(out, "isatty", None)
    if total <= 0 or not (callable(isatty) and isatty()):
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(file=out, force_terminal=True)
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:,.0f}/{task.total:,.0f} " + unit), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task(description, total=total)
        yield lambda done: bar.update(task, completed=done)
