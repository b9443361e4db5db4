"""Workload specs, single runs and parallel parameter sweeps for ``vmctl sim``.

A :class:`WorkloadSpec` names a workload (an SWF trace or a model, with its size, machine, load and
seed) and is small and picklable, so sweep workers rebuild their workload themselves instead of
receiving 200,000 job records through a pipe. :func:`run_one` builds the workload and the policy and
runs the simulator; :func:`sweep` runs the cross product of policies x loads x seeds x migration costs
as cells of the experiment runner (:mod:`vmctl.experiments.runner`: a local Dask cluster or an existing
one, one results table that a rerun resumes from) and returns one row per run (written to
``results.csv`` by the CLI).
"""

from __future__ import annotations

import csv
import importlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from vmctl.errors import OutOfRange, ValidationError
from vmctl.experiments.runner import Cell, cell, run_grid
from vmctl.model import JobShape
from vmctl.policies.registry import create_policy, policy_class
from vmctl.sim.engine import CpuUsageMode, SimConfig, SimResult, Simulator, WorkloadJobLike
from vmctl.sim.execution import ExecutionModel
from vmctl.sim.workloads.shapes import ShapeRule

MODELS = ("feitelson96", "jann97", "lublin99")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Where the jobs come from. Exactly one of ``trace`` and ``model``.

    ``procs`` overrides the trace header's machine size (models: the machine size, default 320).
    ``load`` rescales the inter-arrival times to reach that offered load (None: as generated/recorded).
    ``jobs`` keeps the first N jobs (models: generates N). ``seed`` seeds the model and the CPU usage
    assignment. ``priority_from_queue``: a trace job's priority is its SWF queue number (else 0).
    ``shapes``: the rule of :mod:`vmctl.sim.workloads.shapes` that makes every job moldable or a task
    bag (``rigid``: none)."""

    trace: str | None = None
    model: str | None = None
    jobs: int | None = None
    procs: int | None = None
    load: float | None = None
    seed: int = 1
    cpu_usage: CpuUsageMode = "paper"
    priority_from_queue: bool = False  # a trace's queue number (SWF field 15) is each job's priority
    shapes: ShapeRule = "rigid"

    def label(self) -> str:
        return Path(self.trace).name if self.trace else f"{self.model}"


@dataclass(frozen=True, slots=True)
class BuiltWorkload:
    jobs: Sequence[WorkloadJobLike]
    cores: int
    source: str
    dropped: Mapping[str, int] = field(default_factory=dict)
    #: job id -> shape of the moldable and task-bag jobs (``WorkloadSpec.shapes``); empty = all rigid
    shapes: Mapping[str, JobShape] = field(default_factory=dict)


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
    if spec.shapes != "rigid":
        workload = _module("shapes").with_shapes(workload, spec.shapes)
    return BuiltWorkload(jobs=workload.jobs, cores=workload.max_procs, source=workload.source,
                         dropped=dict(workload.dropped), shapes={str(k): v for k, v in workload.shapes.items()})


def make_config(spec: WorkloadSpec, seed: int, cpu_info: bool = True,
                execution: Callable[[], ExecutionModel] | None = None) -> SimConfig:
    return SimConfig(seed=seed, cpu_usage=spec.cpu_usage, cpu_info=cpu_info, execution=execution)


def shape_execution(rule: ShapeRule, shapes: Mapping[str, JobShape]) -> Callable[[], ExecutionModel]:
    """The execution model of a shaped workload: node speed x moldable time for ``moldable``
    (:mod:`vmctl.sim.exec_moldable`), task bags for ``task-bag`` (:mod:`vmctl.sim.exec_taskbag`); one
    level per core, every core a standard one."""
    from vmctl.sim.exec_moldable import MoldableModel
    from vmctl.sim.exec_taskbag import TaskBagModel

    cls = TaskBagModel if rule == "task-bag" else MoldableModel
    return lambda: cls(shapes)


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
    execution: Callable[[], ExecutionModel] | None = None,
) -> SimResult:
    """One policy over one workload; ``jobs_out``: also write one row per job there (CSV or Parquet,
    :mod:`vmctl.sim.jobs_out`); ``execution``: the execution model (None: the two-tier model)."""
    built = built or build_workload(spec)
    pol = create_policy(policy, **policy_params(policy, params or {}, cpu_info))
    if spec.shapes != "rigid":
        if execution is not None:
            raise ValidationError(field="--shapes", problem=f"{spec.shapes} jobs run on their own execution model "
                                                            "(one level per core); it cannot be combined with another")
        execution = shape_execution(spec.shapes, built.shapes)
    elif built.shapes and execution is None and (
            kinds := {sh.kind for sh in built.shapes.values()} & policy_class(policy).needs.shapes):
        # shapes from a trace's side file (vmctl history export) that the policy schedules; a policy that
        # schedules none of them runs the jobs as the rigid jobs of the SWF records
        execution = shape_execution("task-bag" if "task-bag" in kinds else "moldable", built.shapes)
    cfg = make_config(spec, spec.seed if seed is None else seed, cpu_info, execution)
    sim = Simulator(built.jobs, built.cores, pol, cfg, source=built.source, dropped=built.dropped)
    # ``on_progress(done, total)``: about 200 reports over the run (jobs done of the workload's)
    result = sim.run(on_progress, max(1, len(built.jobs) // 200)) if on_progress is not None else sim.run()
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


def sweep_cell(
    trace: str | None, model: str | None, max_jobs: int | None, procs: int | None, load: float | None, seed: int,
    cpu_usage: str, cpu_info: bool, policy: str, migration_cost: float | None, params: str,
) -> dict[str, Any]:
    """One sweep run as an experiment cell (a pure function of its inputs; ``params``: the policy
    parameters as JSON). Returns the metrics of a ``results.csv`` row."""
    spec = WorkloadSpec(trace=trace, model=model, jobs=max_jobs, procs=procs, load=load, seed=seed,
                        cpu_usage="full" if cpu_usage == "full" else "paper")
    p = dict(json.loads(params))
    if migration_cost is not None:
        p["migration_cost"] = float(migration_cost)
    res = run_one(spec, policy, p, cpu_info=cpu_info)
    m = res.metrics
    return {
        "workload": spec.label(), "cores": res.cores, "jobs": res.jobs, "avg_wait": m.avg_wait,
        "avg_response": m.avg_response, "avg_bounded_slowdown": m.avg_bounded_slowdown,
        "utilization": m.utilization, "makespan": m.makespan, "migrations": res.migrations,
        "estimate_kills": res.estimate_kills, "policy_kills": res.policy_kills,
        "ci_response": None if m.ci_response is None else m.ci_response.half_width,
        "ci_bounded_slowdown": None if m.ci_bounded_slowdown is None else m.ci_bounded_slowdown.half_width,
    }


def sweep_cells(spec: WorkloadSpec, points: Iterable[SweepPoint], params: Mapping[str, Any] | None = None,
                cpu_info: bool = True) -> list[Cell]:
    """The experiment cells of the points (the policy parameters shared by every point: ``params``)."""
    shared = json.dumps(dict(params or {}), sort_keys=True)
    return [cell(sweep_cell, policy=p.policy, load=p.load, seed=p.seed, migration_cost=p.migration_cost,
                 trace=spec.trace, model=spec.model, max_jobs=spec.jobs, procs=spec.procs, cpu_usage=spec.cpu_usage,
                 cpu_info=cpu_info, params=shared)
            for p in points]


def csv_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``results.csv`` row (the format of the committed sweeps) from a results-table row."""
    def blank(v: Any) -> Any:
        return "" if v is None else v

    return {
        "workload": row["workload"], "policy": row["policy"], "load": blank(row["load"]), "seed": row["seed"],
        "migration_cost": blank(row["migration_cost"]), "cpu_usage": row["cpu_usage"],
        "cpu_info": int(bool(row["cpu_info"])),
        **{k: row[k] for k in ("cores", "jobs", "avg_wait", "avg_response", "avg_bounded_slowdown", "utilization",
                               "makespan", "migrations", "estimate_kills", "policy_kills")},
        "ci_response": blank(row["ci_response"]), "ci_bounded_slowdown": blank(row["ci_bounded_slowdown"]),
        "wall_s": round(float(row["wall_s"]), 3),
    }


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


@dataclass(frozen=True, slots=True)
class SweepResult:
    """The ``results.csv`` rows of the cells that succeeded (in the order of the points), the table
    rows of those that failed, and how many cells ran now or were already in the table."""

    rows: list[dict[str, Any]]
    failed: list[dict[str, Any]]
    ran: int
    skipped: int


def sweep(
    spec: WorkloadSpec,
    points: Iterable[SweepPoint],
    table: str | Path,
    params: Mapping[str, Any] | None = None,
    cpu_info: bool = True,
    workers: int | None = None,
    scheduler: str | None = None,
    on_done: Callable[[dict[str, Any]], None] | None = None,
    progress: bool = False,
    retry_failed: bool = False,
) -> SweepResult:
    """Run every point with the experiment runner (a local Dask cluster of ``workers`` processes,
    default one per core, or the cluster at ``scheduler``), resuming from ``table``."""
    pts = list(points)
    for p in pts:
        policy_class(p.policy)  # fail fast on an unknown name, before starting workers
    res = run_grid(sweep_cells(spec, pts, params, cpu_info), table, workers=workers, scheduler=scheduler,
                   progress=progress, retry_failed=retry_failed, label="sweep",
                   on_row=on_done)
    ok = [csv_row(r) for r in res.rows if not r.get("error")]
    return SweepResult(rows=ok, failed=res.failed, ran=res.ran, skipped=res.skipped)


def write_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(CSV_FIELDS))
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in CSV_FIELDS})
