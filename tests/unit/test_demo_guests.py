"""The libvirt demo's pieces that need no libvirtd (``vmctl.cli.demo.guests``): the job command that runs
only in a guest of its own job, the agents' configs (SSH runner, ports that do not overlap, real cores, no
peers), the workload's commands, the per-backend defaults and the clear refusals."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from vmctl.agents.config import parse_agent_config
from vmctl.cli.demo import guests
from vmctl.cli.demo.command import DEFAULTS, Demo, DemoOptions, demo
from vmctl.cli.demo.workload import build_demo_workload
from vmctl.errors import DemoError
from vmctl.localcluster import agent_config


def _run(cmd: str, hostname: str, job: str) -> subprocess.CompletedProcess[str]:
    """The command as the guest's shell runs it (``hostname`` faked by a function of that name)."""
    script = f"hostname() {{ echo {hostname}; }}; VMCTL_JOB_ID={job}; VMCTL_PROCESS_INDEX=1; {cmd}"
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10, check=False)


def test_the_job_command_runs_only_in_a_guest_of_its_own_job() -> None:
    cmd = guests.guest_command(0.05)
    ok = _run(cmd, "j12-r2-p1", "12")
    assert ok.returncode == 0 and ok.stdout.strip() == "job 12 process 1 ran in j12-r2-p1"
    for host in ("j1-r1-p0", "j123-r1-p0", "node1-c0-fg", "buildhost"):  # another job's guest, or no guest
        bad = _run(cmd, host, "12")
        assert bad.returncode == 7 and "not in a guest of job 12" in bad.stdout, (host, bad)
    assert "sleep 2.500;" in guests.guest_command(2.5)


def test_the_workload_gives_each_task_its_command_only_when_asked() -> None:
    plain, _ = build_demo_workload(4, 2, 100, 60, 2, compress=True)
    assert all("command" not in t for j in plain for t in j.spec["tasks"])
    real, _ = build_demo_workload(4, 2, 100, 60, 2, compress=True, command=guests.guest_command)
    for a, b in zip(plain, real, strict=True):
        for ta, tb in zip(a.spec["tasks"], b.spec["tasks"], strict=True):
            assert tb["command"] == guests.guest_command(ta["work_seconds"])  # sleeps the task's (real) run time


def test_agents_on_one_libvirtd_get_disjoint_ports_real_cores_the_ssh_runner_and_no_peers(tmp_path: Path) -> None:
    (tmp_path / "host_key.pub").write_text("ssh-ed25519 AAAAC3Nza\n")
    for f in ("id_ed25519", "vmlinuz", "initrd.gz"):
        (tmp_path / f).write_text("x")
    bases = guests.ssh_port_blocks(3, 2)
    assert [b - bases[0] for b in bases] == [0, 4, 8]  # 2 levels x 2 cores each, back to back
    assert [guests.host_cores(i, 1, 2) for i in range(3)] == [[0], [1], [0]]
    assert guests.host_cores(1, 2, 4) == [2, 3]
    with pytest.raises(DemoError, match="--cores: 3 cores per node, but this machine has 2"):
        guests.host_cores(0, 3, 2)
    ports: set[int] = set()
    for i, node in enumerate(("node1", "node2", "node3")):
        base = agent_config(node, "https://127.0.0.1:1", {"cert": "c", "key": "k", "ca": "a"}, backend="libvirt",
                            cores=2, libvirt_uri="qemu:///system", metrics_port=9000 + i,
                            peers=["node1", "node2", "node3"])
        assert base["peers"]  # what the mock demo's agents get
        raw = guests.libvirt_agent_config(base, tmp_path, tmp_path / f"kh-{node}", bases[i], guests.host_cores(i, 2, 4))
        assert "peers" not in raw
        cfg = parse_agent_config(raw, f"agent-{node}.yaml")
        assert cfg.ssh.enabled and cfg.backend.domain_type == "qemu" and cfg.layout.kernel == str(tmp_path / "vmlinuz")
        assert cfg.layout.cores == ((0, 1), (2, 3), (0, 1))[i] and cfg.layout.levels == 2
        mine = {cfg.layout.ssh_ports + k for k in range(4)}
        assert not mine & ports
        ports |= mine
        known = (tmp_path / f"kh-{node}").read_text().splitlines()
        assert [line.split()[0] for line in known] == [f"[127.0.0.1]:{p}" for p in sorted(mine)]


def test_demo_vms_are_told_apart_by_metadata_and_name() -> None:
    nodes = {"node1", "node2"}
    assert guests._demo_vm("j3-r1-p0", {}, nodes)
    assert guests._demo_vm("node2-c0-bg", {}, nodes)
    assert guests._demo_vm("anything", {"vmctl.node": "node1"}, nodes)
    assert not guests._demo_vm("node10-c0-bg", {"vmctl.node": "node10"}, nodes)
    assert not guests._demo_vm("it123-vm", {"vmctl.node": "it123-lv"}, nodes)


def test_libvirt_refusals_name_the_option(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = Demo(DemoOptions(backend="libvirt", migrate=True, state_dir=str(tmp_path)), echo=lambda *_: None)
    with pytest.raises(DemoError, match="--migrate: needs the mock backend"):
        d.prepare_libvirt()
    monkeypatch.setattr(guests, "SYSTEM_SOCKET", tmp_path / "no-such-socket")
    with pytest.raises(DemoError, match=r"libvirtd is not running .*scripts/demo\.sh --backend libvirt"):
        guests.check_libvirtd("qemu:///system")
    guests.check_libvirtd("qemu+unix:///system?socket=/elsewhere")  # another libvirtd: not ours to check


def test_each_backend_has_its_own_default_shape(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[DemoOptions] = []

    class Stop(Exception):
        pass

    def fake_run(self: Demo) -> None:
        seen.append(self.o)
        raise Stop

    monkeypatch.setattr(Demo, "run", fake_run)
    for args in (["--backend", "libvirt"], [], ["--backend", "libvirt", "--nodes", "1", "--speed", "10"]):
        CliRunner().invoke(demo, [*args, "--state-dir", str(tmp_path)])
    lv, mock, given = seen
    shape = (lv.nodes, lv.cores, lv.jobs, lv.duration, lv.speed)
    assert shape == tuple(DEFAULTS["libvirt"].values()) == (2, 1, 6, 60.0, 100.0)
    assert (mock.nodes, mock.cores, mock.jobs, mock.duration, mock.speed) == (3, 4, 40, 120.0, 1000.0)
    assert (given.nodes, given.speed, given.cores) == (1, 10.0, 1)
