"""SWF reader and writer: conventions, dropping rules, header parsing and every malformed-input error."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.support.workloads import to_model_job
from vmctl.errors import OutOfRange, TraceFormatError
from vmctl.model import Job
from vmctl.sim.workloads import Workload, WorkloadJob, read_swf, write_swf

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT.parent / "shared" / "data" / "traces"

HEADER = """; Version: 2.2
; Computer: test machine
; MaxNodes: 8 (a comment; with a semicolon)
; MaxProcs: 8
; Queue:  1  short
; Queue:  2  long
;
"""


def rec(
    job: int, submit: float, run: float, alloc: int, req_procs: int = -1, req_time: float = -1, user: int = 3
) -> str:
    f = [job, submit, 5, run, alloc, -1, -1, req_procs, req_time, -1, 1, user, 1, -1, 1, -1, -1, -1]
    return " ".join(str(x) for x in f)


def write(tmp_path: Path, body: str, name: str = "t.swf", header: str = HEADER) -> Path:
    p = tmp_path / name
    text = header + body
    if name.endswith(".gz"):
        p.write_bytes(gzip.compress(text.encode()))
    else:
        p.write_text(text)
    return p


def test_basic_fields_and_conventions(tmp_path: Path) -> None:
    body = "\n".join(
        [
            rec(1, 100, 50, 4, 4, 60),
            rec(2, 100, 30, -1, 2, -1),  # no allocation -> requested procs; no estimate -> run time
            rec(3, 120, 10, 1, -1, 5),  # estimate below the run time is kept (the engine decides)
        ]
    )
    w = read_swf(write(tmp_path, body + "\n"))
    assert w.max_procs == 8
    assert w.first_submit == 100.0
    assert w.dropped == {}
    assert w.jobs == [
        WorkloadJob(1, 100.0, 50.0, 4, 60.0, None, 3),
        WorkloadJob(2, 100.0, 30.0, 2, 30.0, None, 3),
        WorkloadJob(3, 120.0, 10.0, 1, 5.0, None, 3),
    ]


def test_ctc_quirk_requested_procs_missing_everywhere(tmp_path: Path) -> None:
    body = "\n".join(rec(i, i * 10, 100, alloc=i, req_procs=-1) for i in range(1, 6))
    w = read_swf(write(tmp_path, body))
    assert [j.procs for j in w.jobs] == [1, 2, 3, 4, 5]


def test_sorted_by_submit_then_id_and_times_not_shifted(tmp_path: Path) -> None:
    body = "\n".join([rec(7, 500, 1, 1), rec(5, 500, 1, 1), rec(9, 400, 1, 1)])
    w = read_swf(write(tmp_path, body))
    assert [(j.submit, j.id) for j in w.jobs] == [(400.0, 9), (500.0, 5), (500.0, 7)]
    assert w.first_submit == 400.0 and w.last_submit == 500.0


def test_dropping_rules_counted_once_each(tmp_path: Path) -> None:
    body = "\n".join(
        [
            rec(1, 0, 0, 2),  # run time 0
            rec(2, 0, -1, 2),  # run time unknown
            rec(3, 0, 0, 0),  # both bad: counted under run time only
            rec(4, 0, 10, -1, -1),  # no processor count at all
            rec(5, 0, 10, 9),  # wider than MaxProcs 8
            rec(6, 0, 10, 8),  # exactly the machine: kept
        ]
    )
    w = read_swf(write(tmp_path, body))
    assert [j.id for j in w.jobs] == [6]
    assert w.dropped == {"nonpositive_run_time": 3, "nonpositive_procs": 1, "wider_than_machine": 1}


def test_max_procs_argument_overrides_header(tmp_path: Path) -> None:
    body = "\n".join([rec(1, 0, 10, 4), rec(2, 0, 10, 8)])
    w = read_swf(write(tmp_path, body), max_procs=4)
    assert w.max_procs == 4 and [j.id for j in w.jobs] == [1]
    assert w.dropped == {"wider_than_machine": 1}


def test_header_parsed(tmp_path: Path) -> None:
    w = read_swf(write(tmp_path, rec(1, 0, 1, 1)))
    assert w.header["Version"] == "2.2"
    assert w.header["MaxNodes"] == "8 (a comment; with a semicolon)"
    assert w.header["MaxProcs"] == "8"
    assert w.header["Queue"] == "1  short\n2  long"  # repeated keys are joined
    assert w.source == str(tmp_path / "t.swf")


def test_gzip_and_plain_give_the_same_workload(tmp_path: Path) -> None:
    body = "\n".join(rec(i, i, 10 + i, 1 + i % 8) for i in range(1, 50))
    a = read_swf(write(tmp_path, body, "a.swf"))
    b = read_swf(write(tmp_path, body, "b.swf.gz"))
    assert a.jobs == b.jobs and len(a.jobs) == 49


def test_blank_lines_and_comments_between_records(tmp_path: Path) -> None:
    body = rec(1, 0, 1, 1) + "\n\n   ; a late comment\n  " + rec(2, 1, 1, 1) + "\n"
    w = read_swf(write(tmp_path, body))
    assert [j.id for j in w.jobs] == [1, 2]


def test_empty_trace(tmp_path: Path) -> None:
    w = read_swf(write(tmp_path, ""))
    assert w.jobs == [] and w.first_submit == 0.0 and w.max_procs == 8


# ------------------------------------------------------------------------------- malformed input
# HEADER has 7 lines, so the first record is line 8.


@pytest.mark.parametrize(
    ("body", "line", "problem"),
    [
        (rec(1, 0, 1, 1) + "\n1 2 3 4 5 6 7", 9, "expected 18 fields, got 7"),
        (rec(1, 0, 1, 1) + "\n" + rec(2, 0, 1, 1) + " 99", 9, "expected 18 fields, got 19"),
        # a short and a long line whose field counts add up to 2 x 18
        (rec(1, 0, 1, 1) + " 99\n" + rec(2, 0, 1, 1).rsplit(" ", 1)[0], 8, "expected 18 fields, got 19"),
        (rec(1, 0, 1, 1).rsplit(" ", 1)[0] + "\n" + rec(2, 0, 1, 1) + " 99", 8, "expected 18 fields, got 17"),
        (rec(1, 0, 1, 1).replace(" 3 1 -1", " x3 1 -1"), 8, "field 12 (user id) is not a number: 'x3'"),
        (rec(1, 0, "abc", 1), 8, "field 4 (run time) is not a number: 'abc'"),  # type: ignore[arg-type]
        (rec(1, 0, "nan", 1), 8, "field 4 (run time) is not a finite number: 'nan'"),  # type: ignore[arg-type]
        (rec(1, 0, 1, 1) + "\n" + rec(2, 0, "1-2", 1), 9, "field 4 (run time) is not a number: '1-2'"),  # type: ignore[arg-type]
        (rec(1, 0, 1, 1) + "\n" + rec(2, -5, 1, 1), 9, "field 2 (submit time) is negative: '-5'"),
        (rec(1, 0, 1, 2.5), 8, "field 5 (allocated processors) must be an integer, got '2.5'"),  # type: ignore[arg-type]
    ],
)
def test_malformed_record(tmp_path: Path, body: str, line: int, problem: str) -> None:
    p = write(tmp_path, body + "\n")
    with pytest.raises(TraceFormatError) as ei:
        read_swf(p)
    assert ei.value.fields["line"] == line
    assert ei.value.fields["problem"] == problem
    assert str(ei.value) == f"{p}:{line}: {problem}"


def test_semicolon_inside_a_record(tmp_path: Path) -> None:
    p = write(tmp_path, rec(1, 0, 1, 1) + "\n" + rec(2, 0, 1, 1) + " ; note\n")
    with pytest.raises(TraceFormatError) as ei:
        read_swf(p)
    assert str(ei.value) == f"{p}:9: ';' inside a record (comment lines must start with ';')"


def test_no_machine_size(tmp_path: Path) -> None:
    p = write(tmp_path, rec(1, 0, 1, 1), header="; Version: 2\n")
    with pytest.raises(TraceFormatError, match="no '; MaxProcs:' header and no machine size given"):
        read_swf(p)
    assert read_swf(p, max_procs=4).max_procs == 4


def test_bad_maxprocs_header(tmp_path: Path) -> None:
    p = write(tmp_path, rec(1, 0, 1, 1), header="; Version: 2\n; MaxProcs: lots\n")
    with pytest.raises(TraceFormatError) as ei:
        read_swf(p)
    assert str(ei.value) == f"{p}:2: header MaxProcs must be a positive integer, got 'lots'"


def test_bad_max_procs_argument(tmp_path: Path) -> None:
    with pytest.raises(OutOfRange):
        read_swf(write(tmp_path, rec(1, 0, 1, 1)), max_procs=0)


def test_corrupt_gzip(tmp_path: Path) -> None:
    good = gzip.compress((HEADER + rec(1, 0, 1, 1) + "\n").encode() * 50)
    p = tmp_path / "bad.swf.gz"
    p.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(TraceFormatError) as ei:
        read_swf(p)
    assert ei.value.fields["line"] == 0 and "corrupt gzip data" in ei.value.fields["problem"]
    p.write_bytes(good[:10] + b"\x00" * 40 + good[50:])  # garbled deflate stream
    with pytest.raises(TraceFormatError, match="corrupt gzip data"):
        read_swf(p)


def test_missing_and_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="no such file"):
        read_swf(tmp_path / "nope.swf")
    with pytest.raises(TraceFormatError, match="cannot read"):
        read_swf(tmp_path)  # a directory


# ------------------------------------------------------------------------------- writer


def test_write_then_read_round_trip(tmp_path: Path) -> None:
    jobs = [
        WorkloadJob(1, 0.0, 12.5, 3, 60.0, (1.0, 0.5, 0.7), 4),
        WorkloadJob(2, 3.25, 100.0, 1, 100.0, (1.0,), -1),
        WorkloadJob(3, 1e7 + 0.1, 7.0, 8, 3600.0, None, 9),
    ]
    w = Workload(jobs=jobs, max_procs=8, source="unit", header={"Note": "a\nb", "Computer": "model"})
    for name in ("w.swf", "w.swf.gz"):
        write_swf(w, tmp_path / name)
        back = read_swf(tmp_path / name)
        assert back.jobs == [WorkloadJob(j.id, j.submit, j.run_time, j.procs, j.estimate, None, j.user) for j in jobs]
        assert back.max_procs == 8
        assert back.header["Note"] == "a\nb" and back.header["Computer"] == "model"
        assert back.header["MaxRecords"] == "3"
    text = (tmp_path / "w.swf").read_text().splitlines()
    assert (
        text[-1].split() == ["3", "10000000.1", "-1", "7", "8", "-1", "-1", "8", "3600"] + ["-1", "1", "9"] + ["-1"] * 6
    )


def test_gz_output_is_deterministic(tmp_path: Path) -> None:
    w = Workload(jobs=[WorkloadJob(1, 0.0, 1.0, 1, 1.0, None)], max_procs=1, source="x")
    write_swf(w, tmp_path / "a.swf.gz")
    write_swf(w, tmp_path / "b.swf.gz")
    assert (tmp_path / "a.swf.gz").read_bytes() == (tmp_path / "b.swf.gz").read_bytes()


def test_write_to_unwritable_path(tmp_path: Path) -> None:
    w = Workload(jobs=[], max_procs=1, source="x")
    with pytest.raises(TraceFormatError, match="cannot write"):
        write_swf(w, tmp_path / "no" / "such" / "dir.swf")


# ------------------------------------------------------------------------------- model job


def test_to_model_job() -> None:
    w = WorkloadJob(42, 10.0, 100.0, 2, 300.0, (0.5, 0.9), 7)
    assert to_model_job(w, usage_known=True) == Job(
        id="42", submit_time=10.0, procs=2, estimate=300.0, cpu_usage=(0.5, 0.9), user="7"
    )
    hidden = to_model_job(w, usage_known=False)
    assert hidden.cpu_usage is None and hidden.estimate == 300.0
    assert to_model_job(WorkloadJob(1, 0.0, 1.0, 1, 1.0, None), usage_known=True).user == ""
    # the oracle is what the simulator builds on the fly for its policy's view
    from vmctl.sim.engine import _make_job

    for job in (w, WorkloadJob(1, 0.0, 1.0, 1, 1.0, None), WorkloadJob(3, 5.0, 9.0, 4, 20.0, None, -1, 2)):
        for known in (True, False):
            usage = job.cpu_usage if known else None
            user = str(job.user) if job.user >= 0 else ""
            assert _make_job(str(job.id), job.submit, job.procs, job.estimate, usage, job.priority, user) \
                == to_model_job(job, usage_known=known)


def test_workload_job_is_slotted_and_frozen() -> None:
    j = WorkloadJob(1, 0.0, 1.0, 1, 1.0, None)
    assert not hasattr(j, "__dict__")
    with pytest.raises(AttributeError):
        j.procs = 2  # type: ignore[misc]


# ------------------------------------------------------------------------------- real traces

# README.md of shared/data/traces: records per file; dropped = run time <= 0 (+ KTH's one job with
# neither allocated nor requested processors).
REAL = {
    "KTH-SP2-1996-2.1-cln.swf.gz": (28_476, 100, {"nonpositive_run_time": 8, "nonpositive_procs": 1}),
    "SDSC-SP2-1998-4.2-cln.swf.gz": (59_715, 128, {"nonpositive_run_time": 5_681}),
    "CTC-SP2-1996-3.1-cln.swf.gz": (77_222, 338, {"nonpositive_run_time": 17}),
    "HPC2N-2002-2.2-cln.swf.gz": (202_871, 240, {}),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_trace_counts(name: str) -> None:
    path = TRACES / name
    if not path.exists():
        pytest.skip(f"real trace {path} not present (shared data folder missing)")
    records, procs, dropped = REAL[name]
    w = read_swf(path)
    assert w.max_procs == procs
    assert w.dropped == dropped
    assert len(w.jobs) + sum(dropped.values()) == records
    assert all(j.procs > 0 and j.run_time > 0 and j.estimate > 0 for j in w.jobs)
    assert [j.submit for j in w.jobs] == sorted(j.submit for j in w.jobs)


def test_integer_and_decimal_records_read_alike(tmp_path: Path) -> None:
    """Integer-only traces take the int64 parse, a trace with one decimal field the float parse; both
    give float times and the same values (and the same types) as each other."""
    ints = read_swf(write(tmp_path, rec(1, 100, 50, 4, 4, 60) + "\n" + rec(2, 7, 3, 1, 1, 9) + "\n"))
    decimal = read_swf(write(tmp_path, rec(1, 100, 50, 4, 4, 60) + "\n" + rec(2, 7, 3, 1, 1, 9.5) + "\n", "d.swf"))
    assert ints.jobs == [WorkloadJob(2, 7.0, 3.0, 1, 9.0, None, 3), WorkloadJob(1, 100.0, 50.0, 4, 60.0, None, 3)]
    assert decimal.jobs == [WorkloadJob(2, 7.0, 3.0, 1, 9.5, None, 3), WorkloadJob(1, 100.0, 50.0, 4, 60.0, None, 3)]
    for w in (ints, decimal):
        assert all(type(j.submit) is float and type(j.estimate) is float and type(j.procs) is int for j in w.jobs)
    # a fractional processor count is still refused when the float parse reads the trace
    with pytest.raises(TraceFormatError, match=r"field 5 .* must be an integer"):
        read_swf(write(tmp_path, rec(1, 100, 50, 4, 4, 60).replace(" 4 ", " 4.5 ", 1) + "\n", "f.swf"))


# ------------------------------------------------------------------------------- chunked reading
# The reader takes the file in chunks of ``_CHUNK`` bytes cut after a newline and parses the records in
# blocks of ``_BLOCK`` lines (issue 27: memory). Tiny sizes put lines, CR LF pairs and blocks across
# every boundary; the workload, header and error lines must be those of one whole read.


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 22])
@pytest.mark.parametrize("block", [1, 2, 3, 32_768])
@pytest.mark.parametrize("name", ["t.swf", "t.swf.gz"])
def test_chunks_and_blocks_give_the_whole_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk: int,
                                               block: int, name: str) -> None:
    import vmctl.sim.workloads.swf as swf

    body = "\r\n".join(rec(j, 100 + j // 2, 10 + j, 1 + j % 8, -1, 20 + j) for j in range(1, 12)) + "\n"
    p = write(tmp_path, "; inside: a comment\n" + body + "\n  \n", name=name)
    whole = read_swf(p)
    assert len(whole.jobs) == 11 and "inside" in whole.header
    monkeypatch.setattr(swf, "_CHUNK", chunk)
    monkeypatch.setattr(swf, "_BLOCK", block)
    small = read_swf(p)
    assert small.jobs == whole.jobs
    assert (small.header, small.dropped, small.max_procs) == (whole.header, whole.dropped, whole.max_procs)


@pytest.mark.parametrize("block", [1, 2, 5])
def test_chunks_and_blocks_name_the_first_bad_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   block: int) -> None:
    import vmctl.sim.workloads.swf as swf

    monkeypatch.setattr(swf, "_CHUNK", 16)
    monkeypatch.setattr(swf, "_BLOCK", block)
    # a short line in the third record (line 10), a word in the fifth (line 12)
    lines = [rec(j, j, 5, 1) for j in range(1, 7)]
    lines[2] = lines[2].rsplit(" ", 1)[0]
    lines[4] = lines[4].replace(" 3 1 -1", " x3 1 -1")
    p = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError) as ei:
        read_swf(p)
    assert str(ei.value) == f"{p}:10: expected 18 fields, got 17"
