"""Issue 26's task-bag evaluation at the testbed scale: bags wider than the scaled machine kept (their tasks
in rounds), tasks split finer, and the r probe (``vmctl.experiments.taskbags``), on a tiny trace by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_taskbags_eval import TINY, line, write
from vmctl.errors import OutOfRange
from vmctl.experiments.taskbags import build, run_cell, tables

# Two identical bags of 6 CPUs, 30 s of their walltime 40, class 3, at 20, on a machine of 8 CPUs sampled at 1/2:
# one bag on round(8 / 2) = 4 workers, wider than the scaled machine.
WIDE = [line(2, 20, 30, 6, 40, "q_2h"), line(3, 20, 30, 6, 40, "q_2h")]
MACH8 = "0\tzz\t1\t8\t1\t1000\n"


def test_wide_bags_are_kept_and_run_in_rounds(tmp_path: Path) -> None:
    trace, mach = write(tmp_path, WIDE, MACH8)
    dropped = build(trace, mach, 2, 1, "homogeneous")
    assert dropped.cores == 4 and not dropped.jobs and dropped.dropped["wider_than_scaled_machine"] == 1
    b = build(trace, mach, 2, 1, "homogeneous", keep_wide=True)
    (c,) = b.jobs
    # 6 tasks of 40 s on at most 4 workers: a forecast span of 2 rounds (80 s), the record's 30/40 kept
    assert b.shapes[str(c.id)].tasks == (40.0,) * 6 and b.shapes[str(c.id)].max_workers == 4
    assert (c.procs, c.estimate, c.run_time, c.deadline) == (4, 80.0, 60.0, 60.0)
    assert b.orig[str(c.id)] == (6, 30.0, 40.0)
    # FCFS by hand: 4 tasks of 30 s in 20-50, then 2 in 50-80: response 60, the deadline (20 + 40) missed;
    # work 6 x 30 = 180 over 4 workers x 60 s
    m = run_cell(trace, mach, 2, 1, "homogeneous", "fcfs", None, False, 1.0, keep_wide=True)
    assert m["jobs"] == 1 and m["wide_kept"] == 1
    assert m["mean_response_h"] * 3600 == pytest.approx(60.0)
    assert m["deadlines_met"] == 0.0
    assert m["utilization"] == pytest.approx(180 / 240)


def test_split_tasks(tmp_path: Path) -> None:
    trace, mach = write(tmp_path, TINY)
    b = build(trace, mach, 1, 1, "homogeneous", split=2)
    assert b.shapes["1"].tasks == (60.0,) * 8 and b.shapes["1"].max_workers == 4
    assert next(j for j in b.jobs if j.id == 1).estimate == 120.0  # 8 tasks of 60 on 4 workers: 2 rounds
    # FCFS as in test_taskbags_eval: the same ends (A 0-100, B 100-150), the split changes nothing rigid
    m = run_cell(trace, mach, 1, 1, "homogeneous", "fcfs", None, False, 1.0, split=2)
    assert m["mean_response_h"] * 3600 == pytest.approx(120.0)
    with pytest.raises(OutOfRange):
        build(trace, mach, 1, 1, "homogeneous", split=0)


def test_the_r_probe_counts_what_r_changed(tmp_path: Path) -> None:
    # the wide bag alone: 6 tasks, cap floor(0.5 x 4) = 2, but no other bag wants a worker (not
    # oversubscribed): r = 0.5 gives it 2 workers where r = 0 gives 4, a different decision at its arrival
    trace, mach = write(tmp_path, WIDE, MACH8)
    lit = run_cell(trace, mach, 2, 1, "homogeneous", "dispatch-priority", 0.5, False, 1.0, keep_wide=True, probe=True)
    assert lit["probe_passes"] >= 1 and lit["probe_top_over_cap"] >= 1
    assert lit["probe_differ"] >= 1 and lit["probe_oversubscribed"] == 0
    # 6 tasks of 30 s on 2 workers: 3 rounds, response 90
    assert lit["mean_response_h"] * 3600 == pytest.approx(90.0)
    same = run_cell(trace, mach, 2, 1, "homogeneous", "dispatch-priority", 0.5, False, 1.0, keep_wide=True)
    assert same["mean_response_h"] == lit["mean_response_h"]  # the probe only watches
    row = {"policy": "dispatch-priority", "r": 0.5, "conserving": False, "speeds": "homogeneous", "sample": 100,
           "seed": 1, "error": "", "keep_wide": True, "split": 4, **lit}
    head = tables([row]).splitlines()[1]
    assert "SMALLER than the documented 1/8" in head and "wider than the machine kept" in head
    assert "split in 4" in head
