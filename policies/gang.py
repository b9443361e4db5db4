"""Gang scheduling with and without backfilling and migration: ``gs``, ``gs-m``, ``bgs``, ``bgs-m``.

Paper 004: Zhang, Franke, Moreira, Sivasubramaniam, "The Impact of Migration on Parallel Job
Scheduling for Distributed Systems", sec. 2 (the algorithm) and sec. 3 (T, MPL, C, Q). The matrix
derivation itself is :mod:`vmctl.policies.gang_matrix` (collapse, compact with migration options 1
and 2 priced by eqs. 1-2, FCFS or backfilling from the queue, expansion with replication; its header
states every reading of the derivation). This module reads the matrix out of the view, calls
:func:`~vmctl.policies.gang_matrix.derive` at every scheduling event and turns the result into
actions. Like every policy it is stateless: everything comes from the view (it keeps two caches
between events, a memo of each running job's nodes and the collapsed matrix, ``KeptCollapse``; neither
changes a decision).

The matrix in the view (``timeslice`` discipline). Row r is level r of every core; node n is core n.
A running job sits on ``RunningJob.level`` of its cores and, when replicated, also on the levels of
``RunningJob.replicas`` (same cores). ``gs``/``bgs`` never migrate; ``gs-m``/``bgs-m`` do.

Actions, in this order (the occupancy model checks them one at a time, so the order matters):

1. collapse: ``Unreplicate(job, r)`` for every row of a replicated job but its lowest (sec. 2 step 1),
   except a replica that expansion puts back unchanged with nothing placed on its cells in between
   (then neither its Unreplicate nor its Replicate is emitted: a stable matrix costs no actions);
2. the derivation's steps as it made them (:class:`~vmctl.policies.gang_matrix.GangStep`): a row
   change on the same cores is a ``Move(job, None, row, cost=0)`` (free: the processes stay on their
   nodes), a change of nodes a ``Move(job, cores, row, cost=C)`` (a migration: checkpoint C/2 then
   restart C/2; the simulator stops the job for C seconds of its own slices), a queued job
   ``Start(job, cores, row)``, an expansion ``Replicate(job, row)``;
3. a :class:`~vmctl.model.SliceSchedule` with period T, epoch 0 and the rows in use in increasing
   order (an empty row is left out of the cycle, which is why compaction pays: every other row gets
   its slices more often; every job runs at least once per cycle).

Example (4 cores, MPL 2, ``gs-m``, C = 10; ``tests/unit/test_gang.py``): a on level 0 of cores 0-1, b on
level 1 of core 0, c queued with 2 processes. Collapse changes nothing; compaction moves b to core 2
of row 0 (option 2, eq. 2 = 20 < eq. 1 = 25): ``Move(b, (2,), 0, cost=10)``; row 1 is now empty and c
opens it on cores 0-1; expansion replicates a into row 1 by clearing its cores there (option 1), which
moves c, not yet started, to cores 2-3: c simply starts there, ``Start(c, (2, 3), 1)``, then
``Replicate(a, 1)``; schedule ``SliceSchedule(200, (0, 1))``: a runs in every slice, b and c in every
other.

Parameters: ``mpl`` (rows at most, default 5; the cluster must offer at least that many levels,
else ``policy-needs-unmet`` before the first decision), ``slice`` (T in seconds, default 200),
``cost`` (C, seconds per migration, default 0), ``quota`` (Q, tasks migrated per slice at most,
default ``inf`` = unlimited; 0 = no migration, so ``gs-m`` with Q = 0 behaves as ``gs``). ``bgs`` and
``bgs-m`` also take ``backfill`` (``easy``, the default: one reservation, for the first job that fits
nowhere; ``conservative``: a reservation for every such job, per row, issue 26's variant, see
:mod:`vmctl.policies.gang_matrix` step 3) and ``depth`` (the conservative variant's reservations at
most, default ``inf``).

Readings where the paper leaves a gap:

- T and the execution model: the schedule the policy emits carries T and replaces the model's period
  from the first decision on (``vmctl sim run --slice`` sets the model's period until then and must
  agree with ``slice``: the CLI refuses a mismatch). Slices start at multiples of T from t = 0
  (epoch 0) whatever the events: the rotation is not restarted at every event, so a burst of
  arrivals cannot starve the rows late in the order.
- Q per slice: the view gives every running job the time of its last change of nodes
  (``RunningJob.migrated_at``). The tasks migrated in the current slice ``[kT, now]`` are the widths
  of the running jobs with ``migrated_at >= kT``; a job that migrated in this slice and has ended
  since is no longer counted (an undercount, only for jobs that end within a slice of moving).
  The derivation prices its options against what is left (``GangParams.quota``).
- A job the derivation moves twice in one event (a row change, then another) gets two actions; it
  pays C for each change of nodes, as the derivation's pricing and quota count them.
- A job started in this event and then moved by the derivation (a blocker cleared for an expansion)
  is started where it ends up, at no cost and not counted as a migration by the simulator (nothing
  of it has run: there is nothing to checkpoint); the derivation's own quota still counted its tasks.
  Replaying its Start at the position of its last placement step stays valid: until then its slots
  are only freer than in the derivation.
- The gang policies assume every core is usable (the simulator's case); a running job outside rows
  0 .. mpl-1 is an error (``ValidationError`` from the derivation).
- FCFS order is the queue's order (submit time, then id); running jobs are ordered by submit time
  for compaction ties and expansion.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from vmctl.errors import PolicyNeedsUnmet, PolicyParameterError, ValidationError
from vmctl.model import (
    Action,
    ClusterView,
    Decision,
    Discipline,
    Job,
    Move,
    Replicate,
    SliceSchedule,
    Start,
    Unreplicate,
)
from vmctl.policies.base import Needs, SchedulingPolicy
from vmctl.policies.gang_matrix import (
    GangJob,
    GangParams,
    GangStep,
    KeptCollapse,
    Matrix,
    _checked_mask,
    _mask,
    derive,
)
from vmctl.policies.registry import register

#: the paper's time slice (sec. 3), as ``vmctl.sim.timeslice.DEFAULT_SLICE`` (a policy does not import the
#: simulator)
DEFAULT_SLICE = 200.0
_TIMESLICE = frozenset({Discipline.TIMESLICE})
#: the backfilling variants of ``bgs``/``bgs-m`` (parameter ``backfill``)
BACKFILL_MODES = ("easy", "conservative")
_BACKFILL_PARAMS: dict[str, tuple[type, Any, str]] = {
    "backfill": (str, "easy", "easy: one reservation (the first blocked job); conservative: one for every "
                              "blocked job, per row (issue 26)"),
    "depth": (float, math.inf, "conservative backfilling: reservations at most (inf = every blocked job)"),
}


class _Gang(SchedulingPolicy):
    """The four gang policies; subclasses set ``backfill`` and ``migration``."""

    backfill: ClassVar[bool] = False
    migration: ClassVar[bool] = False
    parameters: ClassVar[dict[str, tuple[type, Any, str]]] = {
        "mpl": (int, 5, "multiprogramming level: rows of the matrix at most (the cluster's timeslice levels)"),
        "slice": (float, DEFAULT_SLICE, "time slice T in seconds"),
        "cost": (float, 0.0, "migration cost C in seconds (checkpoint C/2 + restart C/2); -m policies only"),
        "quota": (float, math.inf, "Q: tasks migrated per time slice at most (inf = unlimited, 0 = none)"),
    }
    needs: ClassVar[Needs] = Needs(levels=5, disciplines=_TIMESLICE)

    def validate_params(self) -> None:
        #: job id -> (its cores tuple, total cores, sorted nodes, checked bit set or -1, GangJob, its last
        #: entry of the derivation's ``running``): see ``decide``
        self._memo: dict[str, tuple[tuple[int, ...], int, tuple[int, ...], int, GangJob,
                                    tuple[tuple[int, ...], tuple[int, ...]]]] = {}
        #: the collapsed matrix of the last event, updated by what changed (a cache, as the memo: the
        #: derivation is the same with or without it; None: collapse every running job at every event)
        self._kept: KeptCollapse | None = KeptCollapse()
        mpl, period, cost, quota = (self.params[k] for k in ("mpl", "slice", "cost", "quota"))
        if mpl < 1:
            raise PolicyParameterError(policy=self.name, param="mpl", problem=f"must be >= 1, got {mpl}")
        if not (period > 0 and math.isfinite(period)):
            raise PolicyParameterError(policy=self.name, param="slice",
                                       problem=f"must be a positive number of seconds, got {period}")
        if not (cost >= 0 and math.isfinite(cost)):
            raise PolicyParameterError(policy=self.name, param="cost", problem=f"must be a finite number >= 0, "
                                                                               f"got {cost}")
        if not (quota >= 0 and (quota == math.inf or float(quota).is_integer())):
            raise PolicyParameterError(policy=self.name, param="quota",
                                       problem=f"must be a whole number of tasks >= 0 or inf, got {quota}")
        if self.backfill:
            mode, depth = self.params["backfill"], self.params["depth"]
            if mode not in BACKFILL_MODES:
                raise PolicyParameterError(policy=self.name, param="backfill",
                                           problem=f"must be one of {', '.join(BACKFILL_MODES)}, got {mode!r}")
            if not (depth >= 0 and (depth == math.inf or float(depth).is_integer())):
                raise PolicyParameterError(policy=self.name, param="depth",
                                           problem=f"must be a whole number of reservations >= 0 or inf, got {depth}")
        # what this instance needs: ``mpl`` levels under the timeslice discipline (checked by the simulator
        # and vmctld before the first decision); an instance attribute, since MPL is a parameter
        object.__setattr__(self, "needs", Needs(levels=mpl, disciplines=_TIMESLICE))

    def _quota(self, view: ClusterView, now: float) -> int | None:
        """Q minus the tasks migrated since the current slice began (None: unlimited)."""
        q = self.params["quota"]
        if not self.migration:
            return None
        if q == math.inf:
            return None
        period = self.params["slice"]
        begin = math.floor(now / period + 1e-9) * period
        used = sum(len(rj.cores) for rj in view.running.values() if rj.migrated_at >= begin - 1e-9)
        return max(0, int(q) - used)

    def decide(self, view: ClusterView, now: float) -> Decision:
        mpl = self.params["mpl"]
        if view.discipline is not Discipline.TIMESLICE or view.levels < mpl:
            raise PolicyNeedsUnmet(policy=self.name, where="this cluster",
                                   problem=f"needs {mpl} VM levels per core under the timeslice discipline (it has "
                                           f"{view.levels} under {view.discipline.value})")
        slots = view.slot_job
        running: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        jobs: dict[str, GangJob] = {}
        masks: dict[str, int] = {}
        replicated: list[str] = []  # the jobs in more than one row
        total = view.total_cores
        view_running = view.running
        # What a running job's nodes mean for the matrix (sorted nodes, checked bit set, its GangJob) is
        # kept from one event to the next while the job holds the same cores tuple (a memo, not state: an
        # entry is used only for the very object it was made from, which it keeps alive).
        memo = self._memo
        for jid, rj in view_running.items():
            cores = rj.cores
            if not cores or slots[rj.level][cores[0]] != jid:
                continue  # checkpointed: holds no slot
            ent = memo.get(jid)
            replicas = rj.replicas
            rows = (rj.level, *replicas) if replicas else (rj.level,)
            if ent is None or ent[0] is not cores or ent[1] != total:
                cells = tuple(sorted(cores))
                ent = (cores, total, cells, _checked_mask(cells, total),
                       GangJob(jid, len(cores), rj.job.submit_time, math.inf), (cells, rows))
                memo[jid] = ent
            elif ent[5][1] != rows:
                ent = (*ent[:5], (ent[2], rows))
                memo[jid] = ent
            # the same entry object while the job keeps its nodes and rows: the kept collapse tells an
            # unchanged job by one identity test
            running[jid] = ent[5]
            if replicas:
                replicated.append(jid)
            if ent[3] >= 0:
                masks[jid] = ent[3]
            jobs[jid] = ent[4]
        if len(memo) > 2 * len(running) + 64:
            self._memo = {j: e for j, e in memo.items() if j in running}
        # only backfilling reads a running job's remaining time, and only of the jobs it looks at
        remaining = (lambda j: view_running[j].remaining_estimate) if self.backfill else None
        # the queue is converted (and checked) as far as the derivation reads it: GS stops at the first job
        # that fits nowhere, so a long queue behind it costs nothing
        queue = _queued(view.queue, total)
        cost = self.params["cost"]
        conservative = self.backfill and self.params["backfill"] == "conservative"
        depth = self.params["depth"] if self.backfill else math.inf
        params = GangParams(mpl=mpl, backfill=self.backfill, migration=self.migration, cost=cost,
                            quota=self._quota(view, now), conservative=conservative,
                            depth=None if depth == math.inf else int(depth))
        d = derive(total, running, jobs, queue, params, checked=True, blocked=_blocked_cells(slots, running, mpl),
                   masks=masks, remaining=remaining, kept=self._kept)
        actions: list[Action] = []
        kept = _kept_replicas(running, d.steps, replicated, d.matrix)
        for jid in replicated:
            rows = running[jid][1]
            keep = min(rows)
            actions.extend(Unreplicate(jid, r) for r in sorted(rows) if r != keep and (jid, r) not in kept)
        # a job started in this event that the derivation then moves (a blocker cleared in expansion)
        # simply starts where it ends up: its Start goes where its last placement step was
        last = {step.job: i for i, step in enumerate(d.steps) if step.kind != "replicate" and step.job in d.started}
        for i, step in enumerate(d.steps):
            if step.kind != "replicate" and step.job in d.started:
                if last[step.job] == i:
                    actions.append(Start(step.job, step.nodes, step.row))
            elif step.kind == "replicate":
                if (step.job, step.row) not in kept:
                    actions.append(Replicate(step.job, step.row))
            elif step.nodes == step.old_nodes:
                actions.append(Move(step.job, None, step.row, 0.0))
            else:
                actions.append(Move(step.job, step.nodes, step.row, cost))
        rows_in_use = tuple(d.matrix.in_use()) or (0,)
        reasons: dict[str, str] = {}
        if d.reservations:
            for jid, row, start in d.reservations:
                reasons[jid] = f"reserved in row {row}, {start:.0f} s of work from now"
        elif d.reservation is not None:
            jid, row, _shadow = d.reservation
            reasons[jid] = f"head of queue: reserved in row {row}"
        return Decision(actions=tuple(actions), reasons=reasons,
                        default_reason="waiting for a row with enough free processors",
                        schedule=SliceSchedule(float(self.params["slice"]), rows_in_use, 0.0))


class _Queued:
    """The queue as :class:`GangJob` s, one at a time; a job wider than the cluster is an error when read.

    ``next_fitting(widest)`` (what backfilling behind a reservation asks for): the next queued job of
    at most ``widest`` tasks, the wider ones passed over without making a :class:`GangJob` of them (a
    long queue behind the reservation is walked at every event; most of it does not fit the holes)."""

    __slots__ = ("_i", "_q", "_total")

    def __init__(self, queue: Sequence[Job], total: int) -> None:
        self._q, self._i, self._total = queue, 0, total

    def __iter__(self) -> Iterator[GangJob]:
        return self

    def __next__(self) -> GangJob:
        job = self.next_fitting(self._total)
        if job is None:
            raise StopIteration
        return job

    def next_fitting(self, widest: int) -> GangJob | None:
        q, i, total = self._q, self._i, self._total
        n = len(q)
        while i < n:
            j = q[i]
            i += 1
            p = j.procs
            if p <= widest:
                self._i = i
                return GangJob(j.id, p, j.submit_time, j.estimate)
            if p > total:
                self._i = i
                raise ValidationError(field=f"job {j.id}.size", problem=f"must be 1..{total}, got {p}")
        self._i = n
        return None


def _queued(queue: Sequence[Job], total: int) -> _Queued:
    return _Queued(queue, total)


def _blocked_cells(slots: tuple[Sequence[str | None], ...],
                   running: dict[str, tuple[tuple[int, ...], tuple[int, ...]]], mpl: int) -> list[tuple[int, int]]:
    """The cells ``(core, level)`` of levels 0 .. mpl-1 that the view shows taken but that no running job
    of the matrix holds: vmctld keeps a migrating job's source slots reserved until the move is
    confirmed (``vmctl.daemon.view``). A level whose taken cells the running jobs account for is not
    walked (the simulator's case: its moves take no time)."""
    held = [0] * mpl
    for cores, rows in running.values():
        for r in rows:
            if r < mpl:
                held[r] += len(cores)
    out: list[tuple[int, int]] = []
    for r in range(min(mpl, len(slots))):
        line = slots[r]
        if len(line) - line.count(None) == held[r]:
            continue
        for c, jid in enumerate(line):
            if jid is None:
                continue
            ent = running.get(jid)
            if ent is None or r not in ent[1] or c not in ent[0]:
                out.append((c, r))
    return out


def _kept_replicas(running: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
                   steps: list[GangStep], replicated: Sequence[str] | None = None,
                   matrix: Matrix | None = None) -> set[tuple[str, int]]:
    """The replicas that collapse drops and expansion puts back unchanged, with no step in between
    placing anything on their cells: neither their Unreplicate nor their Replicate is emitted (the
    pair would change nothing), so a stable matrix costs no actions. ``replicated``: the jobs of
    ``running`` in more than one row, if the caller knows them. ``matrix``: the derived matrix; a
    step whose nodes are the very tuple a job ends up with there takes its bit set from it."""
    if replicated is None:
        replicated = [jid for jid, (_n, rows) in running.items() if len(rows) > 1]
    dropped = {(jid, r) for jid in replicated for rows in (running[jid][1],) for r in rows if r != min(rows)}
    if not dropped:
        return set()
    moved = {s.job for s in steps if s.kind == "move"}
    kept: set[tuple[str, int]] = set()
    placed: dict[int, int] = {}  # row -> the nodes the steps so far placed something on (bit n: node n)
    final_where = matrix.where if matrix is not None else {}
    final_bits = matrix.bits if matrix is not None else {}
    for step in steps:
        nodes = step.nodes
        cells = final_bits[step.job] if final_where.get(step.job) is nodes else _mask(nodes) if nodes else 0
        if step.kind == "replicate" and (step.job, step.row) in dropped and step.job not in moved \
                and not placed.get(step.row, 0) & cells:
            kept.add((step.job, step.row))
        placed[step.row] = placed.get(step.row, 0) | cells
    return kept


@register
class GangScheduling(_Gang):
    name: ClassVar[str] = "gs"
    summary: ClassVar[str] = "gang scheduling on an Ousterhout matrix, FCFS, no migration (paper 004)"


@register
class GangSchedulingMigration(_Gang):
    name: ClassVar[str] = "gs-m"
    summary: ClassVar[str] = "gang scheduling with migration (options 1/2 by eqs. 1-2, quota Q) (paper 004)"
    migration: ClassVar[bool] = True


@register
class BackfillingGangScheduling(_Gang):
    name: ClassVar[str] = "bgs"
    summary: ClassVar[str] = "backfilling gang scheduling: EASY (or conservative) backfilling in the rows (paper 004)"
    backfill: ClassVar[bool] = True
    parameters: ClassVar[dict[str, tuple[type, Any, str]]] = {**_Gang.parameters, **_BACKFILL_PARAMS}
    quiet_params: ClassVar[frozenset[str]] = frozenset(_BACKFILL_PARAMS)


@register
class BackfillingGangSchedulingMigration(_Gang):
    name: ClassVar[str] = "bgs-m"
    summary: ClassVar[str] = "backfilling gang scheduling with migration (paper 004)"
    backfill: ClassVar[bool] = True
    parameters: ClassVar[dict[str, tuple[type, Any, str]]] = {**_Gang.parameters, **_BACKFILL_PARAMS}
    quiet_params: ClassVar[frozenset[str]] = frozenset(_BACKFILL_PARAMS)
    migration: ClassVar[bool] = True
