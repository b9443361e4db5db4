"""vmctl reproduce: verdict rules, claims.md/claims.parquet, resume, bad input, docs generator (tiny inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.experiment_cells import executions, square
from vmctl.errors import ValidationError
from vmctl.experiments.runner import Cell, grid
from vmctl.reproduce import registry
from vmctl.reproduce.base import (
    UNEXPLAINED,
    Claim,
    Estimate,
    Experiment,
    Outcome,
    Paper,
    Results,
    Size,
    checked,
    compare_order,
    compare_value,
)
from vmctl.reproduce.docs import reproduction_markdown
from vmctl.reproduce.output import COLUMNS, read_claims
from vmctl.reproduce.run import reproduce

# ------------------------------------------------------------------------------------ verdict rules


def test_estimate_interval_is_student_t() -> None:
    e = Estimate.of([1.0, 2.0, 3.0])
    assert e.mean == 2.0 and e.n == 3
    # sd 1, t(0.975, 2) = 4.303: half width 4.303 / sqrt(3) = 2.484
    assert e.hi - e.mean == pytest.approx(2.4843, abs=1e-3)
    one = Estimate.of([5.0])
    assert (one.lo, one.hi, one.n) == (5.0, 5.0, 1)
    with pytest.raises(ValidationError):
        Estimate.of([])


def test_value_rule() -> None:
    assert compare_value(2.5, [1.0, 2.0, 3.0]).verdict == "holds"          # inside [-0.48, 4.48]
    assert compare_value(10.0, [1.0, 2.0, 3.0]).verdict == "differs"
    assert compare_value(10.0, [-3.0, -2.0, -2.5]).verdict == "contradicted"  # opposite sign, significant
    assert compare_value(-10.0, [3.0, 2.0, 2.5]).verdict == "contradicted"
    assert compare_value(10.0, [-3.0, 2.0, -2.5]).verdict == "differs"       # interval spans 0
    assert compare_value(4.0, [3.0], tolerance=1.0).verdict == "holds"
    assert compare_value(4.0, [3.0]).verdict == "differs"


def test_order_rule() -> None:
    held = compare_order({1: [0.1, 0.2], 2: [0.3, 0.05]})
    assert held.verdict == "holds" and held.rule == "order" and "4 of 4" in held.detail
    mixed = compare_order({1: [0.1, -0.2], 2: [0.3, 0.05]})
    assert mixed.verdict == "differs" and "3 of 4" in mixed.detail
    opposite = compare_order({1: [-0.1, -0.2], 2: [-0.3, -0.1], 3: [-0.2, -0.2]})
    assert opposite.verdict == "contradicted"
    # one seed: the opposite ordering everywhere is still not significant
    assert compare_order({1: [-0.1, -0.2]}).verdict == "differs"
    with pytest.raises(ValidationError):
        compare_order({1: []})


def _paper(count_dir: str, evaluate_with: str = "good") -> Paper:
    def cells(size: Size, prior: Results) -> list[Cell]:
        return grid(square, {"count_dir": count_dir}, x=list(size.seeds))

    def summary(res: Results) -> str:
        return "| x | y |\n|---|---|\n" + "\n".join(f"| {r['x']} | {r['y']} |" for r in res.rows("sq"))

    def eval_value(res: Results) -> Outcome:
        out = compare_value(100.0, [r["y"] for r in res.rows("sq")], unit="%")
        return out.because("the squares are small (sq)", "sq") if evaluate_with == "good" else out

    def eval_order(res: Results) -> Outcome:
        ys = {r["x"]: [r["y"] - 0.5] for r in res.rows("sq")}
        return compare_order(ys)

    sizes = {"quick": Size("quick", "2 seeds", (1, 2), est_cpu_s=1.0, reduced="the paper uses 3"),
             "full": Size("full", "3 seeds", (1, 2, 3), est_cpu_s=2.0)}
    return Paper(id="000", title="synthetic", source="none", sizes=sizes,
                 experiments=[Experiment("sq", "squares", cells, summary=summary)],
                 claims=[Claim("000-1", "squares reach 100", "sec. 1", "100 %", "y", eval_value),
                         Claim("000-2", "squares exceed one half", "sec. 2", "yes", "y - 0.5", eval_order)])


def test_checked_fills_cause_and_rejects_unknown_evidence(tmp_path: Path) -> None:
    p = _paper(str(tmp_path))
    bare = compare_value(100.0, [1.0, 4.0])
    assert checked(p, p.claims[0], bare).cause == UNEXPLAINED
    with pytest.raises(ValueError, match="not an experiment"):
        checked(p, p.claims[0], bare.because("x", "nope"))


# ------------------------------------------------------------------------ run, resume, claims files


def test_reproduce_writes_claims_and_resumes(tmp_path: Path) -> None:
    count = tmp_path / "count"
    count.mkdir()
    out = tmp_path / "out"
    paper = _paper(str(count))
    res = reproduce(paper, "quick", out, workers=1, progress=False, say=lambda s: None)
    assert [r.ran for r in res.experiments] == [2]
    rows = read_claims(out / "claims.parquet")
    assert [r["claim"] for r in rows] == ["000-1", "000-2"]
    assert list(rows[0]) == [c for c, _ in COLUMNS]
    first = rows[0]
    assert first["verdict"] == "differs" and first["ours_mean"] == 2.5 and first["n_seeds"] == 2
    assert first["cause"] == "the squares are small (sq)" and first["evidence"] == "sq"
    assert first["mode"] == "quick" and first["reduced"] == "the paper uses 3"
    assert rows[1]["verdict"] == "holds"
    md = (out / "claims.md").read_text()
    assert "| 000-1 |" in md and "**differs**" in md and "### `sq`: squares" in md and "| 2 | 4.0 |" in md
    assert (out / "sq.parquet").is_file()
    # rerun: nothing recomputed; full adds only seed 3
    again = reproduce(paper, "quick", out, workers=1, progress=False, say=lambda s: None)
    assert [r.ran for r in again.experiments] == [0] and [r.skipped for r in again.experiments] == [2]
    assert all(executions(count, f"sq{x}") == 1 for x in (1, 2))
    full = reproduce(paper, "full", out, workers=1, progress=False, say=lambda s: None)
    assert [r.ran for r in full.experiments] == [1]
    assert read_claims(out / "claims.parquet")[0]["n_seeds"] == 3


# ------------------------------------------------------------------------------------- bad input, CLI


def _cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stdout + stderr of ``vmctl ARGS`` (through main: the exit-code mapping)."""
    from vmctl.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


def test_unknown_paper_and_unavailable_module_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, text = _cli(["reproduce", "007", "--out", str(tmp_path)], capsys)
    assert code == 2 and "unknown paper '007'" in text and "Traceback" not in text
    monkeypatch.setitem(registry.PAPERS, "004", ("vmctl.reproduce.p_not_in_build", "gang"))
    code, text = _cli(["reproduce", "4", "--out", str(tmp_path)], capsys)
    assert code == 2 and "not available in this build" in text
    code, text = _cli(["reproduce", "--list"], capsys)
    assert code == 0 and "004  gang: not available in this build" in text


def test_unwritable_out_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, text = _cli(["reproduce", "003", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "--out" in text and "cannot write" in text and "Traceback" not in text


# ------------------------------------------------------------------------------------ docs generator


def test_docs_generator_on_synthetic_claims(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    count = tmp_path / "count"
    count.mkdir()
    reproduce(_paper(str(count)), "quick", tmp_path / "a", workers=1, progress=False, say=lambda s: None)
    text = reproduction_markdown([tmp_path / "a"])
    assert "generated by `vmctl reproduce --docs" in text
    assert "2 claims from 1 papers: 1 hold, 1 differ, 0 contradicted" in text
    assert f"`vmctl reproduce 000 --quick --out {tmp_path / 'a'}`" in text and "| 2 seeds | the paper uses 3 |" in text
    assert "| 000 | 000-1 | squares reach 100 (sec. 1) | 100 % |" in text
    assert "Not in these outputs: 001" in text
    code, cli_text = _cli(["reproduce", "--docs", str(tmp_path / "a")], capsys)
    assert code == 0 and cli_text.startswith("# Reproduction")
    with pytest.raises(ValidationError, match="also in"):
        reproduction_markdown([tmp_path / "a", tmp_path / "a"])
    code, bad = _cli(["reproduce", "--docs", str(tmp_path / "missing")], capsys)
    assert code == 2 and "no claims.parquet" in bad
