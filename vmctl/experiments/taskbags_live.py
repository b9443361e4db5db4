"""Paper 001's testbed, for real: vmctld and mock agents as processes, task bags submitted through the
client library at the sample's arrival times, compared with the simulator on the same sample.

``python -m vmctl.experiments.taskbags_live [--trace wagap-2013] [--jobs 40] [--hosts 10] [--speed 2000]
[--policy dispatch-priority] [--param conserving=true] [--task-usage 0.01] [--libvirt-agents 1] [--out DIR]``

The testbed (sec. IV's, as the paper describes it): ``--hosts`` single-core hosts, each a ``vmctl-agent``
process on the mock backend with a ``shared`` layout of 2 workers (equal weights: two busy workers get
half the core each, one alone gets all of it), one ``vmctld`` process (SQLite) running the dispatch
policy, and this process as the client (``vmctl.client``: one independent-task ``Job`` per bag, submitted
at its arrival time). A task is a mock process that runs for its length at the speed of the clock
(and of its host: a mock agent runs its processes at ``host.speed``, as the simulator runs a worker
at its core's speed; the testbed's hosts and the simulator's cores are all of speed 1).

Sleeping tasks (``--task-usage U``, default 0.01). The paper's testbed tasks sleep for their length, so
two on one single-core host both end on time, where two CPU-bound ones would take twice as long. Every
task here has the CPU usage U on both sides: the mock agents' processes demand U of their core
(``Task.cpu_usage`` -> the bag's ``task_usage`` and each task's ``cpu_usage`` -> ``ProcessSpec.cpu_usage``)
and the simulator's bags carry ``JobShape.task_usage`` = U; both split a core among the busy workers'
demands by the same rule (:func:`vmctl.cpushare.share_core`), a task progressing at its allocation over U.
The default 0.01 is the paper's sleeping tasks (two busy workers of one core get 0.01 each: both at full
speed); ``--task-usage 1`` gives CPU-bound tasks (two share the core, half speed each), the runs before
this option. **Time scaling**: vmctld and every agent run on one accelerated clock (``clock: {speed, epoch}``:
``--speed`` model seconds per real second), so hours of trace replay in seconds; every time below is
model time (vmctld's records: submit, first start, end, and each task's worker and times).

Real libvirt (``--libvirt-agents N``): the first N hosts are ``vmctl-agent`` processes on this machine's
libvirtd (it must be running) whose worker VMs boot the SSH guest of
``vmctl.guestimage`` (built and cached in ``--guest-dir``; TCG; a loopback port
forwarded to each VM's SSH) and run each task there over SSH. Real guests run in real time (an agent
config refuses ``clock:`` for libvirt), so a task of w model seconds is the command ``sleep w/speed``
(:func:`task_command`; mock agents ignore it and run ``work_seconds`` on their clock); vmctld's times stay
model time, so what such an agent adds in real seconds counts ``speed`` times. The run prints each
libvirt task's span beyond its sleep (:func:`libvirt_overheads`: the first task of a bag's worker includes
booting its guest, the next ones are the SSH hand-off). Real guests' tasks sleep whatever
``--task-usage`` says (the mock agents and the simulator follow it); each bag's worker boots a guest,
which the simulator side does not model.

The sample (``--trace``): ``synthetic`` (seeded: bags of 1-6 tasks of 100-900 s, priorities 0-3, arrivals
of a Poisson process of rate ``--rate`` per model hour; deadlines 2-6 times the bag's work on one worker)
or ``wagap-2013``: the CERIT-SC 2013 trace as :mod:`vmctl.experiments.taskbags` reads it (one task per
CPU with the job's run time, priority from the queue class, deadline = submit + requested walltime),
sampled with ``--sample`` (1 job in SAMPLE, seeded), restricted to bags that fit the testbed (at most
``2 * hosts`` tasks) and cut to ``--jobs`` consecutive ones from ``--skip``; submit times are shifted to
start at 0. The forecast is exact (a task's work is its run time), on the testbed and in the simulator.

The simulator runs the same bags (:mod:`vmctl.sim`, the task-bag execution model with 2 ``shared`` levels
on ``hosts`` cores of speed 1, the same policy and parameters, each bag's own deadline as ``Job.deadline``,
its exact time at its width as the estimate: the simulator cuts no bag short, as vmctld does not).
Metrics of both: mean response (end - submit), mean wait (first start - submit), the share of bags
ending by their deadline, and the per-bag differences (testbed - simulator). The testbed adds what
the simulator leaves out: the agents' reporting and reconcile delays (each task hand-off waits for a
report, ~0.05-0.2 s real, i.e. ``speed`` times that in model time) and the order of reports.

This module drives processes over HTTP only (``vmctl.localcluster`` starts them, ``vmctl.client``
talks to vmctld; the guest builder and ``virsh`` run as processes): it imports no daemon, agent or store
code.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from vmctl.errors import OutOfRange, ValidationError, VmctlError

TRACES = ("synthetic", "wagap-2013")
#: the default CPU usage of a task: the paper's testbed tasks sleep for their length
SLEEPING = 0.01


@dataclass(frozen=True, slots=True)
class Bag:
    """One job of the sample: arrival (model seconds from the start), its tasks' work (seconds on a
    standard core), priority and deadline (seconds after its arrival)."""

    id: str
    submit: float
    tasks: tuple[float, ...]
    priority: int
    deadline: float


def synthetic(jobs: int, seed: int, rate_per_h: float = 20.0) -> list[Bag]:
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7E57]))
    out: list[Bag] = []
    t = 0.0
    for i in range(jobs):
        n = int(rng.integers(1, 7))
        work = float(rng.uniform(100, 900))
        out.append(Bag(f"b{i}", round(t, 3), (work,) * n, int(rng.integers(0, 4)),
                       round(float(rng.uniform(2, 6)) * work * n, 3)))
        t += float(rng.exponential(3600.0 / rate_per_h))
    return out


def from_trace(trace: str, machines: str, sample: int, seed: int, jobs: int, skip: int, max_tasks: int) -> list[Bag]:
    """The CERIT-SC bags of the module docstring (via :func:`vmctl.experiments.taskbags.build`)."""
    from vmctl.experiments.taskbags import build

    b = build(trace, machines, sample, seed, "homogeneous")
    fit = [j for j in b.jobs if j.procs <= max_tasks][skip:skip + jobs]
    if not fit:
        raise ValidationError(field="--jobs",
                              problem=f"no job of the sample fits {max_tasks} workers after --skip {skip}")
    t0 = fit[0].submit
    return [Bag(str(j.id), j.submit - t0, (min(j.run_time, j.estimate),) * j.procs, j.priority, j.estimate)
            for j in fit]


def max_workers(bag: Bag, hosts: int) -> int:
    """A bag holds at most one worker per task, and lives on one level: at most one per host's core."""
    return min(len(bag.tasks), hosts)


# ---------------------------------------------------------------------------------------------- simulator

def simulate(bags: Sequence[Bag], hosts: int, policy: str, params: Mapping[str, Any],
             task_usage: float = SLEEPING) -> dict[str, dict[str, float]]:
    """Per bag: submit, start, end, deadline (model seconds) in the simulator; every task of CPU usage
    ``task_usage`` (``JobShape.task_usage``)."""
    from vmctl.model import JobShape
    from vmctl.policies.registry import create_policy
    from vmctl.sim.engine import SimConfig, Simulator
    from vmctl.sim.exec_taskbag import TaskBagModel
    from vmctl.sim.workloads.core import WorkloadJob

    # the record's run time is the bag's time at its most workers on standard ones: the model then runs
    # each task for exactly its work (actual factor 1). The estimate is that exact forecast, and the deadline
    # is the bag's own: vmctld kills no bag at a run-time limit, so the estimate must not cap the run (it
    # did when it carried the deadline: a bag of two rounds past its walltime was cut short there)
    widths = [max_workers(b, hosts) for b in bags]
    times = [JobShape.task_bag(list(b.tasks), w).time_at(w) for b, w in zip(bags, widths, strict=True)]
    jobs = [WorkloadJob(id=i + 1, submit=b.submit, run_time=t, procs=w, estimate=t, cpu_usage=None,
                        priority=b.priority, deadline=b.submit + b.deadline)
            for i, (b, w, t) in enumerate(zip(bags, widths, times, strict=True))]
    shapes = {str(i + 1): JobShape.task_bag(list(b.tasks), w, task_usage)
              for i, (b, w) in enumerate(zip(bags, widths, strict=True))}
    pol = create_policy(policy, **params)
    model = TaskBagModel(shapes, levels=2)
    sim = Simulator(jobs, hosts, pol, SimConfig(seed=1, execution=lambda: model), source="taskbags-live")
    sim.run()
    out: dict[str, dict[str, float]] = {}
    for row in sim.job_rows():
        b = bags[int(row["id"]) - 1]
        out[b.id] = {"submit": b.submit, "start": float(row["start"]), "end": float(row["end"]),
                     "deadline": b.submit + b.deadline}
    return out


# ---------------------------------------------------------------------------------------------- testbed

GUEST_DIR = Path("/var/cache/vmctl/guest")
LIBVIRT_URI = "qemu:///system"
LIBVIRT_SOCKET = Path("/run/libvirt/libvirt-sock")


def task_command(work: float, speed: float) -> str:
    """The command of a task of ``work`` model seconds in a real guest: it sleeps ``work / speed`` real
    seconds (the guest's ``sleep`` runs in real time; vmctld's clock runs ``speed`` times faster), then
    prints where it ran (the guest's hostname, its uptime at the start and the end). Mock agents ignore
    it and run the task's ``work_seconds`` on their own accelerated clock."""
    return (f"s=$(cut -d' ' -f1 /proc/uptime); sleep {work / speed:.3f}; "
            "echo \"task $VMCTL_JOB_ID/$VMCTL_PROCESS_INDEX on $(hostname) up $s $(cut -d' ' -f1 /proc/uptime)\"")


def build_guest(guest_dir: Path, log: Any = print) -> None:
    """The SSH guest of the libvirt agents (``python -m vmctl.guestimage build``;
    cached in ``guest_dir``), after checking that libvirtd answers."""
    import subprocess

    if not LIBVIRT_SOCKET.exists():
        raise ValidationError(field="--libvirt-agents",
                              problem=f"libvirtd is not running ({LIBVIRT_SOCKET} is missing): start it "
                                      "(virtlogd -d; libvirtd -d) or run without real-libvirt agents")
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "vmctl.guestimage", "build", str(guest_dir)],
                         capture_output=True, text=True, check=False, timeout=900)
    if res.returncode != 0:
        raise ValidationError(field="--guest-dir", problem=f"the SSH guest cannot be built: {res.stderr.strip()}")
    log(f"{res.stdout.strip()} ({time.monotonic() - t:.1f} s)")


def _libvirt_agent(cfg: dict[str, Any], guest_dir: Path, state_dir: Path, node: str, core: int) -> dict[str, Any]:
    """A mock agent's config turned into a real-libvirt one: its worker VMs boot the SSH guest on ``core``
    of this machine and run their tasks in it."""
    from vmctl.localcluster import free_port_range, ssh_guest_config

    base = free_port_range(2)
    extra = ssh_guest_config(guest_dir, state_dir / f"known_hosts-{node}", base, 2)
    cfg = {k: v for k, v in cfg.items() if k != "clock"}  # real guests run in real time
    cfg["backend"] = {"kind": "libvirt", "uri": LIBVIRT_URI, **extra["backend"]}
    cfg["layout"] = {**cfg["layout"], "cores": [core], **extra["layout"]}
    cfg["ssh"] = extra["ssh"]
    # a booting guest aborts the agent's passes until its SSH answers: retry soon
    cfg["reconcile"] = {"resync_seconds": 1.0, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 0.5}
    return cfg


def testbed(bags: Sequence[Bag], hosts: int, policy: str, params: Mapping[str, Any], speed: float,
            state_dir: Path, timeout_s: float = 1800.0, log: Any = print, libvirt_agents: int = 0,
            guest_dir: Path = GUEST_DIR, tasks: list[dict[str, Any]] | None = None,
            task_usage: float = SLEEPING) -> dict[str, dict[str, float]]:
    """Per bag: submit, start, end, deadline (model seconds from the run's start) on the live testbed.
    The first ``libvirt_agents`` hosts are real-libvirt agents (worker guests on this machine's cores).
    Every task has the CPU usage ``task_usage`` (the mock agents' processes demand that much of a core).
    ``tasks`` (when given) receives every task: bag, index, worker, work, start, end (model seconds)."""
    from vmctl.files import write_cert_files
    from vmctl.localcluster import DaemonProcess, ManagedProcess, agent_config, free_port, start_agent, wait_registered

    if libvirt_agents:
        build_guest(guest_dir, log)
    from vmctl.client import Client, Job, Task
    from vmctl.clock import accelerated_clock

    epoch = time.time()
    clock_cfg = {"speed": speed, "epoch": epoch}
    model = accelerated_clock(speed, epoch)
    daemon = DaemonProcess(state_dir, policy=policy, tick_s=5.0, node_timeout_s=30.0,
                           extra={"clock": clock_cfg, "policy": {"name": policy, "params": dict(params)}})
    agents: list[ManagedProcess] = []
    try:
        daemon.start_and_wait()
        api = daemon.client()
        for h in range(hosts):
            node = f"host{h:02d}"
            crt, key, ca = write_cert_files(state_dir / "pki", node, api.issue_cert(node))
            cfg = agent_config(node, daemon.url, {"cert": str(crt), "key": str(key), "ca": str(ca)}, backend="mock",
                               cores=1, libvirt_uri="", metrics_port=free_port(), clock=clock_cfg,
                               layout={"levels": 2, "discipline": "shared"})
            if h < libvirt_agents:
                cfg = _libvirt_agent(cfg, guest_dir, state_dir, node, h % 2)
            agents.append(start_agent(node, cfg, state_dir))
        wait_registered(api, agents, state_dir)
        client = Client(url=daemon.url, token=daemon.token(), ca=str(daemon.ca_path), poll_interval=0.5,
                        max_poll_interval=2.0)
        t0 = model.now()
        jobs: dict[str, Job] = {}
        log(f"testbed: vmctld + {hosts} agents ready; replaying {len(bags)} bags at {speed:g}x "
            f"({(bags[-1].submit if bags else 0) / speed:.0f} s of arrivals)")
        for b in sorted(bags, key=lambda x: x.submit):
            wait = (t0 + b.submit - model.now()) / speed
            if wait > 0:
                time.sleep(wait)
            job = Job(b.id, max_workers=max_workers(b, hosts), priority=b.priority, deadline=model.now() + b.deadline)
            for w in b.tasks:
                job.add_task(Task(work_seconds=w, command=task_command(w, speed) if libvirt_agents else None,
                                  cpu_usage=task_usage))
            client.submit(job)
            jobs[b.id] = job
        results = client.wait_all(timeout=timeout_s)
        out: dict[str, dict[str, float]] = {}
        for res in results:
            doc = res.raw
            if res.state != "done":
                raise VmctlError(detail=f"bag {res.name} ended {res.state}: {doc.get('reason')}")
            out[res.name] = {"submit": float(doc["submit_time"]) - t0, "start": float(doc["start_time"]) - t0,
                             "end": float(doc["end_time"]) - t0, "deadline": float(doc["deadline"]) - t0}
            if tasks is not None:
                work = {b.id: b.tasks for b in bags}[res.name]
                tasks += [{"bag": res.name, "index": t.index, "worker": t.worker or "", "work": work[t.index],
                           "start": (t.start or t0) - t0, "end": (t.end or t0) - t0} for t in res.tasks]
        return out
    finally:
        for a in agents:
            a.stop()
        daemon.stop()
        if libvirt_agents:
            _remove_guests({f"host{h:02d}" for h in range(libvirt_agents)})


def _remove_guests(nodes: set[str]) -> None:
    """Destroy and undefine the VMs the libvirt agents of ``nodes`` left (their metadata names the node)."""
    import re
    import subprocess

    def virsh(*args: str) -> str:
        return subprocess.run(["virsh", "-c", LIBVIRT_URI, *args], capture_output=True, text=True, check=False,
                              timeout=60).stdout

    for name in virsh("list", "--all", "--name").split():
        m = re.search(r'key="vmctl\.node">([^<]*)<', virsh("dumpxml", "--inactive", name))
        if m is not None and m.group(1) in nodes:
            virsh("destroy", name)
            virsh("undefine", name)


def libvirt_overheads(tasks: Sequence[Mapping[str, Any]], nodes: set[str], speed: float) -> dict[str, Any]:
    """What a task on a real-libvirt worker costs beyond its sleep, in real seconds: vmctld's span of the
    task (handed out -> its end seen in a report) minus ``work / speed``. The first task of a bag on a
    worker waits for its guest to be defined and booted; the next ones are the SSH hand-off alone (the
    agent sees the end in the guest, reports it, gets the next task, starts it over a new SSH session)."""
    first: list[float] = []
    next_: list[float] = []
    seen: set[tuple[str, str]] = set()
    for t in sorted(tasks, key=lambda t: float(t["start"])):
        if str(t["worker"]).partition("/")[0] not in nodes:
            continue
        extra = (float(t["end"]) - float(t["start"]) - float(t["work"])) / speed
        key = (str(t["bag"]), str(t["worker"]))
        (next_ if key in seen else first).append(extra)
        seen.add(key)

    def summary(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {"tasks": 0}
        return {"tasks": len(xs), "median_s": float(np.median(xs)), "p90_s": float(np.percentile(xs, 90)),
                "min_s": float(np.min(xs)), "max_s": float(np.max(xs))}

    return {"first_task_of_a_worker": summary(first), "next_tasks": summary(next_)}


# ---------------------------------------------------------------------------------------------- comparison

def metrics(rows: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    resp = [r["end"] - r["submit"] for r in rows.values()]
    wait = [r["start"] - r["submit"] for r in rows.values()]
    met = [r["end"] <= r["deadline"] + 1e-6 for r in rows.values()]
    return {"bags": len(rows), "mean_response_s": float(np.mean(resp)), "mean_wait_s": float(np.mean(wait)),
            "deadlines_met": float(np.mean(met))}


def compare(live: Mapping[str, Mapping[str, float]], sim: Mapping[str, Mapping[str, float]]) -> dict[str, Any]:
    """Both runs' metrics, their differences (testbed - simulator) and the per-bag response differences."""
    ml, ms = metrics(live), metrics(sim)
    per_bag = [(live[k]["end"] - live[k]["submit"]) - (sim[k]["end"] - sim[k]["submit"]) for k in live]
    return {"testbed": ml, "simulator": ms,
            "difference": {k: ml[k] - ms[k] for k in ml if k != "bags"},
            "response_difference_per_bag_s": {"mean": float(np.mean(per_bag)), "median": float(np.median(per_bag)),
                                              "max_abs": float(np.max(np.abs(per_bag)))}}


def table(result: Mapping[str, Any]) -> str:
    ml, ms, d = result["testbed"], result["simulator"], result["difference"]
    lines = ["| metric | testbed | simulator | difference |", "|---|---:|---:|---:|"]
    for key, label in (("mean_response_s", "mean response (s)"), ("mean_wait_s", "mean wait (s)"),
                       ("deadlines_met", "deadlines met")):
        lines.append(f"| {label} | {ml[key]:.1f} | {ms[key]:.1f} | {d[key]:+.1f} |" if key != "deadlines_met" else
                     f"| {label} | {ml[key]:.0%} | {ms[key]:.0%} | {d[key] * 100:+.0f} pts |")
    pb = result["response_difference_per_bag_s"]
    lv = result.get("libvirt")
    if lv:
        for key, label in (("first_task_of_a_worker", "first task of a worker (guest boot + SSH)"),
                           ("next_tasks", "next tasks (SSH hand-off)")):
            x = lv[key]
            if x["tasks"]:
                lines.append(f"\nreal-libvirt workers, {label}: {x['tasks']} tasks, span - sleep median "
                             f"{x['median_s']:.2f} s real (p90 {x['p90_s']:.2f}, {x['min_s']:.2f}-{x['max_s']:.2f})")
    lines.append(f"\nper bag, response testbed - simulator: mean {pb['mean']:+.1f} s, median {pb['median']:+.1f} s, "
                 f"largest {pb['max_abs']:.1f} s ({ml['bags']} bags)")
    return "\n".join(lines)


def _params(items: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValidationError(field="--param", problem=f"must be KEY=VALUE, got {item!r}")
        out[key] = yaml.safe_load(raw)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from vmctl.experiments.taskbags import MACHINES, TRACE

    ap = argparse.ArgumentParser(prog="python -m vmctl.experiments.taskbags_live", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", choices=TRACES, default="synthetic")
    ap.add_argument("--trace-file", default=TRACE, help=f"wagap-2013: a path, or a file name in $VMCTL_TRACE_DIR "
                                                        f"(default {TRACE}; the folder: ../shared/data/traces beside "
                                                        "the checkout)")
    ap.add_argument("--machines", default=MACHINES, help=f"its machine file, the same way (default {MACHINES})")
    ap.add_argument("--sample", type=int, default=8, help="wagap-2013: keep 1 job in SAMPLE (seeded)")
    ap.add_argument("--skip", type=int, default=0, help="wagap-2013: skip this many fitting jobs of the sample")
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--rate", type=float, default=20.0, help="synthetic: arrivals per model hour")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=10)
    ap.add_argument("--speed", type=float, default=2000.0, help="model seconds per real second")
    ap.add_argument("--policy", default="dispatch-priority")
    ap.add_argument("--param", action="append", default=[], metavar="K=V")
    ap.add_argument("--task-usage", type=float, default=SLEEPING,
                    help=f"CPU usage of every task in (0, 1], on the mock agents and in the simulator "
                         f"(default {SLEEPING:g}: tasks that sleep, as the paper's; 1: CPU-bound)")
    ap.add_argument("--out", type=Path, default=None, help="write result.json (and the logs) here")
    ap.add_argument("--libvirt-agents", type=int, default=0,
                    help="make this many hosts real-libvirt agents whose workers are SSH guests on this machine")
    ap.add_argument("--guest-dir", type=Path, default=GUEST_DIR, help="where the SSH guest is built (cached)")
    a = ap.parse_args(argv)
    try:
        if a.jobs < 1 or a.hosts < 1:
            raise OutOfRange(what="--jobs/--hosts", value=min(a.jobs, a.hosts), allowed=">= 1")
        if not 0 <= a.libvirt_agents <= a.hosts:
            raise OutOfRange(what="--libvirt-agents", value=a.libvirt_agents, allowed=f"0..{a.hosts} (--hosts)")
        if not (a.speed > 0 and math.isfinite(a.speed)):
            raise OutOfRange(what="--speed", value=a.speed, allowed="> 0")
        if not 0 < a.task_usage <= 1:
            raise OutOfRange(what="--task-usage", value=a.task_usage, allowed="0 < u <= 1")
        params = _params(a.param)
        if a.trace == "synthetic":
            bags = synthetic(a.jobs, a.seed, a.rate)
        else:  # the same files from any working directory, checked before anything starts
            from vmctl.experiments.inputs import trace_file, trace_ref

            bags = from_trace(trace_file(trace_ref(a.trace_file, "--trace-file")),
                              trace_file(trace_ref(a.machines, "--machines")), a.sample, a.seed, a.jobs, a.skip,
                              2 * a.hosts)
        sim = simulate(bags, a.hosts, a.policy, params, a.task_usage)
        with tempfile.TemporaryDirectory(prefix="vmctl-taskbags-live-") as tmp:
            state = a.out if a.out is not None else Path(tmp)
            state.mkdir(parents=True, exist_ok=True)
            t = time.monotonic()
            tasks: list[dict[str, Any]] = []
            live = testbed(bags, a.hosts, a.policy, params, a.speed, state / "testbed",
                           libvirt_agents=a.libvirt_agents, guest_dir=a.guest_dir.resolve(), tasks=tasks,
                           task_usage=a.task_usage)
            real = time.monotonic() - t
        result = compare(live, sim) | {"trace": a.trace, "jobs": len(bags), "hosts": a.hosts, "workers": 2 * a.hosts,
                                       "libvirt_agents": a.libvirt_agents, "task_usage": a.task_usage,
                                       "speed": a.speed, "policy": a.policy, "params": params, "real_s": real}
        if a.libvirt_agents:
            result["libvirt"] = libvirt_overheads(tasks, {f"host{h:02d}" for h in range(a.libvirt_agents)}, a.speed)
        print(table(result))
        real_hosts = f", {a.libvirt_agents} on real libvirt" if a.libvirt_agents else ""
        print(f"({a.trace}, {len(bags)} bags, {a.hosts} hosts x 2 workers{real_hosts}, tasks at {a.task_usage:g} "
              f"CPU, {a.policy} {params or ''}, "
              f"clock {a.speed:g}x, {real:.0f} s real)")
        if a.out is not None:
            (a.out / "result.json").write_text(json.dumps({**result, "bags": {"testbed": live, "simulator": sim},
                                                           "tasks": tasks}, indent=1), encoding="utf-8")
        return 0
    except VmctlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
