"""The Ousterhout matrix of gang scheduling and how it is derived at every scheduling event.

Paper 004: Zhang, Franke, Moreira, Sivasubramaniam, "The Impact of Migration on Parallel Job
Scheduling for Distributed Systems" (Euro-Par 2000), sec. 2 ("The Migration Algorithm"). This module
is pure (no view, no actions, no clock): the gang policies (``gs``, ``gs-m``, ``bgs``, ``bgs-m``) read
the current matrix out of the cluster view, call :func:`derive`, and turn the result into actions.

The matrix. ``rows x nodes`` slots; row ``r`` is one time-sliced virtual machine (a VM *level* of the
``timeslice`` discipline), node ``n`` one processor (a core in vmctl). A job of ``size`` tasks holds
``size`` slots of a row, one per node; it may appear in several rows, always on the *same* nodes (the
paper's rule against ping-pong). Rows rotate every time slice T; a job advances in every slice where a
row holding it is active. The number of rows is at most the multiprogramming level (MPL).

Derivation at every event (arrival or departure), sec. 2, four steps:

1. **Collapse**: every running job keeps its nodes and appears in one row only. Reading: the paper
   does not say which row a replicated job keeps; we keep the lowest-numbered row it is in.
2. **Compact**: rows are traversed from the least to the most populated (ties: lower row first),
   inside a row from the smallest to the largest job (ties: FCFS order). Job A of row r moves to a
   row p that comes later in that traversal order (tried from the most populated down, so moves
   pack rows and empty the sparse ones; reading: the paper names the goal, "maximize the number of
   empty slots in some rows", not the target order). Without migration A moves only if all its
   nodes are free in p (a row change is free: the job keeps its nodes). With migration, if row p
   has at least |A| free slots, two options are priced by the capacity loss (processor x seconds):

   - option 1, move the jobs S(A) that sit on A's nodes in row p to other free nodes of p, then put
     A on its own nodes in p: ``C/2 * |A| + C * sum |J|`` (eq. 1);
   - option 2, move A to free nodes of row p: ``C * |A| + C/2 * sum |J|`` (eq. 2);

   and the cheaper feasible one is taken. Ties (always, when C = 0) go to the option that migrates
   fewer tasks, then to option 2 (it disturbs one job): with these formulas that means option 1
   exactly when ``sum |J| < |A|``. A job that moves keeps the nodes it already has where they are
   free, and takes the lowest-numbered free nodes for the rest.
3. **Schedule from the queue** in FCFS order. A job fits a row with at least ``size`` free slots (it
   takes the lowest-numbered free nodes: in a distributed system any nodes do); the existing rows
   are tried first, the most populated first (best fit), and a new row is opened only when none
   fits and fewer than MPL rows are in use. Without backfilling the traversal stops at the first
   job that fits nowhere. With backfilling it goes on, EASY style inside the rows (reading: the
   paper's [18] treats each row as a space-shared machine; it does not give the rule). The first
   job H that fits nowhere gets a reservation in the row where it can start soonest: in each row,
   running jobs are taken in order of estimated remaining time until enough slots are free; that
   time is the row's *shadow time* and the slots left over are its *extra* slots. All rows run at
   the same pace (each gets one slice per cycle), so shadow times measured in remaining work are
   comparable across rows. A later job may start in any other row where it fits; in the reserved
   row only if its estimate ends before the shadow time or it fits in the extra slots (which it then
   uses up). H cannot be delayed: nothing is added to its row that would still run at the shadow
   time beyond the extra slots, and it needs no new row (every row is in use, or H would have fit
   in a new one).

   *Conservative variant* (``GangParams.conservative``; the ``backfill=conservative`` parameter of
   ``bgs``/``bgs-m``). The paper's backfilling gang scheduling ([18], sec. 2 step 3: "if backfilling
   is enabled, we can look past the first job that cannot be scheduled") does not say how many
   reservations a row keeps. Here every job that fits nowhere gets one (Mu'alem and Feitelson's
   conservative backfilling, per row), at most ``depth`` of them: each row keeps a profile of its free
   slots over the coming remaining work (running jobs release their slots at their estimated
   remaining time, reserved jobs hold theirs from their start to start + estimate); a queued job
   starts now in a row only if the profile has ``size`` free slots from now until its estimate ends,
   else it is reserved in the row where the profile first has room for its whole estimate (ties: the
   lower row). A job beyond ``depth`` reservations gets none and may still start now where it
   disturbs no reservation (Maui's RESERVATIONDEPTH; unbounded depth is the literal variant). As the
   derivation is redone at every event, the reservations are too (conservative backfilling with
   compression at every event). A new row is opened only before the first reservation, as above.
   Example (3 nodes, MPL 1): a runs on 2 nodes for 100 s more; queued H (3 tasks, 50 s), J (2 tasks,
   30 s), S (1 task, 500 s). EASY reserves only H (shadow 100, extra 0): J fits nowhere now, and S
   would hold node 2 past 100 s, so neither starts. Conservative: H reserved [100, 150); J needs 2
   slots, which the row has from 150 on: reserved [150, 180); S would hold its slot through 100-150
   where H needs all three: it is reserved from 150 (the slot J leaves). Under EASY J and S just wait,
   and at the next event a later arrival may take what J would have needed; under the conservative
   variant a later job may only use slots none of H, J, S needs. Change S's estimate to 90 s: it ends
   before 100 and starts now under both variants.
4. **Expansion**: running and just started jobs, in FCFS order, are replicated into every other row
   in use where their whole node set is free. With migration, a row where A's nodes are taken by
   jobs that appear in that row only may be cleared by moving those jobs to other free nodes of the
   row (option 1 only, as the paper says). Reading: expansion never opens a new row (the paper fills
   "holes left in the matrix"; an extra row would slow every other job down).

Migration budget. ``quota`` is the number of tasks that may still be migrated in the current time
slice (the paper's Q minus what this slice already moved; None = unlimited): an option that would
migrate more is not feasible. Every option taken is recorded with its capacity loss by eq. (1) or (2)
as the paper defines it (``Derivation.choices``; ``capacity_loss`` is their sum); the simulator stops
a migrated job's progress for C seconds (checkpoint C/2 then restart C/2, dependent operations).

Example (4 nodes, MPL 2, C = 10, migration on): row 0 holds a on nodes {0, 1}, row 1 holds b on
node {0}. Compaction visits row 1 first (1 task) and tries to move b into row 0: node 0 is taken by
a, so without migration nothing moves. With migration row 0 has 2 free slots; option 1 (move a
away, 2 tasks) costs 5 + 20 = 25, option 2 (move b to node 2) costs 10 + 10 = 20: b moves to node 2
of row 0, row 1 is empty, and one task was migrated.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from vmctl.errors import ValidationError


class GangJob(NamedTuple):
    """A job as the matrix sees it: its task count, its FCFS key and its estimated remaining time
    (dedicated seconds; the estimate for a queued job), which only backfilling reads. (A named tuple:
    a policy makes one per running and examined queued job at every event, and a tuple is made
    several times faster than a frozen dataclass.)"""

    id: str
    size: int
    order: float
    remaining: float = math.inf


@dataclass(frozen=True, slots=True)
class GangParams:
    """``mpl``: rows at most; ``backfill``: BGS instead of GS; ``migration``: allow migration (the
    ``-m`` policies); ``cost``: C, seconds per migration; ``quota``: tasks that may still be migrated in
    this slice (None = unlimited; 0 = no migration in effect); ``conservative``: with ``backfill``, a
    reservation for every blocked job (at most ``depth``; None = all) instead of the first one only."""

    mpl: int = 5
    backfill: bool = False
    migration: bool = False
    cost: float = 0.0
    quota: int | None = None
    conservative: bool = False
    depth: int | None = None

    def __post_init__(self) -> None:
        if self.depth is not None and self.depth < 0:
            raise ValidationError(field="depth", problem=f"must be >= 0 or unlimited, got {self.depth}")
        if self.mpl < 1:
            raise ValidationError(field="mpl", problem=f"must be >= 1, got {self.mpl}")
        if not (self.cost >= 0 and math.isfinite(self.cost)):
            raise ValidationError(field="cost", problem=f"must be a finite number >= 0, got {self.cost}")
        if self.quota is not None and self.quota < 0:
            raise ValidationError(field="quota", problem=f"must be >= 0 or unlimited, got {self.quota}")


@dataclass(frozen=True, slots=True)
class GangMigration:
    """One migration: ``job`` goes from ``old_nodes`` to ``new_nodes`` (all its tasks checkpoint and
    restart) during ``phase`` (``compact`` or ``expand``)."""

    job: str
    old_nodes: tuple[int, ...]
    new_nodes: tuple[int, ...]
    phase: str


class GangStep(NamedTuple):
    """One change of the matrix, in the order :func:`derive` made it, so that replaying the steps one by
    one on the collapsed matrix never puts two jobs on one slot (what a policy needs to turn them into
    actions that an occupancy check accepts one at a time). ``move``: ``job`` leaves ``from_row``
    (``old_nodes``) for ``row`` (``nodes``); ``start``: a queued job takes ``nodes`` of ``row``;
    ``replicate``: a running job also takes its own ``nodes`` of ``row``. (A named tuple, as
    :class:`GangJob`.)"""

    kind: str
    job: str
    row: int
    nodes: tuple[int, ...]
    from_row: int = -1
    old_nodes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GangChoice:
    """One priced migration option that was taken: for ``job`` (the job being moved or replicated),
    ``option`` 1 or 2, its capacity loss by eq. (1) or (2), and the tasks it migrated."""

    job: str
    phase: str
    option: int
    loss: float
    tasks: int


class Matrix:
    """A mutable ``rows x nodes`` matrix of job ids; a job holds the same nodes in every row it is in.

    Kept as bit sets, for speed (the derivation rebuilds and walks the whole matrix at every scheduling
    event): ``occ[r]`` is row r's occupied nodes (bit n: node n), ``bits[job]`` a job's nodes, so that a
    slot test is one AND instead of a walk over the job's nodes; ``members[r]`` the jobs in row r,
    ``free[r]`` its free slots, ``where[job]`` a job's nodes (sorted) and ``rows_of[job]`` its rows (a
    set that is replaced, never changed in place: a copy shares them).
    ``rows`` (``rows[r][n]``: the job on node n of row r, or None) is built from them when asked for."""

    __slots__ = ("bits", "blocked", "free", "members", "mpl", "nodes", "occ", "rows_of", "where")

    def __init__(self, nodes: int, mpl: int) -> None:
        if nodes < 1:
            raise ValidationError(field="nodes", problem=f"must be >= 1, got {nodes}")
        self.nodes = nodes
        self.mpl = mpl
        self.free: list[int] = [nodes] * mpl
        self.where: dict[str, tuple[int, ...]] = {}
        self.rows_of: dict[str, set[int]] = {}
        self.occ: list[int] = [0] * mpl
        self.bits: dict[str, int] = {}
        self.members: list[dict[str, None]] = [{} for _ in range(mpl)]
        #: per row, the cells held by a move in flight (bit n: node n): occupied, but by no job of the matrix
        self.blocked: list[int] = [0] * mpl

    def copy(self) -> Matrix:
        m = Matrix(self.nodes, self.mpl)
        m.free = list(self.free)
        m.where = dict(self.where)
        m.rows_of = dict(self.rows_of)  # the sets are shared: the matrix never changes one in place
        m.occ = list(self.occ)
        m.bits = dict(self.bits)
        m.members = [dict(js) for js in self.members]
        m.blocked = list(self.blocked)
        return m

    @property
    def rows(self) -> list[list[str | None]]:
        """``rows[r][n]``: the job on node n of row r, or None (a new list at every call)."""
        out: list[list[str | None]] = [[None] * self.nodes for _ in range(self.mpl)]
        for r, jobs in enumerate(self.members):
            cells = out[r]
            for j in jobs:
                for n in self.where[j]:
                    cells[n] = j
        return out

    def population(self, row: int) -> int:
        return self.nodes - self.free[row]

    def in_use(self) -> list[int]:
        nodes, free = self.nodes, self.free
        return [r for r in range(self.mpl) if free[r] < nodes]

    def jobs_in(self, row: int) -> list[str]:
        """The jobs of ``row`` in the order of their lowest node."""
        where = self.where
        return sorted(self.members[row], key=lambda j: min(where[j]))

    def job_at(self, row: int, node: int) -> str | None:
        """The job on ``node`` of ``row``, or None."""
        bit = 1 << node
        if not self.occ[row] & bit or self.blocked[row] & bit:
            return None
        bits = self.bits
        return next(j for j in self.members[row] if bits[j] & bit)

    def free_nodes(self, row: int, exclude: Iterable[int] = ()) -> list[int]:
        skip = set(exclude)
        occ = self.occ[row]
        return [n for n in range(self.nodes) if not occ >> n & 1 and n not in skip]

    def all_free(self, row: int, nodes: Iterable[int]) -> bool:
        return not self.occ[row] & _mask(tuple(nodes))

    def place(self, job: str, row: int, nodes: tuple[int, ...]) -> None:
        known = self.where.get(job)
        if known is not None:
            if known != nodes:
                raise ValidationError(field=f"job {job}",
                                      problem=f"holds nodes {list(known)} in another row, cannot take {list(nodes)}")
            mask = self.bits[job]
        else:
            mask = _mask(nodes)
        self._put(job, row, nodes, mask)

    def _put(self, job: str, row: int, nodes: tuple[int, ...], mask: int) -> None:
        """Place ``job`` on ``nodes`` (bit set ``mask``) of ``row``; its other rows, if any, hold the same."""
        if self.occ[row] & mask:
            n = next(n for n in nodes if self.occ[row] >> n & 1)
            holder = self.job_at(row, n) or "a move in flight"
            raise ValidationError(field=f"job {job}", problem=f"row {row} node {n} is taken by {holder}")
        self.occ[row] |= mask
        self.free[row] -= len(nodes)
        self.where[job] = nodes
        self.bits[job] = mask
        self.members[row][job] = None
        rows = self.rows_of.get(job)
        # a new set, never one changed in place: copies of the matrix share the sets (``copy``)
        self.rows_of[job] = {row} if rows is None else rows | {row}

    def remove(self, job: str, row: int) -> None:
        self.occ[row] &= ~self.bits[job]
        self.free[row] += len(self.where[job])
        del self.members[row][job]
        rows = self.rows_of[job] - {row}
        if rows:
            self.rows_of[job] = rows
        else:
            del self.rows_of[job]
            del self.where[job]
            del self.bits[job]

    def block(self, row: int, node: int) -> None:
        """Mark ``node`` of ``row`` as held by a move in flight: no job may be placed there."""
        if not (0 <= row < self.mpl and 0 <= node < self.nodes):
            raise ValidationError(field=f"blocked cell (node {node}, row {row})",
                                  problem=f"outside nodes 0..{self.nodes - 1}, rows 0..{self.mpl - 1}")
        bit = 1 << node
        if self.occ[row] & bit:
            holder = self.job_at(row, node)
            if holder is None:
                return  # blocked twice
            raise ValidationError(field=f"blocked cell (node {node}, row {row})", problem=f"job {holder} runs there")
        self.occ[row] |= bit
        self.blocked[row] |= bit
        self.free[row] -= 1

    def relocate(self, job: str, src: int, dst: int, nodes: tuple[int, ...]) -> None:
        """Move a job that is in row ``src`` only to ``nodes`` (sorted) of row ``dst`` (the same row or
        the same nodes allowed)."""
        self.remove(job, src)
        self._put(job, dst, nodes, _mask(nodes))

    def move_nodes(self, job: str, row: int, nodes: tuple[int, ...]) -> None:
        """Re-place a job that is in ``row`` only onto ``nodes`` of the same row."""
        self.remove(job, row)
        self.place(job, row, nodes)


def _mask(nodes: Sequence[int]) -> int:
    """``nodes`` as a bit set (bit n: node n)."""
    size = len(nodes)
    if size and nodes[0] >= 0 and nodes[-1] - nodes[0] + 1 == size and \
            tuple(nodes) == tuple(range(nodes[0], nodes[0] + size)):
        return ((1 << size) - 1) << nodes[0]  # consecutive nodes, the usual case
    if min(nodes, default=0) < 0:
        raise ValidationError(field="nodes", problem=f"node {min(nodes)} is negative")
    return functools.reduce(operator.or_, map((1).__lshift__, nodes), 0)


def _nodes(mask: int) -> tuple[int, ...]:
    """The nodes of a bit set, in increasing order."""
    if not mask:
        return ()
    low = (mask & -mask).bit_length() - 1
    rest = mask >> low
    if not rest & (rest + 1):  # consecutive nodes
        return tuple(range(low, low + rest.bit_length()))
    # the nodes whose digit is 1 in the binary string, lowest bit first (each step in C)
    return tuple(itertools.compress(range(low, low + rest.bit_length()), bin(rest)[:1:-1].encode().translate(_BITS)))


#: ``bytes.translate`` table: the digits "0" and "1" to the bytes 0 and 1 (``itertools.compress``'s selectors)
_BITS = bytes.maketrans(b"01", b"\x00\x01")


def _lowest(mask: int, count: int) -> int:
    """The ``count`` lowest nodes of the bit set ``mask`` (all of them if it has fewer)."""
    if count <= 0 or not mask:
        return 0
    low = mask & -mask
    run = low * ((1 << count) - 1)  # ``count`` consecutive nodes from the lowest one
    if mask & run == run:
        return run
    out = 0
    for _ in range(count):
        if not mask:
            break
        low = mask & -mask
        out |= low
        mask ^= low
    return out


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


def _pick(matrix: Matrix, row: int, keep: int, count: int) -> tuple[int, ...]:
    """``count`` free nodes of ``row``: those of the bit set ``keep`` that are free first (lowest first),
    then the lowest free."""
    free = ~matrix.occ[row] & ((1 << matrix.nodes) - 1)
    chosen = _lowest(keep & free, count)
    short = count - chosen.bit_count()
    if short > 0:
        chosen |= _lowest(free & ~chosen, short)
    return _nodes(chosen)


class _Deriver:
    def __init__(self, matrix: Matrix, jobs: dict[str, GangJob], params: GangParams,
                 remaining: Callable[[str], float] | None = None) -> None:
        self.m = matrix
        self.jobs = jobs
        self.p = params
        self.out = Derivation(matrix=matrix)
        self.quota = params.quota
        #: the running jobs' remaining time, asked for only when backfilling reads it (see ``derive``)
        self._remaining = remaining
        self._rem_seen: dict[str, float] = {}

    def _rem(self, job: str) -> float:
        """The estimated remaining time of a job of the matrix: from ``derive``'s ``remaining`` for a job
        that ran before this event (asked once), else its :class:`GangJob`'s."""
        get = self._remaining
        if get is None or job in self.out.started:
            return self.jobs[job].remaining
        seen = self._rem_seen.get(job)
        if seen is None:
            seen = self._rem_seen[job] = get(job)
        return seen

    # -------------------------------------------------------------- migration helpers

    def _budget(self, tasks: int) -> bool:
        return self.quota is None or tasks <= self.quota

    def _spend(self, job: str, phase: str, option: int, loss: float, tasks: int) -> None:
        self.out.choices.append(GangChoice(job, phase, option, loss, tasks))
        self.out.tasks_migrated += tasks
        if self.quota is not None:
            self.quota -= tasks

    def _blockers(self, row: int, nodes: int) -> list[str] | None:
        """The jobs on the nodes (bit set) ``nodes`` of ``row``, in the order of their lowest node there,
        or None if one of them is also in another row (it cannot move without breaking the same-nodes
        rule)."""
        m = self.m
        bits, rows_of = m.bits, m.rows_of
        found: list[tuple[int, str]] = []
        for j in m.members[row]:
            over = bits[j] & nodes
            if over:
                if len(rows_of[j]) != 1:
                    return None
                found.append((over & -over, j))
        found.sort()
        return [j for _low, j in found]

    def _clear_plan(self, row: int, nodes: int,
                    blockers: list[str]) -> dict[str, tuple[tuple[int, ...], int]] | None:
        """New nodes in ``row`` for each blocker, outside the bit set ``nodes`` (option 1), or None. Each
        blocker keeps its own nodes outside ``nodes`` and takes the lowest of the rest of the pool (the
        row's free nodes and the blockers' nodes, outside ``nodes``), blocker by blocker."""
        m = self.m
        keep_out = ~nodes
        pool = ~m.occ[row] & ((1 << m.nodes) - 1) & keep_out
        bits = m.bits
        for j in blockers:
            pool |= bits[j] & keep_out
        plan: dict[str, tuple[tuple[int, ...], int]] = {}
        where = m.where
        for j in blockers:
            own = bits[j] & pool
            short = len(where[j]) - own.bit_count()
            chosen = own
            if short > 0:
                rest = pool & ~own
                if rest.bit_count() < short:
                    return None
                chosen |= _lowest(rest, short)
            pool &= ~chosen
            plan[j] = (_nodes(chosen), chosen)
        return plan

    def _apply_clear(self, row: int, plan: dict[str, tuple[tuple[int, ...], int]], phase: str) -> None:
        m = self.m
        old = {j: m.where[j] for j in plan}
        for j in plan:
            m.remove(j, row)
        for j, (nodes, mask) in plan.items():
            m._put(j, row, nodes, mask)
            self.out.migrations.append(GangMigration(j, old[j], nodes, phase))
        # A blocker's new nodes are free nodes or old nodes of blockers planned *after* it (each keeps
        # its own nodes outside A's, so none takes an earlier one's): one by one, the last goes first.
        for j in reversed(plan):
            self.out.steps.append(GangStep("move", j, row, plan[j][0], row, old[j]))

    # -------------------------------------------------------------- the four steps

    def compact(self) -> None:
        m = self.m
        free, where, rows_of, jobs, occ, bits = m.free, m.where, m.rows_of, self.jobs, m.occ, m.bits
        migration = self.p.migration
        order = sorted(m.in_use(), key=lambda r: (-free[r], r))  # (population, row)
        for i, r in enumerate(order):
            later = order[i + 1:]
            if not later:
                break
            # A job moves only to a row with at least its size free (the same nodes, or |A| free slots for
            # migration: ``_move``). The later rows only lose free slots while row r is walked (a move
            # fills its target, a clearing moves jobs within it) and r's jobs come smallest first, so the
            # walk stops at the first job wider than every later row's free slots.
            widest = max(free[p] for p in later)
            targets: list[int] | None = None  # the later rows, most populated first (until a move)
            for a in sorted(m.members[r], key=lambda j: (len(where[j]), jobs[j].order, j)):
                if r not in rows_of.get(a, ()):
                    continue
                size = len(where[a])
                if size > widest:
                    break
                if targets is None:
                    targets = sorted(later, key=lambda p: (free[p], p))
                amask = bits[a]
                for p in targets:
                    # (without migration ``_move`` moves only onto free nodes: the test inlined)
                    if free[p] >= size and (migration or not occ[p] & amask) and self._move(a, r, p):
                        targets = None  # populations changed
                        widest = max(free[q] for q in later)
                        break

    def _move(self, a: str, r: int, p: int) -> bool:
        m = self.m
        amask = m.bits[a]
        if not m.occ[p] & amask:
            nodes = m.where[a]
            m.remove(a, r)
            m._put(a, p, nodes, amask)
            self.out.steps.append(GangStep("move", a, p, nodes, r, nodes))
            return True
        nodes = m.where[a]
        size = len(nodes)
        if not self.p.migration or m.free[p] < size:
            return False
        blockers = self._blockers(p, amask)
        where = m.where
        c = self.p.cost
        options: list[tuple[float, int, int]] = []  # (loss, tasks, -option) : lowest wins; ties -> option 2
        if blockers is not None:
            moved = sum(len(where[j]) for j in blockers)
            if self._budget(moved) and not m.blocked[p] & amask:  # a cell of a move in flight cannot be cleared
                options.append((c / 2 * size + c * moved, moved, -1))
            s_sum = moved  # the blockers are exactly the jobs on A's nodes
        else:
            bits = m.bits
            s_sum = sum(len(where[j]) for j in m.members[p] if bits[j] & amask)
        if self._budget(size):
            options.append((c * size + c / 2 * s_sum, size, -2))
        options.sort()
        for loss, tasks, neg in options:
            if neg == -1:
                assert blockers is not None
                plan = self._clear_plan(p, amask, blockers)
                if plan is None:
                    continue  # option 1 is not feasible: the next cheapest
                m.remove(a, r)
                self._apply_clear(p, plan, "compact")
                m._put(a, p, nodes, amask)  # A keeps its nodes: only the jobs in its way migrate
                self.out.steps.append(GangStep("move", a, p, nodes, r, nodes))
                self._spend(a, "compact", 1, loss, tasks)
                return True
            new = _pick(m, p, amask, size)
            m.relocate(a, r, p, new)
            self.out.steps.append(GangStep("move", a, p, new, r, nodes))
            self.out.migrations.append(GangMigration(a, nodes, new, "compact"))
            self._spend(a, "compact", 2, loss, tasks)
            return True
        return False

    def _start(self, job: GangJob, row: int) -> None:
        m = self.m
        mask = _lowest(~m.occ[row] & ((1 << m.nodes) - 1), job.size)
        cells = _nodes(mask)
        m._put(job.id, row, cells, mask)
        self.jobs.setdefault(job.id, job)
        self.out.steps.append(GangStep("start", job.id, row, cells))
        self.out.started[job.id] = row

    def schedule(self, queue: Iterable[GangJob]) -> None:
        if self.p.backfill and self.p.conservative:
            self._schedule_conservative(queue)
            return
        m = self.m
        free, mpl = m.free, m.mpl
        it = iter(queue)
        blocked: tuple[GangJob, int, float, int] | None = None  # (job, row, shadow, extra)
        for job in it:
            rows = m.in_use()
            size = job.size
            fits = [r for r in rows if free[r] >= size]
            if not fits and len(rows) < mpl:
                fits = [next(r for r in range(mpl) if r not in rows)]
            if not fits:
                if not self.p.backfill:
                    return
                blocked = self._reserve(job)
                self.out.reservation = (job.id, blocked[1], blocked[2])
                break
            row = min(fits, key=lambda r: (free[r], r))
            self._start(job, row)
        if blocked is None:
            return
        # Backfilling behind the reservation: no new row opens any more, so the rows in use are fixed and
        # a job wider than the freest of them fits nowhere (skipped without further look).
        _h, hrow, shadow, extra = blocked
        rows = m.in_use()
        widest = max((free[r] for r in rows), default=0)
        # a policy's queue reader passes over the jobs wider than ``widest`` itself (``next_fitting``)
        fitting: Callable[[int], GangJob | None] | None = getattr(it, "next_fitting", None)
        while True:
            if widest == 0:
                return  # every row full: nothing behind can start
            if fitting is not None:
                nxt = fitting(widest)
            else:
                nxt = next(it, None)
            if nxt is None:
                return
            job = nxt
            size = job.size
            if size > widest:
                continue
            fits = [r for r in rows if free[r] >= size and (r != hrow or job.remaining <= shadow or size <= extra)]
            if not fits:
                continue
            row = min(fits, key=lambda r: (free[r], r))
            if row == hrow and job.remaining > shadow:
                extra -= size
            self._start(job, row)
            widest = max(free[r] for r in rows)

    def _profile(self, row: int) -> list[list[float]]:
        """Row ``row``'s free slots ahead: breakpoints ``[t, free from t on]`` in remaining work, the
        first at 0 with the slots free now; a running job releases its slots at its estimated
        remaining time (one that overran its estimate: just after now, never now)."""
        m = self.m
        releases: dict[float, int] = {}
        for j in m.members[row]:
            t = max(self._rem(j), 1e-9)
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

    def _schedule_conservative(self, queue: Iterable[GangJob]) -> None:
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
                self._start(job, row)
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
        where_of = m.where.__getitem__
        jobs, started, get, seen = self.jobs, self.out.started, self._remaining, self._rem_seen
        best: tuple[float, int, int] | None = None  # (shadow, row, extra)
        for r in m.in_use():
            free = m.free[r]
            shadow = 0.0
            if free < job.size:
                shadow = math.inf
                members = m.members[r]
                # ``_rem`` inlined (every running job of a full matrix is read here, at every event that
                # blocks the queue's head); each job is in one row before expansion: read once
                if get is None:
                    rems = [jobs[j].remaining for j in members]
                else:
                    rems = [jobs[j].remaining if j in started else seen[j] if j in seen else get(j) for j in members]
                ending = sorted(zip(rems, map(len, map(where_of, members)), strict=True))
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
        where, rows_of, occ, bits, free = m.where, m.rows_of, m.occ, m.bits, m.free
        migration = self.p.migration
        rows = m.in_use()  # expansion neither opens nor empties a row
        # Either way a job goes into a row only with at least its size free (its own nodes free, or |A|
        # free slots to clear them), and rows only lose free slots during expansion (a replica fills, a
        # clearing moves jobs within the row): a job wider than every row's free slots is skipped, and
        # once every row is full nothing more is looked at.
        widest = max((free[p] for p in rows), default=0)
        for a in order:
            if not widest:
                return
            nodes = where.get(a)
            if nodes is None:
                continue
            size = len(nodes)
            if size > widest:
                continue
            amask = bits[a]
            mine = rows_of[a]
            for p in rows:
                if p in mine or free[p] < size:
                    continue
                if not occ[p] & amask:
                    m._put(a, p, nodes, amask)
                    self.out.steps.append(GangStep("replicate", a, p, nodes))
                    widest = max(free[q] for q in rows)
                    continue
                # clearing A's nodes of row p needs, besides them, room in p for the jobs on them: exactly
                # when p has |A| free slots (every occupied one of A's nodes is a blocker's)
                if not migration or m.blocked[p] & amask:
                    continue
                blockers = self._blockers(p, amask)
                if not blockers:
                    continue
                moved = sum(len(where[j]) for j in blockers)
                if not self._budget(moved):
                    continue
                plan = self._clear_plan(p, amask, blockers)
                if plan is None:
                    continue
                self._apply_clear(p, plan, "expand")
                m._put(a, p, nodes, amask)
                self.out.steps.append(GangStep("replicate", a, p, nodes))
                widest = max(free[q] for q in rows)
                c = self.p.cost
                self._spend(a, "expand", 1, c / 2 * len(nodes) + c * moved, moved)


def collapse(nodes: int, mpl: int, running: Mapping[str, tuple[tuple[int, ...], Iterable[int]]],
             blocked: Iterable[tuple[int, int]] = (), masks: Mapping[str, int] | None = None) -> Matrix:
    """Step 1: a matrix where every running job (``job -> (nodes, rows it is in)``) keeps its nodes and
    its lowest row, and the cells ``blocked`` (``(node, row)``: held by a move in flight, e.g. the source
    slots of a live migration) are occupied by no job. Raises ``ValidationError`` if two jobs share a
    slot, a job sits on a blocked cell or a row is out of range.

    ``masks``: for some jobs, their nodes as a bit set, already checked by the caller (``nodes`` sorted,
    distinct, within 0 .. nodes-1; a policy keeps them from one event to the next for the jobs that did
    not move): neither sorted nor checked again."""
    m = Matrix(nodes, mpl)
    occ, free, where_of, bits, rows_of, members = m.occ, m.free, m.where, m.bits, m.rows_of, m.members
    for job, (where, rows) in running.items():
        # one row (the usual case: a policy's tuple) needs no sorting
        rs: Sequence[int] = rows if type(rows) is tuple and len(rows) == 1 else sorted(rows)
        if not rs:
            raise ValidationError(field=f"job {job}", problem="runs in no row")
        if rs[0] < 0 or rs[-1] >= mpl:
            raise ValidationError(field=f"job {job}", problem=f"row {rs[-1]} outside 0..{mpl - 1}")
        known_mask = masks.get(job) if masks is not None else None
        if known_mask is not None:
            cells = where
            mask = known_mask
            size = len(cells)
        else:
            cells = tuple(sorted(where))
            size = len(cells)
            mask = _checked_mask(cells, nodes)
        if mask < 0:
            raise ValidationError(field=f"job {job}",
                                  problem=f"nodes {list(where)} are not distinct nodes of 0..{nodes - 1}")
        row = rs[0]
        if occ[row] & mask:
            n = next(n for n in cells if occ[row] >> n & 1)
            raise ValidationError(field=f"job {job}", problem=f"row {row} node {n} is taken by {m.job_at(row, n)}")
        occ[row] |= mask
        free[row] -= size
        where_of[job] = cells
        bits[job] = mask
        rows_of[job] = {row}
        members[row][job] = None
    for node, row in blocked:
        m.block(row, node)
    return m


class KeptCollapse:
    """Step 1 kept from one event to the next (issue 27): the collapsed matrix of the last call, updated
    by what changed in ``running`` (jobs gone, new, or on other nodes or another lowest row) and in the
    ``blocked`` cells, instead of rebuilt from every running job. :meth:`collapse` returns what
    :func:`collapse` returns for the same arguments (a fresh copy: the derivation changes it; the same
    ``ValidationError`` on bad input, made by :func:`collapse` itself) -- a cache, not state: the
    derivation's result depends on its arguments only (``tests/unit/test_gang_kept.py`` compares the
    two on random event sequences).

    The jobs a derivation reads in a matrix's rows are always sorted first (by node, size, FCFS key or
    remaining time), so the order in which the kept matrix lists a row's jobs (the order of their
    updates) changes no decision. ``updates`` / ``rebuilds`` count the calls of each kind."""

    __slots__ = ("_blocked", "_input", "_key", "_m", "rebuilds", "updates")

    def __init__(self) -> None:
        self._m: Matrix | None = None
        self._key: tuple[int, int] = (0, 0)
        #: ``running`` at the last call
        self._input: dict[str, tuple[tuple[int, ...], Iterable[int]]] = {}
        self._blocked: tuple[tuple[int, int], ...] = ()
        self.rebuilds = 0
        self.updates = 0

    def collapse(self, nodes: int, mpl: int, running: Mapping[str, tuple[tuple[int, ...], Iterable[int]]],
                 blocked: Iterable[tuple[int, int]] = (), masks: Mapping[str, int] | None = None) -> Matrix:
        blocked = tuple(blocked)
        if self._m is not None and self._key == (nodes, mpl):
            try:
                m = self._update(running, blocked, masks)
            except ValidationError:
                m = None
            if m is not None:
                self.updates += 1
                return m.copy()
        # the first call, another shape, or bad input (then :func:`collapse` raises its own error)
        self._m = None
        m = collapse(nodes, mpl, running, blocked, masks)
        self._m, self._key, self._blocked = m, (nodes, mpl), blocked
        self._input = dict(running)
        self.rebuilds += 1
        return m.copy()

    def _update(self, running: Mapping[str, tuple[tuple[int, ...], Iterable[int]]],
                blocked: tuple[tuple[int, int], ...], masks: Mapping[str, int] | None) -> Matrix | None:
        """The kept matrix brought up to date (None: drop it; the kept state is then unusable).

        What changed: each entry of ``running`` against the last call's, the very same object first (a
        caller that keeps an unchanged job's entry from one event to the next, as the policies do, costs
        one identity test per job), else by equality."""
        m = self._m
        assert m is not None
        nodes, mpl = m.nodes, m.mpl
        prev = self._input
        get = prev.get
        changed = [item for item in running.items() if get(item[0]) is not item[1] and get(item[0]) != item[1]]
        new = sum(1 for job, _v in changed if job not in prev)
        gone = prev.keys() - running.keys() if len(running) - new != len(prev) else ()
        # Every job that leaves or changes leaves the matrix before any is placed again, so a conflict
        # is found exactly when the new set overlaps (the jobs that stay never overlap each other).
        self._m = None  # until the update is complete
        occ, free, where_of, bits, rows_of, members, held = m.occ, m.free, m.where, m.bits, m.rows_of, \
            m.members, m.blocked
        out: list[str] = [*gone]
        out.extend(job for job, _v in changed if job in prev)
        for job in out:
            row = min(prev.pop(job)[1])
            occ[row] &= ~bits.pop(job)
            free[row] += len(where_of.pop(job))
            del members[row][job]
            del rows_of[job]
        if blocked != self._blocked:
            for r in range(mpl):
                cells = held[r]
                if cells:
                    occ[r] &= ~cells
                    free[r] += cells.bit_count()
                    held[r] = 0
            self._blocked = ()
        # (on a conflict the caller collapses in full, which names the jobs in ``running``'s order)
        for job, value in changed:
            given, rows = value
            rs: Sequence[int] = rows if type(rows) is tuple and len(rows) == 1 else sorted(rows)
            if not rs or rs[0] < 0 or rs[-1] >= mpl:
                return None
            row = rs[0]
            known_mask = masks.get(job) if masks is not None else None
            if known_mask is not None:
                cells_t = tuple(given)
                mask = known_mask
            else:
                cells_t = tuple(sorted(given))
                mask = _checked_mask(cells_t, nodes)
            if mask < 0 or occ[row] & mask:
                return None
            occ[row] |= mask
            free[row] -= len(cells_t)
            where_of[job] = cells_t
            bits[job] = mask
            rows_of[job] = {row}
            members[row][job] = None
            prev[job] = value
        if blocked != self._blocked:
            for node, row in blocked:
                m.block(row, node)
            self._blocked = blocked
        self._m = m
        return m


def _checked_mask(cells: tuple[int, ...], nodes: int) -> int:
    """The bit set of the sorted ``cells``, or -1 if they are not distinct nodes of 0 .. nodes-1."""
    size = len(cells)
    if not size or cells[0] < 0 or cells[-1] >= nodes:
        return -1
    if size == 1:
        return 1 << cells[0]
    if cells[-1] - cells[0] + 1 == size and cells == tuple(range(cells[0], cells[0] + size)):
        return ((1 << size) - 1) << cells[0]  # consecutive nodes (the usual case: the lowest free ones)
    mask: int = functools.reduce(operator.or_, map((1).__lshift__, cells), 0)
    return mask if mask.bit_count() == size else -1  # else a node twice


def derive(
    nodes: int,
    running: Mapping[str, tuple[tuple[int, ...], Iterable[int]]],
    jobs: Mapping[str, GangJob],
    queue: Sequence[GangJob] | Iterable[GangJob],
    params: GangParams,
    *,
    checked: bool = False,
    blocked: Iterable[tuple[int, int]] = (),
    masks: Mapping[str, int] | None = None,
    remaining: Callable[[str], float] | None = None,
    kept: KeptCollapse | None = None,
) -> Derivation:
    """The new matrix at a scheduling event (the four steps of the module docstring).

    ``running``: job -> (its nodes, the rows it is in); ``jobs``: a :class:`GangJob` for every running
    job (and optionally the queued ones); ``queue``: the waiting jobs in FCFS order. The input is not
    changed.

    ``checked``: the caller has made sure that every queued job has 1..``nodes`` tasks and that ``jobs``
    covers every running job; ``queue`` is then read lazily, only as far as the derivation needs it (any
    iterable: a policy converts its queue job by job, and a long queue behind a blocked head under GS
    costs nothing). Without it, every queued job is checked first.

    ``blocked``: cells ``(node, row)`` held by a move in flight (vmctld keeps a migrating job's source
    slots until the move is confirmed): no step places a job there or clears one (compaction's option 1
    and expansion's clearing skip a row where the job's own nodes include one), and they count as
    occupied (a row holding only such cells is in use).

    ``masks``: checked bit sets of some running jobs' nodes (:func:`collapse`). ``remaining``: the
    estimated remaining time of a running job, asked for only when backfilling needs it (a reservation's
    shadow time, a conservative profile), at most once per job; without it, ``jobs[job].remaining``.

    ``kept``: step 1 is :meth:`KeptCollapse.collapse` of that object (the collapsed matrix of its last
    call, updated by what changed) instead of :func:`collapse`; the result is the same."""
    if not checked:
        queue = list(queue)
        for q in queue:
            if q.size < 1 or q.size > nodes:
                raise ValidationError(field=f"job {q.id}.size", problem=f"must be 1..{nodes}, got {q.size}")
    known = dict(jobs)
    if not checked:
        for q in queue:
            known.setdefault(q.id, q)
        missing = [j for j in running if j not in known]
        if missing:
            raise ValidationError(field=f"job {missing[0]}", problem="runs but has no GangJob record")
    matrix = (kept.collapse if kept is not None else collapse)(nodes, params.mpl, running, blocked, masks)
    d = _Deriver(matrix, known, params, remaining)
    d.compact()
    d.schedule(queue)
    d.expand(sorted(d.m.where, key=lambda j: (known[j].order, j)))
    return d.out
