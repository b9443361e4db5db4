"""Paper 001's evaluation, as issue 12 defines it (the paper's results section is empty): the four
dispatch policies, their work-conserving variant and FCFS/EASY on the CERIT-SC 2013 trace.

``python -m vmctl.experiments.taskbags --out DIR [--sample 8] [--seeds 1] [--workers 1]`` runs the grid on
the experiment runner (:mod:`vmctl.experiments.runner`: one cell per policy, parameter set, speed case
and seed, recorded in ``DIR/results.csv``; a rerun skips the cells already there) and writes
``DIR/tables.md``. It runs the same from any working directory: ``--trace`` and ``--machines`` are file
names in ``$VMCTL_TRACE_DIR`` (default ``../shared/data/traces`` beside the checkout) or paths, checked
(and the trace read once) before any cell runs: a missing or malformed file is one error naming it, exit
2. Failed cells are one line per distinct error with its count, exit 7.

The workload (:func:`build`):

- **Jobs**: the trace (``wagap-2013.swf.gz`` and its machine file in the trace folder, read by
  :mod:`vmctl.sim.workloads.alea`). Each job becomes a bag of **one task per CPU**, each task's forecast
  the job's requested walltime and its actual length the job's run time (``min(run, walltime)``: a job
  is killed at its walltime); at most one worker per task (the ``task-bag`` rule of
  :mod:`vmctl.sim.workloads.shapes`). Its **priority** is its queue class (``alea.QUEUE_CLASS``: 3
  short/priority queues .. 0 two weeks and backfill); its **deadline** is its submission plus
  ``deadline_walltimes`` (default 1) times its requested walltime.
- **Sample**: the paper samples the 17,900 jobs at a rate it leaves as "XXX". We draw ``round(n /
  sample)`` jobs uniformly without replacement (seeded) and scale the machine by the same rate
  (``round(2176 / sample)`` workers, one per CPU), so the offered load stays the trace's; submit and run
  times are kept (the paper scales times only to replay the trace on its testbed in real time). Sampled
  jobs wider than the scaled machine are dropped (none at ``sample`` <= 8: the widest job has 256 CPUs).
- **Testbed scale** (issue 26; ``--keep-wide``, ``--split k``): a bag wider than the scaled machine may be
  kept instead (it holds at most every worker and runs its tasks in rounds; its deadline and work stay the
  record's), and each task may be split into k tasks of 1/k of its length. :class:`RProbe` counts, pass by
  pass, where the reservation rate r changed ``dispatch-priority``'s decision (docs/taskbags.md, "At the
  paper's testbed scale").
- **Workers**: one per CPU (one level per core). ``homogeneous``: every worker at speed 1 (the machine
  file's); ``uniform``: each worker's speed drawn from U(0.5, 1.5) (mean 1; seeded), the heterogeneity
  the paper's title promises.

Metrics per cell: mean response (end - submit), mean wait per priority class (first start - submit),
the share of jobs ending by their deadline, the utilization (the jobs' actual work in standard
core-seconds over the workers' capacity, the sum of their speeds, from the first submission to the
last end: work done, not the engine's ``utilization``, which counts the core-seconds slots were held,
idle workers and wall time on fast workers included; docs/taskbags.md compares the two) and the worst
wait of the lowest class (starvation).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vmctl.errors import OutOfRange, ValidationError
from vmctl.experiments.inputs import failure_summary, raise_failed, run_main, trace_file, trace_ref
from vmctl.experiments.runner import Cell, Scalar, cell, run_grid, writable_dir
from vmctl.model import ClusterView, Decision, JobShape
from vmctl.policies.dispatch_policy import DispatchPriority
from vmctl.sim.metrics import replication_interval
from vmctl.sim.workloads.alea import QUEUE_CLASS, read_alea_swf
from vmctl.sim.workloads.core import WorkloadJob
from vmctl.sim.workloads.shapes import with_shapes

#: file names in the trace folder (:func:`vmctl.experiments.inputs.trace_dir`)
TRACE = "wagap-2013.swf.gz"
MACHINES = "wagap-2013.swf.machines"
SPEEDS = ("homogeneous", "uniform")
R_SWEEP = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
CLASSES = tuple(sorted(set(QUEUE_CLASS.values()), reverse=True))
#: (policy, label, r or None) of the grid; each dispatch policy also runs with ``conserving``
DISPATCH = (("dispatch-proportion", "proportion"), ("dispatch-workload", "workload"),
            ("dispatch-deadline", "deadline"))


@dataclass(frozen=True, slots=True)
class Built:
    jobs: list[WorkloadJob]
    cores: int
    shapes: dict[str, JobShape]
    speeds: list[float]
    dropped: dict[str, int]
    #: job id -> the trace's (procs, min(run, walltime), walltime): the work and the deadline of the metrics
    #: (a kept wide bag or a split one runs with another width and span than the record's)
    orig: dict[str, tuple[int, float, float]] = field(default_factory=dict)


def build(trace: str, machines: str, sample: int, seed: int, speeds: str, keep_wide: bool = False,
          split: int = 1, deadline_walltimes: float = 1.0) -> Built:
    """The sampled workload, its task bags and the worker speeds (module docstring). ``keep_wide``: a bag
    wider than the scaled machine is kept and runs on at most every worker (its tasks in rounds) instead
    of being dropped; ``split`` k > 1: each task becomes k tasks of 1/k of its length (so a bag has k
    tasks per worker it may hold). With either, each job carries its deadline (submit +
    ``deadline_walltimes`` x its requested walltime) and its forecast span at its width becomes its
    estimate (the engine's rigid policies, FCFS and EASY, run it for that long)."""
    if sample < 1:
        raise OutOfRange(what="--sample", value=sample, allowed=">= 1 (keep 1 job in SAMPLE)")
    if split < 1:
        raise OutOfRange(what="--split", value=split, allowed=">= 1 (tasks per CPU of a job)")
    if speeds not in SPEEDS:
        raise ValidationError(field="--speeds", problem=f"must be one of {', '.join(SPEEDS)}, got {speeds!r}")
    w = read_alea_swf(trace, machines)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x001]))
    cores = max(1, round(w.max_procs / sample))
    picked = np.sort(rng.choice(len(w.jobs), size=max(1, round(len(w.jobs) / sample)), replace=False))
    jobs = [w.jobs[i] for i in picked]
    dropped = dict(w.dropped)
    srng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EED]))
    speed = [1.0] * cores if speeds == "homogeneous" else [float(s) for s in srng.uniform(0.5, 1.5, cores)]
    orig = {str(j.id): (j.procs, min(j.run_time, j.estimate), j.estimate) for j in jobs}
    if not keep_wide and split == 1:  # the original evaluation, unchanged
        wide = sum(1 for j in jobs if j.procs > cores)
        if wide:
            dropped["wider_than_scaled_machine"] = wide
            jobs = [j for j in jobs if j.procs <= cores]
        w = with_shapes(replace(w, jobs=jobs, max_procs=cores), "task-bag")
        return Built(jobs, cores, {str(k): v for k, v in w.shapes.items()}, speed, dropped, orig)
    if not keep_wide:
        wide = sum(1 for j in jobs if j.procs > cores)
        if wide:
            dropped["wider_than_scaled_machine"] = wide
            jobs = [j for j in jobs if j.procs <= cores]
    out: list[WorkloadJob] = []
    shapes: dict[str, JobShape] = {}
    for j in jobs:
        width = min(j.procs, cores)
        shape = JobShape("task-bag", (width,), tasks=(j.estimate / split,) * (j.procs * split))
        span = shape.time_at(width)  # the forecast span on ``width`` workers of speed 1
        # the record's actual/forecast ratio is kept: the model scales every task by run / span
        out.append(replace(j, procs=width, estimate=span, run_time=min(j.run_time, j.estimate) * span / j.estimate,
                           deadline=j.submit + deadline_walltimes * j.estimate))
        shapes[str(j.id)] = shape
    return Built(out, cores, shapes, speed, dropped, orig)


def run_cell(trace: str, machines: str, sample: int, seed: int, speeds: str, policy: str, r: float | None,
             conserving: bool, deadline_walltimes: float, keep_wide: bool = False, split: int = 1,
             probe: bool = False) -> dict[str, Any]:
    """One simulation of the grid; the metrics of the module docstring. ``probe`` (``dispatch-priority``
    only): every pass also asks the same policy with r = 0 for its decision on the same view (the policy is
    stateless) and counts the passes where r changed the decision, and why it could (:class:`RProbe`).
    ``trace`` and ``machines``: paths, or file names in the trace folder of the process running the cell."""
    from vmctl.policies.registry import create_policy
    from vmctl.sim.engine import SimConfig, Simulator
    from vmctl.sim.exec_taskbag import TaskBagModel

    trace, machines = trace_file(trace), trace_file(machines)
    b = build(trace, machines, sample, seed, speeds, keep_wide, split, deadline_walltimes)
    params: dict[str, Any] = {}
    if policy.startswith("dispatch-"):
        params = {"conserving": conserving, "deadline_walltimes": deadline_walltimes}
        if r is not None:
            params["r"] = r
    pol = create_policy(policy, **params)
    if probe:
        if policy != "dispatch-priority":
            raise ValidationError(field="probe", problem=f"only dispatch-priority has r, not {policy}")
        pol = RProbe(**params)
    model = TaskBagModel(b.shapes, speeds=b.speeds)
    sim = Simulator(b.jobs, b.cores, pol, SimConfig(seed=seed, execution=lambda: model), source=Path(trace).name)
    result = sim.run()
    out: dict[str, Any] = metrics(b, list(sim.job_rows()), deadline_walltimes)
    out["decisions"] = result.decisions
    out["wide_kept"] = sum(1 for v in b.orig.values() if v[0] > b.cores) if keep_wide else 0
    if isinstance(pol, RProbe):
        out |= pol.counts()
    return out


class RProbe(DispatchPriority):
    """``dispatch-priority`` that, at every pass, also computes the decision of the same policy with r = 0
    on the same view (the policy is a pure function of the view) and counts:

    - ``passes``; ``differ``: passes whose actions differ from r = 0's;
    - ``top_over_cap``: passes where the top bag has more unfinished tasks than floor((1 - r) m);
    - ``oversubscribed``: of those, passes where the bags together have more unfinished tasks than m
      (under ``conserving`` only then can the cap bind: otherwise every other bag gets all its tasks and
      the top bag the rest; the literal policy caps the top bag whenever it is over the cap);
    - ``free_over_cap``: of those, passes where the free workers plus the top bag's own exceed the cap
      (only then can a different count change an action: a plan's count for a running bag takes effect
      on free workers now, and on its own workers only at their task ends)."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._shadow = DispatchPriority(**{**params, "r": 0.0})
        self._n = {"passes": 0, "differ": 0, "top_over_cap": 0, "oversubscribed": 0, "free_over_cap": 0}

    def decide(self, view: ClusterView, now: float) -> Decision:
        mine = super().decide(view, now)
        other = self._shadow.decide(view, now)
        n = self._n
        n["passes"] += 1
        if mine.actions != other.actions:
            n["differ"] += 1
        bags, _ = self._bags(view)
        running = {b.job.id for b in bags if b.running is not None}
        m = sum(1 for level, slots in enumerate(view.slot_job) for core in range(view.total_cores)
                if view.usable[core] and (slots[core] is None or slots[core] in running) and level >= 0)
        speed = {f"{c}.{lv}": 1.0 for lv in range(view.levels) for c in range(view.total_cores)}
        jobs = [pj for pj in (self._plan_job(b, speed) for b in bags) if pj is not None]
        if jobs and m:
            top = min(jobs, key=lambda j: (-j.priority, j.order, j.id))
            cap = max(1, math.floor((1.0 - self.params["r"]) * m))
            if top.tasks > cap:
                n["top_over_cap"] += 1
                if sum(j.tasks for j in jobs) > m:
                    n["oversubscribed"] += 1
                    held = 0
                    for b in bags:
                        if b.job.id == top.id and b.running is not None:
                            held = len(b.running.slots)
                    free = sum(len(c) for c in view.idle)
                    if free + held > cap:
                        n["free_over_cap"] += 1
        return mine

    def counts(self) -> dict[str, int]:
        return {f"probe_{k}": v for k, v in self._n.items()}


def metrics(b: Built, rows: Sequence[Mapping[str, Any]], deadline_walltimes: float) -> dict[str, Any]:
    by_id = {str(j.id): j for j in b.jobs}
    waits: dict[int, list[float]] = {c: [] for c in CLASSES}
    responses: list[float] = []
    met = 0
    work = 0.0
    first, last = math.inf, -math.inf
    for row in rows:
        j = by_id[str(row["id"])]
        waits[j.priority].append(row["wait"])
        responses.append(row["end"] - j.submit)
        procs, run, walltime = b.orig.get(str(j.id), (j.procs, min(j.run_time, j.estimate), j.estimate))
        met += row["end"] <= j.submit + deadline_walltimes * walltime + 1e-6
        work += procs * run
        first, last = min(first, j.submit), max(last, row["end"])
    out: dict[str, Any] = {
        "jobs": len(rows),
        "cores": b.cores,
        "mean_response_h": float(np.mean(responses)) / 3600,
        "deadlines_met": met / len(rows),
        "utilization": work / (sum(b.speeds) * (last - first)),
    }
    for c in CLASSES:
        out[f"wait_class{c}_h"] = float(np.mean(waits[c])) / 3600 if waits[c] else math.nan
    low = waits[CLASSES[-1]]
    out["worst_wait_lowest_h"] = max(low) / 3600 if low else math.nan
    return out


def cells(trace: str, machines: str, sample: int, seeds: Sequence[int], speeds: Sequence[str],
          deadline_walltimes: float = 1.0, keep_wide: bool = False, split: int = 1) -> list[Cell]:
    out: list[Cell] = []
    for seed in seeds:
        for sp in speeds:
            common: dict[str, Scalar] = {"trace": trace, "machines": machines, "sample": sample, "seed": seed,
                                         "speeds": sp, "deadline_walltimes": deadline_walltimes}
            if keep_wide or split > 1:
                common |= {"keep_wide": keep_wide, "split": split}
            for base in ("fcfs", "easy"):
                out.append(cell(run_cell, policy=base, r=None, conserving=False, **common))
            for conserving in (False, True):
                for r in R_SWEEP:
                    out.append(cell(run_cell, policy="dispatch-priority", r=r, conserving=conserving, **common))
                for name, _label in DISPATCH:
                    out.append(cell(run_cell, policy=name, r=None, conserving=conserving, **common))
    return out


def label(row: Mapping[str, Any]) -> str:
    name = str(row["policy"]).removeprefix("dispatch-")
    if row.get("r") is not None and not (isinstance(row["r"], float) and math.isnan(row["r"])) and row["r"] != "":
        name += f" r={float(row['r']):.1f}"
    if str(row.get("conserving")).lower() == "true":
        name += " +wc"
    return name


def _paired_with_easy(order: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Each policy minus EASY on the same seed (same sample, same speeds), mean ± 95 % half width over the
    seeds and in how many seeds the policy was lower: the seeds differ far more than the policies do on one
    sample. Empty with fewer than two seeds in common."""
    easy = {int(r["seed"]): r for r in order.get("easy", ())}
    lines: list[str] = []
    for name, rs in order.items():
        mine = {int(r["seed"]): r for r in rs}
        seeds = sorted(set(mine) & set(easy))
        if name == "easy" or len(seeds) < 2:
            continue
        cells = []
        for c, scale, unit in (("mean_response_h", 1.0, " h"), ("deadlines_met", 100.0, " pts")):
            d = [scale * (float(mine[s][c]) - float(easy[s][c])) for s in seeds]
            m, hw = replication_interval(d)
            cells.append(f"{m:+.2f} ± {hw:.2f}{unit} (lower in {sum(x < 0 for x in d)}/{len(d)})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if not lines:
        return []
    return ["", "Paired with EASY on the same seeds (policy - EASY):", "",
            "| policy | mean response | deadlines met |", "|---|---|---|", *lines]


#: the sample the evaluation documents (docs/taskbags.md); a smaller one says so in its tables' headers
DOCUMENTED_SAMPLE = 8


def variant_note(row: Mapping[str, Any]) -> str:
    """What a table's rows differ in from the documented evaluation: a smaller sample, kept wide bags,
    split tasks."""
    notes = []
    if int(row["sample"]) > DOCUMENTED_SAMPLE:
        notes.append(f"a sample SMALLER than the documented 1/{DOCUMENTED_SAMPLE}: fewer jobs and workers, so the "
                     "policies' order can differ from the documented results (docs/taskbags.md); read the intervals")
    if str(row.get("keep_wide", False)).lower() == "true":
        notes.append("bags wider than the machine kept")
    if int(row.get("split", 1) or 1) > 1:
        notes.append(f"each task split in {int(row['split'])}")
    return "; " + "; ".join(notes) if notes else ""


def tables(rows: Sequence[Mapping[str, Any]]) -> str:
    """One markdown table per speed case: the mean over seeds, and with two seeds or more the half width
    of its 95 % Student-t interval (``mean ± hw``; each seed draws its own sample and worker speeds)."""
    cols = ["mean_response_h", *(f"wait_class{c}_h" for c in CLASSES), "deadlines_met", "utilization",
            "worst_wait_lowest_h"]
    heads = ["mean resp. (h)", *(f"wait cl.{c} (h)" for c in CLASSES), "deadlines met", "util.",
             f"worst wait cl.{CLASSES[-1]} (h)"]
    out: list[str] = []
    for sp in SPEEDS:
        group = [r for r in rows if r.get("speeds") == sp and not r.get("error")]
        if not group:
            continue
        first = group[0]
        out.append(f"\n### {sp} workers ({first['cores']} workers, {first['jobs']} jobs, sample 1/{first['sample']}, "
                   f"seeds {sorted({int(r['seed']) for r in group})}{variant_note(first)})\n")
        out.append("| policy | " + " | ".join(heads) + " |")
        out.append("|---" * (len(heads) + 1) + "|")
        order: dict[str, list[Mapping[str, Any]]] = {}
        for r in group:
            order.setdefault(label(r), []).append(r)
        for name, rs in order.items():
            vals = []
            for c in cols:
                v, hw = replication_interval([float(r[c]) for r in rs])
                pct = c in ("deadlines_met", "utilization")
                cell = f"{100 * v:.1f}" if pct else f"{v:.2f}"
                if hw is not None and math.isfinite(hw):
                    cell += f" ± {100 * hw:.1f}" if pct else f" ± {hw:.2f}"
                vals.append(cell + (" %" if pct else ""))
            out.append(f"| {name} | " + " | ".join(vals) + " |")
        out.extend(_paired_with_easy(order))
    if any(r.get("error") for r in rows):  # one line per cause, not per cell
        out.append("\n" + failure_summary(rows))
    return "\n".join(out) + "\n"


def _ints(option: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValidationError(field=option, problem=f"expected comma-separated integers, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); vmctl errors propagate (:func:`run_main` prints them)."""
    ap = argparse.ArgumentParser(prog="python -m vmctl.experiments.taskbags", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory (results.csv, tables.md)")
    ap.add_argument("--trace", default=TRACE, help=f"the CERIT-SC trace: a path, or a file name in $VMCTL_TRACE_DIR "
                                                   f"(default {TRACE}; the folder defaults to ../shared/data/traces "
                                                   "beside the checkout)")
    ap.add_argument("--machines", default=MACHINES, help=f"its machine file, the same way (default {MACHINES})")
    ap.add_argument("--sample", type=int, default=DOCUMENTED_SAMPLE,
                    help=f"keep 1 job in SAMPLE and 1 CPU in SAMPLE (default {DOCUMENTED_SAMPLE}, the documented "
                         "evaluation; a larger one says so in the tables' headers)")
    ap.add_argument("--seeds", default="1", help="comma-separated seeds (sample and speeds)")
    ap.add_argument("--speeds", default=",".join(SPEEDS), help="comma-separated: homogeneous, uniform")
    ap.add_argument("--deadline-walltimes", type=float, default=1.0,
                    help="deadline = submit + this x requested walltime (default 1)")
    ap.add_argument("--workers", type=int, default=1, help="Dask worker processes (default 1: a loaded machine)")
    ap.add_argument("--keep-wide", action="store_true",
                    help="keep bags wider than the scaled machine (their tasks run in rounds) instead of dropping them")
    ap.add_argument("--split", type=int, default=1, help="split each task into this many (default 1)")
    a = ap.parse_args(argv)
    # every input checked before a cell runs: one error naming the file or the option, exit 2
    trace, machines = trace_ref(a.trace, "--trace"), trace_ref(a.machines, "--machines")
    seeds = _ints("--seeds", a.seeds)
    if not seeds:
        raise ValidationError(field="--seeds", problem="no seed given")
    speeds = [s for s in a.speeds.split(",") if s]
    for s in speeds or [""]:
        if s not in SPEEDS:
            raise ValidationError(field="--speeds", problem=f"unknown {s!r} (known: {', '.join(SPEEDS)})")
    if a.sample < 1:
        raise OutOfRange(what="--sample", value=a.sample, allowed=">= 1 (keep 1 job in SAMPLE)")
    if a.split < 1:
        raise OutOfRange(what="--split", value=a.split, allowed=">= 1 (tasks per CPU of a job)")
    if a.workers < 1:
        raise OutOfRange(what="--workers", value=a.workers, allowed=">= 1")
    if not (a.deadline_walltimes > 0 and math.isfinite(a.deadline_walltimes)):
        raise OutOfRange(what="--deadline-walltimes", value=a.deadline_walltimes, allowed="> 0")
    read_alea_swf(trace_file(trace), trace_file(machines))  # a malformed file: its path and line, once
    out = writable_dir(a.out)
    table = out / "results.csv"
    res = run_grid(cells(trace, machines, a.sample, seeds, speeds, a.deadline_walltimes, a.keep_wide, a.split),
                   table, workers=a.workers, label="taskbags", progress=sys.stderr.isatty())
    text = tables(res.rows)
    (out / "tables.md").write_text(text)
    sys.stdout.write(text)
    raise_failed(res.rows, table)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main))
