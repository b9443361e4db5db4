"""issue 10, "Agents: one VM per (core, level), L from the agent config": the agent registers its VM level
layout (levels per core, discipline) with vmctld, which stores it (schema 004, upgraded in place from
schema 3 on SQLite and PostgreSQL), keeps it in the node record, builds the policy's ``ClusterView`` from
it, shows it in ``vmctl node list``/``show``, refuses a mixed cluster, and refuses a policy whose needs
the registered cluster cannot meet (``policy-needs-unmet``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_node_attributes import _store_at

from vmctl.agents.config import parse_agent_config
from vmctl.agents.main import build_agent, layout_registration
from vmctl.api import schemas
from vmctl.api.documents import node_json
from vmctl.cli.render import node_table, node_text
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.errors import Conflict, PolicyNeedsUnmet, ValidationError
from vmctl.model import Discipline, NodeLayout
from vmctl.policies.registry import create_policy
from vmctl.store import NodeRecord, WriteBatch, open_store
from vmctl.store.sql import SUPPORTED_VERSION

# ------------------------------------------------------------------------------ the store


def test_a_schema_3_database_upgrades_in_place(store_url: str) -> None:
    s, epoch = _store_at(store_url, 3)
    with s._transaction() as cur:  # a node as vmctld of schema 3 wrote it: no level columns
        s._exec(cur, "INSERT INTO nodes (name, doc, speed, node_group, memory_mib) VALUES (?, ?, ?, ?, ?)",
                ("n1", '{"name": "n1", "cores": 4, "state": "ready"}', 2.0, "fast", 4096))
    assert SUPPORTED_VERSION >= 4
    assert s.migrate() == SUPPORTED_VERSION
    (n1,) = s.load_nodes()
    assert (n1.cores, n1.speed, n1.group, n1.memory_mib) == (4, 2.0, "fast", 4096)
    assert (n1.levels, n1.discipline) == (2, "priority")  # what every agent had before
    n1.levels, n1.discipline = 3, "timeslice"
    s.write(epoch, WriteBatch(nodes={"n1": n1, "n2": NodeRecord(name="n2", cores=2, levels=1, discipline="shared")}))
    got = {n.name: (n.levels, n.discipline, n.speed) for n in s.load_nodes()}
    assert got == {"n1": (3, "timeslice", 2.0), "n2": (1, "shared", 1.0)}
    with s._transaction() as cur:  # the columns, not the document, hold the layout
        s._exec(cur, "SELECT doc FROM nodes WHERE name = 'n1'")
        assert "levels" not in cur.fetchone()[0]
    s.close()


# a bad stored levels or discipline column: test_node_attributes.test_a_bad_stored_column_names_its_table_and_row


# ------------------------------------------------------------------------------ vmctld


def _daemon(tmp: Path, clock: VirtualClock, policy: str | None = "easy") -> Daemon:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0, holder="levels-test",
                       checkpoint_dir=str(tmp / "ckpt"), policy_name=policy or "easy")
    d = Daemon(cfg, open_store(cfg.store_url), clock=clock,
               policy=create_policy(policy) if policy is not None else None)
    assert d.start()
    return d


def test_registration_carries_the_layout_to_the_view_and_survives_a_restart(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    d = _daemon(tmp_path, clock)
    assert (d.view().levels, d.view().discipline) == (2, Discipline.PRIORITY)  # no node: the fg/bg pair
    d.register_node("a", 2, "a", "mock", levels=3, discipline=Discipline.TIMESLICE)
    d.register_node("b", 2, "b", "mock", levels=3, discipline=Discipline.TIMESLICE)
    view = d.view()
    assert (view.levels, view.discipline) == (3, Discipline.TIMESLICE)
    assert len(view.slot_job) == 3 and view.idle[2] == set(range(4)) and view.slot_job[2] == [None] * 4
    doc = node_json(d, d.node("a"))
    assert (doc["levels"], doc["discipline"]) == (3, "timeslice")
    d.register_node("a", 2, "a", "mock")  # an agent that does not say keeps what the node had
    assert (d.node("a").levels, d.node("a").discipline) == (3, "timeslice")
    d.close()
    again = _daemon(tmp_path, clock)  # a restarted vmctld reads the layout back from the store
    assert (again.view().levels, again.view().discipline) == (3, Discipline.TIMESLICE)
    stored = {n.name: (n.levels, n.discipline) for n in again.store.load_nodes()}
    assert stored == {"a": (3, "timeslice"), "b": (3, "timeslice")}
    again.close()


def test_a_mixed_cluster_is_refused(tmp_path: Path) -> None:
    d = _daemon(tmp_path, VirtualClock(1000.0))
    d.register_node("a", 2, "a", "mock", levels=1, discipline=Discipline.SHARED)
    with pytest.raises(Conflict, match=r"node b: registers 2 priority levels per core, but node\(s\) a carry 1 "
                                       r"shared levels: a vmctld cluster has one level layout"):
        d.register_node("b", 2, "b", "mock")  # an older agent: the fg/bg pair
    assert "b" not in d.state.nodes
    with pytest.raises(Conflict, match="priority discipline has 2"):
        d.register_node("a", 2, "a", "mock", levels=3, discipline=Discipline.PRIORITY)
    d.register_node("a", 2, "a", "mock", levels=2, discipline=Discipline.TIMESLICE)  # alone: it may change
    d.submit([{"procs": 1, "estimate": 100.0}])
    d.decide(1000.0)
    assert d.state.jobs_on("a")
    with pytest.raises(Conflict, match=r"cannot change its level layout .* while jobs run there"):
        d.register_node("a", 2, "a", "mock", levels=1, discipline=Discipline.SHARED)
    d.close()


def test_a_policy_needing_two_priority_levels_is_refused_on_a_one_level_cluster(tmp_path: Path) -> None:
    d = _daemon(tmp_path, VirtualClock(1000.0), policy=None)  # the configured policy: easy (1 level, any)
    d.register_node("a", 2, "a", "mock", levels=1, discipline=Discipline.SHARED)
    view = d.view()
    assert (view.levels, view.discipline, view.idle_bg, list(view.bg_job)) == (1, Discipline.SHARED, frozenset(),
                                                                               [None, None])
    with pytest.raises(PolicyNeedsUnmet) as err:
        d.set_policy("measy", {})
    msg = str(err.value)
    assert err.value.reference == "policy-needs-unmet"
    assert "policy measy cannot run on vmctld (the registered cluster: 1 shared level per core)" in msg
    assert "needs 2 VM levels per core (it has 1); the priority discipline (it has shared)" in msg
    assert d.policy is not None and d.policy.name == "easy"
    d.close()
    # a vmctld running measy takes a first node whose layout measy cannot use, and tells it the fg/bg pair
    # (issue 22: before, it was refused and its agent retried in a loop); it is usable once re-laid out
    d = _daemon(tmp_path / "m", VirtualClock(1000.0), policy="measy")
    d.register_node("a", 2, "a", "mock", levels=1, discipline=Discipline.SHARED)
    assert d.desired("a").layout == NodeLayout(Discipline.PRIORITY, 2) and not any(d.view().usable)
    d.register_node("a", 2, "a", "mock", levels=2, discipline=Discipline.PRIORITY)
    assert all(d.view().usable)
    d.close()


def test_the_registration_check_names_the_field() -> None:
    assert schemas.node_levels({}) == (None, None)
    assert schemas.node_levels({"levels": 3, "discipline": "timeslice"}) == (3, Discipline.TIMESLICE)
    for body, field in (({"levels": 0}, "levels"), ({"levels": "2"}, "levels"), ({"discipline": "gang"}, "discipline"),
                        ({"discipline": 2}, "discipline")):
        with pytest.raises(ValidationError) as err:
            schemas.node_levels(body)
        assert err.value.fields["field"] == field, body


def test_the_agent_registers_its_configured_layout() -> None:
    cfg = parse_agent_config({"node": "n", "backend": {"cores": 2},
                              "layout": {"discipline": "timeslice", "levels": 3}}, "a.yaml")
    assert layout_registration(build_agent(cfg).reconciler.layout) == {"levels": 3, "discipline": "timeslice"}
    plain = build_agent(parse_agent_config({"node": "n", "backend": {"cores": 2}}, "a.yaml"))
    assert layout_registration(plain.reconciler.layout) == {"levels": 2, "discipline": "priority"}


def test_node_list_and_show_print_the_layout() -> None:
    n = {"name": "n1", "cores": 4, "state": "ready", "last_seen": 0.0, "generation": 3, "fg_busy": 1, "bg_busy": 0,
         "utilization": 0.5, "speed": 1.0, "group": "default", "memory_mib": 0, "peers": None, "errors": [],
         "levels": 3, "discipline": "timeslice"}
    row = dict(zip(node_table([n], wide=True).headers, node_table([n], wide=True).rows[0], strict=True))
    assert row["LEVELS"] == "3 timeslice"  # -o wide: the default table fits 100 columns without it
    assert "VM levels per core: 3 timeslice" in node_text(n)
    old = {k: v for k, v in n.items() if k not in ("levels", "discipline")}  # from an older vmctld
    wide = node_table([old], wide=True)
    assert dict(zip(wide.headers, wide.rows[0], strict=True))["LEVELS"] == "-"
