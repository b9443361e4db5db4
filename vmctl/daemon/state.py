"""The daemon's in-memory cluster state and the ``ClusterView`` a policy sees.

``ClusterState`` holds every job, node and open operation (loaded from the store at start, written
through on every change) plus what the agents last reported (``observed``, memory only: agents
report their full state again after a daemon restart). Per-node desired state is *derived* from the
job records' slots (``vmctl.daemon.desired``), and so is the policy's ``ClusterView``
(``vmctl.daemon.view``): restoring the records restores both.

Core numbering: nodes sorted by name, each contributing ``cores`` consecutive global indexes
(``Layout``). Cores of nodes that are not ``ready`` are in the view but not ``usable``.

Progress of a running job (dedicated-core seconds received in the current run) is a model, since a
real guest does not report it: ``progress_base`` (work up to ``tier_since``) plus the elapsed time
times the pace: 1 in fg, and in bg the simulator's progress model (:mod:`vmctl.progress`, MEASY sec.
3.2: ``beta * min(1, (1 - u_fg) / u_bg)``, 0 above the 96 % threshold, full pace where the core's fg
slot is idle) with the fg utilization the agents measure, the bg job's estimated usage as ``u_bg``, the
model's expected beta for the job's size and no loss (``bg_pace``).
"""

from __future__ import annotations

import bisect
import heapq
import math
import re
from collections import deque
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from types import MappingProxyType
from typing import Any, ClassVar

from vmctl.cpushare import shared_rate
from vmctl.daemon.config import DAEMON_SHAPES
from vmctl.model import Discipline, Job, JobShape, JobState, NodeLayout, SliceSchedule
from vmctl.nodedoc import NodeObserved, PowerState, VmDesired
from vmctl.policies.base import Offer
from vmctl.progress import ProgressModel
from vmctl.shapes import job_shape
from vmctl.store.base import JobRecord, NodeRecord, OperationRecord

ACTIVE = (JobState.RUNNING, JobState.SUSPENDED)
TERMINAL = (JobState.DONE, JobState.KILLED, JobState.FAILED, JobState.CANCELLED)
_CORE_REF = re.compile(r"\bcore (\d+)\b")
#: the levels of a core vmctld places jobs on under the priority discipline: 0 and 1 (fg/bg VMs in desired
#: state); a timeslice cluster's jobs go on every registered row (``placeable_levels``)
DAEMON_LEVELS = 2
#: the progress model vmctld shares with the simulator (the paper's parameters)
PROGRESS = ProgressModel()
_BETA: dict[bool, float] = {}  # PROGRESS.expected_beta of one process (False) and of several (True)
_NO_UTIL = object()
_LEVELS = attrgetter("levels")
_DISCIPLINE = attrgetter("discipline")
VM_NAME = re.compile(r"^j(?P<job>[A-Za-z0-9_.-]+?)-r(?P<run>\d+)-p(?P<index>\d+)$")


@dataclass(frozen=True, slots=True)
class Layout:
    names: tuple[str, ...]
    offset: dict[str, int]
    cores: dict[str, int]
    total: int
    node_of_core: tuple[str, ...]
    local_core: tuple[int, ...]

    @classmethod
    def build(cls, nodes: Iterable[NodeRecord]) -> Layout:
        names = tuple(sorted(n.name for n in nodes))
        by = {n.name: n for n in nodes}
        offset: dict[str, int] = {}
        node_of: list[str] = []
        local: list[int] = []
        total = 0
        for name in names:
            offset[name] = total
            c = by[name].cores
            node_of.extend([name] * c)
            local.extend(range(c))
            total += c
        return cls(names, offset, {n: by[n].cores for n in names}, total, tuple(node_of), tuple(local))

    def name_cores(self, text: str) -> str:
        """``text`` with every cluster-wide ``core N`` written as ``core node:local`` (what an operator
        reads; global core numbers move when nodes come and go)."""
        def named(m: re.Match[str]) -> str:
            c = int(m.group(1))
            return f"core {self.node_of_core[c]}:{self.local_core[c]}" if 0 <= c < self.total else m.group(0)

        return _CORE_REF.sub(named, text)

    def global_core(self, node: str, core: int) -> int | None:
        off = self.offset.get(node)
        if off is None or not 0 <= core < self.cores[node]:
            return None
        return off + core


@dataclass(slots=True)
class DesiredSettings:
    fg_weight: int = 10000
    bg_weight: int = 1
    memory_mib: int = 64
    checkpoint_dir: str = "/var/lib/vmctl/checkpoints"


@dataclass(slots=True)
class ClusterState:
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    ops: dict[str, OperationRecord] = field(default_factory=dict)
    observed: dict[str, NodeObserved] = field(default_factory=dict)
    # node -> (agent time, errors) of its latest report that had errors (memory only, like observed)
    agent_errors: dict[str, tuple[float, tuple[str, ...]]] = field(default_factory=dict)
    # migration_targets() for the layout object it was computed with (a peers change calls nodes_changed)
    _mtargets: tuple[Layout | None, Mapping[str, frozenset[str]] | None] = (None, None)
    # node_attributes() for the layout object it was computed with (a change calls nodes_changed)
    _nattrs: tuple[Layout | None, tuple[Mapping[str, float], Mapping[str, str], Mapping[str, int]] | None] = (
        None, None)
    desired: dict[str, tuple[VmDesired, ...]] = field(default_factory=dict)
    #: timeslice clusters: the row rotation in force (the gang policy's last ``Decision.schedule``,
    #: persisted in kv ``gang.schedule``), and the slice clock each node's current desired generation carries
    slices: SliceSchedule | None = None
    desired_slices: dict[str, SliceSchedule | None] = field(default_factory=dict)
    #: the VM level layout vmctld wants on every node (kv ``cluster.layout``; None: the agents' own
    #: ``layout:`` configs decide, as before any relayout), the one a policy switch in progress lays the
    #: nodes out in (``switch_layout``), and the layout each node's current desired generation carries
    cluster_layout: NodeLayout | None = None
    switch_layout: NodeLayout | None = None
    desired_layout: dict[str, NodeLayout | None] = field(default_factory=dict)
    generation: dict[str, int] = field(default_factory=dict)
    next_seq: int = 1
    next_op: int = 1
    settings: DesiredSettings = field(default_factory=DesiredSettings)
    # The queue, kept sorted incrementally by ``reindex`` (a job enters or leaves it one at a time):
    # (submit_time, seq, id) of every queued job, the same jobs' Job objects at the same positions,
    # and each queued job's entry.
    _qorder: list[tuple[float, int, str]] = field(default_factory=list)
    _qjobs: list[Job] = field(default_factory=list)
    _qentry: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    _qmap: dict[str, Job] = field(default_factory=dict)  # each queued job's Job object (the view's queue_index)
    # the last snapshot handed to a view (queue, queue_index); None once the queue changed
    _qsnap: tuple[list[Job], Mapping[str, Job]] | None = None
    _layout: Layout | None = None
    _node_jobs: dict[str, set[str]] = field(default_factory=dict)
    _job_nodes: dict[str, frozenset[str]] = field(default_factory=dict)
    _job_cache: dict[str, Job] = field(default_factory=dict)
    # moldable and task-bag jobs (spec "shape"): the ids of those queued or active, and each one's parsed
    # shape (the view's ``shapes``; empty, and free, while every job is rigid)
    _shaped: set[str] = field(default_factory=set)
    _shape_cache: dict[str, JobShape] = field(default_factory=dict)
    _util: dict[str, float] = field(default_factory=dict)  # VM name -> last reported utilization
    # node -> VM name -> the CPU time (s) its agent last reported to this daemon (memory only: the host's
    # own accounting, reported again in full after a restart; ``cpu_progress``)
    _cpu: dict[str, dict[str, float]] = field(default_factory=dict)
    #: node -> the jobs with a VM on it, as its agent last reported (present, not absent): a queued job
    #: with one on a node that is not down waits (``lingering``) so that no two runs of a job ever run at once
    _present: dict[str, frozenset[str]] = field(default_factory=dict)
    #: job -> its VMs that were moving when the job was stopped, and the nodes still to hear from: the
    #: sources (until they report the VMs gone) and then the targets (a report after that, without them:
    #: a VM that arrived after the job ended was removed by then). Memory only, like ``observed``.
    in_flight: dict[str, dict[str, Any]] = field(default_factory=dict)
    _reports: int = 0
    _active: set[str] = field(default_factory=set)  # ids of running / suspended jobs
    _active_order: list[str] | None = None  # the same sorted (``active``), None until asked after a change
    # the queued jobs' reasons as the last ``set_queue_reasons`` left them: its default (None: unknown, the
    # next call sets every queued job's), the jobs it named (with their reasons), the jobs that entered the
    # queue (or changed) since, and whether the other queued jobs' records hold that default (``rendered``:
    # a new default is not written to 100,000 records per decision; ``reason_of`` and
    # ``render_queue_reasons`` give it at read time); ``_reason_prev``: the same before the last call
    _reason_default: str | None = None
    _reason_named: dict[str, str] = field(default_factory=dict)
    _reason_stale: set[str] = field(default_factory=set)
    _reason_rendered: bool = True
    # the defaults written since the records were last all rendered (what an unrendered record may hold)
    _reason_past: set[str] = field(default_factory=set)
    _reason_prev: tuple[str | None, dict[str, str], set[str], bool] | None = None
    #: write every queued job's reason at each decision, as before issue 27 (``bench.daemon``'s baseline)
    reasons_written_through: ClassVar[bool] = False
    #: the records are rendered once this many defaults were written without a read (``_reason_past``)
    reasons_past_cap: ClassVar[int] = 256
    # per job, until it changes (reindex) or the layout does: global cores, VM names, estimated usages,
    # whether every process maps to a known core, its slots' levels, the lowest, and whether they are all one
    _static: dict[str, tuple[tuple[int, ...], tuple[str, ...], tuple[float, ...], bool, tuple[int, ...], int, bool]] \
        = field(default_factory=dict)
    # the view's per-core arrays kept between views (``vmctl.daemon.view._Cells``; None: built afresh next
    # time), and the jobs whose part of them may have changed since (their record or their VMs' utilization)
    _vcells: Any = None
    _vdirty: set[str] = field(default_factory=set)
    # retention: every finished job's (end_time, seq, id), and the same entries in a min-heap (oldest end
    # first; an entry no longer in _fentry is stale and skipped when it comes up)
    _fentry: dict[str, tuple[float, int, str]] = field(default_factory=dict)
    _fheap: list[tuple[float, int, str]] = field(default_factory=list)

    # ------------------------------------------------------------------ loading
    def load(self, jobs: Iterable[JobRecord], nodes: Iterable[NodeRecord], ops: Iterable[OperationRecord],
             desired: dict[str, tuple[int, tuple[VmDesired, ...]]],
             slices: tuple[SliceSchedule | None, dict[str, SliceSchedule | None]] = (None, {})) -> None:
        self.jobs = {j.id: j for j in jobs}
        self.slices, self.desired_slices = slices[0], dict(slices[1])
        self.nodes = {n.name: n for n in nodes}
        self.ops = {o.id: o for o in ops}
        self.desired = {n: vms for n, (_g, vms) in desired.items()}
        self.generation = {n: g for n, (g, _v) in desired.items()}
        for n in self.nodes.values():
            self.generation[n.name] = max(self.generation.get(n.name, 0), n.generation)
        self.next_seq = max((j.seq for j in self.jobs.values()), default=0) + 1
        nums = [int(o.id[2:]) for o in self.ops.values() if o.id.startswith("op") and o.id[2:].isdigit()]
        self.next_op = max(nums, default=0) + 1
        self._layout = None
        self._node_jobs = {}
        self._job_nodes = {}
        self._job_cache = {}
        self._shaped, self._shape_cache = set(), {}
        self._active = set()
        self._active_order = None
        self._reset_queue_reasons()
        self._static = {}
        self._vcells, self._vdirty = None, set()
        self._fentry, self._fheap = {}, []
        # the queue in one sort (inserting the jobs one by one in store order could be quadratic)
        self._qorder = sorted((j.submit_time, j.seq, j.id) for j in self.jobs.values()
                              if j.state == JobState.QUEUED and not j.held)
        self._qjobs = [self.job_obj(self.jobs[e[2]]) for e in self._qorder]
        self._qentry = {e[2]: e for e in self._qorder}
        self._qmap = {j.id: j for j in self._qjobs}
        self._qsnap = None
        for j in self.jobs.values():
            self.reindex(j)  # the queue entries are already in place: no change there

    # ------------------------------------------------------------------ indexes
    def nodes_of(self, job: JobRecord) -> frozenset[str]:
        if job.state not in ACTIVE or not job.slots:
            return frozenset()
        out = {s.node for s in job.slots}
        if job.migrating:
            op = self.ops.get(job.migrating)
            if op is not None:
                out.update(str(m["from"][0]) for m in op.detail.get("moves", []))
        return frozenset(out)

    def reindex(self, job: JobRecord) -> set[str]:
        """Update the node -> jobs index after ``job`` changed; return every node whose desired state
        may have changed (old and new)."""
        self._static.pop(job.id, None)
        self._vdirty.add(job.id)
        old = self._job_nodes.get(job.id, frozenset())
        new = self.nodes_of(job)
        if job.state in ACTIVE:
            if job.id not in self._active:
                self._active.add(job.id)
                self._active_order = None
        elif job.id in self._active:
            self._active.discard(job.id)
            self._active_order = None
        if "shape" in job.spec:
            if job.state in ACTIVE or job.state == JobState.QUEUED:
                self._shaped.add(job.id)
            else:
                self._shaped.discard(job.id)
        for n in old - new:
            self._node_jobs.get(n, set()).discard(job.id)
        for n in new - old:
            self._node_jobs.setdefault(n, set()).add(job.id)
        if new:
            self._job_nodes[job.id] = new
        else:
            self._job_nodes.pop(job.id, None)
        self._index_queue(job)
        self._index_finished(job)
        return set(old | new)

    def _index_queue(self, job: JobRecord) -> None:
        """Keep ``_qorder`` sorted as ``job`` enters, leaves or stays in the queue: O(log n) to find
        the place plus one list move, instead of re-sorting the whole queue after every change."""
        old = self._qentry.get(job.id)
        order, qjobs = self._qorder, self._qjobs
        if job.state == JobState.QUEUED and not job.held:  # a held job waits outside the queue
            entry = (job.submit_time, job.seq, job.id)
            jid = job.id
            if not self._reason_rendered and job.reason in self._reason_past and old is not None \
                    and self._reason_default is not None and jid not in self._reason_stale \
                    and jid not in self._reason_named:
                # left at a default and unchanged by the caller: its record (stored now) gets the one it shows
                job.reason = self._reason_default
            self._reason_stale.add(jid)  # (any change of a queued job may have set its reason)
            if old == entry:
                return
            if old is not None:
                pos = bisect.bisect_left(order, old)
                del order[pos], qjobs[pos]
            pos = bisect.bisect_left(order, entry)
            order.insert(pos, entry)
            obj = self.job_obj(job)
            qjobs.insert(pos, obj)
            self._qentry[job.id] = entry
            self._qmap[job.id] = obj
        elif old is not None:
            pos = bisect.bisect_left(order, old)
            del order[pos], qjobs[pos]
            del self._qentry[job.id], self._qmap[job.id]
        else:
            return
        self._qsnap = None

    # ------------------------------------------------------------------ retention (config ``retention:``)
    def _index_finished(self, job: JobRecord) -> None:
        """Keep the finished-job index up to date as ``job`` becomes (or stops being) finished: O(log n)
        per change, nothing for a change that keeps its entry."""
        old = self._fentry.get(job.id)
        if job.state in TERMINAL:
            entry = (job.end_time if job.end_time is not None else job.submit_time, job.seq, job.id)
            if old == entry:
                return
            self._fentry[job.id] = entry
            heapq.heappush(self._fheap, entry)
            if len(self._fheap) > 2 * len(self._fentry) + 64:  # mostly stale entries: rebuild (amortized O(1))
                self._fheap = list(self._fentry.values())
                heapq.heapify(self._fheap)
        elif old is not None:
            del self._fentry[job.id]

    def finished_count(self) -> int:
        """How many finished jobs (done, killed, failed, cancelled) are in memory."""
        return len(self._fentry)

    def select_prunable(self, now: float, keep_s: float, keep_count: int, limit: int,
                        skip: Container[str] = ()) -> list[JobRecord]:
        """Up to ``limit`` finished jobs to prune, oldest end first: those that ended ``keep_s`` or more
        before ``now``, and the oldest beyond the ``keep_count`` most recent. Never a queued, running or
        suspended job (only finished jobs are in the index), a job in ``skip`` (changed by the event being
        handled and not committed yet), a job an open operation refers to, nor the newest submission (the
        sequence number a restarted daemon continues from is the highest it loads).

        Bounded: looks at no more than ``2 * limit + 16`` heap entries, O(log n) each, plus one pass over
        the open operations when something is due. The chosen jobs leave the heap: ``forget_jobs`` drops
        them once the store has, ``unselect`` puts them back if the store write failed."""
        heap, fentry, jobs = self._fheap, self._fentry, self.jobs
        out: list[JobRecord] = []
        deferred: list[tuple[float, int, str]] = []
        open_ops: set[str] | None = None
        budget = 2 * limit + 16
        cutoff = now - keep_s
        while heap and len(out) < limit and budget > 0:
            budget -= 1
            entry = heap[0]
            if fentry.get(entry[2]) != entry:
                heapq.heappop(heap)  # stale: the job changed or was pruned since
                continue
            if entry[0] > cutoff and len(fentry) - len(out) <= keep_count:
                break  # the oldest left is young enough and the count is within bounds: nothing more is due
            heapq.heappop(heap)
            rec = jobs.get(entry[2])
            if rec is None:
                del fentry[entry[2]]
                continue
            if open_ops is None:
                open_ops = {o.job_id for o in self.ops.values() if o.state == "pending"}
            if rec.id in skip or rec.id in open_ops or rec.migrating or rec.seq >= self.next_seq - 1:
                deferred.append(entry)
                continue
            out.append(rec)
        for entry in deferred:
            heapq.heappush(heap, entry)
        return out

    def unselect(self, recs: Iterable[JobRecord]) -> None:
        """Put jobs chosen by ``select_prunable`` back into the index (their pruning did not happen)."""
        for rec in recs:
            entry = self._fentry.get(rec.id)
            if entry is not None:
                heapq.heappush(self._fheap, entry)

    def forget_jobs(self, recs: Iterable[JobRecord]) -> None:
        """Drop pruned finished jobs from memory: the record and everything cached about it, including
        the last reported utilization of its VMs (every run's)."""
        for rec in recs:
            if self.jobs.get(rec.id) is rec:
                del self.jobs[rec.id]
            self._fentry.pop(rec.id, None)
            self._job_cache.pop(rec.id, None)
            self._shape_cache.pop(rec.id, None)
            self._shaped.discard(rec.id)
            self._static.pop(rec.id, None)
            procs = max(len(rec.tasks), int(rec.spec.get("procs") or 0))
            for run in range(1, rec.run + 1):
                for i in range(procs):
                    self._util.pop(f"j{rec.id}-r{run}-p{i}", None)

    def job_spec_changed(self, job: JobRecord) -> None:
        """``job``'s spec changed (``vmctl job update`` of a queued job): its ``Job`` is built again, in
        the queue too."""
        self._job_cache.pop(job.id, None)
        self._static.pop(job.id, None)
        self._vdirty.add(job.id)
        entry = self._qentry.get(job.id)
        if entry is not None:
            obj = self.job_obj(job)
            self._qjobs[bisect.bisect_left(self._qorder, entry)] = obj
            self._qmap[job.id] = obj
            self._qsnap = None

    def jobs_on(self, node: str) -> list[JobRecord]:
        return [self.jobs[j] for j in sorted(self._node_jobs.get(node, ()))]

    def layout(self) -> Layout:
        if self._layout is None:
            self._layout = Layout.build(self.nodes.values())
        return self._layout

    def nodes_changed(self) -> None:
        self._layout = None
        self._static.clear()
        self._vcells = None

    def queue(self) -> list[JobRecord]:
        """The queued jobs in queue order: submit time, then submission sequence (held jobs are not in it)."""
        jobs = self.jobs
        return [jobs[e[2]] for e in self._qorder]

    def set_queue_reasons(self, reasons: Mapping[str, str], default: str) -> None:
        """Every queued job's reason: its entry of ``reasons``, else ``default`` (a decision's). Written to
        the records: the jobs named now or by the last call, and those that entered the queue (or changed)
        since; the others' records keep the default they last held, and ``reason_of`` (or, for many,
        ``render_queue_reasons``) gives the current one. A default names the moving shadow time (EASY's
        "would delay the reservation of 7 at t=..."): writing it to every queued record cost 24-28 ms of a
        decision at 100,000 queued (issue 27). After a load (``_reason_default`` None) every queued job's
        record is written, in one C-level pass."""
        jobs = self.jobs
        queued = self._qentry
        self._reason_prev = prev = (self._reason_default, self._reason_named, self._reason_stale,
                                    self._reason_rendered)
        if self._reason_default is None:
            deque(map(setattr, map(jobs.__getitem__, queued), repeat("reason"), repeat(default)), maxlen=0)
            rendered = True
        else:
            rendered = self._reason_rendered and default == self._reason_default
            for jid in self._reason_stale | (self._reason_named.keys() - reasons.keys()):
                if jid in queued:
                    jobs[jid].reason = default
        # a job named with the same reason as last time, unchanged since, holds it already: FCFS names every
        # queued job when none can ever fit (no node yet), 20,000 records written per decision while
        # submissions came in (issue 27). (The names of jobs no longer queued are kept, and never read.)
        last, stale = self._reason_named, self._reason_stale
        for jid, why in reasons.items():
            if (last.get(jid) != why or jid in stale) and jid in queued:
                jobs[jid].reason = why
        named = dict(reasons)
        self._reason_default, self._reason_named, self._reason_stale = default, named, set()
        self._reason_rendered = rendered
        if not rendered:
            past = self._reason_past
            past.add(default)
            if prev[0] is not None:
                past.add(prev[0])  # (what the records left at the last default hold)
            if len(self._reason_past) > self.reasons_past_cap or self.reasons_written_through:
                self.render_queue_reasons()

    def reason_of(self, job: JobRecord) -> str | None:
        """``job``'s reason as operators see it: a queued job left at the last decision's default has that
        default (its record may hold an earlier one: ``set_queue_reasons``), any other job its record's."""
        d = self._reason_default
        if d is None or self._reason_rendered:
            return job.reason
        jid = job.id
        if jid in self._qentry and jid not in self._reason_named and jid not in self._reason_stale:
            return d
        return job.reason

    def render_queue_reasons(self) -> None:
        """Write the last decision's default into the records of the queued jobs left at it (before a job
        list reads the records): one C-level pass over the queue, at most once per decision, on a read."""
        d = self._reason_default
        if d is None or self._reason_rendered:
            return
        jobs, queued = self.jobs, self._qentry
        own = {jid: jobs[jid].reason for jid in self._reason_stale if jid in queued}
        deque(map(setattr, map(jobs.__getitem__, queued), repeat("reason"), repeat(d)), maxlen=0)
        for jid, why in self._reason_named.items():
            if jid in queued:
                jobs[jid].reason = why
        for jid, mine in own.items():
            jobs[jid].reason = mine
        self._reason_rendered = True
        self._reason_past = set()

    def forget_queue_reasons(self) -> None:
        """The caller put the queued jobs' records back as they were before the last ``set_queue_reasons``
        (an operator action keeps the waiting reasons as they were: ``OperatorActions``): the reasons are
        again those before that call. Without one since the load, the next call writes every queued job's."""
        prev = self._reason_prev
        if prev is None:
            self._reset_queue_reasons()
            return
        self._reason_default, self._reason_named, stale, self._reason_rendered = prev
        self._reason_stale = stale | self._reason_stale
        self._reason_prev = None
        # (the records as they were may hold defaults that ``_reason_past`` no longer names, if that call
        # rendered them: they are rendered now, once per operator action)
        self.render_queue_reasons()

    def _reset_queue_reasons(self) -> None:
        """No reason known (a load): the next ``set_queue_reasons`` writes every queued job's."""
        self._reason_default = None
        self._reason_named = {}
        self._reason_stale = set()
        self._reason_rendered = True
        self._reason_past = set()
        self._reason_prev = None

    def queue_length(self) -> int:
        return len(self._qorder)

    def queue_jobs(self) -> tuple[list[Job], Mapping[str, Job]]:
        """The queue as ``Job`` objects, and the same jobs by id (a view's ``queue`` and
        ``queue_index``): a fresh list and a read-only map each call, over objects cached until the
        queue changes (a view outlives later changes unaltered)."""
        if self._qsnap is None:
            q = self._qjobs
            self._qsnap = (q.copy(), MappingProxyType(self._qmap.copy()))
        q, index = self._qsnap
        return q.copy(), index

    def job_obj(self, rec: JobRecord) -> Job:
        j = self._job_cache.get(rec.id)
        if j is None:
            j = rec.to_job()
            self._job_cache[rec.id] = j
        return j

    def shape_of(self, rec: JobRecord) -> JobShape | None:
        """The job's shape (moldable, task bag) from its spec, parsed once; None for a rigid job."""
        shape = self._shape_cache.get(rec.id)
        if shape is None:
            shape = job_shape(rec.spec, f"job {rec.id}")
            if shape is not None:
                self._shape_cache[rec.id] = shape
        return shape

    def moldable_work(self, rec: JobRecord) -> float | None:
        """A placed moldable job's work per process: its shape's time at the width it was started with, on
        standard cores (speed 1.0); None for other jobs."""
        shape = self.shape_of(rec)
        width = len(rec.slots)
        if shape is None or shape.kind != "moldable" or not shape.allows(width):
            return None
        return shape.time_at(width)

    def moldable_time(self, rec: JobRecord) -> float | None:
        """A placed moldable job's run time: its work (``moldable_work``, standard cores) over the slowest
        speed of its nodes (``host.speed``; its processes synchronize, the slowest sets the pace); None for
        other jobs."""
        work = self.moldable_work(rec)
        if work is None:
            return None
        speed, _group, _mem = self.node_attributes()
        slowest = min((speed.get(s.node, 1.0) for s in rec.slots), default=1.0)
        return work / slowest

    def run_limit(self, rec: JobRecord) -> float:
        """How long a job may run before it counts as past its estimate: the estimate, or for a moldable
        job the longer of that and its time at its width on its nodes (``moldable_time``: the policy
        chose the width, the user's estimate is the time at ``procs``)."""
        est = float(rec.spec["estimate"])
        t = self.moldable_time(rec)
        return est if t is None else max(est, t)

    def shapes(self) -> dict[str, JobShape]:
        """The view's ``shapes``: job id -> shape of every queued or active moldable or task-bag job."""
        out: dict[str, JobShape] = {}
        for jid in self._shaped:
            shape = self.shape_of(self.jobs[jid])
            if shape is not None:
                out[jid] = shape
        return out

    def active(self) -> list[JobRecord]:
        """The running and suspended jobs in id order (the order sorted once per change of the set: every
        event's view and decision asks, 10,000+ jobs at issue 27's size)."""
        order = self._active_order
        if order is None:
            order = self._active_order = sorted(self._active)
        return list(map(self.jobs.__getitem__, order))

    def set_observed(self, obs: NodeObserved) -> None:
        self.observed[obs.node] = obs
        jobs = set()
        for v in obs.vms:
            if v.power is not PowerState.ABSENT and v.name.startswith("j"):
                parsed = parse_vm_name(v.name)
                if parsed is not None:
                    jobs.add(parsed[0])
        self._present[obs.node] = frozenset(jobs)
        if obs.errors:
            self.agent_errors[obs.node] = (obs.time, obs.errors)
        util = self._util
        for v in obs.vms:
            if util.get(v.name, _NO_UTIL) != v.utilization:  # the view's fg utilization of its job changes
                util[v.name] = v.utilization
                parsed = parse_vm_name(v.name)
                if parsed is not None:
                    self._vdirty.add(parsed[0])
        self._cpu[obs.node] = {v.name: v.cpu_time_s for v in obs.vms}
        self._reports += 1
        if self.in_flight:
            self._follow_in_flight(obs)

    def _follow_in_flight(self, obs: NodeObserved) -> None:
        present = {v.name for v in obs.vms if v.power is not PowerState.ABSENT}
        for jid, f in list(self.in_flight.items()):
            if f["vms"] & present:
                continue  # still there (moving, or arrived and not removed yet)
            if obs.node in f["sources"]:
                f["sources"].discard(obs.node)
                if not f["sources"]:
                    f["gone"] = self._reports  # left every source: arrived somewhere, or removed
            elif obs.node in f["targets"] and f["gone"] is not None:
                f["targets"].discard(obs.node)
            if not f["sources"] and not f["targets"]:
                del self.in_flight[jid]

    def stopped_moving(self, job: JobRecord, op: OperationRecord) -> None:
        """``job`` was stopped while ``op`` moved it: follow its VMs until the agents show them gone."""
        vms, sources, targets = set(), set(), set()
        for m in op.detail.get("moves", []):
            if m["from"][0] == m["to"][0]:
                continue
            vms.add(job.vm_name(int(m["index"])))
            sources.add(str(m["from"][0]))
            targets.add(str(m["to"][0]))
        if vms:
            self.in_flight[job.id] = {"vms": vms, "sources": sources, "targets": targets, "gone": None}

    def lingering(self) -> set[str]:
        """Queued jobs that a host still reports a VM of (an earlier run, not removed yet: its agent has
        not applied the change, or a migration brought it to a host after the job ended), on nodes that
        are not down (a down node's jobs were requeued because it stopped answering: its agent fenced
        itself, and it removes them when it comes back), and jobs stopped while they moved until the
        agents showed their VMs gone (``in_flight``: a VM may reach its target after the job was
        requeued, and only the target's next report tells). Such a job is kept from the policy until
        the VM is gone, so two runs of one job never run at the same time."""
        out: set[str] = set()
        for jid, f in self.in_flight.items():
            job = self.jobs.get(jid)
            waiting_on = f["sources"] | f["targets"]
            if job is not None and job.state == JobState.QUEUED and any(
                    (rec := self.nodes.get(n)) is not None and rec.state != "down" for n in waiting_on):
                out.add(jid)
        for node, jobs in self._present.items():
            if not jobs:
                continue
            rec = self.nodes.get(node)
            if rec is None or rec.state == "down":
                continue
            for jid in jobs:
                job = self.jobs.get(jid)
                if job is not None and job.state == JobState.QUEUED:
                    out.add(jid)
        return out

    def vm_util(self, name: str) -> float | None:
        return self._util.get(name)

    def migration_block(self, source: str, target: str, mode: str = "live") -> str | None:
        """Why a process cannot move from node ``source`` to node ``target`` in ``mode`` (live |
        checkpoint), judged from what the source's agent registered; None when it can."""
        if source == target:
            return None
        rec = self.nodes.get(source)
        if rec is None:
            return f"node {source} is unknown"
        if mode == "checkpoint":
            if rec.checkpoint_peers is not None and target not in rec.checkpoint_peers:
                return (f"node {source} cannot send checkpoints to {target}: its agent's config has no "
                        f"checkpoints.hosts.{target}")
        elif rec.peers is not None and target not in rec.peers:
            return f"node {source} cannot reach {target}: its agent's config has no peers.{target}"
        return None

    def migration_targets(self) -> Mapping[str, frozenset[str]] | None:
        """node -> the nodes it can live-migrate to, for the nodes whose agents registered their peers
        (a ``ClusterView.migration_targets``, read-only); None when no node is restricted. Cached until
        the nodes change (``nodes_changed``, also called when a node's peers change)."""
        lay = self.layout()
        if self._mtargets[0] is not lay:
            out = {n.name: frozenset(n.peers) for n in self.nodes.values() if n.peers is not None}
            self._mtargets = (lay, MappingProxyType(out) if out else None)
        return self._mtargets[1]

    def node_attributes(self) -> tuple[Mapping[str, float], Mapping[str, str], Mapping[str, int]]:
        """Each node's speed, group and memory (MiB) as registered by its agent: the view's
        ``node_speed``, ``node_group`` and ``node_mem_mib`` (read-only; cached until the nodes change)."""
        lay = self.layout()
        cached = self._nattrs
        if cached[0] is not lay or cached[1] is None:
            nodes = [self.nodes[n] for n in lay.names]
            cached = (lay, (MappingProxyType({n.name: n.speed for n in nodes}),
                            MappingProxyType({n.name: n.group for n in nodes}),
                            MappingProxyType({n.name: n.memory_mib for n in nodes})))
            self._nattrs = cached
        assert cached[1] is not None
        return cached[1]

    def node_layout(self, name: str) -> NodeLayout:
        """The layout node ``name`` has: what its agent registered or last reported."""
        rec = self.nodes[name]
        return NodeLayout(Discipline(rec.discipline), rec.levels)

    def node_busy(self, name: str) -> bool:
        """Whether a job (running, suspended, migrating to or from it) or an open operation holds node
        ``name``: its layout must not change under it."""
        if self._node_jobs.get(name):
            return True
        return any(o.state == "pending" and name in {str(h) for h in o.detail.get("hosts", ())}
                   for o in self.ops.values())

    def wanted_layout(self, name: str) -> NodeLayout | None:
        """The layout node ``name``'s desired state asks for (``NodeDesired.layout``): during a policy
        switch the new layout once the node holds no job, else the cluster's; the node's own layout while
        jobs hold it (their VMs were placed in it); None while vmctld never laid the cluster out (the
        agents' configs decide)."""
        target = self.switch_layout or self.cluster_layout
        if target is None or name not in self.nodes:
            return None
        if self.node_busy(name):
            return self.node_layout(name)
        return target

    def layout_ready(self, name: str) -> bool:
        """Whether node ``name`` carries the cluster's layout (always, while vmctld sets none): a node
        that does not is not usable until its agent reports it re-laid out."""
        return self.cluster_layout is None or self.node_layout(name) == self.cluster_layout

    def cluster_levels(self) -> tuple[int, Discipline]:
        """The VM level layout of the cluster: the one vmctld lays it out in (``cluster_layout``), else
        the levels per core and discipline its agents registered (``register_node`` keeps every node's
        equal: a mixed cluster is refused); with no node, the MEASY fg/bg pair vmctld places jobs on."""
        if self.cluster_layout is not None:
            return self.cluster_layout.levels, self.cluster_layout.discipline
        if not self.nodes:
            return DAEMON_LEVELS, Discipline.PRIORITY
        first = self.nodes[min(self.nodes)]
        return first.levels, Discipline(first.discipline)

    def layout_problem(self, name: str, levels: int, discipline: Discipline) -> str | None:
        """Why node ``name`` cannot (re)register with this level layout, or None. A cluster has one
        layout, the one its nodes share (``ClusterView`` has one ``levels``/``discipline``): a node whose
        layout differs from the other nodes' is refused (not treated per group: the policy sees one view);
        the priority discipline has exactly 2 levels in the model (fg, bg); and a node keeps its layout
        while jobs run on it. None whenever vmctld lays the cluster out (``cluster_layout`` or a switch):
        the node's desired state tells its agent the layout to take."""
        if self.cluster_layout is not None or self.switch_layout is not None:
            return None
        if discipline is Discipline.PRIORITY and levels != 2:
            return (f"registers {levels} priority level{'s' if levels != 1 else ''} per core, but vmctld's priority "
                    f"discipline has 2 (fg, bg): set layout.levels: 2, or use the shared or timeslice discipline")
        mine = (levels, discipline.value)
        # register_node calls this for every node: one C-level pass over the records (sorting every name,
        # as before, made registering N nodes O(N^2 log N) and took most of a 10,000-node setup); the
        # differing names, usually none, are then found and sorted
        recs = self.nodes.values()
        differ: list[str] = []
        if any(map(mine.__ne__, zip(map(_LEVELS, recs), map(_DISCIPLINE, recs), strict=True))):
            differ = sorted(n for n, r in self.nodes.items() if (r.levels, r.discipline) != mine and n != name)
        if differ:
            o = self.nodes[differ[0]]
            shown = ", ".join(differ[:5]) + (" ..." if len(differ) > 5 else "")
            return (f"registers {levels} {discipline.value} levels per core, but node(s) {shown} carry {o.levels} "
                    f"{o.discipline} levels: a vmctld cluster has one level layout (give every agent the same "
                    f"layout.levels and layout.discipline, or let vmctld lay the cluster out: vmctl policy set "
                    f"POLICY --relayout)")
        rec = self.nodes.get(name)
        if rec is not None and (rec.levels, rec.discipline) != mine and self.jobs_on(name):
            return (f"cannot change its level layout from {rec.levels} {rec.discipline} to {levels} "
                    f"{discipline.value} while jobs run there (drain it first, or let vmctld lay the cluster out: "
                    f"vmctl policy set POLICY --relayout)")
        return None

    def offer(self) -> Offer:
        """What the registered cluster offers a policy (``Offer.check``): its discipline, and its levels
        as far as vmctld places jobs on them (levels 0 and 1: fg/bg in desired state)."""
        return levels_offer(*self.cluster_levels())

    # ------------------------------------------------------------------ progress
    def pace(self, job: JobRecord, fg_util: list[float] | None = None) -> float:
        if job.state != JobState.RUNNING or job.suspended or job.checkpointed or job.migrating:
            return 0.0
        if job.gang:
            return row_pace(job, self.slices)
        if job.shared:
            return shared_rate(job.cap, self.job_obj(job).cpu_need)
        if job.lowest_level == 0:
            return 1.0
        # bg: the shared progress model, with what the fg VMs of its cores use
        usages: list[float | None] = []
        for n, c in job.placement:
            fg_owner = self.fg_owner(n, c)
            if fg_owner is None:
                usages.append(None)
                continue
            o = self.jobs[fg_owner]
            idx = next((i for i, p in enumerate(o.placement) if p == (n, c)), 0)
            u = self.vm_util(o.vm_name(idx))
            usages.append(self.job_obj(o).usage_of(idx) if u is None else u)
        return bg_pace(self.job_obj(job), usages)

    def progress(self, job: JobRecord, now: float) -> float:
        if job.tier_since is None:
            return job.progress_base
        return job.progress_base + max(0.0, now - job.tier_since) * self.pace(job)

    # ------------------------------------------------------------------ the estimate's own account
    def cpu_progress(self, job: JobRecord) -> float | None:
        """The job's progress as its hosts account for it: over its processes, the smallest CPU time the
        agent of the process's node last reported to this daemon for its VM, over the process's
        estimated usage (a process that uses half a core progresses one second per half CPU second).
        None while some process's VM has not been reported to this daemon (after a restart: until its
        agent relisted), and for a task bag (its workers come and go; no estimate kill applies to it)."""
        if not job.slots or job.bag is not None:
            return None
        o = self.job_obj(job)
        least = math.inf
        for i, node in enumerate(s.node for s in job.slots):
            cpu = self._cpu.get(node, {}).get(job.vm_name(i))
            if cpu is None:
                return None
            least = min(least, cpu / max(o.usage_of(i), 1e-3))
        return least

    def estimate_progress(self, job: JobRecord, now: float) -> float:
        """The progress counted against the job's estimate (the timers' "ran past its estimate"). Only
        what the agents observed counts: a fg stint (and a gang job's rows) by its time on the job's own
        cores (pace 1 while it runs there; the timers kill only after every node reported the process
        still running after the limit passed), a bg stint by the CPU time its hosts accounted for it
        since the stint began (``cpu_progress``). Never the modelled bg progress: a daemon that was down
        does not know the share the bg VMs got meanwhile (issue 23: the model credited a job with more
        work than its host gave it, and the promoted job was killed 0.5 s later). A bg stint with no
        report at hand counts 0 (a later kill, never an early one). A record stored before this account
        was kept (``est_base`` None) counts as before, by the model."""
        if job.est_base is None:
            return self.progress(job, now)
        if job.tier_since is None:
            return job.est_base
        if not job.gang and not job.shared and job.lowest_level != 0:  # bg
            cpu = self.cpu_progress(job)
            if cpu is None or job.cpu_mark is None:
                return job.est_base
            # a counter below the mark started again (a VM restored or migrated to a fresh process)
            return job.est_base + (cpu - job.cpu_mark if cpu >= job.cpu_mark else cpu)
        return job.est_base + self.progress(job, now) - job.progress_base

    def close_stint(self, job: JobRecord, now: float) -> None:
        """Carry the estimate's account over a change of tier, pace or place (before ``progress_base``
        and ``tier_since`` move to ``now``): what the stint counted, and the CPU progress it ended at."""
        job.est_base = self.estimate_progress(job, now)
        job.cpu_mark = self.cpu_progress(job)

    def open_run(self, job: JobRecord) -> None:
        """A new run's account starts at zero (its VMs are new: their CPU counters start near 0)."""
        job.est_base = 0.0
        cpu = self.cpu_progress(job)
        job.cpu_mark = 0.0 if cpu is None else cpu

    def fg_owner(self, node: str, core: int) -> str | None:
        for jid in self._node_jobs.get(node, ()):
            j = self.jobs[jid]
            if not j.gang and not j.checkpointed and any(
                    s.node == node and s.core == core and s.level == 0 for s in j.slots):
                return jid
        return None


def placeable_levels(levels: int, discipline: Discipline) -> int:
    """The levels of a core vmctld places jobs on: every registered row of a timeslice cluster (gang
    scheduling), at most ``DAEMON_LEVELS`` (fg, bg) otherwise."""
    return levels if discipline is Discipline.TIMESLICE else min(levels, DAEMON_LEVELS)


def levels_offer(levels: int, discipline: Discipline) -> Offer:
    """What a cluster of ``levels`` per core under ``discipline`` offers a policy in vmctld."""
    placed = placeable_levels(levels, discipline)
    where = (f"vmctld (the registered cluster: {levels} {discipline.value} level{'s' if levels != 1 else ''} "
             f"per core{'' if levels <= placed else f'; vmctld places jobs on {placed} of them'})")
    return Offer(where=where, levels=placed, discipline=discipline, shapes=DAEMON_SHAPES, shared_vms=True)


def source_level(op: OperationRecord, job: JobRecord) -> int:
    """The level a migrating job's processes leave (their source slots stay reserved on it): the row a
    gang job left (``from_level``), else the level of the tier it left (``from_tier``: fg 0, bg 1), else
    the job's own."""
    d = op.detail
    if isinstance(d.get("from_level"), int):
        return int(d["from_level"])
    left = {"fg": 0, "bg": 1}.get(str(d.get("from_tier")))
    if left is not None:
        return left
    return 0 if job.lowest_level is None else min(job.lowest_level, 1)


def row_pace(job: JobRecord, slices: SliceSchedule | None) -> float:
    """Pace of a running gang job (timeslice): the share of the slices in which one of its rows is
    active (row 0 alone while no schedule was given: the agents keep row 0 active). Example: order
    (0, 1, 2), a job in row 1 replicated into row 2: 2/3. Suspended slices are not run time."""
    rows = {job.level, *job.replicas}
    if slices is None:
        return 1.0 if 0 in rows else 0.0
    return sum(1 for r in slices.order if r in rows) / len(slices.order)


def bg_pace(job: Job, fg_usage: Iterable[float | None]) -> float:
    """Pace of a bg job whose process i shares its core with a fg VM using ``fg_usage[i]`` of it (None:
    the core's fg slot is idle): the shared progress model with the expected beta of the job's size and
    no loss (see the module docstring)."""
    multi = job.procs > 1
    beta = _BETA.get(multi)
    if beta is None:  # (the multi-process mean is scipy's clipped normal: computed once, not per bg job and view)
        beta = _BETA[multi] = PROGRESS.expected_beta(job.procs)
    return PROGRESS.bg_job_rate(beta, 0.0, ((job.usage_of(min(i, job.procs - 1)), u) for i, u in enumerate(fg_usage)))


def parse_vm_name(name: str) -> tuple[str, int, int] | None:
    m = VM_NAME.match(name)
    if m is None:
        return None
    return m.group("job"), int(m.group("run")), int(m.group("index"))
