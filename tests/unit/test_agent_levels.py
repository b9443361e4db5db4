"""The agent's layout: one VM per (core, level), L from the agent config, idle placeholder VMs only
where the discipline needs them (priority, timeslice), none under the shared discipline; L = 1..4
under each discipline on the mock backend, and memory admission."""

from __future__ import annotations

from itertools import pairwise

import pytest

from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN
from vmctl.agents.config import parse_agent_config
from vmctl.agents.layout import MAX_LEVELS, Layout
from vmctl.agents.main import Agent
from vmctl.agents.plan import validate
from vmctl.errors import ConfigError, OutOfRange, ValidationError
from vmctl.nodedoc import NodeDesired, PowerState, VmDesired, VmRole


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


# ------------------------------------------------------------------ L = 1..4 under each discipline (mock backend)

def _agent(discipline: str, levels: int, **layout: object) -> Agent:
    from vmctl.agents.main import build_agent

    cfg = parse_agent_config({"node": "n", "backend": {"cores": 2},
                              "layout": {"discipline": discipline, "levels": levels, **layout}}, "a.yaml")
    return build_agent(cfg)


def _vms(agent: Agent) -> dict[str, tuple[PowerState, int | None, tuple[int, ...] | None]]:
    return {v.name: (v.power, v.weight, v.pinned_cores) for v in agent.backend.list_vms()}


@pytest.mark.parametrize("levels", [1, 2, 3, 4])
def test_priority_levels_boot_with_weights_falling_by_level(levels: int) -> None:
    agent = _agent("priority", levels)
    assert agent.reconciler.run_once().converged
    names = ["fg", "bg", "bg2", "bg3"][:levels]
    vms = _vms(agent)
    assert sorted(vms) == sorted(f"n-c{k}-{t}" for k in range(2) for t in names)
    for k in range(2):
        weights = [vms[f"n-c{k}-{t}"][1] for t in names]
        assert weights[0] == WEIGHT_MAX and weights[-1] == (WEIGHT_MIN if levels > 1 else WEIGHT_MAX)
        assert all(a > b for a, b in pairwise(weights)), weights
        assert all(vms[f"n-c{k}-{t}"][0] is PowerState.RUNNING and vms[f"n-c{k}-{t}"][2] == (k,) for t in names)
    if levels == 2:  # the MEASY pair, exactly as before: fg 10000, bg 1, no level in names or metadata
        assert [vms["n-c0-fg"][1], vms["n-c0-bg"][1]] == [10000, 1]
        assert all("vmctl.level" not in v.metadata for v in agent.backend.list_vms())
    if levels == 3:
        assert [vms[f"n-c0-{t}"][1] for t in names] == [10000, 100, 1]
    # a job VM on the lowest level takes that level's slot (its placeholder goes), and one whose weight
    # does not fall below the level above is refused as a whole
    low = levels - 1
    job = VmDesired(name="j1-r1-p0", core=0, role=VmRole.BG if low else VmRole.FG, weight=WEIGHT_MIN if low else
                    WEIGHT_MAX, level=low)
    agent.reconciler.source.set(NodeDesired("n", 1, (job,)))  # type: ignore[attr-defined]
    assert agent.reconciler.run_once().converged
    after = _vms(agent)
    assert "j1-r1-p0" in after and f"n-c0-{names[low]}" not in after and len(after) == 2 * levels
    if levels > 1:
        bad = VmDesired(name="j2-r1-p0", core=1, role=VmRole.BG, weight=WEIGHT_MAX, level=low)
        agent.reconciler.source.set(NodeDesired("n", 2, (job, bad)))  # type: ignore[attr-defined]
        res = agent.reconciler.run_once()
        assert any("must exceed" in e for e in res.errors) and "j2-r1-p0" not in _vms(agent)


@pytest.mark.parametrize("levels", [1, 2, 3, 4])
def test_timeslice_rows_only_the_active_row_runs(levels: int) -> None:
    agent = _agent("timeslice", levels)
    rec = agent.reconciler
    assert rec.run_once().converged
    for i, active in enumerate([*range(levels), 0]):
        if i:  # the first: the bare layout, row 0 active
            rec.switch_row(active)
            assert rec.run_once().converged
        vms = _vms(agent)
        assert sorted(vms) == sorted(f"n-c{k}-r{r}" for k in range(2) for r in range(levels))
        for k in range(2):
            for r in range(levels):
                want = (PowerState.RUNNING, WEIGHT_MAX) if r == active else (PowerState.PAUSED, WEIGHT_MIN)
                assert vms[f"n-c{k}-r{r}"][:2] == want and vms[f"n-c{k}-r{r}"][2] == (k,)
    assert all(v.metadata["vmctl.level"] in {str(r) for r in range(levels)} for v in agent.backend.list_vms())
    with pytest.raises(OutOfRange, match="active row"):
        rec.switch_row(levels)
    # a job VM in the last row follows its row: paused while another row is active, resumed with it;
    # a VM desired state wants paused stays paused whatever the row
    job = VmDesired(name="j1-r1-p0", core=1, role=VmRole.BG, weight=WEIGHT_MIN, level=levels - 1)
    held = VmDesired(name="j2-r1-p0", core=0, role=VmRole.FG, weight=WEIGHT_MAX, level=0, power=PowerState.PAUSED)
    rec.source.set(NodeDesired("n", 1, (job, held)))  # type: ignore[attr-defined]
    rec.switch_row(levels - 1)
    assert rec.run_once().converged
    vms = _vms(agent)
    assert vms["j1-r1-p0"][:2] == (PowerState.RUNNING, WEIGHT_MAX) and vms["j2-r1-p0"][0] is PowerState.PAUSED
    assert f"n-c1-r{levels - 1}" not in vms and "n-c0-r0" not in vms
    if levels > 1:
        rec.switch_row(0)
        assert rec.run_once().converged
        vms = _vms(agent)
        assert vms["j1-r1-p0"][:2] == (PowerState.PAUSED, WEIGHT_MIN) and vms["j2-r1-p0"][0] is PowerState.PAUSED


@pytest.mark.parametrize("levels", [2, 3])
def test_timeslice_inactive_rows_can_soak_up_idle_cycles(levels: int) -> None:
    agent = _agent("timeslice", levels, inactive="soak")
    agent.reconciler.switch_row(1)
    assert agent.reconciler.run_once().converged
    vms = _vms(agent)
    for r in range(levels):
        assert vms[f"n-c0-r{r}"][:2] == (PowerState.RUNNING, WEIGHT_MAX if r == 1 else WEIGHT_MIN)


@pytest.mark.parametrize("levels", [1, 2, 3, 4])
def test_shared_workers_run_at_one_weight_without_placeholders(levels: int) -> None:
    agent = _agent("shared", levels)
    rec = agent.reconciler
    assert rec.run_once().converged and _vms(agent) == {}
    # L workers on core 0 (whatever weights desired state asks for: the discipline's is one weight)
    workers = tuple(VmDesired(name=f"j{w}-r1-p0", core=0, role=VmRole.FG if w == 0 else VmRole.BG,
                              weight=WEIGHT_MAX if w == 0 else WEIGHT_MIN, level=w) for w in range(levels))
    rec.source.set(NodeDesired("n", 1, workers))  # type: ignore[attr-defined]
    assert rec.run_once().converged
    vms = _vms(agent)
    assert sorted(vms) == sorted(v.name for v in workers)
    assert {vms[v.name][:3] for v in workers} == {(PowerState.RUNNING, WEIGHT_MAX, (0,))}
    with pytest.raises(ValidationError, match="only a timeslice layout has rows"):
        rec.switch_row(0)
    # a worker beyond the host's levels is refused
    extra = VmDesired(name="jx-r1-p0", core=0, role=VmRole.BG, weight=1, level=levels)
    rec.source.set(NodeDesired("n", 2, (*workers, extra)))  # type: ignore[attr-defined]
    assert any(f"{levels} out of range 0..{levels - 1}" in e for e in rec.run_once().errors)


def test_an_agent_refuses_a_layout_its_host_cannot_hold() -> None:
    from vmctl.agents.main import build_agent

    base = {"node": "n", "backend": {"cores": 4, "memory_mib": 1024}}
    build_agent(parse_agent_config({**base, "layout": {"discipline": "timeslice", "levels": 4}}, "a.yaml"))  # 1 GiB
    with pytest.raises(ConfigError, match=r"layout\.levels: 5 levels x 4 cores x 64 MiB = 1280 MiB of VMs do not "
                                          r"fit in the host's 1024 MiB"):
        build_agent(parse_agent_config({**base, "layout": {"discipline": "timeslice", "levels": 5}}, "a.yaml"))
    with pytest.raises(ConfigError, match="do not fit"):  # the configured host memory counts, and shared too
        build_agent(parse_agent_config({**base, "host": {"memory_mib": 100},
                                        "layout": {"discipline": "shared", "levels": 1}}, "a.yaml"))


def test_a_vms_level_travels_in_both_desired_formats() -> None:
    from vmctl.wire import desired_from_json, desired_to_json

    row = VmDesired(name="j1-r1-p0", core=1, role=VmRole.BG, weight=1, level=2)
    pair = VmDesired(name="j2-r1-p0", core=0, role=VmRole.FG, weight=10000)  # no level: follows its role
    doc = NodeDesired("n", 3, (row, pair))
    raw = desired_to_json(doc)
    assert raw["vms"][0]["level"] == 2 and "level" not in raw["vms"][1]  # fg/bg documents as before
    back = desired_from_json(raw)
    assert back == doc and back.vms[0].slot_level == 2 and back.vms[1].slot_level == 0
    with pytest.raises(ValidationError, match="level"):
        desired_from_json({"node": "n", "generation": 1, "vms": [{"name": "x", "core": 0, "role": "bg", "weight": 1,
                                                                  "level": -2}]})
    from vmctl.agents.sources import desired_from_document  # the --desired FILE seam: the same codec

    with pytest.raises(ConfigError, match=r"d\.yaml: vms\[0\]\.level: must be >= 0"):
        desired_from_document({"node": "n", "generation": 1, "vms": [{"name": "x", "core": 0, "role": "bg",
                                                                      "weight": 1, "level": -2}]}, "d.yaml")
