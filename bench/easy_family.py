"""Benchmark: cost of ``decide`` for the EASY family on views recorded from real simulations.

Run: ``python -m bench.easy_family [--jobs N] [--model-jobs M] [--every K] [--full]``.

1. Simulates EASY over the HPC2N trace (240 processors; ``--jobs`` first jobs, default all 202,871)
   and records every K-th view (a static copy) the policy was asked about. Times ``decide`` of
   fcfs, easy and sjf over the recorded views, and, as the baseline in the same process, a
   straightforward EASY (sorts every fg job by expected end, copies and scans the whole queue, no
   early exit) that must take the same decisions (checked).
2. Simulates MEASY over a Feitelson model workload (320 processors, ``--model-jobs`` jobs) and times
   keasy, reasy, measy and easy over the recorded two-tier views; the ratio is against easy.
3. With ``--full``: wall time of the whole EASY simulation over HPC2N including parsing, and the share
   spent in ``decide``.

Numbers are wall-clock microseconds per call (best of 3 passes); on a loaded machine compare ratios.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from vmctl.model import ClusterView, Decision, Job, RunningJob, StartFg, Tier
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import simulate
from vmctl.sim.workloads import generate_model, read_swf

ROOT = Path(__file__).resolve().parents[1]
HPC2N = ROOT.parent / "shared" / "data" / "traces" / "HPC2N-2002-2.2-cln.swf.gz"


def snapshot(view: ClusterView) -> ClusterView:
    """A static copy of a live view (progress and expected_end frozen at their current values)."""
    running = {
        jid: RunningJob(rj.job, rj.tier, rj.cores, rj.start_time, rj.tier_since, rj.progress, rj.expected_end)
        for jid, rj in view.running.items()
    }
    return ClusterView(
        total_cores=view.total_cores,
        queue=list(view.queue),
        running=running,
        fg_job=list(view.fg_job),
        bg_job=list(view.bg_job),
        idle_fg=set(view.idle_fg),
        idle_bg=set(view.idle_bg),
        fg_util=list(view.fg_util),
        usable=list(view.usable),
    )


class Recorder(SchedulingPolicy):
    """Wraps a policy and keeps a static copy of every K-th non-trivial view it is asked about."""

    name = "recorder"

    def __init__(self, inner: SchedulingPolicy, every: int) -> None:
        super().__init__()
        self.inner = inner
        self.needs = inner.needs  # type: ignore[misc]
        self.every = every
        self.calls = 0
        self.views: list[tuple[ClusterView, float]] = []

    def decide(self, view: ClusterView, now: float) -> Decision:
        if view.queue or len(view.idle_bg) < view.total_cores:
            self.calls += 1
            if self.calls % self.every == 0:
                self.views.append((snapshot(view), now))
        return self.inner.decide(view, now)


def naive_easy(view: ClusterView, now: float) -> Decision:
    """The textbook EASY written without care for cost: the baseline."""
    queue = list(view.queue)
    idle = sorted(view.idle_fg)
    free = len(idle)
    actions: list[StartFg] = []
    ends: list[tuple[float, int]] = []
    usable = sum(view.usable)
    head: Job | None = None
    rest: list[Job] = []
    for k, job in enumerate(queue):
        if job.submit_time > now:
            continue
        if job.procs <= free:
            cores = tuple(reversed(idle[len(idle) - job.procs :]))
            del idle[len(idle) - job.procs :]
            actions.append(StartFg(job.id, cores))
            free -= job.procs
            ends.append((now + job.estimate, job.procs))
            continue
        if job.procs > usable:
            continue
        head = job
        rest = queue[k + 1 :]
        break
    if head is None:
        return Decision(actions=tuple(actions))
    fg = sorted(
        [(rj.expected_end, rj.job.procs) for rj in view.running.values() if rj.tier is Tier.FG] + ends
    )
    avail, shadow, extra = free, math.inf, 0
    for i, (end, procs) in enumerate(fg):
        avail += procs
        if avail >= head.procs:
            avail += sum(p for e, p in fg[i + 1 :] if e <= end)
            shadow, extra = max(end, now), avail - head.procs
            break
    for job in rest:
        if job.submit_time > now or job.procs > free:
            continue
        if now + job.estimate <= shadow:
            pass
        elif job.procs <= extra:
            extra -= job.procs
        else:
            continue
        cores = tuple(reversed(idle[len(idle) - job.procs :]))
        del idle[len(idle) - job.procs :]
        actions.append(StartFg(job.id, cores))
        free -= job.procs
    return Decision(actions=tuple(actions))


def time_calls(fn: Callable[[ClusterView, float], Decision], views: Sequence[tuple[ClusterView, float]]) -> float:
    """Best of 3 passes, microseconds per call."""
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        for v, now in views:
            fn(v, now)
        best = min(best, time.perf_counter() - t0)
    return best / max(1, len(views)) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="decide() cost of the EASY family on recorded views")
    ap.add_argument("--jobs", type=int, default=0, help="first N HPC2N jobs (default: all)")
    ap.add_argument("--model-jobs", type=int, default=20000, help="Feitelson model jobs for the two-tier part")
    ap.add_argument("--every", type=int, default=20, help="record every K-th view")
    ap.add_argument("--full", action="store_true", help="also time the whole EASY simulation over HPC2N")
    args = ap.parse_args(argv)

    jobs = read_swf(HPC2N).jobs
    if args.jobs:
        jobs = jobs[: args.jobs]
    rec = Recorder(create_policy("easy"), args.every)
    simulate(jobs, 240, rec)
    views = rec.views
    easy = create_policy("easy")
    for v, now in views:  # the baseline must take the very same decisions
        assert [a for a in easy.decide(v, now).actions] == list(naive_easy(v, now).actions), "baseline differs"
    qlen = sum(len(v.queue) for v, _ in views) / max(1, len(views))
    print(f"HPC2N, 240 procs, {len(jobs)} jobs: {len(views)} recorded views (mean queue {qlen:.1f})")
    base = time_calls(naive_easy, views)
    print(f"  baseline naive EASY  {base:8.2f} us/call")
    for name in ("fcfs", "easy", "sjf"):
        t = time_calls(create_policy(name).decide, views)
        print(f"  {name:<20} {t:8.2f} us/call   baseline/{name} = {base / t:5.2f}")

    model = generate_model("feitelson96", args.model_jobs, 320, seed=1)
    rec2 = Recorder(create_policy("measy"), args.every)
    simulate(model.jobs, 320, rec2)
    views2 = rec2.views
    bg = sum(sum(1 for rj in v.running.values() if rj.tier is Tier.BG) for v, _ in views2) / max(1, len(views2))
    print(f"Feitelson model, 320 procs, {len(model.jobs)} jobs: {len(views2)} recorded views (mean bg jobs {bg:.1f})")
    ref = time_calls(create_policy("easy").decide, views2)
    print(f"  easy (reference)     {ref:8.2f} us/call")
    for name in ("keasy", "reasy", "measy"):
        t = time_calls(create_policy(name).decide, views2)
        print(f"  {name:<20} {t:8.2f} us/call   {name}/easy = {t / ref:5.2f}")

    if args.full:
        t0 = time.perf_counter()
        full = read_swf(HPC2N).jobs
        pol = create_policy("easy")
        inner = pol.decide
        spent = [0.0]

        def timed(v: ClusterView, now: float) -> Decision:
            a = time.perf_counter()
            d = inner(v, now)
            spent[0] += time.perf_counter() - a
            return d

        pol.decide = timed  # type: ignore[method-assign, assignment]
        res = simulate(full, 240, pol)
        total = time.perf_counter() - t0
        print(f"full EASY run over HPC2N ({res.jobs} jobs, {res.decisions} decisions): {total:.2f} s wall, "
              f"decide {spent[0]:.2f} s ({spent[0] / total:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
