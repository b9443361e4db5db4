"""The pure heart of the agent: ``plan(desired, observed, layout) -> list[Action]``.

No I/O, no clock: given the node's desired state (already completed with the layout's core pairs and
validated by ``validate``) and one relist of what the hypervisor has, return the idempotent steps
that move the host toward the desired state. The reconciler applies them in the returned order and
plans again; when the host matches, the plan is empty (that is what makes an agent restart harmless:
nothing is started or stopped that is already right).

A VM whose forced stop is under way (``Observed.stopping``: the reconciler runs stops off its pass) gets
no action at all until the stop ended; its SSH port stays taken meanwhile.

Order (safe transitions): kill processes / abort migrations, then stop, checkpoint and suspend, then
undefine, then *lower* weights, then define, pin, *raise* weights (so a core never has two VMs at the
fg weight during a promote, only briefly two at the bg weight), then restore/start, resume, start
migrations and finally start job processes. Within a phase, VMs go by name.

Per VM (``d`` desired, ``o`` observed):

=====================  ==================================================================
desired power          observed -> actions
=====================  ==================================================================
running                absent -> define, pin, tune, start (or restore if a checkpoint file
                       is named and exists); shutoff -> pin, tune, start; paused -> resume;
                       saved -> restore (file) or start; crashed -> stop, start
paused                 running -> suspend; absent/shutoff -> as running, then suspend
shutoff                running/paused -> stop; absent -> define
saved                  running/paused -> checkpoint to ``checkpoint_path``
absent                 running/paused -> stop, undefine; shutoff/saved -> undefine
=====================  ==================================================================

Then on a running VM: pin to ``layout.physical(core)`` (unpinned VMs, core -1, are left alone),
weight and cap (``None`` clears the cap), and the job process: kill one that is not wanted, start
the wanted one when the VM has none or another one. A process that ended is never restarted (its
exit status is reported; the daemon clears it).

Migration (``d.migration``, a phase both agents see): the *source* agent starts a live migration
to ``peers[target_node]`` while the phase is requested/running, aborts it when the phase is aborted,
and never re-creates a VM that left (absent VM on the source = migrated). In checkpoint mode the
source checkpoints to ``checkpoint_path`` (and, with ``transfer_checkpoints``, copies the file to
the target host) and the *target* restores from it once the phase is running and the file exists.
The target leaves an absent migrating VM alone until it arrives, then pins and tunes it to
``target_core`` like any other VM (a shared VM with ``target_core`` -1 stays unpinned, as it was on
the source).

A migration the source cannot carry out (live: no ``peers`` entry for the target; checkpoint over
sftp: no ``checkpoints.hosts`` entry) does not make the agent reject the generation: ``accept``
turns that one migration into an aborted one (the VM is left where and as it is; one that already
left is still never re-created), the rest of the document is applied, and the refusal
(``MigrationRefusal``) is reported so that the daemon takes the migration back.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from itertools import pairwise
from typing import Literal, TypeAlias

from vmctl.agents.backends.base import (
    WEIGHT_MAX,
    WEIGHT_MIN,
    MigrationState,
    MigrationStatus,
    ProcessStatus,
    VmInfo,
    VmSpec,
)
from vmctl.agents.layout import META_NODE, META_SSH_PORT, Layout
from vmctl.errors import ValidationError
from vmctl.model import Discipline
from vmctl.nodedoc import MigrationRefusal, MigrationSpec, NodeDesired, PowerState, ProcessSpec, VmDesired, VmRole

CAP_TOLERANCE = 1e-4

# ------------------------------------------------------------------------------------ actions


@dataclass(frozen=True, slots=True)
class Define:
    spec: VmSpec
    #: why the VM cannot be defined yet (no free forwarded SSH port): applying the step fails with it, and
    #: the next pass plans again (a port may have been released meanwhile)
    problem: str | None = None
    kind: Literal["define"] = "define"

    @property
    def vm(self) -> str:
        return self.spec.name


@dataclass(frozen=True, slots=True)
class Undefine:
    vm: str
    kind: Literal["undefine"] = "undefine"


@dataclass(frozen=True, slots=True)
class Start:
    vm: str
    kind: Literal["start"] = "start"


@dataclass(frozen=True, slots=True)
class Stop:
    vm: str
    kind: Literal["stop"] = "stop"


@dataclass(frozen=True, slots=True)
class Suspend:
    vm: str
    kind: Literal["suspend"] = "suspend"


@dataclass(frozen=True, slots=True)
class Resume:
    vm: str
    kind: Literal["resume"] = "resume"


@dataclass(frozen=True, slots=True)
class Pin:
    vm: str
    cores: tuple[int, ...]
    kind: Literal["pin"] = "pin"


@dataclass(frozen=True, slots=True)
class Tune:
    vm: str
    weight: int | None = None
    cap: float | None = None
    clear_cap: bool = False
    kind: Literal["tune"] = "tune"


@dataclass(frozen=True, slots=True)
class CheckpointVm:
    vm: str
    path: str
    kind: Literal["checkpoint"] = "checkpoint"


@dataclass(frozen=True, slots=True)
class RestoreVm:
    vm: str
    path: str
    #: the metadata the restored VM carries here (a checkpoint taken on another node names that node)
    metadata: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    kind: Literal["restore"] = "restore"


@dataclass(frozen=True, slots=True)
class StartMigration:
    vm: str
    dest_uri: str
    migrate_uri: str | None = None
    #: the target node: the VM's ``vmctl.node`` metadata names it on arrival (not part of the step's identity)
    node: str = field(default="", compare=False)
    kind: Literal["start_migration"] = "start_migration"


@dataclass(frozen=True, slots=True)
class Claim:
    """Rewrite a VM's vmctl metadata to this node's (it names another node: it came here by a migration
    or a restore that did not rewrite it), so that this agent owns it whatever happens to it later."""

    vm: str
    metadata: tuple[tuple[str, str], ...]
    kind: Literal["claim"] = "claim"


@dataclass(frozen=True, slots=True)
class TransferCheckpoint:
    """Copy the checkpoint file to the same path on the target node's host (SFTP)."""

    vm: str
    path: str
    node: str
    kind: Literal["transfer_checkpoint"] = "transfer_checkpoint"


@dataclass(frozen=True, slots=True)
class AbortMigration:
    vm: str
    kind: Literal["abort_migration"] = "abort_migration"


@dataclass(frozen=True, slots=True)
class StartProcess:
    vm: str
    spec: ProcessSpec
    kind: Literal["start_process"] = "start_process"


@dataclass(frozen=True, slots=True)
class KillProcess:
    vm: str
    kind: Literal["kill_process"] = "kill_process"


Action: TypeAlias = (
    Define | Undefine | Start | Stop | Suspend | Resume | Pin | Tune | CheckpointVm | RestoreVm
    | StartMigration | AbortMigration | StartProcess | KillProcess | TransferCheckpoint | Claim
)

_Adder: TypeAlias = Callable[[int, Action], None]

# phases of the returned order (see the module docstring)
_P_KILL, _P_STOP, _P_UNDEFINE, _P_LOWER, _P_DEFINE, _P_PIN, _P_RAISE, _P_START, _P_RESUME, _P_PAUSE, \
    _P_MIGRATE, _P_PROCESS = range(12)


# ------------------------------------------------------------------------------------ observed


@dataclass(frozen=True, slots=True)
class Observed:
    """One relist: VMs by name, the job process of each running VM (None = no process), the status
    of migrations this node started, and which checkpoint files exist."""

    vms: Mapping[str, VmInfo]
    processes: Mapping[str, ProcessStatus | None] = field(default_factory=dict)
    migrations: Mapping[str, MigrationStatus] = field(default_factory=dict)
    files: frozenset[str] = frozenset()
    transferred: frozenset[str] = frozenset()  # checkpoint paths already copied to their target host
    #: VMs whose forced stop is under way off the reconcile pass: the plan leaves them alone until it ended
    stopping: frozenset[str] = frozenset()

    @staticmethod
    def of(vms: list[VmInfo], processes: Mapping[str, ProcessStatus | None] | None = None,
           migrations: Mapping[str, MigrationStatus] | None = None, files: frozenset[str] = frozenset(),
           transferred: frozenset[str] = frozenset(), stopping: frozenset[str] = frozenset()) -> Observed:
        return Observed({v.name: v for v in vms}, processes or {}, migrations or {}, files, transferred, stopping)


# ------------------------------------------------------------------------------------ validation


def validate(desired: NodeDesired, layout: Layout) -> None:
    """Reject a desired state as a whole before anything is applied. Raises ``ValidationError``
    whose field is a path like ``desired[n1 gen 7].vms[3].weight``. A well-formed migration that this
    node cannot carry out (no peer entry for its target) is not a reason to reject the document:
    ``accept`` refuses that migration alone."""
    base = f"desired[{desired.node} gen {desired.generation}]"
    if desired.node != layout.host:
        raise ValidationError(field=f"{base}.node",
                              problem=f"is for node {desired.node!r}, this agent is {layout.host!r}")
    if desired.generation < 0:
        raise ValidationError(field=f"{base}.generation", problem=f"must be >= 0, got {desired.generation}")
    dup = [n for n, c in Counter(v.name for v in desired.vms).items() if c > 1]
    if dup:
        raise ValidationError(field=f"{base}.vms", problem=f"VM {dup[0]!r} is listed more than once")
    slots: dict[tuple[int, int], str] = {}  # (core, level) -> VM
    incoming: dict[tuple[int, int], str] = {}
    for i, v in enumerate(desired.vms):
        where = f"{base}.vms[{i}]({v.name})"
        if not v.name or any(ch.isspace() or ch == "/" for ch in v.name):
            raise ValidationError(field=f"{where}.name", problem="must be a non-empty name without spaces or '/'")
        if v.role is VmRole.SHARED:
            if not -1 <= v.core < layout.size:
                raise ValidationError(field=f"{where}.core",
                                      problem=f"{v.core} out of range (-1 = unpinned, or 0..{layout.size - 1})")
        else:
            if not 0 <= v.core < layout.size:
                raise ValidationError(field=f"{where}.core",
                                      problem=f"{v.core} out of range 0..{layout.size - 1} for a {v.role.value} VM")
            level = v.slot_level
            assert level is not None  # only a shared VM holds no level
            if v.level < 0 and v.role is VmRole.BG and layout.levels < 2:
                raise ValidationError(field=f"{where}.role",
                                      problem=f"a bg VM needs 2 levels per core; this host has {layout.levels}")
            if level >= layout.levels:
                raise ValidationError(field=f"{where}.level",
                                      problem=f"{level} out of range 0..{layout.levels - 1} (this host has "
                                              f"{layout.levels} levels per core)")
            # a VM still on its way here may share its core with one about to leave (the daemon moves
            # a job's processes in one operation: a chain node1:2 -> node2:0, node2:2 -> node1:2 lists the
            # arriving VM on core 2 while the leaving one still runs there); two arriving ones may not
            m = v.migration
            arriving = m is not None and m.target_node == layout.host and m.phase in ("requested", "running")
            table = incoming if arriving else slots
            other = table.get((v.core, level))
            if other is not None:
                what = v.role.value if v.level < 0 else f"level {level}"
                raise ValidationError(field=f"{where}.role",
                                      problem=f"core {v.core} already has a {what} VM ({other})")
            for row in v.replicas:  # a replicated VM (timeslice) holds its other rows' slots too
                if not 0 <= row < layout.levels or row == level:
                    raise ValidationError(field=f"{where}.replicas",
                                          problem=f"row {row} must be another level of 0..{layout.levels - 1}")
                holder = table.get((v.core, row))
                if holder is not None:
                    raise ValidationError(field=f"{where}.replicas",
                                          problem=f"core {v.core} already has a level {row} VM ({holder})")
                table[(v.core, row)] = v.name
            table[(v.core, level)] = v.name
        if not WEIGHT_MIN <= v.weight <= WEIGHT_MAX:
            raise ValidationError(field=f"{where}.weight",
                                  problem=f"{v.weight} out of range {WEIGHT_MIN}..{WEIGHT_MAX}")
        if v.cap is not None and not (0.0 < v.cap <= 1.0 and math.isfinite(v.cap)):
            raise ValidationError(field=f"{where}.cap", problem=f"{v.cap} out of range (0, 1] (or null: uncapped)")
        if v.memory_mib < 1:
            raise ValidationError(field=f"{where}.memory_mib", problem=f"must be >= 1, got {v.memory_mib}")
        if v.power is PowerState.SAVED and not v.checkpoint_path:
            raise ValidationError(field=f"{where}.checkpoint_path", problem="is required when power is saved")
        if v.power in (PowerState.CRASHED, PowerState.MIGRATING):
            raise ValidationError(field=f"{where}.power", problem=f"{v.power.value} cannot be desired")
        p = v.process
        if p is not None:
            if not 0.0 < p.cpu_usage <= 1.0:
                raise ValidationError(field=f"{where}.process.cpu_usage", problem=f"{p.cpu_usage} not in (0, 1]")
            if not (p.work_seconds >= 0 and math.isfinite(p.work_seconds)):
                raise ValidationError(field=f"{where}.process.work_seconds", problem=f"{p.work_seconds} must be >= 0")
            if p.index < 0 or not p.job_id:
                raise ValidationError(field=f"{where}.process", problem="needs a job_id and an index >= 0")
        m = v.migration
        if m is not None:
            if layout.host not in (m.source_node, m.target_node):
                raise ValidationError(field=f"{where}.migration",
                                      problem=f"is between {m.source_node} and {m.target_node}, not this node")
            if m.source_node == m.target_node:
                raise ValidationError(field=f"{where}.migration", problem="source and target are the same node")
            lowest = -1 if v.role is VmRole.SHARED else 0  # -1: a shared VM arrives unpinned
            if m.target_node == layout.host and not lowest <= m.target_core < layout.size:
                raise ValidationError(field=f"{where}.migration.target_core",
                                      problem=f"{m.target_core} out of range {lowest}..{layout.size - 1}")
            if m.mode == "checkpoint" and not v.checkpoint_path:
                raise ValidationError(field=f"{where}.checkpoint_path", problem="is required by a checkpoint migration")
    if layout.discipline is Discipline.PRIORITY:
        _check_priority_weights(desired, base)


def _check_priority_weights(desired: NodeDesired, base: str) -> None:
    """Priority discipline: on every core a level's VM weighs more than the VMs of the levels below."""
    by_core: dict[int, list[tuple[int, VmDesired]]] = {}
    for v in desired.vms:
        level = v.slot_level
        if level is not None:
            by_core.setdefault(v.core, []).append((level, v))
    for k in sorted(by_core):
        vms = sorted(by_core[k], key=lambda lv: lv[0])
        for (la, a), (lb, b) in pairwise(vms):
            if la != lb and a.weight <= b.weight:
                upper = "fg" if a.level < 0 and a.role is VmRole.FG else f"level {la}"
                lower = "bg" if b.level < 0 and b.role is VmRole.BG else f"level {lb}"
                raise ValidationError(field=f"{base}.core {k}",
                                      problem=f"{upper} VM {a.name} weight {a.weight} must exceed {lower} VM "
                                              f"{b.name} weight {b.weight}")


def refusal_reason(m: MigrationSpec, peers: Mapping[str, str] | None,
                   checkpoint_peers: Collection[str] | None = None) -> str | None:
    """Why this node, as the source, cannot carry out migration ``m``; None when it can. Live: the
    target must be in ``peers`` (None = not checked). Checkpoint: with ``checkpoints.transfer: sftp``
    the target needs a ``checkpoints.hosts`` entry (``checkpoint_peers``; None = shared storage, any
    node)."""
    if m.mode == "live":
        if peers is not None and m.target_node not in peers:
            return f"unknown peer {m.target_node!r}: this agent's config has no peers.{m.target_node}"
    elif checkpoint_peers is not None and m.target_node not in checkpoint_peers:
        return (f"no checkpoint host for {m.target_node!r}: this agent's config has no "
                f"checkpoints.hosts.{m.target_node}")
    return None


def accept(desired: NodeDesired, layout: Layout, peers: Mapping[str, str] | None = None,
           checkpoint_peers: Collection[str] | None = None) -> tuple[NodeDesired, tuple[MigrationRefusal, ...]]:
    """``validate`` the document (raises for the whole of it), then refuse each migration this node
    would have to start but cannot (``refusal_reason``): in the returned document that migration's
    phase is ``aborted`` (the source leaves the VM where and as it is, stops a transfer in flight and
    never re-creates a VM that already left), everything else is as given, and the refusals are
    reported to the daemon, which takes those migrations back."""
    validate(desired, layout)
    refused: list[MigrationRefusal] = []
    vms: list[VmDesired] = []
    for v in desired.vms:
        m = v.migration
        if m is not None and m.source_node == layout.host and m.phase in ("requested", "running"):
            why = refusal_reason(m, peers, checkpoint_peers)
            if why is not None:
                refused.append(MigrationRefusal(vm=v.name, migration_id=m.migration_id, target_node=m.target_node,
                                                reason=why))
                v = replace(v, migration=replace(m, phase="aborted"))
        vms.append(v)
    if not refused:
        return desired, ()
    return replace(desired, vms=tuple(vms)), tuple(refused)


# ------------------------------------------------------------------------------------ plan


def plan(desired: NodeDesired, observed: Observed, layout: Layout, peers: Mapping[str, str] | None = None,
         migrate_uris: Mapping[str, str] | None = None, prune: bool = True,
         transfer_checkpoints: bool = False) -> list[Action]:
    """The actions that move ``observed`` toward ``desired``. ``prune`` removes VMs this agent manages
    (our metadata or a layout name) that ``desired`` does not list; foreign VMs are never touched.
    ``transfer_checkpoints``: checkpoint files are not on shared storage; the source copies them to
    the target host after the checkpoint (once per path, see ``Observed.transferred``)."""
    steps: list[tuple[int, str, int, Action]] = []
    peers = peers or {}
    migrate_uris = migrate_uris or {}

    def add(phase: int, act: Action) -> None:
        steps.append((phase, act.vm, len(steps), act))

    wanted = {v.name for v in desired.vms}
    for v in desired.vms:
        if v.name in observed.stopping:
            continue  # its stop is under way: nothing else is done to it until that ended (then: plan again)
        _plan_vm(v, observed.vms.get(v.name), observed, layout, peers, migrate_uris, add, transfer_checkpoints)
    if prune:
        for name, o in observed.vms.items():
            if name in wanted or name in observed.stopping or not layout.is_ours(name, o.metadata):
                continue
            if o.power is PowerState.MIGRATING:
                # leaving for a host that no desired state puts it on: call it back (too late once it is
                # there; it then names its new host, whose agent removes it)
                st = observed.migrations.get(name)
                if st is not None and st.state is MigrationState.RUNNING:
                    add(_P_KILL, AbortMigration(name))
                continue
            if o.power in (PowerState.RUNNING, PowerState.PAUSED, PowerState.CRASHED):
                add(_P_STOP, Stop(name))
            add(_P_UNDEFINE, Undefine(name))
    steps.sort(key=lambda s: (s[0], s[1], s[2]))
    shared = {v.name for v in desired.vms if v.slot_level is None}
    return _free_ssh_ports([s[3] for s in steps], observed, layout, shared)


def _free_ssh_ports(actions: list[Action], observed: Observed, layout: Layout,
                    shared: Collection[str] = ()) -> list[Action]:
    """Give every VM defined by ``actions`` a forwarded SSH port no other VM of this host holds.

    Slot VMs: ``Layout.spec_for`` gives a VM the port of its (core, level) slot, but a VM keeps the port
    it was defined with while its role changes (a bg VM promoted to fg under ``priority`` still forwards
    the bg slot's port), so the next VM defined on that bg slot would ask QEMU for a port that is taken and
    never start. Such a VM gets the lowest free port of the slots' range instead (the range has one port
    per slot, and a host holds at most one VM per slot).

    Shared VMs (``shared``: the names of desired VMs without a slot, vcsched's unpinned VMs) get the lowest
    free port of the layout's second range (``shared_ssh_ports``), when it has one.

    A port is held by every VM the host has (its ``vmctl.ssh_port`` metadata: an agent that restarted
    adopts the ports of the VMs it finds) other than those this plan undefines (undefine comes before
    define). The runner reads each VM's port from its metadata. A VM for which no port is free is not
    defined: its ``Define`` carries the reason (``Define.problem``), applying it fails with that, and the
    next pass plans again."""
    slot_defines = [a for a in actions if isinstance(a, Define) and a.spec.ssh_port is not None]
    shared_defines = [a for a in actions if isinstance(a, Define) and a.spec.ssh_port is None and a.vm in shared
                      and layout.shared_ssh_ports is not None]
    if not slot_defines and not shared_defines:
        return actions
    gone = {a.vm for a in actions if isinstance(a, Undefine)}
    holders: dict[int, str] = {}
    for name, o in observed.vms.items():
        held = o.metadata.get(META_SSH_PORT)
        if name not in gone and held is not None and held.isdigit():
            holders[int(held)] = name
    clash = [a for a in slot_defines if a.spec.ssh_port in holders]
    for a in slot_defines:
        if a not in clash and a.spec.ssh_port is not None:
            holders[a.spec.ssh_port] = a.vm
    moved: dict[str, Define] = {}

    def give(a: Define, ports: range, what: str) -> None:
        free = next((p for p in ports if p not in holders), None)
        if free is None:
            # every port of the range is held: the VM waits (its start would fail in QEMU's hostfwd)
            who = ", ".join(sorted(set(holders[p] for p in ports if p in holders)))
            moved[a.vm] = Define(a.spec, problem=f"no free forwarded SSH port for {a.vm}: all {len(ports)} ports of "
                                                 f"{what} {ports.start}-{ports.stop - 1} are held (by {who}); it is "
                                                 f"defined once a VM holding one is gone")
            return
        holders[free] = a.vm
        moved[a.vm] = Define(replace(a.spec, ssh_port=free, metadata={**a.spec.metadata, META_SSH_PORT: str(free)}))

    for a in clash:
        give(a, layout.slot_ports, "layout.ssh_ports")
    for a in shared_defines:
        give(a, layout.shared_ports, "layout.shared_ssh_ports")
    return [moved.get(a.vm, a) if isinstance(a, Define) else a for a in actions]


def _pinning(v: VmDesired, layout: Layout, core: int | None = None) -> tuple[int, ...] | None:
    k = v.core if core is None else core
    return None if k < 0 else (layout.physical(k),)


def _plan_vm(v: VmDesired, o: VmInfo | None, obs: Observed, layout: Layout, peers: Mapping[str, str],
             migrate_uris: Mapping[str, str], add: _Adder, transfer: bool = False) -> None:
    name = v.name
    m = v.migration
    core = v.core
    if m is not None and m.phase not in ("completed", "failed"):
        source = m.source_node == layout.host
        if source:
            _plan_migration_source(v, o, obs, peers, migrate_uris, add, transfer)
            return
        # target: wait for the VM to arrive (or restore it from the checkpoint file)
        core = m.target_core
        if o is None or o.power is PowerState.ABSENT:
            if (m.mode == "checkpoint" and m.phase == "running" and v.checkpoint_path
                    and v.checkpoint_path in obs.files):
                add(_P_START, RestoreVm(name, v.checkpoint_path, _meta(v, layout, core)))
            return
    elif m is not None and m.phase == "completed" and m.source_node == layout.host:
        # the VM left: never re-create it here; clean up what is left of it
        if o is not None and o.power in (PowerState.SHUTOFF, PowerState.SAVED):
            add(_P_UNDEFINE, Undefine(name))
        return
    elif m is not None and m.target_node == layout.host:
        core = m.target_core

    if o is not None and o.power is PowerState.MIGRATING:
        return  # in flight: only the migration logic may touch it
    if m is None and o is not None and o.power is not PowerState.ABSENT and o.metadata.get(META_NODE) != layout.host:
        # desired state puts it here and no move is under way: it is ours (it arrived with another node's
        # name, or was made by hand); a VM a migration is still bringing is claimed once vmctld confirmed it
        add(_P_PIN, Claim(name, _meta(v, layout, core)))

    power = o.power if o is not None else PowerState.ABSENT
    want = v.power
    pin = _pinning(v, layout, core)
    have_file = bool(v.checkpoint_path) and v.checkpoint_path in obs.files

    if want is PowerState.ABSENT:
        if power is PowerState.ABSENT:
            return
        if power in (PowerState.RUNNING, PowerState.PAUSED, PowerState.CRASHED):
            add(_P_STOP, Stop(name))
        add(_P_UNDEFINE, Undefine(name))
        return

    if want is PowerState.SAVED:
        if power in (PowerState.RUNNING, PowerState.PAUSED):
            add(_P_STOP, CheckpointVm(name, v.checkpoint_path or ""))
        return

    # running, paused or shutoff wanted: the VM must exist with the right pinning and tuning
    if power is PowerState.ABSENT:
        if want is not PowerState.SHUTOFF and have_file and v.checkpoint_path:
            add(_P_START, RestoreVm(name, v.checkpoint_path, _meta(v, layout, core)))
            return  # pinned and tuned in the next pass, once it exists
        add(_P_DEFINE, Define(layout.spec_for(v)))
        _tune(v, None, pin, add, new=True, held=_held_weights(obs))
        if want is not PowerState.SHUTOFF:
            add(_P_START, Start(name))
        if want is PowerState.PAUSED:
            add(_P_PAUSE, Suspend(name))
        return

    assert o is not None
    _tune(v, o, pin, add, new=False, held=_held_weights(obs))
    if want is PowerState.SHUTOFF:
        if power in (PowerState.RUNNING, PowerState.PAUSED, PowerState.CRASHED):
            add(_P_STOP, Stop(name))
        return
    # running or paused wanted
    if power is PowerState.CRASHED:
        add(_P_STOP, Stop(name))
        add(_P_START, Start(name))
    elif power is PowerState.SAVED or power is PowerState.SHUTOFF:
        if have_file and v.checkpoint_path:
            add(_P_START, RestoreVm(name, v.checkpoint_path, _meta(v, layout, core)))
        else:
            add(_P_START, Start(name))
    elif power is PowerState.PAUSED and want is PowerState.RUNNING:
        add(_P_RESUME, Resume(name))
    if want is PowerState.PAUSED and power in (PowerState.RUNNING, PowerState.SHUTOFF, PowerState.SAVED,
                                                PowerState.CRASHED):
        add(_P_PAUSE, Suspend(name))
    if power is PowerState.RUNNING:
        _plan_process(v, obs.processes.get(name), add)


def _meta(v: VmDesired, layout: Layout, core: int) -> tuple[tuple[str, str], ...]:
    """The vmctl metadata of ``v`` on this node, on local core ``core``."""
    spec = layout.spec_for(v if core == v.core else replace(v, core=core))
    # the forwarded SSH port is the domain's own (fixed when it was defined, maybe not its slot's): never rewritten
    return tuple(sorted((k, x) for k, x in spec.metadata.items() if k != META_SSH_PORT))


def _held_weights(obs: Observed) -> dict[int, int]:
    """Physical core -> the weight of a VM being stopped there (the lowest, when several): no other VM of
    that core is raised to it until the stop ended, so a core never has two VMs at the fg weight (a stop
    runs off the reconcile pass: the stopping VM keeps its weight meanwhile)."""
    held: dict[int, int] = {}
    for name in obs.stopping:
        o = obs.vms.get(name)
        if o is None or not o.pinned_cores or o.weight is None:
            continue
        for c in o.pinned_cores:
            held[c] = min(held.get(c, o.weight), o.weight)
    return held


def _tune(v: VmDesired, o: VmInfo | None, pin: tuple[int, ...] | None, add: _Adder, new: bool,
          held: Mapping[int, int] | None = None) -> None:
    if pin is not None and (o is None or o.pinned_cores != pin):
        add(_P_PIN, Pin(v.name, pin))
    cur_w = None if o is None else o.weight
    cur_c = None if o is None else o.cap
    weight = v.weight if cur_w != v.weight else None
    cap_change = False
    clear = False
    if v.cap is None:
        clear = cur_c is not None
    else:
        cap_change = cur_c is None or abs(cur_c - v.cap) > CAP_TOLERANCE
    if weight is None and not cap_change and not clear and not new:
        return
    if new and weight is None and not cap_change:
        weight = v.weight
    if held and weight is not None and pin is not None and (cur_w is None or weight > cur_w) \
            and any(weight >= held[c] for c in pin if c in held):
        weight = None  # waits for the stop on its core (``_held_weights``); planned again once it ended
        if not cap_change and not clear:
            return
    lowering = cur_w is not None and weight is not None and weight < cur_w
    phase = _P_LOWER if (lowering or (weight is None and not new)) else _P_RAISE
    add(phase, Tune(v.name, weight=weight, cap=v.cap if cap_change else None, clear_cap=clear))


def _plan_process(v: VmDesired, s: ProcessStatus | None, add: _Adder) -> None:
    p = v.process
    if p is None:
        if s is not None and s.running:
            add(_P_KILL, KillProcess(v.name))
        return
    if s is None:
        add(_P_PROCESS, StartProcess(v.name, p))
        return
    if (s.job_id, s.index) == (p.job_id, p.index):
        return  # running, or ended: its exit status is reported, never restarted
    if s.running:
        add(_P_KILL, KillProcess(v.name))
    add(_P_PROCESS, StartProcess(v.name, p))


def _plan_migration_source(v: VmDesired, o: VmInfo | None, obs: Observed, peers: Mapping[str, str],
                           migrate_uris: Mapping[str, str], add: _Adder, transfer: bool = False) -> None:
    m = v.migration
    assert m is not None
    name = v.name
    status = obs.migrations.get(name)
    if o is None or o.power is PowerState.ABSENT:
        return  # it left (or never was here): never re-create a VM on the source
    if m.phase == "aborted":
        if status is not None and status.state is MigrationState.RUNNING:
            add(_P_KILL, AbortMigration(name))
        return
    if m.mode == "checkpoint":
        if o.power in (PowerState.RUNNING, PowerState.PAUSED) and v.checkpoint_path:
            add(_P_STOP, CheckpointVm(name, v.checkpoint_path))
        elif (transfer and v.checkpoint_path and o.power in (PowerState.SAVED, PowerState.SHUTOFF)
              and v.checkpoint_path in obs.files and v.checkpoint_path not in obs.transferred):
            add(_P_MIGRATE, TransferCheckpoint(name, v.checkpoint_path, m.target_node))
        return
    if o.power is PowerState.MIGRATING:
        return
    if status is not None and status.state is MigrationState.FAILED:
        return  # reported; the daemon decides (retry with a new migration id, or give up)
    if o.power is PowerState.PAUSED and v.power is PowerState.RUNNING:
        # a live migration needs the VM running: a gang VM paused by its row's slice just before the
        # migration was ordered (its row inactive, the rows it leaves never scheduled again) would wait
        # for ever; it runs until it has left (``Layout.shape`` keeps a migrating VM's desired power)
        add(_P_RESUME, Resume(name))
        return
    if o.power is PowerState.RUNNING and m.target_node in peers:
        add(_P_MIGRATE, StartMigration(name, peers[m.target_node], migrate_uris.get(m.target_node), node=m.target_node))


__all__ = [
    "AbortMigration", "Action", "CheckpointVm", "Claim", "Define", "KillProcess", "Observed", "Pin", "RestoreVm",
    "Resume", "Start", "StartMigration", "StartProcess", "Stop", "Suspend", "TransferCheckpoint", "Tune", "Undefine",
    "accept", "plan", "refusal_reason", "validate",
]
