"""The invariant checker's fast path (``invariants.accepts_fast``) only accepts what the general
replay on the occupancy model (``invariants._check_general``) accepts: over generated views and
decisions of starts (legal and broken in every way the start rules know), ``check_decision`` refuses
exactly what the general replay refuses, with the same rule and message, and the fast path answers True only for
decisions the general replay accepts."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.viewbuilder import job, view
from vmctl.errors import InvariantViolation
from vmctl.model import Action, ClusterView, Decision, Discipline, Job, Kill, StartBg, StartFg, Tier
from vmctl.policies import invariants
from vmctl.policies.effects import Effect, EffectKind, Placement
from vmctl.policies.invariants import check_decision

NOW = 10.0


def _outcome(fn: object, v: ClusterView, d: Decision) -> str:
    try:
        fn(v, d, NOW)  # type: ignore[operator]
    except InvariantViolation as exc:
        return str(exc)  # "rule: detail"
    return "ok"


@st.composite
def cases(draw: st.DrawFn) -> tuple[ClusterView, Decision]:
    n = draw(st.integers(1, 6))
    levels = draw(st.sampled_from([1, 2, 2]))
    unusable = draw(st.sets(st.integers(0, n - 1), max_size=2))
    usable = [c not in unusable for c in range(n)]
    slots: list[list[str | None]] = [[None] * n for _ in range(levels)]
    for level in range(levels):
        for c in range(n):
            if draw(st.integers(0, 3)) == 0:
                slots[level][c] = f"r{level}{c}"  # a busy slot (its job is not in the view's running map)
    queue: list[Job] = []
    for q in range(draw(st.integers(0, 4))):
        submit = draw(st.sampled_from([0.0, 0.0, NOW, 50.0]))
        queue.append(job(f"q{q}", draw(st.integers(1, n + 1)), 10.0, submit=submit))
    queue.sort(key=lambda j: (j.submit_time, j.id))
    index = {j.id: j for j in queue} if draw(st.booleans()) else None
    idle = [{c for c in range(n) if usable[c] and slots[level][c] is None} for level in range(levels)]
    v = ClusterView.leveled(n, queue, {}, slots, idle, Discipline.PRIORITY if levels == 2 else Discipline.SHARED,
                            [0.0] * n, usable, queue_index=index)
    ids = [j.id for j in queue] + ["ghost"]
    procs = {j.id: j.procs for j in queue}
    actions: list[StartFg | StartBg] = []
    left = [sorted(idle[level]) for level in range(levels)]  # free slots not taken by earlier starts
    for _ in range(draw(st.integers(0, 3))):
        named = ids if not queue or draw(st.integers(0, 5)) == 0 else ids[:-1]  # "ghost" is not queued
        jid = draw(st.sampled_from(named))
        level = 1 if levels == 2 and draw(st.integers(0, 3)) == 0 else 0
        kind = StartBg if level == 1 else StartFg
        mode = draw(st.integers(0, 5))
        width = procs.get(jid, 1)
        if mode <= 2:  # mostly well-formed: the job's width, on free slots
            cores = tuple(left[level][-width:]) if width <= len(left[level]) else tuple(left[level])
            del left[level][len(left[level]) - len(cores):]
        elif mode == 3:  # the job's width on distinct usable cores, free or not
            cores = tuple(draw(st.permutations([c for c in range(n) if usable[c]]))[:width])
        elif mode == 4:  # the job's width, busy cores first
            busy = [c for c in range(n) if slots[level][c] is not None] if level < levels else []
            cores = tuple((busy + [c for c in range(n) if c not in busy])[:width])
        else:  # anything: out of range, repeated, busy, unusable, too few or too many cores
            cores = tuple(draw(st.integers(-1, n)) for _ in range(draw(st.integers(0, n + 1))))
        if levels == 1 and draw(st.integers(0, 5)) == 0:
            kind = StartBg  # no level 1 in this view
        actions.append(kind(jid, cores))
    waiting = draw(st.sets(st.sampled_from(ids), max_size=2))
    reasons = {jid: draw(st.sampled_from(["waiting"] * 5 + [""])) for jid in waiting}
    wake = draw(st.sampled_from([None, None, None, NOW + 5.0, NOW, NOW - 5.0]))
    default = draw(st.sampled_from(["waiting"] * 5 + [""]))
    return v, Decision(actions=tuple(actions), reasons=reasons, wake_at=wake, default_reason=default)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_checker_refuses_exactly_what_the_general_replay_refuses(case: tuple[ClusterView, Decision]) -> None:
    v, d = case
    general = _outcome(invariants._check_general, v, d)
    assert _outcome(check_decision, v, d) == general
    if invariants.accepts_fast(v, d, NOW):
        assert general == "ok", f"the fast path accepted what the general replay refuses ({general})"
        # what the fast path's callers do with an accepted decision (each start on its cores, at level 0
        # for StartFg, 1 for StartBg) is exactly what the replay's effects say
        starts = [a for a in d.actions if isinstance(a, StartFg | StartBg)]
        assert len(starts) == len(d.actions)
        effects = check_decision(v, d, NOW).effects
        assert effects == [Effect(EffectKind.STARTED, a.job_id, a, Placement(0 if isinstance(a, StartFg) else 1,
                                                                             a.cores))
                           for a in starts]


def test_the_generated_cases_reach_both_paths() -> None:
    """Guard against a vacuous property: the generator must produce decisions the fast path accepts
    (with starts), and starts the general replay refuses for each start rule."""
    fast_with_starts = 0
    rules: set[str] = set()

    @settings(max_examples=2000, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(case=cases())
    def probe(case: tuple[ClusterView, Decision]) -> None:
        nonlocal fast_with_starts
        v, d = case
        if d.actions and invariants.accepts_fast(v, d, NOW):
            fast_with_starts += 1
        rules.add(_outcome(invariants._check_general, v, d).split(":")[0])

    probe()
    assert fast_with_starts >= 20
    missing = {"start-not-queued", "start-before-submit", "cores-count", "cores-distinct", "core-range",
            "core-unusable", "two-fg", "reason-not-waiting", "no-reason", "wake-in-past"} - rules
    assert not missing, missing


def test_fast_path_hands_over_each_broken_start() -> None:
    a, b, r, s = job("a", 2, 100), job("b", 1, 50), job("r", 1, 50), job("s", 1, 50)
    v = view(5, queue=[a, b], unusable=[3], running=[(r, Tier.FG, (4,), 0.0), (s, Tier.BG, (0,), 0.0)])
    ok = Decision(actions=(StartFg("a", (0, 1)), StartFg("b", (2,))), reasons={}, default_reason="w")
    assert invariants.accepts_fast(v, ok, NOW)
    check_decision(v, ok, NOW)
    broken: dict[str, tuple[Action, ...]] = {
        "two-fg": (StartFg("a", (0, 1)), StartFg("b", (1,))),
        "two-fg: start_fg b: fg slot of core 4 holds r": (StartFg("b", (4,)),),
        "two-bg": (StartBg("b", (0,)),),
        "core-unusable": (StartFg("b", (3,)),),
        "core-range": (StartFg("b", (-1,)),),
        "cores-distinct": (StartFg("a", (2, 2)),),
        "cores-count": (StartFg("a", (2,)),),
        "start-not-queued": (StartFg("b", (2,)), StartFg("b", (1,))),
    }
    for rule, actions in broken.items():
        d = Decision(actions=actions, reasons={}, default_reason="w")
        assert not invariants.accepts_fast(v, d, NOW), rule
        assert _outcome(check_decision, v, d).startswith(rule)
    # any other action (here a kill) goes to the general replay
    assert not invariants.accepts_fast(v, Decision(actions=(Kill("a"),)), NOW)
    assert _outcome(check_decision, v, Decision(actions=(Kill("a"),))).startswith("not-running:")
