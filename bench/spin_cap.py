"""Does a CPU cap stretch a spinning job process in a real guest as the model says? (issue 28, vcsched's
real-libvirt fidelity run)

    python -m bench.spin_cap [--cap 0.4] [--cpu 8] [--rounds 2] [--type qemu]

The what-if testbed's CPU-bound guest processes (:func:`vmctl.whatif.fidelity.spin_command`) consume a
given amount of **their own CPU time**, as the guest kernel counts it, and the model (mock agents, the
replay) says a cap of ``c`` stretches such a process by ``1/c``. This boots one SSH guest of
``vmctl.guestimage`` (pinned to core 0, libvirtd started here if it is not running and stopped again) and
runs the spin for ``--cpu`` seconds of CPU, alternately uncapped (the baseline, in the same process) and
capped at ``--cap`` (``vcpu_quota``), ``--rounds`` times each. Per run: the wall time of the SSH command,
the domain's CPU time as the host counts it (libvirt), and the guest's clock (``/proc/uptime``) over the
run. Printed: the capped/uncapped wall ratio against the model's ``1/cap``, and the host CPU time against
the spin's target. The VM is named ``bench<pid>-...`` and removed at the end.
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

PREFIX = f"bench{os.getpid()}-"
GUEST_DIR = Path("/var/cache/vmctl/guest")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spin_cap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap", type=float, default=0.4)
    ap.add_argument("--cpu", type=float, default=8.0, help="CPU seconds the spin consumes (as the guest counts)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--type", default="qemu", choices=("qemu", "kvm"), help="domain type (qemu = TCG)")
    ap.add_argument("--boot-capped", action="store_true",
                    help="boot the guest under the cap (as the agents do: a shared VM is tuned before it starts)")
    a = ap.parse_args(argv)
    if not 0 < a.cap < 1 or a.cpu <= 0 or a.rounds < 1:
        print("error: --cap must be in (0, 1), --cpu > 0, --rounds >= 1")
        return 2
    try:
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError:
        print("libvirt-python is not installed: nothing to measure")
        return 0
    from tests.integration.libvirt_hosts import Unavailable, shared_system, shutdown_shared
    from vmctl.agents.remote import ParamikoRunner, SshSettings
    from vmctl.guestimage import build
    from vmctl.localcluster import free_port_range
    from vmctl.whatif.fidelity import spin_command

    try:
        shared_system()
    except Unavailable as exc:
        print(f"libvirt unavailable here: {exc}")
        return 0
    b = LibvirtBackend("qemu:///system", domain_type=a.type)
    try:
        guest = build(GUEST_DIR)
        print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; domain type {a.type}; "
              f"spin of {a.cpu:g} CPU s, cap {a.cap:g}")
        port = free_port_range(1)
        addr = f"127.0.0.1:{port}"
        name = f"{PREFIX}spin"
        # the spin's work in model seconds at speed 1 and usage 1: it consumes exactly --cpu seconds of CPU
        env = {"VMCTL_WORK_SECONDS": f"{a.cpu:.2f}", "VMCTL_CPU_USAGE": "1.000"}
        with tempfile.TemporaryDirectory() as tmp:
            kh = Path(tmp) / "known_hosts"
            kh.write_text(f"[127.0.0.1]:{port} {guest.host_key}\n")
            runner = ParamikoRunner(SshSettings(user="root", key_file=str(guest.key_file), known_hosts=str(kh),
                                                connect_timeout=2.0), lambda vm: addr)
            b.define(VmSpec(name=name, memory_mib=128, kernel=str(guest.kernel), initrd=str(guest.initrd),
                            cmdline="quiet", ssh_port=port))
            b.pin_vcpus(name, (0,))
            if a.boot_capped:
                b.set_cpu_tune(name, cap=a.cap)
            b.start(name)
            t = time.monotonic()
            while True:
                try:
                    if runner.run(addr, "true", timeout=10).exit_code == 0:
                        break
                except Exception:  # not up yet (refused, no banner, reset)
                    time.sleep(0.2)
                if time.monotonic() - t > 300:
                    raise SystemExit(f"{name}: no SSH answer after 300 s")
            print(f"booted to SSH in {time.monotonic() - t:.1f} s{' under the cap' if a.boot_capped else ''}")

            def cpu() -> float:
                return next(v.cpu_time_s for v in b.list_vms() if v.name == name)

            def uptime() -> float:
                return float(runner.run(addr, "cat /proc/uptime", timeout=30).output_tail.split()[0])

            runs: dict[str, list[tuple[float, float, float]]] = {"uncapped": [], "capped": []}
            for _ in range(a.rounds):
                for label, cap in (("uncapped", None), ("capped", a.cap)):
                    b.set_cpu_tune(name, cap=cap, clear_cap=cap is None)
                    g0, c0, t0 = uptime(), cpu(), time.monotonic()
                    res = runner.run(addr, spin_command(1.0), env=env, timeout=3600)
                    wall, host = time.monotonic() - t0, cpu() - c0
                    gclock = uptime() - g0
                    if res.exit_code != 0:
                        raise SystemExit(f"spin exited {res.exit_code}: {res.output_tail[-300:]}")
                    runs[label].append((wall, host, gclock))
                    print(f"  {label:<8} wall {wall:6.2f} s  host CPU of the domain {host:6.2f} s  guest clock "
                          f"{gclock:6.2f} s  load {os.getloadavg()[0]:.1f}", flush=True)
        med = statistics.median
        wu, wc = med(r[0] for r in runs["uncapped"]), med(r[0] for r in runs["capped"])
        hu, hc = med(r[1] for r in runs["uncapped"]), med(r[1] for r in runs["capped"])
        print(f"capped / uncapped wall: {wc / wu:.2f}x (the model: 1/cap = {1 / a.cap:.2f}x); host CPU per run "
              f"uncapped {hu:.2f} s, capped {hc:.2f} s (the spin's target {a.cpu:g} s as the guest counts it)")
    finally:
        remove_vms(b, PREFIX)
        b.close()
        shutdown_shared()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
