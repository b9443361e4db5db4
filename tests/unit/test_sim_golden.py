"""Golden metrics of the four EASY-family policies on a small synthetic trace.

The trace ``tests/golden/sim/small-fw300.swf`` (300 Feitelson-model jobs, 64 processors, load 0.85,
TModel estimates) was written once with ``generate_model("feitelson96", 300, 64, seed=5, load=0.85)``
and ``write_swf``. The expected results live in ``tests/golden/sim/small-fw300.json``. When a change
to the engine, the progress model or a policy is *meant* to change them, regenerate with

    VMCTL_REGEN_GOLDEN=1 python -m pytest tests/unit/test_sim_golden.py

and explain the difference in the commit message.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from vmctl.experiments.sweep import WorkloadSpec, run_one

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "sim"
TRACE = GOLDEN / "small-fw300.swf"
EXPECTED = GOLDEN / "small-fw300.json"
CASES = {
    "easy": {},
    "keasy": {},
    "reasy": {},
    "measy": {},
    "measy-cost600": {"migration_cost": 600.0},
    "measy-no-cpu-info": {},
    "keasy-full-usage": {},
}


def _run(case: str) -> dict[str, Any]:
    policy = case.split("-")[0]
    spec = WorkloadSpec(trace=str(TRACE), seed=5, cpu_usage="full" if "full-usage" in case else "paper")
    res = run_one(spec, policy, CASES[case], seed=5, cpu_info="no-cpu-info" not in case)
    doc = res.to_dict()
    doc.pop("source")
    return doc


def _close(a: Any, b: Any, path: str) -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, float) and isinstance(b, float | int):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), f"{path}: {a} != {b}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_golden_metrics() -> None:
    got = {case: _run(case) for case in CASES}
    if os.environ.get("VMCTL_REGEN_GOLDEN"):
        EXPECTED.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        pytest.skip("golden file regenerated: review the diff and commit it")
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    assert set(expected) == set(got)
    for case in CASES:
        _close(got[case], expected[case], case)


def test_golden_cases_differ_from_each_other() -> None:
    """A golden file that pins the same numbers for every policy would prove nothing."""
    expected = json.loads(EXPECTED.read_text(encoding="utf-8"))
    responses = {case: doc["avg_response"] for case, doc in expected.items()}
    assert responses["easy"] != responses["measy"]
    assert responses["measy"] != responses["measy-cost600"]
    assert expected["measy"]["migrations"] > 0
    assert expected["keasy"]["kills"]["policy"] > 0
    assert expected["easy"]["migrations"] == 0 and expected["easy"]["kills"]["policy"] == 0
