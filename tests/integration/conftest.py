"""Fixtures for the real-hypervisor tests (marker ``libvirt``): they install and start what they
need (libvirtd, virtlogd, a peer libvirtd in its own mount namespace) and stop only what they
started, by pid. Every domain a test defines is named ``it<pid>-...`` and removed at the end, even
on failure."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.integration.libvirt_hosts import (
    PeerHost,
    Unavailable,
    boost_machine_cgroup,
    shared_images,
    shared_peer,
    shared_system,
)
from tests.support.guests import COUNTER_ADDR, decode_counter
from tests.support.hosts import remove_vms
from tests.support.libvirt import cpu_time_s, memory_peek

PREFIX = f"it{os.getpid()}-"


def _backend_class() -> Any:
    try:
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError as exc:
        pytest.skip(f"libvirt-python is not installed: {exc}")
    return LibvirtBackend


def kvm_usable() -> str | None:
    """None when KVM guests can run here, else the reason they cannot."""
    if not os.path.exists("/dev/kvm"):
        return "/dev/kvm is missing (no hardware virtualization): KVM variant skipped, TCG covers it"
    return None


@pytest.fixture(scope="session")
def system_host() -> Any:
    try:
        return shared_system()
    except Unavailable as exc:
        pytest.skip(f"libvirt cannot be started here: {exc}")


@pytest.fixture(scope="session")
def images(system_host: Any) -> Path:
    return shared_images()


def cleanup(backend: Any) -> None:
    remove_vms(backend, PREFIX)


def counter(b: Any, name: str) -> int:
    """The boot-sector guest's in-memory counter (it counts while the guest runs)."""
    return decode_counter(memory_peek(b, name, COUNTER_ADDR, 8))


def wait_counting(b: Any, name: str, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = counter(b, name)
        if c > 0:
            return c
        time.sleep(0.1)
    raise AssertionError(f"{name} never started counting")


def wait_counter_above(b: Any, name: str, value: int, timeout: float = 60.0) -> int:
    """The guest's counter once it is above ``value`` (the guest runs), however slowly the host gives it
    CPU time."""
    deadline = time.monotonic() + timeout
    while True:
        c = counter(b, name)
        if c > value:
            return c
        assert time.monotonic() < deadline, f"{name}'s counter stayed at {c} for {timeout:.0f} s: it does not run"
        time.sleep(0.05)


def vcpu_cap(uri: str, name: str) -> float | None:
    """The CPU cap libvirt holds for a domain (vcpu_quota / vcpu_period), None when uncapped."""
    import libvirt

    conn = libvirt.open(uri)
    try:
        params = conn.lookupByName(name).schedulerParameters()
    finally:
        conn.close()
    quota, period = params.get("vcpu_quota"), params.get("vcpu_period")
    if quota is None or period is None or quota <= 0:
        return None
    return float(quota) / float(period)


@pytest.fixture(scope="session")
def qemu(system_host: Any) -> Iterator[Any]:
    """The system libvirtd with TCG guests (fast to boot here)."""
    b = _backend_class()("qemu:///system", domain_type="qemu")
    try:
        yield b
    finally:
        cleanup(b)
        b.close()


@pytest.fixture(scope="session")
def peer(system_host: Any) -> PeerHost:
    try:
        return shared_peer()
    except Unavailable as exc:
        pytest.skip(f"cannot start a second libvirtd for migration: {exc}")


@pytest.fixture(scope="session")
def peer_qemu(peer: PeerHost) -> Iterator[Any]:
    b = _backend_class()(peer.uri, domain_type="qemu")
    try:
        yield b
    finally:
        cleanup(b)
        b.close()


@dataclass
class Sample:
    """CPU use over one window: ``frac[name]`` = VM CPU seconds per wall second; ``idle[core]`` =
    the fraction of the window that physical core was idle (psutil)."""

    wall: float
    frac: dict[str, float]
    idle: dict[int, float]


def measure(backend: Any, names: list[str], seconds: float) -> Sample:
    c0 = {n: cpu_time_s(backend, n) for n in names}
    p0 = psutil.cpu_times(percpu=True)
    t0 = time.monotonic()
    time.sleep(seconds)
    c1 = {n: cpu_time_s(backend, n) for n in names}
    p1 = psutil.cpu_times(percpu=True)
    wall = time.monotonic() - t0
    idle = {i: max(0.0, (b.idle + getattr(b, "iowait", 0.0)) - (a.idle + getattr(a, "iowait", 0.0))) / wall
            for i, (a, b) in enumerate(zip(p0, p1, strict=True))}
    return Sample(wall=wall, frac={n: (c1[n] - c0[n]) / wall for n in names}, idle=idle)


def spawn(backend: Any, name: str, image: Path, core: int, weight: int | None = None, cap: float | None = None,
          memory_mib: int = 32, metadata: dict[str, str] | None = None, start: bool = True) -> str:
    from vmctl.agents.backends.base import VmSpec

    full = PREFIX + name
    backend.define(VmSpec(name=full, vcpus=1, memory_mib=memory_mib, image=str(image), metadata=metadata or {}))
    backend.pin_vcpus(full, (core,))
    if weight is not None or cap is not None:
        backend.set_cpu_tune(full, weight=weight, cap=cap)
    if start:
        backend.start(full)
        boost_machine_cgroup()  # exists once libvirt started a first guest
    return full
