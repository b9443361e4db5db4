"""Exact MILP of VCSCHED (sec. 2.5), its rational relaxation (sec. 3.1), and the dynamic variant
with a migration byte budget (sec. 6.1), all solved with HiGHS through ``scipy.optimize``.

Variables, for task i and host j: ``e_ij`` in {0, 1} (task i runs on host j), ``a_ij`` >= 0 (its
CPU fraction there) and ``Y`` (the minimum yield, maximized):

    (7)  sum_j e_ij = 1              (6)  a_ij <= e_ij
    (8)  sum_i a_ij <= 1             (9)  sum_i m_i e_ij <= 1
    (10) sum_j a_ij <= alpha_i       (11) sum_j a_ij / alpha_i >= Y
    (20) parallel jobs: sum_j a_ij equal for all tasks of a job
    (31) dynamic: sum_ij (1 - prev_ij) m_i e_ij <= B   (prev_ij = 1 for all j if i is new)

Symmetry: hosts are identical, so any solution can be relabelled so that host j's lowest task index
is at least j; the static MILP adds ``e_ij = 0 for j > i``. This removes equivalent branches
without cutting any distinct solution (it is not used in the relaxation, whose value is the
paper's bound, nor in the dynamic program, where hosts are no longer interchangeable).

Bound: when ``sum m_i <= H`` the relaxation's optimum is ``min(H / sum alpha_i, 1)`` (sec. 3.1:
spread each task evenly, ``e_ij = 1/H``), else the relaxation is infeasible. ``lp_bound`` uses that
closed form; ``solve_relaxation`` solves the LP with HiGHS, because RRND/RRNZ need a vertex
solution rather than the even spread, and a test checks both agree.

Example (sec. 2.3): 2 hosts, 3 tasks of alpha 0.6 and no memory: the MILP gives 0.5/0.6 = 0.833,
the bound gives min(2/1.8, 1) = 1.

``time_limit`` (seconds) is passed to HiGHS; if it stops the search the status is ``timeout`` and
the best placement found so far, if any, is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix, csr_matrix, vstack

from vmctl.errors import SolverError
from vmctl.policies.vcsched.avgyield import finish
from vmctl.policies.vcsched.instance import EPS, FloatArray, Instance, Solution, failed


def lp_bound(inst: Instance) -> float | None:
    """Optimal minimum yield of the rational relaxation; None when total memory exceeds H."""
    if float(inst.mem_a.sum()) > inst.hosts + 1e-9:
        return None
    return min(inst.hosts / float(inst.cpu_a.sum()), 1.0)


@dataclass(frozen=True)
class _Program:
    c: FloatArray
    a: csr_matrix
    lb: FloatArray
    ub: FloatArray
    var_lb: FloatArray
    var_ub: FloatArray
    integrality: npt.NDArray[np.int64]


def _build(
    inst: Instance,
    integral: bool,
    symmetry: bool,
    prev_hosts: npt.NDArray[np.int64] | None = None,
    budget: float | None = None,
) -> _Program:
    n, h = inst.n_tasks, inst.hosts
    cpu, mem = inst.cpu_a, inst.mem_a
    nv = 2 * n * h + 1
    y_col = 2 * n * h
    rows: list[npt.NDArray[np.int64]] = []
    cols: list[npt.NDArray[np.int64]] = []
    vals: list[FloatArray] = []
    lbs: list[FloatArray] = []
    ubs: list[FloatArray] = []
    r = 0

    ti = np.repeat(np.arange(n, dtype=np.int64), h)
    hj = np.tile(np.arange(h, dtype=np.int64), n)
    e_idx = ti * h + hj
    a_idx = n * h + e_idx

    def add(
        row: npt.NDArray[np.int64], col: npt.NDArray[np.int64], val: FloatArray, lo: FloatArray, hi: FloatArray
    ) -> None:
        nonlocal r
        rows.append(row + r)
        cols.append(col)
        vals.append(val)
        lbs.append(lo)
        ubs.append(hi)
        r += lo.size

    inf = np.inf
    # (7) sum_j e_ij = 1
    add(ti, e_idx, np.ones(n * h), np.ones(n), np.ones(n))
    # (6) a_ij - e_ij <= 0
    k = np.arange(n * h)
    add(
        np.concatenate([k, k]),
        np.concatenate([a_idx, e_idx]),
        np.concatenate([np.ones(n * h), -np.ones(n * h)]),
        np.full(n * h, -inf),
        np.zeros(n * h),
    )
    # (8) sum_i a_ij <= 1
    add(hj, a_idx, np.ones(n * h), np.full(h, -inf), np.ones(h))
    # (9) sum_i m_i e_ij <= 1
    add(hj, e_idx, mem[ti], np.full(h, -inf), np.ones(h))
    # (10) sum_j a_ij <= alpha_i
    add(ti, a_idx, np.ones(n * h), np.full(n, -inf), cpu.copy())
    # (11) sum_j a_ij / alpha_i - Y >= 0
    add(
        np.concatenate([ti, np.arange(n)]),
        np.concatenate([a_idx, np.full(n, y_col)]),
        np.concatenate([1.0 / cpu[ti], -np.ones(n)]),
        np.zeros(n),
        np.full(n, inf),
    )
    # (20) equal allocations within a parallel job: task t minus the job's first task
    if inst.is_parallel:
        first: dict[int, int] = {}
        pairs: list[tuple[int, int]] = []
        for i, j in enumerate(inst.job):
            if j in first:
                pairs.append((first[j], i))
            else:
                first[j] = i
        if pairs:
            p = np.asarray(pairs, dtype=np.int64)
            m = p.shape[0]
            rr = np.repeat(np.arange(m), h)
            jj = np.tile(np.arange(h), m)
            c0 = n * h + np.repeat(p[:, 0], h) * h + jj
            c1 = n * h + np.repeat(p[:, 1], h) * h + jj
            add(
                np.concatenate([rr, rr]),
                np.concatenate([c0, c1]),
                np.concatenate([np.ones(m * h), -np.ones(m * h)]),
                np.zeros(m),
                np.zeros(m),
            )
    # (31) migration budget
    too_big = np.zeros(0, dtype=np.int64)
    if prev_hosts is not None and budget is not None:
        moved = (prev_hosts[ti] >= 0) & (prev_hosts[ti] != hj)
        sel = np.flatnonzero(moved)
        # A move that alone costs more than the budget is ruled out by its bounds, not by the row: HiGHS'
        # feasibility tolerance is absolute (~1e-7), so the row alone let a task of memory 1e-6 move under
        # a budget of 0.
        over = mem[ti[sel]] > budget + EPS  # the same tolerance as the heuristics
        too_big = e_idx[sel[over]]
        sel = sel[~over]
        add(np.zeros(sel.size, dtype=np.int64), e_idx[sel], mem[ti[sel]], np.array([-inf]), np.array([float(budget)]))

    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(r, nv)).tocsr()
    var_lb = np.zeros(nv)
    var_ub = np.ones(nv)
    if symmetry:
        var_ub[e_idx[hj > ti]] = 0.0
    var_ub[too_big] = 0.0
    c = np.zeros(nv)
    c[y_col] = -1.0
    integrality = np.zeros(nv, dtype=np.int64)
    if integral:
        integrality[: n * h] = 1
    return _Program(c, a, np.concatenate(lbs), np.concatenate(ubs), var_lb, var_ub, integrality)


def solve_relaxation(inst: Instance) -> tuple[float, FloatArray] | None:
    """Solve the rational LP with HiGHS: (Y, e as an n x H matrix), or None when infeasible."""
    p = _build(inst, integral=False, symmetry=False)
    # linprog wants A_ub x <= b_ub and A_eq x = b_eq
    eq = p.lb == p.ub
    up = ~eq & np.isfinite(p.ub)
    lo = ~eq & np.isfinite(p.lb)
    a_ub = vstack([p.a[up], -p.a[lo]]).tocsr()
    b_ub = np.concatenate([p.ub[up], -p.lb[lo]])
    res = linprog(
        p.c,
        A_ub=a_ub,
        b_ub=b_ub,
        A_eq=p.a[eq],
        b_eq=p.ub[eq],
        bounds=np.column_stack([p.var_lb, p.var_ub]),
        method="highs",
    )
    if res.status == 2:
        return None
    if res.status != 0 or res.x is None:
        raise SolverError(solver="highs", problem=f"relaxed LP: {res.message}")
    x = np.asarray(res.x, dtype=np.float64)
    n, h = inst.n_tasks, inst.hosts
    return float(x[-1]), np.clip(x[: n * h].reshape(n, h), 0.0, 1.0)


def solve_milp(
    inst: Instance,
    time_limit: float | None = 60.0,
    prev_hosts: npt.NDArray[np.int64] | None = None,
    budget: float | None = None,
    name: str = "milp",
) -> Solution:
    """Exact VCSCHED (or its dynamic variant when ``prev_hosts``/``budget`` are given), then the
    average-yield pass on the optimal placement."""
    if float(inst.mem_a.sum()) > inst.hosts + 1e-9:
        return failed(name, inst)  # no placement can hold the memory: skip the solver
    dynamic = prev_hosts is not None and budget is not None
    p = _build(inst, integral=True, symmetry=not dynamic, prev_hosts=prev_hosts, budget=budget)
    options: dict[str, object] = {"disp": False, "presolve": True}
    if time_limit is not None:
        options["time_limit"] = float(time_limit)
    res = milp(
        p.c,
        integrality=p.integrality,
        bounds=Bounds(p.var_lb, p.var_ub),
        constraints=LinearConstraint(p.a, p.lb, p.ub),
        options=options,
    )
    n, h = inst.n_tasks, inst.hosts
    status = res.status
    if status == 2:
        return failed(name, inst)
    if status == 0 or (status == 1 and res.x is not None):
        x = np.asarray(res.x, dtype=np.float64)
        e = x[: n * h].reshape(n, h)
        hosts = np.argmax(e, axis=1).astype(np.int64)
        return finish(inst, name, hosts, "ok" if status == 0 else "timeout", work=1)
    if status == 1:
        return failed(name, inst, "timeout")
    raise SolverError(solver="highs", problem=f"MILP: {res.message}")
