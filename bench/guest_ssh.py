"""The SSH worker guest on real libvirt (issue 12's testbed): boot time and per-task SSH hand-off.

    python -m bench.guest_ssh [--boots 5] [--tasks 20] [--type qemu]

Starts libvirtd if it is not running (and stops it again), builds the guest of
``vmctl.guestimage`` (cached in /var/cache/vmctl/guest), then measures, with one
VM at a time pinned to core 0:

1. Boot: define + start of the SSH guest until a command answers over SSH through its forwarded port
   (``ParamikoRunner.run("true")``, retried every 50 ms), against the baseline of the same define + start
   of the boot-sector idle guest (libvirt's start returning: what a VM without an OS costs).
2. Hand-off: in a booted guest, ``ParamikoRunner.start`` of a job process (``true``) until ``status``
   reports its exit (polled every 10 ms): what the agent adds to each task besides the task itself
   (a new SSH session per task), p50/p99, against ``run("true")`` (one synchronous session).

Every VM is named ``bench<pid>-...`` and removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from tests.support.hosts import remove_vms
from vmctl.agents.backends.base import VmSpec
from vmctl.nodedoc import ProcessSpec

PREFIX = f"bench{os.getpid()}-"
GUEST_DIR = Path("/var/cache/vmctl/guest")


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.guest_ssh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--boots", type=int, default=5)
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--type", default="qemu", choices=("qemu", "kvm"), help="domain type (qemu = TCG)")
    args = ap.parse_args(argv)
    try:
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError:
        print("libvirt-python is not installed: nothing to measure")
        return 0
    from tests.integration.libvirt_hosts import Unavailable, shared_images, shared_system, shutdown_shared
    from vmctl.agents.remote import ParamikoRunner, SshSettings
    from vmctl.guestimage import build
    from vmctl.localcluster import free_port_range

    try:
        shared_system()
        images = shared_images()
    except Unavailable as exc:
        print(f"libvirt unavailable here: {exc}")
        return 0
    b = LibvirtBackend("qemu:///system", domain_type=args.type)
    try:
        guest = build(GUEST_DIR)
        m = guest.manifest()
        print(f"guest: kernel {m['kernel_release']} {int(str(m['kernel_bytes'])) / 1e6:.1f} MB, initrd "
              f"{int(str(m['initrd_bytes'])) / 1e6:.1f} MB, built in {m['build_seconds']} s")
        print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; domain type {args.type}")
        port = free_port_range(1)
        addr = f"127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as tmp:
            kh = Path(tmp) / "known_hosts"
            kh.write_text(f"[127.0.0.1]:{port} {guest.host_key}\n")
            runner = ParamikoRunner(SshSettings(user="root", key_file=str(guest.key_file), known_hosts=str(kh),
                                                connect_timeout=2.0), lambda vm: addr)
            bare: list[float] = []
            boots: list[float] = []
            for i in range(args.boots):
                name = f"{PREFIX}bare{i}"
                t = time.monotonic()
                b.define(VmSpec(name=name, memory_mib=32, image=str(images / "idle.img")))
                b.pin_vcpus(name, (0,))
                b.start(name)
                bare.append(time.monotonic() - t)
                remove_vms(b, name)
                name = f"{PREFIX}ssh{i}"
                t = time.monotonic()
                b.define(VmSpec(name=name, memory_mib=128, kernel=str(guest.kernel), initrd=str(guest.initrd),
                                cmdline="quiet", ssh_port=port))
                b.pin_vcpus(name, (0,))
                b.start(name)
                while True:
                    try:
                        if runner.run(addr, "true", timeout=10).exit_code == 0:
                            break
                    except Exception:  # not up yet (refused, no banner, reset)
                        time.sleep(0.05)
                    if time.monotonic() - t > 120:
                        raise SystemExit(f"{name}: no SSH answer after 120 s")
                boots.append(time.monotonic() - t)
                if i < args.boots - 1:
                    remove_vms(b, name)
            sync: list[float] = []
            handoff: list[float] = []
            vm = f"{PREFIX}ssh{args.boots - 1}"
            for k in range(args.tasks):
                t = time.monotonic()
                runner.run(addr, "true")
                sync.append(time.monotonic() - t)
                t = time.monotonic()
                runner.start(vm, ProcessSpec(job_id="bench", index=k, command="true"))
                while True:
                    st = runner.status(vm)
                    if st is not None and st.exit_code is not None:
                        break
                    time.sleep(0.01)
                handoff.append(time.monotonic() - t)
        med = statistics.median
        print(f"boot to SSH (define + start until a command answers): median {med(boots):.2f} s "
              f"({min(boots):.2f}-{max(boots):.2f}, {len(boots)} boots)")
        print(f"  baseline, boot-sector guest define + start: median {med(bare) * 1000:.0f} ms; "
              f"ratio {med(boots) / med(bare):.1f}x")
        print(f"task hand-off (runner.start -> exit seen), {len(handoff)} tasks: "
              f"p50 {pct(handoff, 0.5) * 1000:.0f} ms, p99 {pct(handoff, 0.99) * 1000:.0f} ms")
        print(f"  baseline, one synchronous SSH command: p50 {pct(sync, 0.5) * 1000:.0f} ms, p99 "
              f"{pct(sync, 0.99) * 1000:.0f} ms; ratio {pct(handoff, 0.5) / pct(sync, 0.5):.2f}x")
    finally:
        remove_vms(b, PREFIX)
        b.close()
        shutdown_shared()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
