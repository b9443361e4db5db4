"""The policy registry: name -> class. Policy modules register themselves with ``@register``; the
registry imports the modules listed in ``_MODULES`` on first use, so adding a policy means adding its
module here. A lookup by name imports the modules in that order only until the name is registered
(``create_policy("easy")`` does not import the vcsched MILP solver, whose scipy.optimize import costs
0.15 s); listing the policies imports them all."""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

from vmctl.errors import PolicyParameterError, UnknownPolicyError
from vmctl.policies.base import SchedulingPolicy

_MODULES: tuple[str, ...] = (
    "vmctl.policies.easy_family",
    "vmctl.policies.gang",
    "vmctl.policies.vcsched.policy",
    "vmctl.policies.dispatch_policy",
    "vmctl.policies.moldable_slots",
)

_REGISTRY: dict[str, type[SchedulingPolicy]] = {}
_loaded = False
_next_module = 0  # modules before this index of ``_MODULES`` are imported

P = TypeVar("P", bound=type[SchedulingPolicy])


def register(cls: P) -> P:
    name = cls.name.lower()
    if not name:
        raise ValueError(f"{cls.__qualname__} has no name")
    existing = _REGISTRY.get(name)
    if existing is not None and existing is not cls:
        raise ValueError(f"policy name {name!r} registered twice ({existing.__qualname__}, {cls.__qualname__})")
    _REGISTRY[name] = cls
    return cls


def _load(until: str | None = None) -> None:
    """Import the listed modules not imported yet, in order; with ``until``, stop as soon as a policy
    of that name is registered."""
    global _loaded, _next_module
    while not _loaded and not (until is not None and until in _REGISTRY):
        mod = _MODULES[_next_module]
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            # A listed module that does not exist yet (work in progress) is skipped; any other
            # import problem inside an existing module is a bug and propagates.
            if exc.name != mod:
                raise
        _next_module += 1
        _loaded = _next_module >= len(_MODULES)


def available_policies() -> dict[str, type[SchedulingPolicy]]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def policy_class(name: str) -> type[SchedulingPolicy]:
    _load(until=name.lower())
    cls = _REGISTRY.get(name.lower())
    if cls is None:
        raise UnknownPolicyError(name=name, known=", ".join(sorted(_REGISTRY)) or "none")
    return cls


def create_policy(name: str, **params: Any) -> SchedulingPolicy:
    return policy_class(name)(**params)


def parse_policy_params(policy: str, items: tuple[str, ...]) -> dict[str, Any]:
    """``k=v`` pairs (``vmctl sim -p``, ``vmctl whatif -p``), converted to the type the policy declares for ``k``."""
    cls = policy_class(policy)
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise PolicyParameterError(policy=policy, param=item, problem="expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if key not in cls.parameters:
            known = ", ".join(sorted(cls.parameters)) or "none"
            raise PolicyParameterError(policy=policy, param=key, problem=f"unknown (known: {known})")
        kind = cls.parameters[key][0]
        try:
            if kind is bool:
                low = raw.strip().lower()
                if low not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                value: Any = low in ("true", "1", "yes")
            else:
                value = kind(raw)
        except ValueError:
            raise PolicyParameterError(policy=policy, param=key,
                                       problem=f"{raw!r} is not a valid {kind.__name__}") from None
        out[key] = value
    return out
