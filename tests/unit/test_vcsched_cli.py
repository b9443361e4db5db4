"""``vmctl vcsched``: solve / generate / eval from the command line, and its user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vmctl.cli.main import main
from vmctl.errors import InstanceFormatError
from vmctl.policies.vcsched.instance import instance_from_dict


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def write(tmp: Path, doc: object, name: str = "i.json") -> str:
    p = tmp / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc, encoding="utf-8")
    return str(p)


EXAMPLE = {"hosts": 2, "tasks": [{"cpu": 0.6, "mem": 0.1}] * 3}


def test_solve_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        ["vcsched", "solve", write(tmp_path, EXAMPLE), "--algorithm", "mcb8", "--output", "json"], capsys
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["status"] == "ok"
    assert doc["min_yield"] == pytest.approx(0.5 / 0.6)
    assert doc["lp_bound"] == 1.0
    assert {p["host"] for p in doc["placement"]} == {0, 1}
    assert doc["run_time_s"] >= 0


def test_solve_table_and_parallel_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # {0.6, 0.6} | {0.8} has max load 1.2; {0.6, 0.8} | {0.6} has 1.4
    doc = {"hosts": 2, "jobs": [{"tasks": 2, "cpu": 0.6, "mem": 0.2}, {"tasks": 1, "cpu": 0.8, "mem": 0.2}]}
    code, out, _ = run(["vcsched", "solve", write(tmp_path, doc), "-a", "milp"], capsys)
    assert code == 0
    assert "status      ok" in out and "min yield   0.8333" in out


def test_solve_infeasible_is_a_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {"hosts": 2, "tasks": [{"cpu": 0.1, "mem": 0.6}] * 3}
    code, out, _ = run(["vcsched", "solve", write(tmp_path, doc), "-a", "sgb", "-o", "json"], capsys)
    assert code == 0
    got = json.loads(out)
    assert got["status"] == "infeasible" and got["placement"] == []


def test_solve_dynamic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inst = write(tmp_path, {"hosts": 2, "tasks": [{"cpu": 0.5, "mem": 0.3}] * 3})
    prev = write(tmp_path, {"hosts": [0, 0, 0]}, "prev.json")
    code, out, _ = run(
        ["vcsched", "solve", inst, "-a", "dynamic", "--prev", prev, "--budget", "0.3", "-o", "json"], capsys
    )
    assert code == 0
    got = json.loads(out)
    assert got["min_yield"] == 1.0 and got["migrated_mem"] == pytest.approx(0.3)
    code, _, err = run(["vcsched", "solve", inst, "-a", "dynamic"], capsys)
    assert code == 2 and "needs --prev and --budget" in err
    bad = write(tmp_path, {"hosts": [0, 5, 0]}, "bad.json")
    code, _, err = run(["vcsched", "solve", inst, "-a", "dyn-milp", "--prev", bad, "--budget", "1"], capsys)
    assert code == 2 and "hosts[1]: must be -1 or an integer in [0, 1], got 5" in err


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (
            {"hosts": 2, "tasks": [{"cpu": 0.5, "mem": 0.1}] * 3 + [{"cpu": 0.5, "mem": 1.5}]},
            "tasks[3].mem: must be in [0, 1], got 1.5",
        ),
        ({"hosts": 2, "tasks": [{"cpu": 0, "mem": 0.1}]}, "tasks[0].cpu: must be in (0, 1], got 0"),
        ({"hosts": 2, "tasks": [{"cpu": "a", "mem": 0.1}]}, "tasks[0].cpu: must be a number, got 'a'"),
        ({"hosts": 0, "tasks": [{"cpu": 0.5, "mem": 0.1}]}, "hosts: must be an integer >= 1, got 0"),
        ({"hosts": 2}, "$: needs exactly one of 'tasks' or 'jobs'"),
        ({"hosts": 2, "tasks": []}, "tasks: must be a non-empty list"),
        ({"hosts": 2, "tasks": [{"cpu": 0.5}]}, "tasks[0]: missing key 'mem'"),
        ({"hosts": 2, "tasks": [{"cpu": 0.5, "mem": 0.1, "x": 1}]}, "tasks[0].x: unknown key"),
        ({"hosts": 2, "jobs": [{"tasks": 0, "cpu": 0.5, "mem": 0.1}]}, "jobs[0].tasks: must be an integer >= 1"),
        ({"hosts": 2, "cpus": 1}, "cpus: unknown key"),
        ([1, 2], "$: must be an object, got list"),
        ('{"hosts": 2,', "line 1 column 13"),
    ],
)
def test_malformed_instances(tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object, message: str) -> None:
    path = write(tmp_path, doc)
    code, out, err = run(["vcsched", "solve", path, "-a", "mcb8"], capsys)
    assert code == 2
    assert err.startswith(f"error: instance-format: {path}: ")
    assert message in err
    assert "Traceback" not in err and out == ""


def test_missing_file_and_unknown_algorithm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["vcsched", "solve", str(tmp_path / "nope.json"), "-a", "mcb8"], capsys)
    assert code == 2 and "cannot read" in err and "Traceback" not in err
    code, _, err = run(["vcsched", "solve", write(tmp_path, EXAMPLE), "-a", "mcb9"], capsys)
    assert code == 2 and "mcb9" in err


def test_instance_error_class() -> None:
    with pytest.raises(InstanceFormatError) as exc:
        instance_from_dict({"hosts": 1, "tasks": [{"cpu": 0.5, "mem": -0.1}]}, "x.json")
    assert str(exc.value) == "x.json: tasks[0].mem: must be in [0, 1], got -0.1"


def test_generate_round_trips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "gen"
    code, _, _ = run(
        [
            "vcsched",
            "generate",
            "--hosts",
            "4",
            "--tasks",
            "8",
            "--slack",
            "0.3",
            "--cv",
            "0.75",
            "--count",
            "3",
            "--seed",
            "5",
            "--out",
            str(out),
        ],
        capsys,
    )
    assert code == 0
    files = sorted(out.glob("*.json"))
    assert len(files) == 3
    first = files[0].read_text()
    inst = instance_from_dict(json.loads(first), str(files[0]))
    assert inst.hosts == 4 and inst.n_tasks == 8
    again = tmp_path / "again"
    run(
        [
            "vcsched",
            "generate",
            "--hosts",
            "4",
            "--tasks",
            "8",
            "--slack",
            "0.3",
            "--cv",
            "0.75",
            "--count",
            "3",
            "--seed",
            "5",
            "--out",
            str(again),
        ],
        capsys,
    )
    assert sorted(p.read_text() for p in again.glob("*.json")) == sorted(p.read_text() for p in files)
    code, _, err = run(
        ["vcsched", "generate", "--hosts", "4", "--tasks", "8", "--slack", "0.3", "--out", str(out)], capsys
    )
    assert code == 2 and "--cv" in err
    code, _, _ = run(
        [
            "vcsched",
            "generate",
            "--hosts",
            "8",
            "--tasks",
            "40",
            "--slack",
            "0.5",
            "--cv",
            "0.5",
            "--parallel",
            "--out",
            str(tmp_path / "par"),
        ],
        capsys,
    )
    doc = json.loads(next((tmp_path / "par").glob("*.json")).read_text())
    assert "jobs" in doc and sum(j["tasks"] for j in doc["jobs"]) == 40


def test_eval_small_subset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny eval run writes results, a table with every algorithm, and the paper's plots."""
    code, out, _ = run(
        [
            "vcsched",
            "eval",
            "small",
            "--instances",
            "2",
            "--algorithms",
            "milp,gr,sg,mcb5,mcb8",
            "--tasks",
            "6,8",
            "--slacks",
            "0.3,0.7",
            "--out",
            str(tmp_path),
        ],
        capsys,
    )
    assert code == 0
    rows = [json.loads(line) for line in (tmp_path / "results-small.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 4 * 2 * 5
    assert {r["algorithm"] for r in rows} == {"milp", "gr", "sg", "mcb5", "mcb8"}
    milp = {
        (r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"]): r["min_yield"]
        for r in rows
        if r["algorithm"] == "milp"
    }
    for r in rows:
        if r["status"] == "ok":
            assert r["min_yield"] <= milp[(r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"])] + 1e-6
    assert "Table 1" in out and "| mcb8 |" in out
    assert (tmp_path / "small-fig11-all-min_yield.png").stat().st_size > 1000
    assert (tmp_path / "small-fig02-mcb-min_yield.png").exists()


def test_eval_runs_on_the_experiment_runner_and_a_rerun_resumes(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The dynamic suite (several budgets per instance, and instances without an initial placement)
    through the runner's table: the rerun computes nothing and writes the same results."""
    from vmctl.experiments.runner import read_table

    args = ["vcsched", "eval", "dynamic", "--instances", "3", "--tasks", "8", "--slacks", "0.3,0.5",
            "--workers", "2", "--out", str(tmp_path)]
    code, out, err = run(args, capsys)
    assert code == 0, err
    assert "dynamic: 288 cells (288 run now, 0 from " in err
    first = (tmp_path / "results-dynamic.jsonl").read_text()
    rows = [json.loads(line) for line in first.splitlines()]
    # one row per instance, budget and algorithm; an instance without an initial placement has one 'none' row
    nones = [r for r in rows if r["algorithm"] == "none"]
    assert nones and len(rows) == (24 - len(nones)) * 6 * 2 + len(nones)
    assert all(r["budget"] is None and r["status"] == "no-initial" for r in nones)
    assert {r["budget"] for r in rows if r["algorithm"] != "none"} == {0.0, 0.1, 0.25, 0.5, 1.0, "all"}
    table = read_table(tmp_path / "results-dynamic.parquet")
    assert len(table) == 288 and all(r["error"] is None for r in table)

    code, out2, err = run(args, capsys)
    assert code == 0, err
    assert "dynamic: 288 cells (0 run now, 288 from " in err
    assert (tmp_path / "results-dynamic.jsonl").read_text() == first
    assert out2 == out
