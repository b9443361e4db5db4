"""Real libvirt hosts for the integration tests: the system libvirtd (started if not running) and a
second, independent libvirtd in its own mount + UTS namespace that acts as a migration peer.

Everything started here is stopped here, by pid; a daemon that was already running is left alone.
Facts behind the recipe: ../shared/notes/libvirt-on-these-machines.md.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_SOCKET = Path("/run/libvirt/libvirt-sock")
BINARIES = ("libvirtd", "virtlogd", "qemu-system-x86_64", "unshare")


class Unavailable(Exception):
    """libvirt cannot be installed or started here (the tests skip with this message)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_from(path: Path) -> int | None:
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _socket_answers(path: Path) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(1.0)
    try:
        s.connect(str(path))
    except OSError:
        return False
    finally:
        s.close()
    return True


def _wait_for(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return
        time.sleep(0.1)
    raise Unavailable(f"{what} did not come up within {timeout:.0f} s")


def ensure_installed() -> None:
    """Install the Debian packages (scripts/install-system-deps.sh) if a binary is missing."""
    if all(shutil.which(b) or Path(f"/usr/sbin/{b}").exists() for b in BINARIES):
        return
    if os.geteuid() != 0:
        raise Unavailable("libvirtd/QEMU are not installed and installing them needs root")
    try:
        subprocess.run(["bash", str(ROOT / "scripts" / "install-system-deps.sh")], check=True,
                       capture_output=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        raise Unavailable(f"cannot install libvirt/QEMU with scripts/install-system-deps.sh: {exc}") from exc
    missing = [b for b in BINARIES if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())]
    if missing:
        raise Unavailable(f"still missing after install: {', '.join(missing)}")


@dataclass
class SystemDaemons:
    """The machine's libvirtd/virtlogd; ``started`` lists the pids this process started."""

    started: list[int] = field(default_factory=list)
    kvm_mode: int | None = None  # original /dev/kvm mode when the fixture had to open it up
    kvm_gid: int | None = None

    def stop(self) -> None:
        for pid in reversed(self.started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        self.started.clear()
        if self.kvm_mode is not None and self.kvm_gid is not None:
            with contextlib.suppress(OSError):
                os.chown("/dev/kvm", -1, self.kvm_gid)
                os.chmod("/dev/kvm", self.kvm_mode)


def _open_kvm(d: SystemDaemons) -> None:
    """QEMU runs as libvirt-qemu (group kvm); without udev /dev/kvm may be root-only. Give the kvm
    group access as Debian's udev rule would (restored at the end)."""
    try:
        st = os.stat("/dev/kvm")
        import grp

        kvm_gid = grp.getgrnam("kvm").gr_gid
    except (OSError, KeyError):
        return
    if st.st_gid == kvm_gid and st.st_mode & 0o060 == 0o060:
        return
    if os.geteuid() != 0:
        return
    d.kvm_mode, d.kvm_gid = stat.S_IMODE(st.st_mode), st.st_gid
    os.chown("/dev/kvm", -1, kvm_gid)
    os.chmod("/dev/kvm", stat.S_IMODE(st.st_mode) | 0o060)


def start_system_daemons() -> SystemDaemons:
    ensure_installed()
    d = SystemDaemons()
    _open_kvm(d)
    if _socket_answers(SYSTEM_SOCKET):
        return d
    if os.geteuid() != 0:
        raise Unavailable("libvirtd is not running and starting it needs root")
    try:
        if _pid_from(Path("/run/virtlogd.pid")) is None:
            subprocess.run(["virtlogd", "-d"], check=True, timeout=30)
            _wait_for(lambda: _pid_from(Path("/run/virtlogd.pid")) is not None, 60, "virtlogd")
            pid = _pid_from(Path("/run/virtlogd.pid"))
            if pid is not None:
                d.started.append(pid)
        if _pid_from(Path("/run/libvirtd.pid")) is None:
            subprocess.run(["libvirtd", "-d"], check=True, timeout=30)
            _wait_for(lambda: _pid_from(Path("/run/libvirtd.pid")) is not None, 60, "libvirtd")
            pid = _pid_from(Path("/run/libvirtd.pid"))
            if pid is not None:
                d.started.append(pid)
        _wait_for(lambda: _socket_answers(SYSTEM_SOCKET), 60, "libvirtd's socket")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, Unavailable) as exc:
        d.stop()
        raise Unavailable(f"cannot start libvirtd: {exc}") from exc
    return d


def _destroy_all(uri: str) -> None:
    subprocess.run(
        ["sh", "-c", f"for d in $(virsh -c '{uri}' list --name); do virsh -c '{uri}' destroy $d; done"],
        capture_output=True, timeout=60, check=False,
    )


PRIVATE_DIRS = ("/etc/libvirt", "/run/libvirt", "/var/lib/libvirt", "/var/cache/libvirt", "/var/log/libvirt")


@dataclass
class PeerHost:
    """A second libvirtd in its own mount + UTS namespace: a migration peer on the same machine."""

    root: Path
    process: subprocess.Popen[bytes]
    hostname: str

    @property
    def socket(self) -> Path:
        return self.root / "run" / "libvirt" / "libvirt-sock"

    @property
    def uri(self) -> str:
        """How this process (and the system libvirtd) reaches the peer. The explicit ``+unix``
        transport matters: libvirt refuses a peer-to-peer migration to a server-less URI ("same
        host") unless it names a UNIX socket that way."""
        return f"qemu+unix:///system?socket={self.socket}"

    @property
    def system_uri_from_peer(self) -> str:
        """How the peer libvirtd reaches the system one (its /run/libvirt is private)."""
        return f"qemu+unix:///system?socket={self.root}/host-run-libvirt/libvirt-sock"

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not _socket_answers(self.socket):
            if self.process.poll() is not None:
                out = (self.root / "peer-libvirtd.log").read_text(errors="replace")[-2000:]
                raise Unavailable(f"peer libvirtd exited with {self.process.returncode}: {out}")
            if time.monotonic() > deadline:
                raise Unavailable(f"peer libvirtd's socket did not come up within {timeout:.0f} s")
            time.sleep(0.1)

    def restart(self) -> None:
        """Stop the peer libvirtd and start it again on the same state (its VMs keep running)."""
        self._terminate()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self.process = _spawn_peer(self.root, self.hostname)
        self.wait_ready()

    def _terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)

    def stop(self) -> None:
        """Destroy the peer's VMs (QEMU outlives libvirtd), stop it and remove its state."""
        if self.process.poll() is None:
            with contextlib.suppress(Exception):
                _destroy_all(self.uri)
        self._terminate()
        shutil.rmtree(self.root, ignore_errors=True)


def _prepare_root(root: Path, host_uuid: str) -> None:
    if root.exists():
        shutil.rmtree(root)
    etc = root / "etc" / "libvirt"
    shutil.copytree("/etc/libvirt", etc, symlinks=True)
    # no domains, no autostarted networks: this host starts empty
    for sub in ("qemu", "storage", "secrets"):
        p = etc / sub
        if p.is_dir():
            for f in p.glob("*.xml"):
                f.unlink()
    shutil.rmtree(etc / "qemu" / "networks" / "autostart", ignore_errors=True)
    with (etc / "libvirtd.conf").open("a") as fh:
        fh.write(f'\n# vmctl integration-test peer\nhost_uuid = "{host_uuid}"\n')
    with (etc / "qemu.conf").open("a") as fh:
        fh.write('\n# vmctl integration-test peer: QEMU logs to files (no virtlogd in here)\nstdio_handler = "file"\n')
    (root / "run" / "libvirt").mkdir(parents=True)
    (root / "host-run-libvirt").mkdir()
    (root / "var" / "cache" / "libvirt").mkdir(parents=True)
    (root / "var" / "log" / "libvirt" / "qemu").mkdir(parents=True)
    lib = root / "var" / "lib" / "libvirt"
    lib.mkdir(parents=True)
    qemu_dir = lib / "qemu"
    qemu_dir.mkdir()
    src = os.stat("/var/lib/libvirt/qemu")
    os.chown(qemu_dir, src.st_uid, src.st_gid)
    os.chmod(qemu_dir, stat.S_IMODE(src.st_mode))
    for sub in ("images", "boot"):
        (lib / sub).mkdir()


def start_peer(name: str = "vmctl-peer") -> PeerHost:
    """Start the peer libvirtd (stop it with ``PeerHost.stop()``, which also removes its state)."""
    if os.geteuid() != 0:
        raise Unavailable("a second libvirtd in a mount namespace needs root")
    if shutil.which("unshare") is None:
        raise Unavailable("util-linux 'unshare' is missing")
    root = Path(f"/run/vmctl-it-peer-{os.getpid()}")
    _prepare_root(root, str(uuid.uuid4()))
    peer = PeerHost(root=root, process=_spawn_peer(root, name), hostname=name)
    try:
        peer.wait_ready()
    except BaseException:
        peer.stop()
        raise
    return peer


def _spawn_peer(root: Path, name: str) -> subprocess.Popen[bytes]:
    binds = " && ".join([f"mount --bind /run/libvirt {root}/host-run-libvirt"]
                        + [f"mount --bind {root}{d} {d}" for d in PRIVATE_DIRS])
    script = f"hostname {name} && {binds} && exec libvirtd --pid-file /run/libvirt/libvirtd.pid"
    with (root / "peer-libvirtd.log").open("ab") as log:
        return subprocess.Popen(
            ["unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c", script],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )


@contextlib.contextmanager
def peer_host(name: str = "vmctl-peer") -> Iterator[PeerHost]:
    """Start the peer libvirtd and stop it (and remove its state) when the block ends."""
    peer = start_peer(name)
    try:
        yield peer
    finally:
        peer.stop()


# ----------------------------------------------------------------------------- one set per test process


# The cgroup all libvirt guests live under, with the knob that weighs it against the host's own
# processes and that knob's maximum (cgroup v1 hybrid layout here; v2 and systemd layouts too).
MACHINE_KNOBS = (
    ("/sys/fs/cgroup/cpu/machine/cpu.shares", 262144),
    ("/sys/fs/cgroup/cpu,cpuacct/machine/cpu.shares", 262144),
    ("/sys/fs/cgroup/cpu,cpuacct/machine.slice/cpu.shares", 262144),
    ("/sys/fs/cgroup/machine/cpu.weight", 10000),
    ("/sys/fs/cgroup/machine.slice/cpu.weight", 10000),
)


#: where a test process records the knob values it changed, so that the next one restores them when it
#: was killed before its ``shutdown_shared`` (a killed run left the machine partition at 262144 shares,
#: and every later guest starved the host's own processes)
BOOST_RECORD = "/run/vmctl-it-boost-{pid}.json"


def _dead_owner(path: Path, prefix: str, suffix: str = "") -> bool:
    """Whether ``path`` (``<prefix><pid><suffix>``) belongs to a test process that is gone (not this one)."""
    name = path.name
    if not (name.startswith(prefix) and name.endswith(suffix)):
        return False
    pid = name[len(prefix):len(name) - len(suffix)] if suffix else name[len(prefix):]
    return pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid))


def sweep_stale() -> list[str]:
    """Undo what test processes that were killed left behind: their knob values come back, their image
    folders and peer roots go (only those of pids no longer alive; the peer's own libvirtd, started in a
    session of its own, is stopped by pid from its pid file when still running). Returns what it undid."""
    undone: list[str] = []
    for rec in sorted(Path("/run").glob("vmctl-it-boost-*.json")):
        if not _dead_owner(rec, "vmctl-it-boost-", ".json"):
            continue
        try:
            values = json.loads(rec.read_text())
        except (OSError, ValueError):
            values = {}
        for path, value in values.items() if isinstance(values, dict) else ():
            with contextlib.suppress(OSError):
                Path(path).write_text(str(value))
                undone.append(f"{path} = {value}")
        rec.unlink(missing_ok=True)
    for d in sorted(Path("/var/lib").glob("vmctl-it-*")):
        if _dead_owner(d, "vmctl-it-"):
            shutil.rmtree(d, ignore_errors=True)
            undone.append(str(d))
    for d in sorted(Path("/run").glob("vmctl-it-peer-*")):
        if not _dead_owner(d, "vmctl-it-peer-"):
            continue
        with contextlib.suppress(OSError, ValueError):
            pid = int((d / "run" / "libvirt" / "libvirtd.pid").read_text().strip())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm == "libvirtd" and str(d) in Path(f"/proc/{pid}/mountinfo").read_text():  # its binds
                os.kill(pid, signal.SIGTERM)
        shutil.rmtree(d, ignore_errors=True)
        undone.append(str(d))
    return undone


def boost_machine_cgroup() -> str | None:
    """Give the cgroup of all VMs priority over the host's other processes, as a VM host would, so
    that measurements of fg/bg shares and caps are not swamped by whatever else runs here (other
    test processes). Idempotent; the original values come back in ``shutdown_shared``. Returns the
    knob it set, or None when there is none (then shares are judged under the load there is)."""
    if os.geteuid() != 0:
        return None
    for path, top in MACHINE_KNOBS:
        p = Path(path)
        if not p.exists():
            continue
        if path not in _Shared.boosted:
            sweep_stale()  # a killed run's boost comes back first: its value is the one to keep
            try:
                _Shared.boosted[path] = p.read_text().strip()
                Path(BOOST_RECORD.format(pid=os.getpid())).write_text(json.dumps(_Shared.boosted))
                p.write_text(str(top))
            except OSError:
                _Shared.boosted.pop(path, None)
                continue
        return path
    return None


class _Shared:
    boosted: dict[str, str] = {}  # noqa: RUF012 (process-wide registry on purpose)
    system: SystemDaemons | None = None
    system_error: str | None = None
    peer: PeerHost | None = None
    peer_error: str | None = None
    images: Path | None = None


def shared_system() -> SystemDaemons:
    """The system libvirtd, started at most once per process and stopped at exit if we started it."""
    if _Shared.system_error is not None:
        raise Unavailable(_Shared.system_error)
    if _Shared.system is None:
        try:
            _Shared.system = start_system_daemons()
        except Unavailable as exc:
            _Shared.system_error = str(exc)
            raise
    return _Shared.system


def shared_peer() -> PeerHost:
    """The migration peer, started at most once per process and stopped at exit."""
    shared_system()
    if _Shared.peer_error is not None:
        raise Unavailable(_Shared.peer_error)
    if _Shared.peer is None or _Shared.peer.process.poll() is not None:
        try:
            _Shared.peer = start_peer()
        except Unavailable as exc:
            _Shared.peer_error = str(exc)
            raise
    return _Shared.peer


def shared_images() -> Path:
    """A folder of guest images both hosts' QEMUs can read (outside the peer's private mounts)."""
    if _Shared.images is None:
        from tests.support.guests import write_guest_image

        sweep_stale()
        d = Path(f"/var/lib/vmctl-it-{os.getpid()}")
        d.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        write_guest_image(d / "spin.img", "spin")
        write_guest_image(d / "idle.img", "idle")
        write_guest_image(d / "duty50.img", "duty", 0.5)
        _Shared.images = d
    return _Shared.images


def shutdown_shared() -> None:
    for path, value in list(_Shared.boosted.items()):
        with contextlib.suppress(OSError):
            Path(path).write_text(value)
        _Shared.boosted.pop(path, None)
    Path(BOOST_RECORD.format(pid=os.getpid())).unlink(missing_ok=True)
    if _Shared.peer is not None:
        _Shared.peer.stop()
        _Shared.peer = None
    if _Shared.system is not None:
        _Shared.system.stop()
        _Shared.system = None
    if _Shared.images is not None:
        shutil.rmtree(_Shared.images, ignore_errors=True)
        _Shared.images = None


atexit.register(shutdown_shared)
