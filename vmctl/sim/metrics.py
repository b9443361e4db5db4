"""Performance metrics of a simulation run (MEASY paper sec. 3.3).

Per job (``run`` is the job's actual dedicated-core run time, ``min(run_time, estimate)`` because a
job is killed at its estimate):

- response time ``end - submit``;
- bounded slowdown ``max(1, response / max(run, 10 s))`` (tau = 10 s, as in the paper after [14]);
- wait ``first start - submit`` (a job restarted after a kill keeps its first start).

Whole run: utilization = useful work / (cores x makespan), where useful work is ``procs x run`` summed
over the jobs (work lost to kills is not useful; a job whose width changed while it ran, a resized
task bag, counts the core-seconds its slots were actually held) and the makespan runs from the first submission to
the last completion. Work is counted in dedicated-core seconds, so on the two-tier architecture the
utilization can exceed 1: a process that needs 50 % of a core in fg and one that uses the idle half
in bg both deliver work in the same core-second (the consolidation gain the paper is after).

Confidence intervals use the batch-means method [34]: the jobs, in completion order, are cut into
``batches`` consecutive batches of equal size (the last ``n mod batches`` jobs are dropped); the
batch means are treated as independent samples, and the 95 % interval is
``mean_of_batch_means +- t(0.975, batches - 1) * s / sqrt(batches)``. No warm-up batch is deleted:
the workloads start on an empty machine and the first of 25 batches weighs 4 %.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The Student t quantile straight from scipy.special (what scipy.stats.t.ppf calls): importing
# scipy.stats costs ~1 s, which every `vmctl sim run` would pay.
from scipy.special import stdtrit

TAU = 10.0
DEFAULT_BATCHES = 25


def bounded_slowdown(response: Any, run: Any) -> Any:
    """``max(1, response / max(run, TAU))``, elementwise on arrays or on two floats (the one definition:
    the simulator's metrics and ``vmctl demo``'s summary both use it)."""
    return np.maximum(1.0, response / np.maximum(run, TAU))


@dataclass(frozen=True, slots=True)
class Interval:
    """A batch-means 95 % confidence interval: ``mean +- half_width``."""

    mean: float
    half_width: float
    batches: int

    def to_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "half_width": self.half_width, "batches": self.batches}


def batch_means(values_in_completion_order: np.ndarray, batches: int = DEFAULT_BATCHES,
                confidence: float = 0.95) -> Interval | None:
    """Batch-means interval, or None with fewer than two values per batch."""
    n = int(values_in_completion_order.shape[0])
    if batches < 2 or n < 2 * batches:
        return None
    size = n // batches
    trimmed = values_in_completion_order[: size * batches].reshape(batches, size)
    means = trimmed.mean(axis=1)
    grand = float(means.mean())
    s = float(means.std(ddof=1))
    t = float(stdtrit(batches - 1, 0.5 + confidence / 2.0))
    return Interval(mean=grand, half_width=t * s / math.sqrt(batches), batches=batches)


def replication_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean of independent replications (e.g. one run per seed) and the half width of its Student-t
    interval, None with fewer than two values."""
    n = len(values)
    if n == 0:
        raise ValueError("replication_interval needs at least one value")
    m = math.fsum(values) / n
    if n < 2:
        return m, None
    sd = math.sqrt(math.fsum((x - m) ** 2 for x in values) / (n - 1))
    return m, float(stdtrit(n - 1, 0.5 + confidence / 2.0)) * sd / math.sqrt(n)


@dataclass(frozen=True, slots=True)
class Metrics:
    jobs: int
    avg_response: float
    avg_bounded_slowdown: float
    avg_wait: float
    utilization: float
    makespan: float
    ci_response: Interval | None
    ci_bounded_slowdown: Interval | None
    ci_wait: Interval | None


def compute(
    submit: np.ndarray,
    first_start: np.ndarray,
    end: np.ndarray,
    run: np.ndarray,
    procs: np.ndarray,
    cores: int,
    batches: int = DEFAULT_BATCHES,
    core_time: np.ndarray | None = None,
) -> Metrics:
    """Metrics over the finished jobs; arrays are per job, NaN ``end`` marks a job that did not finish
    (cancelled by the policy) and is left out. ``core_time`` (optional, per job): the core-seconds a
    job's slots were held, counted in the utilization instead of ``run x procs`` where it is not NaN
    (a job whose width changed while it ran: a resized task bag)."""
    done = ~np.isnan(end)
    sub, fst, en, rn, pr = submit[done], first_start[done], end[done], run[done], procs[done]
    n = int(sub.shape[0])
    if n == 0:
        return Metrics(0, 0.0, 0.0, 0.0, 0.0, 0.0, None, None, None)
    response = en - sub
    bsld = bounded_slowdown(response, rn)
    wait = fst - sub
    makespan = float(en.max() - submit.min())
    useful = float(np.dot(rn, pr))
    if core_time is not None and not np.isnan(held := core_time[done]).all():
        useful = float(np.where(np.isnan(held), rn * pr, held).sum())
    util = useful / (cores * makespan) if makespan > 0 else 0.0
    order = np.argsort(en, kind="stable")
    return Metrics(
        jobs=n,
        avg_response=float(response.mean()),
        avg_bounded_slowdown=float(bsld.mean()),
        avg_wait=float(wait.mean()),
        utilization=util,
        makespan=makespan,
        ci_response=batch_means(response[order], batches),
        ci_bounded_slowdown=batch_means(bsld[order], batches),
        ci_wait=batch_means(wait[order], batches),
    )


@dataclass(frozen=True, slots=True)
class GangMetrics:
    """The metrics of paper 004 sec. 3 for a time-sliced run (gang scheduling), beside the usual ones.

    - ``avg_slowdown``: mean of ``max(response, T) / max(execution, T)`` (T = the time slice; execution =
      the job's dedicated run time, ``min(run_time, estimate)``);
    - ``avg_wait``: mean of ``first start - submit``;
    - ``utilization_eq3``: eq. (3) as printed, ``sum(n_i t_i^e) / (N x t_m^f x MPL)`` with the first
      arrival at t = 0 (so ``t_m^f`` is the span from the first submission to the last completion);
      ``utilization``: the same without the MPL factor (:class:`Metrics`' utilization). Eq. (3) as
      printed cannot exceed 1/MPL (one task per node at a time), while the paper's Table 1 reports
      0.55-0.97 at MPL 5: its rho is evidently the unscaled one (docs/gang.md);
    - ``capacity_lost``: core-seconds of no progress paid for migrations (cost C x the job's width per
      change of nodes; not counted in the utilization, as the paper says), and that as a fraction of
      ``N x t_m^f``;
    - ``migrations_per_job``: changes of nodes over finished jobs.
    """

    slice_s: float
    mpl: int
    avg_slowdown: float
    avg_wait: float
    utilization: float
    utilization_eq3: float
    capacity_lost: float
    capacity_lost_fraction: float
    migrations_per_job: float

    def to_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


def gang(submit: np.ndarray, first_start: np.ndarray, end: np.ndarray, run: np.ndarray, procs: np.ndarray,
         cores: int, slice_s: float, mpl: int, capacity_lost: float, migrations: int) -> GangMetrics:
    """:class:`GangMetrics` over the finished jobs (arrays per job as in :func:`compute`)."""
    done = ~np.isnan(end)
    sub, fst, en, rn, pr = submit[done], first_start[done], end[done], run[done], procs[done]
    n = int(sub.shape[0])
    if n == 0:
        return GangMetrics(slice_s, mpl, 0.0, 0.0, 0.0, 0.0, capacity_lost, 0.0, 0.0)
    response = en - sub
    slowdown = np.maximum(response, slice_s) / np.maximum(rn, slice_s)
    span = float(en.max() - submit.min())
    useful = float(np.dot(rn, pr))
    util = useful / (cores * span) if span > 0 else 0.0
    return GangMetrics(
        slice_s=slice_s, mpl=mpl, avg_slowdown=float(slowdown.mean()), avg_wait=float((fst - sub).mean()),
        utilization=util, utilization_eq3=util / mpl, capacity_lost=capacity_lost,
        capacity_lost_fraction=capacity_lost / (cores * span) if span > 0 else 0.0,
        migrations_per_job=migrations / n,
    )
