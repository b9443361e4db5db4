"""Benchmark: SWF parsing speed of ``vmctl.sim.workloads.read_swf`` on the real traces.

Run: ``python -m bench.parse [--repeat N] [TRACE ...]`` (default: the four traces in
``../shared/data/traces/``). Prints, per trace, the best and median wall time and the best CPU time
of ``read_swf`` and, as the baseline measured in the same process, of a straightforward pure-Python
reader (``split()`` every line, convert the fields, build the same records, no validation); the
ratio is baseline / read_swf in CPU time (steadier than wall time when the machine is shared). The
target is HPC2N (202,871 jobs) well under 1.5 s, since the whole EASY run including parsing has 3 s.
``--memory`` adds the memory a parsed workload holds (per job) and the peak while parsing.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from vmctl.sim.workloads import WorkloadJob, read_swf

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(os.environ.get("VMCTL_TRACE_DIR", ROOT.parent / "shared" / "data" / "traces"))
DEFAULT = [
    "KTH-SP2-1996-2.1-cln.swf.gz",
    "SDSC-SP2-1998-4.2-cln.swf.gz",
    "CTC-SP2-1996-3.1-cln.swf.gz",
    "HPC2N-2002-2.2-cln.swf.gz",
]


def naive_read(path: Path) -> list[WorkloadJob]:
    """The obvious reader, as a baseline: one Python split and seven conversions per line."""
    jobs: list[WorkloadJob] = []
    with gzip.open(path, "rt", encoding="latin-1") as fh:
        for line in fh:
            s = line.strip()
            if not s or s.startswith(";"):
                continue
            f = s.split()
            run = float(f[3])
            procs = int(f[4]) if int(f[4]) > 0 else int(f[7])
            if run <= 0 or procs <= 0:
                continue
            est = float(f[8]) if float(f[8]) > 0 else run
            jobs.append(WorkloadJob(int(f[0]), float(f[1]), run, procs, est, None, int(f[11])))
    jobs.sort(key=lambda j: (j.submit, j.id))
    return jobs


def timed(fn: Callable[[Path], object], arg: Path, repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``repeat`` calls (CPU time is the steadier number on a shared machine)."""
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(arg)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("traces", nargs="*", type=Path)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--memory", action="store_true", help="also report memory held per job and peak (tracemalloc)")
    args = ap.parse_args(argv)
    paths = args.traces or [TRACES / n for n in DEFAULT]
    missing = [p for p in paths if not p.exists()]
    if missing:
        print(f"missing traces: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    print(
        f"{'trace':30} {'jobs':>7} {'read_swf wall':>13} {'median':>7} {'cpu':>6}"
        f" {'naive wall':>10} {'cpu':>6} {'ratio (cpu)':>11}"
    )
    for p in paths:
        w = read_swf(p)
        fast_wall, fast_cpu = timed(read_swf, p, args.repeat)
        naive_wall, naive_cpu = timed(naive_read, p, max(1, args.repeat // 2))
        print(
            f"{p.name:30} {len(w.jobs):7d} {min(fast_wall):12.3f}s {statistics.median(fast_wall):6.3f}s"
            f" {min(fast_cpu):5.3f}s {min(naive_wall):9.3f}s {min(naive_cpu):5.3f}s"
            f" {min(naive_cpu) / min(fast_cpu):10.2f}x"
        )
    if args.memory:
        for p in paths:
            tracemalloc.start()
            base, _ = tracemalloc.get_traced_memory()
            w = read_swf(p)
            held, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            per_job = (held - base) / max(1, len(w.jobs))
            print(
                f"{p.name:30} memory held {(held - base) / 1e6:6.1f} MB ({per_job:.0f} B/job),"
                f" peak while parsing {(peak - base) / 1e6:6.1f} MB"
            )
            del w
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
