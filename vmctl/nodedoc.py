"""The node documents: the desired state vmctld writes for each node and the state its agent observes.

Level-based: the daemon writes a generation-numbered desired state per node (``NodeDesired``: the VMs
it wants, each on a core and a level of it, ``VmDesired``); the agent reconciles its host towards it and
reports what it observed (``NodeObserved``, ``VmObserved``). The levels and disciplines these documents
place VMs on, and a host's layout of them (``NodeLayout``), are the scheduling vocabulary's
(``vmctl.model``: "Levels"); the JSON codec of both documents is ``vmctl.wire``. Extend them
additively (new optional fields only).

Everything here is a frozen dataclass (or an enum) with no behaviour beyond validation and small derived
properties.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from vmctl.model import NodeLayout, SliceSchedule


class VmRole(StrEnum):
    FG = "fg"
    BG = "bg"
    SHARED = "shared"  # vcsched: one of several capped VMs on a host, not part of a core pair


class PowerState(StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    SHUTOFF = "shutoff"
    SAVED = "saved"  # checkpointed to a file
    ABSENT = "absent"  # not defined
    CRASHED = "crashed"
    MIGRATING = "migrating"


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """A job process to run inside a VM (over SSH for real guests, simulated by the mock backend)."""

    job_id: str
    index: int
    command: str = ""
    work_seconds: float = 0.0  # mock backend: dedicated-core seconds of work the process needs
    cpu_usage: float = 1.0  # mock backend: utilization of the process on a dedicated core


@dataclass(frozen=True, slots=True)
class MigrationSpec:
    """A migration phase in desired state: both agents see it and advance it."""

    migration_id: str
    source_node: str
    target_node: str
    target_core: int  # local core on the target; -1 = unpinned (vcsched shared VMs)
    phase: Literal["requested", "running", "completed", "failed", "aborted"] = "requested"
    mode: Literal["live", "checkpoint"] = "live"


@dataclass(frozen=True, slots=True)
class VmDesired:
    name: str
    core: int  # local core index on the node (pinning target); -1 = unpinned (vcsched shared VMs)
    role: VmRole
    weight: int  # backend-neutral weight 1..10000 (mapped to cpu_shares / credit weight)
    cap: float | None = None  # fraction of one core, None = uncapped
    power: PowerState = PowerState.RUNNING
    process: ProcessSpec | None = None
    checkpoint_path: str | None = None
    migration: MigrationSpec | None = None
    memory_mib: int = 64
    # the VM level on its core (0 .. L-1, see "Levels" in vmctl.model); -1: follows ``role``
    # (fg level 0, bg level 1, a shared VM none), which is all a two-level priority host needs
    level: int = -1
    #: timeslice: the other rows (levels) this VM also runs in, on the same core (a replicated gang job,
    #: ``Replicate``): it holds those slots too and runs while any of its rows is active
    replicas: tuple[int, ...] = ()

    @property
    def slot_level(self) -> int | None:
        """The level this VM holds on its core, or None for a shared VM (no level of a core)."""
        if self.level >= 0:
            return self.level
        return None if self.role is VmRole.SHARED else 0 if self.role is VmRole.FG else 1


@dataclass(frozen=True, slots=True)
class NodeDesired:
    node: str
    generation: int
    vms: tuple[VmDesired, ...] = ()
    #: timeslice nodes: the slice clock the agent switches rows on, ``epoch`` in Unix seconds (None: no
    #: slicing; a timeslice layout keeps its row 0 active, or the row ``Reconciler.switch_row`` chose)
    slices: SliceSchedule | None = None
    #: the VM level layout vmctld wants on the node (None: the agent's own ``layout:`` config); the agent
    #: re-lays out its host once it holds no job VM that this document does not list (docs/agent.md)
    layout: NodeLayout | None = None


@dataclass(frozen=True, slots=True)
class VmObserved:
    name: str
    power: PowerState
    core: int | None = None  # pinned local core, None = unpinned
    weight: int | None = None
    cap: float | None = None
    cpu_time_s: float = 0.0  # cumulative guest CPU time
    utilization: float = 0.0  # fraction of one core over the last sampling interval
    process_job: str | None = None
    process_index: int | None = None
    process_exit: int | None = None  # exit status once the process ended
    migration_phase: str | None = None
    #: a VM of the agent's that no desired state wants: being stopped and removed (absent: removed in the
    #: cycle that reported it)
    orphan: bool = False
    #: the agent asked for the process but it does not run yet (a booting guest's SSH server is not up);
    #: last, so that positional construction by older callers keeps its meaning
    process_starting: bool = False
    #: the agent is stopping the VM (a forced stop runs off its reconcile pass and takes seconds to minutes
    #: on a loaded host): ``power`` is still what the hypervisor says until it is gone
    stopping: bool = False
    #: when the agent saw the job process start (its clock, as ``NodeObserved.time``; None: not known or not
    #: started): a report may come later than that (the one that also carries the exit of a short process)
    process_started_at: float | None = None


@dataclass(frozen=True, slots=True)
class MigrationRefusal:
    """A migration the agent of its source node will not carry out (``reason``, e.g. the target is
    not in its ``peers``). The agent applies the rest of the generation and reports this until the
    daemon takes the migration back."""

    vm: str
    migration_id: str
    target_node: str
    reason: str


@dataclass(frozen=True, slots=True)
class NodeObserved:
    node: str
    generation_applied: int
    cores: int
    vms: tuple[VmObserved, ...] = ()
    host_utilization: float = 0.0
    errors: tuple[str, ...] = ()
    time: float = 0.0
    refusals: tuple[MigrationRefusal, ...] = ()
    #: the VM level layout the host has now, and the memory of each of its VMs (``layout.memory_mib``);
    #: None / 0 from an older agent
    layout: NodeLayout | None = None
    layout_memory_mib: int = 0
