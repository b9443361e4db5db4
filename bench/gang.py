"""Benchmark: gang scheduling in the simulator (paper 004; ``gs-m``/``bgs-m`` on the time-slice model).

Run: ``python -m bench.gang [--quick] [--jobs N] [--load L]`` from the repository root.

1. **10,000 jann97 jobs on 320 processors at MPL 5 with migration** (``gs-m`` and ``bgs-m``, C = 0,
   Q unlimited, T = 200 s, offered load 0.9 by default): jobs per second of wall and CPU time, the
   scheduling passes, and the share of the time spent in the policy (``decide``: reading the matrix
   out of the view, ``gang_matrix.derive``, building the actions) against the engine (checking and
   applying the decisions, slice boundaries, completions).
2. **Growth with jobs**: ``gs-m`` at 1/4, 1/2 and all of the jobs.
3. **Growth with MPL**: ``gs-m`` at MPL 2, 3, 5 on half the jobs.

Wall times are noisy on a shared 2-core machine, so CPU time is printed too. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from vmctl.model import ClusterView, Decision
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.timeslice import TimeSliceModel
from vmctl.sim.workloads.registry import generate_model


def one(policy: str, jobs: int, mpl: int, load: float) -> dict[str, Any]:
    wl = generate_model("jann97", jobs, 320, 1, load, usage="full")
    pol = create_policy(policy, mpl=mpl)
    spent = [0.0]
    decide = pol.decide

    def timed(view: ClusterView, now: float) -> Decision:
        t = time.process_time()
        try:
            return decide(view, now)
        finally:
            spent[0] += time.process_time() - t

    pol.decide = timed  # type: ignore[method-assign]
    sim = Simulator(wl.jobs, 320, pol, SimConfig(seed=1, cpu_usage="full", execution=lambda: TimeSliceModel(mpl)))
    w0, c0 = time.perf_counter(), time.process_time()
    res = sim.run()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    g = res.gang
    assert g is not None
    return {"policy": policy, "jobs": jobs, "mpl": mpl, "wall": wall, "cpu": cpu, "passes": res.decisions,
            "policy_share": spent[0] / cpu if cpu else 0.0, "migrations": res.migrations,
            "slowdown": g.avg_slowdown, "utilization": g.utilization}


def show(r: dict[str, Any]) -> None:
    print(f"  {r['policy']:6s} {r['jobs']:>7,} jobs  MPL {r['mpl']}  wall {r['wall']:7.1f} s "
          f"({r['jobs'] / r['wall']:7.1f} jobs/s)  CPU {r['cpu']:7.1f} s ({r['jobs'] / r['cpu']:7.1f} jobs/s)  "
          f"{r['passes']:,} passes  policy {r['policy_share']:.0%} of CPU  {r['migrations']:,} migrations  "
          f"slowdown {r['slowdown']:.2f}  utilization {r['utilization']:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gang")
    ap.add_argument("--quick", action="store_true", help="1,000 jobs instead of 10,000")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--load", type=float, default=0.9)
    args = ap.parse_args(argv)
    n = args.jobs or (1000 if args.quick else 10_000)
    print(f"1. {n:,} jann97 jobs, 320 processors, MPL 5, migration (C = 0, Q unlimited), load {args.load}")
    for p in ("gs-m", "bgs-m"):
        show(one(p, n, 5, args.load))
    print("2. growth with jobs (gs-m, MPL 5)")
    for k in (n // 4, n // 2):
        show(one("gs-m", k, 5, args.load))
    print("3. growth with MPL (gs-m)")
    for mpl in (2, 3, 5):
        show(one("gs-m", n // 2, mpl, args.load))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
