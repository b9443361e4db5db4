"""The demo on real libvirt (``vmctl demo --backend libvirt``): its agents boot real guests and run the
jobs' processes in them over SSH.

The guest is the one the task-bag testbed boots (``vmctl.guestimage``: a Debian
kernel and a busybox + dropbear initramfs, direct kernel boot, no disk), built once and cached in
``--guest-dir`` (default ``/var/cache/vmctl/guest``, the tests' and the testbed's cache); every VM boots
that kernel and initramfs read-only, so a run copies no image and defines no disk. Each agent gets the
``ssh`` section of :func:`vmctl.localcluster.ssh_guest_config` (the agent's ``ParamikoRunner`` logs
in with the image's key through a loopback port QEMU forwards to the guest's SSH) and TCG guests
(``domain_type: qemu``, as the testbed: on these machines ``/dev/kvm`` is an emulated kind on which a
guest boots slower than under TCG).

One libvirtd, several agents. Every agent of the demo talks to the same local libvirtd (``--libvirt-uri``),
so the demo keeps them apart: distinct node names (``node1`` ...), hence distinct VM names (vmctld's
``j<id>-r<run>-p<k>`` are unique in the cluster, the layout's are ``<node>-c<k>-<level>``), one block of
free loopback ports for all the agents' forwarded SSH ports (:func:`ssh_port_blocks`: ranges taken one
by one could overlap), and each agent owns the VMs whose ``vmctl.node`` metadata names its node. The
agents get no ``peers``: libvirt refuses a migration to the daemon a VM already runs on (it compares host
UUIDs), so cross-node migration cannot work on one libvirtd, and an agent that registers an empty
``peers`` list tells vmctld to plan none (MEASY still starts jobs in the bg tier and promotes them).

A job process in the guest (:func:`guest_command`) checks that it runs in a guest of its own job (the
guest's hostname is its VM's name, from the kernel command line: ``j<job>-r<run>-p<k>``), sleeps for the
task's run time (real seconds: the libvirt demo compresses the workload's times instead of accelerating
a clock) and exits 0, so a job is ``done`` only when every one of its processes ran to its end in its
own guest. The processes sleep rather than spin: CPU-bound work in TCG guests on a shared 2-core
machine would make the demo's length depend on everything else the machine runs.

Nothing of a run outlives it: before it starts, the demo refuses a libvirtd that already holds VMs with
the demo's names (:func:`leftovers`: another cluster's or an earlier run's; their names would collide);
at the end, on success, failure or Ctrl-C, after its agents stopped, it destroys and undefines every
domain whose metadata names one of its nodes or whose name is a demo VM's (:func:`remove_demo_vms`), and
checks that none is left.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vmctl.errors import DemoError
from vmctl.localcluster import free_port_range

GUEST_DIR = Path("/var/cache/vmctl/guest")
SYSTEM_SOCKET = Path("/run/libvirt/libvirt-sock")
DOMAIN_TYPE = "qemu"  # TCG, as the task-bag testbed and the integration tests
LEVELS = 2  # the agents' default layout (fg/bg per core): the VMs per core that need an SSH port
#: how long an agent's SSH runner waits for a guest it booted (the runner's default is 120 s)
BOOT_TIMEOUT_S = 600.0
#: vmctld's ``loop.estimate_grace_s`` for the libvirt demo (real seconds): the SSH runner reports a job's
#: process from the moment it asks the guest, so its guest's boot counts against the job's estimate
ESTIMATE_GRACE_S = BOOT_TIMEOUT_S
JOB_VM = re.compile(r"^j\d+-r\d+-p\d+$")  # vmctld's names of job VMs (JobRecord.vm_name)


def guest_command(run_seconds: float) -> str:
    """The shell command a demo job's process runs in its guest: refuse to run anywhere but a guest of
    its own job, sleep ``run_seconds``, say where it ran."""
    return ('case "$(hostname)" in "j${VMCTL_JOB_ID}-r"*) ;; '
            '*) echo "not in a guest of job $VMCTL_JOB_ID: $(hostname)"; exit 7;; esac; '
            f'sleep {run_seconds:.3f}; echo "job $VMCTL_JOB_ID process $VMCTL_PROCESS_INDEX ran in $(hostname)"')


def check_libvirtd(uri: str) -> None:
    """A clear error when the local system libvirtd is not running (the URI names no other socket)."""
    if uri.startswith("qemu:///system") and "socket=" not in uri and not SYSTEM_SOCKET.exists():
        raise DemoError(what="--backend libvirt",
                        problem=f"libvirtd is not running ({SYSTEM_SOCKET} is missing): start it (virtlogd -d; "
                                "libvirtd -d), or run bash scripts/demo.sh --backend libvirt, which does")


def build_guest(guest_dir: Path, echo: Any) -> None:
    """Build the SSH guest into ``guest_dir``, or reuse the cached build there (same inputs)."""
    from vmctl.errors import VmctlError
    from vmctl.guestimage import build

    try:
        build(guest_dir, log=echo)
    except VmctlError as exc:
        raise DemoError(what="--guest-dir", problem=f"the SSH guest cannot be built in {guest_dir}: {exc}") from exc


def ssh_port_blocks(nodes: int, cores: int, levels: int = LEVELS) -> list[int]:
    """The first forwarded SSH port of each agent: one block of free loopback ports for all of them
    (``levels * cores`` each), so no two agents' ranges overlap."""
    per = levels * cores
    base = free_port_range(nodes * per)
    return [base + i * per for i in range(nodes)]


def host_cores(node_index: int, cores: int, available: int) -> list[int]:
    """The physical cores of agent ``node_index`` (0-based): the machine's cores dealt round-robin, so
    two single-core agents on a 2-core machine get core 0 and core 1."""
    if cores > available:
        raise DemoError(what="--cores", problem=f"{cores} cores per node, but this machine has {available}: with "
                                                "--backend libvirt a node's VMs are pinned to real cores")
    return [(node_index * cores + k) % available for k in range(cores)]


def libvirt_agent_config(cfg: dict[str, Any], guest_dir: Path, known_hosts: Path, ssh_base: int,
                         cores: Sequence[int]) -> dict[str, Any]:
    """An agent config of ``processes.agent_config`` (libvirt) made into one whose VMs boot the SSH guest
    on ``cores`` and run their processes there."""
    from vmctl.localcluster import ssh_guest_config

    extra = ssh_guest_config(guest_dir, known_hosts, ssh_base, LEVELS * len(cores), domain_type=DOMAIN_TYPE)
    out = {k: v for k, v in cfg.items() if k != "peers"}  # one libvirtd: no migration between its agents
    out["backend"] = {**cfg["backend"], **extra["backend"]}
    out["layout"] = {**cfg.get("layout", {}), "cores": list(cores), "levels": LEVELS, **extra["layout"]}
    # a bg guest boots on the cycles its core's fg VM leaves: on a busy machine that can take minutes
    out["ssh"] = {**extra["ssh"], "boot_timeout_seconds": BOOT_TIMEOUT_S}
    # a booting guest aborts the agent's passes until its SSH answers: retry soon
    out["reconcile"] = {"resync_seconds": 1.0, "backoff_initial_seconds": 0.2, "backoff_max_seconds": 1.0}
    return out


def _demo_vm(name: str, metadata: dict[str, str], nodes: set[str]) -> bool:
    # the agents' metadata key naming a VM's node (vmctl.agents.layout.META_NODE; the CLI does not import
    # the agent's modules)
    return metadata.get("vmctl.node") in nodes or JOB_VM.match(name) is not None \
        or any(name.startswith(f"{n}-c") for n in nodes)


def _backend(uri: str) -> Any:
    try:
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError as exc:
        raise DemoError(what="--backend libvirt", problem=f"libvirt-python is not installed: {exc}") from exc
    from vmctl.errors import VmctlError

    try:
        return LibvirtBackend(uri, domain_type=DOMAIN_TYPE)
    except VmctlError as exc:
        raise DemoError(what="--libvirt-uri", problem=f"cannot open {uri}: {exc}") from exc


def leftovers(uri: str, nodes: set[str]) -> list[str]:
    """The domains of ``uri`` whose names a demo with ``nodes`` would use, or whose metadata names one
    of them."""
    b = _backend(uri)
    try:
        return sorted(v.name for v in b.list_vms() if _demo_vm(v.name, v.metadata, nodes))
    finally:
        b.close()


def check_no_leftovers(uri: str, nodes: set[str]) -> None:
    left = leftovers(uri, nodes)
    if left:
        shown = ", ".join(left[:6]) + (" ..." if len(left) > 6 else "")
        raise DemoError(what=f"libvirt {uri}",
                        problem=f"already holds {len(left)} VMs with the demo's names ({shown}): another vmctl "
                                f"cluster or an earlier run uses this libvirtd; remove them (virsh -c {uri} destroy "
                                "NAME; virsh undefine NAME) or use another libvirtd (--libvirt-uri)")


def remove_demo_vms(uri: str, nodes: set[str], settle_s: float = 3.0,
                    timeout_s: float = 90.0) -> tuple[list[str], list[str]]:
    """Destroy and undefine every domain of the demo's ``nodes`` (after its agents stopped); returns the
    names removed and the names still there at the end (should be none).

    An agent stopped in the middle of a libvirt call leaves that call to libvirtd, which may finish it
    after the agent is gone (a ``define`` that waits for libvirtd to probe QEMU can take tens of seconds
    on a loaded machine): so the demo removes, then looks again until no domain of its nodes has been
    seen for ``settle_s`` seconds (at most ``timeout_s``)."""
    b = _backend(uri)
    removed: set[str] = set()
    left: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        quiet_since: float | None = None
        while True:
            names = [v.name for v in b.list_vms() if _demo_vm(v.name, v.metadata, nodes)]
            for name in names:
                with contextlib.suppress(Exception):
                    b.stop(name, force=True)
                with contextlib.suppress(Exception):
                    b.undefine(name)
                removed.add(name)
            left = sorted(v.name for v in b.list_vms() if _demo_vm(v.name, v.metadata, nodes))
            now = time.monotonic()
            if left or names:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            if (quiet_since is not None and now - quiet_since >= settle_s) or now > deadline:
                break
            time.sleep(0.5)
    finally:
        b.close()
    return sorted(removed), left
