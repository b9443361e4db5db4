"""Print the statistics of a generated (or traced) workload next to the MEASY paper's targets.

    python -m vmctl.sim.workloads.stats --model feitelson96 --jobs 200000 --procs 320
    python -m vmctl.sim.workloads.stats --model jann97 --jobs 100000 --procs 320 --seed 2
    python -m vmctl.sim.workloads.stats --trace ../shared/data/traces/CTC-SP2-1996-3.1-cln.swf.gz

Exit status 2 with ``error: <reference>: message`` on bad input.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from typing import Any

import numpy as np

from vmctl.errors import VmctlError
from vmctl.sim.workloads.core import Workload
from vmctl.sim.workloads.load import offered_load
from vmctl.sim.workloads.registry import MEASY_TARGETS, MODELS, generate_model
from vmctl.sim.workloads.swf import read_swf


def workload_stats(w: Workload) -> dict[str, Any]:
    """Summary numbers of a workload (empty workloads give zeros)."""
    n = len(w.jobs)
    if n == 0:
        return {"jobs": 0}
    procs = np.fromiter((j.procs for j in w.jobs), dtype=np.int64, count=n)
    run = np.fromiter((j.run_time for j in w.jobs), dtype=np.float64, count=n)
    est = np.fromiter((j.estimate for j in w.jobs), dtype=np.float64, count=n)
    out: dict[str, Any] = {
        "jobs": n,
        "max_procs": w.max_procs,
        "mean_procs": float(procs.mean()),
        "serial_share": float((procs == 1).mean()),
        "pow2_share": float(((procs & (procs - 1)) == 0).mean()),
        "mean_run_time": float(run.mean()),
        "cv_run_time": float(run.std() / run.mean()),
        "median_run_time": float(np.median(run)),
        "mean_estimate": float(est.mean()),
        "distinct_estimates": len(np.unique(est)),
        "mean_accuracy": float((run / est).mean()),
        "overrun_share": float((run > est).mean()),
        "span_days": (w.last_submit - w.first_submit) / 86400.0,
    }
    if n >= 2 and w.last_submit > w.first_submit:
        out["offered_load"] = offered_load(w)
    if any(j.cpu_usage is not None for j in w.jobs):
        multi = np.fromiter(
            itertools.chain.from_iterable(j.cpu_usage for j in w.jobs if j.cpu_usage is not None and j.procs > 1),
            dtype=np.float64,
        )
        out["mean_usage_multi"] = float(multi.mean()) if multi.size else 1.0
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vmctl.sim.workloads.stats", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", choices=sorted(MODELS))
    src.add_argument("--trace", help="an SWF file (plain or .gz)")
    ap.add_argument("--jobs", type=int, default=None, help="number of jobs (default: the MEASY paper's)")
    ap.add_argument("--procs", type=int, default=None, help="machine size (default 320 for models)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--load", type=float, default=None, help="scale inter-arrivals to this offered load")
    ap.add_argument("--usage", choices=["paper", "full"], default="paper")
    ap.add_argument(
        "--max-estimate",
        type=int,
        default=None,
        help="TModel maximal estimate, s (default: longest run time in whole hours)",
    )
    args = ap.parse_args(argv)
    try:
        t0 = time.perf_counter()
        if args.model:
            target = MEASY_TARGETS.get(args.model, {})
            n = args.jobs if args.jobs is not None else int(target.get("jobs", 100_000))
            w = generate_model(
                args.model, n, args.procs or 320, args.seed, args.load, usage=args.usage, max_estimate=args.max_estimate
            )
        else:
            target = {}
            w = read_swf(args.trace, args.procs)
        elapsed = time.perf_counter() - t0
        stats = workload_stats(w)
    except VmctlError as exc:
        print(f"error: {exc.reference}: {exc}", file=sys.stderr)
        return 2
    print(f"workload: {w.source}  ({elapsed:.2f} s)")
    for key, value in w.header.items():
        if key in ("Estimates", "CpuUsage", "OfferedLoad"):
            print(f"  {key}: {value}")
    if w.dropped:
        print(f"  dropped: {w.dropped}")
    print(f"{'statistic':20} {'value':>14} {'MEASY target':>14} {'deviation':>10}")
    for key, value in stats.items():
        tgt = target.get(key)
        shown = f"{value:14.4f}" if isinstance(value, float) else f"{value:14d}"
        dev = f"{(value - tgt) / tgt:+9.1%}" if tgt else ""
        print(f"{key:20} {shown} {'' if tgt is None else f'{tgt:14g}'} {dev:>10}")
    if "serial_share_max" in target:
        print(f"{'serial_share (max)':20} {'':14} {target['serial_share_max']:14g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
