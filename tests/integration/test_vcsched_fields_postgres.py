"""Virtual-cluster job fields (``cpu_need``, ``mem``) stored and reloaded through the PostgreSQL
store (the SQLite path is covered by tests/unit/test_api_vcsched_fields.py): they live in the job's
spec document, so no schema migration is involved; the reloaded record gives the policy's ``Job``."""

from __future__ import annotations

import pytest

from tests.support.daemon import PostgresServer
from vmctl.api.schemas import job_spec
from vmctl.store import JobRecord, WriteBatch, open_store

pytestmark = pytest.mark.postgres


def test_needs_round_trip_on_postgres(postgres: PostgresServer) -> None:
    store = open_store(postgres.create_db("vcfields"))
    try:
        store.migrate()
        epoch = store.acquire_lease("t", 30.0, 0.0)
        assert epoch is not None
        recs = {
            "1": JobRecord(id="1", seq=1, name="vc", state="queued", submit_time=1.0,
                           spec=job_spec({"procs": 3, "estimate": 30, "cpu_need": 0.35, "mem": 0.125})),
            "2": JobRecord(id="2", seq=2, name="plain", state="queued", submit_time=2.0,
                           spec=job_spec({"procs": 1, "estimate": 30})),
        }
        store.write(epoch, WriteBatch(jobs=recs))
        loaded = {r.id: r.to_job() for r in store.load_jobs()}
    finally:
        store.close()
    assert (loaded["1"].procs, loaded["1"].cpu_need, loaded["1"].mem) == (3, 0.35, 0.125)
    assert (loaded["2"].cpu_need, loaded["2"].mem) == (1.0, 0.0)
