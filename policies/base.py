"""The SchedulingPolicy interface: ``decide(view, now) -> Decision``.

The daemon calls ``decide`` on every event (submission, completion, node change, operator change,
tick, or the ``wake_at`` a previous decision asked for); the simulator calls it at every instant
where something happened, after all completions and arrivals of that instant. The result is checked
by ``vmctl.policies.invariants.check_decision`` in both.

A policy object may hold configuration (thresholds, costs, a seed) but no state that changes between
calls: everything it needs about the cluster is in the view. That makes a policy result in the
simulator a claim about the daemon, and lets the daemon restart at any point.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from vmctl.errors import PolicyParameterError
from vmctl.model import ClusterView, Decision

PolicyParams = Mapping[str, Any]


class SchedulingPolicy(ABC):
    #: registry name, lower case (``easy``, ``measy``, ``mcb8`` ...)
    name: ClassVar[str] = ""
    #: one line for ``vmctl policy show`` and ``--help``
    summary: ClassVar[str] = ""
    #: parameter name -> (type, default, help); validated by ``__init__``
    parameters: ClassVar[Mapping[str, tuple[type, Any, str]]] = {}
    #: True when the policy uses the bg tier (two-tier policies)
    uses_bg_tier: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        self.params: dict[str, Any] = {}
        for key, value in params.items():
            if key not in self.parameters:
                known = ", ".join(sorted(self.parameters)) or "none"
                raise PolicyParameterError(policy=self.name, param=key, problem=f"unknown (known: {known})")
            kind = self.parameters[key][0]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
                raise PolicyParameterError(
                    policy=self.name, param=key, problem=f"must be {kind.__name__}, got {value!r}"
                )
            self.params[key] = value
        for key, (_kind, default, _help) in self.parameters.items():
            self.params.setdefault(key, default)
        self.validate_params()

    def validate_params(self) -> None:
        """Override to check ranges; raise PolicyParameterError."""
        return None

    @abstractmethod
    def decide(self, view: ClusterView, now: float) -> Decision:
        """Return the actions to take now. Must not mutate or retain ``view``."""

    def cannot_act(self, view: ClusterView) -> bool:
        """A cheap, pure test that lets a caller skip ``decide`` when it cannot change anything.

        Contract: True only if ``decide(view, now)`` would return a Decision with no actions and no
        ``wake_at`` for every ``now``. Its reasons, default reason and reservation are not covered:
        a caller that needs them (the daemon reports waiting reasons) must call ``decide`` anyway.
        The default, False, is always correct; override only with a proof. Must not mutate or
        retain ``view``."""
        return False

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "summary": self.summary, "params": dict(self.params)}
