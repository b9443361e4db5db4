"""``vmctl demo``: a whole vmctl cluster on this machine, running a Feitelson-model workload.

What it does, in order (everything it starts, it stops, by pid):

1. makes a state directory (temporary unless ``--state-dir``);
2. starts ``vmctld`` with SQLite on a free loopback port (TLS with its own cluster CA; a bootstrap admin
   token written to the state directory) and waits for its ``vmctld ready port=N`` line;
3. issues a client certificate per node through the API (``POST /v1/certs``) and starts one
   ``vmctl-agent`` per node on the mock backend (``--backend libvirt``: the local libvirt), each with
   its own Prometheus endpoint; the mock agents share a fabric directory, so the daemon's live
   migrations really move VMs (with their job's progress) between the agent processes;
4. runs everything on an accelerated clock: vmctld and the mock agents get ``clock: {speed, epoch}``
   (``--speed`` model seconds per real second from one shared epoch), so daemon timestamps, the mock
   processes' progress and the workload's own times are all model seconds;
5. generates a Feitelson (1996) workload (``vmctl.sim.workloads.generate_model``: TModel estimates,
   the paper's CPU usage per process), in model seconds; when its arrivals would not fit into the
   first half of ``--duration`` they are squeezed further, and run times are capped at a third of it;
6. submits the jobs at their arrival times and shows a live view (nodes with fg/bg occupancy, running
   jobs with tier and placement, migrations as they happen, the metrics URL);
7. prints a summary: response time and bounded slowdown in model seconds, jobs by final state,
   migrations; then stops the agents and the daemon.

The processes run as ``python -m vmctl.daemon.main`` / ``python -m vmctl.agents.main`` with this
interpreter, so the demo works from a checkout's virtualenv without the console scripts on PATH.
The demo talks to the daemon only through its HTTP API (``vmctl.apiclient``).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import click
import yaml

from vmctl import errors
from vmctl.apiclient import ApiClient
from vmctl.model import JobState

TERMINAL = (JobState.DONE, JobState.KILLED, JobState.FAILED, JobState.CANCELLED)
BSLD_TAU = 10.0  # bounded-slowdown threshold in (model) seconds, as in MEASY sec. 3.3


class DemoError(errors.VmctlError):
    reference = "demo-failed"
    template = "{what}: {problem}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ----------------------------------------------------------------------------- processes


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
        """The first stdout line starting with ``prefix``; DemoError if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            if self.proc is not None and self.proc.poll() is not None:
                raise DemoError(what=self.name, problem=f"exited with {self.proc.returncode}; see {self.log_path}"
                                + self.tail())
            left = deadline - time.monotonic()
            if left <= 0:
                raise DemoError(what=self.name, problem=f"not ready after {timeout:.0f} s; see {self.log_path}"
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

    def start_and_wait(self, timeout: float = 30.0) -> None:
        self.start()
        line = self.wait_line("vmctld ready", timeout)
        for part in line.split():
            if part.startswith("port="):
                self.port = int(part.split("=", 1)[1])
        if not self.port:
            raise DemoError(what="vmctld", problem=f"no port in its ready line {line!r}")
        deadline = time.monotonic() + 10
        while not self.token_path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.token_path.exists():
            raise DemoError(what="vmctld", problem=f"wrote no bootstrap token to {self.token_path}")

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
                 state_file: str = "") -> dict[str, Any]:
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
    if clock and backend == "mock":
        cfg["clock"] = dict(clock)
    # migration targets: mock agents reach each other through fabric_dir (live migration between processes)
    others = [p for p in peers if p != node]
    if others:
        cfg["peers"] = {p: (f"mock://{p}" if backend == "mock" else libvirt_uri) for p in others}
    return cfg


# ----------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class DemoJob:
    name: str
    at: float  # seconds after the demo's start (real time)
    spec: dict[str, Any]  # times (estimate, work): model seconds (compressed: real seconds)
    model_run_time: float


def build_demo_workload(n_jobs: int, total_cores: int, speed: float, duration: float, seed: int,
                        model: str = "feitelson96", compress: bool = False) -> tuple[list[DemoJob], dict[str, Any]]:
    """The first ``n_jobs`` of a generated model workload for a machine of ``total_cores`` cores, for
    a clock running ``speed`` model seconds per real second: job times stay in model seconds, the
    arrival offsets ``at`` are real seconds (model / speed, squeezed further when the arrivals would
    not fit into the first half of ``duration``), and run times are capped at a third of ``duration``
    (real seconds, i.e. ``duration / 3 * speed`` model seconds) so the demo ends in time.

    ``compress``: for a daemon on a real-time clock (``--backend libvirt``), job times are divided by
    ``speed`` too (the spec's times are then real seconds)."""
    from vmctl.sim.workloads.registry import MODELS, generate_model

    if model not in MODELS:
        raise errors.OutOfRange(what="workload model", value=model, allowed=" | ".join(MODELS))
    built = generate_model(model, n_jobs, total_cores, seed, usage="paper")
    jobs = list(built.jobs)[:n_jobs]
    if not jobs:
        raise DemoError(what="workload", problem=f"model {model} generated no jobs")
    t0 = min(float(j.submit) for j in jobs)
    span = max(float(j.submit) for j in jobs) - t0
    arrival_scale = 1.0 / speed
    if span / speed > duration * 0.5 and span > 0:
        arrival_scale = duration * 0.5 / span  # squeeze arrivals further so all jobs arrive in time
    max_run = duration / 3.0 * speed
    capped = 0
    out = []
    for j in sorted(jobs, key=lambda x: (float(x.submit), x.id)):
        run = float(j.run_time)
        if run > max_run:
            run = max_run
            capped += 1
        run = max(run, 0.2 * speed)  # at least 0.2 real seconds
        estimate = max(float(j.estimate), run * 1.05)
        unit = 1.0 / speed if compress else 1.0
        run, estimate = run * unit, estimate * unit
        procs = max(1, min(int(j.procs), total_cores))
        usage = list(j.cpu_usage)[:procs] if j.cpu_usage else None
        if usage is not None and len(usage) < procs:
            usage = usage + [usage[-1]] * (procs - len(usage))
        tasks = [{"work_seconds": round(run, 3),
                  **({"cpu_usage": usage[i]} if usage else {})} for i in range(procs)]
        spec: dict[str, Any] = {"name": f"{model}-{j.id}", "procs": procs, "estimate": round(estimate, 3),
                                "tasks": tasks}
        if usage is not None:
            spec["cpu_usage"] = usage
        out.append(DemoJob(name=spec["name"], at=(float(j.submit) - t0) * arrival_scale, spec=spec,
                           model_run_time=float(j.run_time)))
    info = {"model": model, "jobs": len(out), "source": built.source, "arrival_scale": arrival_scale,
            "capped_run_times": capped, "speed": speed, "compressed": compress}
    return out, info


# ----------------------------------------------------------------------------- summary


@dataclass
class Summary:
    jobs: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    mean_response: float = math.nan  # model seconds
    mean_wait: float = math.nan
    mean_bsld: float = math.nan
    max_bsld: float = math.nan
    migrations: int = 0
    bg_starts: int = 0


def summarize(jobs: Sequence[dict[str, Any]], speed: float, tau: float = BSLD_TAU) -> Summary:
    """Response time, wait and bounded slowdown of the finished jobs, in model seconds (real x speed).
    Bounded slowdown: max(1, (end - submit) / max(end - start, tau))."""
    s = Summary(jobs=len(jobs))
    resp: list[float] = []
    waits: list[float] = []
    bsld: list[float] = []
    for j in jobs:
        st = str(j.get("state"))
        s.by_state[st] = s.by_state.get(st, 0) + 1
        s.migrations += int(j.get("migrations") or 0)
        if j.get("tier") == "bg":
            s.bg_starts += 1
        sub, start, end = j.get("submit_time"), j.get("start_time"), j.get("end_time")
        if st == JobState.DONE and sub is not None and start is not None and end is not None:
            r = (float(end) - float(sub)) * speed
            run = (float(end) - float(start)) * speed
            resp.append(r)
            waits.append((float(start) - float(sub)) * speed)
            bsld.append(max(1.0, r / max(run, tau)))
    if resp:
        s.mean_response = sum(resp) / len(resp)
        s.mean_wait = sum(waits) / len(waits)
        s.mean_bsld = sum(bsld) / len(bsld)
        s.max_bsld = max(bsld)
    return s


# ----------------------------------------------------------------------------- the view


def render(client_state: dict[str, Any], info: dict[str, Any]) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    from vmctl.cli.ops import fmt_pct, fmt_placement

    nodes = client_state.get("nodes", [])
    jobs = client_state.get("jobs", [])
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j["state"]] = counts.get(j["state"], 0) + 1
    running = [j for j in jobs if j["state"] == JobState.RUNNING]
    migs = sum(int(j.get("migrations") or 0) for j in jobs)
    n_fg = sum(1 for j in running if j.get("tier") == "fg")
    head = (
        f"[bold]vmctl demo[/] {info['elapsed']:.0f}/{info['duration']:.0f} s   speed {info['speed']:g}x   "
        f"policy {info['policy']}   submitted {info['submitted']}/{info['total']}\n"
        f"queued {counts.get(JobState.QUEUED, 0)}  running {len(running)} "
        f"(fg {n_fg}, bg {len(running) - n_fg})"
        f"  done {counts.get(JobState.DONE, 0)}  killed {counts.get(JobState.KILLED, 0)}"
        f"  failed {counts.get(JobState.FAILED, 0)}"
        f"   migrations {migs}\n"
        f"API {info['url']}   metrics {info['url']}/metrics (token in {info['token_path']})"
        + (f"\nagent metrics: {info['agent_metrics']}" if info.get("agent_metrics") else "")
    )
    nt = Table(title="nodes", expand=False)
    for c in ("node", "state", "cores", "fg busy", "bg busy", "util"):
        nt.add_column(c)
    for n in nodes:
        nt.add_row(str(n["name"]), str(n["state"]), str(n["cores"]), str(n["fg_busy"]), str(n["bg_busy"]),
                   fmt_pct(n.get("utilization")))
    jt = Table(title=f"running jobs ({len(running)})", expand=False)
    for c in ("id", "name", "tier", "procs", "placement", "mig"):
        jt.add_column(c)
    for j in running[:12]:
        jt.add_row(str(j["id"]), str(j.get("name") or ""), str(j.get("tier") or "-"), str(j["procs"]),
                   fmt_placement(j.get("placement")), str(j.get("migrations", 0)))
    events = info.get("events", [])[-5:]
    parts: list[Any] = [Panel(head), nt, jt]
    if events:
        parts.append(Panel("\n".join(events), title="events"))
    return Group(*parts)


# ----------------------------------------------------------------------------- the command


@dataclass
class DemoOptions:
    nodes: int = 3
    cores: int = 4
    jobs: int = 40
    duration: float = 120.0
    speed: float = 1000.0  # the default shape (3 x 4 cores, 40 jobs, seed 2) shows MEASY migrating
    policy: str = "measy"
    backend: str = "mock"
    libvirt_uri: str = "qemu:///system"
    seed: int = 2
    state_dir: str | None = None
    keep: bool = False
    live: bool = True
    migrate: bool = False


class Demo:
    def __init__(self, opts: DemoOptions, echo: Any = click.echo) -> None:
        self.o = opts
        self.echo = echo
        self.tmp_created = opts.state_dir is None
        self.state_dir = Path(opts.state_dir or tempfile.mkdtemp(prefix="vmctl-demo-"))
        self.daemon: DaemonProcess | None = None
        self.agents: list[ManagedProcess] = []
        self.agent_metrics: list[str] = []
        self.events: list[str] = []
        # mock hosts run on the accelerated clock (model time); real guests cannot, so with libvirt the
        # workload's times are compressed instead
        self.accelerated = opts.backend == "mock"
        self.migration_outcomes: dict[str, float] = {}  # the daemon's vmctl_migrations_total by outcome
        self.epoch = time.time()

    def clock_config(self) -> dict[str, float] | None:
        return {"speed": self.o.speed, "epoch": self.epoch} if self.accelerated else None

    # -- setup ----------------------------------------------------------------------------
    def start_cluster(self) -> ApiClient:
        o = self.o
        extra: dict[str, Any] = {"migration": {"timeout_s": 30.0}}
        grace = 1.0
        if self.accelerated:
            extra["clock"] = self.clock_config()
            grace = 2.0 * o.speed  # model seconds: two real seconds of reporting delay
        self.daemon = DaemonProcess(self.state_dir, policy=o.policy, estimate_grace_s=grace, extra=extra)
        self.daemon.start_and_wait()
        client = self.daemon.client()
        from vmctl.agents.config import parse_agent_config  # offline check of what we are about to run

        for i in range(o.nodes):
            node = f"node{i + 1}"
            pki = self.state_dir / "pki"
            from vmctl.cli.ops import write_cert_files

            crt, key, ca = write_cert_files(pki, node, client.issue_cert(node))
            port = free_port()
            cfg = agent_config(node, self.daemon.url, {"cert": str(crt), "key": str(key), "ca": str(ca)},
                               backend=o.backend, cores=o.cores, libvirt_uri=o.libvirt_uri, metrics_port=port,
                               peers=[f"node{k + 1}" for k in range(o.nodes)],
                               fabric_dir=str(self.state_dir / "fabric") if o.backend == "mock" else "",
                               clock=self.clock_config(), migration_seconds=max(1.0, 0.1 * o.speed),
                               state_file=str(self.state_dir / f"mock-{node}.state") if o.backend == "mock" else "")
            path = self.state_dir / f"agent-{node}.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
            try:
                parse_agent_config(cfg, str(path))
            except errors.ConfigError as exc:
                raise DemoError(what="vmctl-agent", problem=f"cannot be configured for the demo: {exc}") from exc
            argv = [sys.executable, "-m", "vmctl.agents.main", "--config", str(path)]
            agent = ManagedProcess(f"vmctl-agent {node}", argv, self.state_dir / f"agent-{node}.log")
            agent.start()
            self.agents.append(agent)
            self.agent_metrics.append(f"http://127.0.0.1:{port}/metrics")
        self.wait_nodes(client, o.nodes, timeout=60)
        return client

    def wait_nodes(self, client: ApiClient, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ready = [x for x in client.list_nodes() if x.get("state") == "ready"]
            if len(ready) >= n:
                return
            for a in self.agents:
                if not a.alive():
                    raise DemoError(what=a.name, problem=f"exited; see {a.log_path}{a.tail()}")
            if time.monotonic() > deadline:
                raise DemoError(what="agents", problem=f"{len(ready)} of {n} nodes registered after {timeout:.0f} s")
            time.sleep(0.2)

    # -- run ------------------------------------------------------------------------------
    def run(self) -> Summary:
        o = self.o
        planned = o.nodes * o.cores
        workload: list[DemoJob] = []
        info: dict[str, Any] = {}
        compress = not self.accelerated
        if o.backend == "mock":  # fail on a bad workload before starting anything
            workload, info = build_demo_workload(o.jobs, planned, o.speed, o.duration, o.seed, compress=compress)
        try:
            self.epoch = time.time()
            client = self.start_cluster()
            total = sum(int(n["cores"]) for n in client.list_nodes())
            if total != planned or not workload:
                workload, info = build_demo_workload(o.jobs, total, o.speed, o.duration, o.seed, compress=compress)
            self.echo(f"state dir {self.state_dir}; vmctld {self.daemon.url if self.daemon else ''} (pid "
                      f"{self.daemon.pid if self.daemon else ''}); {len(self.agents)} agents "
                      f"(pids {', '.join(str(a.pid) for a in self.agents)}); {len(workload)} {info['model']} jobs on "
                      f"{total} cores, clock at {o.speed:g}x" + ("" if self.accelerated else " (compressed workload)"))
            jobs = self.drive(client, workload)
            with contextlib.suppress(errors.VmctlError, OSError):
                self.migration_outcomes = migration_outcomes(client.metrics_text())
            summary = summarize(jobs, 1.0 if self.accelerated else o.speed)
            self.print_summary(summary, info)
            return summary
        finally:
            self.stop()

    def drive(self, client: ApiClient, workload: list[DemoJob]) -> list[dict[str, Any]]:
        o = self.o
        t0 = time.monotonic()
        submitted = 0
        state: dict[str, Any] = {"nodes": [], "jobs": []}
        info: dict[str, Any] = {"duration": o.duration, "speed": o.speed, "policy": o.policy, "total": len(workload),
                                "url": self.daemon.url if self.daemon else "", "events": self.events,
                                "token_path": str(self.daemon.token_path) if self.daemon else "",
                                "agent_metrics": ", ".join(self.agent_metrics[:2])
                                + (" ..." if len(self.agent_metrics) > 2 else "")}
        seen_mig: dict[str, int] = {}
        seen_nodes: dict[str, str] = {}
        migrated = False
        seen_tier: dict[str, str] = {}
        last_print = -10.0
        live_ctx: Any = contextlib.nullcontext()
        live: Any = None
        if o.live:
            from rich.live import Live

            live = Live(refresh_per_second=4, transient=False)
            live_ctx = live
        with live_ctx:
            while True:
                now = time.monotonic() - t0
                due = [j for j in workload[submitted:] if j.at <= now]
                if due:
                    client.submit_jobs([j.spec for j in due])
                    submitted += len(due)
                state["nodes"] = client.list_nodes()
                state["jobs"] = client.list_jobs(limit=max(1000, len(workload) + 10))
                for j in state["jobs"]:
                    jid = str(j["id"])
                    m = int(j.get("migrations") or 0)
                    nodes_now = fmt_nodes(j)
                    before = seen_nodes.get(jid)
                    if j["state"] == JobState.RUNNING and before and nodes_now not in ("-", before):
                        # the daemon decided a move to other nodes: the agents now carry it out
                        self.events.append(f"{now:6.1f}s  job {jid} migrating {before} -> {nodes_now}")
                    if m > seen_mig.get(jid, 0):
                        self.events.append(f"{now:6.1f}s  job {jid} migration done, on {nodes_now}")
                    seen_mig[jid] = m
                    if nodes_now != "-":
                        seen_nodes[jid] = nodes_now
                    tier = str(j.get("tier") or "")
                    if j["state"] == JobState.RUNNING and tier and seen_tier.get(jid) != tier:
                        if seen_tier.get(jid) == "bg" and tier == "fg":
                            self.events.append(f"{now:6.1f}s  job {jid} promoted bg -> fg")
                        elif tier == "bg" and jid not in seen_tier:
                            self.events.append(f"{now:6.1f}s  job {jid} started in the bg tier on {fmt_nodes(j)}")
                        seen_tier[jid] = tier
                if o.migrate and not migrated and now >= o.duration * 0.3:
                    migrated = self.operator_migration(client, state, now)
                info.update(elapsed=now, submitted=submitted)
                if live is not None:
                    live.update(render(state, info))
                elif now - last_print >= 5:
                    last_print = now
                    counts: dict[str, int] = {}
                    for j in state["jobs"]:
                        counts[j["state"]] = counts.get(j["state"], 0) + 1
                    self.echo(f"[{now:5.1f}s] submitted {submitted}/{len(workload)} "
                              + " ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                              + f" migrations {sum(seen_mig.values())}")
                finished = submitted == len(workload) and all(j["state"] in TERMINAL for j in state["jobs"])
                if finished or now > o.duration * 1.25:
                    break
                for a in self.agents:
                    if not a.alive():
                        raise DemoError(what=a.name, problem=f"died; see {a.log_path}{a.tail()}")
                if self.daemon is not None and not self.daemon.alive():
                    raise DemoError(what="vmctld", problem=f"died; see {self.daemon.log_path}{self.daemon.tail()}")
                time.sleep(0.25)
        if not o.live:
            for e in self.events[-10:]:
                self.echo(e)
        return list(state["jobs"])

    def operator_migration(self, client: ApiClient, state: dict[str, Any], now: float) -> bool:
        """What an operator would do with ``vmctl migrate JOB --to NODE``: move a running job that sits
        on one node to another node with enough idle fg cores. True once one was requested."""
        free = {str(n["name"]): int(n["cores"]) - int(n["fg_busy"]) for n in state["nodes"]
                if n.get("state") == "ready"}
        for j in state["jobs"]:
            nodes = {str(p.get("node")) for p in j.get("placement") or []}
            if j.get("state") != JobState.RUNNING or j.get("tier") != "fg" or len(nodes) != 1:
                continue
            src = next(iter(nodes))
            targets = [n for n, f in sorted(free.items()) if n != src and f >= int(j["procs"])]
            if not targets:
                continue
            try:
                op = client.migrate_job(str(j["id"]), targets[0])
            except errors.VmctlError as exc:
                self.events.append(f"{now:6.1f}s  vmctl migrate {j['id']} --to {targets[0]}: {exc.reference}: {exc}")
                continue
            self.events.append(f"{now:6.1f}s  vmctl migrate {j['id']} --to {targets[0]}: operation {op.get('id')} "
                               f"{op.get('state')}")
            return True
        return False

    def print_summary(self, s: Summary, info: dict[str, Any]) -> None:
        def f(x: float) -> str:
            return "-" if math.isnan(x) else f"{x:,.1f}"

        self.echo("")
        how = (f"daemon clock at {self.o.speed:g}x" if self.accelerated else f"real x {self.o.speed:g}")
        self.echo(f"summary ({info['jobs']} {info['model']} jobs, times in model seconds, {how}):")
        self.echo("  jobs by state: " + ", ".join(f"{k} {v}" for k, v in sorted(s.by_state.items())))
        self.echo(f"  mean response time: {f(s.mean_response)} s   mean wait: {f(s.mean_wait)} s")
        self.echo(f"  bounded slowdown (tau={BSLD_TAU:g} s): mean {f(s.mean_bsld)}, max {f(s.max_bsld)}")
        between = ", ".join(f"{k} {v:g}" for k, v in sorted(self.migration_outcomes.items())) or "none"
        self.echo(f"  migrations: {s.migrations} (jobs' counters, same-host re-pins included); "
                  f"between nodes: {between}")
        if info.get("capped_run_times"):
            self.echo(f"  note: {info['capped_run_times']} run times were capped to fit --duration")
        unfinished = sum(v for k, v in s.by_state.items() if k not in TERMINAL)
        if unfinished:
            self.echo(f"  note: {unfinished} jobs had not finished when the demo's time was up")

    def stop(self) -> None:
        for a in self.agents:
            a.terminate()
        for a in self.agents:
            a.stop()
        if self.daemon is not None:
            self.daemon.stop()
        if self.tmp_created and not self.o.keep:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        elif self.o.keep:
            self.echo(f"kept {self.state_dir} (logs, database, certificates)")


def migration_outcomes(metrics_text: str) -> dict[str, float]:
    """``vmctl_migrations_total{outcome="..."}`` of vmctld's /metrics: migrations between nodes by outcome."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("vmctl_migrations_total{"):
            continue
        labels, _, value = line.partition("} ")
        for part in labels.split("{", 1)[1].split(","):
            key, _, val = part.partition("=")
            if key.strip() == "outcome":
                with contextlib.suppress(ValueError):
                    out[val.strip().strip('"')] = out.get(val.strip().strip('"'), 0.0) + float(value)
    return out


def fmt_nodes(job: dict[str, Any]) -> str:
    nodes = sorted({str(p.get("node")) for p in job.get("placement") or [] if isinstance(p, dict)})
    return ",".join(nodes) or "-"


@click.command()
@click.option("--nodes", type=click.IntRange(1, 16), default=3, show_default=True, help="Agents (mock hosts).")
@click.option("--cores", type=click.IntRange(1, 64), default=4, show_default=True, help="Cores per mock host.")
@click.option("--jobs", type=click.IntRange(1, 5000), default=40, show_default=True, help="Jobs to submit.")
@click.option("--duration", type=click.FloatRange(5, 3600), default=120.0, show_default=True,
              help="Target run time of the demo in real seconds.")
@click.option("--speed", type=click.FloatRange(1, 100000), default=DemoOptions.speed, show_default=True,
              help="Accelerated clock of vmctld and the mock agents (model seconds per real second).")
@click.option("--policy", default="measy", show_default=True, help="Scheduling policy of vmctld.")
@click.option("--backend", type=click.Choice(["mock", "libvirt"]), default="mock", show_default=True)
@click.option("--libvirt-uri", default="qemu:///system", show_default=True, help="With --backend libvirt.")
@click.option("--seed", type=int, default=DemoOptions.seed, show_default=True)
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Keep state here (default: a temporary directory, removed at the end).")
@click.option("--keep", is_flag=True, help="Keep the temporary state directory (logs, DB).")
@click.option("--live/--no-live", default=None, help="Live view (default: on a terminal).")
@click.option("--migrate/--no-migrate", default=False, show_default=True,
              help="At 30% of the duration, also migrate a running job as an operator would (vmctl migrate).")
def demo(nodes: int, cores: int, jobs: int, duration: float, speed: float, policy: str, backend: str,
         libvirt_uri: str, seed: int, state_dir: str | None, keep: bool, live: bool | None, migrate: bool) -> None:
    """Run vmctld and mock agents on this machine and show a Feitelson workload running."""
    opts = DemoOptions(nodes=nodes, cores=cores, jobs=jobs, duration=duration, speed=speed, policy=policy,
                       backend=backend, libvirt_uri=libvirt_uri, seed=seed, state_dir=state_dir, keep=keep,
                       live=sys.stdout.isatty() if live is None else live, migrate=migrate)
    summary = Demo(opts).run()
    if summary.by_state.get(JobState.DONE, 0) == 0:
        raise DemoError(what="demo", problem="no job finished; see the logs (--keep)")
