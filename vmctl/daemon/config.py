"""The daemon's YAML configuration (``vmctld --config FILE``); see ``etc/vmctld.yaml``."""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmctl.config import Section, check_finite, load_yaml, parse_yaml
from vmctl.errors import ConfigError, VmctlError
from vmctl.model import Discipline
from vmctl.policies.base import Offer

#: the job shapes vmctld runs: rigid jobs, moldable ones at the width the policy starts them with (their
#: time at that width over the node speed; suspended and resumed like any job), and task bags
#: (``vmctl.daemon.dispatcher`` hands their tasks to their workers; Resize applied at task boundaries)
DAEMON_SHAPES = frozenset({"rigid", "moldable", "task-bag"})
#: what vmctld offers a policy before any node registered: 2 VM levels per core under the priority
#: discipline (fg/bg), rigid, moldable and task-bag jobs, capped shared VMs (vcsched). Once agents
#: registered, the cluster's own layout counts (``ClusterState.offer``): a policy it cannot serve is
#: refused when configured, switched to, or when a first node's registration would leave it without what it needs.
DAEMON_OFFER = Offer(where="vmctld", levels=2, discipline=Discipline.PRIORITY, shapes=DAEMON_SHAPES, shared_vms=True)


def check_policy_config(policy: Any) -> None:
    """The config-time check of a policy's needs, before the cluster is known: vmctld can serve it on the
    layout it lays the cluster out in for it (``Needs.layout``: 3 timeslice levels for ``gs-m`` with
    ``mpl: 3``), and an agent can carry that layout (at most 8 levels). Which layout the registered agents
    have does not matter here: vmctld starts and waits for nodes in that layout (docs/daemon.md, "Switching
    the policy family")."""
    from vmctl.daemon.switch_state import policy_layout

    layout = policy_layout(policy)
    Offer(where=f"vmctld ({layout.text()})", levels=layout.levels, discipline=layout.discipline,
          shapes=DAEMON_SHAPES, shared_vms=True).check(policy)


@dataclass(frozen=True, slots=True)
class MigrationLimits:
    max_per_host: int = 1  # concurrent migrations touching one host (as source or target)
    max_per_cluster: int = 4
    min_gain_s: float = 0.0  # minimum expected gain (seconds) before a policy migration is carried out
    dry_run: bool = False  # log decisions, act on nothing
    timeout_s: float = 600.0  # a migration not confirmed by then is rolled back


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """``retention:``: how long finished jobs (done, killed, failed, cancelled) stay in daemon memory."""

    enabled: bool = True  # False: finished jobs are kept in memory forever (the behaviour before retention)
    keep_s: float = 7 * 86400.0  # a finished job is pruned this long (model seconds) after it ended
    keep_count: int = 10000  # and at most this many finished jobs stay in memory (the oldest go first)
    archive: bool = True  # True: pruned jobs move to the store's job_archive table; False: deleted
    max_per_pass: int = 1000  # at most this many jobs pruned per housekeeping pass (bounded work)


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    path: str = "<defaults>"
    store_url: str = "sqlite:///var/lib/vmctl/vmctld.db"
    #: the SQLite integrity check at start stops after this many real seconds (0: no limit)
    store_check_timeout_s: float = 30.0
    state_dir: str = "/var/lib/vmctl"
    listen: str = "127.0.0.1"
    port: int = 8443
    server_names: tuple[str, ...] = ("localhost", "127.0.0.1")
    max_body_bytes: int = 1 << 20
    max_connections: int = 4096  # client connections open at once (and never more than the open-file limit allows)
    handshake_timeout_s: float = 10.0  # a client's TLS handshake must finish within this (real seconds)
    keepalive_timeout_s: float = 75.0  # an idle client connection is closed after this (real seconds)
    # POST /v1/plan (vmctl.api.planning): worker processes, plans in progress per token and in all (429 beyond)
    plan_workers: int = 1
    plan_per_token: int = 1
    plan_queue: int = 4
    # the admin token written on the first start (mode 0600, never overwritten); default <state_dir>/admin.token
    bootstrap_token_file: str | None = "/var/lib/vmctl/admin.token"
    # notes on deprecated keys the config file used (logged at start, printed by `vmctl config check`)
    deprecations: tuple[str, ...] = ()
    policy_name: str = "measy"
    policy_params: dict[str, Any] = field(default_factory=dict)
    policy_explicit: bool = False  # False: fall back to a registered policy when the default is missing
    tick_s: float = 5.0
    min_interval_s: float = 0.02  # at most one event-driven decision per this interval (bursts coalesce)
    heartbeat_s: float = 5.0  # agents send a heartbeat this often (told in every heartbeat answer)
    node_timeout_s: float = 30.0  # no heartbeat for this long: the node is lost (unschedulable, keeps its jobs)
    fence_s: float = 120.0  # an agent without contact for this long pauses its job VMs (self-fencing)
    node_down_s: float = 300.0  # no heartbeat for this long: the node is down and its jobs are requeued
    kill_at_estimate: bool = True
    estimate_grace_s: float = 60.0
    lease_ttl_s: float = 10.0
    holder: str = ""
    fg_weight: int = 10000
    bg_weight: int = 1
    vm_memory_mib: int = 64
    checkpoint_dir: str = "/var/lib/vmctl/checkpoints"
    migration: MigrationLimits = field(default_factory=MigrationLimits)
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    log_level: str = "info"
    clock_speed: float = 1.0  # clock: {speed}: model seconds per real second (accelerated demos)
    clock_epoch: float | None = None  # clock: {epoch}: wall time where model time = wall time

    @property
    def ca_pem_path(self) -> Path:
        return Path(self.state_dir) / "ca.pem"


def default_holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def load_config(path: str | Path) -> DaemonConfig:
    return config_from_dict(load_yaml(path), str(path))


def parse_config(text: str, path: str = "<string>") -> DaemonConfig:
    return config_from_dict(parse_yaml(text, path), path)


def config_from_dict(data: dict[str, Any], path: str) -> DaemonConfig:
    top = Section(data, path)
    d = DaemonConfig()
    st = top.section("store")
    state_dir = top.get("state_dir", str, d.state_dir)
    store_url = st.get("url", str, f"sqlite:///{state_dir}/vmctld.db")
    check_timeout_s = st.number("check_timeout_s", d.store_check_timeout_s, lo=0, hi=86400)
    st.finish()
    if not store_url.startswith(("sqlite:", "postgresql://", "postgres://", "/")) and "://" in store_url:
        raise st.error("url", f"unsupported store {store_url!r}: use sqlite:///PATH or postgresql://...")

    api = top.section("api")
    listen = api.get("listen", str, d.listen)
    port = api.integer("port", d.port, lo=0, hi=65535)
    names_raw = api.get("server_names", list, list(d.server_names))
    for i, n in enumerate(names_raw):
        if not isinstance(n, str) or not n:
            raise api.error(f"server_names[{i}]", "must be a non-empty string")
    max_body = api.integer("max_body_bytes", d.max_body_bytes, lo=1024, hi=1 << 30)
    max_conns = api.integer("max_connections", d.max_connections, lo=16, hi=1 << 20)
    handshake_s = api.number("handshake_timeout_s", d.handshake_timeout_s, lo=0.1, hi=600)
    keepalive_s = api.number("keepalive_timeout_s", d.keepalive_timeout_s, lo=1, hi=86400)
    plan_workers = api.integer("plan_workers", d.plan_workers, lo=1, hi=64)
    plan_per_token = api.integer("plan_per_token", d.plan_per_token, lo=1, hi=64)
    plan_queue = api.integer("plan_queue", d.plan_queue, lo=1, hi=1024)
    token_file = api.get("bootstrap_token_file", str, f"{state_dir}/admin.token")
    if not token_file:
        raise api.error("bootstrap_token_file", "must be a file path (default: <state_dir>/admin.token)")
    api.finish()

    pol = top.section("policy")
    deprecations: list[str] = []
    if pol.has("kind"):
        # deprecated: vmctld now checks each policy's declared needs against what it offers (levels,
        # discipline, shapes, shared VMs), so a mode that restricts the policy list is not needed
        old = pol.choice("kind", ("scheduling", "vcsched"), "scheduling")
        deprecations.append(f"{path}: policy.kind ({old}) is deprecated and ignored: vmctld refuses a policy "
                            "whose needs the cluster cannot meet; remove the key")
    pol_explicit = pol.has("name")
    name = pol.get("name", str, d.policy_name)
    params = pol.get("params", dict, {})
    check_finite(params, path, "policy.params")  # every number finite (a NaN passes range checks)
    pol.finish()

    loop = top.section("loop")
    tick = loop.number("tick_s", d.tick_s, lo=0.01, hi=3600)
    min_interval = loop.number("min_interval_s", d.min_interval_s, lo=0.0, hi=10.0)
    node_timeout = loop.number("node_timeout_s", d.node_timeout_s, lo=0.1, hi=86400)
    heartbeat, fence_s, node_down = _liveness(loop, d, node_timeout)
    kill_at = loop.get("kill_at_estimate", bool, d.kill_at_estimate)
    grace = loop.number("estimate_grace_s", d.estimate_grace_s, lo=0, hi=1e9)
    loop.finish()

    lease = top.section("lease")
    ttl = lease.number("ttl_s", d.lease_ttl_s, lo=0.5, hi=3600)
    holder = lease.get("holder", str, "") or default_holder()
    lease.finish()

    vm = top.section("vm")
    fg_w = vm.integer("fg_weight", d.fg_weight, lo=1, hi=10000)
    bg_w = vm.integer("bg_weight", d.bg_weight, lo=1, hi=10000)
    if bg_w >= fg_w:
        raise vm.error("bg_weight", f"must be below fg_weight ({fg_w}), got {bg_w}")
    mem = vm.integer("memory_mib", d.vm_memory_mib, lo=16, hi=1 << 20)
    ckpt = vm.get("checkpoint_dir", str, f"{state_dir}/checkpoints")
    vm.finish()

    mig = top.section("migration")
    limits = MigrationLimits(
        max_per_host=mig.integer("max_per_host", 1, lo=0, hi=1000),
        max_per_cluster=mig.integer("max_per_cluster", 4, lo=0, hi=100000),
        min_gain_s=mig.number("min_gain_s", 0.0, lo=0, hi=1e9),
        dry_run=mig.get("dry_run", bool, False),
        timeout_s=mig.number("timeout_s", 600.0, lo=1, hi=1e9),
    )
    mig.finish()
    retention = _retention(top.section("retention"))
    clk = top.section("clock")
    clock_speed = clk.number("speed", 1.0, lo=0.001, hi=1e6)
    clock_epoch = clk.number("epoch", 0.0, lo=0, hi=1e11) if clk.has("epoch") else None
    clk.finish()
    log_level = top.choice("log_level", ("debug", "info", "warning", "error"), d.log_level)
    top.finish()
    if pol_explicit or params:
        from vmctl.policies.registry import policy_class

        try:
            check_policy_config(policy_class(name)(**params))  # parameters and needs, naming the file
        except VmctlError as exc:
            raise ConfigError(path=path, where="policy", problem=str(exc)) from exc
    return DaemonConfig(
        path=path, store_url=store_url, store_check_timeout_s=check_timeout_s, state_dir=state_dir, listen=listen,
        port=port,
        server_names=tuple(names_raw), max_body_bytes=max_body, bootstrap_token_file=token_file,
        max_connections=max_conns, handshake_timeout_s=handshake_s, keepalive_timeout_s=keepalive_s,
        plan_workers=plan_workers, plan_per_token=plan_per_token, plan_queue=plan_queue,
        deprecations=tuple(deprecations), policy_name=name, policy_params=dict(params), policy_explicit=pol_explicit,
        tick_s=tick, min_interval_s=min_interval, node_timeout_s=node_timeout, heartbeat_s=heartbeat,
        fence_s=fence_s, node_down_s=node_down,
        kill_at_estimate=kill_at, estimate_grace_s=grace, lease_ttl_s=ttl, holder=holder, fg_weight=fg_w,
        bg_weight=bg_w, vm_memory_mib=mem, checkpoint_dir=ckpt, migration=limits, log_level=log_level,
        retention=retention, clock_speed=clock_speed, clock_epoch=clock_epoch,
    )


#: the node timeout spans at least this many heartbeats (one late or lost heartbeat never loses a node)
MIN_HEARTBEATS_PER_TIMEOUT = 3


def fence_margin(heartbeat_s: float) -> float:
    """Real seconds ``loop.node_down_s`` must exceed ``loop.fence_s`` by: the agent notices its fence
    deadline within one heartbeat period (its heartbeat thread checks it at least that often, and a
    heartbeat request times out after one period), and one more period covers pausing the VMs."""
    return 2.0 * heartbeat_s


def _liveness(loop: Section, d: DaemonConfig, node_timeout: float) -> tuple[float, float, float]:
    """``loop.heartbeat_s``, ``loop.fence_s`` and ``loop.node_down_s``, checked against each other and
    ``loop.node_timeout_s`` (all real seconds): heartbeat x 3 <= node timeout <= fence <= down - margin."""
    # unset: 5 s, or shorter when a short node timeout asks for it (six heartbeats per timeout)
    heartbeat = loop.number("heartbeat_s", min(d.heartbeat_s, node_timeout / 6), lo=0.01, hi=3600)
    if node_timeout < MIN_HEARTBEATS_PER_TIMEOUT * heartbeat:
        raise loop.error("node_timeout_s", f"must be at least {MIN_HEARTBEATS_PER_TIMEOUT} heartbeats long "
                         f"({MIN_HEARTBEATS_PER_TIMEOUT} x loop.heartbeat_s = "
                         f"{MIN_HEARTBEATS_PER_TIMEOUT * heartbeat:g} s), got {node_timeout:g}")
    fence_s = loop.number("fence_s", max(d.fence_s, node_timeout), lo=0.1, hi=86400)
    if fence_s < node_timeout:
        raise loop.error("fence_s", f"must be at least loop.node_timeout_s ({node_timeout:g} s), got {fence_s:g}")
    margin = fence_margin(heartbeat)
    node_down = loop.number("node_down_s", max(d.node_down_s, fence_s + margin), lo=0.1, hi=86400 * 30)
    if node_down < fence_s + margin:
        raise loop.error("node_down_s", f"must be at least loop.fence_s + 2 x loop.heartbeat_s "
                         f"({fence_s:g} + {margin:g} = {fence_s + margin:g} s: the agents pause their job VMs "
                         f"before their jobs are requeued), got {node_down:g}")
    return heartbeat, fence_s, node_down


def _retention(sec: Section) -> RetentionConfig:
    d = RetentionConfig()
    keep_s = sec.number("keep_s", d.keep_s, lo=0)
    if not math.isfinite(keep_s):
        raise sec.error("keep_s", f"must be a finite number of seconds >= 0, got {keep_s}")
    out = RetentionConfig(
        enabled=sec.get("enabled", bool, d.enabled),
        keep_s=keep_s,
        keep_count=sec.integer("keep_count", d.keep_count, lo=0, hi=100_000_000),
        archive=sec.get("archive", bool, d.archive),
        max_per_pass=sec.integer("max_per_pass", d.max_per_pass, lo=1, hi=1_000_000),
    )
    sec.finish()
    return out
