"""How long a forced stop (``virDomainDestroy``) of a guest takes on this machine, and why.

    python -m bench.libvirt_stop [--rounds 2] [--type qemu] [--no-spin]

Starts libvirtd if it is not running (and stops it again). The scene is the one a gang host is in when
a row's placeholder gives way: guests pinned one per core spin at the top weight (``fg``), and the VM to
stop sits on core 0 at the bottom weight (``bg``, ``cpu_shares`` 2), paused (an inactive row) or
running. Per round and variant it boots a fresh bg guest (before the fg guests spin), then times:

* ``paused, destroy`` / ``running, destroy``: ``virDomainDestroy`` as it is (libvirt sends SIGTERM,
  waits up to 10 s, then SIGKILL);
* ``paused, destroy graceful``: ``VIR_DOMAIN_DESTROY_GRACEFUL`` (SIGTERM only; fails if QEMU does not
  exit in time);
* ``paused, resume then destroy``;
* ``paused, weight raised then destroy``: ``cpu_shares`` set to the top first;
* ``paused, backend stop``: ``LibvirtBackend.stop`` of this code (a plain destroy).

Then (``--passes``, on by default) the agent's side, A/B in the same process, alternating: a
``Reconciler`` on this host whose core-0 bg placeholder (paused) gives way to a job VM while two fg
guests spin; the wall time of that ``run_once`` with the stop off the pass (``background_stops``, the
default on libvirt) and with it in the pass (as before), and the time until the placeholder is gone.

``--control-plane`` puts libvirtd and this process in a cgroup with the ``cpu.shares`` of libvirt's
``machine`` partition for the run (``vmctl.whatif.fidelity.control_plane_cgroup``, as ``bench.whatif``
does for spinning runs; removed at the end): the A/B of the control plane's CPU share.
``--variants "paused, destroy;paused, backend stop"`` picks destroy variants by name.

``--no-spin`` runs the same without the fg guests (the baseline: an idle host). The load average and
libvirt's ``machine`` cgroup share are printed with the numbers. Every VM is named ``bench<pid>-...``
and removed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tests.support.hosts import remove_vms
from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN, VmSpec

PREFIX = f"bench{os.getpid()}-"
VARIANTS = ("paused, destroy", "running, destroy", "paused, destroy graceful", "paused, resume then destroy",
            "paused, weight raised then destroy", "paused, backend stop")
MACHINE_SHARES = Path("/sys/fs/cgroup/cpu/machine/cpu.shares")


def _destroy(b: Any, name: str, variant: str) -> tuple[float, str]:
    """Seconds the variant's stop of ``name`` took, and how it ended."""
    import libvirt

    conn = libvirt.open(b.uri)
    try:
        dom = conn.lookupByName(name)
        t0 = time.perf_counter()
        outcome = "ok"
        try:
            if variant == "paused, backend stop":
                b.stop(name)
            elif variant == "paused, destroy graceful":
                dom.destroyFlags(libvirt.VIR_DOMAIN_DESTROY_GRACEFUL)
            else:
                if variant == "paused, resume then destroy":
                    dom.resume()
                elif variant == "paused, weight raised then destroy":
                    b.set_cpu_tune(name, weight=WEIGHT_MAX)
                dom.destroy()
        except libvirt.libvirtError as exc:
            outcome = f"failed: {exc.get_error_message()}"
        except Exception as exc:
            outcome = f"failed: {exc}"
        took = time.perf_counter() - t0
        if outcome != "ok" and dom.isActive() == 1:  # graceful gave up: finish it (not timed)
            with contextlib.suppress(libvirt.libvirtError):
                dom.destroy()
        return took, outcome
    finally:
        conn.close()


def _spinners(b: Any, images: str, tag: str) -> list[str]:
    fgs: list[str] = []
    for core in range(min(2, os.cpu_count() or 1)):
        name = f"{PREFIX}fg{tag}-{core}"
        b.define(VmSpec(name=name, memory_mib=32, image=f"{images}/spin.img"))
        b.pin_vcpus(name, (core,))
        b.set_cpu_tune(name, weight=WEIGHT_MAX)
        b.start(name)
        fgs.append(name)
    time.sleep(2.0)  # let them spin
    return fgs


def pass_latency(b: Any, images: str, background: bool, spin: bool, tag: str) -> tuple[float, float]:
    """(seconds of the cycle that stops a paused placeholder, seconds until it is gone)."""
    from dataclasses import replace

    from vmctl.agents.layout import Layout
    from vmctl.agents.reconciler import Reconciler
    from vmctl.agents.sources import MemoryReporter, MemorySource
    from vmctl.nodedoc import VmDesired, VmRole

    layout = Layout(host=f"{PREFIX}p{tag}", cores=(0,), memory_mib=32, image=f"{images}/idle.img")
    source = MemorySource(layout.base_desired(1))
    rec = Reconciler(b, layout, source, MemoryReporter(), max_passes=6, background_stops=background)
    res = rec.run_once()
    assert res.converged, res.errors
    bg0 = layout.vm_name(0, "bg")
    b.suspend(bg0)
    fgs = _spinners(b, images, tag) if spin else []
    try:
        d = layout.base_desired(2)
        job = VmDesired(name=f"{PREFIX}j{tag}-r1-p0", core=0, role=VmRole.BG, weight=layout.bg_weight)
        source.set(replace(d, vms=(*[v for v in d.vms if v.name != bg0], job)))
        t0 = time.perf_counter()
        rec.run_once()
        cycle = time.perf_counter() - t0
        while bg0 in {v.name for v in b.list_vms()}:
            rec.wait_stops(600.0)
            rec.run_once()
        gone = time.perf_counter() - t0
    finally:
        for name in fgs:
            b.stop(name)
        remove_vms(b, PREFIX)
    return cycle, gone


def run(b: Any, images: str, rounds: int, spin: bool, variants: tuple[str, ...] = VARIANTS) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        bgs: dict[str, str] = {}
        for i, v in enumerate(variants):
            name = f"{PREFIX}bg{r}-{i}"
            b.define(VmSpec(name=name, memory_mib=32, image=f"{images}/idle.img"))
            b.pin_vcpus(name, (0,))
            b.set_cpu_tune(name, weight=WEIGHT_MIN)
            b.start(name)
            if not v.startswith("running"):
                b.suspend(name)
            bgs[v] = name
        fgs = _spinners(b, images, str(r)) if spin else []
        try:
            for v in variants:
                took, outcome = _destroy(b, bgs[v], v)
                out[v].append(took)
                print(f"  round {r} {v:36s} {took:7.2f} s  {outcome}  (load {os.getloadavg()[0]:.1f})", flush=True)
        finally:
            for name in fgs:
                b.stop(name)
            remove_vms(b, PREFIX)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.libvirt_stop", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--type", default="qemu", choices=("qemu", "kvm"), help="domain type (qemu = TCG)")
    ap.add_argument("--no-spin", action="store_true", help="no spinning fg guests (the idle-host baseline)")
    ap.add_argument("--no-destroy", action="store_true", help="skip the destroy variants")
    ap.add_argument("--no-passes", action="store_true", help="skip the agent's cycle A/B")
    ap.add_argument("--control-plane", action="store_true",
                    help="libvirtd and this process in a cgroup with the machine partition's cpu.shares")
    ap.add_argument("--variants", default="", help="destroy variants by name, separated by ';' (default: all)")
    args = ap.parse_args(argv)
    try:
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError:
        print("libvirt-python is not installed: nothing to measure")
        return 0
    from tests.integration.libvirt_hosts import Unavailable, shared_images, shared_system, shutdown_shared

    try:
        shared_system()
        images = str(shared_images())
    except Unavailable as exc:
        print(f"libvirt unavailable here: {exc}")
        return 0
    b = LibvirtBackend("qemu:///system", domain_type=args.type)
    cgroup = None
    if args.control_plane:
        import subprocess

        from vmctl.whatif.fidelity import control_plane_cgroup

        pids = [int(x) for x in subprocess.run(["pgrep", "-x", "libvirtd"], capture_output=True, text=True,
                                                  check=False).stdout.split()]
        cgroup = control_plane_cgroup([*pids, os.getpid()], print)
    wanted = {w.strip() for w in args.variants.split(";") if w.strip()}
    unknown = wanted - set(VARIANTS)
    if unknown:
        print(f"unknown variant(s) {sorted(unknown)}; known: {'; '.join(VARIANTS)}")
        return 2
    picked = tuple(v for v in VARIANTS if not wanted or v in wanted)
    try:
        shares = MACHINE_SHARES.read_text().strip() if MACHINE_SHARES.exists() else "n/a"
        print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
              f"machine cgroup cpu.shares {shares}; guests {args.type}; fg spinning: {not args.no_spin}")
        if not args.no_destroy:
            res = run(b, images, args.rounds, not args.no_spin, picked)
            print(f"{'variant':38s} {'median s':>9s} {'max s':>7s}")
            for v, xs in res.items():
                print(f"{v:38s} {statistics.median(xs):9.2f} {max(xs):7.2f}")
        if not args.no_passes:
            cycles: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            for r in range(args.rounds):
                for background in ((True, False) if r % 2 == 0 else (False, True)):
                    got = pass_latency(b, images, background, not args.no_spin, f"{r}{int(background)}")
                    cycles[background].append(got)
                    print(f"  round {r} stop {'off the pass' if background else 'in the pass '}: cycle "
                          f"{got[0]:7.2f} s, placeholder gone after {got[1]:7.2f} s (load {os.getloadavg()[0]:.1f})",
                          flush=True)
            head = "agent cycle that stops a paused placeholder"
            print(f"{head:44s} {'median s':>9s} {'max s':>7s} {'gone, median s':>15s}")
            for background in (False, True):
                xs = [c for c, _ in cycles[background]]
                gone = [g for _, g in cycles[background]]
                label = "stop off the pass (this code)" if background else "stop in the pass (before)"
                print(f"{label:44s} {statistics.median(xs):9.2f} {max(xs):7.2f} {statistics.median(gone):15.2f}")
    finally:
        remove_vms(b, PREFIX)
        b.close()
        if cgroup is not None:
            from vmctl.whatif.fidelity import release_cgroup

            release_cgroup(cgroup)
        shutdown_shared()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
