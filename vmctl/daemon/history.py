"""A job's history for operators (``vmctl job show``): starts, tier changes, migrations, requeues and
its end, each with the time and the reason the daemon gave.

``JobHistory.note(jobs, now)`` runs in ``Daemon.commit`` on every job a change touched, before the
store write, so the entries are stored with the job in the same transaction. It compares each job
with what it saw of it last (state, tier, run, migrations, nodes) and appends what changed; the first
sight of a job after a restart only sets that baseline (its stored history is kept). The history is
bounded (``MAX_ENTRIES``, oldest dropped) so a job that is requeued forever does not grow without end.

``running`` (:func:`note_running`, called by the follower of the agents' reports): the first report in
which every process of the current run (a task bag: every worker it holds) has been seen started by its
agent -- a real host's job VM boots its guest first, so this comes seconds to minutes after the run's
``started`` (vmctld's decision), a mock host's a control-loop pass after it. ``vmctl history export``
writes the difference as the job's ``boot`` (docs/operations.md, "The export format"); a task bag's
entry gives its workers' mean delay as ``boot`` (each worker VM boots on its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from vmctl.model import JobState
from vmctl.store.base import JobRecord

MAX_ENTRIES = 50


@dataclass(frozen=True, slots=True)
class _Seen:
    state: str
    tier: str | None
    run: int
    migrations: int
    placement: tuple[tuple[str, int], ...]
    #: the placement at the start of the run or the last completed migration (a migration moves the
    #: placement when it begins and counts when it completes)
    settled: tuple[tuple[str, int], ...]


#: what ``JobHistory.note`` sees of a job just submitted (shared: a ``_Seen`` is immutable)
_SUBMITTED = _Seen(str(JobState.QUEUED), None, 0, 0, (), ())


def _cores(placement: Iterable[tuple[str, int]]) -> str:
    """Cores as an operator reads them: ``n1:0, n1:1`` (``n1`` for unpinned vcsched VMs)."""
    return ", ".join(n if c < 0 else f"{n}:{c}" for n, c in placement) or "-"


def slot_text(v: Any) -> str:
    """A ``[node, core]`` pair of an operation's move as ``node:core`` (``node`` for an unpinned VM)."""
    if isinstance(v, list | tuple) and len(v) == 2:
        node, core = v
        return str(node) if isinstance(core, int) and core < 0 else f"{node}:{core}"
    return str(v)


def requeues(rec: JobRecord) -> int:
    """How often the job went back to the queue after a start (``run`` counts the starts)."""
    return max(0, rec.run - (0 if rec.state == JobState.QUEUED else 1))


#: told of every entry as it is added: (job, time, event, detail); the daemon's event log
Sink = Callable[[JobRecord, float, str, "str | None"], None]


def started_at(rec: JobRecord) -> float | None:
    """The time of the current run's ``started`` entry (None: not in the bounded history)."""
    return next((float(h["time"]) for h in reversed(rec.history) if h.get("event") == "started"), None)


def note_running(rec: JobRecord, now: float, processes: int, workers_at: Sequence[float] = (),
                 workers_on: Sequence[str] = ()) -> bool:
    """Every process (``processes``) of the current run has been seen started: add the run's ``running``
    entry, once per run (module docstring). True when the entry was added. ``workers_at``: a task bag's
    workers, when each was first seen running a task: the entry's ``boot`` is their mean start delay
    (each worker's guest boots on its own and the first to run takes more tasks: the bag's work is
    delayed by the mean, not the slowest). ``workers_on``: the node each of them ran on (same order):
    the entry's ``workers`` lists ``[node, delay]`` per worker, from which the export derives each
    node's boot (``node_boots``; a real host's guest boot differs from a mock host's control loop)."""
    for h in reversed(rec.history):
        if h.get("event") == "running":
            return False  # this run's entry is there (no start since)
        if h.get("event") in ("started", "requeued"):
            break
    start = started_at(rec)
    took = "" if start is None else f" {now - start:.1f} s after the start"
    entry: dict[str, Any] = {"time": now, "event": "running", "detail": f"{processes} processes running{took}"}
    if workers_at and start is not None:
        entry["boot"] = round(sum(max(0.0, t - start) for t in workers_at) / len(workers_at), 3)
        entry["detail"] = f"{processes} workers running{took} (mean {entry['boot']:.1f} s)"
        if len(workers_on) == len(workers_at):
            entry["workers"] = [[str(n), round(max(0.0, t - start), 3)] for n, t in zip(workers_on, workers_at,
                                                                                      strict=True)]
    _append(rec, entry)
    return True


def _append(rec: JobRecord, entry: dict[str, Any]) -> None:
    rec.history.append(entry)
    if len(rec.history) > MAX_ENTRIES:
        del rec.history[: len(rec.history) - MAX_ENTRIES]


class JobHistory:
    def __init__(self, sink: Sink | None = None) -> None:
        self._seen: dict[str, _Seen] = {}
        self.sink = sink

    def forget(self) -> None:
        """After a reload from the store: every job is seen afresh (baseline only)."""
        self._seen.clear()

    def note(self, jobs: Iterable[JobRecord], now: float, by: str) -> None:
        """``by``: who made the change, for tier changes (``the operator``, ``policy easy``)."""
        for rec in jobs:
            placement = tuple(rec.placement)
            prev = self._seen.get(rec.id)
            settled = placement if prev is None or rec.run != prev.run or rec.migrations != prev.migrations \
                else prev.settled
            tier = rec.tier if rec.level is None else f"row {rec.level}"  # a gang job: its row (timeslice)
            cur = _Seen(str(rec.state), tier, rec.run, rec.migrations, placement, settled)
            self._seen[rec.id] = cur
            if prev is None:
                if rec.state == JobState.QUEUED and rec.run == 0 and not rec.history:
                    self.add(rec, now, "submitted", None)
                continue
            self._diff(rec, prev, cur, now, by)
            if rec.state not in (JobState.QUEUED, JobState.RUNNING, JobState.SUSPENDED):
                self._seen.pop(rec.id, None)  # finished: nothing more to compare

    def submitted(self, jobs: Iterable[JobRecord], now: float) -> None:
        """Jobs just submitted (queued, never started, no history, no slot): their ``submitted`` entry and
        the baseline ``note`` compares them with next, as ``note`` gives them, without comparing (issue 27:
        a batch's jobs are all alike)."""
        seen, add = self._seen, self.add
        for rec in jobs:
            assert rec.state == JobState.QUEUED and rec.run == 0 and not rec.history and not rec.slots, rec.id
            seen[rec.id] = _SUBMITTED
            add(rec, now, "submitted", None)

    def _diff(self, rec: JobRecord, prev: _Seen, cur: _Seen, now: float, by: str) -> None:
        if cur.run > prev.run and prev.state != JobState.QUEUED:
            # stopped and started again between two commits: the requeue is implied
            self.add(rec, now, "requeued", rec.reason)
        if cur.state == JobState.QUEUED and prev.state != JobState.QUEUED:
            self.add(rec, now, "requeued", rec.reason)
        if cur.run > prev.run:
            self.add(rec, now, "started", f"run {cur.run} as {cur.tier} on {_cores(cur.placement)}")
            return
        if cur.state == JobState.QUEUED:
            return
        if cur.tier != prev.tier and prev.tier is not None and cur.tier is not None:
            # a move to other nodes (MEASY's bg -> fg migration) says so: "migrated" follows when it completes
            moving = {n for n, _c in cur.placement} != {n for n, _c in prev.placement}
            where = f", migrating {_cores(prev.placement)} -> {_cores(cur.placement)}" if moving else ""
            self.add(rec, now, "tier", f"{prev.tier} -> {cur.tier} by {by}{where}")
        if cur.migrations > prev.migrations:
            self.add(rec, now, "migrated", f"{_cores(prev.settled)} -> {_cores(cur.placement)}")
        if cur.state != prev.state and cur.state not in (JobState.QUEUED, JobState.RUNNING):
            self.add(rec, now, str(cur.state), rec.reason)
        elif cur.state == JobState.RUNNING and prev.state == JobState.SUSPENDED:
            self.add(rec, now, "resumed", rec.reason)

    def add(self, rec: JobRecord, now: float, event: str, detail: str | None) -> None:
        """Append an entry to the job's history (and tell the sink)."""
        _append(rec, {"time": now, "event": event, "detail": detail})
        if self.sink is not None:
            self.sink(rec, now, event, detail)
