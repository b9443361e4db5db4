"""What is left on the hosts: the job VMs (vmctld's names, ``j<job>-r<run>-p<index>``) that each host
still has, read from backends in this process or from the state files of mock agent processes. A test
that ends its jobs asserts that none is left ("nothing of a run outlives the run, on any host").
``remove_vms`` clears a host of the VMs a test or benchmark made under its own name prefix."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from vmctl.agents.backends.base import HypervisorBackend
from vmctl.daemon.state import parse_vm_name


def job_vms_left(hosts: Iterable[HypervisorBackend]) -> dict[str, list[str]]:
    """Host (the backend's ``uri``, else its name) -> the job VMs defined there, for hosts that have any."""
    out: dict[str, list[str]] = {}
    for b in hosts:
        names = sorted(v.name for v in b.list_vms() if parse_vm_name(v.name) is not None)
        if names:
            out[str(getattr(b, "uri", b.name))] = names
    return out


def job_vms_in_state_files(paths: Iterable[Path]) -> dict[str, list[str]]:
    """The same for mock hosts kept by agent processes (``backend.state_file``): file -> job VMs in it."""
    out: dict[str, list[str]] = {}
    for p in paths:
        state = json.loads(Path(p).read_text(encoding="utf-8"))
        names = sorted(str(v["spec"]["name"]) for v in state["vms"] if parse_vm_name(str(v["spec"]["name"])))
        if names:
            out[str(p)] = names
    return out


def wait_job_vms_gone(hosts: Sequence[HypervisorBackend], timeout: float = 30.0) -> dict[str, list[str]]:
    """Wait (up to ``timeout`` s) for the agents to remove every job VM; returns what is still left."""
    deadline = time.monotonic() + timeout
    left = job_vms_left(hosts)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = job_vms_left(hosts)
    return left


def remove_vms(backend: HypervisorBackend, prefix: str) -> list[str]:
    """Stop and undefine every VM whose name starts with ``prefix``, best effort (a VM that is already
    gone or refuses is left to the next call); returns the names it tried. For tests and benchmarks
    that name their VMs with a per-process prefix and must leave the host as they found it."""
    names = [v.name for v in backend.list_vms() if v.name.startswith(prefix)]
    for name in names:
        with contextlib.suppress(Exception):
            backend.stop(name)
        with contextlib.suppress(Exception):
            backend.undefine(name)
    return names
