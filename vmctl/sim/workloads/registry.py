"""``generate_model``: one entry point for the workload models, as the MEASY paper uses them
(sec. 3.1): the model produces sizes, run times and submit times; TModel (Tsafrir 2005) adds the
user estimates; the load is set by scaling inter-arrival times (sec. 3.3); each process gets its
actual CPU usage (sec. 3.1 ``paper`` or sec. 3.5.2 ``full``).

Random streams: the model draws from ``seed``; estimates and CPU usage draw from two streams derived
from the same seed (``SeedSequence([seed, 1])`` and ``[seed, 2]``), so changing, e.g., the usage mode
does not change the jobs' sizes or estimates.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vmctl.errors import OutOfRange
from vmctl.sim.workloads import feitelson96, jann97, lublin99
from vmctl.sim.workloads.core import JobArrays, Workload
from vmctl.sim.workloads.load import load_factor
from vmctl.sim.workloads.tsafrir05 import feasible_max_estimate, tmodel_estimates
from vmctl.sim.workloads.usage import USAGE_MODES, usage_tuples

MODELS: dict[str, Callable[[int, int, int], JobArrays]] = {
    "feitelson96": lambda n, p, s: feitelson96.sample(n, p, s),
    "jann97": lambda n, p, s: jann97.sample(n, p, s),
    "lublin99": lambda n, p, s: lublin99.sample(n, p, s),
}

#: what the MEASY paper (sec. 3.1) reports for its two model workloads
MEASY_TARGETS: dict[str, dict[str, float]] = {
    "feitelson96": {"jobs": 200_000, "mean_procs": 23.4, "mean_run_time": 2606.6, "serial_share_max": 0.18},
    "jann97": {"jobs": 100_000, "mean_procs": 10.5, "mean_run_time": 11267.0, "serial_share": 0.408},
}


def generate_model(
    name: str,
    n_jobs: int,
    procs: int,
    seed: int,
    load: float | None = None,
    *,
    usage: str = "paper",
    max_estimate: int | None = None,
) -> Workload:
    """A complete model workload: ``n_jobs`` jobs of model ``name`` (feitelson96 | jann97 | lublin99)
    for ``procs`` processors, with TModel estimates (maximal estimate ``max_estimate`` seconds,
    default: the smallest whole hour >= the longest run time with which TModel can give every job
    an estimate >= its run time, see ``tsafrir05.feasible_max_estimate``), offered load ``load`` if given (else the
    model's own) and CPU usage mode ``usage`` (paper | full)."""
    if name not in MODELS:
        raise OutOfRange(what="workload model", value=name, allowed=" | ".join(MODELS))
    if usage not in USAGE_MODES:
        raise OutOfRange(what="cpu usage mode", value=usage, allowed=" | ".join(USAGE_MODES))
    base = MODELS[name](n_jobs, procs, seed)
    header = dict(base.header)
    header["MaxProcs"] = str(procs)
    submit, run = base.submit, base.run_time
    estimate = run
    if len(base):
        rng = np.random.default_rng([seed, 1])
        m = max_estimate if max_estimate is not None else feasible_max_estimate(run, rng)
        estimate, run, truncated = tmodel_estimates(run, m, rng)
        header["Estimates"] = f"tsafrir05, maximal estimate {m} s, {truncated} run times truncated to it"
    if load is not None:
        factor = load_factor(submit, run, base.procs, procs, load)
        submit = submit[0] + (submit - submit[0]) * factor
        header["OfferedLoad"] = f"{load:.4g} (inter-arrivals x {factor:.6g})"
    usage_list = usage_tuples(base.procs, np.random.default_rng([seed, 2]), usage)
    header["CpuUsage"] = usage
    arrays = JobArrays(submit, run, base.procs, procs, base.source, header)
    return arrays.to_workload(estimate, usage_list)
