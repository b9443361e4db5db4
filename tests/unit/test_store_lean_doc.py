"""The stored job document leaves out the fields at their defaults (issue 27: a batched submission spent
most of its store time encoding 30 keys of which 22 held their defaults), reads back to the same record,
and is encoded by one C encoder made once, with the output of ``json.JSONEncoder(sort_keys=True)``."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from vmctl.api.routes.jobs import prefers_minimal
from vmctl.model import JobState
from vmctl.store.base import JobRecord, Slot, dumps, upgrade_job_doc

REFERENCE = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


def fresh() -> JobRecord:
    return JobRecord(id="7", seq=7, name="job-7", spec={"procs": 4, "estimate": 100.0}, state=JobState.QUEUED,
                     submit_time=1000.5, reason="submitted",
                     history=[{"time": 1000.5, "event": "submitted", "detail": None}])


def busy() -> JobRecord:
    """A record with every field away from its default."""
    return JobRecord(
        id="9", seq=9, name="x", spec={"procs": 2, "estimate": 5.0}, state=JobState.RUNNING, submit_time=1.0,
        start_time=2.0, end_time=3.0, slots=[Slot("n1", 0, 0), Slot("n2", 3, 1)], reason="r",
        tasks=[{"index": 0}], migrations=1, run=2, progress_base=0.5, tier_since=2.5, suspended=True,
        checkpointed=True, cap=0.5, weight=3, migrating="op1", cancel_requested=True, restore_pending=True,
        held=True, history=[{"time": 2.0, "event": "started", "detail": None}], bag={"next": 0}, gang=True,
        replicas=[1], migrated_at=2.0, width_reason="w", est_base=1.5, cpu_mark=0.25)


def roundtrip(rec: JobRecord) -> JobRecord:
    return JobRecord.from_doc(upgrade_job_doc(json.loads(dumps(rec.to_doc()))))


def test_a_fresh_job_stores_only_what_it_has() -> None:
    doc = json.loads(dumps(fresh().to_doc()))
    assert set(doc) == {"id", "seq", "name", "spec", "state", "submit_time", "reason", "history", "slots"}
    assert doc["state"] == "queued" and doc["slots"] == []


def test_every_field_reads_back() -> None:
    for rec in (fresh(), busy(), JobRecord(id="1", seq=1, name="j", spec={}, state=JobState.DONE, submit_time=0.0)):
        assert roundtrip(rec) == rec
    full = busy().to_doc()
    assert set(full) == {f.name for f in dataclasses.fields(JobRecord)} - {"changed_tasks"}


def test_a_value_equal_to_its_default_but_of_another_type_is_kept() -> None:
    rec = fresh()
    rec.progress_base = 0  # type: ignore[assignment]  # an int 0 beside the default 0.0
    back = roundtrip(rec)
    assert back.progress_base == 0 and type(back.progress_base) is int


def test_the_slots_key_marks_the_new_form() -> None:
    """A document without ``slots`` is read as one from before schema 008: the lean form keeps it."""
    assert "slots" in fresh().to_doc()


@pytest.mark.parametrize("doc", [
    {"b": 1, "a": [1.5, None, True, False, "é\u2028\"\\", {}], "c": {"z": {"y": [{}]}}},
    [], "x", 3, 1e300, -0.0, {"é": "ü", "a\x00": "\ud83d\ude00"}, {1: "int key", 2.5: "float key"},
    fresh().to_doc(), busy().to_doc(),
])
def test_dumps_is_the_reference_encoder(doc: Any) -> None:
    assert dumps(doc) == REFERENCE(doc)


def test_dumps_refuses_what_is_not_json() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        dumps({"a": object()})


@pytest.mark.parametrize(("header", "minimal"), [
    (None, False), ("", False), ("return=minimal", True), ("return=representation", False),
    ("Return = Minimal", True), ('return="minimal"', True), ("respond-async, return=minimal; x=1", True),
    ("wait=10", False), ("return=minimalist", False), ("handling=lenient,return=minimal", True),
])
def test_prefer_header(header: str | None, minimal: bool) -> None:
    assert prefers_minimal(header) is minimal
