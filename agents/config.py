"""The agent's YAML configuration (see the commented example ``etc/vmctl-agent.yaml``).

Every problem is a ``ConfigError`` naming the file and the key (``agent.yaml: layout.fg_weight: must
be <= 10000, got 20000``); unknown keys are rejected (typos are the most common config error); the
config is either fully valid or rejected.
"""

from __future__ import annotations

import ipaddress
import socket
import string
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN
from vmctl.agents.backends.mock import inbox_name
from vmctl.agents.layout import DEFAULT_NAMING, INACTIVE_MODES, MAX_LEVELS, check_naming, port_ranges_problem
from vmctl.auth import check_node_name
from vmctl.config import Section, load_yaml
from vmctl.errors import ValidationError
from vmctl.model import DEFAULT_NODE_GROUP, DEFAULT_NODE_SPEED, MAX_NODE_SPEED, Discipline, group_name_problem

BACKENDS = ("mock", "libvirt")
DISCIPLINES = tuple(d.value for d in Discipline)


@dataclass(frozen=True, slots=True)
class BackendConfig:
    kind: str = "mock"
    uri: str = ""  # libvirt connection URI; mock: fabric URI (default mock://<node>)
    cores: int = 2  # mock: cores of the simulated host
    memory_mib: int = 16384  # mock: memory of the simulated host
    fabric_dir: str = ""  # mock: shared directory through which agent processes migrate VMs; "" = none
    migration_seconds: float = 1.0  # mock: length of a live migration (clock seconds)
    poll_seconds: float = 0.2  # mock: settle the model this often (real s) and wake the agent; 0 = off
    # mock: the host's guests (VMs, job processes, migrations) live on in this file across agent restarts;
    # default <fabric_dir>/<uri as a file name>.state with a fabric_dir, else "" (in this process only)
    state_file: str = ""
    # libvirt on the QEMU driver: kvm or qemu (TCG); "" = kvm when the host offers it
    domain_type: str = ""


@dataclass(frozen=True, slots=True)
class LayoutConfig:
    cores: tuple[int, ...] | None = None  # physical cores to manage; None = all cores of the host
    naming: str = DEFAULT_NAMING
    fg_weight: int = WEIGHT_MAX
    bg_weight: int = WEIGHT_MIN
    memory_mib: int = 64
    image: str | None = None
    discipline: str = "priority"  # priority | timeslice (gang rows) | shared (equal workers, no placeholders)
    levels: int = 2  # VM levels per core, 1 .. MAX_LEVELS (2 = the MEASY fg/bg pair)
    inactive: str = "pause"  # timeslice: the inactive rows' VMs are paused, or "soak" at the lowest weight
    kernel: str | None = None  # libvirt: direct kernel boot of the guests (vmctl/guestimage.py builds one)
    initrd: str | None = None
    cmdline: str = ""
    ssh_ports: int | None = None  # libvirt: first loopback port forwarded to the guests' SSH (one per VM)
    # libvirt: first of shared_ssh_count loopback ports for the shared VMs (no slot), each given the lowest free one
    shared_ssh_ports: int | None = None
    shared_ssh_count: int = 16


@dataclass(frozen=True, slots=True)
class HostConfig:
    """What the agent tells vmctld about its host besides the cores: ``speed`` of one core relative to
    a standard core, ``group`` (the cluster or partition the node belongs to) and ``memory_mib`` (None:
    what the backend reports as the host's memory)."""

    speed: float = DEFAULT_NODE_SPEED
    group: str = DEFAULT_NODE_GROUP
    memory_mib: int | None = None


@dataclass(frozen=True, slots=True)
class ReconcileConfig:
    resync_seconds: float = 30.0
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 30.0
    max_passes: int = 4


@dataclass(frozen=True, slots=True)
class SshConfig:
    enabled: bool = False
    user: str = "root"
    port: int = 22
    key_file: str = ""
    known_hosts: str = ""
    connect_timeout_seconds: float = 10.0
    command_timeout_seconds: float = 86400.0
    address_pattern: str = "{vm}"  # guest address from the VM name
    state_dir: str = "/tmp/vmctl-jobs"  # job traces in the guest (adoption after an agent restart)
    boot_timeout_seconds: float = 120.0  # a guest the agent just booted: how long a job waits for its SSH
    guests: dict[str, str] = field(default_factory=dict)  # explicit VM name -> address


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """Where vmctld is: desired state by long-poll, observations by POST, both over mTLS."""

    url: str
    cert_file: str
    key_file: str
    ca_file: str
    wait_seconds: float = 30.0  # long-poll length
    timeout_seconds: float = 10.0


@dataclass(frozen=True, slots=True)
class AgentConfig:
    path: str
    node: str
    backend: BackendConfig = BackendConfig()
    layout: LayoutConfig = LayoutConfig()
    desired_file: str | None = None
    report_file: str | None = None
    reconcile: ReconcileConfig = ReconcileConfig()
    peers: dict[str, str] = field(default_factory=dict)
    migrate_uris: dict[str, str] = field(default_factory=dict)
    ssh: SshConfig = SshConfig()
    log_level: str = "info"
    daemon: DaemonConfig | None = None
    metrics_listen: str = ""  # host:port of the Prometheus endpoint; "" = none
    checkpoint_transfer: str = "shared"  # shared | sftp
    checkpoint_hosts: dict[str, str] = field(default_factory=dict)  # sftp: node -> host address
    clock_speed: float = 1.0  # clock: {speed}: model seconds per real second (mock backend only)
    clock_epoch: float | None = None  # clock: {epoch}: wall time where model time = wall time
    host: HostConfig = HostConfig()


def split_address(address: str, default_port: int) -> tuple[str, int]:
    """A guest's SSH address ``HOST``, ``HOST:PORT`` or ``[HOST]:PORT`` (IPv6: ``[::1]:PORT``) as (host,
    port); ``ValueError`` names what is wrong."""
    host, port = address, default_port
    if address.startswith("["):
        inner, sep, rest = address[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{address!r}: use HOST, HOST:PORT or [HOST]:PORT")
        host, rest = inner, rest[1:]
        if rest:
            port = _port(address, rest)
    elif address.count(":") == 1:
        host, raw = address.split(":")
        port = _port(address, raw)
    elif ":" in address:
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise ValueError(f"{address!r}: use HOST, HOST:PORT or [HOST]:PORT") from None
    if not host or any(c.isspace() for c in host):
        raise ValueError(f"{address!r}: no host name")
    return host, port


def _port(address: str, raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= 65535:
        raise ValueError(f"{address!r}: the port must be 1..65535")
    return int(raw)


def address_problem(address: str) -> str | None:
    """Why a guest's SSH address is unusable (:func:`split_address`), or None."""
    try:
        split_address(address, 22)
    except ValueError as exc:
        return str(exc)
    return None


def _address_pattern_problem(pattern: str) -> str | None:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None}
    except ValueError as exc:
        return f"not a valid pattern: {exc}"
    unknown = fields - {"vm", "port"}
    if unknown:
        return f"unknown field(s) {', '.join('{' + f + '}' for f in sorted(unknown))}; use {{vm}}, {{port}}"
    if not fields:
        return "must contain {vm} or {port} so that every VM gets its own address"
    return address_problem(pattern.format(vm="vm", port=22))


def load_agent_config(path: str | Path) -> AgentConfig:
    return parse_agent_config(load_yaml(path), str(path))


def _str_map(sec: Section, key: str) -> dict[str, str]:
    raw = sec.get(key, dict, {})
    out: dict[str, str] = {}
    for k, v in raw.items():
        if not isinstance(k, str) or not isinstance(v, str) or not v:
            raise sec.error(f"{key}.{k}", f"must map a name to a non-empty string, got {v!r}")
        out[k] = v
    return out


def parse_agent_config(data: dict[str, Any], path: str = "<agent config>") -> AgentConfig:
    top = Section(data, path)
    node = top.get("node", str, None) or socket.gethostname().split(".")[0]
    try:  # the one rule for node names: every valid name can get its agent a certificate
        check_node_name(node, "node")
    except ValidationError as exc:
        raise top.error("node", str(exc.fields["problem"]) + ("" if top.has("node") else
                                                             " (the host name; set node: in the config)")) from exc
    log_level = top.choice("log_level", ("debug", "info", "warning", "error"), "info")

    b = top.section("backend")
    kind = b.choice("kind", BACKENDS, "mock")
    backend = BackendConfig(kind=kind, uri=b.get("uri", str, ""), cores=b.integer("cores", 2, lo=1, hi=4096),
                            memory_mib=b.integer("memory_mib", 16384, lo=1),
                            fabric_dir=b.get("fabric_dir", str, ""),
                            migration_seconds=b.number("migration_seconds", 1.0, lo=0.0, hi=86400),
                            poll_seconds=b.number("poll_seconds", 0.2, lo=0.0, hi=3600),
                            state_file=b.get("state_file", str, ""),
                            domain_type=b.choice("domain_type", ("kvm", "qemu"), "") if b.has("domain_type") else "")
    if backend.domain_type and kind != "libvirt":
        raise b.error("domain_type", f"applies to the libvirt backend only (backend.kind is {kind})")
    if kind == "libvirt" and not backend.uri:
        raise b.error("uri", "is required for the libvirt backend (e.g. qemu:///system)")
    if kind != "mock":
        for key in ("fabric_dir", "migration_seconds", "poll_seconds", "state_file"):
            if b.has(key):
                raise b.error(key, f"applies to the mock backend only (backend.kind is {kind})")
    if backend.fabric_dir and not backend.fabric_dir.startswith("/"):
        raise b.error("fabric_dir", f"must be an absolute path, got {backend.fabric_dir!r}")
    if backend.state_file and not backend.state_file.startswith("/"):
        raise b.error("state_file", f"must be an absolute path, got {backend.state_file!r}")
    if kind == "mock" and backend.fabric_dir and not b.has("state_file"):
        uri = backend.uri or f"mock://{node}"
        backend = replace(backend, state_file=f"{backend.fabric_dir.rstrip('/')}/{inbox_name(uri)}.state")
    b.finish()

    clk = top.section("clock")
    clock_speed = clk.number("speed", 1.0, lo=0.001, hi=1e6)
    clock_epoch = clk.number("epoch", 0.0, lo=0, hi=1e11) if clk.has("epoch") else None
    if kind != "mock" and (clock_speed != 1.0 or clock_epoch is not None):
        raise clk.error("speed", f"an accelerated clock needs the mock backend (real guests run in real time; "
                        f"backend.kind is {kind})")
    clk.finish()

    lay = top.section("layout")
    cores: tuple[int, ...] | None = None
    raw = lay.get("cores", list, None)
    if raw is not None:
        if not raw:
            raise lay.error("cores", "must list at least one core (or be left out: all cores)")
        for i, c in enumerate(raw):
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise lay.error(f"cores[{i}]", f"must be a non-negative core id, got {c!r}")
        if len(set(raw)) != len(raw):
            raise lay.error("cores", f"lists a core twice: {raw}")
        cores = tuple(raw)
    naming = lay.get("naming", str, DEFAULT_NAMING)
    problem = check_naming(naming)
    if problem:
        raise lay.error("naming", problem)
    fg = lay.integer("fg_weight", WEIGHT_MAX, lo=WEIGHT_MIN, hi=WEIGHT_MAX)
    bg = lay.integer("bg_weight", WEIGHT_MIN, lo=WEIGHT_MIN, hi=WEIGHT_MAX)
    if fg <= bg:
        raise lay.error("fg_weight", f"must exceed bg_weight ({fg} <= {bg})")
    discipline = lay.choice("discipline", DISCIPLINES, "priority")
    levels = lay.integer("levels", 2, lo=1, hi=MAX_LEVELS)
    if discipline == "priority" and fg - bg < levels - 1:
        raise lay.error("levels", f"{levels} priority levels need {levels} distinct weights between bg_weight {bg} "
                                  f"and fg_weight {fg}")
    inactive = lay.choice("inactive", INACTIVE_MODES, "pause")
    if lay.has("inactive") and discipline != "timeslice":
        raise lay.error("inactive", f"applies to the timeslice discipline only (discipline is {discipline})")
    layout = LayoutConfig(cores=cores, naming=naming, fg_weight=fg, bg_weight=bg,
                          memory_mib=lay.integer("memory_mib", 64, lo=16), image=lay.get("image", str, None),
                          discipline=discipline, levels=levels, inactive=inactive,
                          kernel=lay.get("kernel", str, None), initrd=lay.get("initrd", str, None),
                          cmdline=lay.get("cmdline", str, ""),
                          ssh_ports=lay.integer("ssh_ports", lo=1024, hi=65535) if lay.has("ssh_ports") else None,
                          shared_ssh_ports=(lay.integer("shared_ssh_ports", lo=1024, hi=65535)
                                            if lay.has("shared_ssh_ports") else None),
                          shared_ssh_count=lay.integer("shared_ssh_count", 16, lo=1, hi=4096))
    if lay.has("shared_ssh_count") and layout.shared_ssh_ports is None:
        raise lay.error("shared_ssh_count", "needs layout.shared_ssh_ports (the first port of the shared VMs' range)")
    if layout.shared_ssh_ports is not None:
        # the slots' range is known here when the cores are listed (else the agent checks it at start-up)
        slots = levels * len(cores) if cores is not None else 0
        problem = port_ranges_problem(layout.shared_ssh_ports, layout.shared_ssh_count, layout.ssh_ports, slots)
        if problem:
            raise lay.error("shared_ssh_ports", problem)
    for key in ("image", "kernel", "initrd"):
        file = getattr(layout, key)
        if file is not None and not file.startswith("/"):
            raise lay.error(key, f"must be an absolute path, got {file!r}")
    if layout.initrd is not None and layout.kernel is None:
        raise lay.error("initrd", "needs layout.kernel (direct kernel boot)")
    if layout.cmdline and layout.kernel is None:
        raise lay.error("cmdline", "needs layout.kernel (direct kernel boot)")
    if "\n" in layout.cmdline:
        raise lay.error("cmdline", "must be one line")
    for key in ("kernel", "ssh_ports", "shared_ssh_ports"):
        if lay.has(key) and kind != "libvirt":
            raise lay.error(key, f"applies to the libvirt backend only (backend.kind is {kind})")
    lay.finish()

    hs = top.section("host")
    speed = hs.number("speed", DEFAULT_NODE_SPEED, lo=0.0, hi=MAX_NODE_SPEED)
    if speed <= 0:
        raise hs.error("speed", f"must be > 0 (relative to a standard core), got {speed}")
    group = hs.get("group", str, DEFAULT_NODE_GROUP)
    problem = group_name_problem(group)
    if problem:
        raise hs.error("group", f"{problem}, got {group!r}")
    memory_mib = hs.integer("memory_mib", lo=1, hi=1 << 40) if hs.get("memory_mib", int) is not None else None
    host = HostConfig(speed=speed, group=group, memory_mib=memory_mib)
    hs.finish()

    des = top.section("desired")
    desired_file = des.get("file", str, None)
    des.finish()
    rep = top.section("report")
    report_file = rep.get("file", str, None)
    rep.finish()

    rc = top.section("reconcile")
    reconcile = ReconcileConfig(
        resync_seconds=rc.number("resync_seconds", 30.0, lo=0.01, hi=86400),
        backoff_initial_seconds=rc.number("backoff_initial_seconds", 0.5, lo=0.001, hi=3600),
        backoff_max_seconds=rc.number("backoff_max_seconds", 30.0, lo=0.001, hi=86400),
        max_passes=rc.integer("max_passes", 4, lo=1, hi=100))
    if reconcile.backoff_max_seconds < reconcile.backoff_initial_seconds:
        raise rc.error("backoff_max_seconds", "must be >= backoff_initial_seconds")
    rc.finish()

    daemon = None
    if top.has("daemon") and data.get("daemon") is not None:
        dm = top.section("daemon")
        url = dm.get("url", str, required=True)
        if not url.startswith("https://"):
            raise dm.error("url", f"must be an https:// URL (agents authenticate with a certificate), got {url!r}")
        daemon = DaemonConfig(url=url.rstrip("/"), cert_file=dm.get("cert_file", str, required=True),
                              key_file=dm.get("key_file", str, required=True),
                              ca_file=dm.get("ca_file", str, required=True),
                              wait_seconds=dm.number("wait_seconds", 30.0, lo=0.5, hi=600),
                              timeout_seconds=dm.number("timeout_seconds", 10.0, lo=0.1, hi=600))
        dm.finish()
        if desired_file:
            raise top.error("desired.file", "cannot be used together with daemon (choose one source)")
    else:
        top.get("daemon", dict, None)
    mt = top.section("metrics")
    metrics_listen = mt.get("listen", str, "")
    if metrics_listen:
        _, sep, port_part = metrics_listen.rpartition(":")
        if not sep or not port_part.isdigit() or not 0 <= int(port_part) <= 65535:
            raise mt.error("listen", f"must be HOST:PORT (port 0..65535), got {metrics_listen!r}")
    mt.finish()

    peers = _str_map(top, "peers")
    migrate_uris = _str_map(top, "migrate_uris")
    for n in migrate_uris:
        if n not in peers:
            raise top.error(f"migrate_uris.{n}", "names a node that is not in peers")

    ck = top.section("checkpoints")
    checkpoint_transfer = ck.choice("transfer", ("shared", "sftp"), "shared")
    checkpoint_hosts = _str_map(ck, "hosts")
    if checkpoint_transfer == "sftp" and not checkpoint_hosts:
        raise ck.error("hosts", "must name the host of every migration target when transfer is sftp")
    ck.finish()

    s = top.section("ssh")
    ssh = SshConfig(
        enabled=s.get("enabled", bool, False), user=s.get("user", str, "root"),
        port=s.integer("port", 22, lo=1, hi=65535), key_file=s.get("key_file", str, ""),
        known_hosts=s.get("known_hosts", str, ""),
        connect_timeout_seconds=s.number("connect_timeout_seconds", 10.0, lo=0.1, hi=3600),
        command_timeout_seconds=s.number("command_timeout_seconds", 86400.0, lo=0.1, hi=1e9),
        address_pattern=s.get("address_pattern", str, "{vm}"), guests=_str_map(s, "guests"),
        state_dir=s.get("state_dir", str, "/tmp/vmctl-jobs"),
        boot_timeout_seconds=s.number("boot_timeout_seconds", 120.0, lo=0.0, hi=3600))
    if not ssh.state_dir.startswith("/"):
        raise s.error("state_dir", f"must be an absolute path in the guest, got {ssh.state_dir!r}")
    if ssh.enabled:
        if not ssh.key_file:
            raise s.error("key_file", "is required when ssh is enabled")
        if not ssh.known_hosts:
            raise s.error("known_hosts", "is required when ssh is enabled (host keys are always checked)")
    if checkpoint_transfer == "sftp" and not (ssh.key_file and ssh.known_hosts):
        raise s.error("key_file" if not ssh.key_file else "known_hosts",
                      "is required by checkpoints.transfer: sftp (SSH to the peer hosts)")
    problem = _address_pattern_problem(ssh.address_pattern)
    if problem:
        raise s.error("address_pattern", problem)
    if "{port}" in ssh.address_pattern and layout.ssh_ports is None and layout.shared_ssh_ports is None:
        raise s.error("address_pattern", "uses {port}, the guest's forwarded SSH port: set layout.ssh_ports "
                                         "(and layout.shared_ssh_ports for shared VMs)")
    for vm, address in ssh.guests.items():
        problem = address_problem(address)
        if problem:
            raise s.error(f"guests.{vm}", problem)
    s.finish()
    top.finish()
    return AgentConfig(path=path, node=node, backend=backend, layout=layout, desired_file=desired_file,
                       report_file=report_file, reconcile=reconcile, peers=peers, migrate_uris=migrate_uris,
                       ssh=ssh, log_level=log_level, daemon=daemon, metrics_listen=metrics_listen,
                       checkpoint_transfer=checkpoint_transfer, checkpoint_hosts=checkpoint_hosts,
                       clock_speed=clock_speed, clock_epoch=clock_epoch, host=host)
