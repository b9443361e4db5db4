"""``vmctl moldable``: moldable parallel tasks with slot time (paper 002, HSRET), simulated.

``run`` simulates one policy (``vmctl.sim.moldable``) and prints at least ``tasks, aet, awt, put,
utilization, slots``; ``sweep`` runs the paper's grid (policies x slot/rate pairs x forecast
accuracies x seeds) on the experiments runner (Dask) and writes the results table, a CSV, a Markdown
table beside the paper's numbers and the plots of the paper's figs. 9-14 (docs/moldable.md)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import click

from vmctl.errors import ValidationError

#: the paper's grid (sec. 6.2, figs. 9-14): slot 360 with rates 100..150 step 10, slot 720 with
#: 200..300 step 20 (the text pairs 180 with the first and 360 with the second; the figures and the
#: results say 360 and 720: we follow the figures)
PAPER_GRID: dict[float, tuple[float, ...]] = {
    360.0: (100.0, 110.0, 120.0, 130.0, 140.0, 150.0),
    720.0: (200.0, 220.0, 240.0, 260.0, 280.0, 300.0),
}
#: the paper's mean AET over the rates, per slot (sec. 6.2.1)
PAPER_AET: dict[float, dict[str, float]] = {
    360.0: {"all-eft": 5215.3, "cbsp": 5414.5, "afcfs": 5833.6, "hsret": 4367.4},
    720.0: {"all-eft": 5376.7, "cbsp": 5638.2, "afcfs": 6135.7, "hsret": 4624.9},
}

_KEYS = ("tasks", "aet", "awt", "put", "utilization", "slots")


def _numbers(option: str, text: str, kind: type[float] | type[int]) -> list[Any]:
    out = []
    for part in text.split(","):
        try:
            out.append(kind(part))
        except ValueError:
            what = "a number" if kind is float else "an integer"
            raise ValidationError(field=option, problem=f"{part!r} is not {what}") from None
    return out


def _floats(option: str, text: str) -> list[float]:
    return _numbers(option, text, float)


def _ints(option: str, text: str) -> list[int]:
    return _numbers(option, text, int)


@click.group()
def moldable() -> None:
    """Moldable tasks with slot time (paper 002): HSRET, AFCFS, ALL-EFT, CBSP."""


@moldable.command("run")
@click.option("--policy", required=True, help="hsret, afcfs, all-eft or cbsp; hsret-afcfs (HSRET from AFCFS's "
              "list, sec. 6.2.2) or all-eft-cap (ALL-EFT capped by the system load).")
@click.option("--slot", type=float, required=True, help="Slot length SL, minutes.")
@click.option("--rate", type=float, required=True, help="Mean arrivals per slot (uniform in [1, 2 rate - 1]).")
@click.option("--slots", type=int, required=True, help="Slots with arrivals (the warm-up included).")
@click.option("--clusters", type=int, default=10, show_default=True)
@click.option("--nodes", type=int, default=1000, show_default=True, help="Nodes per cluster.")
@click.option("--accuracy", type=float, default=0.95, show_default=True,
              help="Forecast accuracy rho: actual time in [1, 1 + (1 - rho)] x the forecast.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--warmup", type=int, default=None,
              help="Warm-up slots left out of the metrics (default: the longest deadline window).")
@click.option("--batches", type=int, default=10, show_default=True, help="Batches for the batch-means CIs.")
@click.option("--shape", "shapes", multiple=True, metavar="JSON|@FILE",
              help="A speedup profile replacing the built-in WRF/GRAPES stand-ins (repeat; tasks are "
                   "spread evenly over them): a moldable shape, e.g. a measured table "
                   "'{\"kind\": \"moldable\", \"table\": {\"4\": 100, \"8\": 55}}' (docs/workloads.md).")
@click.option("--target", type=float, default=1.0, show_default=True,
              help="Getnet's load target (hsret, hsret-afcfs, all-eft-cap; the paper's is 1).")
@click.option("--output", "-o", type=click.Choice(["table", "json"]), default="table", show_default=True)
def run_cmd(policy: str, slot: float, rate: float, slots: int, clusters: int, nodes: int, accuracy: float,
            seed: int, warmup: int | None, batches: int, shapes: tuple[str, ...], target: float, output: str) -> None:
    """Simulate one policy; print tasks, AET, AWT, PUT (with 95 % CIs), utilization, slots. On a
    terminal, a progress bar with the ETA (arrival slots reached) while it runs."""
    from vmctl.sim.moldable import MoldableConfig

    extra: dict[str, Any] = {}
    if shapes:
        extra["profiles"] = _profiles(shapes)
    cfg = MoldableConfig(policy=policy, slot=slot, rate=rate, slots=slots, clusters=clusters, nodes=nodes,
                         accuracy=accuracy, seed=seed, warmup=warmup, batches=batches, target=target, **extra)
    from vmctl.experiments.inputs import progress_bar

    with progress_bar(policy, slots, "arrival slots") as tick:  # a terminal only: ETA while it runs
        res = simulate_fed(cfg, tick)
    if output == "json":
        click.echo(json.dumps(res, indent=2))
        return
    click.echo(f"{policy}: slot {slot:g} min, rate {rate:g}/slot, {clusters} x {nodes} nodes, rho {accuracy:g}, "
               f"seed {seed}")
    click.echo(f"slots      {res['slots']} ({res['warmup_slots']} warm-up, {res['simulated_slots']} simulated)")
    click.echo(f"tasks      {res['tasks']} measured, {res['unfinished']} unfinished")
    for key, unit in (("aet", "min"), ("awt", "min"), ("put", "%")):
        click.echo(f"{key:<10} {res[key]:.1f} {unit} +- {res['ci_' + key]:.1f}")
    click.echo(f"utilization {res['utilization']:.3f}, mean width {res['mean_width']:.1f}, "
               f"{res['slots_per_s']:.1f} slots/s")


def simulate_fed(cfg: Any, tick: Callable[[float], None] | None = None, step: int | None = None) -> dict[str, Any]:
    """``vmctl.sim.moldable.simulate(cfg)`` with the tasks fed to the engine in chunks of ``step``
    consecutive arrival slots (default: 1/200 of the run), ``tick(slot)`` called as the engine reaches
    each chunk: the progress of a long run. The engine takes its tasks as consecutive chunks (a streamed
    run's own), so the results are ``simulate``'s (tests/unit/test_experiment_inputs.py compares them)."""
    import time
    from dataclasses import fields

    import numpy as np

    from vmctl.sim.moldable import STREAM_SLOTS, Tasks, clusters_of, generate, run_slots, stream_tasks

    t0 = time.perf_counter()
    size = step or max(1, cfg.slots // 200)

    def split(tasks: Tasks) -> Iterator[Tasks]:
        for first in range(0, cfg.slots, size):
            lo, hi = np.searchsorted(tasks.arrival_slot, [first, first + size], side="left")
            yield Tasks(*(getattr(tasks, f.name)[lo:hi] for f in fields(Tasks)))

    def fed(chunks: Iterable[Tasks]) -> Iterator[Tasks]:
        for chunk in chunks:
            if tick is not None and chunk.arrival_slot.size:
                tick(float(chunk.arrival_slot[0]))  # the engine pulls a chunk when it reaches its first arrival
            yield chunk

    chunks: Iterable[Tasks]
    if cfg.slots > STREAM_SLOTS:
        chunks, clusters = stream_tasks(cfg), clusters_of(cfg, np.random.SeedSequence(cfg.seed).spawn(2)[1])
    else:
        tasks, clusters = generate(cfg)
        chunks = split(tasks)
    res, _ = run_slots(cfg.policy, cfg.seed, cfg.slot, fed(chunks), clusters, cfg.profiles, slots=cfg.slots,
                       warm=cfg.warm_slots, drain=cfg.drain, batches=cfg.batches, t0=t0, target=cfg.target)
    return {"policy": cfg.policy, "target": cfg.target, "slot": cfg.slot, "rate": cfg.rate, "accuracy": cfg.accuracy,
            "seed": cfg.seed, **res, "clusters": cfg.clusters, "nodes": cfg.nodes}


def _profiles(shapes: tuple[str, ...]) -> tuple[Any, ...]:
    from vmctl.cli.job import parse_shape_option
    from vmctl.policies.moldable.model import Profile
    from vmctl.shapes import shape_from_json

    out = []
    for i, text in enumerate(shapes):
        shape = shape_from_json(parse_shape_option(text), f"--shape[{i}]")
        if shape.kind != "moldable":
            raise ValidationError(field=f"--shape[{i}].kind", problem=f"must be moldable, got {shape.kind!r}")
        try:
            out.append(Profile.from_shape(f"shape{i}", shape))
        except ValidationError as exc:
            raise ValidationError(field=f"--shape[{i}]: {exc.fields.get('field')}",
                                  problem=exc.fields.get("problem", str(exc))) from exc
    return tuple(out)


@moldable.command("sweep")
@click.option("--policies", default="hsret,afcfs,all-eft,cbsp", show_default=True)
@click.option("--grid", "grid_text", default=None, metavar="SLOT:RATE,RATE;SLOT:...",
              help="Slot lengths and their rates (default: the paper's, 360:100..150 step 10 and "
                   "720:200..300 step 20).")
@click.option("--accuracies", default="1.0,0.95,0.9", show_default=True)
@click.option("--seeds", default="1", show_default=True)
@click.option("--slots", type=int, required=True, help="Slots with arrivals per run (warm-up included).")
@click.option("--warmup", type=int, default=None,
              help="Warm-up slots (default: the longest deadline window, 132 slots at 360 min, 66 at 720).")
@click.option("--clusters", type=int, default=10, show_default=True)
@click.option("--nodes", type=int, default=1000, show_default=True)
@click.option("--workers", type=int, default=None, help="Local Dask workers (default: one per core).")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE", help="An existing Dask cluster.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False))
@click.option("--table", default=None, metavar="FILE", help="Results table (default OUT/results.parquet).")
@click.option("--retry-failed", is_flag=True)
@click.option("--no-plots", is_flag=True)
def sweep_cmd(policies: str, grid_text: str | None, accuracies: str, seeds: str, slots: int, warmup: int | None,
              clusters: int, nodes: int, workers: int | None, scheduler: str | None, out_dir: str, table: str | None,
              retry_failed: bool, no_plots: bool) -> None:
    """Run the grid on Dask; write the table, results.csv, results.md and the figs. 9-14 plots
    (rerunning resumes: cells already in the table are skipped)."""
    from vmctl.errors import CellsFailed
    from vmctl.experiments.runner import cell, run_grid, writable_dir
    from vmctl.policies.moldable import MOLDABLE_POLICIES
    from vmctl.sim.moldable import MoldableConfig, sweep_cell

    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        if name not in MOLDABLE_POLICIES:
            raise ValidationError(field="--policies", problem=f"unknown policy {name!r} "
                                  f"(known: {', '.join(MOLDABLE_POLICIES)})")
    grid = parse_grid(grid_text) if grid_text else PAPER_GRID
    accs = _floats("--accuracies", accuracies)
    seed_list = _ints("--seeds", seeds)
    if workers is not None and workers <= 0:
        raise ValidationError(field="--workers", problem=f"must be > 0, got {workers}")
    for slot, rates in grid.items():  # every input checked before anything runs
        for rate in rates:
            for acc in accs:
                MoldableConfig(policy=names[0], slot=slot, rate=rate, slots=slots, clusters=clusters, nodes=nodes,
                               accuracy=acc, warmup=warmup)
    out = writable_dir(out_dir)
    table_path = Path(table) if table else out / "results.parquet"
    fixed: dict[str, Any] = {} if warmup is None else {"warmup": warmup}   # the default keeps the cell keys
    cells = [cell(sweep_cell, policy=p, slot=slot, rate=rate, accuracy=acc, seed=seed, slots=slots,
                  clusters=clusters, nodes=nodes, **fixed)
             for slot, rates in grid.items() for rate in rates for acc in accs for p in names for seed in seed_list]

    def tick(row: dict[str, Any]) -> None:
        what = f"{row['policy']} slot={row['slot']:g} rate={row['rate']:g} rho={row['accuracy']:g} seed={row['seed']}"
        click.echo(f"{what}: " + (f"failed: {row['error']}" if row["error"] else
                   f"AET {row['aet']:.0f} AWT {row['awt']:.0f} PUT {row['put']:.2f} ({row['wall_s']:.1f} s)"),
                   err=True)

    res = run_grid(cells, table_path, workers=workers, scheduler=scheduler, retry_failed=retry_failed,
                   progress=sys.stderr.isatty(), label="moldable", on_row=tick)
    rows = [r for r in res.rows if not r.get("error")]
    written = [table_path, *write_results(rows, out)]
    if not no_plots and rows:
        written += plot_results(rows, out)
    click.echo(json.dumps({"runs": len(res.rows), "ran": res.ran, "skipped": res.skipped, "failed": len(res.failed),
                           "wall_s": round(res.wall_s, 2), "files": [str(p) for p in written]}))
    if res.failed:
        from vmctl.experiments.inputs import first_failure

        raise CellsFailed(failed=len(res.failed), total=len(cells), table=str(table_path),
                          first=first_failure(res.failed))


@moldable.command("traces")
@click.option("--jobs", type=int, default=5000, show_default=True, help="First N jobs of each trace.")
@click.option("--slot", type=float, default=10.0, show_default=True, help="Slot length SL, minutes.")
@click.option("--deadline-estimates", type=float, default=3.0, show_default=True,
              help="k: a job's deadline is its submit time + k x its requested time.")
@click.option("--policies", default="easy,hsret,afcfs,all-eft,cbsp", show_default=True)
@click.option("--trace-dir", default=None, help="Where the SWF traces are (default: $VMCTL_TRACE_DIR, else "
              "../shared/data/traces beside the checkout).")
@click.option("--workers", type=int, default=None, help="Local Dask workers (default: one per core).")
@click.option("--scheduler", default=None, metavar="ADDRESS|FILE", help="An existing Dask cluster.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory.")
def traces_cmd(jobs: int, slot: float, deadline_estimates: float, policies: str, trace_dir: str | None,
               workers: int | None, scheduler: str | None, out_dir: str) -> None:
    """The four methods against EASY on the real traces (KTH, SDSC, CTC, HPC2N): moldable widths from
    each job's size, deadline = submit + k x requested time; writes OUT/traces.md (docs/moldable.md)."""
    from vmctl.experiments.moldable_traces import METHODS, traces
    from vmctl.policies.moldable.model import check_slot

    if jobs <= 0:
        raise ValidationError(field="--jobs", problem=f"must be > 0, got {jobs}")
    check_slot(slot)
    if not deadline_estimates > 0:
        raise ValidationError(field="--deadline-estimates", problem=f"must be > 0, got {deadline_estimates}")
    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        if name not in METHODS:
            raise ValidationError(field="--policies", problem=f"unknown {name!r} (known: {', '.join(METHODS)})")
    click.echo(traces(out_dir, trace_dir, jobs, slot, deadline_estimates, workers=workers, scheduler=scheduler,
                      progress=sys.stderr.isatty(), policies=names), nl=False)


def parse_grid(text: str) -> dict[float, tuple[float, ...]]:
    """``360:100,110;720:200`` -> {360: (100, 110), 720: (200,)}."""
    out: dict[float, tuple[float, ...]] = {}
    for part in text.split(";"):
        slot, sep, rates = part.partition(":")
        if not sep or not rates:
            raise ValidationError(field="--grid", problem=f"{part!r} is not SLOT:RATE,RATE,...")
        out[_floats("--grid", slot)[0]] = tuple(_floats("--grid", rates))
    return out


COLUMNS = ("policy", "slot", "rate", "accuracy", "seed", "tasks", "aet", "ci_aet", "awt", "ci_awt", "put", "ci_put",
           "utilization", "mean_width", "unfinished", "wall_s")


def write_results(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """``results.csv`` (one row per run) and ``results.md`` (means over the rates beside the paper)."""
    import csv

    csv_path = out / "results.csv"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.get(c) for c in COLUMNS])
    md = out / "results.md"
    md.write_text(summary_markdown(rows), encoding="utf-8")
    return [csv_path, md]


def _mean(values: list[float]) -> float:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    return sum(vals) / len(vals) if vals else math.nan


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    """Per slot: each policy's AET, AWT, PUT and utilization averaged over rates, accuracies and seeds
    (the paper's "average AET"), the paper's AET, and HSRET's reduction against each other policy."""
    lines: list[str] = []
    for slot in sorted({float(r["slot"]) for r in rows}):
        sub = [r for r in rows if float(r["slot"]) == slot]
        rates = sorted({float(r["rate"]) for r in sub})
        accs = sorted({float(r["accuracy"]) for r in sub}, reverse=True)
        lines += [f"### Slot {slot:g} min (rates {', '.join(f'{x:g}' for x in rates)}; "
                  f"rho {', '.join(f'{x:g}' for x in accs)})", "",
                  "| policy | AET (min) | max CI half width | paper AET | AWT (min) | PUT (%) | utilization | "
                  "mean width |", "|---|---|---|---|---|---|---|---|"]
        means: dict[str, float] = {}
        for pol in ("all-eft", "cbsp", "afcfs", "hsret"):
            pr = [r for r in sub if r["policy"] == pol]
            if not pr:
                continue
            means[pol] = _mean([r["aet"] for r in pr])
            paper = PAPER_AET.get(slot, {}).get(pol)
            lines.append(f"| {pol} | {means[pol]:.1f} | {max(r['ci_aet'] for r in pr):.1f} | "
                         f"{'-' if paper is None else f'{paper:,.1f}'} | {_mean([r['awt'] for r in pr]):.1f} | "
                         f"{_mean([r['put'] for r in pr]):.2f} | {_mean([r['utilization'] for r in pr]):.3f} | "
                         f"{_mean([r['mean_width'] for r in pr]):.1f} |")
        if "hsret" in means:
            red = [f"{p} {100 * (means[p] - means['hsret']) / means[p]:.2f} %" for p in ("all-eft", "cbsp", "afcfs")
                   if p in means]
            lines += ["", f"HSRET's AET is lower than: {', '.join(red)} (negative: higher)."]
        lines.append("")
    return "\n".join(lines)


def plot_results(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """The paper's figs. 9-14: AET, AWT and PUT against the rate, one plot per slot length, one line per
    policy and accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    fig_no = {("aet", 360.0): 9, ("aet", 720.0): 10, ("awt", 360.0): 11, ("awt", 720.0): 12,
              ("put", 360.0): 13, ("put", 720.0): 14}
    for metric, label in (("aet", "AET (min)"), ("awt", "AWT (min)"), ("put", "PUT (%)")):
        for slot in sorted({float(r["slot"]) for r in rows}):
            fig, ax = plt.subplots(figsize=(6.4, 4.2))
            sub = [r for r in rows if float(r["slot"]) == slot]
            for pol in sorted({r["policy"] for r in sub}):
                for acc in sorted({float(r["accuracy"]) for r in sub}, reverse=True):
                    pts = sorted((float(r["rate"]), r[metric]) for r in sub
                                 if r["policy"] == pol and float(r["accuracy"]) == acc)
                    rates = sorted({x for x, _ in pts})
                    ys = [_mean([y for x, y in pts if x == rate]) for rate in rates]
                    ax.plot(rates, ys, marker="o", label=f"{pol} rho={acc:g}")
            ax.set_xlabel("arrival rate (tasks per slot)")
            ax.set_ylabel(label)
            no = fig_no.get((metric, slot))
            ax.set_title(f"{label.split()[0]} at slot {slot:g} min" + (f" (paper fig. {no})" if no else ""))
            ax.legend(fontsize=6, ncol=2)
            path = out / f"{metric}-slot{slot:g}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written
