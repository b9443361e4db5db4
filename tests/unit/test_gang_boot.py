"""A gang job's measured boot in the what-if replay passes in wall time (issue 28): vmctld's boot (start to
every process running) already holds the slices the job's row was paused for, so the time-slice model
must not slice it again (:class:`vmctl.sim.timeslice.TimeSliceModel`'s ``boots``,
:func:`vmctl.sim.workloads.swf.job_boots`, :func:`vmctl.whatif.replay.replay` under gs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_sim_support import wj

from tests.unit.test_gang import Gang, ends
from tests.unit.test_whatif import T0
from tests.unit.test_whatif_boot import booted
from vmctl.model import ClusterView, Start
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.timeslice import TimeSliceModel
from vmctl.sim.workloads.swf import job_boots, read_side_file, read_swf
from vmctl.whatif.export import build_trace, write_trace
from vmctl.whatif.replay import actual, error, replay


def _sim(boots: dict[str, float] | None, seen: list[float] | None = None) -> Simulator:
    # T = 10, 2 rows, 2 cores. A (1 process: a 15 s boot + 10 s of work, run time 25) on core 0 of row 0,
    # B (1 process, 30 s) on core 1 of row 1.
    def look(view: ClusterView, now: float) -> list[object]:
        assert seen is not None
        seen.append(view.running["1"].expected_end)
        return []

    script: dict[float, object] = {0.0: [Start("1", (0,), 0), Start("2", (1,), 1)]}
    if seen is not None:
        script[1.0] = look
    pol = Gang(script)  # type: ignore[arg-type]
    sim = Simulator([wj(1, 0, 25, 1), wj(2, 0, 30, 1)], 2, pol,
                    SimConfig(execution=lambda: TimeSliceModel(2, 10.0, boots=boots)))
    sim.run()
    return sim


def test_a_boot_in_wall_time_is_not_sliced_again() -> None:
    # with the boot in wall time A has 15 s at 15 (row 1 active in [10, 20)), then row 0 [20, 30): 25 at 30
    assert ends(_sim({"1": 15.0}), 2) == [pytest.approx(30.0), pytest.approx(60.0)]
    # sliced (the reading before): [0, 10) -> 10, [20, 30) -> 20, [40, 45) -> 25; B is the same either way
    assert ends(_sim(None), 2) == [pytest.approx(45.0), pytest.approx(60.0)]


def test_the_expected_end_counts_the_boot_in_wall_time() -> None:
    seen: list[float] = []
    _sim({"1": 15.0}, seen)
    assert seen == [pytest.approx(30.0)]
    seen.clear()
    _sim(None, seen)
    assert seen == [pytest.approx(45.0)]


def test_a_boot_longer_than_the_work_left_in_a_slice_and_a_boot_of_zero() -> None:
    # a boot of 22 s ends in row 0's slice [20, 30): A has 22 at 22 and goes on there, 25 at 25
    assert ends(_sim({"1": 22.0}), 1) == [pytest.approx(25.0)]
    assert ends(_sim({"1": 0.0}), 1) == [pytest.approx(45.0)]  # no boot: as before


GS = {"name": "gs", "params": {"mpl": 2, "slice": 100.0}, "layout": {"discipline": "timeslice", "levels": 2}}
NODES1 = [{"name": "n1", "cores": 1, "speed": 1.0, "group": "", "discipline": "timeslice", "levels": 2}]


def _gang_history(tmp_path: Path) -> Path:
    """One core, 2 rows, slice 100 s (epoch 0). Job 1 (30 s boot, 400 s of work) runs alone from 0. Job 2
    (50 s of work) starts at 150 in the other row, which the order makes active in [100, 200) and
    [300, 400); its guest boots only in its row's slices: 80 s of boot in [150, 200) and [300, 330), so
    vmctld measures a boot of 180 s; its work runs in [330, 380). Job 1 runs [0, 150), [200, 300) and,
    alone again, from 380: it ends at 380 + 180 = 560."""
    jobs = [booted("1", 0.0, 0.0, 30.0, 400.0), booted("2", 150.0, 150.0, 180.0, 50.0)]
    jobs[0]["history"][-1]["time"] = jobs[0]["end_time"] = T0 + 560.0
    path = tmp_path / "g.swf"
    write_trace(build_trace(jobs, NODES1, GS), path)
    return path


def test_the_replay_of_gs_holds_a_paused_boot_once(tmp_path: Path) -> None:
    path = _gang_history(tmp_path)
    assert job_boots(path) == {"1": 30.0, "2": 180.0}
    assert job_boots(path, "none") == {}
    assert read_swf(path).jobs[1].run_time == pytest.approx(230.0)  # boot + work: the work holds the boot
    act = actual(path)
    sim = replay(path, "gs", {"mpl": 2, "slice": 100.0})
    live, got = json.loads(act["jobs_json"]), json.loads(sim["jobs_json"])
    # job 2's boot sliced again ran [150, 200), [300, 400) and [500, 530): it ended at 530, not 380
    for k in ("1", "2"):
        assert got[k] == pytest.approx(live[k], abs=1e-6), k
    side = read_side_file(path)
    assert side is not None
    e = error(sim, act, {k: float(v["submit"]) for k, v in side["jobs"].items()})
    assert e["avg_response_relative"] == pytest.approx(0.0, abs=1e-9)


def test_slice_loss_stretches_a_gang_jobs_work_and_not_its_boot(tmp_path: Path) -> None:
    # a loss of 50 s per 100-s slice doubles the work: job 2 boots to 330, then 100 s of work in its row's
    # [330, 400) and [500, 530); job 1 (30 s of boot + 800 of work) has 150 at 150, 250 at 300, 350 at 500
    # (row 0's [400, 500)), and runs alone from 530: 480 more
    # (the 0.25 s: the history's submits are 0.25 s past a whole second, its UnixStartTime the second)
    got = json.loads(replay(_gang_history(tmp_path), "gs", {"mpl": 2, "slice": 100.0}, slice_loss=50.0)["jobs_json"])
    assert got["2"][1] == pytest.approx(530.25, abs=1e-6)
    assert got["1"][1] == pytest.approx(1010.25, abs=1e-6)


def test_vmctl_whatif_says_a_gang_replay_runs_the_boots_in_wall_time(tmp_path: Path) -> None:
    from vmctl.whatif.report import render, run_whatif

    path = _gang_history(tmp_path)
    doc = run_whatif(path, ["gs"], {}, GS, 1, tmp_path / "w.csv")
    assert doc["error_in_force"]["avg_response_relative"] == pytest.approx(0.0, abs=1e-9)
    assert "under a gang policy in wall time" in render(doc)
    fcfs = run_whatif(path, ["fcfs"], {}, {**GS, "name": "fcfs", "params": {}}, 1, tmp_path / "f.csv")
    assert "in wall time" not in render(fcfs)


def test_bench_replay_of_a_kept_gang_run_uses_its_measured_row_switch_gap(tmp_path: Path) -> None:
    from bench.whatif import replay_kept

    _gang_history(tmp_path)
    (tmp_path / "g.swf").rename(tmp_path / "history.swf")
    (tmp_path / "g.swf.vmctl.json").rename(tmp_path / "history.swf.vmctl.json")
    assert "replay    395.0  err   +0.0%" in replay_kept(tmp_path, "gang-gs").splitlines()[1]  # boot=own, no gap
    (tmp_path / "result.json").write_text(json.dumps({"slice_loss": 50.0}))
    text = replay_kept(tmp_path, "gang-gs")
    assert "row-switch gap of 50.00 s" in text
    # with the gap, job 2 ends at 530.25 and job 1 at 1010.25 (the slice-loss test above): mean response
    # ((1010.25 - 0.25) + (530.25 - 150.25)) / 2 = 695.0
    assert "boot=own  replay    695.0" in text
