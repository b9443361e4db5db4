"""Live migration between two real libvirt hosts on this machine: the system libvirtd and a second
libvirtd in its own mount + UTS namespace (tests/integration/libvirt_hosts.py). The VM goes over
peer-to-peer with a TCP migration URI and comes back client-managed over a UNIX socket; pinning,
weight and cap travel with it and its in-memory counter keeps going. Also: abort, and reconnecting
after the peer's libvirtd restarts."""

from __future__ import annotations

import os
import pwd
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import counter, spawn, wait_counter_above, wait_counting
from tests.integration.libvirt_hosts import PeerHost
from tests.support.libvirt import domain_id, scheduler_parameters, wait_migration
from vmctl.agents.backends.base import MigrationState, VmInfo
from vmctl.errors import ValidationError, VmStateError
from vmctl.nodedoc import PowerState

pytestmark = pytest.mark.libvirt


def _info(b: Any, name: str) -> VmInfo | None:
    return {v.name: v for v in b.list_vms()}.get(name)


def _unix_dir(images: Path) -> Path:
    """A folder both QEMUs (user libvirt-qemu) can create a socket in."""
    d = images / "migration"
    d.mkdir(exist_ok=True)
    try:
        pw = pwd.getpwnam("libvirt-qemu")
        os.chown(d, pw.pw_uid, pw.pw_gid)
    except KeyError:
        os.chmod(d, 0o777)
    return d


def _check_tuned(b: Any, name: str, shares: int) -> None:
    v = _info(b, name)
    assert v is not None and v.power is PowerState.RUNNING
    assert v.pinned_cores == (1,) and v.weight == 10000 and v.cap == pytest.approx(0.5)
    assert v.metadata == {"job": "7", "tier": "fg"}
    raw = scheduler_parameters(b, name)
    assert raw["cpu_shares"] == shares and raw["vcpu_quota"] == 50000 and raw["vcpu_period"] == 100000


def test_migrate_there_and_back(qemu: Any, peer_qemu: Any, peer: PeerHost, images: Path) -> None:
    name = spawn(qemu, "mig", images / "spin.img", 1, weight=10000, cap=0.5, metadata={"job": "7", "tier": "fg"})
    before = wait_counting(qemu, name)
    shares = scheduler_parameters(qemu, name)["cpu_shares"]

    # there: peer-to-peer (the source libvirtd talks to the peer), data over TCP on loopback
    qemu.start_migration(name, peer.uri, "tcp://127.0.0.1", peer_to_peer=True)
    qemu.start_migration(name, peer.uri, "tcp://127.0.0.1")  # idempotent while it runs
    st = wait_migration(qemu, name, timeout=90)
    assert st.state is MigrationState.COMPLETED, st.error
    assert st.elapsed_s > 0
    assert _info(qemu, name) is None  # undefined on the source
    _check_tuned(peer_qemu, name, shares)
    there = counter(peer_qemu, name)
    assert there >= before, "the guest restarted instead of migrating"

    # back: client-managed (this process drives both sides), data over a UNIX socket
    sock = _unix_dir(images) / f"{name}.sock"
    peer_qemu.start_migration(name, "qemu:///system", f"unix://{sock}", peer_to_peer=False)
    st = wait_migration(peer_qemu, name, timeout=90)
    assert st.state is MigrationState.COMPLETED, st.error
    assert _info(peer_qemu, name) is None
    _check_tuned(qemu, name, shares)
    back = counter(qemu, name)
    assert back >= there
    wait_counter_above(qemu, name, back)  # the migrated guest runs
    qemu.stop(name)
    qemu.undefine(name)


def test_abort_keeps_the_vm_on_the_source(qemu: Any, peer_qemu: Any, peer: PeerHost, images: Path) -> None:
    # 256 MiB of guest RAM so the transfer takes long enough to be caught mid-way
    name = spawn(qemu, "abort", images / "spin.img", 0, memory_mib=256)
    wait_counting(qemu, name)
    qemu.start_migration(name, peer.uri, "tcp://127.0.0.1")
    qemu.abort_migration(name)
    st = qemu.migration_status(name)
    assert st.state is MigrationState.ABORTED, st
    qemu.abort_migration(name)  # idempotent once it ended
    v = _info(qemu, name)
    assert v is not None and v.power is PowerState.RUNNING
    assert _info(peer_qemu, name) is None
    qemu.stop(name)
    qemu.undefine(name)


def test_migration_errors(qemu: Any, peer: PeerHost, images: Path) -> None:
    name = spawn(qemu, "migerr", images / "idle.img", 0, start=False)
    with pytest.raises(VmStateError):
        qemu.start_migration(name, peer.uri, "tcp://127.0.0.1")  # not running
    with pytest.raises(VmStateError):
        qemu.migration_status(name)  # nothing in progress
    with pytest.raises(ValidationError, match="migrate_uri"):
        qemu.start_migration(name, peer.uri, "ftp://x")
    qemu.start(name)
    qemu.start_migration(name, "qemu+unix:///system?socket=/nonexistent/sock", "tcp://127.0.0.1")
    st = wait_migration(qemu, name, timeout=30)
    assert st.state is MigrationState.FAILED and st.error
    assert _info(qemu, name).power is PowerState.RUNNING  # type: ignore[union-attr]
    qemu.stop(name)
    qemu.undefine(name)


def test_reconnects_after_the_peer_daemon_restarts(peer_qemu: Any, peer: PeerHost, images: Path) -> None:
    name = spawn(peer_qemu, "reconn", images / "idle.img", 0)
    dom_id = domain_id(peer_qemu, name)
    reconnects = peer_qemu.reconnects
    peer.restart()
    v = _info(peer_qemu, name)  # the first call after the restart finds the connection dead
    assert v is not None and v.power is PowerState.RUNNING
    assert domain_id(peer_qemu, name) == dom_id  # libvirtd restarts never restart guests
    assert peer_qemu.reconnects > reconnects
    time.sleep(1.0)  # the restarted libvirtd re-attaches its QEMUs in the background
    v = _info(peer_qemu, name)
    assert v is not None and v.power is PowerState.RUNNING and domain_id(peer_qemu, name) == dom_id
    peer_qemu.stop(name)
    peer_qemu.undefine(name)


def test_a_restarted_agent_sees_and_aborts_a_running_migration(
        qemu: Any, peer_qemu: Any, peer: PeerHost, images: Path) -> None:
    from vmctl.agents.backends.libvirt.backend import LibvirtBackend

    name = spawn(qemu, "adoptmig", images / "spin.img", 0, memory_mib=256)
    wait_counting(qemu, name)
    fresh = LibvirtBackend("qemu:///system", domain_type="qemu")  # knows nothing of the migration
    try:
        qemu.start_migration(name, peer.uri, "tcp://127.0.0.1")
        seen = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and qemu.migration_status(name).state is MigrationState.RUNNING:
            try:
                seen = fresh.migration_status(name)  # from libvirt's job, not from memory
                break
            except VmStateError:
                time.sleep(0.01)  # libvirt's job has not begun yet
        if seen is None:
            pytest.fail(f"never saw the migration running: {qemu.migration_status(name)}")
        assert seen.state is MigrationState.RUNNING
        fresh.abort_migration(name)
        st = wait_migration(qemu, name, timeout=60)
        assert st.state is MigrationState.FAILED and st.error  # aborted by someone else
        assert _info(qemu, name).power is PowerState.RUNNING  # type: ignore[union-attr]
        assert _info(peer_qemu, name) is None
    finally:
        fresh.close()
    qemu.stop(name)
    qemu.undefine(name)
