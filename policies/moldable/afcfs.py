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

import numpy as np

from vmctl.policies.moldable.model import Decision, SlotView, Start, all_running


class AFCFS:
    name = "afcfs"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def decide(self, view: SlotView) -> Decision:
        running = all_running(view)
        free = view.free_nodes(running)
        starts: list[Start] = []
        for i in range(len(view.w_id)):  # arrival order
            p = view.profiles[int(view.w_profile[i])]
            n = view.slots_needed(float(view.w_length[i]), p)
            meets = view.meets(n, float(view.w_deadline[i]))
            fits = p.w[None, :] <= free[:, None]
            ok = meets & fits
            clusters = np.nonzero(ok.any(axis=1))[0]
            if clusters.size == 0:
                if meets.any():
                    continue  # could meet the deadline with more free nodes: wait
                ok = fits  # hopeless: run it anyway, as small as fits
                clusters = np.nonzero(ok.any(axis=1))[0]
                if clusters.size == 0:
                    continue
            c = int(clusters[int(self.rng.integers(clusters.size))])
            j = int(np.nonzero(ok[c])[0][0])
            width = int(p.w[j])
            starts.append(Start(int(view.w_id[i]), c, width))
            free[c] -= width
        return Decision(starts, running)
