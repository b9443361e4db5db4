"""Job processes inside real guests, over SSH (paramiko), and checkpoint transfer over SFTP.

``ParamikoRunner`` is the agent's ``ProcessRunner`` for real guests: ``start(vm, spec)`` runs
``spec.command`` in the guest (address from ``address_of(vm)``) on a background thread;
``status(vm)`` reports running / exit status / the output tail; the process's environment holds
``VMCTL_JOB_ID``, ``VMCTL_PROCESS_INDEX`` and vmctld's model of it, ``VMCTL_WORK_SECONDS`` (its work in model
seconds on a dedicated standard core; a moldable job's: its time at the width vmctld chose) and
``VMCTL_CPU_USAGE``; ``kill(vm)`` kills the remote process
group. ``run(host, command, env, timeout)`` is the synchronous core; ``transfer_checkpoint(src_path,
host, dst_path)`` copies a checkpoint image over SFTP (to ``dst_path.part``, then renamed, size checked).

Security: key authentication only (no passwords, no agent, no key search); host keys are always
checked against a known_hosts file (``RejectPolicy``: unknown or changed keys are refused with
``RemoteHostKeyError``). Every network step has a timeout.

Exit statuses: the command's own; 124 when ``run`` hit its timeout (the remote process group is
killed); 137 after ``kill``. The remote command runs as ``exec sh -c CMD`` behind a line that tells
the runner its PID: sshd starts each session command in a new session, so that PID leads the
process group and ``kill -KILL -PGID`` ends the whole job (dropbear, in the guests of
``vmctl/guestimage.py``, puts the shell in the group of its session process: the kill reads
the group from ``/proc/PID/stat`` and ends that, the session with it).

Addresses: ``address_of(vm)`` gives ``HOST``, ``HOST:PORT`` or ``[HOST]:PORT`` (a guest behind a
forwarded loopback port); without a port, ``SshSettings.port``.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import paramiko

from vmctl.agents.backends.base import ProcessRunner, ProcessStatus
from vmctl.agents.config import split_address
from vmctl.errors import ConfigError, RemoteExecError, RemoteHostKeyError, VmctlError
from vmctl.nodedoc import ProcessSpec

log = logging.getLogger("vmctl.agent.remote")

TIMEOUT_EXIT = 124
KILLED_EXIT = 137
_PID_MARK = b"__vmctl_pid="
#: the wrapper's PID line, at the start of a line (something may come before it: a shell's start-up file
#: or a guest's login message on the combined stream) and complete (it may arrive in pieces)
_PID_LINE = re.compile(rb"(?<![^\n])" + re.escape(_PID_MARK) + rb"(\d+)\r?\n")


def take_pid(buf: bytes) -> tuple[int | None, bytes]:
    """The PID the wrapper's marker line in ``buf`` names, and ``buf`` without that line; (None, ``buf``)
    while no whole marker line has arrived."""
    m = _PID_LINE.search(buf)
    if m is None:
        return None, buf
    return int(m.group(1)), buf[:m.start()] + buf[m.end():]

__all__ = ["KILLED_EXIT", "TIMEOUT_EXIT", "ParamikoRunner", "ProcessRunner", "ProcessStatus", "RunResult",
           "SshSettings"]


@dataclass(frozen=True, slots=True)
class SshSettings:
    user: str
    key_file: str
    known_hosts: str
    port: int = 22
    connect_timeout: float = 10.0
    command_timeout: float = 86400.0
    tail_bytes: int = 4096
    state_dir: str = "/tmp/vmctl-jobs"  # in the guest: <state_dir>/<vm>/{job,exit} (adoption after a restart)
    boot_timeout: float = 120.0  # a VM the agent just booted: a job's connection retries this long


@dataclass(frozen=True, slots=True)
class RunResult:
    exit_code: int
    output_tail: str
    timed_out: bool
    duration_s: float


class _Job:
    def __init__(self, spec: ProcessSpec, host: str) -> None:
        self.spec = spec
        self.host = host
        self.exit_code: int | None = None
        self.tail = b""
        self.pid: int | None = None
        self.pid_seen = 0.0  # monotonic: when the PID line came (the process runs in the guest)
        self.killed = False
        self.channel: paramiko.Channel | None = None
        self.error: str = ""
        self.exc: VmctlError | None = None
        self.started = 0.0
        self.ended = 0.0
        self.adopted = False  # found running in the guest after an agent restart (polled by status())
        self.state_dir: str | None = None
        self.wait_until = 0.0  # monotonic: retry the connection until then (the guest is booting)
        self.lock = threading.Lock()


class ParamikoRunner:
    def __init__(self, settings: SshSettings, address_of: Callable[[str], str] | None = None,
                 on_end: Callable[[], None] | None = None, on_start: Callable[[], None] | None = None) -> None:
        self.settings = settings
        self.address_of: Callable[[str], str] = address_of or (lambda vm: vm)
        self.on_end = on_end  # called when a started job's process ended (the agent reports it at once)
        self.on_start = on_start  # called when a job's process runs in its guest (its PID line came)
        self._jobs: dict[str, _Job] = {}
        self._probed: set[str] = set()  # VMs whose guest was asked for a job trace since we started
        self._booting: dict[str, float] = {}  # VM -> monotonic time the agent booted it, until a job connects
        self._lock = threading.Lock()
        for what, p in (("ssh.key_file", settings.key_file), ("ssh.known_hosts", settings.known_hosts)):
            if not os.path.isfile(p):
                raise ConfigError(path=p, where=what, problem="does not exist or is not a file")

    # ------------------------------------------------------------------ connections

    def connect(self, host: str) -> paramiko.SSHClient:
        s = self.settings
        client = paramiko.SSHClient()
        try:
            client.load_host_keys(s.known_hosts)
        except (OSError, paramiko.SSHException) as exc:
            raise ConfigError(path=s.known_hosts, where="ssh.known_hosts", problem=f"cannot be read: {exc}") from exc
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            name, port = split_address(host, s.port)
        except ValueError as exc:
            client.close()
            raise RemoteExecError(host=host, problem=f"bad guest address: {exc}") from exc
        where = f"{s.user}@{name}:{port}"
        sock = self._ssh_socket(name, port, where)
        try:
            client.connect(name, port=port, sock=sock, username=s.user, key_filename=s.key_file,
                           timeout=s.connect_timeout, banner_timeout=s.connect_timeout, auth_timeout=s.connect_timeout,
                           channel_timeout=s.connect_timeout, allow_agent=False, look_for_keys=False)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise RemoteHostKeyError(host=where, problem=f"host key mismatch: got {exc.key.get_name()} "
                                                         f"{exc.key.get_base64()[:16]}..., known_hosts has another key"
                                     ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise RemoteExecError(host=where, problem=f"authentication with {s.key_file} failed: {exc}") from exc
        except paramiko.SSHException as exc:
            client.close()
            if "not found in known_hosts" in str(exc):
                raise RemoteHostKeyError(host=where, problem=f"unknown host key ({s.known_hosts} has none)") from exc
            raise RemoteExecError(host=where, problem=f"ssh failed: {exc}") from exc
        except (OSError, EOFError) as exc:  # refused, unreachable, timeouts (socket.timeout is OSError)
            client.close()
            raise RemoteExecError(host=where, problem=f"cannot connect: {exc or type(exc).__name__}") from exc
        return client

    def _ssh_socket(self, name: str, port: int, where: str) -> socket.socket:
        """A connection on which the server has sent its SSH banner (peeked, left for paramiko). A guest
        behind QEMU's port forward accepts at once and says nothing until its SSH server is up: that is
        "not up yet", refused with one line (not paramiko's banner-error tracebacks in the agent's log)."""
        timeout = self.settings.connect_timeout
        try:
            sock = socket.create_connection((name, port), timeout=timeout)
        except OSError as exc:
            raise RemoteExecError(host=where, problem=f"cannot connect: {exc or type(exc).__name__}") from exc
        try:
            head = sock.recv(4, socket.MSG_PEEK)
        except OSError:
            head = b""
        if not head:
            sock.close()
            raise RemoteExecError(host=where, problem=f"no SSH banner within {timeout:g} s (the server is not up)")
        return sock

    # ------------------------------------------------------------------ synchronous run

    def run(self, host: str, command: str, env: Mapping[str, str] | None = None,
            timeout: float | None = None) -> RunResult:
        """Run ``command`` in ``host`` and wait for it (at most ``timeout`` seconds)."""
        job = _Job(ProcessSpec(job_id="", index=0, command=command), host)
        self._run_job(job, env or {}, self.settings.command_timeout if timeout is None else timeout)
        if job.exc is not None:
            raise job.exc
        if job.error:
            raise RemoteExecError(host=host, problem=job.error)
        assert job.exit_code is not None
        return RunResult(exit_code=job.exit_code, output_tail=job.tail.decode("utf-8", "replace"),
                         timed_out=job.exit_code == TIMEOUT_EXIT and job.killed, duration_s=job.ended - job.started)

    def _run_job(self, job: _Job, env: Mapping[str, str], timeout: float) -> None:
        t0 = time.monotonic()
        job.started = t0
        while True:
            try:
                client = self.connect(job.host)
                break
            except RemoteHostKeyError as exc:
                job.error, job.exc = str(exc), exc
                job.exit_code = -1
                return
            except VmctlError as exc:
                if time.monotonic() < job.wait_until and not job.killed:
                    time.sleep(0.1)  # a guest the agent just booted: its SSH server is not up yet
                    continue
                job.error, job.exc = str(exc), exc
                job.exit_code = -1
                return
        try:
            for k in env:
                if not k.replace("_", "a").isalnum() or k[:1].isdigit():
                    raise RemoteExecError(host=job.host, problem=f"bad environment variable name {k!r}")
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            cmd = f"env {exports} sh -c {shlex.quote(job.spec.command)}" if exports else \
                f"sh -c {shlex.quote(job.spec.command)}"
            if job.state_dir is None:
                wrapper = f"echo {_PID_MARK.decode()}$$; exec {cmd}"
            else:  # leave a trace in the guest so a restarted agent can adopt the process
                d = shlex.quote(job.state_dir)
                wrapper = (f"D={d}; mkdir -p \"$D\" && rm -f \"$D/exit\" && printf '%s %s %s\\n' "
                           f"{shlex.quote(job.spec.job_id)} {job.spec.index} $$ > \"$D/job\" || exit 125; "
                           f"echo {_PID_MARK.decode()}$$; {cmd}; rc=$?; echo $rc > \"$D/exit\"; exit $rc")
            transport = client.get_transport()
            if transport is None:
                raise RemoteExecError(host=job.host, problem="ssh transport closed")
            chan = transport.open_session(timeout=self.settings.connect_timeout)
            chan.set_combine_stderr(True)
            chan.settimeout(0.1)
            chan.exec_command(wrapper)
            chan.shutdown_write()
            with job.lock:
                job.channel = chan
            buf = b""
            deadline = t0 + timeout
            while True:
                try:
                    data = chan.recv(32768)
                except TimeoutError:
                    data = None
                if data:
                    buf += data
                    if job.pid is None:
                        pid, buf = take_pid(buf)
                        if pid is not None:
                            job.pid_seen = time.monotonic()
                            job.pid = pid
                            if self.on_start is not None and job.spec.job_id:
                                self.on_start()
                        else:  # keep what may be the start of the marker line (a whole line is < 64 bytes)
                            buf = buf[-max(self.settings.tail_bytes, 64):]
                    if job.pid is not None:
                        buf = buf[-self.settings.tail_bytes:]
                    with job.lock:
                        job.tail = buf
                    continue
                if data == b"" and chan.exit_status_ready():
                    break
                if job.killed:
                    break
                if time.monotonic() > deadline:
                    self._kill_group(job, client)
                    with job.lock:
                        job.killed = True
                        job.exit_code = TIMEOUT_EXIT
                    break
            if job.exit_code is None:
                if job.killed:
                    job.exit_code = KILLED_EXIT
                else:
                    status = chan.recv_exit_status()
                    job.exit_code = KILLED_EXIT if status < 0 else status
            with job.lock:
                job.tail = buf[-self.settings.tail_bytes:]
        except VmctlError as exc:
            job.error, job.exc = str(exc), exc
            job.exit_code = -1
        except (paramiko.SSHException, OSError, EOFError) as exc:
            job.error = f"ssh session failed: {exc or type(exc).__name__}"
            job.exit_code = -1
        finally:
            job.ended = time.monotonic()
            client.close()

    def _kill_group(self, job: _Job, client: paramiko.SSHClient | None = None) -> None:
        if job.pid is None:
            if job.channel is not None:
                job.channel.close()
            return
        own = client is None
        try:
            c = client or self.connect(job.host)
        except VmctlError as exc:
            log.warning("cannot kill %s on %s: %s", job.pid, job.host, exc)
            return
        try:
            # the process group of the job's shell: its own under OpenSSH (sshd makes it a session leader),
            # dropbear's session process's under dropbear; busybox kill takes no "--", so "-KILL -PGID"
            cmd = (f"g=$(sed 's/.*) //' /proc/{job.pid}/stat 2>/dev/null | cut -d' ' -f3); "
                   f"kill -KILL -\"${{g:-{job.pid}}}\" 2>/dev/null || kill -KILL {job.pid}")
            if job.state_dir is not None:
                cmd += f"; echo {KILLED_EXIT} > {shlex.quote(job.state_dir)}/exit"
            _, out, _ = c.exec_command(cmd, timeout=self.settings.connect_timeout)
            out.channel.recv_exit_status()
        except (paramiko.SSHException, OSError) as exc:
            log.warning("kill of %s on %s failed: %s", job.pid, job.host, exc)
        finally:
            if own:
                c.close()

    # ------------------------------------------------------------------ ProcessRunner

    def _state_dir(self, vm: str) -> str:
        return f"{self.settings.state_dir.rstrip('/')}/{vm}"

    def start(self, vm: str, spec: ProcessSpec) -> None:
        with self._lock:
            cur = self._jobs.get(vm)
            if cur is not None:
                if (cur.spec.job_id, cur.spec.index) == (spec.job_id, spec.index):
                    return
                if cur.exit_code is None:
                    raise RemoteExecError(host=vm, problem=f"still runs {cur.spec.job_id}[{cur.spec.index}]")
            if not spec.command:
                raise RemoteExecError(host=vm, problem=f"process {spec.job_id}[{spec.index}] has no command")
            job = _Job(spec, self.address_of(vm))
            job.state_dir = self._state_dir(vm)
            booted = self._booting.pop(vm, None)
            if booted is not None:
                job.wait_until = booted + self.settings.boot_timeout
            self._jobs[vm] = job
            self._probed.discard(vm)
        # the process's model as vmctld gave it: its work in model seconds on a dedicated standard core (a
        # moldable job's: its time at the width it was started with) and its CPU usage there; a CPU-bound
        # job that spins that much of its own CPU time (vmctl.whatif.fidelity.spin_command) reads them
        env = {"VMCTL_JOB_ID": spec.job_id, "VMCTL_PROCESS_INDEX": str(spec.index),
               "VMCTL_WORK_SECONDS": f"{spec.work_seconds:.3f}", "VMCTL_CPU_USAGE": f"{spec.cpu_usage:.3f}"}
        threading.Thread(target=self._follow, args=(job, env), name=f"vmctl-job-{vm}", daemon=True).start()

    def _follow(self, job: _Job, env: Mapping[str, str]) -> None:
        self._run_job(job, env, self.settings.command_timeout)
        if self.on_end is not None and not job.killed:
            self.on_end()

    def _probe(self, vm: str) -> _Job | None:
        """Read the job trace a runner left in the guest (after an agent restart). Raises
        ``RemoteExecError`` when the guest cannot be asked: then nobody may guess."""
        d = shlex.quote(self._state_dir(vm))
        script = (f"D={d}; [ -f \"$D/job\" ] || exit 0; read -r line < \"$D/job\"; echo \"$line\"; "
                  "pid=${line##* }; st=$(cut -d' ' -f3 /proc/$pid/stat 2>/dev/null); "
                  "if [ -n \"$st\" ] && [ \"$st\" != Z ]; then echo running; "
                  "elif [ -f \"$D/exit\" ]; then cat \"$D/exit\"; else echo lost; fi")
        host = self.address_of(vm)
        res = self.run(host, script, timeout=self.settings.connect_timeout)
        lines = [ln for ln in res.output_tail.splitlines() if ln.strip()]
        if res.exit_code != 0:
            raise RemoteExecError(host=host, problem=f"cannot read the job trace in {d}: {res.output_tail[-200:]}")
        if not lines:
            return None
        try:
            job_id, index, pid = lines[0].rsplit(" ", 2)
            state = lines[1].strip() if len(lines) > 1 else "lost"
            job = _Job(ProcessSpec(job_id=job_id, index=int(index)), host)
            job.pid = int(pid)
        except ValueError as exc:
            raise RemoteExecError(host=host, problem=f"unreadable job trace in {d}: {lines[:2]}") from exc
        job.adopted = True
        job.state_dir = self._state_dir(vm)
        if state == "running":
            return job
        job.exit_code = KILLED_EXIT if state == "lost" else int(state) if state.lstrip("-").isdigit() else -1
        return job

    def status(self, vm: str) -> ProcessStatus | None:
        with self._lock:
            job = self._jobs.get(vm)
            probed = vm in self._probed
        if job is None and not probed:
            job = self._probe(vm)
            with self._lock:
                self._probed.add(vm)
                if job is not None:
                    self._jobs.setdefault(vm, job)
                    job = self._jobs[vm]
        elif job is not None and job.adopted and job.exit_code is None:
            fresh = self._probe(vm)
            if fresh is None or (fresh.spec.job_id, fresh.spec.index) != (job.spec.job_id, job.spec.index):
                job.exit_code = KILLED_EXIT  # the trace vanished (guest rebooted): the process is gone
            elif fresh.exit_code is not None:
                job.exit_code = fresh.exit_code
        if job is None:
            return None
        with job.lock:
            tail = job.tail.decode("utf-8", "replace")
            if job.error:
                tail = f"{tail}\n[vmctl: {job.error}]".lstrip()
            seen = job.pid_seen if job.pid is not None and job.pid_seen > 0 else None
            return ProcessStatus(vm=vm, job_id=job.spec.job_id, index=job.spec.index,
                                 running=job.exit_code is None, exit_code=job.exit_code, output_tail=tail,
                                 started=job.pid is not None or job.exit_code is not None or job.adopted,
                                 started_ago_s=None if seen is None else max(0.0, time.monotonic() - seen))

    def booted(self, vm: str) -> None:
        """The agent just booted ``vm`` from shut off: no process runs in it, so there is no job trace to
        read (``status`` answers None without asking the guest, which may not answer yet), and the next
        job's connection waits up to ``boot_timeout`` for the guest's SSH server."""
        with self._lock:
            job = self._jobs.get(vm)
            if job is not None and job.exit_code is None:
                return  # a process we started is still followed: leave it to its own session
            self._jobs.pop(vm, None)
            self._probed.add(vm)
            self._booting[vm] = time.monotonic()

    def kill(self, vm: str) -> None:
        with self._lock:
            job = self._jobs.pop(vm, None)
            self._probed.add(vm)  # nothing runs there once this returns
        if job is None or job.exit_code is not None:
            return
        with job.lock:
            job.killed = True
        self._kill_group(job)

    def wait(self, vm: str, timeout: float) -> ProcessStatus | None:
        """Wait until the process of ``vm`` ended (tests and tools); returns its status."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st = self.status(vm)
            if st is None or not st.running:
                return st
            time.sleep(0.02)
        return self.status(vm)

    # ------------------------------------------------------------------ SFTP

    def transfer_checkpoint(self, src_path: str, host: str, dst_path: str) -> int:
        """Copy a checkpoint image to ``host:dst_path`` over SFTP; returns the bytes copied."""
        try:
            size = os.path.getsize(src_path)
        except OSError as exc:
            raise RemoteExecError(host=host, problem=f"checkpoint {src_path} cannot be read: {exc}") from exc
        client = self.connect(host)
        part = f"{dst_path}.part"
        try:
            sftp = client.open_sftp()
            sftp.get_channel().settimeout(self.settings.connect_timeout)  # type: ignore[union-attr]
            try:
                attrs = sftp.put(src_path, part, confirm=True)
                if attrs.st_size != size:
                    raise RemoteExecError(host=host, problem=f"{dst_path}: copied {attrs.st_size} of {size} bytes")
                sftp.posix_rename(part, dst_path)
            finally:
                sftp.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteExecError(host=host, problem=f"sftp of {src_path} to {dst_path} failed: "
                                                     f"{exc or type(exc).__name__}") from exc
        finally:
            client.close()
        return size

