"""Moldable tasks with slot time (paper 002): slots simulated per second of CPU time, per method, at the
paper's scale (10 clusters x 1,000 nodes, slot 360 min, rate 150), against the methods' reference forms
run on the same workload in the same process.

    python -m bench.moldable                 # 150 slots per run
    python -m bench.moldable --quick         # 40 slots per run
    python -m bench.moldable --slots 400 --policies hsret,afcfs
    python -m bench.moldable --slot 720 --rate 300   # the other end of the paper's grid
    python -m bench.moldable --steady 3000 --policies hsret   # the default form only, CPU slots/s per 100 slots

Each method runs twice on the same tasks: its reference form (``make_policy(..., reference=True)``:
numpy on each task's table, eq. 8 rebuilt at every step of HSRET's Getnet) and the default one; the
outcomes (every task's start, finish, width and cluster) must be the same, and the ratio is the
default's rate over the reference's. A run starts from an empty system with no warm-up and no drain;
HSRET's and ALL-EFT's queues grow over the first ~100 slots, so short runs are optimistic for them
(docs/moldable.md, "Speed", has the rates of long runs). "10^6 slots" is the CPU time of the paper's
run (1,000,000 arrival slots and the 400 drain slots) at the measured rate; the target (issue 27) is
<= 2 h, i.e. >= 139 slots/s. Times are CPU seconds of this process (``time.process_time``), which a
loaded machine disturbs less than wall time; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from vmctl.sim.moldable import MoldableConfig, generate, run_slots

#: a full run of the paper: 1,000,000 arrival slots and at most 400 drain slots
FULL_SLOTS = 1_000_400
TARGET_HOURS = 2.0


def point(policy: str, slots: int, reference: bool, rate: float = 150.0, nodes: int = 1000, slot: float = 360.0
          ) -> tuple[float, int, tuple[np.ndarray, ...]]:
    """(CPU seconds, simulated slots, outcome arrays) of one run."""
    cfg = MoldableConfig(policy=policy, slot=slot, rate=rate, slots=slots, clusters=10, nodes=nodes, warmup=0,
                         batches=2, drain=0)
    tasks, clusters = generate(cfg)
    t0 = time.process_time()
    res, out = run_slots(policy, cfg.seed, cfg.slot, tasks, clusters, cfg.profiles, slots=cfg.slots, warm=0,
                         drain=0, batches=2, reference=reference)
    cpu = time.process_time() - t0
    assert out is not None
    return cpu, int(res["simulated_slots"]), (out.start, out.finish, out.width, out.cluster)


def steady(policy: str, slots: int, rate: float, slot: float) -> None:
    """CPU slots/s of each 100 slots of one long run from an empty system (where the queue settles)."""
    cfg = MoldableConfig(policy=policy, slot=slot, rate=rate, slots=slots, clusters=10, nodes=1000, warmup=0,
                         batches=2, drain=0)
    tasks, clusters = generate(cfg)
    print(f"{policy}: slot {slot:g}, rate {rate:g}, {slots} slots; load average {os.getloadavg()[0]:.2f}; "
          "CPU time", flush=True)
    marks = [(0, time.process_time())]

    def tick(now: int, last: int) -> None:
        t = time.process_time()
        if now > marks[-1][0]:
            print(f"  slots {marks[-1][0]:>6}-{now:<6} {(now - marks[-1][0]) / (t - marks[-1][1]):8.1f} slots/s "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
            marks.append((now, t))

    res, _ = run_slots(policy, cfg.seed, cfg.slot, tasks, clusters, cfg.profiles, slots=slots, warm=0, drain=0,
                       batches=2, progress=tick, progress_every=100)
    cpu = marks[-1][1] - marks[0][1]
    later = [m for m in marks if m[0] >= slots // 3]
    tail = (later[-1][0] - later[0][0]) / (later[-1][1] - later[0][1]) if len(later) > 1 else float("nan")
    print(f"  whole run {res['simulated_slots'] / cpu:.1f} slots/s, last two thirds {tail:.1f} slots/s: "
          f"10^6 slots in {FULL_SLOTS / tail / 3600:.2f} h (CPU); AET {res['aet']:.0f}, AWT {res['awt']:.0f}",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="40 slots per run")
    ap.add_argument("--slots", type=int, default=None, help="arrival slots per run (default 150)")
    ap.add_argument("--policies", default="hsret,afcfs,cbsp,all-eft")
    ap.add_argument("--slot", type=float, default=360.0, help="slot length SL, minutes (the paper's 360 or 720)")
    ap.add_argument("--rate", type=float, default=150.0, help="mean arrivals per slot (the paper's 100-150 at "
                                                                "slot 360, 200-300 at 720)")
    ap.add_argument("--steady", type=int, default=None, metavar="SLOTS",
                    help="instead: one long run per policy (default form only), CPU slots/s per 100 slots")
    args = ap.parse_args()
    if args.steady:
        for policy in args.policies.split(","):
            steady(policy, args.steady, args.rate, args.slot)
        return
    slots = args.slots or (40 if args.quick else 150)
    point("afcfs", 3, False, rate=2.0, nodes=100)  # imports and first-call costs out of the measurements
    print(f"load average {os.getloadavg()[0]:.2f} (2 cores shared); slot {args.slot:g}, rate {args.rate:g}, "
          f"{slots} slots per run; CPU time")
    print(f"{'policy':<8} {'slots':>6} {'ref slots/s':>12} {'slots/s':>8} {'ratio':>6} {'10^6 slots':>11} "
          f"{'target':>7} {'same':>5}")
    rates: dict[str, float] = {}
    for policy in args.policies.split(","):
        ref_cpu, n, ref_out = point(policy, slots, True, rate=args.rate, slot=args.slot)
        cpu, n2, out = point(policy, slots, False, rate=args.rate, slot=args.slot)
        same = n == n2 and all(np.array_equal(a, b) for a, b in zip(ref_out, out, strict=True))
        rate, ref_rate = n2 / cpu, n / ref_cpu
        rates[policy] = rate
        hours = FULL_SLOTS / rate / 3600
        print(f"{policy:<8} {n2:>6} {ref_rate:>12.1f} {rate:>8.1f} {rate / ref_rate:>5.1f}x {hours:>9.2f} h "
              f"{'met' if hours <= TARGET_HOURS else 'missed':>7} {'yes' if same else 'NO':>5}", flush=True)
    if "hsret" in rates and "all-eft" in rates:
        print(f"ALL-EFT / HSRET time per slot: {rates['hsret'] / rates['all-eft']:.1f}x (target <= 4x)")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
