"""The agent's layout: one VM per (core, level), L from the agent config, idle placeholder VMs only
where the discipline needs them (priority), none under the shared discipline."""

from __future__ import annotations

import pytest

from vmctl.agents.config import parse_agent_config
from vmctl.agents.layout import MAX_LEVELS, Layout
from vmctl.agents.plan import validate
from vmctl.errors import ConfigError, OutOfRange, ValidationError
from vmctl.model import NodeDesired, VmDesired, VmRole


def test_priority_layout_keeps_a_placeholder_per_core_and_level() -> None:
    lay = Layout(host="n1", cores=(2, 3))
    assert [v.name for v in lay.pair_vms()] == ["n1-c0-fg", "n1-c0-bg", "n1-c1-fg", "n1-c1-bg"]


def test_one_level_and_no_placeholders() -> None:
    one = Layout(host="n1", cores=(0, 1), levels=1)
    assert [v.name for v in one.pair_vms()] == ["n1-c0-fg", "n1-c1-fg"]
    assert one.is_ours("n1-c0-fg", {}) and not one.is_ours("n1-c0-bg", {})
    bare = Layout(host="n1", cores=(0, 1), levels=1, placeholders=False)
    assert bare.pair_vms() == [] and bare.complete(NodeDesired("n1", 1)).vms == ()
    shared = VmDesired(name="j1-r1-p0", core=-1, role=VmRole.SHARED, weight=100, cap=0.5)
    assert bare.complete(NodeDesired("n1", 1, (shared,))).vms == (shared,)
    with pytest.raises(OutOfRange, match=r"layout\.levels"):
        Layout(host="n1", cores=(0,), levels=MAX_LEVELS + 1)


def test_a_bg_vm_needs_two_levels() -> None:
    lay = Layout(host="n1", cores=(0,), levels=1)
    bg = VmDesired(name="x", core=0, role=VmRole.BG, weight=1)
    with pytest.raises(ValidationError, match="a bg VM needs 2 levels per core"):
        validate(NodeDesired("n1", 1, (bg,)), lay)


def test_config_discipline_and_levels() -> None:
    base = {"node": "n", "backend": {"cores": 2}}
    cfg = parse_agent_config(base, "a.yaml")
    assert (cfg.layout.discipline, cfg.layout.levels) == ("priority", 2)
    cfg = parse_agent_config({**base, "layout": {"discipline": "shared", "levels": 1}}, "a.yaml")
    assert (cfg.layout.discipline, cfg.layout.levels) == ("shared", 1)
    for layout, msg in (({"discipline": "gang"}, "must be one of priority, timeslice, shared"),
                        ({"levels": MAX_LEVELS + 1}, "levels"), ({"levels": 0}, "levels"),
                        ({"levels": 3, "fg_weight": 2, "bg_weight": 1}, "3 priority levels need 3 distinct weights"),
                        ({"inactive": "soak"}, "applies to the timeslice discipline only"),
                        ({"discipline": "timeslice", "inactive": "sleep"}, "must be one of pause, soak")):
        with pytest.raises(ConfigError, match=msg):
            parse_agent_config({**base, "layout": layout}, "a.yaml")


def test_a_shared_host_boots_no_idle_vms() -> None:
    from vmctl.agents.main import build_agent

    cfg = parse_agent_config({"node": "n", "backend": {"cores": 2}, "layout": {"discipline": "shared", "levels": 1}},
                             "a.yaml")
    agent = build_agent(cfg)
    assert agent.reconciler.run_once().converged and agent.backend.list_vms() == []
    two = build_agent(parse_agent_config({"node": "n", "backend": {"cores": 2}}, "a.yaml"))
    assert two.reconciler.run_once().converged and len(two.backend.list_vms()) == 4
