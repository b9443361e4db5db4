"""The record transitions every writer of job records shares: the daemon's write path below the
decision (``vmctl.daemon.actuator``) and the agents' reports (``vmctl.daemon.follow``).

A change is collected in ``Changes`` (records, operations, kv, the nodes whose desired state may have
changed) and written in one transaction with the desired documents re-derived from the records
(``vmctl.daemon.desired``). The transitions here are the only places that start a run
(``start_run``), begin a migration between hosts (``begin_migration``), take one back
(``rollback_migration``) and end or requeue a job (``stop_job``), whoever asked: a policy's
decision, an operator, a timer, an agent's report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vmctl.daemon import dispatcher
from vmctl.daemon.config import MigrationLimits
from vmctl.daemon.state import ClusterState, source_level
from vmctl.model import JobState
from vmctl.store.base import JobRecord, NodeRecord, OperationRecord, Slot

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


class RecordWriter:
    """The shared record transitions (see the module docstring), over ``state``."""

    def __init__(self, state: ClusterState, limits: MigrationLimits) -> None:
        self.state = state
        self.limits = limits
        #: observers (metrics): on_job_end(job, state, now), on_start(job, now), on_op_closed(op)
        self.on_job_end: Callable[[JobRecord, JobState, float], None] | None = None
        self.on_start: Callable[[JobRecord, float], None] | None = None
        self.on_op_closed: Callable[[OperationRecord], None] | None = None

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
        """Carry the job's progress over a change of pace or place (its stint ends ``now``)."""
        self.state.close_stint(job, now)
        job.progress_base = self.state.progress(job, now)
        job.tier_since = now

    # ------------------------------------------------------------------ the transitions
    def start_run(self, job: JobRecord, slots: list[Slot], now: float, reason: str = "", gang: bool = False,
                  cap: float | None = None) -> None:
        """A queued job starts a new run on ``slots`` (in timeslice rows with ``gang``; capped at ``cap``).
        ``reason``: the start's ``Start.reason`` (why this width and place), kept as ``width_reason``. A
        task bag's workers take their tasks at once (a bag requeued keeps its results)."""
        kept = job.tasks if job.bag is not None else []
        job.run += 1
        job.state = JobState.RUNNING
        job.slots = slots
        job.gang, job.replicas, job.migrated_at = gang, [], None
        job.cap = cap
        job.start_time = now
        job.tier_since = now
        job.progress_base = 0.0
        job.tasks = [{"index": i, "exit_status": None, "error": None, "seen": False} for i in range(len(slots))]
        self.state.open_run(job)
        job.reason = None
        job.width_reason = reason or None
        job.suspended = job.checkpointed = job.restore_pending = False
        job.bag = None
        shape = self.state.shape_of(job)
        if shape is not None and shape.kind == "task-bag":
            dispatcher.start(job, now, kept)
        if self.on_start is not None:
            self.on_start(job, now)

    def begin_migration(self, ch: Changes, job: JobRecord, slots: list[Slot], now: float,
                        modes: Callable[[Slot, Slot], str] | None = None) -> OperationRecord | None:
        """``job`` moves to ``slots``: its record takes them at once; processes that change nodes go by a
        migration operation (two-phase, followed by ``vmctl.daemon.follow`` until the agents confirm it,
        rolled back to the slots it left on failure), and a process that changes cores on its node is
        re-pinned (done when its agent applies it). ``modes(from, to)``: live | checkpoint per move
        (default live). Returns the operation, None when nothing changes nodes."""
        old = job.slots
        moves: list[dict[str, Any]] = [
            {"index": i, "from": [a.node, a.wire_core], "to": [b.node, b.wire_core],
             "mode": "live" if modes is None else modes(a, b)}
            for i, (a, b) in enumerate(zip(old, slots, strict=True)) if (a.node, a.core) != (b.node, b.core)]
        hosts = sorted({a.node for a, b in zip(old, slots, strict=True) if a.node != b.node}
                       | {b.node for a, b in zip(old, slots, strict=True) if a.node != b.node})
        from_tier, from_level = job.tier, old[0].level if old else 0
        job.slots = slots
        if not hosts:
            if moves:
                job.migrations += 1  # a re-pin on the same host: done when the agent applies it
            return None
        detail: dict[str, Any] = {"moves": moves, "hosts": hosts, "tier": job.tier, "stage": "prepare",
                                  "target_gens": {}, "from_tier": from_tier, "origin": "policy"}
        if job.gang:  # a gang job goes back to its row on a rollback
            detail.update(from_level=from_level, level=slots[0].level)
        op = self.new_op(ch, "migrate", job.id, now, detail)
        job.migrating = op.id
        return op

    def rollback_migration(self, op: OperationRecord, job: JobRecord, now: float, ch: Changes, why: str) -> None:
        """Put the job back where it was (its source slots stayed reserved), on the level it left."""
        left = source_level(op, job)
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
