"""The simulator's two-tier engine (the *fast path*): the two-tier execution model of MEASY sec. 2.1
(an fg and a bg slot per core, the priority discipline) and vcsched's capped shared VMs.

Decisions the checker's fast path accepts (``accepts_fast``: starts on free slots only, by far the most
frequent) are applied directly (``_apply_starts``: StartFg, StartBg, with ``_start_fg_now`` for a start
while no bg job runs). Every other decision is committed from the checker's overlay
(``_commit_effects``): STARTED, MOVED (in place: a change of tier, paying its cost as time without
progress; onto other cores: a migration, no progress for ``cost`` seconds), STOPPED (progress lost;
with ``requeue`` the job waits again, in order), PLACED_SHARED and CAPPED (shared VMs). Suspended,
resumed, checkpointed, restored, resized and replicated jobs are not modelled here
(:class:`~vmctl.errors.SimulationError`): they need the levelled engine. ``tests/unit/test_effects.py``
checks that the fast path and the effects give the same runs.

Snapshots (``view.running``) are ``_LiveProgress`` objects rebuilt only when a run's placement or rate
changes, with live progress.
"""

from __future__ import annotations

import heapq
from typing import cast

from vmctl.errors import SimulationError
from vmctl.model import Decision, RunningJob, StartBg, StartFg, Tier
from vmctl.policies.effects import Effect, EffectKind
from vmctl.policies.occupancy import Occupancy
from vmctl.sim.engine_base import _BG, _FG, _INF, EngineBase, _Live, _Run

_STARTED, _MOVED, _STOPPED = EffectKind.STARTED, EffectKind.MOVED, EffectKind.STOPPED
_CAPPED, _PLACED_SHARED = EffectKind.CAPPED, EffectKind.PLACED_SHARED


class _LiveProgress(RunningJob):
    """A RunningJob whose ``progress`` is computed when read, as of the simulator's current time.

    Snapshots are rebuilt only when the job's placement or rate changes (``TwoTierEngine._snapshot``) and
    kept in a dict, so a policy or the invariant checker walking ``view.running`` costs a dict walk,
    not one new object per running job per pass. ``expected_end`` is a plain field here: it does not
    move while the rate stays as it is, for a fg job at rate 1 (``start + estimate - p0``) and for a
    bg job (infinite)."""

    __slots__ = ("_run", "_sim")
    _run: _Run
    _sim: EngineBase
    # class attributes shadow RunningJob's slots (read-only here): no per-snapshot stores on the hot path
    cap = None
    shared_nodes = ()
    tasks_left = None
    replicas = ()
    migrated_at = -_INF
    throughput = None  # vmctld's observed task-bag throughput: the simulator has none
    checkpointed = False
    slot_levels = None

    @property
    def level(self) -> int:
        return 0 if self.tier is _FG else 1

    @property
    def progress(self) -> float:
        return self._run.progress_at(self._sim.now)

    def __repr__(self) -> str:
        return (f"RunningJob(id={self.job.id!r}, tier={self.tier.value}, cores={self.cores}, "
                f"progress={self.progress:.3f}, expected_end={self.expected_end:.3f})")


class _LiveRunningJob(_LiveProgress):
    """Also a live ``expected_end = max(now, blocked_until) + estimate - progress`` (the ARCHITECTURE
    contract): for a fg job that advances slower than real time (fg loss), it drifts with the clock."""

    __slots__ = ()

    @property
    def expected_end(self) -> float:
        run = self._run
        now = self._sim.now
        begin = run.blocked_until if run.blocked_until > now else now
        return begin + run.job.estimate - run.progress_at(now)


class _LiveShared(_Live):
    """A running job of capped shared VMs (vcsched): ``shared_nodes``/``cap`` are its placement; its
    ``cores`` stand for its nodes (the first core of each); progress is live."""

    __slots__ = ()
    replicas = ()
    migrated_at = -_INF
    checkpointed = False
    slot_levels = None


# The slot setters of a fast-path snapshot (``_LiveProgress``): one snapshot is built per start, and
# calling a member descriptor's ``__set__`` costs about 60 % of ``object.__setattr__`` on the frozen class.
_SNAP_NAMES = ("job", "tier", "cores", "start_time", "tier_since", "suspended", "expected_end", "_run", "_sim")
(_SET_JOB, _SET_TIER, _SET_CORES, _SET_START, _SET_SINCE, _SET_SUSPENDED, _SET_END, _SET_RUN,
 _SET_SIM) = (getattr(_LiveProgress, name).__set__ for name in _SNAP_NAMES)
_new_object = object.__new__


class TwoTierEngine(EngineBase):
    """The two-tier engine's steps (a mixin of ``Simulator``)."""

    #: False builds every fg start's snapshot at once (the reference path that
    #: ``tests/unit/test_sim_lazy_snapshots.py`` compares the lazy one against)
    lazy_snapshots: bool = True

    def _build_pending(self) -> None:
        """Build the snapshots the fast path's fg starts left pending (``_start_fg_now``), in start
        order: what it would have built at the start (the run's fields it reads have not changed since:
        a move or a rate change of the run rebuilds its snapshot through ``_snapshot``, which builds the
        pending ones first)."""
        snaps = self._snaps
        for job_id, run in self._pending.items():
            job = run.job
            now = run.start_time
            fixed = run.rate == 1.0
            snap = _new_object(_LiveProgress if fixed else _LiveRunningJob)
            _SET_JOB(snap, job)
            _SET_TIER(snap, _FG)
            _SET_CORES(snap, run.cores)
            _SET_START(snap, now)
            _SET_SINCE(snap, now)
            _SET_SUSPENDED(snap, False)
            _SET_RUN(snap, run)
            _SET_SIM(snap, self)
            if fixed:
                _SET_END(snap, now + job.estimate)
            snaps[job_id] = snap
        self._pending.clear()

    def _snapshot(self, run: _Run) -> None:
        """(Re)build the job's entry in ``view.running`` after its placement or rate changed."""
        if self._pending:  # the pending ones first: the view's order is the order the snapshots were made
            self._build_pending()
        fg = run.tier is _FG
        if not fg and run.shared:
            self._snapshot_shared(run)
            return
        fixed_end = not fg or run.rate == 1.0
        snap = _new_object(_LiveProgress if fixed_end else _LiveRunningJob)
        _SET_JOB(snap, run.job)
        _SET_TIER(snap, run.tier)
        _SET_CORES(snap, run.cores)
        _SET_START(snap, run.start_time)
        _SET_SINCE(snap, run.tier_since)
        _SET_SUSPENDED(snap, False)
        _SET_RUN(snap, run)
        _SET_SIM(snap, self)
        if fixed_end:
            if fg:
                start = run.t0 if run.t0 > run.blocked_until else run.blocked_until
                _SET_END(snap, start + run.job.estimate - run.p0)
            else:
                _SET_END(snap, _INF)
        self._snaps[run.job.id] = snap

    def _snapshot_shared(self, run: _Run) -> None:
        if self._pending:
            self._build_pending()
        snap = _LiveShared.__new__(_LiveShared)
        setattr_ = object.__setattr__
        for name, value in (("job", run.job), ("tier", _FG), ("cores", run.cores), ("start_time", run.start_time),
                            ("tier_since", run.tier_since), ("suspended", False), ("level", 0), ("cap", run.cap),
                            ("shared_nodes", run.nodes), ("expected_end", _INF), ("_run", run), ("_sim", self)):
            setattr_(snap, name, value)
        self._snaps[run.job.id] = snap

    def _reschedule_two_tier(self, run: _Run) -> None:
        """Settle progress at now, recompute the rate and push a fresh completion event."""
        now = self.now
        # run.settle(now), inlined (same arithmetic as _Run.progress_at)
        start = run.t0 if run.t0 > run.blocked_until else run.blocked_until
        if now > start:
            run.p0 = run.p0 + run.rate * (now - start)
        run.t0 = now
        rate = run.rate = self._rate(run)
        if run.placed:  # a rate change alone leaves the snapshot valid (its progress is live)
            self._snapshot(run)
            run.placed = False
        version = self._version = self._version + 1
        run.version = version
        if rate > 0.0:
            start = run.t0 if run.t0 > run.blocked_until else run.blocked_until
            remaining = self._work[run.idx] - run.p0
            t = start + (remaining / rate if remaining > 0 else 0.0)
            heapq.heappush(self._heap, (t, version, run))

    def _mark_fg_change(self, cores: tuple[int, ...]) -> None:
        """The fg occupancy of ``cores`` changed: the bg jobs there need a new rate."""
        if not self._bg_count:
            return
        bg_run = self._bg_run
        dirty = self._dirty
        for c in cores:
            b = bg_run[c]
            if b is not None:
                dirty[b.idx] = b

    def _place(self, run: _Run, tier: Tier, cores: tuple[int, ...]) -> None:
        jid = run.job.id
        run.tier = tier
        run.cores = cores
        run.placed = True
        if tier is _FG:
            self._take_fg(run, jid, cores)
            if self._bg_count:
                self._mark_fg_change(cores)
        else:
            if not self._fg_run_kept:
                self._keep_fg_run()
            bg_job, bg_run = self._bg_job, self._bg_run
            for c in cores:
                bg_job[c] = jid
                bg_run[c] = run
            self._idle_bg.difference_update(cores)
            self._bg_count += 1
        self._dirty[run.idx] = run

    def _take_fg(self, run: _Run, job_id: str, cores: tuple[int, ...]) -> None:
        """The fg slots of ``cores`` go to ``run`` (fast path): job, utilization, the run itself once kept."""
        fg_job, fg_util, usage = self._fg_job, self._fg_util, self._usage[run.idx]
        if len(cores) == 1:  # the most frequent width, without the loop
            c = cores[0]
            fg_job[c] = job_id
            fg_util[c] = usage[0]
        else:  # (the checker has matched len(cores) to procs, the length of the usage tuple)
            for c, u in zip(cores, usage, strict=False):
                fg_job[c] = job_id
                fg_util[c] = u
        if self._fg_run_kept:
            fg_run = self._fg_run
            for c in cores:
                fg_run[c] = run
        self._idle_fg.difference_update(cores)

    def _keep_fg_run(self) -> None:
        """Fast path: the fg run of each core (``slot_run[0]``, which only a bg run's rate reads) is kept
        from the first bg placement on; until then nobody reads it and starts and completions skip it."""
        runs, fg_run = self._runs, self._fg_run
        for c, jid in enumerate(self._fg_job):
            fg_run[c] = None if jid is None else runs[jid]
        self._fg_run_kept = True

    def _vacate_two_tier(self, run: _Run) -> None:
        cores = run.cores
        if run.tier is _FG:
            fg_job, fg_util = self._fg_job, self._fg_util
            if len(cores) == 1:
                c = cores[0]
                fg_job[c] = None
                fg_util[c] = 0.0
                self._idle_fg.add(c)
            else:
                for c in cores:
                    fg_job[c] = None
                    fg_util[c] = 0.0
                self._idle_fg.update(cores)
            if self._fg_run_kept:
                fg_run = self._fg_run
                for c in cores:
                    fg_run[c] = None
            if self._bg_count:
                self._mark_fg_change(cores)
        elif run.shared:
            return  # shared VMs hold no level of a core
        else:
            bg_job, bg_run = self._bg_job, self._bg_run
            for c in cores:
                bg_job[c] = None
                bg_run[c] = None
            self._idle_bg.update(cores)
            self._bg_count -= 1

    def _start(self, job_id: str, tier: Tier, cores: tuple[int, ...]) -> None:
        self._place(self._new_run(job_id, tier, cores), tier, cores)

    def _start_fg_now(self, job_id: str, cores: tuple[int, ...]) -> None:
        """StartFg while no job runs in the bg tier and no rate waits for the flush (``_dirty`` empty):
        ``_start``, ``_place`` and the flush's ``_reschedule`` in one. The effects and their order are
        the same: nothing else is marked dirty (no bg job exists), and this run takes its version now,
        which is the version the flush would have given it first."""
        # ``_new_run`` (with ``_dequeue`` of the usual head) and ``_take_fg``, inlined: the hottest start
        qkey = self._qkey
        idx = qkey[job_id][1]  # (submit, position): the queue key knows the job's position
        q = self._queue
        if q[0].id == job_id:
            job = q.pop(0)
            del qkey[job_id], self._qjobs[job_id]
        else:
            job = self._dequeue(job_id)
        now = self.now
        run = _Run(idx, job, _FG, cores, now)
        self._runs[job_id] = run
        first = self._first_start
        if first[idx] != first[idx]:  # NaN: first start
            first[idx] = now
        fg_job, fg_util = self._fg_job, self._fg_util
        if len(cores) == 1:
            c = cores[0]
            fg_job[c] = job_id
            fg_util[c] = self._usage[idx][0]
            self._idle_fg.discard(c)
        else:
            for c, u in zip(cores, self._usage[idx], strict=False):
                fg_job[c] = job_id
                fg_util[c] = u
            self._idle_fg.difference_update(cores)
        if self._fg_run_kept:
            fg_run = self._fg_run
            for c in cores:
                fg_run[c] = run
        rate = run.rate = 1.0 - self._loss[idx] if self.two_tier else 1.0
        run.placed = False
        # its snapshot (``_snapshot`` of a fg run that has not advanced yet: t0 = blocked_until = now, p0 = 0)
        # is built when ``view.running`` is next read (``_build_pending``)
        if self.lazy_snapshots:
            self._pending[job_id] = run
        else:  # the reference path: the snapshot built at once, as before issue 27
            snap = _new_object(_LiveProgress if rate == 1.0 else _LiveRunningJob)
            _SET_JOB(snap, job)
            _SET_TIER(snap, _FG)
            _SET_CORES(snap, cores)
            _SET_START(snap, now)
            _SET_SINCE(snap, now)
            _SET_SUSPENDED(snap, False)
            _SET_RUN(snap, run)
            _SET_SIM(snap, self)
            if rate == 1.0:
                _SET_END(snap, now + job.estimate)
            self._snaps[job_id] = snap
        version = self._version = self._version + 1
        run.version = version
        if rate > 0.0:
            work = self._work[idx]
            heapq.heappush(self._heap, (now + (work / rate if work > 0 else 0.0), version, run))

    def _apply_starts(self, decision: Decision) -> None:
        """Apply a decision ``accepts_fast`` accepted: starts on free slots only (StartFg, StartBg), in
        order, each what its effect would say (STARTED on its cores at level 0 or 1)."""
        actions = decision.actions
        dirty = self._dirty
        if not actions:
            if dirty:
                self._flush_dirty()
            return
        for act in actions:
            t = type(act)
            if t is StartFg:
                sact = cast("StartFg", act)
                if dirty or self._bg_count:
                    self._start(sact.job_id, _FG, sact.cores)
                else:
                    self._start_fg_now(sact.job_id, sact.cores)
            else:
                bact = cast("StartBg", act)  # accepts_fast took only starts
                self._start(bact.job_id, _BG, bact.cores)
        if dirty:
            self._flush_dirty()

    def _commit_effects(self, decision: Decision, occ: Occupancy) -> None:
        """Commit a checked decision the fast path did not take: what each action did, as the one
        occupancy model says (``occ.effects``, in order), becomes progress kept or lost, costs and
        counters. A move that keeps its cores changes the level in place (paying its cost, if any, as
        time without progress); one onto other cores is a migration. Suspend, resume, checkpoint and
        restore (and resize, rows) are not modelled here: :class:`SimulationError`."""
        now = self.now
        for e in occ.effects:
            kind = e.kind
            jid = e.job_id
            after = e.after
            if kind is _STARTED:
                assert after is not None  # a start places the job
                if after.level == 0 and not self._dirty and not self._bg_count:
                    self._start_fg_now(jid, after.cores)
                else:
                    self._start(jid, _FG if after.level == 0 else _BG, after.cores)
            elif kind is _MOVED:
                assert after is not None  # a move places the job
                run = self._runs[jid]
                run.settle(now)
                self._vacate_two_tier(run)
                run.tier_since = now
                tier = _FG if after.level == 0 else _BG
                if tier is not run.tier:
                    self._tier_changes[run.idx] += 1
                if e.cost > 0.0 or not e.same_cores:
                    run.blocked_until = max(now, run.blocked_until) + e.cost
                if not e.same_cores:
                    self._migrations += 1
                    self._job_migrations[run.idx] += 1
                self._place(run, tier, after.cores)
            elif kind is _STOPPED:
                run = self._runs.pop(jid)
                if self._pending.pop(jid, None) is None:
                    del self._snaps[jid]
                self._vacate_two_tier(run)
                self._killed(run, e.requeue)
            elif kind is _PLACED_SHARED or kind is _CAPPED:
                self._apply_shared(e)
            else:
                raise SimulationError(time=now, problem=f"the simulator does not model {e.action.kind} ({jid})")
        if self._dirty:
            self._flush_dirty()

    def _apply_shared(self, e: Effect) -> None:
        """Capped shared VMs (vcsched): PLACED_SHARED starts a queued job or re-places a running one (a
        change of nodes counts as one migration, at no cost); CAPPED changes the cap. The job advances
        at ``shared_rate(cap, cpu_need)``."""
        now = self.now
        jid = e.job_id
        run = self._runs.get(jid)
        if run is not None and not run.shared:
            raise SimulationError(time=now, problem=f"the simulator does not model {e.action.kind} of {jid}, "
                                                    "which runs on a level of its cores")
        after = e.after
        assert after is not None and after.cap is not None  # shared VMs, with their cap (the occupancy model)
        if e.kind is _CAPPED:
            assert run is not None  # the checker: SetCap names a running job
            run.settle(now)
            run.cap = after.cap
        else:
            stand_in = tuple(self._node_core[n] for n in after.nodes)
            if run is None:
                run = self._new_run(jid, _BG, stand_in)
                run.shared = True
                self._first_bg[run.idx] = 2
            else:
                run.settle(now)
                if sorted(run.nodes) != sorted(after.nodes):
                    run.tier_since = now
                    self._migrations += 1
                    self._job_migrations[run.idx] += 1
                run.cores = stand_in
            run.nodes = after.nodes
            run.cap = after.cap
        run.placed = True
        self._dirty[run.idx] = run
