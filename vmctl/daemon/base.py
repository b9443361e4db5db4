"""The ``Daemon``'s foundation (``vmctl.daemon.core`` composes the rest on it): its state, the
leader lease and the reload from the store, the active policy, and ``commit``, the one transaction
every event ends in (desired state derived from the changed records, the leader epoch checked).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from vmctl.clock import Clock, SystemClock
from vmctl.daemon.actuator import Actuator, ApplyResult, Changes
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.desired import desired_vms
from vmctl.daemon.events import EventLog
from vmctl.daemon.gang import SCHEDULE_KV, check_offer, clock_changed, node_slices, schedule_from_kv
from vmctl.daemon.history import JobHistory, slot_text
from vmctl.daemon.state import PROGRESS, ClusterState, DesiredSettings
from vmctl.daemon.switch_state import (
    LAYOUT_KV,
    SWITCH_KV,
    SwitchRecord,
    layout_from_kv,
    layout_to_json,
    policy_layout,
    switch_from_kv,
)
from vmctl.errors import (
    Conflict,
    LeaseLost,
    NotFound,
    PolicyNeedsUnmet,
    PolicyParameterError,
    StoreError,
    VmctlError,
)
from vmctl.model import Decision
from vmctl.policies.base import SchedulingPolicy
from vmctl.store.base import JobRecord, NodeRecord, OperationRecord, Store, StoreDamaged, WriteBatch
from vmctl.wire import slices_to_json, vm_desired_from_json, vm_desired_to_json

log = logging.getLogger("vmctld")

#: preference order when the configured default policy is not registered (yet)
FALLBACK_POLICIES = ("measy", "reasy", "keasy", "easy", "fcfs")


class NotLeader(VmctlError):
    reference = "not-leader"
    retryable = True
    template = "this vmctld is a standby (leader: {holder})"
    http_status = 503



#: ``DaemonBase.reasons_defer_s``'s default: the reasons of a burst of submissions into a cluster with no idle
#: core lag by at most this (a job's start never does: a decision that could start one is never put off)
REASONS_DEFER_S = 1.0


class DaemonBase:
    """State, leadership, policy and commit; the event handlers are in the modules ``core`` names."""

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
        #: issue 27: real seconds for which the decision loop may put off a decision that cannot start anything
        #: (``SchedulingPolicy.cannot_act``) after the last one the policy made: such a decision would only
        #: rewrite the queued jobs' reasons (``DecisionLoop.begin_decision``; 0: never put off)
        self.reasons_defer_s = REASONS_DEFER_S
        #: when (``time.monotonic``) the last decision the policy made ended; a put-off decision's reasons are
        #: due ``reasons_defer_s`` after it (``reasons_due``: the decision loop passes then)
        self.full_decision_at = -math.inf
        self.reasons_due: float | None = None
        self.deferred_decisions = 0  # passes whose decision was put off (``DecisionLoop.choose``)
        self.loads = 0  # state reloads from the store (a decision made before one is not applied)
        self.decision_seconds: list[float] = []
        self.skipped_total = 0
        #: node -> model time at which its last *fresh* full report (a new relist) arrived, since this daemon
        #: took the lease (memory only, emptied by ``load``). No timer that ends work acts on a node before
        #: its entry exists: what the agents observed while the daemon was down is learnt first.
        self.observed_at: dict[str, float] = {}
        #: node -> until when a fence pause its agent reported was taken off its fg jobs' estimate account
        #: (``NodeEvents._fence_pause``; memory only)
        self._fence_credited: dict[str, float] = {}
        #: nodes whose desired state the next commit writes as a new generation even if its VM list is the
        #: same (an agent that applied a generation the store lost in a rollback: ``NodeEvents.report``)
        self.force_desired: set[str] = set()
        self.events = EventLog()  # the event log (vmctl events): collected here, written with each change
        self.history = JobHistory(sink=self._job_event)  # the jobs' history entries (vmctl job show)
        self._op_states: dict[str, str] = {}  # operation id -> its state in the last event about it
        #: called after a write that stored events (the API wakes its event long polls)
        self.on_events: Callable[[], None] = lambda: None
        #: called with the names of nodes whose desired state changed (after the commit)
        self.on_desired: Callable[[set[str]], None] = lambda nodes: None
        self.metrics: Any = None  # a vmctl.metrics.DaemonMetrics when served (set by the API server)
        #: the store's database found damaged (``StoreDamaged``): the daemon gave up the lease, answers 503
        #: and never campaigns again; the operator restores a backup and restarts it
        self.damaged: StoreDamaged | None = None
        #: called when the daemon stopped leading on its own (a damaged store): the server wakes its waiters
        self.on_step_down: Callable[[], None] = lambda: None
        store.on_damaged = self._store_damaged
        #: a policy switch in progress (kv ``policy.switch``; ``vmctl.daemon.switch``)
        self.switch: SwitchRecord | None = None
        #: the cluster layout was chosen for the policy in force at load and is not stored yet
        self._layout_unsaved = False

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
        # the progress model of a bg job (``bg_pace``) imports scipy.special on its first use (0.2-0.7 s):
        # at start, not inside the first decision that has a bg job to pace (issue 27's latency p99)
        PROGRESS.expected_beta(2)
        return self.try_lead()

    def try_lead(self) -> bool:
        if self.damaged is not None:
            return False
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

    def _store_damaged(self, exc: StoreDamaged) -> None:
        """The store found its database damaged (``Store.on_damaged``, outside any transaction): nothing
        more is served from it. The leader steps down and releases the lease (a standby on a healthy
        replica may take it; if the lease row itself cannot be written, it expires), ``/healthz`` answers
        503 and every request that needs the leader 503 ``store-damaged`` instead of 500s."""
        if self.damaged is not None:
            return
        self.damaged = exc
        was_leader, self.leader = self.leader, False
        what = "giving up the leader lease" if was_leader else "not campaigning for the lease"
        log.critical("%s: out of service, %s; %s", exc, what, exc.hint)
        if was_leader:
            try:
                self.store.release_lease(self.config.holder, self.epoch)
                log.critical("released the leader lease (epoch %d)", self.epoch)
            except StoreError as err:
                log.critical("could not release the leader lease (%s): it expires in at most %.0f s", err,
                             self.config.lease_ttl_s)
        self.on_step_down()

    def damaged_error(self) -> StoreDamaged | None:
        """A fresh ``StoreDamaged`` like the one found (for an answer), or None while the store is sound."""
        return None if self.damaged is None else StoreDamaged(**self.damaged.fields)

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
        # the slice schedule in force and the one each node's desired generation carries (gang scheduling)
        node_slices = {n: schedule_from_kv(doc.get("slices")) for n, (_g, doc) in desired_raw.items()}
        self.state.load(self.store.load_jobs(), self.store.load_nodes(), self.store.load_operations(), desired,
                        (schedule_from_kv(self.store.get_kv(SCHEDULE_KV)), node_slices))
        # the layout vmctld lays the cluster out in, a policy switch in progress, and each node's stored layout
        self.state.cluster_layout = layout_from_kv(self.store.get_kv(LAYOUT_KV))
        self.switch = switch_from_kv(self.store.get_kv(SWITCH_KV))
        self.state.switch_layout = self.switch.layout if self.switch is not None else None
        self.state.desired_layout = {n: layout_from_kv(doc.get("layout")) for n, (_g, doc) in desired_raw.items()}
        self.loads += 1
        self.history.forget()
        self.events.load(self.store)
        self._op_states = {o.id: o.state for o in self.state.ops.values()}
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
        self._layout_for_policy()
        self.dirty = True

    def _layout_for_policy(self) -> None:
        """A policy in force that the registered cluster cannot serve (a configured gang policy on agents
        laid out for MEASY, or with no agent yet) does not stop vmctld: the cluster is laid out for it
        (``cluster_layout``: the nodes' desired state tells their agents, which re-lay out once they hold no
        job VM) and the policy waits for nodes that carry that layout (``policy_waiting``)."""
        pol, st = self.policy, self.state
        if pol is None or st.cluster_layout is not None or self.switch is not None or not st.nodes:
            return  # (with no node yet, the first registration decides: ``NodeEvents._node_layout``)
        try:
            check_offer(st.offer(), pol)
            return
        except VmctlError:
            pass
        st.cluster_layout = policy_layout(pol)
        st.nodes_changed()
        self._layout_unsaved = True
        log.warning("policy %s cannot run on the registered cluster: laying it out in %s (the agents re-lay out "
                    "once they hold no job VM; the policy waits for nodes)", pol.name, st.cluster_layout.text())

    def _make_policy(self, name: str, params: dict[str, Any]) -> SchedulingPolicy:
        from vmctl.policies.registry import create_policy

        policy = create_policy(name, **params)
        policy_layout(policy)  # a layout no agent can carry (mpl above MAX_LAYOUT_LEVELS) is refused here
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

    def set_policy(self, name: str, params: dict[str, Any]) -> SchedulingPolicy:
        """Switch to a policy the cluster's layout serves, at once (else ``PolicyNeedsUnmet`` naming the
        way out: ``vmctl policy set NAME --relayout``, ``PolicySwitch.start_switch``). With no node
        registered and no layout set yet, the cluster is laid out for the policy."""
        self._require_leader()
        if self.switch is not None:
            raise Conflict(what="policy", problem=f"a switch to {self.switch.policy} ({self.switch.layout.text()}) "
                                                  "is in progress: wait for it (vmctl policy show) or cancel it "
                                                  "(vmctl policy cancel)")
        pol = self._make_policy(name, params)
        ch = Changes()
        if not self.state.nodes and self.state.cluster_layout is None:
            try:
                check_offer(self.state.offer(), pol)
            except VmctlError:
                self.state.cluster_layout = policy_layout(pol)
                ch.kv[LAYOUT_KV] = layout_to_json(self.state.cluster_layout)
        else:
            try:
                check_offer(self.state.offer(), pol)
            except (PolicyNeedsUnmet, PolicyParameterError) as exc:
                way = (f"; to lay the cluster out in {policy_layout(pol).text()} (running jobs end first): vmctl "
                       f"policy set {pol.name} ... --relayout")
                if isinstance(exc, PolicyParameterError):
                    raise PolicyParameterError(policy=pol.name, param=exc.fields["param"],
                                               problem=exc.fields["problem"] + way) from exc
                raise PolicyNeedsUnmet(policy=pol.name, where=exc.fields["where"],
                                       problem=exc.fields["problem"] + way) from exc
        self._policy_changed(pol, ch)
        return pol

    def _policy_changed(self, pol: SchedulingPolicy, ch: Changes) -> None:
        """Put ``pol`` in force (stored in kv ``policy`` with the rest of ``ch``, an event logged)."""
        ch.kv["policy"] = {"name": pol.name, "params": dict(pol.params)}
        ch.events.append("policy changed")
        old = self.policy.name if self.policy is not None else "none"
        shown = ", ".join(f"{k}={v}" for k, v in sorted(pol.reported_params().items()))
        self.events.add(self.clock.now(), "policy.changed", f"policy {old} -> {pol.name}"
                        + (f" ({shown})" if shown else ""))
        self.commit(ch)
        self.policy = pol
        self.dirty = True

    # ------------------------------------------------------------------ commit
    def _require_leader(self) -> None:
        damaged = self.damaged_error()
        if damaged is not None:
            raise damaged
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
        batch = WriteBatch(jobs=dict(ch.jobs), nodes=dict(ch.nodes), operations=dict(ch.ops), kv=dict(ch.kv),
                           bags={k: j for k, j in ch.bags.items() if k not in ch.jobs})
        if self._layout_unsaved and st.cluster_layout is not None:
            ch.kv.setdefault(LAYOUT_KV, layout_to_json(st.cluster_layout))
            ch.desired_nodes |= set(st.nodes)
        new_desired: dict[str, tuple[Any, ...]] = {}
        for node in sorted(ch.desired_nodes):
            if node not in st.nodes:
                continue
            vms = desired_vms(st, node)
            if node in self.force_desired or vms != st.desired.get(node, ()) or clock_changed(st, node, vms) \
                    or st.wanted_layout(node) != st.desired_layout.get(node):
                new_desired[node] = vms
        gens: dict[str, int] = {}
        if new_desired:
            for node, vms in new_desired.items():
                gen = st.generation.get(node, 0) + 1
                gens[node] = gen
                rec = st.nodes[node]
                rec.generation = gen
                batch.nodes[node] = rec
                doc: dict[str, Any] = {"node": node, "generation": gen, "vms": [vm_desired_to_json(v) for v in vms]}
                sl = node_slices(st, node)
                if sl is not None:
                    doc["slices"] = slices_to_json(sl)
                lay = st.wanted_layout(node)
                if lay is not None:
                    doc["layout"] = layout_to_json(lay)
                batch.desired[node] = (gen, doc)
        for op in batch.operations.values():
            # a migration in its prepare stage waits for the target to apply this generation
            if op.kind == "migrate" and op.state == "pending" and op.detail.get("stage") == "prepare":
                tg = op.detail.setdefault("target_gens", {})
                for m in op.detail.get("moves", []):
                    t = str(m["to"][0])
                    if m["from"][0] != m["to"][0] and t not in tg:
                        tg[t] = gens.get(t, st.generation.get(t, 0))
        self._op_events(batch.operations.values())
        batch.events = self.events.take()
        if batch.empty():
            return
        try:
            self.store_write(batch)
        except LeaseLost:
            raise
        except StoreError as exc:
            if isinstance(exc, StoreDamaged) or self.damaged is not None:
                raise  # out of service (``_store_damaged``): nothing to reload from
            log.exception("store write failed; reloading state from the store")
            self.load()
            raise
        if LAYOUT_KV in batch.kv:
            self._layout_unsaved = False
        for node, vms in new_desired.items():
            self.force_desired.discard(node)
            st.desired[node] = vms
            st.desired_slices[node] = node_slices(st, node)
            st.desired_layout[node] = st.wanted_layout(node)
            st.generation[node] = gens[node]
        if ch.events:
            self.dirty = True
        if new_desired:
            self.on_desired(set(new_desired))

    def store_write(self, batch: WriteBatch) -> None:
        """Write ``batch`` (with the events collected for it) under the leader epoch; a lost lease steps
        the daemon down. Then the events are logged and the event long polls woken."""
        try:
            self.store.write(self.epoch, batch)
        except LeaseLost:
            self.step_down()
            raise
        if batch.events:
            self.events.written(batch.events)
            self.on_events()

    # ------------------------------------------------------------------ events
    def _job_event(self, rec: JobRecord, now: float, event: str, detail: str | None) -> None:
        """A job history entry is also an event of the log."""
        name = f" ({rec.name})" if rec.name and rec.name != f"job-{rec.id}" else ""
        self.events.add(now, f"job.{event}", f"job {rec.id}{name} {event}" + (f": {detail}" if detail else ""),
                        job_id=rec.id)

    def _op_events(self, ops: Iterable[OperationRecord]) -> None:
        """An event for every operation that started or changed state in this change."""
        now = self.clock.now()
        for op in ops:
            if self._op_states.get(op.id) == op.state:
                continue
            self._op_states[op.id] = op.state
            moves = ", ".join(f"{slot_text(m.get('from'))} -> {slot_text(m.get('to'))}"
                              for m in op.detail.get("moves") or () if isinstance(m, dict))
            what = f"{op.kind} {op.id} of job {op.job_id}"
            if op.state == "pending":
                self.events.add(now, "operation.started", f"{what} started" + (f": {moves}" if moves else ""),
                                job_id=op.job_id)
            else:
                note = op.detail.get("note")
                self.events.add(now, f"operation.{op.state}", f"{what} {op.state}" + (f": {note}" if note else ""),
                                job_id=op.job_id)
                self._op_states.pop(op.id, None)

    # ------------------------------------------------------------------ lookups
    def job(self, job_id: str) -> JobRecord:
        rec = self.state.jobs.get(job_id)
        if rec is None:
            raise NotFound(kind="job", name=job_id)
        return rec

    def node(self, name: str) -> NodeRecord:
        rec = self.state.nodes.get(name)
        if rec is None:
            raise NotFound(kind="node", name=name)
        return rec

