"""Benchmark: the simulator engine (``vmctl.sim.engine``).

Run: ``python -m bench.sim [--quick] [--skip-measy] [--parts] [--jobs N]`` from the repository root.

1. **EASY over HPC2N** (202,871 jobs, 240 processors), parsing included. The
   baseline, in the same process on the same parsed input, is FCFS (the cheapest policy): the ratio
   EASY / FCFS shows what the policy costs on top of the engine. A second baseline is a deliberately
   naive EASY (``bench/naive_easy.py``: own parser, plain lists, no checking) on the same trace; the
   benchmark checks that it gives every job the same wait as vmctl's EASY and prints the CPU ratio
   (issue 27: <= 2.0 with every decision checked, goal 1.0). Parsing is inside the timed region on both
   sides; each side's parse share is printed too.
2. **MEASY with the progress model over FWload** (Feitelson model, TModel estimates, paper CPU usage,
   320 processors, load 0.8; 200,000 jobs, issue 27's target <= 15 s; ``--jobs`` or ``--quick`` for fewer), with
   EASY on the same input as the baseline.
3. **Peak RSS of the whole process** (issue 27: <= 100 MB over HPC2N): EASY over HPC2N (parse and run) in a
   fresh interpreter, beside the naive EASY in another and a bare interpreter, each its own process
   (``VmHWM`` of ``/proc/self/status``, Linux), with the ratio to the naive EASY's; then the command
   ``vmctl sim run --trace HPC2N --policy easy --output json`` itself (full size only).
4. **Memory**: tracemalloc peak of an EASY run at 3 workload sizes (the workload itself excluded);
   bytes per job should stay flat if memory is linear in jobs.
5. **Where the time goes** (``--parts``): EASY over HPC2N split into parsing, ``Simulator.__init__``,
   the engine alone (EASY's decisions recorded in a first run, then replayed to a policy that returns
   them, with the checker's fast path ``accepts_fast`` replaced by a yes), the checker (the replay
   with it minus without it) and EASY's ``decide`` (the full run minus the checked replay); best of 3 runs of each, CPU,
   each part beside the naive EASY's whole run in the same process.
6. **Protocol floor**: what the shared policy protocol alone costs for as many jobs as HPC2N has, with
   no scheduling in it: one ``Job`` built the engine's way, one ``StartFg``, one ``Decision``, one
   check of that decision as the engine checks it (``accepts_fast``) against a one-core view (queue
   index on), one heap push and pop per job. It is a lower bound for any engine that runs the
   daemon's policies and checks every decision; the EASY run is printed as a multiple of it.

Wall times are noisy on a shared 2-core machine, so CPU time (``time.process_time``) is printed too.
Nothing is asserted: the numbers are for people (and for ``docs/simulator.md``).
"""

from __future__ import annotations

import argparse
import gc
import heapq
import math
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import naive_easy
from vmctl.model import ClusterView, Decision, Job, StartFg
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.invariants import accepts_fast, check_decision
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, SimResult, Simulator, _make_job
from vmctl.sim.workloads import generate_model, read_swf

ROOT = Path(__file__).resolve().parents[1]
#: the traces' folder: ``$VMCTL_TRACE_DIR`` (as for ``vmctl reproduce``), default ``../shared/data/traces``
TRACES = Path(os.environ.get("VMCTL_TRACE_DIR", ROOT.parent / "shared" / "data" / "traces"))
HPC2N = TRACES / "HPC2N-2002-2.2-cln.swf.gz"


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _line(label: str, jobs: int, wall: float, cpu: float, extra: str = "") -> None:
    print(f"  {label:<34} {wall:8.2f} s wall {cpu:8.2f} s cpu {jobs / max(cpu, 1e-9):10,.0f} jobs/s {extra}")


def _run_naive(limit: int | None, parse_cpu: dict[str, float]) -> list[float]:
    """The naive EASY over HPC2N (its own parser inside), its parse CPU time in ``parse_cpu["naive"]``."""
    t0 = time.process_time()
    jobs, machine = naive_easy.parse_swf(HPC2N)
    parse_cpu["naive"] = time.process_time() - t0
    return naive_easy.simulate(jobs[:limit] if limit else jobs, machine)


def bench_easy_hpc2n(limit: int | None) -> float | None:
    print(f"EASY over {HPC2N.name} (parsing included)")
    if not HPC2N.exists():
        print(f"  skipped: {HPC2N} not found")
        return None

    def parse_and_run(policy: str) -> tuple[int, SimResult]:
        wl = read_swf(HPC2N)
        jobs = wl.jobs[:limit] if limit else wl.jobs
        return len(jobs), Simulator(jobs, wl.max_procs, create_policy(policy)).run()

    parse_cpu: dict[str, float] = {}  # CPU seconds of the parsing inside each timed run

    def parse_and_run_naive() -> list[float]:
        return _run_naive(limit, parse_cpu)

    sims: list[Simulator] = []

    def parse_and_run_kept(policy: str) -> tuple[int, SimResult]:
        t0 = time.process_time()
        wl = read_swf(HPC2N)
        parse_cpu["easy"] = time.process_time() - t0
        jobs = wl.jobs[:limit] if limit else wl.jobs
        sims.append(Simulator(jobs, wl.max_procs, create_policy(policy)))
        return len(jobs), sims[-1].run()

    (n, easy), wall_e, cpu_e = _timed(lambda: parse_and_run_kept("easy"))
    (_, fcfs), wall_f, cpu_f = _timed(lambda: parse_and_run("fcfs"))
    naive_wait, wall_n, cpu_n = _timed(parse_and_run_naive)
    _line("fcfs (baseline)", n, wall_f, cpu_f, f"passes {fcfs.decisions:,} (skipped {fcfs.skipped_passes:,})")
    _line("naive easy (bench/naive_easy.py)", n, wall_n, cpu_n, "own parser, plain lists, no checks")
    _line("easy", n, wall_e, cpu_e, f"passes {easy.decisions:,} (skipped {easy.skipped_passes:,})")
    ours = [r["wait"] for r in sims[0].job_rows()]
    mismatches = sum(abs(a - b) > 1e-6 for a, b in zip(ours, naive_wait, strict=True))
    print(f"  same waits as the naive EASY: {'yes' if mismatches == 0 else f'NO, {mismatches:,} jobs differ'}")
    pe, pn = parse_cpu["easy"], parse_cpu["naive"]
    print(f"  both timed runs include parsing: easy parses in {pe:.2f} s and simulates in {cpu_e - pe:.2f} s cpu, "
          f"the naive EASY {pn:.2f} s and {cpu_n - pn:.2f} s")
    print(f"  ratio easy/fcfs (cpu) {cpu_e / cpu_f:.2f}; ratio easy/naive easy (cpu) {cpu_e / cpu_n:.2f} "
          f"(issue 27 target <= 2.0 over all of HPC2N: "
          f"{('met' if cpu_e <= 2 * cpu_n else 'NOT met') if not limit else 'n/a (smaller run)'}; goal 1.0)")
    return cpu_e


def bench_parts(limit: int | None, rounds: int = 3) -> None:
    print(f"Where the time goes: EASY over {HPC2N.name}, best of {rounds} (CPU)")
    if not HPC2N.exists():
        print(f"  skipped: {HPC2N} not found")
        return
    import vmctl.sim.engine as engine_mod
    from vmctl.policies.base import Needs

    def cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
        _out, _wall, c = _timed(fn)
        return _out, c

    wl, parse = cpu(lambda: read_swf(HPC2N))
    jobs = wl.jobs[:limit] if limit else wl.jobs
    easy = create_policy("easy")
    recorded: list[Decision] = []
    decide = easy.decide

    def recording(view: ClusterView, now: float) -> Decision:
        d = decide(view, now)
        recorded.append(d)
        return d

    easy.decide = recording  # type: ignore[method-assign]
    Simulator(jobs, wl.max_procs, easy).run()

    class Replay(SchedulingPolicy):
        """Returns the recorded decisions in order; skips the passes EASY skips (same ``cannot_act``)."""

        name = "replay"
        needs = Needs(levels=1)

        def __init__(self) -> None:
            super().__init__()
            self._next = iter(recorded).__next__

        def cannot_act(self, view: ClusterView) -> bool:
            return not view.idle_fg or not view.queue

        def decide(self, view: ClusterView, now: float) -> Decision:
            return self._next()

    best: dict[str, float] = {}

    def keep(label: str, seconds: float) -> None:
        best[label] = min(best.get(label, math.inf), seconds)

    names = vars(engine_mod)  # the engine's globals: its loop looks the checker up there
    fast = names["accepts_fast"]
    for _ in range(rounds):
        keep("full", cpu(lambda: Simulator(jobs, wl.max_procs, create_policy("easy")).run())[1])
        keep("init", cpu(lambda: Simulator(jobs, wl.max_procs, create_policy("easy")))[1])
        keep("replay", cpu(lambda: Simulator(jobs, wl.max_procs, Replay()).run())[1])
        names["accepts_fast"] = lambda view, decision, now: True  # EASY's decisions are starts only
        try:
            keep("engine", cpu(lambda: Simulator(jobs, wl.max_procs, Replay()).run())[1])
        finally:
            names["accepts_fast"] = fast
        keep("naive", cpu(lambda: _run_naive(limit, {}))[1])
    naive = best["naive"]
    parts = [("parse (read_swf)", parse), ("Simulator.__init__", best["init"]),
             ("engine alone (replayed, no check)", best["engine"] - best["init"]),
             ("check_decision", best["replay"] - best["engine"]), ("EASY decide", best["full"] - best["replay"])]
    for label, seconds in parts:
        print(f"  {label:<34} {seconds:6.2f} s cpu = {seconds / naive:5.2f} x the naive EASY's whole run")
    print(f"  naive EASY, parse + simulate       {naive:6.2f} s cpu")


def bench_protocol_floor(n: int, easy_cpu: float | None) -> None:
    print(f"Protocol floor: {n:,} jobs through the policy protocol with no scheduling (cyclic GC paused, as in a run)")
    queue: list[Job] = []
    index: dict[str, Job] = {}
    view = ClusterView(total_cores=1, queue=queue, running={}, fg_job=[None], bg_job=[None], idle_fg={0},
                       idle_bg={0}, fg_util=[0.0], usable=[True], queue_index=index)
    ids = [str(i) for i in range(n)]
    usage = (1.0,)
    heap: list[tuple[float, int, Job]] = []
    parts: dict[str, float] = {}

    def part(label: str, fn: Callable[[], Any]) -> Any:
        t0 = time.process_time()
        out = fn()
        parts[label] = time.process_time() - t0
        return out

    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        jobs: list[Job] = part("Job", lambda: [_make_job(i, 0.0, 1, 100.0, usage, 0, "") for i in ids])
        acts: list[StartFg] = part("StartFg", lambda: [StartFg(j.id, (0,)) for j in jobs])
        decs: list[Decision] = part("Decision", lambda: [Decision(actions=(a,), reasons={}, default_reason="waiting")
                                                         for a in acts])

        def check_all() -> None:
            for j, d in zip(jobs, decs, strict=True):
                queue.append(j)
                index[j.id] = j
                if not accepts_fast(view, d, 1.0):  # as the engine checks: the fast path, else the replay
                    check_decision(view, d, 1.0)
                queue.pop()
                del index[j.id]

        def heap_all() -> None:
            for k, j in enumerate(jobs):
                heapq.heappush(heap, (float(k), k, j))
            while heap:
                heapq.heappop(heap)

        part("queue + check_decision", check_all)
        part("heap push + pop", heap_all)
    finally:
        if was:
            gc.enable()
    total = sum(parts.values())
    print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()) + f"; total {total:.2f} s cpu")
    if easy_cpu is not None:
        print(f"  ratio easy (parse + simulate, cpu) / floor {easy_cpu / total:.2f}")


def bench_measy_fw(jobs: int) -> None:
    print(f"MEASY over FWload: {jobs:,} jobs, 320 processors, load 0.8, progress model on")
    (wl, wall_g, cpu_g) = _timed(lambda: generate_model("feitelson96", jobs, 320, seed=1, load=0.8))
    _line("generate workload", jobs, wall_g, cpu_g)
    easy, wall_e, cpu_e = _timed(lambda: Simulator(wl.jobs, 320, create_policy("easy"), SimConfig(seed=1)).run())
    measy, wall_m, cpu_m = _timed(lambda: Simulator(wl.jobs, 320, create_policy("measy"), SimConfig(seed=1)).run())
    _line("easy (baseline)", jobs, wall_e, cpu_e, f"passes {easy.decisions:,}")
    _line("measy", jobs, wall_m, cpu_m, f"passes {measy.decisions:,}, migrations {measy.migrations:,}")
    print(f"  ratio measy/easy (cpu) {cpu_m / cpu_e:.2f}; issue 27 target <= 15 s for 200,000 jobs: "
          f"{'met' if cpu_m <= 15 and jobs >= 200_000 else 'NOT met' if jobs >= 200_000 else 'n/a (smaller run)'}"
          " (cpu)")


# the peak of this process's own memory (VmHWM, KiB): ``ru_maxrss`` would report the parent's peak, as
# Linux carries it over fork and exec
_HWM = """
def _hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
"""
_PEAK_VMCTL = _HWM + """
import sys, time
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import Simulator
from vmctl.sim.workloads import read_swf
t = time.process_time()
wl = read_swf(sys.argv[1])
limit = int(sys.argv[2])
Simulator(wl.jobs[:limit] if limit else wl.jobs, wl.max_procs, create_policy("easy")).run()
print(_hwm(), time.process_time() - t)
"""
_PEAK_NAIVE = _HWM + """
import sys, time
from pathlib import Path
from bench import naive_easy
t = time.process_time()
jobs, machine = naive_easy.parse_swf(Path(sys.argv[1]))
limit = int(sys.argv[2])
naive_easy.simulate(jobs[:limit] if limit else jobs, machine)
print(_hwm(), time.process_time() - t)
"""
_PEAK_BARE = _HWM + """
print(_hwm(), 0.0)
"""
# the command itself: ``vmctl sim run --trace HPC2N --policy easy --output json`` (its paper CPU usage
# included), its peak and CPU time printed on stderr at exit
_PEAK_CLI = _HWM + """
import atexit, sys, time
t = time.process_time()
atexit.register(lambda: print(_hwm(), time.process_time() - t, file=sys.stderr))
from vmctl.cli.main import main
sys.argv = ["vmctl", "sim", "run", "--trace", sys.argv[1], "--policy", "easy", "--output", "json"]
main()
"""


def bench_peak_rss(limit: int | None) -> None:
    print(f"Peak RSS of the whole process: EASY over {HPC2N.name} (parse + run), each case in a fresh interpreter")
    if not HPC2N.exists():
        print(f"  skipped: {HPC2N} not found")
        return

    def child(code: str) -> tuple[float, float]:
        out = subprocess.run([sys.executable, "-c", code, str(HPC2N), str(limit or 0)], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.split()
        return int(out[0]) / 1024, float(out[1])

    bare, _ = child(_PEAK_BARE)
    naive, naive_cpu = child(_PEAK_NAIVE)
    ours, ours_cpu = child(_PEAK_VMCTL)
    print(f"  bare interpreter                   {bare:8.1f} MB")
    print(f"  naive easy (bench/naive_easy.py)   {naive:8.1f} MB ({naive_cpu:.2f} s cpu)")
    print(f"  vmctl easy                         {ours:8.1f} MB ({ours_cpu:.2f} s cpu)")
    if not limit:
        err = subprocess.run([sys.executable, "-c", _PEAK_CLI, str(HPC2N)], cwd=ROOT, check=True,
                             capture_output=True, text=True).stderr.split()
        cli, cli_cpu = int(err[-2]) / 1024, float(err[-1])
        print(f"  vmctl sim run --trace ... --policy easy (the command, paper CPU usage) {cli:8.1f} MB "
              f"({cli_cpu:.2f} s cpu): {'met' if cli <= 100 else 'NOT met'}; ratio to the naive EASY {cli / naive:.2f}")
    target = "met" if ours <= 100 else "NOT met"
    print(f"  ratio vmctl/naive (peak RSS) {ours / naive:.2f}; issue 27 target <= 100 MB over HPC2N: "
          f"{target if not limit else 'n/a (smaller run)'}")


def bench_memory(sizes: list[int]) -> None:
    print("Memory of an EASY run (tracemalloc peak above the workload itself), FWload, 320 processors")
    per_job = []
    for n in sizes:
        wl = generate_model("feitelson96", n, 320, seed=2, load=0.8)
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        t0 = time.process_time()
        Simulator(wl.jobs, 320, create_policy("easy")).run()
        cpu = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        per_job.append(peak / n)
        print(f"  {n:>8,} jobs: peak {peak / 2**20:8.1f} MiB = {peak / n:7.0f} B/job "
              f"({cpu:.1f} s cpu under tracemalloc)")
    print(f"  bytes/job at the largest size / at the smallest: {per_job[-1] / per_job[0]:.2f} (1.0 = linear)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (HPC2N first 50,000 jobs, FWload 20,000)")
    ap.add_argument("--jobs", type=int, default=None, help="FWload size for the MEASY run (default 200,000)")
    ap.add_argument("--skip-measy", action="store_true")
    ap.add_argument("--parts", action="store_true", help="also split EASY over HPC2N into parse, init, engine, "
                                                         "check and decide (about 1 minute)")
    args = ap.parse_args(argv)
    limit = 50_000 if args.quick else None
    easy_cpu = bench_easy_hpc2n(limit)
    if args.parts:
        bench_parts(limit)
    bench_peak_rss(limit)
    bench_protocol_floor(limit or 202_871, easy_cpu)
    if not args.skip_measy:
        bench_measy_fw(args.jobs or (20_000 if args.quick else 200_000))
    bench_memory([5_000, 10_000, 20_000] if args.quick else [10_000, 20_000, 40_000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
