"""Parallel jobs (sec. 5): a job has T_i tasks with the same needs (alpha_i, m_i); all its tasks get
the same CPU allocation, and the average pass maximizes the average *per-job* yield so that splitting
a job into many small tasks does not buy a larger share (the paper's anti-gaming argument).

Placement algorithms need no change: a placement at minimum yield Y gives every task ``Y * alpha``,
which is equal within a job. The average pass is the LP (placements fixed)

    maximize  sum_k y_k   subject to   Y <= y_k <= 1,
              for every host j:  sum_k c_kj * alpha_k * y_k <= 1

where ``c_kj`` is the number of tasks of job k on host j; task allocations are ``y_k * alpha_k``.
The per-host greedy of sec. 3.5 is not optimal here (a job spans hosts), so the LP is solved with
HiGHS (``scipy.optimize.linprog``).

Example: hosts A, B; job 1 has two tasks of alpha 0.5, one on A and one on B; job 2 (alpha 0.8) is
on A, job 3 (alpha 0.9) on B. Loads 1.3 and 1.4, so Y = 1/1.4 = 0.714 and host B is full. The
per-host greedy would raise job 1's task on A (the smaller need) and break equal allocation; the
LP instead keeps job 1 at 0.714 (its task on B cannot grow) and raises job 2 to
(1 - 0.5 * 0.714) / 0.8 = 0.804: per-job yields (0.714, 0.804, 0.714).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from vmctl.errors import SolverError
from vmctl.policies.vcsched.instance import FloatArray, Instance


def job_average(inst: Instance, hosts: npt.NDArray[np.int64], y_min: float) -> FloatArray:
    """Equal per-task allocations maximizing the average per-job yield, every job >= ``y_min``."""
    n_jobs = inst.n_jobs
    job_cpu = np.zeros(n_jobs)
    job_cpu[inst.job_a] = inst.cpu_a
    # c_kj * alpha_k as a sparse (hosts x jobs) matrix; duplicates are summed by coo -> csr
    a = coo_matrix((inst.cpu_a, (hosts, inst.job_a)), shape=(inst.hosts, n_jobs)).tocsr()
    res = linprog(
        c=-np.ones(n_jobs),
        A_ub=a,
        b_ub=np.ones(inst.hosts),
        bounds=np.column_stack([np.full(n_jobs, y_min), np.ones(n_jobs)]),
        method="highs",
    )
    if res.status != 0 or res.x is None:
        # y_k = y_min for all k is feasible by construction, so this is a solver problem
        raise SolverError(solver="highs", problem=f"average-yield LP: {res.message}")
    y = np.clip(np.asarray(res.x, dtype=np.float64), y_min, 1.0)
    alloc: FloatArray = y[inst.job_a] * inst.cpu_a
    # guard against solver round-off pushing a host a hair over capacity
    load = np.bincount(hosts, weights=alloc, minlength=inst.hosts)
    over = load > 1.0
    if over.any():
        scale = np.where(over, 1.0 / np.maximum(load, 1e-300), 1.0)
        job_scale = np.ones(n_jobs)
        np.minimum.at(job_scale, inst.job_a, scale[hosts])
        alloc = np.maximum(alloc * job_scale[inst.job_a], y_min * inst.cpu_a)
    return alloc
