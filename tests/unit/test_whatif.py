"""``vmctl history export`` and ``vmctl whatif`` without a daemon: the trace built from API documents,
its SWF round trip through vmctl's reader, the side file's round trip, the errors, and the replay and
comparison on a tiny hand-made history."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest

from vmctl import errors
from vmctl.cli.history import parse_range
from vmctl.cli.whatif import whatif_params
from vmctl.sim.workloads.swf import read_side_file, read_swf, side_file_path
from vmctl.whatif.export import build_trace, write_trace
from vmctl.whatif.replay import actual, error, family, replay
from vmctl.whatif.report import render

T0 = 1_795_000_000.25  # an epoch submit with a fraction: UnixStartTime is its floor


def job(jid: str, submit: float, start: float | None, end: float | None, procs: int = 1, state: str = "done",
        **kw: Any) -> dict[str, Any]:
    """A finished job as ``GET /v1/history`` answers it (the fields the export reads)."""
    doc: dict[str, Any] = {
        "id": jid, "name": f"n{jid}", "state": state, "procs": procs, "estimate": 100.0, "priority": 0,
        "deadline": None, "user": "alice", "account": "", "submit_time": T0 + submit,
        "start_time": None if start is None else T0 + start, "end_time": None if end is None else T0 + end,
        "first_start": None if start is None else T0 + start, "width": procs if start is not None else None,
        "shape": None, "migrations": 0, "requeues": 0, "cpu_need": 1.0, "mem": 0.0, "work_seconds": None,
        "cpu_usage": None, "archived": False}
    doc.update(kw)
    return doc


NODES = [{"name": "n1", "cores": 2, "speed": 1.0, "group": "default", "levels": 2, "discipline": "priority",
          "state": "ready"},
         {"name": "n2", "cores": 2, "speed": 1.0, "group": "default", "levels": 2, "discipline": "priority",
          "state": "ready"}]
POLICY = {"name": "easy", "params": {}, "layout": {"discipline": "priority", "levels": 2}}


def history() -> list[dict[str, Any]]:
    """4 cores; job 1 (2 procs, 100 s) and job 2 (2 procs, 50 s) start at once, job 3 (4 procs) waits for
    both, job 4 is a task bag with a deadline and a priority, job 5 was cancelled in the queue."""
    return [
        job("1", 0.0, 0.0, 100.0, procs=2, work_seconds=100.0),
        job("2", 10.0, 10.0, 60.0, procs=2, work_seconds=50.0, user="bob", priority=3),
        job("3", 20.0, 100.0, 140.0, procs=4, work_seconds=40.0, deadline=T0 + 200.0, archived=True),
        job("4", 30.5, 140.0, 170.0, procs=2, priority=2, deadline=T0 + 150.0,
            shape={"kind": "task-bag", "tasks": [10.0, 10.0, 10.0, 10.0], "max_workers": 2}),
        job("5", 40.0, None, 45.0, procs=1, state="cancelled"),
    ]


def export(tmp_path: Path, name: str = "h.swf") -> Path:
    path = tmp_path / name
    write_trace(build_trace(history(), NODES, POLICY, source="https://x:8443"), path)
    return path


def test_the_swf_has_the_cluster_header_and_one_record_per_finished_job(tmp_path: Path) -> None:
    path = export(tmp_path)
    text = path.read_text()
    header = [ln for ln in text.splitlines() if ln.startswith(";")]
    records = [ln.split() for ln in text.splitlines() if not ln.startswith(";")]
    assert "; MaxProcs: 4" in header and "; MaxNodes: 2" in header and "; TimeZoneString: UTC" in header
    assert f"; UnixStartTime: {math.floor(T0)}" in header and "; MaxJobs: 5" in header
    assert any("policy easy" in h for h in header)
    assert any(h.startswith("; Note: Fields vmctl does not know are -1: 6, 7, 10, 14, 16, 17, 18") for h in header)
    assert [len(r) for r in records] == [18] * 5
    # job 3: submit 20 (+0.25 from the floor: 20), waited 80, ran 40 on 4, status 1; job 5: never started
    assert records[2][:5] == ["3", "20", "80", "40", "4"] and records[2][10] == "1"
    assert records[4][2:5] == ["-1", "-1", "-1"] and records[4][10] == "5"
    assert records[1][11] == "2" and records[1][14] == "3"  # bob is user 2; priority 3 in the queue field


def test_swf_round_trip_through_vmctls_reader_without_the_side_file(tmp_path: Path) -> None:
    path = export(tmp_path)
    wl = read_swf(path, side=False)
    assert wl.max_procs == 4 and wl.dropped == {"nonpositive_run_time": 1}
    assert [(j.id, j.submit, j.run_time, j.procs) for j in wl.jobs] == [
        (1, 0.0, 100.0, 2), (2, 10.0, 50.0, 2), (3, 20.0, 40.0, 4), (4, 30.0, 30.0, 2)]
    assert wl.shapes == {} and all(j.priority == 0 and j.deadline is None for j in wl.jobs)
    gz = tmp_path / "h.swf.gz"
    write_trace(build_trace(history(), NODES, POLICY), gz)
    assert gzip.decompress(gz.read_bytes()).decode() == path.read_text().replace(
        "; Installation: vmctld at https://x:8443", "; Installation: vmctld")


def test_side_file_round_trip_gives_exact_times_priority_deadline_and_shapes(tmp_path: Path) -> None:
    path = export(tmp_path)
    side = read_side_file(path)
    assert side is not None and side_file_path(path).name == "h.swf.vmctl.json"
    assert side["cluster"]["policy"]["name"] == "easy" and [n["name"] for n in side["cluster"]["nodes"]] == ["n1", "n2"]
    assert side["jobs"]["3"]["vmctl_id"] == "3" and side["jobs"]["3"]["archived"] is True
    wl = read_swf(path)
    by_id = {j.id: j for j in wl.jobs}
    assert by_id[1].submit == 0.25 and by_id[2].priority == 3 and by_id[4].priority == 2
    assert by_id[3].deadline == pytest.approx(200.25) and by_id[4].deadline == pytest.approx(150.25)
    assert by_id[3].run_time == 40.0  # its work_seconds
    bag = wl.shapes[4]
    assert bag.kind == "task-bag" and bag.tasks == (10.0, 10.0, 10.0, 10.0) and bag.max_workers == 2
    assert by_id[4].run_time == bag.time_at(2) == 20.0  # the forecast at its width (factor 1)


def test_a_broken_side_file_is_named(tmp_path: Path) -> None:
    path = export(tmp_path)
    side = side_file_path(path)
    side.write_text("{not json")
    with pytest.raises(errors.TraceFormatError, match="not JSON") as exc:
        read_swf(path)
    assert str(side) in str(exc.value)
    side.write_text(json.dumps({"format": "other"}))
    with pytest.raises(errors.TraceFormatError, match="not a vmctl side file"):
        read_swf(path)
    doc = json.loads(json.dumps(build_trace(history(), NODES, POLICY).side))
    doc["jobs"]["2"]["priority"] = "high"
    side.write_text(json.dumps(doc))
    with pytest.raises(errors.TraceFormatError, match=r"jobs\.2\.priority"):
        read_swf(path)
    assert len(read_swf(path, side=False).jobs) == 4  # side=False ignores it


def test_an_empty_history_and_a_bad_range_are_errors_naming_the_problem() -> None:
    with pytest.raises(errors.ValidationError, match="no finished job submitted in") as exc:
        build_trace([], NODES, POLICY, since=T0, until=T0 + 60)
    assert "--since/--until" in str(exc.value)
    with pytest.raises(errors.ValidationError, match=r"--until.*not after --since"):
        parse_range("2026-11-25T05:00Z", "2026-11-25T04:00Z")
    with pytest.raises(errors.ValidationError, match="--since"):
        parse_range("yesterday", None)
    s, u = parse_range("1795000000", "1795000060")
    assert (s, u) == (1795000000.0, 1795000060.0)


def test_policy_parameters_are_per_policy_and_typed() -> None:
    assert whatif_params(["easy", "measy"], ["measy.migration_cost=5"]) == {
        "easy": {}, "measy": {"migration_cost": 5.0}}
    with pytest.raises(errors.ValidationError, match="not one of --policies"):
        whatif_params(["easy"], ["measy.migration_cost=5"])
    with pytest.raises(errors.ValidationError, match=r"NAME\.KEY=VALUE"):
        whatif_params(["easy"], ["migration_cost=5"])
    with pytest.raises(errors.PolicyParameterError):
        whatif_params(["measy"], ["measy.migration_cost=soon"])


def test_families() -> None:
    assert [family(p) for p in ("easy", "measy", "gs-m", "moldable", "dispatch-priority", "vcsched-gr")] == [
        "easy", "easy", "gang", "moldable", "task-bag", "vcsched"]


def test_replay_of_the_policy_in_force_reproduces_the_tiny_history(tmp_path: Path) -> None:
    """EASY on 4 cores replays the hand-made history: 1 and 2 start at submit, 3 (4 cores) waits for
    both and starts at 100 (the end of job 1), the bag (rigid at width 2 under EASY, its 20 s forecast)
    queues behind 3 (FCFS order, no room beside it) and runs in [140, 160)."""
    path = export(tmp_path)
    sim = replay(path, "easy", {})
    act = actual(path)
    times = json.loads(sim["jobs_json"])
    assert times["1"] == pytest.approx([0.25, 100.25]) and times["2"] == pytest.approx([10.25, 60.25])
    assert times["3"] == pytest.approx([100.25, 140.25]) and times["4"] == pytest.approx([140.25, 160.25])
    assert sim["jobs"] == 4 and act["jobs"] == 4 and sim["family"] == "easy"
    submits = {k: float(e["submit"]) for k, e in read_side_file(path)["jobs"].items()}  # type: ignore[index]
    err = error(sim, act, submits)
    assert err["jobs_compared"] == 4 and [pj["job"] for pj in err["per_job"]] == ["1", "2", "3", "4"]
    assert err["per_job"][3]["response_actual"] - err["per_job"][3]["response_simulated"] == pytest.approx(10.0)
    # the actual bag ran 30 s (170 - 140) where the replay runs its 20 s forecast at width 2
    assert err["start"]["max_abs"] == pytest.approx(0.0) and err["response"]["max_abs"] == pytest.approx(10.0)
    assert err["means"]["avg_response"] == pytest.approx(-10.0 / 4)
    assert act["deadlines_met"] == pytest.approx(0.5) and sim["deadlines_met"] == pytest.approx(0.5)
    doc = {"jobs": 5, "cluster": read_side_file(path)["cluster"],  # type: ignore[index]
           "policies": [{"policy": "easy", "params": {}, "in_force": True, **{k: sim[k] for k in sim}}],
           "actual": {"policy": "easy", **act}, "error_in_force": err}
    text = render(doc)
    assert "easy (in force)" in text and "actual (easy)" in text and "simulator vs actual on easy" in text


def test_vmctl_sim_run_reads_the_side_file(tmp_path: Path) -> None:
    """``vmctl sim run --trace`` (``build_workload``/``run_one``) takes the side file's priorities,
    deadlines and shapes; EASY, which schedules no bag, runs the SWF records as rigid jobs."""
    from vmctl.experiments.sweep import WorkloadSpec, build_workload, run_one

    path = export(tmp_path)
    built = build_workload(WorkloadSpec(trace=str(path), cpu_usage="full"))
    assert [j.priority for j in built.jobs] == [0, 3, 0, 2] and built.jobs[2].deadline == pytest.approx(200.25)
    assert set(built.shapes) == {"4"} and built.shapes["4"].kind == "task-bag"
    res = run_one(WorkloadSpec(trace=str(path)), "easy")
    assert res.jobs == 4 and res.metrics.jobs == 4


def test_rigid_jobs_replay_as_bags_under_a_dispatch_policy(tmp_path: Path) -> None:
    path = export(tmp_path)
    r = replay(path, "dispatch-priority", {})
    assert r["family"] == "task-bag" and r["jobs"] == 4
    times = json.loads(r["jobs_json"])
    assert all(not math.isnan(v[1]) for v in times.values())
    # job 1: 2 tasks of 100 s on at most 2 workers (the policy picks how many): 100 s at least, 200 at most
    assert 100.0 - 1e-6 <= times["1"][1] - times["1"][0] <= 200.0 + 1e-6


def test_gang_and_slot_replays_run_on_the_daemons_clock_phase(tmp_path: Path) -> None:
    """vmctld's slices (and the moldable policy's slots) start at multiples of their length of the daemon's
    clock (Unix seconds); a replay starts at trace time 0 = UnixStartTime. Here UnixStartTime is 60 s
    past a multiple of 200 (2 rows x 100-s slices), so live the first slice boundary comes 40 s after
    the first submit: A (4 processes, 150 s) and B (4 processes, 50 s), both submitted at once on 4
    cores with 2 rows, end at 90 (B: row 1 in [40, 140)) and 200 (A: 40 s in [0, 40), the rest alone
    from 90). Unaligned, the replay gives B 150 (row 1 in [100, 200)): 60 s off."""
    from vmctl.whatif.replay import clock_phase

    base = 1_795_000_060.0
    assert base % 200 == 60.0
    assert clock_phase("gs", {"mpl": 2, "slice": 100.0}, base) == pytest.approx(60.0)
    assert clock_phase("gs", {"mpl": 3, "slice": 100.0}, base) == pytest.approx(base % 600)
    assert clock_phase("moldable", {"slot": 60.0}, base) == pytest.approx(base % 60)
    assert clock_phase("easy", {}, base) == 0.0 and clock_phase("dispatch-priority", {}, base) == 0.0
    nodes = [{**n, "discipline": "timeslice"} for n in NODES]
    hist = [job(j, 0.0, 0.0, end, procs=4, work_seconds=work, estimate=300.0, submit_time=base, first_start=base,
                start_time=base, end_time=base + end) for j, work, end in (("a", 150.0, 200.0), ("b", 50.0, 90.0))]
    path = tmp_path / "g.swf"
    write_trace(build_trace(hist, nodes, {"name": "gs", "params": {"mpl": 2, "slice": 100.0},
                                          "layout": {"discipline": "timeslice", "levels": 2}}), path)
    sim = replay(path, "gs", {"mpl": 2, "slice": 100.0})
    assert sim["clock_phase"] == pytest.approx(60.0)
    times = json.loads(sim["jobs_json"])
    assert times["1"] == pytest.approx([0.0, 200.0]) and times["2"] == pytest.approx([0.0, 90.0])
    assert all(v[0] == pytest.approx(0.0) for v in times.values())
    err = error(sim, actual(path), {k: 0.0 for k in times})
    assert err["start"]["max_abs"] == pytest.approx(0.0) and err["response"]["max_abs"] == pytest.approx(0.0)
    # the agents' row-switch gap: with 20 s of each 100-s slice lost, B's 50 s take 62.5 s of its row's slices
    lossy = replay(path, "gs", {"mpl": 2, "slice": 100.0}, slice_loss=20.0)
    assert json.loads(lossy["jobs_json"])["2"] == pytest.approx([0.0, 102.5]) and lossy["slice_loss"] == 20.0
    with pytest.raises(errors.ValidationError, match="slice_loss"):
        replay(path, "gs", {"mpl": 2, "slice": 100.0}, slice_loss=100.0)
    assert replay(export(tmp_path), "easy", {}, slice_loss=20.0)["slice_loss"] == 0.0  # gang only
