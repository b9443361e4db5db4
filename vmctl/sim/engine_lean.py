"""The simulator's lean loop (issue 27): the main loop of :mod:`vmctl.sim.engine` for runs whose every
fg job advances at rate 1 (the two-tier model off the two-tier architecture: EASY, FCFS, SJF and any
policy run with ``two_tier`` False), with the hot steps of a start and a completion written out in it.

It keeps the very state the two-tier engine keeps (the view's lists and sets, ``Run`` objects, the
completion heap with its versions, lazy snapshots), so it gives the same run, pass by pass: where a step
leaves the common case (a decision the checker's fast path does not take, a bg start, a bg job running,
the fg runs kept per core) it calls the two-tier engine's own method for it. What it saves is the
per-event overhead: no method call for a start (``_apply_starts``, ``_start_fg_now``), a completion
(``_complete``, ``_vacate_two_tier``) or an arrival (``make_job``), no ``cast``, no rate call (a rate-1
run's completion is at start + work), and the loop's state in locals. ``tests/unit/test_sim_lean.py``
compares it with the general loop (``Simulator.lean_loop = False``) job by job and view by view.

Before a pass calls ``decide``, the idle fg set (``view.idle_fg``, the same set object) is rebuilt
when its hash table has grown past 8 slots a member. The profile of EASY over HPC2N put a quarter of
EASY's ``decide`` in ``sorted(view.idle_fg)``: a set whose cores come and go fills its table with
deleted entries (1,024 slots for 64 cores), and walking and sorting it cost 3.7 us a pass; rebuilt from
its sorted members it is small again and iterates nearly in order. Same members, so a policy that sorts
the set (EASY, FCFS, SJF) decides the same; one that walks it unsorted may see another order.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vmctl.model import ClusterView, Decision, Job, StartFg
from vmctl.policies.invariants import check_decision
from vmctl.sim.engine_base import _BG, _FG, EngineBase, _Run

if TYPE_CHECKING:
    from vmctl.sim.workloads.core import UsageColumn

_EPS = 1e-9
_INF = math.inf
# a ``Job`` filled through its slot descriptors (``vmctl.sim.engine._job_maker`` checks the field list)
_JOB_SET = {name: Job.__dict__[name].__set__ for name in ("id", "submit_time", "procs", "estimate", "cpu_usage",
                                                         "priority", "deadline", "user", "mem", "cpu_need")}
_DEFAULTS = Job.__dataclass_fields__


class LeanEngine(EngineBase):
    """The lean loop (a mixin of ``Simulator``)."""

    #: False runs every run through the general loop (the reference the lean loop is tested against)
    lean_loop: bool = True
    _usage_col: UsageColumn | None
    _fg_run_kept: bool
    _decisions: int
    _skipped: int
    _wake: float | None
    n: int
    _rid: Any
    _procs: Any
    _priority: Any
    _user_name: list[str]
    _apply_starts: Callable[[Decision], None]
    _commit_effects: Callable[..., None]
    _start: Callable[..., None]

    def _run_lean(self, on_progress: Callable[[int, int], None] | None, every: int,
                  fast: Callable[[ClusterView, Decision, float], bool]) -> None:
        n = self.n
        submit = self._submit
        heap = self._heap
        heappop, heappush = heapq.heappop, heapq.heappush
        ai = 0
        policy = self.policy  # type: ignore[attr-defined]
        view = self.view
        cpu_info = self.config.cpu_info  # type: ignore[attr-defined]
        next_report = every
        rid, procs, estimate, usage = self._rid, self._procs, self._estimate, self._usage
        priority, user_name = self._priority, self._user_name
        complete, decide, cannot_act = self._complete, policy.decide, policy.cannot_act
        apply_starts, commit, start_other = self._apply_starts, self._commit_effects, self._start
        queue, qkey, qjobs = self._queue, self._qkey, self._qjobs
        runs, pending = self._runs, self._pending
        fg_job, fg_util, fg_run = self._fg_job, self._fg_util, self._fg_run
        first, end, overrun, est_killed = self._first_start, self._end, self._overrun, self._est_killed
        work = self._work
        dirty = self._dirty
        idle_fg = self._idle_fg
        set_add, set_discard, set_update, set_remove_all = (idle_fg.add, idle_fg.discard, idle_fg.update,
                                                            idle_fg.difference_update)
        Run = _Run
        sizeof = sys.getsizeof
        fg = _FG
        new = object.__new__
        js = _JOB_SET
        s_id, s_submit, s_procs, s_est = js["id"], js["submit_time"], js["procs"], js["estimate"]
        s_usage, s_prio, s_deadline, s_user = js["cpu_usage"], js["priority"], js["deadline"], js["user"]
        s_mem, s_need = js["mem"], js["cpu_need"]
        deadline0, mem0, need0 = _DEFAULTS["deadline"].default, _DEFAULTS["mem"].default, _DEFAULTS["cpu_need"].default
        usage_col = self._usage_col
        fill = 0 if usage_col is not None else n
        now = self.now
        passes = skipped = 0
        nones, zeros = [None] * (self.cores + 1), [0.0] * (self.cores + 1)  # type: ignore[attr-defined]
        while True:
            # next event time
            while heap and heap[0][2].version != heap[0][1]:
                heappop(heap)
            t = heap[0][0] if heap else _INF
            if ai < n and submit[ai] < t:
                t = submit[ai]
            wake = self._wake  # (a pass sets it; nothing else does)
            if wake is not None and wake < t:
                t = wake
            if t == _INF:
                break
            if t > now:
                self.now = now = t
            # (1) completions: ``_complete`` with ``_vacate_two_tier`` of a fg run, written out
            due = now + _EPS
            while heap and heap[0][0] <= due:
                _, ver, r = heappop(heap)
                if r.version != ver:
                    continue
                if r.tier is not fg or self._bg_count or self._fg_run_kept:
                    complete(r)
                    continue
                jid = r.job.id
                del runs[jid]
                if pending.pop(jid, None) is None:
                    del self._snaps[jid]
                cores = r.cores
                k = len(cores)
                if k == 1:
                    c = cores[0]
                    fg_job[c] = None
                    fg_util[c] = 0.0
                    set_add(c)
                else:
                    set_update(cores)
                    lo = min(cores)
                    if max(cores) - lo == k - 1:  # a block of consecutive cores (distinct, by the checker): slices
                        fg_job[lo:lo + k] = nones[:k]
                        fg_util[lo:lo + k] = zeros[:k]
                    else:
                        for c in cores:
                            fg_job[c] = None
                            fg_util[c] = 0.0
                r.version = -1
                idx = r.idx
                end[idx] = now
                if usage_col is not None:
                    usage[idx] = None  # type: ignore[call-overload]
                if overrun[idx]:
                    est_killed[idx] = 1
                self._done += 1
            if dirty:
                self._flush_dirty()
            # (2) arrivals (``make_job`` written out; a job after the queue's last one appended)
            while ai < n and submit[ai] <= now:
                if ai >= fill:
                    fill = min(ai + 4096, n)
                    usage[ai:fill] = usage_col.block(ai, fill)  # type: ignore[union-attr]
                jid = str(rid[ai])
                sub = submit[ai]
                job = new(Job)
                s_id(job, jid)
                s_submit(job, sub)
                s_procs(job, procs[ai])
                s_est(job, estimate[ai])
                s_usage(job, usage[ai] if cpu_info else None)
                s_prio(job, priority[ai])
                s_deadline(job, deadline0)
                s_user(job, user_name[ai])
                s_mem(job, mem0)
                s_need(job, need0)
                key = (sub, ai)
                if queue and qkey[queue[-1].id] > key:
                    self._enqueue(ai, job)
                else:
                    qkey[jid] = key
                    qjobs[jid] = job
                    queue.append(job)
                ai += 1
            # (3) one scheduling pass
            passes += 1
            if cannot_act(view):
                skipped += 1
                if dirty:
                    self._flush_dirty()
                self._wake = None
            else:
                if sizeof(idle_fg) > 216 + 128 * len(idle_fg):  # see the module header
                    tmp = sorted(idle_fg)
                    idle_fg.clear()
                    idle_fg.update(tmp)
                decision = decide(view, now)
                if not fast(view, decision, now):
                    commit(decision, check_decision(view, decision, now))
                elif dirty or self._bg_count:
                    apply_starts(decision)
                else:
                    # ``_apply_starts`` with ``_start_fg_now`` of a rate-1 run, written out
                    for act in decision.actions:
                        if type(act) is not StartFg:
                            start_other(act.job_id, _BG, act.cores)  # a StartBg (the fast path took starts only)
                            continue
                        jid = act.job_id
                        if dirty or self._bg_count:
                            start_other(jid, fg, act.cores)
                            continue
                        cores = act.cores
                        idx = qkey[jid][1]
                        if queue[0].id == jid:
                            job = queue.pop(0)
                            del qkey[jid], qjobs[jid]
                        else:
                            job = self._dequeue(jid)
                        run = Run(idx, job, fg, cores, now)
                        runs[jid] = run
                        if first[idx] != first[idx]:  # NaN: first start
                            first[idx] = now
                        k = len(cores)
                        if k == 1:
                            c = cores[0]
                            fg_job[c] = jid
                            fg_util[c] = usage[idx][0]
                            set_discard(c)
                        else:
                            u = usage[idx]
                            lo = min(cores)
                            if max(cores) - lo == k - 1 and u.count(u[0]) == k:
                                # a block of consecutive cores, one usage for all (a trace's 100 %): slices
                                fg_job[lo:lo + k] = [jid] * k
                                fg_util[lo:lo + k] = u
                            else:
                                for c, uc in zip(cores, u, strict=False):
                                    fg_job[c] = jid
                                    fg_util[c] = uc
                            set_remove_all(cores)
                        if self._fg_run_kept:
                            for c in cores:
                                fg_run[c] = run
                        run.rate = 1.0
                        run.placed = False
                        pending[jid] = run  # its snapshot: built when the view is next read
                        version = self._version = self._version + 1
                        run.version = version
                        w = work[idx]
                        heappush(heap, (now + (w if w > 0 else 0.0), version, run))
                    if dirty:
                        self._flush_dirty()
                w = decision.wake_at
                self._wake = w if w is not None and w > due else None
            if on_progress is not None and self._done >= next_report:
                on_progress(self._done, n)
                next_report = self._done + every
        self._decisions += passes
        self._skipped += skipped
