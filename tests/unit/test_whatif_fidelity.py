"""The what-if fidelity testbed's pieces that need no live cluster (vmctl/whatif/fidelity.py): the sleeping
workload and the guest commands of the real-libvirt variant, the per-job start statistics against the
stated tolerance, and the row-switch gap read from the mock agents' logs."""

from __future__ import annotations

import datetime as dt
import os
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from vmctl.whatif.fidelity import (
    SLEEPING,
    SPECS,
    control_plane_cgroup,
    describe_divergence,
    divergence,
    guest_spec,
    row_switch_lag,
    spin_command,
    start_errors,
    tolerance,
    workload,
)


def test_the_sleeping_workload_is_the_same_jobs_with_sleeping_processes() -> None:
    plain, sleeping = workload(SPECS["measy"], 6, 1), workload(SPECS["measy"], 6, 1, sleeping=True)
    assert [(at, s["procs"], s["work_seconds"]) for at, s in plain] == \
        [(at, s["procs"], s["work_seconds"]) for at, s in sleeping]
    assert all(s["cpu_usage"] == [SLEEPING] * s["procs"] for _, s in sleeping)
    assert any(s["cpu_usage"] != [SLEEPING] * s["procs"] for _, s in plain)


def test_guest_commands_sleep_the_work_in_real_seconds() -> None:
    rigid = guest_spec({"name": "r", "procs": 2, "work_seconds": 610.0, "estimate": 900.0}, 10.0)
    assert rigid["tasks"] == [{"work_seconds": 610.0, "cpu_usage": SLEEPING, "command": "sleep 61.000"}] * 2
    bag = guest_spec({"name": "b", "shape": {"kind": "task-bag", "tasks": [100.0, 250.0], "max_workers": 2,
                                             "task_usage": 0.01}}, 25.0)
    assert [t["command"] for t in bag["tasks"]] == ["sleep 4.000", "sleep 10.000"]
    assert [t["work_seconds"] for t in bag["tasks"]] == [100.0, 250.0]


#: the shells the spin is run with: the guest's is busybox ``sh`` (when this machine has busybox), and any POSIX sh
SHELLS = [p for p in (shutil.which("busybox"), "/bin/sh") if p]


def _spin_cpu(shell: str, command: str, work: str, usage: str) -> float:
    """The CPU seconds (user + system) the command used, run as the SSH runner runs it: ``sh -c`` with
    vmctld's model of the process in its environment."""
    argv = [shell, "sh", "-c", command] if shell.endswith("busybox") else [shell, "-c", command]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env={**os.environ, "VMCTL_WORK_SECONDS": work, "VMCTL_CPU_USAGE": usage}, check=True,
                   timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


@pytest.mark.parametrize("shell", SHELLS)
def test_the_spin_consumes_work_times_usage_over_speed_of_its_own_cpu_time(shell: str) -> None:
    """Measured in CPU time, not wall: a cap or a paused row (or this machine's load) stretches its wall
    time, not the CPU it needs. 60 model s x 1.0 at 200x: 0.30 CPU s; x 0.4: 0.12; a moldable job's time at a
    wider width (15.05 model s here) its share."""
    cmd = spin_command(200.0)
    full = _spin_cpu(shell, cmd, "60.000", "1.000")
    part = _spin_cpu(shell, cmd, "60.000", "0.400")
    wide = _spin_cpu(shell, cmd, "15.05", "1")
    # the spin counts whole 1/100 s ticks of its own CPU time (the target truncated to one): one tick below
    assert 0.29 <= full <= 0.30 + 0.12
    assert 0.11 <= part <= 0.12 + 0.12
    assert 0.064 <= wide <= 0.0752 + 0.12
    assert part < full and wide < full
    # a fraction with a leading zero is decimal, not octal; an empty environment spins nothing
    assert _spin_cpu(shell, cmd, "0.09", "1.000") <= 0.12


def test_the_spin_families_submit_their_model_with_the_spin_as_command() -> None:
    """vcsched, gang and moldable guests spin (a cap, a paused row, a chosen width change a spin's run, not a
    sleep's); the command does not fix the work: the process reads the work vmctld gives it at its start
    (a moldable job's time at its width), so a moldable job keeps its shape and gets no per-process tasks."""
    assert {n for n, f in SPECS.items() if f.guest == "spin"} == {"vcsched", "gang", "gang-gs", "moldable"}
    # vcsched's shared VMs get forwarded SSH ports from the layout's second range on a real host
    assert all(f.no_libvirt is None for n, f in SPECS.items() if n in ("vcsched", "gang-gs", "moldable"))
    mold = {"name": "m", "shape": {"kind": "moldable", "widths": [1, 2, 4], "times": [900.0, 500.0, 300.0]}}
    out = guest_spec(mold, 10.0, "spin")
    assert out["shape"] == mold["shape"] and "tasks" not in out
    assert out["command"] == spin_command(10.0) and "VMCTL_WORK_SECONDS" in out["command"]
    vc = {"name": "v", "procs": 2, "work_seconds": 400.0, "estimate": 800.0, "cpu_need": 0.3, "mem": 0.1}
    assert guest_spec(vc, 10.0, "spin") == {**vc, "command": spin_command(10.0)}
    # the workload keeps the model's usages for a spinning family, even when asked for sleeping processes
    assert workload(SPECS["vcsched"], 4, 1, sleeping=True) == workload(SPECS["vcsched"], 4, 1)


def test_the_control_plane_gets_the_share_of_libvirts_machine_partition(tmp_path: Path) -> None:
    """A spinning guest run puts vmctld, the agents and the submitter in a cgroup with the ``machine``
    partition's cpu.shares (a fake v1 hierarchy here); without a ``machine`` cgroup nothing is made."""
    logs: list[str] = []
    assert control_plane_cgroup([11, 12], logs.append, root=tmp_path) is None and not logs
    (tmp_path / "machine").mkdir()
    (tmp_path / "machine" / "cpu.shares").write_text("262144\n")
    d = control_plane_cgroup([11, 12], logs.append, root=tmp_path)
    assert d is not None and d.parent == tmp_path and d.name.startswith("vmctl-whatif-")
    assert (d / "cpu.shares").read_text() == "262144"
    assert (d / "cgroup.procs").read_text() == "12"  # each pid written in turn (a real cgroup.procs appends)
    assert "cpu.shares 262144" in logs[0]


def test_start_errors_in_seconds_and_loop_periods_against_the_tolerance() -> None:
    per_job = [{"job": str(k), "start_simulated": float(k) + d, "start_actual": float(k)}
               for k, d in enumerate([0.0, 1.0, -2.0, 3.0, 100.0])]
    s = start_errors({"per_job": per_job}, 5.0)
    assert s["jobs"] == 5 and s["p50"] == pytest.approx(2.0) and s["max"] == pytest.approx(100.0)
    assert s["p50_loops"] == pytest.approx(0.4) and s["mean"] == pytest.approx(20.4)
    assert start_errors({"per_job": per_job}, 5.0, ["1", "2"])["max"] == pytest.approx(2.0)
    assert start_errors({"per_job": per_job}, 5.0, [])["jobs"] == 0
    assert tolerance("measy", 5.0) == {"p50": 10.0, "p90": 60.0}
    assert tolerance("measy", 10.0) == {"p50": 20.0, "p90": 120.0}


def _per_job(rows: dict[str, tuple[float, list[float], list[float]]]) -> tuple[dict[str, object], dict[str, float]]:
    per = [{"job": k, "start_simulated": sim[0], "start_actual": live[0], "response_simulated": sim[1] - sub,
            "response_actual": live[1] - sub} for k, (sub, live, sim) in rows.items()]
    return {"per_job": per}, {k: sub for k, (sub, _l, _s) in rows.items()}


def test_the_first_divergent_decision_is_named() -> None:
    # control loop 5 s. Job 1 ends 5 s earlier in the replay; job 2 follows job 1's end in both runs (a loop
    # delay later live: the same decision). Job 4 starts at its arrival in both and ends at 180. Job 3:
    # live after job 2's end (200), in the replay after job 4's end (180), 20.5 s earlier: the replay's
    # job 2 ended at 190, after job 4 -- the first divergent decision; jobs 1, 2, 4 come before it.
    err, subs = _per_job({"1": (0.0, [0.0, 100.0], [0.0, 95.0]), "2": (10.0, [103.0, 200.0], [95.0, 190.0]),
                          "4": (150.0, [150.0, 180.0], [150.0, 180.0]), "3": (20.0, [200.5, 400.0], [180.0, 380.0])})
    d = divergence(err, subs, 5.0)
    assert d["jobs"] == 4 and d["jobs_before"] == 3 and d["divergent"] == 1
    f = d["first"]
    assert f["job"] == "3" and f["live_after"] == ["end", "2"] and f["replay_after"] == ["end", "4"]
    assert f["live_event_times"] == [200.0, 190.0] and f["difference"] == pytest.approx(-20.5)
    assert d["start_error_before"]["max"] == pytest.approx(8.0)
    text = describe_divergence(d)
    assert "decisions diverge at job 3 (3 of 4 jobs before it" in text
    assert "after job 2's end (live 200.0 s, replay 190.0 s)" in text and "after job 4's end" in text
    # the same history without job 4's early end: no divergent decision
    err, subs = _per_job({"1": (0.0, [0.0, 100.0], [0.0, 95.0]), "2": (10.0, [103.0, 200.0], [95.0, 190.0])})
    d = divergence(err, subs, 5.0)
    assert d["first"] is None and d["largest_same_decision"]["job"] == "2"
    assert describe_divergence(d) == ("no divergent decision: every start follows the same event in both runs; the "
                                      "largest start difference among them, job 2 (-8.0 s), follows job 1's end, "
                                      "which the replay has -5.0 s from live")


def test_the_row_switch_gap_from_the_agents_logs(tmp_path: Path) -> None:
    """Slices of 100 model s on a 25x clock: boundaries every 4 s real. The agents turn the leaving row's
    job VM down 0.5 model s after each boundary and resume the arriving row's 2.5 s after it: a gap of 2 s."""
    epoch, speed, period = 1_795_000_000.0, 25.0, 100.0

    def line(model: float, what: str) -> str:
        wall = epoch + (model - epoch) / speed
        stamp = dt.datetime.fromtimestamp(wall).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]  # local time, as logged
        return f"{stamp} INFO vmctl.agent: apply {what}\n"

    text = "".join(line(epoch + k * period + 0.5, "Tune(vm='j1-r1-p0', weight=1, cap=None, kind='tune')")
                   + line(epoch + k * period + 2.5, "Resume(vm='j2-r1-p0', kind='resume')")
                   + line(epoch + k * period + 40.0, "Resume(vm='host00-c0-r1', kind='resume')")  # not a job VM
                   for k in range(1, 9))
    (tmp_path / "agent-host00.log").write_text(text, encoding="utf-8")
    assert row_switch_lag(tmp_path, epoch, speed, period) == pytest.approx(2.0, abs=0.05)
    (tmp_path / "agent-host00.log").write_text("nothing here\n", encoding="utf-8")
    assert row_switch_lag(tmp_path, epoch, speed, period) is None
