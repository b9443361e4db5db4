"""Boot delays in the what-if replay (issue 28): vmctld's ``running`` history entry (the agents' first report
of every process of a run started: a rigid job's processes, a task bag's workers), the export's ``boot``
(started -> running of the first run), the side file's ``boot`` in ``read_swf`` (own / median / none; bad
values named with their line) and in :func:`vmctl.whatif.replay.replay`; a history without boots replays
exactly as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_daemon_core import Cluster
from tests.unit.test_whatif import NODES, T0, job
from vmctl import errors
from vmctl.policies.registry import create_policy
from vmctl.sim.workloads.swf import read_side_file, read_swf, side_file_path
from vmctl.whatif.export import boot_delay, build_trace, write_trace
from vmctl.whatif.replay import actual, boot_summary, error, replay

POLICY = {"name": "fcfs", "params": {}, "layout": {"discipline": "priority", "levels": 2}}


def booted(jid: str, submit: float, start: float, boot: float | None, work: float, procs: int = 1,
           **kw: Any) -> dict[str, Any]:
    """A finished job that started at ``start`` (vmctld's decision), whose processes all ran ``boot`` s
    later (None: no ``running`` entry) and ended after ``work`` s of work."""
    hist = [{"time": T0 + submit, "event": "submitted", "detail": None},
            {"time": T0 + start, "event": "started", "detail": "run 1 as fg on n1:0"}]
    if boot is not None:
        hist.append({"time": T0 + start + boot, "event": "running", "detail": f"{procs} processes running"})
    end = start + (boot or 0.0) + work
    hist.append({"time": T0 + end, "event": "done", "detail": "finished"})
    return job(jid, submit, start, end, procs=procs, work_seconds=work, history=hist, estimate=work * 2, **kw)


def history() -> list[dict[str, Any]]:
    """4 cores under FCFS: job 1 (4 procs) boots 30 s and runs 100; job 2 (4 procs, submitted at 10) waits
    for it, boots 50 s and runs 60; job 3 (2 procs, submitted at 20) waits for job 2 and has no ``running``
    entry (stored before vmctld kept them); job 4 (2 procs) beside it boots 40 s."""
    return [booted("1", 0.0, 0.0, 30.0, 100.0, procs=4),
            booted("2", 10.0, 130.0, 50.0, 60.0, procs=4),
            booted("3", 20.0, 240.0, None, 50.0, procs=2),
            booted("4", 30.0, 240.0, 40.0, 20.0, procs=2)]


def export(tmp_path: Path, jobs: list[dict[str, Any]] | None = None) -> Path:
    path = tmp_path / "h.swf"
    write_trace(build_trace(history() if jobs is None else jobs, NODES, POLICY), path)
    return path


def test_the_boot_is_the_first_runs_started_to_running() -> None:
    assert boot_delay(booted("1", 0.0, 5.0, 30.5, 100.0)) == pytest.approx(30.5)
    assert boot_delay(booted("1", 0.0, 5.0, None, 100.0)) is None
    requeued = booted("1", 0.0, 5.0, 30.0, 100.0)
    requeued["history"].insert(2, {"time": T0 + 20.0, "event": "requeued", "detail": "node down"})
    assert boot_delay(requeued) is None  # the first run stopped before its processes all ran
    assert boot_delay(job("1", 0.0, None, 5.0, state="cancelled")) is None


def test_a_bags_boot_is_its_workers_mean() -> None:
    bag = booted("1", 0.0, 5.0, 30.0, 100.0, procs=2)
    bag["history"][2]["boot"] = 12.5  # its workers ran 0-30 s after the start, on average 12.5 s
    assert boot_delay(bag) == 12.5


def test_the_side_file_has_each_jobs_boot_and_none_without_one(tmp_path: Path) -> None:
    side = read_side_file(export(tmp_path))
    assert side is not None
    assert {k: e.get("boot") for k, e in side["jobs"].items()} == {"1": 30.0, "2": 50.0, "3": None, "4": 40.0}
    assert "boot" not in side["jobs"]["3"]  # absent, not null: the field is only written when known
    assert boot_summary(export(tmp_path)) == {"jobs": 3, "median": 40.0, "mean": 40.0, "max": 50.0}


def test_read_swf_adds_the_boot_to_run_time_and_estimate(tmp_path: Path) -> None:
    path = export(tmp_path)
    plain = {j.id: j for j in read_swf(path, boot="none").jobs}
    own = {j.id: j for j in read_swf(path).jobs}
    med = {j.id: j for j in read_swf(path, boot="median").jobs}
    assert [plain[k].run_time for k in (1, 2, 3, 4)] == [100.0, 60.0, 50.0, 20.0]
    # each its own; job 3 (none measured) the median of the others (40 s)
    assert [own[k].run_time for k in (1, 2, 3, 4)] == [130.0, 110.0, 90.0, 60.0]
    assert [own[k].estimate - plain[k].estimate for k in (1, 2, 3, 4)] == [30.0, 50.0, 40.0, 40.0]
    assert [med[k].run_time for k in (1, 2, 3, 4)] == [140.0, 100.0, 90.0, 60.0]
    with pytest.raises(errors.VmctlError, match="boot"):
        read_swf(path, boot="mean")


def test_the_boot_of_a_bag_is_on_each_first_task_and_of_a_moldable_job_at_every_width(tmp_path: Path) -> None:
    bag = booted("1", 0.0, 0.0, 20.0, 30.0, procs=2,
                 shape={"kind": "task-bag", "tasks": [10.0, 10.0, 10.0, 10.0, 10.0], "max_workers": 2})
    mold = booted("2", 1.0, 60.0, 5.0, 50.0, procs=2, shape={"kind": "moldable", "widths": [1, 2],
                                                               "times": [100.0, 50.0]})
    path = export(tmp_path, [bag, mold])
    wl = read_swf(path)
    assert wl.shapes[1].tasks == (30.0, 30.0, 10.0, 10.0, 10.0)  # each of the 2 workers boots once
    assert wl.shapes[2].times == (105.0, 55.0)
    # a bag has no run-time limit in vmctld and its decision maker saw the estimate as submitted
    plain = {j.id: j for j in read_swf(path, boot="none").jobs}
    assert wl.jobs[0].estimate == plain[1].estimate and wl.jobs[1].estimate == plain[2].estimate + 5.0


def test_a_history_without_boots_reads_and_replays_exactly_as_before(tmp_path: Path) -> None:
    no_boot = [{**j, "history": [h for h in j["history"] if h["event"] != "running"]} for j in history()]
    path = export(tmp_path, no_boot)
    side = read_side_file(path)
    assert side is not None and not any("boot" in e for e in side["jobs"].values())
    for mode in ("own", "median"):
        assert read_swf(path, boot=mode).jobs == read_swf(path, boot="none").jobs
    base = replay(path, "fcfs", {}, boot="none")
    for mode in ("own", "median"):
        assert replay(path, "fcfs", {}, boot=mode) == base


def test_the_replay_of_the_policy_in_force_reproduces_a_history_with_boots(tmp_path: Path) -> None:
    """Without the boots the replay ends every job its boot early (and the jobs behind it start early);
    with them it reproduces the live run: the test fails without the boot model."""
    path = export(tmp_path)
    act = actual(path)
    side = read_side_file(path)
    assert side is not None
    submits = {k: float(e["submit"]) for k, e in side["jobs"].items()}
    with_boot = replay(path, "fcfs", {})
    without = replay(path, "fcfs", {}, boot="none")
    live = json.loads(act["jobs_json"])
    sim = json.loads(with_boot["jobs_json"])
    # job 3 has no boot of its own: the median (40 s), the one it would have had beside job 4
    for k in ("1", "2", "4"):
        assert sim[k] == pytest.approx(live[k], abs=1e-6), k
    assert sim["3"] == pytest.approx([live["3"][0], live["3"][1] + 40.0], abs=1e-6)
    e = error(with_boot, act, submits)
    assert e["start"]["max_abs"] == pytest.approx(0.0, abs=1e-6)
    plain = error(without, act, submits)
    assert plain["avg_response_relative"] < -0.2  # 30-50 s of boot per job of 20-100 s
    assert abs(e["avg_response_relative"]) < abs(plain["avg_response_relative"])


@pytest.mark.parametrize(("value", "shown"), [("-1", "-1"), ('"30"', "'30'"), ("true", "True"), ("NaN", "nan")])
def test_a_bad_boot_is_named_with_its_field_and_line(tmp_path: Path, value: str, shown: str) -> None:
    path = export(tmp_path)
    side = side_file_path(path)
    lines = side.read_text().splitlines()
    # job 2's boot line (the side file is indented: one field per line)
    start = lines.index(' "jobs": {')
    k = next(i for i in range(start, len(lines)) if lines[i].strip() == '"2": {')
    at = next(i for i in range(k, len(lines)) if lines[i].strip().startswith('"boot":'))
    lines[at] = f'   "boot": {value}'
    side.write_text("\n".join(lines) + "\n")
    with pytest.raises(errors.TraceFormatError) as exc:
        read_swf(path)
    msg = str(exc.value)
    assert f"{side}:{at + 1}:" in msg and "jobs.2.boot must be a number >= 0 or null" in msg and shown in msg, msg
    with pytest.raises(errors.TraceFormatError, match=r"jobs\.2\.boot"):
        replay(path, "fcfs", {})


def test_a_null_boot_is_no_boot(tmp_path: Path) -> None:
    path = export(tmp_path)
    side = side_file_path(path)
    doc = json.loads(side.read_text())
    doc["jobs"]["1"]["boot"] = None
    side.write_text(json.dumps(doc, indent=1))
    by_id = {j.id: j for j in read_swf(path).jobs}
    assert by_id[1].run_time == 100.0 + 45.0  # the median of jobs 2 and 4


def test_vmctld_notes_when_every_process_of_a_run_and_every_worker_of_a_bag_ran(tmp_path: Path) -> None:
    c = Cluster(tmp_path, {"n1": 2, "n2": 2})
    jid = c.submit(3, 50, 40)
    c.run_until(lambda: c.state(jid) == "done")
    hist = c.daemon.job(jid).history
    events = [h["event"] for h in hist]
    assert events == ["submitted", "started", "running", "done"], hist
    assert hist[2]["detail"].startswith("3 processes running ") and hist[2]["time"] >= hist[1]["time"]
    c.close()
    b = Cluster(tmp_path / "bag", {"n1": 1, "n2": 1}, policy=create_policy("dispatch-proportion"), shared_levels=2)
    bag = b.daemon.submit([{"shape": {"kind": "task-bag", "tasks": [5.0] * 6}, "procs": 6, "estimate": 30.0}])[0].id
    b.run_until(lambda: b.state(bag) == "done", limit=2000)
    hist = b.daemon.job(bag).history
    running = [h for h in hist if h["event"] == "running"]
    assert len(running) == 1 and " s after the start (mean " in running[0]["detail"], hist
    started = next(h["time"] for h in hist if h["event"] == "started")
    assert 0.0 <= running[0]["boot"] <= running[0]["time"] - started  # the workers' mean, at most the last
    assert [h["event"] for h in hist].index("running") > [h["event"] for h in hist].index("started")
    b.close()


def test_the_fidelity_report_gives_the_boots_and_the_replay_without_them(tmp_path: Path) -> None:
    from bench.whatif import boot_line
    from vmctl.whatif.fidelity import boot_effect

    path = export(tmp_path)
    act = actual(path)
    side = read_side_file(path)
    assert side is not None
    submits = {k: float(e["submit"]) for k, e in side["jobs"].items()}
    b = boot_effect(path, "fcfs", {}, act, submits, 2.0, on_real=["1", "2"])
    assert b["real_host"] == {"jobs": 2, "median": 40.0, "max": 50.0} and b["mock_hosts"]["jobs"] == 1
    assert b["without"]["avg_response"] == replay(path, "fcfs", {}, boot="none")["avg_response"]
    assert b["without"]["error_relative"] < -0.2
    # every job ended at start + boot + work: nothing left beyond them (job 3 has no boot: not counted)
    assert b["tail"]["all"]["jobs"] == 3 and b["tail"]["all"]["max"] == pytest.approx(0.0, abs=1e-6)
    text = boot_line({"boot": b})
    assert "3 jobs, median 40.0" in text and "real host: median 40.0, max 50.0 (2 jobs)" in text and "without" in text
    assert "none in the history" in boot_line({"boot": {"jobs": 0}})


def test_vmctl_whatif_says_how_the_boots_were_replayed(tmp_path: Path) -> None:
    from vmctl.whatif.report import render, run_whatif

    path = export(tmp_path)
    doc = run_whatif(path, ["fcfs"], {}, POLICY, 1, tmp_path / "w.csv")
    assert doc["boot"] == {"mode": "own", "jobs": 3, "median": 40.0, "mean": 40.0, "max": 50.0}
    assert abs(doc["error_in_force"]["avg_response_relative"]) < 0.05
    assert "measured for 3 jobs: median 40.0 s, max 50.0 s; in every replay: each job its own" in render(doc)
    none = run_whatif(path, ["fcfs"], {}, POLICY, 1, tmp_path / "n.csv", boot="none")
    assert none["error_in_force"]["avg_response_relative"] < -0.2 and "not replayed" in render(none)


class Connecting:
    """A runner still connecting to the guests: the processes it was asked for do not run yet."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def start(self, vm: str, spec: Any) -> None:
        self.inner.start(vm, spec)

    def status(self, vm: str) -> Any:
        import dataclasses

        st = self.inner.status(vm)
        return None if st is None else dataclasses.replace(st, started=False)

    def kill(self, vm: str) -> None:
        self.inner.kill(vm)


def test_a_process_the_agent_is_still_starting_is_not_running_yet(tmp_path: Path) -> None:
    """A real guest's process starts over SSH once the guest booted: until then its agent reports it
    ``process_starting`` (the runner has no pid of it), and vmctld neither opens the run nor notes
    ``running``; the wire carries the flag (absent when false)."""
    import dataclasses

    from vmctl.nodedoc import PowerState, VmObserved
    from vmctl.wire import vm_observed_from_json, vm_observed_to_json

    v = VmObserved(name="j1-r1-p0", power=PowerState.RUNNING, process_job="1", process_index=0, process_starting=True)
    assert vm_observed_from_json(vm_observed_to_json(v), "vms[0].") == v
    assert "process_starting" not in vm_observed_to_json(dataclasses.replace(v, process_starting=False))
    c = Cluster(tmp_path, {"n1": 2})
    jid = c.submit(2, 100, 50)
    runners = {name: rec.runner for name, (rec, _s, _r, _b) in c.agents.items()}
    for name, (rec, _s, _r, _b) in c.agents.items():
        rec.runner = Connecting(runners[name])
    for _ in range(3):  # the agents start the processes; their reports say they are still starting
        c.clock.advance(1.0)
        c.daemon.run_once()
        for name, (rec, src, rep, _be) in c.agents.items():
            src.set(c.daemon.desired(name))
            rec.run_once()
            assert rep.last is not None
            assert any(x.process_starting and x.process_started_at is None for x in rep.last.vms)
            c.daemon.report(rep.last)
    for name, (rec, _s, _r, _b) in c.agents.items():
        rec.runner = runners[name]  # the guests' SSH servers are up: the processes run
    job1 = c.daemon.job(jid)
    assert job1.state == "running" and not any(t["seen"] for t in job1.tasks)
    assert "running" not in [h["event"] for h in job1.history]
    c.step()  # now they run
    hist = c.daemon.job(jid).history
    assert [h["event"] for h in hist] == ["submitted", "started", "running"], hist
    assert hist[2]["time"] - hist[1]["time"] >= 3.0  # the 3 s it was starting count as its boot
    c.close()


def test_the_ssh_runner_says_a_process_started_once_it_has_its_pid(tmp_path: Path) -> None:
    from vmctl.agents.remote import ParamikoRunner, SshSettings, _Job
    from vmctl.nodedoc import ProcessSpec

    for f in ("key", "known_hosts"):
        (tmp_path / f).write_text("")
    r = ParamikoRunner(SshSettings(user="root", key_file=str(tmp_path / "key"),
                                   known_hosts=str(tmp_path / "known_hosts")))
    job = _Job(ProcessSpec(job_id="1", index=0, command="sleep 1"), "vm")
    r._jobs["vm"] = job  # connecting: the guest's SSH server is not up yet
    st = r.status("vm")
    assert st is not None and st.running and not st.started
    job.pid = 42  # the wrapper printed the process's pid: it runs in the guest
    st = r.status("vm")
    assert st is not None and st.running and st.started


def test_a_measured_run_holds_the_boot_once(tmp_path: Path) -> None:
    """A job submitted without work_seconds (a real job) has its measured run (end - first start) as its
    work; that run holds its boot, so the side file's work is the run minus the boot and the replay (boot
    + work) ends it where it ended live."""
    real = booted("1", 0.0, 0.0, 30.0, 100.0, procs=2)
    real["work_seconds"] = None
    path = export(tmp_path, [real])
    side = read_side_file(path)
    assert side is not None and side["jobs"]["1"]["work"] == 100.0 and side["jobs"]["1"]["boot"] == 30.0
    assert json.loads(replay(path, "fcfs", {})["jobs_json"])["1"] == pytest.approx([0.25, 130.25])
