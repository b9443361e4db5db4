"""libvirt in the contract suite: the in-process test driver (``test:///default``, no daemon needed)
and real QEMU (``qemu:///system``, TCG guests from boot-sector images, a second libvirtd in its own
mount namespace as migration peer). Operations the test driver lacks are absent from its
``capabilities()``, so the suite skips them by name ("backend lacks cpu_weight, ...")."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vmctl.agents.backends.base import HypervisorBackend, VmSpec


@dataclass
class LibvirtHarness:
    backend: HypervisorBackend
    peer: HypervisorBackend | None = None
    peer_uri: str = ""
    migrate_uri: str | None = None
    cpu_stats_real: bool = False
    images: Path | None = None
    extra: list[HypervisorBackend] = field(default_factory=list)

    def spec(self, name: str) -> VmSpec:
        image = str(self.images / "idle.img") if self.images is not None else None
        return VmSpec(name=name, vcpus=1, memory_mib=32, image=image, metadata={"vmctl.test": "contract"})

    def busy_spec(self, name: str) -> VmSpec | None:
        if self.images is None:
            return None
        return VmSpec(name=name, vcpus=1, memory_mib=32, image=str(self.images / "spin.img"),
                      metadata={"vmctl.test": "contract"})

    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    def close(self) -> None:
        for b in [self.backend, *([self.peer] if self.peer is not None else [])]:
            try:
                for v in b.list_vms():
                    if v.name.startswith("ct-"):
                        b.stop(v.name)
                        b.undefine(v.name)
            finally:
                b.close()


def _libvirt_backend(uri: str, **kw: object) -> HypervisorBackend:
    try:
        from vmctl.agents.backends.libvirt.backend import LibvirtBackend
    except ImportError as exc:  # pragma: no cover - depends on the machine
        pytest.skip(f"libvirt-python is not installed: {exc}")
    return LibvirtBackend(uri, **kw)  # type: ignore[arg-type]


def make_test_driver(tmp: Path) -> LibvirtHarness:
    return LibvirtHarness(backend=_libvirt_backend("test:///default"))


def make_qemu(tmp: Path) -> LibvirtHarness:
    from tests.integration.libvirt_hosts import (
        Unavailable,
        boost_machine_cgroup,
        shared_images,
        shared_peer,
        shared_system,
    )

    try:
        shared_system()
        images = shared_images()
    except Unavailable as exc:
        pytest.skip(f"libvirt/QEMU unavailable: {exc}")
    backend = _libvirt_backend("qemu:///system", domain_type="qemu")
    boost_machine_cgroup()  # guests' CPU time should not depend on what else this machine runs
    peer_backend: HypervisorBackend | None = None
    peer_uri = ""
    try:
        peer = shared_peer()
        peer_backend = _libvirt_backend(peer.uri, domain_type="qemu")
        peer_uri = peer.uri
    except Unavailable:
        peer_backend = None  # the migration test skips: "no second host for this backend"
    return LibvirtHarness(backend=backend, peer=peer_backend, peer_uri=peer_uri, migrate_uri="tcp://127.0.0.1",
                          cpu_stats_real=True, images=images)


FACTORIES: dict[str, Callable[[Path], LibvirtHarness]] = {
    "libvirt-test": make_test_driver,
    "libvirt-qemu": make_qemu,
}
MARKS: dict[str, list[pytest.MarkDecorator]] = {"libvirt-qemu": [pytest.mark.libvirt]}
