"""vmctl reproduce end to end at a tiny size: paper 000's real experiments (200-job workloads, 2 seeds) through
the CLI, then a rerun that computes nothing and gives the same claims."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from vmctl.reproduce import p000
from vmctl.reproduce.base import Size
from vmctl.reproduce.output import read_claims

REPO = Path(__file__).resolve().parents[2]
#: the traces beside the checkout (../shared), or beside the worktrees' folder (a worktree in wt/NAME)
CANDIDATES = (REPO.parent / "shared" / "data" / "traces", REPO.parent.parent / "shared" / "data" / "traces")

pytestmark = pytest.mark.slow


def test_paper_000_tiny_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    env = os.environ.get("VMCTL_TRACE_DIR")
    found = [d for d in ((Path(env),) if env else CANDIDATES) if all((d / t).is_file() for t in p000.TRACES)]
    if not found:
        pytest.skip("the SWF traces are not in $VMCTL_TRACE_DIR or ../shared/data/traces")
    traces = found[0]
    monkeypatch.setenv("VMCTL_TRACE_DIR", str(traces))
    tiny = Size("quick", "200 jobs per run, 2 seeds", (1, 2), est_cpu_s=60.0, reduced="tiny (a test)",
                params={"fw_jobs": 200, "jw_jobs": 200, "side_jobs": 200, "trace_jobs": 200})
    monkeypatch.setattr(p000, "PAPER", dataclasses.replace(p000.PAPER, sizes={"quick": tiny}))
    from vmctl.cli.main import main

    def run() -> str:
        with pytest.raises(SystemExit) as exc:
            main(["reproduce", "000", "--quick", "--out", str(tmp_path / "out"), "--workers", "2", "--no-progress"])
            raise SystemExit(0)
        _out, err = capsys.readouterr()
        assert exc.value.code in (0, None), err
        return err

    first = run()
    assert "estimated time from scratch: 30 s on 2 local worker(s)" in first
    assert "reduced from the paper's size: tiny" in first
    rows = read_claims(tmp_path / "out" / "claims.parquet")
    assert [r["claim"] for r in rows] == [c.id for c in p000.PAPER.claims]
    assert all(r["verdict"] in ("holds", "differs", "contradicted") for r in rows)
    assert all(r["n_seeds"] == 2 and r["ours_lo"] <= r["ours_mean"] <= r["ours_hi"] for r in rows)
    for r in rows:
        if r["verdict"] != "holds":  # every divergence has a cause and names tables of this output
            assert r["cause"] and r["evidence"], r
            assert all((tmp_path / "out" / f"{e.strip()}.parquet").is_file() for e in r["evidence"].split(","))
    md = (tmp_path / "out" / "claims.md").read_text()
    assert "## Experiments (the evidence)" in md and "### `wstats`" in md
    second = run()
    assert "main: 96 cells (0 run now, 96 from main.parquet)" in second
    again = read_claims(tmp_path / "out" / "claims.parquet")
    assert [(r["verdict"], r["ours_mean"]) for r in again] == [(r["verdict"], r["ours_mean"]) for r in rows]
