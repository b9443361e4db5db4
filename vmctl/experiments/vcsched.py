"""Evaluation runner for VCSCHED (Casanova et al., RR-6692, sec. 4, 5.2 and 6).

Suites (``vmctl vcsched eval SUITE --out DIR``):

- ``small``: 4 hosts; 6/8/10/12 tasks; slack 0.1..0.9; CV of memory and of CPU 0.25/0.75 (144
  specifications); every algorithm including the exact MILP; 10 instances each in the paper.
- ``large``: 64 hosts; 100/250/500 tasks; same slacks and CVs (108 specifications); every heuristic
  against the LP bound; 100 instances each in the paper. RRND/RRNZ solve a 64k-variable LP (tens of
  seconds each at 500 tasks), so they run only up to ``rr_max_tasks`` tasks (default 100).
- ``parallel``: as ``large`` with parallel jobs (Lublin-Feitelson sizes 1-64); SG and MCB8.
- ``dynamic``: small clusters after a workload change (CPU needs redrawn by x U(0.5, 1.5), one task
  leaves, two arrive); dynamic MILP vs our dynamic MCB8 heuristic under several migration budgets.

Every instance is generated from ``SeedSequence([seed, spec..., k])``, so a subset of instances is
the same as the corresponding part of the full run. Every solution is checked against the
constraints (``check_solution``); a violation fails that cell (it would be an algorithm bug).

The suites run on the experiment runner (:mod:`vmctl.experiments.runner`): one cell per instance and
algorithm (dynamic: and migration budget), on a local Dask cluster or an existing one, recorded in
``results-SUITE.parquet``; a rerun skips the cells already there. Output, drawn from that table:
``results-SUITE.jsonl`` (one row per instance and algorithm), ``tables-SUITE.md`` and PNG plots
(matplotlib, Agg backend) named after the paper's figures.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vmctl.errors import CellsFailed
from vmctl.experiments.runner import Cell, cell, run_grid
from vmctl.policies.vcsched.algorithms import ALGORITHMS, RANDOMIZED, solve
from vmctl.policies.vcsched.dynamic import dynamic_mcb, dynamic_milp, migration_cost
from vmctl.policies.vcsched.generator import generate, generate_parallel
from vmctl.policies.vcsched.instance import Instance, Solution, check_solution
from vmctl.policies.vcsched.milp import lp_bound

SLACKS = tuple(round(0.1 * k, 1) for k in range(1, 10))
CVS = (0.25, 0.75)
MCBS = tuple(f"mcb{k}" for k in range(1, 9))
OVERALL = ("milp", "rrnd", "rrnz", "gr", "sg", "gb", "sgb", "mcb8")
DYN_BUDGETS = (0.0, 0.1, 0.25, 0.5, 1.0, math.inf)


@dataclass(frozen=True)
class SuiteSpec:
    hosts: int
    tasks: tuple[int, ...]
    instances: int
    algorithms: tuple[str, ...]
    parallel: bool = False


SUITES: dict[str, SuiteSpec] = {
    "small": SuiteSpec(4, (6, 8, 10, 12), 10, ALGORITHMS),
    "large": SuiteSpec(64, (100, 250, 500), 100, tuple(a for a in ALGORITHMS if a != "milp")),
    "parallel": SuiteSpec(64, (100, 250, 500), 100, ("sg", "mcb8"), parallel=True),
    "dynamic": SuiteSpec(4, (8, 10), 10, ("dyn-milp", "dyn-mcb")),
}


@dataclass(frozen=True)
class Job:
    suite: str
    hosts: int
    tasks: int
    slack: float
    cv_mem: float
    cv_cpu: float
    k: int
    seed: int
    algorithms: tuple[str, ...]
    parallel: bool
    time_limit: float
    rr_max_tasks: int

    def rng(self) -> np.random.Generator:
        ss = np.random.SeedSequence(
            [
                self.seed,
                self.hosts,
                self.tasks,
                round(self.slack * 10),
                round(self.cv_mem * 100),
                round(self.cv_cpu * 100),
                int(self.parallel),
                self.k,
            ]
        )
        return np.random.default_rng(ss)

    def key(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "hosts": self.hosts,
            "tasks": self.tasks,
            "slack": self.slack,
            "cv_mem": self.cv_mem,
            "cv_cpu": self.cv_cpu,
            "k": self.k,
        }


def _timed(fn: Callable[[], Solution]) -> tuple[Solution, float]:
    t0 = time.perf_counter()
    sol = fn()
    return sol, time.perf_counter() - t0


def _check(inst: Instance, sol: Solution, job: Job) -> None:
    problems = check_solution(inst, sol)
    if problems:
        raise AssertionError(f"{sol.algorithm} on {job.key()}: invalid solution: {'; '.join(problems)}")


def run_instance(job: Job) -> list[dict[str, Any]]:
    """All algorithms of the job on its instance (module-level so a process pool can pickle it)."""
    if job.suite == "dynamic":
        return _run_dynamic(job)
    rng = job.rng()
    gen = generate_parallel if job.parallel else generate
    inst = gen(job.hosts, job.tasks, job.slack, job.cv_mem, job.cv_cpu, rng)
    bound = lp_bound(inst)
    rows = []
    for alg in job.algorithms:
        base = {**job.key(), "algorithm": alg, "lp_bound": bound}
        if alg in RANDOMIZED and job.tasks > job.rr_max_tasks:
            rows.append({**base, "status": "skipped", "min_yield": 0.0, "avg_yield": 0.0, "time_s": 0.0})
            continue
        sol, secs = _timed(lambda a=alg: solve(inst, a, seed=job.k, time_limit=job.time_limit))  # type: ignore[misc]
        _check(inst, sol, job)
        rows.append(
            {
                **base,
                "status": sol.status,
                "placed": sol.placed,
                "min_yield": sol.min_yield,
                "avg_yield": sol.avg_yield,
                "time_s": secs,
            }
        )
    return rows


@dataclass(frozen=True)
class DynamicSetup:
    """A dynamic instance after the workload change, the placement before it, and the stay yield."""

    inst: Instance
    prev: np.ndarray[Any, np.dtype[np.int64]]
    stay: float


def dynamic_setup(job: Job) -> DynamicSetup | None:
    """The change of the job's dynamic instance; None when MCB8 finds no initial placement."""
    rng = job.rng()
    base = generate(job.hosts, job.tasks, job.slack, job.cv_mem, job.cv_cpu, rng)
    # before the change: the first tasks - 2 tasks, placed by MCB8
    n0 = job.tasks - 2
    before = Instance.sequential(job.hosts, base.cpu[:n0], base.mem[:n0])
    first = solve(before, "mcb8")
    if not first.placed:
        return None
    # the change: CPU needs redrawn, one old task leaves, two new tasks arrive
    leave = int(rng.integers(n0))
    keep = [i for i in range(n0) if i != leave]
    cpu = [min(1.0, max(0.01, base.cpu[i] * float(rng.uniform(0.5, 1.5)))) for i in keep] + list(base.cpu[n0:])
    mem = [base.mem[i] for i in keep] + list(base.mem[n0:])
    inst = Instance.sequential(job.hosts, cpu, mem)
    prev = np.asarray([first.hosts[i] for i in keep] + [-1, -1], dtype=np.int64)
    return DynamicSetup(inst, prev, solve_stay(inst, prev))


def dynamic_one(job: Job, setup: DynamicSetup, alg: str, budget: float) -> dict[str, Any]:
    """One algorithm under one migration budget (``math.inf``: all the memory may move)."""
    inst, prev = setup.inst, setup.prev
    b = float(inst.mem_a.sum()) if math.isinf(budget) else budget
    if alg == "dyn-milp":
        sol, secs = _timed(lambda: dynamic_milp(inst, prev, b, time_limit=job.time_limit))
    else:
        sol, secs = _timed(lambda: dynamic_mcb(inst, prev, b))
    _check(inst, sol, job)
    moved = migration_cost(inst, prev, sol.hosts) if sol.placed else 0.0
    if sol.placed and moved > b + 1e-9:
        raise AssertionError(f"{alg} moved {moved} > budget {b} on {job.key()}")
    return {
        **job.key(),
        "algorithm": alg,
        "budget": "all" if math.isinf(budget) else budget,
        "status": sol.status,
        "placed": sol.placed,
        "min_yield": sol.min_yield,
        "avg_yield": sol.avg_yield,
        "moved": moved,
        "time_s": secs,
        "stay_yield": setup.stay,
    }


def _run_dynamic(job: Job) -> list[dict[str, Any]]:
    setup = dynamic_setup(job)
    if setup is None:
        return [{**job.key(), "algorithm": "none", "status": "no-initial", "budget": None}]
    return [dynamic_one(job, setup, alg, budget) for budget in DYN_BUDGETS for alg in job.algorithms]


def solve_stay(inst: Instance, prev: np.ndarray[Any, np.dtype[np.int64]]) -> float:
    """Minimum yield when nothing moves and the new tasks go to the least loaded host with memory."""
    dyn = dynamic_mcb(inst, prev, 0.0)
    return dyn.min_yield if dyn.placed else 0.0


def jobs_for(
    suite: str,
    instances: int | None,
    seed: int,
    time_limit: float,
    algorithms: Sequence[str] | None,
    rr_max_tasks: int,
    tasks: Sequence[int] | None = None,
    slacks: Sequence[float] | None = None,
) -> list[Job]:
    spec = SUITES[suite]
    n = instances if instances is not None else spec.instances
    algs = tuple(algorithms) if algorithms else spec.algorithms
    slack_list = tuple(slacks) if slacks else (0.3, 0.5, 0.7) if suite == "dynamic" else SLACKS
    out = []
    for n_tasks in tuple(tasks) if tasks else spec.tasks:
        for slack in slack_list:
            for cm in CVS:
                for cc in CVS:
                    for k in range(n):
                        out.append(
                            Job(
                                suite,
                                spec.hosts,
                                n_tasks,
                                slack,
                                cm,
                                cc,
                                k,
                                seed,
                                algs,
                                spec.parallel,
                                time_limit,
                                rr_max_tasks,
                            )
                        )
    return out


#: the inputs of a cell that name its instance (the columns of a results row before ``algorithm``)
KEY_FIELDS = ("suite", "hosts", "tasks", "slack", "cv_mem", "cv_cpu", "k")
#: a results row's fields after ``algorithm``, in the order of results-SUITE.jsonl
STATIC_FIELDS = ("lp_bound", "status", "placed", "min_yield", "avg_yield", "time_s")
DYNAMIC_FIELDS = ("budget", "status", "placed", "min_yield", "avg_yield", "moved", "time_s", "stay_yield")


def eval_cell(suite: str, hosts: int, tasks: int, slack: float, cv_mem: float, cv_cpu: float, k: int, seed: int,
              parallel: bool, algorithm: str, time_limit: float, rr_max_tasks: int,
              budget: str | None = None) -> dict[str, Any]:
    """One algorithm on one instance (dynamic: under one migration budget, ``"all"`` or a number) as an
    experiment cell; returns the fields of its results row after ``algorithm`` (``budget`` excepted)."""
    job = Job(suite, hosts, tasks, slack, cv_mem, cv_cpu, k, seed, (algorithm,), parallel, time_limit, rr_max_tasks)
    if suite == "dynamic":
        setup = dynamic_setup(job)
        if setup is None:
            return {"status": "no-initial"}
        row = dynamic_one(job, setup, algorithm, math.inf if budget == "all" else float(budget or 0.0))
    else:
        [row] = run_instance(job)
    return {k: v for k, v in row.items() if k not in KEY_FIELDS and k not in ("algorithm", "budget")}


def eval_cells(jobs: Sequence[Job]) -> list[Cell]:
    """The cells of the jobs, in the order of results-SUITE.jsonl (instance, [budget,] algorithm)."""
    out = []
    for job in jobs:
        inputs: dict[str, Any] = {**job.key(), "seed": job.seed, "parallel": job.parallel,
                                  "time_limit": job.time_limit, "rr_max_tasks": job.rr_max_tasks}
        budgets: tuple[str | None, ...] = (None,)
        if job.suite == "dynamic":
            budgets = tuple("all" if math.isinf(b) else repr(b) for b in DYN_BUDGETS)
        for b in budgets:
            for alg in job.algorithms:
                extra = {} if b is None else {"budget": b}
                out.append(cell(eval_cell, **inputs, algorithm=alg, **extra))
    return out


def results_rows(suite: str, table_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """results-SUITE.jsonl rows from the results table's rows of the cells that succeeded (dynamic: the
    cells of an instance without an initial placement become its one ``none`` row)."""
    out: list[dict[str, Any]] = []
    no_initial: set[tuple[Any, ...]] = set()
    for r in table_rows:
        if r.get("error"):
            continue
        key = {f: r[f] for f in KEY_FIELDS}
        if r["status"] == "no-initial":
            ident = tuple(key.values())
            if ident not in no_initial:
                no_initial.add(ident)
                out.append({**key, "algorithm": "none", "status": "no-initial", "budget": None})
            continue
        row = {**key, "algorithm": r["algorithm"]}
        for f in DYNAMIC_FIELDS if suite == "dynamic" else STATIC_FIELDS:
            v = r.get(f)
            if f == "budget" and v is not None and v != "all":
                v = float(v)
            if not (f == "placed" and r["status"] == "skipped"):  # a skipped run has no 'placed'
                row[f] = v
        out.append(row)
    return out


def run_suite(
    suite: str,
    out: Path,
    instances: int | None = None,
    workers: int = 1,
    seed: int = 2008,
    time_limit: float = 60.0,
    algorithms: Sequence[str] | None = None,
    rr_max_tasks: int = 100,
    progress: Callable[[str], None] | None = None,
    tasks: Sequence[int] | None = None,
    slacks: Sequence[float] | None = None,
    scheduler: str | None = None,
    table: Path | None = None,
    retry_failed: bool = False,
    progress_bar: bool = False,
) -> str:
    """Run the suite with the experiment runner (a local Dask cluster of ``workers`` processes or the
    cluster at ``scheduler``; the cells of one instance in one Dask task), resuming from ``table``
    (default ``OUT/results-SUITE.parquet``); write results-SUITE.jsonl, tables-SUITE.md and the plots
    from the table and return the tables' text. Cells that failed (an invalid solution is an algorithm
    bug) are left out of the outputs and raise :class:`CellsFailed` after they are written."""
    jobs = jobs_for(suite, instances, seed, time_limit, algorithms, rr_max_tasks, tasks, slacks)
    cells = eval_cells(jobs)
    table_path = table or out / f"results-{suite}.parquet"
    t0 = time.perf_counter()
    done = 0

    def note(row: dict[str, Any]) -> None:
        nonlocal done
        done += 1
        if progress and (done % max(1, len(cells) // 20) == 0):
            progress(f"{suite}: {done} cells run, {time.perf_counter() - t0:.0f} s")

    per_instance = max(1, len(cells) // max(1, len(jobs)))
    res = run_grid(cells, table_path, workers=workers, scheduler=scheduler, retry_failed=retry_failed,
                   progress=progress_bar, label=suite, on_row=note, batch=per_instance)
    if progress:
        progress(f"{suite}: {len(cells)} cells ({res.ran} run now, {res.skipped} from {table_path}), "
                 f"{time.perf_counter() - t0:.0f} s")
    rows = results_rows(suite, res.rows)
    with (out / f"results-{suite}.jsonl").open("w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")
    text = report(suite, rows, out)
    (out / f"tables-{suite}.md").write_text(text, encoding="utf-8")
    if res.failed:
        from vmctl.experiments.inputs import first_failure

        first = res.failed[0]
        raise CellsFailed(failed=len(res.failed), total=len(cells), table=str(table_path),
                          first=first_failure(res.failed, f"{first['algorithm']} on tasks={first['tasks']} "
                                                          f"slack={first['slack']} k={first['k']}"))
    return text


# ----------------------------------------------------------------------------- analysis


def _solved(r: dict[str, Any]) -> bool:
    return bool(r.get("placed")) and r["status"] != "skipped"


def degradation(rows: Iterable[dict[str, Any]], algs: Sequence[str]) -> dict[str, tuple[float, float, int]]:
    """Per algorithm: (average, maximum) % degradation of the minimum yield from the best of ``algs``
    on the same instance, over the instances the algorithm solved; and how many those were."""
    per: dict[tuple[Any, ...], dict[str, float]] = defaultdict(dict)
    for r in rows:
        if r["algorithm"] in algs and _solved(r):
            key = (r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"])
            per[key][r["algorithm"]] = r["min_yield"]
    acc: dict[str, list[float]] = defaultdict(list)
    for ys in per.values():
        best = max(ys.values())
        if best <= 0:
            continue
        for a, y in ys.items():
            acc[a].append(100.0 * (best - y) / best)
    return {a: (float(np.mean(v)), float(np.max(v)), len(v)) for a, v in acc.items() if v}


def _by(rows: Iterable[dict[str, Any]], field: str) -> dict[tuple[str, Any], list[dict[str, Any]]]:
    out: dict[tuple[str, Any], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[(r["algorithm"], r[field])].append(r)
    return out


def curves(
    rows: list[dict[str, Any]], algs: Sequence[str], field: str, metric: str
) -> dict[str, tuple[list[Any], list[float]]]:
    """metric: min_yield / avg_yield (mean over solved), failure (rate), time_s (mean)."""
    groups = _by(rows, field)
    xs = sorted({r[field] for r in rows})
    out = {}
    for a in algs:
        px, py = [], []
        for x in xs:
            rs = [r for r in groups.get((a, x), []) if r["status"] != "skipped"]
            if not rs:
                continue
            if metric == "failure":
                val = 1.0 - sum(_solved(r) for r in rs) / len(rs)
            elif metric == "time_s":
                val = float(np.mean([r["time_s"] for r in rs]))
            else:
                ok = [r[metric] for r in rs if _solved(r)]
                if not ok:
                    continue
                val = float(np.mean(ok))
            px.append(x)
            py.append(val)
        out[a] = (px, py)
    return out


def bound_curve(rows: list[dict[str, Any]], field: str) -> tuple[list[Any], list[float]]:
    seen: dict[tuple[Any, ...], tuple[Any, float]] = {}
    for r in rows:
        if r.get("lp_bound") is not None:
            seen[(r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"])] = (r[field], r["lp_bound"])
    acc: dict[Any, list[float]] = defaultdict(list)
    for x, b in seen.values():
        acc[x].append(b)
    xs = sorted(acc)
    return xs, [float(np.mean(acc[x])) for x in xs]


def _plot(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, tuple[list[Any], list[float]]],
    bound: tuple[list[Any], list[float]] | None = None,
    logy: bool = False,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    markers = "os^vD<>xP*h"
    for i, (name, (xs, ys)) in enumerate(series.items()):
        if xs:
            ax.plot(xs, ys, marker=markers[i % len(markers)], label=name.upper(), linewidth=1.2, markersize=4)
    if bound is not None and bound[0]:
        ax.plot(bound[0], bound[1], "k--", label="LP bound", linewidth=1.2)
    if logy:
        ax.set_yscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in r) + " |")
    return "\n".join(lines)


FIGS = {
    # suite -> (group, metric) -> paper figure number
    "small": {
        ("mcb", "min_yield"): 2,
        ("mcb", "avg_yield"): 3,
        ("mcb", "failure"): 4,
        ("mcb", "time_s"): 5,
        ("all", "min_yield"): 11,
        ("all", "avg_yield"): 12,
        ("all", "failure"): 13,
        ("all", "time_s"): 14,
    },
    "large": {
        ("mcb", "min_yield"): 6,
        ("mcb", "avg_yield"): 8,
        ("mcb", "failure"): 9,
        ("mcb", "time_s"): 10,
        ("all", "min_yield"): 15,
        ("all", "avg_yield"): 16,
        ("all", "failure"): 17,
        ("all", "time_s"): 18,
    },
    "parallel": {("all", "min_yield"): 19, ("all", "avg_yield"): 20, ("all", "failure"): 21, ("all", "time_s"): 22},
}
LABEL = {
    "min_yield": "minimum yield",
    "avg_yield": "average yield",
    "failure": "failure rate",
    "time_s": "run time (s)",
}


def report(suite: str, rows: list[dict[str, Any]], out: Path) -> str:
    if suite == "dynamic":
        return _report_dynamic(rows)
    n_inst = len({(r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"]) for r in rows})
    present = sorted({r["algorithm"] for r in rows}, key=lambda a: ALGORITHMS.index(a))
    parts = [f"# VCSCHED evaluation: {suite} ({n_inst} instances)\n"]
    mcbs = [a for a in MCBS if a in present]
    if len(mcbs) > 1:
        deg = degradation(rows, mcbs)
        parts.append("## % degradation of the minimum yield from the best MCB (Table 1 / Fig. 7)\n")
        parts.append(
            _table(
                ["algorithm", "avg %", "max %", "solved"], [(a, *deg[a]) for a in sorted(deg, key=lambda a: deg[a][0])]
            )
        )
    # summary per algorithm
    summary = []
    milp = {
        (r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"]): r
        for r in rows
        if r["algorithm"] == "milp" and _solved(r)
    }
    for a in present:
        rs = [r for r in rows if r["algorithm"] == a and r["status"] != "skipped"]
        if not rs:
            continue
        ok = [r for r in rs if _solved(r)]
        gap_b = [100 * (r["lp_bound"] - r["min_yield"]) / r["lp_bound"] for r in ok if r.get("lp_bound")]
        gap_m = []
        for r in ok:
            m = milp.get((r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"]))
            if m is not None and m["min_yield"] > 0:
                gap_m.append(100 * (m["min_yield"] - r["min_yield"]) / m["min_yield"])
        summary.append(
            (
                a,
                len(rs),
                1 - len(ok) / len(rs),
                float(np.mean([r["min_yield"] for r in ok])) if ok else float("nan"),
                float(np.mean([r["avg_yield"] for r in ok])) if ok else float("nan"),
                float(np.mean(gap_m)) if gap_m else float("nan"),
                float(np.mean(gap_b)) if gap_b else float("nan"),
                1000 * float(np.mean([r["time_s"] for r in rs])),
                1000 * float(np.max([r["time_s"] for r in rs])),
            )
        )
    parts.append("\n## Summary per algorithm\n")
    parts.append(
        "min/avg yield: mean over solved instances; '% below MILP' and '% below LP bound': mean "
        "relative gap of the minimum yield on the instances both solved.\n"
    )
    parts.append(
        _table(
            [
                "algorithm",
                "runs",
                "failure rate",
                "min yield",
                "avg yield",
                "% below MILP",
                "% below LP bound",
                "mean ms",
                "max ms",
            ],
            summary,
        )
    )
    timeouts = sum(1 for r in rows if r["status"] == "timeout")
    skipped = sum(1 for r in rows if r["status"] == "skipped")
    parts.append(f"\nMILP timeouts: {timeouts}; runs skipped (RRND/RRNZ above the task limit): {skipped}\n")
    # plots
    figs = FIGS.get(suite, {})
    groups = {"mcb": mcbs, "all": [a for a in (OVERALL if suite != "parallel" else ("sg", "mcb8")) if a in present]}
    written = []
    for (group, metric), num in sorted(figs.items(), key=lambda kv: kv[1]):
        algs = groups[group]
        if not algs:
            continue
        field = "tasks" if metric == "time_s" else "slack"
        series = curves(rows, algs, field, metric)
        bound = bound_curve(rows, field) if metric == "min_yield" and group == "all" else None
        name = f"{suite}-fig{num:02d}-{group}-{metric.replace('_s', '')}.png"
        what = "MCB algorithms" if group == "mcb" else "algorithms"
        _plot(
            out / name,
            f"Fig. {num} ({suite}): {what}, {LABEL[metric]} vs {field}",
            field,
            LABEL[metric],
            series,
            bound,
            logy=metric == "time_s",
        )
        written.append(name)
    parts.append("\nPlots: " + ", ".join(written) + "\n")
    return "\n".join(parts)


def _report_dynamic(rows: list[dict[str, Any]]) -> str:
    rows = [r for r in rows if r["algorithm"] != "none"]
    lost = len({(r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"]) for r in rows})
    out = [f"# VCSCHED dynamic workloads ({lost} instances with a valid initial placement)\n"]
    table = []
    budgets = [b for b in (*DYN_BUDGETS[:-1], "all") if any(r["budget"] == b for r in rows)]
    for b in budgets:
        rb = [r for r in rows if r["budget"] == b]
        milp = {
            (r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"]): r for r in rb if r["algorithm"] == "dyn-milp"
        }
        for a in ("dyn-milp", "dyn-mcb"):
            ra = [r for r in rb if r["algorithm"] == a]
            if not ra:
                continue
            ok = [r for r in ra if r["placed"]]
            gaps = []
            for r in ok:
                m = milp.get((r["tasks"], r["slack"], r["cv_mem"], r["cv_cpu"], r["k"]))
                if m is not None and m["placed"] and m["min_yield"] > 0:
                    gaps.append(100 * (m["min_yield"] - r["min_yield"]) / m["min_yield"])
            table.append(
                (
                    b,
                    a,
                    len(ra),
                    1 - len(ok) / len(ra),
                    float(np.mean([r["min_yield"] for r in ok])) if ok else float("nan"),
                    float(np.mean(gaps)) if gaps else float("nan"),
                    float(np.mean([r["moved"] for r in ok])) if ok else float("nan"),
                    1000 * float(np.mean([r["time_s"] for r in ra])),
                )
            )
    out.append(
        _table(
            ["budget", "algorithm", "runs", "failure rate", "min yield", "% below dyn-MILP", "mem moved", "mean ms"],
            table,
        )
    )
    return "\n".join(out)
