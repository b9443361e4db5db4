"""Job records stored before placement became slots (schema 008): a document of each kind (fg, bg, a gang
row with a replica, a task bag on two levels, a shared vcsched job, a job migrating from bg to fg) loads,
and the daemon derives from it the same ``ClusterView`` and the same desired VMs as the code before slots
did. The expected outputs were captured from that code (``tests/unit/fixtures/premigration.json``):

    PYTHONPATH=<a checkout before slots> python tests/unit/test_store_slots.py --write

Both stores' migration 008 rewrites such documents in the new form; they load to the same records."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import sys
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).parent / "fixtures" / "premigration.json"
NOW = 1000.0

SPEC = {"procs": 2, "estimate": 600.0, "command": "run"}
BAG_SPEC = {"procs": 3, "estimate": 600.0, "shape": {"kind": "task-bag", "tasks": [60.0] * 5}}


def _job(jid: str, **kw: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": jid, "seq": int(jid), "name": f"j{jid}", "spec": dict(SPEC), "state": "running",
                           "submit_time": 1.0, "start_time": 10.0, "tier_since": 10.0, "run": 1,
                           "tasks": [{"index": 0, "exit_status": None, "error": None, "seen": True},
                                     {"index": 1, "exit_status": None, "error": None, "seen": True}]}
    doc.update(kw)
    return doc


#: (cluster name, nodes: name -> (cores, levels, discipline), old-form job documents, open operations)
CLUSTERS: list[tuple[str, dict[str, tuple[int, int, str]], list[dict[str, Any]], list[dict[str, Any]]]] = [
    ("priority", {"a": (2, 2, "priority"), "b": (2, 2, "priority")}, [
        _job("1", tier="fg", placement=[["a", 0], ["a", 1]]),
        _job("2", tier="bg", placement=[["a", 0], ["b", 0]], cap=0.5),
        _job("3", tier="fg", placement=[["b", 1], ["a", 1]], migrating="op1", migrations=0),
    ], [{"id": "op1", "kind": "migrate", "job_id": "3", "state": "pending", "created": 20.0, "updated": 20.0,
         "detail": {"moves": [{"index": 0, "from": ["b", 1], "to": ["b", 1], "mode": "live"},
                              {"index": 1, "from": ["b", 0], "to": ["a", 1], "mode": "live"}],
                    "hosts": ["a", "b"], "tier": "fg", "stage": "go", "target_gens": {}, "from_tier": "bg",
                    "origin": "policy"}}]),
    ("timeslice", {"a": (2, 3, "timeslice"), "b": (2, 3, "timeslice")}, [
        _job("4", tier="bg", level=1, replicas=[2], placement=[["a", 0], ["b", 0]], migrated_at=5.0),
        _job("5", tier="fg", level=0, replicas=[], placement=[["a", 1], ["b", 1]]),
    ], []),
    ("shared", {"a": (2, 2, "shared"), "b": (2, 2, "shared")}, [
        _job("6", spec=dict(BAG_SPEC), tier="fg", placement=[["a", 0], ["a", 0], ["b", 1]],
             tasks=[{"index": k, "exit_status": None, "error": None} for k in range(5)],
             bag={"levels": [0, 1, 1], "next": 3, "next_vm": 3, "vms": [0, 1, 2], "task": [0, 1, 2],
                  "release": [False, False, False], "rate": {}, "retry": []}),
        _job("7", tier="shared", placement=[["a", -1], ["b", -1]], cap=0.5, spec={**SPEC, "cpu_need": 0.5}),
    ], []),
]


def _plain(x: Any) -> Any:
    """A JSON-comparable form of views, running jobs and desired VMs."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, enum.Enum):
        return x.value
    if isinstance(x, float) and not math.isfinite(x):
        return repr(x)
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, Set):
        return sorted(_plain(v) for v in x)
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    return x


def derive(docs: list[dict[str, Any]], nodes: dict[str, tuple[int, int, str]],
           ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The view and every node's desired VMs the daemon derives from old-form documents."""
    from vmctl.daemon.state import ClusterState
    from vmctl.store.base import JobRecord, NodeRecord, OperationRecord

    st = ClusterState()
    st.load([JobRecord.from_doc(json.loads(json.dumps(d))) for d in docs],
            [NodeRecord(name=n, cores=c, levels=lv, discipline=disc, state="ready") for n, (c, lv, disc) in
             nodes.items()], [OperationRecord.from_doc(json.loads(json.dumps(o))) for o in ops], {})
    view, _lay = _build_view(st)
    return {"view": _plain(view), "desired": {n: _plain(_desired(st, n)) for n in sorted(nodes)}}


def _build_view(st: Any) -> Any:
    try:
        from vmctl.daemon.view import build_view
    except ImportError:  # the code before slots: a method of the state
        return st.build_view(NOW)
    return build_view(st, NOW)


def _desired(st: Any, node: str) -> Any:
    try:
        from vmctl.daemon.desired import desired_vms
    except ImportError:
        return st.desired_vms(node)
    return desired_vms(st, node)


def test_old_documents_derive_the_same_view_and_desired_vms() -> None:
    want = json.loads(FIXTURE.read_text(encoding="utf-8"))
    for name, nodes, docs, ops in CLUSTERS:
        assert derive(docs, nodes, ops) == want[name], name


def test_old_documents_load_as_slots() -> None:
    from vmctl.store.base import JobRecord, Slot

    by = {d["id"]: JobRecord.from_doc(json.loads(json.dumps(d))) for _n, _nodes, docs, _o in CLUSTERS for d in docs}
    assert by["1"].slots == [Slot("a", 0, 0), Slot("a", 1, 0)] and by["1"].tier == "fg"
    assert by["2"].slots == [Slot("a", 0, 1), Slot("b", 0, 1)] and by["2"].tier == "bg"
    assert by["4"].slots == [Slot("a", 0, 1), Slot("b", 0, 1)] and by["4"].gang and by["4"].replicas == [2]
    assert by["4"].level == 1 and by["4"].tier == "bg" and by["5"].level == 0 and by["5"].tier == "fg"
    assert by["6"].slots == [Slot("a", 0, 0), Slot("a", 0, 1), Slot("b", 1, 1)] and by["6"].tier == "fg"
    assert by["6"].bag is not None and "levels" not in by["6"].bag
    assert by["7"].slots == [Slot("a", None, 0), Slot("b", None, 0)] and by["7"].tier == "shared"
    for rec in by.values():  # the new form round-trips
        again = JobRecord.from_doc(json.loads(json.dumps(rec.to_doc())))
        assert again == rec and "tier" not in rec.to_doc() and "placement" not in rec.to_doc()


def test_migration_008_rewrites_old_documents(store_url: str) -> None:
    """A store at schema 007 (SQLite and PostgreSQL) holding old-form documents (and a bag's ``levels`` in
    its bag column): migration 008 rewrites them in the new form; they load to the records the old form
    loads to."""
    from vmctl.store import open_store
    from vmctl.store.base import JobRecord, dumps
    from vmctl.store.sql import migrations, split_statements

    store: Any = open_store(store_url)
    docs = [d for _n, _nodes, ds, _o in CLUSTERS for d in ds]
    try:
        with store._transaction(lock=False) as cur:  # the tables as schema 007 left them
            store._exec(cur, "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied TEXT)")
            for version, sql in migrations():
                if version > 7:
                    break
                for stmt in split_statements(sql):
                    store._exec(cur, stmt)
                store._exec(cur, "INSERT INTO schema_version (version, applied) VALUES (?, ?)", (version, "test"))
            for d in docs:
                doc = dict(d)
                bag = doc.pop("bag", None)
                if bag is not None:
                    doc["tasks"] = []
                store._exec(cur, "INSERT INTO jobs (id, seq, state, doc, bag) VALUES (?, ?, ?, ?, ?)",
                            (d["id"], d["seq"], d["state"], dumps(doc), None if bag is None else dumps(bag)))
            store._exec(cur, "INSERT INTO job_archive (id, seq, state, doc) VALUES (?, ?, ?, ?)",
                        ("99", 99, "done", dumps(_job("99", state="done", tier="bg", placement=[["a", 1], ["b", 1]]))))
        assert store.migrate() >= 8
        with store._transaction(lock=False) as cur:
            store._exec(cur, "SELECT doc FROM jobs UNION ALL SELECT doc FROM job_archive")
            rows = cur.fetchall()
            store._exec(cur, "SELECT bag FROM jobs WHERE bag IS NOT NULL")
            bags = [json.loads(b) for (b,) in cur.fetchall()]
        for (raw,) in rows:
            doc = json.loads(raw)
            assert "slots" in doc and not {"tier", "placement", "level"} & doc.keys(), doc
        assert bags and all("levels" not in b for b in bags)
        loaded = {r.id: r for r in store.load_jobs()}
        for d in docs:
            want = JobRecord.from_doc(json.loads(json.dumps(d)))
            got = loaded[d["id"]]
            assert (got.slots, got.gang, got.replicas, got.tier) == (want.slots, want.gang, want.replicas, want.tier)
        archived = store.get_archived_job("99")
        assert archived is not None and archived.tier == "bg" and archived.placement == [("a", 1), ("b", 1)]
    finally:
        store.close()


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps({name: derive(docs, nodes, ops) for name, nodes, docs, ops in CLUSTERS},
                                  indent=1, sort_keys=True) + "\n", encoding="utf-8")
