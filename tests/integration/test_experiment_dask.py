"""The experiment runner on a real Dask cluster: a ``dask scheduler`` and two ``dask worker`` processes
on loopback, started here and stopped by pid; the grid runs through ``--scheduler``.

Executions are counted with files (tests/experiment_cells.py); cells 4.. of the grid wait for a gate file
so that a worker can be killed while it certainly runs a cell.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the experiment runner needs dask[distributed]")

from tests import experiment_cells as ec
from tests.support.processes import stop_process
from vmctl.experiments.runner import read_table

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@dataclass
class DaskCluster:
    address: str
    scheduler_file: Path
    workers: list[subprocess.Popen[bytes]]


def _wait_for(what: str, check: Callable[[], bool], procs: list[subprocess.Popen[bytes]], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for p in procs:
            assert p.poll() is None, f"{p.args!r} exited with {p.returncode} while waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def dask_cluster(tmp_path: Path) -> Iterator[DaskCluster]:
    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        pytest.skip(f"the dask command is not installed next to {sys.executable}")
    sched_file = tmp_path / "scheduler.json"
    logs = tmp_path / "logs"
    logs.mkdir()
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> subprocess.Popen[bytes]:
        with (logs / f"{name}.log").open("wb") as log:
            # the scheduler's and workers' scratch space under tmp_path (Dask's default, /tmp/dask-scratch-space,
            # would outlive the test)
            env = {**ENV, "DASK_TEMPORARY_DIRECTORY": str(tmp_path / "scratch")}
            p = subprocess.Popen([str(dask), *args], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
              "--scheduler-file", str(sched_file))
        _wait_for("the scheduler file", lambda: sched_file.exists() and sched_file.stat().st_size > 0, procs)
        address = json.loads(sched_file.read_text())["address"]
        workers = [start(f"w{i}", "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                         "--host", "127.0.0.1", "--name", f"w{i}", "--local-directory", str(tmp_path / f"w{i}"))
                   for i in range(2)]
        from distributed import Client

        with Client(address, set_as_default=False, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        yield DaskCluster(address, sched_file, workers)
    finally:
        for p in reversed(procs):
            stop_process(p)


def test_a_grid_runs_through_scheduler_and_a_killed_worker_has_its_cell_rerun(
        dask_cluster: DaskCluster, tmp_path: Path) -> None:
    counts, gate, table = tmp_path / "c", tmp_path / "gate", tmp_path / "t.parquet"
    counts.mkdir()
    journal = tmp_path / "t.parquet.partial.jsonl"
    cmd = [sys.executable, "-m", "tests.experiment_cells", str(table), str(counts), str(gate), "10"]
    proc = subprocess.Popen([*cmd, "--scheduler", dask_cluster.address], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_for("the first four cells", lambda: journal.exists() and len(journal.read_text().splitlines()) >= 4,
                  [proc, *dask_cluster.workers], timeout=180)
        # both workers now wait in a gated cell: kill one of them (the scheduler sees its connection drop)
        lost = dask_cluster.workers[0]
        os.kill(lost.pid, signal.SIGKILL)
        lost.wait()
        gate.touch()
        out, _ = proc.communicate(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    text = out.decode()
    assert proc.returncode == 0, text
    assert text.strip().splitlines()[-1] == "ran 10 skipped 0 failed 0", text
    rows = read_table(table)
    assert [r["y"] for r in rows] == [i * i for i in range(10)]
    assert all(r["error"] is None for r in rows)
    assert [ec.executions(counts, f"s{i}") for i in range(10)] == [1] * 10

    # the same grid through the scheduler file: every cell is already in the table
    again = subprocess.run([*cmd, "--scheduler", str(dask_cluster.scheduler_file)], cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300, check=True)
    assert again.stdout.strip().splitlines()[-1] == "ran 0 skipped 10 failed 0"
    assert [ec.executions(counts, f"s{i}") for i in range(10)] == [1] * 10


def test_vmctl_sim_sweep_through_scheduler_gives_the_local_results(dask_cluster: DaskCluster, tmp_path: Path) -> None:
    golden = ROOT / "tests" / "golden" / "sim" / "small-fw300.swf"
    data = [ln for ln in golden.read_text(encoding="utf-8").splitlines() if not ln.startswith(";")][:60]
    trace = tmp_path / "small.swf"
    trace.write_text("; MaxProcs: 64\n" + "\n".join(data) + "\n", encoding="utf-8")
    args = [sys.executable, "-m", "vmctl.cli.main", "sim", "sweep", "--trace", str(trace), "--policies", "easy,measy",
            "--loads", "0.6,0.9", "--migration-costs", "20,600", "--no-plots"]

    def sweep(*extra: str) -> list[dict[str, str]]:
        out = tmp_path / extra[-1].replace("/", "_").replace(":", "_")
        proc = subprocess.run([*args, "--out", str(out), *extra], cwd=ROOT, env=ENV, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout)
        assert (summary["runs"], summary["ran"], summary["failed"]) == (6, 6, 0)
        with (out / "results.csv").open(encoding="utf-8") as fh:
            return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(fh)]

    remote = sweep("--scheduler", dask_cluster.address)
    local = sweep("--workers", "1")
    assert remote == local
    assert {r["migration_cost"] for r in remote if r["policy"] == "measy"} == {"20.0", "600.0"}
