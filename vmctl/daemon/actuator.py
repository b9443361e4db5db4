"""Turn policy decisions into job records (and so into per-node desired state), and follow the agents'
reports until every action is confirmed.

The actuator is the paper's *dispatcher* (001 sec. III-A.3): the decision maker (the policy) only
plans; this module carries the plan out. Each action changes ``JobRecord``s; the nodes whose desired
state may have changed are collected in ``Changes.desired_nodes`` and their desired documents are
re-derived (``ClusterState.desired_vms``) and written in the same transaction as the records.

Actions are re-checked against the actual slot occupancy while they are applied, on the one
occupancy model (``vmctl.policies.occupancy``, the invariant checker's): one that cannot be carried
out (a migration over the safety limits, a slot that a skipped action did not free) is skipped and
logged, and so is every later action that depended on it; the next decision re-plans.

Multi-step actions are ``OperationRecord``s: migrate (between nodes), checkpoint, restore. While a
migration runs, the job's *source* slots stay reserved (``ClusterState.build_view``) so that a
rollback always has somewhere to go.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from vmctl.daemon import dispatcher
from vmctl.daemon.config import MigrationLimits
from vmctl.daemon.gang import apply_row_action, apply_schedule, is_row_action, row_form
from vmctl.daemon.gang import occupy as _occupy
from vmctl.daemon.state import ACTIVE, ClusterState, Layout, parse_vm_name, source_level
from vmctl.errors import InvariantViolation
from vmctl.model import (
    Action,
    Checkpoint,
    ClusterView,
    Decision,
    Demote,
    Discipline,
    JobState,
    Kill,
    Migrate,
    Move,
    NodeObserved,
    PlaceShared,
    PowerState,
    Promote,
    Resize,
    Restore,
    Resume,
    SetCap,
    Start,
    StartBg,
    StartFg,
    Suspend,
    Tier,
)
from vmctl.policies.occupancy import Occupancy, level_of, priority_form, queued_subset
from vmctl.store.base import JobRecord, NodeRecord, OperationRecord, Slot, slots_at

log = logging.getLogger("vmctld.actuator")


@dataclass(slots=True)
class Changes:
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    ops: dict[str, OperationRecord] = field(default_factory=dict)
    kv: dict[str, Any] = field(default_factory=dict)
    desired_nodes: set[str] = field(default_factory=set)
    events: list[str] = field(default_factory=list)  # reasons to run the policy again
    #: task bags of which only the dispatcher state and some tasks changed (a task end handed the worker its
    #: next one): stored without rewriting their job document (``WriteBatch.bags``)
    bags: dict[str, JobRecord] = field(default_factory=dict)

    def any(self) -> bool:
        return bool(self.jobs or self.bags or self.nodes or self.ops or self.kv or self.desired_nodes)


@dataclass(slots=True)
class ApplyResult:
    applied: list[Action] = field(default_factory=list)
    skipped: list[tuple[Action, str]] = field(default_factory=list)


class Actuator:
    def __init__(self, state: ClusterState, limits: MigrationLimits) -> None:
        self.state = state
        self.limits = limits
        #: observers (metrics): on_job_end(job, state, now), on_start(job, now), on_op_closed(op)
        self.on_job_end: Any = None
        self.on_start: Any = None
        self.on_op_closed: Any = None
        #: the policy's quota Q of tasks migrated per time slice (gang policies' ``quota``; None: none),
        #: checked again on every gang move to other cores (``vmctl.daemon.gang.quota_problem``)
        self.slice_quota: float | None = None

    # ------------------------------------------------------------------ helpers
    def touch(self, ch: Changes, job: JobRecord) -> None:
        ch.jobs[job.id] = job
        ch.desired_nodes |= self.state.reindex(job)

    def new_op(self, ch: Changes, kind: str, job_id: str, now: float, detail: dict[str, Any]) -> OperationRecord:
        op = OperationRecord(id=f"op{self.state.next_op}", kind=kind, job_id=job_id, state="pending",
                             created=now, updated=now, detail=detail)
        self.state.next_op += 1
        self.state.ops[op.id] = op
        ch.ops[op.id] = op
        return op

    def close_op(self, ch: Changes, op: OperationRecord, state: str, now: float, note: str = "") -> None:
        op.state = state
        op.updated = now
        if note:
            op.detail["note"] = note
        ch.ops[op.id] = op
        if self.on_op_closed is not None:
            self.on_op_closed(op)

    def open_migrations(self) -> list[OperationRecord]:
        return [o for o in self.state.ops.values() if o.kind == "migrate" and o.state == "pending"]

    def freeze_progress(self, job: JobRecord, now: float) -> None:
        self.state.close_stint(job, now)
        job.progress_base = self.state.progress(job, now)
        job.tier_since = now

    def start_record(self, job: JobRecord, slots: list[Slot], now: float, reason: str = "") -> None:
        """A queued job's record as it starts a new run on ``slots``;
        ``reason``: the start's ``Start.reason`` (why this width and place), kept as ``width_reason``."""
        job.run += 1
        job.state = JobState.RUNNING
        job.slots = slots
        job.start_time = now
        job.tier_since = now
        job.progress_base = 0.0
        job.tasks = [{"index": i, "exit_status": None, "error": None, "seen": False} for i in range(len(slots))]
        self.state.open_run(job)
        job.reason = None
        job.width_reason = reason or None
        job.suspended = job.checkpointed = job.restore_pending = False
        if self.on_start is not None:
            self.on_start(job, now)

    # ------------------------------------------------------------------ decisions
    def apply(self, decision: Decision, view: ClusterView, lay: Layout, now: float, ch: Changes) -> ApplyResult:
        res = ApplyResult()
        # what each action does to slot occupancy: the one occupancy model, on a copy-on-write overlay
        # of the view (the decision was checked on it; an action fails here only when an earlier one
        # was skipped, or when the view was rebuilt after events that came in during the decision)
        occ = Occupancy(view, queued_subset(view, {a.job_id for a in decision.actions}), now)

        def place(cores: tuple[int, ...]) -> list[tuple[str, int]]:
            return [(lay.node_of_core[c], lay.local_core[c]) for c in cores]

        moving_now: dict[str, int] = {}
        cluster_moving = 0
        for op in self.open_migrations():
            cluster_moving += 1
            for host in op.detail.get("hosts", []):
                moving_now[host] = moving_now.get(host, 0) + 1

        def moving(hosts: list[str], count: bool) -> str | None:
            """Why one more migration between ``hosts`` breaks the limits; with ``count``, it goes ahead."""
            nonlocal cluster_moving
            if not count:
                return self._limit_reached(hosts, cluster_moving, moving_now)
            cluster_moving += 1
            for h in hosts:
                moving_now[h] = moving_now.get(h, 0) + 1
            return None

        for act in decision.actions:
            job = self.state.jobs.get(act.job_id)
            if job is None:
                res.skipped.append((act, "unknown job"))
                continue
            start_reason = act.reason if isinstance(act, Start) else ""
            why: str | None = None
            if view.discipline is Discipline.TIMESLICE:
                act = row_form(act, job)
            row = is_row_action(act, view.discipline)
            if not row and isinstance(act, Start | Move):
                act = priority_form(act, checkpointed=job.checkpointed)
            if row:  # gang rows: any level of a timeslice cluster
                why = apply_row_action(self, act, job, now, ch, occ, place, moving)
            elif isinstance(act, StartFg | StartBg) or (isinstance(act, Start) and act.slot_levels is not None):
                # a Start left as such names slot levels: a task bag on several levels of a shared cluster
                levels = [lv for _c, lv in act.slots] if isinstance(act, Start) else \
                    [0 if isinstance(act, StartFg) else 1] * len(act.cores)
                if job.state != JobState.QUEUED:
                    why = f"job is {job.state}, not queued"
                elif (why := _occupy(occ, act)) is None:
                    kept = job.tasks if job.bag is not None else []  # a bag requeued with its results
                    self.start_record(job, [Slot(n, c, lv) for (n, c), lv in zip(place(act.cores), levels,
                                                                                   strict=True)], now, start_reason)
                    job.bag = None
                    shape = self.state.shape_of(job)
                    if shape is not None and shape.kind == "task-bag":  # workers take tasks at once
                        dispatcher.start(job, now, kept)
            elif isinstance(act, Promote | Demote):
                want = Tier.FG if isinstance(act, Promote) else Tier.BG
                rj = view.running.get(job.id)
                if job.state not in ACTIVE or rj is None or job.lowest_level == level_of(want):
                    why = f"job is not running in {want.other().value}"
                elif (why := _occupy(occ, act)) is None:
                    self.freeze_progress(job, now)
                    job.set_level(level_of(want))
            elif isinstance(act, Migrate):
                why = self._migrate(act, job, view, lay, now, ch, occ, place, moving_now, cluster_moving)
                if why is None and job.migrating:
                    cluster_moving += 1
            elif isinstance(act, Kill):
                if job.state not in ACTIVE:
                    why = f"job is {job.state}"
                elif (why := _occupy(occ, act)) is None:
                    self.stop_job(ch, job, now, JobState.QUEUED if act.requeue else JobState.KILLED,
                                  act.reason or ("killed and requeued" if act.requeue else "killed by the policy"))
            elif isinstance(act, Checkpoint):
                if job.state != JobState.RUNNING or job.checkpointed or job.migrating:
                    why = "job is not running (or is migrating)"
                elif (why := _occupy(occ, act)) is None:
                    self.freeze_progress(job, now)
                    job.checkpointed = True
                    job.state = JobState.SUSPENDED
                    self.new_op(ch, "checkpoint", job.id, now, {"placement": [list(p) for p in job.placement]})
            elif isinstance(act, Restore):
                if not (job.checkpointed or job.suspended):
                    why = "job is not checkpointed"
                elif (why := _occupy(occ, act)) is None:
                    job.slots = slots_at(place(act.cores), level_of(act.tier))
                    job.restore_pending = job.checkpointed
                    job.checkpointed = job.suspended = False
                    job.state = JobState.RUNNING
                    job.tier_since = now
                    self.new_op(ch, "restore", job.id, now, {"placement": [list(p) for p in job.placement]})
            elif isinstance(act, SetCap):
                if job.state not in ACTIVE:
                    why = "job is not running"
                elif (why := _occupy(occ, act)) is None:
                    job.cap = act.cap
            elif isinstance(act, Suspend):
                if job.state != JobState.RUNNING:
                    why = "job is not running"
                elif (why := _occupy(occ, act)) is None:
                    self.freeze_progress(job, now)
                    job.suspended = True
                    job.state = JobState.SUSPENDED
            elif isinstance(act, Resume):
                if not job.suspended or job.checkpointed:
                    why = "job is not suspended"
                elif (why := _occupy(occ, act)) is None:
                    job.suspended = False
                    job.state = JobState.RUNNING
                    job.tier_since = now
            elif isinstance(act, Resize):
                why = self._resize(act, job, lay, now, occ, place)
            elif isinstance(act, PlaceShared):
                why = self._place_shared(act, job, now, ch, occ, moving_now, cluster_moving)
                if why is None and job.migrating:
                    cluster_moving += 1
            else:
                why = f"{act.kind} is not carried out by this daemon"
            if why is None:
                res.applied.append(act)
                self.touch(ch, job)
            else:
                res.skipped.append((act, why))
                log.info("skipped %s of job %s: %s", act.kind, act.job_id, why)
        if decision.schedule is not None and view.discipline is Discipline.TIMESLICE:
            apply_schedule(self, decision.schedule, now, ch)
        # reasons of the jobs left waiting: kept in memory only (the next decision after a restart
        # recomputes them), so a decision does not rewrite every queued job's record
        for rec in self.state.queue():
            rec.reason = decision.reason_for(rec.id)
        return res

    def _migrate(self, act: Migrate, job: JobRecord, view: ClusterView, lay: Layout, now: float, ch: Changes,
                 occ: Occupancy, place: Any, moving_now: dict[str, int], cluster_moving: int) -> str | None:
        rj = view.running.get(job.id)
        if job.state != JobState.RUNNING or rj is None or job.migrating or job.checkpointed:
            return "job is not running (or already migrating)"
        try:
            occ.fits(job.id, level_of(act.tier), act.cores, "migrate")
        except InvariantViolation as exc:
            return str(exc)
        new_place: list[tuple[str, int]] = place(act.cores)
        moves: list[dict[str, Any]] = [
            {"index": i, "from": list(job.placement[i]), "to": list(new_place[i]), "mode": "live"}
            for i in range(len(new_place)) if job.placement[i] != new_place[i]]
        remote = [(job.placement[i][0], new_place[i][0]) for i in range(len(new_place))
                  if job.placement[i][0] != new_place[i][0]]
        hosts = sorted({a for a, _b in remote} | {b for _a, b in remote})
        blocked = self.unreachable(moves)
        if blocked is not None:
            return blocked
        if hosts:
            lim = self.limits
            full = self._limit_reached(hosts, cluster_moving, moving_now)
            if full is not None:
                return full
            gain = self.expected_gain(job, rj.tier, act, now)
            if gain < lim.min_gain_s:
                return f"expected gain {gain:.1f}s below migration.min_gain_s {lim.min_gain_s}"
        if (why := _occupy(occ, act)) is not None:
            return why
        self.freeze_progress(job, now)
        # processes that leave their node keep their source slot until the migration is confirmed (as
        # ClusterState.build_view reserves it between decisions): no later action of this decision may
        # place another VM of that tier there while the leaving VM still runs
        leaving = tuple(rj.cores[i] for i in range(min(len(new_place), len(rj.cores)))
                        if job.placement[i][0] != new_place[i][0])
        from_tier = job.tier
        job.slots = slots_at(new_place, level_of(act.tier))
        if hosts and from_tier in ("fg", "bg"):
            occ.hold(job.id, 0 if from_tier == "fg" else 1, leaving)
        if hosts:
            op = self.new_op(ch, "migrate", job.id, now, {"moves": moves, "hosts": hosts, "tier": act.tier.value,
                                                          "stage": "prepare", "target_gens": {},
                                                          "from_tier": from_tier, "origin": "policy"})
            job.migrating = op.id
            for h in hosts:
                moving_now[h] = moving_now.get(h, 0) + 1
        else:
            job.migrations += 1  # a re-pin on the same host: done when the agent applies it
        return None

    def _resize(self, act: Resize, job: JobRecord, lay: Layout, now: float, occ: Occupancy,
                place: Any) -> str | None:
        """A task bag's new worker set (``vmctl.daemon.dispatcher.resize``): applied on the occupancy
        model, whose slots a given-up worker still running its task keep held for the job until that
        task ends (no later action of this decision may take them)."""
        bag = job.bag
        if job.state != JobState.RUNNING or bag is None:
            return "job is not a running task bag"
        if (why := _occupy(occ, act)) is not None:
            return why
        draining = dispatcher.resize(job, [(n, c, lv) for (n, c), (_g, lv) in zip(place(act.cores), act.slots,
                                                                                  strict=True)], now)
        held = [(g, lv) for g, lv in ((lay.global_core(n, c), lv) for n, c, lv in draining) if g is not None]
        if held:
            occ.hold(job.id, 0, tuple(g for g, _lv in held), tuple(lv for _g, lv in held))
        return None

    def unreachable(self, moves: list[dict[str, Any]]) -> str | None:
        """Why one of ``moves`` goes between nodes that cannot reach each other (the source's agent
        registered no peer entry for the target); None when all can. The policy is not offered such
        moves (``ClusterView.can_migrate``): this is the second line of defence."""
        for m in moves:
            why = self.state.migration_block(str(m["from"][0]), str(m["to"][0]), str(m.get("mode", "live")))
            if why is not None:
                return why
        return None

    def _limit_reached(self, hosts: list[str], cluster_moving: int, moving_now: dict[str, int]) -> str | None:
        """Why one more migration touching ``hosts`` would exceed ``migration.max_per_cluster`` or
        ``max_per_host``; None when it fits."""
        lim = self.limits
        if cluster_moving + 1 > lim.max_per_cluster:
            return f"cluster migration limit {lim.max_per_cluster} reached"
        for h in hosts:
            if moving_now.get(h, 0) + 1 > lim.max_per_host:
                return f"host {h} migration limit {lim.max_per_host} reached"
        return None

    def _place_shared(self, act: PlaceShared, job: JobRecord, now: float, ch: Changes, occ: Occupancy,
                      moving_now: dict[str, int], cluster_moving: int) -> str | None:
        """vcsched: process i runs in an unpinned, capped VM (``VmRole.SHARED``) on ``act.nodes[i]``.
        A queued job starts; a running one whose nodes change migrates the processes that move."""
        for n in act.nodes:
            node = self.state.nodes.get(n)
            if node is None or node.state != "ready":
                return f"node {n} is not ready"
        new_place = [(n, -1) for n in act.nodes]
        if job.state == JobState.QUEUED:
            if (why := _occupy(occ, act)) is not None:
                return why
            job.run += 1
            job.state = JobState.RUNNING
            job.slots = slots_at(new_place, 0, shared=True)
            job.cap = act.cap
            job.start_time = now
            job.tier_since = now
            job.progress_base = 0.0
            job.tasks = [{"index": i, "exit_status": None, "error": None, "seen": False} for i in range(len(new_place))]
            self.state.open_run(job)
            job.reason = None
            if self.on_start is not None:
                self.on_start(job, now)
            return None
        if job.state != JobState.RUNNING or not job.shared or job.migrating:
            return "job is not a running shared job (or is migrating)"
        if len(new_place) != len(job.placement):
            return f"{len(new_place)} nodes for {len(job.placement)} processes"
        moved = [i for i in range(len(new_place)) if job.placement[i][0] != new_place[i][0]]
        if not moved:
            if (why := _occupy(occ, act)) is not None:
                return why
            self.freeze_progress(job, now)
            job.cap = act.cap
            return None
        moves: list[dict[str, Any]] = [
            {"index": i, "from": list(job.placement[i]), "to": list(new_place[i]), "mode": "live"} for i in moved]
        hosts = sorted({job.placement[i][0] for i in moved} | {new_place[i][0] for i in moved})
        blocked = self.unreachable(moves)
        if blocked is not None:
            return blocked
        full = self._limit_reached(hosts, cluster_moving, moving_now)
        if full is not None:
            return full
        if (why := _occupy(occ, act)) is not None:
            return why
        self.freeze_progress(job, now)
        job.cap = act.cap
        job.slots = slots_at(new_place, 0, shared=True)
        op = self.new_op(ch, "migrate", job.id, now, {"moves": moves, "hosts": hosts, "tier": "shared",
                                                      "stage": "prepare", "target_gens": {}, "from_tier": "shared",
                                                      "origin": "policy"})
        job.migrating = op.id
        for h in hosts:
            moving_now[h] = moving_now.get(h, 0) + 1
        return None

    def expected_gain(self, job: JobRecord, from_tier: Tier, act: Migrate, now: float) -> float:
        """Seconds of job time a migration is expected to save: the remaining estimate times the pace it
        gains (a bg job that the fg VMs leave 30% of its cores gains 0.7 of its remaining time when it
        moves to fg), minus the migration's cost."""
        remaining = max(0.0, float(job.spec["estimate"]) - self.state.progress(job, now))
        pace_now = self.state.pace(job)
        pace_after = 1.0 if act.tier is Tier.FG else pace_now
        if from_tier is Tier.FG and act.tier is Tier.FG:
            return math.inf  # consolidation: no per-job gain to weigh, so min_gain_s does not apply
        return remaining * max(0.0, pace_after - pace_now) - act.cost

    # ------------------------------------------------------------------ job ends
    def stop_job(self, ch: Changes, job: JobRecord, now: float, state: JobState, reason: str,
                 keep_results: bool = False) -> None:
        """End or requeue ``job``. ``keep_results``: a task bag requeued keeps its tasks' results (its
        next run hands out only the unfinished ones)."""
        if job.migrating:
            op = self.state.ops.get(job.migrating)
            if op is not None and op.state == "pending":
                self.close_op(ch, op, "aborted", now, f"job {state}")
                if state == JobState.QUEUED:
                    self.state.stopped_moving(job, op)
            job.migrating = None
        for op in self.state.ops.values():
            if op.job_id == job.id and op.state == "pending":
                self.close_op(ch, op, "aborted", now, f"job {state}")
        job.slots = []
        if job.bag is not None:  # a task bag's workers are gone (its task results stay, unless requeued)
            dispatcher.stop(job, f"stopped: job {state}")
        job.suspended = job.checkpointed = job.restore_pending = False
        job.gang, job.replicas = False, []
        job.cap = None
        job.weight = None
        if state == JobState.QUEUED:
            job.state = JobState.QUEUED
            job.progress_base = 0.0
            job.tier_since = None
            job.est_base = job.cpu_mark = None
            if not (keep_results and job.bag is not None):
                job.tasks = []
                job.bag = None
            job.reason = reason
        else:
            job.state = state
            job.end_time = now
            job.reason = reason
        self.touch(ch, job)
        ch.events.append(f"job {job.id} {state}")
        if self.on_job_end is not None and state != JobState.QUEUED:
            self.on_job_end(job, state, now)

    # ------------------------------------------------------------------ agent reports
    def observe(self, obs: NodeObserved, now: float, ch: Changes) -> None:
        st = self.state
        st.set_observed(obs)
        seen: dict[str, Any] = {}
        for v in obs.vms:
            parsed = parse_vm_name(v.name)
            if parsed is None:
                continue
            jid, run, idx = parsed
            seen[v.name] = v
            job = st.jobs.get(jid)
            if job is not None and job.bag is not None:
                if job.run == run and job.state == JobState.RUNNING:
                    self._observe_worker(job, idx, v, obs.node, now, ch)
                continue
            if job is None or job.run != run or job.state not in ACTIVE or idx >= len(job.tasks):
                continue
            if job.placement and idx < len(job.placement) and job.placement[idx][0] != obs.node and not job.migrating:
                continue  # a stale copy on a node the process left
            task = job.tasks[idx]
            if task.get("seen") is False and v.process_job == jid and v.process_index == idx:
                # the first report that shows this process started: its run is modelled from here, not from
                # the decision that placed it (an agent may have learnt of it only after a daemon restart)
                task["seen"] = True
                if job.state == JobState.RUNNING and not job.migrating:
                    job.progress_base = 0.0
                    job.tier_since = now
                    st.open_run(job)
                ch.jobs[job.id] = job
            if task["exit_status"] is None:
                if v.process_exit is not None:
                    task["exit_status"] = int(v.process_exit)
                    ch.jobs[job.id] = job
                elif v.power is PowerState.CRASHED:
                    task["exit_status"] = -1
                    task["error"] = "VM crashed"
                    ch.jobs[job.id] = job
            if job.tasks and all(t["exit_status"] is not None for t in job.tasks):
                ok = all(t["exit_status"] == 0 for t in job.tasks)
                self.stop_job(ch, job, now, JobState.DONE if ok else JobState.FAILED,
                              "finished" if ok else "a process exited with a non-zero status")
        # operations waiting for this node
        for op in [o for o in st.ops.values() if o.state == "pending"]:
            job = st.jobs.get(op.job_id)
            if job is None:
                continue
            if op.kind == "migrate":
                self._follow_migration(op, job, now, ch)
            elif op.kind in ("checkpoint", "restore"):
                want = PowerState.SAVED if op.kind == "checkpoint" else PowerState.RUNNING
                nodes = {str(p[0]) for p in op.detail.get("placement", [])}
                if obs.node not in nodes:
                    continue
                ok = True
                for i, (n, _c) in enumerate(op.detail.get("placement", [])):
                    o = st.observed.get(str(n))
                    vm = next((v for v in o.vms if v.name == job.vm_name(i)), None) if o else None
                    if vm is None or vm.power is not want:
                        ok = False
                        break
                if ok:
                    self.close_op(ch, op, "done", now)
                    if op.kind == "restore":
                        job.restore_pending = False
                        self.touch(ch, job)
                    ch.events.append(f"{op.kind} {op.id} done")

    def _observe_worker(self, job: JobRecord, vm_number: int, v: Any, node: str, now: float, ch: Changes) -> None:
        """A task bag's worker VM in a report: the dispatcher records a task's end and hands the worker
        its next task (a changed desired state); the job ends when its last task has."""
        i = job.bag["vms"].index(vm_number) if job.bag is not None and vm_number in job.bag["vms"] else -1
        if i < 0 or job.placement[i][0] != node:
            return  # a worker that left, or a stale copy on another node
        held = len(job.placement)
        if not dispatcher.observe(job, vm_number, v, now):
            return
        if len(job.placement) == held and not dispatcher.finished(job):  # the worker took its next task
            ch.bags[job.id] = job
            ch.desired_nodes |= self.state.reindex(job)
            return
        self.touch(ch, job)
        if dispatcher.finished(job):
            failed = any(t["exit_status"] != 0 for t in job.tasks)
            self.stop_job(ch, job, now, JobState.FAILED if failed else JobState.DONE,
                          "a task exited with a non-zero status" if failed else "finished")
        elif len(job.placement) < held:
            ch.events.append(f"job {job.id} released a worker")  # the decision maker runs (passive)

    def _follow_migration(self, op: OperationRecord, job: JobRecord, now: float, ch: Changes) -> None:
        st = self.state
        for host in op.detail.get("hosts", []):  # an agent refused this migration: take it back at once
            o = st.observed.get(str(host))
            ref = next((r for r in o.refusals if r.migration_id == op.id), None) if o is not None else None
            if ref is not None:
                self.rollback_migration(op, job, now, ch, f"the agent of {host} refused it: {ref.reason}")
                return
        if op.detail.get("stage") == "prepare":
            # the target is ready when it applied the generation that expects the VM, or when its report
            # already lists the incoming VM (the agent reports it as absent, phase "waiting")
            gens: dict[str, int] = op.detail.get("target_gens") or {}
            ready = True
            for m in op.detail.get("moves", []):
                t = str(m["to"][0])
                if m["from"][0] == m["to"][0]:
                    continue
                o = st.observed.get(t)
                name = job.vm_name(int(m["index"]))
                if o is None or not (o.generation_applied >= gens.get(t, 1 << 62)
                                     or any(v.name == name for v in o.vms)):
                    ready = False
                    break
            if ready:
                op.detail["stage"] = "go"
                op.updated = now
                ch.ops[op.id] = op
                self.touch(ch, job)
            return
        done = True
        for m in op.detail.get("moves", []):
            src, dst = m["from"], m["to"]
            if src[0] == dst[0]:
                continue
            name = job.vm_name(int(m["index"]))
            s_obs, d_obs = st.observed.get(str(src[0])), st.observed.get(str(dst[0]))
            s_vm = next((v for v in s_obs.vms if v.name == name), None) if s_obs else None
            d_vm = next((v for v in d_obs.vms if v.name == name), None) if d_obs else None
            for v in (s_vm, d_vm):
                if v is not None and v.migration_phase in ("failed", "aborted"):
                    self.rollback_migration(op, job, now, ch, f"agent reported {v.migration_phase}")
                    return
            arrived = d_vm is not None and d_vm.power in (PowerState.RUNNING, PowerState.PAUSED) and \
                d_vm.migration_phase in (None, "completed", "arrived")
            left = s_vm is None or s_vm.migration_phase == "completed" or s_vm.power is PowerState.ABSENT
            if not (arrived and left):
                done = False
        if done:
            self.close_op(ch, op, "done", now)
            job.migrating = None
            job.migrations += 1
            job.tier_since = now
            self.touch(ch, job)
            ch.events.append(f"migration {op.id} done")

    def rollback_migration(self, op: OperationRecord, job: JobRecord, now: float, ch: Changes, why: str) -> None:
        """Put the job back where it was (its source slots stayed reserved)."""
        left = source_level(op, job)  # a gang job goes back to its row too
        slots = [Slot(s.node, s.core, left) for s in job.slots]
        for m in op.detail.get("moves", []):
            i = int(m["index"])
            if i < len(slots):
                core = int(m["from"][1])
                slots[i] = Slot(str(m["from"][0]), None if slots[i].shared else core, left)
        job.slots = slots
        job.migrating = None
        job.tier_since = now
        self.close_op(ch, op, "rolled_back", now, why)
        self.touch(ch, job)
        ch.events.append(f"migration {op.id} rolled back: {why}")
        log.warning("migration %s of job %s rolled back: %s", op.id, job.id, why)
