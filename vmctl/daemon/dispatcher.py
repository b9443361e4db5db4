"""vmctld's dispatcher of task bags (paper 001 sec. II-B-3): hands a bag's tasks to the workers the
decision maker gave it, one at a time, and follows the agents' reports of them.

A task bag (job shape ``task-bag``, :class:`vmctl.model.JobShape`) runs on *workers*: one VM per
(core, level) slot of a ``shared`` layout (docs/agent.md; the paper's testbed has 2 per single-core
node). A bag may hold slots on several levels, two of one core included (``Start``/``Resize`` with
``slot_levels``): worker i runs on ``JobRecord.slots[i]`` (node, core, level). A task is a job process on
its worker's VM (``VmDesired.process`` with ``index`` = the task's number): when the agent reports
that process ended (``VmObserved.process_exit``), the dispatcher records the task's result and hands
the worker the next task not started, in the bag's order; the agent sees a new process index on the
same VM and starts it (``agents/plan.py``: a VM whose process is another one gets the wanted one).
The job is done when every task is.

State (persisted in ``JobRecord.bag`` and the bag's task rows, written in the same transaction as the
desired state it implies, so a vmctld restart or kill -9 loses no recorded result and never hands one
task to two workers): ``vms[i]``, ``task[i]`` and ``release[i]`` run parallel to
``slots``: worker i's stable
VM number (its VM name ``j<id>-r<run>-p<vms[i]>`` survives other workers coming and going), the
task it runs (None: none), and whether a ``Resize`` gave its slot up (it leaves at the end of its
task: a running task is never killed to shrink a job). The level of worker i's slot is ``slots[i].level``
(a record stored before schema 008 kept them here as ``levels``, or one ``level`` for every worker: the
store's migration moved them to the slots). ``next`` is the
first task not started;
``retry`` the tasks whose worker was lost with a node that went down (handed out first).
``rate`` maps a worker id (``node/core.level``, as ``GET /v1/workers``) to the job's throughput
there, corrected from observed task durations (the paper's status checker: work / duration, an
exponentially weighted mean, weight ``RATE_WEIGHT`` for the newest task). ``JobRecord.tasks[k]``
holds task k's result: ``exit_status``, ``error``, ``worker``, ``start`` and ``end``; every function here
that changes task k adds k to ``JobRecord.changed_tasks``, and the store writes those tasks' rows
(``vmctl.store.tasks``, schema 006): a task end costs its row and the next task's, not the bag's
whole record.

What a restarted vmctld sees again: an agent re-reports the process its VM last ran. A report of a
task the record says is done (or that another worker now runs) is ignored; a report of the task the
worker is assigned completes it (the result was lost with the crash, not the task). A worker whose
process the agent reports under another index (the old task's exit, before the agent applied the new
assignment) is waiting for the agent: nothing changes.

Worked example: 5 tasks of 10 s, started on 2 workers (A, B): A runs 0, B runs 1; A's task ends: A
runs 2; a Resize to [B] while B runs 1 marks A ``release`` (it finishes 2 and leaves); B runs 3, then
4; when 4 ends the job is done.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from vmctl.model import JobShape
from vmctl.nodedoc import PowerState, ProcessSpec, VmObserved
from vmctl.store.base import JobRecord, Slot
from vmctl.store.tasks import has_content, new_task, task_count

#: the weight of the newest task's throughput in a worker's corrected estimate
RATE_WEIGHT = 0.5


def worker_id(node: str, core: int, level: int) -> str:
    return f"{node}/{core}.{level}"


def slot_levels(rec: JobRecord) -> list[int]:
    """The level of each worker's slot (``JobRecord.slots``)."""
    return [s.level for s in rec.slots]


def start(rec: JobRecord, now: float, kept: list[dict[str, Any]] | None = None) -> None:
    """``rec`` was just placed on its first workers (``slots``): every worker takes a task.
    ``kept``: the task results of an earlier run (a bag requeued when its last workers' node went
    down): the tasks that ended keep their results, the others are handed out again."""
    shape_tasks = len(rec.spec["shape"]["tasks"])
    n = len(rec.slots)
    if kept and len(kept) == shape_tasks:
        rec.tasks = [t if t.get("exit_status") is not None else new_task(k) for k, t in enumerate(kept)]
        retry, nxt = [k for k, t in enumerate(rec.tasks) if t["exit_status"] is None], shape_tasks
        rec.changed_tasks.update(k for k, t in enumerate(rec.tasks) if has_content(t))  # stored again, this run
    else:
        rec.tasks = [new_task(k) for k in range(shape_tasks)]
        retry, nxt = [], 0
    rec.bag = {"next": nxt, "next_vm": n, "vms": list(range(n)), "task": [None] * n,
               "release": [False] * n, "rate": {}, "retry": retry}
    idle = [i for i in range(n) if not _take(rec, i, now)]
    for i in reversed(idle):  # fewer tasks left than workers: the extra slots are not taken
        _drop(rec, i)


def _take(rec: JobRecord, i: int, now: float) -> bool:
    """Worker i takes the next task not started; False when none is left."""
    bag = rec.bag
    assert bag is not None
    retry = bag.setdefault("retry", [])
    if retry:  # a task whose worker was lost with its node goes first
        k = int(retry.pop(0))
    else:
        k = int(bag["next"])
        if k >= len(rec.tasks):
            bag["task"][i] = None
            return False
        bag["next"] = k + 1
    bag["task"][i] = k
    slot = rec.slots[i]
    t = rec.tasks[k]
    t["worker"], t["start"] = worker_id(slot.node, slot.wire_core, slot.level), now
    rec.changed_tasks.add(k)
    return True


def tasks_left(rec: JobRecord) -> int:
    """The bag's unfinished tasks: those its workers run and those not started."""
    bag = rec.bag
    if bag is None:
        return 0
    running = sum(1 for t in bag["task"] if t is not None)
    return task_count(rec.spec) - int(bag["next"]) + running + len(bag.get("retry", ()))


def resize(rec: JobRecord, slots: list[tuple[str, int, int]], now: float) -> list[tuple[str, int, int]]:
    """The decision maker gave the bag the workers on ``slots`` (node, core, level): kept slots keep their
    worker (one given up earlier and still running stops leaving), new slots get new workers that take
    tasks at once, and a given-up slot whose worker runs a task stays the job's until that task ends.
    Returns those draining slots (still held)."""
    bag = rec.bag
    assert bag is not None
    wanted = set(slots)
    vms, task = bag["vms"], bag["task"]
    place: list[Slot] = []
    nv: list[int] = []
    nt: list[int | None] = []
    nr: list[bool] = []
    draining: list[tuple[str, int, int]] = []
    for i, s in enumerate(rec.slots):
        slot = (s.node, s.wire_core, s.level)
        if slot in wanted or task[i] is not None:
            place.append(s)
            nv.append(vms[i])
            nt.append(task[i])
            nr.append(slot not in wanted)
            if slot not in wanted:
                draining.append(slot)
    held = {(s.node, s.wire_core, s.level) for s in place}
    rec.slots, bag["vms"], bag["task"], bag["release"] = place, nv, nt, nr
    for slot in slots:
        if slot in held:
            continue
        rec.slots.append(Slot(slot[0], slot[1], slot[2]))
        nv.append(int(bag["next_vm"]))
        bag["next_vm"] = int(bag["next_vm"]) + 1
        nt.append(None)
        nr.append(False)
        if not _take(rec, len(rec.slots) - 1, now):
            _drop(rec, len(rec.slots) - 1)  # nothing left to run: the slot is not taken
    return draining


def lose_node(rec: JobRecord, node: str) -> int:
    """``node`` is down (its agent fenced its VMs): the bag's workers there are gone, and the tasks they
    ran go back to be handed to other workers first (their results, if any, were never reported). A
    task runs on at most one worker at a time: vmctld declares a node down only after its agent paused
    its VMs (``loop.fence_s``). Returns how many workers were lost."""
    bag = rec.bag
    assert bag is not None
    lost = [i for i, s in enumerate(rec.slots) if s.node == node]
    for i in reversed(lost):
        k = bag["task"][i]
        if k is not None:
            t = rec.tasks[k]
            t["worker"] = t["start"] = None
            rec.changed_tasks.add(k)
            bag.setdefault("retry", []).append(k)
        _drop(rec, i)
    bag.get("retry", []).sort()
    return len(lost)


def stop(rec: JobRecord, why: str) -> None:
    """The job stops (cancelled, killed, requeued): its workers are gone, and a task one of them ran
    has no result but ``error`` = ``why`` (requeued with its results kept: it is handed out again)."""
    bag = rec.bag
    assert bag is not None
    for k in bag["task"]:
        if k is not None:
            rec.tasks[k]["error"] = why
            rec.changed_tasks.add(k)
            bag.setdefault("retry", []).append(k)
    bag.get("retry", []).sort()
    bag["vms"], bag["task"], bag["release"] = [], [], []


def _drop(rec: JobRecord, i: int) -> None:
    bag = rec.bag
    assert bag is not None
    del rec.slots[i], bag["vms"][i], bag["task"][i], bag["release"][i]


def observe(rec: JobRecord, vm_number: int, v: VmObserved, now: float) -> bool:
    """A report of worker VM ``vm_number``: record the end of its task and hand it the next one (or
    release it). True when the record changed."""
    bag = rec.bag
    assert bag is not None
    try:
        i = bag["vms"].index(vm_number)
    except ValueError:
        return False  # a worker that already left
    k = bag["task"][i]
    if k is None:
        return False
    t = rec.tasks[k]
    if v.power is PowerState.CRASHED:  # the task is lost with its VM (the agent restarts the VM)
        t["exit_status"], t["error"] = -1, "VM crashed"
    elif v.process_job == rec.id and v.process_index == k and v.process_exit is not None:
        t["exit_status"] = int(v.process_exit)
    else:
        return False  # still running, or the agent has not started this task yet
    t["end"] = now
    rec.changed_tasks.add(k)
    work = float(rec.spec["shape"]["tasks"][k])
    took = now - float(t["start"])
    if t["exit_status"] == 0 and work > 0 and took > 0:
        rate = work / took
        old = bag["rate"].get(t["worker"])
        bag["rate"][t["worker"]] = rate if old is None else RATE_WEIGHT * rate + (1 - RATE_WEIGHT) * old
    if bag["release"][i] or not _take(rec, i, now):
        _drop(rec, i)
    return True


def finished(rec: JobRecord) -> bool:
    """Every task ended (O(workers): a task handed out and no longer running, nor given back, ended)."""
    return rec.bag is not None and tasks_left(rec) == 0


def process(rec: JobRecord, i: int, shape: JobShape, cpu_usage: float) -> ProcessSpec | None:
    """The process worker i runs: its task (the bag's command, or the task's own; the mock backend's
    work is the task's work unless the spec gives ``work_seconds`` for every task). Its CPU usage: the
    task's own ``cpu_usage``, else the shape's ``task_usage`` when it is set (not 1.0: tasks that sleep,
    as the simulator's task-bag model runs them), else ``cpu_usage`` (the job's)."""
    bag = rec.bag
    assert bag is not None
    k = bag["task"][i]
    if k is None:
        return None
    per_task = rec.spec.get("tasks") or []
    t: dict[str, Any] = per_task[k] if k < len(per_task) else {}
    work = float(t.get("work_seconds", rec.spec.get("work_seconds", shape.tasks[k])))
    return ProcessSpec(job_id=rec.id, index=k, command=str(t.get("command", rec.spec.get("command", ""))),
                       work_seconds=work,
                       cpu_usage=float(t.get("cpu_usage", shape.task_usage if shape.task_usage != 1.0 else cpu_usage)))


def throughput_by_slot(rec: JobRecord,
                       global_core: Callable[[str, int], int | None]) -> dict[tuple[int, int], float] | None:
    """The bag's corrected throughput per (global core, level) slot it holds now, for the view
    (``RunningJob.throughput``); None when no task ended on any of them yet."""
    bag = rec.bag
    if bag is None or not bag["rate"]:
        return None
    out: dict[tuple[int, int], float] = {}
    for s in rec.slots:
        node, core, level = s.node, s.wire_core, s.level
        rate = bag["rate"].get(worker_id(node, core, level))
        g = global_core(node, core)
        if rate is not None and g is not None and rate > 0 and math.isfinite(rate):
            out[(g, level)] = float(rate)
    return out or None


def workers_doc(rec: JobRecord) -> list[dict[str, Any]]:
    """The workers a bag holds (what the client is told): id, node, core, the task it runs, whether
    it leaves at its task boundary, and the job's corrected throughput there (None: no task ended)."""
    bag = rec.bag
    if bag is None:
        return []
    out = []
    for i, s in enumerate(rec.slots):
        node, core, level = s.node, s.wire_core, s.level
        wid = worker_id(node, core, level)
        rate = bag["rate"].get(wid)
        out.append({"id": wid, "node": node, "core": core, "level": level, "task": bag["task"][i],
                    "leaving": bool(bag["release"][i]),
                    "throughput": None if rate is None or not math.isfinite(rate) else float(rate)})
    return out
