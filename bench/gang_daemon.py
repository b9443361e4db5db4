"""Benchmarks of gang scheduling on real hosts (issue 11; ``python -m bench.gang_daemon [--quick]``).

1. vmctld deriving a new matrix: 1,000 nodes x 32 cores of a timeslice cluster with 5 rows (agents
   replaced by direct reports), ``bgs-m`` (MPL 5), the rows filled with running jobs and 2,000 jobs
   queued. One event is "a running job's processes exited", reported by its agent; the latency is from
   the report to the new matrix and desired state committed (report + view + the policy's derivation +
   invariant check + actuation of the row actions + one SQLite transaction). Baseline in the same
   process: ``policy.decide`` alone (the pure matrix derivation) on the same view. This is also the
   daemon run at 1,000 mock nodes the issue asks for, as a benchmark (a test at that size is too slow
   for CI); the actions the actuator skipped are counted (0 expected). Also, per event on one fresh
   view, the thread CPU of ``decide`` with the collapsed matrix kept between events against the same
   ``decide`` collapsing every running job (issue 27's baseline; their decisions must be equal).
   The baselines run with the cyclic collector paused, as vmctld pauses it around its own decide.
   ``--freeze``: ``gc.freeze()`` after setup, as vmctld freezes the state it loads at start or on taking
   the lease; ``--only-matrix``: part 1 only.
2. Agent row-switch latency on the mock backend: one agent with 32 cores and 2 rows (2 x 32 job VMs,
   ``inactive: pause``) switching rows on its slice clock; the latency is the reconcile cycle that
   applies a switch (pause 32 VMs, resume 32). Baseline in the same process: a cycle with no switch.
   The same with ``inactive: soak`` (weights instead of pause/resume).
3. Strict gang against soak: the makespan of one workload whose processes leave half of each core idle,
   on vmctld and two mock agents (virtual time); soak lets the inactive row use the idle half.
``--libvirt``: part 2 also on the system libvirtd (started if needed), 2 cores x 2 rows of idle TCG
guests, 2 s slices of wall time.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from bench.daemon import decide_seconds, pct, print_against_decide
from tests.support.hosts import remove_vms
from vmctl.agents.backends.base import HypervisorBackend
from vmctl.agents.backends.mock import MockBackend
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import SystemClock, VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.daemon.decisions import cyclic_gc_paused
from vmctl.daemon.runtime import freeze_loaded_state
from vmctl.daemon.view import build_view
from vmctl.model import Discipline, JobState, SliceSchedule
from vmctl.nodedoc import NodeDesired, NodeObserved, PowerState, VmDesired, VmObserved, VmRole
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.registry import create_policy
from vmctl.store import open_store

ROWS = 5


def _cluster(nodes: int, cores: int, queued: int, tmp: Path) -> tuple[Daemon, VirtualClock]:
    clock = VirtualClock(1_000_000.0)
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/gang.db", state_dir=str(tmp / "gang"), holder="bench",
                       tick_s=3600, node_timeout_s=1e9, kill_at_estimate=False, policy_name="bgs-m",
                       policy_params={"mpl": ROWS, "slice": 200.0})
    d = Daemon(cfg, open_store(cfg.store_url), clock=clock)
    d.start()
    t0 = time.perf_counter()
    for i in range(nodes):
        d.register_node(f"n{i:04d}", cores, f"n{i:04d}", "mock", levels=ROWS, discipline=Discipline.TIMESLICE)
    rng = random.Random(1)
    total = nodes * cores
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    # enough work to fill every row, then the backlog
    fill: list[dict[str, object]] = []
    cells = 0
    while cells < total * ROWS:
        p = rng.choice(sizes)
        fill.append({"procs": p, "estimate": rng.uniform(600, 7200), "work_seconds": 7200.0})
        cells += p
    d.submit(fill)
    clock.advance(1)
    d.run_once()
    d.submit([{"procs": rng.choice(sizes), "estimate": rng.uniform(60, 7200)} for _ in range(queued)])
    clock.advance(1)
    d.run_once()
    print(f"setup: {nodes} nodes x {cores} cores, {ROWS} rows, {len(d.state.active())} running jobs, "
          f"{len(d.state.queue())} queued ({time.perf_counter() - t0:.1f} s)")
    return d, clock


def _decide_kept_and_full(d: Daemon, policy: SchedulingPolicy, full: SchedulingPolicy,
                          clock: VirtualClock) -> tuple[float, float]:
    """Thread CPU seconds of ``policy.decide`` (the kept collapsed matrix) and of ``full.decide`` (the same
    policy collapsing every running job: issue 27's baseline) on one fresh view; their decisions must agree.
    Both instances see one view per event, so the kept matrix is updated by one event's changes. The cyclic
    collector is paused meanwhile, as vmctld pauses it around its own decide."""
    with cyclic_gc_paused():
        view, _lay = build_view(d.state, clock.now())
        t = time.thread_time()
        a = policy.decide(view, clock.now())
        kept = time.thread_time() - t
        t = time.thread_time()
        b = full.decide(view, clock.now())
        whole = time.thread_time() - t
    assert (a.actions, a.reasons, a.schedule) == (b.actions, b.reasons, b.schedule), "kept and full collapse differ"
    return kept, whole


def matrix_latency(nodes: int, cores: int, queued: int, events: int, tmp: Path, freeze: bool = False) -> None:
    d, clock = _cluster(nodes, cores, queued, tmp)
    if freeze:  # as vmctld does with the state it loads at start or on taking the lease
        freeze_loaded_state()
        print("  (the objects alive after setup frozen out of the cyclic collector's reach: --freeze)")
    assert d.policy is not None
    policy = d.policy
    alone = create_policy(policy.name, **policy.params)  # decides once per event, beside ``full``
    full = create_policy(policy.name, **policy.params)
    full._kept = None  # type: ignore[attr-defined]  # the baseline: a full collapse at every event
    rng = random.Random(2)
    lat: list[float] = []
    base: list[float] = []
    cpu: list[float] = []
    kept_cpu: list[float] = []
    full_cpu: list[float] = []
    skipped = 0
    for _ in range(events):
        clock.advance(5)
        running = [j for j in d.state.active() if j.level is not None and j.placement and not j.migrating]
        job = rng.choice(running)
        by_node: dict[str, list[VmObserved]] = {}
        for i, (n, c) in enumerate(job.placement):
            by_node.setdefault(n, []).append(VmObserved(job.vm_name(i), PowerState.RUNNING, core=c,
                                                        process_job=job.id, process_index=i, process_exit=0))
        before = d.skipped_total
        t, c = time.perf_counter(), time.thread_time()
        for n, vms in sorted(by_node.items()):
            d.report(NodeObserved(node=n, generation_applied=d.state.generation.get(n, 0), cores=cores,
                                  vms=tuple(vms)))
        d.run_once()
        lat.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)
        skipped += d.skipped_total - before
        base.append(decide_seconds(d, policy, clock))
        k, f = _decide_kept_and_full(d, alone, full, clock)
        kept_cpu.append(k)
        full_cpu.append(f)
    print_against_decide(f"new matrix (job end -> matrix and desired state committed), {events} events, bgs-m MPL "
                         f"{ROWS}:", lat, base, "the derivation", f"   ({skipped} actions skipped)")
    print(f"  vmctld CPU  p50 {pct(cpu, 50) * 1e3:8.1f} ms   p99 {pct(cpu, 99) * 1e3:8.1f} ms   (thread CPU time of "
          f"the same events; load average {os.getloadavg()[0]:.1f})")
    k50, k99, f50, f99 = (pct(x, q) * 1e3 for x in (kept_cpu, full_cpu) for q in (50, 99))
    print(f"  decide CPU  p50 {k50:8.1f} ms   p99 {k99:8.1f} ms   (the collapsed matrix kept between events)")
    print(f"  full CPU    p50 {f50:8.1f} ms   p99 {f99:8.1f} ms   (baseline: the same decide collapsing every "
          f"running job; same decisions)   ratio p50 {f50 / k50:.2f}x")
    d.close()
    d.store.close()


def row_switch_latency(cores: int, switches: int, inactive: str, backend: HypervisorBackend | None = None,
                       image: str | None = None, what: str = "mock") -> None:
    """The cycle that applies a row switch vs a cycle with nothing to do, ``cores`` x 2 rows of job VMs
    (on the mock backend unless ``backend`` is given: then a real hypervisor, wall-clock slices)."""
    real = backend is not None
    clock = SystemClock() if real else VirtualClock(1_000_000.0)
    host = f"bench{os.getpid()}-gang" if real else "m"
    layout = Layout(host=host, cores=tuple(range(cores)), levels=2, discipline=Discipline.TIMESLICE,
                    inactive=inactive, image=image, memory_mib=32 if real else 64)
    if backend is None:
        backend = MockBackend(hostname="m", cores=cores, clock=clock, memory_mib=1 << 20)
    vms = tuple(VmDesired(name=f"{host}-j{r}{k}", core=k, role=VmRole.FG if r == 0 else VmRole.BG,
                          weight=10000 if r == 0 else 1, level=r, memory_mib=layout.memory_mib)
                for r in range(2) for k in range(cores))
    source = MemorySource(NodeDesired(host, 1, vms))
    rec = Reconciler(backend, layout, source, MemoryReporter(), clock=clock, max_passes=6)
    assert rec.run_once().converged  # boots the guests (slow under TCG) before the slices start
    period = 2.0 if real else 10.0
    sched = SliceSchedule(period, (0, 1), float(int(clock.now()) + 1))
    source.set(NodeDesired(host, 2, vms, slices=sched))
    steady: list[float] = []
    for _ in range(switches):
        if isinstance(clock, VirtualClock):
            clock.set(sched.next_switch(clock.now()))
        else:
            time.sleep(max(0.0, sched.next_switch(clock.now()) - clock.now()))
        res = rec.run_once()
        assert res.converged and not res.errors, res.errors
        t = time.perf_counter()
        rec.run_once()  # the same row: nothing to do
        steady.append(time.perf_counter() - t)
    sw = rec.switch_seconds[-switches:]
    assert len(sw) == switches
    s50, s99 = pct(sw, 50) * 1e3, pct(sw, 99) * 1e3
    b50 = pct(steady, 50) * 1e3
    print(f"agent row switch on {what}, {cores} cores x 2 rows ({2 * cores} job VMs), inactive: {inactive}, "
          f"{switches} switches:")
    print(f"  switch cycle p50 {s50:7.2f} ms   p99 {s99:7.2f} ms")
    print(f"  steady cycle p50 {b50:7.2f} ms   (baseline: a cycle with no switch)   ratio p50 {s50 / b50:.1f}x")


def libvirt_switches(switches: int) -> None:
    """Row switches on the system libvirtd (started if needed, as the libvirt tests do), idle TCG guests."""
    try:
        from tests.integration.libvirt_hosts import Unavailable, shared_images, shared_system, shutdown_shared
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError as exc:
        print(f"real libvirt: not available ({exc})")
        return
    try:
        shared_system()
        images = shared_images()
    except Unavailable as exc:
        print(f"real libvirt: unavailable here ({exc})")
        return
    b = LibvirtBackend("qemu:///system", domain_type="qemu")
    try:
        print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        for inactive in ("pause", "soak"):
            row_switch_latency(2, switches, inactive, b, str(images / "idle.img"), "real libvirt (TCG)")
            remove_vms(b, f"bench{os.getpid()}-")
    finally:
        remove_vms(b, f"bench{os.getpid()}-")
        b.close()
        shutdown_shared()


def pause_vs_soak(jobs: int, tmp: Path) -> None:
    """Makespan of the same gang workload under strict gang (inactive rows paused) and soak (inactive
    rows at the lowest weight), vmctld and two mock agents of 2 cores on one virtual clock: MPL 2, T 10
    s, 4-process jobs of 60 s of work whose processes use half a core (cpu_usage 0.5), so the active row
    leaves half of every core idle."""
    from tests.support.gang import Cluster

    spans: dict[str, float] = {}
    for inactive in ("pause", "soak"):
        c = Cluster(tmp / inactive, levels=2, inactive=inactive, params={"mpl": 2, "slice": 10.0})
        recs = c.d.submit([{"procs": 4, "estimate": 600.0, "work_seconds": 60.0, "cpu_usage": [0.5] * 4}
                           for _ in range(jobs)])
        t0 = c.clock.now()
        c.step()
        while any(r.state in (JobState.QUEUED, JobState.RUNNING) for r in recs):
            assert c.clock.now() - t0 < 100 * 60 * jobs, "the workload does not finish"
            c.step(1.0)
        spans[inactive] = max(r.end_time or 0.0 for r in recs) - t0
        c.d.close()
    print(f"strict gang vs soak on mock, {jobs} jobs of 4 x 60 s at cpu_usage 0.5, MPL 2, T 10 s (makespan, "
          "virtual time):")
    ratio = spans["pause"] / spans["soak"]
    print(f"  pause {spans['pause']:7.0f} s   soak {spans['soak']:7.0f} s   ratio {ratio:.2f}x (baseline: pause, the "
          "paper's strict gang)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 nodes, 200 queued jobs, fewer events")
    ap.add_argument("--libvirt", action="store_true", help="also row switches on the system libvirtd (2 x 2 VMs)")
    ap.add_argument("--freeze", action="store_true",
                    help="part 1: gc.freeze() after setup, as vmctld freezes the state it loads at start or on taking "
                         "the lease (a daemon restarted with these jobs); default: the jobs arrived after start, "
                         "as submitted jobs do, and the collector walks them")
    ap.add_argument("--only-matrix", action="store_true", help="part 1 only")
    args = ap.parse_args()
    nodes, queued, events = (100, 200, 10) if args.quick else (1000, 2000, 30)
    with tempfile.TemporaryDirectory() as tmp:
        matrix_latency(nodes, 32, queued, events, Path(tmp), freeze=args.freeze)
        if args.only_matrix:
            return
        pause_vs_soak(4, Path(tmp))
    for inactive in ("pause", "soak"):
        row_switch_latency(32, 20 if args.quick else 100, inactive)
    if args.libvirt:
        libvirt_switches(5 if args.quick else 10)


if __name__ == "__main__":
    main()
