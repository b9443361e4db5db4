"""Benchmark: the simulator engine (``vmctl.sim.engine``).

Run: ``python -m bench.sim [--quick] [--skip-measy] [--jobs N]`` from the repository root.

1. **EASY over HPC2N** (202,871 jobs, 240 processors), parsing included (target <= 3 s wall). The
   baseline, in the same process on the same parsed input, is FCFS (the cheapest policy): the ratio
   EASY / FCFS shows what the policy costs on top of the engine.
2. **MEASY with the progress model over FWload** (Feitelson model, TModel estimates, paper CPU usage,
   320 processors, load 0.8; 200,000 jobs, target <= 60 s; ``--jobs`` or ``--quick`` for fewer), with
   EASY on the same input as the baseline.
3. **Memory**: tracemalloc peak of an EASY run at 3 workload sizes (the workload itself excluded);
   bytes per job should stay flat if memory is linear in jobs.

Wall times are noisy on a shared 2-core machine, so CPU time (``time.process_time``) is printed too.
Nothing is asserted: the numbers are for people (and for ``docs/simulator.md``).
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, SimResult, Simulator
from vmctl.sim.workloads import generate_model, read_swf

ROOT = Path(__file__).resolve().parents[1]
HPC2N = ROOT.parent / "shared" / "data" / "traces" / "HPC2N-2002-2.2-cln.swf.gz"


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def _line(label: str, jobs: int, wall: float, cpu: float, extra: str = "") -> None:
    print(f"  {label:<34} {wall:8.2f} s wall {cpu:8.2f} s cpu {jobs / max(cpu, 1e-9):10,.0f} jobs/s {extra}")


def bench_easy_hpc2n(limit: int | None) -> None:
    print(f"EASY over {HPC2N.name} (parsing included)")
    if not HPC2N.exists():
        print(f"  skipped: {HPC2N} not found")
        return

    def parse_and_run(policy: str) -> tuple[int, SimResult]:
        wl = read_swf(HPC2N)
        jobs = wl.jobs[:limit] if limit else wl.jobs
        return len(jobs), Simulator(jobs, wl.max_procs, create_policy(policy)).run()

    (n, easy), wall_e, cpu_e = _timed(lambda: parse_and_run("easy"))
    (_, fcfs), wall_f, cpu_f = _timed(lambda: parse_and_run("fcfs"))
    _line("fcfs (baseline)", n, wall_f, cpu_f, f"passes {fcfs.decisions:,} (skipped {fcfs.skipped_passes:,})")
    _line("easy", n, wall_e, cpu_e, f"passes {easy.decisions:,} (skipped {easy.skipped_passes:,})")
    print(f"  ratio easy/fcfs (cpu) {cpu_e / cpu_f:.2f}; target <= 3 s wall: {'met' if wall_e <= 3 else 'NOT met'}")


def bench_measy_fw(jobs: int) -> None:
    print(f"MEASY over FWload: {jobs:,} jobs, 320 processors, load 0.8, progress model on")
    (wl, wall_g, cpu_g) = _timed(lambda: generate_model("feitelson96", jobs, 320, seed=1, load=0.8))
    _line("generate workload", jobs, wall_g, cpu_g)
    easy, wall_e, cpu_e = _timed(lambda: Simulator(wl.jobs, 320, create_policy("easy"), SimConfig(seed=1)).run())
    measy, wall_m, cpu_m = _timed(lambda: Simulator(wl.jobs, 320, create_policy("measy"), SimConfig(seed=1)).run())
    _line("easy (baseline)", jobs, wall_e, cpu_e, f"passes {easy.decisions:,}")
    _line("measy", jobs, wall_m, cpu_m, f"passes {measy.decisions:,}, migrations {measy.migrations:,}")
    print(f"  ratio measy/easy (cpu) {cpu_m / cpu_e:.2f}; target <= 60 s wall for 200,000 jobs: "
          f"{'met' if wall_m <= 60 and jobs >= 200_000 else 'not met' if jobs >= 200_000 else 'n/a (smaller run)'}")


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
    args = ap.parse_args(argv)
    bench_easy_hpc2n(50_000 if args.quick else None)
    if not args.skip_measy:
        bench_measy_fw(args.jobs or (20_000 if args.quick else 200_000))
    bench_memory([5_000, 10_000, 20_000] if args.quick else [10_000, 20_000, 40_000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
