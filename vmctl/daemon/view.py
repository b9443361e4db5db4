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
from types import MappingProxyType

from vmctl.cpushare import shared_rate
from vmctl.daemon import dispatcher
from vmctl.daemon.state import ClusterState, Layout, bg_pace, row_pace, source_level
from vmctl.model import ClusterView, JobState, RunningJob, Tier
from vmctl.store.base import JobRecord


def build_view(st: ClusterState, now: float) -> tuple[ClusterView, Layout]:
    """The view of ``st`` at ``now``, and the layout its global cores are numbered in."""
    lay = st.layout()
    total = lay.total
    levels, discipline = st.cluster_levels()
    # slot_job per level (at least fg and bg: the priority names), cut to the cluster's levels below
    slots: list[list[str | None]] = [[None] * total for _ in range(max(2, levels))]
    fg = slots[0]
    util = [0.0] * total
    usable = [False] * total
    for name in lay.names:
        if st.nodes[name].state == "ready" and st.layout_ready(name):
            off = lay.offset[name]
            usable[off:off + lay.cores[name]] = [True] * lay.cores[name]
    running: dict[str, RunningJob] = {}
    offset, ncores, util_of = lay.offset, lay.cores, st._util
    placed: list[tuple[JobRecord, tuple[int, ...], int]] = []
    static = st._static
    for rec in st.active():
        shared = rec.shared
        cached = static.get(rec.id)
        if cached is None:  # until the job's record changes (``ClusterState.reindex``) or the nodes do
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
            cached = (tuple(cores), tuple(rec.vm_name(i) for i in range(n)), tuple(job.usage_of(i) for i in range(n)),
                      n > 0 and len(cores) == n, on, min(on, default=0), len(set(on)) <= 1)
            static[rec.id] = cached
        cores_t, names, usages, complete, on_levels, low, uniform = cached
        if complete:
            placed.append((rec, cores_t, low))
        if shared:
            continue
        if not rec.checkpointed:
            jid = rec.id
            if rec.gang or uniform:  # a gang job's row and its replicas, or a job on one level: every core
                for lv in (low, *rec.replicas) if rec.gang else (low,):
                    if lv < len(slots):
                        row = slots[lv]
                        for g in cores_t:
                            row[g] = jid
                if low == 0 and not rec.gang:  # level 0 holds the fg slot and its utilization
                    for g, name, us in zip(cores_t, names, usages, strict=False):
                        u = util_of.get(name)
                        util[g] = us if u is None else u
            else:  # a task bag on several levels: each worker on its slot's level
                for g, lv, name, us in zip(cores_t, on_levels, names, usages, strict=False):
                    if lv < len(slots):
                        slots[lv][g] = jid
                    if lv == 0:
                        u = util_of.get(name)
                        util[g] = us if u is None else u
        if rec.migrating:
            # the source slots stay reserved until the migration is confirmed or rolled back
            op = st.ops.get(rec.migrating)
            if op is not None:
                src = source_level(op, rec)
                arr = slots[src] if src < len(slots) else slots[1]
                for m in op.detail.get("moves", []):
                    g2 = lay.global_core(str(m["from"][0]), int(m["from"][1]))
                    if g2 is not None and arr[g2] is None:
                        arr[g2] = rec.id
    for rec, cores_t, low in placed:
        tier = Tier.FG if low == 0 else Tier.BG  # vcsched's shared VMs count as fg
        prog = _progress_with(st, rec, now, util, fg, cores_t, low)
        job = st.job_obj(rec)
        end = now + max(0.0, job.estimate - prog) if (tier is Tier.FG or rec.gang) and \
            rec.state == JobState.RUNNING else math.inf
        per_slot: tuple[int, ...] | None = None
        if rec.bag is not None and not static[rec.id][6]:
            per_slot = static[rec.id][4]
        running[rec.id] = RunningJob(
            job=job, tier=tier, cores=cores_t, start_time=rec.start_time or now,
            tier_since=rec.tier_since or now, progress=prog, expected_end=end,
            suspended=rec.suspended or rec.checkpointed, checkpointed=rec.checkpointed,
            cap=rec.cap, shared_nodes=tuple(s.node for s in rec.slots) if rec.shared else (),
            tasks_left=None if rec.bag is None else dispatcher.tasks_left(rec),
            throughput=None if rec.bag is None else dispatcher.throughput_by_slot(rec, lay.global_core),
            level=low if rec.gang else -1, replicas=tuple(rec.replicas), slot_levels=per_slot,
            migrated_at=-math.inf if rec.migrated_at is None else rec.migrated_at,
        )
    queue, queue_index = st.queue_jobs()
    waiting = st.lingering() if queue else set()
    if waiting:  # a VM of an earlier run is still on some host: this run starts once it is gone
        queue = [j for j in queue if j.id not in waiting]
        queue_index = MappingProxyType({j.id: j for j in queue})
    idle = [{c for c in range(total) if usable[c] and row[c] is None} for row in slots]
    speed, group, mem = st.node_attributes()
    view = ClusterView.leveled(
        total, queue, running, slots[:levels], idle[:levels],
        discipline, util, usable, node_of_core=lay.node_of_core,
        local_core=lay.local_core, node_names=lay.names, queue_index=queue_index,
        migration_targets=st.migration_targets(),
        node_speed=speed, node_group=group, node_mem_mib=mem, shapes=st.shapes() if st._shaped else {},
    )
    return view, lay


def _progress_with(st: ClusterState, rec: JobRecord, now: float, util: list[float], fg: list[str | None],
                   cores: tuple[int, ...], low: int) -> float:
    """``ClusterState.progress`` with the fg utilization of the view being built."""
    if rec.tier_since is None:
        return rec.progress_base
    if rec.state != JobState.RUNNING or rec.suspended or rec.checkpointed or rec.migrating:
        pace = 0.0
    elif rec.gang:
        pace = row_pace(rec, st.slices)
    elif rec.shared:
        pace = shared_rate(rec.cap, st.job_obj(rec).cpu_need)
    elif low == 0:
        pace = 1.0
    else:
        pace = bg_pace(st.job_obj(rec), [None if fg[g] is None else util[g] for g in cores])
    return rec.progress_base + max(0.0, now - rec.tier_since) * pace
