"""Table tests of the pure ``plan()`` and of ``validate()``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.support.agents import swap_tiers
from vmctl.agents.backends.base import MigrationState, MigrationStatus, ProcessStatus, VmInfo
from vmctl.agents.layout import Layout
from vmctl.agents.plan import (
    AbortMigration,
    Action,
    CheckpointVm,
    Define,
    KillProcess,
    Observed,
    Pin,
    RestoreVm,
    Resume,
    Start,
    StartMigration,
    StartProcess,
    Stop,
    Suspend,
    TransferCheckpoint,
    Tune,
    Undefine,
    accept,
    plan,
    validate,
)
from vmctl.errors import ValidationError
from vmctl.nodedoc import MigrationSpec, NodeDesired, PowerState, ProcessSpec, VmDesired, VmRole

L = Layout("n1", (0, 1))
META = {"vmctl.managed": "1", "vmctl.node": "n1"}
P1 = ProcessSpec(job_id="j1", index=0, command="run", work_seconds=10)
P2 = ProcessSpec(job_id="j2", index=3, command="run", work_seconds=10)


def info(name: str, power: PowerState = PowerState.RUNNING, core: int | None = 0, weight: int = 10000,
         cap: float | None = None, meta: dict[str, str] | None = None) -> VmInfo:
    return VmInfo(name=name, power=power, pinned_cores=None if core is None else (core,), weight=weight, cap=cap,
                  cpu_time_s=0.0, metadata=META if meta is None else meta)


def want(name: str = "n1-c0-fg", core: int = 0, role: VmRole = VmRole.FG, weight: int = 10000, **kw: Any) -> VmDesired:
    return VmDesired(name=name, core=core, role=role, weight=weight, **kw)


def node(*vms: VmDesired, gen: int = 1) -> NodeDesired:
    return NodeDesired(node="n1", generation=gen, vms=vms)


def obs(*vms: VmInfo, **kw: Any) -> Observed:
    return Observed.of(list(vms), **kw)


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    return [(a.kind, a.vm) for a in actions]


FG = want()
FG_INFO = info("n1-c0-fg")


def run_status(vm: str, p: ProcessSpec, running: bool = True, exit_code: int | None = None) -> ProcessStatus:
    return ProcessStatus(vm=vm, job_id=p.job_id, index=p.index, running=running, exit_code=exit_code)


MIG_LIVE = MigrationSpec(migration_id="m1", source_node="n1", target_node="n2", target_core=1)
MIG_IN = MigrationSpec(migration_id="m2", source_node="n2", target_node="n1", target_core=1)
MIG_CK = MigrationSpec(migration_id="m3", source_node="n1", target_node="n2", target_core=0, mode="checkpoint")
MIG_CK_IN = MigrationSpec(migration_id="m4", source_node="n2", target_node="n1", target_core=0, mode="checkpoint",
                          phase="running")

CASES: list[tuple[str, NodeDesired, Observed, list[Action]]] = [
    ("matches: nothing to do", node(FG), obs(FG_INFO), []),
    ("absent: define pin tune start", node(FG), obs(),
     [Define(L.spec_for(FG)), Pin("n1-c0-fg", (0,)), Tune("n1-c0-fg", weight=10000), Start("n1-c0-fg")]),
    ("weight differs", node(FG), obs(info("n1-c0-fg", weight=1)), [Tune("n1-c0-fg", weight=10000)]),
    ("cap set", node(want(cap=0.5)), obs(FG_INFO), [Tune("n1-c0-fg", cap=0.5)]),
    ("cap within tolerance", node(want(cap=0.5)), obs(info("n1-c0-fg", cap=0.50001)), []),
    ("cap changed", node(want(cap=0.5)), obs(info("n1-c0-fg", cap=0.25)), [Tune("n1-c0-fg", cap=0.5)]),
    ("cap cleared", node(FG), obs(info("n1-c0-fg", cap=0.3)), [Tune("n1-c0-fg", clear_cap=True)]),
    ("weight and cap in one tune", node(want(weight=500, cap=0.2)), obs(FG_INFO),
     [Tune("n1-c0-fg", weight=500, cap=0.2)]),
    ("pinned elsewhere", node(FG), obs(info("n1-c0-fg", core=1)), [Pin("n1-c0-fg", (0,))]),
    ("unpinned", node(FG), obs(info("n1-c0-fg", core=None)), [Pin("n1-c0-fg", (0,))]),
    ("shutoff -> start", node(FG), obs(info("n1-c0-fg", PowerState.SHUTOFF)), [Start("n1-c0-fg")]),
    ("paused -> resume", node(FG), obs(info("n1-c0-fg", PowerState.PAUSED)), [Resume("n1-c0-fg")]),
    ("crashed -> stop, start", node(FG), obs(info("n1-c0-fg", PowerState.CRASHED)),
     [Stop("n1-c0-fg"), Start("n1-c0-fg")]),
    ("want paused", node(want(power=PowerState.PAUSED)), obs(FG_INFO), [Suspend("n1-c0-fg")]),
    ("want paused, already", node(want(power=PowerState.PAUSED)), obs(info("n1-c0-fg", PowerState.PAUSED)), []),
    ("want shutoff", node(want(power=PowerState.SHUTOFF)), obs(FG_INFO), [Stop("n1-c0-fg")]),
    ("want shutoff, absent: define only", node(want(power=PowerState.SHUTOFF)), obs(),
     [Define(L.spec_for(want(power=PowerState.SHUTOFF))), Pin("n1-c0-fg", (0,)), Tune("n1-c0-fg", weight=10000)]),
    ("want absent", node(want(power=PowerState.ABSENT)), obs(FG_INFO), [Stop("n1-c0-fg"), Undefine("n1-c0-fg")]),
    ("want absent, shutoff", node(want(power=PowerState.ABSENT)), obs(info("n1-c0-fg", PowerState.SHUTOFF)),
     [Undefine("n1-c0-fg")]),
    ("want absent, absent", node(want(power=PowerState.ABSENT)), obs(), []),
    ("want saved", node(want(power=PowerState.SAVED, checkpoint_path="/ck/a")), obs(FG_INFO),
     [CheckpointVm("n1-c0-fg", "/ck/a")]),
    ("want saved, saved", node(want(power=PowerState.SAVED, checkpoint_path="/ck/a")),
     obs(info("n1-c0-fg", PowerState.SAVED)), []),
    ("saved + file -> restore", node(want(checkpoint_path="/ck/a")),
     obs(info("n1-c0-fg", PowerState.SAVED), files=frozenset({"/ck/a"})), [RestoreVm("n1-c0-fg", "/ck/a")]),
    ("absent + file -> restore", node(want(checkpoint_path="/ck/a")), obs(files=frozenset({"/ck/a"})),
     [RestoreVm("n1-c0-fg", "/ck/a")]),
    ("saved, no file -> start", node(want(checkpoint_path="/ck/a")), obs(info("n1-c0-fg", PowerState.SAVED)),
     [Start("n1-c0-fg")]),
    ("process: start", node(want(process=P1)), obs(FG_INFO), [StartProcess("n1-c0-fg", P1)]),
    ("process: running, same", node(want(process=P1)),
     obs(FG_INFO, processes={"n1-c0-fg": run_status("n1-c0-fg", P1)}), []),
    ("process: ended is never restarted", node(want(process=P1)),
     obs(FG_INFO, processes={"n1-c0-fg": run_status("n1-c0-fg", P1, False, 0)}), []),
    ("process: replace", node(want(process=P2)),
     obs(FG_INFO, processes={"n1-c0-fg": run_status("n1-c0-fg", P1)}),
     [KillProcess("n1-c0-fg"), StartProcess("n1-c0-fg", P2)]),
    ("process: replace an ended one", node(want(process=P2)),
     obs(FG_INFO, processes={"n1-c0-fg": run_status("n1-c0-fg", P1, False, 1)}), [StartProcess("n1-c0-fg", P2)]),
    ("process: not wanted", node(FG), obs(FG_INFO, processes={"n1-c0-fg": run_status("n1-c0-fg", P1)}),
     [KillProcess("n1-c0-fg")]),
    ("process: waits for the VM to run", node(want(process=P1)), obs(info("n1-c0-fg", PowerState.SHUTOFF)),
     [Start("n1-c0-fg")]),
    ("prune: managed orphan", node(FG), obs(FG_INFO, info("n1-old", core=1)), [Stop("n1-old"), Undefine("n1-old")]),
    ("prune: foreign VM untouched", node(FG), obs(FG_INFO, info("someone", meta={})), []),
    ("prune: layout name adopted w/o metadata", node(FG), obs(FG_INFO, info("n1-c1-bg", meta={}, core=1)),
     [Stop("n1-c1-bg"), Undefine("n1-c1-bg")]),
    ("prune: other node's VM untouched", node(FG),
     obs(FG_INFO, info("n2-x", meta={"vmctl.managed": "1", "vmctl.node": "n2"})), []),
    ("shared unpinned: no pin", node(want("s1", core=-1, role=VmRole.SHARED, weight=300, cap=0.4)),
     obs(info("s1", core=None, weight=300, cap=0.4)), []),
    ("shared pinned", node(want("s1", core=1, role=VmRole.SHARED, weight=300)),
     obs(info("s1", core=None, weight=300)), [Pin("s1", (1,))]),
    ("migration source: start", node(want(migration=MIG_LIVE)), obs(FG_INFO),
     [StartMigration("n1-c0-fg", "mock://n2", "tcp://n2")]),
    ("migration source: paused (its gang row's slice) runs first", node(want(migration=MIG_LIVE)),
     obs(info("n1-c0-fg", PowerState.PAUSED)), [Resume("n1-c0-fg")]),
    ("migration source: paused as desired stays so", node(want(migration=MIG_LIVE, power=PowerState.PAUSED)),
     obs(info("n1-c0-fg", PowerState.PAUSED)), []),
    ("migration source: in flight", node(want(migration=MIG_LIVE)), obs(info("n1-c0-fg", PowerState.MIGRATING)), []),
    ("migration source: gone is never re-created", node(want(migration=MIG_LIVE)), obs(), []),
    ("migration source: failed waits for the daemon", node(want(migration=MIG_LIVE)),
     obs(FG_INFO, migrations={"n1-c0-fg": MigrationStatus(MigrationState.FAILED)}), []),
    ("migration source: abort", node(want(migration=replace(MIG_LIVE, phase="aborted"))),
     obs(info("n1-c0-fg", PowerState.MIGRATING), migrations={"n1-c0-fg": MigrationStatus(MigrationState.RUNNING)}),
     [AbortMigration("n1-c0-fg")]),
    ("migration source: completed, leftover undefined", node(want(migration=replace(MIG_LIVE, phase="completed"))),
     obs(info("n1-c0-fg", PowerState.SHUTOFF)), [Undefine("n1-c0-fg")]),
    ("migration target: waits", node(want("v9", core=0, role=VmRole.SHARED, weight=5, migration=MIG_IN)), obs(), []),
    ("migration target: arrived, pinned to target core",
     node(want("v9", core=0, role=VmRole.SHARED, weight=5, migration=MIG_IN)), obs(info("v9", core=0, weight=9)),
     [Tune("v9", weight=5), Pin("v9", (1,))]),  # a lowered weight goes first
    ("migration target: an unpinned shared VM arrives and stays unpinned",
     node(want("v9", core=-1, role=VmRole.SHARED, weight=5, migration=replace(MIG_IN, target_core=-1))),
     obs(info("v9", core=None, weight=5)), []),
    ("checkpoint migration source", node(want(migration=MIG_CK, checkpoint_path="/ck/m")), obs(FG_INFO),
     [CheckpointVm("n1-c0-fg", "/ck/m")]),
    ("checkpoint migration source: saved, done", node(want(migration=MIG_CK, checkpoint_path="/ck/m")),
     obs(info("n1-c0-fg", PowerState.SAVED)), []),
    ("checkpoint migration target: restore when running + file",
     node(want("v8", core=0, role=VmRole.SHARED, weight=5, migration=MIG_CK_IN, checkpoint_path="/ck/m")),
     obs(files=frozenset({"/ck/m"})), [RestoreVm("v8", "/ck/m")]),
    ("checkpoint migration target: no file yet",
     node(want("v8", core=0, role=VmRole.SHARED, weight=5, migration=MIG_CK_IN, checkpoint_path="/ck/m")), obs(), []),
    ("checkpoint migration target: not before phase running",
     node(want("v8", core=0, role=VmRole.SHARED, weight=5, migration=replace(MIG_CK_IN, phase="requested"),
               checkpoint_path="/ck/m")), obs(files=frozenset({"/ck/m"})), []),
]


@pytest.mark.parametrize(("desired", "observed", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_plan_table(desired: NodeDesired, observed: Observed, expected: list[Action]) -> None:
    got = plan(desired, observed, L, peers={"n2": "mock://n2"}, migrate_uris={"n2": "tcp://n2"})
    assert got == expected


def test_physical_core_mapping() -> None:
    lay = Layout("n1", (2, 3))
    got = plan(node(want("n1-c1-fg", core=1)), obs(info("n1-c1-fg", core=2)), lay)
    assert got == [Pin("n1-c1-fg", (3,))]


def test_bare_layout_on_an_empty_host_orders_phases() -> None:
    got = plan(L.base_desired(1), obs(), L)
    order = [a.kind for a in got]
    assert order == ["define"] * 4 + ["pin"] * 4 + ["tune"] * 4 + ["start"] * 4
    assert plan(L.base_desired(1), obs(*[info(v.name, core=v.core, weight=v.weight) for v in L.pair_vms()]), L) == []


def test_promote_lowers_before_it_raises() -> None:
    base = L.base_desired(1)
    have = obs(*[info(v.name, core=v.core, weight=v.weight) for v in L.pair_vms()])
    got = plan(swap_tiers(base, 0), have, L)
    assert got == [Tune("n1-c0-fg", weight=1), Tune("n1-c0-bg", weight=10000)]
    # never two VMs at the fg weight on core 0 at any step
    weights = {"n1-c0-fg": 10000, "n1-c0-bg": 1}
    for a in got:
        assert isinstance(a, Tune) and a.weight is not None
        weights[a.vm] = a.weight
        assert sorted(weights.values()) != [10000, 10000]


def test_paused_from_absent_starts_then_suspends() -> None:
    got = plan(node(want(power=PowerState.PAUSED)), obs(), L)
    assert kinds(got) == [("define", "n1-c0-fg"), ("pin", "n1-c0-fg"), ("tune", "n1-c0-fg"), ("start", "n1-c0-fg"),
                          ("suspend", "n1-c0-fg")]


def test_checkpoint_transfer_after_the_checkpoint_once() -> None:
    d = node(want(migration=MIG_CK, checkpoint_path="/ck/m"))
    saved = info("n1-c0-fg", PowerState.SAVED)
    assert plan(d, obs(saved, files=frozenset({"/ck/m"})), L, transfer_checkpoints=True) == [
        TransferCheckpoint("n1-c0-fg", "/ck/m", "n2")]
    assert plan(d, obs(saved, files=frozenset({"/ck/m"}), transferred=frozenset({"/ck/m"})), L,
                transfer_checkpoints=True) == []
    assert plan(d, obs(saved), L, transfer_checkpoints=True) == []  # no file: nothing to copy
    assert plan(d, obs(saved, files=frozenset({"/ck/m"})), L) == []  # shared storage
    assert plan(d, obs(FG_INFO), L, transfer_checkpoints=True) == [CheckpointVm("n1-c0-fg", "/ck/m")]


def test_prune_off_keeps_everything() -> None:
    assert plan(node(FG), obs(FG_INFO, info("n1-old", core=1)), L, prune=False) == []


def test_kills_come_before_stops_and_starts() -> None:
    d = node(want(process=P2), want("n1-c1-fg", core=1, power=PowerState.SHUTOFF))
    o = obs(FG_INFO, info("n1-c1-fg", core=1), processes={"n1-c0-fg": run_status("n1-c0-fg", P1)})
    got = kinds(plan(d, o, L))
    assert got == [("kill_process", "n1-c0-fg"), ("stop", "n1-c1-fg"), ("start_process", "n1-c0-fg")]


# ------------------------------------------------------------------------------------ validate

BAD: list[tuple[str, NodeDesired, str]] = [
    ("other node", NodeDesired(node="n9", generation=1), "node"),
    ("negative generation", node(gen=-1), "generation"),
    ("duplicate", node(FG, FG), "listed more than once"),
    ("core out of range", node(want(core=2)), "vms[0](n1-c0-fg).core"),
    ("fg VM unpinned", node(want(core=-1)), ".core"),
    ("shared core -2", node(want("s", core=-2, role=VmRole.SHARED)), ".core"),
    ("weight 0", node(want(weight=0)), ".weight"),
    ("weight too big", node(want(weight=10001)), ".weight"),
    ("cap 0", node(want(cap=0.0)), ".cap"),
    ("cap > 1", node(want(cap=1.5)), ".cap"),
    ("cap nan", node(want(cap=float("nan"))), ".cap"),
    ("two fg on a core", node(FG, want("other", core=0)), "already has a fg VM"),
    ("fg weight not above bg", node(FG, want("n1-c0-bg", role=VmRole.BG, weight=10000)), "must exceed"),
    ("saved without path", node(want(power=PowerState.SAVED)), ".checkpoint_path"),
    ("crashed desired", node(want(power=PowerState.CRASHED)), ".power"),
    ("memory 0", node(want(memory_mib=0)), ".memory_mib"),
    ("process usage 0", node(want(process=replace(P1, cpu_usage=0.0))), ".process.cpu_usage"),
    ("process negative work", node(want(process=replace(P1, work_seconds=-1))), ".process.work_seconds"),
    ("migration elsewhere", node(want(migration=replace(MIG_LIVE, source_node="n7"))), ".migration"),
    ("migration to self", node(want(migration=replace(MIG_LIVE, target_node="n1"))), ".migration"),
    ("migration target core", node(want("v", role=VmRole.SHARED, migration=replace(MIG_IN, target_core=5))),
     "target_core"),
    ("migration target core -1 for a fg VM", node(want("v", core=1, migration=replace(MIG_IN, target_core=-1))),
     "target_core"),
    ("checkpoint migration without path", node(want(migration=MIG_CK)), ".checkpoint_path"),
    ("two arriving fg on a core", node(want("a", core=1, migration=MIG_IN), want("b", core=1, migration=MIG_IN)),
     "already has a fg VM"),
    ("arrived fg (completed) on a taken core", node(want(core=1), want("b", core=1, migration=replace(
        MIG_IN, phase="completed"))), "already has a fg VM"),
    ("bad name", node(want("a b")), ".name"),
]


@pytest.mark.parametrize(("desired", "needle"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_validate_rejects(desired: NodeDesired, needle: str) -> None:
    with pytest.raises(ValidationError) as ei:
        validate(desired, L)
    assert needle in str(ei.value)
    assert "desired[" in str(ei.value)


def test_validate_accepts_the_full_layout_and_a_swap() -> None:
    validate(L.base_desired(3), L)
    validate(swap_tiers(L.base_desired(3), 1), L)
    validate(node(want("s", core=-1, role=VmRole.SHARED, weight=3, cap=0.3)), L)
    # a chain of moves: the VM arriving on core 1 shares it with the one about to leave from there
    validate(node(want("leaving", core=1), want("arriving", core=1, migration=MIG_IN)), L)


def test_accept_refuses_only_the_migration_to_an_unknown_peer() -> None:
    """issue 9 item 4: a migration toward a node missing from ``peers`` used to make ``validate`` reject
    the whole generation (the node froze until the daemon's migration timeout). Now that migration
    alone is refused (aborted: its VM is left as it is), every other VM of the document is applied."""
    doc = node(want(migration=replace(MIG_LIVE, target_node="n5")), want("other", core=1, process=P2), gen=7)
    full, refused = accept(doc, L, peers={"n2": "mock://n2"})
    assert [(r.vm, r.migration_id, r.target_node) for r in refused] == [("n1-c0-fg", "m1", "n5")]
    assert "unknown peer 'n5'" in refused[0].reason and "peers.n5" in refused[0].reason
    assert full.generation == 7 and [v.name for v in full.vms] == ["n1-c0-fg", "other"]
    assert full.vms[0].migration == replace(MIG_LIVE, target_node="n5", phase="aborted")
    assert full.vms[1] == doc.vms[1]
    # the plan of the accepted document runs the rest and never starts the refused migration
    acts = plan(full, obs(FG_INFO), L, peers={"n2": "mock://n2"})
    assert ("define", "other") in kinds(acts) and not any(a.vm == "n1-c0-fg" for a in acts)
    # a VM that already left (absent here) is not re-created by the refusal
    assert not any(a.vm == "n1-c0-fg" for a in plan(full, obs(), L, peers={"n2": "mock://n2"}))
    # a known peer, an incoming migration, an aborted one: nothing refused, the document unchanged
    for ok in (node(want(migration=MIG_LIVE)), node(want("v", core=1, migration=MIG_IN)),
               node(want(migration=replace(MIG_LIVE, target_node="n5", phase="aborted")))):
        assert accept(ok, L, peers={"n2": "mock://n2"}) == (ok, ())
    # peers not given (None): not checked, as before
    assert accept(doc, L)[1] == ()
    # a broken document is still rejected as a whole
    with pytest.raises(ValidationError, match="weight"):
        accept(node(want(weight=0, migration=replace(MIG_LIVE, target_node="n5"))), L, peers={})


def test_accept_refuses_a_checkpoint_migration_without_a_checkpoint_host() -> None:
    ck = want(checkpoint_path="/ck/a.save", migration=MIG_CK)
    assert accept(node(ck), L, peers={}, checkpoint_peers=None)[1] == ()  # shared storage: any node
    assert accept(node(ck), L, peers={}, checkpoint_peers={"n2"})[1] == ()
    full, refused = accept(node(ck), L, peers={}, checkpoint_peers={"n3"})
    assert [r.vm for r in refused] == ["n1-c0-fg"] and "checkpoints.hosts.n2" in refused[0].reason
    assert full.vms[0].migration is not None and full.vms[0].migration.phase == "aborted"
    assert plan(full, obs(FG_INFO), L, transfer_checkpoints=True) == [], "the VM is not saved for nothing"
