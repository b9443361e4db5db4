"""Cost of one Prometheus scrape of vmctld's metrics and of one CLI table.

    python -m bench.metrics_scrape [--nodes 100] [--cores 32] [--rounds 30]

In one process, for a cluster of NODES x CORES cores (2 VMs per core):

- baseline: ``DaemonMetrics.exposition()`` with an empty cluster snapshot (the direct instruments only);
- cluster: the same with every node and VM document (per-node fg/bg utilization, per-VM CPU, weight,
  cap) rebuilt by the custom collector, as on every real scrape;
- agent: ``AgentMetrics.exposition()`` of one node of CORES cores;
- CLI table: ``vmctl vm list`` for the whole cluster, as a rich table and as printed (plain text
  above ``RICH_MAX_ROWS`` rows).

Prints p50/p99 in ms, the exposition size, and the ratio cluster/baseline. A scrape must stay far
below Prometheus' default 10 s timeout on the biggest cluster we expect.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from vmctl.cli.render import RICH_MAX_ROWS, vm_table
from vmctl.metrics import AgentMetrics, ClusterSnapshot, DaemonMetrics
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved


def cluster(nodes: int, cores: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    ns, vms = [], []
    for n in range(nodes):
        name = f"node{n:04d}"
        ns.append({"name": name, "cores": cores, "state": "ready", "fg_busy": cores, "bg_busy": cores // 2,
                   "utilization": 0.9, "last_seen": 1.0e9, "generation": 10 + n})
        for c in range(cores):
            for role in ("fg", "bg"):
                vms.append({"name": f"{name}-c{c}-{role}", "node": name, "core": c, "role": role,
                            "weight": 10000 if role == "fg" else 1, "cap": 0.5 if role == "bg" else None,
                            "power": "running", "job_id": str(c), "utilization": 0.7, "cpu_time_s": 123.0 + c})
    return ns, vms


def timeit(fn: Callable[[], Any], rounds: int) -> tuple[float, float, Any]:
    fn()  # warm up
    xs = []
    out = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        xs.append((time.perf_counter() - t0) * 1000)
    xs.sort()
    return statistics.median(xs), xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))], out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--cores", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=30)
    a = ap.parse_args()
    ns, vms = cluster(a.nodes, a.cores)
    empty = DaemonMetrics(lambda: ClusterSnapshot())
    full = DaemonMetrics(lambda: ClusterSnapshot(nodes=ns, vms=vms, time=1.0e9 + 5))
    for m in (empty, full):
        m.observe_cycle(0.01)
        m.decision("start_fg")
    obs = NodeObserved(node="node0000", generation_applied=3, cores=a.cores, vms=tuple(
        VmObserved(name=f"node0000-c{c}-{r}", power=PowerState.RUNNING, core=c, weight=1, cap=0.5, cpu_time_s=1.0,
                   utilization=0.5) for c in range(a.cores) for r in ("fg", "bg")))
    agent = AgentMetrics(lambda: obs)
    b50, b99, bout = timeit(lambda: empty.exposition()[0], a.rounds)
    c50, c99, cout = timeit(lambda: full.exposition()[0], a.rounds)
    a50, a99, aout = timeit(lambda: agent.exposition()[0], a.rounds)

    def rich_table() -> None:
        Console(file=io.StringIO(), width=140).print(vm_table(vms).to_rich())

    t50, t99, _ = timeit(lambda: vm_table(vms).render(), max(3, a.rounds // 10))
    r50, r99, _ = timeit(rich_table, 2)
    print(f"cluster: {a.nodes} nodes x {a.cores} cores = {len(vms)} VMs")
    print(f"baseline scrape (instruments only): p50 {b50:8.2f} ms  p99 {b99:8.2f} ms  {len(bout):>9,} bytes")
    print(f"daemon scrape (cluster collector):  p50 {c50:8.2f} ms  p99 {c99:8.2f} ms  {len(cout):>9,} bytes")
    print(f"agent scrape ({a.cores} cores):            p50 {a50:8.2f} ms  p99 {a99:8.2f} ms  {len(aout):>9,} bytes")
    print(f"vmctl vm list, rich table ({len(vms)} rows):  p50 {r50:8.2f} ms  p99 {r99:8.2f} ms")
    print(f"vmctl vm list, as printed (plain text above {RICH_MAX_ROWS} rows): p50 {t50:8.2f} ms  p99 {t99:8.2f} ms"
          f"  ({r50 / t50:.0f}x faster)")
    print(f"ratio daemon/baseline p50: {c50 / b50:.1f}x; per VM: {(c50 - b50) / len(vms) * 1000:.1f} us")


if __name__ == "__main__":
    main()
