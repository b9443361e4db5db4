"""``vmctl-agent``: the node agent's console script.

    vmctl-agent --config /etc/vmctl/agent.yaml            # reconcile forever
    vmctl-agent --config agent.yaml --once                # one cycle, print the observation (JSON)
    vmctl-agent --config agent.yaml --desired d.yaml      # desired state from a file (the seam)

Exit codes as for ``vmctl`` (``vmctl.errors.exit_code_for``): 2 bad config or desired state,
6 hypervisor unavailable, 7 an operation failed (``--once`` only: a cycle with errors exits 7).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from vmctl.agents.backends.base import HypervisorBackend, ProcessRunner
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.config import AgentConfig, load_agent_config
from vmctl.agents.layout import META_SSH_PORT, Layout, memory_problem, port_ranges_problem
from vmctl.agents.reconciler import Backoff, Reconciler, ReconcileResult
from vmctl.agents.sources import DesiredStateSource, FileReporter, FileSource, MemorySource, Reporter
from vmctl.clock import Clock, SystemClock, accelerated_clock
from vmctl.errors import ConfigError, HypervisorUnavailable, ValidationError, VmctlError, VmNotFound, exit_code_for
from vmctl.model import Discipline
from vmctl.nodedoc import NodeObserved
from vmctl.wire import observed_to_json

log = logging.getLogger("vmctl.agent")
#: seconds an agent that was asked to exit waits for the VM stops under way (off its reconcile pass); below
#: the unit's TimeoutStopSec (30 s)
STOP_DRAIN_S = 20.0


@dataclass
class Agent:
    config: AgentConfig
    backend: HypervisorBackend
    reconciler: Reconciler
    http_source: Any = None  # the daemon's HttpSource when the agent talks to vmctld
    liveness: Any = None  # its contact with vmctld (http_source.Liveness: heartbeats, self-fencing)


class _Both:
    """Report to the daemon and to a file."""

    def __init__(self, first: Reporter, second: Reporter) -> None:
        self.first, self.second = first, second

    def report(self, observed: NodeObserved) -> None:
        try:
            self.first.report(observed)
        finally:
            self.second.report(observed)


def _http_endpoint(cfg: AgentConfig) -> Any:
    from vmctl.agents.http_source import AgentEndpoint

    d = cfg.daemon
    assert d is not None
    for key in ("cert_file", "key_file", "ca_file"):
        path = getattr(d, key)
        if not os.path.isfile(path):
            raise ConfigError(path=cfg.path, where=f"daemon.{key}", problem=f"{path} does not exist or is not a file")
    ep = AgentEndpoint(d.url, cfg.node, d.cert_file, d.key_file, d.ca_file, timeout_s=d.timeout_seconds)
    from vmctl.agents.credentials import finish_renewal

    try:  # a renewal a crash interrupted between its renames (vmctl.agents.credentials)
        finish_renewal(ep)
    except OSError as exc:
        raise ConfigError(path=cfg.path, where="daemon.cert_file",
                          problem=f"cannot finish an interrupted certificate renewal: {exc}") from exc
    try:  # a CA, certificate or key that cannot be used fails here, named, before any thread starts
        ep.ssl_context()
    except ValidationError as exc:
        raise ConfigError(path=cfg.path, where=exc.fields["field"], problem=exc.fields["problem"]) from exc
    return ep


def make_backend(cfg: AgentConfig) -> HypervisorBackend:
    b = cfg.backend
    if b.kind == "mock":
        return MockBackend(hostname=cfg.node, cores=b.cores, memory_mib=b.memory_mib, clock=agent_clock(cfg),
                           uri=b.uri or None, fabric_dir=b.fabric_dir or None, migration_seconds=b.migration_seconds,
                           poll_seconds=b.poll_seconds or None, state_file=b.state_file or None,
                           speed=cfg.host.speed)
    try:
        module = importlib.import_module("vmctl.agents.backends.libvirt.backend")
    except ImportError as exc:
        raise HypervisorUnavailable(backend="libvirt", uri=b.uri,
                                    problem=f"the libvirt backend cannot be loaded: {exc}") from exc
    factory: Any = getattr(module, "LibvirtBackend", None)
    if factory is None:
        raise HypervisorUnavailable(backend="libvirt", uri=b.uri, problem="this vmctl has no LibvirtBackend")
    backend = factory(uri=b.uri, domain_type=b.domain_type or None)
    assert isinstance(backend, HypervisorBackend)
    return backend


def agent_clock(cfg: AgentConfig) -> Clock:
    """The agent's clock (``clock: {speed, epoch}``; the mock's processes run in its time)."""
    return accelerated_clock(cfg.clock_speed, cfg.clock_epoch)


def _ssh_settings(cfg: AgentConfig) -> Any:
    from vmctl.agents.remote import SshSettings

    s = cfg.ssh
    return SshSettings(user=s.user, key_file=s.key_file, known_hosts=s.known_hosts, port=s.port,
                       connect_timeout=s.connect_timeout_seconds, command_timeout=s.command_timeout_seconds,
                       state_dir=s.state_dir, boot_timeout=s.boot_timeout_seconds)


def make_transfer(cfg: AgentConfig) -> Callable[[str, str, str], int] | None:
    """``checkpoints.transfer: sftp``: copy checkpoint files to the target node's host over SFTP."""
    if cfg.checkpoint_transfer != "sftp":
        return None
    from vmctl.agents.remote import ParamikoRunner

    runner = ParamikoRunner(_ssh_settings(cfg))
    hosts = dict(cfg.checkpoint_hosts)

    def transfer(src: str, node: str, dst: str) -> int:
        host = hosts.get(node)
        if host is None:
            raise ConfigError(path=cfg.path, where=f"checkpoints.hosts.{node}",
                              problem=f"is missing: no host to copy the checkpoint {src} to")
        return runner.transfer_checkpoint(src, host, dst)

    return transfer


def make_runner(cfg: AgentConfig, backend: HypervisorBackend,
                on_end: Callable[[], None] | None = None,
                on_start: Callable[[], None] | None = None) -> ProcessRunner | None:
    """The agent's process runner: over SSH into the guests (``ssh.enabled``; a guest's address is
    ``ssh.guests[vm]`` or ``ssh.address_pattern`` with ``{vm}`` and ``{port}``, the loopback port the
    layout forwards to that VM's SSH, read from the VM's metadata), else the mock's simulated processes.
    ``on_end``/``on_start``: called when a job process in a guest ends / runs (the agent wakes to report it)."""
    if cfg.ssh.enabled:
        from vmctl.agents.remote import ParamikoRunner

        guests = dict(cfg.ssh.guests)
        pattern = cfg.ssh.address_pattern

        def address_of(vm: str) -> str:
            if vm in guests:
                return guests[vm]
            port: str | None = None
            if "{port}" in pattern:
                port = next((v.metadata.get(META_SSH_PORT) for v in backend.list_vms() if v.name == vm), None)
                if port is None:
                    raise VmNotFound(backend=f"{backend.name} (with a forwarded SSH port, layout.ssh_ports or "
                                             "layout.shared_ssh_ports)", name=vm)
            return pattern.format(vm=vm, port=port)

        return ParamikoRunner(_ssh_settings(cfg), address_of, on_end, on_start)
    if isinstance(backend, MockBackend):
        return MockProcessRunner(backend)
    return None


def _shared_ports(cfg: AgentConfig, cores: tuple[int, ...]) -> dict[str, Any]:
    """The layout's shared VMs' SSH port range, checked against the slots' range of the host's actual cores
    (the config check could not, when ``layout.cores`` is left out)."""
    lc = cfg.layout
    if lc.shared_ssh_ports is None:
        return {}
    problem = port_ranges_problem(lc.shared_ssh_ports, lc.shared_ssh_count, lc.ssh_ports, lc.levels * len(cores))
    if problem:
        raise ConfigError(path=cfg.path, where="layout.shared_ssh_ports", problem=problem)
    return {"shared_ssh_ports": lc.shared_ssh_ports, "shared_ssh_count": lc.shared_ssh_count}


def build_agent(cfg: AgentConfig, desired: str | None = None, report: str | None = None,
                backend: HypervisorBackend | None = None) -> Agent:
    """Assemble backend, layout, source, reporter and reconciler from a config (``desired`` and
    ``report`` override the config's files)."""
    backend = backend if backend is not None else make_backend(cfg)
    cores = cfg.layout.cores
    if cores is None:
        cores = tuple(range(backend.host_info().cores))
    else:
        host_cores = backend.host_info().cores
        bad = [c for c in cores if c >= host_cores]
        if bad:
            raise ConfigError(path=cfg.path, where="layout.cores",
                              problem=f"core {bad[0]} does not exist: {cfg.node} has {host_cores} cores")
    lc = cfg.layout
    layout = Layout(host=cfg.node, cores=cores, naming=lc.naming, fg_weight=lc.fg_weight, bg_weight=lc.bg_weight,
                    memory_mib=lc.memory_mib, image=lc.image, levels=lc.levels, discipline=Discipline(lc.discipline),
                    inactive=lc.inactive, kernel=lc.kernel, initrd=lc.initrd, cmdline=lc.cmdline,
                    ssh_ports=lc.ssh_ports, **_shared_ports(cfg, cores))
    # memory admission: refuse a layout whose L x C VMs the host cannot hold
    host_memory = cfg.host.memory_mib if cfg.host.memory_mib is not None else backend.host_info().memory_mib
    problem = memory_problem(layout.levels, layout.size, layout.memory_mib, host_memory)
    if problem:
        raise ConfigError(path=cfg.path, where="layout.levels", problem=problem)
    source: DesiredStateSource
    reporter: Reporter | None
    http: Any = None
    liveness: Any = None
    if desired is None and cfg.daemon is not None:
        http = _http_endpoint(cfg)
        from vmctl.agents.http_source import HttpReporter, HttpSource, Liveness

        source = HttpSource(http, wait_s=cfg.daemon.wait_seconds)
        liveness = Liveness()
        reporter = HttpReporter(http, liveness)
    else:
        desired_file = desired or cfg.desired_file
        source = FileSource(desired_file) if desired_file else MemorySource(None)
        reporter = None
    report_file = report or cfg.report_file
    if report_file:
        reporter = FileReporter(report_file) if reporter is None else _Both(reporter, FileReporter(report_file))
    rc = cfg.reconcile
    clock = backend.clock if isinstance(backend, MockBackend) else SystemClock()  # CPU time and samples agree
    wake: list[Callable[[], None]] = []  # the reconciler's, once it exists: a guest's job started or ended
    runner = make_runner(cfg, backend, on_end=lambda: wake[0]() if wake else None,
                         on_start=lambda: wake[0]() if wake else None)
    reconciler = Reconciler(backend, layout, source, reporter, clock=clock, runner=runner,
                            peers=cfg.peers, migrate_uris=cfg.migrate_uris, resync_seconds=rc.resync_seconds,
                            backoff=Backoff(initial=rc.backoff_initial_seconds, maximum=rc.backoff_max_seconds),
                            max_passes=rc.max_passes, transfer=make_transfer(cfg),
                            checkpoint_peers=cfg.checkpoint_hosts if cfg.checkpoint_transfer == "sftp" else None,
                            host_memory_mib=host_memory)
    wake.append(reconciler.wake)
    if liveness is not None:
        reconciler.fence = liveness.fenced
    return Agent(cfg, backend, reconciler, source if http is not None else None, liveness)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False),
              help="agent YAML config (see etc/vmctl-agent.yaml)")
@click.option("--once", is_flag=True, help="run one reconcile cycle, print the observation as JSON, exit")
@click.option("--desired", type=click.Path(dir_okay=False), default=None,
              help="read the desired state from this YAML/JSON file (overrides desired.file)")
@click.option("--report", type=click.Path(dir_okay=False), default=None,
              help="write observations to this JSON file (overrides report.file)")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default=None)
def cli(config_path: str, once: bool, desired: str | None, report: str | None, log_level: str | None) -> None:
    """vmctl node agent: keeps this host's two-tier VMs as the daemon wants them."""
    cfg = load_agent_config(config_path)
    logging.basicConfig(level=(log_level or cfg.log_level).upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    agent = build_agent(cfg, desired, report)
    try:
        if once:
            res = agent.reconciler.run_once()
            if res.observed is not None:
                click.echo(json.dumps(observed_to_json(res.observed), indent=1))
            for e in res.errors:
                click.echo(f"error: {e}", err=True)
            if res.errors:
                sys.exit(7)
            return
        stop = threading.Event()

        def _stop(signum: int, frame: object) -> None:
            log.info("signal %d: stopping", signum)
            stop.set()
            agent.reconciler.wake()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        serve(agent, stop)
    finally:
        agent.backend.close()


def host_registration(cfg: AgentConfig, backend: HypervisorBackend) -> tuple[float, str, int]:
    """What the agent registers about its host besides the cores: the configured speed and group, and
    the configured memory or else what the backend reports as the host's memory."""
    hc = cfg.host
    return hc.speed, hc.group, hc.memory_mib if hc.memory_mib is not None else backend.host_info().memory_mib


def layout_registration(layout: Layout) -> dict[str, Any]:
    """What the agent registers about its VM level layout: levels per core and their discipline."""
    return {"levels": layout.levels, "discipline": layout.discipline.value}


def serve(agent: Agent, stop: threading.Event) -> None:
    """The long-running agent: register with vmctld (when configured), long-poll its desired state,
    reconcile until ``stop``; Prometheus metrics when ``metrics.listen`` is set; sd_notify READY after
    the first successful relist and WATCHDOG while cycles keep completing."""
    from vmctl.metrics import AgentMetrics
    from vmctl.sdnotify import Notifier

    cfg, rec = agent.config, agent.reconciler
    last: dict[str, Any] = {"obs": None, "t": time.monotonic(), "ready": False}
    metrics = AgentMetrics(lambda: last["obs"])
    if cfg.metrics_listen:
        host, _, port = cfg.metrics_listen.rpartition(":")
        try:
            bound = metrics.serve(int(port), addr=host or "127.0.0.1")
        except OSError as exc:
            raise ConfigError(path=cfg.path, where="metrics.listen", problem=f"cannot listen: {exc}") from exc
        log.info("metrics on %s:%d", host or "127.0.0.1", bound)
    notifier = Notifier()
    src = agent.http_source
    heartbeat: Any = None
    try:
        if src is not None:
            delay = 0.5
            while not stop.is_set():
                try:
                    speed, group, memory = host_registration(cfg, agent.backend)
                    src.register(cores=rec.layout.size, hostname=socket.gethostname(), backend=agent.backend.name,
                                 peers=rec.peers, checkpoint_peers=rec.checkpoint_peers, speed=speed,
                                 group=group, memory_mib=memory, **layout_registration(rec.layout))
                    break
                except VmctlError as exc:
                    metrics.daemon_error()
                    log.warning("register with %s: %s (retrying in %.1f s)", cfg.daemon.url if cfg.daemon else "",
                                exc, delay)
                    stop.wait(delay)
                    delay = min(cfg.reconcile.backoff_max_seconds, delay * 2)
            src.start(on_change=rec.wake)
            if agent.liveness is not None:
                from vmctl.agents.credentials import CertRenewer
                from vmctl.agents.http_source import Heartbeat

                def fence() -> None:
                    rec.fence_vms()
                    rec.wake()

                # its own thread and connection: the node stays alive in vmctld's eyes whatever the
                # reconcile loop does; the interval and the fence period come from vmctld's answers
                # the heartbeat answer also says when to renew the certificate or the CA bundle (a CA
                # rotation): done over the same mTLS channel (vmctl.agents.credentials)
                heartbeat = Heartbeat(src.ep, agent.liveness, on_fence=fence, on_contact=rec.wake,
                                      on_answer=CertRenewer(src.ep).handle)
                heartbeat.beat()
                heartbeat.start()
        limit = 3 * max(rec.resync_seconds, cfg.reconcile.backoff_max_seconds)
        notifier.start_watchdog(lambda: time.monotonic() - float(last["t"]) < limit)

        def on_cycle(res: ReconcileResult | None, seconds: float) -> None:
            ok = res is not None and not any(e.startswith("observe:") for e in res.errors)
            metrics.observe_reconcile(seconds, ok)
            last["t"] = time.monotonic()
            if res is None:
                return
            if res.observed is not None:
                last["obs"] = res.observed
            for a in res.applied:
                metrics.action(a.kind)
            for a in res.failed:
                metrics.action(a.kind, "failed")
            if any(e.startswith(("desired: daemon", "report: daemon")) for e in res.errors):
                metrics.daemon_error()
            if ok and not last["ready"]:
                last["ready"] = True
                notifier.ready(f"node {cfg.node}: {rec.layout.size} cores")
                ports = rec.layout.port_text()
                log.info("agent %s ready: %d cores, backend %s%s", cfg.node, rec.layout.size, agent.backend.name,
                         f", forwarded SSH ports: {ports}" if ports else "")

        rec.on_switch = metrics.row_switch
        rec.run(stop, on_cycle=on_cycle)
        if not rec.wait_stops(STOP_DRAIN_S):  # a stop under way ends on libvirtd's side anyway
            log.warning("exiting with a VM stop still under way (%s): the next start finishes it",
                        ", ".join(sorted(rec.stops_under_way())))
    finally:
        notifier.stopping()
        notifier.close()
        if heartbeat is not None:
            heartbeat.stop()
        if src is not None:
            src.stop()
        metrics.close()


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="vmctl-agent", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except VmctlError as exc:
        click.echo(f"error: {exc.reference}: {exc}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        sys.exit(exit_code_for(exc))


if __name__ == "__main__":  # pragma: no cover
    main()
