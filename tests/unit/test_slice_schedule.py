"""The slice clock a timeslice node's desired state carries (``vmctl.model.SliceSchedule``) and its
wire form."""

from __future__ import annotations

import pytest

from vmctl.errors import ValidationError
from vmctl.model import SliceSchedule
from vmctl.nodedoc import NodeDesired
from vmctl.wire import desired_from_json, desired_to_json


def test_active_row_follows_the_row_order_and_skips_rows_not_listed() -> None:
    s = SliceSchedule(period=200.0, order=(0, 2), epoch=1000.0)
    assert [s.active_row(t) for t in (0.0, 1000.0, 1199.9, 1200.0, 1399.9, 1400.0, 1650.0)] == [0, 0, 0, 2, 2, 0, 2]
    assert s.next_switch(1250.0) == 1400.0
    assert s.next_switch(10.0) == 1200.0  # before the epoch: rows[0] until one period after it


def test_round_trip_and_absent_schedule_stays_absent() -> None:
    d = NodeDesired("n1", 3, (), SliceSchedule(period=30.0, order=(1, 0, 2), epoch=5.5))
    doc = desired_to_json(d)
    assert doc["slices"] == {"epoch": 5.5, "period_s": 30.0, "rows": [1, 0, 2]}
    assert desired_from_json(doc) == d
    plain = NodeDesired("n1", 3)
    assert "slices" not in desired_to_json(plain)
    assert desired_from_json(desired_to_json(plain)) == plain


@pytest.mark.parametrize(("slices", "field"), [
    ({"epoch": 0, "period_s": 0, "rows": [0]}, "slices.period_s"),
    ({"epoch": 0, "period_s": -5, "rows": [0]}, "slices.period_s"),
    ({"epoch": 0, "period_s": 10, "rows": []}, "slices.rows"),
    ({"epoch": 0, "period_s": 10, "rows": [0, 0]}, "slices.rows"),
    ({"epoch": 0, "period_s": 10, "rows": [-1]}, "slices.rows"),
    ({"epoch": 0, "period_s": 10, "rows": [True]}, "slices.rows[0]"),
    ({"epoch": 0, "rows": [0]}, "slices.period_s"),
    ({"epoch": "x", "period_s": 10, "rows": [0]}, "slices.epoch"),
])
def test_bad_schedules_name_the_field(slices: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        desired_from_json({"node": "n", "generation": 1, "slices": slices})
    assert str(err.value).startswith(f"{field}: ")
