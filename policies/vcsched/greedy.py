"""Greedy algorithms of sec. 3.3: GR, SG, GB, SGB.

GR takes the tasks in the given (arbitrary, here: index) order; for each it ranks the hosts by CPU
load (the sum of the full needs alpha of the tasks already there, ties by host index) and puts the
task on the least loaded host where its memory fits. SG first sorts the tasks by decreasing memory
need (stable). The placement then gets its best minimum yield ``min(1, 1 / max load)`` and the
average pass (``avgyield.py``).

GB and SGB add depth-first backtracking: when a task fits on no host, the previous task moves to its
next candidate host (in the load order computed when that task was first placed), and so on. Every
host tried counts as one placement attempt; the search gives up after ``max_attempts`` (500,000 in
the paper). Reading chosen: the paper's "job placement attempts" counts each host tried, fitting or
not; identical empty hosts are not merged (the paper does not prune symmetric branches).

Example: 2 hosts, tasks (cpu, mem) = (0.5, 0.6), (0.5, 0.6), (0.2, 0.5) in that order: GR puts task
0 on host 0, task 1 on host 1 (host 0 has load 0.5 and no memory left), then task 2 fits nowhere
(0.6 + 0.5 > 1) and GR fails. SG does the same (memory order is the index order). GB backtracks
through every choice and also fails: no host can take two of these tasks. With task 2's memory at 0.4 everything
fits: task 2 goes to host 0 (load 0.5, ties by index) and the minimum yield is 1.
"""

from __future__ import annotations

import numpy as np

from vmctl.policies.vcsched.avgyield import finish
from vmctl.policies.vcsched.instance import EPS, Instance, Solution

DEFAULT_MAX_ATTEMPTS = 500_000
_VECTOR_HOSTS = 48  # above this many hosts GR/SG pick the host with one numpy pass per task


def _order(inst: Instance, sort_by_memory: bool) -> list[int]:
    if not sort_by_memory:
        return list(range(inst.n_tasks))
    return np.argsort(-inst.mem_a, kind="stable").tolist()  # type: ignore[no-any-return]


def greedy(inst: Instance, sort_by_memory: bool = False, name: str = "gr") -> Solution:
    """GR (``sort_by_memory=False``) or SG."""
    h = inst.hosts
    cpu = inst.cpu
    mem = inst.mem
    if h > _VECTOR_HOSTS:
        return _greedy_numpy(inst, sort_by_memory, name)
    load = [0.0] * h
    used = [0.0] * h
    hosts = [-1] * inst.n_tasks
    for i in _order(inst, sort_by_memory):
        m = mem[i]
        best = -1
        best_load = 0.0
        for j in range(h):  # least loaded host with room, ties by index
            if used[j] + m <= 1.0 + EPS and (best < 0 or load[j] < best_load):
                best, best_load = j, load[j]
        if best < 0:
            return finish(inst, name, None, work=inst.n_tasks)
        hosts[i] = best
        load[best] += cpu[i]
        used[best] += m
    return finish(inst, name, np.asarray(hosts, dtype=np.int64), work=inst.n_tasks)


def _greedy_numpy(inst: Instance, sort_by_memory: bool, name: str) -> Solution:
    """The same choices as the Python loop (least loaded host with room, ties by index), one numpy
    pass over the hosts per task: faster when there are many hosts."""
    load = np.zeros(inst.hosts)
    room = np.ones(inst.hosts) + EPS
    cpu, mem = inst.cpu, inst.mem
    hosts = np.full(inst.n_tasks, -1, dtype=np.int64)
    inf = np.inf
    for i in _order(inst, sort_by_memory):
        j = int(np.argmin(np.where(room >= mem[i], load, inf)))
        if room[j] < mem[i]:
            return finish(inst, name, None, work=inst.n_tasks)
        hosts[i] = j
        load[j] += cpu[i]
        room[j] -= mem[i]
    return finish(inst, name, hosts, work=inst.n_tasks)


def backtracking(
    inst: Instance, sort_by_memory: bool = False, max_attempts: int = DEFAULT_MAX_ATTEMPTS, name: str = "gb"
) -> Solution:
    """GB (``sort_by_memory=False``) or SGB: depth-first search with a bound on placement attempts."""
    h = inst.hosts
    cpu = inst.cpu
    mem = inst.mem
    order = _order(inst, sort_by_memory)
    n = len(order)
    load = [0.0] * h
    used = [0.0] * h
    hosts = [-1] * inst.n_tasks
    cands: list[list[int]] = []  # candidate hosts of the task at each depth, in load order
    nxt: list[int] = []  # next candidate to try at each depth
    attempts = 0
    depth = 0
    while depth < n:
        i = order[depth]
        if depth == len(cands):
            cands.append(sorted(range(h), key=lambda j: (load[j], j)))
            nxt.append(0)
        lst, k = cands[depth], nxt[depth]
        m = mem[i]
        placed = False
        while k < h:
            j = lst[k]
            k += 1
            attempts += 1
            if used[j] + m <= 1.0 + EPS:
                hosts[i] = j
                load[j] += cpu[i]
                used[j] += m
                placed = True
                break
            if attempts >= max_attempts:
                break
        nxt[depth] = k
        if placed:
            depth += 1
            if attempts >= max_attempts and depth < n:
                return finish(inst, name, None, work=attempts)
            continue
        if attempts >= max_attempts:
            return finish(inst, name, None, work=attempts)
        # dead end: forget this depth and move the previous task to its next host
        cands.pop()
        nxt.pop()
        depth -= 1
        if depth < 0:
            return finish(inst, name, None, work=attempts)
        p = order[depth]
        j = hosts[p]
        load[j] -= cpu[p]
        used[j] -= mem[p]
        hosts[p] = -1
    return finish(inst, name, np.asarray(hosts, dtype=np.int64), work=attempts)
