"""The ``ClusterView`` a policy sees, built from the job records' slots (one reader of the records for
this projection; ``vmctl.daemon.desired`` is the other).

Each active job's slots (``JobRecord.slots``: node, local core, level) give its global cores and the
level each process occupies: a process on level 0 holds the core's fg slot (and its measured utilization
is the core's ``fg_util``), one on level 1 the bg slot, higher levels the upper rows of a timeslice
cluster. A gang job holds its row and its replicas on every one of its cores. A shared (vcsched) VM is
unpinned: it stands for its node (the node's first global core) and holds no slot. While a job
migrates, its *source* slots stay reserved (on the level it left: ``source_level``) so that a rollback
always has somewhere to go.

Progress of a running job is modelled (see ``vmctl.daemon.state``): the pace is 1 on level 0, the
share of active slices for a gang job (``row_pace``), the cap's share for a shared VM and the shared
progress model below a fg VM (``bg_pace``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from operator import attrgetter
from types import MappingProxyType
from typing import Any

from vmctl.cpushare import shared_rate
from vmctl.daemon import dispatcher
from vmctl.daemon.state import ClusterState, Layout, bg_pace, row_pace, source_level
from vmctl.model import ClusterView, JobState, RunningJob, Tier
from vmctl.store.base import JobRecord


def build_view(st: ClusterState, now: float, *, full: bool = False) -> tuple[ClusterView, Layout]:
    """The view of ``st`` at ``now``, and the layout its global cores are numbered in.

    The per-core part (every level's slot owners, the fg utilization, the usable cores and the idle
    sets) is kept between calls (``_Cells``) and updated for the jobs that changed since the last call
    (``ClusterState.reindex`` and the agents' reports mark them); ``full`` builds it from every record
    instead (the reference the incremental path is tested against), without touching what is kept."""
    return prepare_view(st, now, full=full).build()


class PreparedView:
    """A view read from the state but not built yet (``prepare_view``): every value it needs, copied, so
    that ``build`` (the ``RunningJob`` objects, O(running jobs), and the ``ClusterView``) may run in a
    worker thread while the event loop's handlers change the state (``vmctl.daemon.runtime``)."""

    __slots__ = ("_args", "_reference", "_rest", "lay")

    def __init__(self, lay: Layout, args: list[tuple[Any, ...]], rest: tuple[Any, ...], reference: bool) -> None:
        self.lay, self._args, self._rest, self._reference = lay, args, rest, reference

    def release(self) -> None:
        """Drop the values read (the decision is done; ``build`` must not be called again)."""
        self._args = []

    def build(self) -> tuple[ClusterView, Layout]:
        make = _reference_running_job if self._reference else _running_job
        running = {a[0].id: make(a) for a in self._args}
        (levels, queue, rows, idle, discipline, util, usable, queue_index, targets, speed, group, mem,
         shapes) = self._rest
        lay = self.lay
        view = ClusterView.leveled(
            lay.total, queue, running, rows[:levels], idle[:levels],
            discipline, util, usable, node_of_core=lay.node_of_core,
            local_core=lay.local_core, node_names=lay.names, queue_index=queue_index,
            migration_targets=targets, node_speed=speed, node_group=group, node_mem_mib=mem, shapes=shapes,
        )
        return view, lay


#: ``RunningJob``'s fields in the order of its slots (the order ``prepare_view`` lists a job's values in)
_RJ_FIELDS = ("job", "tier", "cores", "start_time", "tier_since", "progress", "expected_end", "suspended", "level",
              "cap", "shared_nodes", "tasks_left", "replicas", "migrated_at", "throughput", "checkpointed",
              "slot_levels")
_RJ_SETTERS: tuple[Any, ...] | None = (
    tuple(getattr(RunningJob, f).__set__ for f in _RJ_FIELDS)
    if getattr(RunningJob, "__slots__", None) == _RJ_FIELDS else None)
_new = object.__new__


def _reference_running_job(values: tuple[Any, ...]) -> RunningJob:
    """A ``RunningJob`` through its constructor (the reference ``_running_job`` is tested against)."""
    return RunningJob(**dict(zip(_RJ_FIELDS, values, strict=True)))


def _running_job(values: tuple[Any, ...]) -> RunningJob:
    """The same ``RunningJob`` as its constructor makes, without the frozen dataclass's per-field
    ``object.__setattr__`` and ``__post_init__`` (``prepare_view`` gives the ``level`` it would compute):
    half the cost, on every running job of every view."""
    setters = _RJ_SETTERS
    if setters is None:  # RunningJob's fields changed: the constructor
        return _reference_running_job(values)
    o = _new(RunningJob)
    for put, v in zip(setters, values, strict=False):  # (both in _RJ_FIELDS order)
        put(o, v)
    return o


def prepare_view(st: ClusterState, now: float, *, full: bool = False) -> PreparedView:
    """Read from ``st`` what the view at ``now`` needs (``build_view``); ``PreparedView.build`` makes it."""
    lay = st.layout()
    levels, discipline = st.cluster_levels()
    active = st.active()
    static = st._static
    placed: list[tuple[JobRecord, tuple[int, ...], int]] = []
    for rec in active:
        cached = static.get(rec.id)
        if cached is None:
            cached = _static_of(st, rec, lay)
            static[rec.id] = cached
        if cached[3]:
            placed.append((rec, cached[0], cached[5]))
    cells = None if full else st._vcells
    if cells is None or cells.lay is not lay or cells.levels != levels or not cells.update(st, active):
        cells = _Cells(st, lay, levels, active)
        if not full:
            st._vcells = cells
    if not full:
        st._vdirty.clear()
    rows, util, usable, idle = cells.snapshot()
    fg, fg_util = cells.rows[0], cells.util
    args: list[tuple[Any, ...]] = []
    job_cache, slices = st._job_cache, st.slices
    fg_tier, bg_tier, running_state, inf = Tier.FG, Tier.BG, JobState.RUNNING, math.inf
    paces: dict[tuple[int | None, ...], float] = {}  # a gang job's rows -> its ``row_pace`` under ``slices``
    for rec, cores_t, low in placed:  # (the loop the view costs at 10,000 jobs: kept lean)
        tier = fg_tier if low == 0 else bg_tier  # vcsched's shared VMs count as fg
        job = job_cache.get(rec.id) or st.job_obj(rec)
        slots, gang, live = rec.slots, rec.gang, rec.state == running_state
        shared = bool(slots) and slots[0].core is None  # JobRecord.shared
        # the progress (``ClusterState.progress`` with the fg utilization of this view)
        since = rec.tier_since
        if since is None:
            prog = rec.progress_base
        else:
            if not live or rec.suspended or rec.checkpointed or rec.migrating:
                pace = 0.0
            elif gang:
                # one ``row_pace`` per set of rows (a view's gang jobs sit in a few distinct row sets)
                key = (rec.level, *rec.replicas)
                pace = paces.get(key, -1.0)
                if pace < 0.0:
                    pace = paces[key] = row_pace(rec, slices)
            elif shared:
                pace = shared_rate(rec.cap, job.cpu_need)
            elif low == 0:
                pace = 1.0
            else:
                pace = bg_pace(job, [None if fg[g] is None else fg_util[g] for g in cores_t])
            prog = rec.progress_base + max(0.0, now - since) * pace
        end = now + max(0.0, job.estimate - prog) if (tier is fg_tier or gang) and live else inf
        bag = rec.bag
        per_slot: tuple[int, ...] | None = None
        if bag is not None and not static[rec.id][6]:
            per_slot = static[rec.id][4]
        # the level RunningJob.__post_init__ gives: a gang job's row, a bag's lowest, else fg 0 / bg 1
        level = low if gang or per_slot else (0 if low == 0 else 1)
        migrated = rec.migrated_at
        args.append((
            job, tier, cores_t, rec.start_time or now, since or now, prog, end,
            rec.suspended or rec.checkpointed, level, rec.cap, tuple(s.node for s in slots) if shared else (),
            None if bag is None else dispatcher.tasks_left(rec), tuple(rec.replicas),
            -inf if migrated is None else migrated,
            None if bag is None else dispatcher.throughput_by_slot(rec, lay.global_core),
            rec.checkpointed, per_slot))
    queue, queue_index = st.queue_jobs()
    waiting = st.lingering() if queue else set()
    if waiting:  # a VM of an earlier run is still on some host: this run starts once it is gone
        queue = [j for j in queue if j.id not in waiting]
        queue_index = MappingProxyType({j.id: j for j in queue})
    speed, group, mem = st.node_attributes()
    rest = (levels, queue, rows, idle, discipline, util, usable, queue_index, st.migration_targets(), speed, group,
            mem, st.shapes() if st._shaped else {})
    return PreparedView(lay, args, rest, full)


_STATE = attrgetter("state")

#: per job (``ClusterState._static``): global cores, VM names, estimated usages, whether every process maps
#: to a known core, its slots' levels, the lowest, and whether they are all one
Static = tuple[tuple[int, ...], tuple[str, ...], tuple[float, ...], bool, tuple[int, ...], int, bool]


def _static_of(st: ClusterState, rec: JobRecord, lay: Layout) -> Static:
    """What the view needs of ``rec`` that changes only with its record (``ClusterState.reindex``) or the
    nodes (``nodes_changed``)."""
    offset, ncores = lay.offset, lay.cores
    cores: list[int] = []
    for s in rec.slots:
        base = offset.get(s.node)
        if base is None:
            continue
        if s.core is None:
            cores.append(base)  # an unpinned shared VM stands for its node (no fg/bg slot)
        elif 0 <= s.core < ncores[s.node]:
            cores.append(base + s.core)
    job = st.job_obj(rec)
    n = len(rec.slots)
    on = tuple(s.level for s in rec.slots)
    return (tuple(cores), tuple(rec.vm_name(i) for i in range(n)), tuple(job.usage_of(i) for i in range(n)),
            n > 0 and len(cores) == n, on, min(on, default=0), len(set(on)) <= 1)


#: what one job writes into the per-core arrays: the slots it holds (level, core), the fg utilization of
#: its level-0 cores (core, value), and the source slots it keeps reserved while it migrates (level, core;
#: written only where no job is)
Writes = tuple[list[tuple[int, int]], list[tuple[int, float]], list[tuple[int, int]]]


def _writes(st: ClusterState, rec: JobRecord, cached: Static, nrows: int, lay: Layout) -> Writes:
    cells: list[tuple[int, int]] = []
    utils: list[tuple[int, float]] = []
    reserve: list[tuple[int, int]] = []
    cores_t, names, usages, _complete, on_levels, low, uniform = cached
    if not rec.shared:
        if not rec.checkpointed:
            util_of = st._util
            if rec.gang or uniform:  # a gang job's row and its replicas, or a job on one level: every core
                for lv in (low, *rec.replicas) if rec.gang else (low,):
                    if lv < nrows:
                        cells.extend((lv, g) for g in cores_t)
                if low == 0 and not rec.gang:  # level 0 holds the fg slot and its utilization
                    for g, name, us in zip(cores_t, names, usages, strict=False):
                        u = util_of.get(name)
                        utils.append((g, us if u is None else u))
            else:  # a task bag on several levels: each worker on its slot's level
                for g, lv, name, us in zip(cores_t, on_levels, names, usages, strict=False):
                    if lv < nrows:
                        cells.append((lv, g))
                    if lv == 0:
                        u = util_of.get(name)
                        utils.append((g, us if u is None else u))
        if rec.migrating:
            # the source slots stay reserved until the migration is confirmed or rolled back
            op = st.ops.get(rec.migrating)
            if op is not None:
                src = source_level(op, rec)
                row = src if src < nrows else 1
                for m in op.detail.get("moves", []):
                    g2 = lay.global_core(str(m["from"][0]), int(m["from"][1]))
                    if g2 is not None:
                        reserve.append((row, g2))
    return cells, utils, reserve


#: the per-core arrays one view gets: slot owners and idle cores per level, fg utilization, usable cores
Snapshot = tuple[list[Sequence[str | None]], list[float], list[bool], list[Set[int]]]


class _Cells:
    """The per-core arrays of the view (slot owners per level, fg utilization, usable cores, idle cores per
    level), kept between views and updated job by job (``update``). Built from every active job in id order
    it is exactly what a view built from scratch holds; while two jobs' writes overlap (which a consistent
    state never has) every update falls back to that full build, where the later job's write wins."""

    def __init__(self, st: ClusterState, lay: Layout, levels: int, active: list[JobRecord]) -> None:
        self.lay, self.levels = lay, levels
        total = lay.total
        nrows = max(2, levels)  # at least fg and bg: the priority names
        self.rows: list[list[str | None]] = [[None] * total for _ in range(nrows)]
        self.util = [0.0] * total
        self._states: list[str] | None = None  # the nodes' states node_ok was computed from
        self.node_ok: list[bool] = []
        self.node_ok = self._node_ok(st)
        self.usable = self._usable()
        self.writes: dict[str, Writes] = {}
        self.conflict = False
        rows, util = self.rows, self.util
        for rec in active:  # in id order, the later job's write winning, as a view was always built
            jid = rec.id
            cells, utils, reserve = _writes(st, rec, st._static[jid], nrows, lay)
            for lv, g in cells:
                cur = rows[lv][g]
                if cur is not None and cur != jid:
                    self.conflict = True
                rows[lv][g] = jid
            for g, u in utils:
                util[g] = u
            kept = [(lv, g) for lv, g in reserve if rows[lv][g] is None]
            for lv, g in kept:
                rows[lv][g] = jid
            self.writes[jid] = (cells, utils, kept)
        usable = self.usable
        self.idle = [{c for c in range(total) if usable[c] and row[c] is None} for row in rows]
        self._snap: Snapshot | None = None
        self._changed_rows: set[int] = set(range(nrows))
        self._util_changed = True
        self._usable_changed = True

    def _node_ok(self, st: ClusterState) -> list[bool]:
        """Whether each node's cores are usable: it is ready and carries the cluster's layout. O(nodes) in C
        while vmctld lays no layout out (every node carries its own) and the nodes' states did not change."""
        nodes = st.nodes
        states = list(map(_STATE, map(nodes.__getitem__, self.lay.names)))
        if st.cluster_layout is None:
            if states == self._states:
                return self.node_ok
            self._states = states
            return [s == "ready" for s in states]
        self._states = None
        return [nodes[name].state == "ready" and st.layout_ready(name) for name in self.lay.names]

    def _usable(self) -> list[bool]:
        lay = self.lay
        out: list[bool] = []
        for name, ok in zip(lay.names, self.node_ok, strict=True):
            out.extend([ok] * lay.cores[name])
        return out

    def update(self, st: ClusterState, active: list[JobRecord]) -> bool:
        """Bring the arrays up to date with ``st``: the jobs marked changed (``_vdirty``), the migrating
        ones (their source reservations follow the operation), those that left the active set, and the
        nodes' usability. False when the arrays cannot be updated job by job (overlapping writes): the
        caller builds them again from every job."""
        if self.conflict:
            return False
        lay, nrows = self.lay, len(self.rows)
        dirty = st._vdirty
        writes = self.writes
        redo: list[JobRecord] = []
        gone = set(writes)
        for rec in active:
            jid = rec.id
            gone.discard(jid)
            w = writes.get(jid)
            if w is None or jid in dirty or rec.migrating or w[2]:
                redo.append(rec)
        rows, util, idle = self.rows, self.util, self.idle
        usable = self.usable
        changed = self._changed_rows
        # take every changed job's old writes out first (a job that left may free cells another now takes)
        for jid in (*gone, *(r.id for r in redo)):
            w = writes.pop(jid, None)
            if w is None:
                continue
            cells, utils, reserve = w
            for lv, g in cells:
                cur = rows[lv][g]
                if cur != jid:
                    if cur is None:  # the job's own second process on the core
                        continue
                    self.conflict = True
                    return False
                rows[lv][g] = None
                if usable[g]:
                    idle[lv].add(g)
                changed.add(lv)
            for g, _u in utils:
                util[g] = 0.0
                self._util_changed = True
            for lv, g in reserve:
                if rows[lv][g] == jid:
                    rows[lv][g] = None
                    if usable[g]:
                        idle[lv].add(g)
                    changed.add(lv)
        for rec in redo:
            jid = rec.id
            w = _writes(st, rec, st._static[jid], nrows, lay)
            cells, utils, reserve = w
            for lv, g in cells:
                cur = rows[lv][g]
                if cur is not None and cur != jid:
                    self.conflict = True
                    return False
                rows[lv][g] = jid
                idle[lv].discard(g)
                changed.add(lv)
            for g, u in utils:
                if util[g] != u:
                    util[g] = u
                    self._util_changed = True
            kept = [(lv, g) for lv, g in reserve if rows[lv][g] is None]  # a held source slot stays its job's
            for lv, g in kept:
                rows[lv][g] = jid
                idle[lv].discard(g)
                changed.add(lv)
            writes[jid] = (cells, utils, kept)
        node_ok = self._node_ok(st)
        if node_ok != self.node_ok:
            self.node_ok = node_ok
            self.usable = usable = self._usable()
            total = lay.total
            self.idle = [{c for c in range(total) if usable[c] and row[c] is None} for row in rows]
            self._usable_changed = True
            changed.update(range(nrows))
        return True

    def snapshot(self) -> Snapshot:
        """Copies of the arrays for one view (a view outlives later changes unaltered); a part that did not
        change since the last view is shared with it (views are read-only)."""
        snap = self._snap
        if snap is None:
            rows: list[Sequence[str | None]] = [row.copy() for row in self.rows]
            idle: list[Set[int]] = [frozenset(s) for s in self.idle]
            snap = (rows, self.util.copy(), self.usable.copy(), idle)
        else:
            rows, util, usable, idle = list(snap[0]), snap[1], snap[2], list(snap[3])
            for lv in self._changed_rows:
                rows[lv] = self.rows[lv].copy()
                idle[lv] = frozenset(self.idle[lv])
            snap = (rows, self.util.copy() if self._util_changed else util,
                    self.usable.copy() if self._usable_changed else usable, idle)
        self._snap = snap
        self._changed_rows = set()
        self._util_changed = self._usable_changed = False
        return snap
