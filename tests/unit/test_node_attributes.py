"""issue 10, "Nodes carry speed, group and memory": from the agent config (``host:``) through the
registration, vmctld's node record and the store (schema 003, upgraded in place from schema 2) to the
policy's ``ClusterView`` and the operator's ``vmctl node list`` / ``node show``. Bad values are refused
naming the file and key (config) or the field (API). The live API is in
tests/integration/test_daemon_api.py (``test_agent_registers_speed_group_and_memory``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from vmctl.agents.backends.mock import MockBackend
from vmctl.agents.config import load_agent_config, parse_agent_config
from vmctl.agents.main import host_registration
from vmctl.api import schemas
from vmctl.api.documents import node_json
from vmctl.cli.render import node_table, node_text
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.errors import ConfigError, ValidationError
from vmctl.model import ClusterView
from vmctl.policies.registry import create_policy
from vmctl.store import NodeRecord, WriteBatch, open_store
from vmctl.store.base import CorruptRecord, Store
from vmctl.store.sql import SUPPORTED_VERSION, SqlStore, migrations, split_statements

ROOT = Path(__file__).resolve().parents[2]

# ------------------------------------------------------------------------------ the agent config


def test_host_defaults_and_values() -> None:
    cfg = parse_agent_config({"node": "n1"}, "agent.yaml")
    assert (cfg.host.speed, cfg.host.group, cfg.host.memory_mib) == (1.0, "default", None)
    cfg = parse_agent_config({"node": "n1", "host": {"speed": 2.5, "group": "gpu-a.1", "memory_mib": 65536}})
    assert (cfg.host.speed, cfg.host.group, cfg.host.memory_mib) == (2.5, "gpu-a.1", 65536)
    example = load_agent_config(ROOT / "etc" / "vmctl-agent.yaml")
    assert (example.host.speed, example.host.group, example.host.memory_mib) == (1.0, "default", None)


def test_the_mock_backend_runs_at_the_speed_the_agent_registers() -> None:
    """issue 22: the speed vmctld is told is the speed the mock host's processes run at (one value)."""
    from vmctl.agents.main import make_backend

    for raw, want in (({}, 1.0), ({"host": {"speed": 2.0}}, 2.0)):
        cfg = parse_agent_config({"node": "n1", "backend": {"kind": "mock", "cores": 1}, **raw})
        backend = make_backend(cfg)
        try:
            assert isinstance(backend, MockBackend) and backend.speed == want
            assert host_registration(cfg, backend)[0] == want
        finally:
            backend.close()


def test_the_agent_registers_the_backends_memory_unless_configured() -> None:
    backend = MockBackend(hostname="n1", cores=2, memory_mib=12345, clock=VirtualClock(0.0))
    cfg = parse_agent_config({"node": "n1", "host": {"speed": 0.5, "group": "old"}})
    assert host_registration(cfg, backend) == (0.5, "old", 12345)
    cfg = parse_agent_config({"node": "n1", "host": {"memory_mib": 4096}})
    assert host_registration(cfg, backend) == (1.0, "default", 4096)


BAD_HOST: list[tuple[str, str, str]] = [
    ("speed: .nan", "host.speed", "must be a finite number"),
    ("speed: .inf", "host.speed", "must be a finite number"),
    ("speed: 0", "host.speed", "must be > 0"),
    ("speed: -1.5", "host.speed", "must be >= 0.0"),
    ("speed: 1.0e+9", "host.speed", "must be <= 1000"),
    ("speed: fast", "host.speed", "must be float"),
    ("group: ''", "host.group", "must not be empty"),
    ("group: 'a b'", "host.group", "must hold only letters"),
    ('group: "x\\e[2J"', "host.group", "must hold only letters"),
    ("group: " + "g" * 65, "host.group", "longer than 64"),
    ("group: 7", "host.group", "must be str"),
    ("memory_mib: 0", "host.memory_mib", "must be >= 1"),
    ("memory_mib: 1.5", "host.memory_mib", "must be int"),
    ("cores: 4", "host.cores", "unknown key"),
]


@pytest.mark.parametrize(("line", "key", "words"), BAD_HOST, ids=[c[0] for c in BAD_HOST])
def test_bad_host_values_name_the_file_and_key(tmp_path: Path, line: str, key: str, words: str) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(f"node: n1\nhost:\n  {line}\n")
    with pytest.raises(ConfigError) as err:
        load_agent_config(p)
    assert err.value.reference == "config-invalid"
    assert str(err.value).startswith(f"{p}: {key}: "), str(err.value)
    assert words in str(err.value)


# ------------------------------------------------------------------------------ the API's check


def test_the_registration_check_names_the_field() -> None:
    assert schemas.node_host({"cores": 2}) == (None, None, None)
    assert schemas.node_host({"speed": 2, "group": "p1", "memory_mib": 1024}) == (2.0, "p1", 1024)
    for body, field in [({"speed": 0}, "speed"), ({"speed": -1.0}, "speed"), ({"speed": 1001}, "speed"),
                        ({"speed": "1"}, "speed"), ({"speed": True}, "speed"), ({"group": ""}, "group"),
                        ({"group": "a/b"}, "group"), ({"group": "\u200b"}, "group"), ({"group": 3}, "group"),
                        ({"memory_mib": 0}, "memory_mib"), ({"memory_mib": 1.5}, "memory_mib")]:
        with pytest.raises(ValidationError) as err:
            schemas.node_host(body)
        assert err.value.fields["field"] == field, body
    with pytest.raises(ValidationError) as err:  # NaN never reaches the handler: the body reader names it
        schemas.parse_body(b'{"cores": 2, "speed": NaN}')
    assert err.value.fields["field"] == "speed"


# ------------------------------------------------------------------------------ the store


def _migrate_to(s: Store, version: int) -> None:
    """Bring an empty database to schema ``version`` the way a vmctld of that version did."""
    assert isinstance(s, SqlStore)
    with s._transaction(lock=False) as cur:
        s._exec(cur, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied TEXT)")
        for v, sql in migrations():
            if v <= version:
                for stmt in split_statements(sql):
                    s._exec(cur, stmt)
                s._exec(cur, "INSERT INTO schema_version (version, applied) VALUES (?, ?)", (v, f"migration {v:03d}"))


def _store_at(store_url: str, version: int) -> tuple[SqlStore, int]:
    """A database at schema ``version`` as a vmctld of that version left it, and a lease on it."""
    s = open_store(store_url)
    _migrate_to(s, version)
    assert s.schema_version() == version
    epoch = s.acquire_lease("old", 10, 0)
    assert epoch is not None and isinstance(s, SqlStore)
    return s, epoch


def test_a_schema_2_database_upgrades_in_place(store_url: str) -> None:
    s, epoch = _store_at(store_url, 2)
    with s._transaction() as cur:  # a node as vmctld of schema 2 wrote it: a document, no columns
        s._exec(cur, "INSERT INTO nodes (name, doc) VALUES (?, ?)",
                ("n1", '{"name": "n1", "cores": 4, "state": "ready", "peers": ["n2"]}'))
    assert SUPPORTED_VERSION >= 3
    assert s.migrate() == SUPPORTED_VERSION
    (n1,) = s.load_nodes()
    assert (n1.name, n1.cores, n1.peers) == ("n1", 4, ["n2"])
    assert (n1.speed, n1.group, n1.memory_mib) == (1.0, "default", 0)
    n1.speed, n1.group, n1.memory_mib = 2.5, "fast", 65536
    s.write(epoch, WriteBatch(nodes={"n1": n1, "n2": NodeRecord(name="n2", cores=2, group="slow", speed=0.5)}))
    got = {n.name: (n.speed, n.group, n.memory_mib, n.cores) for n in s.load_nodes()}
    assert got == {"n1": (2.5, "fast", 65536, 4), "n2": (0.5, "slow", 0, 2)}
    s.close()


@pytest.mark.parametrize(("column", "value", "words"), [
    ("speed", 0.0, "column speed must be a finite number > 0"),
    ("speed", -2.0, "column speed must be a finite number > 0"),
    ("node_group", "", "column node_group must not be empty"),
    ("node_group", "a b", "column node_group must hold only letters"),
    ("memory_mib", -1, "column memory_mib must be an integer >= 0"),
    ("levels", 0, "column levels must be an integer >= 1"),  # schema 004: the node's level layout
    ("discipline", "gang", "column discipline must be one of priority, timeslice, shared"),
])
def test_a_bad_stored_column_names_its_table_and_row(store: Store, column: str, value: Any,
                                                     words: str) -> None:
    epoch = store.acquire_lease("a", 10, 0)
    assert epoch is not None and isinstance(store, SqlStore)
    store.write(epoch, WriteBatch(nodes={"n1": NodeRecord(name="n1", cores=2)}))
    with store._transaction() as cur:
        store._exec(cur, f"UPDATE nodes SET {column} = ? WHERE name = 'n1'", (value,))
    with pytest.raises(CorruptRecord) as err:
        store.load_nodes()
    assert "table nodes, row name='n1'" in str(err.value) and words in str(err.value), str(err.value)


# ------------------------------------------------------------------------------ vmctld and the view


def _daemon(tmp: Path, clock: VirtualClock) -> Daemon:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0, holder="nodes-test",
                       checkpoint_dir=str(tmp / "ckpt"))
    d = Daemon(cfg, open_store(cfg.store_url), clock=clock, policy=create_policy("easy"))
    assert d.start()
    return d


def _attrs(view: ClusterView, node: str) -> tuple[float, str, int]:
    return view.speed_of(node), view.group_of(node), view.mem_mib_of(node)


def test_registration_reaches_the_view_and_survives_a_restart(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    d = _daemon(tmp_path, clock)
    d.register_node("a", 2, "a", "mock", speed=2.0, group="fast", memory_mib=8192)
    d.register_node("b", 2, "b", "mock")  # an agent from before this change: the defaults
    view = d.view()
    assert view.node_names == ("a", "b")
    assert _attrs(view, "a") == (2.0, "fast", 8192) and _attrs(view, "b") == (1.0, "default", 0)
    assert dict(view.node_speed) == {"a": 2.0, "b": 1.0} and dict(view.node_group) == {"a": "fast", "b": "default"}
    # re-registering without them keeps what the node had; with new values the view follows at once
    d.register_node("a", 2, "a", "mock")
    assert _attrs(d.view(), "a") == (2.0, "fast", 8192)
    d.register_node("b", 2, "b", "mock", speed=0.25, group="slow", memory_mib=1024)
    assert _attrs(d.view(), "b") == (0.25, "slow", 1024)
    doc = node_json(d, d.node("b"))
    assert (doc["speed"], doc["group"], doc["memory_mib"]) == (0.25, "slow", 1024)
    d.close()
    again = _daemon(tmp_path, clock)  # a restarted vmctld reads them back from the store
    view = again.view()
    assert _attrs(view, "a") == (2.0, "fast", 8192) and _attrs(view, "b") == (0.25, "slow", 1024)
    again.close()


def test_a_view_without_nodes_has_the_defaults() -> None:
    view = ClusterView(total_cores=1, queue=(), running={}, fg_job=[None], bg_job=[None], idle_fg={0}, idle_bg={0},
                       fg_util=[0.0], usable=[True])
    assert _attrs(view, "sim") == (1.0, "default", 0)


# ------------------------------------------------------------------------------ the CLI


def test_node_list_and_show_print_group_speed_and_memory() -> None:
    n = {"name": "n1", "cores": 4, "state": "ready", "last_seen": 0.0, "generation": 3, "fg_busy": 1, "bg_busy": 0,
         "utilization": 0.5, "speed": 2.5, "group": "gpu", "memory_mib": 262144, "peers": None, "errors": []}
    grid = node_table([n], wide=True)  # the default table leaves them out to fit 100 columns
    row = dict(zip(grid.headers, grid.rows[0], strict=True))
    assert (row["GROUP"], row["SPEED"], row["MEM"], row["CORES"]) == ("gpu", "2.5x", "256G", "4")
    assert "group gpu; core speed 2.5x a standard core; memory 256G" in node_text(n)
    unknown = dict(zip(grid.headers, node_table([{**n, "memory_mib": 0}], wide=True).rows[0], strict=True))
    assert unknown["MEM"] == "-" and "memory not known" in node_text({**n, "memory_mib": 0})


def test_the_yaml_example_documents_the_host_section() -> None:
    text = (ROOT / "etc" / "vmctl-agent.yaml").read_text()
    host = yaml.safe_load(text)["host"]
    assert set(host) == {"speed", "group"} and "# memory_mib:" in text
