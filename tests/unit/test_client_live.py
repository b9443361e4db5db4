"""The client library against a real vmctld: one batch request, real ids, cancel and wait_all.
(Jobs run to completion only with agents: that path is exercised by tests/integration/test_demo.py.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.livedaemon import live_daemon
from vmctl import errors
from vmctl.client import Client, Job, Profile, Task
from vmctl.localcluster import DaemonProcess


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    yield from live_daemon(tmp_path_factory.mktemp("client"), policy="easy", tick_s=0.2)


def test_batch_submit_cancel_wait(daemon: DaemonProcess) -> None:
    j1 = Job("lib-1", profile=Profile(runtime_s=100, cpu_usage=0.5), priority=2).add_task(Task(work_seconds=1))
    j2 = Job("lib-2", estimate=50, deadline=4102444800.0).add_task(Task()).add_task(Task(cpu_usage=0.25))
    c = Client([j1, j2], api=daemon.client(), poll_interval=0.05)
    c.submit()
    assert j1.id and j2.id and j1.id != j2.id and j1.state == j2.state == "queued"
    api = daemon.client()
    doc = api.get_job(j2.id)
    assert doc["procs"] == 2 and doc["deadline"] == 4102444800.0 and doc["name"] == "lib-2"
    assert api.get_job(j1.id)["estimate"] == pytest.approx(120.0) and api.get_job(j1.id)["priority"] == 2
    c.start()
    with pytest.raises(errors.WaitTimeout):
        c.wait_all(timeout=0.3)  # no nodes: nothing can run
    c.cancel()
    results = c.wait_all(timeout=60)
    assert [r.state for r in results] == ["cancelled", "cancelled"] and not any(r.ok for r in results)


def test_invalid_job_rejected_before_sending(daemon: DaemonProcess) -> None:
    c = Client([Job("ok", estimate=5).add_task(Task()), Job("empty", estimate=5)], api=daemon.client())
    with pytest.raises(errors.ValidationError, match="at least one task"):
        c.submit()
    assert all(j.id is None for j in c.jobs)


def test_daemon_rejects_whole_batch(daemon: DaemonProcess) -> None:
    api = daemon.client()
    before = len(api.list_jobs())
    bad = Job("bad", estimate=5, priority=2**70).add_task(Task())  # out of the API's integer range
    c = Client([Job("fine", estimate=5).add_task(Task()), bad], api=api)
    with pytest.raises(errors.ValidationError):
        c.submit()
    assert len(api.list_jobs()) == before


def test_the_module_docstring_example_runs_as_written(daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example of ``vmctl.client``'s docstring (paper 001's Example Code 1), with only its URL and CA
    pointed at the test daemon, runs to ``c12.start()`` (the imports, the names and the TLS settings are
    all there; without agents nothing finishes, so the waits are left out and the jobs cancelled)."""
    import textwrap

    import vmctl.client

    doc = vmctl.client.__doc__ or ""
    block = textwrap.dedent(doc.split("::\n", 1)[1].split("\nA job's processes", 1)[0])
    head = block.split("c12.start()", 1)[0] + "c12.start()\n"
    assert "import time" in head and 'ca=CA' in head
    code = head.replace('"https://vmctld:8443"', repr(daemon.url)).replace('"/etc/vmctl/ca.pem"',
                                                                          repr(str(daemon.ca_path)))
    monkeypatch.setenv("VMCTL_TOKEN", daemon.token())
    env: dict[str, object] = {}
    exec(compile(code, "vmctl.client docstring", "exec"), env)
    c12 = env["c12"]
    assert isinstance(c12, Client)
    c12.cancel()
    assert [r.state for r in c12.wait_all(timeout=60)] == ["cancelled", "cancelled"]


PLAN_INSTANCE = {"workers": [{"id": f"w{i}", "node": f"n{i // 2}"} for i in range(10)],
                 "jobs": [{"id": "A", "tasks": 20, "work": 200, "priority": 3},
                          {"id": "B", "tasks": 5, "work": 50, "priority": 2},
                          {"id": "C", "tasks": 5, "work": 50, "priority": 1}]}


def test_post_plan_answers_the_decision_makers_plan(daemon: DaemonProcess) -> None:
    # paper 001's example: r = 0.2, 10 workers, 3 jobs: A 8, B 1, C 1 (the fastest first; equal speeds: by id)
    doc = daemon.client().plan(PLAN_INSTANCE, "priority", {"r": 0.2})
    assert {j: len(ws) for j, ws in doc["assignment"].items()} == {"A": 8, "B": 1, "C": 1}
    assert doc["unassigned_workers"] == [] and doc["params"] == {"r": 0.2, "conserving": False}
    assert doc["run_time_s"] >= 0
    assert daemon.client().list_jobs() == [] or all(j["name"] not in "ABC" for j in daemon.client().list_jobs())


@pytest.mark.parametrize(("change", "field"), [
    ({"jobs": [{"id": "A", "tasks": 0, "work": 1}]}, "body.jobs[0].tasks"),
    ({"jobs": [{"id": "A", "tasks": 1, "work": -1}]}, "body.jobs[0].work"),
    ({"jobs": [{"id": "A", "tasks": 1, "work": 1, "deadline": -5}]}, "body.jobs[0].deadline"),
    ({"jobs": [{"id": "A", "tasks": 1, "work": 1, "throughput": {"w0": 0}}]}, "body.jobs[0].throughput.w0"),
    ({"jobs": [{"id": "A", "tasks": 1, "work": 1, "throughput": {"nope": 1}}]}, "job A.throughput"),
    ({"params": {"r": 1.5}}, "r"),
])
def test_post_plan_bad_input_names_the_field(daemon: DaemonProcess, change: dict[str, object], field: str) -> None:
    instance = {**PLAN_INSTANCE, **{k: v for k, v in change.items() if k != "params"}}
    params = change.get("params", {})
    assert isinstance(params, dict)
    with pytest.raises(errors.VmctlError) as err:
        daemon.client().plan(instance, "priority", params)
    assert field in str(err.value)


def test_a_read_token_may_ask_for_a_plan_but_not_submit(daemon: DaemonProcess) -> None:
    from vmctl.apiclient import ApiClient

    token = daemon.client().issue_token("planner", "read")["token"]
    reader = ApiClient(daemon.url, token, ca=str(daemon.ca_path))
    assert reader.plan(PLAN_INSTANCE, "proportion")["assignment"]["A"]
    with pytest.raises(errors.Forbidden):
        reader.submit_job({"name": "x", "estimate": 5, "tasks": [{}]})


def test_get_workers_on_a_live_daemon(daemon: DaemonProcess) -> None:
    assert daemon.client().list_workers() == []  # no agent registered: no worker
    with pytest.raises(errors.NotFound):
        daemon.client().list_workers("nowhere")
