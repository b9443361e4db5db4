"""Job events of the ``Daemon``: submissions, cancellations, and ``explain`` (why a job waits)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vmctl.daemon.actuator import Changes
from vmctl.daemon.base import DaemonBase
from vmctl.daemon.state import TERMINAL
from vmctl.model import JobState
from vmctl.store.base import JobRecord, WriteBatch


class JobEvents(DaemonBase):
    """Submit, cancel and explain jobs."""

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
        self.store_write(WriteBatch(jobs=dict(ch.jobs), events=self.events.take()))
        self.state.next_seq = seq
        for rec in out:
            self.state.jobs[rec.id] = rec
            self.state.reindex(rec)
        self.dirty = True
        return out

    def cancel(self, job_id: str) -> JobRecord:
        self._require_leader()
        rec = self.job(job_id)
        if rec.state in TERMINAL:
            return rec
        ch = Changes()
        self.actuator.stop_job(ch, rec, self.clock.now(), JobState.CANCELLED, "cancelled by an operator")
        self.commit(ch)
        return rec

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
