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

#: ``scipy.special.stdtrit(df, 0.975)`` (what ``scipy.stats.t.ppf`` calls) for df = 1 .. 128, as scipy
#: computes it (``tests/unit/test_sim_metrics_t.py`` compares every entry): the 95 % intervals of every
#: run need no scipy import, which costs ~26 MB of memory at the end of a run, when the run's state is
#: live (issue 27: the whole process's peak over HPC2N). Other quantiles import scipy when asked.
_T975 = (
    12.706204736174694, 4.302652729749462, 3.1824463052837078, 2.7764451051977934, 2.5705818356363146,
    2.4469118511449786, 2.364624251592784, 2.306004135204166, 2.262157162798205, 2.228138851986274,
    2.200985160091639, 2.1788128296672284, 2.1603686564627913, 2.144786687917804, 2.131449545559776,
    2.1199052992212546, 2.1098155778333156, 2.1009220402410382, 2.0930240544083087, 2.085963447265864,
    2.0796138447276795, 2.0738730679040254, 2.0686576104190486, 2.0638985616280245, 2.0595385527532972,
    2.0555294386428735, 2.0518305164802846, 2.0484071417952454, 2.045229642132703, 2.0422724563012378,
    2.039513446396408, 2.0369333434601016, 2.0345152974493383, 2.0322445093177186, 2.030107928250343,
    2.0280940009804502, 2.0261924630291093, 2.0243941639119694, 2.022690920036761, 2.021075390306273,
    2.019540970441376, 2.0180817028184443, 2.016692199227824, 2.0153675744437636, 2.014103388880846,
    2.012895598919429, 2.0117405137297655, 2.010634757624232, 2.0095752371292392, 2.008559112100761,
    2.007583770315836, 2.006646805061688, 2.0057459953178687, 2.0048792881880564, 2.0040447832891455,
    2.003240718847872, 2.002465459291007, 2.0017174841452356, 2.000995378088267, 2.0002978220142604,
    1.999623584994939, 1.9989715170333788, 1.998340542520741, 1.997729654317693, 1.9971379083920038,
    1.9965644189523117, 1.996008354025296, 1.9954689314298435, 1.9949454151072374, 1.994437111771186,
    1.9939433678456255, 1.9934635666618719, 1.992997125889855, 1.992543495180932, 1.9921021540022417,
    1.9916726096446642, 1.9912543953883846, 1.9908470688116906, 1.9904502102301285, 1.990063421254446,
    1.9896863234569029, 1.989318557136572, 1.9889597801751624, 1.9886096669757083, 1.9882679074772216,
    1.98793420623902, 1.9876082815890708, 1.9872898648311692, 1.986978699506281, 1.9866745407037683,
    1.9863771544186177, 1.98608631695113, 1.9858018143458227, 1.985523441866604, 1.9852510035054978,
    1.984984311522457, 1.9847231860139845, 1.9844674545084815, 1.9842169515864174, 1.9839715185235518,
    1.983731002955606, 1.9834952585628793, 1.9832641447734565, 1.9830375264837259, 1.9828152737950475,
    1.9825972617655006, 1.9823833701756908, 1.982173483307727, 1.9819674897364825, 1.981765282132372,
    1.9815667570749007, 1.9813718148763053, 1.981180359414661, 1.9809922979758567, 1.9808075411039094,
    1.9806260024590894, 1.9804475986834025, 1.980272249272974, 1.9800998764569397, 1.9799304050824402,
    1.9797637625053868, 1.9795998784866382, 1.9794386850933035, 1.9792801166048548, 1.9791241094237977,
    1.9789706019906281, 1.9788195347028539, 1.978670849837835
)


def t_quantile(df: int, p: float) -> float:
    """The Student t quantile ``stdtrit(df, p)`` (from the table above for p = 0.975, else from scipy)."""
    if p == 0.975 and 1 <= df <= len(_T975) and df == int(df):
        return _T975[int(df) - 1]
    from scipy.special import stdtrit

    return float(stdtrit(df, p))

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
    t = t_quantile(batches - 1, 0.5 + confidence / 2.0)
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
    return m, t_quantile(n - 1, 0.5 + confidence / 2.0) * sd / math.sqrt(n)


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
    if done.all():  # every job finished (the usual case): no copies (issue 27: peak memory at the end of a run)
        sub, fst, en, rn, pr = submit, first_start, end, run, procs
    else:
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
    if done.all():  # every job finished (the usual case): no copies (issue 27: peak memory at the end of a run)
        sub, fst, en, rn, pr = submit, first_start, end, run, procs
    else:
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
