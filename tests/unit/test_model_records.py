"""``StartFg``, ``StartBg`` and ``Decision`` have hand-written ``__init__`` methods (slot setters, for
speed): they must behave exactly like the frozen dataclasses they are."""

from __future__ import annotations

import dataclasses

import pytest

from vmctl.model import Decision, Reservation, StartBg, StartFg


def test_starts_are_frozen_dataclasses_with_their_fields() -> None:
    for cls, kind in ((StartFg, "start_fg"), (StartBg, "start_bg")):
        a = cls("j", (3, 1))
        assert (a.job_id, a.cores, a.kind) == ("j", (3, 1), kind)
        assert a == cls(job_id="j", cores=(3, 1)) and hash(a) == hash(cls("j", (3, 1)))
        assert a != cls("j", (1, 3))
        assert [f.name for f in dataclasses.fields(cls)] == ["job_id", "cores", "kind"]
        assert repr(a) == f"{cls.__name__}(job_id='j', cores=(3, 1), kind='{kind}')"
        assert dataclasses.replace(a, cores=(0,)) == cls("j", (0,))
        with pytest.raises(dataclasses.FrozenInstanceError):
            a.job_id = "k"  # type: ignore[misc]
    assert StartFg("j", (0,)) != StartBg("j", (0,))  # type: ignore[comparison-overlap]
    with pytest.raises(TypeError):
        StartFg("j")  # type: ignore[call-arg]


def test_decision_defaults_fields_and_equality() -> None:
    d = Decision()
    assert (d.actions, d.wake_at, d.reasons, d.default_reason, d.reservation, d.schedule) == (
        (), None, {}, "waiting for free cores", None, None)
    assert Decision().reasons is not d.reasons  # a new dict each time, as with default_factory
    full = Decision((StartFg("a", (0,)),), 5.0, {"b": "why"}, "w", Reservation("b", 9.0, 1))
    assert full == Decision(actions=(StartFg("a", (0,)),), wake_at=5.0, reasons={"b": "why"}, default_reason="w",
                            reservation=Reservation("b", 9.0, 1))
    assert full.reason_for("b") == "why" and full.reason_for("c") == "w"
    assert [f.name for f in dataclasses.fields(Decision)] == [
        "actions", "wake_at", "reasons", "default_reason", "reservation", "schedule"]
    assert dataclasses.replace(full, wake_at=None).wake_at is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        full.wake_at = 1.0  # type: ignore[misc]
