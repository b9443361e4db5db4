"""When a job's processes started, as vmctld records it: from when the agent saw each start, not from
the report that first says so (a short process may start and end between two reports; that report
carries both). The SSH runner finds the wrapper's PID line wherever it starts a line of the stream."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.agents.backends.base import ProcessStatus
from vmctl.agents.backends.mock import MockBackend
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.remote import take_pid
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.nodedoc import PowerState, ProcessSpec, VmObserved
from vmctl.wire import vm_observed_from_json, vm_observed_to_json


def test_the_pid_line_is_found_after_other_output_and_in_pieces() -> None:
    assert take_pid(b"__vmctl_pid=42\nout") == (42, b"out")
    # something the guest's shell printed first (a start-up file, a login message): the old parser, which
    # looked only at the buffer's start, never found the PID, so the process counted as started at its exit
    assert take_pid(b"Welcome to the guest\n__vmctl_pid=7\r\nout\n") == (7, b"Welcome to the guest\nout\n")
    assert take_pid(b"__vmctl_pid=12") == (None, b"__vmctl_pid=12")  # not whole yet: wait for the rest
    assert take_pid(b"__vmctl_pid=12" + b"34\n") == (1234, b"")
    assert take_pid(b"echo x__vmctl_pid=5\n") == (None, b"echo x__vmctl_pid=5\n")  # not at a line start


def test_the_wire_carries_stopping_and_the_start_time() -> None:
    v = VmObserved(name="j1-r1-p0", power=PowerState.PAUSED, stopping=True, process_job="1", process_index=0,
                   process_started_at=1234.5)
    assert vm_observed_from_json(vm_observed_to_json(v), "vms[0].") == v
    plain = vm_observed_to_json(dataclasses.replace(v, stopping=False, process_started_at=None))
    assert "stopping" not in plain and "process_started_at" not in plain


class SpedUpVirtualClock(VirtualClock):
    """A virtual clock that says it runs 10x real time (as ``ScaledClock`` does)."""

    factor = 10.0


class LateRunner:
    """A runner whose process started ``ago`` real seconds before the agent looks (SSH: its PID line)."""

    def __init__(self, ago: float) -> None:
        self.ago = ago
        self.specs: dict[str, ProcessSpec] = {}

    def start(self, vm: str, spec: ProcessSpec) -> None:
        self.specs[vm] = spec

    def status(self, vm: str) -> ProcessStatus | None:
        s = self.specs.get(vm)
        return None if s is None else ProcessStatus(vm=vm, job_id=s.job_id, index=s.index, running=True,
                                                    started_ago_s=self.ago)

    def kill(self, vm: str) -> None:
        self.specs.pop(vm, None)


def test_the_agent_reports_when_it_saw_the_process_start() -> None:
    layout = Layout("n1", (0,))
    clock = SpedUpVirtualClock(1000.0)
    b = MockBackend("n1", cores=1, clock=clock)
    d = layout.base_desired(1)
    fg = layout.vm_name(0, "fg")
    d = dataclasses.replace(d, vms=tuple(dataclasses.replace(v, process=ProcessSpec(job_id="1", index=0))
                                         if v.name == fg else v for v in d.vms))
    runner = LateRunner(ago=2.0)
    rep = MemoryReporter()
    rec = Reconciler(b, layout, MemorySource(d), rep, clock=clock, runner=runner)
    rec.run_once()
    v = next(x for x in rep.last.vms if x.name == fg) if rep.last else None
    assert v is not None and v.process_job == "1"
    # seen 2 real seconds before the pass that looked: 20 s of this clock (sped up 10x) before it
    assert v.process_started_at is not None and v.process_started_at <= rep.last.time - 20.0 + 1e-6
    first = v.process_started_at
    clock.advance(50.0)
    rec.run_once()
    v = next(x for x in rep.last.vms if x.name == fg)
    assert v.process_started_at == first  # kept: the time of the first sight, not of this report


def test_vmctld_records_the_start_the_agent_saw_not_the_late_report(tmp_path: Path) -> None:
    """The report that first shows the processes started comes 30 s after they started and also carries
    their exit: the run's ``running`` entry (its boot, for what-if) is at their start."""
    c = Cluster(tmp_path, {"n1": 2})
    jid = c.submit(2, 100, 50)
    for _ in range(2):  # the agents start the processes; their reports say they are still starting
        c.clock.advance(1.0)
        c.daemon.run_once()
        for name, (rec, src, rep, _be) in c.agents.items():
            src.set(c.daemon.desired(name))
            rec.run_once()
            assert rep.last is not None
            c.daemon.report(dataclasses.replace(rep.last, vms=tuple(
                dataclasses.replace(x, process_starting=x.process_job is not None) for x in rep.last.vms)))
    started = next(h["time"] for h in c.daemon.job(jid).history if h["event"] == "started")
    c.clock.advance(5.0)
    seen = c.clock.now()  # the agent saw them start here ...
    c.clock.advance(30.0)  # ... and its next report comes 30 s later, with their exit
    for rec, _src, rep, _be in c.agents.values():
        rec.run_once()
        assert rep.last is not None
        c.daemon.report(dataclasses.replace(rep.last, vms=tuple(
            dataclasses.replace(x, process_starting=False, process_started_at=seen, process_exit=0)
            if x.process_job is not None else x for x in rep.last.vms)))
    hist = c.daemon.job(jid).history
    running = next(h for h in hist if h["event"] == "running")
    assert running["time"] == pytest.approx(seen), (running, started)
    assert c.daemon.job(jid).state == "done"
    c.close()
