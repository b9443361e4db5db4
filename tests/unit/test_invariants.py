"""The invariant checker rejects each kind of broken decision and accepts legal ones."""

from __future__ import annotations

import pytest

from tests.viewbuilder import job, view
from vmctl.errors import InvariantViolation
from vmctl.model import Decision, Kill, Migrate, Promote, SetCap, StartBg, StartFg, Tier
from vmctl.policies.invariants import check_decision

A = job("a", 2, 100)
B = job("b", 1, 50, submit=5)


def check(v, *actions, **kw):  # type: ignore[no-untyped-def]
    check_decision(v, Decision(actions=tuple(actions), **kw), kw.pop("now", 10.0) if False else 10.0)


def test_legal_start_and_bg() -> None:
    v = view(4, queue=[A, B])
    check(v, StartFg("a", (0, 1)), StartBg("b", (0,)))


@pytest.mark.parametrize(
    ("actions", "rule"),
    [
        ((StartFg("a", (0, 0)),), "cores-distinct"),
        ((StartFg("a", (0,)),), "cores-count"),
        ((StartFg("a", (0, 9)),), "core-range"),
        ((StartFg("a", (0, 1)), StartFg("b", (1,))), "two-fg"),
        ((StartFg("a", (0, 1)), StartFg("a", (2, 3))), "start-not-queued"),
        ((StartFg("zz", (0,)),), "start-not-queued"),
        ((Promote("a"),), "not-running"),
        ((SetCap("a", 1.5),), "not-running"),
    ],
)
def test_illegal(actions: tuple, rule: str) -> None:  # type: ignore[type-arg]
    v = view(4, queue=[A, B])
    with pytest.raises(InvariantViolation, match=rule):
        check(v, *actions)


def test_start_before_submit() -> None:
    v = view(4, queue=[job("late", 1, 10, submit=50)])
    with pytest.raises(InvariantViolation, match="start-before-submit"):
        check(v, StartFg("late", (0,)))


def test_unusable_core() -> None:
    v = view(4, queue=[B], unusable=[2])
    with pytest.raises(InvariantViolation, match="core-unusable"):
        check(v, StartFg("b", (2,)))


def test_promote_needs_idle_fg() -> None:
    other = job("o", 1, 10)
    v = view(4, running=[(A, Tier.BG, (0, 1), 0.0), (other, Tier.FG, (1,), 0.0)])
    with pytest.raises(InvariantViolation, match="promote-fg-busy"):
        check(v, Promote("a"))
    v2 = view(4, running=[(A, Tier.BG, (0, 1), 0.0)])
    check(v2, Promote("a"))


def test_kill_then_restart_and_migrate() -> None:
    v = view(4, running=[(A, Tier.BG, (0, 1), 0.0)])
    check(v, Kill("a"), StartFg("a", (2, 3)))
    check(v, Migrate("a", (2, 3), Tier.FG, cost=20))
    with pytest.raises(InvariantViolation, match="migrate-cost"):
        check(v, Migrate("a", (2, 3), Tier.FG, cost=-1))


def test_reasons_and_wake() -> None:
    v = view(4, queue=[A, B])
    with pytest.raises(InvariantViolation, match="reason-not-waiting"):
        check(v, StartFg("a", (0, 1)), reasons={"a": "x"})
    with pytest.raises(InvariantViolation, match="wake-in-past"):
        check(v, wake_at=1.0)
    with pytest.raises(InvariantViolation, match="no-reason"):
        check(v, default_reason="")
    check(v, reasons={"a": "blocked by reservation"}, wake_at=20.0)


def test_long_queue_jobs_named_deep_in_the_queue_are_found() -> None:
    queue = [job(f"q{i:04d}", 1, 10) for i in range(2000)]
    v = view(4, queue=queue)
    check(v, StartFg("q1999", (0,)), StartBg("q0000", (1,)), reasons={"q1500": "behind the head"})
    with pytest.raises(InvariantViolation, match="reason-not-waiting"):
        check(v, StartFg("q0001", (0,)), reasons={"nope": "x"})
    with pytest.raises(InvariantViolation, match="start-not-queued"):
        check(v, StartFg("q0001", (0,)), StartFg("nope", (1,)))


def test_check_does_not_look_at_untouched_running_jobs() -> None:
    class Exploding(dict):  # type: ignore[type-arg]
        def items(self):  # type: ignore[no-untyped-def]
            raise AssertionError("check_decision iterated the whole running map")

        def values(self):  # type: ignore[no-untyped-def]
            raise AssertionError("check_decision iterated the whole running map")

    base = view(4, running=[(A, Tier.BG, (0, 1), 0.0)])
    from dataclasses import replace

    v = replace(base, running=Exploding(base.running))
    check(v, Promote("a"))
    with pytest.raises(InvariantViolation, match="not-running"):
        check(v, Kill("zz"))
