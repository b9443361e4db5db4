"""The cluster's event log (``vmctl events``, ``GET /v1/events``): one ordered stream of what happened.

Jobs (submitted, started, requeued, held, released, updated, tier changes, migrated, done, killed,
failed, cancelled: the entries of the jobs' histories, ``vmctl.daemon.history``), nodes (joined, lost,
down, back, draining, drained, undrained, removed), migrations and other operations (started and how
they ended), what an agent refused, and policy changes. Each event is numbered (``seq``, one sequence
for the whole cluster), carries the model time, a kind (``job.started``, ``node.lost``, ...), a
sentence, the job and node it is about, and the actor: ``token NAME`` when an operator's request
caused it, ``agent NODE`` for what an agent reported, ``vmctld`` for what the daemon did on its own
(its policy and its timers). The actor of a request is put in ``ACTOR`` by the API's authentication
middleware for the duration of the request.

``EventLog.add`` only collects; the events are written in the store transaction of the change they
record (``DaemonBase.commit`` and the other writers call ``take`` and put them in the batch), so an
event is stored exactly when its change is, and a change that failed to commit leaves no event. Every
event is also logged at INFO (logger ``vmctld.events``). Events live in the store only (schema 004);
the daemon keeps the next number and the oldest time, to prune events older than
``retention.keep_s`` (``prune``, from the housekeeping of every pass, one indexed delete when due).
"""

from __future__ import annotations

import contextvars
import logging

from vmctl.store.base import EventRecord, Store

log = logging.getLogger("vmctld.events")

#: who asked for the change being handled (``token NAME``, ``agent NODE``); unset: vmctld itself
ACTOR: contextvars.ContextVar[str | None] = contextvars.ContextVar("vmctl_actor", default=None)


class EventLog:
    def __init__(self) -> None:
        self.next_seq = 1
        self.oldest: float | None = None  # time of the oldest stored event (None: none)
        self._pending: list[EventRecord] = []

    def load(self, store: Store) -> None:
        """After (re)loading the state: continue the numbering where the store's log ends."""
        last, oldest = store.event_bounds()
        self.next_seq = last + 1
        self.oldest = oldest
        self._pending = []

    def add(self, now: float, kind: str, message: str, job_id: str | None = None, node: str | None = None,
            actor: str | None = None) -> EventRecord:
        """Record an event of the change being handled (written with it by the next ``take``)."""
        who = actor or ACTOR.get() or "vmctld"
        ev = EventRecord(seq=self.next_seq, time=now, kind=kind, message=message, job_id=job_id, node=node,
                         actor=who)
        self.next_seq += 1
        self._pending.append(ev)
        return ev

    def take(self) -> list[EventRecord]:
        """The events collected since the last ``take``, for the batch about to be written."""
        out, self._pending = self._pending, []
        return out

    def written(self, events: list[EventRecord]) -> None:
        """The batch with ``events`` is in the store: log them."""
        for ev in events:
            if self.oldest is None:
                self.oldest = ev.time
            log.info("%s %s (%s)", ev.kind, ev.message, ev.actor)

    def prune(self, store: Store, epoch: int, now: float, keep_s: float) -> int:
        """Delete the events older than ``keep_s`` when there are some (one store transaction)."""
        cutoff = now - keep_s
        if self.oldest is None or self.oldest >= cutoff:
            return 0
        n = store.prune_events(epoch, cutoff)
        self.oldest = store.event_bounds()[1]
        return n
