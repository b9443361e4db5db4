"""Job shapes through the API's job spec, vmctld's store and view, the client library and
``vmctl job submit --shape`` (the live HTTP round trip with a mock agent is
tests/integration/test_shapes_live.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.livedaemon import run_cli
from tests.support.daemon import queued_daemon
from tests.unit.test_cli_ops import JOB, Recorder, server  # noqa: F401 - the recording HTTP server fixture
from vmctl.api.documents import job_json
from vmctl.api.schemas import job_batch, job_spec
from vmctl.client import Job as ClientJob
from vmctl.clock import VirtualClock
from vmctl.daemon.core import Daemon
from vmctl.errors import ValidationError
from vmctl.model import JobShape

MOLDABLE = {"kind": "moldable", "table": {"2": 100, "4": 60}}
BAG = {"kind": "task-bag", "tasks": [10, 10, 10, 10, 10], "max_workers": 2}


# ------------------------------------------------------------------------------ the job spec


def test_a_shaped_spec_takes_procs_and_estimate_from_its_shape() -> None:
    spec = job_spec({"shape": MOLDABLE})
    assert spec["procs"] == 2 and spec["estimate"] == 100.0  # the smallest width, its time there
    assert spec["shape"] == {"kind": "moldable", "widths": [2, 4], "times": [100.0, 60.0]}  # canonical
    bag = job_spec({"shape": BAG, "estimate": 500})
    assert bag["procs"] == 2 and bag["estimate"] == 500.0  # the most workers; a given estimate stays
    assert job_spec({"shape": BAG, "procs": 1})["estimate"] == 50.0  # five tasks one after the other
    assert "shape" not in job_spec({"procs": 2, "estimate": 10})


@pytest.mark.parametrize(("raw", "field", "words"), [
    ({"shape": MOLDABLE, "procs": 3}, "jobs[0].procs", "3 is not a width its shape allows"),
    ({"shape": BAG, "procs": 3}, "jobs[0].procs", "3 is not a width its shape allows"),
    ({"shape": {"kind": "moldable", "table": {"2": -5}}}, "jobs[0].shape.times[0]", "positive"),
    ({"shape": {"kind": "task-bag", "tasks": [1, -1]}}, "jobs[0].shape.tasks[1]", "in [0, "),
    ({"shape": {"kind": "task-bag", "tasks": []}}, "jobs[0].shape.tasks", "at least one task"),
    ({"shape": "moldable"}, "jobs[0].shape", "must be an object"),
    ({"estimate": 10}, "jobs[0].procs", "required"),  # a rigid job still needs procs
])
def test_bad_shaped_specs_name_the_field(raw: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        job_batch({"jobs": [raw]})
    assert err.value.fields["field"] == field, err.value
    assert words in str(err.value)


# ------------------------------------------------------------------------------ vmctld


def _daemon(tmp: Path, clock: VirtualClock) -> Daemon:
    d: Daemon = queued_daemon(tmp, clock, "shapes-test")
    return d


def test_shapes_reach_the_view_and_survive_a_restart(tmp_path: Path) -> None:
    clock = VirtualClock(1000.0)
    d = _daemon(tmp_path, clock)  # no node: the jobs stay queued
    # the server hands vmctld specs that ``job_spec`` normalized
    (m, b, r) = d.submit([job_spec({"shape": MOLDABLE}), job_spec({"shape": BAG}), {"procs": 1, "estimate": 5.0}])
    shapes = d.view().shapes
    assert shapes == {m.id: JobShape.moldable({2: 100.0, 4: 60.0}), b.id: JobShape.task_bag([10.0] * 5, 2)}
    doc = job_json(d.job(m.id))
    assert doc["shape"] == {"kind": "moldable", "widths": [2, 4], "times": [100.0, 60.0]} and doc["width"] is None
    assert job_json(d.job(r.id))["shape"] is None
    d.close()
    again = _daemon(tmp_path, clock)
    assert again.view().shapes == shapes
    again.close()


def test_a_rigid_cluster_view_carries_no_shapes(tmp_path: Path) -> None:
    d = _daemon(tmp_path, VirtualClock(1000.0))
    d.submit([{"procs": 1, "estimate": 5.0}])
    assert d.view().shapes == {}
    d.close()


# ------------------------------------------------------------------------------ client library and CLI


def test_the_client_library_sends_a_shape_without_tasks() -> None:
    spec = ClientJob("wrf", shape=JobShape.moldable({2: 100.0, 4: 60.0})).to_spec()
    assert spec == {"name": "wrf", "priority": 0, "shape": {"kind": "moldable", "widths": [2, 4],
                                                            "times": [100.0, 60.0]}}
    assert job_spec(spec)["procs"] == 2
    with pytest.raises(ValidationError):
        ClientJob("nothing").to_spec()  # neither tasks nor a shape


def test_job_submit_shape_and_show(server: tuple[str, Recorder], tmp_path: Path,  # noqa: F811
                                   capsys: pytest.CaptureFixture[str]) -> None:
    url, rec = server
    shape = {"kind": "moldable", "widths": [2, 4], "times": [100.0, 60.0]}
    job = {**JOB, "shape": shape, "width": 2}
    rec.answer("POST", "/v1/jobs", 201, {"job": job})
    code, _, err = run_cli(capsys, "job", "submit", "--url", url, "--shape", json.dumps(MOLDABLE), "-o", "json")
    assert code == 0, err
    assert rec.requests[-1]["body"] == {"shape": shape}
    f = tmp_path / "bag.yaml"
    f.write_text("kind: task-bag\ntasks: [10, 10, 10]\nmax_workers: 2\n")
    code, _, err = run_cli(capsys, "job", "submit", "--url", url, "--shape", f"@{f}", "-t", "40", "-o", "json")
    assert code == 0, err
    assert rec.requests[-1]["body"] == {"estimate": 40.0, "shape": {"kind": "task-bag", "tasks": [10.0, 10.0, 10.0],
                                                                    "max_workers": 2}}
    rec.answer("GET", "/v1/jobs/17", 200, {"job": job})
    code, out, err = run_cli(capsys, "job", "show", "17", "--url", url)
    assert code == 0, err
    shown = {k: v.strip() for k, v in ([*line.split(None, 1), ""][:2] for line in out.splitlines() if line.strip())}
    # the chosen width of the allowed ones (a daemon that sends no width_time: without the time there)
    assert shown["shape"] == "moldable widths 2, 4 (times 100 s, 60 s)" and shown["width"] == "2 of widths 2,4", out


def test_job_submit_refuses_a_bad_shape_before_sending(server: tuple[str, Recorder],  # noqa: F811
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    url, rec = server
    code, _, err = run_cli(capsys, "job", "submit", "--url", url, "--shape", '{"kind": "task-bag", "tasks": [-1]}')
    assert code != 0 and "--shape.tasks[0]" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "job", "submit", "--url", url, "--shape", "{not json")
    assert code != 0 and "--shape" in err
    code, _, err = run_cli(capsys, "job", "submit", "--url", url)
    assert code != 0 and "--procs and --estimate are required" in err
    assert rec.requests == []
