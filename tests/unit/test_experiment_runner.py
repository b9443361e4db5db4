"""The experiment runner (vmctl.experiments.runner) on a real Dask LocalCluster.

Executions are counted with files (tests/experiment_cells.py), so "skipped" means "not run again",
whatever the process that ran it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the experiment runner needs dask[distributed]")

from tests import experiment_cells as ec
from vmctl.errors import ClusterUnavailable, Conflict, ValidationError
from vmctl.experiments.runner import (
    Cell,
    ResultTable,
    cell,
    dask_client,
    grid,
    read_table,
    run_grid,
)

ROOT = Path(__file__).resolve().parents[2]


def test_cell_key_is_stable_and_independent_of_input_order() -> None:
    a = Cell("pkg.mod:f", {"load": 0.9, "seed": 1})
    assert a.key == Cell("pkg.mod:f", {"seed": 1, "load": 0.9}).key
    assert a.key == "fbdee5a093a22f681495"  # the same on every machine and Python run (resume depends on it)
    assert a.key != Cell("pkg.mod:f", {"load": 0.9, "seed": 2}).key
    assert a.key != Cell("pkg.mod:g", {"load": 0.9, "seed": 1}).key


@pytest.mark.parametrize(("function", "inputs", "problem"), [
    ("no_colon", {}, "importable"),
    ("__main__:f", {}, "__main__"),
    ("m:<lambda>", {}, "lambdas"),
    ("m:f", {"error": 1}, "runner writes itself"),
    ("m:f", {"x": [1, 2]}, "not list"),
    ("m:f", {"x": float("nan")}, "finite"),
    ("m:f", {"not an identifier": 1}, "column name"),
])
def test_bad_cells_are_refused(function: str, inputs: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Cell(function, inputs)  # type: ignore[arg-type]


def test_grid_is_the_cross_product_first_axis_slowest() -> None:
    cells = grid(ec.square, {"count_dir": "d"}, x=[1, 2], y=["a", "b"])
    assert [(c.inputs["x"], c.inputs["y"]) for c in cells] == [(1, "a"), (1, "b"), (2, "a"), (2, "b")]
    assert all(c.function == "tests.experiment_cells:square" and c.inputs["count_dir"] == "d" for c in cells)


def test_a_local_cluster_runs_while_another_holds_the_dask_dashboard_port(tmp_path: Path) -> None:
    """Two grids on one machine (or a Dask dashboard left open) used to collide on port 8787: the second
    LocalCluster warned "Port 8787 is already in use" (an error under -W error). Its HTTP server now takes
    a free port."""
    import socket

    with socket.socket() as holder:
        with contextlib.suppress(OSError):  # already taken by someone else: the same situation
            holder.bind(("", 8787))
            holder.listen()
        counts = tmp_path / "counts"
        counts.mkdir()
        done = run_grid(grid(ec.square, {"count_dir": str(counts)}, x=[1, 2]), tmp_path / "t.parquet", workers=1,
                        progress=False)
    assert (done.ran, done.failed) == (2, [])


def test_two_workers_run_the_grid_record_a_failing_cell_and_skip_it_all_on_rerun(tmp_path: Path) -> None:
    counts = tmp_path / "counts"
    counts.mkdir()
    table = tmp_path / "out" / "results.parquet"
    cells = grid(ec.fail_on, {"bad": 2, "count_dir": str(counts)}, x=list(range(6)))
    first = run_grid(cells, table, workers=2, progress=True)
    assert (first.ran, first.skipped, first.workers) == (6, 0, 2)
    assert [r["x"] for r in first.rows] == list(range(6))  # grid order, whatever the finishing order
    assert [r["y"] for r in first.rows] == [1, 2, None, 4, 5, 6]
    [bad] = first.failed
    assert (bad["x"], bad["bad"], bad["count_dir"]) == (2, 2, str(counts))  # the failing cell's inputs
    assert bad["error"].startswith("ValueError: cell 2 is bad (at experiment_cells.py:")
    assert all(r["error"] is None and r["wall_s"] >= 0 and r["vmctl_version"] for r in first.rows if r["x"] != 2)

    on_disk = read_table(table)
    assert [r["cell"] for r in on_disk] == [c.key for c in cells]
    assert list(on_disk[0]) == ["cell", "function", "x", "bad", "count_dir", "y", "wall_s", "host",
                                "vmctl_version", "error"]
    assert not (tmp_path / "out" / "results.parquet.partial.jsonl").exists()

    again = run_grid(cells, table, workers=2, progress=False)
    assert (again.ran, again.skipped) == (0, 6)
    assert again.rows == first.rows
    assert [ec.executions(counts, f"f{x}") for x in range(6)] == [1] * 6

    retried = run_grid(cells, table, workers=2, progress=False, retry_failed=True)
    assert (retried.ran, retried.skipped, len(retried.failed)) == (1, 5, 1)
    assert [ec.executions(counts, f"f{x}") for x in range(6)] == [1, 1, 2, 1, 1, 1]


def test_a_local_cluster_leaves_no_scratch_space_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where Dask (and our runner) put temporary files
    counts = tmp_path / "c"
    counts.mkdir()
    res = run_grid(grid(ec.square, {"count_dir": str(counts)}, x=[1]), tmp_path / "t.parquet", workers=1,
                   progress=False)
    assert res.ran == 1
    assert list(scratch.iterdir()) == []  # no dask-scratch-space, no worker directory


def test_a_grid_that_grows_runs_only_the_new_cells_and_csv_tables_resume_too(tmp_path: Path) -> None:
    counts = tmp_path / "c"
    counts.mkdir()
    table = tmp_path / "r.csv"
    run_grid(grid(ec.square, {"count_dir": str(counts)}, x=[1, 2]), table, workers=1, progress=False)
    res = run_grid(grid(ec.square, {"count_dir": str(counts)}, x=[1, 2, 3]), table, workers=1, progress=False)
    assert (res.ran, res.skipped) == (1, 2)
    assert [(r["x"], r["y"], r["ci_y"]) for r in res.rows] == [(1, 1.0, 0.5), (2, 4.0, 0.5), (3, 9.0, 0.5)]
    assert [ec.executions(counts, f"sq{x}") for x in (1, 2, 3)] == [1, 1, 1]
    assert table.read_text().splitlines()[0].startswith('"cell","function","x","count_dir","y","ci_y"')


def test_a_cell_that_returns_no_mapping_is_a_failed_cell(tmp_path: Path) -> None:
    res = run_grid([cell(ec.not_a_mapping, x=1)], tmp_path / "t.parquet", workers=1, progress=False)  # type: ignore[arg-type]
    assert "returned list, not a mapping of metrics" in res.rows[0]["error"]


def test_a_worker_lost_mid_cell_has_its_cell_rerun(tmp_path: Path) -> None:
    counts, markers = tmp_path / "c", tmp_path / "m"
    counts.mkdir()
    markers.mkdir()
    res = run_grid(grid(ec.crash_once, {"marker_dir": str(markers), "count_dir": str(counts)}, x=[1]),
                   tmp_path / "t.parquet", workers=2, progress=False)
    assert res.rows[0]["error"] is None and res.rows[0]["y"] == 1
    assert ec.executions(counts, "c1") == 2  # the worker died in the first execution; Dask ran it again


def test_a_journal_left_by_a_killed_run_is_folded_in_and_its_cells_skipped(tmp_path: Path) -> None:
    counts = tmp_path / "c"
    counts.mkdir()
    cells = grid(ec.square, {"count_dir": str(counts)}, x=[1, 2])
    table = tmp_path / "t.parquet"
    done = {"cell": cells[0].key, "function": cells[0].function, **cells[0].inputs, "y": 1.0, "ci_y": 0.5,
            "wall_s": 0.1, "host": "h", "vmctl_version": "0", "error": None}
    (tmp_path / "t.parquet.partial.jsonl").write_text(json.dumps(done) + "\n" + '{"cell": "trunc')
    res = run_grid(cells, table, workers=1, progress=False)
    assert (res.ran, res.skipped) == (1, 1)
    assert [ec.executions(counts, f"sq{x}") for x in (1, 2)] == [0, 1]
    assert res.rows[0]["host"] == "h"


def _grid_command_past_four_cells(tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[str], dict[str, str]]:
    """``tests.experiment_cells`` over 10 cells on two local workers, in a session of its own, with its
    TMPDIR under ``tmp_path``; returned once the first four cells are in the journal (cells 4.. wait for
    the gate file ``tmp_path/gate``)."""
    counts, gate, table = tmp_path / "c", tmp_path / "gate", tmp_path / "t.parquet"
    counts.mkdir()
    journal = tmp_path / "t.parquet.partial.jsonl"
    cmd = [sys.executable, "-m", "tests.experiment_cells", str(table), str(counts), str(gate), "10", "--workers", "2"]
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not (journal.exists() and len(journal.read_text().splitlines()) >= 4):
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the first four cells did not finish"
            time.sleep(0.05)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc, cmd, env


def test_killed_mid_grid_then_rerun_finishes_without_recomputing_finished_cells(tmp_path: Path) -> None:
    """kill -9 of the whole command (client and local workers) while cells 4.. wait for a gate file."""
    counts, gate, table = tmp_path / "c", tmp_path / "gate", tmp_path / "t.parquet"
    # a command killed with -9 cannot remove its temporary directory (the local cluster's scratch space):
    # it is kept under tmp_path
    proc, cmd, env = _grid_command_past_four_cells(tmp_path)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    survived = ResultTable(table).open()
    assert sorted(int(r["i"]) for r in survived.rows.values()) == [0, 1, 2, 3]
    survived.close()

    gate.touch()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip().splitlines()[-1] == "ran 6 skipped 4 failed 0"
    assert [r["y"] for r in read_table(table)] == [i * i for i in range(10)]
    assert [ec.executions(counts, f"s{i}") for i in range(10)] == [1] * 10


def test_sigterm_mid_grid_closes_the_local_cluster_and_removes_its_scratch_space(tmp_path: Path) -> None:
    """``kill PID`` (systemd, a CI timeout) of a command running a grid on a local cluster: the command
    ends, its worker processes end with it and its scratch directory goes (a SIGTERM used to end the
    process at once, leaving ``TMPDIR/vmctl-dask-*`` and the workers behind)."""
    import psutil

    proc, _cmd, _env = _grid_command_past_four_cells(tmp_path)
    table = tmp_path / "t.parquet"

    def group() -> list[int]:
        out = []
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if p.pid != proc.pid and os.getpgid(p.pid) == proc.pid and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
        return out

    try:
        assert [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("vmctl-dask-")]
        proc.send_signal(signal.SIGTERM)  # the command alone, as ``kill PID`` does
        output = proc.communicate(timeout=180)[0].decode()
        assert proc.returncode != 0, output
        deadline = time.monotonic() + 120  # the workers' nannies end when their scheduler is gone
        while group():
            assert time.monotonic() < deadline, f"worker processes left: {group()}"
            time.sleep(0.2)
        assert list((tmp_path / "tmp").iterdir()) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            proc.communicate()
    kept = ResultTable(table).open()  # the finished cells are kept for a rerun (journal folded in or not)
    assert sorted(int(r["i"]) for r in kept.rows.values())[:4] == [0, 1, 2, 3]
    kept.close()


def test_output_errors_are_clear(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValidationError, match="cannot write the results table there"):
        run_grid([cell(ec.square, x=1, count_dir=str(tmp_path))], blocker / "t.parquet", progress=False)
    with pytest.raises(ValidationError, match=r"\.parquet or \.csv"):
        run_grid([], tmp_path / "t.xlsx", progress=False)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(ValidationError, match="not a results table"):
        run_grid([], tmp_path / "junk.parquet", progress=False)
    held = ResultTable(tmp_path / "t.parquet").open()
    try:
        with pytest.raises(Conflict, match="another run is writing this table"):
            ResultTable(tmp_path / "t.parquet").open()
    finally:
        held.close()


def test_scheduler_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="neither an address"), dask_client(scheduler=str(tmp_path / "nope")):
        pass
    with pytest.raises(ClusterUnavailable, match=r"tcp://127\.0\.0\.1:9"), \
            dask_client(scheduler="tcp://127.0.0.1:9", connect_timeout=1):
        pass


def test_batched_cells_are_still_one_row_each_and_a_failure_stays_in_its_cell(tmp_path: Path) -> None:
    counts = tmp_path / "c"
    counts.mkdir()
    cells = grid(ec.fail_on, {"bad": 4, "count_dir": str(counts)}, x=list(range(7)))
    res = run_grid(cells, tmp_path / "t.parquet", workers=2, batch=3, progress=False)
    assert [r["y"] for r in res.rows] == [1, 2, 3, 4, None, 6, 7]
    assert [r["x"] for r in res.failed] == [4]
    assert [ec.executions(counts, f"f{x}") for x in range(7)] == [1] * 7
    with pytest.raises(ValidationError, match="batch"):
        run_grid(cells, tmp_path / "t.parquet", batch=0)
