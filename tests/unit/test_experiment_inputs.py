"""Issue 25, the researcher's footguns: experiment entry points that run the same from any working
directory and check their files before any cell runs, one error line per cause, Table 1 sizes too small
for its loads refused or named, and a progress bar with an ETA on a terminal only
(``vmctl.experiments.inputs``, ``vmctl sim run``, ``vmctl moldable run``, ``vmctl sim gang-table1``)."""

from __future__ import annotations

import csv
import gzip
import io
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.livedaemon import run_cli
from vmctl.errors import ValidationError
from vmctl.experiments import inputs
from vmctl.experiments.runner import Cell, GridResult

ROOT = Path(__file__).resolve().parents[2]
GOLDEN_TRACE = ROOT / "tests" / "golden" / "sim" / "small-fw300.swf"


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal (what rich and the progress bar ask)."""

    def isatty(self) -> bool:
        return True


# ------------------------------------------------------------------------------------- progress


def test_the_progress_bar_shows_an_eta_on_a_terminal_and_nothing_otherwise() -> None:
    tty = FakeTerminal()
    with inputs.progress_bar("measy", 10, "jobs done", stream=tty) as tick:
        assert tick is not None
        tick(4)
    assert "measy" in tty.getvalue() and "ETA" in tty.getvalue() and "jobs done" in tty.getvalue()
    pipe = io.StringIO()
    with inputs.progress_bar("measy", 10, stream=pipe) as tick:
        assert tick is None
    assert pipe.getvalue() == ""


@pytest.fixture()
def small_trace(tmp_path: Path) -> Path:
    lines = GOLDEN_TRACE.read_text(encoding="utf-8").splitlines()
    data = [ln for ln in lines if not ln.startswith(";")][:60]
    path = tmp_path / "small.swf.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("; MaxProcs: 64\n" + "\n".join(data) + "\n")
    return path


def _cli_with_stderr(monkeypatch: pytest.MonkeyPatch, stderr: io.StringIO, *args: str) -> tuple[int, str]:
    """``vmctl ARGS`` in this process with ``stderr`` as sys.stderr; (exit code, stdout)."""
    from vmctl.cli.main import main

    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", stderr)
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue()


@pytest.mark.parametrize("tty", [True, False])
def test_sim_run_shows_progress_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, small_trace: Path,
                                                   tty: bool) -> None:
    err = FakeTerminal() if tty else io.StringIO()
    code, out = _cli_with_stderr(monkeypatch, err, "sim", "run", "--trace", str(small_trace), "--policy", "easy",
                                 "-o", "json")
    assert code == 0, err.getvalue()
    assert '"avg_response"' in out  # the result itself is unchanged on stdout
    assert ("ETA" in err.getvalue() and "/60 jobs done" in err.getvalue()) is tty, err.getvalue()


MOLDABLE = ("moldable", "run", "--policy", "hsret", "--slot", "360", "--rate", "4", "--slots", "30", "--clusters",
            "2", "--nodes", "40", "--warmup", "3", "--batches", "3", "-o", "json")


@pytest.mark.parametrize("tty", [True, False])
def test_moldable_run_shows_progress_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch, tty: bool) -> None:
    err = FakeTerminal() if tty else io.StringIO()
    code, out = _cli_with_stderr(monkeypatch, err, *MOLDABLE)
    assert code == 0, err.getvalue()
    assert '"aet"' in out
    assert ("ETA" in err.getvalue() and "arrival slots" in err.getvalue()) is tty, err.getvalue()


def test_moldable_run_fed_in_chunks_gives_simulate_s_results() -> None:
    from vmctl.cli.moldable import simulate_fed
    from vmctl.sim.moldable import MoldableConfig, simulate

    cfg = MoldableConfig(policy="hsret", slot=360.0, rate=4.0, slots=30, clusters=2, nodes=40, warmup=3, batches=3)
    ticks: list[float] = []
    fed = simulate_fed(cfg, ticks.append, step=4)
    whole = simulate(cfg)
    timing = ("wall_s", "slots_per_s")
    assert {k: v for k, v in fed.items() if k not in timing} == {k: v for k, v in whole.items() if k not in timing}
    assert ticks == sorted(ticks) and len(ticks) >= 7 and ticks[-1] >= 28  # one report per chunk of 4 slots


# ------------------------------------------------------------------------------------- traces


def test_a_trace_is_a_path_or_a_name_in_the_trace_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    (folder / "a.swf").write_text("x")
    other = tmp_path / "b.swf"
    other.write_text("x")
    monkeypatch.setenv("VMCTL_TRACE_DIR", str(folder))
    monkeypatch.chdir(tmp_path)
    assert inputs.trace_ref("a.swf", "--trace") == "a.swf"  # in the folder: the name, no machine's path
    assert inputs.trace_ref(str(folder / "a.swf"), "--trace") == "a.swf"
    assert inputs.trace_ref("b.swf", "--trace") == str(other)  # here: its absolute path
    assert inputs.trace_file("a.swf") == str(folder / "a.swf") and inputs.trace_file(str(other)) == str(other)
    with pytest.raises(ValidationError, match=r"--trace: c\.swf: not a file, nor a file of the trace folder"):
        inputs.trace_ref("c.swf", "--trace")
    monkeypatch.delenv("VMCTL_TRACE_DIR")
    assert inputs.trace_dir() == (ROOT / ".." / "shared" / "data" / "traces").resolve()  # not the working directory


def test_failures_are_one_line_per_cause_with_their_count() -> None:
    rows: list[dict[str, Any]] = [{"error": "TraceFormatError: x: no such file"}] * 40 + [{"error": None}] * 2
    rows.append({"error": "ValueError: other"})
    text = inputs.failure_summary(rows)
    assert text.splitlines() == ["41 of 43 cell(s) failed (2 distinct errors):",
                                 "- 40 x TraceFormatError: x: no such file", "- 1 x ValueError: other"]
    assert inputs.first_failure(rows) == ("TraceFormatError: x: no such file [40 cells with this error; 1 other "
                                          "distinct error(s)]")
    assert inputs.failure_summary([{"error": None}]) == ""


def _line(jid: int, submit: float, run: float, procs: int, walltime: float, queue: str) -> str:
    cpus = "{" + ",".join(["7"] * procs) + "}"
    return (f"{jid} {submit:g} 0 {run:g} {procs} 1 1024 {procs} {walltime:g} 1024 1 5 1 1 -1 1 1 1 {cpus} {queue} "
            f"1:ppn={procs}")


def _taskbags(cwd: Path, env_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VMCTL_TRACE_DIR": str(env_dir)}
    return subprocess.run([sys.executable, "-m", "vmctl.experiments.taskbags", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_taskbags_from_another_directory_checks_its_files_first_and_runs(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    empty = tmp_path / "empty"
    empty.mkdir()
    # no trace: one line naming the file, exit 2 (bad input), no cell run, no table
    bad = _taskbags(elsewhere, empty, "--out", "out")
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.splitlines()[0].startswith("error: validation-failed: --trace: wagap-2013.swf.gz: not a file")
    assert str(empty) in bad.stderr and "Traceback" not in bad.stderr and len(bad.stderr) < 400
    assert not (elsewhere / "out" / "results.csv").exists()
    # a malformed trace: its path and line, once, before any cell
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "wagap-2013.swf.machines").write_text("0\tzz\t1\t4\t1\t1000\n")
    with gzip.open(traces / "wagap-2013.swf.gz", "wt") as fh:
        fh.write(_line(0, 0, 100, 2, 100, "q_2w") + "\n" + _line(1, 10, 50, 4, 120, "q_3h") + "\n")
    bad = _taskbags(elsewhere, traces, "--out", "out")
    assert bad.returncode == 2 and bad.stderr.count("error:") == 1
    assert "wagap-2013.swf.gz:2: unknown queue" in bad.stderr
    # a good trace: the grid runs from here; its table names the trace, not this machine's path
    with gzip.open(traces / "wagap-2013.swf.gz", "wt") as fh:
        fh.write(_line(0, 0, 100, 2, 100, "q_2w") + "\n" + _line(1, 10, 50, 4, 120, "q_2h") + "\n")
    ok = _taskbags(elsewhere, traces, "--out", "out", "--sample", "1", "--speeds", "homogeneous")
    assert ok.returncode == 0, ok.stderr
    with (elsewhere / "out" / "results.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 20 and {r["trace"] for r in rows} == {"wagap-2013.swf.gz"} and not any(r["error"] for r in rows)
    assert "### homogeneous workers (4 workers, 2 jobs, sample 1/1" in ok.stdout


def test_a_sample_smaller_than_documented_says_so_in_the_header() -> None:
    from vmctl.experiments.taskbags import DOCUMENTED_SAMPLE, tables

    row = {"policy": "easy", "r": None, "conserving": False, "speeds": "homogeneous", "cores": 34, "jobs": 280,
           "seed": 1, "mean_response_h": 1.0, "deadlines_met": 0.5, "utilization": 0.5, "worst_wait_lowest_h": 1.0,
           **{f"wait_class{c}_h": 1.0 for c in range(4)}, "error": None}
    assert "SMALLER than the documented 1/8" in tables([{**row, "sample": 64}])
    assert "SMALLER" not in tables([{**row, "sample": DOCUMENTED_SAMPLE}])


def test_taskbags_tables_group_identical_errors() -> None:
    from vmctl.experiments.taskbags import tables

    err = "TraceFormatError[trace-format]: ../shared/data/traces/wagap-2013.swf.gz:0: no such file (at alea.py:1)"
    text = tables([{"policy": "easy", "r": None, "conserving": False, "speeds": "uniform", "error": err}] * 40)
    assert text.count("no such file") == 1 and f"- 40 x {err}" in text


# ------------------------------------------------------------------------------------- gang-table1


def _fake_grid(curve: dict[float, float]) -> Any:
    """``run_grid`` answering every gang cell from ``curve`` (offered load -> utilization): no simulation."""
    def run_grid(cells: Iterable[Cell], table: Any, **_kw: Any) -> GridResult:
        rows = [{**c.inputs, "utilization": curve.get(round(float(c.inputs["load"]), 2), max(curve.values())),
                 "avg_slowdown": 1.0 + float(c.inputs["load"]), "error": None} for c in cells]
        return GridResult(rows=rows, ran=len(rows), skipped=0, wall_s=0.0, workers=1)
    return run_grid


def test_out_of_reach_workloads() -> None:
    from vmctl.experiments.gang import out_of_reach, reach_note

    assert out_of_reach([(0.5, 0.36), (1.2, 0.512)]) == list(range(9))
    assert out_of_reach([(0.5, 0.48), (1.2, 0.916)]) == [7, 8]
    assert out_of_reach([(0.5, 0.5), (1.2, 0.98)]) == [] and reach_note([(0.5, 0.5), (1.2, 0.98)], 9) == ""
    note = reach_note([(0.5, 0.48), (1.1, 0.9), (1.2, 0.916)], 2000)
    assert note.startswith("workloads 7-8 (target rho 0.94-0.97) out of reach: BGS+M reaches at most rho 0.916 "
                           "(offered load 1.2) on 2,000 jobs")


def test_gang_table1_refuses_a_size_that_reaches_too_few_loads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from vmctl.experiments import runner

    # 500 jobs measured here: 0.358 at load 0.5, 0.482 at 0.9, 0.512 at 1.2: no workload's target reached
    curve = {0.5: 0.358, 0.6: 0.39, 0.7: 0.42, 0.8: 0.45, 0.9: 0.482, 1.0: 0.49, 1.1: 0.50, 1.2: 0.512}
    monkeypatch.setattr(runner, "run_grid", _fake_grid(curve))
    code, out, err = run_cli(capsys, "sim", "gang-table1", "--jobs", "500", "--out", str(tmp_path / "g"))
    assert code == 2, err
    assert "error: validation-failed: --jobs: 500 jobs are too few for Table 1's loads: workloads 0-8" in err
    assert "use --jobs 2000" in err and "Traceback" not in err and out == ""
    assert not (tmp_path / "g" / "table1.md").exists()


def test_gang_table1_names_the_workloads_sharing_the_last_load(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from vmctl.experiments import runner

    curve = {0.5: 0.46, 0.6: 0.55, 0.7: 0.62, 0.8: 0.69, 0.9: 0.757, 1.0: 0.79, 1.1: 0.81, 1.2: 0.828}
    monkeypatch.setattr(runner, "run_grid", _fake_grid(curve))
    code, out, err = run_cli(capsys, "sim", "gang-table1", "--jobs", "1000", "--out", str(tmp_path / "g"))
    assert code == 0, err
    assert "warning: workloads 5-8 (target rho 0.83-0.97) out of reach" in err
    assert "note: 1,000 jobs is SMALLER than the documented 2,000" in out and "note: workloads 5-8" in out
