"""One desired-state codec: every kind of node document vmctld writes (``vmctl.wire``) reads back the same
through the wire and through the agent's file source (``--desired FILE``, ``vmctl-agent --once``), in
YAML and in JSON. (Before issue 24 the file source had its own codec, which refused a gang node's
``slices`` and ``replicas``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vmctl.agents.layout import Layout
from vmctl.agents.sources import FileSource, desired_from_document
from vmctl.errors import ConfigError, ValidationError
from vmctl.model import Discipline, NodeLayout, SliceSchedule
from vmctl.nodedoc import MigrationSpec, NodeDesired, PowerState, ProcessSpec, VmDesired, VmRole
from vmctl.wire import desired_from_json, desired_to_json


def _priority() -> NodeDesired:
    """A two-tier node: fg/bg pairs, one job process per tier, a live migration under way, a saved VM."""
    base = Layout("n1", (0, 1)).base_desired(4)
    fg, bg, fg1, bg1 = base.vms
    return NodeDesired("n1", 5, (
        VmDesired(fg.name, 0, VmRole.FG, 10000, process=ProcessSpec("j1", 0, "./a.out", 60.0, 0.8)),
        VmDesired(bg.name, 0, VmRole.BG, 1, cap=0.5, process=ProcessSpec("j2", 3, "", 12.5, 1.0),
                  migration=MigrationSpec("m1", "n1", "n2", 1, "running", "live")),
        VmDesired(fg1.name, 1, VmRole.FG, 10000),
        VmDesired(bg1.name, 1, VmRole.BG, 1, power=PowerState.SAVED, checkpoint_path="/ck/n1-c1-bg.img",
                  memory_mib=128),
    ), layout=NodeLayout(Discipline.PRIORITY, 2))


def _gang() -> NodeDesired:
    """A gang node (timeslice): rows at levels 0..2, one job replicated into row 0, the slice clock."""
    return NodeDesired("g1", 12, (
        VmDesired("j4-r1-p0", 0, VmRole.FG, 10000, level=0, process=ProcessSpec("j4", 0, work_seconds=30.0)),
        VmDesired("j5-r1-p0", 0, VmRole.BG, 1, level=1, power=PowerState.PAUSED),
        VmDesired("j6-r1-p1", 1, VmRole.BG, 1, level=2, replicas=(0,), process=ProcessSpec("j6", 1)),
    ), slices=SliceSchedule(period=200.0, order=(0, 1, 2), epoch=1000.0), layout=NodeLayout(Discipline.TIMESLICE, 3))


def _shared() -> NodeDesired:
    """A vcsched node: unpinned shared VMs with caps, one migrating to an unpinned target."""
    return NodeDesired("s1", 3, (
        VmDesired("j7-r1-p0", -1, VmRole.SHARED, 40, cap=0.25, process=ProcessSpec("j7", 0, cpu_usage=0.25)),
        VmDesired("j8-r1-p0", -1, VmRole.SHARED, 60, cap=None,
                  migration=MigrationSpec("m2", "s1", "s2", -1, "requested", "checkpoint")),
    ), layout=NodeLayout(Discipline.SHARED, 1))


def _task_bag() -> NodeDesired:
    """A task bag's workers on two levels of the same core (priority discipline, three levels)."""
    return NodeDesired("b1", 8, (
        VmDesired("j9-w0", 0, VmRole.FG, 10000, level=0, process=ProcessSpec("j9", 4, "task 4", 5.0, 0.5)),
        VmDesired("j9-w1", 0, VmRole.BG, 100, level=2, process=ProcessSpec("j9", 7, "task 7", 9.0, 0.5)),
    ), layout=NodeLayout(Discipline.PRIORITY, 3))


KINDS = {
    "priority": _priority, "gang": _gang, "shared": _shared, "task-bag": _task_bag,
    "layout only": lambda: NodeDesired("n2", 1, (), layout=NodeLayout(Discipline.TIMESLICE, 2)),
    "empty": lambda: NodeDesired("n3", 0, ()),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_node_document_reads_back_through_wire_and_file(kind: str, tmp_path: Path) -> None:
    doc = KINDS[kind]()
    raw = desired_to_json(doc)
    assert desired_from_json(raw) == doc  # the daemon's store, the HTTP source
    assert desired_from_document(raw, "d") == doc
    for suffix, dump in ((".yaml", yaml.safe_dump), (".json", json.dumps)):
        p = tmp_path / f"desired{suffix}"
        p.write_text(dump(raw), encoding="utf-8")
        assert FileSource(p).fetch() == doc, suffix  # --desired FILE
    if kind == "gang":  # what the file source refused before it used the wire codec
        assert raw["slices"] == {"epoch": 1000.0, "period_s": 200.0, "rows": [0, 1, 2]}
        assert raw["vms"][2]["replicas"] == [0]


BAD = [
    ("unknown top key", {"node": "n", "generation": 1, "slice": {}}, "slice", "unknown key (known: node,"),
    ("unknown vm key", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "fg", "weight": 1,
                                                                "replica": [1]}]}, "vms[0].replica", "unknown key"),
    ("bad replicas", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "fg", "weight": 1,
                                                              "level": 1, "replicas": [0, 0]}]},
     "vms[0].replicas", "must be distinct levels"),
    ("slices without rows", {"node": "n", "generation": 1, "slices": {"epoch": 0, "period_s": 5}}, "slices.rows",
     "is required"),
    ("core below -1", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": -2, "role": "shared",
                                                               "weight": 1}]}, "vms[0].core", "must be >= -1"),
    ("observed-only power", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "fg",
                                                                     "weight": 1, "power": "migrating"}]},
     "vms[0].power", "must be one of running, paused, shutoff, saved, absent"),
    ("zero cpu usage", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "fg", "weight": 1,
                                                                "process": {"job_id": "j", "index": 0,
                                                                            "cpu_usage": 0}}]},
     "vms[0].process.cpu_usage", "must be > 0"),
    ("layout levels", {"node": "n", "generation": 1, "layout": {"discipline": "timeslice", "levels": 9}},
     "layout.levels", "must be 1..8"),
]


@pytest.mark.parametrize(("data", "field", "needle"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_one_codec_one_answer_to_a_bad_document(data: object, field: str, needle: str) -> None:
    # the wire names the field; the file source names the file and the same field
    with pytest.raises(ValidationError) as wire_err:
        desired_from_json(data)
    assert wire_err.value.fields["field"] == field and needle in wire_err.value.fields["problem"]
    with pytest.raises(ConfigError) as file_err:
        desired_from_document(data, "/etc/d.yaml")
    assert str(file_err.value).startswith(f"/etc/d.yaml: {field}: ") and needle in str(file_err.value)


def test_a_document_that_is_not_a_mapping_is_named_as_the_top_level() -> None:
    with pytest.raises(ConfigError, match=r"^d\.yaml: top level: must be an object, got list"):
        desired_from_document([1, 2], "d.yaml")
