"""Moldable tasks with slot time (paper 002): slots simulated per second, per method, at the paper's
scale (10 clusters x 1,000 nodes, slot 360 min, rate 150), and how that grows with the rate and the
number of nodes.

    python -m bench.moldable            # 60 slots per point
    python -m bench.moldable --quick    # 15 slots per point

A point is one ``vmctl.sim.moldable.simulate`` run from an empty system, with no warm-up and no
drain: the queue has not reached its steady state, so these are optimistic for the methods whose
queue grows (HSRET, ALL-EFT); docs/moldable.md, "Speed", has the steady-state rates of full runs.
"100k slots" is 100,000 / (slots/s).
"""

from __future__ import annotations

import argparse
import time

from vmctl.policies.moldable import MOLDABLE_POLICIES
from vmctl.sim.moldable import MoldableConfig, simulate


def point(policy: str, rate: float, nodes: int, slots: int) -> tuple[float, int]:
    cfg = MoldableConfig(policy=policy, slot=360.0, rate=rate, slots=slots, clusters=10, nodes=nodes, warmup=0,
                         batches=2, drain=0)
    t0 = time.perf_counter()
    res = simulate(cfg)
    return res["simulated_slots"] / (time.perf_counter() - t0), res["simulated_slots"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    slots = 15 if args.quick else 60
    point("afcfs", 2.0, 100, 3)   # imports and first-call costs out of the first measurement
    print(f"{'policy':<8} {'rate':>5} {'nodes':>6} {'slots':>6} {'slots/s':>8} {'100k slots':>11}")
    for policy in MOLDABLE_POLICIES:
        for rate, nodes in ((150.0, 1000), (100.0, 1000), (150.0, 500)):
            sps, n = point(policy, rate, nodes, slots)
            print(f"{policy:<8} {rate:>5g} {nodes:>6} {n:>6} {sps:>8.1f} {100_000 / sps / 3600:>9.1f} h", flush=True)


if __name__ == "__main__":
    main()
