"""The two-tier policies' cheaper passes (issue 27, tenth session) against the forms they replaced, kept
here as the reference:

* step 3 (``_fill_bg``) counts the free bg slots under the threshold first and builds the
  (utilization, -core) pairs only when a queued job fits them; the reference builds the pairs first and
  counts them (the count must be the same, including the cores whose fg slot this pass filled);
* the process order sorts with a C-level key and ``reverse=True`` instead of a negated key (equal usages
  must stay in index order);
* the promote test uses set operations instead of ``all(st.fg_idle(c) ...)``;
* the bg jobs' arrival order uses an ``attrgetter`` key instead of ``_arrival(rj.job)``.

Every decision on random views must be the same, action for action, reason for reason, and so must a
whole MEASY/KEASY/REASY simulation over a generated workload (bg starts, promotions, migrations, fg
placements that change which bg slots are under the threshold)."""

from __future__ import annotations

import heapq
from collections.abc import Set
from typing import Any, ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_policies_properties import PARAMS, SETTINGS, blocked_two_tier_views, views
from vmctl.model import ClusterView, Decision, Job, RunningJob, StartBg
from vmctl.policies.easy_family import _BG, KeasyPolicy, MeasyPolicy, ReasyPolicy, _arrival, _Pass, _TwoTier
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.workloads import generate_model


def _reference_class(base: type[_TwoTier]) -> type[_TwoTier]:
    class Ref(base):  # type: ignore[valid-type,misc]
        name: ClassVar[str] = base.name

        def _proc_order(self, job: Job) -> list[int]:
            if not self._info or job.cpu_usage is None:
                return list(range(job.procs))
            usage = job.cpu_usage
            return sorted(range(job.procs), key=lambda p: -usage[p])

        def _plan(self, st: _Pass, item: Job | RunningJob) -> tuple[str, float, float] | None:
            now = st.now
            if isinstance(item, Job):
                end = now + item.estimate
                return ("start", end, end)
            est = item.job.estimate
            if all(st.fg_idle(c) for c in item.cores):
                return ("promote", now + est, now + item.remaining_estimate)
            if self.mode == "R":
                return None
            if self.mode == "K":
                return ("kill", now + est, now + est)
            return ("migrate", now + self._cost + est, now + self._cost + item.remaining_estimate)

        def decide(self, view: ClusterView, now: float) -> Decision:
            # the bg jobs' order as the reference sorts them; the pass itself is the policy's
            bg = sorted((rj for rj in view.running.values() if rj.tier is _BG and not rj.suspended),
                        key=lambda rj: _arrival(rj.job))
            self._last_bg_jobs: list[RunningJob] | None = None
            out = super().decide(view, now)
            assert self._last_bg_jobs is None or self._last_bg_jobs == bg  # (None: a pass that stopped early)
            return out

        def _fill_bg(self, st: _Pass, view: ClusterView, now: float, started: set[str]) -> list[str]:
            self._last_bg_jobs = list(st.bg_jobs)
            out: list[str] = []
            queue = view.queue
            if len(queue) <= len(started):
                return out
            base: Set[int] = view.idle_bg
            if st.bg_freed:
                base = base | {c for c in st.bg_freed if view.usable[c]}
            if not base:
                return out
            thr = self._threshold
            if not self._info:
                idle_fg = view.idle_fg - st.fg_taken if st.fg_taken else view.idle_fg
                pairs = [(0.0, -c) for c in base & idle_fg] if thr > 0.0 else []
            else:
                util, over = view.fg_util, st.util_over
                pairs = [(util[c], -c) for c in base if util[c] < thr and c not in over]
                pairs += [(u, -c) for c, u in over.items() if c in base and u < thr]
            free = len(pairs)
            if free == 0:
                return out
            cand = [(job.estimate, job.submit_time, job.id, job) for job in queue
                    if job.procs <= free and job.submit_time <= now and job.id not in started]
            if not cand:
                return out
            pairs.sort()
            slots = [-nc for _u, nc in pairs]
            heapq.heapify(cand)
            pos = 0
            while cand and free > 0:
                job = heapq.heappop(cand)[3]
                if job.procs > free:
                    continue
                cores = [0] * job.procs
                for k, p in enumerate(self._proc_order(job)):
                    cores[p] = slots[pos + k]
                pos += job.procs
                free -= job.procs
                st.actions.append(StartBg(job.id, tuple(cores)))
                out.append(job.id)
            return out

    return Ref


REFS = {p.name: _reference_class(p) for p in (KeasyPolicy, ReasyPolicy, MeasyPolicy)}
_PAIRS = [(name, params) for name, ps in PARAMS.items() for params in ps]


def _same(a: Decision, b: Decision) -> bool:
    return (a.actions, a.reasons, a.default_reason, a.reservation, a.wake_at) == (
        b.actions, b.reasons, b.default_reason, b.reservation, b.wake_at)


@SETTINGS
@given(st.one_of(views(), blocked_two_tier_views()))
def test_two_tier_decisions_equal_the_reference(case: tuple[ClusterView, float]) -> None:
    v, now = case
    for name, params in _PAIRS:
        assert _same(create_policy(name, **params).decide(v, now), REFS[name](**params).decide(v, now)), (name, params)


@pytest.mark.parametrize(("name", "params"), [("measy", {}), ("measy", {"bg_util_threshold": 0.5}),
                                              ("keasy", {}), ("reasy", {"use_cpu_info": False})])
def test_a_two_tier_run_equals_the_reference(name: str, params: dict[str, Any]) -> None:
    """A whole run: every pass of the policy against the reference on the same view, and the job rows."""
    wl = generate_model("feitelson96", 1500, 64, seed=5, load=0.9)
    ref = REFS[name](**params)
    pol = create_policy(name, **params)
    decide = pol.decide
    passes = bg_starts = with_over = 0

    def both(view: ClusterView, now: float) -> Decision:
        nonlocal passes, bg_starts, with_over
        a, b = decide(view, now), ref.decide(view, now)
        assert _same(a, b), (passes, now)
        passes += 1
        bg_starts += sum(type(x) is StartBg for x in a.actions)
        with_over += any(type(x) is not StartBg for x in a.actions) and any(type(x) is StartBg for x in a.actions)
        return a

    pol.decide = both  # type: ignore[method-assign]
    checked = Simulator(wl.jobs, 64, pol, SimConfig(seed=5))
    checked.run()
    sim_ref = Simulator(wl.jobs, 64, REFS[name](**params), SimConfig(seed=5))
    sim_ref.run()
    assert list(checked.job_rows()) == list(sim_ref.job_rows())
    # the run exercised step 3, and passes that placed fg jobs before bg ones (``util_over``)
    assert passes > 1000 and bg_starts > 50 and with_over > 5, (passes, bg_starts, with_over)
