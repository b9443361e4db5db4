"""Paper 002's methods on real traces against EASY (``vmctl.experiments.moldable_traces``): the rules that
make a rigid trace job a moldable task with a deadline, hand-checked on a two-job trace, one cell of each
method, bad input naming the option, and (when the real traces are beside the checkout) a short run on
KTH-SP2."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from vmctl.errors import ValidationError
from vmctl.experiments.moldable_traces import METHODS, build, run_cell, table
from vmctl.speedup import Downey

KTH = Path(__file__).resolve().parents[2] / "../shared/data/traces/KTH-SP2-1996-2.1-cln.swf.gz"


def swf(tmp_path: Path) -> str:
    """Job 1: 4 processors at 0, ran 600 s of its requested 1,200; job 2: 2 processors at 120 s, ran
    3,000 s of its requested 1,800 (killed at 1,800). An 8-processor machine."""
    path = tmp_path / "tiny.swf.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("; MaxProcs: 8\n; MaxJobs: 2\n")
        fh.write("1 0 0 600 4 -1 -1 4 1200 -1 1 1 1 1 1 1 -1 -1\n")
        fh.write("2 120 0 3000 2 -1 -1 2 1800 -1 1 1 1 1 1 1 -1 -1\n")
    return str(path)


def test_the_rules_by_hand(tmp_path: Path) -> None:
    t = build(swf(tmp_path), 10, slot=10.0, deadline_estimates=3.0)
    assert t.cores == 8 and t.clusters.nodes == (8,) and t.clusters.speed == (1.0,)
    # minutes from the first submission; deadline = submit + 3 x requested time
    assert t.tasks.arrival.tolist() == [0.0, 2.0]
    assert t.tasks.deadline.tolist() == [60.0, 2.0 + 90.0]
    # forecast = requested time at procs; actual = min(run, requested) / requested of it
    assert t.tasks.factor.tolist() == [0.5, 1.0]
    p4, p2 = t.profiles
    assert p4.widths == (1, 2, 4, 8) and p2.widths == (1, 2, 4)
    # Downey A = procs, sigma = 1, anchored at the requested time at procs
    s4 = Downey(A=4.0, sigma=1.0).speedup
    assert math.isclose(t.tasks.length[0], 20.0 * s4(4))  # 1,200 s at width 4 -> at width 1, in minutes
    assert np.allclose(p4.r, [1.0, 1 / s4(2), 1 / s4(4), 1 / s4(8)])
    assert t.tasks.arrival_slot.tolist() == [0, 0]


def test_one_cell_of_each_method(tmp_path: Path) -> None:
    trace = swf(tmp_path)
    easy = run_cell(trace, 10, 10.0, 3.0, "easy")
    # EASY: both start at once (4 + 2 of 8); 10 and 30 minutes (job 2 killed at its requested time)
    assert (easy["aet"], easy["awt"], easy["put"], easy["width_over_procs"]) == (20.0, 0.0, 0.0, 1.0)
    afcfs = run_cell(trace, 10, 10.0, 3.0, "afcfs")
    # AFCFS sees both at the boundary 10 min. Job 1 (58.2 min at width 1: 6 slots, ends 70 > 60) takes
    # width 2 (32.7 min: 4 slots, ends 50), actually half: 2 slots, ends at 30. Job 2 (48 min at
    # width 1: 5 slots, ends 60 <= 92) takes width 1 and ends at 60.
    assert afcfs["width_over_procs"] == 0.5
    assert (afcfs["aet"], afcfs["awt"], afcfs["put"]) == (35.0, 9.0, 0.0)
    for method in METHODS:
        res = run_cell(trace, 10, 10.0, 3.0, method)
        assert res["tasks"] == 2 and res["unfinished"] == 0 and res["put"] == 0.0, (method, res)
    md = table([{"trace": trace, "policy": "easy", **easy}], 10, 10.0, 3.0)
    assert "| tiny.swf.gz | 8 | easy | 20.0 ± nan | 0.0 ± nan | 20.0 | 0.0 ± nan |" in md


@pytest.mark.parametrize(("slot", "k", "field"), [(0.0, 3.0, "slot"), (10.0, 0.0, "--deadline-estimates")])
def test_bad_input_names_the_option(tmp_path: Path, slot: float, k: float, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        build(swf(tmp_path), 10, slot, k)
    assert err.value.fields["field"] == field


@pytest.mark.skipif(not KTH.exists(), reason="the real traces are not beside this checkout (../shared/data/traces)")
def test_the_first_kth_jobs_against_easy() -> None:
    rows = {m: run_cell(str(KTH), 300, 10.0, 3.0, m) for m in ("easy", "hsret", "cbsp")}
    assert {r["tasks"] for r in rows.values()} == {300}
    assert all(r["unfinished"] == 0 for r in rows.values())
    # the moldable methods choose widths (not all at procs); EASY runs every job at procs
    assert rows["easy"]["width_over_procs"] == 1.0 and rows["hsret"]["width_over_procs"] != 1.0


@pytest.mark.parametrize(("args", "words"), [
    (["--jobs", "0"], "--jobs: must be > 0"),
    (["--slot", "0"], "slot: the slot length must be"),
    (["--deadline-estimates", "-1"], "--deadline-estimates: must be > 0"),
    (["--trace-dir", "/nonexistent-vmctl-traces"], "no such file"),
    (["--policies", "easy,sjf"], "--policies: unknown 'sjf'"),
])
def test_the_command_refuses_bad_input_naming_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         args: list[str], words: str) -> None:
    from tests.livedaemon import run_cli

    code, out, err = run_cli(capsys, "moldable", "traces", "--out", str(tmp_path / "out"), *args)
    assert code == 2 and words in err, (code, out, err)
    assert not (tmp_path / "out" / "traces.md").exists()
