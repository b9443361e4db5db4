"""Domain XML generation (golden files), its parse, spec validation, and the boot-sector guests.

Regenerate the golden files after an intended change with ``VMCTL_UPDATE_GOLDEN=1 pytest <this file>``
and review the diff.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.support import guests
from vmctl.agents.backends.base import VmSpec
from vmctl.agents.backends.libvirt.xml import VMCTL_NS, CpuTune, domain_xml, parse_domain_xml
from vmctl.errors import OutOfRange, ValidationError

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "libvirt"

SPEC = VmSpec(
    name="job42-fg-c1",
    vcpus=2,
    memory_mib=64,
    image="/var/lib/vmctl/images/spin.img",
    metadata={"job": "42", "tier": "fg", "node": "n1"},
)
TUNE = CpuTune(pins=(0, 1), shares=262144, period=100000, quota=50000)

CASES = {
    "kvm-tuned": (SPEC, "kvm", TUNE, None),
    "qemu-plain": (VmSpec(name="bg-0", image="/tmp/idle.img"), "qemu", None, None),
    "xen-tuned": (SPEC, "xen", TUNE, None),
    "test-redefine": (VmSpec(name="t", metadata={"k": "v"}), "test", CpuTune(pins=(3,)),
                      "0b3c33d6-2f3e-4a0e-9a5d-8a7a64f1c2de"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_domain_xml_matches_golden(case: str) -> None:
    spec, dtype, tune, uuid = CASES[case]
    got = domain_xml(spec, dtype, tune, uuid)
    path = GOLDEN / f"{case}.xml"
    if os.environ.get("VMCTL_UPDATE_GOLDEN") == "1":
        path.write_text(got, encoding="utf-8")
    assert path.is_file(), f"missing golden file {path}; run with VMCTL_UPDATE_GOLDEN=1"
    assert got == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("case", sorted(CASES))
def test_parse_round_trip(case: str) -> None:
    spec, dtype, tune, uuid = CASES[case]
    parsed = parse_domain_xml(domain_xml(spec, dtype, tune, uuid))
    assert parsed.name == spec.name
    assert parsed.domain_type == dtype
    assert parsed.vcpus == spec.vcpus
    assert parsed.memory_mib == spec.memory_mib
    assert parsed.metadata == spec.metadata
    if tune is None:
        assert parsed.cputune == CpuTune()
    elif dtype == "xen":  # Xen: weight/cap are credit-scheduler parameters, only pins in XML
        assert parsed.cputune == CpuTune(pins=tune.pins)
    else:
        assert parsed.cputune == tune


def test_xen_xml_uses_pv_disk_and_xenfv() -> None:
    x = domain_xml(SPEC, "xen", TUNE)
    assert "machine=\"xenfv\"" in x and "bus=\"xen\"" in x and "<shares>" not in x and "<quota>" not in x
    assert "usb" not in x


def test_parse_what_libvirt_reports() -> None:
    # the shape libvirtd returns for a running, tuned QEMU domain (abridged from a real one)
    live = f"""<domain type='qemu' id='6'>
  <name>x</name>
  <uuid>846c68db-a62a-436c-aa1d-4c25440cc6f0</uuid>
  <metadata xmlns:vmctl="{VMCTL_NS}">
    <vmctl:vm><vmctl:entry key="tier">fg</vmctl:entry><vmctl:entry key="empty"/></vmctl:vm>
    <other:thing xmlns:other="urn:x"><other:entry key="no">1</other:entry></other:thing>
  </metadata>
  <memory unit='KiB'>65536</memory>
  <vcpu placement='static'>2</vcpu>
  <cputune>
    <shares>2</shares>
    <period>100000</period>
    <quota>-1</quota>
    <vcpupin vcpu='1' cpuset='0'/>
    <vcpupin vcpu='0' cpuset='1'/>
  </cputune>
</domain>"""
    p = parse_domain_xml(live)
    assert p.memory_mib == 64 and p.vcpus == 2
    assert p.cputune == CpuTune(pins=(1, 0), shares=2, period=100000, quota=-1)
    assert p.metadata == {"tier": "fg", "empty": ""}


@pytest.mark.parametrize(
    ("pins_xml", "expected"),
    [
        ("<vcpupin vcpu='0' cpuset='0-1'/>", None),  # a range is not a pin to one core
        ("<vcpupin vcpu='0' cpuset='0,1'/>", None),
        ("", None),
        ("<vcpupin vcpu='0' cpuset='1'/>", (1,)),
    ],
)
def test_parse_pins(pins_xml: str, expected: tuple[int, ...] | None) -> None:
    doc = f"<domain type='kvm'><name>a</name><vcpu>1</vcpu><cputune>{pins_xml}</cputune></domain>"
    assert parse_domain_xml(doc).cputune.pins == expected


def test_parse_rejects_garbage_with_vmctl_error() -> None:
    from vmctl.errors import HypervisorError

    with pytest.raises(HypervisorError, match="parse domain XML"):
        parse_domain_xml("<domain><name>")


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (VmSpec(name=""), "vm.name"),
        (VmSpec(name="a/b"), "vm.name"),
        (VmSpec(name="x" * 65), "vm.name"),
        (VmSpec(name="ok", vcpus=0), "vm ok.vcpus"),
        (VmSpec(name="ok", memory_mib=8), "vm ok.memory_mib"),
        (VmSpec(name="ok", image="relative.img"), "vm ok.image"),
        (VmSpec(name="ok", metadata={"bad key": "v"}), "vm ok.metadata"),
    ],
)
def test_bad_spec_names_field(spec: VmSpec, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        domain_xml(spec, "kvm")
    assert str(info.value).startswith(field + ":")


def test_unknown_domain_type() -> None:
    with pytest.raises(ValidationError, match="domain_type: 'lxc'"):
        domain_xml(VmSpec(name="a"), "lxc")


# ----------------------------------------------------------------------------- boot-sector guests


@pytest.mark.parametrize(("kind", "duty"), [("spin", None), ("idle", None), ("duty", 0.5), ("duty", 0.1)])
def test_boot_sector_shape(kind: str, duty: float | None) -> None:
    sector = guests.boot_sector(kind, duty)
    assert len(sector) == 512 and sector[-2:] == b"\x55\xaa"
    assert sector.startswith(b"\xfa\x31\xc0")  # cli; xor ax,ax
    # every guest counts at COUNTER_ADDR: add dword [0x7e00],1
    assert bytes.fromhex("668306007e01") in sector
    image = guests.guest_image(kind, duty)
    assert len(image) == guests.IMAGE_SIZE >= 516096 and image[:512] == sector and not any(image[512:])


def test_spin_loop_jumps_back_to_the_counter() -> None:
    s = guests.boot_sector("spin")
    at = s.index(bytes.fromhex("668306007e01"))
    assert s[at + 12] == 0xEB and at + 14 + struct.unpack("b", s[at + 13:at + 14])[0] == at


def test_idle_guest_halts() -> None:
    s = guests.boot_sector("idle")
    assert b"\xfb\xf4" in s  # sti; hlt


@pytest.mark.parametrize(("duty", "threshold"), [(0.5, 5966), (0.25, 8949), (0.75, 2983)])
def test_duty_guest_programs_pit_and_threshold(duty: float, threshold: int) -> None:
    s = guests.boot_sector("duty", duty)
    assert bytes([0xB0, 0x34, 0xE6, 0x43, 0xB0, 0x9C, 0xE6, 0x40, 0xB0, 0x2E, 0xE6, 0x40]) in s  # 11932 = 100 Hz
    assert b"\x3d" + struct.pack("<H", threshold) in s
    assert guests.boot_sector("duty", duty) != guests.boot_sector("duty", 0.3)


@pytest.mark.parametrize("duty", [None, 0.0, 1.0, -0.2, 2])
def test_duty_out_of_range(duty: float | None) -> None:
    with pytest.raises(OutOfRange, match="duty"):
        guests.boot_sector("duty", duty)


def test_unknown_guest_kind() -> None:
    with pytest.raises(ValueError):
        guests.boot_sector("busy")


def test_write_and_decode(tmp_path: Path) -> None:
    p = guests.write_guest_image(tmp_path / "g.img", "spin")
    assert p.stat().st_size == guests.IMAGE_SIZE and (p.stat().st_mode & 0o444) == 0o444
    assert guests.decode_counter(struct.pack("<Q", 2**40 + 7)) == 2**40 + 7
    with pytest.raises(ValueError):
        guests.decode_counter(b"\x00" * 4)
