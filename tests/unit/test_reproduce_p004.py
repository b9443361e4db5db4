"""vmctl reproduce 004: the paper's claims evaluated on a tiny run of the job-size study (real cells)."""

from __future__ import annotations

import pytest

from vmctl.experiments.runner import resolve
from vmctl.reproduce import registry
from vmctl.reproduce.base import Results, Size, checked
from vmctl.reproduce.p004 import PAPER, SIZES, length_cells, length_summary, study_cells, study_summary


@pytest.fixture(scope="module")
def tiny() -> Results:
    size = Size("quick", "tiny", seeds=(1, 2), est_cpu_s=1.0, params={"jobs": 40, "loads": "0.7,1.5"})
    rows = []
    for c in study_cells(size, Results()):
        rows.append({**c.inputs, **resolve(c.function)(**c.inputs)})
    res = Results()
    res.add("study", rows)
    res.add("length", [{**c.inputs, **resolve(c.function)(**c.inputs)} for c in length_cells(size, res)])
    return res


def test_the_registry_loads_paper_004() -> None:
    p = registry.load("004")
    assert p is PAPER and [c.id for c in p.claims] == [f"004-{i}" for i in range(1, 11)]
    assert set(SIZES) == {"quick", "full"} and SIZES["quick"].reduced and SIZES["full"].est_cpu_s > 0
    # the quick size: 3 mixes x 5 policies x its loads x its seeds
    assert len(study_cells(SIZES["quick"], Results())) == 3 * 5 * 5 * 3


def test_every_claim_has_an_estimate_a_verdict_and_a_backed_cause(tiny: Results) -> None:
    assert len(tiny.rows("study")) == 3 * 5 * 2 * 2
    for claim in PAPER.claims:
        out = checked(PAPER, claim, claim.evaluate(tiny))
        assert out.verdict in ("holds", "differs", "contradicted")
        assert out.ours.n == 2
        if out.verdict != "holds":
            assert out.cause and "study" in out.evidence and set(out.evidence) <= {"study", "length"}, (claim.id, out)


def test_saturation_claims_read_the_highest_steady_utilization(tiny: Results) -> None:
    rows = tiny.rows("study", model="jann97", policy="gs", backfill="easy")
    per_seed = [max(float(r["steady_utilization"]) for r in rows if r["seed"] == s) for s in (1, 2)]
    out = PAPER.claims[0].evaluate(tiny)
    assert out.ours.mean == pytest.approx(sum(per_seed) / 2)
    assert "end-to-end" in out.detail


def test_the_summary_is_the_study_table(tiny: Results) -> None:
    text = study_summary(tiny)
    assert "### Saturation utilization" in text and "BGS-cons" in text and "lublin99" in text
    assert "| GS+M | 80 |" in length_summary(tiny)


def test_the_claims_read_without_the_length_check() -> None:
    # a Results with the study only (an older output): the causes leave the run-length part out
    size = Size("quick", "tiny", seeds=(1, 2), est_cpu_s=1.0, params={"jobs": 30, "loads": "0.8,1.5"})
    res = Results()
    res.add("study", [{**c.inputs, **resolve(c.function)(**c.inputs)} for c in study_cells(size, res)])
    for claim in PAPER.claims:
        assert "run length" not in claim.evaluate(res).cause


def test_the_quick_size_is_the_studys_grid_so_a_study_run_resumes_it() -> None:
    from vmctl.experiments.gang import STUDY_LOADS
    from vmctl.experiments.gang import study_cells as the_study

    quick = SIZES["quick"]
    assert study_cells(quick, Results()) == the_study(800, (1, 2, 3), loads=STUDY_LOADS)
