"""The one occupancy model: what each action does to the cluster, written once.

An :class:`Occupancy` is a copy-on-write overlay of a ``ClusterView``: applying an action changes only
the overlay (per level, only the cores it touches; per job, only the jobs it names), so replaying a
decision costs O(actions), never O(cluster). Every ``apply`` either changes the overlay or raises
``InvariantViolation`` naming the broken rule and changes nothing (the checker then refuses the whole
decision; vmctld's actuator skips that action and goes on, so later actions that depended on it fail
in turn). ``apply`` returns what the action did as an :class:`~vmctl.policies.effects.Effect` (its kind,
the job, its placement after and before in view coordinates, its cost) and appends it to ``effects``:
executors commit those instead of interpreting the action types (:mod:`vmctl.policies.effects`).

State, per core and level: the job on that slot (``slot(level, core)``). Per job touched: where it
runs (level and cores, or shared VMs on nodes with a cap; a task bag on several levels of a ``shared``
cluster also its per-slot levels, ``multi``), whether it is suspended or checkpointed.
Per node (capped shared VMs, vcsched): the sum of CPU caps and of memory of every shared VM on it,
*counting what is already placed* (``RunningJob.shared_nodes`` / ``cap`` of the view's running jobs,
summed on first use), checked on the decision's end state (:meth:`check_capacity`): CPU caps (each a
fraction of one core, the VM's single vCPU) against the node's cores (its cores in
``view.node_of_core``; 1 for a node the view gives no cores), memory against 1 (a fraction of the node).
The actions of one decision are carried out together, so two jobs may swap nodes.

Actions (``vmctl.model``), with ``Tier.FG``/``Tier.BG`` read as levels 0 and 1:

========================  =========================================================================
start (StartFg/StartBg,   a queued, submitted job takes ``level`` of ``cores``; rigid: width = procs,
Start)                    moldable/task bag: a width its ``JobShape`` allows; a task bag on a
                          ``shared`` cluster may name ``slot_levels`` (slot i: level i of core i;
                          distinct (core, level) pairs; elsewhere refused, ``slot-levels``)
resize                    a running task bag's workers move to ``level`` of ``cores`` (new width), or
                          to the slots ``slot_levels`` names, as for a start
move (Promote, Demote,    a running (or checkpointed, for Restore) job moves to ``level`` of cores
Migrate, Restore, Move)   (its own when None), keeping its width; Promote needs level 1 -> 0
kill                      frees its slots; with ``requeue`` it is queued again (may restart at once)
checkpoint                frees its slots, the job keeps its progress; only Restore/Move bring it back
                          (``RunningJob.checkpointed`` in the view: a Resume of it is refused,
                          ``resume-checkpointed``; a Kill is allowed)
suspend / resume          keep the slots; suspend needs a running, not suspended job, resume a
                          suspended one (no double suspend, no resume of a job that is not suspended)
set_cap                   cap in (0, 1] or None; a shared VM's node totals follow the new cap
place_shared              a queued job starts, or a running one is re-placed, as capped shared VMs
replicate                 ``timeslice`` only: a running job also takes ``level`` of its own cores (free
                          there); kill/checkpoint/completion free every row; a replicated job cannot
                          move or resize (unreplicate first); a bag on several levels neither
                          moves nor replicates (``slot-levels``): it changes its slots with Resize
unreplicate               drops one of a replicated job's rows (its lowest other row becomes its level
                          when that one goes); never its last row
========================  =========================================================================

Example (shared discipline, 2 levels, 1 core): ``Start(t, (0, 0), slot_levels=(0, 1))`` gives bag t
both workers of core 0; ``Resize(t, (0,), slot_levels=(1,))`` keeps level 1 and gives level 0 up.

Example (priority discipline, 2 cores): view fg = [a, None], bg = [None, None]. ``StartBg(b, (0,))``
puts b on level 1 of core 0; ``Promote(b)`` then fails (``promote-fg-busy``: a holds level 0 of
core 0); ``Kill(a)`` then ``Promote(b)`` succeeds, leaving fg = [b, None].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Set
from typing import Any

from vmctl.errors import InvariantViolation
from vmctl.model import (
    Action,
    Checkpoint,
    ClusterView,
    Demote,
    Discipline,
    Job,
    Kill,
    Migrate,
    Move,
    PlaceShared,
    Promote,
    Replicate,
    Resize,
    Restore,
    Resume,
    SetCap,
    SliceSchedule,
    Start,
    StartBg,
    StartFg,
    Suspend,
    Tier,
    Unreplicate,
    slots_of,
)
from vmctl.policies.effects import Effect, EffectKind, Placement

EPS = 1e-9
CAPACITY_TOL = 1e-6
_FG = Tier.FG


def fail(rule: str, detail: str) -> InvariantViolation:
    return InvariantViolation(rule=rule, detail=detail)


def level_name(level: int) -> str:
    """``fg``/``bg`` for levels 0/1 (the priority names every message used so far), else ``level k``."""
    return "fg" if level == 0 else "bg" if level == 1 else f"level {level}"


def level_of(tier: Tier) -> int:
    return 0 if tier is _FG else 1


class Occupancy:
    """Copy-on-write occupancy of a view (see the module docstring). ``queued`` holds the queued jobs
    the caller will name (``queued_subset``); jobs not in it are treated as not waiting."""

    __slots__ = ("_node_cpu", "_node_mem", "_node_touched", "base", "checkpointed", "effects", "extra", "multi",
                 "nodes", "now", "over", "placed", "queued", "started", "suspended", "view")

    def __init__(self, view: ClusterView, queued: dict[str, Job], now: float) -> None:
        self.view = view
        self.now = now
        self.queued = queued
        self.over: list[dict[int, str | None]] = [{} for _ in range(view.levels)]
        self.base = view.slot_job  # built once: ``slot_job`` is a property
        # job -> (level, cores) on core levels, (-1, ()) for shared VMs, None when it does not run;
        # filled from the view on first touch
        self.placed: dict[str, tuple[int, tuple[int, ...]] | None] = {}
        self.started: set[str] = set()
        self.checkpointed: set[str] = set()
        self.suspended: dict[str, bool] = {}
        self.nodes: dict[str, tuple[tuple[str, ...], float, float]] = {}  # shared job -> (nodes, cap, mem)
        self.extra: dict[str, tuple[int, ...]] = {}  # replicated job -> its other levels (sorted), same cores
        # a task bag placed on several levels -> the level of each of its cores (``placed`` then holds its
        # lowest level); absent for every job on one level
        self.multi: dict[str, tuple[int, ...]] = {}
        self._node_cpu: dict[str, float] | None = None
        self._node_mem: dict[str, float] = {}
        self._node_touched: set[str] = set()
        self.effects: list[Effect] = []  # what each applied action did, in order (``apply``)

    # ------------------------------------------------------------------ reading
    def slot(self, level: int, core: int) -> str | None:
        over = self.over[level]
        if core in over:
            return over[core]
        return self.base[level][core]

    def running(self, job_id: str) -> tuple[int, tuple[int, ...]] | None:
        """(level, cores) of a running job (level -1: shared VMs), None when it does not run."""
        if job_id in self.placed:
            return self.placed[job_id]
        rj = self.view.running.get(job_id)
        if rj is None:
            return None
        if rj.checkpointed:  # holds no slot until a Restore/Move puts it back on cores
            self.placed[job_id] = None
            self.checkpointed.add(job_id)
            self.suspended[job_id] = True
            return None
        where = (-1, rj.cores) if rj.shared_nodes else (rj.level, rj.cores)
        self.placed[job_id] = where
        if rj.replicas:
            self.extra[job_id] = tuple(sorted(rj.replicas))
        if rj.slot_levels is not None and not rj.shared_nodes:
            self.multi[job_id] = rj.slot_levels
        if rj.shared_nodes:
            self.nodes[job_id] = (rj.shared_nodes, _cap_of(rj.cap, rj.job), rj.job.mem)
        self.suspended[job_id] = rj.suspended
        return where

    def _need_running(self, job_id: str, action: str) -> tuple[int, tuple[int, ...]]:
        where = self.running(job_id)
        if where is None:
            if job_id in self.checkpointed:
                raise fail("checkpointed", f"{action} {job_id}: the job is checkpointed and holds no slots "
                                           "(Restore or Move it onto cores first)")
            raise fail("not-running", f"{action} {job_id}: job is not running")
        return where

    def slots(self, job_id: str) -> tuple[tuple[int, int], ...]:
        """The (core, level) slots of a job placed on cores (none: not running or shared VMs)."""
        where = self.running(job_id)
        if where is None or where[0] < 0:
            return ()
        return slots_of(where[1], where[0], self.multi.get(job_id))

    def _procs(self, job_id: str, default: int) -> int:
        rj = self.view.running.get(job_id)
        return rj.job.procs if rj is not None else default

    # ------------------------------------------------------------------ rules shared by actions
    def cores_ok(self, job_id: str, cores: tuple[int, ...], procs: int, action: str,
                 slot_levels: tuple[int, ...] | None = None) -> None:
        view = self.view
        if len(cores) != procs:
            raise fail("cores-count", f"{action} {job_id}: {len(cores)} cores for {procs} processes")
        if slot_levels is not None:
            if len(set(zip(cores, slot_levels, strict=True))) != len(cores):
                raise fail("cores-distinct", f"{action} {job_id}: a slot (core, level) is listed twice")
        elif len(set(cores)) != len(cores):
            raise fail("cores-distinct", f"{action} {job_id}: a core is listed twice")
        usable = view.usable
        if cores and min(cores) >= 0 and max(cores) < view.total_cores and all(map(usable.__getitem__, cores)):
            return  # (the usual case, tested in C; else the loop names the first core that fails)
        for c in cores:
            if not 0 <= c < view.total_cores:
                raise fail("core-range", f"{action} {job_id}: core {c} not in 0..{view.total_cores - 1}")
            if not view.usable[c]:
                raise fail("core-unusable", f"{action} {job_id}: core {c} is not usable")

    def _level_ok(self, job_id: str, level: int, action: str) -> None:
        if not 0 <= level < self.view.levels:
            raise fail("level-range", f"{action} {job_id}: level {level} not in 0..{self.view.levels - 1}")

    def _slot_levels(self, job_id: str, cores: tuple[int, ...], level: int, slot_levels: tuple[int, ...] | None,
                     action: str) -> tuple[int, tuple[int, ...] | None]:
        """Check a placement's per-slot levels: only a task bag on a ``shared`` cluster names them, one per
        core, each an existing level. Returns (its lowest level, the levels), or (that one level, None)
        when they are all the same: a bag on one level is placed as any job is."""
        if slot_levels is None:
            return level, None
        if self.view.discipline is not Discipline.SHARED:
            raise fail("slot-levels", f"{action} {job_id}: slots on several levels are for task bags of a shared "
                                      f"cluster, the cluster is {self.view.discipline.value}")
        shape = self.view.shapes.get(job_id) if self.view.shapes else None
        if shape is None or shape.kind != "task-bag":
            raise fail("slot-levels", f"{action} {job_id}: only a task bag holds slots on several levels")
        if len(slot_levels) != len(cores):
            raise fail("slot-levels", f"{action} {job_id}: {len(slot_levels)} levels for {len(cores)} cores")
        if not slot_levels:
            return level, None
        for lv in sorted(set(slot_levels)):
            self._level_ok(job_id, lv, action)
        low = min(slot_levels)
        return (low, None) if all(lv == low for lv in slot_levels) else (low, tuple(slot_levels))

    def _check_free(self, job_id: str, level: int, cores: tuple[int, ...], action: str,
                    slot_levels: tuple[int, ...] | None = None) -> None:
        """Each of ``cores`` has ``level`` (or its ``slot_levels`` entry) free, or held by ``job_id`` itself."""
        if slot_levels is None:  # one level (the usual case): ``slot`` inlined
            over, base = self.over[level], self.base[level]
            for c in cores:
                other = over[c] if c in over else base[c]
                if other is not None and other != job_id:
                    name = level_name(level)
                    rule = f"two-{name}" if level < 2 else "two-on-level"
                    raise fail(rule, f"{action} {job_id}: {name} slot of core {c} holds {other}")
            return
        for c, lv in slots_of(cores, level, slot_levels):
            other = self.slot(lv, c)
            if other is not None and other != job_id:
                name = level_name(lv)
                rule = f"two-{name}" if lv < 2 else "two-on-level"
                raise fail(rule, f"{action} {job_id}: {name} slot of core {c} holds {other}")

    def _take(self, job_id: str, level: int, cores: tuple[int, ...], action: str,
              slot_levels: tuple[int, ...] | None = None) -> None:
        self._check_free(job_id, level, cores, action, slot_levels)
        if slot_levels is None:
            over_l = self.over[level]
            for c in cores:
                over_l[c] = job_id
        else:
            over = self.over
            for c, lv in slots_of(cores, level, slot_levels):
                over[lv][c] = job_id
        self.placed[job_id] = (level, cores)
        if slot_levels is None:
            self.multi.pop(job_id, None)
        else:
            self.multi[job_id] = slot_levels

    def _free(self, job_id: str) -> None:
        """Free the slots (or shared VMs) of a running job; it then does not run until placed again."""
        where = self.placed[job_id]
        self.placed[job_id] = None
        if where is None:
            return
        level, cores = where
        if level < 0:
            self._unshare(job_id)
            return
        multi = self.multi.pop(job_id, None)
        if multi is not None:
            for c, lv in zip(cores, multi, strict=True):
                if self.slot(lv, c) == job_id:
                    self.over[lv][c] = None
            return
        for lv in (level, *self.extra.pop(job_id, ())):
            over, base = self.over[lv], self.base[lv]
            for c in cores:
                if (over[c] if c in over else base[c]) == job_id:  # ``slot`` inlined
                    over[c] = None

    def _one_level(self, job_id: str, action: str) -> None:
        """Raise when the job holds slots on several levels (a task bag: it changes them with Resize)."""
        if job_id in self.multi:
            raise fail("slot-levels", f"{action} {job_id}: the bag holds slots on several levels; it changes "
                                      "them with Resize")

    def _single_row(self, job_id: str, action: str) -> None:
        """Raise when the job runs in several rows (a replicated job neither moves nor resizes)."""
        extra = self.extra.get(job_id)
        if extra:
            raise fail("replicated", f"{action} {job_id}: the job also runs on levels {list(extra)}; unreplicate "
                                     "it first")

    def _submitted(self, job: Job) -> None:
        if job.submit_time > self.now + EPS:
            raise fail("start-before-submit", f"{job.id} submitted at {job.submit_time}, now {self.now}")

    def _queued_job(self, job_id: str, action: str) -> Job:
        job = self.queued.get(job_id)
        if job is None or job_id in self.started:
            raise fail("start-not-queued", f"{action} {job_id}: job is not waiting in the queue")
        return job

    # ------------------------------------------------------------------ actions
    def _width(self, job: Job, cores: tuple[int, ...]) -> int:
        """The width ``cores`` gives the job, when its shape allows it; else ``procs`` (then
        ``cores_ok`` names the mismatch): a rigid job's width is ``procs``."""
        shape = self.view.shapes.get(job.id) if self.view.shapes else None
        return len(cores) if shape is not None and shape.allows(len(cores)) else job.procs

    def start(self, job_id: str, cores: tuple[int, ...], level: int, action: str,
              slot_levels: tuple[int, ...] | None = None) -> None:
        job = self._queued_job(job_id, action)
        self._submitted(job)
        level, slot_levels = self._slot_levels(job_id, cores, level, slot_levels, action)
        self._level_ok(job_id, level, action)
        shape = self.view.shapes.get(job_id) if self.view.shapes else None
        if shape is not None and not shape.allows(len(cores)):
            allowed = (", ".join(map(str, shape.widths)) if shape.kind == "moldable"
                       else f"1..{shape.max_workers} workers")
            raise fail("cores-count", f"{action} {job_id}: {len(cores)} cores, a width its {shape.kind} shape does "
                                      f"not allow ({allowed})")
        self.cores_ok(job_id, cores, self._width(job, cores), action, slot_levels)  # rigid: width == procs
        self._take(job_id, level, cores, action, slot_levels)
        self.started.add(job_id)
        self.suspended[job_id] = False

    def move(self, job_id: str, cores: tuple[int, ...] | None, level: int, cost: float, action: str) -> None:
        if cost < 0 or not math.isfinite(cost):
            raise fail("migrate-cost", f"{action} {job_id}: cost {cost}")
        self._level_ok(job_id, level, action)
        self.running(job_id)  # learns from the view whether the job is checkpointed
        if job_id in self.checkpointed:
            if cores is None:
                raise fail("restore-cores", f"{action} {job_id}: a checkpointed job needs target cores")
            self.cores_ok(job_id, cores, self._procs(job_id, len(cores)), action)
            self._take(job_id, level, cores, action)
            self.checkpointed.discard(job_id)
            self.suspended[job_id] = False
            return
        _old_level, old_cores = self._need_running(job_id, action)
        self._single_row(job_id, action)
        self._one_level(job_id, action)
        target = old_cores if cores is None else cores
        self.cores_ok(job_id, target, self._procs(job_id, len(old_cores)), action)
        self._check_free(job_id, level, target, action)  # before freeing: a refused move changes nothing
        self._free(job_id)
        self._take(job_id, level, target, action)

    def fits(self, job_id: str, level: int, cores: tuple[int, ...], action: str) -> None:
        """Raise unless ``job_id`` could take ``level`` of ``cores`` now (changes nothing)."""
        self._level_ok(job_id, level, action)
        self.cores_ok(job_id, cores, len(cores), action)
        self._check_free(job_id, level, cores, action)

    def hold(self, job_id: str, level: int, cores: tuple[int, ...], slot_levels: tuple[int, ...] | None = None) -> None:
        """Keep ``level`` of ``cores`` (or the slots ``slot_levels`` names) reserved for ``job_id`` where they
        are free (vmctld: the source slots of processes that leave their node stay reserved until the
        migration is confirmed; a task bag's given-up slot stays its own until its worker's task ends)."""
        over = self.over
        for c, lv in slots_of(cores, level, slot_levels):
            if self.slot(lv, c) is None:
                over[lv][c] = job_id

    def resize(self, job_id: str, cores: tuple[int, ...], level: int,
               slot_levels: tuple[int, ...] | None = None) -> None:
        """A task bag's workers move to ``level`` of ``cores``, or to the slots ``slot_levels`` names (any
        width its shape allows)."""
        shape = self.view.shapes.get(job_id) if self.view.shapes else None
        if shape is None or shape.kind != "task-bag":
            raise fail("resize-not-task-bag", f"resize {job_id}: only a task bag changes its worker count")
        self._need_running(job_id, "resize")
        self._single_row(job_id, "resize")
        level, slot_levels = self._slot_levels(job_id, cores, level, slot_levels, "resize")
        self._level_ok(job_id, level, "resize")
        if not shape.allows(len(cores)):
            raise fail("cores-count", f"resize {job_id}: {len(cores)} workers, its shape allows 1..{max(shape.widths)}")
        self.cores_ok(job_id, cores, len(cores), "resize", slot_levels)
        self._check_free(job_id, level, cores, "resize", slot_levels)
        self._free(job_id)
        self._take(job_id, level, cores, "resize", slot_levels)

    def promote(self, job_id: str) -> None:
        level, cores = self._need_running(job_id, "promote")
        self._one_level(job_id, "promote")
        if level != 1:
            raise fail("promote-not-bg", f"promote {job_id}: job runs in {level_name(level)}")
        for c in cores:
            if self.slot(0, c) is not None:
                raise fail("promote-fg-busy", f"promote {job_id}: fg slot of core {c} is busy")
        self.move(job_id, None, 0, 0.0, "promote")

    def demote(self, job_id: str) -> None:
        level, _cores = self._need_running(job_id, "demote")
        self._one_level(job_id, "demote")
        if level != 0:
            raise fail("demote-not-fg", f"demote {job_id}: job runs in {level_name(level)}")
        self.move(job_id, None, 1, 0.0, "demote")

    def restore(self, job_id: str, cores: tuple[int, ...], level: int) -> None:
        rj = self.view.running.get(job_id)
        self.running(job_id)  # learns from the view whether the job is checkpointed
        was_checkpointed = job_id in self.checkpointed
        if not was_checkpointed and not (rj is not None and rj.suspended):
            raise fail("restore-not-checkpointed", f"restore {job_id}: job is not checkpointed")
        self._level_ok(job_id, level, "restore")
        self.cores_ok(job_id, cores, self._procs(job_id, len(cores)), "restore")
        self._check_free(job_id, level, cores, "restore")
        if not was_checkpointed:  # a suspended job of the view: restored from its own slots
            self._need_running(job_id, "restore")
            self._one_level(job_id, "restore")
            self._free(job_id)
        self._take(job_id, level, cores, "restore")
        self.checkpointed.discard(job_id)
        self.suspended[job_id] = False

    def kill(self, job_id: str, requeue: bool) -> None:
        if self.running(job_id) is None and job_id in self.checkpointed:
            self.checkpointed.discard(job_id)  # a checkpointed job may be killed: it has no slot to free
        else:
            self._need_running(job_id, "kill")
            self._free(job_id)
        if requeue:
            rj = self.view.running.get(job_id)
            if rj is not None:
                self.queued[job_id] = rj.job
            self.started.discard(job_id)

    def checkpoint(self, job_id: str) -> None:
        self._need_running(job_id, "checkpoint")
        self._free(job_id)
        self.checkpointed.add(job_id)

    def suspend(self, job_id: str) -> None:
        self._need_running(job_id, "suspend")
        if self.suspended.get(job_id, False):
            raise fail("double-suspend", f"suspend {job_id}: job is already suspended")
        self.suspended[job_id] = True

    def resume(self, job_id: str) -> None:
        if self.running(job_id) is None and job_id in self.checkpointed:
            raise fail("resume-checkpointed", f"resume {job_id}: the job is checkpointed and holds no slots; resume "
                                              "is for a suspended job: use Restore/Move onto cores")
        self._need_running(job_id, "resume")
        if not self.suspended.get(job_id, False):
            raise fail("resume-not-suspended", f"resume {job_id}: job is not suspended")
        self.suspended[job_id] = False

    def set_cap(self, job_id: str, cap: float | None) -> None:
        self._need_running(job_id, "set_cap")
        if cap is not None and not (0.0 < cap <= 1.0 + EPS):
            raise fail("cap-range", f"set_cap {job_id}: cap {cap} not in (0, 1]")
        shared = self.nodes.get(job_id)
        if shared is not None:
            nodes, _old, mem = shared
            job = self.view.running[job_id].job
            self._unshare(job_id)
            self._share(job_id, nodes, _cap_of(cap, job), mem)

    def place_shared(self, act: PlaceShared) -> None:
        view = self.view
        jid = act.job_id
        queued = self.queued.get(jid)
        if queued is not None and jid not in self.started:
            job = queued
            self._submitted(job)
            fresh = True
        else:
            rj = view.running.get(jid)
            if rj is None or jid in self.started or self.running(jid) is None:
                raise fail("place-shared-unknown", f"place_shared {jid}: job is neither waiting nor running")
            job = rj.job
            fresh = False
        if len(act.nodes) != job.procs:
            raise fail("cores-count", f"place_shared {jid}: {len(act.nodes)} nodes for {job.procs} processes")
        known = _known_nodes(view)
        for node in act.nodes:
            if known and node not in known:
                raise fail("unknown-node", f"place_shared {jid}: node {node!r} is not in the view")
        top = min(1.0, job.cpu_need)
        if not (0.0 < act.cap <= top + EPS):
            raise fail("cap-range", f"place_shared {jid}: cap {act.cap} not in (0, {top}]")
        if fresh:
            self.started.add(jid)
            self.suspended[jid] = False
        else:
            self._free(jid)
        self.placed[jid] = (-1, ())
        self._share(jid, act.nodes, act.cap, job.mem)

    def replicate(self, job_id: str, level: int) -> None:
        """The job also runs on ``level`` of its own cores (time slicing only; the slots must be free)."""
        where, cores = self._need_running(job_id, "replicate")
        if self.view.discipline is not Discipline.TIMESLICE:
            raise fail("replicate-discipline", f"replicate {job_id}: rows need the timeslice discipline, the "
                                               f"cluster is {self.view.discipline.value}")
        if where < 0:
            raise fail("replicate-shared", f"replicate {job_id}: the job runs as capped shared VMs")
        self._one_level(job_id, "replicate")
        self._level_ok(job_id, level, "replicate")
        extra = self.extra.get(job_id, ())
        if level == where or level in extra:
            raise fail("replicate-twice", f"replicate {job_id}: the job already runs on level {level}")
        self._check_free(job_id, level, cores, "replicate")
        over = self.over[level]
        for c in cores:
            over[c] = job_id
        self.extra[job_id] = tuple(sorted((*extra, level)))

    def unreplicate(self, job_id: str, level: int) -> None:
        """Drop ``level`` from a job that runs in several rows."""
        where, cores = self._need_running(job_id, "unreplicate")
        extra = self.extra.get(job_id, ())
        if level != where and level not in extra:
            raise fail("unreplicate-absent", f"unreplicate {job_id}: the job does not run on level {level}")
        if not extra:
            raise fail("unreplicate-last-row", f"unreplicate {job_id}: level {level} is its only row (Kill or "
                                               "Checkpoint it instead)")
        over, base = self.over[level], self.base[level]
        for c in cores:
            if (over[c] if c in over else base[c]) == job_id:  # ``slot`` inlined
                over[c] = None
        if level == where:
            self.placed[job_id] = (extra[0], cores)
            extra = extra[1:]
        else:
            extra = tuple(lv for lv in extra if lv != level)
        if extra:
            self.extra[job_id] = extra
        else:
            del self.extra[job_id]

    def apply(self, act: Action) -> Effect:
        """Apply one action (any kind) and return what it did (also appended to ``effects``), or raise
        ``InvariantViolation`` and change nothing."""
        handler = _HANDLERS.get(type(act))
        if handler is None:  # pragma: no cover - exhaustive over Action
            raise fail("unknown-action", repr(act))
        effect = handler(self, act)
        self.effects.append(effect)
        return effect

    def placement(self, job_id: str) -> Placement | None:
        """Where the job runs now, in view coordinates (None: it does not run, or is checkpointed)."""
        where = self.running(job_id)
        if where is None:
            return None
        level, cores = where
        if level < 0:
            nodes, cap, _mem = self.nodes[job_id]
            return Placement(-1, (), nodes=nodes, cap=cap)
        return Placement(level, cores, self.multi.get(job_id), self.extra.get(job_id, ()))

    def _migrate(self, act: Migrate) -> None:
        self._need_running(act.job_id, "migrate")
        self.move(act.job_id, act.cores, level_of(act.tier), act.cost, "migrate")

    # ------------------------------------------------------------------ shared VMs and node capacity
    def _totals(self) -> dict[str, float]:
        """Per-node CPU caps of the shared VMs already placed (memory in ``_node_mem``), on first use."""
        if self._node_cpu is None:
            cpu: dict[str, float] = {}
            mem = self._node_mem
            for rj in self.view.running.values():
                if rj.shared_nodes:
                    cap = _cap_of(rj.cap, rj.job)
                    for node in rj.shared_nodes:
                        cpu[node] = cpu.get(node, 0.0) + cap
                        mem[node] = mem.get(node, 0.0) + rj.job.mem
            self._node_cpu = cpu
        return self._node_cpu

    def _share(self, job_id: str, nodes: tuple[str, ...], cap: float, mem: float) -> None:
        cpu, mems = self._totals(), self._node_mem
        for node in nodes:
            cpu[node] = cpu.get(node, 0.0) + cap
            mems[node] = mems.get(node, 0.0) + mem
        self._node_touched.update(nodes)
        self.nodes[job_id] = (nodes, cap, mem)

    def _unshare(self, job_id: str) -> None:
        got = self.nodes.pop(job_id, None)
        if got is None:
            return
        nodes, cap, mem = got
        cpu, mems = self._totals(), self._node_mem
        for node in nodes:
            cpu[node] -= cap
            mems[node] -= mem

    def check_capacity(self) -> None:
        """No node the decision touched carries more CPU caps than its cores, or more than 1 of memory
        (end state)."""
        if not self._node_touched:
            return
        cpu, mem = self._totals(), self._node_mem
        cores = node_cores(self.view)
        for node in sorted(self._node_touched):
            have = cores.get(node, 1)
            if cpu.get(node, 0.0) > have + CAPACITY_TOL:
                raise fail("node-cpu", f"CPU caps of the shared VMs on {node} sum to {cpu[node]:.6f} > {have} "
                                       f"(its cores)")
            if mem.get(node, 0.0) > 1.0 + CAPACITY_TOL:
                raise fail("node-memory", f"memory of the shared VMs on {node} sums to {mem[node]:.6f} > 1")


def _started(o: Occupancy, act: StartFg | StartBg | Start, level: int,
             slot_levels: tuple[int, ...] | None = None) -> Effect:
    o.start(act.job_id, act.cores, level, act.kind, slot_levels)
    return Effect(EffectKind.STARTED, act.job_id, act, o.placement(act.job_id))


def _moved(o: Occupancy, act: Promote | Demote | Migrate | Move | Restore, run: Callable[[], None],
           cost: float = 0.0) -> Effect:
    """A move of any name: MOVED for a running job, RESTORED for a checkpointed one (or a Restore)."""
    jid = act.job_id
    before = o.placement(jid)
    restored = isinstance(act, Restore) or (before is None and jid in o.checkpointed)
    run()
    kind = EffectKind.RESTORED if restored else EffectKind.MOVED
    return Effect(kind, jid, act, o.placement(jid), before, cost)


def _around(kind: EffectKind, run: Callable[[Occupancy, Any], None]) -> Callable[[Occupancy, Any], Effect]:
    """An action whose effect is ``kind``, with the job's placement before and after it."""

    def handler(o: Occupancy, act: Any) -> Effect:
        jid = act.job_id
        before = o.placement(jid)
        run(o, act)
        return Effect(kind, jid, act, o.placement(jid), before)

    return handler


def _stopped(o: Occupancy, act: Kill) -> Effect:
    before = o.placement(act.job_id)
    o.kill(act.job_id, act.requeue)
    return Effect(EffectKind.STOPPED, act.job_id, act, None, before, requeue=act.requeue)


# what each action does, by its type (the priority names read fg/bg as levels 0/1), and the effect it returns
_HANDLERS: dict[type, Callable[[Occupancy, Any], Effect]] = {
    StartFg: lambda o, a: _started(o, a, 0),
    StartBg: lambda o, a: _started(o, a, 1),
    Start: lambda o, a: _started(o, a, a.level, a.slot_levels),
    Promote: lambda o, a: _moved(o, a, lambda: o.promote(a.job_id)),
    Demote: lambda o, a: _moved(o, a, lambda: o.demote(a.job_id)),
    Migrate: lambda o, a: _moved(o, a, lambda: o._migrate(a), a.cost),
    Move: lambda o, a: _moved(o, a, lambda: o.move(a.job_id, a.cores, a.level, a.cost, a.kind), a.cost),
    Restore: lambda o, a: _moved(o, a, lambda: o.restore(a.job_id, a.cores, level_of(a.tier))),
    Kill: _stopped,
    Checkpoint: _around(EffectKind.CHECKPOINTED, lambda o, a: o.checkpoint(a.job_id)),
    Suspend: _around(EffectKind.SUSPENDED, lambda o, a: o.suspend(a.job_id)),
    Resume: _around(EffectKind.RESUMED, lambda o, a: o.resume(a.job_id)),
    SetCap: _around(EffectKind.CAPPED, lambda o, a: o.set_cap(a.job_id, a.cap)),
    PlaceShared: _around(EffectKind.PLACED_SHARED, Occupancy.place_shared),
    Resize: _around(EffectKind.RESIZED, lambda o, a: o.resize(a.job_id, a.cores, a.level, a.slot_levels)),
    Replicate: _around(EffectKind.REPLICATED, lambda o, a: o.replicate(a.job_id, a.level)),
    Unreplicate: _around(EffectKind.UNREPLICATED, lambda o, a: o.unreplicate(a.job_id, a.level)),
}


def _cap_of(cap: float | None, job: Job) -> float:
    """The CPU a shared VM may take: its cap, or (uncapped) its need."""
    return min(1.0, job.cpu_need) if cap is None else cap


def node_cores(view: ClusterView) -> dict[str, int]:
    """Each node's cores in the view (``node_of_core``): the CPU capacity of its shared VMs' caps."""
    out: dict[str, int] = {}
    for node in view.node_of_core:
        out[node] = out.get(node, 0) + 1
    return out


def _known_nodes(view: ClusterView) -> Set[str]:
    return set(view.node_names) | set(view.node_of_core)


def priority_form(act: Action, checkpointed: bool = False) -> Action:
    """A ``Start``/``Move`` on level 0 or 1 in the priority discipline's own words (StartFg/StartBg,
    Promote/Demote, Migrate, Restore for a ``checkpointed`` job); any other action unchanged. Its one
    caller left is vmctld's actuator, which dispatches on action types; once it commits the effects of
    ``apply`` (:mod:`vmctl.policies.effects`) as the simulator does, this goes."""
    if isinstance(act, Start) and act.level <= 1 and act.slot_levels is None:
        return StartFg(act.job_id, act.cores) if act.level == 0 else StartBg(act.job_id, act.cores)
    if isinstance(act, Move) and act.level <= 1:
        tier = Tier.FG if act.level == 0 else Tier.BG
        if checkpointed and act.cores is not None:
            return Restore(act.job_id, act.cores, tier)
        if act.cores is None and act.cost == 0.0:
            return Promote(act.job_id) if act.level == 0 else Demote(act.job_id)
        if act.cores is not None:
            return Migrate(act.job_id, act.cores, tier, act.cost)
    return act


def check_schedule(view: ClusterView, schedule: SliceSchedule) -> None:
    """A time-slice schedule needs the ``timeslice`` discipline, a positive period and distinct rows."""
    if view.discipline is not Discipline.TIMESLICE:
        raise fail("schedule-discipline", f"a time-slice schedule needs the timeslice discipline, "
                                          f"the cluster is {view.discipline.value}")
    if not (schedule.period > 0 and math.isfinite(schedule.period)):
        raise fail("schedule-period", f"period {schedule.period} is not a positive number of seconds")
    order = schedule.order
    if not order or len(set(order)) != len(order) or not all(0 <= r < view.levels for r in order):
        raise fail("schedule-order", f"order {order} must list distinct rows of 0..{view.levels - 1}")


def queued_subset(view: ClusterView, wanted: Set[str]) -> dict[str, Job]:
    """The queued jobs among ``wanted``: looked up in ``view.queue_index`` when the view has one,
    else found by scanning the queue only up to the last one (the jobs a decision names are usually
    near its front), never indexing the whole queue."""
    out: dict[str, Job] = {}
    left = len(wanted)
    if not left:
        return out
    index: Mapping[str, Job] | None = view.queue_index
    if index is not None:
        get = index.get
        for jid in wanted:
            j = get(jid)
            if j is not None:
                out[jid] = j
        return out
    for j in view.queue:
        if j.id in wanted and j.id not in out:
            out[j.id] = j
            left -= 1
            if not left:
                break
    return out
