"""``vmctl plan``: a dispatching plan for an instance file (paper 001 sec. II-B-3), and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_vcsched_cli import run

INSTANCE = {
    "workers": [{"id": f"w{i}", "node": f"n{i // 2}", "speed": 1.0} for i in range(10)],
    "jobs": [
        {"id": "A", "tasks": 20, "work": 2000, "priority": 3},
        {"id": "B", "tasks": 5, "work": 500, "priority": 2},
        {"id": "C", "tasks": 5, "work": 500, "priority": 1},
    ],
}


def write(tmp: Path, doc: object) -> str:
    p = tmp / "instance.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc), encoding="utf-8")
    return str(p)


def test_plan_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", write(tmp_path, INSTANCE), "--policy", "priority", "-p", "r=0.2", "-o", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert {j: len(w) for j, w in doc["assignment"].items()} == {"A": 8, "B": 1, "C": 1}
    assert doc["unassigned_workers"] == [] and doc["run_time_s"] >= 0


def test_plan_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["plan", write(tmp_path, INSTANCE), "--policy", "proportion"], capsys)
    assert code == 0
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[1:4]}
    assert rows == {"A": "7", "B": "2", "C": "1"}  # ceil(10 * 2000/3000) = 7, ceil(10 * 500/3000) = 2, 1 left


@pytest.mark.parametrize(("doc", "needle"), [
    ("{not json", "line 1 column 2"),
    ({"workers": [], "jobs": [{"id": "A", "tasks": 0, "work": 1}]}, "jobs[0].tasks"),
    ({"workers": [{"id": "w"}], "jobs": [{"id": "A", "tasks": 1, "work": 1, "throughput": {"x": 1}}]},
     "unknown worker"),
])
def test_plan_bad_instance(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object, needle: str) -> None:
    code, out, err = run(["plan", write(tmp_path, doc), "--policy", "workload"], capsys)
    assert code == 2 and needle in err and "Traceback" not in err and out == ""


def test_plan_bad_parameter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["plan", write(tmp_path, INSTANCE), "--policy", "priority", "-p", "r=2"], capsys)
    assert code == 2 and "r" in err and "[0, 1]" in err
