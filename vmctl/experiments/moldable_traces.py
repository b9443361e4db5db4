"""Paper 002's four methods (HSRET, AFCFS, ALL-EFT, CBSP) on the real traces, against EASY (issue 13).

``vmctl moldable traces --out DIR [--jobs 2000] [--slot 10] [--deadline-estimates 3] [--workers 2]``
runs one cell per (trace, method) on the experiment runner (:mod:`vmctl.experiments.runner`; a rerun
resumes) and writes ``DIR/traces.md``. The rules that turn a rigid trace into moldable tasks with
deadlines (traces record neither), all chosen before any run:

- **Jobs**: the first ``jobs`` jobs of each trace as :func:`vmctl.experiments.sweep.build_workload`
  reads them (run time <= 0 dropped, CTC's missing requested processors taken from the allocated ones;
  docs/workloads.md), with their submit times (shifted so that the first is 0).
- **Widths and times** (the ``moldable`` rule of :mod:`vmctl.sim.workloads.shapes`, the one ``vmctl sim
  run --shapes moldable`` uses): widths ``procs // 4``, ``procs // 2``, ``procs``, ``2 procs`` within
  [1, machine]; times from Downey's model with average parallelism ``A = procs`` and ``sigma = 1``,
  anchored at the job's **requested time** at its recorded width ``procs``. The requested time is the
  forecast the policies see (as EASY sees it); the actual time at any width is the forecast times
  ``min(run, requested) / requested`` (a job is killed at its requested time, as EASY does), so the
  forecast errors are the trace's own (overestimates), not the paper's rho.
- **Deadline**: submit + ``k`` x requested time (``k`` = ``--deadline-estimates``, default 3): a job
  run at its recorded width meets it if it waits less than twice its requested time.
- **Cluster**: the whole machine is one cluster of ``MaxProcs`` nodes of speed 1 (one node = one
  processor; the four SP2/Linux machines are homogeneous, so there is nothing to split into groups).
- **Slot time**: ``--slot`` minutes (default 10). Trace jobs run from seconds to days; the paper's 360
  minutes would round most of them up to a 6-hour slot. A task holds its nodes to the end of its last
  slot (sec. 3.2), so AET of a moldable method includes up to one slot of rounding; EASY runs in
  continuous time.

EASY runs the same jobs rigid (each at ``procs``, killed at its requested time) on the simulator's
engine (:mod:`vmctl.sim.engine`, every process at 100 % CPU). Metrics, per method, in minutes: AET
(mean end - start), AWT (mean start - submit), PUT (% of jobs not ended by the deadline), the mean
width over ``procs``, and 95 % batch-means half widths over 10 batches of consecutive submissions
(``ci_*``). No warm-up: the first jobs of a trace start on an empty machine for every method alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vmctl.errors import ValidationError
from vmctl.experiments.gang import TRACES
from vmctl.policies.moldable import MOLDABLE_POLICIES
from vmctl.policies.moldable.model import Clusters, Profile, check_slot
from vmctl.sim.moldable import Tasks, batch_means, run_slots
from vmctl.sim.workloads.core import WorkloadJob
from vmctl.sim.workloads.shapes import derive_shape

METHODS = ("easy", *MOLDABLE_POLICIES)
BATCHES = 10


@dataclass(frozen=True)
class TraceTasks:
    """A trace's first jobs as moldable tasks (module docstring): tasks in minutes, one profile per
    distinct ``procs``, the machine as one cluster, and the rigid jobs EASY runs."""

    tasks: Tasks
    profiles: tuple[Profile, ...]
    clusters: Clusters
    procs: np.ndarray
    jobs: Sequence[Any]
    cores: int
    dropped: int


def build(trace: str, jobs: int, slot: float, deadline_estimates: float) -> TraceTasks:
    from vmctl.experiments.sweep import WorkloadSpec, build_workload

    check_slot(slot)
    if isinstance(deadline_estimates, bool) or not deadline_estimates > 0:
        raise ValidationError(field="--deadline-estimates",
                              problem=f"the deadline factor k (deadline = submit + k x requested time) must be > 0, "
                                      f"got {deadline_estimates!r}")
    built = build_workload(WorkloadSpec(trace=trace, jobs=jobs, cpu_usage="full"))
    cores = built.cores
    kept = [j for j in built.jobs if isinstance(j, WorkloadJob) and j.procs <= cores]
    first = min(j.submit for j in kept)
    by_procs: dict[int, int] = {}
    profiles: list[Profile] = []
    arrival, deadline, length, profile, factor = [], [], [], [], []
    for j in kept:
        shape = derive_shape(j, "moldable", cores)
        assert shape is not None and shape.times is not None
        if j.procs not in by_procs:
            by_procs[j.procs] = len(profiles)
            profiles.append(Profile(f"procs{j.procs}", tuple(shape.widths),
                                    tuple(float(t) / float(shape.times[0]) for t in shape.times)))
        arrival.append((j.submit - first) / 60.0)
        deadline.append((j.submit - first + deadline_estimates * j.estimate) / 60.0)
        length.append(float(shape.times[0]) / 60.0)
        profile.append(by_procs[j.procs])
        factor.append(min(j.run_time, j.estimate) / j.estimate)
    arr = np.array(arrival)
    tasks = Tasks(arr, np.array(deadline), np.array(length), np.array(profile, dtype=np.int64), np.array(factor),
                  (arr // slot).astype(np.int64))
    return TraceTasks(tasks, tuple(profiles), Clusters((cores,), (1.0,)),
                      np.array([j.procs for j in kept], dtype=np.int64), kept, cores, len(built.jobs) - len(kept))


def batch_index(arrival_slot: np.ndarray, slots: int) -> np.ndarray:
    """The batch of consecutive arrival slots of each task (as :func:`vmctl.sim.moldable.run_slots`)."""
    return (arrival_slot * BATCHES) // slots


def run_cell(trace: str, jobs: int, slot: float, deadline_estimates: float, policy: str) -> dict[str, Any]:
    """One method on one trace: the metrics of the module docstring."""
    from vmctl.experiments.inputs import trace_file

    t0 = time.perf_counter()
    t = build(trace_file(trace), jobs, slot, deadline_estimates)
    slots = int(t.tasks.arrival_slot.max()) + 1
    if policy == "easy":
        out = easy_metrics(t, slot, slots)
    else:
        # drain: long enough for every task at its smallest width one after the other, capped
        drain = min(50 * slots, math.ceil(float(t.tasks.length.sum()) / slot) + 10)
        res, o = run_slots(policy, 1, slot, t.tasks, t.clusters, t.profiles, slots=slots, warm=0, drain=drain,
                           batches=BATCHES)
        assert o is not None  # one chunk: every task's outcome is kept
        started = o.start >= 0
        out = {k: res[k] for k in ("aet", "awt", "put", "ci_aet", "ci_awt", "ci_put", "unfinished", "slots_per_s")}
        finish = np.where(o.finish >= 0, o.finish * slot, np.inf)
        out["put_long"] = put_long(t, slot, finish)
        out["width_over_procs"] = float((o.width[started] / t.procs[started]).mean()) if started.any() else math.nan
        out["utilization"] = res["utilization"]
        out["suspended_task_slots"] = res["suspended_task_slots"]
    return {"tasks": len(t.jobs), "cores": t.cores, "dropped_wide": t.dropped, "slots_run": slots,
            **out, "sim_s": time.perf_counter() - t0}


def easy_metrics(t: TraceTasks, slot: float, slots: int) -> dict[str, Any]:
    """EASY on the rigid jobs (engine of :mod:`vmctl.sim.engine`), measured like the slot methods."""
    from vmctl.policies.registry import create_policy
    from vmctl.sim.engine import SimConfig, Simulator

    sim = Simulator(list(t.jobs), t.cores, create_policy("easy"), SimConfig(seed=1))
    res = sim.run()
    rows = {str(r["id"]): r for r in sim.job_rows()}
    first = min(j.submit for j in t.jobs)
    start = np.array([rows[str(j.id)]["start"] - first for j in t.jobs]) / 60.0
    end = np.array([rows[str(j.id)]["end"] - first for j in t.jobs]) / 60.0
    batch = batch_index(t.tasks.arrival_slot, slots)
    done = ~np.isnan(end)
    aet, ci_aet = batch_means((end - start)[done], batch[done], BATCHES)
    awt, ci_awt = batch_means((start - t.tasks.arrival)[done], batch[done], BATCHES)
    late = ~done | (np.nan_to_num(end, nan=np.inf) > t.tasks.deadline + 1e-9)
    put, ci_put = batch_means(100.0 * late.astype(np.float64), batch, BATCHES)
    return {"aet": aet, "awt": awt, "put": put, "put_long": put_long(t, slot, np.nan_to_num(end, nan=np.inf)),
            "ci_aet": ci_aet, "ci_awt": ci_awt, "ci_put": ci_put,
            "unfinished": int((~done).sum()), "width_over_procs": 1.0, "utilization": res.metrics.utilization,
            "suspended_task_slots": 0}


def put_long(t: TraceTasks, slot: float, end: np.ndarray) -> float:
    """PUT (%) over the jobs whose deadline window is at least 3 slots: a shorter window is a deadline
    no slot method can meet (it sees a job at the next boundary and ends it at a slot's end), so this
    is the PUT that compares the methods and not the slot rounding."""
    long = t.tasks.deadline - t.tasks.arrival >= 3 * slot
    return float(100.0 * (end[long] > t.tasks.deadline[long] + 1e-9).mean()) if long.any() else math.nan


def table(rows: Sequence[Mapping[str, Any]], jobs: int, slot: float, k: float) -> str:
    lines = [f"First {jobs:,} jobs of each trace; slot {slot:g} min; deadline = submit + {k:g} x requested time; "
             "one cluster (the machine); 95 % batch-means half widths (10 batches)", "",
             "| trace | procs | method | AET (min) | AWT (min) | response (min) | PUT % | PUT % (window >= 3 slots) "
             "| width / procs | util. | unfinished |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        name = Path(str(r["trace"])).name.split("-cln")[0]
        if r.get("error"):
            lines.append(f"| {name} | | {r['policy']} | failed (below) | | | | | | | |")
            continue
        lines.append(f"| {name} | {r['cores']} | {r['policy']} | {r['aet']:,.1f} ± {r['ci_aet']:,.1f} | "
                     f"{r['awt']:,.1f} ± {r['ci_awt']:,.1f} | {r['aet'] + r['awt']:,.1f} | "
                     f"{r['put']:.1f} ± {r['ci_put']:.1f} | "
                     f"{r['put_long']:.1f} | {r['width_over_procs']:.2f} | {r['utilization']:.3f} | "
                     f"{r['unfinished']} |")
    if any(r.get("error") for r in rows):  # each cause once, with the number of cells it failed
        from vmctl.experiments.inputs import failure_summary

        lines += ["", failure_summary(rows)]
    return "\n".join(lines) + "\n"


def traces(out: str, trace_dir: str | None, jobs: int, slot: float, deadline_estimates: float,
           workers: int | None = None, scheduler: str | None = None, progress: bool = True,
           policies: Sequence[str] = METHODS) -> str:
    """Every method of ``policies`` on the first ``jobs`` jobs of each trace; writes ``OUT/traces.md``."""
    from vmctl.experiments.gang import _raise_failed
    from vmctl.experiments.runner import grid, run_grid, writable_dir

    for p in policies:
        if p not in METHODS:
            raise ValidationError(field="--policies", problem=f"unknown {p!r} (known: {', '.join(METHODS)})")
    from vmctl.experiments.inputs import trace_cells_paths

    paths = trace_cells_paths(trace_dir, TRACES)  # checked before any cell runs
    where = writable_dir(out)
    path = where / "traces.parquet"
    res = run_grid(grid(run_cell, {"jobs": jobs, "slot": slot, "deadline_estimates": deadline_estimates},
                        trace=paths, policy=list(policies)),
                   path, workers=workers, scheduler=scheduler, progress=progress, label="moldable-traces")
    doc = table(res.rows, jobs, slot, deadline_estimates)
    (where / "traces.md").write_text(doc, encoding="utf-8")
    _raise_failed(res.rows, path)
    return doc
