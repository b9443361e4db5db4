"""Job events of the ``Daemon``: submissions, cancellations, and ``explain`` (why a job waits)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from vmctl.daemon.actuator import Changes
from vmctl.daemon.base import DaemonBase
from vmctl.daemon.state import ACTIVE, TERMINAL
from vmctl.errors import Conflict, ValidationError
from vmctl.model import JobShape, JobState
from vmctl.policies.base import SchedulingPolicy
from vmctl.shapes import job_shape
from vmctl.store.base import JobRecord, NodeRecord, WriteBatch


class JobEvents(DaemonBase):
    """Submit, cancel and explain jobs."""

    def submit(self, specs: Iterable[dict[str, Any]], batch: bool = True) -> list[JobRecord]:
        """Queue ``specs`` (checked specs, ``vmctl.api.schemas.job_spec``); ``batch``: errors name the
        fields as ``jobs[i].FIELD`` (else ``FIELD``, a single job's request)."""
        self._require_leader()
        now = self.clock.now()
        specs = list(specs)
        shapes = [job_shape(spec, f"jobs[{i}]" if batch else "") for i, spec in enumerate(specs)]
        self._check_for_policy(specs, shapes, now, batch)
        ch = Changes()
        out: list[JobRecord] = []
        seq = self.state.next_seq
        for i, (spec, shape) in enumerate(zip(specs, shapes, strict=True)):  # nothing is submitted when one is refused
            deadline = spec.get("deadline")
            if deadline is not None and shape is not None and shape.kind == "task-bag" and deadline <= now:
                where = f"jobs[{i}].deadline" if len(specs) > 1 else "deadline"
                raise ValidationError(field=where, problem=f"{deadline} is in the past (now {now:.3f}): a task bag's "
                                                           f"deadline must be later than its submission")
        for spec in specs:
            rec = JobRecord(id=str(seq), seq=seq, name=str(spec.get("name") or f"job-{seq}"), spec=dict(spec),
                            state=JobState.QUEUED, submit_time=now, reason="submitted")
            seq += 1
            out.append(rec)
            ch.jobs[rec.id] = rec
        ch.events.append("submit")
        self.history.submitted(out, now)
        self.store_write(WriteBatch(jobs=dict(ch.jobs), events=self.events.take()))
        self.state.next_seq = seq
        for rec in out:
            self.state.jobs[rec.id] = rec
            self.state.reindex(rec)
        self.dirty = True
        return out

    def _check_for_policy(self, specs: Sequence[dict[str, Any]], shapes: Sequence[JobShape | None], now: float,
                          batch: bool) -> None:
        """What the active policy needs of a job beyond the spec's own checks, before anything is
        applied: a deadline after the submission when it schedules by deadlines, and its own rules
        (``SchedulingPolicy.check_job``: the moldable policy refuses a table whose time grows with the
        width). A ``ValidationError`` names the field (``jobs[1].deadline``)."""
        pol = self.policy
        if pol is None:
            return
        if type(pol).check_job is SchedulingPolicy.check_job and "deadline" not in getattr(pol, "job_fields", ()):
            return  # nothing to check: no Job built per submitted job for the base class's no-op
        for i, (spec, shape) in enumerate(zip(specs, shapes, strict=True)):
            where = f"jobs[{i}]" if batch else ""
            field = f"{where}." if where else ""
            dl = spec.get("deadline")
            if dl is not None and "deadline" in pol.job_fields and float(dl) <= now:
                raise ValidationError(field=f"{field}deadline", problem=f"t={float(dl):.0f} is not after the "
                                      f"submission (now, t={now:.0f}): policy {pol.name} schedules by deadlines")
            rec = JobRecord(id=where or "job", seq=0, name="", spec=spec, state=JobState.QUEUED, submit_time=now)
            pol.check_job(rec.to_job(), shape, where)

    def cancel(self, job_id: str) -> JobRecord:
        self._require_leader()
        rec = self.job(job_id)
        if rec.state in TERMINAL:
            return rec
        ch = Changes()
        self.actuator.stop_job(ch, rec, self.clock.now(), JobState.CANCELLED, "cancelled by an operator")
        self.commit(ch)
        return rec

    # ------------------------------------------------------------------ hold, release, requeue, update
    def _queued(self, job_id: str, verb: str, if_active: str) -> JobRecord:
        """The queued job ``job_id`` (held or not), or a conflict saying why ``verb`` does not apply and
        what to do instead (``if_active`` for a running or suspended job)."""
        rec = self.job(job_id)
        if rec.state != JobState.QUEUED:
            hint = if_active if rec.state in ACTIVE else "it has ended"
            raise Conflict(what=f"job {job_id}", problem=f"is {rec.state}: only a queued job can be {verb}; {hint}")
        return rec

    def _job_change(self, rec: JobRecord, event: str, detail: str | None) -> None:
        """Commit an operator's change of a job with its history entry (and event)."""
        ch = Changes()
        self.actuator.touch(ch, rec)
        self.history.add(rec, self.clock.now(), event, detail)
        ch.events.append(f"job {rec.id} {event}")
        self.commit(ch)
        self.dirty = True

    def hold(self, job_id: str, reason: str | None = None) -> JobRecord:
        """Keep a queued job out of the queue the policy sees (``vmctl job hold``) until ``release``;
        stored with the job, so a restarted daemon keeps it held. Holding a held job again only
        changes the reason."""
        self._require_leader()
        rec = self._queued(job_id, "held", f"requeue it held instead (vmctl job requeue {job_id} --hold)")
        rec.held = True
        rec.reason = f"held: {reason}" if reason else "held"
        self._job_change(rec, "held", reason)
        return rec

    def release(self, job_id: str) -> JobRecord:
        """A held job goes back to its place in the queue (its submit time is kept)."""
        self._require_leader()
        rec = self._queued(job_id, "released", "a running job is not held")
        if not rec.held:
            raise Conflict(what=f"job {job_id}", problem="is not held")
        rec.held = False
        rec.reason = "released"
        self._job_change(rec, "released", None)
        return rec

    def requeue(self, job_id: str, reason: str | None = None, hold: bool = False) -> JobRecord:
        """A running or suspended job goes back to the queue (``vmctl job requeue``): its VMs are removed,
        its progress is lost and its next start is a new run from the beginning (checkpoints are not
        kept); it keeps its submit time, so its place in the queue. ``hold``: held as it goes back."""
        self._require_leader()
        rec = self.job(job_id)
        if rec.state not in ACTIVE:
            hint = "hold it to keep it from starting (vmctl job hold)" if rec.state == JobState.QUEUED else \
                "it has ended: submit it again"
            raise Conflict(what=f"job {job_id}", problem=f"is {rec.state}: only a running or suspended job can be "
                                                         f"requeued; {hint}")
        ch = Changes()
        why = f"requeued by an operator: {reason}" if reason else "requeued by an operator"
        self.actuator.stop_job(ch, rec, self.clock.now(), JobState.QUEUED, why)
        if hold:
            self.history.note([rec], self.clock.now(), "the operator")  # the requeue first, then the hold
            rec.held = True
            rec.reason = f"held: {reason}" if reason else "held"
            self.actuator.touch(ch, rec)
            self.history.add(rec, self.clock.now(), "held", reason)
        self.commit(ch)
        self.dirty = True
        return rec

    def update(self, job_id: str, changes: dict[str, Any]) -> JobRecord:
        """Change the estimate, priority or deadline of a queued job (``vmctl job update``); ``changes``
        holds the checked new values (a deadline of None removes it)."""
        self._require_leader()
        rec = self._queued(job_id, "updated", f"requeue it first (vmctl job requeue {job_id}; its progress is lost)")
        done = []
        for key in ("estimate", "priority", "deadline"):
            if key in changes and rec.spec.get(key) != changes[key]:
                done.append(f"{key} {rec.spec.get(key)} -> {changes[key]}")
                if changes[key] is None:
                    rec.spec.pop(key, None)
                else:
                    rec.spec[key] = changes[key]
        if done:
            self.state.job_spec_changed(rec)
            self._job_change(rec, "updated", ", ".join(done))
        return rec

    # ------------------------------------------------------------------ what a submission or a queued job is told
    def ignored_fields(self, specs: Sequence[dict[str, Any]]) -> list[str]:
        """Warnings for job fields the active policy does not use: a ``priority`` other than 0 or a
        ``deadline``. A policy that orders its queue by them declares it with a ``job_fields`` attribute
        (a set holding ``priority`` and/or ``deadline``): the EASY family with ``queue_order=multifactor``
        uses priorities; nothing registered uses deadlines yet (vcsched orders by its own rules)."""
        pol = self.policy
        if pol is None:
            return []
        used = frozenset(getattr(pol, "job_fields", frozenset()))
        out = []
        n = sum(1 for s in specs if int(s.get("priority") or 0) != 0)
        if n and "priority" not in used:
            which = "the job's priority" if len(specs) == 1 else f"the priority of {n} job(s)"
            hint = (f" (vmctl policy set {pol.name} -p queue_order=multifactor makes it count)"
                    if "queue_order" in pol.parameters else "")
            out.append(f"policy {pol.name} does not use job priorities: {which} has no effect on when it starts"
                       + hint)
        n = sum(1 for s in specs if s.get("deadline") is not None)
        if n and "deadline" not in used:
            which = "the job's deadline" if len(specs) == 1 else f"the deadline of {n} job(s)"
            out.append(f"policy {pol.name} does not use deadlines: {which} is neither considered nor enforced")
        return out

    def node_blocker(self) -> Callable[[JobRecord], list[NodeRecord]]:
        """For queued jobs: the nodes out of service (draining, drained, lost, down) that alone keep the job
        from ever starting now: it needs more cores than the ready nodes have, and would fit with those
        nodes back. Empty otherwise (it waits for running jobs, or is held). Computed once for a list."""
        nodes = self.state.nodes.values()
        pol = self.policy
        ready = sum(n.cores for n in nodes if n.state == "ready")
        out = sorted((n for n in nodes if n.state != "ready"), key=lambda n: n.name)
        total = ready + sum(n.cores for n in out)
        shared = pol is not None and pol.needs.shared_vms  # vcsched: VMs share cores, no core count applies

        def blocking(rec: JobRecord) -> list[NodeRecord]:
            if shared or rec.state != JobState.QUEUED or rec.held or not out:
                return []
            procs = int(rec.spec["procs"])
            return out if ready < procs <= total else []

        return blocking

    # ------------------------------------------------------------------ explain
    def explain(self, job_id: str) -> dict[str, Any]:
        """Why ``job_id`` waits (or what it does): its reason, its place in the queue, the reservation
        of the last decision (with whether its holder is queued or running in bg: a bg job's reservation
        is for its move to fg), the nodes out of service that alone keep it waiting, and the migrations
        of its current run only (a requeued job's earlier runs moved VMs that no longer exist)."""
        rec = self.job(job_id)
        pos: int | None = None
        if rec.state == JobState.QUEUED:  # in the order the policy considers the queue (multifactor, SJF)
            queue, _ = self.state.queue_jobs()
            if self.policy is not None:
                total = sum(n.cores for n in self.state.nodes.values())
                queue = self.policy.queue_order(queue, self.clock.now(), max(1, total))
            ids = [j.id for j in queue]
            pos = ids.index(rec.id) if rec.id in ids else None
        res = None
        d = self.last_decision
        if d is not None and d.reservation is not None:
            r = d.reservation
            holder = self.state.jobs.get(r.job_id)
            res = {"job_id": r.job_id, "shadow_time": r.shadow_time, "extra_cores": r.extra_cores,
                   "holder_state": None if holder is None else str(holder.state),
                   "holder_tier": holder.tier if holder is not None and holder.state in ACTIVE else None}
        since = rec.start_time if rec.state in ACTIVE else None  # the current run's start (None: no run now)
        migs = [{"id": o.id, "state": o.state, "origin": o.detail.get("origin"), "note": o.detail.get("note"),
                 "to": sorted({str(m["to"][0]) for m in o.detail.get("moves", []) if m["from"][0] != m["to"][0]})}
                for o in sorted(self.state.ops.values(), key=lambda o: (o.created, len(o.id), o.id))
                if o.job_id == rec.id and o.kind == "migrate" and since is not None and o.created >= since]
        return {"job_id": rec.id, "state": rec.state, "reason": self.state.reason_of(rec), "reservation": res,
                "queue_position": pos, "migrations": migs[-5:], "held": rec.held, "run": rec.run,
                "blocked_by": [{"node": n.name, "state": n.state} for n in self.node_blocker()(rec)]}
