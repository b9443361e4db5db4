"""HSRET (HSRET paper, "paper 002", sec. 4.2 and 5): widths chosen from one normalized execution time
common to all tasks, set by the system load, then corrected task by task for deadlines.

The paper's Algorithms 1-4 and its Fig. 8 were lost; only the prose survived, and it is garbled in
places. Everything below that is not a quotation of the prose is a reconstruction, marked **R**.

**Load cases (sec. 4.2, eqs. 2-6).** ``Jset`` (eq. 2) is every task that has arrived and whose deadline
is after now ("TN tasks which arrive before the slot time now and have a deadline more than now"):
waiting, active and finished alike (read literally). Each task's work is "average allocated to the
time from the task arrival to the deadline" and, as eqs. 3-4 write ``pl^jmax`` for every task, every
task of Jset is counted at the width in question, whatever width it really got: the sum estimates the
work arriving per unit of time (the offered load) if every task ran at that width, and does not feed
back the widths chosen in the past. ``TP`` is the processing ability of the system, sum over clusters
of nodes x speed (standard nodes). The load when every task has its maximum / minimum width:

    crmax = sum_i maxp_i * et_i(maxp_i) / ((dl_i - ar_i) * TP)        (eq. 3)
    crmin = sum_i minp_i * et_i(minp_i) / ((dl_i - ar_i) * TP)        (eq. 4, R: the text writes
                                                                       pl^jmax * et^jmin; the width
                                                                       must be the minimum, as for
                                                                       the time)

``et`` is the forecast time on standard resources rounded up to whole slots (**R**: eq. 8 writes
``pl * et``; but "during the slot time, the task holds the allocated resources exclusively, until the
end of every slot time", sec. 3.2, so a task consumes ``pl`` nodes for ``ceil(et / SL)`` whole slots;
unrounded, the target load of 1 below is exceeded by the fragments of every last slot). The text
defines ``minsl = min(crmin / TP, 1)`` and ``maxsl = max(crmax / TP, 1)`` (eqs. 5-6), dividing by TP twice
and making maxsl >= 1 always; and it swaps min and max in their definitions. **R**: we use
``minsl = min(crmin, 1)``, ``maxsl = min(crmax, 1)`` and the three cases as the text explains them
(its own case numbers are swapped between the list and the sentence after it):

- Case 1, ``maxsl < 1``: even at maximum width no slot is overloaded: normalized time 0 (every task
  at its fastest width);
- Case 2, ``minsl = 1``: even at minimum width the system is overloaded: normalized time 1;
- Case 3, ``minsl < 1 <= crmax``: the width is decided by Getnet.

**Normalized execution time (eq. 7)**: ``net^j = (et^j - min et) / (max et - min et)``
(:class:`vmctl.policies.moldable.model.Profile.net`); 1 at the smallest width, 0 at the fastest.

**Getnet (Algorithm 1)**: binary search for the common normalized time ``snet`` in [0, 1]. For a
candidate ``snet`` every task of Jset takes the narrowest width whose normalized time is <= snet (line
7-8), and adds ``ld = pl * et / ((dl - ar) * T)`` (eq. 8) to every slot from now to its deadline (line
9; **R**: the slots before now are past, so the window is cut at now). If the most loaded slot is over
1 (**R**: the text says "minimum load ... minl"; a slot that is not overloaded is the stated goal, so
it is the maximum), the lower bound rises (the text swaps the bounds' names); else the upper bound
falls; until the range is under ``minstep`` (line 3, **R**: the smallest gap between the normalized
times of two neighbouring widths of any profile, below which no width changes). It returns the upper
bound, the smallest normalized time found with no overloaded slot. (Since every task of ``Jset`` has
arrived and has its deadline after now, every task's window covers the current slot, so the most
loaded slot is the current one; the per-slot form is kept as the paper has it.)

**Selet (Algorithm 2) with Sch1-Sch3 (Algorithms 3-4)**, **R** throughout, from the prose: waiting tasks
are taken earliest deadline first (sec. 4.1 Phase 4: "some sub-tasks can be brought forward because
other sub-tasks have deadlines close to the deadline"). For each task ``t_i`` (Checksch: some cluster
has the nodes free now and the task, started now and run every slot, ends by its deadline):

1. at the width of ``snet``, on the fastest cluster that can take it;
2. else the normalized time is *enhanced* (narrower, one width = one minstep at a time) and *reduced*
   (wider) until a width passes Checksch in each direction, and the one that uses fewer node-slots
   is taken ("we select the policy which saves more computing resources"); the tasks with later
   deadlines (the paper's ``rgt_i``, Sch3, and ``midt_i``, Sch2: "just enhance the normalized
   execution time, and reduce the system load") come after ``t_i`` in this order and so get their
   normalized time enhanced to what is left;
3. else, if the task can still meet its deadline starting at the next boundary, it waits; if not
   (Sch1, ``lft_i``: tasks that arrived before ``t_i`` with earlier deadlines and are running):
   running tasks with slack, i.e. that still end by their deadline if suspended for this slot, are
   suspended, the ones with the most slack first, on the cluster where the fewest nodes must be
   suspended, for the width closest to ``snet`` that then passes Checksch (the paper's motivating
   example, sec. 3.3: "the sub-tasks of b and c are suspended" for d);
4. else it waits; and a task that cannot meet its deadline whatever it gets starts anyway, at the
   width of ``snet`` (or the narrowest that fits) on the fastest cluster with room.

Each slot, before the waiting tasks, the active tasks are packed earliest deadline first into their
clusters' nodes (those that can still end in time before those that cannot); the ones that do not
fit (after a suspension, more tasks may hold a cluster than it has nodes) stay suspended this slot.

**The load target** (parameter ``target``, default 1.0). Algorithm 1's prose: the binary search finds
"the maximum parallelism which ensures that every slot is not overloaded (less than 1)", and "checks
whether the load minl is more than 1"; eqs. 5-6 clip the loads at 1 and the three cases compare with 1.
So the paper's value is 1 exactly: the platform is planned full. ``target`` replaces that 1 in the
cases and in Getnet (a slot is overloaded when its load exceeds ``target``); values below 1 keep a
margin for the load the estimate misses (the whole-slot fragments, the forecast errors, the tasks that
arrive within the slot). It is a sensitivity of this reconstruction, not a value the paper gives.

**AFCFS start** (``HSRET(start="afcfs")``, policy name ``hsret-afcfs``). Sec. 6.2.2: "HSRET gets the
initial scheduling list as AFCFS, and then according to the initial list, gets an optimistic scheduling
result. So, HSRET always has the lowest value in AWT." **R**: (1) the initial list is AFCFS's for this
slot: the waiting tasks in arrival order, each placed, if some cluster has the nodes now and the
smallest width that meets its deadline fits there, on the fastest such cluster (HSRET draws nothing at
random) at that width; its nodes are reserved; a task no width can serve in time runs at its smallest
width that fits (AFCFS's rule); (2) the optimization: the listed tasks, earliest deadline first, are
widened towards the width of ``snet`` (never past it, never narrower than AFCFS's width) with the nodes
of their cluster that the list left free; (3) an urgent task that is not in the list may still
suspend running tasks (Sch1) as in the default variant. So the set of tasks started in a slot is
AFCFS's, and the widths are HSRET's where room allows.

Tiny example (slot 10 minutes, so every time is whole slots): one task waiting, widths (1, 2, 4) with
times (100, 60, 40) minutes (net 1, 1/3, 0), ``ar`` 0, ``dl`` 100, TP 2 nodes: at snet 1 (width 1) the
load is 1 * 100 / (100 * 2) = 0.5; at snet 0 (width 4) it is 4 * 40 / 200 = 0.8: Case 1, snet = 0.
With TP = 1 the loads are 1.0 and 1.6, minsl = 1: Case 2, snet = 1. With widths (1, 2) times (100, 40)
and TP = 1 the loads are 1.0 at width 1 and 0.8 at width 2: crmax < 1, Case 1 (checked first). With
TP = 1.25 (one node of speed 1.25) the loads are 0.8, 0.96 and 1.28: Case 3; Getnet (minstep 1/3)
tries 0.5 (width 2, 0.96: not overloaded, upper bound 0.5), then 0.25 (width 4, 1.28: lower bound
0.25), stops and returns 0.5: width 2. With ``target`` 0.9 the same search finds 0.96 > 0.9 at
width 2 too, and returns 1.0: width 1 (load 0.8).

AFCFS start, tiny example: one cluster of 8 free nodes, tasks A (arrived first, smallest width that meets
its deadline 4) and B (2), snet's width 8 for both: the list places A at 4 and B at 2 (2 nodes left);
widening, earliest deadline first (B first, say): B takes the 2 free nodes (width 4), A stays at 4.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np

from vmctl.policies.moldable.model import EPS, Decision, Profile, SlotView, Start, deadline_table, monotone

if TYPE_CHECKING:
    from numpy.typing import NDArray


def edf_pack(view: SlotView, reference: bool = False) -> NDArray[np.bool_]:
    """Which active tasks run this slot: earliest deadline first, each if its width still fits; the
    tasks that can still end by their deadline before those that cannot (a late task first would
    make more tasks late). A cluster whose active tasks all fit runs them all whatever the order, so
    only the other clusters' tasks go through the loop (``reference``: every task does; same answer)."""
    running = np.zeros(len(view.a_id), dtype=np.bool_)
    free = view.clusters.n.copy()
    late = (view.now + view.a_rem) * view.slot > view.a_deadline + EPS
    order = np.lexsort((view.a_id, view.a_deadline, late))
    if not reference and len(view.a_id):
        held = np.bincount(view.a_cluster, weights=view.a_width, minlength=len(free))
        fits = (held <= free)[view.a_cluster]
        running[fits] = True
        order = order[~fits[order]]
    for k in order.tolist():
        c, w = int(view.a_cluster[k]), int(view.a_width[k])
        if w <= free[c]:
            free[c] -= w
            running[k] = True
    return running


def _jset(view: SlotView) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64],
                                     NDArray[np.int64]]:
    """Eq. (2): arrival, deadline, length and profile of every task that has arrived and whose deadline
    is after now (waiting, active and finished)."""
    arrival = np.concatenate([view.w_arrival, view.a_arrival, view.f_arrival])
    deadline = np.concatenate([view.w_deadline, view.a_deadline, view.f_deadline])
    length = np.concatenate([view.w_length, view.a_length, view.f_length])
    profile = np.concatenate([view.w_profile, view.a_profile, view.f_profile])
    keep = deadline > view.t
    return arrival[keep], deadline[keep], length[keep], profile[keep]


def _loads(view: SlotView) -> tuple[list[NDArray[np.float64]], list[NDArray[np.int64]]]:
    """Per profile: ``ld[i, j]``, eq. (8) over TP, of each task of Jset at each width of the profile,
    and the last slot (from now) of each task's window."""
    tp = float((view.clusters.n * view.clusters.s).sum())
    arrival, deadline, length, profile = _jset(view)
    loads: list[NDArray[np.float64]] = []
    lasts: list[NDArray[np.int64]] = []
    for pi, p in enumerate(view.profiles):
        m = profile == pi
        window = (deadline[m] - arrival[m]) * tp
        held = np.ceil(length[m][:, None] * p.r[None, :] / view.slot - EPS) * view.slot
        loads.append(held * p.w[None, :] / window[:, None])
        lasts.append(np.ceil(deadline[m] / view.slot - EPS).astype(np.int64) - view.now)
    return loads, lasts


def check_target(target: float) -> float:
    """Getnet's load target: a number in (0, 2] (field ``target``; the paper's value is 1)."""
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 2:
        from vmctl.errors import ValidationError

        raise ValidationError(field="target", problem=f"the load target must be a number in (0, 2] (the paper's "
                              f"is 1: a slot is overloaded above it), got {target!r}")
    return float(target)


class LoadTable:
    """Eqs. (2)-(8) of one slot computed once: :func:`_loads` (per profile, each Jset task's load at each
    width and the last slot of its window) and, for :func:`slot_loads`, the windows' ends as one index
    array, so that Getnet's binary search does not rebuild them at every step. The slot loads of one
    width choice (one width index per profile) are kept: two values of ``snet`` that give every profile
    the same width give the same loads. Same floating-point operations in the same order as without
    the table (the results are bit-identical; ``tests/unit/test_moldable_fast.py``)."""

    def __init__(self, view: SlotView) -> None:
        self.loads, self.lasts = _loads(view)
        self.horizon = max([1, *(int(x.max()) for x in self.lasts if x.size)])
        self.index = np.concatenate([np.clip(last, 1, self.horizon) for last in self.lasts])
        self._memo: dict[tuple[int, ...], NDArray[np.float64]] = {}

    def slot_loads(self, profiles: tuple[Profile, ...], snet: float) -> NDArray[np.float64]:
        js = tuple(p.index_for_net(snet) for p in profiles)
        got = self._memo.get(js)
        if got is None:
            cols = [ld[:, j] for ld, j in zip(self.loads, js, strict=True)]
            # np.add.at on zeros and a weighted bincount both add in input order (bit-identical)
            delta = np.asarray(np.bincount(self.index, weights=-np.concatenate(cols), minlength=self.horizon + 1),
                               dtype=np.float64)
            first = 0.0
            for col in cols:
                first += col.sum()
            delta[0] = first
            got = np.cumsum(delta)[:self.horizon]
            self._memo[js] = got
        return got


def load_case(view: SlotView, target: float = 1.0, table: LoadTable | None = None) -> tuple[int, float, float]:
    """(case, crmin, crmax) of eqs. 3-6 (reconstructed: see the module docstring), ``target`` in place
    of the paper's 1; ``table``: this slot's :class:`LoadTable` (else computed here)."""
    loads = _loads(view)[0] if table is None else table.loads
    crmin = sum(float(ld[:, 0].sum()) for ld in loads)
    crmax = sum(float(ld[:, -1].sum()) for ld in loads)
    if min(crmax, target) < target:
        return 1, crmin, crmax
    if min(crmin, target) >= target:
        return 2, crmin, crmax
    return 3, crmin, crmax


def slot_loads(view: SlotView, snet: float, table: LoadTable | None = None) -> NDArray[np.float64]:
    """The load of each slot from now to the last deadline of Jset when every task of Jset takes the
    width of ``snet`` (Algorithm 1 lines 6-9; eq. 8). This is the reference form; with ``table`` the
    same values come from :meth:`LoadTable.slot_loads`."""
    if table is not None:
        return table.slot_loads(view.profiles, snet)
    loads, lasts = _loads(view)
    horizon = max([1, *(int(x.max()) for x in lasts if x.size)])
    delta = np.zeros(horizon + 1, dtype=np.float64)
    for p, ld, last in zip(view.profiles, loads, lasts, strict=True):
        col = ld[:, p.index_for_net(snet)]
        delta[0] += col.sum()
        np.add.at(delta, np.clip(last, 1, horizon), -col)
    return np.cumsum(delta)[:horizon]


def minstep(view: SlotView) -> float:
    """Algorithm 1 line 3 (reconstructed): the finest step that changes some task's width."""
    return max(1e-3, min(p.minstep() for p in view.profiles))


def getnet(view: SlotView, target: float = 1.0, table: LoadTable | None = None) -> float:
    """Algorithm 1: the smallest common normalized time with no slot loaded above ``target`` (binary
    search); ``table``: this slot's :class:`LoadTable` (None: the reference, recomputing eq. 8 at
    every step)."""
    beg, end = 0.0, 1.0
    step = minstep(view)
    while end - beg >= step:
        mid = (beg + end) / 2
        if float(slot_loads(view, mid, table).max()) > target:
            beg = mid
        else:
            end = mid
    return end


def select_net(view: SlotView, target: float = 1.0, reference: bool = False) -> tuple[int, float]:
    """(case, snet) for this slot; ``reference``: without the :class:`LoadTable` (the same result,
    slower)."""
    table = None if reference else LoadTable(view)
    case, _, _ = load_case(view, target, table)
    if case == 1:
        return case, 0.0
    if case == 2:
        return case, 1.0
    return case, getnet(view, target, table)


def _urgent(view: SlotView) -> NDArray[np.bool_]:
    """Waiting tasks that meet their deadline on some cluster and width if started now, but on none if
    started at the next boundary (the only ones for which HSRET suspends running tasks)."""
    out = np.zeros(len(view.w_id), dtype=np.bool_)
    for pi, p in enumerate(view.profiles):
        m = np.nonzero(view.w_profile == pi)[0]
        if m.size == 0:
            continue
        # the fastest way to run it: the smallest slot count over clusters and widths
        minutes = view.w_length[m][:, None] * p.r[None, :] / float(view.clusters.s.max())
        n = np.maximum(1, np.ceil(minutes / view.slot - EPS)).min(axis=1)
        dl = view.w_deadline[m]
        out[m] = ((view.now + n) * view.slot <= dl + EPS) & ((view.now + 1 + n) * view.slot > dl + EPS)
    return out


START_MODES = ("edf", "afcfs")
#: how many waiting tasks HSRET's fast path tabulates at once
_BLOCK = 64


class HSRET:
    """HSRET; ``target``: Getnet's load target (the paper's 1); ``start``: ``edf`` (Selet over the
    waiting tasks earliest deadline first) or ``afcfs`` (AFCFS's list of the slot, widened; sec. 6.2.2).

    ``reference``: the plain form, one task at a time with numpy on its (cluster x width) table and
    eq. (8) recomputed at every step of Getnet. The default computes the same decisions faster: the
    slot counts and deadline checks of every waiting task in one vectorized pass per profile, then,
    per task, Checksch on the interval of widths each cluster allows (a profile whose times never grow
    with the width meets the deadline from some width on and fits up to some width: see
    :meth:`_select`); ``tests/unit/test_moldable_fast.py`` compares the two on seeded workloads."""

    name: str = "hsret"

    def __init__(self, target: float = 1.0, start: str = "edf", reference: bool = False) -> None:
        self.target = check_target(target)
        if start not in START_MODES:
            from vmctl.errors import ValidationError

            raise ValidationError(field="start", problem=f"must be one of {', '.join(START_MODES)}, got {start!r}")
        self.start = start
        self.reference = reference
        self.name = "hsret" if start == "edf" else "hsret-afcfs"

    def decide(self, view: SlotView) -> Decision:
        running = edf_pack(view, self.reference)
        starts: list[Start] = []
        if len(view.w_id) == 0:
            return Decision(starts, running)
        case, snet = select_net(view, self.target, self.reference)
        free = view.free_nodes(running)
        urgent = _urgent(view)
        if self.start == "afcfs":
            starts = self._afcfs_list(view, snet, free, self.reference)
            placed = {s.task for s in starts}
            order = [i for i in range(len(view.w_id)) if int(view.w_id[i]) not in placed and urgent[i]]
        else:
            order = np.lexsort((view.w_arrival, view.w_deadline)).tolist()
        if self.reference:
            starts += self._select_reference(view, order, snet, free, running, urgent)
        else:
            starts += self._select(view, order, snet, free, running, urgent)
        return Decision(starts, running, {"case": float(case), "snet": snet})

    def _select_reference(self, view: SlotView, order: list[int], snet: float, free: NDArray[np.int64],
                          running: NDArray[np.bool_], urgent: NDArray[np.bool_]) -> list[Start]:
        """Steps 1-4 of the module docstring for the waiting tasks in ``order`` (the reference form);
        updates ``free`` and ``running``."""
        speed = view.clusters.s
        starts: list[Start] = []
        for i in order:
            p = view.profiles[int(view.w_profile[i])]
            if free.max() < p.minp and not urgent[i]:
                continue  # no room anywhere and it can wait (or is late anyway): nothing to decide
            choice = self._choose(view, i, p, p.index_for_net(snet), free, running, speed)
            if choice is None:
                continue
            c, j = choice
            width = int(p.w[j])
            starts.append(Start(int(view.w_id[i]), c, width))
            free[c] -= width
        return starts

    def _choose(self, view: SlotView, i: int, p: Profile, jref: int, free: NDArray[np.int64],
                running: NDArray[np.bool_], speed: NDArray[np.float64]) -> tuple[int, int] | None:
        """Steps 1-4 for waiting task ``i``: (cluster, width index), or None when it waits."""
        dl = float(view.w_deadline[i])
        n = view.slots_needed(float(view.w_length[i]), p)
        meets = view.meets(n, dl)
        area = p.w[None, :] * n
        choice = self._checksch(p, jref, meets & (p.w[None, :] <= free[:, None]), area, speed)
        if choice is None and meets.any():
            if view.meets(n, dl, delay=1).any():
                return None  # it can still meet its deadline if it starts at the next boundary: wait
            return self._sch1(view, p, jref, meets, free, running, dl)  # None: nothing to suspend, wait
        if choice is None:
            fits = p.w[None, :] <= free[:, None]
            if not fits.any():
                return None
            order = [jref, *range(len(p.widths))]
            j = next(j for j in order if fits[:, j].any())
            cs = np.nonzero(fits[:, j])[0]
            choice = (int(cs[np.argmax(speed[cs])]), j)
        return choice

    def _select(self, view: SlotView, order: list[int], snet: float, free: NDArray[np.int64],
                running: NDArray[np.bool_], urgent: NDArray[np.bool_]) -> list[Start]:
        """:meth:`_select_reference` computed faster, with the same result. For a task of a profile
        whose times never grow with the width, the slot count never grows with the width either, so
        on each cluster ``c`` the widths that meet the deadline are those from index ``lo[c]`` on
        (``lo`` computed for every waiting task at once) and the widths that fit in the free nodes are
        those up to ``hi[c]``: Checksch's table ``ok[c, j]`` is ``lo[c] <= j <= hi[c]``, and its
        searches become a few comparisons per cluster on Python integers. A profile whose time grows
        by a rounding error somewhere (allowed by :class:`Profile`) goes through :meth:`_choose`."""
        speed = view.clusters.s
        spd: list[float] = speed.tolist()
        ncl = len(spd)
        profiles = view.profiles
        prof: list[int] = view.w_profile.tolist()
        urg: list[bool] = urgent.tolist()
        jrefs = [p.index_for_net(snet) for p in profiles]
        widths = [list(p.widths) for p in profiles]
        mono = [monotone(p) for p in profiles]
        # per waiting task (filled a block at a time, for the tasks that get that far): its slot
        # counts n[c, j] and lo[c], the first width index that meets its deadline on cluster c
        table: dict[int, tuple[NDArray[np.int64], list[int]]] = {}
        freel: list[int] = free.tolist()
        fmax = max(freel)
        starts: list[Start] = []
        # once no cluster has room for any profile's smallest width, only urgent tasks (Sch1) pass
        # the test below: go from one to the next (Sch1 may free nodes again)
        smallest = min(w[0] for w in widths)
        urgent_at = [pos for pos, i in enumerate(order) if urg[i]]
        pos = 0
        while pos < len(order):
            if fmax < smallest:
                k = bisect_left(urgent_at, pos)
                if k == len(urgent_at):
                    break
                pos = urgent_at[k]
            i = order[pos]
            pos += 1
            pi = prof[i]
            ws = widths[pi]
            if fmax < ws[0] and not urg[i]:
                continue  # no room anywhere and it can wait (or is late anyway): nothing to decide
            p = profiles[pi]
            jref = jrefs[pi]
            if not mono[pi]:
                choice = self._choose(view, i, p, jref, free, running, speed)
                freel = free.tolist()  # Sch1 may have freed nodes
                fmax = max(freel)
            else:
                if i not in table:  # this task and the next ones that pass the test above now
                    if fmax < smallest:
                        k = bisect_left(urgent_at, pos)
                        block = [i, *(order[q] for q in urgent_at[k:k + _BLOCK - 1])]
                    else:
                        block = [i]
                        for k in islice(order, pos, pos + 4 * _BLOCK):
                            if fmax >= widths[prof[k]][0] or urg[k]:
                                block.append(k)
                                if len(block) == _BLOCK:
                                    break
                    table.update(deadline_table(view, block))
                n, lo = table[i]
                nw = len(ws)
                choice = None
                wref = ws[jref]
                cs = [c for c in range(ncl) if lo[c] <= jref and freel[c] >= wref]  # lo[c] <= jref <= hi[c]
                if cs:
                    choice = (max(cs, key=spd.__getitem__), jref)
                else:
                    hi = [bisect_right(ws, f) - 1 for f in freel]  # the widest width index that fits
                    best: tuple[int, int, int] | None = None  # (area, cluster, j)
                    down = max((min(hi[c], jref - 1) for c in range(ncl) if lo[c] <= min(hi[c], jref - 1)),
                               default=-1)
                    up = min((max(lo[c], jref + 1) for c in range(ncl) if max(lo[c], jref + 1) <= hi[c]),
                             default=nw)
                    for j in (down, up):
                        if not 0 <= j < nw:
                            continue
                        area = {c: ws[j] * int(n[c, j]) for c in range(ncl) if lo[c] <= j <= hi[c]}
                        c = min(area, key=area.__getitem__)
                        if best is None or area[c] < best[0]:
                            best = (area[c], c, j)
                    if best is not None:
                        choice = (best[1], best[2])
                if choice is None and min(lo) < nw:
                    dl = float(view.w_deadline[i])
                    if ((view.now + 1 + n) * view.slot <= dl + EPS).any():
                        continue  # it can still meet its deadline if it starts at the next boundary: wait
                    choice = self._sch1(view, p, jref, view.meets(n, dl), free, running, dl)
                    freel = free.tolist()
                    fmax = max(freel)
                elif choice is None:
                    if fmax < ws[0]:
                        continue
                    j = jref if fmax >= ws[jref] else 0
                    cs = [c for c in range(ncl) if freel[c] >= ws[j]]
                    choice = (max(cs, key=spd.__getitem__), j)
            if choice is None:
                continue
            c, j = choice
            width = ws[j]
            starts.append(Start(int(view.w_id[i]), c, width))
            free[c] -= width
            freel[c] -= width
            fmax = max(freel)
        return starts

    @staticmethod
    def _afcfs_list(view: SlotView, snet: float, free: NDArray[np.int64], reference: bool = False) -> list[Start]:
        """Sec. 6.2.2 (module docstring, "AFCFS start"): AFCFS's list of this slot on the fastest
        cluster, then each listed task widened towards the width of ``snet`` with the nodes the list left
        free, earliest deadline first. Updates ``free``. ``reference``: the list one task at a time with
        numpy (else from :func:`deadline_table`, as in :class:`~vmctl.policies.moldable.afcfs.AFCFS`;
        the same list)."""
        speed = view.clusters.s
        spd: list[float] = speed.tolist()
        ncl = len(spd)
        mono = [monotone(p) for p in view.profiles]
        table = {} if reference else deadline_table(view, range(len(view.w_id)))
        listed: list[tuple[int, int, int]] = []  # (waiting index, cluster, width index)
        for i in range(len(view.w_id)):  # arrival order
            p = view.profiles[int(view.w_profile[i])]
            if not reference and mono[int(view.w_profile[i])]:
                ws = p.widths
                nw = len(ws)
                lo = table[i][1]
                okc = [c for c in range(ncl) if lo[c] < nw and free[c] >= ws[lo[c]]]
                if okc:
                    j = min(lo[c] for c in okc)  # the smallest width that passes somewhere
                    cs = [c for c in range(ncl) if lo[c] <= j and free[c] >= ws[j]]
                else:
                    if min(lo) < nw:
                        continue  # AFCFS waits for nodes
                    j = 0  # hopeless: AFCFS runs it anyway, as small as fits
                    cs = [c for c in range(ncl) if free[c] >= ws[0]]
                    if not cs:
                        continue
                c = max(cs, key=spd.__getitem__)
                free[c] -= ws[j]
                listed.append((i, c, j))
                continue
            n = view.slots_needed(float(view.w_length[i]), p)
            fits = p.w[None, :] <= free[:, None]
            ok = view.meets(n, float(view.w_deadline[i])) & fits
            if not ok.any():
                if view.meets(n, float(view.w_deadline[i])).any():
                    continue  # AFCFS waits for nodes
                ok = fits  # hopeless: AFCFS runs it anyway, as small as fits
                if not ok.any():
                    continue
            j = int(np.nonzero(ok.any(axis=0))[0][0])  # the smallest width that passes somewhere
            cs_a = np.nonzero(ok[:, j])[0]
            c = int(cs_a[np.argmax(speed[cs_a])])
            free[c] -= int(p.w[j])
            listed.append((i, c, j))
        for k in sorted(range(len(listed)), key=lambda k: (float(view.w_deadline[listed[k][0]]), k)):
            i, c, j = listed[k]
            p = view.profiles[int(view.w_profile[i])]
            jref = p.index_for_net(snet)
            if jref <= j:
                continue
            room = int(free[c]) + int(p.w[j])
            # a wider width is never slower (profiles do not grow with the width), so it meets the
            # deadline whenever AFCFS's width does
            best = max(jj for jj in range(j, jref + 1) if int(p.w[jj]) <= room)
            free[c] -= int(p.w[best]) - int(p.w[j])
            listed[k] = (i, c, best)
        return [Start(int(view.w_id[i]), c, int(view.profiles[int(view.w_profile[i])].w[j])) for i, c, j in listed]

    @staticmethod
    def _checksch(p: Profile, jref: int, ok: NDArray[np.bool_], area: NDArray[np.int64],
                  speed: NDArray[np.float64]) -> tuple[int, int] | None:
        """Steps 1-2: the width of snet, else the nearest passing width in each direction, the one
        using fewer node-slots (ties: the narrower)."""
        if ok[:, jref].any():
            cs = np.nonzero(ok[:, jref])[0]
            return int(cs[np.argmax(speed[cs])]), jref
        best: tuple[int, int, int] | None = None  # (area, cluster, j)
        for js in (range(jref - 1, -1, -1), range(jref + 1, ok.shape[1])):
            j = next((j for j in js if ok[:, j].any()), None)
            if j is None:
                continue
            cs = np.nonzero(ok[:, j])[0]
            c = int(cs[np.argmin(area[cs, j])])
            cand = (int(area[c, j]), c, j)
            if best is None or cand[0] < best[0]:
                best = cand
        return None if best is None else (best[1], best[2])

    @staticmethod
    def _sch1(view: SlotView, p: Profile, jref: int, meets: NDArray[np.bool_], free: NDArray[np.int64],
              running: NDArray[np.bool_], dl: float) -> tuple[int, int] | None:
        """Step 3: suspend running tasks with slack to make room; updates ``free`` and ``running``."""
        slack = np.floor(view.a_deadline / view.slot + EPS) - (view.now + 1 + view.a_rem)
        movable = running & (slack >= 0)
        order = sorted(range(len(p.widths)), key=lambda j: (abs(j - jref), -j))
        for j in order:
            width = int(p.w[j])
            best: tuple[int, int, NDArray[np.int64]] | None = None  # (nodes suspended, cluster, tasks)
            for cc in np.nonzero(meets[:, j])[0]:
                need = width - int(free[cc])
                ks = np.nonzero(movable & (view.a_cluster == cc))[0]
                if ks.size == 0:
                    continue
                ks = ks[np.argsort(-slack[ks], kind="stable")]
                got = np.cumsum(view.a_width[ks])
                reach = np.nonzero(got >= need)[0]
                if reach.size == 0:
                    continue
                take = ks[: int(reach[0]) + 1]
                cost = int(got[int(reach[0])])
                if best is None or cost < best[0]:
                    best = (cost, int(cc), take)
            if best is not None:
                _, c, take = best
                running[take] = False
                free[c] += int(view.a_width[take].sum())
                return c, int(j)
        return None
