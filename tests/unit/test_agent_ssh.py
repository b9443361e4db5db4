"""ParamikoRunner and SFTP checkpoint transfer against a REAL sshd on loopback.

The fixture starts ``/usr/sbin/sshd -D -f <tmp config> -p <free port>`` (as root) with a generated
host key and an authorized client key, and stops it by pid. Skips with a reason when sshd or
ssh-keygen is missing or we are not root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import stop_process
from vmctl.agents.remote import TIMEOUT_EXIT, ParamikoRunner, SshSettings
from vmctl.errors import ConfigError, RemoteExecError, RemoteHostKeyError
from vmctl.nodedoc import ProcessSpec

pytestmark = pytest.mark.ssh

SSHD = "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    key_file: str
    known_hosts: str
    host_pub: str
    tmp: Path

    def settings(self, **kw: float) -> SshSettings:
        # the "guest" is this host: its job state under the fixture's folder, not the default /tmp/vmctl-jobs
        return SshSettings(user="root", key_file=self.key_file, known_hosts=self.known_hosts, port=self.port,
                           connect_timeout=kw.get("connect_timeout", 5.0),
                           command_timeout=kw.get("command_timeout", 30.0), state_dir=str(self.tmp / "jobs"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not os.path.exists(SSHD):
        pytest.skip(f"{SSHD} is not installed (apt-get install openssh-server)")
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    if os.geteuid() != 0:
        pytest.skip("sshd on loopback needs root here")
    tmp = tmp_path_factory.mktemp("sshd")
    _keygen(tmp / "host_key")
    _keygen(tmp / "client_key")
    (tmp / "authorized_keys").write_text((tmp / "client_key.pub").read_text())
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
    port = _free_port()
    cfg = tmp / "sshd_config"
    cfg.write_text(
        f"ListenAddress 127.0.0.1\nHostKey {tmp / 'host_key'}\nAuthorizedKeysFile {tmp / 'authorized_keys'}\n"
        f"PidFile {tmp / 'sshd.pid'}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\n"
        "LogLevel ERROR\n")
    log = open(tmp / "sshd.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg), "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=log)
    try:
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                pytest.skip(f"sshd exited: {(tmp / 'sshd.log').read_text()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.skip("sshd did not start listening within 10 s")
                time.sleep(0.05)
        host_pub = " ".join((tmp / "host_key.pub").read_text().split()[:2])
        kh = tmp / "known_hosts"
        kh.write_text(f"[127.0.0.1]:{port} {host_pub}\n")
        yield Sshd(port=port, key_file=str(tmp / "client_key"), known_hosts=str(kh), host_pub=host_pub, tmp=tmp)
    finally:
        stop_process(proc, timeout=5)
        log.close()


def test_run_returns_exit_status_output_tail_and_env(sshd: Sshd) -> None:
    r = ParamikoRunner(sshd.settings())
    res = r.run("127.0.0.1", 'echo "hello $GREETING"; echo oops >&2; exit 3', env={"GREETING": "wor ld"})
    assert res.exit_code == 3
    assert not res.timed_out
    assert "hello wor ld" in res.output_tail and "oops" in res.output_tail
    assert "__vmctl_pid" not in res.output_tail


def test_output_tail_is_bounded(sshd: Sshd) -> None:
    r = ParamikoRunner(SshSettings(user="root", key_file=sshd.key_file, known_hosts=sshd.known_hosts,
                                   port=sshd.port, tail_bytes=100))
    res = r.run("127.0.0.1", "seq 1 5000")
    assert res.exit_code == 0
    assert len(res.output_tail) <= 100
    assert res.output_tail.rstrip().endswith("5000")


def _gated(tmp_path: Path, then: str) -> tuple[Path, str]:
    """A shell command that waits until the test creates the gate file, then runs ``then``: no test
    depends on how fast SSH connects on a loaded machine."""
    gate = tmp_path / "gate"
    return gate, f"while [ ! -e {gate} ]; do sleep 0.05; done; {then}"


def test_run_timeout_kills_the_remote_process(sshd: Sshd, tmp_path: Path) -> None:
    marker = tmp_path / "survived"
    gate, command = _gated(tmp_path, f"touch {marker}")
    r = ParamikoRunner(sshd.settings())
    res = r.run("127.0.0.1", command, timeout=0.3)  # would never end on its own
    assert res.timed_out and res.exit_code == TIMEOUT_EXIT
    gate.touch()
    time.sleep(0.5)
    assert not marker.exists(), "the timed-out command kept running"


def test_host_key_mismatch_is_rejected(sshd: Sshd, tmp_path: Path) -> None:
    _keygen(tmp_path / "other")
    other = " ".join((tmp_path / "other.pub").read_text().split()[:2])
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {other}\n")
    r = ParamikoRunner(SshSettings(user="root", key_file=sshd.key_file, known_hosts=str(kh), port=sshd.port))
    with pytest.raises(RemoteHostKeyError, match="host key mismatch") as ei:
        r.run("127.0.0.1", "true")
    assert not ei.value.retryable


def test_unknown_host_key_is_rejected(sshd: Sshd, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    r = ParamikoRunner(SshSettings(user="root", key_file=sshd.key_file, known_hosts=str(kh), port=sshd.port))
    with pytest.raises(RemoteHostKeyError, match="unknown host key"):
        r.run("127.0.0.1", "true")


def test_wrong_client_key_fails_authentication(sshd: Sshd, tmp_path: Path) -> None:
    _keygen(tmp_path / "stranger")
    r = ParamikoRunner(SshSettings(user="root", key_file=str(tmp_path / "stranger"), known_hosts=sshd.known_hosts,
                                   port=sshd.port))
    with pytest.raises(RemoteExecError, match="authentication"):
        r.run("127.0.0.1", "true")


def test_connect_timeout_on_a_silent_server(sshd: Sshd) -> None:
    """A server that accepts but never speaks SSH: the banner timeout ends the attempt."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    conns: list[socket.socket] = []

    def accept() -> None:
        try:
            c, _ = srv.accept()
            conns.append(c)
        except OSError:
            pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    r = ParamikoRunner(SshSettings(user="root", key_file=sshd.key_file, known_hosts=sshd.known_hosts, port=port,
                                   connect_timeout=0.5))
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteExecError) as ei:
            r.run("127.0.0.1", "true")
        assert ei.value.retryable
        assert time.monotonic() - t0 < 4
    finally:
        srv.close()
        for c in conns:
            c.close()


def test_connection_refused_is_a_retryable_error(sshd: Sshd) -> None:
    r = ParamikoRunner(SshSettings(user="root", key_file=sshd.key_file, known_hosts=sshd.known_hosts,
                                   port=_free_port(), connect_timeout=1))
    with pytest.raises(RemoteExecError, match="cannot connect") as ei:
        r.run("127.0.0.1", "true")
    assert ei.value.retryable


def test_missing_key_file_is_a_config_error(sshd: Sshd, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="key_file"):
        ParamikoRunner(SshSettings(user="root", key_file=str(tmp_path / "nope"), known_hosts=sshd.known_hosts))


def test_process_runner_start_status_and_exit(sshd: Sshd) -> None:
    r = ParamikoRunner(sshd.settings(), address_of=lambda vm: "127.0.0.1")
    spec = ProcessSpec(job_id="j7", index=2, command='echo "$VMCTL_JOB_ID/$VMCTL_PROCESS_INDEX"; exit 5')
    r.start("vm-a", spec)
    r.start("vm-a", spec)  # idempotent
    st = r.wait("vm-a", 10)
    assert st is not None and not st.running
    assert (st.job_id, st.index, st.exit_code) == ("j7", 2, 5)
    assert "j7/2" in st.output_tail


def test_process_runner_gives_the_process_its_work_and_usage(sshd: Sshd) -> None:
    """A CPU-bound job (vmctl.whatif.fidelity.spin_command) reads the work vmctld gave its process -- for a
    moldable job, its time at the width chosen at its start -- and its CPU usage from the environment."""
    r = ParamikoRunner(sshd.settings(), address_of=lambda vm: "127.0.0.1")
    spec = ProcessSpec(job_id="j8", index=1, command='echo "w=$VMCTL_WORK_SECONDS u=$VMCTL_CPU_USAGE"',
                       work_seconds=523.45, cpu_usage=0.25)
    r.start("vm-w", spec)
    st = r.wait("vm-w", 10)
    assert st is not None and st.exit_code == 0
    assert "w=523.450 u=0.250" in st.output_tail


def test_process_runner_kill_ends_the_process_group(sshd: Sshd, tmp_path: Path) -> None:
    marker = tmp_path / "after-kill"
    gate, command = _gated(tmp_path, f"touch {marker}")
    r = ParamikoRunner(sshd.settings(), address_of=lambda vm: "127.0.0.1")
    r.start("vm-b", ProcessSpec(job_id="j8", index=0, command=command))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        st = r.status("vm-b")
        assert st is not None and st.running
        if r._jobs["vm-b"].pid is not None:
            break
        time.sleep(0.02)
    r.kill("vm-b")
    assert r.status("vm-b") is None
    gate.touch()
    time.sleep(0.5)
    assert not marker.exists(), "the killed job's child kept running"


def test_sftp_transfer_checkpoint(sshd: Sshd, tmp_path: Path) -> None:
    src = tmp_path / "ckpt.img"
    payload = os.urandom(300_000)
    src.write_bytes(payload)
    dst = tmp_path / "remote" / "ckpt.img"
    dst.parent.mkdir()
    r = ParamikoRunner(sshd.settings())
    assert r.transfer_checkpoint(str(src), "127.0.0.1", str(dst)) == len(payload)
    assert dst.read_bytes() == payload
    assert not Path(f"{dst}.part").exists()


def test_sftp_transfer_to_a_missing_folder_fails_cleanly(sshd: Sshd, tmp_path: Path) -> None:
    src = tmp_path / "ckpt.img"
    src.write_bytes(b"x" * 10)
    r = ParamikoRunner(sshd.settings())
    with pytest.raises(RemoteExecError, match="sftp"):
        r.transfer_checkpoint(str(src), "127.0.0.1", str(tmp_path / "no" / "such" / "dir" / "ckpt.img"))
    with pytest.raises(RemoteExecError, match="cannot be read"):
        r.transfer_checkpoint(str(tmp_path / "missing.img"), "127.0.0.1", str(tmp_path / "x"))


def _wait_started(runner: ParamikoRunner, vm: str, bound: float = 120.0) -> None:
    """Until ``runner`` has the process's pid, which the guest's wrapper prints after it wrote the job
    trace a restarted runner adopts (a fixed sleep lost that race on a loaded machine)."""
    deadline = time.monotonic() + bound
    while True:
        st = runner.status(vm)
        if st is not None and st.started:
            return
        assert time.monotonic() < deadline, f"{vm}: the process never started ({st})"
        time.sleep(0.05)


def test_a_restarted_runner_adopts_a_running_job_and_sees_its_exit(sshd: Sshd, tmp_path: Path) -> None:
    def runner() -> ParamikoRunner:
        return ParamikoRunner(SshSettings(user="root", key_file=sshd.key_file, known_hosts=sshd.known_hosts,
                                          port=sshd.port, state_dir=str(tmp_path / "state")),
                              address_of=lambda vm: "127.0.0.1")

    gate, command = _gated(tmp_path, "exit 4")
    first = runner()
    first.start("vm-c", ProcessSpec(job_id="job 1", index=4, command=command))
    _wait_started(first, "vm-c")
    second = runner()  # the agent restarted: no memory of the job
    st = second.status("vm-c")
    assert st is not None and st.running and (st.job_id, st.index) == ("job 1", 4)
    second.start("vm-c", ProcessSpec(job_id="job 1", index=4, command=command))  # adopted: no-op
    gate.touch()
    st = second.wait("vm-c", 10)
    assert st is not None and st.exit_code == 4
    assert runner().status("vm-c").exit_code == 4  # type: ignore[union-attr]
    assert runner().status("vm-other") is None  # no trace: no process


def test_a_killed_adopted_job_reports_137(sshd: Sshd, tmp_path: Path) -> None:
    settings = SshSettings(user="root", key_file=sshd.key_file, known_hosts=sshd.known_hosts, port=sshd.port,
                           state_dir=str(tmp_path / "state"))
    first = ParamikoRunner(settings, address_of=lambda vm: "127.0.0.1")
    first.start("vm-d", ProcessSpec(job_id="j", index=0, command="sleep 30"))
    _wait_started(first, "vm-d")
    second = ParamikoRunner(settings, address_of=lambda vm: "127.0.0.1")
    assert second.status("vm-d").running  # type: ignore[union-attr]
    second.kill("vm-d")
    assert second.status("vm-d") is None
    third = ParamikoRunner(settings, address_of=lambda vm: "127.0.0.1")
    st = third.status("vm-d")
    assert st is not None and not st.running and st.exit_code == 137


def test_agent_config_sftp_transfer_to_a_peer_host(sshd: Sshd, tmp_path: Path) -> None:
    from vmctl.agents.config import parse_agent_config
    from vmctl.agents.main import make_transfer

    cfg = parse_agent_config({"node": "n1", "checkpoints": {"transfer": "sftp", "hosts": {"n2": "127.0.0.1"}},
                              "ssh": {"key_file": sshd.key_file, "known_hosts": sshd.known_hosts,
                                      "port": sshd.port}}, "agent.yaml")
    transfer = make_transfer(cfg)
    assert transfer is not None
    src = tmp_path / "a.ckpt"
    src.write_bytes(b"state" * 1000)
    dst = tmp_path / "peer" / "a.ckpt"
    dst.parent.mkdir()
    assert transfer(str(src), "n2", str(dst)) == 5000
    assert dst.read_bytes() == src.read_bytes()
    with pytest.raises(ConfigError, match=r"agent.yaml: checkpoints\.hosts\.n3: is missing"):
        transfer(str(src), "n3", str(dst))


def test_a_server_that_sends_no_banner_is_refused_in_one_line(sshd: Sshd) -> None:
    """A guest still booting behind QEMU's port forward accepts the connection and says nothing."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        r = ParamikoRunner(sshd.settings(connect_timeout=0.3))
        t = time.monotonic()
        with pytest.raises(RemoteExecError, match=r"no SSH banner within 0\.3 s \(the server is not up\)"):
            r.run(f"127.0.0.1:{silent.getsockname()[1]}", "true")
        assert time.monotonic() - t < 5
        assert r.run(f"[127.0.0.1]:{sshd.port}", "echo via-address-port").output_tail.strip() == "via-address-port"
        with pytest.raises(RemoteExecError, match="bad guest address"):
            r.run("127.0.0.1:notaport", "true")
    finally:
        silent.close()


def test_a_booted_vm_is_not_probed_and_its_job_waits_for_ssh(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    closed = _free_port()  # nothing listens: the guest's SSH server is not up
    ends: list[str] = []
    r = ParamikoRunner(sshd.settings(connect_timeout=0.5), address_of=lambda vm: f"127.0.0.1:{closed}",
                       on_end=lambda: ends.append("end"))
    with pytest.raises(RemoteExecError, match="cannot connect"):
        r.status("vm-x")  # an unknown VM's job trace must be read: an unreachable guest is an error
    r.booted("vm-b")
    assert r.status("vm-b") is None  # the agent just booted it: nothing of ours runs there
    real = r.connect
    tries: list[str] = []

    def booting(host: str) -> Any:  # the guest answers on the third try
        tries.append(host)
        if len(tries) < 3:
            return real(f"127.0.0.1:{closed}")
        return real(f"127.0.0.1:{sshd.port}")

    monkeypatch.setattr(r, "connect", booting)
    r.start("vm-b", ProcessSpec(job_id="j", index=0, command="echo ran; exit 4"))
    st = r.wait("vm-b", 20)
    assert st is not None and st.exit_code == 4 and "ran" in st.output_tail, st
    assert len(tries) == 3
    deadline = time.monotonic() + 5
    while not ends and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ends == ["end"]  # the agent is woken to report the end
    # without booted(): no retry, the job fails at once with the connection error
    tries.clear()
    monkeypatch.setattr(r, "connect", lambda host: real(f"127.0.0.1:{closed}"))
    r.start("vm-c", ProcessSpec(job_id="j", index=1, command="true"))
    st = r.wait("vm-c", 10)
    assert st is not None and st.exit_code == -1 and "cannot connect" in st.output_tail
