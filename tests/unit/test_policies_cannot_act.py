"""``SchedulingPolicy.cannot_act``: when it says True, ``decide`` must return no actions and no
``wake_at`` for every ``now`` (its contract), for every registered policy; and the simulator, which
skips such passes, must give exactly the results it gives when it calls ``decide`` every time."""

from __future__ import annotations

import math
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vmctl.model import ClusterView, Decision, Job, RunningJob, Tier
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.registry import available_policies, create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.workloads.core import WorkloadJob

ONE_TIER = ("fcfs", "easy", "sjf")
NOWS = (0.0, 1.0, 10.0, 50.0, 1e6)


@st.composite
def busy_views(draw: st.DrawFn) -> ClusterView:
    """Views whose usable fg slots are mostly (often all) taken, with bg jobs and a mixed queue
    (jobs submitted before, at and after the times in NOWS)."""
    n = draw(st.integers(1, 10))
    unusable = set(draw(st.sets(st.integers(0, n - 1), max_size=2))) if draw(st.booleans()) else set()
    usable = [c not in unusable for c in range(n)]
    fg: list[str | None] = [None] * n
    bg: list[str | None] = [None] * n
    util = [0.0] * n
    running: dict[str, RunningJob] = {}
    leave_idle = draw(st.sampled_from([0, 0, 0, 1]))  # idle usable fg cores to leave (mostly none)
    k = 0
    for tier in (Tier.FG, Tier.BG):
        slots = fg if tier is Tier.FG else bg
        while True:
            free = [c for c in range(n) if slots[c] is None and usable[c]]
            if tier is Tier.FG and len(free) <= leave_idle:
                break
            if tier is Tier.BG and (not free or not draw(st.booleans())):
                break
            cap = len(free) - leave_idle if tier is Tier.FG else len(free)
            procs = draw(st.integers(1, cap))
            cores = tuple(draw(st.permutations(free))[:procs])
            est = draw(st.sampled_from([1.0, 7.0, 30.0, 500.0]))
            usage = None if draw(st.booleans()) else tuple(draw(st.sampled_from([0.2, 0.9, 1.0])) for _ in cores)
            job = Job(id=f"r{k}", submit_time=0.0, procs=procs, estimate=est, cpu_usage=usage)
            k += 1
            progress = draw(st.floats(0.0, est))
            for i, c in enumerate(cores):
                slots[c] = job.id
                if tier is Tier.FG:
                    util[c] = draw(st.sampled_from([job.usage_of(i), 0.5, 0.99]))
            end = 1.0 + est - progress if tier is Tier.FG else math.inf
            running[job.id] = RunningJob(job, tier, cores, 0.0, 0.0, progress=progress, expected_end=end)
    queue = []
    for q in range(draw(st.integers(0, 8))):  # empty sometimes: two-tier policies may still act
        procs = draw(st.integers(1, n + 1))
        submit = draw(st.sampled_from([0.0, 1.0, 10.0, 20.0]))
        est = draw(st.sampled_from([1.0, 4.0, 60.0, 1000.0]))
        queue.append(Job(id=f"q{q}", submit_time=submit, procs=procs, estimate=est))
    queue.sort(key=lambda j: (j.submit_time, j.id))
    return ClusterView(
        total_cores=n, queue=queue, running=running, fg_job=fg, bg_job=bg,
        idle_fg={c for c in range(n) if fg[c] is None and usable[c]},
        idle_bg={c for c in range(n) if bg[c] is None and usable[c]},
        fg_util=util, usable=usable,
    )  # fmt: skip


def test_every_registered_policy_answers_cannot_act() -> None:
    names = set(available_policies())
    assert set(ONE_TIER) <= names
    empty = ClusterView(
        total_cores=2, queue=[Job(id="q", submit_time=0.0, procs=1, estimate=5.0)], running={},
        fg_job=[None, None], bg_job=[None, None], idle_fg={0, 1},
        idle_bg={0, 1}, fg_util=[0.0, 0.0], usable=[True, True],
    )  # fmt: skip
    for name in names:
        assert create_policy(name).cannot_act(empty) is False, name  # idle cores, a job: it might act


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(view=busy_views())
def test_cannot_act_implies_an_empty_decision(view: ClusterView) -> None:
    for name in available_policies():
        policy = create_policy(name)
        if not policy.cannot_act(view):
            continue
        for now in NOWS:
            d = policy.decide(view, now)
            assert d.actions == (), f"{name} at now={now}: cannot_act but decided {d.actions}"
            assert d.wake_at is None, f"{name} at now={now}: cannot_act but wake_at={d.wake_at}"


@settings(max_examples=100, deadline=None)
@given(view=busy_views())
def test_one_tier_cannot_act_exactly_when_no_idle_fg_or_no_queue(view: ClusterView) -> None:
    for name in ONE_TIER:
        assert create_policy(name).cannot_act(view) is (not view.idle_fg or not view.queue)


def test_strategy_reaches_cannot_act() -> None:
    """Guard against a vacuous property: the strategy must produce views where cannot_act holds and
    the queue holds jobs that could start if a core were idle."""
    hits = 0

    @settings(max_examples=60, deadline=None, database=None)
    @given(view=busy_views())
    def probe(view: ClusterView) -> None:
        nonlocal hits
        if create_policy("easy").cannot_act(view) and any(j.procs <= view.total_cores for j in view.queue):
            hits += 1

    probe()
    assert hits > 0


class _Always(SchedulingPolicy):
    """Wraps a policy and never claims cannot_act: the simulator then calls decide at every pass."""

    def __init__(self, inner: SchedulingPolicy) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]
        self.params = inner.params

    def decide(self, view: ClusterView, now: float) -> Decision:
        return self.inner.decide(view, now)

    def reported_params(self) -> dict[str, Any]:
        return self.inner.reported_params()


def _jobs(seed: int, count: int, cores: int) -> list[WorkloadJob]:
    rnd = random.Random(seed)
    t = 0.0
    out = []
    for i in range(count):
        t += rnd.expovariate(1 / 40.0)
        est = rnd.choice([30.0, 120.0, 600.0, 3600.0])
        run = rnd.uniform(1.0, est * 1.2)  # some overrun their estimate (killed there)
        out.append(WorkloadJob(i, round(t, 1), run, rnd.choice([1, 1, 2, 4, 8, cores // 2, cores]), est, None))
    return out


def test_simulator_skipping_changes_nothing() -> None:
    cores = 16
    jobs = _jobs(11, 400, cores)
    for name in ONE_TIER:
        skipped = Simulator(jobs, cores, create_policy(name), SimConfig(seed=1)).run()
        full = Simulator(jobs, cores, _Always(create_policy(name)), SimConfig(seed=1)).run()
        assert full.skipped_passes == 0
        assert skipped.skipped_passes > 0, name
        assert skipped.decisions == full.decisions
        assert skipped.to_dict() == full.to_dict(), name
