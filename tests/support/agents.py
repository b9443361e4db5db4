"""Desired states for agent tests and benchmarks, written by hand: ``swap_tiers`` (a Promote/Demote of
one core pair, the live weight swap of docs/agent.md)."""

from __future__ import annotations

from dataclasses import replace

from vmctl.agents.backends.base import WEIGHT_MAX, WEIGHT_MIN
from vmctl.errors import ValidationError
from vmctl.nodedoc import NodeDesired, VmRole


def swap_tiers(desired: NodeDesired, core: int, fg_weight: int = WEIGHT_MAX, bg_weight: int = WEIGHT_MIN,
               generation: int | None = None) -> NodeDesired:
    """Promote the bg VM of ``core`` and demote its fg VM: swap roles and weights (a live change).
    How the agent tests and benchmarks express a Promote/Demote in desired state (vmctld's own come
    from its placement, ``vmctl.daemon``)."""
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
