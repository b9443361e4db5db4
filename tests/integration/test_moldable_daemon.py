"""Issue 13 on real hosts (mock backend): vmctld running paper 002's moldable methods (policy
``moldable``, ``policies/moldable_slots.py``) over HTTPS with two agents in two node groups of
different speed. A moldable job with a deadline lands in the group and at the width the method chose,
runs its time at that width over the group's speed, and ``GET /v1/jobs/{id}`` and ``vmctl job show``
say why; at slot boundaries a job is paused (Suspend: its VMs paused by the agent, its progress
stopped) and resumed; bad input is refused naming the field, with nothing submitted. Every answer is
checked against vmctl/api/openapi.yaml."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.test_daemon_api import check_openapi
from tests.livedaemon import run_cli
from tests.support.daemon import InProcessDaemon, cli_daemon, wait_for
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, HttpReporter, HttpSource
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.client import Client, Job
from vmctl.clock import SystemClock
from vmctl.daemon.desired import desired_vms
from vmctl.model import JobShape
from vmctl.nodedoc import PowerState
from vmctl.policies.moldable.model import Decision as SlotDecision
from vmctl.policies.moldable.model import SlotView

SLOT = 1.0  # seconds


class Agents:
    """Two mock agents, ``slow`` (group slow, speed 1) and ``fast`` (group fast, speed 2), 4 cores each,
    reconciling in a background thread."""

    def __init__(self, d: InProcessDaemon, certs: Path) -> None:
        self.parts: list[tuple[HttpSource, HttpReporter, MockBackend, Reconciler]] = []
        for node, speed in (("slow", 1.0), ("fast", 2.0)):
            cert, key = d.agent_cert(node, certs)
            ep = AgentEndpoint(d.url, node, cert, key, d.ca_file)
            source, reporter = HttpSource(ep, wait_s=0.2), HttpReporter(ep)
            backend = MockBackend(hostname=node, cores=4, uri=f"mock://{node}", clock=SystemClock(), speed=speed)
            agent = Reconciler(backend, Layout(host=node, cores=tuple(range(4))), source, reporter,
                               runner=MockProcessRunner(backend))
            source.register(4, node, "mock", speed=speed, group=node)
            self.parts.append((source, reporter, backend, agent))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            for _s, _r, _b, agent in self.parts:
                agent.run_once()
            time.sleep(0.05)

    def backend(self, node: str) -> MockBackend:
        return next(b for _s, _r, b, _a in self.parts if b.hostname == node)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        for source, reporter, backend, _a in self.parts:
            source.stop()
            reporter.close()
            backend.close()


@pytest.fixture()
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[InProcessDaemon, Agents]]:
    with cli_daemon(tmp_path, monkeypatch, "moldable-live") as d:
        d.call(lambda: d.daemon.set_policy("moldable", {"method": "afcfs", "slot": SLOT}))
        agents = Agents(d, tmp_path / "certs")
        try:
            wait_for(lambda: len(d.request("GET", "/v1/nodes")[1]["nodes"]) == 2, "both agents to register")
            yield d, agents
        finally:
            agents.close()


def run_in_even_slots(d: InProcessDaemon) -> None:
    """Script the active ``moldable`` policy's method: its starts are AFCFS's, its running mask runs every
    active job in even slots and suspends it in odd ones (the pause/resume tests test vmctld's and the
    agents' side of a suspension, not a method's reasons for one)."""
    pol = d.call(lambda: d.daemon.policy)
    afcfs = pol._method

    class EvenSlots:
        name = "afcfs"

        def decide(self, view: SlotView) -> SlotDecision:
            ans = afcfs.decide(view)
            ans.running = np.full(len(view.a_id), view.now % 2 == 0, dtype=np.bool_)
            return ans

    d.call(lambda: setattr(pol, "_method", EvenSlots()))


def job(d: InProcessDaemon, jid: str) -> dict[str, Any]:
    status, body = d.request("GET", f"/v1/jobs/{jid}")
    check_openapi("GET", f"/v1/jobs/{jid}", status, body)
    assert status == 200, body
    return dict(body["job"])


def test_a_moldable_job_lands_in_the_group_and_width_the_method_chose(
        live: tuple[InProcessDaemon, Agents], capsys: pytest.CaptureFixture[str]) -> None:
    d, _agents = live
    # times on a standard core: width 2 takes 8 s, width 4 takes 6 s. Slow group (speed 1): 8 or 6
    # slots of 1 s; fast group (speed 2): 4 or 3. A deadline 6.5 s after submission leaves at most 5
    # slots after the next boundary: only the fast group meets it, and there AFCFS takes the smallest
    # width that does, 2.
    now = d.call(lambda: d.daemon.clock.now())
    status, body = d.request("POST", "/v1/jobs", {"shape": {"kind": "moldable", "table": {"2": 8, "4": 6}},
                                                   "deadline": now + 6.5})
    check_openapi("POST", "/v1/jobs", status, body)
    assert status == 201, body
    jid = str(body["job"]["id"])
    wait_for(lambda: job(d, jid)["state"] in ("running", "done"), "the moldable job to start")
    j = job(d, jid)
    assert j["width"] == 2 and {p["node"] for p in j["placement"]} == {"fast"}, j
    assert j["width_reason"].startswith("width 2 of [2, 4] in group fast (speed 2): AFCFS"), j["width_reason"]
    assert "meets the deadline" in j["width_reason"], j["width_reason"]
    # the mock processes get the job's time at width 2 on a standard core (8 s) and the speed-2 host runs
    # them at its speed (issue 22: one rule for every shape), so they end after 8 s / 2
    vms = d.call(lambda: desired_vms(d.daemon.state, "fast"))
    assert {v.process.work_seconds for v in vms if v.process is not None} == {8.0}
    assert d.call(lambda: d.daemon.state.moldable_time(d.daemon.state.jobs[jid])) == 4.0
    code, out, err = run_cli(capsys, "job", "show", jid)
    assert code == 0, err
    assert "width_reason" in out and "group fast (speed 2)" in out, out
    wait_for(lambda: job(d, jid)["state"] == "done", "the moldable job to end", limit=30)
    j = job(d, jid)
    ran = j["end_time"] - j["start_time"]
    assert 4.0 <= ran < 6.0, j  # 4 s at speed 2 (8 s on a standard core), plus the report delay
    # each process's span on the host, in its model time (no report delay): 8 s of work at speed 2
    ops = _agents.backend("fast").operations("start_process", "process_exited")
    began = {e.vm: e.time for e in ops if e.operation == "start_process"}
    spans = {e.vm: e.time - began[e.vm] for e in ops if e.operation == "process_exited"}
    assert len(spans) == 2 and spans == pytest.approx(dict.fromkeys(spans, 4.0), rel=1e-6), spans
    assert j["end_time"] <= j["deadline"] + 0.5, j


def test_the_cli_and_the_client_library_submit_moldable_jobs_with_deadlines(
        live: tuple[InProcessDaemon, Agents], capsys: pytest.CaptureFixture[str]) -> None:
    d, _agents = live
    now = d.call(lambda: d.daemon.clock.now())
    code, out, err = run_cli(capsys, "job", "submit", "--shape", '{"kind": "moldable", "table": {"2": 4, "4": 3}}',
                             "--deadline", str(now + 30), "-o", "json")
    assert code == 0, err
    by_cli = str(json.loads(out)["jobs"][0]["id"])
    lib = Job("lib-wrf", shape=JobShape.moldable({2: 4.0, 4: 3.0}), deadline=now + 30)
    client = Client([lib], url=d.url, token=d.admin_token, ca=d.ca_file, poll_interval=0.1)
    client.submit()
    client.start()
    results = client.wait_all(timeout=30)
    assert [r.state for r in results] == ["done"] and results[0].ok
    wait_for(lambda: job(d, by_cli)["state"] == "done", "the CLI's job to end")
    for jid in (by_cli, str(lib.id)):
        j = job(d, jid)
        # an ended job holds no cores (width None); the reason says which width its run had
        assert re.match(r"width [24] of \[2, 4\] in group (fast|slow) \(speed [12]\): AFCFS", j["width_reason"]), j
        assert j["end_time"] <= j["deadline"], j


def test_pause_and_resume_at_slot_boundaries(live: tuple[InProcessDaemon, Agents]) -> None:
    """The method's running mask becomes Suspend/Resume at slot boundaries: the agent pauses the VMs
    (power paused) and the job's progress stops while paused. The method is AFCFS for the start; its
    running mask is then replaced by one that suspends every running job in slots 2k + 1 (a scripted
    method: the mechanism under test is vmctld's, not a method's choice)."""
    d, agents = live
    run_in_even_slots(d)
    status, body = d.request("POST", "/v1/jobs", {"shape": {"kind": "moldable", "table": {"2": 40, "4": 30}}})
    assert status == 201, body
    jid = str(body["job"]["id"])
    wait_for(lambda: job(d, jid)["state"] in ("running", "suspended"), "the job to start")
    wait_for(lambda: job(d, jid)["state"] == "suspended", "a slot boundary to suspend the job", limit=10)
    node = job(d, jid)["placement"][0]["node"]

    def powers() -> set[PowerState]:  # of the job's VMs on its node (``j<id>-r<run>-p<index>``)
        return {v.power for v in agents.backend(node).list_vms() if v.name.startswith(f"j{jid}-")}

    def paused() -> bool:
        return powers() == {PowerState.PAUSED}

    wait_for(paused, "the agent to pause the job's VMs", limit=10)
    p1 = d.call(lambda: d.daemon.state.progress(d.daemon.state.jobs[jid], d.daemon.clock.now()))
    time.sleep(0.3)
    p2 = d.call(lambda: d.daemon.state.progress(d.daemon.state.jobs[jid], d.daemon.clock.now()))
    if job(d, jid)["state"] == "suspended":
        assert p2 == p1, (p1, p2)  # no progress while paused
    wait_for(lambda: job(d, jid)["state"] == "running", "the next boundary to resume the job", limit=10)
    wait_for(lambda: powers() == {PowerState.RUNNING}, "the agent to resume the VMs", limit=10)


BAD: list[tuple[dict[str, Any], str, str]] = [
    ({"shape": {"kind": "moldable", "table": {"2": 8, "4": 6}}, "procs": 8}, "procs", "not a width"),
    ({"shape": {"kind": "moldable", "table": {"2": 8, "4": 6}, "min_width": 4}}, "shape", "outside"),
    ({"shape": {"kind": "moldable", "table": {"2": 8, "4": 9}}}, "shape.times[1]", "must not grow"),
    ({"shape": {"kind": "moldable", "table": {"2": 8, "4": 6}}, "deadline": 1000.0}, "deadline",
     "not after the submission"),
]


@pytest.mark.parametrize(("spec", "field", "words"), BAD, ids=["width", "min-width", "not-monotone", "deadline"])
def test_bad_moldable_input_names_the_field_and_applies_nothing(live: tuple[InProcessDaemon, Agents],
                                                                spec: dict[str, Any], field: str, words: str) -> None:
    d, _agents = live
    ok = {"shape": {"kind": "moldable", "table": {"2": 8, "4": 6}}}
    status, body = d.request("POST", "/v1/jobs", spec)  # one job: the field by its own name
    check_openapi("POST", "/v1/jobs", status, body)
    assert status == 422, body
    assert body["error"]["field"].startswith(field) and words in body["error"]["message"], body
    status, body = d.request("POST", "/v1/jobs:batch", {"jobs": [ok, spec]})  # a batch: jobs[i].FIELD
    check_openapi("POST", "/v1/jobs:batch", status, body)
    assert status == 422 and body["error"]["field"].startswith(f"jobs[1].{field}"), body
    assert d.request("GET", "/v1/jobs")[1]["jobs"] == []  # nothing submitted, not even the good job


def test_a_slot_length_not_above_zero_is_refused(live: tuple[InProcessDaemon, Agents]) -> None:
    d, _agents = live
    for slot in (0, -60):
        status, body = d.request("PUT", "/v1/policy", {"name": "moldable", "params": {"slot": slot}})
        # the policy API's convention for a bad parameter: 400 policy-parameter, naming the parameter
        assert status == 400 and body["error"]["reference"] == "policy-parameter", body
        assert "parameter slot: must be > 0" in body["error"]["message"], body
    assert d.call(lambda: d.daemon.policy.params["slot"]) == SLOT  # the active policy is unchanged
