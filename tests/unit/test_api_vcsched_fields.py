"""Virtual-cluster fields of a job spec (``cpu_need``, ``mem``): validation naming the field, the
stored spec, the ``Job`` a policy sees and the Job JSON of the API."""

from __future__ import annotations

from pathlib import Path

import pytest

from vmctl.api.documents import job_json
from vmctl.api.schemas import job_batch, job_spec
from vmctl.errors import ValidationError
from vmctl.store import open_store
from vmctl.store.base import JobRecord, WriteBatch


def test_valid_needs_are_kept() -> None:
    spec = job_spec({"procs": 3, "estimate": 10, "cpu_need": 0.25, "mem": 0})
    assert spec["cpu_need"] == 0.25 and spec["mem"] == 0.0
    plain = job_spec({"procs": 1, "estimate": 1})
    assert "cpu_need" not in plain and "mem" not in plain
    assert job_spec({"procs": 1, "estimate": 1, "cpu_need": 1, "mem": 1}) == {
        "procs": 1, "estimate": 1.0, "priority": 0, "cpu_need": 1.0, "mem": 1.0}


@pytest.mark.parametrize(("body", "field", "problem"), [
    ({"cpu_need": 0}, "cpu_need", "> 0.0"),
    ({"cpu_need": 1.01}, "cpu_need", "<= 1.0"),
    ({"cpu_need": "half"}, "cpu_need", "must be a number"),
    ({"cpu_need": True}, "cpu_need", "must be a number"),
    ({"mem": -0.5}, "mem", ">= 0.0"),
    ({"mem": 2}, "mem", "<= 1.0"),
    ({"mem": float("nan")}, "mem", "finite"),
])
def test_bad_needs_name_the_field(body: dict[str, object], field: str, problem: str) -> None:
    with pytest.raises(ValidationError) as ei:
        job_spec({"procs": 1, "estimate": 1, **body})
    assert ei.value.fields["field"] == field and problem in str(ei.value)
    with pytest.raises(ValidationError) as ei:
        job_batch({"jobs": [{"procs": 1, "estimate": 1}, {"procs": 1, "estimate": 1, **body}]})
    assert ei.value.fields["field"] == f"jobs[1].{field}"


def test_needs_survive_the_store_and_reach_the_policy_job(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/s.db")
    try:
        store.migrate()
        spec = job_spec({"procs": 2, "estimate": 30, "cpu_need": 0.4, "mem": 0.3})
        rec = JobRecord(id="7", seq=7, name="vc", spec=spec, state="queued", submit_time=1.0)
        epoch = store.acquire_lease("t", 30.0, 0.0)
        assert epoch is not None
        store.write(epoch, WriteBatch(jobs={rec.id: rec}))
        loaded = next(r for r in store.load_jobs() if r.id == "7")
    finally:
        store.close()
    job = loaded.to_job()
    assert (job.procs, job.cpu_need, job.mem) == (2, 0.4, 0.3)
    plain = JobRecord(id="8", seq=8, name="p", spec=job_spec({"procs": 1, "estimate": 3}), state="queued",
                      submit_time=1.0).to_job()
    assert (plain.cpu_need, plain.mem) == (1.0, 0.0)  # a full core, memory not modelled
    doc = job_json(loaded)
    assert (doc["cpu_need"], doc["mem"], doc["cap"]) == (0.4, 0.3, None)
