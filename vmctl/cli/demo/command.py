"""``vmctl demo``: the command and the ``Demo`` that starts the cluster (daemon and agents as child
processes), drives the workload through the API, shows the live view and prints the summary."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

from vmctl import errors
from vmctl.apiclient import ApiClient
from vmctl.cli.demo import guests
from vmctl.cli.demo.summary import BSLD_TAU, Moves, Summary, count_moves, migration_lines, summarize
from vmctl.cli.demo.view import EventFeed, render
from vmctl.cli.demo.workload import DemoJob, build_demo_workload
from vmctl.errors import DemoError
from vmctl.localcluster import DaemonProcess, ManagedProcess, agent_config, free_port
from vmctl.model import JobState
from vmctl.sigterm import sigterm_as_interrupt

TERMINAL = (JobState.DONE, JobState.KILLED, JobState.FAILED, JobState.CANCELLED)


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
    guest_dir: str = str(guests.GUEST_DIR)


#: the shape of each backend's demo when --nodes / --cores / --jobs / --duration / --speed are not given:
#: the mock's 3 hosts x 4 cores at 1000x; on real libvirt 2 single-core nodes (each agent pinned to one of
#: this machine's cores, both on the one local libvirtd) and few enough jobs that their guests boot and
#: run in a few minutes (every job process boots a guest first: ~10 s under TCG on an idle 2-core machine,
#: 30-60 s on a loaded one), the workload's times divided by 100 (a model hour runs 36 s in its guest)
DEFAULTS: dict[str, dict[str, Any]] = {
    "mock": {"nodes": 3, "cores": 4, "jobs": 40, "duration": 120.0, "speed": 1000.0},
    "libvirt": {"nodes": 2, "cores": 1, "jobs": 6, "duration": 60.0, "speed": 100.0},
}
#: how long past --duration the libvirt demo waits for its jobs to end (real guests boot first)
LIBVIRT_EXTRA_S = 600.0


class Demo:
    def __init__(self, opts: DemoOptions, echo: Any = click.echo) -> None:
        self.o = opts
        self.echo = echo
        self.tmp_created = opts.state_dir is None
        self.state_dir = Path(opts.state_dir or tempfile.mkdtemp(prefix="vmctl-demo-"))
        self.daemon: DaemonProcess | None = None
        self.agents: list[ManagedProcess] = []
        self.agent_metrics: list[str] = []
        self.feed = EventFeed()
        self.events = self.feed.lines  # the event panel's lines (and what --no-live prints at the end)
        # mock hosts run on the accelerated clock (model time); real guests cannot, so with libvirt the
        # workload's times are compressed instead
        self.accelerated = opts.backend == "mock"
        self.moves: Moves | str = Moves()  # vmctld's migrate operations (between nodes), or why not known
        self.epoch = time.time()
        self.libvirt = opts.backend == "libvirt"
        self.node_names = [f"node{i + 1}" for i in range(opts.nodes)]
        self.libvirt_touched = False  # agents were started on libvirt: their domains are removed at the end
        self.domains_removed: list[str] = []
        self.domains_left: list[str] = []
        # real guests boot first and run in real time: the demo waits for them past --duration
        self.time_limit = opts.duration * 1.25 + (LIBVIRT_EXTRA_S if self.libvirt else 0.0)

    def clock_config(self) -> dict[str, float] | None:
        return {"speed": self.o.speed, "epoch": self.epoch} if self.accelerated else None

    # -- setup ----------------------------------------------------------------------------
    def start_cluster(self) -> ApiClient:
        o = self.o
        extra: dict[str, Any] = {"migration": {"timeout_s": 30.0}}
        grace = guests.ESTIMATE_GRACE_S if self.libvirt else 1.0  # real guests boot first (guests.py)
        if self.accelerated:
            extra["clock"] = self.clock_config()
            grace = 2.0 * o.speed  # model seconds: two real seconds of reporting delay
        self.daemon = DaemonProcess(self.state_dir, policy=o.policy, estimate_grace_s=grace, extra=extra)
        self.daemon.start_and_wait()
        client = self.daemon.client()
        from vmctl.agents.config import parse_agent_config  # offline check of what we are about to run

        ssh_bases = guests.ssh_port_blocks(o.nodes, o.cores) if self.libvirt else []
        for i, node in enumerate(self.node_names):
            pki = self.state_dir / "pki"
            from vmctl.files import write_cert_files

            crt, key, ca = write_cert_files(pki, node, client.issue_cert(node))
            port = free_port()
            cfg = agent_config(node, self.daemon.url, {"cert": str(crt), "key": str(key), "ca": str(ca)},
                               backend=o.backend, cores=o.cores, libvirt_uri=o.libvirt_uri, metrics_port=port,
                               peers=[f"node{k + 1}" for k in range(o.nodes)],
                               fabric_dir=str(self.state_dir / "fabric") if o.backend == "mock" else "",
                               clock=self.clock_config(), migration_seconds=max(1.0, 0.1 * o.speed),
                               state_file=str(self.state_dir / f"mock-{node}.state") if o.backend == "mock" else "")
            if self.libvirt:
                cfg = guests.libvirt_agent_config(cfg, Path(o.guest_dir), self.state_dir / f"known_hosts-{node}",
                                                  ssh_bases[i], guests.host_cores(i, o.cores, os.cpu_count() or 1))
            path = self.state_dir / f"agent-{node}.yaml"
            path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
            try:
                parse_agent_config(cfg, str(path))
            except errors.ConfigError as exc:
                raise DemoError(what="vmctl-agent", problem=f"cannot be configured for the demo: {exc}") from exc
            argv = [sys.executable, "-m", "vmctl.agents.main", "--config", str(path)]
            agent = ManagedProcess(f"vmctl-agent {node}", argv, self.state_dir / f"agent-{node}.log")
            self.libvirt_touched = self.libvirt_touched or self.libvirt
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
        command = guests.guest_command if self.libvirt else None
        if o.backend == "mock":  # fail on a bad workload before starting anything
            workload, info = build_demo_workload(o.jobs, planned, o.speed, o.duration, o.seed, compress=compress)
        # SIGTERM ends the demo as Ctrl-C does (through ``stop``: nothing is left behind)
        restore = contextlib.ExitStack()
        restore.enter_context(sigterm_as_interrupt())
        try:
            if self.libvirt:
                self.prepare_libvirt()
            self.epoch = time.time()
            client = self.start_cluster()
            total = sum(int(n["cores"]) for n in client.list_nodes())
            if total != planned or not workload:
                workload, info = build_demo_workload(o.jobs, total, o.speed, o.duration, o.seed, compress=compress,
                                                     command=command)
            self.echo(f"state dir {self.state_dir}; vmctld {self.daemon.url if self.daemon else ''} (pid "
                      f"{self.daemon.pid if self.daemon else ''}); {len(self.agents)} agents "
                      f"(pids {', '.join(str(a.pid) for a in self.agents)}); {len(workload)} {info['model']} jobs on "
                      f"{total} cores, clock at {o.speed:g}x" + ("" if self.accelerated else " (compressed workload)"))
            if self.daemon is not None:  # where to look while it runs (the live view shows it too)
                self.echo(f"API {self.daemon.url}; metrics {self.daemon.url}/metrics with the bearer token in "
                          f"{self.daemon.token_path} and the CA {self.daemon.ca_path}; agents' metrics "
                          + ", ".join(self.agent_metrics))
            jobs = self.drive(client, workload)
            try:
                self.moves = count_moves(client.list_operations(limit=100000))
            except (errors.VmctlError, OSError) as exc:
                self.moves = f"not known (GET /v1/operations: {exc})"
            summary = summarize(jobs, 1.0 if self.accelerated else o.speed)
            self.print_summary(summary, info)
            return summary
        finally:
            self.stop()
            restore.close()

    def prepare_libvirt(self) -> None:
        """Before anything starts: libvirtd answers, the SSH guest is built (or the cached build is
        reused), and libvirtd holds no VM with the demo's names."""
        o = self.o
        if o.migrate:
            raise DemoError(what="--migrate", problem="needs the mock backend: the libvirt demo's nodes share one "
                                                      "libvirtd, which cannot migrate a VM to itself")
        guests.check_libvirtd(o.libvirt_uri)
        guests.host_cores(0, o.cores, os.cpu_count() or 1)  # a clear error before building anything
        guests.build_guest(Path(o.guest_dir), self.echo)
        guests.check_no_leftovers(o.libvirt_uri, set(self.node_names))

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
        migrated = False
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
                self.feed.update(state["jobs"], now)
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
                              + f" migrations {sum(int(j.get('migrations') or 0) for j in state['jobs'])}")
                finished = submitted == len(workload) and all(j["state"] in TERMINAL for j in state["jobs"])
                if finished or now > self.time_limit:
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
        if isinstance(self.moves, str):
            self.echo(f"  migrations between nodes: {self.moves}; jobs' migration counters: {s.migrations}")
        else:
            for line in migration_lines(s, self.moves):
                self.echo(line)
        if info.get("capped_run_times"):
            self.echo(f"  note: {info['capped_run_times']} run times were capped to fit --duration")
        unfinished = sum(v for k, v in s.by_state.items() if k not in TERMINAL)
        if unfinished:
            self.echo(f"  note: {unfinished} jobs had not finished when the demo's time was up")

    def stop(self) -> None:
        """Stop the agents and vmctld (by pid), remove the libvirt domains of the demo's nodes, remove the
        temporary state directory. A second Ctrl-C or a SIGTERM while this runs does not cut it short."""
        masked: list[tuple[signal.Signals, Any]] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                masked.append((sig, signal.signal(sig, signal.SIG_IGN)))
        try:
            self._stop()
        finally:
            for sig, handler in masked:
                signal.signal(sig, handler)

    def _stop(self) -> None:
        for a in self.agents:
            a.terminate()
        for a in self.agents:
            a.stop()
        if self.daemon is not None:
            self.daemon.stop()
        if self.libvirt_touched:
            # the agents leave their VMs defined when they stop (an agent that restarts adopts them): the
            # demo's run is over, so nothing of it stays in libvirtd
            try:
                self.domains_removed, self.domains_left = guests.remove_demo_vms(self.o.libvirt_uri,
                                                                                 set(self.node_names))
            except DemoError as exc:
                self.domains_left = [f"? ({exc})"]
            self.echo(f"libvirt: removed {len(self.domains_removed)} domains of the demo's nodes; "
                      f"domains left: {len(self.domains_left)}"
                      + (f" ({', '.join(self.domains_left)})" if self.domains_left else ""))
        if self.tmp_created and not self.o.keep:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        elif self.o.keep:
            self.echo(f"kept {self.state_dir} (logs, database, certificates)")


@click.command()
@click.option("--nodes", type=click.IntRange(1, 16), default=None,
              help="Agents (hosts). [default: 3; --backend libvirt: 2, sharing the local libvirtd]")
@click.option("--cores", type=click.IntRange(1, 64), default=None,
              help="Cores per host. [default: 4; --backend libvirt: 1, a real core of this machine]")
@click.option("--jobs", type=click.IntRange(1, 5000), default=None, help="Jobs to submit. [default: 40; "
              "--backend libvirt: 6]")
@click.option("--duration", type=click.FloatRange(5, 3600), default=None,
              help="Target run time of the demo in real seconds (the workload is fitted to it; real guests "
                   "may take longer to boot and run). [default: 120; --backend libvirt: 60]")
@click.option("--speed", type=click.FloatRange(1, 100000), default=None,
              help="Accelerated clock of vmctld and the mock agents (model seconds per real second); "
                   "--backend libvirt: the workload's times are divided by it. [default: 1000; libvirt: 100]")
@click.option("--policy", default="measy", show_default=True, help="Scheduling policy of vmctld.")
@click.option("--backend", type=click.Choice(["mock", "libvirt"]), default="mock", show_default=True)
@click.option("--libvirt-uri", default="qemu:///system", show_default=True, help="With --backend libvirt.")
@click.option("--guest-dir", type=click.Path(file_okay=False), default=str(guests.GUEST_DIR), show_default=True,
              help="With --backend libvirt: where the SSH guest is built (reused when its inputs are unchanged).")
@click.option("--seed", type=int, default=DemoOptions.seed, show_default=True)
@click.option("--state-dir", type=click.Path(file_okay=False), default=None,
              help="Keep state here (default: a temporary directory, removed at the end).")
@click.option("--keep", is_flag=True, help="Keep the temporary state directory (logs, DB).")
@click.option("--live/--no-live", default=None, help="Live view (default: on a terminal).")
@click.option("--migrate/--no-migrate", default=False, show_default=True,
              help="At 30% of the duration, also migrate a running job as an operator would (vmctl migrate).")
def demo(nodes: int | None, cores: int | None, jobs: int | None, duration: float | None, speed: float | None,
         policy: str, backend: str, libvirt_uri: str, guest_dir: str, seed: int, state_dir: str | None, keep: bool,
         live: bool | None, migrate: bool) -> None:
    """Run vmctld and agents on this machine and show a Feitelson workload running: on mock hosts, or
    (--backend libvirt) in real guests of the local libvirtd, each job process over SSH in its own VM."""
    d = DEFAULTS[backend]
    opts = DemoOptions(nodes=d["nodes"] if nodes is None else nodes, cores=d["cores"] if cores is None else cores,
                       jobs=d["jobs"] if jobs is None else jobs,
                       duration=d["duration"] if duration is None else duration,
                       speed=d["speed"] if speed is None else speed, policy=policy, backend=backend,
                       libvirt_uri=libvirt_uri, seed=seed, state_dir=state_dir, keep=keep,
                       live=sys.stdout.isatty() if live is None else live, migrate=migrate, guest_dir=guest_dir)
    summary = Demo(opts).run()
    if summary.by_state.get(JobState.DONE, 0) == 0:
        raise DemoError(what="demo", problem="no job finished; see the logs (--keep)")
