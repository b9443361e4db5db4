"""The policy registry: name -> class. Policy modules register themselves with ``@register``; the
registry imports the modules listed in ``_MODULES`` on first use, so adding a policy means adding its
module here."""

from __future__ import annotations

import importlib
from typing import Any, TypeVar

from vmctl.errors import UnknownPolicyError
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


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for mod in _MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            # A listed module that does not exist yet (work in progress) is skipped; any other
            # import problem inside an existing module is a bug and propagates.
            if exc.name != mod:
                raise
    _loaded = True


def available_policies() -> dict[str, type[SchedulingPolicy]]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def policy_class(name: str) -> type[SchedulingPolicy]:
    _load()
    cls = _REGISTRY.get(name.lower())
    if cls is None:
        raise UnknownPolicyError(name=name, known=", ".join(sorted(_REGISTRY)) or "none")
    return cls


def create_policy(name: str, **params: Any) -> SchedulingPolicy:
    return policy_class(name)(**params)
