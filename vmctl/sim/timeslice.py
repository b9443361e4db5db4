"""The time-slice execution model: gang scheduling on an Ousterhout matrix (paper 004, sec. 2-3).

The cluster has ``L`` levels per core under the ``timeslice`` discipline; level k is row k of the
matrix (a virtual machine of the whole cluster), L the multiprogramming level (MPL). Time is cut into
slices of ``period`` seconds (the paper's T = 200 s); during each slice one row is active, the rows
following the schedule's ``order`` cyclically from its ``epoch``::

    active row at time t = order[floor((t - epoch) / period) mod len(order)]

The schedule is the model's default (``period``, rows 0 .. L-1 in turn, epoch 0) until a decision
carries a :class:`~vmctl.model.SliceSchedule`, which replaces it from then on (a row the order leaves
out is never active). The engine fires an event at every slice boundary; the policy is not called
there (it asks with ``wake_at`` when it wants to be).

A job runs one process per core on one row (a level of its cores, as the occupancy model places it)
and advances at rate 1 while its row is active, 0 otherwise: a job alone in its row of an L-row
cycle takes about L times its run time. A job may also be in several rows (the paper's expansion
phase): a :class:`~vmctl.model.Replicate` puts it on another level of the *same* cores (free there;
the occupancy model keeps the job's other levels as ``Run.replicas`` / ``RunningJob.replicas``), and
it then advances at rate 1 in every slice where *any* of its rows is active (never faster: one
process per core, the replicas are the same processes given more slices). Kill, checkpoint and
completion free every row; ``Unreplicate`` drops one (a replicated job neither moves nor resizes).
Suspend/Resume: rate 0 while suspended, slots kept; Checkpoint: slots freed, progress kept; a
Move/Restore with ``cost`` c (migration option 1 or 2 of sec. 2, or a restore) costs c seconds of the
job's own active time (:mod:`vmctl.sim.execution`, "Costs").

Boots in wall time (``boots``: job id -> seconds; the what-if replay's measured boots, issue 28). A job
listed there advances at rate 1 for its first ``boots[id]`` seconds after its first start, whichever row
is active, and by its row's slices after that; its work holds the boot (``read_swf`` adds it to the
run time). vmctld measures a gang job's boot from its start to every process running, and a real
host's guest boots only while its row is active: the measured boot already holds the slices its row
was paused for, and time-slicing it again counted them twice (a gs run with one real-libvirt host
replayed +16.5 % long). A boot passes once per job (a run started again after a requeue has none
left); an event ends each boot (its run's rate changes then).

Worked example (L = 2, T = 10, 2 cores): A (2 processes, 25 s of work) on row 0, B (2 processes,
15 s) on row 1, both at t = 0. Row 0 is active in [0, 10), [20, 30), [40, 50) ..., row 1 in
[10, 20), [30, 40) ...: A has 10 s of work at 10, 20 at 30 and ends at 45; B ends at 35. Had A
been replicated into row 1 on its cores (B elsewhere), it would advance in every slice and end at 25.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from typing import ClassVar

from vmctl.errors import ValidationError
from vmctl.model import Discipline, SliceSchedule
from vmctl.policies.base import Offer
from vmctl.sim.execution import EngineState, ExecutionModel, Run

#: the paper's time slice (sec. 3: T = 200 s)
DEFAULT_SLICE = 200.0
_EPS = 1e-9
_INF = math.inf


class TimeSliceModel(ExecutionModel):
    """Gang scheduling with ``levels`` rows rotating every ``period`` seconds (see the module docstring)."""

    name: ClassVar[str] = "timeslice"
    has_events: ClassVar[bool] = True

    def __init__(self, levels: int, period: float = DEFAULT_SLICE, order: tuple[int, ...] | None = None,
                 boots: Mapping[str, float] | None = None) -> None:
        super().__init__()
        if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
            raise ValidationError(field="timeslice.levels", problem=f"must be an integer >= 1, got {levels!r}")
        if isinstance(period, bool) or not isinstance(period, int | float) or not (
                period > 0 and math.isfinite(period)):
            raise ValidationError(field="timeslice.period", problem=f"must be a positive number of seconds, "
                                                                    f"got {period!r}")
        rows = tuple(range(levels)) if order is None else tuple(order)
        if not rows or len(set(rows)) != len(rows) or not all(0 <= r < levels for r in rows):
            raise ValidationError(field="timeslice.order", problem=f"{rows} must list distinct rows of "
                                                                  f"0..{levels - 1}")
        self.levels = levels
        self.schedule = SliceSchedule(float(period), rows, 0.0)
        self._k = 0  # index of the current slice since the epoch
        self._active = rows[0]
        self._next = _INF  # start of the next slice (inf: one row only, nothing ever changes)
        self._pos = {r: i for i, r in enumerate(rows)}
        self._stalled = False  # no run can advance: no events until one may (see ``rate``)
        self._boots = {str(k): float(v) for k, v in (boots or {}).items() if v > 0}  # job id -> wall-time boot
        self._boot_end: dict[str, float] = {}  # job id -> when its boot ends (set at its first start)
        self._boot_heap: list[tuple[float, str]] = []  # (end, job id) of the boots not yet ended

    def work(self, run: Run) -> float:
        """As the base model's; the first start of a job with a boot opens its boot (module docstring)."""
        jid = run.job.id
        if jid in self._boots and jid not in self._boot_end:
            end = self.state.now + self._boots[jid]
            self._boot_end[jid] = end
            heapq.heappush(self._boot_heap, (end, jid))
        return super().work(run)

    def _booting(self, run: Run, now: float) -> float:
        """Seconds of boot the run has left at ``now`` (0: none)."""
        end = self._boot_end.get(run.job.id)
        return end - now if end is not None and end > now + _EPS else 0.0

    def _next_boot_end(self) -> float:
        heap = self._boot_heap
        while heap and heap[0][1] not in self.state.runs:
            heapq.heappop(heap)  # its job no longer runs (an end not yet handled stays: ``on_event`` takes it)
        return heap[0][0] if heap else _INF

    def offer(self) -> Offer:
        return Offer(where=self.where(), levels=self.levels, discipline=Discipline.TIMESLICE)

    def bind(self, state: EngineState) -> None:
        super().bind(state)
        self._set(self.schedule, state.now)

    def _set(self, schedule: SliceSchedule, now: float) -> None:
        """Follow ``schedule`` from ``now``: the current slice, its row, the next boundary."""
        self.schedule = schedule
        period, order, epoch = schedule.period, schedule.order, schedule.epoch
        k = math.floor((now - epoch) / period)
        if epoch + (k + 1) * period <= now + _EPS:  # on a boundary, up to rounding
            k += 1
        self._k = k
        self._active = order[k % len(order)]
        self._next = epoch + (k + 1) * period if len(order) > 1 else _INF
        self._pos = {r: i for i, r in enumerate(order)}

    @property
    def active_row(self) -> int:
        return self._active

    def rate(self, run: Run) -> float:
        self._stalled = False
        now = self.state.now
        if now >= self._next - _EPS:
            # no boundary events while nothing ran or nothing could advance: catch up with the clock (no
            # other run's rate changes, since none was advancing; while runs advance, every boundary
            # is an event handled before any rate is asked for at that instant)
            self._set(self.schedule, now)
        if self._boot_end and self._booting(run, now):
            return 1.0  # booting: wall time (module docstring)
        active = self._active
        return 1.0 if run.level == active or (run.replicas and active in run.replicas) else 0.0

    def next_event(self) -> float:
        if not self.state.runs:
            return _INF
        nxt = _INF if self._stalled else self._next
        if self._boot_heap:
            b = self._next_boot_end()
            if b < nxt:
                return b
        return nxt

    def on_event(self, now: float) -> Iterable[Run]:
        booted: list[Run] = []
        heap = self._boot_heap
        while heap and heap[0][0] <= now + _EPS:  # boots that end now: their runs go by their rows from here
            _end, jid = heapq.heappop(heap)
            run = self.state.runs.get(jid)
            if run is not None:
                booted.append(run)
        if booted and now < self._next - _EPS:
            return booted  # no slice boundary now
        return [*booted, *self._on_boundary(now)]

    def _on_boundary(self, now: float) -> Iterable[Run]:
        old = self._active
        self._set(self.schedule, now)
        new = self._active
        changed: list[Run] = []
        can_advance = False
        rows = self._pos
        for run in self.state.runs.values():
            extra = run.replicas
            if run.level == old or run.level == new or (extra and (old in extra or new in extra)):
                changed.append(run)
            if not can_advance and not run.stopped and (run.level in rows or any(r in rows for r in extra)
                                                        or (self._boot_end and self._booting(run, now))):
                can_advance = True
        self._stalled = not can_advance
        return changed if old != new else ()

    def on_schedule(self, schedule: SliceSchedule, now: float) -> Iterable[Run]:
        """The runs whose rate changes at ``now``: those of the row the runs' rates were last computed for
        (the active row as followed so far) and of the row active now, when the two differ; none when the
        same row stays active (a gang policy sends its schedule with every decision, mostly the same one:
        re-rating every run at every decision was a third of the engine's time on a gang run). Every run
        is in one of the two rows or had rate 0 and keeps it. After a stall (no run could advance, so the
        boundaries were not followed), every run."""
        stalled = self._stalled
        old = self._active
        self._set(schedule, now)
        self._stalled = False
        runs = self.state.runs.values()
        if stalled:
            return list(runs)
        new = self._active
        if old == new:
            return ()
        return [run for run in runs if run.level == old or run.level == new
                or (run.replicas and (old in run.replicas or new in run.replicas))]

    def expected_end(self, run: Run, now: float) -> float:
        """When the run ends at the latest if the schedule stays as it is: its remaining estimate
        (plus what it owes to a move's cost) in the active slices of its rows; ``inf`` when stopped or
        in rows the schedule leaves out. A booting run advances in wall time until its boot ends."""
        left = self._booting(run, now) if self._boot_end and not run.stopped else 0.0
        if left:
            need = run.job.estimate - run.progress_at(now) + run.debt
            if need <= left:
                return now + need
            return self._end_from(run, now + left, need - left)
        if run.replicas:
            return self._expected_end_rows(run, now)
        j = self._pos.get(run.level)
        if run.stopped or j is None:
            return _INF
        blocked = run.blocked_until - now if run.blocked_until > now else 0.0
        need = run.job.estimate - run.progress_at(now) + run.debt + blocked
        if need <= 0:
            return now
        period, n = self.schedule.period, len(self.schedule.order)
        if n == 1:
            return now + need
        k = self._k
        if k % n == j:  # its row is active now
            left = self._next - now
            if need <= left:
                return now + need
            need -= left
            first = k + n
        else:
            first = k + (j - k) % n
        cycles = max(0, math.ceil(need / period) - 1)
        return self.schedule.epoch + (first + cycles * n) * period + (need - cycles * period)

    def _end_from(self, run: Run, t: float, need: float) -> float:
        """When ``need`` seconds of the run's rows' active time have passed from ``t`` on (the schedule as it
        is; ``inf`` when none of its rows is in the order)."""
        pos = {self._pos[r] for r in (run.level, *run.replicas) if r in self._pos}
        if not pos:
            return _INF
        period, n, epoch = self.schedule.period, len(self.schedule.order), self.schedule.epoch
        if n == 1 or len(pos) == n:
            return t + need
        k = math.floor((t - epoch) / period)
        if epoch + (k + 1) * period <= t + _EPS:
            k += 1
        if k % n in pos:
            left = epoch + (k + 1) * period - t
            if need <= left:
                return t + need
            need -= left
        k += 1
        per_cycle = len(pos) * period
        cycles = max(0, math.ceil(need / per_cycle) - 1)
        need -= cycles * per_cycle
        k += cycles * n
        while True:
            if k % n in pos:
                if need <= period:
                    return epoch + k * period + need
                need -= period
            k += 1

    def _expected_end_rows(self, run: Run, now: float) -> float:
        """``expected_end`` of a job in several rows: the same count over every slot of the cycle held by
        one of its rows (whole cycles skipped at once, then at most one cycle walked slice by slice)."""
        pos = sorted({self._pos[r] for r in (run.level, *run.replicas) if r in self._pos})
        if run.stopped or not pos:
            return _INF
        blocked = run.blocked_until - now if run.blocked_until > now else 0.0
        need = run.job.estimate - run.progress_at(now) + run.debt + blocked
        if need <= 0:
            return now
        period, n = self.schedule.period, len(self.schedule.order)
        if len(pos) == n:
            return now + need
        k = self._k
        if k % n in pos:  # one of its rows is active now
            left = self._next - now
            if need <= left:
                return now + need
            need -= left
        k += 1
        per_cycle = len(pos) * period
        cycles = max(0, math.ceil(need / per_cycle) - 1)
        need -= cycles * per_cycle
        k += cycles * n
        mine = set(pos)
        while True:
            if k % n in mine:
                if need <= period:
                    return self.schedule.epoch + k * period + need
                need -= period
            k += 1
