"""Property tests: on random cluster views every policy's decision passes the invariant checker, is
deterministic, and keeps the promises of its algorithm (MEASY paper sec. 2)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vmctl.model import ClusterView, Decision, Job, Kill, Migrate, Promote, RunningJob, StartBg, StartFg, Tier
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import create_policy

EASY_FAMILY = ("fcfs", "easy", "sjf", "keasy", "reasy", "measy")
TWO_TIER = ("keasy", "reasy", "measy")


@st.composite
def views(draw: st.DrawFn) -> tuple[ClusterView, float]:
    n = draw(st.integers(1, 10))
    now = draw(st.sampled_from([0.0, 5.0, 100.0]))
    unusable = set(draw(st.sets(st.integers(0, n - 1), max_size=2))) if draw(st.booleans()) else set()
    usable = [c not in unusable for c in range(n)]
    fg: list[str | None] = [None] * n
    bg: list[str | None] = [None] * n
    util = [0.0] * n
    running: dict[str, RunningJob] = {}

    def usage(procs: int) -> tuple[float, ...] | None:
        if draw(st.booleans()):
            return None
        return tuple(draw(st.lists(st.sampled_from([0.2, 0.5, 0.9, 0.97, 1.0]), min_size=procs, max_size=procs)))

    for k in range(draw(st.integers(0, 8))):
        tier = draw(st.sampled_from([Tier.FG, Tier.BG]))
        slots = fg if tier is Tier.FG else bg
        free = [c for c in range(n) if slots[c] is None and usable[c]]
        if not free:
            continue
        procs = draw(st.integers(1, len(free)))
        cores = tuple(draw(st.permutations(free))[:procs])
        est = draw(st.sampled_from([1.0, 7.0, 30.0, 500.0]))
        start = draw(st.floats(0.0, now))
        job = Job(id=f"r{k}", submit_time=start, procs=procs, estimate=est, cpu_usage=usage(procs))
        progress = draw(st.floats(0.0, est))
        for i, c in enumerate(cores):
            slots[c] = job.id
            if tier is Tier.FG:
                util[c] = draw(st.sampled_from([job.usage_of(i), 0.5, 0.99]))
        end = now + est - progress if tier is Tier.FG else math.inf
        running[job.id] = RunningJob(job, tier, cores, start, start, progress=progress, expected_end=end)
    queue = []
    for k in range(draw(st.integers(0, 10))):
        procs = draw(st.integers(1, n + 2))
        submit = draw(st.sampled_from([0.0, 1.0, now, now + 1.0])) if now else draw(st.sampled_from([0.0, 1.0]))
        est = draw(st.sampled_from([1.0, 4.0, 10.0, 60.0, 1000.0]))
        queue.append(Job(id=f"q{k}", submit_time=submit, procs=procs, estimate=est, cpu_usage=usage(procs)))
    queue.sort(key=lambda j: (j.submit_time, j.id))
    reverse = draw(st.booleans())  # build the idle sets in another insertion order
    order = list(range(n))[::-1] if reverse else list(range(n))
    v = ClusterView(
        total_cores=n,
        queue=queue,
        running=running,
        fg_job=fg,
        bg_job=bg,
        idle_fg={c for c in order if fg[c] is None and usable[c]},
        idle_bg={c for c in order if bg[c] is None and usable[c]},
        fg_util=util,
        usable=usable,
    )
    return v, now


@st.composite
def blocked_views(draw: st.DrawFn) -> tuple[ClusterView, float]:
    """One-tier views where the queue head does not fit: most fg slots are busy."""
    n = draw(st.integers(2, 12))
    now = 10.0
    fg: list[str | None] = [None] * n
    running: dict[str, RunningJob] = {}
    cores = draw(st.permutations(range(n)))
    idle = draw(st.integers(0, min(3, n - 1)))
    pos, k = idle, 0
    while pos < n:
        procs = draw(st.integers(1, n - pos))
        cs = tuple(cores[pos : pos + procs])
        pos += procs
        job = Job(id=f"r{k}", submit_time=0.0, procs=procs, estimate=draw(st.sampled_from([11.0, 15.0, 20.0, 40.0])))
        k += 1
        for c in cs:
            fg[c] = job.id
        running[job.id] = RunningJob(job, Tier.FG, cs, 0.0, 0.0, progress=10.0, expected_end=job.estimate)
    head = Job(id="q00", submit_time=1.0, procs=draw(st.integers(idle + 1, n)), estimate=5.0)
    queue = [head]
    for i in range(draw(st.integers(1, 8))):
        procs = draw(st.integers(1, max(1, idle)))
        est = draw(st.sampled_from([1.0, 5.0, 10.0, 20.0, 30.0, 100.0]))
        queue.append(Job(id=f"q{i + 1:02d}", submit_time=2.0, procs=procs, estimate=est))
    v = ClusterView(
        total_cores=n, queue=queue, running=running, fg_job=fg, bg_job=[None] * n,
        idle_fg={c for c in range(n) if fg[c] is None}, idle_bg=set(range(n)), fg_util=[0.0] * n, usable=[True] * n,
    )  # fmt: skip
    return v, now


@st.composite
def blocked_two_tier_views(draw: st.DrawFn) -> tuple[ClusterView, float]:
    """Two-tier views with busy fg slots, bg jobs (some arrived before the queue head) and a head that
    does not fit: the situations where promote, kill, migrate and REASY's pinned reservation matter."""
    n = draw(st.integers(3, 10))
    now = 10.0
    fg: list[str | None] = [None] * n
    bg: list[str | None] = [None] * n
    util = [0.0] * n
    running: dict[str, RunningJob] = {}
    for k in range(draw(st.integers(1, 6))):
        tier = draw(st.sampled_from([Tier.FG, Tier.BG]))
        slots = fg if tier is Tier.FG else bg
        free = [c for c in range(n) if slots[c] is None]
        if not free:
            continue
        procs = draw(st.integers(1, min(3, len(free))))
        cores = tuple(draw(st.permutations(free))[:procs])
        est = draw(st.sampled_from([5.0, 12.0, 25.0, 40.0]))
        submit = draw(st.sampled_from([0.0, 2.0]))
        job = Job(id=f"r{k}", submit_time=submit, procs=procs, estimate=est)
        for c in cores:
            slots[c] = job.id
            if tier is Tier.FG:
                util[c] = draw(st.sampled_from([0.5, 1.0]))
        progress = draw(st.sampled_from([0.0, 3.0]))
        end = now + est - progress if tier is Tier.FG else math.inf
        running[job.id] = RunningJob(job, tier, cores, submit, submit, progress=progress, expected_end=end)
    queue = [Job(id="q00", submit_time=1.0, procs=draw(st.integers(2, n)), estimate=5.0)]
    for i in range(draw(st.integers(0, 5))):
        est = draw(st.sampled_from([1.0, 5.0, 10.0, 30.0, 100.0]))
        queue.append(Job(id=f"q{i + 1:02d}", submit_time=3.0, procs=draw(st.integers(1, 3)), estimate=est))
    v = ClusterView(
        total_cores=n, queue=queue, running=running, fg_job=fg, bg_job=bg,
        idle_fg={c for c in range(n) if fg[c] is None}, idle_bg={c for c in range(n) if bg[c] is None},
        fg_util=util, usable=[True] * n,
    )  # fmt: skip
    return v, now


def rebuilt(v: ClusterView) -> ClusterView:
    """An equal view whose sets and dicts were built in reverse order."""
    return ClusterView(
        total_cores=v.total_cores,
        queue=list(v.queue),
        running=dict(reversed(list(v.running.items()))),
        fg_job=list(v.fg_job),
        bg_job=list(v.bg_job),
        idle_fg=set(sorted(v.idle_fg, reverse=True)),
        idle_bg=set(sorted(v.idle_bg, reverse=True)),
        fg_util=list(v.fg_util),
        usable=list(v.usable),
    )


PARAMS: dict[str, list[dict[str, Any]]] = {
    "keasy": [{}, {"use_cpu_info": False}],
    "reasy": [{}, {"bg_util_threshold": 0.5}],
    "measy": [{}, {"migration_cost": 0.0}, {"use_cpu_info": False, "bg_util_threshold": 1.0}],
}

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.one_of(views(), blocked_two_tier_views()))
def test_every_decision_is_legal_and_deterministic(case: tuple[ClusterView, float]) -> None:
    v, now = case
    for name in EASY_FAMILY:
        for params in PARAMS.get(name, [{}]):
            pol = create_policy(name, **params)
            d = pol.decide(v, now)
            check_decision(v, d, now)
            assert pol.decide(v, now) == d, name
            assert create_policy(name, **params).decide(rebuilt(v), now) == d, name
            _algorithm_promises(name, v, d, now)


def _algorithm_promises(name: str, v: ClusterView, d: Decision, now: float) -> None:
    kinds = {type(a) for a in d.actions}
    if name in ("fcfs", "easy", "sjf"):
        assert kinds <= {StartFg}, name
    if name == "reasy":
        assert not kinds & {Kill, Migrate}
    if name == "keasy":
        assert Migrate not in kinds
    if name == "measy":
        assert Kill not in kinds
    if name == "keasy":
        # a Kill is always followed by the restart of the same job in fg
        acts = list(d.actions)
        for i, a in enumerate(acts):
            if isinstance(a, Kill):
                assert isinstance(acts[i + 1], StartFg) and acts[i + 1].job_id == a.job_id
    for a in d.actions:
        if isinstance(a, StartFg | StartBg):
            job = next(j for j in v.queue if j.id == a.job_id) if a.job_id in {j.id for j in v.queue} else None
            if job is not None:
                assert job.submit_time <= now
    if name == "fcfs":
        # the started jobs are exactly a prefix of the submitted queue (jobs wider than the usable
        # cores are skipped: they would block it forever)
        usable = sum(v.usable)
        submitted = [j.id for j in v.queue if j.submit_time <= now and j.procs <= usable]
        got = [a.job_id for a in d.actions]
        assert got == submitted[: len(got)]
    if name == "sjf":
        # SJF is work conserving: no waiting job fits the fg slots left idle
        left = len(v.idle_fg) - sum(len(a.cores) for a in d.actions if isinstance(a, StartFg))
        started = {a.job_id for a in d.actions}
        assert all(j.procs > left for j in v.queue if j.id not in started and j.submit_time <= now)
    if name in TWO_TIER:
        # Promote only when the job's own fg slots are idle in the view (none of ours are taken
        # before it, which the invariant checker verifies against the overlay).
        for a in d.actions:
            if isinstance(a, Promote):
                assert v.running[a.job_id].tier is Tier.BG


@settings(max_examples=300, deadline=None)
@given(st.one_of(views(), blocked_views()))
def test_easy_backfill_never_delays_the_head(case: tuple[ClusterView, float]) -> None:
    """Replay EASY's starts against the reservation: at the head's shadow time the head still fits."""
    v, now = case
    d = create_policy("easy").decide(v, now)
    if d.reservation is None:
        return
    head = next(j for j in v.queue if j.id == d.reservation.job_id)
    shadow = d.reservation.shadow_time
    assert d.reasons[head.id].startswith("head of queue: reservation")
    by_id = {j.id: j for j in v.queue}
    # cores free at the shadow time: idle now, minus new starts still running then, plus fg jobs ended
    free_at_shadow = len(v.idle_fg)
    for a in d.actions:
        assert isinstance(a, StartFg)
        if now + by_id[a.job_id].estimate > shadow:
            free_at_shadow -= len(a.cores)
    for rj in v.running.values():
        if rj.tier is Tier.FG and rj.expected_end <= shadow:
            free_at_shadow += rj.job.procs
    assert free_at_shadow >= head.procs


@settings(max_examples=300, deadline=None)
@given(st.one_of(views(), blocked_two_tier_views()))
def test_two_tier_backfill_never_delays_the_head(case: tuple[ClusterView, float]) -> None:
    """Replay the fg placements of KEASY/REASY/MEASY against their reservation."""
    v, now = case
    for name in TWO_TIER:
        pol = create_policy(name)
        d = pol.decide(v, now)
        res = d.reservation
        if res is None:
            continue
        cost = float(pol.params.get("migration_cost", 0.0))
        queued = {j.id: j for j in v.queue}
        placed: list[tuple[float, tuple[int, ...]]] = []  # (expected end, cores) of new fg placements
        for a in d.actions:
            if isinstance(a, StartFg):
                job = queued[a.job_id] if a.job_id in queued else v.running[a.job_id].job
                placed.append((now + job.estimate, a.cores))
            elif isinstance(a, Promote):
                rj = v.running[a.job_id]
                placed.append((now + rj.remaining_estimate, rj.cores))
            elif isinstance(a, Migrate):
                rj = v.running[a.job_id]
                placed.append((now + cost + rj.remaining_estimate, a.cores))
        shadow = res.shadow_time
        head_bg = v.running.get(res.job_id)
        if name == "reasy" and head_bg is not None:
            # pinned head: its own cores must all be free of fg work at the shadow time
            own = set(head_bg.cores)
            for end, cores in placed:
                assert end <= shadow or not own & set(cores), (name, res)
            for c in own:
                occ = v.fg_job[c]
                if occ is not None:
                    assert v.running[occ].expected_end <= shadow
            continue
        need = queued[res.job_id].procs if res.job_id in queued else v.running[res.job_id].job.procs
        free_at_shadow = len(v.idle_fg) - sum(len(cores) for end, cores in placed if end > shadow)
        for rj in v.running.values():
            if rj.tier is Tier.FG and rj.expected_end <= shadow:
                free_at_shadow += rj.job.procs
        assert free_at_shadow >= need, (name, res)


def _reference_easy(v: ClusterView, now: float) -> list[str]:
    """A second, deliberately plain EASY (textbook form, no early exits): the ids it starts, in order."""
    usable = sum(v.usable)
    free = len(v.idle_fg)
    waiting = [j for j in v.queue if j.submit_time <= now and j.procs <= usable]
    out: list[str] = []
    ends: list[tuple[float, int]] = []
    while waiting and waiting[0].procs <= free:
        j = waiting.pop(0)
        out.append(j.id)
        free -= j.procs
        ends.append((now + j.estimate, j.procs))
    if not waiting:
        return out
    head = waiting.pop(0)
    timeline = sorted([(rj.expected_end, rj.job.procs) for rj in v.running.values() if rj.tier is Tier.FG] + ends)
    avail, shadow, extra = free, -math.inf, 0
    for end, _p in timeline:
        avail = free + sum(p for e, p in timeline if e <= end)
        if avail >= head.procs:
            shadow, extra = max(end, now), avail - head.procs
            break
    for j in waiting:
        if j.procs > free:
            continue
        if now + j.estimate <= shadow or j.procs <= extra:
            if now + j.estimate > shadow:
                extra -= j.procs
            out.append(j.id)
            free -= j.procs
    return out


@SETTINGS
@given(st.one_of(views(), blocked_views()))
def test_easy_matches_a_plain_reference(case: tuple[ClusterView, float]) -> None:
    v, now = case
    d = create_policy("easy").decide(v, now)
    assert [a.job_id for a in d.actions] == _reference_easy(v, now)
