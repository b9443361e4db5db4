"""The systemd units: ``systemd-analyze verify`` (no warnings), ``systemd-analyze security --offline``
(exposure at most what docs/operations.md records), the directives the design needs, and sd_notify on a
real datagram socket.

The units reference ``/usr/local/bin/vmctld`` and ``/usr/local/bin/vmctl-agent`` (symlinks to the
virtualenv's console scripts, see docs/operations.md); the test substitutes the virtualenv's bin
directory so that ``verify`` finds executables on any machine."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vmctl.sdnotify import Notifier

ROOT = Path(__file__).resolve().parents[2]
UNITS = ("vmctld.service", "vmctl-agent.service")
#: Exposure scores recorded in docs/operations.md; a change that weakens hardening fails here.
MAX_EXPOSURE = {"vmctld.service": 1.2, "vmctl-agent.service": 1.5}


def _analyze() -> str:
    exe = shutil.which("systemd-analyze")
    if exe is None:
        pytest.skip("systemd-analyze not installed (Debian package 'systemd')")
    return exe


def _installed_copy(tmp_path: Path, unit: str) -> Path:
    bindir = Path(sys.executable).parent
    text = (ROOT / "systemd" / unit).read_text()
    assert "/usr/local/bin/" in text
    for script in ("vmctld", "vmctl-agent"):
        if not (bindir / script).exists():
            pytest.skip(f"console script {script} not installed in {bindir} (run scripts/setup.sh)")
    out = tmp_path / unit
    out.write_text(text.replace("/usr/local/bin/", f"{bindir}/"))
    return out


def _directives(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (ROOT / "systemd" / unit).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key, []).append(value)
    return out


@pytest.mark.parametrize("unit", UNITS)
def test_verify_clean(tmp_path: Path, unit: str) -> None:
    exe = _analyze()
    path = _installed_copy(tmp_path, unit)
    r = subprocess.run([exe, "verify", "--man=no", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.strip() == "", f"systemd-analyze verify warned:\n{r.stderr}"


def test_the_control_plane_slice_verifies_and_outweighs_the_guests(tmp_path: Path) -> None:
    """vmctld and the agent run in vmctl.slice, whose CPU weight is above machine.slice's default (100),
    where libvirt puts the guests: spinning guests cannot starve the control plane."""
    exe = _analyze()
    for unit in UNITS:
        assert _directives(unit).get("Slice") == ["vmctl.slice"], unit
        _installed_copy(tmp_path, unit)
    slice_ = tmp_path / "vmctl.slice"
    slice_.write_text((ROOT / "systemd" / "vmctl.slice").read_text())
    r = subprocess.run([exe, "verify", "--man=no", str(slice_), *(str(tmp_path / u) for u in UNITS)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr.strip() == "", r.stdout + r.stderr
    weight = _directives("vmctl.slice").get("CPUWeight")
    assert weight is not None and int(weight[0]) > 100


def test_verify_catches_a_missing_binary(tmp_path: Path) -> None:
    exe = _analyze()
    text = (ROOT / "systemd" / "vmctld.service").read_text().replace("/usr/local/bin/", "/nonexistent/")
    (tmp_path / "vmctld.service").write_text(text)
    r = subprocess.run([exe, "verify", "--man=no", str(tmp_path / "vmctld.service")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "not executable" in r.stderr


@pytest.mark.parametrize("unit", UNITS)
def test_security_exposure(tmp_path: Path, unit: str) -> None:
    exe = _analyze()
    path = _installed_copy(tmp_path, unit)
    r = subprocess.run([exe, "security", "--offline=yes", "--no-pager", str(path)],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert m, r.stdout[-2000:] + r.stderr
    assert float(m.group(1)) <= MAX_EXPOSURE[unit], f"{unit} exposure {m.group(1)} > {MAX_EXPOSURE[unit]}"
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert f"`{unit}` | {MAX_EXPOSURE[unit]}" in doc, "record the exposure score in docs/operations.md"


def test_design_directives() -> None:
    for unit in UNITS:
        d = _directives(unit)
        assert d["Type"] == ["notify"], unit
        assert d["Restart"] == ["on-failure"], unit
        assert d.get("WatchdogSec"), unit
        assert d.get("NoNewPrivileges") == ["yes"], unit
        assert d.get("ProtectSystem") == ["strict"], unit
    agent = _directives("vmctl-agent.service")
    assert agent["KillMode"] == ["process"]
    assert "libvirt" in agent["SupplementaryGroups"]
    assert "KillMode" not in _directives("vmctld.service")


def test_sd_notify_over_a_real_socket(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(str(path))
    srv.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "30000000"})
        assert n.enabled and n.watchdog_interval() == 15.0
        assert n.ready("serving")
        assert srv.recv(4096) == b"READY=1\nSTATUS=serving"
        assert n.watchdog()
        assert srv.recv(4096) == b"WATCHDOG=1"
        assert n.stopping()
        assert srv.recv(4096) == b"STOPPING=1"
        n.close()
    finally:
        srv.close()


def test_sd_notify_abstract_socket_and_noop() -> None:
    name = f"vmctl-test-{id(object())}"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(b"\0" + name.encode())
    srv.settimeout(5)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.watchdog() and srv.recv(64) == b"WATCHDOG=1"
        n.close()
    finally:
        srv.close()
    off = Notifier({})
    assert not off.enabled and not off.ready() and off.watchdog_interval() is None
    # WATCHDOG_PID for another process: the watchdog is not ours
    assert Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}).watchdog_interval() is None
    # a socket that vanished: no exception, just False
    assert not Notifier({"NOTIFY_SOCKET": "/nonexistent/notify.sock"}).ready()


def test_watchdog_thread_pings_only_while_healthy(tmp_path: Path) -> None:
    path = tmp_path / "wd.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(str(path))
    srv.settimeout(30)
    healthy = {"ok": True}
    unhealthy_checks = [0]

    def check() -> bool:
        if not healthy["ok"]:
            unhealthy_checks[0] += 1
        return healthy["ok"]

    def wait_checks(n: int) -> None:  # until the watchdog thread has asked n times since the loop hung
        deadline = time.monotonic() + 30
        while unhealthy_checks[0] < n:
            assert time.monotonic() < deadline, "the watchdog thread stopped checking"
            time.sleep(0.01)

    n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "100000"})  # ping every 50 ms
    try:
        assert n.start_watchdog(check) is not None
        assert srv.recv(64) == b"WATCHDOG=1"
        healthy["ok"] = False
        # once the thread asked again, the ping of its previous (healthy) round has been sent: drain those
        wait_checks(1)
        srv.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                srv.recv(64)
        seen = unhealthy_checks[0]
        wait_checks(seen + 3)
        with pytest.raises(BlockingIOError):
            srv.recv(64)  # a hung loop: three more rounds, no more pings
    finally:
        n.close()
        srv.close()
    assert Notifier({}).start_watchdog(lambda: True) is None


def _notifications(sock: socket.socket, want: set[bytes], timeout: float) -> list[bytes]:
    """Datagrams received until every line in ``want`` was seen or ``timeout`` passed."""
    got: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not want <= {line for msg in got for line in msg.split(b"\n")}:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        with contextlib.suppress(TimeoutError):
            got.append(sock.recv(4096))
    return got


@pytest.mark.slow
def test_services_notify_ready_and_watchdog(tmp_path: Path) -> None:
    """vmctld and vmctl-agent, started as systemd would start them (NOTIFY_SOCKET, WATCHDOG_USEC):
    READY=1 after start-up, then WATCHDOG=1 pings."""
    import os

    import yaml

    from vmctl.files import write_cert_files
    from vmctl.localcluster import DaemonProcess, ManagedProcess, agent_config, free_port

    def notify_env(name: str) -> tuple[socket.socket, dict[str, str]]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(str(tmp_path / f"{name}.sock"))
        return s, {**os.environ, "NOTIFY_SOCKET": str(tmp_path / f"{name}.sock"), "WATCHDOG_USEC": "2000000"}

    dsock, denv = notify_env("vmctld")
    asock, aenv = notify_env("agent")
    daemon = DaemonProcess(tmp_path / "state", policy="easy", env=denv)
    agent: ManagedProcess | None = None
    try:
        daemon.start_and_wait(timeout=60)
        got = _notifications(dsock, {b"READY=1"}, 30)
        assert any(b"READY=1" in m for m in got), got
        client = daemon.client()
        crt, key, ca = write_cert_files(tmp_path / "pki", "n1", client.issue_cert("n1"))
        cfg = agent_config("n1", daemon.url, {"cert": str(crt), "key": str(key), "ca": str(ca)}, backend="mock",
                           cores=2, libvirt_uri="", metrics_port=free_port())
        (tmp_path / "agent.yaml").write_text(yaml.safe_dump(cfg))
        agent = ManagedProcess("vmctl-agent", [sys.executable, "-m", "vmctl.agents.main", "--config",
                                               str(tmp_path / "agent.yaml")], tmp_path / "agent.log", env=aenv)
        agent.start()
        got = _notifications(asock, {b"READY=1", b"WATCHDOG=1"}, 60)
        lines = {line for m in got for line in m.split(b"\n")}
        assert b"READY=1" in lines, f"agent sent {got}{agent.tail()}"
        assert b"WATCHDOG=1" in lines, f"agent sent {got}"
        got = _notifications(dsock, {b"WATCHDOG=1"}, 30)
        assert any(b"WATCHDOG=1" in m for m in got), f"vmctld sent {got}{daemon.tail()}"
    finally:
        if agent is not None:
            agent.stop()
        daemon.stop()
        dsock.close()
        asock.close()
