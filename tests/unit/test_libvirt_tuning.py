"""Table tests of the pure weight/cap mapping (agents/backends/libvirt/tuning.py)."""

from __future__ import annotations

import pytest

from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN
from vmctl.agents.backends.libvirt import tuning
from vmctl.agents.backends.libvirt.tuning import CgroupCpu
from vmctl.errors import OutOfRange

V1, V2 = CgroupCpu.V1, CgroupCpu.V2


@pytest.mark.parametrize(
    ("weight", "cgroup", "shares"),
    [
        (WEIGHT_MIN, V1, 2),  # bg tier: the smallest cpu.shares
        (WEIGHT_MAX, V1, 262144),  # fg tier: the largest cpu.shares
        (100, V1, 2598),  # 2 + ceil(99 * 262142 / 9999)
        (5000, V1, 131060),  # 2 + ceil(131057.9)
        (WEIGHT_MIN, V2, 1),
        (WEIGHT_MAX, V2, 10000),
        (100, V2, 100),  # identity on cgroup v2 (cpu.weight)
        (4321, V2, 4321),
    ],
)
def test_weight_to_shares(weight: int, cgroup: CgroupCpu, shares: int) -> None:
    assert tuning.weight_to_shares(weight, cgroup) == shares


@pytest.mark.parametrize("cgroup", [V1, V2])
def test_shares_round_trip_every_weight(cgroup: CgroupCpu) -> None:
    for w in range(WEIGHT_MIN, WEIGHT_MAX + 1):
        assert tuning.shares_to_weight(tuning.weight_to_shares(w, cgroup), cgroup) == w


def test_shares_mapping_is_monotonic_and_kernel_consistent() -> None:
    prev = 0
    for w in range(WEIGHT_MIN, WEIGHT_MAX + 1):
        s = tuning.weight_to_shares(w, V1)
        assert s > prev
        prev = s
        # the kernel's (and runc's) v1 -> v2 conversion brings us back to the same weight
        assert 1 + ((s - 2) * 9999) // 262142 == w


@pytest.mark.parametrize(
    ("shares", "cgroup", "weight"),
    [(1024, V1, 39), (2, V1, 1), (262144, V1, 10000), (1, V1, 1), (10**9, V1, 10000), (100, V2, 100), (0, V2, 1)],
)
def test_shares_to_weight_reads_foreign_values(shares: int, cgroup: CgroupCpu, weight: int) -> None:
    assert tuning.shares_to_weight(shares, cgroup) == weight


@pytest.mark.parametrize(
    ("weight", "xen"),
    [(1, 1), (10000, 65535), (100, 650), (5000, 32765)],  # 1 + ceil((w - 1) * 65534 / 9999)
)
def test_weight_to_xen_credit(weight: int, xen: int) -> None:
    assert tuning.weight_to_xen(weight) == xen
    assert tuning.xen_to_weight(xen) == weight


def test_xen_round_trip_every_weight() -> None:
    assert all(tuning.xen_to_weight(tuning.weight_to_xen(w)) == w for w in range(WEIGHT_MIN, WEIGHT_MAX + 1))


@pytest.mark.parametrize(
    ("cap", "quota"),
    [(None, -1), (1.0, 100000), (0.5, 50000), (0.25, 25000), (0.1, 10000), (0.75, 75000), (0.001, 1000),
     (0.333, 33300)],
)
def test_cap_to_quota(cap: float | None, quota: int) -> None:
    assert tuning.cap_to_quota(cap) == quota


@pytest.mark.parametrize(
    ("quota", "period", "cap"),
    [(-1, 100000, None), (0, 100000, None), (50000, 100000, 0.5), (100000, 100000, 1.0),
     (200000, 100000, 1.0), (25000, 50000, 0.5), (1000, 0, None)],
)
def test_quota_to_cap(quota: int, period: int, cap: float | None) -> None:
    assert tuning.quota_to_cap(quota, period) == cap


@pytest.mark.parametrize(
    ("cap", "vcpus", "xen"),
    [(None, 1, 0), (0.5, 1, 50), (1.0, 1, 100), (0.5, 2, 100), (0.25, 4, 100), (0.001, 1, 1)],
)
def test_cap_to_xen(cap: float | None, vcpus: int, xen: int) -> None:
    assert tuning.cap_to_xen(cap, vcpus) == xen


@pytest.mark.parametrize(("xen", "vcpus", "cap"), [(0, 1, None), (50, 1, 0.5), (100, 2, 0.5), (400, 2, 1.0)])
def test_xen_to_cap(xen: int, vcpus: int, cap: float | None) -> None:
    assert tuning.xen_to_cap(xen, vcpus) == cap


@pytest.mark.parametrize("bad", [0, 10001, -5, 1.5, True, "7"])
def test_bad_weight_names_range(bad: object) -> None:
    with pytest.raises(OutOfRange, match=r"weight = .* is out of range \(integer 1\.\.10000\)"):
        tuning.weight_to_shares(bad, V1)  # type: ignore[arg-type]
    with pytest.raises(OutOfRange):
        tuning.weight_to_xen(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.01, float("nan"), True])
def test_bad_cap_names_range(bad: float) -> None:
    with pytest.raises(OutOfRange, match=r"cap = .* is out of range"):
        tuning.cap_to_quota(bad)
    with pytest.raises(OutOfRange):
        tuning.cap_to_xen(bad, 1)


def test_kvm_params() -> None:
    assert tuning.kvm_params(10000, None, False, V1) == {"cpu_shares": 262144}
    assert tuning.kvm_params(1, None, False, V2) == {"cpu_shares": 1}
    assert tuning.kvm_params(None, 0.5, False, V1) == {"vcpu_period": 100000, "vcpu_quota": 50000}
    assert tuning.kvm_params(None, None, True, V1) == {"vcpu_quota": -1}
    assert tuning.kvm_params(None, None, False, V1) == {}
    assert tuning.kvm_params(1, 0.25, True, V1) == {"cpu_shares": 2, "vcpu_period": 100000, "vcpu_quota": 25000}


def test_xen_params() -> None:
    assert tuning.xen_params(10000, 0.5, False, 1) == {"weight": 65535, "cap": 50}
    assert tuning.xen_params(1, None, True, 2) == {"weight": 1, "cap": 0}
    assert tuning.xen_params(None, 0.5, False, 2) == {"cap": 100}
    assert tuning.xen_params(None, None, False, 1) == {}


HYBRID = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
HYBRID_JOINED = "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
PURE_V2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
CPUACCT_ONLY = "cgroup /sys/fs/cgroup/cpuacct cgroup rw,cpuacct 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n"


@pytest.mark.parametrize(
    ("mounts", "controllers", "expected"),
    [
        (HYBRID, "", V1),  # these machines: cpu on v1, accounting on v2
        (HYBRID_JOINED, None, V1),
        (PURE_V2, "cpuset cpu io memory pids", V2),
        (PURE_V2, None, V2),
        (CPUACCT_ONLY, "cpu memory", V2),  # cpuacct alone is not the cpu controller
        (PURE_V2, "memory pids", V1),  # no cpu controller anywhere: default
        ("", None, V1),
    ],
)
def test_detect_cgroup_cpu(mounts: str, controllers: str | None, expected: CgroupCpu) -> None:
    assert tuning.detect_cgroup_cpu(mounts, controllers) is expected
