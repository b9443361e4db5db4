"""Scheduling policies (import name ``vmctl.policies``).

Pure: a policy imports only ``vmctl.model``, ``vmctl.errors``, the standard library and numerical
libraries; time and seeds are arguments; no I/O, no global random state. See ``base.py`` for the
interface and ``registry.py`` for the list of policies.
"""

from vmctl.policies.base import PolicyParams, SchedulingPolicy
from vmctl.policies.registry import available_policies, create_policy, register

__all__ = ["PolicyParams", "SchedulingPolicy", "available_policies", "create_policy", "register"]
