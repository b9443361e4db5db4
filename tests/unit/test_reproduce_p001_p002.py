"""vmctl reproduce 001 and 002: the grids each size builds, and the claims' verdicts and causes read from
hand-made result rows (no simulation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vmctl.errors import ValidationError
from vmctl.reproduce import p001, p002
from vmctl.reproduce.base import Results, checked
from vmctl.reproduce.registry import load


def test_the_papers_load_and_their_quick_grids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the grids check that the trace files are there; their cells name them by file name only
    for name in (p001.TRACE_NAME, p001.MACHINES_NAME):
        (tmp_path / name).write_text("")
    monkeypatch.setenv("VMCTL_TRACE_DIR", str(tmp_path))
    assert load("002") is p002.PAPER and load("001") is p001.PAPER
    size = p002.PAPER.size("quick")
    base = p002.base_cells(size, Results())
    # 3 methods x 3 seeds; ALL-EFT literal and capped on seed 1 (equal speeds in --full only)
    assert len(p002.eft_cells(size, Results())) == 2 and len(p002.eft_cells(p002.PAPER.size("full"), Results())) == 20
    assert len(base) == 9 and all(c.inputs["nodes"] == 200 and c.inputs["rate"] == 30.0 for c in base)
    assert len(p002.profile_cells(size, Results())) == 3 * 4 * 3
    q = p001.PAPER.size("quick")
    cells = p001.testbed_cells(q, Results())
    assert len(cells) == 3 * 2 * 7 and all(c.inputs["keep_wide"] is True for c in cells)
    names = {(c.inputs["trace"], c.inputs["machines"]) for c in cells}
    assert names == {("wagap-2013.swf.gz", "wagap-2013.swf.machines")}
    assert {c.inputs["split"] for c in p001.split_cells(q, Results())} == {4}
    assert all(c.inputs["keep_wide"] is False for c in p001.dropped_cells(q, Results()))
    monkeypatch.setenv("VMCTL_TRACE_DIR", str(tmp_path / "none"))
    with pytest.raises(ValidationError, match="VMCTL_TRACE_DIR"):  # named before any cell runs
        p001.testbed_cells(q, Results())


def _m(policy: str, seed: int, aet: float, awt: float, put: float, **extra: Any) -> dict[str, Any]:
    return {"policy": policy, "seed": seed, "aet": aet, "awt": awt, "put": put, "utilization": 0.9,
            "mean_width": 8.0, "unfinished": 0, "equal_speeds": False, "target": 1.0, "profile": "standin", **extra}


def test_p002_claims_from_rows() -> None:
    # the paper's orders hold in both seeds: AET AFCFS 6000 > CBSP 5400 > ALL-EFT 5200 > HSRET 4500
    rows = [_m(p, s, a, w, u) for s in (1, 2) for p, a, w, u in
            (("afcfs", 6000, 300, 0.2), ("cbsp", 5400, 400, 0.5), ("all-eft", 5200, 500, 1.0),
             ("hsret", 4500, 200, 0.1))]
    res = Results({"base": [r for r in rows if r["policy"] != "all-eft"], "target": [], "variant": [], "profile": [],
                   "eft": [r for r in rows if r["policy"] == "all-eft"]})
    claims = {c.id: checked(p002.PAPER, c, c.evaluate(res)) for c in p002.PAPER.claims}
    assert claims["002-1"].verdict == "holds" and claims["002-4"].verdict == "holds"
    assert claims["002-5"].verdict == "holds"
    # (6000 - 4500) / 6000 = 25 % in both seeds: the paper's 25.13 % is not inside a zero-width interval
    assert claims["002-2"].ours.mean == 25.0 and claims["002-2"].verdict == "differs"
    assert claims["002-2"].evidence == ("base", "profile")
    # ALL-EFT fastest: the AET order differs and the cause names the variant study
    eft = [dict(r, aet=1000.0) for r in rows if r["policy"] == "all-eft"] + [_m("all-eft-cap", 1, 1500, 9000, 50)]
    res2 = Results({"base": [r for r in rows if r["policy"] != "all-eft"], "eft": eft})
    o = p002.aet_order(res2)
    assert o.verdict == "differs" and "eft" in o.evidence and "1,500" in o.cause


def test_p001_starvation_claim_from_rows() -> None:
    def row(seed: int, r: float, worst: float, wc: bool = False) -> dict[str, Any]:
        return {"policy": "dispatch-priority", "r": r, "conserving": wc, "seed": seed, "speeds": "homogeneous",
                "worst_wait_lowest_h": worst, "probe_differ": 3, "probe_passes": 10, "probe_oversubscribed": 2}
    res = Results({"testbed": [row(1, 0.0, 50.0), row(1, 0.5, 0.0), row(2, 0.0, 20.0), row(2, 0.5, 1.0)],
                   "dropped": [row(1, 0.5, 0.0)], "split": []})
    held = p001.starvation(res, False)
    assert held.verdict == "holds" and held.ours.mean == (50.0 + 19.0) / 2
    res2 = Results({"testbed": [row(1, 0.0, 50.0, True), row(1, 0.5, 60.0, True), row(2, 0.0, 20.0, True),
                                row(2, 0.5, 10.0, True)], "dropped": [row(1, 0.5, 0.0, True)], "split": []})
    mixed = p001.starvation(res2, True)
    assert mixed.verdict == "differs" and mixed.evidence == ("testbed", "dropped")
    assert "3 of 10 passes" in mixed.cause and "r changes 3 of 10 passes (dropped)" in mixed.cause
