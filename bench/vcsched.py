"""VCSCHED speed: MCB8 (with the average-yield pass) scaling curve, the other heuristics at the
paper's large size, and the exact MILP on small instances for reference.

    python -m bench.vcsched            # full run (a few minutes, most of it the MILP reference)
    python -m bench.vcsched --quick    # smaller repetitions

Targets: MCB8 + average pass on 500 tasks / 64 hosts <= 20 ms; 10,000 tasks / 1,000 hosts <= 2 s.
Times are the median of several runs (wall clock, one core) on instances from the sec. 4.1
generator (slack 0.3, CV 0.75 / 0.75). The baseline printed next to MCB8 is SG, the fastest
heuristic, measured in the same process on the same instances.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

from vmctl.policies.vcsched.algorithms import solve
from vmctl.policies.vcsched.generator import generate
from vmctl.policies.vcsched.instance import Instance, Solution

CPU: dict[str, float] = {}


def timeit(fn: Callable[[], Solution], reps: int) -> tuple[float, Solution]:
    """Median wall time of ``reps`` runs (after one warm-up); the median process CPU time of the same
    runs goes to ``CPU['last']`` (on a loaded machine it is the fairer measure of the algorithm)."""
    times = []
    cpu = []
    sol = fn()
    for _ in range(reps):
        c0 = time.process_time()
        t0 = time.perf_counter()
        sol = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    CPU["last"] = statistics.median(cpu)
    return statistics.median(times), sol


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    reps = 3 if args.quick else 7

    print("MCB8 + average pass, scaling (median of", reps, "runs; SG in the same process as baseline)")
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(
        f"{'hosts':>6} {'tasks':>7} {'MCB8 ms':>9} {'MCB8 cpu':>9} {'probes':>6} {'min yield':>9} {'LP bound':>8} "
        f"{'SG ms':>8} {'MCB8/SG':>8}"
    )
    sizes = [(16, 100), (64, 250), (64, 500), (128, 1000), (256, 2500), (500, 5000), (1000, 10000)]
    results: dict[tuple[int, int], float] = {}
    cpu_results: dict[tuple[int, int], float] = {}
    for hosts, tasks in sizes:
        inst: Instance = generate(hosts, tasks, 0.3, 0.75, 0.75, rng)
        r = reps if tasks <= 2500 else max(2, reps // 3)
        t_mcb, sol = timeit(lambda i=inst: solve(i, "mcb8"), r)  # type: ignore[misc]
        c_mcb = CPU["last"]
        t_sg, _ = timeit(lambda i=inst: solve(i, "sg"), r)  # type: ignore[misc]
        bound = min(1.0, hosts / sum(inst.cpu))
        results[(hosts, tasks)] = t_mcb
        cpu_results[(hosts, tasks)] = c_mcb
        print(
            f"{hosts:>6} {tasks:>7} {t_mcb * 1000:9.2f} {c_mcb * 1000:9.2f} {sol.work:>6} "
            f"{sol.min_yield:9.4f} {bound:8.4f} {t_sg * 1000:8.2f} {t_mcb / t_sg:8.1f}"
        )
    for key, limit, label in (
        ((64, 500), 0.020, "500 tasks / 64 hosts <= 20 ms"),
        ((1000, 10000), 2.0, "10,000 tasks / 1,000 hosts <= 2 s"),
    ):
        wall, cpu = results[key], cpu_results[key]
        print(
            f"target {label}: wall {wall * 1000:.1f} ms ({'met' if wall <= limit else 'missed'}), "
            f"CPU {cpu * 1000:.1f} ms ({'met' if cpu <= limit else 'missed'})"
        )

    print("\nAll heuristics, 64 hosts / 500 tasks, slack 0.1 .. 0.9 (median over slacks of the median run, ms)")
    algs = ["gr", "sg", "gb", "sgb", *(f"mcb{k}" for k in range(1, 9))]
    per: dict[str, list[float]] = {a: [] for a in algs}
    for slack in (0.1, 0.3, 0.5, 0.7, 0.9):
        inst = generate(64, 500, slack, 0.75, 0.75, rng)
        for a in algs:
            t, _ = timeit(lambda i=inst, a=a: solve(i, a), max(1, reps // 2))  # type: ignore[misc]
            per[a].append(t)
    for a in algs:
        print(f"  {a:>5}: {statistics.median(per[a]) * 1000:8.2f} ms")

    print("\nExact MILP (HiGHS) on small instances, 4 hosts (reference; paper: GLPK, 28.7 s on average)")
    for tasks in (6, 8, 10, 12):
        times = []
        for slack in (0.2, 0.5, 0.8) if args.quick else (0.1, 0.3, 0.5, 0.7, 0.9):
            inst = generate(4, tasks, slack, 0.75, 0.75, rng)
            t0 = time.perf_counter()
            solve(inst, "milp", time_limit=120.0)
            times.append(time.perf_counter() - t0)
        t_mcb, _ = timeit(lambda i=inst: solve(i, "mcb8"), reps)  # type: ignore[misc]
        print(
            f"  {tasks:>2} tasks: MILP mean {statistics.mean(times):7.3f} s, max {max(times):7.3f} s;"
            f" MCB8 {t_mcb * 1000:.2f} ms"
        )


if __name__ == "__main__":
    main()
