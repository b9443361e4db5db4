"""CBSP, after M. Beji and S. Achour, "Resizing of Heterogeneous Platforms and the Optimization of
Parallel Applications", PDP 2018 (HSRET paper sec. 2 and 6, ref. [26]).

What the HSRET paper gives: CBSP "tried to schedule parallel application by resizing the application
and finding the appropriate sub-platform with the optimal number of resources (clusters, processors)
from the original platform. There are three steps: firstly, determining of the computing clusters;
secondly, determining the optimal number of processors in each cluster; finally placing the tasks on
the appropriate processors" (sec. 2); "it always assigns resources according to the system load"
(sec. 6.2.1) and "sometimes is required to wait for resources for the selected parallelism" (6.2.2).

At each slot boundary, in arrival order, for each waiting task:

1. **cluster**: the one with the most free computing power now (free nodes x node speed; ties to the
   lower index);
2. **processors**: the platform is resized to the load: the task's share is the free nodes of the
   whole platform divided by the number of waiting tasks not yet placed in this round; the width is
   the largest allowed width within that share (at least ``minp``), capped by the cluster's size;
3. **placement**: if that width fits in the cluster's free nodes now, the task starts; otherwise it
   waits for that width (it is reconsidered, from step 1, at the next boundary).

**Choices** (the PDP paper is not public here; these steps are our reading of the three sentences
above): the share rule of step 2 and the cluster rule of step 1. Deadlines are not used. CBSP never
suspends a started task.

Tiny example: 2 clusters of 8 nodes (speeds 1.0, 1.2), nothing running, 3 waiting tasks with widths
(2, 4, 8): the first sees 16 free / 3 tasks = share 5, so width 4 on cluster 1 (8 x 1.2 > 8 x 1.0);
the second sees 12 / 2 = 6: width 4 on cluster 0 (8 > 4 x 1.2); the third sees 8 / 1: width 8, which
fits nowhere (4 free on each), so it waits.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING

import numpy as np

from vmctl.policies.moldable.model import Decision, SlotView, Start, all_running

if TYPE_CHECKING:
    from numpy.typing import NDArray


class CBSP:
    """CBSP (module docstring). ``reference``: the plain form with numpy per task; the default makes
    the same decisions on Python integers (the products free x speed are the same floats, the
    largest width within a bound is a bisection of the sorted widths)."""

    name = "cbsp"

    def __init__(self, reference: bool = False) -> None:
        self.reference = reference

    def decide(self, view: SlotView) -> Decision:
        running = all_running(view)
        free = view.free_nodes(running)
        if self.reference:
            return Decision(self._reference(view, free), running)
        spd: list[float] = view.clusters.s.tolist()
        nodes = list(view.clusters.nodes)
        freel: list[int] = free.tolist()
        ncl = len(freel)
        widths = [list(p.widths) for p in view.profiles]
        prof: list[int] = view.w_profile.tolist()
        ids: list[int] = view.w_id.tolist()
        total = sum(freel)
        starts: list[Start] = []
        waiting = len(ids)
        for i in range(waiting):
            ws = widths[prof[i]]
            power = [f * s for f, s in zip(freel, spd, strict=True)]
            c = max(range(ncl), key=power.__getitem__)  # the first of the largest, as np.argmax
            share = total // (waiting - i)
            k = bisect_right(ws, min(max(share, ws[0]), nodes[c])) - 1
            if k < 0:
                continue  # wider than the chosen cluster at its smallest width
            width = ws[k]
            if width <= freel[c]:
                starts.append(Start(ids[i], c, width))
                freel[c] -= width
                total -= width
        return Decision(starts, running)

    @staticmethod
    def _reference(view: SlotView, free: NDArray[np.int64]) -> list[Start]:
        speed = view.clusters.s
        nodes = view.clusters.n
        starts: list[Start] = []
        waiting = len(view.w_id)
        for i in range(waiting):
            p = view.profiles[int(view.w_profile[i])]
            c = int(np.argmax(free * speed))
            share = int(free.sum()) // (waiting - i)
            fitting = np.nonzero((p.w <= max(share, p.minp)) & (p.w <= nodes[c]))[0]
            if fitting.size == 0:
                continue  # wider than the chosen cluster at its smallest width
            width = int(p.w[fitting[-1]])
            if width <= free[c]:
                starts.append(Start(int(view.w_id[i]), c, width))
                free[c] -= width
        return starts
