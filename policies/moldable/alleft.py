"""ALL-EFT, "All Earliest Finish Time" task allocation (Y.-R. Wang, K.-C. Huang, F.-J. Wang, "Scheduling
online mixed-parallel workflows of rigid tasks in heterogeneous multi-cluster environments", FGCS 60,
2016; HSRET paper sec. 2 and 6, ref. [11]).

As the HSRET paper describes it: "ALL-EFT tries to select a parallelism for every task in every cluster
to ensure that the task has the minimum execution time, and repeat[s] the step until all tasks have been
scheduled" (sec. 6.3, O(I^2 cn maxp)); it "always waits for adequate resources to shorten the execution
time" (sec. 6.2.2) and "gives every task as many resources as possible under the system load".

At each slot boundary, over the waiting tasks (at most ``window`` of them, in arrival order):

1. for every task, cluster and width: the earliest slot at which that many nodes stay free for the
   task's whole forecast run (the free-node profile of the active tasks and of the reservations made so
   far in this round), and so its earliest finish time (EFT);
2. the (task, cluster, width) with the smallest EFT overall, ties to the shortest execution, then
   the fewest nodes, then the earliest arrival, is fixed: started now if its start is now, else
   reserved for this round only (reconsidered at the next boundary, since a width is fixed only at
   start);
3. repeat until every task has its slot.

**Choices**: Wang et al. allocate rigid tasks; here the width is part of the choice (the HSRET paper's
reading). Deadlines are ignored (EFT is the only criterion). ``window`` (default 200) bounds the
O(I^2) round when an overloaded queue grows (no effect at the paper's loads, where the queue stays
far shorter). ALL-EFT never suspends a started task.

**Load-capped ALL-EFT** (``AllEFT(cap=True)``, policy name ``all-eft-cap``). The HSRET paper says ALL-EFT
"always makes the task execute in the shortest execution time *under the system load requirement*"
(sec. 6.2.2) and "gives every task as many resources as possible *under the system load*" (sec.
6.2.3); the literal reading above has no load in it. **R**: the system load is HSRET's own estimate
(eqs. 2-8, :func:`vmctl.policies.moldable.hsret.select_net` with the load target ``target``, 1 by
default): each slot, a task may take only the widths at least as narrow as the width of the common
normalized time ``snet`` that keeps no slot overloaded, and EFT chooses among those. So the capped
variant widens only as far as the offered load allows; the literal one is kept beside it.

Tiny example: one cluster of 8 nodes, 4 of them busy for 2 more slots; a task needing 3 slots at width 4
or 2 slots at width 8: width 4 can start now and ends after 3 slots, width 8 starts in 2 slots and ends
after 4: EFT picks width 4 now. Capped, with the load allowing width 4 at most (snet's width), width 8
is not a candidate whatever the free nodes.
"""

from __future__ import annotations

import numpy as np

from vmctl.policies.moldable.availability import earliest_starts, free_profile, reach_rows, reserve
from vmctl.policies.moldable.model import Decision, SlotView, Start, all_running

_INF = 10**12
_KEY = 10**6  # slot counts stay far below this


class AllEFT:
    name = "all-eft"

    def __init__(self, window: int = 200, cap: bool = False, target: float = 1.0, reference: bool = False) -> None:
        from vmctl.policies.moldable.hsret import check_target

        self.reference = reference
        self.window = window
        self.cap = cap
        self.target = check_target(target)
        self.name = "all-eft-cap" if cap else "all-eft"
        #: per profile, how many of its widths (narrowest first) a task may take this slot
        self._limit: list[int] = []

    def _cluster_options(self, view: SlotView, free: np.ndarray, c: int, tasks: np.ndarray,
                         cache: dict[tuple[int, int], np.ndarray]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Best (finish, exec, width index, start) of each of ``tasks`` on cluster ``c``: the smallest
        finish, then the fewest slots (then the narrowest width)."""
        k = len(tasks)
        best_f = np.full(k, _INF, dtype=np.int64)
        best_n = np.full(k, _INF, dtype=np.int64)
        best_j = np.zeros(k, dtype=np.int64)
        best_s = np.zeros(k, dtype=np.int64)
        speed = view.clusters.speed[c]
        horizon = free.shape[1]
        for pi, p in enumerate(view.profiles):
            sel = np.nonzero(view.w_profile[tasks] == pi)[0]
            usable = int(np.searchsorted(p.w, view.clusters.nodes[c], side="right"))
            if self._limit:
                usable = min(usable, self._limit[pi])
            if sel.size == 0 or usable == 0:
                continue
            rows = cache.get((c, pi))
            if rows is None:
                rows = cache[(c, pi)] = reach_rows(free[c], p.w[:usable])
            n = np.maximum(1, np.ceil(view.w_length[tasks[sel]][:, None] * p.r[None, :usable] / speed / view.slot
                                      - 1e-9)).astype(np.int64)
            st = earliest_starts(rows, n)
            fin = np.where(st >= horizon, _INF, st + n)
            key = fin * _KEY + n  # lexicographic (finish, slots); argmin takes the narrowest on ties
            jb = np.argmin(key, axis=1)
            r = np.arange(sel.size)
            best_f[sel], best_n[sel], best_j[sel], best_s[sel] = fin[r, jb], n[r, jb], jb, st[r, jb]
        return best_f, best_n, best_j, best_s

    def decide(self, view: SlotView) -> Decision:
        running = all_running(view)
        tasks = np.arange(min(len(view.w_id), self.window), dtype=np.int64)
        starts: list[Start] = []
        if tasks.size == 0:
            return Decision(starts, running)
        self._limit = []
        if self.cap:
            from vmctl.policies.moldable.hsret import select_net

            _case, snet = select_net(view, self.target, self.reference)
            self._limit = [p.index_for_net(snet) + 1 for p in view.profiles]
        nclust = len(view.clusters.nodes)
        extra = 1 + int(np.ceil(view.w_length[tasks].max() / min(view.clusters.speed) / view.slot))
        free = free_profile(view, running, extra=extra)
        cache: dict[tuple[int, int], np.ndarray] = {}
        f = np.empty((nclust, tasks.size), dtype=np.int64)
        n = np.empty_like(f)
        j = np.empty_like(f)
        s = np.empty_like(f)
        for c in range(nclust):
            f[c], n[c], j[c], s[c] = self._cluster_options(view, free, c, tasks, cache)
        # a reservation on cluster c only delays EFTs on c, so the values computed before it are lower
        # bounds ("stale"): the best is recomputed only when a stale value comes out on top (exact)
        stale = np.zeros((nclust, tasks.size), dtype=np.bool_)
        wid = np.zeros_like(f)
        for pi, p in enumerate(view.profiles):
            m = view.w_profile[tasks] == pi
            wid[:, m] = p.w[j[:, m]]
        alive = np.ones(tasks.size, dtype=np.bool_)

        def recompute(c_best: int) -> None:
            # recompute every stale task of that cluster at once (one vectorized pass)
            redo = np.nonzero(stale[c_best] & alive)[0]
            fr, nr, jr, sr = self._cluster_options(view, free, c_best, tasks[redo], cache)
            f[c_best, redo], n[c_best, redo], j[c_best, redo], s[c_best, redo] = fr, nr, jr, sr
            for pi, p in enumerate(view.profiles):
                m = view.w_profile[tasks[redo]] == pi
                wid[c_best, redo[m]] = p.w[jr[m]]
            stale[c_best, redo] = False

        # the fast form keeps, per cluster, its alive tasks sorted by (EFT, execution, nodes, task) (valid
        # until the cluster's values are recomputed) and the position of the first one still alive
        alive_l = [True] * tasks.size
        orders: list[list[int]] = [[] for _ in range(nclust)]
        firsts = [0] * nclust

        def sort_row(c: int) -> None:
            cand = np.nonzero(alive)[0]
            orders[c] = cand[np.lexsort((cand, wid[c, cand], n[c, cand], f[c, cand]))].tolist()
            firsts[c] = 0

        def row_min(c: int) -> tuple[int, int, int, int]:
            """Cluster c's smallest (EFT, execution, nodes, task) over the alive tasks."""
            order, k = orders[c], firsts[c]
            while not alive_l[order[k]]:
                k += 1
            firsts[c] = k
            t = order[k]
            return int(f[c, t]), int(n[c, t]), int(wid[c, t]), t

        left = tasks.size
        best: list[tuple[int, int, int, int]] = []
        if not self.reference:
            for c in range(nclust):
                sort_row(c)
                best.append(row_min(c))
        while left:
            if self.reference:
                cand = np.nonzero(alive)[0]
                fc, nc, wc = f[:, cand], n[:, cand], wid[:, cand]
                # smallest EFT, then shortest execution, then fewest nodes, then arrival (lexsort: last key first)
                flat = int(np.lexsort((np.broadcast_to(cand, fc.shape).ravel(), wc.ravel(), nc.ravel(),
                                       fc.ravel()))[0])
                c_best, col = divmod(flat, cand.size)
                t = int(cand[col])
            else:
                # the same choice from each cluster's smallest: the smallest of those, ties to the
                # lower cluster (the flat order of the reference's lexsort)
                c_best = min(range(nclust), key=best.__getitem__)
                t = best[c_best][3]
            if stale[c_best, t]:
                recompute(c_best)
                if not self.reference:
                    sort_row(c_best)
                    best[c_best] = row_min(c_best)
                continue
            alive[t] = False
            alive_l[t] = False
            left -= 1
            if not self.reference and left:
                for c in range(nclust):
                    if best[c][3] == t:
                        best[c] = row_min(c)
            if f[c_best, t] >= _INF:
                continue  # too wide for every cluster: never placed
            width = int(wid[c_best, t])
            start = int(s[c_best, t])
            if start == 0:
                starts.append(Start(int(view.w_id[tasks[t]]), c_best, width))
            length = int(n[c_best, t])
            free = reserve(free, c_best, start, length, width)
            for pi in range(len(view.profiles)):
                cache.pop((c_best, pi), None)
            if self.reference:
                stale[c_best] = True
            else:
                stale[c_best, self._broken(free[c_best], start, length, f[c_best], n[c_best], s[c_best],
                                           wid[c_best], alive)] = True
        return Decision(starts, running)

    @staticmethod
    def _broken(row: np.ndarray, start: int, length: int, f: np.ndarray, n: np.ndarray, s: np.ndarray,
                wid: np.ndarray, alive: np.ndarray) -> np.ndarray:
        """After a reservation of slots [start, start + length) in a cluster's free-node ``row``: the
        alive tasks whose best option there (``s``, ``n``, ``wid``) no longer has its nodes. The others'
        best is unchanged: a reservation only removes free nodes, so every other option's finish can
        only grow, and the best one still starts when it did (the reference marks every task of the
        cluster stale and recomputes them; this marks only these, with the same values as a result)."""
        end = start + length
        k = np.flatnonzero((s < end) & (s + n > start) & alive & (f < _INF))
        if k.size == 0:
            return k
        seg = row[start:end]
        need = wid[k]
        if int(seg.min()) >= int(need.max()):
            return k[:0]  # every overlapping task still has its nodes
        col = np.arange(start, end)[None, :]
        inside = (col >= s[k][:, None]) & (col < (s[k] + n[k])[:, None])
        low = np.where(inside, seg[None, :], _INF).min(axis=1)
        out: np.ndarray = k[low < need]  # the row has the reservation already
        return out
