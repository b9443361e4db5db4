"""``vmctl vcsched``: offline VCSCHED tools (Casanova et al., RR-6692).

- ``solve INSTANCE.json --algorithm NAME`` runs one algorithm on one instance and prints
  ``{"status", "min_yield", "avg_yield", "placement", "run_time_s"}`` (plus the LP bound).
  ``status`` is ok, infeasible (the algorithm found no allocation) or timeout; all three exit 0.
  ``--prev PREV.json --budget B`` re-allocates with a migration budget (sec. 6): PREV holds
  ``{"hosts": [h0, h1, ...]}``, the current host of every task (-1 for a new task).
- ``generate`` writes instances of sec. 4.1 (or parallel ones of sec. 5 with ``--parallel``).
- ``eval small|large|parallel|dynamic`` regenerates the tables and plots of ``docs/vcsched.md``.

A malformed instance is an ``InstanceFormatError`` naming the file and the JSON path (exit 2).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np

from vmctl.cli.jsonfile import read_json
from vmctl.cli.render import flow, screen_width
from vmctl.errors import InstanceFormatError
from vmctl.policies.vcsched.algorithms import ALGORITHMS, solve
from vmctl.policies.vcsched.instance import Instance, Solution, instance_from_dict
from vmctl.policies.vcsched.milp import lp_bound


def load_instance(path: str) -> Instance:
    return instance_from_dict(read_json(path), source=path)


def _load_prev(path: str, inst: Instance) -> np.ndarray[Any, np.dtype[np.int64]]:
    doc = read_json(path)
    if not isinstance(doc, dict) or "hosts" not in doc:
        raise InstanceFormatError(path=path, where="$", problem="must be an object with key 'hosts'")
    hosts = doc["hosts"]
    if not isinstance(hosts, list) or len(hosts) != inst.n_tasks:
        raise InstanceFormatError(path=path, where="hosts", problem=f"must be a list of {inst.n_tasks} host indices")
    for i, h in enumerate(hosts):
        if isinstance(h, bool) or not isinstance(h, int) or not -1 <= h < inst.hosts:
            raise InstanceFormatError(
                path=path, where=f"hosts[{i}]", problem=f"must be -1 or an integer in [0, {inst.hosts - 1}], got {h!r}"
            )
    return np.asarray(hosts, dtype=np.int64)


@click.group()
def vcsched() -> None:
    """VCSCHED: virtual-cluster CPU caps and placement (max-min yield)."""


def _result(sol: Solution, inst: Instance, seconds: float) -> dict[str, Any]:
    out = sol.to_dict()
    out["run_time_s"] = seconds
    out["lp_bound"] = lp_bound(inst)
    return out


@vcsched.command("solve")
@click.argument("instance", type=click.Path(dir_okay=False))
@click.option(
    "--algorithm",
    "-a",
    required=True,
    type=click.Choice([*ALGORITHMS, "dynamic", "dyn-milp"]),
    help="Algorithm (dynamic / dyn-milp need --prev and --budget).",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of RRND/RRNZ.")
@click.option(
    "--time-limit", type=click.FloatRange(min=0.001), default=60.0, show_default=True, help="MILP time limit, seconds."
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=500_000,
    show_default=True,
    help="GB/SGB bound on placement attempts.",
)
@click.option("--prev", type=click.Path(dir_okay=False), default=None, help="Current placement (dynamic).")
@click.option("--budget", type=click.FloatRange(min=0.0), default=None, help="Migration budget, host-memory units.")
@click.option("--output", "-o", type=click.Choice(["json", "table"]), default="table", show_default=True)
def solve_cmd(
    instance: str,
    algorithm: str,
    seed: int,
    time_limit: float,
    max_attempts: int,
    prev: str | None,
    budget: float | None,
    output: str,
) -> None:
    """Solve one instance file with one algorithm."""
    inst = load_instance(instance)
    t0 = time.perf_counter()
    moved: float | None = None
    if algorithm in ("dynamic", "dyn-milp"):
        if prev is None or budget is None:
            raise click.UsageError(f"--algorithm {algorithm} needs --prev and --budget")
        from vmctl.policies.vcsched.dynamic import dynamic_mcb, dynamic_milp, migration_cost

        prev_hosts = _load_prev(prev, inst)
        if algorithm == "dynamic":
            sol = dynamic_mcb(inst, prev_hosts, budget)
        else:
            sol = dynamic_milp(inst, prev_hosts, budget, time_limit=time_limit)
        if sol.placed:
            moved = migration_cost(inst, prev_hosts, sol.hosts)
    else:
        if prev is not None or budget is not None:
            raise click.UsageError("--prev/--budget apply only to --algorithm dynamic or dyn-milp")
        sol = solve(inst, algorithm, seed=seed, time_limit=time_limit, max_attempts=max_attempts)
    seconds = time.perf_counter() - t0
    out = _result(sol, inst, seconds)
    if moved is not None:
        out["migrated_mem"] = moved
    if output == "json":
        click.echo(json.dumps(out, indent=2))
        return
    bound = out["lp_bound"]
    click.echo(f"algorithm   {sol.algorithm}")
    click.echo(f"status      {sol.status}")
    click.echo(f"min yield   {sol.min_yield:.4f}")
    click.echo(f"avg yield   {sol.avg_yield:.4f}")
    click.echo(f"LP bound    {'infeasible' if bound is None else f'{bound:.4f}'}")
    if moved is not None:
        click.echo(f"migrated    {moved:.4f} (host memory units)")
    click.echo(f"run time    {seconds * 1000:.2f} ms")
    if sol.placed:
        click.echo("")
        click.echo(f"{'host':>4}  {'cpu':>6}  {'mem':>6}  tasks (cpu cap / need)")
        for h in range(inst.hosts):
            tasks = [i for i, hh in enumerate(sol.hosts) if hh == h]
            cpu = sum(sol.alloc[i] for i in tasks)
            mem = sum(inst.mem[i] for i in tasks)
            cells = [f"{i}:{sol.alloc[i]:.3f}/{inst.cpu[i]:.3f}" for i in tasks]
            for line in flow(f"{h:>4}  {cpu:6.3f}  {mem:6.3f}  ", cells, screen_width(), sep=", "):
                click.echo(line)  # a host's tasks over lines that fit the screen, under the tasks column


@vcsched.command("generate")
@click.option("--hosts", type=click.IntRange(min=1), required=True)
@click.option("--tasks", type=click.IntRange(min=1), required=True)
@click.option("--slack", type=click.FloatRange(0.0, 1.0, max_open=True), required=True, help="Memory slack in [0, 1).")
@click.option("--cv", type=click.FloatRange(min=0.0), default=None, help="CV of both memory and CPU needs.")
@click.option("--cv-mem", type=click.FloatRange(min=0.0), default=None, help="CV of memory needs (overrides --cv).")
@click.option("--cv-cpu", type=click.FloatRange(min=0.0), default=None, help="CV of CPU needs (overrides --cv).")
@click.option("--count", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--parallel", is_flag=True, help="Parallel jobs with Lublin-Feitelson sizes (sec. 5).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True)
def generate_cmd(
    hosts: int,
    tasks: int,
    slack: float,
    cv: float | None,
    cv_mem: float | None,
    cv_cpu: float | None,
    count: int,
    seed: int,
    parallel: bool,
    out_dir: str,
) -> None:
    """Write COUNT random instances (sec. 4.1) as JSON files into OUT."""
    from vmctl.policies.vcsched.generator import generate, generate_parallel

    cm = cv_mem if cv_mem is not None else cv
    cc = cv_cpu if cv_cpu is not None else cv
    if cm is None or cc is None:
        raise click.UsageError("give --cv, or both --cv-mem and --cv-cpu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for k in range(count):
        gen = generate_parallel if parallel else generate
        inst = gen(hosts, tasks, slack, cm, cc, rng)
        name = f"vc-h{hosts}-t{tasks}-s{slack:g}-cm{cm:g}-cc{cc:g}-seed{seed}-{k:04d}.json"
        (out / name).write_text(json.dumps(inst.to_dict()) + "\n", encoding="utf-8")
    click.echo(f"wrote {count} instance(s) to {out}")


@vcsched.command("eval")
@click.argument("suite", type=click.Choice(["small", "large", "parallel", "dynamic"]))
@click.option(
    "--instances",
    type=click.IntRange(min=1),
    default=None,
    help="Instances per problem specification (paper: 10 small, 100 large).",
)
@click.option("--workers", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=int, default=2008, show_default=True)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0.001),
    default=60.0,
    show_default=True,
    help="MILP time limit per instance, seconds.",
)
@click.option("--algorithms", default=None, help="Comma-separated subset of algorithms.")
@click.option("--tasks", "tasks_opt", default=None, help="Comma-separated subset of task counts.")
@click.option("--slacks", default=None, help="Comma-separated subset of memory slacks.")
@click.option(
    "--rr-max-tasks",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Run RRND/RRNZ only on instances with at most this many tasks (their LP is slow).",
)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True)
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE",
              help="Run on an existing Dask cluster: tcp://HOST:8786 or a scheduler file (docs/experiments.md).")
@click.option("--table", default=None, metavar="FILE",
              help="Results table, one row per instance and algorithm: .parquet or .csv "
                   "(default: OUT/results-SUITE.parquet). Rerunning skips the cells already in it.")
@click.option("--retry-failed", is_flag=True, help="Rerun the cells that failed last time (default: skip them).")
def eval_cmd(
    suite: str,
    instances: int | None,
    workers: int,
    seed: int,
    time_limit: float,
    algorithms: str | None,
    tasks_opt: str | None,
    slacks: str | None,
    rr_max_tasks: int,
    out_dir: str,
    scheduler: str | None,
    table: str | None,
    retry_failed: bool,
) -> None:
    """Run an evaluation suite on Dask (local workers or --scheduler); write the results table,
    results-SUITE.jsonl, tables (Markdown) and PNG plots into OUT. Rerunning resumes."""
    from vmctl.experiments.runner import writable_dir
    from vmctl.experiments.vcsched import run_suite

    algs = None
    if algorithms:
        algs = [a.strip().lower() for a in algorithms.split(",") if a.strip()]
        bad = [a for a in algs if a not in ALGORITHMS]
        if bad:
            raise click.UsageError(f"unknown algorithm(s): {', '.join(bad)} (known: {', '.join(ALGORITHMS)})")
    try:
        task_list = [int(x) for x in tasks_opt.split(",")] if tasks_opt else None
        slack_list = [float(x) for x in slacks.split(",")] if slacks else None
    except ValueError as exc:
        raise click.UsageError(f"--tasks/--slacks: {exc}") from exc
    if task_list and min(task_list) < 3:
        raise click.UsageError("--tasks: task counts must be >= 3")
    if slack_list and not all(0.0 <= x < 1.0 for x in slack_list):
        raise click.UsageError("--slacks: values must be in [0, 1)")
    summary = run_suite(
        suite,
        writable_dir(out_dir),
        instances=instances,
        workers=workers,
        seed=seed,
        time_limit=time_limit,
        algorithms=algs,
        rr_max_tasks=rr_max_tasks,
        progress=lambda s: click.echo(s, err=True),
        tasks=task_list,
        slacks=slack_list,
        scheduler=scheduler,
        table=Path(table) if table else None,
        retry_failed=retry_failed,
        progress_bar=sys.stderr.isatty(),
    )
    click.echo(summary)
