"""Paper 002: the slot-stepped simulator (workload, engine checks, metrics, determinism) and
``vmctl moldable run|sweep``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.test_vcsched_cli import run
from vmctl.errors import InvariantViolation, ValidationError
from vmctl.policies.moldable.model import Decision, SlotView, Start
from vmctl.sim import moldable as sim
from vmctl.sim.moldable import MoldableConfig, Tasks, generate, paper_profiles, run_slots, simulate

#: about 0.83 of the nodes at the smallest widths (6 tasks x 4 nodes x 5,000 min per 360 min, 400 nodes)
SMALL: dict[str, Any] = {"slot": 360.0, "rate": 6.0, "slots": 40, "clusters": 2, "nodes": 200, "warmup": 10,
                         "batches": 5}


def test_generated_workload_follows_sec_6() -> None:
    cfg = MoldableConfig(policy="afcfs", slot=360.0, rate=20.0, slots=200, clusters=10, nodes=1000, accuracy=0.9)
    tasks, clusters = generate(cfg)
    per_slot = np.bincount(tasks.arrival_slot, minlength=200)
    assert per_slot.min() >= 1 and per_slot.max() <= 39           # uniform in [1, 2 * 20 - 1]
    assert abs(per_slot.mean() - 20) < 1.5
    assert (np.diff(tasks.arrival) >= 0).all()
    assert ((tasks.arrival >= tasks.arrival_slot * 360) & (tasks.arrival < (tasks.arrival_slot + 1) * 360)).all()
    assert tasks.length.min() >= 500 and tasks.length.max() <= 9500
    factor = (tasks.deadline - tasks.arrival) / tasks.length
    assert factor.min() >= 1.5 and factor.max() <= 5.0
    assert tasks.factor.min() >= 1.0 and tasks.factor.max() <= 1.1
    assert set(np.unique(tasks.profile).tolist()) == {0, 1}
    assert all(0.8 <= s <= 1.2 for s in clusters.speed) and clusters.nodes == (1000,) * 10
    exact, _ = generate(MoldableConfig(policy="afcfs", slot=360.0, rate=20.0, slots=20, accuracy=1.0, warmup=0))
    assert (exact.factor == 1.0).all()


def test_paper_profiles_are_two_different_downey_curves() -> None:
    wrf, grapes = paper_profiles()
    assert (wrf.minp, wrf.maxp, grapes.minp, grapes.maxp) == (4, 64, 4, 32)
    assert wrf.r[-1] == pytest.approx(0.092, abs=0.001)      # 10.9x faster on 16x the nodes
    assert grapes.r[-1] == pytest.approx(0.29, abs=0.005)    # 3.4x faster on 8x the nodes
    assert (np.diff(wrf.r) < 0).all() and (np.diff(grapes.r) < 0).all()


@pytest.mark.parametrize("policy", ["hsret", "afcfs", "all-eft", "cbsp"])
def test_same_seed_same_result(policy: str) -> None:
    a = simulate(MoldableConfig(policy=policy, seed=3, **SMALL))
    b = simulate(MoldableConfig(policy=policy, seed=3, **SMALL))
    c = simulate(MoldableConfig(policy=policy, seed=4, **SMALL))
    drop = ("wall_s", "slots_per_s")
    assert {k: v for k, v in a.items() if k not in drop} == {k: v for k, v in b.items() if k not in drop}
    assert a["aet"] != c["aet"]
    assert 0 <= a["put"] <= 100 and 0 < a["utilization"] <= 1
    assert a["tasks"] > 0 and a["unfinished"] == 0


def test_light_load_afcfs_starts_everything_at_the_next_boundary_at_its_smallest_width() -> None:
    res = simulate(MoldableConfig(policy="afcfs", slot=360.0, rate=2.0, slots=40, clusters=2, nodes=1000,
                                  warmup=5, batches=5, accuracy=1.0))
    assert res["awt"] < 360            # arrivals are uniform within a slot: waits in (0, 360)
    assert res["mean_width"] == 4.0    # deadlines >= 1.5 x the time at the smallest width: always met
    assert res["put"] == 0.0
    assert res["suspended_task_slots"] == 0


def test_hsret_reports_its_load_cases() -> None:
    res = simulate(MoldableConfig(policy="hsret", **SMALL))
    assert 0 < sum(res["hsret_cases"].values()) <= res["simulated_slots"]   # one per slot with waiting tasks
    assert set(res["hsret_cases"]) <= {"1", "2", "3"}


class _Bad:
    name = "bad"

    def __init__(self, how: str) -> None:
        self.how = how

    def decide(self, view: SlotView) -> Decision:
        running = np.ones(len(view.a_id), dtype=np.bool_)
        if not len(view.w_id):
            return Decision([], running)
        t = int(view.w_id[0])
        if self.how == "twice":
            return Decision([Start(t, 0, 4), Start(t, 0, 4)], running)
        if self.how == "width":
            return Decision([Start(t, 0, 5)], running)
        return Decision([Start(int(i), 0, 64 if view.w_profile[k] == 0 else 32)
                         for k, i in enumerate(view.w_id)], running)


@pytest.mark.parametrize(("how", "rule"), [("twice", "moldable-start"), ("width", "moldable-start"),
                                           ("overfull", "moldable-capacity")])
def test_engine_refuses_a_broken_decision(how: str, rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim, "make_policy", lambda name, rng: _Bad(how))
    with pytest.raises(InvariantViolation) as exc:
        simulate(MoldableConfig(policy="afcfs", **{**SMALL, "nodes": 60, "rate": 30.0}))
    assert exc.value.fields["rule"] == rule


@pytest.mark.parametrize(("change", "field"), [
    ({"slot": 0.0}, "slot"), ({"slot": -5.0}, "slot"), ({"rate": 0.5}, "rate"), ({"accuracy": 1.2}, "accuracy"),
    ({"accuracy": 0.0}, "accuracy"), ({"policy": "easy"}, "policy"), ({"nodes": 3}, "nodes"),
    ({"slots": 12}, "slots"), ({"batches": 1}, "batches"), ({"clusters": 0}, "clusters"),
])
def test_bad_config_names_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        MoldableConfig(**{"policy": "hsret", **SMALL, **change})
    assert exc.value.fields["field"] == field


# ----------------------------------------------------------------------------- CLI

BASE = ["moldable", "run", "--slot", "360", "--rate", "6", "--slots", "40", "--clusters", "2", "--nodes", "200",
        "--warmup", "10", "--batches", "5"]


def test_cli_run_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*BASE, "--policy", "hsret", "--output", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert {"tasks", "aet", "awt", "put", "utilization", "slots"} <= set(doc)
    assert doc["slots"] == 40 and doc["policy"] == "hsret"
    direct = simulate(MoldableConfig(policy="hsret", seed=1, accuracy=0.95, **SMALL))
    assert doc["aet"] == pytest.approx(direct["aet"])
    code, out, _ = run([*BASE, "--policy", "cbsp"], capsys)
    assert code == 0 and "aet" in out and "utilization" in out


def test_cli_run_with_a_measured_table(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    table = tmp_path / "app.json"
    table.write_text(json.dumps({"kind": "moldable", "table": {"4": 600, "8": 330, "16": 200}}), encoding="utf-8")
    light = [*BASE[:5], "1", *BASE[6:]]   # one task per slot: HSRET's Case 1, every task at its fastest width
    code, out, _ = run([*light, "--policy", "hsret", "--shape", f"@{table}", "-o", "json"], capsys)
    assert code == 0
    assert json.loads(out)["mean_width"] == 16.0
    code, out, _ = run([*light, "--policy", "hsret", "-o", "json"], capsys)
    assert json.loads(out)["mean_width"] > 16.0   # the built-in profiles go to 64 and 32


@pytest.mark.parametrize(("args", "needle"), [
    (["--policy", "hsret", "--slot", "0"], "slot"),
    (["--policy", "sjf"], "policy"),
    (["--policy", "hsret", "--accuracy", "2"], "accuracy"),
    (["--policy", "hsret", "--shape", '{"kind": "moldable", "table": {"4": 100, "8": 120}}'], "shape.times[1]"),
    (["--policy", "hsret", "--shape", '{"kind": "moldable", "table": {"4": -1}}'], "times"),
])
def test_cli_bad_input(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = [a for a in BASE]
    if "--slot" in args:
        i = base.index("--slot")
        del base[i:i + 2]
    code, out, err = run([*base, *args], capsys)
    assert code == 2
    assert needle in err and "Traceback" not in err and out == ""


def test_cli_sweep_writes_table_csv_markdown_and_plots(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["moldable", "sweep", "--grid", "360:6;720:12", "--policies", "hsret,afcfs", "--accuracies", "1.0",
            "--slots", "40", "--warmup", "10", "--clusters", "2", "--nodes", "200", "--workers", "1",
            "--out", str(tmp_path)]
    code, out, _ = run(args, capsys)
    assert code == 0
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["runs"] == 4 and summary["failed"] == 0
    rows = (tmp_path / "results.csv").read_text(encoding="utf-8").splitlines()
    assert len(rows) == 5 and rows[0].startswith("policy,slot,rate,accuracy")
    md = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert "### Slot 360 min" in md and "### Slot 720 min" in md and "4,367.4" in md
    assert {p.name for p in tmp_path.glob("*.png")} == {f"{m}-slot{s}.png" for m in ("aet", "awt", "put")
                                                       for s in (360, 720)}
    code, out, _ = run(args, capsys)   # resumes: nothing recomputed
    assert json.loads(out.strip().splitlines()[-1])["skipped"] == 4


def test_cli_sweep_bad_grid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(["moldable", "sweep", "--grid", "360", "--slots", "80", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--grid" in err
    code, _, err = run(["moldable", "sweep", "--policies", "hsret,sjf", "--slots", "80", "--out", str(tmp_path)],
                       capsys)
    assert code == 2 and "sjf" in err


def _chunks(tasks: Tasks, size: int) -> Iterator[Tasks]:
    end = int(tasks.arrival_slot.max()) + 1
    for first in range(0, end, size):
        sel = (tasks.arrival_slot >= first) & (tasks.arrival_slot < first + size)
        yield Tasks(*(getattr(tasks, f)[sel] for f in ("arrival", "deadline", "length", "profile", "factor",
                                                          "arrival_slot")))


@pytest.mark.parametrize("policy", ["hsret", "afcfs", "cbsp"])
def test_a_run_fed_in_chunks_forgets_ended_tasks_and_measures_the_same(policy: str) -> None:
    """The engine of long runs: tasks fed chunk by chunk, the ended prefix folded into the metrics and
    dropped, give exactly the metrics of the same tasks fed at once."""
    cfg = MoldableConfig(policy=policy, slot=360.0, rate=40.0, slots=300, nodes=300, accuracy=0.95, seed=2)
    tasks, clusters = generate(cfg)
    kw: dict[str, Any] = {"slots": 300, "warm": cfg.warm_slots, "drain": 400, "batches": 10}
    whole, outcome = run_slots(policy, 2, 360.0, tasks, clusters, cfg.profiles, **kw)
    parts, dropped = run_slots(policy, 2, 360.0, _chunks(tasks, 37), clusters, cfg.profiles, **kw)
    assert outcome is not None and dropped is None  # the chunked run forgot tasks on the way
    for key in ("tasks", "aet", "ci_aet", "awt", "ci_awt", "put", "ci_put", "mean_width", "unfinished",
                "utilization", "simulated_slots", "suspended_task_slots"):
        assert parts[key] == pytest.approx(whole[key], rel=1e-9), key


def test_long_runs_stream_their_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above STREAM_SLOTS, simulate draws arrivals chunk by chunk (another sample of the same workload):
    every task is counted, and the chunks differ (each from its own stream)."""
    monkeypatch.setattr(sim, "STREAM_SLOTS", 100)
    monkeypatch.setattr(sim, "CHUNK_SLOTS", 40)
    cfg = MoldableConfig(policy="cbsp", slot=360.0, rate=30.0, slots=200, nodes=200, warmup=20, seed=3)
    chunks = list(sim.stream_tasks(cfg))
    assert [(int(c.arrival_slot.min()), int(c.arrival_slot.max())) for c in chunks] == [
        (0, 39), (40, 79), (80, 119), (120, 159), (160, 199)]
    assert not np.allclose(chunks[0].length[:10], chunks[1].length[:10])
    res = simulate(cfg)
    measured = sum(int((c.arrival_slot >= 20).sum()) for c in chunks)
    assert res["tasks"] == measured and res["unfinished"] == 0 and res["aet"] > 0
