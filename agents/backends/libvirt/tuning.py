"""Pure mapping of vmctl's backend-neutral CPU weights and caps onto each hypervisor's knobs.

vmctl weights are integers ``WEIGHT_MIN``..``WEIGHT_MAX`` (1..10000); caps are fractions of one
physical core in (0, 1] per VCPU, or None for uncapped. The two-tier architecture (MEASY paper,
sec. 2.1) gives the fg VM the highest and the bg VM the lowest CPU priority, so the end points of
every range must map onto the end points of the hypervisor's range:

==========================  ===================  ==========================================
hypervisor knob             range                vmctl weight 1 / 10000
==========================  ===================  ==========================================
KVM, cgroup v1 cpu.shares   2..262144            2 / 262144
KVM, cgroup v2 cpu.weight   1..10000             1 / 10000 (identity)
Xen credit ``weight``       1..65535             1 / 65535
==========================  ===================  ==========================================

The v1 mapping is the inverse of the kernel's/runc's shares->weight conversion
(``weight = 1 + (shares - 2) * 9999 / 262142``), so a weight set through either cgroup version
means the same share of a contended core. Example: weight 100 -> 2 + ceil(99 * 262142 / 9999) = 2598,
and the kernel reads 2598 back as weight 1 + 2596 * 9999 // 262142 = 100.

Caps: KVM uses CFS bandwidth control per VCPU, ``vcpu_quota / vcpu_period`` with the period fixed
at 100000 us: cap 0.5 -> quota 50000. libvirt accepts quotas of at least 1000 us, so caps are
clamped up to 0.01. Uncapped is quota -1. Xen's credit ``cap`` is a percentage of one physical CPU
for the whole domain (0 = uncapped), so a per-VCPU cap of 0.5 on a 2-VCPU domain is ``cap=100``.
"""

from __future__ import annotations

import re
from enum import StrEnum

from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN
from vmctl.errors import OutOfRange

SHARES_V1_MIN = 2
SHARES_V1_MAX = 262144
WEIGHT_V2_MIN = 1
WEIGHT_V2_MAX = 10000
XEN_WEIGHT_MIN = 1
XEN_WEIGHT_MAX = 65535
VCPU_PERIOD_US = 100000
VCPU_QUOTA_MIN_US = 1000
QUOTA_UNLIMITED = -1


class CgroupCpu(StrEnum):
    """Which cgroup file libvirt writes ``cpu_shares`` into."""

    V1 = "v1"  # cpu.shares, 2..262144
    V2 = "v2"  # cpu.weight, 1..10000


def check_weight(weight: int) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not WEIGHT_MIN <= weight <= WEIGHT_MAX:
        raise OutOfRange(what="weight", value=weight, allowed=f"integer {WEIGHT_MIN}..{WEIGHT_MAX}")
    return weight


def check_cap(cap: float) -> float:
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not 0.0 < cap <= 1.0:
        raise OutOfRange(what="cap", value=cap, allowed="fraction of one core in (0, 1]")
    return float(cap)


def _linear(value: int, lo: int, hi: int, out_lo: int, out_hi: int) -> int:
    """Map ``lo..hi`` onto ``out_lo..out_hi``, rounding UP so that ``_linear_inverse`` (which
    rounds down, like the kernel's shares->weight conversion) gives ``value`` back."""
    return out_lo + -(-(value - lo) * (out_hi - out_lo) // (hi - lo))


def _linear_inverse(value: int, lo: int, hi: int, out_lo: int, out_hi: int) -> int:
    """``out_lo..out_hi`` back onto ``lo..hi``, rounding down; values outside are clamped."""
    value = min(max(value, out_lo), out_hi)
    return lo + (value - out_lo) * (hi - lo) // (out_hi - out_lo)


def weight_to_shares(weight: int, cgroup: CgroupCpu) -> int:
    """The ``cpu_shares`` scheduler parameter libvirt's QEMU driver takes for ``weight``."""
    check_weight(weight)
    if cgroup is CgroupCpu.V2:
        return _linear(weight, WEIGHT_MIN, WEIGHT_MAX, WEIGHT_V2_MIN, WEIGHT_V2_MAX)
    return _linear(weight, WEIGHT_MIN, WEIGHT_MAX, SHARES_V1_MIN, SHARES_V1_MAX)


def shares_to_weight(shares: int, cgroup: CgroupCpu) -> int:
    """Read back: the vmctl weight of ``shares`` (the kernel's conversion; off-grid values round down)."""
    if cgroup is CgroupCpu.V2:
        return _linear_inverse(shares, WEIGHT_MIN, WEIGHT_MAX, WEIGHT_V2_MIN, WEIGHT_V2_MAX)
    return _linear_inverse(shares, WEIGHT_MIN, WEIGHT_MAX, SHARES_V1_MIN, SHARES_V1_MAX)


def weight_to_xen(weight: int) -> int:
    check_weight(weight)
    return _linear(weight, WEIGHT_MIN, WEIGHT_MAX, XEN_WEIGHT_MIN, XEN_WEIGHT_MAX)


def xen_to_weight(xen_weight: int) -> int:
    return _linear_inverse(xen_weight, WEIGHT_MIN, WEIGHT_MAX, XEN_WEIGHT_MIN, XEN_WEIGHT_MAX)


def cap_to_quota(cap: float | None) -> int:
    """``vcpu_quota`` (us per ``VCPU_PERIOD_US``) for a per-VCPU cap; None -> unlimited (-1)."""
    if cap is None:
        return QUOTA_UNLIMITED
    check_cap(cap)
    return max(VCPU_QUOTA_MIN_US, round(cap * VCPU_PERIOD_US))


def quota_to_cap(quota: int, period: int) -> float | None:
    """Read back a cap from libvirt's ``vcpu_quota``/``vcpu_period``; a quota of 0 or below means
    uncapped, one of at least the period is a cap of a whole core (1.0)."""
    if quota <= 0 or period <= 0:
        return None
    return round(min(1.0, quota / period), 6)


def cap_to_xen(cap: float | None, vcpus: int) -> int:
    """Xen credit ``cap`` in percent of one physical CPU for the whole domain; 0 = uncapped."""
    if vcpus < 1:
        raise OutOfRange(what="vcpus", value=vcpus, allowed=">= 1")
    if cap is None:
        return 0
    check_cap(cap)
    return max(1, round(cap * 100 * vcpus))


def xen_to_cap(xen_cap: int, vcpus: int) -> float | None:
    if xen_cap <= 0 or vcpus < 1:
        return None
    return round(min(1.0, xen_cap / (100.0 * vcpus)), 6)


def kvm_params(weight: int | None, cap: float | None, clear_cap: bool, cgroup: CgroupCpu) -> dict[str, int]:
    """The QEMU driver's parameters (scheduler type ``posix``) for a weight and/or cap change."""
    out: dict[str, int] = {}
    if weight is not None:
        out["cpu_shares"] = weight_to_shares(weight, cgroup)
    if cap is not None:
        out["vcpu_period"] = VCPU_PERIOD_US
        out["vcpu_quota"] = cap_to_quota(cap)
    elif clear_cap:
        out["vcpu_quota"] = QUOTA_UNLIMITED
    return out


def xen_params(weight: int | None, cap: float | None, clear_cap: bool, vcpus: int) -> dict[str, int]:
    """The Xen (libxl) credit scheduler's parameters for a weight and/or cap change."""
    out: dict[str, int] = {}
    if weight is not None:
        out["weight"] = weight_to_xen(weight)
    if cap is not None:
        out["cap"] = cap_to_xen(cap, vcpus)
    elif clear_cap:
        out["cap"] = 0
    return out


def detect_cgroup_cpu(mounts: str, unified_controllers: str | None = None) -> CgroupCpu:
    """Which cgroup version carries the ``cpu`` controller, from the text of /proc/self/mounts.

    A cgroup v1 hierarchy mounted with the ``cpu`` option wins (hybrid layouts: libvirt writes
    cpu.shares there); otherwise a cgroup2 mount means v2. ``unified_controllers`` is the content
    of the v2 root's cgroup.controllers, used only to double-check that ``cpu`` is available.
    """
    has_v2 = False
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        fstype, options = fields[2], fields[3].split(",")
        if fstype == "cgroup" and "cpu" in options:
            return CgroupCpu.V1
        if fstype == "cgroup2":
            has_v2 = True
    if has_v2 and (unified_controllers is None or re.search(r"\bcpu\b", unified_controllers)):
        return CgroupCpu.V2
    # No cpu controller visible (e.g. a container without cgroup mounts): assume v1, libvirt's
    # historical layout; the backend constructor takes an explicit override.
    return CgroupCpu.V1
