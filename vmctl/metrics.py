"""Prometheus metrics for vmctld and vmctl-agent.

Two kinds of source, as ARCHITECTURE.md asks:

* **Direct instruments** for daemon internals, updated by the daemon's code as things happen:
  ``DaemonMetrics.observe_cycle(seconds)``, ``.decision(action, outcome)``, ``.migration(outcome)``,
  ``.set_queue_length(n)``, ``.set_running(tier, n)``, ``.observe_wait(s)``, ``.observe_response(s)``,
  ``.set_leader(bool, epoch)``.
* **Custom collectors rebuilt on every scrape** from cached state: ``ClusterCollector(snapshot_fn)``
  (daemon: per-node fg/bg utilization and occupancy, per-VM CPU, weight, cap, agent health, built from
  the same node/VM documents the API serves) and ``AgentCollector(snapshot_fn)`` (agent: its last
  ``NodeObserved``). A scrape calls ``snapshot_fn`` once, which must return cached state and never block
  on libvirt. Every collector also yields ``vmctl_collector_success{collector=...}`` (0 when its snapshot
  function raised; the other families of that collector are then omitted for that scrape) and
  ``vmctl_collector_duration_seconds{collector=...}``.

Names follow Prometheus conventions: base units (seconds, ratios 0..1), ``_total`` for counters, no job
id labels (VM names are bounded: two per core). ``docs/monitoring.md`` lists every metric.

    >>> m = DaemonMetrics()
    >>> m.set_queue_length(3)
    >>> b"vmctl_queue_length 3.0" in m.exposition()[0]
    True
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from vmctl.model import WORKER_STATES
from vmctl.nodedoc import NodeObserved, PowerState

log = logging.getLogger(__name__)

#: Scheduling cycle (one policy pass plus writing desired state): 1 ms .. 10 s.
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Job wait and response times: HPC jobs wait from seconds to days.
JOB_TIME_BUCKETS = (
    1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0, 43200.0, 86400.0, 172800.0,
    345600.0, 604800.0,
)
#: Agent reconcile pass (relist + plan + apply): 1 ms .. 30 s.
RECONCILE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

TIERS = ("fg", "bg")
NODE_STATES = ("ready", "draining", "drained", "lost", "down")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("vmctl")
    except Exception:  # pragma: no cover - not installed
        return "unknown"


def _num(value: Any, default: float = 0.0) -> float:
    if value is None or isinstance(value, bool):
        return float(value) if isinstance(value, bool) else default
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


class _TimedCollector(Collector):
    """Base: calls ``snapshot_fn`` once per scrape, times it, yields success and duration."""

    name = "base"
    #: what a ``None`` snapshot means: True = nothing to report (a standby daemon), False = no data yet
    none_is_success = False

    def __init__(self, snapshot_fn: Callable[[], Any]) -> None:
        self._snapshot_fn = snapshot_fn

    def families(self, snapshot: Any) -> Iterable[Metric]:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        ok = 1.0
        out: list[Metric] = []
        try:
            snap = self._snapshot_fn()
            if snap is not None:
                out = list(self.families(snap))
            elif not self.none_is_success:
                ok = 0.0
        except Exception:  # a scrape must never fail; the failure is the metric
            log.exception("metrics collector %s failed", self.name)
            ok = 0.0
            out = []
        success = GaugeMetricFamily(
            "vmctl_collector_success", "1 if the collector's last scrape succeeded, else 0", labels=["collector"]
        )
        success.add_metric([self.name], ok)
        duration = GaugeMetricFamily(
            "vmctl_collector_duration_seconds", "Time the collector took on this scrape", labels=["collector"]
        )
        duration.add_metric([self.name], time.perf_counter() - t0)
        yield from out
        yield success
        yield duration

    def describe(self) -> Iterable[Metric]:
        # No describe: the registry must not call collect() at registration (snapshot may not exist yet).
        return []


# ----------------------------------------------------------------------------- daemon


@dataclass(frozen=True)
class ClusterSnapshot:
    """What the daemon's cluster collector reads: the node and VM documents of the API
    (``GET /v1/nodes``, ``GET /v1/vms``, ``GET /v1/workers``), optionally with ``cpu_time_s`` per VM."""

    nodes: Sequence[Mapping[str, Any]] = ()
    vms: Sequence[Mapping[str, Any]] = ()
    time: float = field(default_factory=time.time)
    #: paper 001's workers (``GET /v1/workers``): one per VM slot with its state
    workers: Sequence[Mapping[str, Any]] = ()


class ClusterCollector(_TimedCollector):
    """Per-node and per-VM families from the daemon's cached documents. ``snapshot_fn`` returns None
    on a standby daemon (no cluster families; the collector still reports success)."""

    name = "cluster"
    none_is_success = True

    def families(self, snapshot: ClusterSnapshot) -> Iterable[Metric]:
        cores = GaugeMetricFamily("vmctl_node_cores", "Physical cores of the node", labels=["node"])
        state = GaugeMetricFamily("vmctl_node_state", "1 for the node's current state", labels=["node", "state"])
        busy = GaugeMetricFamily("vmctl_node_busy_cores", "Cores whose fg / bg slot holds a job process",
                                 labels=["node", "tier"])
        util = GaugeMetricFamily(
            "vmctl_node_utilization_ratio",
            "CPU utilization of the node's fg / bg VMs as a fraction of the node's cores", labels=["node", "tier"],
        )
        host_util = GaugeMetricFamily("vmctl_node_host_utilization_ratio", "Measured host CPU utilization",
                                      labels=["node"])
        agent_up = GaugeMetricFamily("vmctl_agent_up", "1 if the node's agent reported recently (state not lost)",
                                     labels=["node"])
        last_seen = GaugeMetricFamily("vmctl_agent_last_seen_timestamp_seconds",
                                      "When the node's agent last reported", labels=["node"])
        age = GaugeMetricFamily("vmctl_agent_report_age_seconds",
                                "Seconds since the node's agent last sent a full report (heartbeats do not count)",
                                labels=["node"])
        applied = GaugeMetricFamily("vmctl_agent_applied_generation",
                                    "Generation of desired state the node's agent applied (its latest report)",
                                    labels=["node"])
        refusals = GaugeMetricFamily("vmctl_agent_migration_refusals",
                                     "Migrations the node's agent refuses in its latest report", labels=["node"])
        gen = GaugeMetricFamily("vmctl_node_desired_generation", "Generation of the node's desired state",
                                labels=["node"])
        vm_cpu = CounterMetricFamily("vmctl_vm_cpu_seconds", "Cumulative guest CPU time of the VM",
                                     labels=["vm", "node", "role"])
        vm_util = GaugeMetricFamily("vmctl_vm_utilization_ratio", "CPU utilization of the VM (fraction of one core)",
                                    labels=["vm", "node", "role"])
        vm_weight = GaugeMetricFamily("vmctl_vm_weight", "CPU weight of the VM (1..10000)",
                                      labels=["vm", "node", "role"])
        vm_cap = GaugeMetricFamily("vmctl_vm_cap_ratio", "CPU cap of the VM as a fraction of one core (capped only)",
                                   labels=["vm", "node", "role"])
        vm_busy = GaugeMetricFamily("vmctl_vm_busy", "1 if the VM runs a job process", labels=["vm", "node", "role"])

        per_node_util: dict[tuple[str, str], float] = {}
        for v in snapshot.vms:
            name, nd, role = str(v.get("name", "")), str(v.get("node", "")), str(v.get("role", ""))
            labels = [name, nd, role]
            u = _num(v.get("utilization"))
            vm_util.add_metric(labels, u)
            if v.get("weight") is not None:
                vm_weight.add_metric(labels, _num(v.get("weight")))
            if v.get("cap") is not None:
                vm_cap.add_metric(labels, _num(v.get("cap")))
            if v.get("cpu_time_s") is not None:
                vm_cpu.add_metric(labels, _num(v.get("cpu_time_s")))
            vm_busy.add_metric(labels, 1.0 if v.get("job_id") else 0.0)
            if role in TIERS:
                per_node_util[(nd, role)] = per_node_util.get((nd, role), 0.0) + u

        for n in snapshot.nodes:
            nd = str(n.get("name", ""))
            ncores = _num(n.get("cores"))
            cores.add_metric([nd], ncores)
            st = str(n.get("state", ""))
            for s in sorted(set(NODE_STATES) | {st}):
                if s:
                    state.add_metric([nd, s], 1.0 if s == st else 0.0)
            busy.add_metric([nd, "fg"], _num(n.get("fg_busy")))
            busy.add_metric([nd, "bg"], _num(n.get("bg_busy")))
            for tier in TIERS:
                total = per_node_util.get((nd, tier), 0.0)
                util.add_metric([nd, tier], total / ncores if ncores > 0 else 0.0)
            if n.get("utilization") is not None:
                host_util.add_metric([nd], _num(n.get("utilization")))
            agent_up.add_metric([nd], 0.0 if st in ("lost", "down") else 1.0)
            if n.get("last_seen") is not None:
                last_seen.add_metric([nd], _num(n.get("last_seen")))
            if n.get("last_report") is not None:
                age.add_metric([nd], max(0.0, snapshot.time - _num(n.get("last_report"))))
            if n.get("generation_applied") is not None:
                applied.add_metric([nd], _num(n.get("generation_applied")))
            refusals.add_metric([nd], float(len(n.get("refusals") or ())))
            if n.get("generation") is not None:
                gen.add_metric([nd], _num(n.get("generation")))
        workers = GaugeMetricFamily("vmctl_workers", "Workers (VM slots) of the node in each state of paper 001 "
                                    "(available, occupied, busy, down)", labels=["node", "state"])
        counts: dict[str, dict[str, int]] = {}
        for w in snapshot.workers:
            per = counts.setdefault(str(w.get("node", "")), dict.fromkeys(WORKER_STATES, 0))
            st = str(w.get("state", ""))
            per[st] = per.get(st, 0) + 1
        for nd, per in sorted(counts.items()):
            for st, k in per.items():
                workers.add_metric([nd, st], float(k))
        return [cores, state, busy, util, host_util, agent_up, last_seen, age, gen, applied, refusals,
                vm_cpu, vm_util, vm_weight, vm_cap, vm_busy, workers]


class DaemonMetrics:
    """The daemon's registry: direct instruments plus the cluster collector.

    ``snapshot_fn`` returns a ``ClusterSnapshot`` of cached state (called once per scrape); it can be
    given later with ``set_cluster_source``. Serve ``exposition()`` at ``GET /metrics``."""

    def __init__(self, snapshot_fn: Callable[[], ClusterSnapshot | None] | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        r = self.registry
        Info("vmctl_build", "vmctl version", registry=r).info({"version": _version(), "component": "vmctld"})
        self.cycle_seconds = Histogram(
            "vmctl_scheduler_cycle_seconds", "Duration of one scheduling cycle (policy pass and desired-state write)",
            buckets=CYCLE_BUCKETS, registry=r,
        )
        self.cycles_total = Counter("vmctl_scheduler_cycles", "Scheduling cycles run", registry=r)
        self.decisions_total = Counter(
            "vmctl_decisions", "Scheduling actions decided, by action kind and outcome",
            labelnames=["action", "outcome"], registry=r,
        )
        self.migrations_total = Counter(
            "vmctl_migrations", "Migrations finished, by outcome", labelnames=["outcome"], registry=r,
        )
        self.queue_length = Gauge("vmctl_queue_length", "Jobs waiting in the queue", registry=r)
        self.running_jobs = Gauge("vmctl_running_jobs", "Running jobs by tier", labelnames=["tier"], registry=r)
        for tier in TIERS:
            self.running_jobs.labels(tier=tier).set(0)
        self.jobs_finished_total = Counter(
            "vmctl_jobs_finished", "Jobs that left the system, by final state", labelnames=["state"], registry=r,
        )
        self.wait_seconds = Histogram(
            "vmctl_job_wait_seconds", "Time from submission to first start", buckets=JOB_TIME_BUCKETS, registry=r,
        )
        self.response_seconds = Histogram(
            "vmctl_job_response_seconds", "Time from submission to completion", buckets=JOB_TIME_BUCKETS, registry=r,
        )
        self.polls_waiting = Gauge(
            "vmctl_agent_polls_waiting", "Agent desired-state long-polls parked on the daemon, waiting for a change",
            registry=r,
        )
        self.gang_rows = Gauge("vmctl_gang_rows_in_use",
                               "Rows of the gang matrix holding a job (timeslice clusters)", registry=r)
        self.gang_holes = Gauge("vmctl_gang_holes",
                                "Free cells (core slots) in the gang rows in use (timeslice clusters)", registry=r)
        self.leader = Gauge("vmctl_leader", "1 if this daemon holds the leader lease", registry=r)
        self.epoch = Gauge("vmctl_leader_epoch", "Leader lease epoch of this daemon", registry=r)
        self.api_requests_total = Counter(
            "vmctl_api_requests", "API requests answered, by route group and status class",
            labelnames=["route", "code"], registry=r,
        )
        self._snapshot_fn: Callable[[], ClusterSnapshot | None] | None = snapshot_fn
        self._cluster = ClusterCollector(lambda: self._snapshot_fn() if self._snapshot_fn else None)
        r.register(self._cluster)

    # -- the small API daemon-core calls ------------------------------------------------------

    def set_cluster_source(self, snapshot_fn: Callable[[], ClusterSnapshot | None]) -> None:
        self._snapshot_fn = snapshot_fn

    def observe_cycle(self, seconds: float) -> None:
        self.cycle_seconds.observe(max(0.0, seconds))
        self.cycles_total.inc()

    def decision(self, action: str, outcome: str = "applied", count: int = 1) -> None:
        """``action`` is an action kind (``start_fg``, ``migrate``, ...); outcome ``applied``/``failed``/
        ``rejected``."""
        self.decisions_total.labels(action=action, outcome=outcome).inc(count)

    def migration(self, outcome: str) -> None:
        """``completed``, ``failed`` or ``aborted``."""
        self.migrations_total.labels(outcome=outcome).inc()

    def set_gang(self, rows_in_use: int, holes: int) -> None:
        self.gang_rows.set(rows_in_use)
        self.gang_holes.set(holes)

    def set_queue_length(self, n: int) -> None:
        self.queue_length.set(n)

    def set_running(self, tier: str, n: int) -> None:
        self.running_jobs.labels(tier=tier).set(n)

    def job_finished(self, state: str, response_seconds: float | None = None) -> None:
        self.jobs_finished_total.labels(state=state).inc()
        if response_seconds is not None:
            self.response_seconds.observe(max(0.0, response_seconds))

    def observe_wait(self, seconds: float) -> None:
        self.wait_seconds.observe(max(0.0, seconds))

    def observe_response(self, seconds: float) -> None:
        self.response_seconds.observe(max(0.0, seconds))

    def set_leader(self, is_leader: bool, epoch: int = 0) -> None:
        self.leader.set(1 if is_leader else 0)
        self.epoch.set(epoch)

    def api_request(self, route: str, status: int) -> None:
        self.api_requests_total.labels(route=route, code=f"{status // 100}xx").inc()

    def exposition(self) -> tuple[bytes, str]:
        """(body, content type) for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


# ----------------------------------------------------------------------------- agent


class AgentCollector(_TimedCollector):
    """Per-VM and per-node metrics of one agent, from its last ``NodeObserved`` (cached)."""

    name = "agent"

    def families(self, obs: NodeObserved) -> Iterable[Metric]:
        nd = obs.node
        labels = ["vm", "node"]
        cpu = CounterMetricFamily("vmctl_agent_vm_cpu_seconds", "Cumulative guest CPU time", labels=labels)
        util = GaugeMetricFamily("vmctl_agent_vm_utilization_ratio",
                                 "VM CPU utilization over the last sampling interval (fraction of one core)",
                                 labels=labels)
        weight = GaugeMetricFamily("vmctl_agent_vm_weight", "Applied CPU weight (1..10000)", labels=labels)
        cap = GaugeMetricFamily("vmctl_agent_vm_cap_ratio", "Applied CPU cap (fraction of one core; capped only)",
                                labels=labels)
        power = GaugeMetricFamily("vmctl_agent_vm_power_state", "1 for the VM's power state",
                                  labels=["vm", "node", "state"])
        for v in obs.vms:
            lv = [v.name, nd]
            cpu.add_metric(lv, v.cpu_time_s)
            util.add_metric(lv, v.utilization)
            if v.weight is not None:
                weight.add_metric(lv, float(v.weight))
            if v.cap is not None:
                cap.add_metric(lv, v.cap)
            power.add_metric([v.name, nd, str(v.power)], 1.0)
        present = [v for v in obs.vms if v.power is not PowerState.ABSENT]
        vms = GaugeMetricFamily("vmctl_agent_vms", "VMs the hypervisor reports on this node", labels=["node"])
        vms.add_metric([nd], float(len(present)))
        orphans = GaugeMetricFamily("vmctl_agent_orphan_vms",
                                    "VMs of this agent that no desired state wants (being stopped and removed)",
                                    labels=["node"])
        orphans.add_metric([nd], float(sum(1 for v in present if v.orphan)))
        cores = GaugeMetricFamily("vmctl_agent_cores", "Physical cores of this node", labels=["node"])
        cores.add_metric([nd], float(obs.cores))
        host = GaugeMetricFamily("vmctl_agent_host_utilization_ratio", "Host CPU utilization", labels=["node"])
        host.add_metric([nd], obs.host_utilization)
        gen = GaugeMetricFamily("vmctl_agent_generation_applied", "Desired-state generation last applied",
                                labels=["node"])
        gen.add_metric([nd], float(obs.generation_applied))
        errs = GaugeMetricFamily("vmctl_agent_reconcile_errors", "Errors in the last reconcile pass", labels=["node"])
        errs.add_metric([nd], float(len(obs.errors)))
        seen = GaugeMetricFamily("vmctl_agent_observed_timestamp_seconds", "When the observation was taken",
                                 labels=["node"])
        seen.add_metric([nd], obs.time)
        return [cpu, util, weight, cap, power, vms, orphans, cores, host, gen, errs, seen]


class AgentMetrics:
    """The agent's registry: ``AgentCollector`` over ``snapshot_fn`` (returns the last ``NodeObserved``
    or None before the first relist) plus direct instruments for the reconcile loop. ``serve(port)``
    starts a small HTTP endpoint (``prometheus_client``) in a daemon thread."""

    def __init__(self, snapshot_fn: Callable[[], NodeObserved | None],
                 registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        r = self.registry
        Info("vmctl_build", "vmctl version", registry=r).info({"version": _version(), "component": "vmctl-agent"})
        self.reconcile_seconds = Histogram(
            "vmctl_agent_reconcile_seconds", "Duration of one reconcile pass (relist, plan, apply)",
            buckets=RECONCILE_BUCKETS, registry=r,
        )
        self.actions_total = Counter(
            "vmctl_agent_actions", "Reconcile actions applied, by kind and outcome",
            labelnames=["action", "outcome"], registry=r,
        )
        self.daemon_errors_total = Counter(
            "vmctl_agent_daemon_errors", "Failed requests to vmctld", registry=r,
        )
        self.hypervisor_up = Gauge("vmctl_agent_hypervisor_up", "1 if the last relist succeeded", registry=r)
        self.row_switch_seconds = Histogram(
            "vmctl_agent_row_switch_seconds",
            "Duration of a timeslice row switch on the slice clock (pause the inactive rows, resume the active one)",
            buckets=RECONCILE_BUCKETS, registry=r,
        )
        r.register(AgentCollector(snapshot_fn))
        self._server: Any = None

    def observe_reconcile(self, seconds: float, ok: bool = True) -> None:
        self.reconcile_seconds.observe(max(0.0, seconds))
        self.hypervisor_up.set(1 if ok else 0)

    def row_switch(self, seconds: float) -> None:
        """One row switch (its ``_count`` is the number of switches)."""
        self.row_switch_seconds.observe(max(0.0, seconds))

    def action(self, action: str, outcome: str = "applied") -> None:
        self.actions_total.labels(action=action, outcome=outcome).inc()

    def daemon_error(self) -> None:
        self.daemon_errors_total.inc()

    def exposition(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start ``/metrics`` on ``addr:port`` (port 0 picks a free one); returns the bound port."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
