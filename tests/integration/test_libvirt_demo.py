"""``vmctl demo --backend libvirt`` end to end on the real system libvirtd (issue 22): vmctld and two
agents as processes, both on the one local libvirtd, each job process run over SSH in its own TCG guest
(the SSH guest of ``vmctl/guestimage.py``, built or reused from ``/var/cache/vmctl/guest``).

- A short run (3 jobs) ends with every job ``done``, which takes a process that exited 0 in a guest of
  its own job (the demo's command exits 7 anywhere else), and leaves no domain of the demo's nodes, no
  job VM and no process behind.
- Interrupted (SIGINT, as Ctrl-C) while a job runs in a guest, or failing (an agent killed), the demo
  still removes every domain it made and stops every process it started.

Skipped with the reason when libvirtd/QEMU cannot run here or the guest cannot be built."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from vmctl.cli.demo import guests

pytestmark = pytest.mark.libvirt

URI = "qemu:///system"


@pytest.fixture(scope="module")
def guest(system_host: Any) -> Path:
    from vmctl.errors import VmctlError
    from vmctl.guestimage import build

    try:
        build(guests.GUEST_DIR, log=None)
    except VmctlError as exc:
        pytest.skip(f"the SSH guest cannot be built here: {exc}")
    return guests.GUEST_DIR


@pytest.fixture()
def clean_libvirt(system_host: Any) -> Any:
    """The demo refuses a libvirtd that holds VMs with its names; after the test, whatever it left is
    removed (so one failure does not fail the next test) and the test has already asserted there was none."""
    nodes = {"node1", "node2"}
    if guests.leftovers(URI, nodes):
        pytest.skip(f"libvirtd holds VMs with the demo's names already: {guests.leftovers(URI, nodes)}")
    yield nodes
    guests.remove_demo_vms(URI, nodes)


def _dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


def _demo_argv(state: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "vmctl.cli.main", "demo", "--backend", "libvirt", "--libvirt-uri", URI,
            "--no-live", "--state-dir", str(state), *args]


def _pids(out: str) -> list[int]:
    m = re.search(r"vmctld \S+ \(pid (\d+)\); \d+ agents \(pids ([\d, ]+)\)", out)
    assert m, out
    return [int(m.group(1)), *(int(p) for p in m.group(2).split(","))]


def test_a_short_libvirt_demo_runs_its_jobs_in_guests_and_leaves_nothing(guest: Path, clean_libvirt: set[str],
                                                                          tmp_path: Path) -> None:
    state = tmp_path / "state"
    t0 = time.monotonic()
    proc = subprocess.run(_demo_argv(state, "--jobs", "3", "--duration", "20", "--seed", "3"),
                          capture_output=True, text=True, timeout=600, check=False)
    took = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    m = re.search(r"jobs by state: (.*)", out)
    assert m and m.group(1) == "done 3", out
    assert "domains left: 0" in out, out
    assert re.search(r"libvirt: removed [1-9]\d* domains of the demo's nodes", out), out
    assert guests.leftovers(URI, clean_libvirt) == []
    for pid in _pids(out):
        assert _dead(pid), pid
    # the jobs ran over SSH in guests of this run: the agents logged in, and every process started
    logs = "".join((state / f"agent-{n}.log").read_text() for n in sorted(clean_libvirt))
    assert "Authentication (publickey) successful" in logs
    assert "no process runner" not in logs and "has no command" not in logs
    started = set(re.findall(r"StartProcess\(vm='(j\d+-r\d+-p\d+)'", logs))
    assert {name.split("-")[0] for name in started} == {"j1", "j2", "j3"}, started
    print(f"\nlibvirt demo, 3 jobs on 2 nodes: {took:.0f} s wall, done 3, domains left 0")


def _interrupt_mid_run(state: Path, nodes: set[str], interrupt: Any) -> tuple[str, int | None, list[str]]:
    """Start a demo of long jobs (20 s each in the guest), call ``interrupt(demo_pid, agent_pids)`` once a
    job VM of it runs, and return its output, exit code and the job VMs that were running."""
    import threading

    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    # Ctrl-C as a terminal sends it: the demo must not inherit an ignored SIGINT (a suite started in the
    # background of a non-interactive shell ignores it, and so would the demo: the SIGINT was lost)
    proc = subprocess.Popen(_demo_argv(state, "--jobs", "2", "--duration", "60", "--speed", "1", "--seed", "3"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True)
    reader.start()
    b = LibvirtBackend(URI, domain_type="qemu")
    running: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while not running:
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "no job VM of the demo ran within 300 s"
            running = [v.name for v in b.list_vms() if guests.JOB_VM.match(v.name)
                       and v.metadata.get("vmctl.node") in nodes and v.power.value == "running"]
            time.sleep(0.5)
        interrupt(proc.pid, _pids("".join(lines))[1:])
        proc.wait(timeout=240)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        if proc.stdout is not None:
            proc.stdout.close()
        b.close()
    return "".join(lines), proc.returncode, running


def test_ctrl_c_mid_run_leaves_no_domain_and_no_process(guest: Path, clean_libvirt: set[str],
                                                       tmp_path: Path) -> None:
    """SIGINT while a job's guest runs: the demo stops its agents and vmctld and removes every domain."""
    out, rc, running = _interrupt_mid_run(tmp_path / "state", clean_libvirt,
                                          lambda pid, agents: os.kill(pid, signal.SIGINT))
    assert rc != 0, out  # interrupted
    assert "domains left: 0" in out, out
    assert guests.leftovers(URI, clean_libvirt) == [], out
    for pid in _pids(out):
        assert _dead(pid), pid
    print(f"\ninterrupted with {running} running: domains left 0")


def test_a_failed_demo_leaves_no_domain(guest: Path, clean_libvirt: set[str], tmp_path: Path) -> None:
    """An agent dies (kill -9) while a job's guest runs: the demo fails, naming it, and still removes
    every domain of its nodes, the dead agent's included."""
    out, rc, _ = _interrupt_mid_run(tmp_path / "state", clean_libvirt,
                                    lambda pid, agents: os.kill(agents[0], signal.SIGKILL))
    assert rc != 0 and "vmctl-agent node1: died" in out, out
    assert "domains left: 0" in out, out
    assert guests.leftovers(URI, clean_libvirt) == [], out
    for pid in _pids(out):
        assert _dead(pid), pid
