"""Turn policy decisions into job records: decision -> effects -> records -> projections.

The actuator is the paper's *dispatcher* (001 sec. III-A.3): the decision maker (the policy) only
plans; this module carries the plan out. Each action is applied on the one occupancy model
(``vmctl.policies.occupancy``, the invariant checker's and the simulator's), which says what it does as a
typed effect (``vmctl.policies.effects``: started, moved, restored, stopped, ...; with the placement
before and after, in view coordinates). The actuator commits the effect, not the action: one transition
per effect kind changes the ``JobRecord`` (its ``slots``) and opens the operations the agents must
confirm; the nodes whose desired state may have changed are collected in ``Changes.desired_nodes`` and
their documents re-derived from the records (``vmctl.daemon.desired``, ``vmctl.daemon.view``) in the
same transaction.

An effect can be refused here though the model accepted it: the record says otherwise (an event came in
while the policy decided: a job cancelled, a migration begun), or a move between hosts fails the daemon's
guard (``_guard``: the source cannot reach the target, the migration limits, the minimum gain, a gang
policy's quota Q). A refused action is taken back from the model (``_Model.undo``), skipped and logged,
and so is every later action that depended on it; the next decision re-plans.

Multi-step actions are ``OperationRecord``s: migrate (between nodes, ``RecordWriter.begin_migration``),
checkpoint, restore; ``vmctl.daemon.follow`` follows them to their end. While a migration runs, the job's
*source* slots stay reserved (in the model here, in the view between decisions) so that a rollback
always has somewhere to go.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from vmctl.daemon import dispatcher
from vmctl.daemon.config import MigrationLimits
from vmctl.daemon.follow import Follower
from vmctl.daemon.gang import apply_schedule, quota_problem, row_form
from vmctl.daemon.records import Changes
from vmctl.daemon.state import ACTIVE, ClusterState, Layout
from vmctl.errors import InvariantViolation
from vmctl.model import Action, ClusterView, Decision, Discipline, Job, JobState, Kill, SetCap, Start
from vmctl.policies.effects import Effect, EffectKind, Placement
from vmctl.policies.occupancy import Occupancy, priority_form, queued_subset
from vmctl.store.base import JobRecord, OperationRecord, Slot

log = logging.getLogger("vmctld.actuator")

__all__ = ["Actuator", "ApplyResult", "Changes"]


@dataclass(slots=True)
class ApplyResult:
    applied: list[Action] = field(default_factory=list)
    skipped: list[tuple[Action, str]] = field(default_factory=list)


class _Model:
    """The occupancy model of one decision, on a copy-on-write overlay of the view (the decision was
    checked on it; an action fails here only when an earlier one was skipped, or when the view was rebuilt
    after events that came in during the decision). ``undo`` takes the last applied action back: the
    model is built again from the view with the steps kept (a refusal is rare; a step is cheap)."""

    def __init__(self, view: ClusterView, queued: dict[str, Job], now: float) -> None:
        self._base = (view, queued, now)
        self.occ = Occupancy(view, dict(queued), now)
        self._steps: list[Callable[[Occupancy], object]] = []

    def apply(self, act: Action) -> Effect:
        eff = self.occ.apply(act)
        self._steps.append(lambda o: o.apply(act))
        return eff

    def hold(self, job_id: str, level: int, cores: tuple[int, ...], levels: tuple[int, ...] | None = None) -> None:
        """Keep slots the job leaves held for it (a migration's sources, a bag's draining workers)."""
        if cores:
            self.occ.hold(job_id, level, cores, levels)
            self._steps.append(lambda o: o.hold(job_id, level, cores, levels))

    def undo(self) -> None:
        self._steps.pop()
        view, queued, now = self._base
        self.occ = Occupancy(view, dict(queued), now)
        for step in self._steps:
            step(self.occ)


@dataclass(slots=True)
class _Moving:
    """Migrations in flight, per host and in the cluster (the limits ``migration.max_per_host`` and
    ``max_per_cluster``), counting those this decision begins."""

    per_host: dict[str, int]
    cluster: int

    def full(self, hosts: list[str], lim: MigrationLimits) -> str | None:
        if self.cluster + 1 > lim.max_per_cluster:
            return f"cluster migration limit {lim.max_per_cluster} reached"
        for h in hosts:
            if self.per_host.get(h, 0) + 1 > lim.max_per_host:
                return f"host {h} migration limit {lim.max_per_host} reached"
        return None

    def add(self, hosts: list[str]) -> None:
        self.cluster += 1
        for h in hosts:
            self.per_host[h] = self.per_host.get(h, 0) + 1


@dataclass(slots=True)
class _Commit:
    """What the transitions of one decision share."""

    model: _Model
    lay: Layout
    now: float
    ch: Changes
    moving: _Moving
    timeslice: bool
    #: the action being committed as the policy gave it (before it was put in the discipline's words)
    asked: Action | None = None

    def slots(self, p: Placement | None) -> list[Slot]:
        """A placement of the model (view coordinates) as record slots."""
        if p is None:
            return []
        if p.shared:
            return [Slot(n, None, 0) for n in p.nodes]
        levels = p.slot_levels or (p.level,) * len(p.cores)
        return [Slot(self.lay.node_of_core[c], self.lay.local_core[c], lv) for c, lv in zip(p.cores, levels,
                                                                                              strict=True)]


def _asked(act: Action) -> tuple[str, float | None]:
    """What an action says beyond its effect: a start's or kill's reason, a cap asked for."""
    reason = act.reason if isinstance(act, Start | Kill) else ""
    return reason, act.cap if isinstance(act, SetCap) else None


class Actuator(Follower):
    def __init__(self, state: ClusterState, limits: MigrationLimits) -> None:
        super().__init__(state, limits)
        #: the policy's quota Q of tasks migrated per time slice (gang policies' ``quota``; None: none),
        #: checked again on every gang move to other cores (``vmctl.daemon.gang.quota_problem``)
        self.slice_quota: float | None = None
        self._transitions: dict[EffectKind, Callable[[_Commit, Effect, JobRecord], str | None]] = {
            EffectKind.STARTED: self._started, EffectKind.MOVED: self._moved, EffectKind.RESTORED: self._restored,
            EffectKind.STOPPED: self._stopped, EffectKind.CHECKPOINTED: self._checkpointed,
            EffectKind.SUSPENDED: self._suspended, EffectKind.RESUMED: self._resumed,
            EffectKind.CAPPED: self._capped, EffectKind.RESIZED: self._resized,
            EffectKind.REPLICATED: self._rows, EffectKind.UNREPLICATED: self._rows,
            EffectKind.PLACED_SHARED: self._placed_shared,
        }

    # ------------------------------------------------------------------ decisions
    def apply(self, decision: Decision, view: ClusterView, lay: Layout, now: float, ch: Changes) -> ApplyResult:
        res = ApplyResult()
        model = _Model(view, queued_subset(view, {a.job_id for a in decision.actions}), now)
        moving = _Moving({}, 0)
        for op in self.open_migrations():
            moving.add([str(h) for h in op.detail.get("hosts", [])])
        timeslice = view.discipline is Discipline.TIMESLICE
        c = _Commit(model, lay, now, ch, moving, timeslice)
        for act in decision.actions:
            job = self.state.jobs.get(act.job_id)
            if job is None:
                res.skipped.append((act, "unknown job"))
                continue
            # an operator's Migrate of a gang job is a Move within its row; a Start/Move on level 0 or 1 of a
            # priority cluster in the discipline's own words (the same effect, the names the paper uses)
            c.asked = act
            act = row_form(act, job) if timeslice else priority_form(act, checkpointed=job.checkpointed)
            why: str | None = None
            try:
                eff: Effect | None = model.apply(act)
            except InvariantViolation as exc:
                eff, why = None, _refused(job, exc)
            if eff is not None:
                why = self._transitions[eff.kind](c, eff, job)
                if why is not None:
                    model.undo()
            if why is None:
                res.applied.append(act)
                self.touch(ch, job)
            else:
                res.skipped.append((act, why))
                log.info("skipped %s of job %s: %s", act.kind, act.job_id, why)
        if decision.schedule is not None and timeslice:
            apply_schedule(self, decision.schedule, now, ch)
        # reasons of the jobs left waiting: kept in memory only (the next decision after a restart
        # recomputes them), so a decision does not rewrite every queued job's record
        self.state.set_queue_reasons(decision.reasons, decision.default_reason)
        return res

    # ------------------------------------------------------------------ one transition per effect kind
    def _started(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        if job.state != JobState.QUEUED:
            return f"job is {job.state}, not queued"
        self.start_run(job, c.slots(eff.after), c.now, _asked(c.asked or eff.action)[0], gang=c.timeslice)
        return None

    def _moved(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        """A job changes level (a promotion, a gang job's row) and/or cores (a migration, a re-pin)."""
        if job.state not in ACTIVE or job.migrating:
            return "job is not running (or is migrating)"
        after = c.slots(eff.after)
        if not eff.same_cores:
            if job.state != JobState.RUNNING or job.checkpointed:
                return "job is not running (or is migrating)"
            if (why := self._guard(c, eff, job, after)) is not None:
                return why
            if job.gang:
                job.migrated_at = c.now  # the policies' quota Q counts it in this slice
        self.freeze_progress(job, c.now)
        self._relocate(c, eff, job, after)
        return None

    def _restored(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        if not (job.checkpointed or job.suspended):
            return "job is not checkpointed"
        job.slots = c.slots(eff.after)
        job.restore_pending = job.checkpointed
        job.checkpointed = job.suspended = False
        job.state = JobState.RUNNING
        job.tier_since = c.now
        self.new_op(c.ch, "restore", job.id, c.now, {"placement": [list(p) for p in job.placement]})
        return None

    def _stopped(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        if job.state not in ACTIVE:
            return f"job is {job.state}"
        reason = _asked(c.asked or eff.action)[0] or ("killed and requeued" if eff.requeue else "killed by the policy")
        self.stop_job(c.ch, job, c.now, JobState.QUEUED if eff.requeue else JobState.KILLED, reason)
        return None

    def _checkpointed(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        if job.state != JobState.RUNNING or job.checkpointed or job.migrating:
            return "job is not running (or is migrating)"
        self.freeze_progress(job, c.now)
        job.checkpointed = True
        job.state = JobState.SUSPENDED
        self.new_op(c.ch, "checkpoint", job.id, c.now, {"placement": [list(p) for p in job.placement]})
        return None

    def _suspended(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        if job.state != JobState.RUNNING:
            return "job is not running"
        self.freeze_progress(job, c.now)
        job.suspended = True
        job.state = JobState.SUSPENDED
        return None

    def _resumed(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        if not job.suspended or job.checkpointed:
            return "job is not suspended"
        job.suspended = False
        job.state = JobState.RUNNING
        job.tier_since = c.now
        return None

    def _capped(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        if job.state not in ACTIVE:
            return "job is not running"
        job.cap = _asked(c.asked or eff.action)[1]
        return None

    def _resized(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        """A task bag's new worker set (``vmctl.daemon.dispatcher.resize``): a given-up worker still
        running its task keeps its slot held for the job until that task ends (in the model too: no later
        action of this decision may take it)."""
        if job.state != JobState.RUNNING or job.bag is None:
            return "job is not a running task bag"
        draining = dispatcher.resize(job, [(s.node, s.wire_core, s.level) for s in c.slots(eff.after)], c.now)
        held = [(g, lv) for g, lv in ((c.lay.global_core(n, core), lv) for n, core, lv in draining) if g is not None]
        c.model.hold(job.id, 0, tuple(g for g, _lv in held), tuple(lv for _g, lv in held))
        return None

    def _rows(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        """A gang job replicated into a row more, or one fewer (its main row may change: the lowest left)."""
        if job.state != JobState.RUNNING or not job.gang or job.migrating or eff.after is None:
            return "job is not running in a row (or is migrating)"
        self.freeze_progress(job, c.now)
        job.set_level(eff.after.level)
        job.replicas = list(eff.after.replicas)
        return None

    def _placed_shared(self, c: _Commit, eff: Effect, job: JobRecord) -> str | None:
        """vcsched: process i runs in an unpinned, capped VM on node i of the placement. A queued job
        starts; a running one whose nodes change migrates the processes that move."""
        assert eff.after is not None
        for n in eff.after.nodes:
            node = self.state.nodes.get(n)
            if node is None or node.state != "ready":
                return f"node {n} is not ready"
        after = c.slots(eff.after)
        if job.state == JobState.QUEUED:
            self.start_run(job, after, c.now, cap=eff.after.cap)
            return None
        if job.state != JobState.RUNNING or not job.shared or job.migrating:
            return "job is not a running shared job (or is migrating)"
        if len(after) != len(job.slots):
            return f"{len(after)} nodes for {len(job.slots)} processes"
        if (why := self._guard(c, eff, job, after)) is not None:
            return why
        self.freeze_progress(job, c.now)
        job.cap = eff.after.cap
        self._relocate(c, eff, job, after)
        return None

    # ------------------------------------------------------------------ moves between hosts
    def _guard(self, c: _Commit, eff: Effect, job: JobRecord, after: list[Slot]) -> str | None:
        """The daemon's one guard for a move to other cores, whoever asked (a priority migration, a gang
        move, a vcsched placement): a gang policy's quota Q per slice; then, for processes that change nodes,
        that the source can reach the target (live, or a gang job's checkpoint), the migration limits and,
        for a priority job, the minimum gain. The policies are offered only what passes (the view's
        ``can_migrate``, ``migrated_at``): this is the second line of defence."""
        if job.gang and (why := quota_problem(self.state, self.slice_quota, job, c.now)) is not None:
            return why
        pairs = [(a, b) for a, b in zip(job.slots, after, strict=True) if a.node != b.node]
        if not pairs:
            return None
        for a, b in pairs:
            if (why := self.state.migration_block(a.node, b.node, self._mode(job, a, b))) is not None:
                return why
        if (why := c.moving.full(_hosts(pairs), self.limits)) is not None:
            return why
        if not (job.gang or job.shared):
            gain = self.expected_gain(job, eff, c.now)
            if gain < self.limits.min_gain_s:
                return f"expected gain {gain:.1f}s below migration.min_gain_s {self.limits.min_gain_s}"
        return None

    def _mode(self, job: JobRecord, a: Slot, b: Slot) -> str:
        """Live migration; a gang job whose source cannot reach the target live goes by checkpoint/restore
        (the paper's mechanism)."""
        return "live" if not job.gang or self.state.migration_block(a.node, b.node) is None else "checkpoint"

    def _relocate(self, c: _Commit, eff: Effect, job: JobRecord, after: list[Slot]) -> None:
        """The record takes its new slots; processes that change nodes begin a migration, whose source
        slots stay held in the model until the agents confirm it."""
        before = eff.before
        leaving = tuple(before.cores[i] for i, (a, b) in enumerate(zip(job.slots, after, strict=True))
                        if a.node != b.node and i < len(before.cores)) if before is not None else ()
        op: OperationRecord | None = self.begin_migration(c.ch, job, after, c.now,
                                                          lambda a, b: self._mode(job, a, b))
        if op is not None:
            if before is not None and not before.shared:
                c.model.hold(job.id, before.level, leaving)
            c.moving.add([str(h) for h in op.detail["hosts"]])

    def expected_gain(self, job: JobRecord, eff: Effect, now: float) -> float:
        """Seconds of job time a migration is expected to save: the remaining estimate times the pace it
        gains (a bg job that the fg VMs leave 30% of its cores gains 0.7 of its remaining time when it
        moves to fg), minus the migration's cost."""
        to_fg = eff.after is not None and eff.after.level == 0
        if to_fg and eff.before is not None and eff.before.level == 0:
            return math.inf  # consolidation: no per-job gain to weigh, so min_gain_s does not apply
        remaining = max(0.0, float(job.spec["estimate"]) - self.state.progress(job, now))
        pace_now = self.state.pace(job)
        pace_after = 1.0 if to_fg else pace_now
        return remaining * max(0.0, pace_after - pace_now) - eff.cost


def _refused(job: JobRecord, exc: InvariantViolation) -> str:
    """Why the model refused an action: the record's own words when an event during the decision explains
    it (a start of a job cancelled meanwhile: the view was built again without it in the queue)."""
    if exc.fields.get("rule") == "start-not-queued" and job.state != JobState.QUEUED:
        return f"job is {job.state}, not queued"
    return str(exc)


def _hosts(pairs: list[tuple[Slot, Slot]]) -> list[str]:
    return sorted({a.node for a, _b in pairs} | {b.node for _a, b in pairs})
