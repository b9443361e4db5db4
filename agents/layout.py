"""The core layout of one host: one VM per (core, level) (MEASY paper, sec. 2.1, for two levels).

Levels and placeholders. ``levels`` is the number of VM levels per core the host carries (the
cluster's ``ClusterView.levels``); this agent supports the priority discipline's fg (level 0) and bg
(level 1) VMs, so 1 or 2. ``placeholders`` says whether the agent keeps an idle VM on every (core,
level) even when no job runs there: the priority discipline needs them (a job starts in a booted VM,
a promote is a live weight swap); the ``shared`` discipline does not (its workers and vcsched's
capped shared VMs come and go with desired state). Gang rows (``timeslice``, L > 2) need row VMs in
desired state and are not supported by this agent yet.

For a host with C managed physical cores the agent keeps 2C single-VCPU VMs: on core k a foreground
VM and a background VM, both pinned to core k. The fg VM runs at the highest weight, the bg VM at the
lowest, so the bg VM only gets the cycles the fg VM leaves idle. Promote/demote swaps the two weights
live, without a restart; caps can be set live too (Casanova et al., sec. 2 and 7: fractional shares
by caps). Besides the core pairs a host may carry ``VmRole.SHARED`` VMs (vcsched): capped VMs,
pinned or not.

Cores: ``VmDesired.core`` is the *local* index k in 0..C-1 (the cluster's ``local_core``); the
layout maps it to the physical core ``cores[k]`` (the host may keep some cores for itself).

Names: ``naming`` is a pattern with ``{host}``, ``{core}`` (local index) and ``{tier}`` (fg/bg),
default ``{host}-c{core}-{tier}``. ``{tier}`` is the VM's *home* tier: after a promote the VM named
``...-bg`` runs at the fg weight (its role in desired state says which tier it is in now). VMs also
carry metadata (``vmctl.node``, ``vmctl.role``, ``vmctl.core``) so an agent adopts them by name or by
metadata after a restart.

Example: host ``n1``, cores (2, 3) -> VMs n1-c0-fg (core 2, weight 10000), n1-c0-bg (core 2,
weight 1), n1-c1-fg (core 3, weight 10000), n1-c1-bg (core 3, weight 1).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, replace

from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN, VmSpec
from vmctl.errors import OutOfRange, ValidationError
from vmctl.model import NodeDesired, Tier, VmDesired, VmRole

META_NODE = "vmctl.node"
META_ROLE = "vmctl.role"
META_CORE = "vmctl.core"
META_MANAGED = "vmctl.managed"

DEFAULT_NAMING = "{host}-c{core}-{tier}"


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
    placeholders: bool = True

    def __post_init__(self) -> None:
        if self.levels not in (1, 2):
            raise OutOfRange(what="layout.levels", value=self.levels, allowed="1..2 (fg, bg)")
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
        problem = check_naming(self.naming)
        if problem:
            raise ValidationError(field="layout.naming", problem=problem)
        if self.memory_mib < 1:
            raise OutOfRange(what="layout.memory_mib", value=self.memory_mib, allowed=">= 1")

    @property
    def size(self) -> int:
        return len(self.cores)

    def vm_name(self, core: int, tier: Tier | str) -> str:
        self.physical(core)
        return self.naming.format(host=self.host, core=core, tier=Tier(tier).value)

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

    def weight_of(self, role: VmRole) -> int:
        return self.fg_weight if role is VmRole.FG else self.bg_weight

    def pair_vm(self, core: int, tier: Tier) -> VmDesired:
        role = VmRole.FG if tier is Tier.FG else VmRole.BG
        return VmDesired(name=self.vm_name(core, tier), core=core, role=role, weight=self.weight_of(role),
                         memory_mib=self.memory_mib)

    @property
    def tiers(self) -> tuple[Tier, ...]:
        """The levels of each core, by their priority names (fg, then bg)."""
        return (Tier.FG, Tier.BG)[: self.levels]

    def pair_vms(self) -> list[VmDesired]:
        """The idle placeholder VMs of the bare layout (no processes): one per (core, level), fg before
        bg on each core, when the layout keeps placeholders; none otherwise."""
        if not self.placeholders:
            return []
        return [self.pair_vm(k, t) for k in range(self.size) for t in self.tiers]

    def base_desired(self, generation: int = 0) -> NodeDesired:
        return NodeDesired(node=self.host, generation=generation, vms=tuple(self.pair_vms()))

    def complete(self, desired: NodeDesired) -> NodeDesired:
        """Add the layout's placeholder VMs that ``desired`` leaves out (by name, and only where the
        core's slot of that role is not taken by another VM), so the L x C VMs always exist."""
        names = {v.name for v in desired.vms}
        taken = {(v.core, v.role) for v in desired.vms if v.role is not VmRole.SHARED}
        extra = []
        for vm in self.pair_vms():
            if vm.name not in names and (vm.core, vm.role) not in taken:
                extra.append(vm)
        if not extra:
            return desired
        return replace(desired, vms=desired.vms + tuple(extra))

    def spec_for(self, vm: VmDesired) -> VmSpec:
        return VmSpec(name=vm.name, vcpus=1, memory_mib=vm.memory_mib, image=self.image,
                      metadata={META_MANAGED: "1", META_NODE: self.host, META_ROLE: vm.role.value,
                                META_CORE: str(vm.core)})

    def is_ours(self, name: str, metadata: dict[str, str]) -> bool:
        """True for VMs this agent manages: our metadata, or a core-pair name of this layout."""
        if metadata.get(META_NODE) == self.host and metadata.get(META_MANAGED) == "1":
            return True
        return any(name == self.vm_name(k, t) for k in range(self.size) for t in self.tiers)


def swap_tiers(desired: NodeDesired, core: int, fg_weight: int = WEIGHT_MAX, bg_weight: int = WEIGHT_MIN,
               generation: int | None = None) -> NodeDesired:
    """Promote the bg VM of ``core`` and demote its fg VM: swap roles and weights (a live change).
    Used by the demo and tests to express a Promote/Demote in desired state."""
    fg = [v for v in desired.vms if v.core == core and v.role is VmRole.FG]
    bg = [v for v in desired.vms if v.core == core and v.role is VmRole.BG]
    if len(fg) != 1 or len(bg) != 1:
        raise ValidationError(field=f"core {core}", problem="needs exactly one fg and one bg VM to swap")
    vms = []
    for v in desired.vms:
        if v is fg[0]:
            v = replace(v, role=VmRole.BG, weight=bg_weight)
        elif v is bg[0]:
            v = replace(v, role=VmRole.FG, weight=fg_weight)
        vms.append(v)
    gen = desired.generation + 1 if generation is None else generation
    return NodeDesired(node=desired.node, generation=gen, vms=tuple(vms))


__all__ = ["DEFAULT_NAMING", "META_CORE", "META_MANAGED", "META_NODE", "META_ROLE", "Layout",
           "check_naming", "swap_tiers"]
