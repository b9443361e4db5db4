"""Domain XML for vmctl's VMs: generation (pure, golden-tested) and the parse of what libvirt reports.

One generator for the three drivers vmctl uses:

* ``kvm`` / ``qemu`` (TCG): a PC machine booting from a read-only raw virtio disk (the guest image),
  no balloon, no USB, no graphics; CPU tuning in ``<cputune>`` (shares, period/quota, vcpupin).
* ``xen``: an HVM guest with the disk on the Xen PV bus; weight and cap are credit-scheduler
  parameters set through the scheduler API (libvirt's libxl driver has no XML for them), so only the
  pinning goes into ``<cputune>``.
* ``test``: libvirt's in-process test driver; same shape, no emulator.

Guests that run job processes (``VmSpec.kernel``, ``initrd``, ``cmdline``, ``ssh_port``; the guest of
``vmctl/guestimage.py``): direct kernel boot (``<kernel>``, ``<initrd>``, ``<cmdline>``, to which
``vmctl.hostname=NAME`` is added so each guest knows its VM name), and one NIC on QEMU's user network
(slirp, ``restrict=on``: the guest reaches nothing outside QEMU) with a host forward from
``127.0.0.1:ssh_port`` to the guest's port 22, given to QEMU through ``<qemu:commandline>`` (libvirt 9.0
forwards ports of ``<interface type='user'>`` only with the passt backend, which Debian 12 does not
install by default). Loopback only. QEMU drivers only: a ``ssh_port`` on xen or test is refused.

The VmSpec metadata travels in ``<metadata><vmctl:vm xmlns:vmctl=...>`` so an agent can recognise and
adopt its VMs after a restart::

    <metadata>
      <vmctl:vm xmlns:vmctl="https://vmctl.dev/xmlns/domain/1">
        <vmctl:entry key="job">42</vmctl:entry>
      </vmctl:vm>
    </metadata>
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from vmctl.agents.backends.base import VmSpec
from vmctl.errors import HypervisorError, ValidationError

VMCTL_NS = "https://vmctl.dev/xmlns/domain/1"
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
VMCTL_PREFIX = "vmctl"
DOMAIN_TYPES = ("kvm", "qemu", "xen", "test")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$")

ET.register_namespace(VMCTL_PREFIX, VMCTL_NS)
ET.register_namespace("qemu", QEMU_NS)


@dataclass(frozen=True, slots=True)
class CpuTune:
    """What ``<cputune>`` holds. ``pins[i]`` is the physical core of VCPU i."""

    pins: tuple[int, ...] | None = None
    shares: int | None = None
    period: int | None = None
    quota: int | None = None


def validate_spec(spec: VmSpec) -> None:
    """Reject a VmSpec libvirt would reject (or misread), naming the field."""
    if not _NAME_RE.match(spec.name):
        raise ValidationError(field="vm.name",
                              problem=f"{spec.name!r}: use 1-64 of A-Z a-z 0-9 _ . - (letter/digit first)")
    if isinstance(spec.vcpus, bool) or not isinstance(spec.vcpus, int) or not 1 <= spec.vcpus <= 256:
        raise ValidationError(field=f"vm {spec.name}.vcpus", problem=f"{spec.vcpus!r}: must be an integer 1..256")
    mem = spec.memory_mib
    if isinstance(mem, bool) or not isinstance(mem, int) or not 16 <= mem <= 1 << 20:
        raise ValidationError(field=f"vm {spec.name}.memory_mib", problem=f"{spec.memory_mib!r}: must be 16..1048576")
    if spec.image is not None and (not spec.image.startswith("/") or "\n" in spec.image):
        raise ValidationError(field=f"vm {spec.name}.image", problem=f"{spec.image!r}: must be an absolute path")
    for what, path in (("kernel", spec.kernel), ("initrd", spec.initrd)):
        if path is not None and (not path.startswith("/") or "\n" in path):
            raise ValidationError(field=f"vm {spec.name}.{what}", problem=f"{path!r}: must be an absolute path")
    if spec.initrd is not None and spec.kernel is None:
        raise ValidationError(field=f"vm {spec.name}.initrd", problem="needs a kernel (direct kernel boot)")
    if spec.cmdline and (spec.kernel is None or "\n" in spec.cmdline):
        raise ValidationError(field=f"vm {spec.name}.cmdline",
                              problem="needs a kernel (direct kernel boot) and must be one line")
    if spec.ssh_port is not None and (isinstance(spec.ssh_port, bool) or not isinstance(spec.ssh_port, int)
                                      or not 1 <= spec.ssh_port <= 65535):
        raise ValidationError(field=f"vm {spec.name}.ssh_port", problem=f"{spec.ssh_port!r}: must be 1..65535")
    for key, value in spec.metadata.items():
        if not _KEY_RE.match(key):
            raise ValidationError(field=f"vm {spec.name}.metadata", problem=f"key {key!r}: use a name-like key")
        if not isinstance(value, str):
            raise ValidationError(field=f"vm {spec.name}.metadata.{key}", problem="values must be strings")


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrib)
    if text is not None:
        el.text = text
    return el


def domain_xml(spec: VmSpec, domain_type: str, cputune: CpuTune | None = None, uuid: str | None = None) -> str:
    """The ``<domain>`` document to define ``spec`` on a hypervisor of ``domain_type``; ``uuid`` is
    given when redefining an existing domain (libvirt matches definitions by name AND uuid)."""
    validate_spec(spec)
    if domain_type not in DOMAIN_TYPES:
        raise ValidationError(field="domain_type",
                              problem=f"{domain_type!r}: expected one of {', '.join(DOMAIN_TYPES)}")
    if spec.ssh_port is not None and domain_type not in ("kvm", "qemu"):
        raise ValidationError(field=f"vm {spec.name}.ssh_port",
                              problem=f"a forwarded SSH port needs the QEMU driver (kvm or qemu), not {domain_type}")
    dom = ET.Element("domain", {"type": domain_type})
    _sub(dom, "name", spec.name)
    if uuid is not None:
        _sub(dom, "uuid", uuid)
    if spec.metadata:
        meta = _sub(dom, "metadata")
        vm = _sub(meta, f"{{{VMCTL_NS}}}vm")
        for key in sorted(spec.metadata):
            _sub(vm, f"{{{VMCTL_NS}}}entry", spec.metadata[key], key=key)
    _sub(dom, "memory", str(spec.memory_mib), unit="MiB")
    _sub(dom, "vcpu", str(spec.vcpus), placement="static")
    if cputune is not None and (cputune.pins or cputune.shares is not None or cputune.quota is not None):
        ct = _sub(dom, "cputune")
        if domain_type != "xen":
            if cputune.shares is not None:
                _sub(ct, "shares", str(cputune.shares))
            if cputune.period is not None:
                _sub(ct, "period", str(cputune.period))
            if cputune.quota is not None:
                _sub(ct, "quota", str(cputune.quota))
        for i, core in enumerate(cputune.pins or ()):
            _sub(ct, "vcpupin", vcpu=str(i), cpuset=str(core))
    os_el = _sub(dom, "os")
    machine = "xenfv" if domain_type == "xen" else "pc"
    _sub(os_el, "type", "hvm", arch="x86_64", machine=machine)
    if spec.kernel is not None:
        _sub(os_el, "kernel", spec.kernel)
        if spec.initrd is not None:
            _sub(os_el, "initrd", spec.initrd)
        _sub(os_el, "cmdline", " ".join(p for p in (spec.cmdline, f"vmctl.hostname={spec.name}") if p))
    else:
        _sub(os_el, "boot", dev="hd")
    _sub(dom, "clock", offset="utc")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")
    devices = _sub(dom, "devices")
    if spec.image is not None:
        disk = _sub(devices, "disk", type="file", device="disk")
        _sub(disk, "driver", name="qemu", type="raw")
        _sub(disk, "source", file=spec.image)
        if domain_type == "xen":
            _sub(disk, "target", dev="xvda", bus="xen")
        else:
            _sub(disk, "target", dev="vda", bus="virtio")
        _sub(disk, "readonly")
    if domain_type in ("kvm", "qemu"):
        _sub(devices, "controller", type="usb", model="none")
    if domain_type != "test":
        _sub(devices, "memballoon", model="none")
    if spec.ssh_port is not None:
        cmd = _sub(dom, f"{{{QEMU_NS}}}commandline")
        for arg in ("-netdev", f"user,id=vmctl0,restrict=on,hostfwd=tcp:127.0.0.1:{spec.ssh_port}-:22",
                    "-device", "virtio-net-pci,netdev=vmctl0"):
            _sub(cmd, f"{{{QEMU_NS}}}arg", value=arg)
    ET.indent(dom, space="  ")
    return ET.tostring(dom, encoding="unicode") + "\n"


@dataclass(frozen=True, slots=True)
class ParsedDomain:
    name: str
    domain_type: str
    vcpus: int
    memory_mib: int
    cputune: CpuTune
    metadata: dict[str, str]


def _int(el: ET.Element | None) -> int | None:
    if el is None or el.text is None:
        return None
    try:
        return int(el.text.strip())
    except ValueError:
        return None


def _single_cpu(cpuset: str) -> int | None:
    """``"3"`` -> 3; a range or list (``"0-1"``, ``"0,2"``) is not a pin to one core -> None."""
    cpuset = cpuset.strip()
    return int(cpuset) if cpuset.isdigit() else None


def parse_domain_xml(text: str) -> ParsedDomain:
    """Read back what vmctl cares about from ``virDomainGetXMLDesc``."""
    try:
        dom = ET.fromstring(text)
    except ET.ParseError as exc:
        raise HypervisorError(backend="libvirt", operation="parse domain XML", problem=str(exc)) from exc
    name = dom.findtext("name") or ""
    vcpus = _int(dom.find("vcpu")) or 1
    mem_el = dom.find("memory")
    mem = _int(mem_el) or 0
    unit = (mem_el.get("unit") if mem_el is not None else None) or "KiB"
    scale = {"KiB": 1 / 1024, "k": 1 / 1024, "MiB": 1, "M": 1, "GiB": 1024, "G": 1024,
             "b": 1 / (1 << 20), "bytes": 1 / (1 << 20)}
    memory_mib = int(mem * scale.get(unit, 1 / 1024))
    ct = dom.find("cputune")
    pins: tuple[int, ...] | None = None
    shares = period = quota = None
    if ct is not None:
        shares, period, quota = _int(ct.find("shares")), _int(ct.find("period")), _int(ct.find("quota"))
        by_vcpu: dict[int, int | None] = {}
        for pin in ct.findall("vcpupin"):
            v = pin.get("vcpu")
            if v is not None and v.isdigit():
                by_vcpu[int(v)] = _single_cpu(pin.get("cpuset", ""))
        if by_vcpu and all(by_vcpu.get(i) is not None for i in range(vcpus)):
            pins = tuple(by_vcpu[i] or 0 for i in range(vcpus))
    metadata: dict[str, str] = {}
    vm = dom.find(f"metadata/{{{VMCTL_NS}}}vm")
    if vm is not None:
        for entry in vm.findall(f"{{{VMCTL_NS}}}entry"):
            key = entry.get("key")
            if key:
                metadata[key] = entry.text or ""
    return ParsedDomain(
        name=name,
        domain_type=dom.get("type", ""),
        vcpus=vcpus,
        memory_mib=memory_mib,
        cputune=CpuTune(pins=pins, shares=shares, period=period, quota=quota),
        metadata=metadata,
    )


def _check_metadata(metadata: dict[str, str], where: str) -> None:
    for key, value in metadata.items():
        if not _KEY_RE.match(key):
            raise ValidationError(field=f"{where}.metadata", problem=f"key {key!r}: use a name-like key")
        if not isinstance(value, str):
            raise ValidationError(field=f"{where}.metadata.{key}", problem="values must be strings")


def metadata_element(metadata: dict[str, str]) -> str:
    """The ``<vm>`` element of vmctl's metadata namespace holding ``metadata``, as
    ``virDomainSetMetadata(VIR_DOMAIN_METADATA_ELEMENT, xml, "vmctl", VMCTL_NS)`` takes it (libvirt
    puts it into the namespace given there)."""
    _check_metadata(metadata, "vm")
    vm = ET.Element("vm")
    for key in sorted(metadata):
        _sub(vm, "entry", metadata[key], key=key)
    return ET.tostring(vm, encoding="unicode")


def with_metadata(xml: str, metadata: dict[str, str]) -> str:
    """A domain XML (as ``XMLDesc`` gives it) whose vmctl metadata is replaced by ``metadata``; the rest
    is left as it is (a migration's destination XML may change the metadata only)."""
    _check_metadata(metadata, "vm")
    try:
        dom = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise HypervisorError(backend="libvirt", operation="rewrite metadata",
                              problem=f"unparsable domain XML: {exc}") from exc
    meta = dom.find("metadata")
    if meta is None:
        meta = _sub(dom, "metadata")
    for old in meta.findall(f"{{{VMCTL_NS}}}vm"):
        meta.remove(old)
    vm = _sub(meta, f"{{{VMCTL_NS}}}vm")
    for key in sorted(metadata):
        _sub(vm, f"{{{VMCTL_NS}}}entry", metadata[key], key=key)
    return ET.tostring(dom, encoding="unicode")

