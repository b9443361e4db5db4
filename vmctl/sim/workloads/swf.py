"""Standard Workload Format (SWF) reader and writer.

SWF (Parallel Workloads Archive, Feitelson et al.): one job per line, 18 whitespace-separated numeric
fields, ``-1`` = unknown; lines starting with ``;`` are header comments such as ``; MaxProcs: 128``.

Conventions chosen here (docs/workloads.md explains why):

- processors = allocated (field 5) if > 0, else requested (field 8): CTC-SP2 has field 8 = -1 for
  every job, and the allocation is what the job actually used;
- estimate = requested time (field 9) if > 0, else the run time (a perfect estimate);
- dropped, each counted once under the first reason that applies, in this order:
  ``nonpositive_run_time`` (run time <= 0: cancelled jobs, SDSC-SP2 has 5,681),
  ``nonpositive_procs`` (no processor count), ``wider_than_machine`` (more processors than the machine);
- jobs are sorted by submit time, then id; times are *not* shifted (``Workload.first_submit`` tells
  where the trace starts);
- the machine size is the ``max_procs`` argument if given, else the header's ``MaxProcs``;
- the user id (field 12) becomes the job's ``user``; SWF has no priority and no deadline field, so
  jobs have priority 0 and no deadline, unless ``priority_from_queue`` asks for the queue number
  (field 15) as the priority (-1, unknown, gives 0); the number's meaning (which queue is favoured)
  is the trace's own: check its header. Group (13) and partition (16) are not read.

Side file (``FILE.vmctl.json`` next to ``FILE``; written by ``vmctl history export``, docs/operations.md,
"The export format"): what SWF cannot hold. When it is present, :func:`read_swf` reads it too and, for
every job it lists (by SWF job number), takes its exact submit time (SWF holds whole seconds), its work
(the dedicated-core seconds the replay runs it for, ``work``), estimate, requested processors, priority,
deadline (same time base as the submit times), CPU usage and shape (moldable or task bag, into
``Workload.shapes``); ``read_side_file`` returns the whole document (the cluster it was exported from).
``side=False`` ignores it. A side file that is not valid JSON or not of this format is a
``TraceFormatError`` naming it; a bad value of a job's field names the field (``jobs.K.NAME``) and its
line in the side file.

Boot delays (the side file's ``boot``: a job's first run's start delay measured by vmctld, from its
start decision to the agents' first report of every process running; a real host's guest boot, a mock
host's control-loop pass). ``read_swf(..., boot=MODE)``:

- ``"own"`` (default): a job takes its own ``boot``; a job the side file lists without one takes the
  median of the side file's boots; a side file without any ``boot`` changes nothing (every result read
  without boots is the same, byte for byte);
- ``"median"``: every job the side file lists takes the median of the side file's boots (the reading
  that does not depend on where a job ran: ``vmctl whatif``'s other policies may place a job elsewhere);
- ``"none"``: boots are ignored;
- ``"node"``: as ``"own"``, except that a task bag takes no boot of its own: the execution model gives
  each of its workers the boot of the node it is placed on (the side file's header-level
  ``node_boots``, :class:`vmctl.sim.exec_taskbag.TaskBagModel`'s ``boots``; ``vmctl whatif``'s
  reading when the side file has them).

A job with a boot delay ``b`` holds its cores for ``b`` seconds before its work starts: its run time
and its estimate grow by ``b`` (vmctld counts a run's progress against the estimate from the first
report of its processes, after the boot; a task bag's estimate stays as submitted: vmctld sets a bag
no run-time limit and its decision maker saw that estimate); a moldable job's time at every width grows by ``b``; a task
bag's first ``max_workers`` tasks (the first task of each worker it can start with: each worker is a VM
that boots once per run) grow by ``b``. The boot passes at the job's own pace (a two-tier bg job's at
the share of its core it gets, as a bg guest boots on the cycles its fg VM leaves), and at a node's
speed in the task-bag and moldable models (the speeds of a replayed cluster are those of its nodes).

Malformed input raises :class:`vmctl.errors.TraceFormatError` naming the file and the line: wrong
field count, a non-numeric or non-finite field, a fractional id / processor count / user, a negative
submit time, an unreadable file or corrupt gzip data, a bad ``MaxProcs`` header, or no machine size.
The seven fields the reader uses (1, 2, 4, 5, 8, 9, 12; and 15 with ``priority_from_queue``) are
parsed strictly; the others are only checked for characters that cannot occur in a number (letters,
``nan``...), so a garbled number made of digits and signs such as ``1-2`` in, say, the queue field goes
unnoticed unless that field is read.

Speed and memory: the file is read in chunks of 4 MB and its records are parsed in blocks of 32,768
lines, each in one call to numpy's C ``loadtxt`` (as integers first, which is about 5x faster, then as
floats if a used field is not an integer) and validated with array operations; only when a check fails
is the offending line re-examined in Python to name the problem. Neither the whole text nor a copy of it
is held beside the lines (issue 27: HPC2N's parse peaked at ~170 MB above the interpreter).
HPC2N (202,871 jobs) parses in about 0.35 s on the project machine (``python -m bench.parse``).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from vmctl.errors import OutOfRange, TraceFormatError, VmctlError
from vmctl.model import JobShape
from vmctl.sim.workloads.core import JobTable, Workload, WorkloadJob, gc_paused

__all__ = ["BOOT_MODES", "FIELD_NAMES", "SIDE_FORMAT", "SIDE_SUFFIX", "read_side_file", "read_swf", "side_file_path",
           "side_line", "write_swf"]

#: the side file of ``FILE`` is ``FILE`` + this suffix; its ``format`` field is ``SIDE_FORMAT``
SIDE_SUFFIX = ".vmctl.json"
SIDE_FORMAT = "vmctl-swf-side/1"

#: the 18 SWF fields, 1-based in messages (``FIELD_NAMES[0]`` is field 1)
FIELD_NAMES: tuple[str, ...] = (
    "job id",
    "submit time",
    "wait time",
    "run time",
    "allocated processors",
    "average CPU time",
    "used memory",
    "requested processors",
    "requested time",
    "requested memory",
    "status",
    "user id",
    "group id",
    "executable",
    "queue",
    "partition",
    "preceding job",
    "think time",
)
N_FIELDS = len(FIELD_NAMES)

#: the 0-based SWF fields the reader uses, in the column order of its parsed array
_USED = (0, 1, 3, 4, 7, 8, 11)
# their columns in that array
_ID, _SUBMIT, _RUN, _ALLOC, _REQ_PROCS, _REQ_TIME, _USER = range(7)
_INTEGRAL = (_ID, _ALLOC, _REQ_PROCS, _USER)
_NUMBER_BYTES = b"0123456789.-+eE \t\n\r"
#: what loadtxt reads: the used fields plus the last one (so that a short line fails to parse)
_PARSED = (*_USED, N_FIELDS - 1)
#: the queue field (0-based), read only for ``priority_from_queue``: then column ``_QUEUE`` of the array
_QUEUE_FIELD = 14
_QUEUE = len(_USED)
_PARSED_QUEUE = (*_USED, _QUEUE_FIELD, N_FIELDS - 1)

_HEADER_RE = re.compile(r"^\s*;\s*([A-Za-z][A-Za-z0-9_ ]*?)\s*:\s*(.*?)\s*$")
_LEADING_INT_RE = re.compile(r"^\s*(\d+)")

DROP_RUN_TIME = "nonpositive_run_time"
DROP_PROCS = "nonpositive_procs"
DROP_WIDE = "wider_than_machine"

FloatArray = npt.NDArray[np.float64]


#: bytes of (decompressed) trace read at a time by :func:`_read_lines`
_CHUNK = 1 << 22


def _read_lines(path: Path) -> list[str]:
    """The file's lines, as ``text.splitlines()`` of its whole text would give them, read in chunks of
    ``_CHUNK`` bytes (gzip-compressed or plain): neither the compressed file, nor the whole decompressed
    text, nor its decoded copy is ever held at once (issue 27: they were 60 MB of HPC2N's parse peak).
    A chunk is cut after its last newline, so no line (nor a CR LF pair) is split between two chunks."""
    lines: list[str] = []
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
            fh.seek(0)
            src = gzip.GzipFile(fileobj=fh, mode="rb") if gz else fh
            rest = b""
            while chunk := src.read(_CHUNK):
                if rest:
                    chunk = rest + chunk
                cut = chunk.rfind(b"\n") + 1
                # SWF is ASCII; latin-1 never fails, so stray bytes in comments do not stop a read
                lines += chunk[:cut].decode("latin-1").splitlines()
                rest = chunk[cut:]
            if rest:
                lines += rest.decode("latin-1").splitlines()
    except FileNotFoundError as exc:
        raise TraceFormatError(path=str(path), line=0, problem="no such file") from exc
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
        raise TraceFormatError(path=str(path), line=0, problem=f"corrupt gzip data: {exc}") from exc
    except OSError as exc:
        raise TraceFormatError(path=str(path), line=0, problem=f"cannot read: {exc.strerror or exc}") from exc
    return lines


def _is_data(line: str) -> bool:
    return ";" not in line and bool(line) and not line.isspace()


def _line_problem(line: str, strict: tuple[int, ...] = ()) -> str | None:
    """Why one data line is malformed, or None. The single source of the reader's messages. ``strict``:
    more 0-based fields that must be integers (the queue, when it is read)."""
    tokens = line.split()
    if len(tokens) != N_FIELDS:
        return f"expected {N_FIELDS} fields, got {len(tokens)}"
    values: list[float] = []
    for k, tok in enumerate(tokens):
        try:
            v = float(tok)
        except ValueError:
            return f"field {k + 1} ({FIELD_NAMES[k]}) is not a number: {tok!r}"
        if not math.isfinite(v):
            return f"field {k + 1} ({FIELD_NAMES[k]}) is not a finite number: {tok!r}"
        values.append(v)
    for k in (*(_USED[c] for c in _INTEGRAL), *strict):
        if values[k] != math.floor(values[k]):
            return f"field {k + 1} ({FIELD_NAMES[k]}) must be an integer, got {tokens[k]!r}"
    if values[1] < 0:
        return f"field 2 (submit time) is negative: {tokens[1]!r}"
    return None


def _data_line_numbers(lines: Sequence[str]) -> list[int]:
    return [i + 1 for i, line in enumerate(lines) if _is_data(line)]


def _raise_at_row(path: Path, lines: Sequence[str], row: int, strict: tuple[int, ...] = ()) -> NoReturn:
    """Raise the error of the ``row``-th data line (0-based) of the file."""
    line_no = _data_line_numbers(lines)[row]
    problem = _line_problem(lines[line_no - 1], strict) or "malformed record"
    raise TraceFormatError(path=str(path), line=line_no, problem=problem)


def _raise_first_bad_line(path: Path, lines: Sequence[str], fallback: str) -> NoReturn:
    for i, line in enumerate(lines):
        if _is_data(line):
            problem = _line_problem(line)
            if problem is not None:
                raise TraceFormatError(path=str(path), line=i + 1, problem=problem)
    raise TraceFormatError(path=str(path), line=0, problem=fallback)


def _parse_header(path: Path, lines: Sequence[str], n_other: int) -> tuple[dict[str, str], int | None]:
    """Header comments -> dict, plus the header's MaxProcs. ``n_other`` is the number of non-data
    (comment or blank) lines: the scan stops after the last of them, i.e. right after the header in
    a usual SWF file, instead of walking every record."""
    header: dict[str, str] = {}
    header_max_procs: int | None = None
    seen = 0
    for i, line in enumerate(lines):
        if seen >= n_other:
            break
        s = line.lstrip()
        if s and s[0] != ";":
            if ";" in s:
                raise TraceFormatError(
                    path=str(path), line=i + 1, problem="';' inside a record (comment lines must start with ';')"
                )
            continue
        seen += 1
        m = _HEADER_RE.match(s)
        if m is None:
            continue
        key, value = m.group(1), m.group(2)
        header[key] = f"{header[key]}\n{value}" if key in header else value
        if key == "MaxProcs":
            n = _LEADING_INT_RE.match(value)
            if n is None or int(n.group(1)) <= 0:
                raise TraceFormatError(
                    path=str(path), line=i + 1, problem=f"header MaxProcs must be a positive integer, got {value!r}"
                )
            header_max_procs = int(n.group(1))
    return header, header_max_procs


def _parse_numbers(path: Path, lines: Sequence[str], data: list[str], usecols: tuple[int, ...]) -> FloatArray:
    """The ``usecols`` fields of every record, as floats. Traces usually hold integers only, which
    numpy's C parser reads about 5x faster as int64 (exactly: every int64 converts to the float that
    parsing its text as a float gives, both being the correctly rounded value); a field with a
    decimal point or an exponent makes that attempt fail, and the records are read as floats."""
    try:
        ints: npt.NDArray[np.int64] = np.loadtxt(data, dtype=np.int64, ndmin=2, comments=None, usecols=usecols)
        return ints.astype(np.float64)
    except ValueError:
        pass
    try:
        floats: FloatArray = np.loadtxt(data, dtype=np.float64, ndmin=2, comments=None, usecols=usecols)
    except ValueError as exc:  # a short line, or "1-2": only number characters, yet no number
        _raise_first_bad_line(path, lines, fallback=f"cannot parse: {exc}")
    return floats


#: records checked and parsed at a time (:func:`_parse_block`)
_BLOCK = 32_768


def _parse_block(path: Path, lines: Sequence[str], block: list[str], usecols: tuple[int, ...]) -> FloatArray:
    """The ``usecols`` fields of the records ``block`` (consecutive data lines of the file), after the
    cheap checks that let the C parser see well-formed numbers only: no character outside a number's
    alphabet appears anywhere in them (this also catches "nan"/"inf" and words in the fields not parsed),
    and they hold 18 fields each: the parser reads field 18, so no line has fewer, and the total count of
    fields is 18 per line, so no line has more."""
    blob = "\n".join(block).encode("latin-1")
    if blob.translate(None, _NUMBER_BYTES):
        _raise_first_bad_line(path, lines, fallback="unexpected character in a record")
    space = np.frombuffer(blob, dtype=np.uint8) <= 32  # after the check: blank, tab, CR, LF
    n_fields = int(np.count_nonzero(space[:-1] & ~space[1:])) + (0 if space[0] else 1)
    del space, blob
    if n_fields != N_FIELDS * len(block):
        _raise_first_bad_line(path, lines, fallback="wrong number of fields")
    return _parse_numbers(path, lines, block, usecols)


def side_file_path(path: str | PathLike[str]) -> Path:
    """Where the side file of the trace ``path`` is (``FILE.vmctl.json``)."""
    return Path(str(path) + SIDE_SUFFIX)


def read_side_file(path: str | PathLike[str]) -> dict[str, Any] | None:
    """The side file of the trace ``path`` as a JSON document (None when there is none); a side file
    that cannot be read, is not JSON or not of ``SIDE_FORMAT`` is a ``TraceFormatError`` naming it."""
    side = side_file_path(path)
    if not side.exists():
        return None
    try:
        doc = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(path=str(side), line=0, problem=f"cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise TraceFormatError(path=str(side), line=exc.lineno, problem=f"not JSON: {exc.msg}") from exc
    if not isinstance(doc, dict) or doc.get("format") != SIDE_FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise TraceFormatError(path=str(side), line=1, problem=f"not a vmctl side file (format {SIDE_FORMAT!r} "
                                                               f"expected, got {got!r})")
    if not isinstance(doc.get("jobs"), dict):
        raise TraceFormatError(path=str(side), line=1, problem="'jobs' must be an object of SWF job number -> job")
    return doc


#: ``read_swf``'s readings of the side file's boot delays (module docstring)
BOOT_MODES = ("own", "median", "none", "node")


def side_line(side: Path, key: str, name: str | None = None) -> int:
    """The 1-based line of field ``name`` of job ``key`` in the side file (of the job's entry when the
    field is not in it; 0 when the file cannot be read or has no such job): for error messages only."""
    try:
        text = side.read_text(encoding="utf-8")
        at = text.index('"jobs"')
    except (OSError, UnicodeDecodeError, ValueError):
        return 0
    m = re.compile(r'"' + re.escape(key) + r'"\s*:\s*\{').search(text, at)
    if m is None:
        return 0
    pos = m.end() - 1
    if name is not None:
        try:
            end = json.JSONDecoder().raw_decode(text, pos)[1]
        except json.JSONDecodeError:
            end = len(text)
        f = re.compile(r'"' + re.escape(name) + r'"\s*:').search(text, pos, end)
        if f is not None:
            pos = f.start()
    return text.count("\n", 0, pos) + 1


def _side_number(side: Path, key: str, entry: Mapping[str, Any], name: str, lo: float, *, optional: bool = False
                 ) -> float | None:
    v = entry.get(name)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < lo:
        raise TraceFormatError(path=str(side), line=side_line(side, key, name),
                               problem=f"jobs.{key}.{name} must be a number >= {lo:g}{' or null' if optional else ''}"
                                       f", got {v!r}")
    return float(v)


def _boots(side: Path, entries: Mapping[str, Any], mode: str) -> tuple[dict[str, float], float | None]:
    """Each listed job's boot delay as the side file gives it (checked: a number >= 0 or null/absent) and
    what a job without one takes under ``mode`` (module docstring): the median of the side file's boots,
    or None (no boot at all: nothing changes)."""
    if mode not in BOOT_MODES:
        raise OutOfRange(what="boot", value=mode, allowed=" | ".join(BOOT_MODES))
    own: dict[str, float] = {}
    for key, e in entries.items():
        if isinstance(e, dict) and "boot" in e:
            b = _side_number(side, key, e, "boot", 0.0, optional=True)
            if b is not None:
                own[key] = b
    if mode == "none" or not own:
        return {}, None
    med = float(np.median(np.fromiter(own.values(), dtype=np.float64)))
    return ({} if mode == "median" else own), med


def job_boots(path: str | PathLike[str], boot: str = "own") -> dict[str, float]:
    """The boot delay ``read_swf(path, boot=boot)`` adds to each job of the trace's side file, by SWF job
    number (jobs without one, or with 0, are not listed; empty without a side file). A model that passes
    a job's boot its own way (:class:`vmctl.sim.timeslice.TimeSliceModel`'s ``boots``: in wall time,
    not by its row's slices) reads them here."""
    doc = read_side_file(path)
    if doc is None:
        return {}
    entries: Mapping[str, Any] = doc["jobs"]
    own, default = _boots(side_file_path(path), entries, boot)
    out: dict[str, float] = {}
    for key, e in entries.items():
        b = own.get(key, default)
        if b and isinstance(e, dict) and (_num_or_none(e.get("work")) or 0.0) > 0 \
                and (_num_or_none(e.get("estimate")) or 0.0) > 0:
            out[key] = b
    return out


def _num_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _booted_shape(shape: JobShape, boot: float) -> JobShape:
    """``shape`` with ``boot`` seconds before its work (module docstring)."""
    import dataclasses

    if shape.kind == "moldable":
        return dataclasses.replace(shape, times=tuple(t + boot for t in shape.times))
    if shape.kind == "task-bag":
        first = min(shape.max_workers, len(shape.tasks))
        return dataclasses.replace(shape, tasks=tuple(t + boot if k < first else t for k, t in enumerate(shape.tasks)))
    return shape


def _apply_side(side: Path, doc: Mapping[str, Any], jobs: list[WorkloadJob], shapes: dict[int, JobShape],
                boot: str = "own") -> list[WorkloadJob]:
    """The jobs with what the side file says of them (see the module docstring)."""
    from vmctl.shapes import shape_from_json

    entries: Mapping[str, Any] = doc["jobs"]
    own_boot, default_boot = _boots(side, entries, boot)
    out: list[WorkloadJob] = []
    for j in jobs:
        key = str(j.id)
        e = entries.get(key)
        if e is None:
            out.append(j)
            continue
        if not isinstance(e, dict):
            raise TraceFormatError(path=str(side), line=0, problem=f"jobs.{key} must be an object")
        submit = _side_number(side, key, e, "submit", 0.0)
        work = _side_number(side, key, e, "work", 0.0)
        estimate = _side_number(side, key, e, "estimate", 0.0)
        deadline = _side_number(side, key, e, "deadline", 0.0, optional=True)
        procs = e.get("procs", j.procs)
        prio = e.get("priority", 0)
        if isinstance(procs, bool) or not isinstance(procs, int) or procs < 1:
            raise TraceFormatError(path=str(side), line=0, problem=f"jobs.{key}.procs must be an integer >= 1")
        if isinstance(prio, bool) or not isinstance(prio, int):
            raise TraceFormatError(path=str(side), line=0, problem=f"jobs.{key}.priority must be an integer")
        usage = e.get("cpu_usage")
        if usage is not None and (not isinstance(usage, list) or len(usage) != procs or not all(
                isinstance(u, int | float) and not isinstance(u, bool) and 0 < u <= 1 for u in usage)):
            raise TraceFormatError(path=str(side), line=0, problem=f"jobs.{key}.cpu_usage must be {procs} numbers "
                                                                   "in (0, 1]")
        if e.get("shape") is not None:
            try:
                shapes[j.id] = shape_from_json(e["shape"], f"jobs.{key}.shape")
            except VmctlError as exc:
                raise TraceFormatError(path=str(side), line=0, problem=str(exc)) from exc
        assert submit is not None and work is not None and estimate is not None
        if work <= 0 or estimate <= 0:
            out.append(j)
            continue
        b = own_boot.get(key, default_boot)
        bag = j.id in shapes and shapes[j.id].kind == "task-bag"
        if b and not (bag and boot == "node"):  # None (no boots in the side file) or 0: the job as before
            # vmctld sets a task bag no run-time limit, and its decision maker sees the estimate as submitted
            work, estimate = work + b, estimate if bag else estimate + b
            if j.id in shapes:
                shapes[j.id] = _booted_shape(shapes[j.id], b)
        out.append(WorkloadJob(id=j.id, submit=submit, run_time=work, procs=procs, estimate=estimate,
                               cpu_usage=None if usage is None else tuple(float(u) for u in usage), user=j.user,
                               priority=prio, deadline=deadline))
    out.sort(key=lambda x: (x.submit, x.id))
    return out


def read_swf(path: str | PathLike[str], max_procs: int | None = None, *, priority_from_queue: bool = False,
             side: bool = True, boot: str = "own") -> Workload:
    """Read an SWF trace (plain or gzip-compressed) into a :class:`Workload`.

    ``max_procs`` is the size of the simulated machine; it overrides the header's ``MaxProcs``
    (jobs wider than it are dropped). ``priority_from_queue``: each job's priority is its queue number
    (field 15, parsed strictly then; -1 gives 0); without it every job has priority 0. See the module
    docstring for the conventions; ``boot``: how the side file's boot delays apply (``BOOT_MODES``,
    module docstring).
    """
    p = Path(path)
    if max_procs is not None and max_procs <= 0:
        raise OutOfRange(what="max_procs", value=max_procs, allowed="a positive number of processors")
    lines = _read_lines(p)
    # records: lines without ";" that are not blank (memchr and isspace run in C, no copies)
    data = [line for line in lines if ";" not in line and line and not line.isspace()]
    header, header_max_procs = _parse_header(p, lines, len(lines) - len(data))
    machine = max_procs if max_procs is not None else header_max_procs
    if machine is None:
        raise TraceFormatError(
            path=str(p), line=1, problem="no '; MaxProcs:' header and no machine size given (--procs)"
        )
    if not data:
        return Workload(jobs=[], max_procs=machine, source=str(p), dropped={}, header=header)

    with gc_paused():
        strict = (_QUEUE_FIELD,) if priority_from_queue else ()
        usecols = _PARSED_QUEUE if priority_from_queue else _PARSED
        # The records are checked and parsed in blocks of ``_BLOCK`` lines: the temporaries of the
        # checks (a bytes copy of the block and masks of its bytes) then stay a few MB whatever the
        # trace's size, instead of several copies of the whole text (issue 27: HPC2N's parse peaked
        # at 170 MB). A block's checks and numbers are those of the whole file restricted to its lines.
        # (each block's numbers go straight into one array: no list of blocks beside their concatenation)
        arr = np.empty((len(data), len(usecols)), dtype=np.float64)
        for k in range(0, len(data), _BLOCK):
            arr[k:k + _BLOCK] = _parse_block(p, lines, data[k:k + _BLOCK], usecols)

        bad = ~np.isfinite(arr).all(axis=1)
        for k in (*_INTEGRAL, _QUEUE) if priority_from_queue else _INTEGRAL:
            bad |= arr[:, k] != np.floor(arr[:, k])
        bad |= arr[:, _SUBMIT] < 0
        if bad.any():
            _raise_at_row(p, lines, int(np.flatnonzero(bad)[0]), strict)
        del lines, data  # the job objects below are the workload's memory; the text is not needed any more

        run = arr[:, _RUN]
        procs = np.where(arr[:, _ALLOC] > 0, arr[:, _ALLOC], arr[:, _REQ_PROCS])
        drop_run = run <= 0
        drop_procs = ~drop_run & (procs <= 0)
        drop_wide = ~drop_run & ~drop_procs & (procs > machine)
        keep = ~(drop_run | drop_procs | drop_wide)
        dropped = {
            reason: int(mask.sum())
            for reason, mask in ((DROP_RUN_TIME, drop_run), (DROP_PROCS, drop_procs), (DROP_WIDE, drop_wide))
            if mask.any()
        }

        # the kept rows in (submit, id) order, taken column by column (no copy of the whole array)
        rows = np.flatnonzero(keep)
        order = rows[np.lexsort((arr[rows, _ID], arr[rows, _SUBMIT]))]
        del rows, keep, drop_run, drop_procs, drop_wide
        krun = arr[order, _RUN]
        req_time = arr[order, _REQ_TIME]
        kest = np.where(req_time > 0, req_time, krun)
        del req_time
        # the jobs as columns (issue 27: no object per record; ``JobTable`` builds them when asked)
        jobs: Sequence[WorkloadJob] = JobTable(
            arr[order, _ID].astype(np.int64), arr[order, _SUBMIT], krun, procs[order].astype(np.int64), kest,
            arr[order, _USER].astype(np.int64),
            np.maximum(arr[order, _QUEUE], 0).astype(np.int64) if priority_from_queue else None)
        del arr, run, procs, krun, kest, order
    doc = read_side_file(p) if side else None
    if doc is None:
        return Workload(jobs=jobs, max_procs=machine, source=str(p), dropped=dropped, header=header)
    shapes: dict[int, JobShape] = {}
    jobs = _apply_side(side_file_path(p), doc, list(jobs), shapes, boot)
    return Workload(jobs=jobs, max_procs=machine, source=str(p), dropped=dropped, header=header, shapes=shapes)


def _num(x: float) -> str:
    """Shortest exact text for a number: integers without a decimal point."""
    if x == math.floor(x) and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


def write_swf(workload: Workload, path: str | PathLike[str]) -> None:
    """Write ``workload`` as an 18-field SWF file (gzip-compressed when ``path`` ends in ``.gz``).

    Unknown fields are ``-1``; requested processors = allocated = ``procs``; requested time = the
    estimate; status 1 (completed); a positive priority is written as the queue number (field 15), as
    ``read_swf(..., priority_from_queue=True)`` reads it back (a priority <= 0 is not written). CPU usage
    has no SWF field and is not written (regenerate it from the seed). Reading the file back gives the
    same jobs, sorted the same way.
    """
    p = Path(path)
    own = {
        "Version": "2.2",
        "MaxJobs": str(len(workload.jobs)),
        "MaxRecords": str(len(workload.jobs)),
        "MaxProcs": str(workload.max_procs),
    }
    out: list[str] = [f"; {k}: {v}" for k, v in own.items()]
    if "Note" not in workload.header:
        out.append(f"; Note: written by vmctl from {workload.source}")
    for key, value in workload.header.items():
        if key in own:
            continue
        out.extend(f"; {key}: {part}" for part in value.split("\n"))
    for j in workload.jobs:
        fields = (
            str(j.id), _num(j.submit), "-1", _num(j.run_time), str(j.procs), "-1", "-1", str(j.procs),
            _num(j.estimate), "-1", "1", str(j.user), "-1", "-1", str(j.priority) if j.priority > 0 else "-1", "-1",
            "-1", "-1",
        )  # fmt: skip
        out.append(" ".join(fields))
    text = "\n".join(out) + "\n"
    try:
        if p.name.endswith(".gz"):
            with open(p, "wb") as fh, gzip.GzipFile(filename="", fileobj=fh, mode="wb", mtime=0) as gz:
                gz.write(text.encode("ascii"))
        else:
            p.write_text(text, encoding="ascii")
    except OSError as exc:
        raise TraceFormatError(path=str(p), line=0, problem=f"cannot write: {exc.strerror or exc}") from exc
