"""Benchmark: gang scheduling in the simulator (paper 004; ``gs``, ``gs-m``, ``bgs``, ``bgs-m`` on the time-slice
model), the fast derivation against the reference one in the same process.

Run: ``python -m bench.gang [--quick] [--jobs N] [--load L] [--policies gs,gs-m,...]`` from the repository root.

1. **Fast against reference**: each policy on ``N`` jann97 jobs (default 4,000; ``--quick`` 1,000) on 320
   processors at MPL 5, T = 200 s, C = 0, Q unlimited, offered load ``L`` (default 1.2, Table 1's highest:
   the queue is long and the matrix full), once with the policies as they are and once with the
   reference derivation and ``decide`` of ``tests/support/gang_reference.py`` (the code before issue 27's
   speed-up). Both runs must give the same result job by job (start, end, migrations: checked before a
   ratio is printed). Printed: jobs per second of CPU time, the share of the CPU spent in ``decide``
   (reading the matrix out of the view, the derivation, building the actions; the rest is the engine:
   checking and applying the decisions, slice boundaries, completions) and the ratio fast / reference.
2. **Growth with jobs** (fast only): ``gs`` and ``bgs-m`` at ``N/2``, ``N`` and ``2N`` jobs: jobs per second
   should stay flat (the cost per event is bounded by the matrix, not by the queue).

Wall times are noisy on a shared 2-core machine, so CPU time is what is printed. Nothing is asserted
(except that fast and reference agree).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from typing import Any

from tests.support.gang_reference import reference_decide
from vmctl.model import ClusterView, Decision
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.timeslice import TimeSliceModel
from vmctl.sim.workloads.registry import generate_model


def one(policy: str, jobs: int, load: float, reference: bool = False, mpl: int = 5) -> dict[str, Any]:
    """One simulation; ``reference``: the policy's ``decide`` replaced by the reference one."""
    wl = generate_model("jann97", jobs, 320, 1, load, usage="full")
    pol = create_policy(policy, mpl=mpl)
    spent = [0.0]
    decide = pol.decide

    def timed(view: ClusterView, now: float) -> Decision:
        t = time.process_time()
        try:
            return reference_decide(pol, view, now) if reference else decide(view, now)
        finally:
            spent[0] += time.process_time() - t

    pol.decide = timed  # type: ignore[method-assign]
    sim = Simulator(wl.jobs, 320, pol, SimConfig(seed=1, cpu_usage="full", execution=lambda: TimeSliceModel(mpl)))
    c0 = time.process_time()
    res = sim.run()
    cpu = time.process_time() - c0
    g = res.gang
    assert g is not None
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()} for r in sim.job_rows()]
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return {"policy": policy, "jobs": jobs, "mpl": mpl, "cpu": cpu, "passes": res.decisions,
            "policy_share": spent[0] / cpu if cpu else 0.0, "migrations": res.migrations,
            "slowdown": g.avg_slowdown, "utilization": g.utilization, "digest": digest}


def show(r: dict[str, Any], label: str) -> None:
    print(f"  {label:9s} {r['policy']:6s} {r['jobs']:>7,} jobs  CPU {r['cpu']:7.1f} s "
          f"({r['jobs'] / r['cpu']:7.1f} jobs/s)  "
          f"{r['passes']:,} passes  decide {r['policy_share']:.0%} of CPU  {r['migrations']:,} migrations  "
          f"slowdown {r['slowdown']:.2f}  utilization {r['utilization']:.3f}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gang")
    ap.add_argument("--quick", action="store_true", help="1,000 jobs instead of 4,000")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--load", type=float, default=1.2)
    ap.add_argument("--policies", default="gs,gs-m,bgs,bgs-m")
    ap.add_argument("--no-growth", action="store_true", help="skip part 2")
    args = ap.parse_args(argv)
    n = args.jobs or (1000 if args.quick else 4000)
    policies = [p for p in args.policies.split(",") if p]
    print(f"1. fast against reference: {n:,} jann97 jobs, 320 processors, MPL 5, T = 200 s, C = 0, Q unlimited, "
          f"offered load {args.load}")
    ratios = []
    for p in policies:
        ref = one(p, n, args.load, reference=True)
        show(ref, "reference")
        fast = one(p, n, args.load)
        show(fast, "fast")
        if fast["digest"] != ref["digest"]:
            print(f"  MISMATCH: {p} gives other job results with the fast derivation ({fast['digest']} against "
                  f"{ref['digest']})", flush=True)
            return 1
        ratios.append(ref["cpu"] / fast["cpu"])
        decide = ref["policy_share"] * ref["cpu"] / max(1e-9, fast["policy_share"] * fast["cpu"])
        print(f"  {'':9s} {p:6s} same results job by job; fast / reference: {ratios[-1]:.2f}x the jobs per CPU "
              f"second (decide alone {decide:.1f}x)", flush=True)
    if ratios:
        print(f"  geometric mean over the policies: {math.prod(ratios) ** (1 / len(ratios)):.2f}x", flush=True)
    if not args.no_growth:
        print("2. growth with jobs (fast)")
        for p in ("gs", "bgs-m"):
            for k in (n // 2, n, 2 * n):
                show(one(p, k, args.load), "fast")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
