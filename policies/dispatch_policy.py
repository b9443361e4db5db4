"""Paper 001's four policies as simulator/daemon policies: ``dispatch-priority``, ``dispatch-proportion``,
``dispatch-workload``, ``dispatch-deadline``.

Each is stateless: on every pass it builds the decision maker's inputs from the view, asks the pure
planner (:func:`vmctl.policies.dispatch.plan`, whose header gives the readings of the listings) for a
plan and turns the plan's worker counts into ``Start`` / ``Resize`` actions on task bags.

Inputs from the view.

- **Workers**: every usable slot (core x level) that is free or held by a running task bag; a slot
  held by any other job is not a worker. A worker's speed is its node's speed divided by the number of
  levels (the ``shared`` discipline splits a core equally between its levels when they are all busy:
  the paper's testbed runs 2 workers on each single-core node).
- **Jobs**: the task bags queued or running (not suspended). A running bag's unfinished tasks are
  ``RunningJob.tasks_left`` (the field this policy needed; the simulator's task-bag model fills it);
  its remaining work is the forecast work of its last ``tasks_left`` tasks (tasks are started in the
  bag's order, so the unfinished ones are the last; exact when the tasks are equal, as in a trace's
  bags). A queued bag has all its tasks. The planner's task count is capped by the bag's
  ``max_workers`` (a job never holds more workers than it has unfinished tasks, nor more than its
  shape allows). A running bag's throughput on a worker it holds is ``RunningJob.throughput`` where
  the view has it (vmctld: corrected from observed task durations, paper 001's status checker), else the
  worker's speed times the bag's *profile factor*: the mean, over the workers it was observed on, of
  observed throughput / that worker's speed (1 before any observation). Example: a bag seen at 1.5 on a
  worker of speed 1 is planned at 0.75 on a worker of speed 0.5 it has not run on. Reading: the paper
  estimates a job's throughput "from the job's profile and the node's speed, then corrected"; we correct
  the profile too, so one observation informs every worker. An observation includes the core's sharing
  at the time (a worker alone on a core of 2 shared levels is seen at twice its nominal speed).
  Priority is ``Job.priority``; the deadline is ``Job.deadline`` or, with parameter
  ``deadline_walltimes`` x > 0, ``submit + x * estimate`` for a job that has none (the requested
  walltime as the deadline, issue 12's evaluation). Ties go to the earlier submission.

From plan to actions (the plan says how many workers each job gets; the actions choose the slots).
Jobs are taken in the planner's order (priority, then submission). On a ``shared`` cluster a worker is
any (core, level) slot, and a bag may hold slots on several levels, two of one core included
(``Start``/``Resize`` with ``slot_levels``; paper 001 sec. II-A: each worker is a VM instance and a
job may hold any of them). **The slot rule**: slots are chosen fastest first (node speed); on ties,
slots on cores with fewer busy levels first (a level is busy when a job holds it, counting the slots
this pass has already handed out: a bag spreads over idle cores before it doubles up on one), then
the lower core, then the lower level. Under another discipline (or one level) a bag lives on one
level, as before: a queued bag starts on the level with the most free slots, grows on its own level.

- A running bag given fewer workers than it holds keeps the best of its slots by the same rule (its
  own other slot on a core counts as busy) and gives the others up with a ``Resize``. A given-up slot
  whose worker runs a task stays the job's until that task ends (the execution model's task boundary
  rule): it is *not* offered to another job in the same pass. When the task ends the simulator gives
  the policy a pass (a slot freed at a task boundary: the paper's dispatcher hands the worker on),
  which plans again and hands the slot to the job the plan gives it. A worker with no task left leaves
  its bag at once and the policy gets a pass too (the task-bag model, as vmctld's dispatcher drops it;
  issue 28; ``vmctl/sim/exec_taskbag.py`` has the reading of paper 001). A running bag given no worker
  keeps one (its running tasks are never killed). A core that is not usable (vmctld: its node is
  lost) is never named in a Resize: the bag's worker there is given up like the others.
- A running bag given more workers grows on free slots by the slot rule.
- A queued bag given workers starts on free slots by the slot rule.
- Rigid jobs are not scheduled (these policies schedule bags of independent tasks); they wait with a
  reason saying so.

Worked examples (tests/unit/test_dispatch_policy.py). 10 cores of speed 1, one level, ``r = 0.2``;
bags A (priority 3, 20 tasks), B (2, 5 tasks), C (1, 5 tasks) arrive at 0: A starts on 8 cores, B and
C on one each; the work-conserving variant gives the same (no worker idles). The paper's testbed, 10
single-core nodes x 2 shared levels (20 workers of speed 1/2): a lone bag of 20 tasks of 10 s gets all
20 slots (level 0 of cores 0-9 first, then level 1: every core has one busy level by then), two tasks
per core at half speed, and ends at 20 s; on one level it got 10 workers, 10 tasks at a time at full
speed, and also ended at 20 s: the tasks are CPU-bound and a core's speed is shared by its busy levels,
so the extra workers change how many tasks run at once, not how fast the cores do the work (12 tasks:
cores 0 and 1 carry 2 each, 20 s; one level: 10 + 2, 20 s). Two bags at once, 10 tasks each under
``proportion``: the plan splits the 20 workers 10 / 10; the first takes level 0 of the 10 cores, the
second level 1 (no core is idle any more, so ties fall to the lower core, then level).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from vmctl.errors import PolicyParameterError
from vmctl.model import Action, ClusterView, Decision, Discipline, Job, JobShape, Resize, RunningJob, Start
from vmctl.policies.base import Needs, SchedulingPolicy
from vmctl.policies.dispatch import DISPATCH_POLICIES, PlanJob, PlanWorker, plan, policy_params
from vmctl.policies.registry import register

_TASK_BAGS = frozenset({"rigid", "task-bag"})


@dataclass(slots=True)
class _Bag:
    job: Job
    shape: JobShape
    running: RunningJob | None


def _remaining_work(shape: JobShape, tasks_left: int) -> float:
    return math.fsum(shape.tasks[len(shape.tasks) - tasks_left:]) if tasks_left > 0 else 0.0


class DispatchPolicy(SchedulingPolicy):
    """Common body of the four ``dispatch-*`` policies (module docstring)."""

    #: the planner's policy name (``vmctl.policies.dispatch``)
    planner: ClassVar[str] = ""
    needs: ClassVar[Needs] = Needs(levels=1, shapes=_TASK_BAGS)
    _COMMON: ClassVar[dict[str, tuple[type, Any, str]]] = {
        "conserving": (bool, False, "give workers the policy leaves idle to jobs with tasks waiting"),
        "deadline_walltimes": (float, 0.0, "a job without a deadline gets submit + this x its estimate "
                                           "(0: no deadline)"),
    }

    def validate_params(self) -> None:
        x = self.params["deadline_walltimes"]
        if not (x >= 0 and math.isfinite(x)):
            raise PolicyParameterError(policy=self.name, param="deadline_walltimes",
                                       problem=f"must be a finite number >= 0, got {x}")
        policy_params(self.planner, self._planner_params())  # r in [0, 1], horizon > 0 ...

    def _planner_params(self) -> dict[str, Any]:
        return {k: v for k, v in self.params.items() if k != "deadline_walltimes"}

    # ------------------------------------------------------------------ inputs

    def _deadline(self, job: Job) -> float | None:
        if job.deadline is not None:
            return job.deadline
        x = self.params["deadline_walltimes"]
        return job.submit_time + x * job.estimate if x > 0 else None

    def _bags(self, view: ClusterView) -> tuple[list[_Bag], list[str]]:
        """The task bags to plan for, and the queued rigid jobs (not scheduled here)."""
        shapes = view.shapes
        bags: list[_Bag] = []
        for rj in view.running.values():
            shape = shapes.get(rj.id)
            if shape is not None and shape.kind == "task-bag" and not rj.suspended and rj.cores:
                bags.append(_Bag(rj.job, shape, rj))
        rigid: list[str] = []
        for job in view.queue:
            shape = shapes.get(job.id)
            if shape is not None and shape.kind == "task-bag":
                bags.append(_Bag(job, shape, None))
            else:
                rigid.append(job.id)
        return bags, rigid

    def _plan_job(self, bag: _Bag, speed: Mapping[str, float]) -> PlanJob | None:
        shape = bag.shape
        rj = bag.running
        left = len(shape.tasks) if rj is None else rj.tasks_left
        if left is None:  # a view that does not know the bag's progress: count its tasks as unstarted
            left = len(shape.tasks)
        if left < 1:
            return None
        job = bag.job
        # the status checker's corrected throughput on the workers the bag holds (vmctld), where observed
        observed = {} if rj is None or not rj.throughput else \
            {w: v for (c, lv), v in rj.throughput.items() if (w := f"{c}.{lv}") in speed}
        # the job's profile factor, learnt from the workers it was observed on: the mean of observed /
        # nominal speed, applied to the workers it has not run on (1 when nothing is observed)
        ratios = [v / speed[w] for w, v in observed.items()]
        profile = math.fsum(ratios) / len(ratios) if ratios else 1.0
        return PlanJob(job.id, min(left, shape.max_workers), _remaining_work(shape, left), job.priority,
                       self._deadline(job), job.submit_time, observed, profile)

    # ------------------------------------------------------------------ the pass

    def decide(self, view: ClusterView, now: float) -> Decision:
        bags, rigid = self._bags(view)
        reasons = {j: "not a task bag (the dispatch policies schedule bags of independent tasks)" for j in rigid}
        if not bags:
            return Decision(reasons=reasons)
        running_ids = {b.job.id for b in bags if b.running is not None}
        levels = view.levels
        speed: dict[int, float] = {}
        workers: list[PlanWorker] = []
        for level, slots in enumerate(view.slot_job):
            for core in range(view.total_cores):
                holder = slots[core]
                if not view.usable[core] or (holder is not None and holder not in running_ids):
                    continue
                node = view.node(core)
                s = speed.setdefault(core, view.speed_of(node) / levels)
                workers.append(PlanWorker(f"{core}.{level}", node, s))
        nominal = {w.id: w.speed for w in workers}
        jobs = [pj for pj in (self._plan_job(b, nominal) for b in bags) if pj is not None]
        counts = {j: len(ws) for j, ws in
                  plan(self.planner, workers, jobs, now, self._planner_params()).assignment.items()}
        by_id = {b.job.id: b for b in bags}
        order = sorted((by_id[pj.id] for pj in jobs), key=lambda b: (-b.job.priority, b.job.submit_time, b.job.id))
        return self._actions(view, order, counts, speed, reasons)

    def _actions(self, view: ClusterView, order: Sequence[_Bag], counts: Mapping[str, int],
                 speed: dict[int, float], reasons: dict[str, str]) -> Decision:
        slots = _Slots(view, speed)
        actions: list[Action] = []
        for bag in order:
            want = counts.get(bag.job.id, 0)
            rj = bag.running
            if rj is None:
                if want < 1:
                    continue
                level = None if slots.any_level else max(range(view.levels), key=lambda lv: (slots.free_on(lv), -lv))
                got = slots.take(want, level)
                if got:
                    cores, level_, per_slot = _placement(got)
                    actions.append(Start(bag.job.id, cores, level_, slot_levels=per_slot))
                continue
            # a core of a node out of service (vmctld: lost) cannot be named in a Resize: the bag's
            # worker there is given up (it keeps its slot until its task ends or the node is down)
            held = tuple(s for s in rj.slots if view.usable[s[0]])
            if not held:
                continue
            want = max(1, want)
            new: tuple[tuple[int, int], ...] | None = None
            if want < len(held):
                new = slots.best(held, want)
            elif want == len(held) and len(held) < len(rj.cores):
                new = held
            elif want > len(held):
                extra = slots.take(want - len(held), None if slots.any_level else rj.level)
                if extra:
                    new = (*held, *extra)
            if new is not None:
                cores, level_, per_slot = _placement(new)
                actions.append(Resize(rj.id, cores, level_, slot_levels=per_slot))
        return Decision(actions=tuple(actions), reasons=reasons,
                        default_reason="waiting for a worker (the plan gave it none)")


def _placement(slots: Iterable[tuple[int, int]]) -> tuple[tuple[int, ...], int, tuple[int, ...] | None]:
    """(cores, level, slot_levels) of a Start/Resize on ``slots``, in (core, level) order: one ``level`` when
    they share it (``slot_levels`` None, as for any job), else their levels one by one."""
    ordered = sorted(slots)
    cores = tuple(c for c, _lv in ordered)
    levels = tuple(lv for _c, lv in ordered)
    low = min(levels) if levels else 0
    return cores, low, None if all(lv == low for lv in levels) else levels


class _Slots:
    """The free worker slots of one pass and the slot rule (module docstring): fastest first, then cores
    with fewer busy levels (the view's holders plus the slots this pass handed out), then the lower core,
    then the lower level. ``any_level``: a bag may take slots on several levels (a ``shared`` cluster
    of more than one level); otherwise each take is confined to one level."""

    def __init__(self, view: ClusterView, speed: dict[int, float]) -> None:
        self.view = view
        self.speed = speed
        self.any_level = view.discipline is Discipline.SHARED and view.levels > 1
        self.free: dict[int, set[int]] = {}  # core -> its free levels no action of this pass has taken
        for level, cores in enumerate(view.idle):
            for c in cores:
                self.free.setdefault(c, set()).add(level)
        self.count = [len(cores) for cores in view.idle]  # free slots per level
        self.busy: dict[int, int] = {}  # core -> its busy levels (any_level only; else 0: one level per bag)

    def _speed(self, core: int) -> float:
        s = self.speed.get(core)
        if s is None:
            s = self.speed[core] = self.view.speed_of(self.view.node(core)) / self.view.levels
        return s

    def _busy(self, core: int) -> int:
        if not self.any_level:
            return 0
        b = self.busy.get(core)
        if b is None:
            b = self.busy[core] = sum(1 for row in self.view.slot_job if row[core] is not None)
        return b

    def free_on(self, level: int) -> int:
        return self.count[level]

    def take(self, n: int, level: int | None) -> list[tuple[int, int]]:
        """Hand out up to ``n`` free slots by the slot rule (on ``level`` only, unless None)."""
        heap = [(-self._speed(c), self._busy(c), c, min(lv) if level is None else level)
                for c, lv in self.free.items() if lv and (level is None or level in lv)]
        heapq.heapify(heap)
        out: list[tuple[int, int]] = []
        while heap and len(out) < n:
            _s, _b, c, lv = heapq.heappop(heap)
            out.append((c, lv))
            left = self.free[c]
            left.discard(lv)
            self.count[lv] -= 1
            if self.any_level:
                self.busy[c] = self._busy(c) + 1
            if left and level is None:
                heapq.heappush(heap, (-self._speed(c), self.busy[c], c, min(left)))
        return out

    def best(self, held: Sequence[tuple[int, int]], n: int) -> tuple[tuple[int, int], ...]:
        """The ``n`` slots a shrinking bag keeps of ``held``, by the slot rule (a core's busy levels
        count its other holders, the bag's own other slot there included)."""
        return tuple(sorted(held, key=lambda s: (-self._speed(s[0]), self._busy(s[0]), s[0], s[1]))[:n])


_COMMON = DispatchPolicy._COMMON


@register
class DispatchPriority(DispatchPolicy):
    """Algorithm 1 (reservation rate ``r``)."""

    name: ClassVar[str] = "dispatch-priority"
    planner: ClassVar[str] = "priority"
    summary: ClassVar[str] = "paper 001 Alg. 1: the top bag gets at most 1 - r of the workers, the others one each"
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {**DISPATCH_POLICIES["priority"], **_COMMON}


@register
class DispatchProportion(DispatchPolicy):
    """Algorithm 2 (fair share by remaining work)."""

    name: ClassVar[str] = "dispatch-proportion"
    planner: ClassVar[str] = "proportion"
    summary: ClassVar[str] = "paper 001 Alg. 2: workers in proportion to each bag's remaining work"
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {**DISPATCH_POLICIES["proportion"], **_COMMON}


@register
class DispatchWorkload(DispatchPolicy):
    """Algorithm 3 (greedy by throughput, ``horizon``)."""

    name: ClassVar[str] = "dispatch-workload"
    planner: ClassVar[str] = "workload"
    summary: ClassVar[str] = "paper 001 Alg. 3: the fastest workers until a bag's work fits in the horizon"
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {**DISPATCH_POLICIES["workload"], **_COMMON}


@register
class DispatchDeadline(DispatchPolicy):
    """Algorithm 4 (enough workers to finish by the deadline)."""

    name: ClassVar[str] = "dispatch-deadline"
    planner: ClassVar[str] = "deadline"
    summary: ClassVar[str] = "paper 001 Alg. 4: the fastest workers until a bag meets its deadline"
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {**DISPATCH_POLICIES["deadline"], **_COMMON}
