"""EASY's reservation (``easy_family._reservation``): the shadow time is the first expected end by which
the head fits, the extra cores count every job ending at that instant, bg jobs never count; checked
against a direct definition over generated running sets with ties, bg jobs and jobs placed this pass."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.viewbuilder import job, view
from vmctl.model import Tier
from vmctl.policies.easy_family import _reservation


def _by_definition(fg_ends: list[tuple[float, int]], need: int, free: int, now: float) -> tuple[float, int] | None:
    for shadow in sorted({e for e, _p in fg_ends}):
        avail = free + sum(p for e, p in fg_ends if e <= shadow)
        if avail >= need:
            return (max(shadow, now), avail - need)
    return None


@settings(max_examples=400, deadline=None)
@given(
    ends=st.lists(st.tuples(st.sampled_from([5.0, 10.0, 10.0, 30.0]), st.integers(1, 3), st.booleans()), max_size=6),
    placed=st.lists(st.tuples(st.sampled_from([5.0, 10.0, 40.0]), st.integers(1, 3)), max_size=3),
    need=st.integers(1, 12),
    free=st.integers(0, 3),
    now=st.sampled_from([0.0, 10.0]),
)
def test_reservation_matches_its_definition(
    ends: list[tuple[float, int, bool]], placed: list[tuple[float, int]], need: int, free: int, now: float
) -> None:
    running = []
    core = 0
    for k, (end, procs, bg) in enumerate(ends):
        cores = tuple(range(core, core + procs))
        core += procs
        running.append((job(f"r{k}", procs, end), Tier.BG if bg else Tier.FG, cores, 0.0))
    v = view(max(core, 1) + free, running=running)
    fg_ends = [(e, p) for e, p, bg in ends if not bg] + placed
    assert _reservation(v, placed, need, free, now) == _by_definition(fg_ends, need, free, now)
    assert all(math.isinf(rj.expected_end) for rj in v.running.values() if rj.tier is Tier.BG)
