"""Paper 004's Table 1 on our simulator: rho and slowdown of BGS, BGS+M, GS, GS+M for workloads 0-8
(MPL 5, T = 200 s, C = 0, Q unlimited), beside the paper's numbers, with the "% s better" columns.

Workloads. The paper's nine workloads come from a Jann (1997) model fitted to ASCI Blue-Pacific
(320 nodes), at increasing load; we use our ``jann97`` model (fitted to the CTC SP2, the paper's
parameters being unavailable: docs/workloads.md) at 320 processors, one seed, ``jobs`` jobs. The
offered load of workload i is chosen so that BGS+M (the policy that saturates last) reaches the
paper's highest utilization of that row (0.55, 0.61, 0.66, 0.72, 0.77, 0.83, 0.88, 0.94, 0.97): a
calibration grid runs BGS+M at offered loads 0.5, 0.6, ..., 1.2 on the same jobs, and the load of
workload i is read off the measured utilization curve by linear interpolation (clamped to the grid;
the curve is made non-decreasing first). Utilization is measured as the paper's rho: work /
(N x last finish), the first arrival at 0 (eq. 3 without its MPL factor, see
:class:`vmctl.sim.metrics.GangMetrics`).

Both grids run on the experiments runner (:mod:`vmctl.experiments.runner`): a rerun with the same
table skips the cells already in it. ``vmctl sim gang-table1`` is the command.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vmctl.model import SliceSchedule
from vmctl.sim.execution import Run
from vmctl.sim.timeslice import TimeSliceModel

#: paper 004 Table 1: workload -> policy -> (rho, slowdown)
PAPER_TABLE1: dict[int, dict[str, tuple[float, float]]] = {
    0: {"bgs": (0.55, 2.5), "bgs-m": (0.55, 2.4), "gs": (0.55, 2.8), "gs-m": (0.55, 2.5)},
    1: {"bgs": (0.61, 2.8), "bgs-m": (0.61, 2.6), "gs": (0.61, 4.4), "gs-m": (0.61, 2.9)},
    2: {"bgs": (0.66, 3.4), "bgs-m": (0.66, 2.9), "gs": (0.66, 6.8), "gs-m": (0.66, 4.3)},
    3: {"bgs": (0.72, 4.4), "bgs-m": (0.72, 3.4), "gs": (0.72, 16.3), "gs-m": (0.72, 8.0)},
    4: {"bgs": (0.77, 5.7), "bgs-m": (0.77, 4.1), "gs": (0.77, 44.1), "gs-m": (0.77, 12.6)},
    5: {"bgs": (0.83, 9.0), "bgs-m": (0.83, 5.4), "gs": (0.83, 172.6), "gs-m": (0.83, 25.7)},
    6: {"bgs": (0.88, 13.7), "bgs-m": (0.88, 7.6), "gs": (0.84, 650.8), "gs-m": (0.88, 66.7)},
    7: {"bgs": (0.94, 24.5), "bgs-m": (0.94, 13.5), "gs": (0.84, 1169.5), "gs-m": (0.94, 257.9)},
    8: {"bgs": (0.95, 48.7), "bgs-m": (0.97, 42.7), "gs": (0.85, 1693.3), "gs-m": (0.94, 718.6)},
}
#: the paper's own "% s better" columns (BGS -> BGS+M, GS -> GS+M), computed from its unrounded slowdowns
PAPER_BETTER: dict[int, tuple[float, float]] = {
    0: (5.3, 11.7), 1: (9.3, 34.5), 2: (15.2, 37.1), 3: (23.2, 50.9), 4: (27.7, 71.3), 5: (40.3, 85.1),
    6: (44.5, 89.7), 7: (44.7, 77.9), 8: (12.3, 57.6),
}
POLICIES = ("bgs", "bgs-m", "gs", "gs-m")
CALIBRATION_LOADS = tuple(round(0.5 + 0.1 * i, 2) for i in range(8))  # 0.5 .. 1.2


def target_utilization(workload: int) -> float:
    """The highest utilization the paper reports for ``workload`` (its offered load at the least)."""
    return max(rho for rho, _s in PAPER_TABLE1[workload].values())


#: the study's workload models (issue 26): ``jann97`` (ours, fitted to CTC), ``lublin99``, and
#: ``jann97-par``: jann97's per-size-range streams with the serial range left out (see :func:`study_jobs`)
STUDY_MODELS = ("jann97", "lublin99", "jann97-par")
#: warm-up trimmed from the steady-state utilization: the first 10 % of the arrivals
WARMUP_FRACTION = 0.10


def study_jobs(model: str, jobs: int, procs: int, load: float, seed: int) -> tuple[list[Any], str]:
    """``jobs`` jobs of ``model`` for ``procs`` processors at offered load ``load`` (TModel estimates,
    full CPU usage, as every gang run). ``jann97-par`` is our reading of "a size mix matched to the
    paper's description": the paper says only that its workloads are Jann-model fits to ASCI
    Blue-Pacific, 320 nodes, *parallel* jobs (sec. 1, 3) whose tasks are gang-scheduled; our jann97 has
    41-47 % serial jobs (CTC's share). ``jann97-par`` keeps jann97's independent per-size-range arrival
    and run-time streams and leaves out the size-1 stream (the first ``jobs`` parallel jobs of a larger
    jann97 sample), then rescales the arrivals to ``load``."""
    from vmctl.errors import OutOfRange
    from vmctl.sim.workloads.load import scale_to_load
    from vmctl.sim.workloads.registry import generate_model

    if model not in STUDY_MODELS:
        raise OutOfRange(what="study model", value=model, allowed=" | ".join(STUDY_MODELS))
    if model != "jann97-par":
        wl = generate_model(model, jobs, procs, seed, load, usage="full")
        return list(wl.jobs), wl.source
    from dataclasses import replace

    wl = generate_model("jann97", 2 * jobs + 100, procs, seed, None, usage="full")
    par = [j for j in wl.jobs if j.procs >= 2][:jobs]
    wl = scale_to_load(replace(wl, jobs=par), load, procs)
    return list(wl.jobs), f"jann97-par({wl.source}, serial jobs left out)"


def steady_window(submits: Sequence[float], warmup: float = WARMUP_FRACTION) -> tuple[float, float]:
    """The steady-state window: from the arrival of job ``int(warmup x (n - 1))`` (in arrival order; the
    warm-up trimmed) to the last arrival (the drain trimmed: after it the load only falls)."""
    xs = sorted(submits)
    if not xs:
        return (0.0, 0.0)
    return xs[int(warmup * (len(xs) - 1))], xs[-1]


class MeteredTimeSlice(TimeSliceModel):
    """A :class:`~vmctl.sim.timeslice.TimeSliceModel` that records the busy processors of the active row
    (``samples``: ``(time, busy)``) at every slice boundary and after every decision (the gang policies
    emit a schedule with every decision, so every start, end or move is followed by a sample). Between
    two samples the occupancy is constant (runs change only at events and boundaries), so the record is
    the exact work rate with C = 0 (with C > 0 a migrating job's blocked time would count as busy)."""

    def __init__(self, levels: int, period: float) -> None:
        super().__init__(levels, period)
        self.samples: list[tuple[float, int]] = []

    def _sample(self, now: float) -> None:
        active = self.active_row
        busy = sum(len(r.cores) for r in self.state.runs.values()
                   if not r.stopped and (r.level == active or active in r.replicas))
        self.samples.append((now, busy))

    def on_event(self, now: float) -> Iterable[Run]:
        out = list(super().on_event(now))
        self._sample(now)
        return out

    def on_schedule(self, schedule: SliceSchedule, now: float) -> Iterable[Run]:
        out = list(super().on_schedule(schedule, now))
        self._sample(now)
        return out


def metered_utilization(samples: Sequence[tuple[float, int]], cores: int, window: tuple[float, float]) -> float:
    """Work done in ``window`` over ``cores`` x its length, from a :class:`MeteredTimeSlice` record (a
    sample holds until the next one; with one row in use there are no boundaries, and the samples come
    from the decisions alone; a stall samples 0).

    >>> metered_utilization([(0.0, 2), (10.0, 1), (20.0, 0)], 2, (5.0, 15.0))
    0.75
    """
    lo, hi = window
    if hi <= lo:
        return 0.0
    done = 0.0
    pts = sorted(samples, key=lambda p: p[0])
    for i, (t, busy) in enumerate(pts):
        end = pts[i + 1][0] if i + 1 < len(pts) else t
        overlap = min(end, hi) - max(t, lo)
        if overlap > 0:
            done += busy * overlap
    return done / (cores * (hi - lo))


def steady_utilization(rows: Sequence[Mapping[str, Any]], work: Mapping[str, float], cores: int,
                       warmup: float = WARMUP_FRACTION) -> float:
    """Utilization in the steady state, *prorated*: over :func:`steady_window`, the work done in the
    window over ``cores`` x its length, a job's work (``width x execution``) spread evenly over its
    [first start, end]. Kept beside the metered one (:func:`metered_utilization`) to show its bias: a
    job's progress is not even (it speeds up when fewer rows are in use, as in the drain), so prorating
    moves work of the drain into the window. ``rows``: the simulator's job rows.

    The window ends at the last arrival (10 here): a and b fill both cores over [0, 10] and c, which starts
    at its end, counts nothing; without b half the cores are busy.

    >>> rows = [{"id": "a", "submit": 0.0, "start": 0.0, "end": 10.0, "width": 1},
    ...         {"id": "b", "submit": 0.0, "start": 0.0, "end": 10.0, "width": 1},
    ...         {"id": "c", "submit": 10.0, "start": 10.0, "end": 20.0, "width": 1}]
    >>> steady_utilization(rows, {"a": 10.0, "b": 10.0, "c": 10.0}, 2, warmup=0.0)
    1.0
    >>> steady_utilization(rows[:1] + rows[2:], {"a": 10.0, "c": 10.0}, 2, warmup=0.0)
    0.5
    """
    import math as _math

    if len(rows) < 2:
        return 0.0
    lo, hi = steady_window([float(r["submit"]) for r in rows], warmup)
    if hi <= lo:
        return 0.0
    done = 0.0
    for r in rows:
        s, e = float(r["start"]), float(r["end"])
        if _math.isnan(e) or e <= s:
            continue
        overlap = min(e, hi) - max(s, lo)
        if overlap > 0:
            done += work[str(r["id"])] * overlap / (e - s)
    return done / (cores * (hi - lo))


def gang_cell(policy: str, load: float, jobs: int, procs: int, mpl: int, slice_s: float, cost: float,
              quota: int, seed: int, workload: int = -1, model: str = "jann97",
              backfill: str = "easy") -> dict[str, Any]:
    """One run of a gang policy on ``model`` (``quota`` < 0: unlimited; ``workload`` only labels the
    row; ``backfill``: ``easy`` or ``conservative`` for ``bgs``/``bgs-m``): the sec. 3 metrics, and the
    steady-state utilization (``steady_utilization``: metered, :func:`metered_utilization`;
    ``steady_prorated``: :func:`steady_utilization`), both over :func:`steady_window`."""
    from vmctl.experiments.sweep import WorkloadSpec, build_workload, make_config
    from vmctl.policies.registry import create_policy
    from vmctl.sim.engine import Simulator

    t0, c0 = time.perf_counter(), time.process_time()
    spec = WorkloadSpec(model="jann97", jobs=jobs, procs=procs, load=load, seed=seed, cpu_usage="full")
    if model == "jann97":
        built = build_workload(spec)
        wjobs, cores, source = list(built.jobs), built.cores, built.source
    else:
        wjobs, source = study_jobs(model, jobs, procs, load, seed)
        cores = procs
    extra = {"backfill": backfill} if policy.startswith("bgs") else {}
    pol = create_policy(policy, mpl=mpl, slice=slice_s, cost=cost, quota=float("inf") if quota < 0 else float(quota),
                        **extra)
    models: list[MeteredTimeSlice] = []

    def metered() -> TimeSliceModel:
        m = MeteredTimeSlice(mpl, slice_s)
        models.append(m)
        return m

    cfg = make_config(spec, seed, execution=metered)
    sim = Simulator(wjobs, cores, pol, cfg, source=source)
    res = sim.run()
    window = steady_window([float(j.submit) for j in wjobs])
    g = res.gang
    assert g is not None  # a timeslice run of mpl >= 2 levels
    work = {str(j.id): float(min(j.run_time, j.estimate)) * j.procs for j in wjobs}
    sizes = [j.procs for j in wjobs]
    return {"utilization": g.utilization, "utilization_eq3": g.utilization_eq3, "avg_slowdown": g.avg_slowdown,
            "avg_wait": g.avg_wait, "capacity_lost_fraction": g.capacity_lost_fraction,
            "migrations_per_job": g.migrations_per_job, "makespan": res.metrics.makespan, "jobs_done": res.jobs,
            "steady_utilization": metered_utilization(models[-1].samples, cores, window),
            "steady_prorated": steady_utilization(list(sim.job_rows()), work, cores),
            "mean_size": sum(sizes) / len(sizes), "serial_share": sum(1 for x in sizes if x == 1) / len(sizes),
            "sim_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def loads_for_targets(curve: Sequence[tuple[float, float]], targets: Sequence[float]) -> list[float]:
    """Offered loads reaching ``targets`` on a measured ``(offered load, utilization)`` curve, by linear
    interpolation on its non-decreasing envelope (clamped to the curve's ends).

    >>> loads_for_targets([(0.5, 0.45), (0.6, 0.55), (0.7, 0.5)], [0.5, 0.55, 0.9])
    [0.55, 0.6, 0.7]
    """
    pts = sorted(curve)
    env: list[tuple[float, float]] = []
    top = -1.0
    for x, y in pts:
        top = max(top, y)
        env.append((x, top))
    out: list[float] = []
    for t in targets:
        if t <= env[0][1]:
            out.append(env[0][0])
            continue
        for (x0, y0), (x1, y1) in itertools.pairwise(env):
            if y0 < t <= y1:
                out.append(round(x0 + (x1 - x0) * (t - y0) / (y1 - y0), 4))
                break
        else:
            out.append(env[-1][0])
    return out


def table1_markdown(rows: Mapping[tuple[int, str], Mapping[str, Any]], loads: Sequence[float]) -> str:
    """Ours beside the paper's: per workload, rho and s of each policy and the "% s better" columns
    (``100 (s - s_m) / s``, migration against none)."""

    def better(s: float, sm: float) -> str:
        return f"{100 * (s - sm) / s:.1f} %" if s > 0 else "-"

    head = ("| wl | load | BGS rho | BGS s | BGS+M rho | BGS+M s | % s better | GS rho | GS s | GS+M rho | GS+M s "
            "| % s better |")
    lines = ["### ours (jann97, 320 processors)", "", head, "|---" * 12 + "|"]
    for w, load in enumerate(loads):
        cells = [f"{w}", f"{load:.3f}"]
        for pair in (("bgs", "bgs-m"), ("gs", "gs-m")):
            a, b = rows[(w, pair[0])], rows[(w, pair[1])]
            cells += [f"{a['utilization']:.2f}", f"{a['avg_slowdown']:.1f}", f"{b['utilization']:.2f}",
                      f"{b['avg_slowdown']:.1f}", better(a["avg_slowdown"], b["avg_slowdown"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "### the paper (Table 1)", "", head.replace("| load ", ""), "|---" * 11 + "|"]
    for w in range(len(loads)):
        p = PAPER_TABLE1[w]
        cells = [f"{w}"]
        for k, pair in enumerate((("bgs", "bgs-m"), ("gs", "gs-m"))):
            (ra, sa), (rb, sb) = p[pair[0]], p[pair[1]]
            cells += [f"{ra:.2f}", f"{sa:.1f}", f"{rb:.2f}", f"{sb:.1f}", f"{PAPER_BETTER[w][k]:.1f} %"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table1(jobs: int, out: str, seed: int = 1, workers: int | None = None, scheduler: str | None = None,
           progress: bool = True, warn: Callable[[str], None] | None = None) -> str:
    """Calibrate the loads, run the 36 cells of Table 1, write ``OUT/table1.md`` and return it. A size
    whose calibration reaches too few workloads' utilizations is refused before the table's cells run
    (:func:`check_reach`); ``warn`` is told of the workloads that share the last load, which the table's
    header names too."""
    from pathlib import Path

    from vmctl.experiments.runner import grid, run_grid, writable_dir

    where = writable_dir(out)
    fixed = _fixed(jobs, seed)
    curve, loads = calibrate(jobs, seed, where, workers, scheduler, progress)
    if warn is not None and (reach := reach_note(curve, jobs)):
        warn(f"warning: {reach}")
    cells = [c for w, load in enumerate(loads) for c in grid(gang_cell, {**fixed, "load": load, "workload": w},
                                                               policy=list(POLICIES))]
    res = run_grid(cells, where / "table1.parquet", workers=workers, scheduler=scheduler, progress=progress,
                   label="table 1")
    _raise_failed(res.rows, where / "table1.parquet")
    rows = {(int(r["workload"]), str(r["policy"])): r for r in res.rows}
    notes = []
    if jobs < DOCUMENTED_JOBS:
        notes.append(f"note: {jobs:,} jobs is SMALLER than the documented {DOCUMENTED_JOBS:,} (docs/gang.md): more end "
                     "effect, lower rho at each load")
    if reach := reach_note(curve, jobs):
        notes.append(f"note: {reach}")
    doc = "\n".join([f"Table 1, {jobs:,} jann97 jobs, seed {seed}; offered loads calibrated on BGS+M "
                     f"(curve: {', '.join(f'{x:g} -> {y:.3f}' for x, y in sorted(curve))})",
                     *notes, "", table1_markdown(rows, loads), ""])
    Path(where / "table1.md").write_text(doc, encoding="utf-8")
    return doc


def table1_seeds(dirs: Sequence[str]) -> str:
    """Table 1 over several seeds: each directory holds one ``gang-table1`` run (its own seed and its
    own calibrated loads); workload ``w`` of every run aims at the same utilization, so the rows are
    pooled by workload. Prints the mean rho and the mean slowdown with a 95 % Student-t half width
    over the seeds (the spread of the workload model, not of one run), the mean rho with its half width too,
    and the "% s better" of the means with, in parentheses, in how many seeds migration lowered s (a paired
    count: the seeds' slowdowns spread far more than their differences)."""
    from pathlib import Path

    import pyarrow.parquet as pq

    from vmctl.errors import ValidationError
    from vmctl.sim.metrics import replication_interval

    by: dict[tuple[int, str], list[tuple[float, float]]] = {}
    seeds: list[int] = []
    jobs: set[int] = set()
    for d in dirs:
        path = Path(d) / "table1.parquet"
        if not path.is_file():
            raise ValidationError(field=str(d), problem="holds no table1.parquet (run `vmctl sim gang-table1 "
                                                        "--out DIR` first)")
        rows = pq.read_table(path).to_pylist()
        bad = [r for r in rows if r.get("error")]
        if bad or len(rows) != 9 * len(POLICIES):
            raise ValidationError(field=str(path), problem=f"is not a complete Table 1 run ({len(rows)} cells, "
                                                           f"{len(bad)} failed; 36 needed)")
        seed = int(rows[0]["seed"])
        if seed in seeds:
            raise ValidationError(field=str(d), problem=f"repeats seed {seed}")
        seeds.append(seed)
        jobs.add(int(rows[0]["jobs"]))
        for r in rows:
            by.setdefault((int(r["workload"]), str(r["policy"])), []).append(
                (float(r["utilization"]), float(r["avg_slowdown"])))
    if len(seeds) < 2:
        raise ValidationError(field="DIR", problem="needs at least two runs (seeds) for an interval")

    def mean_hw(xs: Sequence[float]) -> tuple[float, float]:
        m, hw = replication_interval(xs)
        assert hw is not None  # every cell has one value per seed, and there are >= 2 seeds
        return m, hw

    head = ("| wl | BGS rho | BGS s | BGS+M rho | BGS+M s | % s better | GS rho | GS s | GS+M rho | GS+M s "
            "| % s better |")
    lines = [f"Table 1 over {len(seeds)} seeds ({', '.join(map(str, sorted(seeds)))}), "
             f"{'/'.join(f'{j:,}' for j in sorted(jobs))} jann97 jobs each: mean, and +- the 95 % half width "
             "over the seeds; (k/n): the seeds where migration lowered s", "", head, "|---" * 11 + "|"]
    for w in range(9):
        cells = [f"{w}"]
        for pair in (("bgs", "bgs-m"), ("gs", "gs-m")):
            means = []
            for p in pair:
                rho, rho_hw = mean_hw([u for u, _ in by[(w, p)]])
                s, hw = mean_hw([x for _, x in by[(w, p)]])
                means.append(s)
                cells += [f"{rho:.2f} +- {rho_hw:.2f}", f"{s:.1f} +- {hw:.1f}"]
            wins = sum(m < x for (_, x), (_, m) in zip(by[(w, pair[0])], by[(w, pair[1])], strict=True))
            better = f"{100 * (means[0] - means[1]) / means[0]:.1f} %" if means[0] > 0 else "-"
            cells.append(f"{better} ({wins}/{len(seeds)})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _fixed(jobs: int, seed: int) -> dict[str, Any]:
    """The inputs of Table 1's cells besides policy and load: 320 processors, MPL 5, T = 200 s, C = 0,
    Q unlimited."""
    return {"jobs": jobs, "procs": 320, "mpl": 5, "slice_s": 200.0, "cost": 0.0, "quota": -1, "seed": seed}


def calibrate(jobs: int, seed: int, where: Any, workers: int | None, scheduler: str | None,
              progress: bool) -> tuple[list[tuple[float, float]], list[float]]:
    """The calibration grid (BGS+M at :data:`CALIBRATION_LOADS`, in ``WHERE/calibration.parquet``):
    the measured ``(offered load, utilization)`` curve and the offered loads of workloads 0-8."""
    from vmctl.experiments.runner import grid, run_grid

    table = where / "calibration.parquet"
    top = max(target_utilization(w) for w in range(9))
    # Early stop (issue 27): the grid runs up to load 1.0 first, then one load at a time, and stops once
    # the utilization reaches the highest target: the loads after that point cannot change any target's
    # interpolation (each is read on the first segment of the envelope that reaches it), so the loads
    # are those of the whole grid. At 20,000 jobs BGS+M reaches 0.97 by 1.1 and the 1.2 cell (the
    # slowest) is not run; at 2,000 jobs no load reaches it and the whole grid runs as before.
    first = [x for x in CALIBRATION_LOADS if x <= 1.0]
    stages = [first] + [[x] for x in CALIBRATION_LOADS if x > 1.0]
    rows: list[Mapping[str, Any]] = []
    for loads in stages:
        if rows and max(float(r["utilization"]) for r in rows) >= top:
            break
        cal = run_grid(grid(gang_cell, _fixed(jobs, seed), policy=["bgs-m"], load=loads), table,
                       workers=workers, scheduler=scheduler, progress=progress, label="calibration")
        _raise_failed(cal.rows, table)
        rows += cal.rows
    curve = [(float(r["load"]), float(r["utilization"])) for r in rows]
    check_reach(curve, jobs, table)
    return curve, loads_for_targets(curve, [target_utilization(w) for w in range(9)])


#: the size Table 1 is documented at (docs/gang.md): workloads 7 and 8 already share the last load there
DOCUMENTED_JOBS = 2000
#: fewer workloads within reach than this, and most of Table 1's rows would be one run repeated: refused
MIN_REACHED = 5


def out_of_reach(curve: Sequence[tuple[float, float]]) -> list[int]:
    """The workloads whose target utilization BGS+M's measured curve never reaches: their load is clamped
    to the grid's last one (:func:`loads_for_targets`), so they all run the same cells.

    >>> out_of_reach([(0.5, 0.45), (1.2, 0.80)])
    [5, 6, 7, 8]
    """
    top = max(u for _x, u in curve)
    return [w for w in range(9) if target_utilization(w) > top]


def reach_note(curve: Sequence[tuple[float, float]], jobs: int) -> str:
    """Why some workloads share the last load ('' when every target is reached)."""
    lost = out_of_reach(curve)
    if not lost:
        return ""
    x, top = max(curve, key=lambda p: (p[1], -p[0]))
    rows = f"workload {lost[0]}" if len(lost) == 1 else f"workloads {lost[0]}-{lost[-1]}"
    return (f"{rows} (target rho {target_utilization(lost[0]):.2f}"
            f"{'' if len(lost) == 1 else f'-{target_utilization(lost[-1]):.2f}'}) out of reach: BGS+M reaches at "
            f"most rho {top:.3f} (offered load {x:g}) on {jobs:,} jobs (the tail of a short run's last jobs keeps "
            f"rho low), so {'it runs' if len(lost) == 1 else 'they all run'} at load {max(CALIBRATION_LOADS):g}"
            f"{'' if len(lost) == 1 else ' and repeat one row'}")


def check_reach(curve: Sequence[tuple[float, float]], jobs: int, table: Any) -> None:
    """Refuse (``ValidationError`` on ``--jobs``, exit 2) a size whose calibration reaches fewer than
    :data:`MIN_REACHED` of the nine workloads' utilizations: most rows of the table would be the same cells."""
    from vmctl.errors import ValidationError

    lost = out_of_reach(curve)
    if 9 - len(lost) < MIN_REACHED:
        raise ValidationError(field="--jobs", problem=f"{jobs:,} jobs are too few for Table 1's loads: "
                              f"{reach_note(curve, jobs)}; use --jobs {DOCUMENTED_JOBS} (the documented size) or more "
                              f"(the calibration is kept in {table})")


#: Figure 1's axes: the quota Q (tasks per slice; -1 = unlimited) and the migration cost C (s)
FIGURE1_QUOTAS = (0, 16, 64, 256, -1)
FIGURE1_COSTS = (0.0, 10.0, 20.0, 30.0)


def figure1(jobs: int, out: str, seed: int = 1, workers: int | None = None, scheduler: str | None = None,
            progress: bool = True, costs: Sequence[float] = FIGURE1_COSTS,
            quotas: Sequence[int] = FIGURE1_QUOTAS) -> str:
    """Figure 1: slowdown and wait of GS+M and BGS+M against Q for workloads 2 and 5 (their offered loads
    from the Table 1 calibration in ``OUT``), one line per policy and cost; writes ``OUT/figure1.md``
    and ``OUT/figure1.png``."""
    from vmctl.experiments.runner import grid, run_grid, writable_dir

    where = writable_dir(out)
    _curve, loads = calibrate(jobs, seed, where, workers, scheduler, progress)
    base = {k: v for k, v in _fixed(jobs, seed).items() if k not in ("cost", "quota")}
    cells = [c for w in (2, 5) for c in grid(gang_cell, {**base, "load": loads[w], "workload": w},
                                             policy=["gs-m", "bgs-m"], cost=list(costs), quota=list(quotas))]
    table = where / "figure1.parquet"
    res = run_grid(cells, table, workers=workers, scheduler=scheduler, progress=progress, label="figure 1")
    _raise_failed(res.rows, table)
    lines = [f"Figure 1, {jobs:,} jann97 jobs, seed {seed}: average slowdown / average wait (s) against Q", "",
             "| workload | policy | C (s) | " + " | ".join("Q = " + ("unlimited" if q < 0 else str(q))
                                                         for q in quotas) + " |",
             "|---" * (3 + len(quotas)) + "|"]
    by = {(int(r["workload"]), str(r["policy"]), float(r["cost"]), int(r["quota"])): r for r in res.rows}
    for w in (2, 5):
        for p in ("gs-m", "bgs-m"):
            for c in costs:
                vals = [by[(w, p, float(c), q)] for q in quotas]
                lines.append(f"| {w} | {p} | {c:g} | " + " | ".join(f"{v['avg_slowdown']:.2f} / {v['avg_wait']:,.0f}"
                                                                   for v in vals) + " |")
    doc = "\n".join(lines) + "\n"
    (where / "figure1.md").write_text(doc, encoding="utf-8")
    _plot_figure1(by, costs, quotas, where / "figure1.png")
    return doc


def _plot_figure1(by: Mapping[tuple[int, str, float, int], Mapping[str, Any]], costs: Sequence[float],
                  quotas: Sequence[int], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = list(range(len(quotas)))
    labels = ["unl." if q < 0 else str(q) for q in quotas]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for col, w in enumerate((2, 5)):
        for row, metric in enumerate(("avg_slowdown", "avg_wait")):
            ax = axes[row][col]
            for p in ("gs-m", "bgs-m"):
                for c in costs:
                    ax.plot(xs, [by[(w, p, float(c), q)][metric] for q in quotas], marker="o",
                            label=f"{p.upper().replace('-M', '+M')} C={c:g}")
            ax.set_xticks(xs, labels)
            ax.set_xlabel("Q (tasks migrated per slice)")
            ax.set_ylabel("slowdown" if metric == "avg_slowdown" else "wait (s)")
            ax.set_title(f"workload {w}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure2(jobs: int, out: str, seed: int = 1, workers: int | None = None, scheduler: str | None = None,
            progress: bool = True, costs: Sequence[float] = (0.0, 20.0, 30.0), mpls: Sequence[int] = (2, 3, 5),
            workloads: Sequence[int] = tuple(range(9))) -> str:
    """Figure 2: slowdown against utilization of GS+M and BGS+M for each MPL, with Q = 0 (no migration)
    and with Q = 64 at each cost C, over the offered loads of ``workloads`` (Table 1 calibration in
    ``OUT``); and the largest utilization with slowdown <= 20 (the largest measured among those runs).
    Writes ``OUT/figure2.md`` and ``OUT/figure2.png``."""
    from vmctl.experiments.runner import grid, run_grid, writable_dir

    where = writable_dir(out)
    _curve, loads = calibrate(jobs, seed, where, workers, scheduler, progress)
    base = {k: v for k, v in _fixed(jobs, seed).items() if k not in ("cost", "quota", "mpl")}
    variants = [(0.0, 0), *((float(c), 64) for c in costs)]  # (C, Q); C does not matter at Q = 0
    cells = [c for w in workloads for cost, q in variants
             for c in grid(gang_cell, {**base, "load": loads[w], "workload": w, "cost": cost, "quota": q},
                           policy=["gs-m", "bgs-m"], mpl=list(mpls))]
    table = where / "figure2.parquet"
    res = run_grid(cells, table, workers=workers, scheduler=scheduler, progress=progress, label="figure 2")
    _raise_failed(res.rows, table)
    by: dict[tuple[float, int, str, int], list[Mapping[str, Any]]] = {}
    for r in res.rows:
        by.setdefault((float(r["cost"]), int(r["quota"]), str(r["policy"]), int(r["mpl"])), []).append(r)
    lines = [f"Figure 2, {jobs:,} jann97 jobs, seed {seed}, workloads {', '.join(map(str, workloads))}: "
             "utilization / slowdown per offered load, and the largest utilization with slowdown <= 20", "",
             "| Q | C (s) | policy | MPL | " + " | ".join(f"wl {w}" for w in workloads) + " | max rho, s <= 20 |",
             "|---" * (5 + len(workloads)) + "|"]
    for (cost, q, pol, mpl), rs in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2], kv[0][3])):
        rs = sorted(rs, key=lambda r: int(r["workload"]))
        ok = [float(r["utilization"]) for r in rs if float(r["avg_slowdown"]) <= 20]
        lines.append(f"| {q} | {cost:g} | {pol} | {mpl} | "
                     + " | ".join(f"{r['utilization']:.2f} / {r['avg_slowdown']:.1f}" for r in rs)
                     + (f" | {max(ok):.2f} |" if ok else " | - |"))
    doc = "\n".join(lines) + "\n"
    (where / "figure2.md").write_text(doc, encoding="utf-8")
    _plot_figure2(by, variants, where / "figure2.png")
    return doc


def _plot_figure2(by: Mapping[tuple[float, int, str, int], list[Mapping[str, Any]]],
                  variants: Sequence[tuple[float, int]], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(variants), figsize=(4.5 * len(variants), 4), squeeze=False)
    for ax, (cost, q) in zip(axes[0], variants, strict=True):
        for (c, qq, pol, mpl), rs in sorted(by.items()):
            if (c, qq) != (cost, q):
                continue
            rs = sorted(rs, key=lambda r: float(r["utilization"]))
            ax.plot([r["utilization"] for r in rs], [r["avg_slowdown"] for r in rs], marker="o",
                    label=f"{pol.upper().replace('-M', '+M') if q else pol.upper().replace('-M', '')} MPL {mpl}")
        ax.axhline(20, color="grey", linewidth=0.5)
        ax.set_yscale("log")
        ax.set_xlabel("utilization")
        ax.set_ylabel("slowdown")
        ax.set_title("Q = 0" if q == 0 else f"Q = {q}, C = {cost:g} s")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _raise_failed(rows: Sequence[Mapping[str, Any]], table: Any) -> None:
    """``CellsFailed`` naming each distinct error once (:func:`vmctl.experiments.inputs.raise_failed`)."""
    from vmctl.experiments.inputs import raise_failed

    raise_failed(rows, table)


#: the real traces of the comparison with EASY and MEASY (``../shared/data/traces``)
TRACES = ("KTH-SP2-1996-2.1-cln.swf.gz", "SDSC-SP2-1998-4.2-cln.swf.gz", "CTC-SP2-1996-3.1-cln.swf.gz",
          "HPC2N-2002-2.2-cln.swf.gz")
TRACE_POLICIES = ("easy", "measy", "gs", "gs-m", "bgs", "bgs-m")


def trace_cell(trace: str, jobs: int, policy: str, seed: int, mpl: int = 5, slice_s: float = 200.0) -> dict[str, Any]:
    """One policy on the first ``jobs`` jobs of a trace: the gang policies on the time-slice model
    (MPL ``mpl``, T ``slice_s``, C = 0, Q unlimited), EASY and MEASY on the two-tier model (the MEASY
    paper's, with its CPU-usage rule). Besides the usual metrics, the paper-004 slowdown
    ``max(response, T) / max(execution, T)`` of every policy, so the two families compare on one scale.
    ``trace``: a path, or a file name in the trace folder (:mod:`vmctl.experiments.inputs`)."""
    import math as _math

    from vmctl.experiments.inputs import trace_file
    from vmctl.experiments.sweep import WorkloadSpec, build_workload, make_config
    from vmctl.policies.registry import create_policy
    from vmctl.sim.engine import Simulator
    from vmctl.sim.timeslice import TimeSliceModel

    t0, c0 = time.perf_counter(), time.process_time()
    spec = WorkloadSpec(trace=trace_file(trace), jobs=jobs, seed=seed)
    built = build_workload(spec)
    gang = policy in POLICIES
    pol = create_policy(policy, mpl=mpl, slice=slice_s) if gang else create_policy(policy)
    cfg = make_config(spec, seed, execution=(lambda: TimeSliceModel(mpl, slice_s)) if gang else None)
    sim = Simulator(built.jobs, built.cores, pol, cfg, source=built.source, dropped=built.dropped)
    res = sim.run()
    execution = {str(j.id): min(j.run_time, j.estimate) for j in built.jobs}
    slowdowns = [max(r["end"] - r["submit"], slice_s) / max(execution[r["id"]], slice_s) for r in sim.job_rows()
                 if not _math.isnan(r["end"])]
    m = res.metrics
    return {"cores": built.cores, "jobs_done": m.jobs, "avg_wait": m.avg_wait, "avg_response": m.avg_response,
            "avg_bounded_slowdown": m.avg_bounded_slowdown, "avg_slowdown_t": sum(slowdowns) / max(1, len(slowdowns)),
            "utilization": m.utilization, "migrations_per_job": res.migrations / max(1, m.jobs),
            "sim_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def traces(jobs: int, out: str, trace_dir: str | None = None, seed: int = 1, workers: int | None = None,
           scheduler: str | None = None, progress: bool = True) -> str:
    """The gang policies against EASY and MEASY on the first ``jobs`` jobs of each of :data:`TRACES` in
    ``trace_dir`` (default: the trace folder, :func:`vmctl.experiments.inputs.trace_dir`); writes
    ``OUT/traces.md``."""
    from pathlib import Path

    from vmctl.experiments.inputs import trace_cells_paths
    from vmctl.experiments.runner import grid, run_grid, writable_dir

    paths = trace_cells_paths(trace_dir, TRACES)
    where = writable_dir(out)
    table = where / "traces.parquet"
    res = run_grid(grid(trace_cell, {"jobs": jobs, "seed": seed}, trace=paths, policy=list(TRACE_POLICIES)),
                   table, workers=workers, scheduler=scheduler, progress=progress, label="traces")
    _raise_failed(res.rows, table)
    lines = [f"Real traces, first {jobs:,} jobs each, seed {seed}; gang policies at MPL 5, T = 200 s, C = 0, "
             "Q unlimited", "",
             "| trace | cores | policy | avg wait (s) | avg bounded slowdown | slowdown (T = 200 s) | utilization "
             "| migrations/job |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in res.rows:
        lines.append(f"| {Path(str(r['trace'])).name.split('-cln')[0]} | {r['cores']} | {r['policy']} | "
                     f"{r['avg_wait']:,.0f} | {r['avg_bounded_slowdown']:.2f} | {r['avg_slowdown_t']:.2f} | "
                     f"{r['utilization']:.3f} | {r['migrations_per_job']:.2f} |")
    doc = "\n".join(lines) + "\n"
    (where / "traces.md").write_text(doc, encoding="utf-8")
    return doc


# ------------------------------------------------------------------------------ the job-size study (issue 26)

#: the study's policies: (label, policy, backfill)
STUDY_POLICIES = (("GS", "gs", "easy"), ("GS+M", "gs-m", "easy"), ("BGS", "bgs", "easy"),
                  ("BGS+M", "bgs-m", "easy"), ("BGS-cons", "bgs", "conservative"))
#: the study's calibration grid of offered loads (every policy saturates before 1.5)
STUDY_LOADS = (0.6, 0.8, 1.0, 1.2, 1.5)
#: paper 004's saturation utilizations (Table 1's highest rho of each policy, sec. 4's text)
PAPER_SATURATION = {"GS": 0.85, "GS+M": 0.94, "BGS": 0.95, "BGS+M": 0.97}
_PAPER_KEY = {"GS": "gs", "GS+M": "gs-m", "BGS": "bgs", "BGS+M": "bgs-m"}


def study_cells(jobs: int, seeds: Sequence[int], models: Sequence[str] = STUDY_MODELS,
                loads: Sequence[float] = STUDY_LOADS) -> list[Any]:
    """The study's grid: every model x seed x policy (:data:`STUDY_POLICIES`) x offered load, at 320
    processors, MPL 5, T = 200 s, C = 0, Q unlimited."""
    from vmctl.experiments.runner import grid

    fixed = {k: v for k, v in _fixed(jobs, 1).items() if k != "seed"}
    out: list[Any] = []
    for seed in seeds:  # seed slowest: an interrupted run has whole seeds
        for _label, policy, backfill in STUDY_POLICIES:
            out += grid(gang_cell, {**fixed, "policy": policy, "backfill": backfill, "seed": seed},
                        model=list(models), load=list(loads))
    return out


def study(jobs: int, out: str, seeds: Sequence[int] = (1, 2, 3), models: Sequence[str] = STUDY_MODELS,
          loads: Sequence[float] = STUDY_LOADS, workers: int | None = None, scheduler: str | None = None,
          progress: bool = True) -> str:
    """Run the job-size study (resumable, ``OUT/study.parquet``), write ``OUT/study.md`` and return it."""
    from vmctl.experiments.runner import run_grid, writable_dir

    where = writable_dir(out)
    table = where / "study.parquet"
    res = run_grid(study_cells(jobs, seeds, models, loads), table, workers=workers, scheduler=scheduler,
                   progress=progress, label="gang study")
    _raise_failed(res.rows, table)
    doc = study_markdown(res.rows)
    (where / "study.md").write_text(doc, encoding="utf-8")
    return doc


def _label(row: Mapping[str, Any]) -> str:
    for label, policy, backfill in STUDY_POLICIES:
        if row["policy"] == policy and (not policy.startswith("bgs") or row.get("backfill", "easy") == backfill):
            return label
    raise ValueError(f"not a study row: {row['policy']}")


def interp_curve(points: Sequence[tuple[float, float]], x: float) -> float:
    """Linear interpolation of ``points`` (sorted by x) at ``x``, clamped to the ends."""
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y1
    return pts[-1][1]


def load_for(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The offered load where a measured (load, utilization) curve first reaches ``target`` (its
    non-decreasing envelope, interpolated); None if it never does (the policy saturates below)."""
    if max(u for _x, u in curve) < target:
        return None
    return loads_for_targets(curve, [target])[0]


def study_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The study's numbers from its rows: per model, label and seed the curves; per model and label the
    saturation utilizations (steady and end-to-end, mean and 95 % half width over seeds); per model the
    seeds where BGS saturates below GS+M; per model, workload and label the slowdown at the policy's
    own calibration and at BGS+M's."""
    from vmctl.sim.metrics import replication_interval

    curves: dict[tuple[str, str, int], list[Mapping[str, Any]]] = {}
    for r in rows:
        curves.setdefault((str(r["model"]), _label(r), int(r["seed"])), []).append(r)
    models = sorted({k[0] for k in curves}, key=lambda m: STUDY_MODELS.index(m) if m in STUDY_MODELS else 99)
    seeds = sorted({k[2] for k in curves})
    labels = [lab for lab, _p, _b in STUDY_POLICIES if any(k[1] == lab for k in curves)]

    def ci(xs: Sequence[float]) -> tuple[float, float]:
        m, hw = replication_interval(list(xs))
        return m, (hw if hw is not None else float("nan"))

    sat: dict[tuple[str, str], dict[str, tuple[float, float]]] = {}
    per_seed: dict[tuple[str, str], list[float]] = {}
    for mo in models:
        for lab in labels:
            steady = [max(float(r["steady_utilization"]) for r in curves[(mo, lab, s)]) for s in seeds]
            e2e = [max(float(r["utilization"]) for r in curves[(mo, lab, s)]) for s in seeds]
            pro = [max(float(r.get("steady_prorated") or 0.0) for r in curves[(mo, lab, s)]) for s in seeds]
            per_seed[(mo, lab)] = steady
            sat[(mo, lab)] = {"steady": ci(steady), "end_to_end": ci(e2e), "prorated": ci(pro)}
    order = {mo: sum(b < g for b, g in zip(per_seed[(mo, "BGS")], per_seed[(mo, "GS+M")], strict=True))
             for mo in models if (mo, "BGS") in per_seed and (mo, "GS+M") in per_seed}
    # slowdown at a workload's utilization: the policy's own calibration (its steady curve reaching the
    # paper's rho of that policy and row) and BGS+M's (BGS+M's curve reaching the row's target)
    calib: dict[tuple[str, int, str], dict[str, tuple[float, float] | None]] = {}
    for mo in models:
        for w in range(9):
            for lab in labels:
                own: list[float] = []
                at_bgsm: list[float] = []
                paper_rho = PAPER_TABLE1[w][_PAPER_KEY.get(lab, "bgs")][0]
                for s in seeds:
                    rs = curves[(mo, lab, s)]
                    util = [(float(r["load"]), float(r["steady_utilization"])) for r in rs]
                    slow = [(float(r["load"]), float(r["avg_slowdown"])) for r in rs]
                    x = load_for(util, paper_rho)
                    if x is not None:
                        own.append(interp_curve(slow, x))
                    ref = [(float(r["load"]), float(r["steady_utilization"])) for r in curves[(mo, "BGS+M", s)]]
                    xb = load_for(ref, target_utilization(w))
                    if xb is not None:
                        at_bgsm.append(interp_curve(slow, xb))
                calib[(mo, w, lab)] = {"own": ci(own) if len(own) == len(seeds) else None,
                                       "bgsm": ci(at_bgsm) if len(at_bgsm) == len(seeds) else None}
    sizes = {mo: (sum(float(r["mean_size"]) for r in rows if r["model"] == mo)
                  / max(1, sum(1 for r in rows if r["model"] == mo)),
                  sum(float(r["serial_share"]) for r in rows if r["model"] == mo)
                  / max(1, sum(1 for r in rows if r["model"] == mo))) for mo in models}
    jobs = sorted({int(r["jobs"]) for r in rows})
    return {"models": models, "seeds": seeds, "labels": labels, "saturation": sat, "per_seed": per_seed,
            "bgs_below_gsm": order, "calibration": calib, "sizes": sizes, "jobs": jobs,
            "loads": sorted({float(r["load"]) for r in rows}), "curves": curves}


def study_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """The study as Markdown: saturation table (ours beside the paper's), the BGS / GS+M order per
    seed, slowdown at each policy's own calibration beside BGS+M's, and the load curves."""
    sm = study_summary(rows)
    models, seeds, labels = sm["models"], sm["seeds"], sm["labels"]

    def f(v: tuple[float, float] | None, fmt: str = ".2f") -> str:
        return "-" if v is None else f"{v[0]:{fmt}} +- {v[1]:{fmt}}"

    lines = [f"Job-size study: {'/'.join(f'{j:,}' for j in sm['jobs'])} jobs per run, 320 processors, MPL 5, "
             f"T = 200 s, C = 0, Q unlimited; seeds {', '.join(map(str, seeds))}; offered loads "
             f"{', '.join(f'{x:g}' for x in sm['loads'])}. Mean +- 95 % half width over the seeds. Steady-state "
             f"utilization: the window from the {WARMUP_FRACTION:.0%} arrival to the last arrival.", "",
             "### Saturation utilization (the highest over the load grid)", "",
             "| model | mean size | serial | policy | steady rho (metered) | end-to-end rho | steady, prorated "
             "| paper |",
             "|---|---|---|---|---|---|---|---|"]
    for mo in models:
        size, serial = sm["sizes"][mo]
        for lab in labels:
            sat = sm["saturation"][(mo, lab)]
            paper = PAPER_SATURATION.get(lab)
            lines.append(f"| {mo} | {size:.1f} | {serial:.0%} | {lab} | {f(sat['steady'], '.3f')} | "
                         f"{f(sat['end_to_end'], '.3f')} | {f(sat['prorated'], '.3f')} | "
                         f"{'-' if paper is None else f'{paper:.2f}'} |")
    lines += ["", "BGS saturates below GS+M (steady) in: " + "; ".join(
        f"{mo} {k}/{len(seeds)} seeds" for mo, k in sm["bgs_below_gsm"].items()) + " (paper: BGS 0.95 above GS+M 0.94)",
        "", "### Slowdown at each policy's own calibration / at BGS+M's", "",
        "Own: the load where the policy's steady utilization reaches the paper's rho for that policy and row; "
        "BGS+M's: the load where BGS+M reaches the row's target (Table 1's method). Slowdown interpolated "
        "linearly on the load grid; '-': some seed's curve never reaches that utilization.", ""]
    for mo in models:
        lines += [f"**{mo}**", "", "| wl | " + " | ".join(f"{lab} own | {lab} at BGS+M" for lab in labels)
                  + " | paper GS / GS+M / BGS / BGS+M |", "|---" * (2 + 2 * len(labels)) + "|"]
        for w in range(9):
            cells = []
            for lab in labels:
                c = sm["calibration"][(mo, w, lab)]
                cells += [f(c["own"], ".1f"), f(c["bgsm"], ".1f")]
            p = PAPER_TABLE1[w]
            lines.append(f"| {w} | " + " | ".join(cells) + " | "
                         + " / ".join(f"{p[k][1]:g}" for k in ("gs", "gs-m", "bgs", "bgs-m")) + " |")
        lines.append("")
    lines += ["### Curves: steady rho / slowdown per offered load (mean over seeds)", "",
              "| model | policy | " + " | ".join(f"load {x:g}" for x in sm["loads"]) + " |",
              "|---" * (2 + len(sm["loads"])) + "|"]
    for mo in models:
        for lab in labels:
            cells = []
            for x in sm["loads"]:
                rs = [r for s in seeds for r in sm["curves"][(mo, lab, s)] if float(r["load"]) == x]
                u = sum(float(r["steady_utilization"]) for r in rs) / len(rs)
                sl = sum(float(r["avg_slowdown"]) for r in rs) / len(rs)
                cells.append(f"{u:.2f} / {sl:.1f}")
            lines.append(f"| {mo} | {lab} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
