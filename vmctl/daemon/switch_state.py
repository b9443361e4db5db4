"""What vmctld keeps about the cluster's host layout and a policy switch in progress (kv entries), and
the layout a policy is laid out in. The switch itself (drain, re-lay out, switch) is
``vmctl.daemon.switch``; this module has no daemon state, so ``vmctl.daemon.base`` loads it at start.

- kv ``cluster.layout`` (``{"discipline": ..., "levels": N}``): the VM level layout vmctld wants on every
  node (``ClusterState.cluster_layout``); absent until vmctld first lays the cluster out (the agents'
  ``layout:`` configs decide until then, as before this existed).
- kv ``policy.switch``: the switch in progress (``SwitchRecord``: the new policy and its parameters, the
  layout it needs, the policy and layout before, when it began); null when none. Written in the
  transaction that starts, completes or cancels the switch, so a vmctld killed mid-switch resumes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vmctl.errors import PolicyParameterError, ValidationError
from vmctl.model import MAX_LAYOUT_LEVELS, NodeLayout
from vmctl.policies.base import SchedulingPolicy
from vmctl.wire import layout_from_json, layout_to_json

LAYOUT_KV = "cluster.layout"
SWITCH_KV = "policy.switch"

__all__ = ["LAYOUT_KV", "SWITCH_KV", "SwitchRecord", "layout_from_kv", "layout_to_json", "policy_layout",
           "switch_from_kv"]


def policy_layout(policy: SchedulingPolicy) -> NodeLayout:
    """The layout the cluster is laid out in for ``policy`` (``Needs.layout``); a policy that needs more
    levels than an agent carries is refused naming its parameter (``mpl``) or its needs."""
    try:
        return policy.needs.layout()
    except ValidationError as exc:
        param = "mpl" if "mpl" in policy.params else "needs"
        raise PolicyParameterError(policy=policy.name, param=param,
                                   problem=f"needs {policy.needs.levels} VM levels per core, but an agent carries "
                                           f"at most {MAX_LAYOUT_LEVELS} (layout.levels)") from exc


def layout_from_kv(raw: Any) -> NodeLayout | None:
    """A stored layout (None when none is stored, or it is unreadable: vmctld then lays out nothing)."""
    if not isinstance(raw, dict):
        return None
    try:
        return layout_from_json(raw, "layout.")
    except ValidationError:
        return None


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """A policy switch in progress: to ``policy`` (``params``) on ``layout``, from ``from_policy`` on
    ``from_layout`` (what the nodes had; where a cancel takes them back), begun at ``started``."""

    policy: str
    params: dict[str, Any]
    layout: NodeLayout
    from_policy: str | None
    from_params: dict[str, Any] = field(default_factory=dict)
    from_layout: NodeLayout | None = None
    started: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "params": dict(self.params), "layout": layout_to_json(self.layout),
                "from_policy": self.from_policy, "from_params": dict(self.from_params),
                "from_layout": None if self.from_layout is None else layout_to_json(self.from_layout),
                "started": self.started}


def switch_from_kv(raw: Any) -> SwitchRecord | None:
    """The stored switch (None when none is in progress, or what is stored cannot be read)."""
    if not isinstance(raw, dict):
        return None
    layout = layout_from_kv(raw.get("layout"))
    name, params = raw.get("policy"), raw.get("params")
    if layout is None or not isinstance(name, str) or not isinstance(params, dict):
        return None
    frm = raw.get("from_policy")
    frm_params = raw.get("from_params")
    started = raw.get("started")
    return SwitchRecord(policy=name, params=params, layout=layout, from_policy=frm if isinstance(frm, str) else None,
                        from_params=frm_params if isinstance(frm_params, dict) else {},
                        from_layout=layout_from_kv(raw.get("from_layout")),
                        started=float(started) if isinstance(started, int | float) else 0.0)
