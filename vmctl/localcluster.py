"""A vmctl cluster of local processes (the library under ``vmctl demo``, the live task-bag testbed of
``vmctl.experiments.taskbags_live``, ``bench/`` and the tests that need a real vmctld or agent process):
``ManagedProcess`` (a child with its output in a log file, stopped by pid), ``DaemonProcess``
(``vmctld`` with SQLite on a free loopback port), ``agent_config`` (the config of one ``vmctl-agent``),
free loopback ports and ``ssh_guest_config`` (the agent sections that boot the SSH guest of
``vmctl.guestimage``). A process that dies or never gets ready raises ``LocalClusterError``.

The processes run as ``python -m vmctl.daemon.main`` / ``python -m vmctl.agents.main`` with this
interpreter, so they work from a checkout's virtualenv without the console scripts on PATH.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from vmctl.apiclient import ApiClient
from vmctl.errors import LocalClusterError


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int, first: int = 20000, last: int = 60000) -> int:
    """The first of ``count`` consecutive loopback ports that are free now (a random start, then upwards)."""
    import random

    start = random.randrange(first, last - count)
    for base in [*range(start, last - count), *range(first, start)]:
        socks: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return int(base)
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no {count} consecutive free loopback ports in {first}..{last}")


def ssh_guest_config(guest_dir: Path, known_hosts: Path, base_port: int, vms: int,
                     domain_type: str = "qemu", shared_vms: int = 0) -> dict[str, Any]:
    """The agent config sections that make a libvirt agent boot the SSH guest built in ``guest_dir``
    (``python -m vmctl.guestimage build DIR``) and run its job processes there: the
    ``layout`` keys (direct kernel boot, ``ssh_ports`` from ``base_port``; with ``shared_vms``, the shared
    VMs' range of that many ports right after the ``vms`` slot ports, ``shared_ssh_ports``/``shared_ssh_count``),
    ``backend.domain_type`` and the ``ssh`` section (its ``known_hosts``, written here, gives the image's host
    key to every forwarded port)."""
    host_key = (guest_dir / "host_key.pub").read_text(encoding="utf-8").strip()
    ports = range(base_port, base_port + vms + shared_vms)
    known_hosts.write_text("".join(f"[127.0.0.1]:{p} {host_key}\n" for p in ports), encoding="utf-8")
    layout: dict[str, Any] = {"kernel": str(guest_dir / "vmlinuz"), "initrd": str(guest_dir / "initrd.gz"),
                              "cmdline": "quiet", "ssh_ports": base_port, "memory_mib": 128}
    if shared_vms:
        layout.update(shared_ssh_ports=base_port + vms, shared_ssh_count=shared_vms)
    return {"backend": {"domain_type": domain_type},
            "layout": layout,
            "ssh": {"enabled": True, "user": "root", "key_file": str(guest_dir / "id_ed25519"),
                    "known_hosts": str(known_hosts), "address_pattern": "127.0.0.1:{port}",
                    "connect_timeout_seconds": 2.0}}


class ManagedProcess:
    """A child process with its output in a log file; stopped by pid (SIGTERM, then SIGKILL)."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self._reader: threading.Thread | None = None
        self.lines: list[str] = []
        self._line_event = threading.Event()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL, text=True,
            env=self.env, start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{self.name}-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            self._line_event.set()
            if self._log is not None:
                with contextlib.suppress(ValueError):
                    self._log.write(line)
                    self._log.flush()

    def wait_line(self, prefix: str, timeout: float) -> str:
        """The first stdout line starting with ``prefix``; LocalClusterError if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            if self.proc is not None and self.proc.poll() is not None:
                problem = f"exited with {self.proc.returncode}; see {self.log_path}"
                raise LocalClusterError(what=self.name, problem=problem + self.tail())
            left = deadline - time.monotonic()
            if left <= 0:
                raise LocalClusterError(what=self.name, problem=f"not ready after {timeout:.0f} s; see {self.log_path}"
                                + self.tail())
            self._line_event.clear()
            self._line_event.wait(min(0.2, left))

    def tail(self, n: int = 5) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-n:]
        except OSError:
            return ""
        return ("\n  " + "\n  ".join(lines)) if lines else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        """Send SIGTERM to this pid (no wait)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM this pid, wait, then SIGKILL; returns the exit code."""
        rc: int | None = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(5)
            rc = self.proc.returncode
            if self.proc.stdout is not None:
                self.proc.stdout.close()
        if self._reader is not None:
            self._reader.join(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
        return rc


class DaemonProcess(ManagedProcess):
    """``vmctld`` with SQLite in ``state_dir`` on a free loopback port."""

    def __init__(self, state_dir: Path, *, policy: str = "measy", tick_s: float = 0.5,
                 node_timeout_s: float = 10.0, estimate_grace_s: float = 1.0,
                 extra: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = state_dir / "vmctld.yaml"
        cfg: dict[str, Any] = {
            "state_dir": str(state_dir),
            "store": {"url": f"sqlite:///{state_dir}/vmctld.db"},
            "api": {"listen": "127.0.0.1", "port": 0, "bootstrap_token_file": str(state_dir / "admin.token")},
            "policy": {"name": policy},
            "loop": {"tick_s": tick_s, "node_timeout_s": node_timeout_s, "estimate_grace_s": estimate_grace_s},
            "log_level": "info",
        }
        for k, v in (extra or {}).items():
            if isinstance(v, dict) and isinstance(cfg.get(k), dict):
                cfg[k].update(v)
            else:
                cfg[k] = v
        self.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        super().__init__("vmctld", [sys.executable, "-m", "vmctl.daemon.main", "--config", str(self.config_path)],
                         state_dir / "vmctld.log", env=env)
        self.port = 0

    def start_and_wait(self, timeout: float = 120.0) -> None:
        """Start vmctld and wait for its ready line and bootstrap token, ``timeout`` seconds in all. The
        bound is generous: a start took 9-34 s on a 2-core host whose guests spun at libvirt's CPU share,
        and the ready line is the progress waited for (the process's exit ends the wait at once)."""
        deadline = time.monotonic() + timeout
        self.start()
        line = self.wait_line("vmctld ready", timeout)
        for part in line.split():
            if part.startswith("port="):
                self.port = int(part.split("=", 1)[1])
        if not self.port:
            raise LocalClusterError(what="vmctld", problem=f"no port in its ready line {line!r}")
        deadline = max(deadline, time.monotonic() + 10)
        while not self.token_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.token_path.exists():
            raise LocalClusterError(what="vmctld", problem=f"wrote no bootstrap token to {self.token_path}")

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def token_path(self) -> Path:
        return self.state_dir / "admin.token"

    @property
    def ca_path(self) -> Path:
        return self.state_dir / "ca.pem"

    def token(self) -> str:
        return self.token_path.read_text(encoding="utf-8").strip()

    def client(self, timeout: float = 30.0) -> ApiClient:
        return ApiClient(self.url, self.token(), ca=str(self.ca_path), timeout=timeout)


def agent_config(node: str, daemon_url: str, certs: dict[str, str], *, backend: str, cores: int,
                 libvirt_uri: str, metrics_port: int, peers: Sequence[str] = (), fabric_dir: str = "",
                 clock: dict[str, float] | None = None, migration_seconds: float = 1.0,
                 state_file: str = "", layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """An agent's config (``layout``: extra ``layout:`` keys, e.g. ``{"levels": 2, "discipline": "shared"}``)."""
    b: dict[str, Any] = {"kind": backend}
    if backend == "mock":
        b["cores"] = cores
        if state_file:  # the host's guests outlive its agent process (a restarted agent re-adopts them)
            b["state_file"] = state_file
        if fabric_dir:
            b["fabric_dir"] = fabric_dir
            b["migration_seconds"] = migration_seconds
    else:
        b["uri"] = libvirt_uri
    cfg: dict[str, Any] = {
        "node": node,
        "log_level": "info",
        "backend": b,
        "reconcile": {"resync_seconds": 2.0, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 2.0},
        # short long-polls: a change still arrives at once, and a stop never waits long
        "daemon": {"url": daemon_url, "cert_file": certs["cert"], "key_file": certs["key"], "ca_file": certs["ca"],
                   "wait_seconds": 2.0},
        "metrics": {"listen": f"127.0.0.1:{metrics_port}"},
    }
    if backend == "libvirt":
        cfg["layout"] = {"cores": list(range(cores))}
    if layout:
        cfg["layout"] = {**cfg.get("layout", {}), **layout}
    if clock and backend == "mock":
        cfg["clock"] = dict(clock)
    # migration targets: mock agents reach each other through fabric_dir (live migration between processes)
    others = [p for p in peers if p != node]
    if others:
        cfg["peers"] = {p: (f"mock://{p}" if backend == "mock" else libvirt_uri) for p in others}
    return cfg


def start_agent(node: str, cfg: dict[str, Any], state_dir: Path) -> ManagedProcess:
    """Write ``cfg`` as ``STATE_DIR/agent-NODE.yaml`` and start ``vmctl-agent`` on it (its log beside it)."""
    path = state_dir / f"agent-{node}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    agent = ManagedProcess(f"vmctl-agent {node}", [sys.executable, "-m", "vmctl.agents.main", "--config", str(path)],
                           state_dir / f"agent-{node}.log")
    agent.start()
    return agent


def wait_registered(api: ApiClient, agents: Sequence[ManagedProcess], state_dir: Path, timeout: float = 60.0) -> None:
    """Until vmctld lists as many ready nodes as ``agents``; ``LocalClusterError`` when one dies or the
    time runs out (a bound for a broken setup, not a measurement)."""
    deadline = time.monotonic() + timeout
    while sum(1 for n in api.list_nodes() if n.get("state") == "ready") < len(agents):
        if time.monotonic() > deadline or not all(a.alive() for a in agents):
            raise LocalClusterError(what="agents", problem=f"the {len(agents)} agents did not all register "
                                                           f"(logs in {state_dir})")
        time.sleep(0.2)
