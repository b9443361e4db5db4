"""How one core's capacity is split among the processes that demand it: one rule for the mock backend
(``vmctl.agents.backends.mock``, a VM's process demands its ``cpu_usage`` of a core) and the simulator's
task-bag model (``vmctl.sim.exec_taskbag``, a busy worker demands its task's CPU usage), so that a
mock testbed and the simulator share a core the same way (issue 12: paper 001's testbed tasks sleep).

The rule: strict priority by weight (the highest-weight demands are served first, as MEASY sec. 2.1's
fg/bg tiers intend), max-min fair among equal weights (water-filling: equal shares, and a demand smaller
than its share keeps only what it asks, the rest going to the others). A process that demands u and
is allocated a progresses at ``a / u`` dedicated-core seconds per second. Example, one core, equal
weights: two demands of 1.0 get 0.5 each (two CPU-bound processes at half speed); 1.0 and 0.25 get 0.75
and 0.25 (the first at 0.75 of full speed, the second at full speed); two of 0.01 (two processes that
mostly sleep) get 0.01 each: both at full speed.

Pure: it imports nothing of vmctl (tests/unit/test_import_boundaries.py)."""

from __future__ import annotations

from collections.abc import Sequence

#: demands and leftovers below this are nothing (rounding of the water-filling)
EPS = 1e-9


def share_core(demands: Sequence[tuple[int, float]], capacity: float) -> list[float]:
    """Split ``capacity`` among ``(weight, demand)`` pairs: strict priority by weight, max-min fair
    (water-filling) among equal weights. Returns the allocation of each pair, in input order.

    >>> share_core([(10000, 0.5), (1, 1.0)], 1.0)
    [0.5, 0.5]
    >>> share_core([(5, 1.0), (5, 0.2)], 1.0)
    [0.8, 0.2]
    """
    alloc = [0.0] * len(demands)
    left = capacity
    for w in sorted({w for w, _ in demands}, reverse=True):
        group = [i for i, (wi, _) in enumerate(demands) if wi == w]
        pending = sorted(group, key=lambda i: demands[i][1])
        while pending and left > EPS:
            share = left / len(pending)
            i = pending[0]
            if demands[i][1] <= share + EPS:
                alloc[i] = demands[i][1]
                left -= demands[i][1]
                pending.pop(0)
            else:
                for j in pending:
                    alloc[j] = share
                left = 0.0
                pending = []
        left = max(0.0, left)
    return alloc


def shared_rate(cap: float | None, need: float) -> float:
    """Pace of a job of capped shared VMs (vcsched): each VM would use ``need`` of one core alone and
    gets ``cap`` of one core (``None``: uncapped), so it advances at ``min(1, cap / need)`` (VCSCHED's
    yield, Casanova et al. sec. 2). One rule for the simulator (``vmctl.sim.execution``) and vmctld's
    progress accounting (``vmctl.daemon.state``); on the mock backend a shared VM's process demands
    ``need`` of its core and its cap limits it, which gives the same pace.

    >>> shared_rate(0.3, 0.6), shared_rate(0.4, 0.4)
    (0.5, 1.0)
    """
    if cap is None or cap >= need:
        return 1.0
    return cap / need
