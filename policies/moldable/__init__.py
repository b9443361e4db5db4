"""Moldable parallel tasks with slot time (HSRET paper, "paper 002"): the task model
(:mod:`.model`) and four policies that choose each task's width and cluster at slot boundaries:
HSRET (:mod:`.hsret`), AFCFS (:mod:`.afcfs`), ALL-EFT (:mod:`.alleft`) and CBSP (:mod:`.cbsp`).

They are pure: a :class:`.model.SlotView` in, a :class:`.model.Decision` out; the slot-stepped
simulator (``vmctl.sim.moldable``) runs them. ``make_policy(name, rng)`` builds one by name (AFCFS
draws its random cluster from ``rng``)."""

from __future__ import annotations

import numpy as np

from vmctl.errors import UnknownPolicyError
from vmctl.policies.moldable.afcfs import AFCFS
from vmctl.policies.moldable.alleft import AllEFT
from vmctl.policies.moldable.cbsp import CBSP
from vmctl.policies.moldable.hsret import HSRET
from vmctl.policies.moldable.model import MoldablePolicy

MOLDABLE_POLICIES = ("hsret", "afcfs", "all-eft", "cbsp", "hsret-afcfs", "all-eft-cap")
#: the policies that take Getnet's load ``target`` (:mod:`.hsret`)
TARGET_POLICIES = ("hsret", "hsret-afcfs", "all-eft-cap")


def make_policy(name: str, rng: np.random.Generator, target: float = 1.0, reference: bool = False) -> MoldablePolicy:
    """The policy called ``name`` (one of :data:`MOLDABLE_POLICIES`: the paper's four, HSRET starting
    from AFCFS's list (sec. 6.2.2) and the load-capped ALL-EFT); ``target`` is Getnet's load target of
    the policies in :data:`TARGET_POLICIES` (the paper's 1). ``reference``: the plain form of each
    method, which the default (faster, same decisions) is tested and benchmarked against."""
    if name not in TARGET_POLICIES and target != 1.0:
        from vmctl.errors import ValidationError

        raise ValidationError(field="target", problem=f"only {', '.join(TARGET_POLICIES)} take a load target, "
                              f"not {name}")
    if name == "hsret":
        return HSRET(target, reference=reference)
    if name == "hsret-afcfs":
        return HSRET(target, start="afcfs", reference=reference)
    if name == "afcfs":
        return AFCFS(rng, reference=reference)
    if name == "all-eft":
        return AllEFT(reference=reference)
    if name == "all-eft-cap":
        return AllEFT(cap=True, target=target, reference=reference)
    if name == "cbsp":
        return CBSP(reference=reference)
    raise UnknownPolicyError(name=name, known=", ".join(MOLDABLE_POLICIES))


__all__ = ["AFCFS", "CBSP", "HSRET", "MOLDABLE_POLICIES", "TARGET_POLICIES", "AllEFT", "make_policy"]
