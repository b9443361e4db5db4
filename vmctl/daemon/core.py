"""vmctld's decision loop: the paper's status checker + decision maker + dispatcher (001 sec. III-A.3)
around one scheduling policy (000: the policy objects of the simulator, unchanged).

``Daemon`` owns the in-memory ``ClusterState``, the store and the policy. Every change comes in as an
event -- job submitted or cancelled, agent report (a process exited, an operation confirmed), node
joined or lost, operator change, periodic tick, or the ``wake_at`` a decision asked for -- and is
written to the store in one transaction together with the desired state it implies. ``run_once``
builds a ``ClusterView``, asks the policy, checks the decision with
``vmctl.policies.invariants.check_decision`` and applies it (``Actuator``).

Crash safety: the store is written before an API call answers and in one transaction per event, with
the leader epoch checked inside it. A restarted daemon reloads the records, derives the same desired
state and picks up the agents' next full reports: a submitted job is never lost (it was committed
before ``201``), never started twice (its ``run`` number and placement were committed with the
desired state that starts it), and an open migration/checkpoint is an ``OperationRecord`` that is
confirmed from the reports or rolled back at its timeout.

The loop is synchronous (``run_once``). The API server drives it from asyncio in three steps so that
the policy does not hold up the API: ``begin_pass`` (housekeeping, then the view, on the loop),
``choose`` (the policy and the invariant check, in a worker thread: they read only that view, which
shares nothing mutable with the state), ``finish_decision`` (actuation and commit, on the loop). Events
that arrive meanwhile are handled as usual; the actuator then checks each action against the state as
it is now (a fresh view), and a decision made before a reload or a node change is dropped and made
again.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from vmctl.clock import Clock, SystemClock
from vmctl.daemon.actuator import Actuator, ApplyResult, Changes
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.history import JobHistory
from vmctl.daemon.retention import prune_finished
from vmctl.daemon.state import ACTIVE, TERMINAL, ClusterState, DesiredSettings, Layout, levels_offer
from vmctl.errors import Conflict, LeaseLost, NotFound, StoreError, ValidationError, VmctlError
from vmctl.model import (
    ClusterView,
    Decision,
    Demote,
    Discipline,
    JobState,
    Migrate,
    NodeDesired,
    NodeObserved,
    Promote,
    SetCap,
    Tier,
)
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.invariants import check_decision
from vmctl.store.base import JobRecord, NodeRecord, OperationRecord, Store, WriteBatch
from vmctl.wire import vm_desired_from_json, vm_desired_to_json

log = logging.getLogger("vmctld")

#: preference order when the configured default policy is not registered (yet)
FALLBACK_POLICIES = ("measy", "reasy", "keasy", "easy", "fcfs")


class NotLeader(VmctlError):
    reference = "not-leader"
    retryable = True
    template = "this vmctld is a standby (leader: {holder})"
    http_status = 503


@dataclass(frozen=True, slots=True)
class PendingDecision:
    """A decision in the making: the view it is made on, built by ``Daemon.begin_decision``."""

    now: float
    view: ClusterView
    layout: Layout
    policy: SchedulingPolicy
    started: float  # time.perf_counter() at the start, for the cycle-time metric
    loads: int  # Daemon.loads when the view was built


class Daemon:
    def __init__(self, config: DaemonConfig, store: Store, clock: Clock | None = None,
                 policy: SchedulingPolicy | None = None) -> None:
        self.config = config
        self.store = store
        self.clock = clock or SystemClock()
        for note in config.deprecations:
            log.warning("%s", note)
        # model seconds per real second (an accelerated ScaledClock); operational periods in the config
        # (tick, node timeout, migration timeout) are real seconds and are scaled by this
        self.speed = float(getattr(self.clock, "factor", 1.0))
        # the lease is operational: real time under an accelerated clock
        self.lease_clock: Clock = SystemClock() if self.speed != 1.0 else self.clock
        self.last_pass = time.monotonic()  # real time of the last decision-loop pass (the watchdog's health)
        self.state = ClusterState(settings=DesiredSettings(
            fg_weight=config.fg_weight, bg_weight=config.bg_weight, memory_mib=config.vm_memory_mib,
            checkpoint_dir=config.checkpoint_dir))
        self.actuator = Actuator(self.state, config.migration)
        self._fixed_policy = policy
        self.policy: SchedulingPolicy | None = policy
        self.leader = False
        self.epoch = 0
        self.dirty = True  # an event happened since the last decision
        self.wake_at: float | None = None
        self.last_decide_at = -math.inf
        self.last_decision: Decision | None = None
        self.last_result: ApplyResult | None = None
        self.decisions = 0
        self.loads = 0  # state reloads from the store (a decision made before one is not applied)
        self.decision_seconds: list[float] = []
        self.skipped_total = 0
        #: node -> model time at which its last *fresh* full report (a new relist) arrived, since this daemon
        #: took the lease (memory only, emptied by ``load``). No timer that ends work acts on a node before
        #: its entry exists: what the agents observed while the daemon was down is learnt first.
        self.observed_at: dict[str, float] = {}
        self.history = JobHistory()  # the jobs' history entries (vmctl job show)
        #: called with the names of nodes whose desired state changed (after the commit)
        self.on_desired: Callable[[set[str]], None] = lambda nodes: None
        self.metrics: Any = None  # a vmctl.metrics.DaemonMetrics when served (set by the API server)

    def attach_metrics(self, metrics: Any) -> None:
        """Feed a ``vmctl.metrics.DaemonMetrics`` (direct instruments) from the loop and the actuator."""
        self.metrics = metrics
        outcome = {"done": "completed", "rolled_back": "failed", "aborted": "aborted", "failed": "failed"}

        def job_end(job: JobRecord, state: str, now: float) -> None:
            metrics.job_finished(state, now - job.submit_time)

        def start(job: JobRecord, now: float) -> None:
            if job.run == 1:
                metrics.observe_wait(now - job.submit_time)

        def op_closed(op: OperationRecord) -> None:
            if op.kind == "migrate":
                metrics.migration(outcome.get(op.state, op.state))

        self.actuator.on_job_end = job_end
        self.actuator.on_start = start
        self.actuator.on_op_closed = op_closed

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> bool:
        """Migrate the schema, try to take the leader lease, load state when leader. Returns leader."""
        self.store.migrate()
        return self.try_lead()

    def try_lead(self) -> bool:
        epoch = self.store.acquire_lease(self.config.holder, self.config.lease_ttl_s, self.lease_clock.now())
        if epoch is None:
            self.leader = False
            return False
        if not self.leader or epoch != self.epoch:
            self.epoch = epoch
            self.leader = True
            self.load()
            log.info("leader with epoch %d (%s)", epoch, self.config.holder)
        return True

    def renew(self) -> None:
        if not self.leader:
            return
        try:
            self.store.renew_lease(self.config.holder, self.epoch, self.config.lease_ttl_s, self.lease_clock.now())
        except LeaseLost:
            self.step_down()
            raise

    def step_down(self) -> None:
        log.error("lost the leader lease (epoch %d): standing by", self.epoch)
        self.leader = False

    def close(self) -> None:
        if self.leader:
            with contextlib.suppress(StoreError):
                self.store.release_lease(self.config.holder, self.epoch)
        self.leader = False

    def load(self) -> None:
        desired_raw = self.store.load_desired()
        desired = {n: (g, tuple(vm_desired_from_json(v, f"desired[{n}].vms[{i}].")
                                for i, v in enumerate(doc.get("vms", []))))
                   for n, (g, doc) in desired_raw.items()}
        self.state.load(self.store.load_jobs(), self.store.load_nodes(), self.store.load_operations(), desired)
        self.loads += 1
        self.history.forget()
        now = self.clock.now()
        self.observed_at = {}  # nothing observed by this daemon yet: see housekeeping
        for n in self.state.nodes.values():
            n.last_seen = max(n.last_seen, now)  # grace: agents re-report after a daemon restart
        if self._fixed_policy is None:
            saved = self.store.get_kv("policy")
            if isinstance(saved, dict) and "name" in saved:
                try:
                    self.policy = self._make_policy(str(saved["name"]), dict(saved.get("params") or {}))
                except VmctlError as exc:
                    log.error("stored policy %s unusable (%s); using the configured one", saved, exc)
                    self.policy = None
            if self.policy is None:
                self.policy = self._configured_policy()
        self.dirty = True

    def _make_policy(self, name: str, params: dict[str, Any]) -> SchedulingPolicy:
        from vmctl.policies.registry import create_policy

        policy = create_policy(name, **params)
        self.state.offer().check(policy)  # PolicyNeedsUnmet when the registered cluster cannot serve it
        return policy

    def _configured_policy(self) -> SchedulingPolicy:
        from vmctl.errors import UnknownPolicyError
        from vmctl.policies.registry import available_policies

        try:
            return self._make_policy(self.config.policy_name, self.config.policy_params)
        except UnknownPolicyError:
            if self.config.policy_explicit:
                raise
            avail = available_policies()
            for name in FALLBACK_POLICIES:
                if name in avail:
                    log.warning("policy %s is not registered; falling back to %s", self.config.policy_name, name)
                    return self._make_policy(name, {})
            if avail:
                name = next(iter(avail))
                log.warning("policy %s is not registered; falling back to %s", self.config.policy_name, name)
                return self._make_policy(name, {})
            raise

    # ------------------------------------------------------------------ commit
    def _require_leader(self) -> None:
        if not self.leader:
            raise NotLeader(holder=self.store.lease().holder or "none")

    def commit(self, ch: Changes) -> None:
        """Derive the desired state of every touched node and write everything in one transaction.
        On a store error the in-memory state is reloaded from the store (nothing half-applied)."""
        st = self.state
        if ch.jobs:  # stored with the jobs, in this transaction
            by = "the operator" if "operator action" in ch.events else \
                f"policy {self.policy.name if self.policy else '-'}"
            self.history.note(ch.jobs.values(), self.clock.now(), by)
        batch = WriteBatch(jobs=dict(ch.jobs), nodes=dict(ch.nodes), operations=dict(ch.ops), kv=dict(ch.kv))
        new_desired: dict[str, tuple[Any, ...]] = {}
        for node in sorted(ch.desired_nodes):
            if node not in st.nodes:
                continue
            vms = st.desired_vms(node)
            if vms != st.desired.get(node, ()):
                new_desired[node] = vms
        gens: dict[str, int] = {}
        if new_desired:
            for node, vms in new_desired.items():
                gen = st.generation.get(node, 0) + 1
                gens[node] = gen
                rec = st.nodes[node]
                rec.generation = gen
                batch.nodes[node] = rec
                batch.desired[node] = (gen, {"node": node, "generation": gen,
                                             "vms": [vm_desired_to_json(v) for v in vms]})
        for op in batch.operations.values():
            # a migration in its prepare stage waits for the target to apply this generation
            if op.kind == "migrate" and op.state == "pending" and op.detail.get("stage") == "prepare":
                tg = op.detail.setdefault("target_gens", {})
                for m in op.detail.get("moves", []):
                    t = str(m["to"][0])
                    if m["from"][0] != m["to"][0] and t not in tg:
                        tg[t] = gens.get(t, st.generation.get(t, 0))
        if batch.empty():
            return
        try:
            self.store.write(self.epoch, batch)
        except LeaseLost:
            self.step_down()
            raise
        except StoreError:
            log.exception("store write failed; reloading state from the store")
            self.load()
            raise
        for node, vms in new_desired.items():
            st.desired[node] = vms
            st.generation[node] = gens[node]
        if ch.events:
            self.dirty = True
        if new_desired:
            self.on_desired(set(new_desired))

    # ------------------------------------------------------------------ operator / API events
    def submit(self, specs: Iterable[dict[str, Any]]) -> list[JobRecord]:
        self._require_leader()
        now = self.clock.now()
        ch = Changes()
        out: list[JobRecord] = []
        seq = self.state.next_seq
        for spec in specs:
            rec = JobRecord(id=str(seq), seq=seq, name=str(spec.get("name") or f"job-{seq}"), spec=dict(spec),
                            state=JobState.QUEUED, submit_time=now, reason="submitted")
            seq += 1
            out.append(rec)
            ch.jobs[rec.id] = rec
        ch.events.append("submit")
        self.history.note(out, now, "the operator")
        try:
            self.store.write(self.epoch, WriteBatch(jobs=dict(ch.jobs)))
        except LeaseLost:
            self.step_down()
            raise
        self.state.next_seq = seq
        for rec in out:
            self.state.jobs[rec.id] = rec
            self.state.reindex(rec)
        self.dirty = True
        return out

    def job(self, job_id: str) -> JobRecord:
        rec = self.state.jobs.get(job_id)
        if rec is None:
            raise NotFound(kind="job", name=job_id)
        return rec

    def cancel(self, job_id: str) -> JobRecord:
        self._require_leader()
        rec = self.job(job_id)
        if rec.state in TERMINAL:
            return rec
        ch = Changes()
        self.actuator.stop_job(ch, rec, self.clock.now(), JobState.CANCELLED, "cancelled by an operator")
        self.commit(ch)
        return rec

    def register_node(self, name: str, cores: int, hostname: str, backend: str, peers: Iterable[str] | None = None,
                      checkpoint_peers: Iterable[str] | None = None, speed: float | None = None,
                      group: str | None = None, memory_mib: int | None = None, levels: int | None = None,
                      discipline: Discipline | None = None) -> NodeRecord:
        """A node agent (re)registers. ``peers``: the nodes its agent can live-migrate to (None: it did
        not say, not restricted); ``checkpoint_peers``: where it can send checkpoint files (None: shared
        storage, any node). Policies are offered only migrations these allow (``ClusterView.can_migrate``).
        ``speed``, ``group`` and ``memory_mib`` describe the host (None: the agent did not say; the node
        keeps what it had, at first the defaults) and reach the policy's view (``ClusterView.speed_of``).
        ``levels`` and ``discipline``: the agent's VM level layout (None: as before, at first 2 priority
        levels); refused (``Conflict``) when it differs from the other nodes' (``ClusterState.layout_problem``),
        and (``PolicyNeedsUnmet``) when the policy in force cannot run on the cluster it makes."""
        self._require_leader()
        now = self.clock.now()
        ch = Changes()
        rec = self.state.nodes.get(name)
        layout = self._node_layout(name, rec, levels, discipline)
        if rec is None:
            rec = NodeRecord(name=name, cores=cores, state="ready", last_seen=now, hostname=hostname,
                             backend=backend, registered=now, generation=self.state.generation.get(name, 0))
            self.state.nodes[name] = rec
            self.state.nodes_changed()
        else:
            if rec.cores != cores:
                busy = [j for j in self.state.jobs_on(name) if any(c >= cores for n, c in j.placement if n == name)]
                if busy:
                    raise Conflict(what=f"node {name}", problem=f"cannot shrink to {cores} cores: jobs run there")
                rec.cores = cores
                self.state.nodes_changed()
            rec.hostname, rec.backend, rec.last_seen = hostname, backend, now
            if rec.state == "lost":
                rec.state = "ready"
        reach = (None if peers is None else sorted(set(peers) - {name}),
                 None if checkpoint_peers is None else sorted(set(checkpoint_peers) - {name}))
        if (rec.peers, rec.checkpoint_peers) != reach:
            rec.peers, rec.checkpoint_peers = reach
            self.state.nodes_changed()  # a decision made on the old reachability is made again
        host = (rec.speed if speed is None else speed, rec.group if group is None else group,
                rec.memory_mib if memory_mib is None else memory_mib)
        if (rec.speed, rec.group, rec.memory_mib) != host:
            rec.speed, rec.group, rec.memory_mib = host
            self.state.nodes_changed()
        if (rec.levels, rec.discipline) != layout:
            rec.levels, rec.discipline = layout
            self.state.nodes_changed()
        ch.nodes[name] = rec
        ch.desired_nodes.add(name)
        ch.events.append(f"node {name} joined")
        self.commit(ch)
        self.dirty = True
        return rec

    def _node_layout(self, name: str, rec: NodeRecord | None, levels: int | None,
                     discipline: Discipline | None) -> tuple[int, str]:
        """The level layout node ``name`` registers (None: what it had), checked against the cluster and
        the policy in force before anything changes."""
        lv = levels if levels is not None else rec.levels if rec is not None else 2
        dis = discipline if discipline is not None else Discipline(rec.discipline if rec is not None else "priority")
        problem = self.state.layout_problem(name, lv, dis)
        if problem is not None:
            raise Conflict(what=f"node {name}", problem=problem)
        if self.policy is not None and (len(self.state.nodes) - (rec is not None)) == 0:
            # the first node sets the cluster's layout (the others must match it): the policy must fit
            levels_offer(lv, dis).check(self.policy)
        return lv, dis.value

    def node(self, name: str) -> NodeRecord:
        rec = self.state.nodes.get(name)
        if rec is None:
            raise NotFound(kind="node", name=name)
        return rec

    def report(self, obs: NodeObserved) -> None:
        self._require_leader()
        rec = self.node(obs.node)
        now = self.clock.now()
        rec.last_seen = now
        ch = Changes()
        self._node_back(rec, ch)
        self.actuator.observe(obs, now, ch)
        if not any(e.startswith("observe:") for e in obs.errors):
            # a fresh relist (a report whose relist failed repeats the agent's previous VM list)
            self.observed_at[rec.name] = now
        self.commit(ch)

    def heartbeat(self, name: str) -> dict[str, Any]:
        """An agent's cheap sign of life (``POST /v1/agent/nodes/<n>/heartbeat``): keeps its node from
        being lost, and tells the agent the liveness settings and its node's current generation (an agent
        that fenced itself resumes its VMs only once it holds that generation). In memory only: a
        heartbeat writes the store only when it brings a lost or down node back."""
        self._require_leader()
        rec = self.node(name)
        rec.last_seen = self.clock.now()
        ch = Changes()
        self._node_back(rec, ch)
        if ch.any():
            self.commit(ch)
        cfg = self.config
        return {"node": name, "state": rec.state, "generation": self.state.generation.get(name, 0),
                "heartbeat_s": cfg.heartbeat_s, "node_timeout_s": cfg.node_timeout_s, "fence_s": cfg.fence_s,
                "node_down_s": cfg.node_down_s}

    def _node_back(self, rec: NodeRecord, ch: Changes) -> None:
        """The agent of a lost or down node was heard from: the node is schedulable again (a lost node
        kept its jobs; a down node's were requeued)."""
        if rec.state in ("lost", "down"):
            log.warning("node %s back (was %s)", rec.name, rec.state)
            rec.state = "ready"
            ch.nodes[rec.name] = rec
            ch.events.append(f"node {rec.name} back")
            self.state.nodes_changed()

    def set_node_state(self, name: str, drain: bool, reason: str | None = None) -> NodeRecord:
        self._require_leader()
        rec = self.node(name)
        ch = Changes()
        if drain and rec.state == "ready":
            rec.state = "draining" if self.state.jobs_on(name) else "drained"
        elif not drain and rec.state in ("draining", "drained"):
            rec.state = "ready"
        rec.drain_reason = reason if drain else None
        ch.nodes[name] = rec
        ch.events.append(f"node {name} {rec.state}")
        self.commit(ch)
        return rec

    def desired(self, node: str) -> NodeDesired:
        self.node(node)
        return NodeDesired(node=node, generation=self.state.generation.get(node, 0),
                           vms=self.state.desired.get(node, ()))

    def set_policy(self, name: str, params: dict[str, Any]) -> SchedulingPolicy:
        self._require_leader()
        pol = self._make_policy(name, params)
        ch = Changes(kv={"policy": {"name": pol.name, "params": dict(pol.params)}})
        ch.events.append("policy changed")
        self.commit(ch)
        self.policy = pol
        self.dirty = True
        return pol

    # ------------------------------------------------------------------ operator actions through the checker
    def _operator_decision(self, actions: tuple[Any, ...]) -> tuple[ApplyResult, Changes]:
        self._require_leader()
        now = self.clock.now()
        view, lay = self.state.build_view(now)
        from vmctl.errors import InvariantViolation

        dec = Decision(actions=actions, reasons={}, default_reason="waiting")
        try:
            check_decision(view, dec, now)
        except InvariantViolation as exc:  # an operator's request the rules refuse: a conflict, not a bug
            raise Conflict(what=f"{actions[0].kind} of job {actions[0].job_id}",
                           problem=f"refused ({lay.name_cores(exc.message)})") from exc
        ch = Changes()
        saved = {j.id: j.reason for j in self.state.queue()}
        res = self.actuator.apply(dec, view, lay, now, ch)
        for rec in self.state.queue():  # an operator action does not change waiting reasons
            rec.reason = saved.get(rec.id, rec.reason)
            ch.jobs.pop(rec.id, None)
        if res.skipped:
            raise Conflict(what=f"{actions[0].kind} of job {actions[0].job_id}", problem=res.skipped[0][1])
        ch.events.append("operator action")
        self.commit(ch)
        return res, ch

    def migrate_job(self, job_id: str, to_node: str) -> OperationRecord:
        rec = self.job(job_id)
        node = self.node(to_node)
        if rec.state != JobState.RUNNING or rec.migrating:
            raise Conflict(what=f"job {job_id}", problem=f"is {rec.state}{' and migrating' if rec.migrating else ''}")
        if node.state != "ready":
            raise Conflict(what=f"node {to_node}", problem=f"is {node.state}")
        for src in sorted({n for n, _c in rec.placement}):
            why = self.state.migration_block(src, to_node)
            if why is not None:
                raise Conflict(what=f"migration of job {job_id} to {to_node}", problem=why)
        view, lay = self.state.build_view(self.clock.now())
        off = lay.offset[to_node]
        free = [off + c for c in range(node.cores) if (off + c) in view.idle_fg]
        procs = len(rec.placement)
        if len(free) < procs:
            raise Conflict(what=f"node {to_node}", problem=f"has {len(free)} free fg cores, job needs {procs}")
        act = Migrate(job_id=job_id, cores=tuple(free[:procs]), tier=Tier.FG)
        saved = self.config.migration
        # an operator's migration is not subject to min_gain_s, but is to the concurrency limits
        self.actuator.limits = type(saved)(saved.max_per_host, saved.max_per_cluster, 0.0, False, saved.timeout_s)
        try:
            _res, ch = self._operator_decision((act,))
        finally:
            self.actuator.limits = saved
        ops = [o for o in ch.ops.values() if o.kind == "migrate"]
        if ops:
            ops[0].detail["origin"] = "operator"
            return ops[0]
        return OperationRecord(id=f"local-{job_id}", kind="migrate", job_id=job_id, state="done",
                               created=self.clock.now(), updated=self.clock.now(), detail={})

    def set_vm_priority(self, vm_name: str, tier: str | None, weight: int | None, cap: float | None,
                        cap_given: bool, pin: int | None) -> str:
        """Operator change of one job VM; returns the node. Tier changes apply to the whole job (all its
        processes share one tier) as Promote/Demote through the invariant checker."""
        from vmctl.daemon.state import parse_vm_name

        parsed = parse_vm_name(vm_name)
        rec = self.state.jobs.get(parsed[0]) if parsed else None
        if parsed is None or rec is None or rec.run != parsed[1] or rec.state not in ACTIVE \
                or parsed[2] >= len(rec.placement):
            raise NotFound(kind="vm", name=vm_name)
        idx = parsed[2]
        actions: list[Any] = []
        if tier is not None and tier != rec.tier:
            actions.append(Promote(job_id=rec.id) if tier == "fg" else Demote(job_id=rec.id))
        if cap_given:
            actions.append(SetCap(job_id=rec.id, cap=cap))
        if pin is not None:
            node, _c = rec.placement[idx]
            n = self.node(node)
            if not 0 <= pin < n.cores:
                raise ValidationError(field="pin", problem=f"core {pin} not in 0..{n.cores - 1} on {node}")
            lay = self.state.layout()
            cores = [lay.offset[p[0]] + p[1] for p in rec.placement]
            cores[idx] = lay.offset[node] + pin
            actions.append(Migrate(job_id=rec.id, cores=tuple(cores), tier=Tier(tier or rec.tier or "fg")))
        if actions:
            self._operator_decision(tuple(actions))
        if weight is not None:
            ch = Changes()
            rec.weight = weight
            self.actuator.touch(ch, rec)
            self.commit(ch)
        return rec.placement[idx][0]

    # ------------------------------------------------------------------ housekeeping + decisions
    def housekeeping(self, now: float, ch: Changes) -> None:
        """The timers: nodes lost (no heartbeat for ``node_timeout_s``: unschedulable, jobs kept) and
        down (no heartbeat for ``node_down_s``: jobs requeued; their agent fenced them ``fence_s`` after
        its last contact, see docs/daemon.md), migrations past ``migration.timeout_s`` rolled back, fg jobs
        past estimate + grace killed. Timers that end work act only on what the agents reported to this
        daemon (``observed_at``), never on a state that may have changed while no daemon was listening."""
        st = self.state
        cfg = self.config
        prune_finished(self, now, ch)  # retention: finished jobs past retention.keep_s / keep_count
        for n in st.nodes.values():
            age = now - n.last_seen
            if n.state in ("ready", "draining") and age > cfg.node_timeout_s * self.speed:
                n.state = "lost"
                ch.nodes[n.name] = n
                ch.events.append(f"node {n.name} lost")
                log.warning("node %s lost (no heartbeat for %.1f s): nothing new is placed there; its %d jobs "
                            "are kept until loop.node_down_s", n.name, age / self.speed, len(st.jobs_on(n.name)))
                st.nodes_changed()
            if n.state == "lost" and age > cfg.node_down_s * self.speed:
                n.state = "down"
                ch.nodes[n.name] = n
                ch.events.append(f"node {n.name} down")
                log.warning("node %s down (no heartbeat for %.1f s): its jobs are requeued (its agent paused "
                            "them after loop.fence_s)", n.name, age / self.speed)
                for job in st.jobs_on(n.name):
                    if job.migrating:
                        op = st.ops.get(job.migrating)
                        if op is not None:
                            srcs = {str(m["from"][0]) for m in op.detail.get("moves", [])}
                            if n.name not in srcs:  # the target died: go back to the source
                                self.actuator.rollback_migration(op, job, now, ch, f"node {n.name} down")
                                continue
                    self.actuator.stop_job(ch, job, now, JobState.QUEUED, f"requeued: node {n.name} down")
                st.nodes_changed()
            elif n.state == "draining" and not st.jobs_on(n.name):
                n.state = "drained"
                ch.nodes[n.name] = n
        heard = self.observed_at
        for op in [o for o in st.ops.values() if o.state == "pending" and o.kind == "migrate"]:
            hosts = [str(h) for h in op.detail.get("hosts", [])]
            # not before every node of the migration reported to this daemon: it may have finished meanwhile
            if now - op.created > cfg.migration.timeout_s * self.speed and all(h in heard for h in hosts):
                mj = st.jobs.get(op.job_id)
                if mj is not None:
                    self.actuator.rollback_migration(op, mj, now, ch, "timed out")
        if cfg.kill_at_estimate:
            for job in st.active():
                if job.state != JobState.RUNNING or job.tier != "fg" or job.migrating:
                    continue
                if not all(t.get("seen", True) for t in job.tasks):
                    continue  # not every process reported started yet: it cannot have overrun
                limit = float(job.spec["estimate"]) + cfg.estimate_grace_s
                prog = st.progress(job, now)
                pace = st.pace(job)
                if prog <= limit or pace <= 0:
                    continue
                crossed = now - (prog - limit) / pace  # when its modelled progress passed estimate + grace
                # killed only when every node it runs on reported it still running in a relist that arrived
                # after that moment (a process that exited meanwhile ends the job as done, not killed)
                if all(heard.get(node, -math.inf) > crossed for node, _c in job.placement):
                    self.actuator.stop_job(ch, job, now, JobState.KILLED, "killed: ran past its estimate")

    def run_once(self) -> float | None:
        """One pass: housekeeping, then (if anything happened or a wake time passed) one decision.
        Returns when the daemon wants the next pass at the latest."""
        pending = self.begin_pass()
        if pending is not None:
            self.finish_decision(pending, self.choose(pending))
        return self.next_pass_at()

    def begin_pass(self) -> PendingDecision | None:
        """The first part of ``run_once``: housekeeping, then the view for a decision if one is due."""
        self.last_pass = time.monotonic()
        if not self.leader:
            return None
        now = self.clock.now()
        ch = Changes()
        self.housekeeping(now, ch)
        if ch.any():
            self.commit(ch)
            self.dirty = True
        due = self.wake_at is not None and now >= self.wake_at
        tick = now >= self.last_decide_at + self.config.tick_s * self.speed
        if self.dirty or due or tick:
            return self.begin_decision(now)
        return None

    def next_pass_at(self) -> float | None:
        """When the daemon wants the next pass at the latest (model time); None when standing by."""
        if not self.leader:
            return None
        nxt = self.last_decide_at + self.config.tick_s * self.speed
        if self.wake_at is not None:
            nxt = min(nxt, self.wake_at)
        return nxt

    def decide(self, now: float) -> Decision:
        pending = self.begin_decision(now)
        return self.finish_decision(pending, self.choose(pending))

    def begin_decision(self, now: float) -> PendingDecision:
        assert self.policy is not None
        started = time.perf_counter()
        self.dirty = False
        self.last_decide_at = now
        view, lay = self.state.build_view(now)
        return PendingDecision(now=now, view=view, layout=lay, policy=self.policy, started=started, loads=self.loads)

    @staticmethod
    def choose(pending: PendingDecision) -> Decision:
        """The policy's decision, checked. Reads only ``pending`` (the view is built for this decision
        and shares nothing mutable with the daemon's state), so it may run in a worker thread."""
        decision = pending.policy.decide(pending.view, pending.now)
        check_decision(pending.view, decision, pending.now)
        return decision

    def finish_decision(self, pending: PendingDecision, decision: Decision) -> Decision:
        """Actuate ``decision`` and commit it. If events came in since ``begin_decision`` (possible when
        ``choose`` ran in a thread), every action is checked against a fresh view of the state as it is
        now; if the state was reloaded, the nodes changed (core numbers may have moved) or the lease was
        lost meanwhile, nothing is applied and the next pass decides again."""
        now = pending.now
        self.last_decision = decision
        self.wake_at = decision.wake_at if decision.wake_at is not None and math.isfinite(decision.wake_at) else None
        if self.config.migration.dry_run:
            if decision.actions:
                log.info("dry-run: would apply %s", ", ".join(f"{a.kind} {a.job_id}" for a in decision.actions))
            self.last_result = ApplyResult(skipped=[(a, "dry-run") for a in decision.actions])
            return decision
        view, lay = pending.view, pending.layout
        if not self.leader or self.loads != pending.loads or self.state.layout() is not lay:
            log.info("decision dropped: the state changed under it (reload, node change or lost lease)")
            self.dirty = True
            self.last_result = ApplyResult(skipped=[(a, "state changed during the decision")
                                                    for a in decision.actions])
            return decision
        if self.dirty:
            view, lay = self.state.build_view(now)
        ch = Changes()
        res = self.actuator.apply(decision, view, lay, now, ch)
        self.last_result = res
        self.skipped_total += len(res.skipped)
        self.commit(ch)
        self.decisions += 1
        self.decision_seconds.append(time.perf_counter() - pending.started)
        if self.metrics is not None:
            m = self.metrics
            m.observe_cycle(self.decision_seconds[-1])
            for a in res.applied:
                m.decision(a.kind, "applied")
            for a, _why in res.skipped:
                m.decision(a.kind, "rejected")
            m.set_queue_length(self.state.queue_length())
            active = self.state.active()
            m.set_running("fg", sum(1 for j in active if j.tier == "fg"))
            m.set_running("bg", sum(1 for j in active if j.tier == "bg"))
            m.set_leader(self.leader, self.epoch)
        if len(self.decision_seconds) > 1000:
            del self.decision_seconds[:500]
        return decision

    # ------------------------------------------------------------------ explain
    def explain(self, job_id: str) -> dict[str, Any]:
        rec = self.job(job_id)
        pos: int | None = None
        if rec.state == JobState.QUEUED:
            ids = [j.id for j in self.state.queue()]
            pos = ids.index(rec.id) if rec.id in ids else None
        res = None
        d = self.last_decision
        if d is not None and d.reservation is not None:
            r = d.reservation
            res = {"job_id": r.job_id, "shadow_time": r.shadow_time, "extra_cores": r.extra_cores}
        migs = [{"id": o.id, "state": o.state, "origin": o.detail.get("origin"), "note": o.detail.get("note"),
                 "to": sorted({str(m["to"][0]) for m in o.detail.get("moves", []) if m["from"][0] != m["to"][0]})}
                for o in sorted(self.state.ops.values(), key=lambda o: (o.created, len(o.id), o.id))
                if o.job_id == rec.id and o.kind == "migrate"]
        return {"job_id": rec.id, "state": rec.state, "reason": rec.reason, "reservation": res, "queue_position": pos,
                "migrations": migs[-5:]}

    def view(self) -> ClusterView:
        return self.state.build_view(self.clock.now())[0]
