"""Reconcile latency of one agent on a 32-core host (2 x 32 mock VMs).

    python -m bench.agent [--rounds 300] [--cores 32]

Measures, in one process, the wall time of ``Reconciler.run_once()``:

- baseline: a no-op cycle (desired state unchanged: fetch, relist, plan, report);
- change: from a desired-state change to applied (a promote = live weight swap on one core, a cap
  change, or a job process started on a bg VM), i.e. the cycle that applies it.

Prints p50/p99 in ms and the change/baseline ratio. The mock backend costs almost nothing, so this
is the agent's own overhead (planning, validation, bookkeeping); the libvirt helper's bench adds the
real hypervisor's cost.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

from tests.support.agents import swap_tiers
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.nodedoc import NodeDesired, ProcessSpec


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def change(d: NodeDesired, rng: random.Random, cores: int, i: int) -> NodeDesired:
    kind = i % 3
    gen = d.generation + 1
    if kind == 0:
        return swap_tiers(d, rng.randrange(cores), generation=gen)
    vms = list(d.vms)
    k = rng.randrange(len(vms))
    if kind == 1:
        vms[k] = replace(vms[k], cap=None if vms[k].cap is not None else round(rng.uniform(0.1, 1.0), 2))
    else:
        vms[k] = replace(vms[k], process=ProcessSpec(job_id=f"j{i}", index=0, work_seconds=1e6, cpu_usage=0.5))
    return NodeDesired(d.node, gen, tuple(vms))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--cores", type=int, default=32)
    args = ap.parse_args()
    clock = VirtualClock(0.0)
    backend = MockBackend("bench", cores=args.cores, clock=clock)
    layout = Layout("bench", tuple(range(args.cores)))
    source = MemorySource(layout.base_desired(1))
    rec = Reconciler(backend, layout, source, MemoryReporter(), clock=clock, runner=MockProcessRunner(backend))
    t0 = time.perf_counter()
    first = rec.run_once()
    setup_ms = (time.perf_counter() - t0) * 1000
    assert first.converged, first.errors
    rng = random.Random(42)
    base: list[float] = []
    chg: list[float] = []
    desired = layout.base_desired(1)
    for i in range(args.rounds):
        rec.reporter = MemoryReporter()  # keep memory flat
        clock.advance(1.0)
        t = time.perf_counter()
        res = rec.run_once()
        base.append((time.perf_counter() - t) * 1000)
        assert res.applied == () and res.converged
        desired = change(desired, rng, args.cores, i)
        source.set(desired)
        clock.advance(1.0)
        t = time.perf_counter()
        res = rec.run_once()
        chg.append((time.perf_counter() - t) * 1000)
        assert res.converged and res.applied and not res.errors, res.errors
        assert res.observed is not None and res.observed.generation_applied == desired.generation
    vms = 2 * args.cores
    print(f"agent reconcile latency, {vms} mock VMs on {args.cores} cores, {args.rounds} rounds")
    print(f"  initial convergence (define+pin+tune+start {vms} VMs): {setup_ms:8.2f} ms")
    print(f"  baseline no-op cycle   p50 {pct(base, .5):7.3f} ms  p99 {pct(base, .99):7.3f} ms"
          f"  mean {statistics.fmean(base):7.3f} ms")
    print(f"  change -> applied      p50 {pct(chg, .5):7.3f} ms  p99 {pct(chg, .99):7.3f} ms"
          f"  mean {statistics.fmean(chg):7.3f} ms")
    print(f"  ratio change/baseline  p50 {pct(chg, .5) / pct(base, .5):5.2f}x"
          f"  p99 {pct(chg, .99) / pct(base, .99):5.2f}x")


if __name__ == "__main__":
    main()
