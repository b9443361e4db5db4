"""Multi-capacity bin packing inside a binary search on the yield (sec. 3.4): MCB1 .. MCB8.

For a trial minimum yield Y every task needs ``Y * alpha_i`` CPU and ``m_i`` memory, both fixed, and
the question becomes 2-dimensional bin packing. The packing is the two-list heuristic of Leinberger,
Karypis and Kumar (ICPP 1999) for d = 2:

1. split the tasks into a CPU-heavy list (CPU need > memory need) and a memory-heavy list (the rest),
   each sorted by the variant's key (stable, ties by task index);
2. fill hosts one at a time. For the current host, scan the list that goes *against* the host's
   imbalance (more CPU than memory left: the CPU-heavy list; otherwise the memory-heavy list) for
   the first task that fits; if none fits, scan the other list; place it and repeat. When nothing
   fits, move to the next host. Success when every task is placed.

Keys: MCB1 mem+cpu ascending, MCB2 max-min asc., MCB3 max/min asc., MCB4 max asc., MCB5..MCB8 the
same keys descending (MCB5 is Leinberger's; MCB8, max descending, is the paper's best).

Search: the yield lies in [0, hi] with ``hi = min(1, total CPU capacity / sum alpha)``. We probe
``hi`` first (when it packs it is optimal and the search stops at once); otherwise we gallop down,
probing ``hi * (1 - d)`` for d = 0.01, 0.04, 0.16, 0.64 until one packs, then bisect between that
success and the lowest failure until the interval is narrower than ``tol * hi`` (1e-3 by default).
After a success the search continues from the yield that placement really supports
(``min_j capacity_j / load_j``), which is often above the probe. The paper starts a plain bisection
at hi/2; galloping needs about 6 probes instead of 11 when, as usual, the answer is within a few % of
the bound. The packing is not monotone in Y (a placement can fail at Y and succeed at a larger Y),
so like the paper's this is a heuristic search. The final minimum yield is that of the best
placement (``min(1, 1/max load)``), followed by the average pass.

Reading chosen where the paper is silent: on a host with as much CPU as memory left (an empty host),
the memory-heavy list is scanned first.

Speed: a task that does not fit the current host never fits it later (capacities only shrink), so
each list is scanned once per host with a pointer. The scan runs in Python for a few steps and then
switches to a numpy mask over the rest of the list, which makes the "nothing fits any more" check at
the end of each host O(1) Python work. ``pack`` also takes per-host starting capacities, which the
dynamic heuristic (``dynamic.py``) uses to pack around tasks that stay where they are.

Example: 2 hosts; tasks (alpha, mem) = (0.8, 0.2), (0.8, 0.2), (0.2, 0.7), (0.2, 0.7). At Y = 1
MCB8 lists: CPU-heavy [0, 1], memory-heavy [2, 3]. Host 0 is balanced, so it takes task 2 from the
memory-heavy list (mem left 0.3, CPU left 0.8), then scans the CPU-heavy list and takes task 0
(left 0.0 CPU, 0.1 memory); host 1 gets tasks 3 and 1 the same way: minimum yield 1.
"""

from __future__ import annotations

import numpy as np

from vmctl.policies.vcsched.avgyield import finish
from vmctl.policies.vcsched.instance import EPS, FloatArray, Instance, IntArray, Solution

VARIANTS = tuple(range(1, 9))
DEFAULT_TOL = 1e-3
_SCAN_PY = 12  # Python scan steps before switching to a numpy mask
_COMPACT_ALWAYS = 2048  # lists up to this length drop placed tasks after every host
_GALLOP = (0.01, 0.04, 0.16, 0.64)  # after the bound fails, probe bound * (1 - drop) before bisecting


def sort_key(variant: int, c: FloatArray, m: FloatArray) -> FloatArray:
    """The variant's sort key (larger = later for ascending variants 1-4)."""
    kind = (variant - 1) % 4
    if kind == 0:
        out: FloatArray = c + m
    elif kind == 1:
        out = np.abs(c - m)
    elif kind == 2:
        hi, lo = np.maximum(c, m), np.minimum(c, m)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = np.where(lo > 0, hi / np.where(lo > 0, lo, 1.0), np.where(hi > 0, np.inf, 1.0))
    else:
        out = np.maximum(c, m)
    return out


def lists(variant: int, c: FloatArray, m: FloatArray) -> tuple[IntArray, IntArray]:
    """(CPU-heavy, memory-heavy) task indices, each sorted by the variant's key."""
    if variant not in VARIANTS:
        raise ValueError(f"MCB variant must be 1..8, got {variant}")
    key = sort_key(variant, c, m)
    if variant >= 5:
        key = -key
    order = np.argsort(key, kind="stable")
    heavy_cpu = c[order] > m[order]
    return order[heavy_cpu].astype(np.int64), order[~heavy_cpu].astype(np.int64)


def pack(
    c: FloatArray,
    m: FloatArray,
    list_cpu: IntArray,
    list_mem: IntArray,
    cap_c: FloatArray,
    cap_m: FloatArray,
) -> IntArray | None:
    """Two-list packing of the tasks in ``list_cpu`` + ``list_mem`` (needs ``c``, ``m``) onto hosts with
    remaining capacities ``cap_c``/``cap_m``, host by host. Returns the host of every listed task
    (-1 for tasks not listed) or None when some task does not fit."""
    n = c.size
    hosts = np.full(n, -1, dtype=np.int64)
    c_l: list[float] = c.tolist()
    m_l: list[float] = m.tolist()
    # Per list: task indices (numpy and Python) and their needs (numpy). Short lists drop their placed
    # tasks after every host (within a host, placed tasks are behind the scan pointer). Long lists
    # ("lazy") only flag placed tasks as dead (numpy for the vectorized scan, bytearray for the
    # Python scan) and are compacted when more than half of them is dead.
    idx = [list_cpu, list_mem]
    py: list[list[int]] = [list_cpu.tolist(), list_mem.tolist()]
    cs = [c[list_cpu], c[list_mem]]
    ms = [m[list_cpu], m[list_mem]]
    lazy = [list_cpu.size > _COMPACT_ALWAYS, list_mem.size > _COMPACT_ALWAYS]
    alive = [np.ones(list_cpu.size if lazy[0] else 0, dtype=bool), np.ones(list_mem.size if lazy[1] else 0, dtype=bool)]
    alive_py = [bytearray(b"\x01") * alive[0].size, bytearray(b"\x01") * alive[1].size]
    dead = [0, 0]
    placed = [0, 0]
    head = [0, 0]  # first alive position of each lazy list
    left = list_cpu.size + list_mem.size
    caps_c: list[float] = cap_c.tolist()
    caps_m: list[float] = cap_m.tolist()
    for j in range(len(caps_c)):
        if left == 0:
            break
        cc = caps_c[j] + EPS
        mm = caps_m[j] + EPS
        ptr = [head[0], head[1]]
        while True:
            first = 0 if cc > mm else 1  # against the imbalance; ties: memory-heavy first
            got = -1
            side = first
            p = 0
            for side in (first, 1 - first):
                lst = py[side]
                p = ptr[side]
                end = len(lst)
                stop = p + _SCAN_PY
                if stop > end:
                    stop = end
                if lazy[side]:
                    ok = alive_py[side]
                    while p < stop:
                        t = lst[p]
                        if ok[p] and c_l[t] <= cc and m_l[t] <= mm:
                            got = t
                            break
                        p += 1
                else:
                    while p < stop:
                        t = lst[p]
                        if c_l[t] <= cc and m_l[t] <= mm:
                            got = t
                            break
                        p += 1
                if got < 0 and p < end:
                    fit = (cs[side][p:] <= cc) & (ms[side][p:] <= mm)
                    if lazy[side]:
                        fit &= alive[side][p:]
                    k = int(fit.argmax())
                    if fit[k]:
                        p += k
                        got = lst[p]
                    else:
                        p = end
                if got >= 0:
                    ptr[side] = p + 1
                    break
                ptr[side] = p
            if got < 0:
                break
            hosts[got] = j
            if lazy[side]:
                alive[side][p] = False
                alive_py[side][p] = 0
                dead[side] += 1
            placed[side] += 1
            cc -= c_l[got]
            mm -= m_l[got]
            left -= 1
        for sd in (0, 1):
            if not placed[sd]:
                continue
            placed[sd] = 0
            if not lazy[sd] or dead[sd] * 2 > len(py[sd]):
                keep = hosts[idx[sd]] < 0
                idx[sd] = idx[sd][keep]
                cs[sd] = cs[sd][keep]
                ms[sd] = ms[sd][keep]
                py[sd] = idx[sd].tolist()
                lazy[sd] = idx[sd].size > _COMPACT_ALWAYS
                size = idx[sd].size if lazy[sd] else 0
                alive[sd] = np.ones(size, dtype=bool)
                alive_py[sd] = bytearray(b"\x01") * size
                dead[sd] = 0
                head[sd] = 0
            else:
                ok, h, end = alive_py[sd], head[sd], len(py[sd])
                while h < end and not ok[h]:
                    h += 1
                head[sd] = h
    return hosts if left == 0 else None


def search(
    alpha: FloatArray,
    m: FloatArray,
    variant: int,
    cap_c: FloatArray,
    cap_m: FloatArray,
    tol: float = DEFAULT_TOL,
    subset: IntArray | None = None,
) -> tuple[IntArray | None, float, int]:
    """Binary search on the yield; returns (placement of the best packing, its probe yield, number of
    probes). ``subset`` restricts the packing to some tasks (the others keep host -1)."""
    idx = np.arange(alpha.size, dtype=np.int64) if subset is None else subset
    if float(m[idx].sum()) > float(cap_m.sum()) + EPS:
        return None, 0.0, 0
    total = float(alpha[idx].sum())
    hi = 1.0 if total <= 0 else min(1.0, float(cap_c.sum()) / total)
    probes = 0

    def attempt(y: float) -> IntArray | None:
        nonlocal probes
        probes += 1
        c = alpha * y
        la, lb = lists(variant, c[idx], m[idx])
        return pack(c, m, idx[la], idx[lb], cap_c, cap_m)

    got = attempt(hi)
    if got is not None:
        return got, hi, probes
    best: IntArray | None = None
    best_y = 0.0
    stop = tol * hi  # relative to the bound, so an infeasible instance stops after a bounded number of probes

    def real_yield(hosts: IntArray) -> float:
        """The yield the placement supports (often above the probe that found it)."""
        sel = hosts[idx]
        load = np.bincount(sel, weights=alpha[idx], minlength=cap_c.size)
        with np.errstate(divide="ignore", over="ignore"):
            return float(np.min(np.where(load > 0, cap_c / np.where(load > 0, load, 1.0), np.inf)))

    # gallop down from the bound: good placements are usually within a few % of it
    lo, top = 0.0, hi
    for drop in _GALLOP:
        y = hi * (1.0 - drop)
        got = attempt(y)
        if got is not None:
            best, best_y, lo = got, y, max(y, min(real_yield(got), top))
            break
        top = y
    # then bisect between the best success and the lowest failure
    while top - lo > stop:
        mid = 0.5 * (lo + top)
        got = attempt(mid)
        if got is not None:
            best, best_y, lo = got, mid, max(mid, min(real_yield(got), top))
        else:
            top = mid
    return best, best_y, probes


def mcb(inst: Instance, variant: int = 8, tol: float = DEFAULT_TOL) -> Solution:
    name = f"mcb{variant}"
    ones = np.ones(inst.hosts)
    hosts, _y, probes = search(inst.cpu_a, inst.mem_a, variant, ones, ones.copy(), tol)
    return finish(inst, name, hosts, work=probes)
