"""One reader of a job spec's shape (``vmctl.shapes.job_shape``): the API's request check and the daemon's
submission read the same shape from a request and from the canonical spec the API stores, and name a
bad field under the job's path."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmctl.api.schemas import job_spec
from vmctl.errors import ValidationError
from vmctl.model import JobShape
from vmctl.shapes import job_shape, shape_from_json

ROOT = Path(__file__).resolve().parents[2]

REQUESTS = [
    {"shape": {"kind": "moldable", "table": {"4": 60, "2": 100}}},
    {"shape": {"kind": "moldable", "min_width": 2, "max_width": 4, "time_at_min": 100,
               "speedup": {"name": "amdahl", "serial": 0.1}}},
    {"shape": {"kind": "task-bag", "tasks": [10, 12, 8], "max_workers": 2, "task_usage": 0.5}},
]


@pytest.mark.parametrize("request_", REQUESTS, ids=["table", "model", "bag"])
def test_a_request_and_its_stored_spec_have_one_shape(request_: dict[str, object]) -> None:
    asked = job_shape(request_)
    assert isinstance(asked, JobShape) and asked == shape_from_json(request_["shape"])
    stored = job_spec(request_)  # the canonical spec the daemon keeps
    assert job_shape(stored) == asked
    assert stored["procs"] == (asked.widths[0] if asked.kind == "moldable" else asked.max_workers)


def test_a_rigid_job_has_no_shape() -> None:
    assert job_shape({"procs": 4, "estimate": 10}) is None
    assert job_shape({"procs": 4, "shape": None}) is None


@pytest.mark.parametrize(("where", "field"), [("", "shape.kind"), ("jobs[2]", "jobs[2].shape.kind"),
                                              ("job 7", "job 7.shape.kind")])
def test_a_bad_shape_is_named_under_the_jobs_path(where: str, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        job_shape({"shape": {"kind": "rigid"}}, where)
    assert err.value.fields["field"] == field


def test_the_api_and_the_submission_read_shapes_through_the_one_reader() -> None:
    # shape_from_json parses a shape document; a job spec's shape is read by job_shape alone, so the
    # request check and the daemon's submission cannot drift apart (the daemon's view: see job_shape)
    for rel in ("vmctl/api/schemas.py", "vmctl/daemon/jobs.py"):
        text = (ROOT / rel).read_text(encoding="utf-8")
        assert "job_shape(" in text and "shape_from_json" not in text, rel
