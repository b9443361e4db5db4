"""issue 25 items 1, 3 and 4: ``job show`` prints its history as lines, ``job list``/``job show`` speak
each shape's language (rigid, moldable, task bag, gang, shared vcsched VM) and the tables fit 100 columns
(``-o wide`` for the rest), at the width ``COLUMNS`` gives when stdout is no terminal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.livedaemon import run_cli
from tests.unit.test_daemon_core import Cluster
from vmctl.api.documents import job_json
from vmctl.api.schemas import job_spec
from vmctl.policies.registry import create_policy

NOW = 1795000000.0

RIGID = {
    "id": "17", "name": "sim-a", "state": "running", "procs": 2, "estimate": 600.0, "priority": 0,
    "deadline": None, "user": "alice", "account": "", "submit_time": NOW - 60, "start_time": NOW - 50,
    "end_time": None, "tier": "bg", "placement": [{"node": "n1", "core": 0}, {"node": "n1", "core": 1}],
    "reason": None, "tasks": [{"index": 0, "exit_status": None, "error": None}], "migrations": 1,
    "history": [{"time": NOW - 60, "event": "submitted", "detail": None},
                {"time": NOW - 50, "event": "started", "detail": "run 1 as bg on n1:0, n1:1"}],
}


class FakeClient:
    """What ``vmctl job`` asks of the API client, answered from documents."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs

    def get_job(self, job_id: str) -> dict[str, Any]:
        return next(j for j in self.jobs if j["id"] == job_id)

    def list_jobs(self, state: str | None = None, limit: int | None = None, order: str = "oldest") -> list[Any]:
        return list(reversed(self.jobs)) if order == "newest" else list(self.jobs)


@pytest.fixture()
def serve(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(*jobs: dict[str, Any]) -> None:
        monkeypatch.setattr("vmctl.cli.job._client", lambda url, token, ca: FakeClient(list(jobs)))

    return use


def test_job_show_prints_its_history_one_line_per_entry(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    serve(RIGID)
    code, out, _ = run_cli(capsys, "job", "show", "17")
    assert code == 0
    assert "\\n" not in out, out
    lines = out.splitlines()
    at = lines.index("history:")
    assert "submitted" in lines[at + 1] and "started: run 1 as bg on n1:0, n1:1" in lines[at + 2], out


def test_a_line_break_inside_a_history_detail_stays_in_its_entry() -> None:
    from vmctl.cli.job import history_text

    text = history_text([{"time": NOW, "event": "requeued", "detail": "node n1\nlost"}])
    assert text.count("\n") == 1 and "node n1\\nlost" in text


# ------------------------------------------------------------------------------ the job document


def test_a_moldable_job_keeps_its_width_and_its_time_there_after_it_ends(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 4}, policy=create_policy("moldable"))
    spec = job_spec({"shape": {"kind": "moldable", "table": {"1": 40, "2": 24, "4": 12}}, "work_seconds": 6})
    jid = c.daemon.submit([spec])[0].id
    c.run_until(lambda: c.state(jid) == "running")
    running = job_json(c.daemon.job(jid))
    assert running["procs"] == 1  # the spec's procs: the smallest width, which a rigid policy would give it
    width = running["width"]
    assert width == len(running["placement"]) and width in (1, 2, 4)
    assert running["width_time"] == {1: 40.0, 2: 24.0, 4: 12.0}[width]
    c.run_until(lambda: c.state(jid) == "done", limit=200)
    done = job_json(c.daemon.job(jid))
    assert done["placement"] == [] and (done["width"], done["width_time"]) == (width, running["width_time"])
    assert done["tasks_total"] is None and done["work_left"] is None
    c.close()


def test_a_task_bag_counts_tasks_done_and_work_left(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 1}, policy=create_policy("dispatch-priority"), shared_levels=2)
    spec = {"shape": {"kind": "task-bag", "tasks": [4.0, 4.0, 4.0, 8.0, 8.0]}, "procs": 2, "estimate": 28.0}
    jid = c.daemon.submit([spec])[0].id
    queued = job_json(c.daemon.job(jid), bag_tasks=False)
    assert (queued["tasks_done"], queued["tasks_total"], queued["work_left"], queued["width"]) == (0, 5, 28.0, None)
    c.run_until(lambda: sum(t["exit_status"] is not None for t in c.daemon.job(jid).tasks) >= 2)
    doc = job_json(c.daemon.job(jid), bag_tasks=False)  # the job list's form: no task rows
    done = [k for k, t in enumerate(c.daemon.job(jid).tasks) if t["exit_status"] is not None]
    assert doc["tasks"] == [] and doc["tasks_done"] == len(done) and doc["tasks_total"] == 5
    assert doc["work_left"] == 28.0 - sum(spec["shape"]["tasks"][k] for k in done)  # type: ignore[index]
    assert doc["width"] == len(doc["workers"]) >= 1
    c.run_until(lambda: c.state(jid) == "done", limit=500)
    end = job_json(c.daemon.job(jid), bag_tasks=False)
    assert (end["tasks_done"], end["work_left"], end["width"]) == (5, 0.0, None)
    c.close()


# ------------------------------------------------------------------------------ job list / job show per shape

OPENAPI = yaml.safe_load((Path(__file__).resolve().parents[2] / "vmctl/api/openapi.yaml").read_text())


def job_doc(**kw: Any) -> dict[str, Any]:
    """A job document as GET /v1/jobs answers it (checked against the OpenAPI file's Job schema)."""
    doc = {**RIGID, "tier": "fg", "migrations": 0, "cpu_need": 1.0, "mem": 0.0, "cap": None, "expected_start": None,
           "held": False, "blocked_by": [], "shape": None, "width": 2, "width_reason": None, "workers": [],
           "tasks_left": None, "width_time": None, "tasks_total": None, "tasks_done": None, "work_left": None,
           "runs": 1, "requeues": 0, **kw}
    schema = {**OPENAPI["components"]["schemas"]["Job"], "components": OPENAPI["components"]}
    jsonschema.Draft202012Validator(schema).validate(doc)
    return doc


MOLD_SHAPE = {"kind": "moldable", "widths": [1, 2, 4, 8], "times": [400.0, 220.0, 120.0, 70.0]}
BAG_SHAPE = {"kind": "task-bag", "tasks": [4.0] * 20, "max_workers": 4}
CORES = [{"node": "n2", "core": c} for c in range(4)]

MOLDABLE = job_doc(id="21", name="mold", procs=1, estimate=400.0, shape=MOLD_SHAPE, width=4, width_time=120.0,
                   placement=CORES, width_reason="width 4 of [1, 2, 4, 8]: AFCFS")
MOLDABLE_DONE = job_doc(id="22", name="mold-done", state="done", procs=1, estimate=400.0, shape=MOLD_SHAPE, width=4,
                        width_time=120.0, placement=[], tier=None, end_time=NOW, reason="done")
MOLDABLE_QUEUED = job_doc(id="23", name="mold-q", state="queued", procs=1, estimate=400.0, shape=MOLD_SHAPE,
                          width=None, placement=[], tier=None, start_time=None, reason="waits for 1 core")
BAG = job_doc(id="31", name="bag", procs=4, estimate=80.0, shape=BAG_SHAPE, width=3, placement=CORES[:3],
              tasks_left=8, tasks_total=20, tasks_done=12, work_left=32.0,
              workers=[{"id": f"n2/{c}.0", "node": "n2", "core": c, "level": 0, "task": 12 + c, "leaving": False,
                        "throughput": None} for c in range(3)])
GANG = job_doc(id="41", name="gang", procs=2, estimate=300.0, tier="bg", placement=CORES[:2],
               gang={"row": 1, "replicas": [2], "run_s": 100.0, "active_s": 50.0})
SHARED = job_doc(id="51", name="vc", procs=2, estimate=300.0, tier="shared", cap=0.5,
                 placement=[{"node": "node3", "core": -1}, {"node": "node3", "core": -1}])


def _rows(grid: Any) -> dict[str, dict[str, str]]:
    return {row[0]: dict(zip(grid.headers, row, strict=True)) for row in grid.rows}


def test_job_list_speaks_each_shapes_language() -> None:
    from vmctl.cli.render import job_table

    rows = _rows(job_table([RIGID, MOLDABLE, MOLDABLE_DONE, MOLDABLE_QUEUED, BAG, GANG, SHARED]))
    assert (rows["17"]["WIDTH"], rows["17"]["TIME"], rows["17"]["STATE"]) == ("2", "10.0m", "running bg")
    # moldable: the chosen width of the allowed ones and the time there, not procs 1 and the time at 1
    assert (rows["21"]["WIDTH"], rows["21"]["TIME"]) == ("4 of 1,2,4,8", "2.0m")
    assert (rows["22"]["WIDTH"], rows["22"]["TIME"]) == ("4 of 1,2,4,8", "2.0m")  # kept after the end
    assert (rows["23"]["WIDTH"], rows["23"]["TIME"]) == ("1,2,4,8", "70s..6.7m")  # not chosen yet
    # task bag: workers now, tasks done of all and the work left, not the most workers and one task's time
    assert (rows["31"]["WIDTH"], rows["31"]["TIME"]) == ("3 workers", "12/20, 32s left")
    assert rows["41"]["STATE"] == "running row 1+2"  # a gang job's row and replicas, not fg/bg
    assert rows["51"]["STATE"] == "running cap 50%" and rows["51"]["NODES (REASON)"] == "node3x2"
    assert rows["21"]["NODES (REASON)"] == "n2:0-3" and rows["23"]["NODES (REASON)"] == "waits for 1 core"
    assert rows["22"]["STATE"] == "done" and rows["22"]["NODES (REASON)"] == "done"
    wide = _rows(job_table([SHARED, MOLDABLE_DONE], wide=True))
    assert wide["51"]["PLACEMENT"] == "node3, node3" and ":-1" not in str(wide)
    assert wide["22"]["REASON"] == "done" and wide["22"]["PRIO"] == "0" and wide["51"]["RUNS AS"] == "cap 50%"


def _show(serve: Any, capsys: pytest.CaptureFixture[str], doc: dict[str, Any]) -> dict[str, str]:
    serve(doc)
    code, out, err = run_cli(capsys, "job", "show", str(doc["id"]))
    assert code == 0, err
    head = out.split("history:")[0]
    return {k: v.strip() for k, v in ([*line.split(None, 1), ""][:2] for line in head.splitlines() if line.strip())}


def test_job_show_speaks_each_shapes_language(serve: Any, capsys: pytest.CaptureFixture[str]) -> None:
    shown = _show(serve, capsys, MOLDABLE)
    assert shown["width"] == "4 of widths 1,2,4,8, 2.0m at that width"
    assert "procs" not in shown and "estimate" not in shown  # the spec's: the smallest width, its time
    assert _show(serve, capsys, MOLDABLE_DONE)["width"] == "4 of widths 1,2,4,8 (its last run), 2.0m at that width"
    assert _show(serve, capsys, MOLDABLE_QUEUED)["width"] == "not chosen yet (widths 1,2,4,8)"
    bag = _show(serve, capsys, BAG)
    assert bag["width"] == "3 workers now (at most 4)" and "procs" not in bag
    assert bag["work_left"] == "32s of work (on a standard core) in 8 task(s)"
    assert _show(serve, capsys, GANG)["tier"].startswith("row 1+2 (gang")
    shared = _show(serve, capsys, SHARED)
    assert shared["tier"] == "shared (unpinned VMs, each VM capped at 50% of a core)"
    assert shared["placement"] == "node3, node3"
    rigid = _show(serve, capsys, job_doc())
    assert (rigid["procs"], rigid["estimate"], rigid["width"]) == ("2", "600.0", "2") and "work_left" not in rigid


# ------------------------------------------------------------------------------ table width without a TTY

LONG_REASON = ("head of queue: reservation at 2026-11-23T18:53:20Z needs 16 cores; 12 are free on the nodes of group "
               "default and the other jobs end later than its deadline allows")
WAITING = job_doc(id="61", name="a-rather-long-job-name-from-a-sweep-cell-0042", user="researcher",
                  account="project-with-long-name", state="queued", held=True, placement=[], tier=None,
                  start_time=None, expected_start=NOW + 600, reason=LONG_REASON, width=None)
NODES = [{"name": f"compute-node-{i:03d}", "cores": 32, "state": "drained" if i == 2 else "ready",
          "drain_reason": "DIMM swap in slot B3, ticket INC-20261128-0042" if i == 2 else None,
          "last_seen": NOW - 3, "generation": 120 + i, "generation_applied": 118 + i, "report_age_s": 12.0,
          "fg_busy": 30, "bg_busy": 28, "orphans": i % 2, "utilization": 0.93, "speed": 1.5, "group": "default",
          "memory_mib": 262144, "levels": 2, "discipline": "priority",
          "peers": [f"compute-node-{j:03d}" for j in range(8)],
          "errors": ["plan: generation refused: core 40 out of range of this host's 32 cores"] if i == 3 else []}
         for i in range(6)]
VMS = [{"name": f"j1234-r1-p{i}", "node": "compute-node-001", "core": i, "role": "fg", "weight": 10000, "cap": 0.5,
        "power": "running", "job_id": "1234", "utilization": 0.5, "managed": True, "differs": ["power", "cap", "core"],
        "observed": {"node": "compute-node-001", "power": "paused", "core": i + 8, "weight": 10000, "cap": 1.0,
                     "job_id": "1234", "utilization": 0.0, "migration_phase": None}} for i in range(4)]


class FakeCluster(FakeClient):
    def list_nodes(self) -> list[dict[str, Any]]:
        return NODES

    def list_vms(self, node: str | None = None) -> list[dict[str, Any]]:
        return VMS


@pytest.fixture()
def cluster_api(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeCluster([RIGID, MOLDABLE, MOLDABLE_DONE, MOLDABLE_QUEUED, BAG, GANG, SHARED, WAITING])
    for mod in ("job", "node", "vm"):
        monkeypatch.setattr(f"vmctl.cli.{mod}._client", lambda url, token, ca: fake)


TABLES = [(("job", "list"), 8), (("node", "list"), 6), (("vm", "list"), 4)]


def _table_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize(("argv", "rows"), TABLES)
@pytest.mark.parametrize("columns", ["100", None])
def test_tables_fit_100_columns_a_line_per_row(cluster_api: None, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch, argv: tuple[str, ...], rows: int,
                                               columns: str | None) -> None:
    """At COLUMNS=100, and at the default without a terminal (the test's stdout is captured: no TTY)."""
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    lines = _table_lines(out)
    assert max(len(line.rstrip()) for line in lines) <= 100, out
    assert len(lines) == rows + 2, out  # header, its rule and a line per row: nothing folded


def test_columns_is_honoured_without_a_tty_and_wide_cuts_nothing(cluster_api: None,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    code, narrow, _ = run_cli(capsys, "job", "list")
    assert code == 0 and "\u2026" in narrow and "deadline allows" not in narrow  # the reason is cut ...
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_cli(capsys, "job", "list")
    assert code == 0 and max(len(line.rstrip()) for line in out.splitlines()) > 100  # ... less at 200
    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = run_cli(capsys, "job", "list")
    assert code == 0 and "deadline allows" in out and "\u2026" not in out  # ... and not at all at 400
    for columns in ("100", None):  # wide: never cut or folded, whatever the width
        if columns is None:
            monkeypatch.delenv("COLUMNS")
        for argv, rows in TABLES:
            code, out, err = run_cli(capsys, *argv, "-o", "wide")
            assert code == 0, err
            assert "\u2026" not in out and len(_table_lines(out)) == rows + 2, out
    code, out, _ = run_cli(capsys, "node", "list", "-o", "wide")
    assert "DIMM swap in slot B3, ticket INC-20261128-0042" in out and "PEERS" in out


def test_top_lays_a_32_core_node_over_lines_that_fit(capsys: pytest.CaptureFixture[str]) -> None:
    from vmctl.cli.top import top_text

    node = {**NODES[0], "name": "n1"}
    vms = [{"name": f"j{100 + c}-r1-p0", "node": "n1", "core": c, "role": "fg", "job_id": str(100 + c),
            "managed": True} for c in range(32)]
    text = top_text({"name": "easy"}, [node], vms, [WAITING, MOLDABLE_QUEUED], [RIGID], width=100)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100, text
    cores = [line for line in lines if "/-" in line]
    assert len(cores) > 1 and all(line.startswith(" ") for line in cores[1:]), text  # indented under the first
    assert sum(line.count("/-") for line in cores) == 32
    assert "23 mold-q widths 1,2,4,8: waits for 1 core" in text  # a moldable job asks for its widths
    unlimited = top_text({"name": "easy"}, [node], vms, [WAITING], [RIGID]).splitlines()
    assert sum(1 for line in unlimited if "/-" in line) == 1  # no width: a node on one line


def test_placements_and_times_are_compact() -> None:
    from vmctl import timefmt
    from vmctl.cli.render import fmt_cores, fmt_placement

    cores = [{"node": "n1", "core": c} for c in (0, 1, 2, 3, 6, 8, 9)] + [{"node": "n2", "core": 0}]
    assert fmt_cores(cores) == "n1:0-3,6,8-9 n2:0"
    assert fmt_cores([{"node": "n1", "core": 0}, {"node": "n1", "core": 0}]) == "n1:0 (2 slots)"  # two levels
    assert fmt_cores([{"node": "node3", "core": -1}]) == "node3" and fmt_cores([]) == "-"
    assert fmt_placement([{"node": "node3", "core": -1}]) == "node3"  # never node3:-1
    now = timefmt.parse_time("2026-11-25T12:00:00", local=True)
    assert timefmt.short(now - 3600, now) == timefmt.iso(now - 3600)[11:19]  # today: the clock time
    assert timefmt.short(now - 86400 * 3, now).startswith("Nov 22 ")
    assert timefmt.short(now - 86400 * 400, now) == timefmt.iso(now - 86400 * 400)[:10]
    at = timefmt.parse_time("2026-11-25T03:05:06Z")
    assert timefmt.rewrite_iso("at 2026-11-25T03:05:06Z.", lambda t: f"<{t:.0f}>") == f"at <{at:.0f}>."
    assert timefmt.rewrite_iso("2026-13-45T03:05:06Z", str) == "2026-13-45T03:05:06Z"  # no date: as it is


def test_vcsched_solve_lays_a_hosts_tasks_over_lines_that_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from vmctl.cli.render import flow

    assert flow("h  ", ["a", "bb", "cc"], 8, sep=", ") == ["h  a, bb", "   cc"]
    assert flow("h  ", ["a", "bb", "cc"], None, sep=", ") == ["h  a, bb, cc"]
    inst = tmp_path / "i.json"
    inst.write_text(json.dumps({"hosts": 1, "tasks": [{"cpu": 0.05, "mem": 0.01}] * 16}), encoding="utf-8")
    monkeypatch.setenv("COLUMNS", "60")
    code, out, err = run_cli(capsys, "vcsched", "solve", str(inst), "-a", "mcb8")
    assert code == 0, err
    rows = out[out.index("tasks (cpu cap / need)"):].splitlines()[1:]
    assert len(rows) > 1 and max(len(r) for r in rows) <= 60, out
    assert sum(r.count("/0.050") for r in rows) == 16  # every task, on lines under the tasks column


def test_a_bags_work_left_counts_running_retried_and_unstarted_tasks() -> None:
    from vmctl.api.documents import shape_fields
    from vmctl.model import JobState
    from vmctl.store.base import JobRecord

    spec = job_spec({"shape": {"kind": "task-bag", "tasks": [1, 2, 3, 4, 5], "max_workers": 2}})
    rec = JobRecord(id="b1", seq=1, name="b", spec=spec, state=JobState.RUNNING, submit_time=0.0)
    rec.bag = {"next": 3, "task": [1, None], "release": [False, False], "vms": [0, 1], "rate": {}, "retry": []}
    got = shape_fields(rec)
    assert (got["tasks_done"], got["work_left"]) == (2, 2.0 + 4.0 + 5.0)  # task 1 runs, 3 and 4 not started
    rec.bag = {"next": 5, "task": [], "release": [], "vms": [], "rate": {}, "retry": [1, 3]}  # requeued, kept
    rec.state = JobState.QUEUED
    got = shape_fields(rec)
    assert (got["tasks_done"], got["tasks_total"], got["work_left"], got["width"]) == (3, 5, 6.0, None)


def test_top_marks_slots_the_hosts_did_not_report_and_a_lost_nodes_age() -> None:
    """``top`` shows what vmctld wants; a slot whose host reported otherwise (``differs``) is marked, and a
    lost node says how old its last report is (its slots are not live)."""
    from vmctl.cli.top import top_text

    live = {**NODES[0], "name": "n1", "cores": 2}
    lost = {**NODES[0], "name": "n2", "cores": 2, "state": "lost", "report_age_s": 185.0}
    vms = [{"name": "j7-r1-p0", "node": "n1", "core": 0, "role": "fg", "job_id": "7", "managed": True,
            "differs": []},
           {"name": "j8-r1-p0", "node": "n2", "core": 1, "role": "bg", "job_id": "8", "managed": True,
            "differs": ["power"]}]
    text = top_text({"name": "measy"}, [live, lost], vms, [], [], width=100)
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("n1", "n2"))}
    assert "7/-" in rows["n1"] and "*" not in rows["n1"], text
    assert "-/8*" in rows["n2"] and "lost, report 3.1m old" in rows["n2"], text
    assert "*: wanted by vmctld, the host's last report differs" in text
    clean = top_text({"name": "measy"}, [live], vms[:1], [], [], width=100)
    assert "*" not in clean  # no legend without a marked slot
