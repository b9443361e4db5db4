"""``vmctl sim`` from the command line: JSON keys, tables, error references and exit codes, no
tracebacks for bad input, the sweep's CSV and plots."""

from __future__ import annotations

import csv
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.livedaemon import run_cli

GOLDEN_TRACE = Path(__file__).resolve().parents[1] / "golden" / "sim" / "small-fw300.swf"


vmctl = run_cli


@pytest.fixture()
def small_trace(tmp_path: Path) -> Path:
    lines = GOLDEN_TRACE.read_text(encoding="utf-8").splitlines()
    data = [ln for ln in lines if not ln.startswith(";")][:60]
    path = tmp_path / "small.swf.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("; MaxProcs: 64\n" + "\n".join(data) + "\n")
    return path


def test_run_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str], small_trace: Path) -> None:
    code, out, err = vmctl(capsys, "sim", "run", "--trace", str(small_trace), "--policy", "measy",
                           "--param", "migration_cost=60", "--output", "json")
    assert code == 0, err
    doc = json.loads(out)
    for key in ("jobs", "avg_wait", "avg_response", "avg_bounded_slowdown", "utilization", "makespan",
                "migrations", "kills", "dropped", "ci95"):
        assert key in doc
    assert doc["jobs"] == 60
    assert doc["params"]["migration_cost"] == 60.0
    assert isinstance(doc["avg_response"], float) and doc["avg_response"] > 0
    assert set(doc["kills"]) == {"estimate", "policy"}


def test_run_table_and_procs_override(capsys: pytest.CaptureFixture[str], small_trace: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # the table's layout, whatever terminal runs the tests
    code, out, _ = vmctl(capsys, "sim", "run", "--trace", str(small_trace), "--policy", "easy", "--procs", "16")
    assert code == 0
    assert "average bounded slowdown" in out
    # the machine row, not the title: a title with the whole trace path wrapped at 80 columns and split "16 cores"
    assert re.search(r"machine\s*│\s*16 cores", out), out
    assert str(small_trace.parent) not in out  # the title names the trace file, not its directory
    assert "wider than the machine" in out or "wider_than_machine" in out


def test_no_cpu_info_and_full_usage_change_the_result(capsys: pytest.CaptureFixture[str], small_trace: Path) -> None:
    base = ("sim", "run", "--trace", str(small_trace), "--procs", "32", "--policy", "measy", "--output", "json")
    docs = []
    for extra in ((), ("--no-cpu-info",), ("--cpu-usage", "full")):
        code, out, err = vmctl(capsys, *base, *extra)
        assert code == 0, err
        docs.append(json.loads(out))
    assert docs[1]["params"]["use_cpu_info"] is False
    assert docs[0]["avg_response"] != docs[1]["avg_response"]
    assert docs[0]["avg_response"] != docs[2]["avg_response"]


@pytest.mark.parametrize(
    ("args", "reference"),
    [
        (("--trace", "/nonexistent/x.swf", "--policy", "easy"), "trace-format"),
        (("--trace", "{bad}", "--policy", "easy"), "trace-format"),
        (("--trace", "{good}", "--policy", "nosuch"), "unknown-policy"),
        (("--trace", "{good}", "--policy", "measy", "--param", "migration_cost=abc"), "policy-parameter"),
        (("--trace", "{good}", "--policy", "measy", "--param", "nosuch=1"), "policy-parameter"),
        (("--trace", "{good}", "--policy", "measy", "--param", "migration_cost=-5"), "policy-parameter"),
        (("--policy", "easy"), "validation-failed"),
        (("--trace", "{good}", "--policy", "easy", "--load", "-1"), "out-of-range"),
    ],
)
def test_bad_input_is_a_located_error_with_exit_2(
    capsys: pytest.CaptureFixture[str], small_trace: Path, tmp_path: Path, args: tuple[str, ...], reference: str
) -> None:
    bad = tmp_path / "bad.swf"
    bad.write_text("; MaxProcs: 8\n1 0 -1 10 2 -1 -1 2 20 -1 1\n", encoding="utf-8")
    argv = [a.replace("{good}", str(small_trace)).replace("{bad}", str(bad)) for a in args]
    code, _out, err = vmctl(capsys, "sim", "run", *argv)
    assert code == 2
    assert err.startswith(f"error: {reference}: "), err
    assert "Traceback" not in err
    if reference == "trace-format" and "bad" in argv[1]:
        assert "bad.swf:2" in err  # names the file and the line


def test_subprocess_error_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "vmctl.cli.main", "sim", "run", "--trace", str(tmp_path / "none.swf"),
                           "--policy", "easy"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: trace-format: ")
    assert "Traceback" not in proc.stderr


def test_sweep_writes_csv_and_plots(capsys: pytest.CaptureFixture[str], small_trace: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "sweep"
    code, out, err = vmctl(capsys, "sim", "sweep", "--trace", str(small_trace), "--policies", "easy,keasy,measy",
                           "--loads", "0.6,0.9", "--migration-costs", "20,600", "--workers", "2",
                           "--out", str(out_dir))
    assert code == 0, err
    summary = json.loads(out)
    with (out_dir / "results.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    # easy, keasy: 2 loads each; measy: 2 loads x 2 costs
    assert summary["runs"] == len(rows) == 8
    assert {r["policy"] for r in rows} == {"easy", "keasy", "measy"}
    assert {r["migration_cost"] for r in rows if r["policy"] == "measy"} == {"20.0", "600.0"}
    for name in ("response_vs_load.png", "slowdown_vs_load.png", "migrations_vs_load.png", "migration_cost.png"):
        png = out_dir / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    # the markdown comparison: one row per policy and load, gains against easy
    code, table, err = vmctl(capsys, "sim", "compare", str(out_dir / "results.csv"))
    assert code == 0, err
    keasy_rows = [ln for ln in table.splitlines() if ln.startswith("| ") and "| keasy |" in ln]
    assert len(keasy_rows) == 2 + 1  # two loads + the summary line
    assert "response vs easy: mean / best" in table
    # the same point run alone gives the same numbers as in the sweep
    code, out, _ = vmctl(capsys, "sim", "run", "--trace", str(small_trace), "--policy", "keasy", "--load", "0.9",
                         "--output", "json")
    single = json.loads(out)
    row = next(r for r in rows if r["policy"] == "keasy" and r["load"] == "0.9")
    assert float(row["avg_response"]) == pytest.approx(single["avg_response"], rel=1e-12)


def test_sweep_rejects_a_parameter_no_policy_takes(capsys: pytest.CaptureFixture[str], small_trace: Path,
                                                  tmp_path: Path) -> None:
    code, _, err = vmctl(capsys, "sim", "sweep", "--trace", str(small_trace), "--policies", "easy",
                         "--param", "migration_cost=5", "--out", str(tmp_path / "o"))
    assert code == 2 and err.startswith("error: policy-parameter: ")


def test_compare_rejects_a_file_that_is_not_a_sweep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    code, _, err = vmctl(capsys, "sim", "compare", str(bad))
    assert code == 2 and err.startswith("error: instance-format: ") and "x.csv" in err
    code, _, err = vmctl(capsys, "sim", "compare", str(tmp_path / "missing.csv"))
    assert code == 2 and "missing.csv" in err


def test_sweep_rerun_skips_every_run_and_rewrites_the_same_csv(capsys: pytest.CaptureFixture[str], small_trace: Path,
                                                             tmp_path: Path) -> None:
    out_dir = tmp_path / "sweep"
    args = ["sim", "sweep", "--trace", str(small_trace), "--policies", "easy,measy", "--loads", "0.6,0.9",
            "--migration-costs", "20,600", "--workers", "2", "--out", str(out_dir), "--no-plots"]
    code, out, err = vmctl(capsys, *args)
    assert code == 0, err
    assert json.loads(out)["ran"] == 6
    # progress lines: the cost only where the policy takes one, never an empty "cost=:"
    assert "cost=:" not in err and "cost=" in err
    assert re.search(r"^\[\d\] easy load=0\.6 seed=1: response ", err, re.M)
    assert re.search(r"^\[\d\] measy load=0\.9 seed=1 cost=600: response ", err, re.M)
    first = (out_dir / "results.csv").read_text()
    code, out, err = vmctl(capsys, *args)
    assert code == 0, err
    assert (json.loads(out)["ran"], json.loads(out)["skipped"]) == (0, 6)
    assert (out_dir / "results.csv").read_text() == first
    from vmctl.experiments.runner import read_table

    table = read_table(out_dir / "results.parquet")
    assert len(table) == 6 and all(r["error"] is None and r["vmctl_version"] for r in table)
    assert {"policy", "load", "seed", "migration_cost", "avg_response", "ci_response", "wall_s"} <= set(table[0])


def test_sweep_reports_failing_runs_with_their_inputs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.swf"
    bad.write_text("1 0 0 10\n", encoding="utf-8")
    code, out, err = vmctl(capsys, "sim", "sweep", "--trace", str(bad), "--policies", "easy,fcfs", "--workers", "1",
                           "--out", str(tmp_path / "o"))
    assert code == 7
    assert json.loads(out)["failed"] == 2
    assert "error: cells-failed: 2 of 2 cells failed (first: easy seed=1: TraceFormatError[trace-format]: " in err
    assert str(tmp_path / "o" / "results.parquet") in err
    assert "Traceback" not in err


def test_sweep_out_that_cannot_be_written_is_a_clear_error(capsys: pytest.CaptureFixture[str], small_trace: Path,
                                                          tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("", encoding="utf-8")
    code, _, err = vmctl(capsys, "sim", "sweep", "--trace", str(small_trace), "--policies", "easy",
                         "--out", str(blocker / "sub"))
    assert code == 2
    assert err.startswith("error: validation-failed: --out: cannot write to ") and "Traceback" not in err


def test_sweep_plots_have_interval_bars_one_line_per_cost_and_visible_zero_lines() -> None:
    import matplotlib.pyplot as plt

    from vmctl.sim.plots import _draw, _series

    def row(policy: str, load: float, seed: int, cost: float | None, resp: float, ci: float,
            migr: int) -> dict[str, Any]:
        return {"policy": policy, "load": load, "seed": seed, "migration_cost": "" if cost is None else cost,
                "avg_response": resp, "ci_response": ci, "migrations": migr}

    rows = [row("easy", 0.5, 1, None, 100.0, 3.0, 0), row("easy", 0.5, 2, None, 120.0, 4.0, 0),
            row("keasy", 0.5, 1, None, 90.0, 2.0, 0),
            row("measy", 0.5, 1, 20.0, 80.0, 1.0, 7), row("measy", 0.5, 1, 600.0, 95.0, 1.0, 2)]
    resp = _series(rows, "load", "avg_response", by_cost=True)
    assert list(resp) == ["easy", "keasy", "measy, cost 20 s", "measy, cost 600 s"]
    assert resp["easy"][0.5] == pytest.approx((110.0, 2.5))  # mean of two seeds, sqrt(3^2 + 4^2) / 2
    fig, ax = plt.subplots()
    try:
        _draw(ax, _series(rows, "load", "migrations", by_cost=True))
        labels = [t.get_text() for t in ax.legend().get_texts()]
        assert labels == ["easy (0 everywhere)", "keasy (0 everywhere)", "measy, cost 20 s", "measy, cost 600 s"]
        lines = [c.lines[0] for c in ax.containers]
        assert len({ln.get_marker() for ln in lines}) == 4
        assert lines[0].get_markersize() > lines[1].get_markersize()  # easy's marker shows around keasy's
        ax.clear()
        _draw(ax, resp)
        assert all(c.has_yerr for c in ax.containers)
    finally:
        plt.close(fig)


def test_plots_are_redrawn_from_the_table_without_running_anything(capsys: pytest.CaptureFixture[str],
                                                                   small_trace: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "sweep"
    code, _, err = vmctl(capsys, "sim", "sweep", "--trace", str(small_trace), "--policies", "easy,measy",
                         "--loads", "0.6,0.9", "--workers", "1", "--out", str(out_dir), "--no-plots")
    assert code == 0, err
    assert not list(out_dir.glob("*.png"))
    for source in ("results.parquet", "results.csv"):
        code, out, err = vmctl(capsys, "sim", "plot", str(out_dir / source), "--out", str(tmp_path / source))
        assert code == 0, err
        files = [Path(f) for f in json.loads(out)["files"]]
        assert [f.name for f in files] == ["response_vs_load.png", "slowdown_vs_load.png", "migrations_vs_load.png"]
        assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in files)
    code, _, err = vmctl(capsys, "sim", "plot", str(tmp_path), "--out", str(tmp_path / "x"))
    assert code == 2 and err.startswith("error: instance-format: ")


def test_run_takes_o_warns_on_overload_and_prints_long_spans_readably(
        capsys: pytest.CaptureFixture[str], small_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``-o json`` works on sim run as on the other commands; ``--load 5`` is no longer accepted silently;
    the makespan says how long it is, not only raw seconds."""
    monkeypatch.setenv("COLUMNS", "120")
    code, out, err = vmctl(capsys, "sim", "run", "--trace", str(small_trace), "--policy", "easy", "-o", "json",
                           "--load", "5")
    assert code == 0 and "makespan" in json.loads(out)
    assert "warning: --load 5 offers more work than the cluster can do" in err
    code, out, err = vmctl(capsys, "sim", "run", "--trace", str(small_trace), "--policy", "easy")
    assert code == 0 and "warning" not in err
    assert re.search(r"makespan\s*│\s*[\d,.]+ s \(\d+(\.\d)?[mhd]\)", out), out
