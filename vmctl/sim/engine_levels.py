"""The simulator's levelled engine: every execution model but the two-tier one (time slicing, the
shared discipline's levels, moldable jobs and task bags; :mod:`vmctl.sim.execution`).

Any number of levels per core. Each decision is committed from the checker's overlay (the one
occupancy model has already said what each action does to the slots): ``_effect`` turns each effect
into what it means for the runs (Suspend/Resume: rate 0, slots kept; Checkpoint: slots freed, progress
kept; Restore or a Move back onto slots; move costs paid in time the job would advance, ``Run.debt``),
then ``_commit`` writes the slots the overlay changed into the engine's arrays and re-rates the runs
the model says depend on them. A task bag's workers give up or take back slots at task boundaries
(``hold_slots``/``release_slots``, the ``EngineState`` calls of the models).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from vmctl.errors import SimulationError
from vmctl.model import Decision, tier_of_level
from vmctl.policies.effects import Effect, EffectKind
from vmctl.policies.occupancy import Occupancy, level_name
from vmctl.sim.engine_base import EngineBase, _Live, _Run

#: a run whose rate falls to 0 with at most this much work left is complete (rounding)
_DONE_TOL = 1e-6
(_STARTED, _MOVED, _SUSPENDED, _RESUMED, _CHECKPOINTED, _RESTORED, _STOPPED, _RESIZED, _REPLICATED, _UNREPLICATED,
 _CAPPED, _PLACED_SHARED) = EffectKind


def _by_level(slots: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    """(core, level) slots grouped by level: level -> its cores, in order."""
    out: dict[int, list[int]] = {}
    for c, level in slots:
        out.setdefault(level, []).append(c)
    return out


class _LiveLevel(_Live):
    """A running job on the levelled path: its ``level``, ``suspended`` (also for a checkpointed job,
    which holds no slot), ``checkpointed`` and placement are fields; ``progress`` is live and ``expected_end`` is what
    the execution model says (``ExecutionModel.expected_end``)."""

    __slots__ = ()
    cap = None
    shared_nodes = ()

    @property
    def expected_end(self) -> float:
        return self._sim.model.expected_end(self._run, self._sim.now)

    @property
    def tasks_left(self) -> int | None:  # type: ignore[override]
        return self._sim.model.tasks_left(self._run)

    def __repr__(self) -> str:
        return (f"RunningJob(id={self.job.id!r}, level={self.level}, cores={self.cores}, "
                f"progress={self.progress:.3f}, suspended={self.suspended})")


class LevelEngine(EngineBase):
    """The levelled engine's steps (a mixin of ``Simulator``)."""

    def _apply_leveled(self, decision: Decision, occ: Occupancy) -> None:
        """Commit a checked decision on the levelled path: ``occ`` is the checker's overlay, whose effects
        say what each action did to the slots (the one occupancy model); the engine adds what they mean
        for the runs (progress kept or lost, costs, counters) and then commits the slots the overlay
        changed."""
        dirty = self._dirty
        if occ.effects:
            gone: list[str] = []
            resized: list[tuple[_Run, tuple[tuple[int, int], ...]]] = []
            for e in occ.effects:
                self._effect(e, gone, resized)
            self._commit(occ, gone)
            for run, old in resized:
                for r in self.model.on_resize(run, old, self.now):
                    dirty[r.idx] = r
                grown = self.model.grown_work(run)
                if grown:  # new workers' boots (task bags)
                    self._work[run.idx] += grown
                    dirty[run.idx] = run
        if decision.schedule is not None:
            for r in self.model.on_schedule(decision.schedule, self.now):
                dirty[r.idx] = r
        if dirty:
            self._flush_dirty()

    def _effect(self, e: Effect, gone: list[str], resized: list[tuple[_Run, tuple[tuple[int, int], ...]]]) -> None:
        """What one effect means for the runs; slots are committed afterwards, from the overlay."""
        now = self.now
        jid = e.job_id
        kind = e.kind
        if kind is _PLACED_SHARED or kind is _CAPPED:
            raise SimulationError(time=now, problem=f"the {self.model.name} model has no capped shared VMs "
                                                    f"({e.action.kind} {jid})")
        after = e.after
        if kind is _STARTED:
            level, cores = self._placement(e)
            run = self._new_run(jid, tier_of_level(level), cores)
            run.on_level(level)
            run.slot_levels = after.slot_levels if after is not None else None
            self._width[run.idx] = len(cores)
            self._work[run.idx] = self.model.work(run)
            if self._span is not None:
                self._span[run.idx] = self.model.span(run)
            if self._held is not None:  # a new run: its slots are held from now
                self._held[run.idx], self._held_at[run.idx], self._resized[run.idx] = 0.0, now, 0
            self._dirty[run.idx] = run
            return
        if kind is _STOPPED:
            gone.append(jid)
            self._killed(self._runs.pop(jid), e.requeue)
            return
        run = self._runs[jid]
        run.settle(now)
        if self._held is not None:
            self._held_count(run)
        run.placed = True
        self._dirty[run.idx] = run
        if kind is _SUSPENDED:
            run.suspended = True
        elif kind is _RESUMED:
            if run.checkpointed:
                raise SimulationError(time=now, problem=f"resume {jid}: the job is checkpointed and holds no "
                                                        "slots; restore it (Restore, or Move onto cores)")
            run.suspended = False
        elif kind is _CHECKPOINTED:
            run.checkpointed = True
            run.replicas = ()
            run.slot_levels = None  # its slots are freed; a restore places it on one level
        elif kind is _REPLICATED or kind is _UNREPLICATED:
            run.level, run.cores = self._placement(e)
            run.tier = tier_of_level(run.level)
            run.replicas = after.replicas if after is not None else ()
        elif kind is _RESIZED:
            old = run.slots
            run.level, run.cores = self._placement(e)
            run.slot_levels = after.slot_levels if after is not None else None
            run.tier = tier_of_level(run.level)
            self._width[run.idx] = len(run.cores)
            self._resized[run.idx] = 1
            resized.append((run, old))
        else:  # MOVED or RESTORED (Move and its priority names: Promote, Demote, Migrate, Restore)
            level, cores = self._placement(e)
            cost = e.cost
            if level != run.level:
                self._tier_changes[run.idx] += 1
            if not run.checkpointed and sorted(cores) != sorted(run.cores):
                self._migrations += 1
                self._job_migrations[run.idx] += 1
                run.migrated_at = now
                self._migration_loss += cost * len(cores)
            run.level, run.cores, run.tier = level, cores, tier_of_level(level)
            run.slot_levels = after.slot_levels if after is not None else None
            run.tier_since = now
            run.debt += cost
            if kind is _RESTORED:  # back on slots, running
                run.checkpointed = run.suspended = False

    def _placement(self, e: Effect) -> tuple[int, tuple[int, ...]]:
        after = e.after
        if after is None or after.shared:  # pragma: no cover - the occupancy model has just placed it
            raise SimulationError(time=self.now, problem=f"{e.job_id} has no placement after its action")
        return after.level, after.cores

    def _commit(self, occ: Occupancy, gone: list[str]) -> None:
        """Write the slots the decision changed (the occupancy overlay) into the engine's arrays, and
        re-rate the runs the model says depend on them."""
        snaps = self._snaps
        for jid in gone:
            if jid not in self._runs:
                snaps.pop(jid, None)
        runs, dirty, affected = self._runs, self._dirty, self.model.affected
        for level, over in enumerate(occ.over):
            if not over:
                continue
            jobs, slot_run, idle = self._slot_job[level], self._slot_run[level], self._idle[level]
            for c, holder in over.items():
                jobs[c] = holder
                if holder is None:
                    slot_run[c] = None
                    idle.add(c)
                else:
                    slot_run[c] = runs[holder]
                    idle.discard(c)
            for r in affected(level, over.keys()):
                dirty[r.idx] = r

    def _vacate_leveled(self, run: _Run) -> None:
        """A completed run leaves its slots (the engine's own event, not an action)."""
        if run.checkpointed:
            return
        jid = run.job.id
        if run.slot_levels is not None:
            slots: tuple[tuple[int, int], ...] = run.slots
        else:
            slots = tuple((c, lv) for lv in (run.level, *run.replicas) for c in run.cores)
        for level, cores in _by_level(slots).items():
            jobs, slot_run, idle = self._slot_job[level], self._slot_run[level], self._idle[level]
            for c in cores:
                if jobs[c] == jid:
                    jobs[c] = None
                    slot_run[c] = None
                    idle.add(c)
            for r in self.model.affected(level, cores):
                self._dirty[r.idx] = r

    def hold_slots(self, run: _Run, slots: tuple[tuple[int, int], ...]) -> None:
        """``EngineState.hold_slots``: a task bag's worker keeps a slot a Resize gave up until its task ends."""
        jid = run.job.id
        for c, level in slots:
            jobs = self._slot_job[level]
            if jobs[c] is not None:
                raise SimulationError(time=self.now, problem=f"resize of {jid} gave up {level_name(level)} of core {c} "
                                      f"while a task runs there, and the same decision gave it to {jobs[c]} (a "
                                      "shrink takes effect at task boundaries)")
            jobs[c], self._slot_run[level][c] = jid, run
            self._idle[level].discard(c)
        self._reslot(run, run.slots + slots, slots)

    def release_slots(self, run: _Run, slots: tuple[tuple[int, int], ...]) -> None:
        """``EngineState.release_slots``: the run gives up the (core, level) ``slots`` now."""
        self._released = True
        jid = run.job.id
        for c, level in slots:
            jobs = self._slot_job[level]
            if jobs[c] == jid:
                jobs[c], self._slot_run[level][c] = None, None
                self._idle[level].add(c)
        gone = set(slots)
        self._reslot(run, tuple(s for s in run.slots if s not in gone), slots)

    def _reslot(self, run: _Run, slots: tuple[tuple[int, int], ...], changed: tuple[tuple[int, int], ...]) -> None:
        """The run now holds ``slots`` ((core, level) pairs; ``changed`` changed hands)."""
        self._held_count(run)
        self._resized[run.idx] = 1
        run.cores = tuple(c for c, _lv in slots)
        levels = tuple(lv for _c, lv in slots)
        if levels and any(lv != levels[0] for lv in levels):
            run.level, run.slot_levels = min(levels), levels
        else:
            run.slot_levels = None
            if levels:
                run.level = levels[0]
        run.tier = tier_of_level(run.level)
        run.placed = True
        self._width[run.idx] = len(slots)
        self._dirty[run.idx] = run
        for level, cores in _by_level(changed).items():
            for r in self.model.affected(level, cores):
                self._dirty[r.idx] = r

    def _reschedule_leveled(self, run: _Run) -> None:
        """Settle at now, ask the model for the rate (0 while stopped), move what is still owed to a
        move's cost into advancing time (``Run.debt``), and push a fresh completion event."""
        now = self.now
        run.settle(now)
        rate = 0.0 if run.stopped else self._rate(run)
        owed = run.debt + (run.blocked_until - now if run.blocked_until > now else 0.0)
        if rate > 0.0:
            run.blocked_until = now + owed
            run.debt = 0.0
        else:
            run.blocked_until = now
            run.debt = owed
        run.rate = rate
        if run.placed:
            self._snapshot_leveled(run)
            run.placed = False
        version = self._version = self._version + 1
        run.version = version
        remaining = self._work[run.idx] - run.p0
        if rate > 0.0:
            heapq.heappush(self._heap, (run.blocked_until + (remaining / rate if remaining > 0 else 0.0), version, run))
        elif remaining <= _DONE_TOL and not run.stopped:  # done up to rounding when its rate fell to 0
            heapq.heappush(self._heap, (now, version, run))

    def _snapshot_leveled(self, run: _Run) -> None:
        snap = _LiveLevel.__new__(_LiveLevel)
        setattr_ = object.__setattr__
        for name, value in (("job", run.job), ("tier", run.tier), ("cores", run.cores),
                            ("start_time", run.start_time), ("tier_since", run.tier_since),
                            ("suspended", run.stopped), ("checkpointed", run.checkpointed), ("level", run.level),
                            ("slot_levels", run.slot_levels),
                            ("replicas", run.replicas),
                            ("migrated_at", run.migrated_at), ("_run", run), ("_sim", self)):
            setattr_(snap, name, value)
        self._snaps[run.job.id] = snap
