"""Replay an exported history (:mod:`vmctl.whatif.export`) under other policies on a model of the cluster
it came from, and compare with what actually happened (``vmctl whatif``, ``bench/whatif.py``).

The model of the cluster (the side file's ``cluster``: the nodes at export time). Each policy runs on
the execution model of its family, chosen from what it needs (``policy.needs``), the same models
``vmctl sim`` runs:

- capped shared VMs (vcsched, paper 003): the default engine on ``cores_per_node`` cores per node, a
  job's CPU need its ``cpu_need``;
- the timeslice discipline (gang, paper 004): :class:`~vmctl.sim.timeslice.TimeSliceModel` with the
  policy's ``mpl`` rows and ``slice``;
- task bags (dispatch, paper 001): :class:`~vmctl.sim.exec_taskbag.TaskBagModel` on the nodes' speeds
  and groups with the cluster's levels (its layout; a ``shared`` layout of 2 workers per core when the
  cluster has another);
- moldable jobs (HSRET, paper 002): :class:`~vmctl.sim.exec_moldable.MoldableModel` on the nodes'
  speeds and groups, one level;
- anything else (the EASY family, paper 000): the two-tier fg/bg model (every core speed 1: that model
  has no node speeds).

Node speeds and groups need the same core count on every node (``cores_per_node``); a cluster of mixed
node sizes is modelled as one-core nodes of each node's speed and group. A job whose shape the policy
does not schedule (a task bag under EASY) replays as a rigid job at the width it ran at for its work; a
rigid job under a dispatch policy (which schedules bags only) replays as a bag of one task per process.
A job's CPU usage is the one it was submitted with, else 100 % (vmctld does not measure it).

Progress of a two-tier run (``progress``): ``cpu-share`` (default) -- a process advances at the share of
its core it gets over its CPU usage, fg before bg (:func:`vmctl.cpushare.share_core`: a bg process
gets the cycles the fg one leaves, ``min(1, (1 - u_fg) / u_bg)``), with no context-switch loss and no
preemption penalty: the rule vmctld's agents apply (the mock backend exactly; ``ProgressModel`` with loss
0, beta 1 and the bg threshold at 1); ``paper`` -- MEASY sec. 3.2's measured model (:mod:`vmctl.progress`:
per-job loss 0.5-4 %, bg efficiency beta 0.2-0.92, no bg progress above 96 % fg usage), the hardware
of the paper. bench/whatif.py measured the difference (docs/operations.md).

Boot delays (``boot``; the side file's per-job ``boot``, vmctld's measured start delay of a job's first
run: its decision to start the run to the agents' first report of every process running -- a real
host's guest boot, seconds to minutes under load; a mock host's control-loop pass). Reading chosen: a
job holds its cores for its boot before its work starts (:func:`vmctl.sim.workloads.swf.read_swf`'s
``boot``: run time and estimate grow by the boot; a task bag's first task on each worker it can start
with, a moldable job's time at every width), under **every** policy replayed, the one in force and the
others alike (``boot="own"``, default): a job's own measured boot, and the median of the history's
boots for a job without one (started before vmctld kept them). The other policies then differ from the
policy in force by their decisions only, not by the boot model. What this does not know: where a job
would run under another policy -- on a cluster of mixed hosts (a real host among mock ones, as the
fidelity testbed's) a job that booted on the real host keeps its boot wherever the replay places it;
``boot="median"`` gives every job the history's median instead (no job's own placement), ``"none"``
replays without boots. A history without boots (mock hosts before vmctld kept them) replays exactly as
before.

Per-node boots of task bags. A task bag's boot is its workers' start delays, and those depend on the
node each worker ran on (a real host's guest boot against a mock host's control loop). When the side
file has ``node_boots`` (the median first-run boot of the bags' workers on each node; vmctld's
``running`` entry lists ``[node, delay]`` per worker), a replay under a task-bag policy with
``boot="own"`` gives each worker, wherever the replay places it, the boot of its node before its
first task (:class:`vmctl.sim.exec_taskbag.TaskBagModel`'s ``boots``; a node without one: the median
of the others), and the bags take no boot of their own (``read_swf(boot="node")``). ``boot="bag"``
keeps the bag's mean on every worker (the reading before ``node_boots``). The model's cores are the
side file's nodes with cores, in its order (by name), so the boots map by index. Rigid jobs keep
their own boot (a job's boot as the largest of its nodes' boots under another placement is not
modelled).

Gang jobs' boots pass in wall time. A gang job's guest boots only while its row is active, so the boot
vmctld measures (its start to every process running) already holds the slices its row was paused for.
The replay under a gang policy gives each job its boot at rate 1 whichever row is active, then its
work by its row's slices (:class:`vmctl.sim.timeslice.TimeSliceModel`'s ``boots``); before, the boot
was time-sliced again and a gs history with one real-libvirt host replayed +16.5 % long. The other
families replay a gang history's boots as above (no rows there).

Every policy is a cell of the experiment runner (:mod:`vmctl.experiments.runner`): ``replay_cell``
reads the trace (SWF + side file) itself, so the cells run on any Dask worker.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vmctl.errors import ValidationError

#: the metrics of a replay and of the actual run, in the order the table shows them
METRICS = ("avg_response", "avg_wait", "avg_bounded_slowdown", "utilization", "migrations", "deadlines_met")


def family(policy: str) -> str:
    """``vcsched``, ``gang``, ``task-bag``, ``moldable`` or ``easy`` (module docstring)."""
    from vmctl.model import Discipline
    from vmctl.policies.registry import policy_class

    needs = policy_class(policy).needs
    if needs.shared_vms:
        return "vcsched"
    if Discipline.TIMESLICE in needs.disciplines:
        return "gang"
    if "task-bag" in needs.shapes:
        return "task-bag"
    if "moldable" in needs.shapes:
        return "moldable"
    return "easy"


def _node_model(cluster: Mapping[str, Any]) -> tuple[int, list[float], int, list[str]]:
    """(cores, per-core speeds, cores per node, per-node groups) of the side file's cluster."""
    nodes = [n for n in cluster.get("nodes", ()) if int(n.get("cores") or 0) > 0]
    if not nodes:
        raise ValidationError(field="cluster.nodes", problem="the cluster has no node with cores to replay on")
    sizes = {int(n["cores"]) for n in nodes}
    per = sizes.pop() if len(sizes) == 1 else 1
    speeds = [float(n.get("speed") or 1.0) for n in nodes for _ in range(int(n["cores"]))]
    groups = [str(n.get("group") or "default") for n in nodes for _ in range(int(n["cores"]) // per)]
    return len(speeds), speeds, per, groups


def _core_boots(side: Mapping[str, Any], boot: str) -> list[float]:
    """Per core of the model (:func:`_node_model`'s order: the side file's nodes with cores), its node's
    boot from the side file's ``node_boots`` (a node without one: their median) under ``boot="own"`` (or
    ``"node"``); empty when the side file has none or ``boot`` is another reading (module docstring)."""
    nb = side.get("node_boots")
    if boot not in ("own", "node") or not isinstance(nb, Mapping) or not nb:
        return []
    vals: dict[str, float] = {}
    for name, b in nb.items():
        if isinstance(b, bool) or not isinstance(b, int | float) or not (math.isfinite(b) and b >= 0):
            raise ValidationError(field=f"node_boots.{name}", problem=f"must be a number >= 0, got {b!r}")
        vals[str(name)] = float(b)
    med = float(np.median(list(vals.values())))
    nodes = [n for n in side["cluster"].get("nodes", ()) if int(n.get("cores") or 0) > 0]
    return [vals.get(str(n.get("name")), med) for n in nodes for _ in range(int(n["cores"]))]


def _levels(cluster: Mapping[str, Any]) -> int:
    lay = cluster.get("layout") or {}
    if lay.get("discipline") == "shared" and int(lay.get("levels") or 0) >= 2:
        return int(lay["levels"])
    return 2


#: the progress models of ``replay`` (module docstring)
PROGRESS = ("cpu-share", "paper")


def progress_model(name: str) -> Any:
    from vmctl.progress import ProgressModel

    if name == "paper":
        return ProgressModel()
    if name == "cpu-share":
        return ProgressModel(loss_low=0.0, loss_high=0.0, beta_single_low=1.0, beta_single_high=1.0,
                             beta_multi_low=1.0, beta_multi_high=1.0, beta_multi_mean=1.0, beta_multi_sigma=0.0,
                             bg_threshold=1.0)
    raise ValidationError(field="--progress", problem=f"must be one of {', '.join(PROGRESS)}, got {name!r}")


def clock_phase(policy: str, params: Mapping[str, Any], unix_start: float) -> float:
    """Where trace time 0 falls in the cycle of the policy's clock-aligned decisions, in seconds: the
    replay runs the trace this much later so that its slots and slices fall where vmctld's did (0 for a
    policy with none).

    vmctld's gang schedule starts its slices at multiples of ``slice`` of the daemon's clock (Unix
    seconds, epoch 0), and the row of a slice is ``order[k mod len(order)]`` for the k-th slice since
    then; the moldable policy decides at multiples of ``slot``. A replay starts its clock at trace
    time 0 (the first submit, ``UnixStartTime``), so unaligned the replay's slices and slots are a
    random phase away from the live ones: up to a slice for each start (gs: median 48 s, p90 105 s of
    100-s slices before). The cycle of a gang schedule with up to ``mpl`` rows in use repeats every
    ``slice x lcm(1..mpl)`` seconds (every order length has the same phase then)."""
    from vmctl.policies.registry import policy_class

    fam = family(policy)
    known = policy_class(policy).parameters
    if fam == "gang":
        period = float(params.get("slice", known["slice"][1] if "slice" in known else 0.0))
        rows = int(params.get("mpl", known["mpl"][1] if "mpl" in known else 1))
        period *= math.lcm(*range(1, max(1, rows) + 1))
    elif fam == "moldable" and "slot" in known:
        period = float(params.get("slot", known["slot"][1]))
    else:
        return 0.0
    if not (period > 0 and math.isfinite(period)):
        return 0.0
    return float(math.fmod(float(unix_start), period))


def boot_summary(trace: str | Path) -> dict[str, Any]:
    """The side file's boot delays (module docstring): how many jobs have one, their median, mean and
    largest (seconds; None without any), and ``node_boots`` when the side file has them."""
    from vmctl.sim.workloads.swf import read_side_file

    side = read_side_file(trace)
    b = [float(e["boot"]) for e in (side or {}).get("jobs", {}).values()
         if isinstance(e, dict) and isinstance(e.get("boot"), int | float) and not isinstance(e.get("boot"), bool)]
    if not b:
        return {"jobs": 0, "median": None, "mean": None, "max": None}
    out: dict[str, Any] = {"jobs": len(b), "median": float(np.median(b)), "mean": float(np.mean(b)),
                           "max": float(max(b))}
    nb = (side or {}).get("node_boots")
    if isinstance(nb, Mapping) and nb:  # only then (the summary is unchanged without them)
        out["node_boots"] = dict(nb)
    return out


def replay(trace: str | Path, policy: str, params: Mapping[str, Any], seed: int = 1,
           progress: str = "cpu-share", slice_loss: float = 0.0, boot: str = "own") -> dict[str, Any]:
    """One policy over the exported trace on the model of its cluster: the metrics of :data:`METRICS`
    (with ``ci_`` half widths where the batch means give them) and ``jobs``: SWF number -> [first start,
    end] (trace seconds; NaN when it did not end).

    ``slice_loss`` (gang family only; seconds, default 0): what a job loses of each of its active slices
    to the row switch -- the agents switch rows on their own clock a reconcile pass after the boundary
    (the leaving row's VMs are turned down first, the arriving row's resumed after), so a live job
    advances for about ``slice - slice_loss`` seconds per active slice. The replay runs each gang job's
    work (and estimate) times ``slice / (slice - slice_loss)``. Negligible on a real-time clock (a pass
    is a fraction of a second against slices of minutes); on the fidelity testbed's accelerated clock
    it is measured from the agents' logs (:mod:`vmctl.whatif.fidelity`) and decides on which side of a
    slice boundary an end falls: a job that misses the end of its slice by a second ends a cycle later.

    ``boot``: how the side file's boot delays apply (``own``, ``bag``, ``median``, ``none``; module
    docstring)."""
    from vmctl.policies.registry import create_policy, policy_class
    from vmctl.sim.engine import SimConfig, Simulator
    from vmctl.sim.workloads.swf import job_boots, read_side_file, read_swf

    side = read_side_file(trace)
    if side is None:
        raise ValidationError(field="trace", problem=f"{trace} has no side file ({trace}.vmctl.json): "
                                                     "export it with vmctl history export")
    cores, speeds, per, groups = _node_model(side["cluster"])
    fam = family(policy)
    core_boots = _core_boots(side, boot) if fam == "task-bag" else []
    read_mode = "node" if core_boots else ("own" if boot == "bag" else boot)
    wl = read_swf(trace, max_procs=cores * _levels(side["cluster"]), boot=read_mode)
    bags = frozenset(str(k) for k, s in wl.shapes.items() if s.kind == "task-bag")  # they take node boots
    from vmctl.model import JobShape
    needs = policy_class(policy).needs
    entries: Mapping[str, Any] = side["jobs"]
    jobs = []
    shapes: dict[str, Any] = {}
    for j in wl.jobs:
        e = entries.get(str(j.id), {})
        shape = wl.shapes.get(j.id)
        if shape is not None and shape.kind == "task-bag" and shape.max_workers > cores:
            # the engine drops a job wider than the cores; vmctld's dispatcher may give such a bag workers
            # on both levels of a core: the replay caps the bag at one worker per core
            shape = JobShape.task_bag(list(shape.tasks), cores, shape.task_usage)
            j = dataclasses.replace(j, procs=cores, run_time=shape.time_at(cores))
        if shape is not None and shape.kind not in needs.shapes:
            width = int(e.get("width") or j.procs)
            j = dataclasses.replace(j, procs=min(width, cores), run_time=shape.time_at(
                min(max(width, shape.min_width), shape.max_width)))
            shape = None
        if shape is None and fam == "task-bag":
            # the dispatch policies schedule bags only: a rigid job of n processes replays as a bag of n
            # tasks of its work on up to n workers (its processes are independent there)
            shape = JobShape.task_bag([j.run_time] * j.procs, min(j.procs, cores),
                                      max(j.cpu_usage) if j.cpu_usage else 1.0)
            j = dataclasses.replace(j, procs=min(j.procs, cores), run_time=shape.time_at(min(j.procs, cores)))
        if shape is not None:
            shapes[str(j.id)] = shape
        if fam == "vcsched":
            need = float(e.get("cpu_need") or 1.0)
            j = dataclasses.replace(j, cpu_usage=(need,) * j.procs)
        jobs.append(j)
    phase = clock_phase(policy, params, float(side.get("unix_start_time") or 0.0))
    # a gang job's measured boot holds the slices its row was paused for: it passes in wall time (module docstring)
    gang_boots = job_boots(trace, read_mode) if fam == "gang" else {}
    if slice_loss and fam == "gang":
        known = policy_class(policy).parameters
        period = float(params.get("slice", known["slice"][1] if "slice" in known else 0.0))
        if not 0.0 <= slice_loss < period:
            raise ValidationError(field="slice_loss", problem=f"{slice_loss} s must be in [0, {period:g}) "
                                                              "(the slice)")
        f = period / (period - slice_loss)
        # a job's boot passes in wall time (below): only its work loses to the row switches
        jobs = [dataclasses.replace(j, run_time=(j.run_time - gang_boots.get(str(j.id), 0.0)) * f
                                    + gang_boots.get(str(j.id), 0.0),
                                    estimate=(j.estimate - gang_boots.get(str(j.id), 0.0)) * f
                                    + gang_boots.get(str(j.id), 0.0)) for j in jobs]
    if phase:
        jobs = [dataclasses.replace(j, submit=j.submit + phase,
                                    deadline=None if j.deadline is None else j.deadline + phase) for j in jobs]
    pol = create_policy(policy, **params)
    execution: Callable[[], Any] | None = None
    cfg_kw: dict[str, Any] = {}
    if fam == "vcsched":
        cfg_kw["cores_per_node"] = per
    elif fam == "gang":
        from vmctl.sim.timeslice import TimeSliceModel

        known = policy_class(policy).parameters
        levels = int(params.get("mpl", known["mpl"][1] if "mpl" in known else 2))
        period = float(params.get("slice", known["slice"][1] if "slice" in known else 200.0))
        execution = lambda: TimeSliceModel(levels, period, boots=gang_boots)  # noqa: E731
    elif fam in ("task-bag", "moldable"):
        from vmctl.sim.exec_moldable import MoldableModel
        from vmctl.sim.exec_taskbag import TaskBagModel

        cls = TaskBagModel if fam == "task-bag" else MoldableModel
        lv = _levels(side["cluster"]) if fam == "task-bag" else 1
        if core_boots:
            execution = lambda: TaskBagModel(shapes, speeds=speeds, cores_per_node=per, groups=groups,  # noqa: E731
                                             levels=lv, boots=core_boots, booted=bags)
        else:
            execution = lambda: cls(shapes, speeds=speeds, cores_per_node=per, groups=groups, levels=lv)  # noqa: E731
    cfg = SimConfig(seed=seed, cpu_usage="paper", execution=execution, progress=progress_model(progress), **cfg_kw)
    sim = Simulator(jobs, cores, pol, cfg, source=str(trace), dropped=wl.dropped)
    res = sim.run()
    m = res.metrics
    per_job: dict[str, list[float]] = {}
    met = total = 0
    for row in sim.job_rows():
        per_job[str(row["id"])] = [float(row["start"]) - phase, float(row["end"]) - phase]
        d = entries.get(str(row["id"]), {}).get("deadline")
        if d is not None:
            total += 1
            met += bool(float(row["end"]) - phase <= float(d) + 1e-6)
    return {
        "family": fam, "cores": cores, "jobs": res.jobs, "avg_response": m.avg_response, "avg_wait": m.avg_wait,
        "avg_bounded_slowdown": m.avg_bounded_slowdown, "utilization": m.utilization,
        "migrations": res.migrations, "deadlines_met": met / total if total else None,
        "ci_avg_response": None if m.ci_response is None else m.ci_response.half_width,
        "ci_avg_wait": None if m.ci_wait is None else m.ci_wait.half_width,
        "ci_avg_bounded_slowdown": None if m.ci_bounded_slowdown is None else m.ci_bounded_slowdown.half_width,
        "jobs_json": json.dumps(per_job), "clock_phase": phase, "slice_loss": slice_loss if fam == "gang" else 0.0,
    }


def replay_cell(trace: str, policy: str, params: str, seed: int, progress: str = "cpu-share",
                boot: str = "own") -> dict[str, Any]:
    """:func:`replay` as an experiment cell (``params``: the policy parameters as JSON)."""
    return replay(trace, policy, json.loads(params), seed, progress, boot=boot)


def actual(trace: str | Path) -> dict[str, Any]:
    """What happened: the metrics of :data:`METRICS` over the jobs of the trace that ran (the side
    file's exact times; work and width as a replay uses them), and ``jobs``: SWF number -> [first
    start, end]."""
    from vmctl.sim import metrics as metrics_mod
    from vmctl.sim.workloads.swf import read_side_file

    side = read_side_file(trace)
    if side is None:
        raise ValidationError(field="trace", problem=f"{trace} has no side file")
    cores = _node_model(side["cluster"])[0]
    rows = [(k, e) for k, e in side["jobs"].items() if e.get("start") is not None and e.get("end") is not None]
    if not rows:
        raise ValidationError(field="trace", problem=f"no job of {trace} ever ran")
    sub = np.array([float(e["submit"]) for _, e in rows])
    st = np.array([float(e["start"]) for _, e in rows])
    en = np.array([float(e["end"]) for _, e in rows])
    run = np.array([float(e.get("work") or (float(e["end"]) - float(e["start"]))) for _, e in rows])
    procs = np.array([float(e.get("width") or e.get("procs") or 1) for _, e in rows])
    # a moldable job's work is its forecast at its requested width; the cores it held: its width x its run
    held = np.array([(float(e["end"]) - float(e["start"])) * float(e.get("width") or 1)
                     if (e.get("shape") or {}).get("kind") == "moldable" else np.nan for _, e in rows])
    m = metrics_mod.compute(sub, st, en, run, procs, cores, core_time=held)
    dl = [(float(e["end"]), float(e["deadline"])) for _, e in rows if e.get("deadline") is not None]
    return {
        "family": "", "cores": cores, "jobs": len(rows), "avg_response": m.avg_response, "avg_wait": m.avg_wait,
        "avg_bounded_slowdown": m.avg_bounded_slowdown, "utilization": m.utilization,
        "migrations": sum(int(e.get("migrations") or 0) for _, e in rows),
        "deadlines_met": sum(end <= d + 1e-6 for end, d in dl) / len(dl) if dl else None,
        "ci_avg_response": None if m.ci_response is None else m.ci_response.half_width,
        "ci_avg_wait": None if m.ci_wait is None else m.ci_wait.half_width,
        "ci_avg_bounded_slowdown": None if m.ci_bounded_slowdown is None else m.ci_bounded_slowdown.half_width,
        "jobs_json": json.dumps({k: [float(e["start"]), float(e["end"])] for k, e in rows}),
    }


def error(sim: Mapping[str, Any], act: Mapping[str, Any], submits: Mapping[str, float]) -> dict[str, Any]:
    """The simulator's error on the policy that was in force: on the means (simulated - actual, and
    relative to the actual mean response) and per job (start and response differences, simulated -
    actual: mean, median, 90th percentile and largest absolute value) over the jobs both ran, and
    ``per_job``: each job's (SWF number) simulated and actual start and response."""
    sj: Mapping[str, Sequence[float]] = json.loads(sim["jobs_json"])
    aj: Mapping[str, Sequence[float]] = json.loads(act["jobs_json"])
    common = [k for k in aj if k in sj and not math.isnan(sj[k][1])]
    ds = np.array([sj[k][0] - aj[k][0] for k in common])
    dr = np.array([(sj[k][1] - submits[k]) - (aj[k][1] - submits[k]) for k in common])

    def summary(x: np.ndarray) -> dict[str, float | None]:
        if x.size == 0:
            return {"mean": None, "median": None, "p90_abs": None, "max_abs": None}
        return {"mean": float(x.mean()), "median": float(np.median(x)), "p90_abs": float(np.percentile(np.abs(x), 90)),
                "max_abs": float(np.abs(x).max())}

    means = {k: (None if sim.get(k) is None or act.get(k) is None else float(sim[k]) - float(act[k]))
             for k in METRICS}
    a_resp = float(act["avg_response"])
    per_job = [{"job": k, "start_simulated": sj[k][0], "start_actual": aj[k][0],
                "response_simulated": sj[k][1] - submits[k], "response_actual": aj[k][1] - submits[k]} for k in common]
    return {"jobs_compared": len(common), "means": means, "per_job": per_job,
            "avg_response_relative": (float(sim["avg_response"]) - a_resp) / a_resp if a_resp > 0 else None,
            "start": summary(ds), "response": summary(dr)}
