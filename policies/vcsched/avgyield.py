"""The average-yield pass of sec. 3.5, run after every algorithm.

Once an algorithm has fixed where every task runs, the minimum yield of that placement is
``Y = min(1, min_j 1 / load_j)`` (``load_j`` = sum of the CPU needs on host j). Every task first
gets ``alloc_i = Y * cpu_i``; what is left on a host is then handed out to its tasks in increasing
order of CPU need, each filled up to its need before the next one gets anything. A unit of CPU
buys ``1 / cpu_i`` of yield, so the smallest needs come first; the paper proves this greedy optimal
for the average yield with placements fixed (an exchange argument), and a test checks it against
HiGHS on random placements.

Example: one host, tasks of need 0.2, 0.5, 0.6 (load 1.3, Y = 1/1.3 = 0.769): base allocations
0.154, 0.385, 0.462 use the whole host, nothing is left, average yield 0.769. With needs 0.2 and
0.5 only (load 0.7), Y = 1 and both get their full need.

Parallel jobs (sec. 5) use a per-job yield and equal allocations for the tasks of a job; their pass
is a small LP solved in ``parallel.py``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from vmctl.policies.vcsched.instance import FloatArray, Instance, Solution, Status, placement_yield, yields


def greedy_average(inst: Instance, hosts: npt.NDArray[np.int64], y_min: float) -> FloatArray:
    """Optimal average-yield allocation for a fixed placement, every task at least ``y_min``."""
    cpu = inst.cpu_a
    base = cpu * y_min
    load = np.bincount(hosts, weights=base, minlength=inst.hosts)
    left = np.maximum(1.0 - load, 0.0)
    extra_need = cpu - base
    order = np.lexsort((np.arange(cpu.size), cpu, hosts))  # by host, then need, then index
    h_sorted = hosts[order]
    need_sorted = extra_need[order]
    csum = np.cumsum(need_sorted)
    # cumulative need of the earlier tasks on the same host
    start = np.searchsorted(h_sorted, h_sorted, side="left")
    before = csum - need_sorted - np.where(start > 0, csum[start - 1], 0.0)
    give = np.clip(left[h_sorted] - before, 0.0, need_sorted)
    alloc = base.copy()
    alloc[order] += give
    return np.minimum(alloc, cpu)


def finish(
    inst: Instance,
    algorithm: str,
    hosts: npt.NDArray[np.int64] | None,
    status: Status = "ok",
    work: int = 0,
) -> Solution:
    """Turn a placement into a Solution: best minimum yield of the placement, then the average
    pass. ``hosts=None`` means the algorithm found nothing."""
    from vmctl.policies.vcsched.instance import failed

    if hosts is None:
        return failed(algorithm, inst, "infeasible" if status == "ok" else status, work)
    hosts = np.asarray(hosts, dtype=np.int64)
    y = placement_yield(inst, hosts)
    if y < 0:  # memory exceeded: an algorithm bug, never reported as a result
        raise AssertionError(f"{algorithm}: placement exceeds a host's memory")
    if inst.is_parallel:
        from vmctl.policies.vcsched.parallel import job_average

        alloc = job_average(inst, hosts, y)
    else:
        alloc = greedy_average(inst, hosts, y)
    lo, avg = yields(inst, alloc)
    return Solution(algorithm, status, tuple(hosts.tolist()), tuple(alloc.tolist()), lo, avg, work)
