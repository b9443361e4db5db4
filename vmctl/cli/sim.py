"""``vmctl sim``: run the scheduling policies on a simulated cluster (offline; no daemon): the two-tier
(fg/bg) cluster by default, gang scheduling with ``--discipline timeslice``.

    vmctl sim run --trace ../shared/data/traces/KTH-SP2-1996-2.1-cln.swf.gz --policy easy
    vmctl sim run --model feitelson96 --jobs 5000 --policy easy --discipline timeslice --levels 3 --slice 200
    vmctl sim run --model jann97 --jobs 2000 --load 0.9 --policy gs-m --discipline timeslice --param cost=20
    vmctl sim gang-table1 --jobs 2000 --workers 2 --out results/gang
    vmctl sim run --model feitelson96 --jobs 20000 --procs 320 --load 0.8 --policy measy --output json
    vmctl sim sweep --model feitelson96 --jobs 20000 --policies easy,keasy,reasy,measy \\
        --loads 0.5,0.6,0.7,0.8,0.9,0.95 --out results/fw

Bad input (missing or malformed trace, unknown policy or parameter) raises a vmctl error, which
``vmctl.cli.main`` prints as ``error: <reference>: message`` with exit code 2.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from vmctl.errors import PolicyParameterError, ValidationError
from vmctl.policies.registry import parse_policy_params, policy_class

if TYPE_CHECKING:
    from vmctl.sim.execution import ExecutionModel


def _floats(option: str, text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidationError(field=option, problem=f"expected comma-separated numbers, got {text!r}") from None


def _ints(option: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidationError(field=option, problem=f"expected comma-separated integers, got {text!r}") from None


def _execution(discipline: str, levels: int | None, slice_s: float | None
               ) -> tuple[Callable[[], ExecutionModel] | None, dict[str, Any]]:
    """The execution model ``vmctl sim run`` asks for (None = the default two-tier model) and how the
    result names it; bad combinations are errors naming the option."""
    if levels is not None and levels < 1:
        raise ValidationError(field="--levels", problem=f"must be >= 1, got {levels}")
    if slice_s is not None and not (slice_s > 0 and math.isfinite(slice_s)):
        raise ValidationError(field="--slice", problem=f"must be a positive number of seconds, got {slice_s:g}")
    if discipline == "priority":
        if levels is not None and levels != 2:
            raise ValidationError(field="--levels", problem=f"the priority discipline has 2 levels (fg and bg), not "
                                                            f"{levels}; --discipline timeslice takes any number")
        if slice_s is not None:
            raise ValidationError(field="--slice", problem="applies to --discipline timeslice only")
        return None, {"model": "two-tier", "discipline": "priority", "levels": 2}
    from vmctl.sim.timeslice import DEFAULT_SLICE, TimeSliceModel

    n = 2 if levels is None else levels
    period = DEFAULT_SLICE if slice_s is None else slice_s
    return (functools.partial(TimeSliceModel, n, period),
            {"model": "timeslice", "discipline": "timeslice", "levels": n, "slice_s": period})


def _spec(trace: str | None, model: str | None, jobs: int | None, procs: int | None, load: float | None,
          seed: int, cpu_usage: str) -> Any:
    from vmctl.experiments.sweep import WorkloadSpec

    if (trace is None) == (model is None):
        raise ValidationError(field="--trace/--model", problem="give exactly one of --trace FILE and --model NAME")
    return WorkloadSpec(trace=trace, model=model, jobs=jobs, procs=procs, load=load, seed=seed,
                        cpu_usage="full" if cpu_usage == "full" else "paper")


def _gang_defaults(policy: str, parsed: dict[str, Any], discipline: str, levels: int | None,
                   slice_s: float | None) -> tuple[int | None, float | None]:
    """A policy with ``mpl``/``slice`` parameters (the gang policies) on ``--discipline timeslice``: the
    levels default to its MPL, and ``--slice`` and its ``slice`` are one value (either sets both; both
    given and different is an error), so the model's first slices already have the policy's T."""
    cls = policy_class(policy)
    known = cls.parameters
    if discipline != "timeslice" or not ("slice" in known or "mpl" in known):
        return levels, slice_s
    cls(**parsed)  # a bad mpl/slice is named as the policy's parameter, not as --levels/--slice
    if "slice" in known:
        if slice_s is not None and "slice" in parsed and parsed["slice"] != slice_s:
            raise ValidationError(field="--slice", problem=f"{slice_s:g} s is not the policy's "
                                                           f"slice={parsed['slice']:g}; give one of them")
        if slice_s is None:
            slice_s = float(parsed.get("slice", known["slice"][1]))
        else:
            parsed["slice"] = slice_s
    if levels is None and "mpl" in known:
        levels = int(parsed.get("mpl", known["mpl"][1]))
    return levels, slice_s


@click.group()
def sim() -> None:
    """Simulate scheduling policies on a two-tier (fg/bg) cluster."""


_workload_options = [
    click.option("--trace", type=str, default=None, help="SWF trace file (.swf or .swf.gz)."),
    click.option("--model", type=click.Choice(["feitelson96", "jann97", "lublin99"]), default=None,
                 help="Workload model instead of a trace."),
    click.option("--jobs", type=int, default=None, help="Number of jobs (model: generate; trace: first N)."),
    click.option("--procs", type=int, default=None, help="Machine size; overrides the trace header (model: 320)."),
    click.option("--cpu-usage", type=click.Choice(["paper", "full"]), default="paper", show_default=True,
                 help="Actual process CPU usage: paper = 100 % one-process, U(40,100) % multi; full = 100 %."),
    click.option("--no-cpu-info", is_flag=True, help="The policy does not see the CPU usage (sec. 3.5.1)."),
]


def _with_workload_options(f: Any) -> Any:
    for opt in reversed(_workload_options):
        f = opt(f)
    return f


@sim.command("run")
@_with_workload_options
@click.option("--load", type=float, default=None, help="Offered load (rescales inter-arrival times).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the model and every random draw.")
@click.option("--policy", required=True, help="Policy name (see vmctl policy list / registry).")
@click.option("--param", "params", multiple=True, metavar="K=V", help="Policy parameter (repeatable).")
@click.option("--output", "-o", "output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Human table or JSON for scripts.")
@click.option("--jobs-out", type=str, default=None, metavar="FILE",
              help="Also write one row per job (id, user, submit, start, end, width, wait, tier changes, "
                   "migrations, kills): CSV, or Parquet when FILE ends in .parquet.")
@click.option("--priority-from-queue", is_flag=True,
              help="Trace only: each job's priority is its SWF queue number (field 15; SWF has no priority).")
@click.option("--discipline", type=click.Choice(["priority", "timeslice"]), default="priority", show_default=True,
              help="Execution model: priority = the two-tier fg/bg progress model (MEASY sec. 3.2); timeslice = "
                   "gang scheduling, one of --levels rows active per --slice seconds (paper 004).")
@click.option("--levels", type=int, default=None, metavar="N",
              help="VM levels per core (timeslice: the multiprogramming level, default 2; priority: 2).")
@click.option("--slice", "slice_s", type=float, default=None, metavar="SECONDS",
              help="Timeslice only: the time slice T (default 200, the paper's).")
@click.option("--shapes", type=click.Choice(["rigid", "moldable", "task-bag"]), default="rigid", show_default=True,
              help="Make every job moldable (widths procs/4 .. 2 procs, Downey speedup) or a bag of one task per "
                   "processor, and run them on that execution model (docs/workloads.md, Job shapes).")
def run_cmd(trace: str | None, model: str | None, jobs: int | None, procs: int | None, cpu_usage: str,
            no_cpu_info: bool, load: float | None, seed: int, policy: str, params: tuple[str, ...],
            output: str, jobs_out: str | None, priority_from_queue: bool, discipline: str, levels: int | None,
            slice_s: float | None, shapes: str) -> None:
    """Run one policy over one workload and print the metrics (on a terminal, a progress bar with the
    ETA while it runs: jobs done of the workload's)."""
    from vmctl.experiments.sweep import build_workload, run_one
    from vmctl.sim import report

    parsed = parse_policy_params(policy, params)
    levels, slice_s = _gang_defaults(policy, parsed, discipline, levels, slice_s)
    execution, execution_doc = _execution(discipline, levels, slice_s)
    if jobs_out is not None:
        from vmctl.sim.jobs_out import check_target

        check_target(jobs_out)
    spec = _spec(trace, model, jobs, procs, load, seed, cpu_usage)
    if load is not None and load > 1:
        click.echo(f"warning: --load {load:g} offers more work than the cluster can do (load > 1): the queue grows "
                   f"without bound and waits measure the overload, not the policy (typical loads: 0.5 to 0.95)",
                   err=True)
    if priority_from_queue:
        spec = dataclasses.replace(spec, priority_from_queue=True)
    if shapes != "rigid":
        if discipline != "priority" or levels is not None or slice_s is not None:
            raise ValidationError(field="--shapes", problem=f"{shapes} jobs run on their own execution model (one "
                                                            "level per core); leave out --discipline/--levels/--slice")
        spec = dataclasses.replace(spec, shapes="task-bag" if shapes == "task-bag" else "moldable")
        execution_doc = {"model": shapes, "discipline": "shared", "levels": 1}
    t0 = time.perf_counter()
    built = build_workload(spec)
    from vmctl.experiments.inputs import progress_bar

    with progress_bar(policy, len(built.jobs), "jobs done") as tick:  # a terminal only: ETA while it runs
        result = run_one(spec, policy, parsed, cpu_info=not no_cpu_info, built=built, jobs_out=jobs_out,
                         on_progress=None if tick is None else lambda done, _total: tick(done), execution=execution)
    wall = time.perf_counter() - t0
    if output == "json":
        click.echo(report.to_json(result, {"wall_s": round(wall, 3), "cpu_info": not no_cpu_info,
                                           "cpu_usage": cpu_usage, "load": load, "execution": execution_doc}))
    else:
        report.print_table(result, execution=execution_doc)
        click.echo(f"wall time {wall:.2f} s", err=True)


@sim.command("gang-seeds")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
def gang_seeds_cmd(dirs: tuple[str, ...]) -> None:
    """Table 1 pooled over several `gang-table1` runs of different seeds (one DIR each): mean rho and
    slowdown with 95 % intervals over the seeds, and in how many seeds migration lowered the slowdown."""
    from vmctl.experiments.gang import table1_seeds

    click.echo(table1_seeds(dirs), nl=False)


@sim.command("gang-table1")
@click.option("--jobs", type=int, default=2000, show_default=True, help="jann97 jobs per run (the paper's size: "
              "as many as the workload needs; see docs/gang.md).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the model.")
@click.option("--workers", type=int, default=None, help="Worker processes of the local Dask cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE", help="Run on an existing Dask cluster.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
def gang_table1_cmd(jobs: int, seed: int, workers: int | None, scheduler: str | None, out_dir: str) -> None:
    """Paper 004's Table 1 (gs, gs-m, bgs, bgs-m; MPL 5, C = 0, Q unlimited) on jann97 at 320
    processors: calibrate the offered loads, run the grid, print ours beside the paper's. A size whose
    calibration reaches fewer than 5 of the nine workloads' utilizations is refused (exit 2; about
    1,000 jobs reach 5, 500 none); workloads out of reach are named on stderr and in the header."""
    from vmctl.experiments.gang import table1

    if jobs <= 0:
        raise ValidationError(field="--jobs", problem=f"must be > 0, got {jobs}")
    if workers is not None and workers <= 0:
        raise ValidationError(field="--workers", problem=f"must be > 0, got {workers}")
    click.echo(table1(jobs, out_dir, seed=seed, workers=workers, scheduler=scheduler,
                      progress=sys.stderr.isatty(), warn=lambda text: click.echo(text, err=True)))


@sim.command("gang-study")
@click.option("--jobs", type=int, default=1000, show_default=True, help="Jobs per run.")
@click.option("--seeds", default="1,2,3", show_default=True, help="Seeds, comma-separated (>= 2 for intervals).")
@click.option("--models", default="jann97,lublin99,jann97-par", show_default=True,
              help="Job-size mixes: jann97, lublin99, jann97-par (jann97 without serial jobs).")
@click.option("--loads", default="0.5,0.7,0.9,1.1,1.3,1.5", show_default=True, help="Offered loads of the grid.")
@click.option("--workers", type=int, default=None, help="Worker processes of the local Dask cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE", help="Run on an existing Dask cluster.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
def gang_study_cmd(jobs: int, seeds: str, models: str, loads: str, workers: int | None, scheduler: str | None,
                   out_dir: str) -> None:
    """Issue 26's job-size study of paper 004: GS, GS+M, BGS, BGS+M and conservative BGS on each mix over
    a grid of offered loads, steady-state utilization (warm-up and drain trimmed), saturation beside the
    paper's, slowdown at each policy's own calibration beside BGS+M's; writes OUT/study.md."""
    from vmctl.experiments.gang import STUDY_MODELS, study

    if jobs <= 0:
        raise ValidationError(field="--jobs", problem=f"must be > 0, got {jobs}")
    if workers is not None and workers <= 0:
        raise ValidationError(field="--workers", problem=f"must be > 0, got {workers}")
    seed_list, load_list = _ints("--seeds", seeds), _floats("--loads", loads)
    model_list = [m.strip() for m in models.split(",") if m.strip()]
    if len(set(seed_list)) < 2:
        raise ValidationError(field="--seeds", problem=f"give at least two distinct seeds, got {seeds!r}")
    if not load_list or any(not (x > 0 and math.isfinite(x)) for x in load_list):
        raise ValidationError(field="--loads", problem=f"expected positive numbers, got {loads!r}")
    bad = [m for m in model_list if m not in STUDY_MODELS]
    if bad or not model_list:
        raise ValidationError(field="--models", problem=f"unknown {', '.join(bad) or 'none given'}; known: "
                                                        f"{', '.join(STUDY_MODELS)}")
    click.echo(study(jobs, out_dir, seeds=sorted(set(seed_list)), models=model_list, loads=load_list,
                     workers=workers, scheduler=scheduler, progress=sys.stderr.isatty()), nl=False)


@sim.command("gang-figure1")
@click.option("--jobs", type=int, default=2000, show_default=True, help="jann97 jobs per run.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the model.")
@click.option("--costs", default="0,10,20,30", show_default=True, help="Migration costs C (s), comma-separated.")
@click.option("--quotas", default="0,16,64,256,-1", show_default=True,
              help="Quotas Q (tasks per slice; -1 = unlimited), comma-separated.")
@click.option("--workers", type=int, default=None, help="Worker processes of the local Dask cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE", help="Run on an existing Dask cluster.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
def gang_figure1_cmd(jobs: int, seed: int, costs: str, quotas: str, workers: int | None, scheduler: str | None,
                     out_dir: str) -> None:
    """Paper 004's Figure 1: slowdown and wait of GS+M and BGS+M against Q for workloads 2 and 5 (loads
    from the Table 1 calibration in OUT), at each cost C; writes OUT/figure1.md and OUT/figure1.png."""
    from vmctl.experiments.gang import figure1

    if jobs <= 0:
        raise ValidationError(field="--jobs", problem=f"must be > 0, got {jobs}")
    cost_list, quota_list = _floats("--costs", costs), _ints("--quotas", quotas)
    if not cost_list or any(not (c >= 0 and math.isfinite(c)) for c in cost_list):
        raise ValidationError(field="--costs", problem=f"expected finite numbers >= 0, got {costs!r}")
    if not quota_list or any(q < -1 for q in quota_list):
        raise ValidationError(field="--quotas", problem=f"expected integers >= 0 (or -1 = unlimited), got {quotas!r}")
    click.echo(figure1(jobs, out_dir, seed=seed, workers=workers, scheduler=scheduler, progress=sys.stderr.isatty(),
                       costs=cost_list, quotas=quota_list))


@sim.command("gang-figure2")
@click.option("--jobs", type=int, default=2000, show_default=True, help="jann97 jobs per run.")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the model.")
@click.option("--costs", default="0,20,30", show_default=True, help="Migration costs C (s) at Q = 64.")
@click.option("--mpls", default="2,3,5", show_default=True, help="Multiprogramming levels.")
@click.option("--workloads", default="0,1,2,3,4,5,6,7,8", show_default=True,
              help="Workloads of Table 1 (their calibrated loads) to sweep.")
@click.option("--workers", type=int, default=None, help="Worker processes of the local Dask cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE", help="Run on an existing Dask cluster.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
def gang_figure2_cmd(jobs: int, seed: int, costs: str, mpls: str, workloads: str, workers: int | None,
                     scheduler: str | None, out_dir: str) -> None:
    """Paper 004's Figure 2: slowdown against utilization for each MPL, Q = 0 and Q = 64 at each cost;
    the largest utilization with slowdown <= 20. Writes OUT/figure2.md and OUT/figure2.png."""
    from vmctl.experiments.gang import figure2

    if jobs <= 0:
        raise ValidationError(field="--jobs", problem=f"must be > 0, got {jobs}")
    cost_list, mpl_list, wl_list = _floats("--costs", costs), _ints("--mpls", mpls), _ints("--workloads", workloads)
    if any(not (c >= 0 and math.isfinite(c)) for c in cost_list):
        raise ValidationError(field="--costs", problem=f"expected finite numbers >= 0, got {costs!r}")
    if not mpl_list or any(m < 2 for m in mpl_list):
        raise ValidationError(field="--mpls", problem=f"expected integers >= 2, got {mpls!r}")
    if not wl_list or any(not 0 <= w <= 8 for w in wl_list):
        raise ValidationError(field="--workloads", problem=f"expected workloads 0..8, got {workloads!r}")
    click.echo(figure2(jobs, out_dir, seed=seed, workers=workers, scheduler=scheduler, progress=sys.stderr.isatty(),
                       costs=cost_list, mpls=mpl_list, workloads=wl_list))


@sim.command("gang-traces")
@click.option("--jobs", type=int, default=3000, show_default=True, help="First N jobs of each trace.")
@click.option("--trace-dir", default=None, help="Where the SWF traces are (default: $VMCTL_TRACE_DIR, else "
              "../shared/data/traces beside the checkout).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the CPU-usage draw (MEASY).")
@click.option("--workers", type=int, default=None, help="Worker processes of the local Dask cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE", help="Run on an existing Dask cluster.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
def gang_traces_cmd(jobs: int, trace_dir: str | None, seed: int, workers: int | None, scheduler: str | None,
                    out_dir: str) -> None:
    """gs, gs-m, bgs, bgs-m (MPL 5) against EASY and MEASY on the real traces (KTH, SDSC, CTC, HPC2N);
    writes OUT/traces.md."""
    from vmctl.experiments.gang import traces

    if jobs <= 0:
        raise ValidationError(field="--jobs", problem=f"must be > 0, got {jobs}")
    click.echo(traces(jobs, out_dir, trace_dir, seed=seed, workers=workers, scheduler=scheduler,
                      progress=sys.stderr.isatty()))


@sim.command("sweep")
@_with_workload_options
@click.option("--policies", default="easy,keasy,reasy,measy", show_default=True, help="Comma-separated policies.")
@click.option("--loads", default=None, help="Comma-separated loads, e.g. 0.5,0.6,0.7,0.8,0.9,0.95 (default: as is).")
@click.option("--seeds", default="1", show_default=True, help="Comma-separated seeds.")
@click.option("--migration-costs", default=None, help="Comma-separated migration costs (s) for policies that take one.")
@click.option("--param", "params", multiple=True, metavar="K=V", help="Parameter for every policy that has it.")
@click.option("--workers", type=int, default=None,
              help="Worker processes of the local Dask cluster (default: number of cores).")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE",
              help="Run on an existing Dask cluster: tcp://HOST:8786 or a scheduler file (docs/experiments.md).")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
@click.option("--table", default=None, metavar="FILE",
              help="Results table, one row per run: .parquet or .csv (default: OUT/results.parquet). "
                   "Rerunning the same sweep skips the runs already in it.")
@click.option("--retry-failed", is_flag=True, help="Rerun the runs that failed last time (default: skip them).")
@click.option("--no-plots", is_flag=True, help="Write results.csv only.")
def sweep_cmd(trace: str | None, model: str | None, jobs: int | None, procs: int | None, cpu_usage: str,
              no_cpu_info: bool, policies: str, loads: str | None, seeds: str, migration_costs: str | None,
              params: tuple[str, ...], workers: int | None, scheduler: str | None, out_dir: str, table: str | None,
              retry_failed: bool, no_plots: bool) -> None:
    """Run policies x loads x seeds (x migration costs) on Dask; write the results table, results.csv
    and plots (rerunning resumes: runs already in the table are skipped)."""
    from vmctl.errors import CellsFailed
    from vmctl.experiments.sweep import sweep, sweep_points, write_csv

    names = [p.strip() for p in policies.split(",") if p.strip()]
    if not names:
        raise ValidationError(field="--policies", problem="no policy given")
    shared: dict[str, Any] = {}
    for name in names:
        cls = policy_class(name)
        for item in params:
            key = item.split("=", 1)[0].strip()
            if key in cls.parameters:
                shared.update(parse_policy_params(name, (item,)))
    for item in params:
        key = item.split("=", 1)[0].strip()
        if key not in shared:
            raise PolicyParameterError(policy=",".join(names), param=key, problem="no listed policy takes it")
    load_list: list[float | None] = list(_floats("--loads", loads)) if loads else [None]
    seed_list = _ints("--seeds", seeds)
    costs = _floats("--migration-costs", migration_costs) if migration_costs else []
    if workers is not None and workers <= 0:
        raise ValidationError(field="--workers", problem=f"must be > 0, got {workers}")
    spec = _spec(trace, model, jobs, procs, None, seed_list[0] if seed_list else 1, cpu_usage)
    if spec.trace is not None and not Path(spec.trace).exists():
        from vmctl.errors import TraceFormatError

        raise TraceFormatError(path=spec.trace, line=0, problem="no such file")
    points = sweep_points(names, load_list, seed_list or [1], costs)
    from vmctl.experiments.runner import writable_dir

    out = writable_dir(out_dir)
    table_path = Path(table) if table else out / "results.parquet"
    t0 = time.perf_counter()
    done = 0

    def tick(row: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        click.echo(f"[{done}] {_point_text(row)}: " + (f"failed: {row['error']}" if row["error"] else
                   f"response {row['avg_response']:.0f} s, bsld {row['avg_bounded_slowdown']:.2f} "
                   f"({row['wall_s']:.1f} s)"), err=True)

    res = sweep(spec, points, table_path, shared, cpu_info=not no_cpu_info, workers=workers, scheduler=scheduler,
                on_done=tick, progress=sys.stderr.isatty(), retry_failed=retry_failed)
    write_csv(res.rows, out / "results.csv")
    written = [table_path, out / "results.csv"]
    if not no_plots and res.rows:
        from vmctl.sim.plots import plot_results

        written += plot_results(res.rows, out, title=spec.label())
    click.echo(json.dumps({"runs": len(res.rows), "ran": res.ran, "skipped": res.skipped, "failed": len(res.failed),
                           "wall_s": round(time.perf_counter() - t0, 2), "files": [str(p) for p in written]}))
    if res.failed:
        from vmctl.experiments.inputs import first_failure

        raise CellsFailed(failed=len(res.failed), total=len(points), table=str(table_path),
                          first=first_failure(res.failed, _point_text(res.failed[0])))


def _point_text(row: Mapping[str, Any]) -> str:
    """``measy load=0.9 seed=1 cost=20``; the load and the cost only when the sweep has them."""
    parts = [str(row["policy"])]
    if row.get("load") is not None:
        parts.append(f"load={row['load']}")
    parts.append(f"seed={row['seed']}")
    if row.get("migration_cost") is not None:
        parts.append(f"cost={row['migration_cost']:g}")
    return " ".join(parts)


@sim.command("plot")
@click.argument("results", type=str)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Where the PNGs go.")
@click.option("--title", default=None, help="Plot title (default: the workload).")
def plot_cmd(results: str, out_dir: str, title: str | None) -> None:
    """Redraw a sweep's plots from its results table (results.parquet, or results.csv) without
    running anything."""
    from vmctl.errors import InstanceFormatError
    from vmctl.experiments.runner import read_table, writable_dir
    from vmctl.experiments.sweep import csv_row
    from vmctl.sim.plots import plot_results

    path = Path(results)
    if not path.is_file():
        raise InstanceFormatError(path=results, where="file", problem="no such file")
    if path.suffix == ".parquet":
        rows: list[dict[str, Any]] = [csv_row(r) for r in read_table(path) if not r.get("error")]
    else:
        import csv

        with path.open(encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
    need = {"workload", "policy", "load", "migration_cost", "avg_response", "avg_bounded_slowdown", "migrations"}
    if not rows or not need <= set(rows[0]):
        raise InstanceFormatError(path=results, where="header",
                                  problem=f"not a sweep's results (needs columns {', '.join(sorted(need))})")
    written = plot_results(rows, writable_dir(out_dir), title=title or str(rows[0]["workload"]))
    click.echo(json.dumps({"files": [str(p) for p in written]}))


@sim.command("compare")
@click.argument("results", type=str, nargs=-1, required=True)
@click.option("--baseline", default="easy", show_default=True, help="Policy the others are compared with.")
def compare_cmd(results: tuple[str, ...], baseline: str) -> None:
    """Print a markdown table from one or more sweeps' results.csv: response time and bounded slowdown
    per workload, load and policy, with the improvement over the baseline policy in %."""
    import csv

    from vmctl.errors import InstanceFormatError
    from vmctl.sim.report import compare_markdown

    need = {"workload", "policy", "load", "avg_response", "avg_bounded_slowdown", "migrations"}
    rows: list[dict[str, str]] = []
    for results_path in results:
        try:
            with Path(results_path).open(encoding="utf-8", newline="") as fh:
                part = list(csv.DictReader(fh))
        except OSError as exc:
            raise InstanceFormatError(path=results_path, where="file", problem=exc.strerror or str(exc)) from exc
        if not part or not need <= set(part[0]):
            raise InstanceFormatError(path=results_path, where="header",
                                      problem=f"not a sweep results.csv (needs columns {', '.join(sorted(need))})")
        rows += part
    try:
        click.echo(compare_markdown(rows, baseline))
    except ValueError as exc:
        raise InstanceFormatError(path=",".join(results), where="values", problem=str(exc)) from exc
