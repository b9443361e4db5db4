"""AFCFS, "Adapted First Come First Served" (HSRET paper sec. 6, after its refs. [5, 23, 25]).

The paper's whole description: AFCFS "schedules parallel tasks as First Come First Served policy, and
randomly select[s] one cluster which ensures the parallel task can be finished before its deadline ...
[and] always prefer[s] to select the minimum parallelism that ensures the tasks can be executed before
their deadlines"; "AFCFS always allocate[s] resources once they come and with the smallest resources
requirement" (sec. 6.2.2).

At each slot boundary, in arrival order, for each waiting task:

1. the clusters where some width fits in the free nodes now and ends by the deadline (started now,
   running every slot); one of them drawn uniformly at random (``rng``);
2. in that cluster, the smallest such width.

**Choices where the paper says nothing**: a task that no cluster can serve in time *now* but could
later (too few free nodes) waits, and the tasks behind it are still tried (list scheduling, not strict
FCFS: "allocate resources once they come"). A task that can no longer meet its deadline at all runs
anyway, at the smallest width that fits, on a random cluster where it fits (it counts as unfinished in
PUT). AFCFS never suspends a started task.

Tiny example: 2 clusters of 8 nodes, speeds 1.0 and 0.8, SL 100, a task of length 300 with widths
(2, 4), rel (1, 0.5), deadline 250, arriving at 0, decided at slot 0: width 2 needs 3 slots (ends at
300 > 250) on both; width 4 needs ceil(150 / 100) = 2 slots on cluster 0 (ends 200) and
ceil(187.5 / 100) = 2 on cluster 1: both clusters qualify, one is drawn, width 4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vmctl.policies.moldable.model import Decision, SlotView, Start, all_running, deadline_table, monotone

if TYPE_CHECKING:
    from numpy.typing import NDArray


class AFCFS:
    """AFCFS (module docstring). ``reference``: the plain form, numpy on each task's (cluster x width)
    table; the default makes the same decisions (and the same random draws) from
    :func:`~vmctl.policies.moldable.model.deadline_table`: with times that never grow with the width,
    cluster ``c`` serves a task in time now iff the first width that meets its deadline there,
    ``lo[c]``, fits in its free nodes, and that width is the smallest such."""

    name = "afcfs"

    def __init__(self, rng: np.random.Generator, reference: bool = False) -> None:
        self.rng = rng
        self.reference = reference

    def decide(self, view: SlotView) -> Decision:
        running = all_running(view)
        free = view.free_nodes(running)
        if self.reference:
            return Decision(self._reference(view, free), running)
        starts: list[Start] = []
        mono = [monotone(p) for p in view.profiles]
        widths = [list(p.widths) for p in view.profiles]
        table = deadline_table(view, range(len(view.w_id)))
        prof: list[int] = view.w_profile.tolist()
        ids: list[int] = view.w_id.tolist()
        freel: list[int] = free.tolist()
        ncl = len(freel)
        for i in range(len(ids)):  # arrival order
            pi = prof[i]
            if not mono[pi]:
                got = self._one(view, i, free)
                freel = free.tolist()
                if got is not None:
                    starts.append(got)
                continue
            ws = widths[pi]
            nw = len(ws)
            lo = table[i][1]
            clusters = [c for c in range(ncl) if lo[c] < nw and freel[c] >= ws[lo[c]]]
            if clusters:
                c = clusters[int(self.rng.integers(len(clusters)))]
                j = lo[c]
            else:
                if min(lo) < nw:
                    continue  # could meet the deadline with more free nodes: wait
                clusters = [c for c in range(ncl) if freel[c] >= ws[0]]  # hopeless: as small as fits
                if not clusters:
                    continue
                c = clusters[int(self.rng.integers(len(clusters)))]
                j = 0
            starts.append(Start(ids[i], c, ws[j]))
            free[c] -= ws[j]
            freel[c] -= ws[j]
        return Decision(starts, running)

    def _reference(self, view: SlotView, free: NDArray[np.int64]) -> list[Start]:
        starts: list[Start] = []
        for i in range(len(view.w_id)):  # arrival order
            got = self._one(view, i, free)
            if got is not None:
                starts.append(got)
        return starts

    def _one(self, view: SlotView, i: int, free: NDArray[np.int64]) -> Start | None:
        """Waiting task ``i``'s start, or None when it waits; updates ``free``."""
        p = view.profiles[int(view.w_profile[i])]
        n = view.slots_needed(float(view.w_length[i]), p)
        meets = view.meets(n, float(view.w_deadline[i]))
        fits = p.w[None, :] <= free[:, None]
        ok = meets & fits
        clusters = np.nonzero(ok.any(axis=1))[0]
        if clusters.size == 0:
            if meets.any():
                return None  # could meet the deadline with more free nodes: wait
            ok = fits  # hopeless: run it anyway, as small as fits
            clusters = np.nonzero(ok.any(axis=1))[0]
            if clusters.size == 0:
                return None
        c = int(clusters[int(self.rng.integers(clusters.size))])
        j = int(np.nonzero(ok[c])[0][0])
        width = int(p.w[j])
        free[c] -= width
        return Start(int(view.w_id[i]), c, width)
