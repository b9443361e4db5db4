"""Persistence of a mock host: its state file, checkpoint files, and the atomic writes both use.

Guests outlive the agent process, as real ones do, when the backend has a ``state_file`` (agent
config ``backend.state_file``; by default ``<fabric_dir>/<inbox>.state`` when there is a fabric
directory): the host's state -- VMs (power, pinning, weight, cap, CPU time, checkpoint file), job
processes (spec, model start time, work done, exit status) and migrations -- is written there
atomically (temporary file, fsync, rename; mode 0600) after every change, stamped with the model
time. A new ``MockBackend`` with the same file takes the host over: the model integrates from the
stamped time to now, so a process kept running while no agent was there and the agent re-adopts it
(``start_process`` of the same job and index is a no-op). The file is created at once when missing (a
new, empty host); an unreadable, empty or corrupt file is ``MockStateError`` (nothing is started, so
nothing runs twice; delete the file to replace the host by an empty one -- its guests are then gone).
If the clock is behind the stamped time (an accelerated clock without ``epoch``), the host resumes
from now and the dead interval counts as zero. Without a state file the host lives in this process
only: a new agent process finds an empty host (like a host that rebooted).

Checkpoints are small JSON files holding the VM's state (``vm_state``); the migration hand-off
between processes (``fabric.py``) carries the same document.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from vmctl.agents.backends.base import MigrationState, VmSpec
from vmctl.agents.backends.mock.host import MockHost, MockMigration, MockProcess, MockVm
from vmctl.errors import HypervisorError, HypervisorUnavailable
from vmctl.nodedoc import PowerState, ProcessSpec

CHECKPOINT_FORMAT = "vmctl-mock-checkpoint/1"
HOST_STATE_FORMAT = "vmctl-mock-host/1"

log = logging.getLogger("vmctl.agent.mock")


class MockStateError(HypervisorUnavailable):
    """The mock host's state file cannot be read or written: the host cannot be taken over."""

    reference = "mock-state-unreadable"
    template = "{backend}: host {uri}: {problem}"
    hint = ("the mock host keeps its guests in backend.state_file; fix or restore the file, or delete it to "
            "start this host empty (its guests are then gone)")


class HostStateFile(MockHost):
    """The state file part of ``MockBackend`` (see the module docstring)."""

    def _host_state(self) -> dict[str, Any]:
        """Everything that outlives the agent process (the model at ``self._t``)."""
        migrations = []
        for m in self._migrations.values():
            migrations.append({"name": m.name, "target_uri": m.target_uri, "started": m.started,
                               "duration": m.duration, "state": m.state.value, "error": m.error,
                               "finished": m.finished, "offer": None if m.offer is None else str(m.offer),
                               "metadata": dict(m.metadata)})
        return {"format": HOST_STATE_FORMAT, "hostname": self.hostname, "uri": self.uri, "cores": self.cores,
                "time": self._t,
                "vms": [{**vm_state(vm, self.hostname, self._t), "power": vm.power.value,
                         "saved_to": vm.saved_to, "frozen": vm.frozen} for vm in self._vms.values()],
                "migrations": migrations}

    def _save(self) -> bool:
        """Write the state file atomically; on failure remember why (the next call retries and fails
        while it cannot be written) and log it once. Never raises: the poll thread calls it too."""
        assert self.state_file is not None
        with self._lock:
            try:
                write_text(self.state_file, json.dumps(self._host_state(), indent=1), private=True)
            except (OSError, ValueError) as exc:
                if self._unsaved is None:
                    log.error("mock host %s: cannot write its state file %s: %s", self.uri, self.state_file, exc)
                self._unsaved = f"{self.state_file}: {exc}"
                return False
            if self._unsaved is not None:
                log.info("mock host %s: state file %s written again", self.uri, self.state_file)
            self._unsaved = None
            return True

    def _state_error(self, path: Path, problem: str) -> MockStateError:
        return MockStateError(backend=self.name, uri=self.uri, problem=f"state file {path}: {problem}")

    def _take_over(self, path: Path) -> None:
        """Adopt the host recorded in ``path`` (or create the file for a new, empty host)."""
        text: str | None
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            text = None
        except (OSError, UnicodeDecodeError) as exc:
            raise self._state_error(path, f"cannot be read: {exc}") from exc
        if text is None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise self._state_error(path, f"cannot create its directory: {exc}") from exc
            if not self._save():
                raise self._state_error(path, f"cannot be written: {self._unsaved}")
            log.info("mock host %s: new, empty host (state file %s)", self.uri, path)
            return
        if not text.strip():
            raise self._state_error(path, "is empty (no host state in it)")
        try:
            state = json.loads(text)
        except ValueError as exc:
            raise self._state_error(path, f"is not valid JSON (corrupt?): {exc}") from exc
        try:
            t, vms, migrations = self._parse_host_state(state, str(path))
        except (KeyError, TypeError, ValueError, AttributeError, HypervisorError) as exc:
            raise self._state_error(path, f"is not a mock host state: {exc}") from exc
        now = self.clock.now()
        shift = 0.0
        if now < t:
            shift = now - t  # the clock is behind the file (no clock.epoch): resume from now
            log.warning("mock host %s: the clock (%.3f) is behind the state file's time (%.3f): the host resumes "
                        "from now (give the clock an epoch so that model time survives a restart)", self.uri, now, t)
        for m in migrations.values():
            m.started += shift
            if m.finished is not None:
                m.finished += shift
        for vm in vms.values():
            if vm.process is not None:
                vm.process.started += shift
        self._vms, self._migrations, self._t = vms, migrations, t + shift
        self._dirty = True
        self._advance(max(self._t, now))  # the guests ran on while no agent was there
        self._adopt_claimed()  # frozen since their hand-off, as if claimed now
        running = sum(1 for v in vms.values() if v.process is not None and v.process.exit_code is None)
        log.info("mock host %s: took over %d VM(s), %d job process(es) running, from %s (model time %.3f, "
                 "%.3f s ago)", self.uri, len(vms), running, path, self._t, max(0.0, now - self._t))
        self._save()

    def _parse_host_state(self, state: Any, where: str) -> tuple[float, dict[str, MockVm], dict[str, MockMigration]]:
        if not isinstance(state, dict):
            raise ValueError(f"expected an object, got {type(state).__name__}")
        if state.get("format") != HOST_STATE_FORMAT:
            raise ValueError(f"format {state.get('format')!r} is not {HOST_STATE_FORMAT}")
        if state["uri"] != self.uri:
            raise ValueError(f"it belongs to the mock host {state['uri']!r}, not {self.uri!r}")
        t = float(state["time"])
        if not math.isfinite(t):
            raise ValueError(f"time {t} is not a finite number")
        vms: dict[str, MockVm] = {}
        for i, raw in enumerate(state["vms"]):
            vm = vm_from_state(raw, f"{where}: vms[{i}]")
            if vm.spec.name in vms:
                raise ValueError(f"VM {vm.spec.name!r} is listed twice")
            vm.power = PowerState(raw["power"])
            saved_to, frozen = raw["saved_to"], raw["frozen"]
            if not (saved_to is None or isinstance(saved_to, str)) or not isinstance(frozen, bool):
                raise ValueError(f"vms[{i}]: saved_to must be a path or null and frozen a boolean")
            vm.saved_to, vm.frozen = saved_to, frozen
            if vm.pinned is not None and max(vm.pinned, default=0) >= self.cores:
                vm.pinned = None  # the host has fewer cores now
            vms[vm.spec.name] = vm
        migrations: dict[str, MockMigration] = {}
        for i, raw in enumerate(state["migrations"]):
            target_uri = str(raw["target_uri"])
            target = self.fabric.lookup(target_uri) if self.fabric is not None else None
            finished, offer = raw["finished"], raw["offer"]
            mig = MockMigration(name=str(raw["name"]), target=target, started=float(raw["started"]),
                             duration=float(raw["duration"]), state=MigrationState(raw["state"]),
                             error=str(raw["error"]), finished=None if finished is None else float(finished),
                             target_uri=target_uri, offer=None if offer is None else Path(str(offer)),
                             metadata={str(k): str(v) for k, v in (raw.get("metadata") or {}).items()})
            if mig.state is MigrationState.RUNNING and target is None and self.fabric_dir is None:
                # an in-process target that is not here any more: the VM stays (as a failed migration)
                mig.state, mig.error, mig.finished = MigrationState.FAILED, "the target left with the old agent", t
                moving = vms.get(mig.name)
                if moving is not None and moving.power is PowerState.MIGRATING:
                    moving.power, moving.frozen = PowerState.RUNNING, False
            migrations[mig.name] = mig
            if not all(math.isfinite(x) for x in (mig.started, mig.duration)):
                raise ValueError(f"migrations[{i}]: times must be finite")
        return t, vms, migrations


def write_text(path: Path, text: str, private: bool = False) -> None:
    """Atomically: a temporary file in the same directory, then rename. ``private``: mode 0600 (whatever
    the umask), and durable (the file is fsynced before the rename, the directory after it)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        if private:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "w", encoding="utf-8") as fh:
                os.fchmod(fd, 0o600)  # a leftover temporary file keeps its mode otherwise
                fh.write(text)
                fh.flush()
                os.fsync(fd)
        else:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if private:
        with contextlib.suppress(OSError):
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)


def write_json(path: Path, state: dict[str, Any]) -> None:
    write_text(path, json.dumps(state, indent=1))


def vm_state(vm: MockVm, host: str, t: float) -> dict[str, Any]:
    """The VM as a checkpoint (also the migration hand-off's payload)."""
    return {
        "format": CHECKPOINT_FORMAT,
        "host": host,
        "time": t,
        "spec": {"name": vm.spec.name, "vcpus": vm.spec.vcpus, "memory_mib": vm.spec.memory_mib,
                 "image": vm.spec.image, "metadata": dict(vm.spec.metadata)},
        "paused": vm.power is PowerState.PAUSED,
        "pinned": list(vm.pinned) if vm.pinned is not None else None,
        "weight": vm.weight,
        "cap": vm.cap,
        "cpu_time": vm.cpu_time,
        "process": None if vm.process is None else {
            "job_id": vm.process.spec.job_id, "index": vm.process.spec.index,
            "command": vm.process.spec.command, "work_seconds": vm.process.spec.work_seconds,
            "cpu_usage": vm.process.spec.cpu_usage, "done": vm.process.done,
            "exit_code": vm.process.exit_code, "started": vm.process.started,
        },
    }


def vm_from_state(state: Any, where: str) -> MockVm:
    """Parse :func:`vm_state`'s output; HypervisorError naming ``where`` when it is not one."""
    try:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"format {state.get('format')!r} is not {CHECKPOINT_FORMAT}")
        s = state["spec"]
        spec = VmSpec(name=str(s["name"]), vcpus=int(s["vcpus"]), memory_mib=int(s["memory_mib"]),
                      image=s["image"], metadata={str(k): str(v) for k, v in s["metadata"].items()})
        pinned = tuple(int(c) for c in state["pinned"]) if state["pinned"] is not None else None
        proc = state["process"]
        process = None if proc is None else MockProcess(
            spec=ProcessSpec(job_id=str(proc["job_id"]), index=int(proc["index"]),
                             command=str(proc["command"]), work_seconds=float(proc["work_seconds"]),
                             cpu_usage=float(proc["cpu_usage"])),
            done=float(proc["done"]), exit_code=_exit_code(proc["exit_code"]),
            started=float(proc.get("started", 0.0)))
        weight, cap, cpu_time = int(state["weight"]), state["cap"], float(state["cpu_time"])
        paused = bool(state["paused"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise HypervisorError(backend="mock", operation="restore",
                              problem=f"{where} is not a mock checkpoint: {exc}") from exc
    return MockVm(spec=spec, power=PowerState.PAUSED if paused else PowerState.RUNNING, pinned=pinned,
               weight=weight, cap=None if cap is None else float(cap), cpu_time=cpu_time, process=process)


def _exit_code(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"exit_code must be an integer or null, got {value!r}")
    return value
