"""Daemon memory per finished job, with and without retention (``python -m bench.retention [--quick]``).

A daemon on a fresh SQLite store (temp dir), one mock node of 64 cores whose "agent" is a direct report:
batches of jobs filling the node (``--procs`` processes each, default 4) are submitted, started by the
policy (FCFS) and finished by a report of their processes' exit (the real path: submit -> decision ->
desired state -> report -> done). After a warm-up of ``warmup`` finished jobs, ``tracemalloc`` measures
the daemon's traced memory growth over the next ``jobs`` finished jobs; growth / jobs is the memory each
finished job costs.

Three runs in the same process: retention off (every finished job stays in memory, the behaviour before
retention), retention with ``keep_count`` and ``archive: true`` (pruned jobs move to the store's
``job_archive`` table) and with ``archive: false`` (deleted). Also printed: wall time per 1,000 jobs
(submit + decide + finish + housekeeping with its pruning), finished jobs left in memory, rows archived.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig, RetentionConfig
from vmctl.daemon.core import Daemon
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.policies.registry import create_policy
from vmctl.store import open_store

CORES = 64


def _finish_batch(d: Daemon, clock: VirtualClock, procs: int) -> int:
    """Submit jobs of ``procs`` processes filling the node, let the policy start them, report every process
    exited; returns how many jobs ended."""
    recs = d.submit([{"name": f"bench-{procs}p", "procs": procs, "estimate": 60.0, "work_seconds": 1.0}
                     for _ in range(CORES // procs)])
    clock.advance(0.01)
    d.run_once()
    vms: list[VmObserved] = []
    for r in recs:
        rec = d.state.jobs[r.id]
        assert rec.state == "running", (rec.id, rec.state, rec.reason)
        vms.extend(VmObserved(rec.vm_name(i), PowerState.RUNNING, core=c, process_job=rec.id, process_index=i,
                              process_exit=0, utilization=0.9) for i, (_n, c) in enumerate(rec.placement))
    clock.advance(0.01)
    d.report(NodeObserved(node="n0", generation_applied=d.state.generation.get("n0", 0), cores=CORES,
                          vms=tuple(vms)))
    d.run_once()
    assert all(d.state.jobs[r.id].state == "done" for r in recs if r.id in d.state.jobs)
    return len(recs)


def measure(label: str, retention: RetentionConfig, warmup: int, jobs: int, procs: int,
            tmp: Path) -> dict[str, float]:
    clock = VirtualClock(1_000_000.0)
    base = DaemonConfig(store_url=f"sqlite:///{tmp}/{label}.db", state_dir=str(tmp / label), holder="bench",
                        tick_s=3600, kill_at_estimate=False)
    cfg = replace(base, retention=retention)
    d = Daemon(cfg, open_store(cfg.store_url), clock=clock, policy=create_policy("fcfs"))
    try:
        d.start()
        d.register_node("n0", CORES, "n0", "mock")
        done = 0
        while done < warmup:
            done += _finish_batch(d, clock, procs)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        n = 0
        while n < jobs:
            n += _finish_batch(d, clock, procs)
        wall = time.perf_counter() - t0
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        per_job = (after - before) / n
        left = d.state.finished_count()
        archived = d.store.count_archived_jobs()
        print(f"{label:<28} {per_job:>+10.1f} B/job {(after - before) / 1e6:>+8.3f} MB over {n} jobs   "
              f"{wall / n * 1000:>6.2f} s/1000 jobs   finished in memory {left:>6}   archived {archived:>6}",
              flush=True)
        return {"per_job": per_job, "left": left, "archived": archived, "s_per_1000": wall / n * 1000}
    finally:
        d.store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run (fewer jobs)")
    ap.add_argument("--procs", type=int, default=4, choices=(1, 2, 4, 8, 16, 32, 64), help="processes per job")
    args = ap.parse_args(argv)
    warmup, jobs, keep = (1024, 2048, 512) if args.quick else (4096, 20480, 1000)
    tracemalloc.start()
    print(f"{CORES}-core mock node, FCFS, SQLite, {args.procs}-process jobs; warm-up {warmup} finished jobs, "
          f"then {jobs} measured; retention keep_count={keep} (keep_s 7 days, never reached)")
    with tempfile.TemporaryDirectory(prefix="vmctl-bench-retention-") as tmp:
        off = measure("retention off", RetentionConfig(enabled=False), warmup, jobs, args.procs, Path(tmp))
        arch = measure(f"keep_count {keep}, archive", RetentionConfig(keep_count=keep, archive=True), warmup, jobs,
                       args.procs, Path(tmp))
        drop = measure(f"keep_count {keep}, delete", RetentionConfig(keep_count=keep, archive=False), warmup,
                       jobs, args.procs, Path(tmp))
    tracemalloc.stop()
    assert off["left"] >= warmup + jobs
    assert arch["left"] <= keep + 1 and drop["left"] <= keep + 1  # + the newest submission, never pruned
    assert arch["archived"] >= warmup + jobs - keep - 1 and drop["archived"] == 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
