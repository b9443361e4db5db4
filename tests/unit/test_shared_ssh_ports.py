"""Forwarded SSH ports of shared VMs (vcsched's unpinned VMs, no (core, level) slot): the layout's second
port range (``layout.shared_ssh_ports``/``shared_ssh_count``), its config checks (bounds, no overlap with the
slots' range, errors naming the key), the plan's lowest-free assignment, its adoption of the ports the
host's VMs already hold after an agent restart, their release when a VM goes, and a clear reason when every
port of the range is held (mock backend)."""

from __future__ import annotations

from typing import Any

import pytest

from vmctl.agents.backends.base import VmInfo
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.config import parse_agent_config
from vmctl.agents.layout import META_NODE, META_SSH_PORT, Layout
from vmctl.agents.plan import Claim, Define, Observed, plan
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.errors import ConfigError, ValidationError
from vmctl.model import Discipline
from vmctl.nodedoc import NodeDesired, PowerState, VmDesired, VmRole


def _layout(count: int = 3, **kw: Any) -> Layout:
    return Layout(host="h", cores=(0, 1), levels=1, discipline=Discipline.SHARED, ssh_ports=30000,
                  shared_ssh_ports=30002, shared_ssh_count=count, **kw)


def _shared(name: str, cap: float = 0.5) -> VmDesired:
    return VmDesired(name=name, core=-1, role=VmRole.SHARED, weight=10000, cap=cap)


def _doc(gen: int, *names: str) -> NodeDesired:
    return NodeDesired(node="h", generation=gen, vms=tuple(_shared(n) for n in names))


def _held(name: str, port: int, node: str = "h") -> VmInfo:
    return VmInfo(name=name, power=PowerState.RUNNING, pinned_cores=(), weight=10000, cap=0.5, cpu_time_s=1.0,
                  metadata={META_NODE: node, "vmctl.managed": "1", "vmctl.role": "shared", "vmctl.core": "-1",
                            META_SSH_PORT: str(port)})


def _ports(actions: list[Any]) -> dict[str, int | None]:
    return {a.vm: a.spec.ssh_port for a in actions if isinstance(a, Define)}


# ------------------------------------------------------------------------------------ the layout


def test_the_shared_range_follows_the_slots_and_must_not_overlap_them() -> None:
    lay = _layout()
    assert lay.slot_ports == range(30000, 30002) and lay.shared_ports == range(30002, 30005)
    assert lay.port_text() == "slots 30000-30001, shared VMs 30002-30004"
    assert lay.spec_for(_shared("a")).ssh_port is None  # a shared VM's port is the plan's to choose
    with pytest.raises(ValidationError, match=r"layout\.shared_ssh_ports: 30001\.\.30003 overlaps layout\.ssh_ports "
                                              r"30000\.\.30001 .*start the shared range at 30002"):
        Layout(host="h", cores=(0, 1), levels=1, ssh_ports=30000, shared_ssh_ports=30001, shared_ssh_count=3)
    with pytest.raises(ValidationError, match=r"layout\.shared_ssh_ports: 65530\.\.65545 .* within 1024\.\.65535"):
        Layout(host="h", cores=(0,), shared_ssh_ports=65530)
    # below the slots is as good as above them; a range without slot ports at all too
    assert Layout(host="h", cores=(0, 1), ssh_ports=30100, shared_ssh_ports=30000,
                  shared_ssh_count=100).shared_ports.stop == 30100
    assert Layout(host="h", cores=(0,), shared_ssh_ports=40000).port_text() == "shared VMs 40000-40015"


# ------------------------------------------------------------------------------------ the config


def _cfg(layout: dict[str, Any], backend: str = "libvirt", **more: Any) -> dict[str, Any]:
    b = {"kind": "libvirt", "uri": "qemu:///system"} if backend == "libvirt" else {"kind": "mock"}
    return {"node": "n1", "backend": b, "layout": layout, **more}


@pytest.mark.parametrize(("layout", "backend", "where"), [
    ({"cores": [0, 1], "levels": 2, "ssh_ports": 30000, "shared_ssh_ports": 30003}, "libvirt",
     r"layout\.shared_ssh_ports: 30003\.\.30018 overlaps layout\.ssh_ports 30000\.\.30003"),
    ({"cores": [0, 1], "levels": 1, "ssh_ports": 30010, "shared_ssh_ports": 30000, "shared_ssh_count": 11}, "libvirt",
     r"layout\.shared_ssh_ports: 30000\.\.30010 overlaps"),
    ({"shared_ssh_ports": 65530, "shared_ssh_count": 10}, "libvirt", r"layout\.shared_ssh_ports: .* within 1024"),
    ({"shared_ssh_ports": 80}, "libvirt", r"layout\.shared_ssh_ports: must be >= 1024"),
    ({"shared_ssh_count": 4}, "libvirt", r"layout\.shared_ssh_count: needs layout\.shared_ssh_ports"),
    ({"shared_ssh_ports": 30000, "shared_ssh_count": 0}, "libvirt", r"layout\.shared_ssh_count: must be >= 1"),
    ({"shared_ssh_ports": 30000}, "mock", r"layout\.shared_ssh_ports: applies to the libvirt backend only"),
])
def test_bad_shared_port_ranges_name_the_key(layout: dict[str, Any], backend: str, where: str) -> None:
    with pytest.raises(ConfigError, match=where):
        parse_agent_config(_cfg(layout, backend), "a.yaml")


def test_a_shared_range_alone_serves_port_addresses_and_is_checked_against_the_hosts_cores() -> None:
    from vmctl.agents.main import _shared_ports
    from vmctl.cli.config_cmd import summary

    ssh = {"enabled": True, "key_file": "/k", "known_hosts": "/kh", "address_pattern": "127.0.0.1:{port}"}
    cfg = parse_agent_config(_cfg({"discipline": "shared", "levels": 1, "shared_ssh_ports": 31000,
                                   "shared_ssh_count": 8}, ssh=ssh), "a.yaml")
    assert (cfg.layout.shared_ssh_ports, cfg.layout.shared_ssh_count) == (31000, 8)
    assert "forwarded SSH ports: shared VMs 31000-31007" in summary("agent", cfg)
    # the cores are left out: the slots' range is only known at start-up, on the host's cores
    both = parse_agent_config(_cfg({"levels": 2, "ssh_ports": 30000, "shared_ssh_ports": 30004}), "a.yaml")
    assert _shared_ports(both, (0, 1)) == {"shared_ssh_ports": 30004, "shared_ssh_count": 16}
    with pytest.raises(ConfigError, match=r"layout\.shared_ssh_ports: 30004\.\.30019 overlaps layout\.ssh_ports "
                                          r"30000\.\.30005"):
        _shared_ports(both, (0, 1, 2))


# ------------------------------------------------------------------------------------ the plan


def test_shared_vms_get_the_lowest_free_ports_of_their_range() -> None:
    lay = _layout(count=4)
    out = plan(_doc(1, "b", "a", "c"), Observed.of([]), lay)
    assert _ports(out) == {"a": 30002, "b": 30003, "c": 30004}  # in name order
    meta = {a.vm: a.spec.metadata[META_SSH_PORT] for a in out if isinstance(a, Define)}
    assert meta == {"a": "30002", "b": "30003", "c": "30004"}
    # without a shared range a shared VM gets no port (as before)
    plain = Layout(host="h", cores=(0, 1), levels=1, discipline=Discipline.SHARED, ssh_ports=30000)
    assert _ports(plan(_doc(1, "a"), Observed.of([]), plain)) == {"a": None}


def test_ports_held_on_the_host_are_adopted_and_a_gone_vms_port_is_free_again() -> None:
    lay = _layout(count=4)
    held = [_held("x", 30002), _held("y", 30004)]  # what an agent finds after a restart
    out = plan(_doc(2, "x", "y", "z", "w"), Observed.of(held), lay)
    assert _ports(out) == {"w": 30003, "z": 30005}  # x and y are not redefined: they keep theirs
    # y leaves in the same plan as w and z arrive: its port goes to the next VM
    out = plan(_doc(3, "x", "z", "w"), Observed.of(held), lay)
    assert _ports(out) == {"w": 30003, "z": 30004}


def test_no_free_port_leaves_the_vm_undefined_with_the_reason() -> None:
    lay = _layout(count=2)
    out = plan(_doc(4, "x", "y", "z"), Observed.of([_held("x", 30002), _held("y", 30003)]), lay)
    (d,) = [a for a in out if isinstance(a, Define)]
    assert d.vm == "z" and d.spec.ssh_port is None and META_SSH_PORT not in d.spec.metadata
    assert d.problem == ("no free forwarded SSH port for z: all 2 ports of layout.shared_ssh_ports 30002-30003 are "
                         "held (by x, y); it is defined once a VM holding one is gone")


def test_a_claim_never_rewrites_the_port_a_vm_was_defined_with() -> None:
    lay = _layout()
    arrived = _held("a", 30003, node="other")  # came here with another node's name
    out = plan(_doc(5, "a"), Observed.of([arrived]), lay)
    (claim,) = [a for a in out if isinstance(a, Claim)]
    assert META_SSH_PORT not in dict(claim.metadata) and dict(claim.metadata)[META_NODE] == "h"


# ------------------------------------------------------------------------------------ the agent (mock backend)


def test_the_agent_assigns_adopts_after_a_restart_releases_and_reports_exhaustion() -> None:
    clock = VirtualClock(0.0)
    lay = _layout(count=2)
    be = MockBackend("h", cores=2, clock=clock)
    src = MemorySource(_doc(1, "a", "b"))

    def agent() -> Reconciler:
        return Reconciler(be, lay, src, MemoryReporter(), clock=clock, runner=MockProcessRunner(be))

    def ports() -> dict[str, str | None]:
        return {v.name: v.metadata.get(META_SSH_PORT) for v in be.list_vms()}

    res = agent().run_once()
    assert res.converged and not res.errors
    assert ports() == {"a": "30002", "b": "30003"}
    # a restarted agent finds both VMs with their ports and changes nothing
    again = agent()
    assert again.run_once().applied == ()
    # a third VM while both ports are held: not defined, the reason is reported, the generation not applied
    src.set(_doc(2, "a", "b", "c"))
    res = again.run_once()
    assert "c" not in ports() and not res.converged
    assert any("define c:" in e and "no free forwarded SSH port for c: all 2 ports of layout.shared_ssh_ports "
               "30002-30003 are held (by a, b)" in e for e in res.errors), res.errors
    assert res.observed is not None and res.observed.generation_applied == 1
    assert any("no free forwarded SSH port" in e for e in res.observed.errors)
    # a goes: its port is released and c gets it (after another restart: adoption again)
    src.set(_doc(3, "b", "c"))
    res = agent().run_once()
    assert res.converged and not res.errors, res.errors
    assert ports() == {"b": "30003", "c": "30002"}


def test_the_fidelity_benchs_real_vcsched_host_forwards_its_shared_vms(tmp_path: Any) -> None:
    """bench.whatif's real host of a shared layout (vcsched) gets the second range right after its slots',
    and its known_hosts file covers every forwarded port."""
    from vmctl.localcluster import agent_config
    from vmctl.whatif.fidelity import SHARED_SSH_PORTS, SPECS, libvirt_agent_config

    (tmp_path / "host_key.pub").write_text("ssh-ed25519 AAAAC3Nza\n")
    fam = SPECS["vcsched"]
    certs = {"cert": "/c", "key": "/k", "ca": "/a"}
    base = agent_config("h", "https://127.0.0.1:1", certs, backend="libvirt", cores=fam.cores,
                        libvirt_uri="qemu:///system", metrics_port=1, layout=dict(fam.layout))
    raw = libvirt_agent_config(base, tmp_path, tmp_path / "kh", [0, 1], 1)
    cfg = parse_agent_config(raw, "a.yaml")
    lc = cfg.layout
    assert lc.ssh_ports is not None and lc.shared_ssh_ports == lc.ssh_ports + 2
    assert lc.shared_ssh_count == SHARED_SSH_PORTS
    lines = (tmp_path / "kh").read_text().splitlines()
    assert len(lines) == 2 + SHARED_SSH_PORTS
    assert lines[-1].startswith(f"[127.0.0.1]:{lc.shared_ssh_ports + SHARED_SSH_PORTS - 1} ")
    # a priority family's real host has slots only
    moldable = dict(SPECS["moldable"].layout)
    plain = libvirt_agent_config({**base, "layout": moldable}, tmp_path, tmp_path / "kh2", [0, 1], 2)
    assert "shared_ssh_ports" not in plain["layout"]
