"""Guests that run job processes over SSH (issue 12's real-libvirt testbed): the guest image's parts
(newc cpio, kernel module dependencies, cache key), the domain XML of a direct-kernel-boot guest with a
forwarded SSH port, the agent config keys that ask for it (errors name the field), guest addresses with
ports, the layout's port per (core, level), and the testbed's per-task overheads."""

from __future__ import annotations

import gzip
import stat
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from vmctl import guestimage
from vmctl.agents.backends.base import VmSpec
from vmctl.agents.backends.libvirt.xml import QEMU_NS, domain_xml
from vmctl.agents.config import parse_agent_config, split_address
from vmctl.agents.layout import META_SSH_PORT, Layout
from vmctl.errors import ConfigError, GuestImageError, OutOfRange, ValidationError
from vmctl.experiments.taskbags_live import libvirt_overheads, task_command
from vmctl.guestimage import Cpio, cache_key, module_depends, resolve_modules
from vmctl.localcluster import free_port_range, ssh_guest_config
from vmctl.model import Discipline
from vmctl.nodedoc import VmDesired, VmRole


def _read_cpio(data: bytes) -> dict[str, tuple[int, bytes, tuple[int, int]]]:
    """name -> (mode, data, (rdevmajor, rdevminor)) of a newc archive, checking its layout as the kernel does."""
    out: dict[str, tuple[int, bytes, tuple[int, int]]] = {}
    pos = 0
    while True:
        assert data[pos:pos + 6] == b"070701", pos
        f = [int(data[pos + 6 + 8 * i: pos + 14 + 8 * i], 16) for i in range(13)]
        namesize, filesize = f[11], f[6]
        name = data[pos + 110: pos + 110 + namesize - 1].decode()
        assert data[pos + 110 + namesize - 1] == 0
        pos += 110 + namesize
        pos += -pos % 4
        body = data[pos: pos + filesize]
        pos += filesize
        pos += -pos % 4
        if name == "TRAILER!!!":
            assert len(data) % 512 == 0 and not data[pos:].strip(b"\0")
            return out
        assert f[2] == f[3] == 0 and f[5] == 0  # root-owned, mtime 0: deterministic
        out[name] = (f[1], body, (f[9], f[10]))


def test_cpio_newc_archive_the_kernel_can_unpack() -> None:
    c = Cpio()
    c.file("etc/rc", b"#!/bin/sh\necho hi\n", 0o755)
    c.symlink("bin/sh", "/bin/busybox")
    c.chardev("dev/console", 5, 1)
    c.dir("root/.ssh", 0o700)
    c.file("etc/rc", b"second copy is ignored")
    entries = _read_cpio(c.finish())
    assert entries["etc"][0] == stat.S_IFDIR | 0o755  # parents come first
    assert list(entries).index("etc") < list(entries).index("etc/rc")
    assert entries["etc/rc"] == (stat.S_IFREG | 0o755, b"#!/bin/sh\necho hi\n", (0, 0))
    assert entries["bin/sh"][0] == stat.S_IFLNK | 0o777 and entries["bin/sh"][1] == b"/bin/busybox"
    assert entries["dev/console"] == (stat.S_IFCHR | 0o600, b"", (5, 1))
    assert entries["root/.ssh"][0] == stat.S_IFDIR | 0o700
    assert gzip.decompress(gzip.compress(c.finish(), mtime=0)) == c.finish()


def _ko(path: Path, depends: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF junk\0license=GPL\0depends=" + depends.encode() + b"\0vermagic=6.1\0")


def test_kernel_modules_come_with_their_dependencies_first(tmp_path: Path) -> None:
    _ko(tmp_path / "drivers/net/virtio_net.ko", "net_failover,virtio,virtio_ring")
    _ko(tmp_path / "drivers/net/net_failover.ko", "failover")
    _ko(tmp_path / "net/core/failover.ko", "")
    _ko(tmp_path / "drivers/virtio/virtio.ko", "")
    _ko(tmp_path / "drivers/virtio/virtio_ring.ko", "")
    _ko(tmp_path / "drivers/virtio/virtio_pci.ko", "virtio_pci_modern_dev,virtio,virtio_ring")
    _ko(tmp_path / "drivers/virtio/virtio_pci_modern_dev.ko", "")
    assert module_depends(tmp_path / "drivers/net/net_failover.ko") == ["failover"]
    assert module_depends(tmp_path / "net/core/failover.ko") == []
    order = [p.stem for p in resolve_modules(tmp_path, ("virtio_pci", "virtio_net"))]
    assert order == ["virtio_pci_modern_dev", "virtio", "virtio_ring", "virtio_pci", "failover", "net_failover",
                     "virtio_net"]
    _ko(tmp_path / "drivers/net/broken.ko", "missing_mod")
    with pytest.raises(GuestImageError, match="module missing_mod is not in the kernel package"):
        resolve_modules(tmp_path, ("broken",))


def test_the_cache_key_follows_the_inputs() -> None:
    doc: dict[str, object] = {"builder": 1, "packages": {"busybox-static": "1:1.35.0-4"}, "init": "x"}
    assert cache_key(doc) == cache_key(dict(reversed(list(doc.items()))))
    assert cache_key(doc) != cache_key({**doc, "packages": {"busybox-static": "1:1.36.0-1"}})


def test_a_cached_build_is_reused_without_touching_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc: dict[str, object] = {"builder": 1, "packages": {"p": "1"}}
    monkeypatch.setattr(guestimage, "inputs", lambda: doc)
    for name in ("vmlinuz", "initrd.gz", "id_ed25519"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "manifest.json").write_text(f'{{"key": "{cache_key(doc)}"}}')
    said: list[str] = []
    (tmp_path / "initrd.gz").chmod(0o644)  # as an older builder left it
    img = guestimage.build(tmp_path, log=said.append)
    assert img.kernel == tmp_path / "vmlinuz" and said == [f"guest image {tmp_path}: cached (key {cache_key(doc)})"]
    # the initramfs holds the guest's SSH host key: its owner's only, also for a reused build
    assert stat.S_IMODE(img.initrd.stat().st_mode) == 0o600 and stat.S_IMODE(img.key_file.stat().st_mode) == 0o600
    monkeypatch.setattr(guestimage.shutil, "which", lambda tool: None)  # a changed input: a rebuild is needed
    monkeypatch.setattr(guestimage, "inputs", lambda: {**doc, "packages": {"p": "2"}})
    with pytest.raises(GuestImageError, match="guest image: tools: apt-get is not on PATH"):
        guestimage.build(tmp_path, log=None)


def test_a_build_is_used_when_apt_cannot_say_its_versions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_apt() -> dict[str, object]:
        raise GuestImageError(step="version of busybox-static", problem="apt knows no candidate version")

    monkeypatch.setattr(guestimage, "inputs", no_apt)
    with pytest.raises(GuestImageError, match="version of busybox-static"):  # nothing built there: no way on
        guestimage.build(tmp_path, log=None)
    for name in ("vmlinuz", "initrd.gz", "id_ed25519"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "manifest.json").write_text('{"key": "abc"}')
    said: list[str] = []
    assert guestimage.build(tmp_path, log=said.append).initrd == tmp_path / "initrd.gz"
    assert "the package versions cannot be read" in said[0] and "(key abc)" in said[0]


def test_direct_kernel_boot_with_a_forwarded_ssh_port() -> None:
    spec = VmSpec(name="j1-r1-p0", memory_mib=128, kernel="/g/vmlinuz", initrd="/g/initrd.gz", cmdline="quiet",
                  ssh_port=22001)
    dom = ET.fromstring(domain_xml(spec, "qemu"))
    assert dom.findtext("os/kernel") == "/g/vmlinuz" and dom.findtext("os/initrd") == "/g/initrd.gz"
    assert dom.findtext("os/cmdline") == "quiet vmctl.hostname=j1-r1-p0"
    assert dom.find("os/boot") is None and dom.find("devices/disk") is None
    args = [a.get("value") for a in dom.findall(f"{{{QEMU_NS}}}commandline/{{{QEMU_NS}}}arg")]
    assert args == ["-netdev", "user,id=vmctl0,restrict=on,hostfwd=tcp:127.0.0.1:22001-:22",
                    "-device", "virtio-net-pci,netdev=vmctl0"]
    plain = ET.fromstring(domain_xml(VmSpec(name="a", image="/i.img"), "qemu"))
    assert plain.find(f"{{{QEMU_NS}}}commandline") is None and plain.find("os/boot") is not None


@pytest.mark.parametrize(("spec", "field"), [
    (VmSpec(name="a", kernel="vmlinuz"), "vm a.kernel"),
    (VmSpec(name="a", initrd="/i"), "vm a.initrd"),
    (VmSpec(name="a", cmdline="quiet"), "vm a.cmdline"),
    (VmSpec(name="a", kernel="/k", cmdline="a\nb"), "vm a.cmdline"),
    (VmSpec(name="a", kernel="/k", ssh_port=0), "vm a.ssh_port"),
])
def test_bad_guest_boot_specs_name_the_field(spec: VmSpec, field: str) -> None:
    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        domain_xml(spec, "qemu")


@pytest.mark.parametrize("driver", ["xen", "test"])
def test_a_forwarded_port_needs_the_qemu_driver(driver: str) -> None:
    with pytest.raises(ValidationError, match="needs the QEMU driver"):
        domain_xml(VmSpec(name="a", kernel="/k", ssh_port=2200), driver)


def test_split_address() -> None:
    assert split_address("10.0.0.5", 22) == ("10.0.0.5", 22)
    assert split_address("127.0.0.1:2201", 22) == ("127.0.0.1", 2201)
    assert split_address("[::1]:2201", 22) == ("::1", 2201)
    assert split_address("[::1]", 2222) == ("::1", 2222)
    assert split_address("::1", 22) == ("::1", 22)  # bare IPv6: no port in it
    for bad in ("host:0", "host:x", "[::1]x", ":22", "a b", "h:22:x"):
        with pytest.raises(ValueError):
            split_address(bad, 22)


def _cfg(**sections: Any) -> dict[str, Any]:
    return {"node": "n1", "backend": {"kind": "libvirt", "uri": "qemu:///system"}, **sections}


def test_agent_config_of_ssh_guests() -> None:
    cfg = parse_agent_config(_cfg(
        backend={"kind": "libvirt", "uri": "qemu:///system", "domain_type": "qemu"},
        layout={"cores": [0], "levels": 2, "discipline": "shared", "kernel": "/g/vmlinuz", "initrd": "/g/initrd.gz",
                "cmdline": "quiet", "ssh_ports": 22000, "memory_mib": 128},
        ssh={"enabled": True, "key_file": "/g/id", "known_hosts": "/g/kh", "address_pattern": "127.0.0.1:{port}",
             "guests": {"special": "[::1]:2222"}}), "a.yaml")
    assert cfg.backend.domain_type == "qemu"
    assert (cfg.layout.kernel, cfg.layout.initrd, cfg.layout.cmdline, cfg.layout.ssh_ports) == \
        ("/g/vmlinuz", "/g/initrd.gz", "quiet", 22000)
    assert cfg.ssh.address_pattern == "127.0.0.1:{port}" and cfg.ssh.guests == {"special": "[::1]:2222"}


@pytest.mark.parametrize(("raw", "where"), [
    (_cfg(layout={"kernel": "vmlinuz"}), "layout.kernel: must be an absolute path"),
    (_cfg(layout={"initrd": "/i"}), "layout.initrd: needs layout.kernel"),
    (_cfg(layout={"cmdline": "quiet"}), "layout.cmdline: needs layout.kernel"),
    (_cfg(layout={"ssh_ports": 80}), "layout.ssh_ports: must be >= 1024"),
    ({"node": "n1", "layout": {"kernel": "/k"}}, "layout.kernel: applies to the libvirt backend only"),
    ({"node": "n1", "backend": {"domain_type": "qemu"}}, "backend.domain_type: applies to the libvirt backend"),
    (_cfg(backend={"kind": "libvirt", "uri": "qemu:///system", "domain_type": "xen"}), "backend.domain_type"),
    (_cfg(ssh={"address_pattern": "127.0.0.1:{port}"}), "ssh.address_pattern: uses {port}"),
    (_cfg(ssh={"address_pattern": "{host}"}), r"ssh.address_pattern: unknown field\(s\) \{host\}"),
    (_cfg(ssh={"address_pattern": "10.0.0.1"}), "ssh.address_pattern: must contain {vm} or {port}"),
    (_cfg(layout={"kernel": "/k", "ssh_ports": 2000}, ssh={"address_pattern": "h:{port}:x"}), "ssh.address_pattern"),
    (_cfg(ssh={"guests": {"vm1": "h:99999"}}), "ssh.guests.vm1: 'h:99999': the port must be 1..65535"),
])
def test_bad_guest_config_names_the_field(raw: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError, match=where.replace(".", r"\.") if "\\" not in where else where):
        parse_agent_config(raw, "a.yaml")


def test_the_layout_gives_each_slot_a_port_and_kernel_guests_their_memory() -> None:
    lay = Layout(host="h", cores=(2, 3), levels=2, discipline=Discipline.SHARED, memory_mib=128,
                 kernel="/g/vmlinuz", initrd="/g/initrd.gz", ssh_ports=30000)
    assert [lay.ssh_port(k, lvl) for k in (0, 1) for lvl in (0, 1)] == [30000, 30001, 30002, 30003]
    assert lay.ssh_port(2, 0) is None and lay.ssh_port(0, 2) is None
    spec = lay.spec_for(VmDesired(name="j7-r1-p0", core=1, role=VmRole.FG, weight=10000, memory_mib=64,
                                  level=1))
    assert spec.ssh_port == 30003 and spec.metadata[META_SSH_PORT] == "30003"
    assert spec.memory_mib == 128 and spec.kernel == "/g/vmlinuz"  # the layout's memory is a kernel guest's floor
    plain = Layout(host="h", cores=(0,), memory_mib=128)
    assert plain.spec_for(VmDesired(name="x", core=0, role=VmRole.FG, weight=10000, memory_mib=64)).memory_mib == 64
    with pytest.raises(OutOfRange, match=r"layout\.ssh_ports"):
        Layout(host="h", cores=(0, 1), levels=2, ssh_ports=65533)


def test_ssh_guest_config_and_free_ports(tmp_path: Path) -> None:
    (tmp_path / "host_key.pub").write_text("ssh-ed25519 AAAAC3Nza\n")
    base = free_port_range(3)
    extra = ssh_guest_config(tmp_path, tmp_path / "kh", base, 3)
    assert (tmp_path / "kh").read_text().splitlines() == [f"[127.0.0.1]:{base + i} ssh-ed25519 AAAAC3Nza"
                                                         for i in range(3)]
    cfg = parse_agent_config(_cfg(backend={"kind": "libvirt", "uri": "qemu:///system", **extra["backend"]},
                                  layout={"cores": [0], **extra["layout"]}, ssh=extra["ssh"]), "a.yaml")
    assert cfg.layout.ssh_ports == base and cfg.ssh.enabled and cfg.backend.domain_type == "qemu"


def test_task_command_sleeps_model_seconds_at_the_clock_speed() -> None:
    cmd = task_command(450.0, 100.0)
    assert "sleep 4.500;" in cmd and "$(hostname)" in cmd


def test_libvirt_overheads_split_first_tasks_from_hand_offs() -> None:
    tasks = [  # model seconds at speed 10: a task's work w sleeps w / 10 real seconds
        {"bag": "a", "index": 0, "worker": "host00/0.0", "work": 100.0, "start": 0.0, "end": 160.0},
        {"bag": "a", "index": 1, "worker": "host00/0.0", "work": 100.0, "start": 160.0, "end": 265.0},
        {"bag": "a", "index": 2, "worker": "host00/0.0", "work": 100.0, "start": 265.0, "end": 372.0},
        {"bag": "b", "index": 0, "worker": "host01/0.0", "work": 100.0, "start": 0.0, "end": 100.0},
    ]
    out = libvirt_overheads(tasks, {"host00"}, 10.0)
    assert out["first_task_of_a_worker"]["tasks"] == 1 and out["first_task_of_a_worker"]["median_s"] == 6.0
    nxt = out["next_tasks"]
    assert nxt["tasks"] == 2 and nxt["min_s"] == pytest.approx(0.5) and nxt["max_s"] == pytest.approx(0.7)
    assert libvirt_overheads(tasks, {"host09"}, 10.0)["next_tasks"] == {"tasks": 0}


@pytest.mark.parametrize("n", ["3", "-1"])
def test_libvirt_agents_beyond_the_hosts_are_refused(n: str, capsys: pytest.CaptureFixture[str]) -> None:
    from vmctl.experiments.taskbags_live import main

    assert main(["--hosts", "2", "--jobs", "2", "--libvirt-agents", n]) == 2
    assert f"--libvirt-agents = {n} is out of range (0..2 (--hosts))" in capsys.readouterr().err


def test_a_vm_defined_on_a_slot_whose_port_a_promoted_vm_holds_gets_a_free_port() -> None:
    """A promoted bg VM keeps the bg slot's forwarded port: the next bg VM of that core must not ask QEMU
    for it (the libvirt demo's guests failed to start with "Could not set up host forwarding rule")."""
    from vmctl.agents.backends.base import VmInfo
    from vmctl.agents.layout import META_NODE
    from vmctl.agents.plan import Define, Observed, plan
    from vmctl.nodedoc import NodeDesired, PowerState

    lay = Layout(host="h", cores=(0, 1), levels=2, memory_mib=128, kernel="/g/vmlinuz", initrd="/g/i.gz",
                 ssh_ports=30000)
    promoted = VmInfo(name="j2-r1-p1", power=PowerState.RUNNING, pinned_cores=(0,), weight=10000, cap=None,
                      cpu_time_s=1.0, metadata={META_NODE: "h", "vmctl.managed": "1", "vmctl.role": "fg",
                                                "vmctl.core": "0", META_SSH_PORT: "30001"})
    desired = NodeDesired(node="h", generation=3, vms=(
        VmDesired(name="j2-r1-p1", core=0, role=VmRole.FG, weight=10000),
        VmDesired(name="j3-r1-p1", core=0, role=VmRole.BG, weight=1),
        VmDesired(name="j4-r1-p0", core=1, role=VmRole.FG, weight=10000)))
    defines = {a.spec.name: a.spec for a in plan(desired, Observed.of([promoted]), lay) if isinstance(a, Define)}
    assert lay.spec_for(desired.vms[1]).ssh_port == 30001  # the bg slot's port: taken by the promoted VM
    assert defines["j3-r1-p1"].ssh_port == 30000 and defines["j3-r1-p1"].metadata[META_SSH_PORT] == "30000"
    assert defines["j4-r1-p0"].ssh_port == 30002  # a free slot port stays the slot's
    # once the promoted VM is being removed, its port is free again for the slot's next VM
    gone = NodeDesired(node="h", generation=4, vms=desired.vms[1:])
    again = {a.spec.name: a.spec for a in plan(gone, Observed.of([promoted]), lay) if isinstance(a, Define)}
    assert again["j3-r1-p1"].ssh_port == 30001
