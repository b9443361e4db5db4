"""Workload specs, single runs and parallel parameter sweeps for ``vmctl sim``.

A :class:`WorkloadSpec` names a workload (an SWF trace or a model, with its size, machine, load and
seed) and is small and picklable, so sweep workers rebuild their workload themselves instead of
receiving 200,000 job records through a pipe. :func:`run_one` builds the workload and the policy and
runs the simulator; :func:`sweep` runs the cross product of policies x loads x seeds x migration costs
on a process pool and returns one row per run (written to ``results.csv`` by the CLI).
"""

from __future__ import annotations

import csv
import importlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmctl.errors import OutOfRange, ValidationError, VmctlError
from vmctl.policies.registry import create_policy, policy_class
from vmctl.sim.engine import CpuUsageMode, SimConfig, SimResult, Simulator, WorkloadJobLike

MODELS = ("feitelson96", "jann97", "lublin99")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Where the jobs come from. Exactly one of ``trace`` and ``model``.

    ``procs`` overrides the trace header's machine size (models: the machine size, default 320).
    ``load`` rescales the inter-arrival times to reach that offered load (None: as generated/recorded).
    ``jobs`` keeps the first N jobs (models: generates N). ``seed`` seeds the model and the CPU usage
    assignment. ``priority_from_queue``: a trace job's priority is its SWF queue number (else 0)."""

    trace: str | None = None
    model: str | None = None
    jobs: int | None = None
    procs: int | None = None
    load: float | None = None
    seed: int = 1
    cpu_usage: CpuUsageMode = "paper"
    priority_from_queue: bool = False  # a trace's queue number (SWF field 15) is each job's priority

    def label(self) -> str:
        return Path(self.trace).name if self.trace else f"{self.model}"


@dataclass(frozen=True, slots=True)
class BuiltWorkload:
    jobs: Sequence[WorkloadJobLike]
    cores: int
    source: str
    dropped: Mapping[str, int] = field(default_factory=dict)


def _module(name: str) -> Any:
    return importlib.import_module(f"vmctl.sim.workloads.{name}")


def build_workload(spec: WorkloadSpec) -> BuiltWorkload:
    """Read or generate the workload of ``spec`` (errors: TraceFormatError, ValidationError, OutOfRange).

    Traces: read, keep the first ``jobs``, rescale to ``load``, assign the actual CPU usage (``paper``
    rule of MEASY sec. 3.1, drawn from a generator seeded with (seed, 0xC0)). Models:
    ``generate_model`` does all of it (TModel estimates included). Under ``cpu_usage == "full"`` the
    engine runs every process at 100 % anyway."""
    import numpy as np

    if (spec.trace is None) == (spec.model is None):
        raise ValidationError(field="workload", problem="give exactly one of --trace and --model")
    if spec.jobs is not None and spec.jobs <= 0:
        raise OutOfRange(what="--jobs", value=spec.jobs, allowed="> 0")
    if spec.load is not None and not spec.load > 0.0:
        raise OutOfRange(what="--load", value=spec.load, allowed="> 0")
    if spec.procs is not None and spec.procs <= 0:
        raise OutOfRange(what="--procs", value=spec.procs, allowed="> 0")
    if spec.trace is not None:
        workload = _module("swf").read_swf(spec.trace, max_procs=spec.procs,
                                           priority_from_queue=spec.priority_from_queue)
        if spec.jobs is not None and spec.jobs < len(workload.jobs):
            workload = replace(workload, jobs=workload.jobs[: spec.jobs])
        if spec.load is not None:
            workload = _module("load").scale_to_load(workload, spec.load)
        if spec.cpu_usage == "paper":
            rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 0xC0]))
            workload = _module("usage").with_cpu_usage(workload, rng, "paper")
    else:
        if spec.priority_from_queue:
            raise ValidationError(field="--priority-from-queue", problem="applies to a --trace only (models have no "
                                                                         "queues)")
        if spec.model not in MODELS:
            raise ValidationError(field="--model", problem=f"unknown model {spec.model!r}; known: {', '.join(MODELS)}")
        # the model, TModel estimates, load scaling and CPU usage all come from the workloads package
        workload = _module("registry").generate_model(spec.model, spec.jobs or 10_000, spec.procs or 320, spec.seed,
                                                      spec.load, usage=spec.cpu_usage)
    return BuiltWorkload(jobs=workload.jobs, cores=workload.max_procs, source=workload.source,
                         dropped=dict(workload.dropped))


def make_config(spec: WorkloadSpec, seed: int, cpu_info: bool = True) -> SimConfig:
    return SimConfig(seed=seed, cpu_usage=spec.cpu_usage, cpu_info=cpu_info)


def policy_params(name: str, params: Mapping[str, Any], cpu_info: bool) -> dict[str, Any]:
    """The policy's parameters for a run: without CPU information (sec. 3.5.1) a policy that has a
    ``use_cpu_info`` parameter gets it set to False unless the caller set it."""
    out = dict(params)
    if not cpu_info and "use_cpu_info" in policy_class(name).parameters:
        out.setdefault("use_cpu_info", False)
    return out


def run_one(
    spec: WorkloadSpec,
    policy: str,
    params: Mapping[str, Any] | None = None,
    seed: int | None = None,
    cpu_info: bool = True,
    on_progress: Callable[[int, int], None] | None = None,
    built: BuiltWorkload | None = None,
    jobs_out: str | Path | None = None,
) -> SimResult:
    """One policy over one workload; ``jobs_out``: also write one row per job there (CSV or Parquet,
    :mod:`vmctl.sim.jobs_out`)."""
    built = built or build_workload(spec)
    pol = create_policy(policy, **policy_params(policy, params or {}, cpu_info))
    cfg = make_config(spec, spec.seed if seed is None else seed, cpu_info)
    sim = Simulator(built.jobs, built.cores, pol, cfg, source=built.source, dropped=built.dropped)
    result = sim.run(on_progress)
    if jobs_out is not None:
        from vmctl.sim.jobs_out import write_jobs

        write_jobs(sim.job_rows(), jobs_out)
    return result


# ------------------------------------------------------------------------------------------- sweeps


@dataclass(frozen=True, slots=True)
class SweepPoint:
    policy: str
    load: float | None
    seed: int
    migration_cost: float | None = None


CSV_FIELDS = (
    "workload", "policy", "load", "seed", "migration_cost", "cpu_usage", "cpu_info", "cores", "jobs",
    "avg_wait", "avg_response", "avg_bounded_slowdown", "utilization", "makespan", "migrations",
    "estimate_kills", "policy_kills", "ci_response", "ci_bounded_slowdown", "wall_s",
)


def _row(spec: WorkloadSpec, point: SweepPoint, cpu_info: bool, res: SimResult, wall: float) -> dict[str, Any]:
    m = res.metrics
    return {
        "workload": spec.label(),
        "policy": point.policy,
        "load": "" if point.load is None else point.load,
        "seed": point.seed,
        "migration_cost": "" if point.migration_cost is None else point.migration_cost,
        "cpu_usage": spec.cpu_usage,
        "cpu_info": int(cpu_info),
        "cores": res.cores,
        "jobs": res.jobs,
        "avg_wait": m.avg_wait,
        "avg_response": m.avg_response,
        "avg_bounded_slowdown": m.avg_bounded_slowdown,
        "utilization": m.utilization,
        "makespan": m.makespan,
        "migrations": res.migrations,
        "estimate_kills": res.estimate_kills,
        "policy_kills": res.policy_kills,
        "ci_response": "" if m.ci_response is None else m.ci_response.half_width,
        "ci_bounded_slowdown": "" if m.ci_bounded_slowdown is None else m.ci_bounded_slowdown.half_width,
        "wall_s": round(wall, 3),
    }


def _worker(spec: WorkloadSpec, point: SweepPoint, params: Mapping[str, Any], cpu_info: bool) -> dict[str, Any]:
    """One sweep run. A vmctl error is returned as data (exception classes with keyword-only
    constructors do not survive pickling) and re-raised by :func:`sweep` in the parent."""
    try:
        return _run_point(spec, point, params, cpu_info)
    except VmctlError as exc:
        return {"__error__": (type(exc).__module__, type(exc).__qualname__, dict(exc.fields))}


def _reraise(row: dict[str, Any]) -> dict[str, Any]:
    err = row.get("__error__")
    if err is None:
        return row
    module, qualname, fields = err
    cls = getattr(importlib.import_module(module), qualname)
    raise cls(**fields)


def _run_point(spec: WorkloadSpec, point: SweepPoint, params: Mapping[str, Any], cpu_info: bool) -> dict[str, Any]:
    import time

    t0 = time.perf_counter()
    s = replace(spec, load=point.load, seed=point.seed)
    p = dict(params)
    if point.migration_cost is not None:
        p["migration_cost"] = float(point.migration_cost)
    res = run_one(s, point.policy, p, cpu_info=cpu_info)
    return _row(s, point, cpu_info, res, time.perf_counter() - t0)


def sweep_points(
    policies: Sequence[str], loads: Sequence[float | None], seeds: Sequence[int],
    migration_costs: Sequence[float] = (),
) -> list[SweepPoint]:
    """Every policy at every load and seed; with ``migration_costs``, the policies that take a
    ``migration_cost`` parameter additionally run once per cost (the others once)."""
    pts: list[SweepPoint] = []
    for pol in policies:
        takes_cost = "migration_cost" in policy_class(pol).parameters
        costs: Sequence[float | None] = list(migration_costs) if (migration_costs and takes_cost) else [None]
        for load in loads:
            for seed in seeds:
                for cost in costs:
                    pts.append(SweepPoint(pol, load, seed, cost))
    return pts


def sweep(
    spec: WorkloadSpec,
    points: Iterable[SweepPoint],
    params: Mapping[str, Any] | None = None,
    cpu_info: bool = True,
    workers: int | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every point on a process pool (``workers`` processes, default: the number of cores) and
    return the rows in the order of ``points``."""
    pts = list(points)
    for p in pts:
        policy_class(p.policy)  # fail fast on an unknown name, before starting workers
    n = max(1, min(workers or os.cpu_count() or 1, len(pts) or 1))
    rows: list[dict[str, Any] | None] = [None] * len(pts)
    if n == 1:
        for i, p in enumerate(pts):
            rows[i] = _reraise(_worker(spec, p, params or {}, cpu_info))
            if on_done is not None:
                on_done(rows[i] or {})
    else:
        with ProcessPoolExecutor(max_workers=n) as pool:
            futs = {pool.submit(_worker, spec, p, dict(params or {}), cpu_info): i for i, p in enumerate(pts)}
            for fut in as_completed(futs):
                row = _reraise(fut.result())
                rows[futs[fut]] = row
                if on_done is not None:
                    on_done(row)
    return [r for r in rows if r is not None]


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(CSV_FIELDS))
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in CSV_FIELDS})
