"""The core layout of one host: one VM per (core, level) (MEASY paper, sec. 2.1, for two levels).

Levels and disciplines. ``levels`` (L, 1 .. ``MAX_LEVELS``) is the number of VM levels per core the
host carries and ``discipline`` how they share the core (``vmctl.model.Discipline``; both come from
the agent config and are registered with vmctld):

- ``priority``: level 0 at ``fg_weight``, level L-1 at ``bg_weight``, the levels between at weights
  spaced geometrically in between (each level far above the next: 10000, 100, 1 for L = 3), so a
  level only gets the cycles the levels above it leave idle. L = 2 is the MEASY fg/bg pair (fg_weight,
  bg_weight), exactly as it always was. The weights of job VMs come from desired state (vmctld's
  ``vm.fg_weight``/``vm.bg_weight``) and must decrease with the level on every core.
- ``timeslice`` (gang scheduling): level k is row k of the Ousterhout matrix; one row is *active*
  (``active_row``, switched by ``Reconciler.switch_row``): its VMs run at ``fg_weight``; the VMs of
  the other rows are paused (``inactive: pause``, the default) or, with ``inactive: soak``, keep
  running at ``bg_weight`` and soak up the cycles the active row leaves idle. The agent sets these
  weights and power states itself (``shape``), for its placeholders and for job VMs alike; a VM that
  desired state wants paused, saved, absent or migrating is left as desired.
- ``shared`` (paper 001: several workers per machine): L workers of equal weight (``fg_weight``).

Placeholders: idle VMs on every (core, level) even when no job runs there, under ``priority`` (a job
starts in a booted VM, a promote is a live weight swap) and ``timeslice`` (a row switch only pauses
and resumes VMs that exist: nothing is booted or destroyed at a slice boundary); not under ``shared``
(workers, like vcsched's capped shared VMs, come and go with desired state).

Memory: the layout's L x C VMs of ``memory_mib`` each must fit in the host's memory
(``memory_problem``; under ``shared`` that is the most the workers can take): an agent refuses a
layout it cannot hold.

Cores: ``VmDesired.core`` is the *local* index k in 0..C-1 (the cluster's ``local_core``); the
layout maps it to the physical core ``cores[k]`` (the host may keep some cores for itself).

Names: ``naming`` is a pattern with ``{host}``, ``{core}`` (local index) and ``{tier}`` (the level's
name: ``fg``, ``bg``, then ``bg2`` ... under priority; ``r0``, ``r1`` ... rows under timeslice; ``w0``,
``w1`` ... workers under shared), default ``{host}-c{core}-{tier}``. ``{tier}`` is the VM's *home*
level: after a promote the VM named ``...-bg`` runs at the fg weight (its role in desired state says
which tier it is in now). VMs also carry metadata (``vmctl.node``, ``vmctl.role``, ``vmctl.core``,
``vmctl.level``) so an agent adopts them by name or by metadata after a restart.

Guests that run job processes (libvirt; ``vmctl/guestimage.py``): ``kernel``/``initrd``/
``cmdline`` boot every VM of the layout directly, such a VM gets at least ``memory_mib`` whatever its job
asked for, and ``ssh_ports`` forwards loopback port ``ssh_ports + k * levels + level`` to the SSH port of
the VM on (local core k, level), whatever vmctld named it; the port also goes into the VM's metadata
(``vmctl.ssh_port``), where the agent's SSH runner looks it up. A VM keeps its port when its role
changes (a promoted bg VM), so the plan gives a VM defined on a slot whose port another VM still holds
the lowest free port of the range instead (``plan._free_ssh_ports``).

Shared VMs (vcsched's capped, unpinned VMs: core -1, no (core, level) slot) have no slot port. With
``shared_ssh_ports`` (first port) and ``shared_ssh_count`` (how many) the layout has a second range for
them, ``shared_ssh_ports .. shared_ssh_ports + shared_ssh_count - 1``, which must not overlap the slots'
range: the plan gives each shared VM it defines the lowest port of that range no VM of the host holds
(held = named by a VM's ``vmctl.ssh_port`` metadata, so an agent that restarts adopts its VMs' ports and
a VM that is undefined frees its own). When every port of the range is held, the VM is not defined and
the agent reports why (``Define.problem``) until one is released.

Example: host ``n1``, cores (2, 3) -> VMs n1-c0-fg (core 2, weight 10000), n1-c0-bg (core 2,
weight 1), n1-c1-fg (core 3, weight 10000), n1-c1-bg (core 3, weight 1). The same host as a timeslice
layout of 3 rows with row 1 active: n1-c0-r0 (paused, weight 1), n1-c0-r1 (running, weight 10000),
n1-c0-r2 (paused, weight 1), and the same on core 1.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, replace

from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN, VmSpec
from vmctl.errors import OutOfRange, ValidationError
from vmctl.model import MAX_LAYOUT_LEVELS, Discipline, Tier, tier_of_level
from vmctl.nodedoc import NodeDesired, PowerState, VmDesired, VmRole

META_NODE = "vmctl.node"
META_ROLE = "vmctl.role"
META_CORE = "vmctl.core"
META_LEVEL = "vmctl.level"
META_MANAGED = "vmctl.managed"
META_SSH_PORT = "vmctl.ssh_port"  # the loopback port forwarded to the guest's SSH (layout.ssh_ports)

DEFAULT_NAMING = "{host}-c{core}-{tier}"

#: most VM levels per core an agent carries: gang scheduling's multiprogramming levels are small (the
#: gang-scheduling paper's matrices have a handful of rows), and every level is a VM on every core
MAX_LEVELS = MAX_LAYOUT_LEVELS

#: what the VMs of a timeslice layout's inactive rows do: stay paused, or run at the lowest weight
INACTIVE_MODES = ("pause", "soak")


def check_naming(pattern: str) -> str | None:
    """Return a problem with a naming pattern, or None when it is usable."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None}
    except ValueError as exc:
        return f"not a valid pattern: {exc}"
    unknown = fields - {"host", "core", "tier"}
    if unknown:
        return f"unknown field(s) {', '.join('{' + f + '}' for f in sorted(unknown))}; use {{host}}, {{core}}, {{tier}}"
    if not {"core", "tier"} <= fields:
        return "must contain {core} and {tier} so that every VM gets its own name"
    sample = pattern.format(host="h", core=0, tier="fg")
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", sample):
        return f"gives names like {sample!r}: use letters, digits and _ . + - only"
    return None


def level_weights(levels: int, top: int, bottom: int) -> tuple[int, ...]:
    """Priority weights of ``levels`` levels from ``top`` (level 0) down to ``bottom`` (level L-1),
    geometrically spaced and strictly decreasing (``top - bottom >= levels - 1`` is required)."""
    if levels == 1:
        return (top,)
    out: list[int] = []
    for k in range(levels):
        w = round(top * (bottom / top) ** (k / (levels - 1)))
        # strictly below the level above, and room left for the levels below
        w = min(w, out[-1] - 1) if out else top
        out.append(max(w, bottom + (levels - 1 - k)))
    return tuple(out)


def memory_problem(levels: int, cores: int, memory_mib: int, host_memory_mib: int) -> str | None:
    """Why a host of ``host_memory_mib`` cannot hold a layout of ``levels`` x ``cores`` VMs of
    ``memory_mib`` each, or None when it can."""
    need = levels * cores * memory_mib
    if need > host_memory_mib:
        return (f"{levels} levels x {cores} cores x {memory_mib} MiB = {need} MiB of VMs do not fit in the "
                f"host's {host_memory_mib} MiB: lower layout.levels or layout.memory_mib, or manage fewer cores")
    return None


@dataclass(frozen=True, slots=True)
class Layout:
    host: str
    cores: tuple[int, ...]
    naming: str = DEFAULT_NAMING
    fg_weight: int = WEIGHT_MAX
    bg_weight: int = WEIGHT_MIN
    memory_mib: int = 64
    image: str | None = None
    levels: int = 2
    #: idle placeholder VMs on every (core, level); None: where the discipline needs them (priority,
    #: timeslice; not shared)
    placeholders: bool | None = None
    discipline: Discipline = Discipline.PRIORITY
    inactive: str = "pause"  # timeslice: the inactive rows' VMs are paused, or "soak" at the lowest weight
    #: guests that run job processes over SSH (vmctl/guestimage.py): direct kernel boot ...
    kernel: str | None = None
    initrd: str | None = None
    cmdline: str = ""
    #: ... and a loopback port per VM forwarded to its port 22: ssh_ports + k * levels + level for the VM of
    #: local core k on that level (None: no network)
    ssh_ports: int | None = None
    #: ... and a second range for shared VMs (no slot): ``shared_ssh_count`` ports from ``shared_ssh_ports``,
    #: the lowest free one given to each shared VM the agent defines (``plan._free_ssh_ports``; None: none)
    shared_ssh_ports: int | None = None
    shared_ssh_count: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.levels <= MAX_LEVELS:
            raise OutOfRange(what="layout.levels", value=self.levels, allowed=f"1..{MAX_LEVELS}")
        if not self.cores:
            raise ValidationError(field="layout.cores", problem="must list at least one core")
        if len(set(self.cores)) != len(self.cores) or min(self.cores) < 0:
            raise ValidationError(field="layout.cores", problem=f"must be distinct non-negative ids, got {self.cores}")
        for what, w in (("fg_weight", self.fg_weight), ("bg_weight", self.bg_weight)):
            if not WEIGHT_MIN <= w <= WEIGHT_MAX:
                raise OutOfRange(what=f"layout.{what}", value=w, allowed=f"{WEIGHT_MIN}..{WEIGHT_MAX}")
        if self.fg_weight <= self.bg_weight:
            raise ValidationError(field="layout.fg_weight",
                                  problem=f"must exceed bg_weight ({self.fg_weight} <= {self.bg_weight})")
        if self.discipline is Discipline.PRIORITY and self.fg_weight - self.bg_weight < self.levels - 1:
            raise ValidationError(field="layout.fg_weight",
                                  problem=f"{self.levels} priority levels need {self.levels} distinct weights "
                                          f"between bg_weight {self.bg_weight} and fg_weight {self.fg_weight}")
        if self.inactive not in INACTIVE_MODES:
            raise ValidationError(field="layout.inactive",
                                  problem=f"must be {' or '.join(INACTIVE_MODES)}, got {self.inactive!r}")
        problem = check_naming(self.naming)
        if problem:
            raise ValidationError(field="layout.naming", problem=problem)
        if self.memory_mib < 1:
            raise OutOfRange(what="layout.memory_mib", value=self.memory_mib, allowed=">= 1")
        if self.ssh_ports is not None and not 1024 <= self.ssh_ports <= 65536 - self.levels * len(self.cores):
            raise OutOfRange(what="layout.ssh_ports", value=self.ssh_ports,
                             allowed=f"1024..{65536 - self.levels * len(self.cores)} (one port per VM of "
                                     f"{self.levels} levels x {len(self.cores)} cores)")
        problem = self.shared_ports_problem()
        if problem is not None:
            raise ValidationError(field="layout.shared_ssh_ports", problem=problem)
        if self.placeholders is None:
            object.__setattr__(self, "placeholders", self.discipline is not Discipline.SHARED)

    @property
    def size(self) -> int:
        return len(self.cores)

    @property
    def slot_ports(self) -> range:
        """The slots' forwarded SSH ports (empty without ``ssh_ports``)."""
        if self.ssh_ports is None:
            return range(0)
        return range(self.ssh_ports, self.ssh_ports + self.levels * self.size)

    @property
    def shared_ports(self) -> range:
        """The shared VMs' forwarded SSH ports (empty without ``shared_ssh_ports``)."""
        if self.shared_ssh_ports is None:
            return range(0)
        return range(self.shared_ssh_ports, self.shared_ssh_ports + self.shared_ssh_count)

    def shared_ports_problem(self) -> str | None:
        """Why the shared VMs' port range is unusable (out of 1024..65535, or overlapping the slots'
        range, which has one port per VM of levels x cores), or None."""
        if self.shared_ssh_ports is None:
            return None
        if self.shared_ssh_count < 1:
            return f"shared_ssh_count must be >= 1, got {self.shared_ssh_count}"
        return port_ranges_problem(self.shared_ssh_ports, self.shared_ssh_count, self.ssh_ports,
                                   self.levels * self.size)

    def port_text(self) -> str:
        """The forwarded SSH port ranges, for logs and ``vmctl config check`` (empty without any)."""
        parts = []
        if self.slot_ports:
            parts.append(f"slots {self.slot_ports.start}-{self.slot_ports.stop - 1}")
        if self.shared_ports:
            parts.append(f"shared VMs {self.shared_ports.start}-{self.shared_ports.stop - 1}")
        return ", ".join(parts)

    def level_name(self, level: int) -> str:
        """The ``{tier}`` of a level's VMs: fg, bg, bg2 ... (priority), r0 ... (timeslice), w0 ... (shared)."""
        if self.discipline is Discipline.TIMESLICE:
            return f"r{level}"
        if self.discipline is Discipline.SHARED:
            return f"w{level}"
        return Tier.FG.value if level == 0 else Tier.BG.value if level == 1 else f"bg{level}"

    def vm_name(self, core: int, tier: Tier | str | int) -> str:
        """The name of the VM of ``core`` on a level (its number, or fg/bg for levels 0/1)."""
        self.physical(core)
        level = tier if isinstance(tier, int) else 0 if Tier(tier) is Tier.FG else 1
        return self.naming.format(host=self.host, core=core, tier=self.level_name(level))

    def physical(self, core: int) -> int:
        """Physical core id of local core ``core``."""
        if not 0 <= core < len(self.cores):
            raise OutOfRange(what="core", value=core, allowed=f"0..{len(self.cores) - 1} on {self.host}")
        return self.cores[core]

    def local(self, physical: int) -> int | None:
        try:
            return self.cores.index(physical)
        except ValueError:
            return None

    @property
    def weights(self) -> tuple[int, ...]:
        """The weight of each level in the bare layout (timeslice: with row 0 active)."""
        if self.discipline is Discipline.PRIORITY:
            return level_weights(self.levels, self.fg_weight, self.bg_weight)
        if self.discipline is Discipline.SHARED:
            return (self.fg_weight,) * self.levels
        return tuple(self.fg_weight if k == 0 else self.bg_weight for k in range(self.levels))

    def level_vm(self, core: int, level: int) -> VmDesired:
        """The idle placeholder VM of one (core, level)."""
        return VmDesired(name=self.vm_name(core, level), core=core, role=_role(level),
                         weight=self.weights[level], memory_mib=self.memory_mib,
                         level=level if level > 1 or self.discipline is not Discipline.PRIORITY else -1)

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """The priority names of a core's first two levels (fg, then bg), as far as the layout has them."""
        return (Tier.FG, Tier.BG)[: self.levels]

    def pair_vms(self) -> list[VmDesired]:
        """The idle placeholder VMs of the bare layout (no processes): one per (core, level), level 0
        first on each core, when the layout keeps placeholders; none otherwise."""
        if not self.placeholders:
            return []
        return [self.level_vm(k, lvl) for k in range(self.size) for lvl in range(self.levels)]

    def base_desired(self, generation: int = 0) -> NodeDesired:
        return NodeDesired(node=self.host, generation=generation, vms=tuple(self.pair_vms()))

    def complete(self, desired: NodeDesired) -> NodeDesired:
        """Add the layout's placeholder VMs that ``desired`` leaves out (by name, and only where the
        core's slot of that level is not taken by another VM), so the L x C VMs always exist."""
        names = {v.name for v in desired.vms}
        taken = {(v.core, lv) for v in desired.vms if v.slot_level is not None for lv in (v.slot_level, *v.replicas)}
        extra = []
        for vm in self.pair_vms():
            if vm.name not in names and (vm.core, vm.slot_level) not in taken:
                extra.append(vm)
        if not extra:
            return desired
        return replace(desired, vms=desired.vms + tuple(extra))

    def row_state(self, level: int, active_row: int) -> tuple[PowerState, int]:
        """Timeslice: the power state and weight of a running VM of row ``level`` while ``active_row``
        is active."""
        if level == active_row:
            return PowerState.RUNNING, self.fg_weight
        return (PowerState.PAUSED if self.inactive == "pause" else PowerState.RUNNING), self.bg_weight

    def shape(self, desired: NodeDesired, active_row: int = 0) -> NodeDesired:
        """The discipline's weights and power states on the level VMs of ``desired`` (a completed
        document): timeslice rows by ``active_row``, shared workers at one weight; priority as desired.
        A VM desired state does not want running (paused, saved, absent) or that is migrating keeps
        what desired state says."""
        if self.discipline is Discipline.PRIORITY:
            return desired
        if not 0 <= active_row < self.levels:
            raise OutOfRange(what="active row", value=active_row, allowed=f"0..{self.levels - 1} on {self.host}")
        vms: list[VmDesired] = []
        for v in desired.vms:
            level = v.slot_level
            moving = v.migration is not None and v.migration.phase in ("requested", "running")
            if level is not None and v.power is PowerState.RUNNING and not moving:
                if self.discipline is Discipline.SHARED:
                    v = replace(v, weight=self.fg_weight)
                else:  # a replicated VM runs while any of its rows is active
                    power, weight = self.row_state(active_row if active_row in v.replicas else level, active_row)
                    v = replace(v, power=power, weight=weight)
            vms.append(v)
        return replace(desired, vms=tuple(vms))

    def spec_for(self, vm: VmDesired) -> VmSpec:
        meta = {META_MANAGED: "1", META_NODE: self.host, META_ROLE: vm.role.value, META_CORE: str(vm.core)}
        if vm.level >= 0:  # a level the role does not imply (fg/bg VMs look as they always did)
            meta[META_LEVEL] = str(vm.level)
        level = vm.slot_level
        port = self.ssh_port(vm.core, level) if level is not None else None
        if port is not None:  # the runner finds the guest's address here (job VMs have vmctld's names)
            meta[META_SSH_PORT] = str(port)
        # a guest that boots a kernel needs its memory whatever the job asked for (vmctld's default is 64 MiB,
        # in which the Debian kernel and initramfs of vmctl/guestimage.py do not even start): the layout's is the floor
        memory = max(vm.memory_mib, self.memory_mib) if self.kernel is not None else vm.memory_mib
        return VmSpec(name=vm.name, vcpus=1, memory_mib=memory, image=self.image, metadata=meta,
                      kernel=self.kernel, initrd=self.initrd, cmdline=self.cmdline, ssh_port=port)

    def ssh_port(self, core: int, level: int) -> int | None:
        """The loopback port forwarded to the SSH port of the VM on (local ``core``, ``level``); None
        without ``ssh_ports``."""
        if self.ssh_ports is None or not 0 <= core < self.size or not 0 <= level < self.levels:
            return None
        return self.ssh_ports + core * self.levels + level

    def is_ours(self, name: str, metadata: dict[str, str]) -> bool:
        """True for VMs this agent manages: our metadata, or a (core, level) name of this layout. A VM
        whose metadata names another node is that node's: on a hypervisor several agents share (the
        libvirt demo, the task-bag testbed) it belongs to a live agent, and one that came here by
        migration names this node from its arrival (the source rewrites it: ``StartMigration.node``)."""
        if metadata.get(META_NODE) == self.host and metadata.get(META_MANAGED) == "1":
            return True
        return self.is_level_name(name)

    def is_level_name(self, name: str) -> bool:
        """True for the name of one of this layout's (core, level) VMs (a placeholder's, when idle)."""
        return any(name == self.vm_name(k, lvl) for k in range(self.size) for lvl in range(self.levels))


def port_ranges_problem(shared_first: int, shared_count: int, slot_first: int | None, slots: int) -> str | None:
    """Why the shared VMs' SSH port range (``shared_count`` ports from ``shared_first``) cannot be used beside
    the slots' (``slots`` ports from ``slot_first``; None: no slot range), or None when it can."""
    last = shared_first + shared_count - 1
    if shared_first < 1024 or last > 65535:
        return f"{shared_first}..{last} ({shared_count} ports, layout.shared_ssh_count) must lie within 1024..65535"
    if slot_first is not None and shared_first <= slot_first + slots - 1 and slot_first <= last:
        return (f"{shared_first}..{last} overlaps layout.ssh_ports {slot_first}..{slot_first + slots - 1} (one port "
                f"per (core, level) slot): start the shared range at {slot_first + slots} or end it below "
                f"{slot_first}")
    return None


def _role(level: int) -> VmRole:
    """The role of a level VM: the priority discipline's tier name of its level."""
    return VmRole.FG if tier_of_level(level) is Tier.FG else VmRole.BG


__all__ = ["DEFAULT_NAMING", "INACTIVE_MODES", "MAX_LEVELS", "META_CORE", "META_LEVEL", "META_MANAGED", "META_NODE",
           "META_ROLE", "Layout", "check_naming", "level_weights", "memory_problem", "port_ranges_problem"]
