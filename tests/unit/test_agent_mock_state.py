"""The mock host's state file: its guests outlive the agent process (round trip through a new
``MockBackend``), a corrupt or unreadable file is a clear error and never an empty host that runs the
jobs again, and the file is written atomically (0600, never half-written)."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from vmctl.agents.backends.base import MigrationState, VmSpec
from vmctl.agents.backends.mock import MockBackend, MockProcessRunner, MockStateError, inbox_name
from vmctl.agents.config import parse_agent_config
from vmctl.agents.main import main as agent_main
from vmctl.clock import VirtualClock
from vmctl.errors import ConfigError, HypervisorError
from vmctl.nodedoc import PowerState, ProcessSpec


def host(path: Path, clock: VirtualClock, **kw: Any) -> MockBackend:
    return MockBackend("h", cores=2, clock=clock, state_file=path, **kw)


def up(b: MockBackend, name: str, core: int, work: float | None = None, usage: float = 1.0) -> None:
    b.define(VmSpec(name=name, metadata={"k": "v"}))
    b.pin_vcpus(name, (core,))
    b.set_cpu_tune(name, weight=10000, cap=0.5 if usage < 1.0 else None)
    b.start(name)
    if work is not None:
        b.start_process(name, ProcessSpec(job_id=f"job-{name}", index=0, work_seconds=work, cpu_usage=usage))


def test_guests_outlive_the_backend_and_progress_while_it_is_gone(tmp_path: Path) -> None:
    path = tmp_path / "h.state"
    clock = VirtualClock(100.0)
    a = host(path, clock)
    up(a, "run", 0, work=50.0)
    up(a, "slow", 1, work=50.0, usage=0.4)  # capped at 0.5 of a core: 0.4 of demand, full speed
    a.define(VmSpec(name="off"))
    up(a, "paused", 1)
    a.suspend("paused")
    clock.advance(20.0)
    a.list_vms()  # the model at 120: 20 s of work done (not written: the file needs no progress)
    before = {v.name: v for v in a.list_vms()}
    # the agent process dies: no close(), nothing written at the end; 10 s pass without any agent
    clock.advance(10.0)
    b = host(path, clock)
    after = {v.name: v for v in b.list_vms()}
    assert set(after) == {"run", "slow", "off", "paused"}
    assert after["off"].power is PowerState.SHUTOFF and after["paused"].power is PowerState.PAUSED
    for name in ("run", "slow"):
        o = after[name]
        assert o.power is PowerState.RUNNING and o.pinned_cores == before[name].pinned_cores
        assert o.weight == 10000 and o.cap == before[name].cap and o.metadata == {"k": "v"}
        status = b.process_status(name)
        assert status is not None and status.running and status.job_id == f"job-{name}"
        assert status.work_done == pytest.approx(30.0)  # the guest kept running while no agent was there
    assert after["run"].cpu_time_s == pytest.approx(30.0)
    assert after["slow"].cpu_time_s == pytest.approx(30.0 * 0.4)
    # the new agent re-adopts the running process: starting it again is a no-op, not a second run
    MockProcessRunner(b).start("run", ProcessSpec(job_id="job-run", index=0, work_seconds=50.0))
    assert b.operations("start_process") == []
    clock.advance(20.0)  # started at 100, 50 s of work: ends at 150, exactly when it would have
    status = b.process_status("run")
    assert status is not None and not status.running and status.exit_code == 0
    exits = {e.vm: e.time for e in b.operations("process_exited")}
    assert exits == {"run": pytest.approx(150.0), "slow": pytest.approx(150.0)}


def test_a_process_that_ended_while_no_agent_ran_is_reported_ended(tmp_path: Path) -> None:
    path = tmp_path / "h.state"
    clock = VirtualClock(0.0)
    a = host(path, clock)
    up(a, "vm", 0, work=5.0)
    clock.advance(60.0)
    b = host(path, clock)
    s = b.process_status("vm")
    assert s is not None and s.exit_code == 0 and s.work_done == pytest.approx(5.0)
    assert [v.cpu_time_s for v in b.list_vms()] == [pytest.approx(5.0)]


def test_every_change_is_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "h.state"
    clock = VirtualClock(0.0)
    a = host(path, clock)
    up(a, "gone", 0)
    up(a, "vm", 1, work=100.0)
    a.stop("gone")
    a.undefine("gone")
    clock.advance(1.0)
    a.kill_process("vm")
    a.checkpoint("vm", str(tmp_path / "vm.ckpt"))
    b = host(path, VirtualClock(2.0))
    [vm] = b.list_vms()
    assert vm.name == "vm" and vm.power is PowerState.SAVED
    assert b.process_status("vm") is None  # killed and cleared: not reported as a killed job again
    assert b.restore(str(tmp_path / "vm.ckpt")) == "vm"
    state = json.loads(path.read_text(encoding="utf-8"))
    assert [v["power"] for v in state["vms"]] == ["running"]


def test_a_new_file_is_a_new_empty_host(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "h.state"
    b = host(path, VirtualClock(0.0))
    assert b.list_vms() == []
    state = json.loads(path.read_text(encoding="utf-8"))
    assert state["format"] == "vmctl-mock-host/1" and state["uri"] == "mock://h" and state["vms"] == []


@pytest.mark.parametrize(("content", "problem"), [
    ("", "is empty"),
    ("   \n", "is empty"),
    ('{"format": "vmctl-mock-host/1", "uri": "mock://h", "time": 1, "vms": [', "not valid JSON"),
    ("\xff\xfe garbage", "not valid JSON"),
    ("[]", "expected an object"),
    ('{"format": "something-else"}', "is not vmctl-mock-host/1"),
    ('{"format": "vmctl-mock-host/1", "uri": "mock://other", "time": 1, "vms": [], "migrations": []}',
     "belongs to the mock host 'mock://other'"),
    ('{"format": "vmctl-mock-host/1", "uri": "mock://h", "time": 1, "vms": [{"format": 1}], "migrations": []}',
     "not a mock checkpoint"),
    ('{"format": "vmctl-mock-host/1", "uri": "mock://h", "time": NaN, "vms": [], "migrations": []}',
     "not a finite number"),
    ('{"format": "vmctl-mock-host/1", "uri": "mock://h", "time": 1, "vms": []}', "'migrations'"),
])
def test_a_corrupt_state_file_is_a_clear_error_and_is_left_alone(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "h.state"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(MockStateError) as info:
        host(path, VirtualClock(0.0))
    msg = str(info.value)
    assert str(path) in msg and problem in msg, msg
    assert info.value.reference == "mock-state-unreadable"
    assert path.read_text(encoding="utf-8") == content  # not replaced by an empty host


def test_a_bad_process_exit_code_in_the_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "h.state"
    clock = VirtualClock(0.0)
    up(host(path, clock), "vm", 0, work=5.0)
    state = json.loads(path.read_text(encoding="utf-8"))
    state["vms"][0]["process"]["exit_code"] = "zero"
    path.write_text(json.dumps(state), encoding="utf-8")
    with pytest.raises(MockStateError, match="exit_code must be an integer"):
        host(path, clock)


def test_an_unreadable_state_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "h.state"
    path.mkdir()  # a directory where the file should be: reading it fails
    with pytest.raises(MockStateError, match="cannot be read"):
        host(path, VirtualClock(0.0))


def test_the_state_file_is_private_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "h.state"
    old = os.umask(0o000)
    try:
        b = host(path, VirtualClock(0.0))
        up(b, "vm", 0, work=1.0)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.state"]  # no temporary file left behind
    # a temporary file left by a killed writer (same pid, wide mode) does not widen the new file
    leftover = tmp_path / f".h.state.tmp{os.getpid()}"
    leftover.write_text("half", encoding="utf-8")
    leftover.chmod(0o666)
    b.suspend("vm")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and not leftover.exists()


def test_a_failed_write_never_leaves_a_half_written_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "h.state"
    clock = VirtualClock(0.0)
    b = host(path, clock)
    up(b, "vm", 0, work=100.0)
    good = path.read_text(encoding="utf-8")

    def no_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_fsync)
    with caplog.at_level(logging.ERROR, logger="vmctl.agent.mock"):
        b.suspend("vm")  # the change is made; its record fails (logged, once)
        assert path.read_text(encoding="utf-8") == good  # the old, complete state: the rename never happened
        assert sorted(p.name for p in tmp_path.iterdir()) == ["h.state"]
        with pytest.raises(HypervisorError, match="cannot write the host state"):
            b.list_vms()  # every call fails while the host's state cannot be recorded
        with pytest.raises(HypervisorError, match="No space left"):
            b.resume("vm")
    assert len([r for r in caplog.records if "cannot write its state file" in r.message]) == 1
    monkeypatch.undo()
    assert [v.power for v in b.list_vms()] == [PowerState.PAUSED]  # written again at the next call
    assert json.loads(path.read_text(encoding="utf-8"))["vms"][0]["power"] == "paused"
    assert host(path, clock).list_vms()[0].power is PowerState.PAUSED


def test_a_clock_behind_the_file_resumes_from_now(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "h.state"
    a = host(path, VirtualClock(1000.0))
    up(a, "vm", 0, work=50.0)
    clock = VirtualClock(10.0)  # e.g. an accelerated clock without an epoch, started again
    with caplog.at_level(logging.WARNING, logger="vmctl.agent.mock"):
        b = host(path, clock)
    assert any("behind the state file" in r.message for r in caplog.records)
    s = b.process_status("vm")
    assert s is not None and s.running and s.work_done == pytest.approx(0.0)
    clock.advance(50.0)
    s = b.process_status("vm")
    assert s is not None and s.exit_code == 0


def test_a_live_migration_through_the_fabric_survives_a_restart_of_the_source(tmp_path: Path) -> None:
    clock = VirtualClock(0.0)
    fab = tmp_path / "fab"
    a = MockBackend("a", clock=clock, fabric_dir=fab, migration_seconds=2.0, state_file=tmp_path / "a.state")
    b = MockBackend("b", clock=clock, fabric_dir=fab, state_file=tmp_path / "b.state")
    up(a, "vm", 0, work=100.0)
    a.start_migration("vm", b.uri)
    clock.advance(1.0)
    a2 = MockBackend("a", clock=clock, fabric_dir=fab, migration_seconds=2.0, state_file=tmp_path / "a.state")
    assert a2.list_vms()[0].power is PowerState.MIGRATING
    clock.advance(1.5)
    a2.list_vms()  # the hand-off, by the new agent
    b.list_vms()  # the target claims it
    assert a2.migration_status("vm").state is MigrationState.COMPLETED and a2.list_vms() == []
    # the target dies too: the VM it adopted is in its file, with the progress it made
    clock.advance(10.0)
    b2 = MockBackend("b", clock=clock, fabric_dir=fab, state_file=tmp_path / "b.state")
    s = b2.process_status("vm")
    assert s is not None and s.running and s.work_done == pytest.approx(12.5, abs=1e-6)


def test_a_claimed_offer_whose_target_died_before_recording_it_is_adopted(tmp_path: Path) -> None:
    clock = VirtualClock(0.0)
    fab = tmp_path / "fab"
    a = MockBackend("a", clock=clock, fabric_dir=fab, migration_seconds=1.0)
    up(a, "vm", 0, work=100.0)
    b = MockBackend("b", clock=clock, fabric_dir=fab, state_file=tmp_path / "b.state")
    a.start_migration("vm", b.uri)
    clock.advance(1.0)
    a.list_vms()  # the offer is in b's inbox now
    offer = fab / inbox_name(b.uri) / "vm.json"
    claimed = offer.with_name("vm.json.claimed-4242")
    offer.rename(claimed)  # what b's claim does first; b "dies" before it recorded the VM
    a.list_vms()
    assert a.migration_status("vm").state is MigrationState.COMPLETED
    b2 = MockBackend("b", clock=clock, fabric_dir=fab, state_file=tmp_path / "b.state")
    assert [v.name for v in b2.list_vms()] == ["vm"] and not claimed.exists()
    s = b2.process_status("vm")
    assert s is not None and s.running and s.work_done == pytest.approx(1.0)


# ------------------------------------------------------------------------------ agent config and CLI


def _cfg(**backend: Any) -> dict[str, Any]:
    return {"node": "n1", "backend": {"kind": "mock", **backend}}


def test_config_state_file_defaults_next_to_the_fabric_inbox() -> None:
    assert parse_agent_config(_cfg()).backend.state_file == ""
    assert parse_agent_config(_cfg(fabric_dir="/f/")).backend.state_file == "/f/mock_n1.state"
    assert parse_agent_config(_cfg(fabric_dir="/f", uri="mock://x")).backend.state_file == "/f/mock_x.state"
    assert parse_agent_config(_cfg(fabric_dir="/f", state_file="/s/n1")).backend.state_file == "/s/n1"
    assert parse_agent_config(_cfg(fabric_dir="/f", state_file="")).backend.state_file == ""  # in memory
    assert parse_agent_config(_cfg(state_file="/s/n1")).backend.state_file == "/s/n1"


@pytest.mark.parametrize(("data", "where"), [
    (_cfg(state_file="rel/n1.state"), "backend.state_file: must be an absolute path"),
    (_cfg(state_file=3), "backend.state_file"),
    ({"node": "n1", "backend": {"kind": "libvirt", "uri": "qemu:///system", "state_file": "/s"}},
     "backend.state_file: applies to the mock backend only"),
])
def test_config_state_file_errors(data: dict[str, Any], where: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_agent_config(data, "agent.yaml")
    assert where in str(info.value), str(info.value)


def test_agent_with_a_corrupt_state_file_exits_with_a_clear_error(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "n1.state"
    state.write_text('{"format": "vmctl-mock-host/1", "vms": [{"na', encoding="utf-8")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump(_cfg(state_file=str(state))), encoding="utf-8")
    with pytest.raises(SystemExit) as info:
        agent_main(["--config", str(cfg), "--once", "--log-level", "error"])
    assert info.value.code == 6
    err = capsys.readouterr().err
    assert f"error: mock-state-unreadable: mock: host mock://n1: state file {state}: is not valid JSON" in err
    assert "delete it to start this host empty" in err and "Traceback" not in err


def test_agent_once_re_adopts_the_guests_of_its_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "n1.state"
    desired = tmp_path / "desired.yaml"
    desired.write_text(yaml.safe_dump({"node": "n1", "generation": 1, "vms": [
        {"name": "n1-c0-fg", "core": 0, "role": "fg", "weight": 10000,
         "process": {"job_id": "j1", "index": 0, "work_seconds": 1e6, "cpu_usage": 1.0}}]}), encoding="utf-8")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(yaml.safe_dump({**_cfg(state_file=str(state)), "desired": {"file": str(desired)}}),
                   encoding="utf-8")
    applied = []
    for _ in range(2):  # two agent lives on one host
        agent_main(["--config", str(cfg), "--once", "--log-level", "error"])
        out = json.loads(capsys.readouterr().out)
        [vm] = [v for v in out["vms"] if v["name"] == "n1-c0-fg"]
        assert vm["power"] == "running" and vm["process_job"] == "j1" and vm["process_exit"] is None
        applied.append(json.loads(state.read_text(encoding="utf-8")))
    first, second = ({v["spec"]["name"]: v for v in s["vms"]}["n1-c0-fg"] for s in applied)
    assert first["process"]["started"] == second["process"]["started"]  # the same process, not a new one
