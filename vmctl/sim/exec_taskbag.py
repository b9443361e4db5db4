"""The task-bag execution model: bags of independent tasks on workers of different speeds (paper 001).

A task bag (:class:`vmctl.model.JobShape`, kind ``task-bag``) is a list of tasks, each with its work
in seconds on a standard core (paper 001 sec. II-A). The job holds ``width`` workers, one per (core,
level) slot it was placed on (a worker is one VM slot, sec. II-B-2: "a worker instance executes at most
one task at a time"; on a ``shared`` cluster a bag may hold several levels of one core,
``Run.slot_levels``). Each worker runs one task at a time at its slot's rate
(:meth:`MoldableModel.slot_rate`); a worker that finishes a task takes the next one not started, in the
bag's order.

Sharing a core (issue 12: paper 001's testbed tasks sleep for their length). A busy worker demands its
task's CPU usage ``u`` (``JobShape.task_usage``, in (0, 1]; default 1.0, a CPU-bound task) of its core,
an idle one nothing, a rigid or moldable job's process the whole core; the core's speed is split among
the demands on its levels max-min fairly, exactly as the mock backend splits a core among equal-weight
VMs (:func:`vmctl.cpushare.share_core`), and a task progresses at its allocation over ``u``, times the
core's speed. By hand, one core of speed 1 and 2 shared levels: two CPU-bound tasks (u = 1) get 0.5 each
and run at half speed; two tasks of u = 0.5 get 0.5 each, i.e. full speed; u = 1.0 beside u = 0.25 gets
0.75 and 0.25: the first at 0.75, the second at full speed; two sleeping tasks (u = 0.01) both at full
speed, whatever their neighbours (u -> 0 is a sleep).

The job is done when every task is done; its work (the engine's progress) is the sum of its tasks,
advancing at the sum of its busy workers' rates, so the engine's completion is the last task's end. The
tasks' work is the forecast the policy sees; the actual work of each is scaled as a moldable job's time is
(:meth:`MoldableModel.actual_factor`: the record's run at ``procs`` workers over the shape's time
there, ``JobShape.time_at``), so a hand-made bag whose record says that time runs exactly as given.

Resize (the policy sets the worker count, sec. III). The occupancy model applies a ``Resize`` at once:
new slots get new workers, which take tasks immediately. A worker whose slot the resize gives up
keeps it until its running task ends (a running task is never killed to shrink a job; issue 12): the
model holds the slot back for the job (``hold_slots``) and gives it up at that task's end
(``release_slots``); meanwhile the slot is the job's in the view. A worker that is idle when its core
is given up leaves at once. If the same decision gives a held-back slot to another job, the run stops
with ``SimulationError`` (a shrink takes effect at task boundaries; the policy must wait for them).
A freed slot is seen by the policy at its next pass: ``release_slots`` makes the engine call it.

Idle workers leave (issue 28, as vmctld's dispatcher does). A worker that ends a task and finds none
left to take leaves the bag at once and its slot is free (``release_slots``, so the policy gets a
pass), while another worker of the bag still runs a task; the bag's last task end completes the job
with the slots it holds. That is ``vmctl.daemon.dispatcher.observe`` (a worker with no next task is
dropped, ``_drop``) followed by ``vmctl.daemon.follow`` ("job released a worker", an event that makes
vmctld decide). Before, the idle worker kept its slot until the policy shrank the bag at a later pass
(an arrival or a job's end), which the what-if replay of a live run showed as bags starting up to
377 s later than live (docs/operations.md, "How far to trust it"). Only under a policy that schedules
task bags (``"task-bag" in policy.needs.shapes``, the ``dispatch-*`` policies): a rigid policy (FCFS,
EASY: paper 001's baseline) runs a bag rigidly on the cores it started it on, as vmctld, which refuses
such a policy task bags, would. A task end that hands the worker its next task calls no pass, in
vmctld neither (no event; its periodic ``tick_s`` pass, which the simulator does not model, re-plans
in between, which matters only to the policies whose plan follows the remaining work: proportion,
workload, deadline). Reading of paper 001 (sec. II-B-2/3): the decision maker is passive, "normally
... invoked by dispatcher whenever a job is submitted or finished"; a worker is "available" when idle
and ready to accept a task, so a worker whose bag has no task left for it is available again, handed
back by the dispatcher, which invokes the decision maker for it as for a job's end (the pass at a
slot freed at a task boundary already was this reading).

Rigid and moldable jobs run as in :class:`~vmctl.sim.exec_moldable.MoldableModel`. Worked example
(checked in tests/unit/test_sim_shapes.py): 5 tasks of 10 s on 2 workers of speed 1 end at 30 (tasks 0,
1 in [0, 10), 2, 3 in [10, 20), 4 in [20, 30)); shrunk to 1 worker at 5, the task on the given-up
core still ends at 10, and the one remaining worker runs tasks 2, 3, 4 in [10, 40): the job ends at 40.
On one core of 2 shared levels, the same bag on both slots (``slot_levels=(0, 1)``) runs two tasks at
a time at half speed each: tasks 0, 1 in [0, 20), 2, 3 in [20, 40), task 4 alone at full speed in
[40, 50) (the other worker is idle and demands nothing); on one slot it ends at 50 too (5 x 10 s): the
core's speed is the limit. With ``task_usage`` 0.01 (sleeping tasks) the two slots run two tasks at a
time at full speed: [0, 10), [10, 20), task 4 in [20, 30).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import ClassVar

from vmctl.errors import SimulationError, ValidationError
from vmctl.model import JobShape
from vmctl.sim.exec_moldable import MoldableModel
from vmctl.sim.execution import EngineState, Run

#: a task is done when less than this much of its work is left (rounding of the piecewise rates)
_TOL = 1e-7


class _Bag:
    """One task-bag run's workers: ``task[i]`` is the task worker i runs (-1: idle), ``left[i]`` its
    work still to do and ``speed[i]`` its rate; worker i sits on slot ``run.slots[i]`` (core, level).
    ``draining`` are the slots the job has given up whose worker still runs its task; ``p`` is the run's progress (the
    engine's) when ``left`` was last brought up to date; ``version`` invalidates older events; ``at`` maps
    a slot to its worker (:meth:`index`, after every change of the run's slots)."""

    __slots__ = ("at", "at_slots", "booted", "draining", "factor", "left", "next", "p", "shape", "speed", "task",
                 "version")

    def __init__(self, shape: JobShape, factor: float) -> None:
        self.shape = shape
        self.factor = factor  # actual work / the shape's work (MoldableModel.actual_factor)
        self.next = 0
        self.task: list[int] = []
        self.left: list[float] = []
        self.speed: list[float] = []
        self.draining: set[tuple[int, int]] = set()
        self.p = 0.0
        self.version = 0
        self.at: dict[tuple[int, int], int] = {}
        self.at_slots: tuple[tuple[int, int], ...] = ()
        self.booted = 0.0  # the boot work its workers added to its tasks' (``TaskBagModel.boots``)

    def index(self, slots: tuple[tuple[int, int], ...]) -> None:
        if slots != self.at_slots:
            self.at, self.at_slots = {s: i for i, s in enumerate(slots)}, slots

    def demand(self, slot: tuple[int, int]) -> float:
        """What the worker on ``slot`` demands of its core: its task's CPU usage while it runs one."""
        i = self.at.get(slot)
        return self.shape.task_usage if i is not None and self.task[i] >= 0 else 0.0

    def take(self, i: int) -> None:
        """Worker i takes the next task not started (or idles when none is left)."""
        tasks = self.shape.tasks
        if self.next < len(tasks):
            self.task[i], self.left[i] = self.next, tasks[self.next] * self.factor
            self.next += 1
        else:
            self.task[i], self.left[i] = -1, 0.0

    def add_worker(self) -> None:
        self.task.append(-1)
        self.left.append(0.0)
        self.speed.append(0.0)
        self.take(len(self.task) - 1)


class TaskBagModel(MoldableModel):
    """Task bags, moldable and rigid jobs at node speed (see the module docstring)."""

    name: ClassVar[str] = "task-bag"
    has_events: ClassVar[bool] = True
    SHAPES: ClassVar[frozenset[str]] = frozenset({"rigid", "moldable", "task-bag"})

    def __init__(self, shapes: Mapping[str, JobShape] | None = None, speeds: Sequence[float] = (),
                 cores_per_node: int = 1, groups: Sequence[str] = (), levels: int = 1,
                 boots: Sequence[float] = (), booted: Collection[str] | None = None) -> None:
        """``boots``: per core, the boot of its node (seconds of work, passing at the node's speed), which
        a new worker of a bag runs before its first task (module docstring, "Boots"); ``booted``: the
        jobs that take it (None: every task bag)."""
        super().__init__(shapes, speeds, cores_per_node, groups, levels)
        for i, b in enumerate(boots):
            if isinstance(b, bool) or not isinstance(b, int | float) or not (math.isfinite(b) and b >= 0):
                raise ValidationError(field=f"boots[{i}]", problem=f"must be a number >= 0, got {b!r}")
        self._boots = [float(b) for b in boots]
        self._booted = None if booted is None else frozenset(booted)

    def _boot(self, run: Run, bag: _Bag, i: int, core: int) -> None:
        """Worker i, new on ``core``, boots before its first task: that task's work grows by the node's boot."""
        if self._boots and bag.task[i] >= 0 and (self._booted is None or run.job.id in self._booted):
            b = self._boots[core]
            bag.left[i] += b
            bag.booted += b

    def grown_work(self, run: Run) -> float:
        """The boot work the bag's workers added since the engine last asked (new workers of a resize)."""
        bag = self._bag(run)
        if bag is None or not bag.booted:
            return 0.0
        b, bag.booted = bag.booted, 0.0
        return b

    def bind(self, state: EngineState) -> None:
        super().bind(state)
        if self._boots and len(self._boots) != state.cores:
            raise ValidationError(field="boots", problem=f"{len(self._boots)} boots for {state.cores} cores")
        # (time, sequence, version, run): a task end of ``run`` as of its bag's ``version`` (unique sequence
        # numbers keep the heap from comparing runs)
        self._events: list[tuple[float, int, int, Run]] = []
        self._seq = itertools.count()
        # vmctld's dispatcher: a worker with no task left leaves its bag at once (module docstring, "Idle
        # workers"); only under a policy that schedules task bags (EASY & co. run a bag rigidly)
        needs = getattr(getattr(state, "policy", None), "needs", None)
        self.release_idle = needs is None or "task-bag" in needs.shapes

    # ------------------------------------------------------------------ bookkeeping

    def _bag(self, run: Run) -> _Bag | None:
        data = run.data
        return data if isinstance(data, _Bag) else None

    def _settle(self, run: Run, bag: _Bag, now: float) -> None:
        """Bring every busy worker's ``left`` up to ``now``. The engine's progress is the truth: since
        the last settle the busy workers, at the speeds in force, shared its growth ``dp`` in
        proportion to their speeds (they all ran for the same effective time ``dp / sum(speeds)``,
        which already leaves out time stopped or paying a move's cost)."""
        p = run.progress_at(now)
        dp = p - bag.p
        bag.p = p
        if dp <= 0.0:
            return
        busy = sum(bag.speed[i] for i, task in enumerate(bag.task) if task >= 0)
        if busy <= 0.0:  # pragma: no cover - the run advances only while a worker is busy
            return
        dt = dp / busy
        for i, task in enumerate(bag.task):
            if task >= 0:
                bag.left[i] -= bag.speed[i] * dt

    def _push(self, run: Run, bag: _Bag, now: float) -> None:
        """(Re)schedule the task ends of the run's busy workers at their current speeds. The time
        ignores a pending move cost, so an event may come early: ``on_event`` then re-pushes it."""
        bag.version += 1
        for i, task in enumerate(bag.task):
            if task >= 0 and bag.speed[i] > 0.0:
                heapq.heappush(self._events, (now + max(0.0, bag.left[i]) / bag.speed[i], next(self._seq),
                                              bag.version, run))

    # ------------------------------------------------------------------ the contract

    def slot_demand(self, run: Run, core: int, level: int) -> float:
        """A bag's worker demands its task's CPU usage while it runs one, nothing while idle."""
        bag = self._bag(run)
        return super().slot_demand(run, core, level) if bag is None else bag.demand((core, level))

    def work(self, run: Run) -> float:
        shape = self.shapes.get(run.job.id)
        if shape is None or shape.kind != "task-bag":
            return super().work(run)
        bag = _Bag(shape, self.actual_factor(run))
        for _ in run.cores:
            bag.add_worker()
        bag.index(run.slots)
        run.data = bag
        if self._boots:
            for i, (c, _level) in enumerate(run.slots):
                self._boot(run, bag, i, c)
            booted, bag.booted = bag.booted, 0.0
            return shape.work * bag.factor + booted
        return shape.work * bag.factor

    def span(self, run: Run) -> float:
        """A bag's length for the metrics: its time at the width it started with, in order on standard
        workers (``JobShape.time_at``), actual (scaled as its tasks are); its workers hold their slots
        until the job ends, so span x width is the core time it occupies (at a constant width)."""
        shape = self.shapes.get(run.job.id)
        if shape is None or shape.kind != "task-bag":
            return super().span(run)
        return shape.time_at(run.width) * self.actual_factor(run)

    def known_work(self, run: Run) -> float:
        shape = self.shapes.get(run.job.id)
        if shape is None or shape.kind != "task-bag":
            return super().known_work(run)
        return shape.work

    def tasks_left(self, run: Run) -> int | None:
        """The bag's unfinished tasks: those its workers run (draining ones too) and those not started."""
        bag = self._bag(run)
        if bag is None:
            return None
        return len(bag.shape.tasks) - bag.next + sum(1 for task in bag.task if task >= 0)

    def rate(self, run: Run) -> float:
        bag = self._bag(run)
        if bag is None:
            return super().rate(run)
        now = self.state.now
        self._settle(run, bag, now)
        total = 0.0
        slot_rate = self.slot_rate
        slots = run.slots
        bag.index(slots)  # a Move changes the slots without a model hook
        for i, (c, level) in enumerate(slots):
            speed = bag.speed[i] = slot_rate(c, level)
            if bag.task[i] >= 0:
                total += speed
        if total <= 0.0 and bag.next >= len(bag.shape.tasks):
            # every task has ended: what the engine's progress still lacks is the rounding a task end
            # is allowed (_TOL of its work, on workers of unequal speeds), which the workers finish at
            # once (at their full rate; it is microseconds). Without this the run would never complete.
            total = sum(bag.speed) or 1.0
        self._push(run, bag, now)
        return total

    def next_event(self) -> float:
        events = self._events
        runs = self.state.runs
        while events:
            _t, _seq, version, run = events[0]
            bag = run.data
            if runs.get(run.job.id) is run and isinstance(bag, _Bag) and bag.version == version:
                return events[0][0]
            heapq.heappop(events)
        return float("inf")

    def on_event(self, now: float) -> Iterable[Run]:
        """Task ends due now: each such worker takes the next task (or idles, or, on a given-up core,
        leaves); the runs whose rate changed."""
        events = self._events
        due = now + 1e-9
        changed: dict[int, Run] = {}
        while events and events[0][0] <= due:
            _t, _seq, version, run = heapq.heappop(events)
            bag = run.data
            if self.state.runs.get(run.job.id) is run and isinstance(bag, _Bag) and bag.version == version:
                changed[run.idx] = run
        # a task whose rest takes less than the clock can resolve at ``now`` (a few ulps: trace times are
        # Unix seconds, ulp 2.4e-7 s) is done too: its end event would otherwise come back at ``now``
        # for ever, with no time passing to finish it
        tick = 4.0 * math.ulp(now)
        others: dict[int, Run] = {}  # runs on other levels of a core whose worker went idle
        for run in changed.values():
            bag = run.data
            self._settle(run, bag, now)
            release: list[tuple[int, int]] = []
            slots = run.slots
            for i, task in enumerate(bag.task):
                if task >= 0 and bag.left[i] <= max(_TOL * max(1.0, bag.shape.tasks[task] * bag.factor),
                                                    tick * bag.speed[i]):
                    slot = slots[i]
                    if slot in bag.draining:
                        bag.task[i], bag.left[i] = -1, 0.0
                        release.append(slot)
                    else:
                        bag.take(i)
                        if bag.task[i] < 0 and self.levels > 1:  # idle now: its core's other runs get more
                            for r in self.affected(slot[1], (slot[0],)):
                                others[r.idx] = r
            if self.release_idle:
                release.extend(self._idle_slots(run, bag))
            if release:
                self._release(run, bag, release)
        return list((changed | others).values())  # the engine re-rates each (``rate`` re-times its task ends)

    def on_resize(self, run: Run, old_slots: tuple[tuple[int, int], ...], now: float) -> Iterable[Run]:
        bag = self._bag(run)
        if bag is None:  # pragma: no cover - the checker accepts Resize for task bags only
            raise SimulationError(time=now, problem=f"resize of {run.job.id}, which is not a task bag")
        self._settle(run, bag, now)
        old = {s: i for i, s in enumerate(old_slots)}
        new_slots = run.slots
        task, left, speed = [], [], []
        for s in new_slots:  # kept slots keep their worker (and a draining one stops draining)
            i = old.get(s)
            task.append(bag.task[i] if i is not None else -1)
            left.append(bag.left[i] if i is not None else 0.0)
            speed.append(bag.speed[i] if i is not None else 0.0)
            bag.draining.discard(s)
        kept = set(new_slots)
        hold = tuple(s for s in old_slots if s not in kept and bag.task[old[s]] >= 0)
        for s in hold:  # given up while running a task: the worker stays until that task ends
            i = old[s]
            task.append(bag.task[i])
            left.append(bag.left[i])
            speed.append(bag.speed[i])
        bag.task, bag.left, bag.speed = task, left, speed
        bag.index(new_slots + hold)
        for i, s in enumerate(new_slots):  # new workers take the next tasks, in slot order
            if s not in old:
                bag.take(i)
                self._boot(run, bag, i, s[0])
        if hold:
            bag.draining.update(hold)
            self.state.hold_slots(run, hold)
        return ()

    # ------------------------------------------------------------------ idle workers leave (vmctld's dispatcher)

    @staticmethod
    def _idle_slots(run: Run, bag: _Bag) -> list[tuple[int, int]]:
        """The slots of the bag's idle workers (no task left for them), which leave the bag now, as
        vmctld's dispatcher drops a worker that has no next task (``vmctl.daemon.dispatcher.observe``) and
        the release makes vmctld decide. None while no worker of the bag is busy: its last task has
        ended and the run completes holding its slots, as any job does."""
        if all(task < 0 for task in bag.task):
            return []
        return [s for s, task in zip(run.slots, bag.task, strict=True) if task < 0 and s not in bag.draining]

    # ------------------------------------------------------------------ slots held past a resize

    def _release(self, run: Run, bag: _Bag, slots: list[tuple[int, int]]) -> None:
        gone = set(slots)
        keep = [i for i, s in enumerate(run.slots) if s not in gone]
        bag.task = [bag.task[i] for i in keep]
        bag.left = [bag.left[i] for i in keep]
        bag.speed = [bag.speed[i] for i in keep]
        bag.draining -= gone
        self.state.release_slots(run, tuple(slots))
        bag.index(run.slots)
