"""Dynamic workloads (sec. 6): re-allocate after the workload changed, moving at most ``B`` bytes.

``prev_hosts[i]`` is the host task i runs on now, or -1 for a task that just arrived (departed tasks
are simply not in the instance). Moving task i costs ``m_i`` (its memory, in host-memory units;
multiply by the host's memory size for bytes). Two solvers:

* ``dynamic_milp``: the exact MILP of sec. 6.1, i.e. sec. 2.5 plus
  ``sum_ij (1 - prev_ij) m_i e_ij <= B`` (new tasks have prev_ij = 1 for every host and move for
  free). HiGHS, with a time limit.
* ``dynamic_mcb``: our heuristic (the paper leaves heuristics to future work). For a trial yield Y
  every task that has a host stays there unless its host is over capacity at Y; an overloaded
  host evicts tasks in decreasing order of CPU freed per byte moved (``alpha_i / m_i``) until its
  CPU fits, then, if memory needs grew, in decreasing memory order until memory fits. If the
  evicted memory exceeds B the trial fails. The evicted and the new tasks are then packed around
  the tasks that stayed with the MCB8 two-list packing (``mcb.pack`` with per-host remaining
  capacities). The yield is found by the same probe-then-bisect search as MCB. An evicted task that
  lands back on its own host costs nothing; the reported cost is the memory actually moved.
  A second candidate is a full MCB8 re-pack whose bins are matched to the current hosts by a
  maximum-weight assignment (kept memory, ``scipy.optimize.linear_sum_assignment``); it replaces
  the first when it fits the budget and has a higher minimum yield (large budgets).

Example: 2 hosts; tasks A (0.6, mem 0.5) and B (0.6, mem 0.5) share host 0, C (0.6, mem 0.1) arrives.
With B = 0 nothing may move: C goes to host 1, host 0 keeps load 1.2, yield 1/1.2 = 0.833. With
B = 0.5 the heuristic evicts A or B at Y = 1, packs it with C on host 1 (load 1.2 there), and gets
0.833 again; the MILP confirms 0.833 is optimal since three tasks of 0.6 share two hosts.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from vmctl.policies.vcsched.avgyield import finish
from vmctl.policies.vcsched.instance import EPS, Instance, IntArray, Solution, placement_yield
from vmctl.policies.vcsched.mcb import DEFAULT_TOL, lists, pack, search
from vmctl.policies.vcsched.milp import solve_milp


def migration_cost(inst: Instance, prev_hosts: npt.NDArray[np.int64], hosts: tuple[int, ...] | IntArray) -> float:
    """Memory moved (host-memory units) going from ``prev_hosts`` to ``hosts``."""
    new = np.asarray(hosts, dtype=np.int64)
    moved = (prev_hosts >= 0) & (new >= 0) & (new != prev_hosts)
    return float(inst.mem_a[moved].sum())


def _check_prev(inst: Instance, prev_hosts: npt.NDArray[np.int64]) -> None:
    if prev_hosts.shape != (inst.n_tasks,):
        raise ValueError(f"prev_hosts must have one entry per task ({inst.n_tasks}), got shape {prev_hosts.shape}")
    if prev_hosts.size and (prev_hosts.max() >= inst.hosts or prev_hosts.min() < -1):
        raise ValueError("prev_hosts entries must be -1 or a host index")


def dynamic_milp(
    inst: Instance, prev_hosts: npt.NDArray[np.int64], budget: float, time_limit: float | None = 60.0
) -> Solution:
    prev = np.asarray(prev_hosts, dtype=np.int64)
    _check_prev(inst, prev)
    return solve_milp(inst, time_limit=time_limit, prev_hosts=prev, budget=budget, name="dyn-milp")


def _attempt(inst: Instance, prev: IntArray, budget: float, y: float, variant: int) -> IntArray | None:
    c = inst.cpu_a * y
    m = inst.mem_a
    h = inst.hosts
    stay = prev >= 0
    load = np.bincount(prev[stay], weights=c[stay], minlength=h)
    used = np.bincount(prev[stay], weights=m[stay], minlength=h)
    evicted: list[int] = []
    spent = 0.0
    for j in np.flatnonzero((load > 1.0 + EPS) | (used > 1.0 + EPS)).tolist():
        tasks = np.flatnonzero(prev == j)
        with np.errstate(divide="ignore", over="ignore"):
            ratio = np.where(m[tasks] > 0, c[tasks] / np.where(m[tasks] > 0, m[tasks], 1.0), np.inf)
        cpu_order = tasks[np.argsort(-ratio, kind="stable")].tolist()
        lj, uj = float(load[j]), float(used[j])
        out: set[int] = set()
        for t in cpu_order:
            if lj <= 1.0 + EPS:
                break
            out.add(t)
            lj -= float(c[t])
            uj -= float(m[t])
        if uj > 1.0 + EPS:
            for t in tasks[np.argsort(-m[tasks], kind="stable")].tolist():
                if uj <= 1.0 + EPS:
                    break
                if t not in out:
                    out.add(t)
                    lj -= float(c[t])
                    uj -= float(m[t])
        for t in sorted(out):
            evicted.append(t)
            spent += float(m[t])
        load[j], used[j] = lj, uj
        if spent > budget + EPS:
            return None
    todo = np.asarray(sorted(set(np.flatnonzero(~stay).tolist()) | set(evicted)), dtype=np.int64)
    hosts = prev.copy()
    hosts[todo] = -1
    if todo.size == 0:
        return hosts
    la, lb = lists(variant, c[todo], m[todo])
    got = pack(c, m, todo[la], todo[lb], np.maximum(1.0 - load, 0.0), np.maximum(1.0 - used, 0.0))
    if got is None:
        return None
    hosts[todo] = got[todo]
    return hosts


def dynamic_mcb(
    inst: Instance,
    prev_hosts: npt.NDArray[np.int64],
    budget: float,
    variant: int = 8,
    tol: float = DEFAULT_TOL,
) -> Solution:
    prev = np.asarray(prev_hosts, dtype=np.int64)
    _check_prev(inst, prev)
    name = "dyn-mcb"
    if float(inst.mem_a.sum()) > inst.hosts + EPS:
        return finish(inst, name, None)
    hi = min(1.0, inst.hosts / float(inst.cpu_a.sum()))
    probes = 1
    best = _attempt(inst, prev, budget, hi, variant)
    if best is None:
        lo = 0.0
        stop = tol * hi
        while hi - lo > stop:
            mid = 0.5 * (lo + hi)
            probes += 1
            got = _attempt(inst, prev, budget, mid, variant)
            if got is not None:
                best, lo = got, mid
            else:
                hi = mid
    # Second candidate: a full MCB8 re-pack whose bins are matched to the current hosts so as to keep
    # as much memory in place as possible (an assignment problem); taken when it fits the budget
    # and its minimum yield is higher.
    ones = np.ones(inst.hosts)
    fresh, _y, more = search(inst.cpu_a, inst.mem_a, variant, ones, ones.copy(), tol)
    probes += more
    if fresh is not None:
        fresh = _match_hosts(inst, prev, fresh)
        if migration_cost(inst, prev, fresh) <= budget + EPS and (
            best is None or placement_yield(inst, fresh) > placement_yield(inst, best) + 1e-12
        ):
            best = fresh
    return finish(inst, name, best, work=probes)


def _match_hosts(inst: Instance, prev: IntArray, hosts: IntArray) -> IntArray:
    """Relabel the bins of ``hosts`` to maximize the memory of tasks that stay on their host."""
    h = inst.hosts
    stay = prev >= 0
    keep = np.zeros((h, h))
    np.add.at(keep, (hosts[stay], prev[stay]), inst.mem_a[stay] + 1e-9)  # +1e-9: count tasks too
    rows, cols = linear_sum_assignment(keep, maximize=True)
    label = np.empty(h, dtype=np.int64)
    label[rows] = cols
    out: IntArray = label[hosts]
    return out
