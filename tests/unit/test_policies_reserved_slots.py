"""A bg slot the daemon holds back (the source slot of a running migration stays reserved, so it is
not idle although no bg job of the view runs there) must not crash the EASY family's core choice
(found by ``vmctl demo``: ``KeyError`` in ``_fg_cores``, the decision loop failing every tick)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.viewbuilder import job, view
from vmctl.model import StartBg, StartFg, Tier
from vmctl.policies.registry import policy_class


@pytest.mark.parametrize("name", ["measy", "reasy", "keasy"])
def test_reserved_bg_slot_counts_as_busy(name: str) -> None:
    bg_job = job("r0", 2, 300.0, usage=1.0)
    v = view(4, queue=[job("q0", 2, 200.0, submit=1.0, usage=0.5)], running=[(bg_job, Tier.BG, (1, 3), 0.0)],
             now=2.0)
    v = replace(v, idle_bg=v.idle_bg - {0})  # core 0's bg slot: reserved by a migration in flight
    decision = policy_class(name)().decide(v, 2.0)
    starts = [a for a in decision.actions if isinstance(a, StartFg | StartBg) and a.job_id == "q0"]
    assert len(starts) == 1 and isinstance(starts[0], StartFg)
    # the free bg slot (core 2) first, then the reserved one counts as fully used: after core 3/1 (1.0)
    # only by index, never before the idle one
    assert 2 in starts[0].cores
