"""Real-hypervisor numbers for the libvirt backend on this machine.

    python -m bench.libvirt [--rounds 20] [--window 3] [--types qemu,kvm] [--skip-split]

Starts libvirtd if it is not running (and stops it again), then measures:

1. Reconcile latency with 4 VMs (2 cores x fg/bg, boot-sector idle guests): the wall time of
   ``Reconciler.run_once()`` for a no-op cycle (baseline) and for a desired-state change until it is
   applied (a promote = weight swap on one core; a cap change), p50/p99 in ms, and the same cycles on
   the in-memory mock backend in the same process (ratio = what the real hypervisor adds).
2. Per domain type (TCG ``qemu`` and ``kvm`` where /dev/kvm works), from libvirt's CPU-time counters:
   fg loss (fg spinning with a spinning bg on its core vs alone), bg use of the idle cycles (fg at a
   50 % duty cycle, bg spinning: bg / (capacity - fg)), both in CPU time and in guest progress (the
   rate of the guest's in-memory counter, read with virDomainMemoryPeek), and cap accuracy for caps of 10/25/50/75 %
   on a spinning VM alone on a core; printed next to the papers' numbers (MEASY sec. 2.1: fg loss
   0.5-4 %, bg use of idle cycles 80-92 %; Casanova et al. sec. 7: Xen cap error mean 0.72 %, max
   5.99 %).

Other processes on the machine lower absolute shares; the host's load average is printed with the
numbers. Every VM it creates is named ``bench<pid>-...`` and removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from tests.support.agents import swap_tiers
from tests.support.hosts import remove_vms
from tests.support.libvirt import cpu_time_s, memory_peek
from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN, HypervisorBackend, VmSpec
from vmctl.agents.backends.mock import MockBackend
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.nodedoc import NodeDesired

PREFIX = f"bench{os.getpid()}-"
BOOST: list[Callable[[], str | None]] = []
_BOOSTED: list[bool] = []
PAPER = {
    "fg_loss": "0.5-4 %",
    "fg_loss_progress": "0.5-4 %",
    "bg_idle_use": "80-92 %",
    "bg_idle_use_progress": "80-92 %",
    "cap_err_mean": "0.72 % (Xen)",
    "cap_err_max": "5.99 % (Xen)",
}


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def cleanup(b: HypervisorBackend) -> None:
    remove_vms(b, PREFIX)


# ----------------------------------------------------------------------------- reconcile latency


def _cycles(backend: HypervisorBackend, layout: Layout, rounds: int) -> dict[str, list[float]]:
    source = MemorySource(layout.base_desired(1))
    rec = Reconciler(backend, layout, source, MemoryReporter(), clock=None, max_passes=6)
    res = rec.run_once()
    assert res.converged, res.errors
    out: dict[str, list[float]] = {"no-op": [], "promote": [], "cap": []}
    desired: NodeDesired = source.fetch() or layout.base_desired(1)
    for i in range(rounds):
        t0 = time.perf_counter()
        r = rec.run_once()
        out["no-op"].append((time.perf_counter() - t0) * 1000)
        assert r.converged and not r.applied, r
        desired = swap_tiers(desired, core=i % layout.size)
        source.set(desired)
        t0 = time.perf_counter()
        r = rec.run_once()
        out["promote"].append((time.perf_counter() - t0) * 1000)
        assert r.converged and [a.kind for a in r.applied] == ["tune", "tune"], r
        vms = tuple(replace(v, cap=(0.5 if i % 2 == 0 else None)) if v.name == desired.vms[0].name else v
                    for v in desired.vms)
        desired = NodeDesired(node=desired.node, generation=desired.generation + 1, vms=vms)
        source.set(desired)
        t0 = time.perf_counter()
        r = rec.run_once()
        out["cap"].append((time.perf_counter() - t0) * 1000)
        assert r.converged and [a.kind for a in r.applied] == ["tune"], r
    return out


def bench_reconcile(rounds: int, images: str) -> None:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    real = LibvirtBackend("qemu:///system", domain_type="qemu")
    try:
        layout = Layout(host=f"{PREFIX}agent", cores=(0, 1), memory_mib=32, image=f"{images}/idle.img")
        got = _cycles(real, layout, rounds)
    finally:
        cleanup(real)
        real.close()
    mock = MockBackend("bench-mock", cores=2, clock=VirtualClock(0.0))
    base = _cycles(mock, Layout(host="m", cores=(0, 1), memory_mib=32), rounds)
    print(f"\nreconcile latency, 4 VMs on 2 cores, {rounds} rounds (ms; mock = same cycles on the mock backend)")
    print(f"{'cycle':<10}{'libvirt p50':>12}{'p99':>9}{'mock p50':>10}{'ratio p50':>11}")
    for k in ("no-op", "promote", "cap"):
        r50, r99, m50 = statistics.median(got[k]), pct(got[k], 0.99), statistics.median(base[k])
        print(f"{k:<10}{r50:>12.1f}{r99:>9.1f}{m50:>10.2f}{r50 / max(m50, 1e-6):>10.0f}x")
    print(f"promote vs no-op on libvirt: {statistics.median(got['promote']) / statistics.median(got['no-op']):.2f}x")


# ----------------------------------------------------------------------------- CPU split and caps


def _cpu(b: Any, names: list[str], seconds: float) -> dict[str, float]:
    c0 = {n: cpu_time_s(b, n) for n in names}
    t0 = time.monotonic()
    time.sleep(seconds)
    c1 = {n: cpu_time_s(b, n) for n in names}
    wall = time.monotonic() - t0
    return {n: (c1[n] - c0[n]) / wall for n in names}


def _counter(b: Any, name: str) -> int:
    from tests.support.guests import COUNTER_ADDR, decode_counter

    return decode_counter(memory_peek(b, name, COUNTER_ADDR, 8))


def _window(b: Any, cpu: list[str], progress: list[str], seconds: float) -> tuple[dict[str, float], dict[str, float]]:
    """CPU cores used (libvirt counters) and guest progress (counter increments per second)."""
    k0 = {n: _counter(b, n) for n in progress}
    c0 = {n: cpu_time_s(b, n) for n in cpu}
    t0 = time.monotonic()
    time.sleep(seconds)
    c1 = {n: cpu_time_s(b, n) for n in cpu}
    k1 = {n: _counter(b, n) for n in progress}
    wall = time.monotonic() - t0
    return {n: (c1[n] - c0[n]) / wall for n in cpu}, {n: (k1[n] - k0[n]) / wall for n in progress}


def _wait_counting(b: Any, names: list[str], timeout: float = 30.0) -> None:
    from tests.support.guests import COUNTER_ADDR, decode_counter

    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending and time.monotonic() < deadline:
        pending = {n for n in pending if decode_counter(memory_peek(b, n, COUNTER_ADDR, 8)) == 0}
        time.sleep(0.2)
    if pending:
        raise RuntimeError(f"guests never ran: {sorted(pending)}")


@contextlib.contextmanager
def _vm(b: Any, name: str, image: str, core: int, weight: int, cap: float | None = None) -> Iterator[str]:
    full = PREFIX + name
    b.define(VmSpec(name=full, memory_mib=32, image=image))
    b.pin_vcpus(full, (core,))
    b.set_cpu_tune(full, weight=weight, cap=cap)
    b.start(full)
    if BOOST and not _BOOSTED:  # the VMs' parent cgroup exists once a first guest ran
        _BOOSTED.append(True)
        print(f"(VM cgroup priority raised: {BOOST[0]() or 'no knob found'})")
    try:
        yield full
    finally:
        b.stop(full)
        b.undefine(full)


def bench_split(kind: str, window: float, images: str) -> dict[str, float]:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    b = LibvirtBackend("qemu:///system", domain_type=kind)
    out: dict[str, float] = {}
    try:
        spin, duty = f"{images}/spin.img", f"{images}/duty50.img"
        with _vm(b, "bg", spin, 1, WEIGHT_MIN) as bg:
            _wait_counting(b, [bg])
            _, r = _window(b, [bg], [bg], window)
            bg_solo_rate = r[bg]
            b.suspend(bg)
            with _vm(b, "fg", spin, 1, WEIGHT_MAX) as fg:
                _wait_counting(b, [fg])
                cw, r = _window(b, [fg], [fg], window)
                solo, fg_solo_rate = cw[fg], r[fg]
                b.resume(bg)
                pair, r = _window(b, [fg, bg], [fg], window)  # never peek a starved bg: its QEMU crawls
                out["fg_solo"], out["fg_pair"], out["bg_pair"] = solo, pair[fg], pair[bg]
                out["fg_loss"] = max(0.0, 1.0 - pair[fg] / solo)
                out["fg_loss_progress"] = max(0.0, 1.0 - r[fg] / fg_solo_rate)
            with _vm(b, "fgduty", duty, 1, WEIGHT_MAX) as fgd:
                _wait_counting(b, [fgd])
                d, r = _window(b, [fgd, bg], [bg], window)
                out["fg_duty"], out["bg_with_duty"] = d[fgd], d[bg]
                idle_share = max(1e-9, 1.0 - d[fgd] / solo)
                out["bg_idle_use"] = d[bg] / (solo * idle_share)
                out["bg_idle_use_progress"] = (r[bg] / bg_solo_rate) / idle_share
        errs = []
        for cap in (0.10, 0.25, 0.50, 0.75):
            with _vm(b, f"cap{int(cap * 100)}", spin, 0, WEIGHT_MAX) as c:
                _wait_counting(b, [c])  # boot uncapped (SeaBIOS under KVM's emulator needs seconds of CPU)
                b.set_cpu_tune(c, cap=cap)
                time.sleep(0.3)
                got = _cpu(b, [c], window)[c]
                out[f"cap_{int(cap * 100)}"] = got
                errs.append(abs(got - cap))
        out["cap_err_mean"] = statistics.mean(errs)
        out["cap_err_max"] = max(errs)
    finally:
        cleanup(b)
        b.close()
    return out


def print_split(results: dict[str, dict[str, float]]) -> None:
    kinds = list(results)
    print("\nfg/bg CPU split and caps (libvirt getCPUStats(True); load average "
          f"{os.getloadavg()[0]:.2f} during the run)")
    print(f"{'measure':<34}" + "".join(f"{k:>12}" for k in kinds) + f"{'paper':>16}")
    rows: list[tuple[str, str, Callable[[float], str]]] = [
        ("fg alone (cores)", "fg_solo", lambda v: f"{v:.3f}"),
        ("fg with spinning bg (cores)", "fg_pair", lambda v: f"{v:.3f}"),
        ("bg with spinning fg (cores)", "bg_pair", lambda v: f"{v:.4f}"),
        ("fg loss (CPU time)", "fg_loss", lambda v: f"{v:.1%}"),
        ("fg loss (guest progress)", "fg_loss_progress", lambda v: f"{v:.1%}"),
        ("fg at 50 % duty (cores)", "fg_duty", lambda v: f"{v:.3f}"),
        ("bg next to 50 % fg (cores)", "bg_with_duty", lambda v: f"{v:.3f}"),
        ("bg use of idle cycles (CPU time)", "bg_idle_use", lambda v: f"{v:.1%}"),
        ("bg use of idle cycles (progress)", "bg_idle_use_progress", lambda v: f"{v:.1%}"),
        ("cap 10 % measured", "cap_10", lambda v: f"{v:.1%}"),
        ("cap 25 % measured", "cap_25", lambda v: f"{v:.1%}"),
        ("cap 50 % measured", "cap_50", lambda v: f"{v:.1%}"),
        ("cap 75 % measured", "cap_75", lambda v: f"{v:.1%}"),
        ("cap error mean (points)", "cap_err_mean", lambda v: f"{v * 100:.2f}"),
        ("cap error max (points)", "cap_err_max", lambda v: f"{v * 100:.2f}"),
    ]
    for label, key, fmt in rows:
        cells = "".join(f"{fmt(results[k][key]) if key in results[k] else '-':>12}" for k in kinds)
        print(f"{label:<34}{cells}{PAPER.get(key, ''):>16}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.libvirt", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--window", type=float, default=3.0, help="seconds per CPU measurement window")
    ap.add_argument("--types", default="qemu,kvm", help="domain types for the CPU split (qemu = TCG)")
    ap.add_argument("--skip-split", action="store_true")
    ap.add_argument("--quick", action="store_true", help="5 rounds, 2 s windows, TCG only")
    ap.add_argument("--no-boost", action="store_true",
                    help="leave the VMs' parent cgroup at its default weight (other processes then compete)")
    args = ap.parse_args(argv)
    if args.quick:
        args.rounds, args.window, args.types = 5, 2.0, "qemu"
    try:
        import vmctl.agents.backends.libvirt.backend  # noqa: F401  (only to tell the user why nothing runs)
    except ImportError:
        print("libvirt-python is not installed: nothing to measure")
        return 0
    from tests.integration.libvirt_hosts import (
        Unavailable,
        boost_machine_cgroup,
        shared_images,
        shared_system,
        shutdown_shared,
    )

    try:
        shared_system()
        images = str(shared_images())
    except Unavailable as exc:
        print(f"libvirt unavailable here: {exc}")
        return 0
    try:
        print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
        if not args.no_boost:
            BOOST.append(boost_machine_cgroup)
        bench_reconcile(args.rounds, images)
        if not args.skip_split:
            results: dict[str, dict[str, float]] = {}
            for kind in [k.strip() for k in args.types.split(",") if k.strip()]:
                if kind == "kvm" and not os.path.exists("/dev/kvm"):
                    print("kvm: /dev/kvm missing, skipped")
                    continue
                results[kind] = bench_split(kind, args.window, images)
            print_split(results)
    finally:
        shutdown_shared()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
