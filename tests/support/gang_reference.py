"""The gang derivation and the gang policies' ``decide`` as they were before issue 27's speed-up: the
reference that the fast :mod:`vmctl.policies.gang_matrix` is checked against (``tests/unit/
test_gang_reference.py`` compares every output of both on random matrices, and ``python -m bench.gang``
runs whole simulations with both in one process, checks that they agree job by job and prints the
ratio of their speeds).

The code is the straightforward one: a matrix of lists walked node by node, the queue converted
whole at every event, every option priced and planned. Keep it as it is: it is the baseline, not
product code (the product is :mod:`vmctl.policies.gang_matrix` and :mod:`vmctl.policies.gang`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vmctl.errors import PolicyNeedsUnmet, ValidationError
from vmctl.model import (
    Action,
    ClusterView,
    Decision,
    Discipline,
    Move,
    Replicate,
    SliceSchedule,
    Start,
    Unreplicate,
)
from vmctl.policies.gang_matrix import GangChoice, GangJob, GangMigration, GangParams, GangStep


class Matrix:
    """A mutable ``rows x nodes`` matrix of job ids; a job holds the same nodes in every row it is in."""

    __slots__ = ("free", "mpl", "nodes", "rows", "rows_of", "where")

    def __init__(self, nodes: int, mpl: int) -> None:
        if nodes < 1:
            raise ValidationError(field="nodes", problem=f"must be >= 1, got {nodes}")
        self.nodes = nodes
        self.mpl = mpl
        self.rows: list[list[str | None]] = [[None] * nodes for _ in range(mpl)]
        self.free: list[int] = [nodes] * mpl
        self.where: dict[str, tuple[int, ...]] = {}
        self.rows_of: dict[str, set[int]] = {}

    def copy(self) -> Matrix:
        m = Matrix(self.nodes, self.mpl)
        m.rows = [list(r) for r in self.rows]
        m.free = list(self.free)
        m.where = dict(self.where)
        m.rows_of = {j: set(rs) for j, rs in self.rows_of.items()}
        return m

    def population(self, row: int) -> int:
        return self.nodes - self.free[row]

    def in_use(self) -> list[int]:
        return [r for r in range(self.mpl) if self.free[r] < self.nodes]

    def jobs_in(self, row: int) -> list[str]:
        seen: dict[str, None] = {}
        for j in self.rows[row]:
            if j is not None:
                seen[j] = None
        return list(seen)

    def free_nodes(self, row: int, exclude: Iterable[int] = ()) -> list[int]:
        skip = set(exclude)
        return [n for n, j in enumerate(self.rows[row]) if j is None and n not in skip]

    def all_free(self, row: int, nodes: Iterable[int]) -> bool:
        cells = self.rows[row]
        return all(cells[n] is None for n in nodes)

    def place(self, job: str, row: int, nodes: tuple[int, ...]) -> None:
        known = self.where.get(job)
        if known is not None and known != nodes:
            raise ValidationError(field=f"job {job}",
                                  problem=f"holds nodes {list(known)} in another row, cannot take {list(nodes)}")
        cells = self.rows[row]
        for n in nodes:
            if cells[n] is not None:
                raise ValidationError(field=f"job {job}", problem=f"row {row} node {n} is taken by {cells[n]}")
        for n in nodes:
            cells[n] = job
        self.free[row] -= len(nodes)
        self.where[job] = nodes
        self.rows_of.setdefault(job, set()).add(row)

    def remove(self, job: str, row: int) -> None:
        cells = self.rows[row]
        nodes = self.where[job]
        for n in nodes:
            cells[n] = None
        self.free[row] += len(nodes)
        rows = self.rows_of[job]
        rows.discard(row)
        if not rows:
            del self.rows_of[job]
            del self.where[job]

    def move_nodes(self, job: str, row: int, nodes: tuple[int, ...]) -> None:
        """Re-place a job that is in ``row`` only onto ``nodes`` of the same row."""
        self.remove(job, row)
        self.place(job, row, nodes)




@dataclass(slots=True)
class Derivation:
    """What :func:`derive` decided: the new matrix, the queued jobs started (``job -> row``), the
    migrations, the reservation of the first blocked job (``(job, row, shadow)``, BGS only; under the
    conservative variant ``reservations`` holds every one, ``(job, row, start)``) and the tasks
    migrated."""

    matrix: Matrix
    started: dict[str, int] = field(default_factory=dict)
    migrations: list[GangMigration] = field(default_factory=list)
    choices: list[GangChoice] = field(default_factory=list)
    reservation: tuple[str, int, float] | None = None
    reservations: list[tuple[str, int, float]] = field(default_factory=list)
    tasks_migrated: int = 0
    steps: list[GangStep] = field(default_factory=list)

    @property
    def capacity_loss(self) -> float:
        """Processor x seconds lost to the migrations chosen (the paper's eqs. 1 and 2)."""
        return sum(c.loss for c in self.choices)


def _pick(matrix: Matrix, row: int, keep: Sequence[int], count: int, exclude: Iterable[int] = ()) -> tuple[int, ...]:
    """``count`` free nodes of ``row``: those of ``keep`` that are free first, then the lowest free."""
    skip = set(exclude)
    cells = matrix.rows[row]
    chosen = [n for n in keep if cells[n] is None and n not in skip][:count]
    if len(chosen) < count:
        taken = set(chosen)
        chosen += [n for n in matrix.free_nodes(row, skip) if n not in taken][: count - len(chosen)]
    return tuple(sorted(chosen))


class _Deriver:
    def __init__(self, matrix: Matrix, jobs: Mapping[str, GangJob], params: GangParams) -> None:
        self.m = matrix
        self.jobs = jobs
        self.p = params
        self.out = Derivation(matrix=matrix)
        self.quota = params.quota

    # -------------------------------------------------------------- migration helpers

    def _budget(self, tasks: int) -> bool:
        return self.quota is None or tasks <= self.quota

    def _spend(self, job: str, phase: str, option: int, loss: float, tasks: int) -> None:
        self.out.choices.append(GangChoice(job, phase, option, loss, tasks))
        self.out.tasks_migrated += tasks
        if self.quota is not None:
            self.quota -= tasks

    def _blockers(self, row: int, nodes: Iterable[int]) -> list[str] | None:
        """The jobs on ``nodes`` of ``row``, or None if one of them is also in another row (it
        cannot move without breaking the same-nodes rule)."""
        cells = self.m.rows[row]
        found: dict[str, None] = {}
        for n in nodes:
            j = cells[n]
            if j is not None:
                if self.m.rows_of[j] != {row}:
                    return None
                found[j] = None
        return list(found)

    def _clear_plan(self, row: int, nodes: tuple[int, ...], blockers: list[str]) -> dict[str, tuple[int, ...]] | None:
        """New nodes in ``row`` for each blocker, outside ``nodes`` (option 1), or None."""
        m = self.m
        keep_out = set(nodes)
        pool = set(m.free_nodes(row, keep_out))
        for j in blockers:
            pool.update(n for n in m.where[j] if n not in keep_out)
        plan: dict[str, tuple[int, ...]] = {}
        for j in blockers:
            own = [n for n in m.where[j] if n in pool]
            size = len(m.where[j])
            chosen = own[:size]
            if len(chosen) < size:
                rest = sorted(pool.difference(own))
                chosen += rest[: size - len(chosen)]
            if len(chosen) < size:
                return None
            pool.difference_update(chosen)
            plan[j] = tuple(sorted(chosen))
        return plan

    def _apply_clear(self, row: int, plan: dict[str, tuple[int, ...]], phase: str) -> None:
        m = self.m
        old = {j: m.where[j] for j in plan}
        for j in plan:
            m.remove(j, row)
        for j, nodes in plan.items():
            m.place(j, row, nodes)
            self.out.migrations.append(GangMigration(j, old[j], nodes, phase))
        # A blocker's new nodes are free nodes or old nodes of blockers planned *after* it (each keeps
        # its own nodes outside A's, so none takes an earlier one's): one by one, the last goes first.
        for j in reversed(plan):
            self.out.steps.append(GangStep("move", j, row, plan[j], row, old[j]))

    # -------------------------------------------------------------- the four steps

    def compact(self) -> None:
        m = self.m
        order = sorted(m.in_use(), key=lambda r: (m.population(r), r))
        for i, r in enumerate(order):
            for a in sorted(m.jobs_in(r), key=lambda j: (len(m.where[j]), self.jobs[j].order, j)):
                if r not in m.rows_of.get(a, ()):
                    continue
                targets = sorted(order[i + 1:], key=lambda p: (-m.population(p), p))
                for p in targets:
                    if self._move(a, r, p):
                        break

    def _move(self, a: str, r: int, p: int) -> bool:
        m = self.m
        nodes = m.where[a]
        size = len(nodes)
        if m.all_free(p, nodes):
            m.remove(a, r)
            m.place(a, p, nodes)
            self.out.steps.append(GangStep("move", a, p, nodes, r, nodes))
            return True
        if not self.p.migration or m.free[p] < size:
            return False
        blockers = self._blockers(p, nodes)
        c = self.p.cost
        options: list[tuple[float, int, int]] = []  # (loss, tasks, -option) : lowest wins; ties -> option 2
        plan: dict[str, tuple[int, ...]] | None = None
        if blockers is not None:
            moved = sum(len(m.where[j]) for j in blockers)
            plan = self._clear_plan(p, nodes, blockers)
            if plan is not None and self._budget(moved):
                options.append((c / 2 * size + c * moved, moved, -1))
        s_sum = sum(len(m.where[j]) for j in {m.rows[p][n] for n in nodes} if j is not None)
        if self._budget(size):
            options.append((c * size + c / 2 * s_sum, size, -2))
        if not options:
            return False
        loss, tasks, neg = min(options)
        if -neg == 1:
            assert plan is not None
            m.remove(a, r)
            self._apply_clear(p, plan, "compact")
            m.place(a, p, nodes)  # A keeps its nodes: only the jobs in its way migrate
            self.out.steps.append(GangStep("move", a, p, nodes, r, nodes))
            self._spend(a, "compact", 1, loss, tasks)
            return True
        new = _pick(m, p, nodes, size)
        m.remove(a, r)
        m.place(a, p, new)
        self.out.steps.append(GangStep("move", a, p, new, r, nodes))
        self.out.migrations.append(GangMigration(a, nodes, new, "compact"))
        self._spend(a, "compact", 2, loss, tasks)
        return True

    def schedule(self, queue: Sequence[GangJob]) -> None:
        if self.p.backfill and self.p.conservative:
            self._schedule_conservative(queue)
            return
        m = self.m
        blocked: tuple[GangJob, int, float, int] | None = None  # (job, row, shadow, extra)
        for job in queue:
            rows = m.in_use()
            fits = [r for r in rows if m.free[r] >= job.size]
            if blocked is not None:
                h, hrow, shadow, extra = blocked
                ok = []
                for r in fits:
                    if r != hrow or job.remaining <= shadow or job.size <= extra:
                        ok.append(r)
                fits = ok
            if not fits and len(rows) < m.mpl and blocked is None:
                fits = [next(r for r in range(m.mpl) if r not in rows)]
            if not fits:
                if blocked is None:
                    if not self.p.backfill:
                        return
                    blocked = self._reserve(job)
                    self.out.reservation = (job.id, blocked[1], blocked[2])
                continue
            row = min(fits, key=lambda r: (m.free[r], r))
            if blocked is not None and row == blocked[1] and job.remaining > blocked[2]:
                h, hrow, shadow, extra = blocked
                blocked = (h, hrow, shadow, extra - job.size)
            cells = tuple(m.free_nodes(row)[: job.size])
            m.place(job.id, row, cells)
            self.out.steps.append(GangStep("start", job.id, row, cells))
            self.out.started[job.id] = row

    def _profile(self, row: int) -> list[list[float]]:
        """Row ``row``'s free slots ahead: breakpoints ``[t, free from t on]`` in remaining work, the
        first at 0 with the slots free now; a running job releases its slots at its estimated
        remaining time (one that overran its estimate: just after now, never now)."""
        m = self.m
        releases: dict[float, int] = {}
        for j in m.jobs_in(row):
            t = max(self.jobs[j].remaining, 1e-9)
            releases[t] = releases.get(t, 0) + len(m.where[j])
        prof = [[0.0, float(m.free[row])]]
        free = float(m.free[row])
        for t in sorted(releases):
            free += releases[t]
            prof.append([t, free])
        return prof

    @staticmethod
    def _earliest(prof: list[list[float]], size: int, dur: float) -> float:
        """The first breakpoint from which ``prof`` has ``size`` free slots for ``dur`` (inf: none)."""
        n = len(prof)
        for i in range(n):
            if prof[i][1] < size:
                continue
            start = prof[i][0]
            end = start + dur
            k = i + 1
            while k < n and prof[k][0] < end and prof[k][1] >= size:
                k += 1
            if k == n or prof[k][0] >= end:
                return start
        return math.inf

    @staticmethod
    def _hold(prof: list[list[float]], start: float, dur: float, size: int) -> None:
        """Take ``size`` slots of ``prof`` during ``[start, start + dur)`` (breakpoints added as needed)."""
        end = start + dur
        for t in (start, end):
            if math.isinf(t):
                continue
            idx = next((i for i, (bt, _f) in enumerate(prof) if bt >= t), len(prof))
            if idx == len(prof) or prof[idx][0] != t:
                prof.insert(idx, [t, prof[idx - 1][1]])
        for bp in prof:
            if start <= bp[0] < end:
                bp[1] -= size

    def _schedule_conservative(self, queue: Sequence[GangJob]) -> None:
        m = self.m
        profiles = {r: self._profile(r) for r in m.in_use()}
        depth = self.p.depth
        for job in queue:
            dur = job.remaining
            now = [r for r, prof in profiles.items() if self._earliest(prof, job.size, dur) == 0.0]
            if not now and not self.out.reservations and len(profiles) < m.mpl:
                r = next(r for r in range(m.mpl) if r not in profiles)
                profiles[r] = [[0.0, float(m.nodes)]]
                now = [r]
            if now:
                row = min(now, key=lambda r: (m.free[r], r))
                self._hold(profiles[row], 0.0, dur, job.size)
                cells = tuple(m.free_nodes(row)[: job.size])
                m.place(job.id, row, cells)
                self.out.steps.append(GangStep("start", job.id, row, cells))
                self.out.started[job.id] = row
                continue
            if depth is not None and len(self.out.reservations) >= depth:
                continue
            start, row = min((self._earliest(prof, job.size, dur), r) for r, prof in profiles.items())
            self._hold(profiles[row], start, dur, job.size)
            self.out.reservations.append((job.id, row, start))
            if self.out.reservation is None:
                self.out.reservation = (job.id, row, start)

    def _reserve(self, job: GangJob) -> tuple[GangJob, int, float, int]:
        m = self.m
        best: tuple[float, int, int] | None = None  # (shadow, row, extra)
        for r in m.in_use():
            free = m.free[r]
            shadow = 0.0
            if free < job.size:
                shadow = math.inf
                ending = sorted((self.jobs[j].remaining, len(m.where[j])) for j in m.jobs_in(r))
                for remaining, size in ending:
                    free += size
                    if free >= job.size:
                        shadow = remaining
                        break
            cand = (shadow, r, free - job.size)
            if best is None or cand[:2] < best[:2]:
                best = cand
        assert best is not None  # every row is in use when a job fits nowhere
        return (job, best[1], best[0], best[2])

    def expand(self, order: Sequence[str]) -> None:
        m = self.m
        for a in order:
            if a not in m.where:
                continue
            nodes = m.where[a]
            for p in m.in_use():
                if p in m.rows_of[a]:
                    continue
                if m.all_free(p, nodes):
                    m.place(a, p, nodes)
                    self.out.steps.append(GangStep("replicate", a, p, nodes))
                    continue
                # clearing A's nodes of row p needs, besides them, room in p for the jobs on them: exactly
                # when p has |A| free slots (every occupied one of A's nodes is a blocker's)
                if not self.p.migration or m.free[p] < len(nodes):
                    continue
                blockers = self._blockers(p, nodes)
                if not blockers:
                    continue
                moved = sum(len(m.where[j]) for j in blockers)
                if not self._budget(moved):
                    continue
                plan = self._clear_plan(p, nodes, blockers)
                if plan is None:
                    continue
                self._apply_clear(p, plan, "expand")
                m.place(a, p, nodes)
                self.out.steps.append(GangStep("replicate", a, p, nodes))
                c = self.p.cost
                self._spend(a, "expand", 1, c / 2 * len(nodes) + c * moved, moved)


def collapse(nodes: int, mpl: int, running: Mapping[str, tuple[tuple[int, ...], Iterable[int]]]) -> Matrix:
    """Step 1: a matrix where every running job (``job -> (nodes, rows it is in)``) keeps its nodes and
    its lowest row. Raises ``ValidationError`` if two jobs share a slot or a row is out of range."""
    m = Matrix(nodes, mpl)
    for job, (where, rows) in running.items():
        rows = sorted(rows)
        if not rows:
            raise ValidationError(field=f"job {job}", problem="runs in no row")
        if rows[0] < 0 or rows[-1] >= mpl:
            raise ValidationError(field=f"job {job}", problem=f"row {rows[-1]} outside 0..{mpl - 1}")
        if not where or min(where) < 0 or max(where) >= nodes or len(set(where)) != len(where):
            raise ValidationError(field=f"job {job}",
                                  problem=f"nodes {list(where)} are not distinct nodes of 0..{nodes - 1}")
        m.place(job, rows[0], tuple(sorted(where)))
    return m


def derive(
    nodes: int,
    running: Mapping[str, tuple[tuple[int, ...], Iterable[int]]],
    jobs: Mapping[str, GangJob],
    queue: Sequence[GangJob],
    params: GangParams,
) -> Derivation:
    """The new matrix at a scheduling event (the four steps of the module docstring).

    ``running``: job -> (its nodes, the rows it is in); ``jobs``: a :class:`GangJob` for every running
    job (and optionally the queued ones); ``queue``: the waiting jobs in FCFS order. The input is not
    changed."""
    for q in queue:
        if q.size < 1 or q.size > nodes:
            raise ValidationError(field=f"job {q.id}.size", problem=f"must be 1..{nodes}, got {q.size}")
    known = dict(jobs)
    for q in queue:
        known.setdefault(q.id, q)
    missing = [j for j in running if j not in known]
    if missing:
        raise ValidationError(field=f"job {missing[0]}", problem="runs but has no GangJob record")
    d = _Deriver(collapse(nodes, params.mpl, running), known, params)
    d.compact()
    d.schedule(queue)
    d.expand(sorted(d.m.where, key=lambda j: (known[j].order, j)))
    return d.out


def reference_decide(policy: Any, view: ClusterView, now: float) -> Decision:
    """``policy.decide(view, now)`` as it was (``policy``: a gang policy of :mod:`vmctl.policies.gang`)."""
    self = policy
    mpl = self.params["mpl"]
    if view.discipline is not Discipline.TIMESLICE or view.levels < mpl:
        raise PolicyNeedsUnmet(policy=self.name, where="this cluster",
                               problem=f"needs {mpl} VM levels per core under the timeslice discipline (it has "
                                       f"{view.levels} under {view.discipline.value})")
    slots = view.slot_job
    running: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    jobs: dict[str, GangJob] = {}
    for jid, rj in view.running.items():
        if not rj.cores or slots[rj.level][rj.cores[0]] != jid:
            continue  # checkpointed: holds no slot
        running[jid] = (tuple(sorted(rj.cores)), (rj.level, *rj.replicas))
        jobs[jid] = GangJob(jid, len(rj.cores), rj.job.submit_time, rj.remaining_estimate)
    queue = [GangJob(j.id, j.procs, j.submit_time, j.estimate) for j in view.queue]
    cost = self.params["cost"]
    conservative = self.backfill and self.params["backfill"] == "conservative"
    depth = self.params["depth"] if self.backfill else math.inf
    params = GangParams(mpl=mpl, backfill=self.backfill, migration=self.migration, cost=cost,
                        quota=self._quota(view, now), conservative=conservative,
                        depth=None if depth == math.inf else int(depth))
    d = derive(view.total_cores, running, jobs, queue, params)
    actions: list[Action] = []
    kept = _kept_replicas(running, d.steps)
    for jid, (_nodes, rows) in running.items():
        if len(rows) > 1:
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


def _kept_replicas(running: dict[str, tuple[tuple[int, ...], tuple[int, ...]]],
                   steps: list[GangStep]) -> set[tuple[str, int]]:
    """The replicas that collapse drops and expansion puts back unchanged, with no step in between
    placing anything on their cells: neither their Unreplicate nor their Replicate is emitted (the
    pair would change nothing), so a stable matrix costs no actions."""
    dropped = {(jid, r) for jid, (_n, rows) in running.items() if len(rows) > 1 for r in rows if r != min(rows)}
    if not dropped:
        return set()
    moved = {s.job for s in steps if s.kind == "move"}
    kept: set[tuple[str, int]] = set()
    for i, step in enumerate(steps):
        if step.kind != "replicate" or (step.job, step.row) not in dropped or step.job in moved:
            continue
        cells = set(step.nodes)
        if not any(s.row == step.row and not cells.isdisjoint(s.nodes) for s in steps[:i]):
            kept.add((step.job, step.row))
    return kept
