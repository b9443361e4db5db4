"""``vmctl sim run --jobs-out FILE``: one row per job, CSV or Parquet, consistent with the run's totals."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from tests.livedaemon import run_cli
from vmctl.model import Action, ClusterView, Decision, Kill, Migrate, StartBg, StartFg, Tier
from vmctl.policies.base import SchedulingPolicy
from vmctl.sim.engine import Simulator
from vmctl.sim.workloads.core import WorkloadJob

GOLDEN_TRACE = Path(__file__).resolve().parents[1] / "golden" / "sim" / "small-fw300.swf"


def _run(capsys: pytest.CaptureFixture[str], out: Path, *extra: str) -> dict[str, object]:
    code, stdout, err = run_cli(capsys, "sim", "run", "--trace", str(GOLDEN_TRACE), "--policy", "measy",
                                "--output", "json", "--jobs-out", str(out), *extra)
    assert code == 0, err
    doc: dict[str, object] = json.loads(stdout)
    return doc


def test_csv_rows_add_up_to_the_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = _run(capsys, tmp_path / "jobs.csv")
    with (tmp_path / "jobs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == doc["jobs"] == 300
    assert sum(int(r["migrations"]) for r in rows) == doc["migrations"]
    kills = doc["kills"]
    assert isinstance(kills, dict)
    assert sum(r["killed"] == "estimate" for r in rows) == kills["estimate"]
    assert sum(int(r["policy_kills"]) for r in rows) == kills["policy"]
    for r in rows:
        submit, start, end, wait = (float(r[k]) for k in ("submit", "start", "end", "wait"))
        assert submit <= start <= end
        assert math.isclose(wait, start - submit, abs_tol=1e-9)
    # MEASY starts some jobs in the bg tier and moves some of them: both show up per job
    assert {r["first_tier"] for r in rows} == {"fg", "bg"}
    assert any(int(r["tier_changes"]) > 0 for r in rows)


def test_parquet_has_the_same_rows(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow is a dependency; reinstall with scripts/setup.sh")
    _run(capsys, tmp_path / "jobs.csv")
    _run(capsys, tmp_path / "jobs.parquet")
    table = pq.read_table(tmp_path / "jobs.parquet").to_pylist()
    with (tmp_path / "jobs.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(table) == len(rows)
    for a, b in zip(table, rows, strict=True):
        assert a["id"] == b["id"] and a["migrations"] == int(b["migrations"]) and a["killed"] == b["killed"]
        assert a["end"] == float(b["end"])


def test_unwritable_target_is_refused_before_the_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "sim", "run", "--trace", str(GOLDEN_TRACE), "--policy", "easy",
                           "--jobs-out", str(tmp_path / "missing" / "jobs.csv"))
    assert code == 2
    assert "--jobs-out" in err and "does not exist" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "sim", "run", "--trace", str(GOLDEN_TRACE), "--policy", "easy",
                           "--jobs-out", str(tmp_path))
    assert code == 2 and "is a directory" in err


class _Scripted(SchedulingPolicy):
    """Starts job 1 in bg, migrates it to fg, then starts job 2 and kills it for good."""

    name = "scripted"

    def decide(self, view: ClusterView, now: float) -> Decision:
        acts: list[Action] = []
        q = {j.id: j for j in view.queue}
        if "1" in q:
            acts.append(StartBg("1", (0,)))
        elif "1" in view.running and view.running["1"].tier is Tier.BG:
            acts.append(Migrate("1", (1,), Tier.FG, cost=0.0))
        if "2" in q and now >= 5:
            acts.append(StartFg("2", (0,)))
        elif "2" in view.running:
            acts.append(Kill("2", requeue=False))
        return Decision(tuple(acts), default_reason="waiting", wake_at=now + 1 if "1" in view.running or q else None)


def test_per_job_history_counts_each_action() -> None:
    jobs = [WorkloadJob(id=1, submit=0.0, run_time=10.0, procs=1, estimate=20.0, cpu_usage=None, user=7),
            WorkloadJob(id=2, submit=5.0, run_time=10.0, procs=1, estimate=20.0, cpu_usage=None, user=8)]
    sim = Simulator(jobs, 2, _Scripted())
    sim.run()
    rows = {r["id"]: r for r in sim.job_rows()}
    assert rows["1"]["first_tier"] == "bg" and rows["1"]["migrations"] == 1 and rows["1"]["tier_changes"] == 1
    assert rows["1"]["user"] == 7 and rows["1"]["killed"] == ""
    assert rows["2"]["killed"] == "policy" and rows["2"]["policy_kills"] == 1
    assert math.isnan(float(rows["2"]["end"]))
