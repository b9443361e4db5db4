"""Randomized rounding of the relaxed LP (sec. 3.2): RRND and RRNZ.

Both solve the rational relaxation with HiGHS (a vertex solution, not the even spread of the
closed form, which would make every host equally likely) and read ``e_ij`` as the probability of
putting task i on host j. Tasks are taken in index order; a host where the task's memory does not
fit gets probability 0 and the draw is repeated among the others (equivalently: drawn among the
hosts that fit, weights renormalised). RRND fails when no host with a positive weight fits; RRNZ
first raises every zero ``e_ij`` to ``epsilon`` (0.01), so it fails only when the task fits nowhere.

Draws come from ``numpy.random.default_rng(seed)``: the same seed gives the same placement.

Example: 2 hosts, 2 tasks of (cpu 0.6, mem 0.6): the LP may answer e = [[1, 0], [0, 1]]; RRND then
places each task on its host with probability 1 (minimum yield 1). If the LP had answered
e = [[1, 0], [1, 0]] (also optimal when only CPU matters), RRND would fail on task 1 (host 0 has no
memory left, host 1 has weight 0) while RRNZ would put it on host 1 with weight 0.01.
"""

from __future__ import annotations

import numpy as np

from vmctl.policies.vcsched.avgyield import finish
from vmctl.policies.vcsched.instance import EPS, Instance, Solution, failed
from vmctl.policies.vcsched.milp import solve_relaxation

DEFAULT_EPSILON = 0.01


def randomized_rounding(inst: Instance, seed: int = 0, epsilon: float = 0.0, name: str = "rrnd") -> Solution:
    """RRND (``epsilon == 0``) or RRNZ (``epsilon > 0``)."""
    relaxed = solve_relaxation(inst)
    if relaxed is None:
        return failed(name, inst)
    _y, e = relaxed
    if epsilon > 0:
        e = np.where(e <= 1e-12, epsilon, e)
    rng = np.random.default_rng(seed)
    used = np.zeros(inst.hosts)
    hosts = np.full(inst.n_tasks, -1, dtype=np.int64)
    mem = inst.mem_a
    for i in range(inst.n_tasks):
        w = np.where(used + mem[i] <= 1.0 + EPS, e[i], 0.0)
        w[w <= 1e-12] = 0.0
        total = w.sum()
        if total <= 0.0:
            return failed(name, inst, work=i)
        j = int(rng.choice(inst.hosts, p=w / total))
        hosts[i] = j
        used[j] += mem[i]
    return finish(inst, name, hosts, work=inst.n_tasks)
