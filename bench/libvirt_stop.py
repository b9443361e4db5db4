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
* ``paused, weight raised then destroy``: ``cpu_shares`` set to the top first (what the backend's
  ``stop`` now does);
* ``paused, backend stop``: ``LibvirtBackend.stop`` of this code.

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


def run(b: Any, images: str, rounds: int, spin: bool) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        bgs: dict[str, str] = {}
        for i, v in enumerate(VARIANTS):
            name = f"{PREFIX}bg{r}-{i}"
            b.define(VmSpec(name=name, memory_mib=32, image=f"{images}/idle.img"))
            b.pin_vcpus(name, (0,))
            b.set_cpu_tune(name, weight=WEIGHT_MIN)
            b.start(name)
            if not v.startswith("running"):
                b.suspend(name)
            bgs[v] = name
        fgs: list[str] = []
        if spin:
            for core in range(min(2, os.cpu_count() or 1)):
                name = f"{PREFIX}fg{r}-{core}"
                b.define(VmSpec(name=name, memory_mib=32, image=f"{images}/spin.img"))
                b.pin_vcpus(name, (core,))
                b.set_cpu_tune(name, weight=WEIGHT_MAX)
                b.start(name)
                fgs.append(name)
            time.sleep(2.0)  # let them spin
        try:
            for v in VARIANTS:
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
    try:
        shares = MACHINE_SHARES.read_text().strip() if MACHINE_SHARES.exists() else "n/a"
        print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; "
              f"machine cgroup cpu.shares {shares}; guests {args.type}; fg spinning: {not args.no_spin}")
        res = run(b, images, args.rounds, not args.no_spin)
        print(f"{'variant':38s} {'median s':>9s} {'max s':>7s}")
        for v, xs in res.items():
            print(f"{v:38s} {statistics.median(xs):9.2f} {max(xs):7.2f}")
    finally:
        remove_vms(b, PREFIX)
        b.close()
        shutdown_shared()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
