"""vmctld's side of gang scheduling (paper 004 on real hosts): the gang policies' actions on a
``timeslice`` cluster, the slice schedule, and the matrix an operator reads (``vmctl gang show``).

Rows on the hosts. A timeslice cluster's agents carry L levels per core; level r of every core is row r
of the Ousterhout matrix. A gang job's record keeps its row (its slots' level, ``JobRecord.level``), the rows it is
replicated into (``replicas``, same cores) and when it last changed nodes (``migrated_at``: the
policies count the tasks migrated in the current slice from it, their quota Q). Its VMs carry the row
as ``VmDesired.level`` and ``replicas``; the agent runs a VM while any of its rows is active.

The actions, each applied on the one occupancy model, whose effect the actuator commits
(``vmctl.daemon.actuator``: a start, a move, a row more or fewer):

- ``Start(job, cores, r)``: the job's VMs are created in row r of its cores (the row's placeholders go);
- ``Move(job, None, r)``: the same VMs change row (on the host: a change of level, nothing is copied);
- ``Move(job, cores, r, cost)`` to other cores: on the same node a re-pin; to other nodes a migration
  operation in checkpoint mode (the paper's mechanism: save on the source, restore on the target;
  the agents' existing two-phase path). The source slots stay reserved until the agents confirm it, and
  a failed or refused migration rolls the job back to where it was (row included: ``from_level``);
- ``Replicate(job, r)`` / ``Unreplicate(job, r)``: a row more or less for the same VMs.

The slice schedule (``apply_schedule``). The policy's ``Decision.schedule`` (period T, row order,
epoch 0: slices start at multiples of T of the daemon's clock, Unix seconds) replaces the one in force
when it differs; it is written to the store (kv ``gang.schedule``) and, in the same transaction, put in
the desired state (``NodeDesired.slices``, a new generation) of every timeslice node that must learn it
(below). Nothing is written per slice: each agent switches rows on its own clock
(``Reconciler.run_once``). A restarted or failed-over vmctld loads the same schedule (same epoch, so
the agents keep the phase). Before the schedule changes, every gang job's modelled progress is frozen
at its old pace (``row_pace``: the share of slices its rows are active) and goes on at the new one.

Which nodes get a new generation (``node_clock``). A node's document changes when its VMs change or
when the schedule *as that node sees it* changes: T, the epoch and the row order with the rows none of
its VMs is in blanked out (an agent does the same to its VMs whichever of those rows is active: they are
all inactive). The order is per cluster and a row's turn depends on its place in it, so a node must
learn a new order whenever one of its rows changes place or the cycle changes length, even if its VMs
did not change: otherwise its row would run out of phase with the same job's other nodes. Example: rows
(0, 1) -> (0, 2): a node whose VMs are all in row 0 keeps its document (row 0 still runs every other
slice from the same epoch), the node of the job that moved from row 1 to row 2 gets one; rows (0, 1)
-> (0,): the row-0 node gets one too (row 0 now runs in every slice). A node with no VM in a row of
the schedule keeps its document (none at all if it never had a job VM) and gets the schedule in force
with its next VM. A document kept may carry an older schedule (``ClusterState.desired_slices``; a
restarted vmctld loads it) that its agent follows to the same effect on its VMs; only its idle
placeholders switch on the old clock.

Run-time limits. A gang job's modelled progress counts only its active slices, so ``kill_at_estimate``
(estimate + grace) measures active time, not time spent paused in an inactive row; ``vmctl job show``
prints both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vmctl.daemon.records import Changes, RecordWriter
from vmctl.daemon.state import ClusterState
from vmctl.errors import PolicyParameterError, ValidationError
from vmctl.model import Action, Discipline, JobState, Migrate, Move, SliceSchedule
from vmctl.nodedoc import VmDesired
from vmctl.policies.base import Offer, SchedulingPolicy
from vmctl.store.base import JobRecord
from vmctl.wire import slices_from_json, slices_to_json

#: the kv key of the persisted slice schedule
SCHEDULE_KV = "gang.schedule"


def row_form(act: Action, job: JobRecord) -> Action:
    """An operator's ``Migrate`` of a gang job as the row action it is: a ``Move`` within its row."""
    if isinstance(act, Migrate) and job.level is not None:
        return Move(act.job_id, act.cores, job.level, act.cost)
    return act


def schedule_from_kv(raw: Any) -> SliceSchedule | None:
    """The persisted schedule (None when none was stored, or what is stored is unreadable)."""
    if not isinstance(raw, dict):
        return None
    try:
        return slices_from_json(raw, f"kv {SCHEDULE_KV}.")
    except ValidationError:  # a bad stored value is dropped: the next decision sets one again
        return None


def apply_schedule(writer: RecordWriter, schedule: SliceSchedule, now: float, ch: Changes) -> bool:
    """Put ``schedule`` in force if it differs from the current one; True when it changed. Every running
    gang job's progress is fixed at ``now`` first (its pace changes)."""
    st = writer.state
    if st.slices == schedule:
        return False
    for rec in st.active():
        if rec.gang and rec.state == JobState.RUNNING:
            writer.freeze_progress(rec, now)
        if rec.gang:
            ch.jobs[rec.id] = rec
    st.slices = schedule
    ch.kv[SCHEDULE_KV] = slices_to_json(schedule)
    ch.desired_nodes |= {n for n, rec in st.nodes.items() if rec.discipline == Discipline.TIMESLICE.value}
    return True


def check_offer(offer: Offer, policy: SchedulingPolicy) -> None:
    """``offer.check(policy)``, with a gang policy's MPL above the registered levels named as its
    parameter ``mpl`` (what the operator sets), not only as a need of the cluster."""
    mpl = policy.params.get("mpl")
    if offer.discipline is Discipline.TIMESLICE and isinstance(mpl, int) and mpl > offer.levels:
        raise PolicyParameterError(policy=policy.name, param="mpl",
                                   problem=f"{mpl} rows need {mpl} timeslice levels per core, but the registered "
                                           f"agents carry {offer.levels} (their layout.levels): use mpl <= "
                                           f"{offer.levels}")
    offer.check(policy)


def quota_problem(state: ClusterState, q: float | None, job: JobRecord, now: float) -> str | None:
    """Why moving ``job`` to other cores now would exceed the policy's quota Q of tasks migrated per
    slice (``q``: ``Actuator.slice_quota``), or None. The second line of defence behind the gang policies, which
    count the same from ``RunningJob.migrated_at``: the tasks of the jobs that changed cores since the
    current slice began, this decision's moves included (their records already carry ``migrated_at``)."""
    sched = state.slices
    if q is None or not math.isfinite(q) or sched is None:
        return None
    begin = sched.epoch + sched.slot(now) * sched.period
    used = sum(len(r.slots) for r in state.active()
               if r.migrated_at is not None and r.migrated_at >= begin - 1e-9)
    if used + len(job.placement) > q:
        return (f"quota Q = {q:g} tasks migrated per slice reached ({used} since the slice began at t={begin:.0f}; "
                f"this move needs {len(job.placement)})")
    return None


def node_slices(state: ClusterState, node: str) -> SliceSchedule | None:
    """The slice clock node ``node``'s desired state carries: the schedule in force on a timeslice node."""
    rec = state.nodes.get(node)
    if rec is None or rec.discipline != Discipline.TIMESLICE.value:
        return None
    return state.slices


#: a node's view of the slice schedule (``node_clock``): T, epoch, the order with the node's other rows blanked
NodeClock = tuple[float, float, tuple[int | None, ...]]
#: the view of a node none of whose VMs is in a row of the schedule in force (its VMs never run)
IDLE_CLOCK: NodeClock = (0.0, 0.0, ())


def node_clock(schedule: SliceSchedule | None, vms: Sequence[VmDesired]) -> NodeClock | None:
    """What a node whose desired VMs are ``vms`` does with ``schedule``: T, the epoch and ``schedule``'s
    order with the rows none of ``vms`` is in as None; ``IDLE_CLOCK`` when none of them is; None for no
    schedule while some VM has a row (the agent keeps its row active). Two schedules with the same view
    run the node's VMs in the same slices. Example: ``vms`` in row 0 only, order (0, 1) and (0, 2):
    both ``(T, epoch, (0, None))``."""
    rows = {r for v in vms if v.slot_level is not None for r in (v.slot_level, *v.replicas)}
    if not rows:
        return IDLE_CLOCK
    if schedule is None:
        return None
    order = tuple(r if r in rows else None for r in schedule.order)
    if all(r is None for r in order):
        return IDLE_CLOCK
    return schedule.period, schedule.epoch, order


def clock_changed(state: ClusterState, node: str, vms: Sequence[VmDesired]) -> bool:
    """Whether node ``node`` with desired ``vms`` must learn the schedule in force: its stored document's
    schedule (``desired_slices``) runs ``vms`` in other slices."""
    return node_clock(node_slices(state, node), vms) != node_clock(state.desired_slices.get(node), vms)


# ---------------------------------------------------------------------------------------- the matrix

def matrix_doc(state: ClusterState, now: float) -> dict[str, Any]:
    """The Ousterhout matrix of a timeslice cluster as ``GET /v1/gang`` answers it: per row, per node,
    the job on each local core (null: a hole); the schedule and the row active now; rows in use and the
    holes (free cells of the rows in use on usable cores)."""
    levels, discipline = state.cluster_levels()
    lay = state.layout()
    sched = state.slices
    active = sched.active_row(now) if sched is not None else 0
    cells: list[dict[str, list[str | None]]] = [{n: [None] * lay.cores[n] for n in lay.names}
                                                for _ in range(levels)]
    for rec in state.active():
        if rec.level is None or rec.checkpointed:
            continue
        for lv in (rec.level, *rec.replicas):
            if lv < levels:
                for n, c in rec.placement:
                    row = cells[lv].get(n)
                    if row is not None and 0 <= c < len(row):
                        row[c] = rec.id
    in_use = [r for r in range(levels) if any(j is not None for cs in cells[r].values() for j in cs)]
    usable = {n for n in lay.names if state.nodes[n].state == "ready"}
    holes = sum(1 for r in in_use for n, cs in cells[r].items() if n in usable for j in cs if j is None)
    return {
        "discipline": discipline.value, "levels": levels, "nodes": list(lay.names),
        "schedule": None if sched is None else {
            **slices_to_json(sched), "active_row": active,
            "next_switch": sched.next_switch(now)},
        "active_row": active if discipline is Discipline.TIMESLICE else None,
        "rows": [{"row": r, "active": discipline is Discipline.TIMESLICE and r == active, "cells": cells[r]}
                 for r in range(levels)],
        "rows_in_use": in_use, "holes": holes,
        "cells_per_row": sum(lay.cores[n] for n in usable),
    }


def active_share(job: JobRecord, state: ClusterState, now: float) -> tuple[float, float] | None:
    """(wall seconds since the job's start, active seconds of it) of a running gang job, for ``vmctl
    job show`` (active = modelled progress: the slices its rows were active); None for other jobs."""
    if job.level is None or job.start_time is None:
        return None
    return max(0.0, now - job.start_time), min(max(0.0, now - job.start_time), state.progress(job, now))

