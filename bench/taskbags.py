"""Benchmarks of vmctld running task bags (paper 001): ``python -m bench.taskbags [--quick]``.

1. **Decision-maker latency**, for each dispatch policy (``dispatch-priority``, ``-proportion``,
   ``-workload``, ``-deadline``): a cluster of 10,000 workers (1,250 nodes x 4 cores x 2 ``shared``
   levels; agents replaced by direct registration), 1,000 task bags (1-200 tasks of 60-3,600 s,
   priorities 0-3, deadlines 1-48 h away), most of them running after a first pass. One event is a
   submission (the decision maker is passive: it runs on submit and when a worker is released); the
   latency is one full pass as vmctld runs it: view + policy + invariant check + actuation (Start,
   Resize, the dispatcher handing out tasks) + the SQLite transaction. Baseline in the same process:
   ``policy.decide`` alone on the same view (the ratio is the daemon's overhead around the policy).
2. **Dispatcher throughput**: task starts per second on mock agents (the real reconciler on the mock
   backend, a ``shared`` layout of 2 workers per core, 10 single-core hosts; a virtual clock, so the
   agents' processes end at once when it advances). Each round: the clock moves past a task's length,
   every agent reconciles and reports, vmctld records the ends and hands out the next tasks. Baseline in
   the same process: the same number of one-process rigid jobs (what vmctld could run before bags: one
   job per task) under FCFS through the same loop. ``--tasks 1000,2000,5000`` runs it at each size (always
   4 bags): a task end writes the task's rows and the bag's dispatcher state (schema 006), so the cost per
   task no longer grows with the bag (before: the bag's whole record, every task's result, per task end).

Wall times are noisy on a shared 2-core machine; nothing is asserted.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.daemon import pct
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.daemon.view import build_view
from vmctl.model import Discipline
from vmctl.policies.registry import create_policy
from vmctl.store import open_store

POLICIES = ("dispatch-priority", "dispatch-proportion", "dispatch-workload", "dispatch-deadline")


def _daemon(tmp: Path, name: str, policy: str, clock: VirtualClock, **params: Any) -> Daemon:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/{name}.db", state_dir=str(tmp / name), holder="bench",
                       tick_s=1e9, node_timeout_s=1e9, kill_at_estimate=False)
    d = Daemon(cfg, open_store(cfg.store_url), clock=clock, policy=create_policy(policy, **params))
    d.start()
    return d


def _bag(rng: random.Random, now: float) -> dict[str, Any]:
    n = rng.randint(1, 200)
    work = rng.uniform(60, 3600)
    return {"shape": {"kind": "task-bag", "tasks": [work] * n}, "procs": n, "estimate": work,
            "priority": rng.randint(0, 3), "deadline": now + rng.uniform(3600, 48 * 3600)}


def decision_latency(policy: str, nodes: int, cores: int, jobs: int, events: int, tmp: Path) -> None:
    clock = VirtualClock(1_000_000.0)
    d = _daemon(tmp, policy, policy, clock, conserving=True)
    t0 = time.perf_counter()
    for i in range(nodes):
        d.register_node(f"n{i:04d}", cores, f"n{i:04d}", "mock", levels=2, discipline=Discipline.SHARED)
    rng = random.Random(1)
    d.submit([_bag(rng, clock.now()) for _ in range(jobs)])
    clock.advance(1)
    d.decide(clock.now())
    running = len(d.state.active())
    setup = time.perf_counter() - t0
    assert d.policy is not None
    lat: list[float] = []
    base: list[float] = []
    for _ in range(events):
        clock.advance(5)
        d.submit([_bag(rng, clock.now())])
        t = time.perf_counter()
        d.decide(clock.now())
        lat.append(time.perf_counter() - t)
        view, _lay = build_view(d.state, clock.now())
        t = time.perf_counter()
        d.policy.decide(view, clock.now())
        base.append(time.perf_counter() - t)
    p50, p99 = pct(lat, 50) * 1e3, pct(lat, 99) * 1e3
    b50, b99 = pct(base, 50) * 1e3, pct(base, 99) * 1e3
    print(f"  {policy:20s} vmctld pass p50 {p50:8.1f} ms  p99 {p99:8.1f} ms | decide only p50 {b50:8.1f} ms  "
          f"p99 {b99:8.1f} ms | ratio p50 {p50 / b50:5.2f}x  ({running} bags running, {len(d.state.queue())} "
          f"queued after the first pass; setup {setup:.0f} s)", flush=True)
    d.close()
    d.store.close()


class _Hosts:
    """``hosts`` single-core mock hosts driven by hand on a virtual clock: a ``shared`` layout of
    ``shared_levels`` workers per core, or (None) the priority fg/bg pair rigid jobs run on."""

    def __init__(self, d: Daemon, clock: VirtualClock, hosts: int, shared_levels: int | None) -> None:
        self.d, self.clock = d, clock
        self.agents: list[tuple[str, Reconciler, MemorySource, MemoryReporter, MockBackend]] = []
        for h in range(hosts):
            name = f"w{h:02d}"
            be = MockBackend(hostname=name, cores=1, clock=clock, uri=f"mock://{name}")
            src, rep = MemorySource(None), MemoryReporter()
            lay = Layout(host=name, cores=(0,)) if shared_levels is None else \
                Layout(host=name, cores=(0,), levels=shared_levels, discipline=Discipline.SHARED)
            self.agents.append((name, Reconciler(be, lay, src, rep, clock=clock, runner=MockProcessRunner(be)),
                                src, rep, be))
            d.register_node(name, 1, name, "mock", levels=lay.levels, discipline=lay.discipline)

    def round(self, dt: float) -> None:
        self.clock.advance(dt)
        self.d.run_once()
        for name, rec, src, rep, _be in self.agents:
            src.set(self.d.desired(name))
            rec.run_once()
            assert rep.last is not None
            self.d.report(rep.last)

    def starts(self) -> int:
        return sum(len(be.operations("start_process")) for *_x, be in self.agents)


def dispatcher_throughput(tasks: int, hosts: int, tmp: Path) -> None:
    out: dict[str, float] = {}
    for label, policy, specs, levels in (
            ("task bags (dispatcher)", "dispatch-proportion",
             [{"shape": {"kind": "task-bag", "tasks": [1.0] * (tasks // 4)}, "procs": tasks // 4, "estimate": 1.0}
              for _ in range(4)], 2),
            ("rigid 1-process jobs (baseline)", "fcfs",  # on the fg/bg pair: FCFS fills level 0 only
             [{"procs": 1, "estimate": 10.0, "work_seconds": 1.0} for _ in range(tasks)], None)):
        clock = VirtualClock(1_000_000.0)
        d = _daemon(tmp, label.split()[0], policy, clock, **({"conserving": True} if policy != "fcfs" else {}))
        hosts_ = _Hosts(d, clock, hosts, levels)
        d.submit(specs)
        t0, c0 = time.perf_counter(), time.process_time()
        rounds = 0
        while any(j.state not in ("done", "failed") for j in d.state.jobs.values()):
            hosts_.round(1.01)
            rounds += 1
            assert rounds < 10 * tasks, "no progress"
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = hosts_.starts()
        out[label] = n / wall
        print(f"  {label:32s} {n:6,} task starts in {wall:6.1f} s wall ({n / wall:7.1f}/s), {cpu:6.1f} s CPU "
              f"({n / cpu:7.1f}/s), {rounds} rounds", flush=True)
        d.close()
        d.store.close()
    a, b = out.values()
    print(f"  ratio (bags / rigid jobs): {a / b:.2f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the cluster and jobs, fewer events")
    ap.add_argument("--policies", default=",".join(POLICIES), help="decision-maker latency: these policies")
    ap.add_argument("--tasks", default=None,
                    help="dispatcher throughput: task counts (comma-separated), each in 4 bags (default 2000)")
    ap.add_argument("--only", choices=("latency", "dispatcher"), default=None, help="run one of the two benchmarks")
    a = ap.parse_args(argv)
    nodes, jobs, events, tasks = (125, 100, 10, "400") if a.quick else (1250, 1000, 30, "2000")
    try:
        counts = [int(x) for x in (a.tasks or tasks).split(",")]
    except ValueError:
        ap.error(f"--tasks: comma-separated integers, got {a.tasks!r}")
    if any(n < 4 for n in counts):
        ap.error(f"--tasks: at least 4 tasks (4 bags), got {a.tasks!r}")
    with tempfile.TemporaryDirectory(prefix="vmctl-bench-taskbags-") as tmp:
        if a.only != "dispatcher":
            print(f"decision-maker latency: {jobs:,} bags on {nodes * 4 * 2:,} workers, {events} submissions each")
            for p in a.policies.split(","):
                decision_latency(p, nodes, 4, jobs, events, Path(tmp))
        if a.only != "latency":
            for n in counts:
                print(f"dispatcher throughput: {n:,} tasks (4 bags) of 1 s on 10 mock hosts x 2 workers "
                      "(virtual clock)")
                dispatcher_throughput(n, 10, Path(tmp) / f"t{n}")


if __name__ == "__main__":
    main()
