"""The two-tier policies' fg dispatch (``_TwoTier._fg_cores``) keeps a per-pass sorted list of the idle
cores with an empty bg slot instead of set operations and a sort over the cluster per job (issue 27: a
10,000-node vmctld's first decision deployed 10,000 jobs, each sorting 320,000 cores). These tests hold
it to the set formulation it replaced, kept here as the reference: every decision on random views is
the same, action for action, and so is every single dispatch with taken, vacated and avoided cores.

The backfill loop tests a queued job (exactly ``Job``) inline instead of through ``_plan`` (it may walk
the whole queue: 100,000 jobs); the reference runs on the same queue as instances of a subclass, which
take the general path."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_policies_properties import PARAMS, SETTINGS, blocked_two_tier_views, views
from vmctl.model import ClusterView, Job, RunningJob, Tier
from vmctl.policies.easy_family import KeasyPolicy, MeasyPolicy, ReasyPolicy, _Pass, _TwoTier
from vmctl.policies.registry import create_policy


def reference_fg_cores(
    pol: _TwoTier, st_: _Pass, job: Job, mover: RunningJob | None, avoid: frozenset[int]
) -> tuple[int, ...] | None:
    """Dispatch(FG) as sets: the idle fg cores not taken, minus ``avoid``; those whose bg slot is empty
    or vacated by descending index first, then the others by ascending bg usage, then descending index."""
    view = st_.view
    cands = (view.idle_fg - st_.fg_taken) - avoid
    k = job.procs
    if len(cands) < k:
        return None
    vacated = st_.bg_freed if mover is None else st_.bg_freed.union(mover.cores)
    empty = (cands & view.idle_bg) | (cands & vacated)
    chosen = sorted(empty, reverse=True)[:k]
    if len(chosen) < k:
        busy = sorted(cands - empty, reverse=True)
        if pol._info:
            usage_of = pol._bg_usage_map(st_)
            busy.sort(key=lambda c: usage_of.get(c, 1.0))
        chosen.extend(busy[: k - len(chosen)])
    out = [0] * k
    for slot, p in enumerate(pol._proc_order(job)):
        out[p] = chosen[slot]
    return tuple(out)


def _reference_class(base: type[_TwoTier]) -> type[_TwoTier]:
    class Ref(base):  # type: ignore[valid-type,misc]
        name: ClassVar[str] = base.name

        def _fg_cores(self, st_: _Pass, job: Job, mover: RunningJob | None,
                      avoid: frozenset[int]) -> tuple[int, ...] | None:
            return reference_fg_cores(self, st_, job, mover, avoid)

    return Ref


REFS = {p.name: _reference_class(p) for p in (KeasyPolicy, ReasyPolicy, MeasyPolicy)}


class _RefJob(Job):
    """A queued job the backfill loop sends through ``_plan`` (its inline test is for ``Job`` exactly)."""


def _general_path(v: ClusterView) -> ClusterView:
    queue = [_RefJob(**{f.name: getattr(j, f.name) for f in dataclasses.fields(Job)}) for j in v.queue]
    return dataclasses.replace(v, queue=queue, queue_index={j.id: j for j in queue})


def _pairs() -> list[tuple[str, dict[str, Any]]]:
    return [(name, params) for name, ps in PARAMS.items() for params in ps]


@SETTINGS
@given(st.one_of(views(), blocked_two_tier_views()))
def test_two_tier_decisions_equal_the_set_formulation(case: tuple[ClusterView, float]) -> None:
    v, now = case
    for name, params in _pairs():
        fast = create_policy(name, **params).decide(v, now)
        ref_pol = REFS[name](**params)
        ref = ref_pol.decide(_general_path(v), now)
        assert fast.actions == ref.actions, (name, params)
        assert fast.reasons == ref.reasons and fast.reservation == ref.reservation, (name, params)


@st.composite
def dispatch_cases(draw: st.DrawFn) -> tuple[ClusterView, list[tuple[Job, frozenset[int], frozenset[int]]]]:
    """A view with bg jobs (some with usages) and a sequence of fg dispatches, each with cores vacated
    in the pass so far and cores to avoid."""
    n = draw(st.integers(2, 40))
    bg: list[str | None] = [None] * n
    fg: list[str | None] = [None] * n
    running: dict[str, RunningJob] = {}
    for k in range(draw(st.integers(0, 6))):
        free = [c for c in range(n) if bg[c] is None]
        if not free:
            break
        procs = draw(st.integers(1, min(5, len(free))))
        cores = tuple(draw(st.permutations(free))[:procs])
        usage = None if draw(st.booleans()) else tuple(
            draw(st.lists(st.sampled_from([0.1, 0.5, 1.0]), min_size=procs, max_size=procs)))
        job = Job(id=f"b{k}", submit_time=0.0, procs=procs, estimate=10.0, cpu_usage=usage)
        for c in cores:
            bg[c] = job.id
        running[job.id] = RunningJob(job, Tier.BG, cores, 0.0, 0.0, progress=0.0, expected_end=float("inf"))
    for c in draw(st.sets(st.integers(0, n - 1), max_size=n // 2)):
        fg[c] = "f"
    held = draw(st.sets(st.integers(0, n - 1), max_size=3))  # bg slots busy without a bg job in the view
    v = ClusterView(
        total_cores=n, queue=[], running=running, fg_job=fg, bg_job=bg,
        idle_fg={c for c in range(n) if fg[c] is None},
        idle_bg={c for c in range(n) if bg[c] is None and c not in held},
        fg_util=[0.0] * n, usable=[True] * n,
    )  # fmt: skip
    steps = []
    for i in range(draw(st.integers(1, 8))):
        procs = draw(st.integers(1, 6))
        usage = None if draw(st.booleans()) else tuple(
            draw(st.lists(st.sampled_from([0.2, 0.7, 1.0]), min_size=procs, max_size=procs)))
        vac = frozenset(draw(st.sets(st.integers(0, n - 1), max_size=4)))
        avoid = frozenset(draw(st.sets(st.integers(0, n - 1), max_size=4))) if draw(st.booleans()) else frozenset()
        steps.append((Job(id=f"q{i}", submit_time=0.0, procs=procs, estimate=5.0, cpu_usage=usage), vac, avoid))
    return v, steps


@pytest.mark.parametrize("info", [True, False])
@SETTINGS
@given(dispatch_cases())
def test_each_fg_dispatch_equals_the_set_formulation(
    info: bool, case: tuple[ClusterView, list[tuple[Job, frozenset[int], frozenset[int]]]]
) -> None:
    v, steps = case
    pol = MeasyPolicy(use_cpu_info=info)
    fast, ref = _Pass(v, 0.0), _Pass(v, 0.0)
    for job, vac, avoid in steps:
        for p in (fast, ref):
            p.bg_freed.update(vac)
        got = pol._fg_cores(fast, job, None, avoid)
        want = reference_fg_cores(pol, ref, job, None, avoid)
        assert got == want
        if got is not None:  # the pass takes the cores, as _deploy does
            for p in (fast, ref):
                pol._occupy_fg(p, job, got, 5.0)
