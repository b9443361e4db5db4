"""Hand-checked scenarios for the one-tier policies: fcfs, easy, sjf (MEASY paper sec. 2.2)."""

from __future__ import annotations

import pytest

from tests.viewbuilder import job, view
from vmctl.errors import PolicyParameterError, UnknownPolicyError
from vmctl.model import ClusterView, Decision, StartFg, Tier
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import available_policies, create_policy


def decide(name: str, v: ClusterView, now: float = 0.0, **params: object) -> Decision:
    d = create_policy(name, **params).decide(v, now)
    check_decision(v, d, now)
    return d


def started(d: Decision) -> dict[str, tuple[int, ...]]:
    return {a.job_id: a.cores for a in d.actions if isinstance(a, StartFg)}


def test_registry_names() -> None:
    names = set(available_policies())
    assert {"fcfs", "easy", "sjf", "keasy", "reasy", "measy"} <= names
    with pytest.raises(UnknownPolicyError):
        create_policy("easyy")
    with pytest.raises(PolicyParameterError, match="unknown"):
        create_policy("easy", migration_cost=3.0)


def test_empty_queue_is_a_no_op() -> None:
    for name in ("fcfs", "easy", "sjf"):
        d = decide(name, view(4))
        assert d.actions == () and d.wake_at is None


# ------------------------------------------------------------------------------------ fcfs


def test_fcfs_starts_in_order_and_blocks() -> None:
    a, b, c = job("a", 2, 10), job("b", 3, 10, submit=1), job("c", 1, 10, submit=2)
    d = decide("fcfs", view(4, queue=[a, b, c]), now=2)
    # a fits (2 of 4); b needs 3 of 2 idle -> blocks; c would fit but must wait behind b.
    assert list(started(d)) == ["a"]
    assert d.reasons["b"].startswith("head of queue")
    assert "FCFS" in d.reason_for("c")


def test_fcfs_places_on_highest_cores_first() -> None:
    d = decide("fcfs", view(5, queue=[job("a", 2, 10), job("b", 1, 10, submit=1)]), now=1)
    assert started(d) == {"a": (4, 3), "b": (2,)}


def test_fcfs_skips_jobs_not_yet_submitted() -> None:
    d = decide("fcfs", view(4, queue=[job("a", 1, 10), job("late", 1, 10, submit=50)]), now=0)
    assert list(started(d)) == ["a"]
    assert "not submitted" in d.reasons["late"]


# ------------------------------------------------------------------------------------ easy


def _easy_setup() -> ClusterView:
    # 5 cores; J1 (2 cores, ends at 10) running on cores 3-4. Head J2 needs 4 -> shadow 10, extra 1.
    j1 = job("J1", 2, 10)
    queue = [
        job("J2", 4, 6, submit=0.1),
        job("J3", 2, 5, submit=0.2),  # ends at 5 <= 10: backfill by the shadow rule
        job("J4", 1, 11, submit=0.3),  # ends at 11 > 10 but 1 <= extra: backfill, extra -> 0
        job("J5", 1, 1, submit=0.4),  # no idle core left
    ]
    return view(5, queue=queue, running=[(j1, Tier.FG, (3, 4), 0.0)])


def test_easy_reservation_and_both_backfill_conditions() -> None:
    d = decide("easy", _easy_setup(), now=0.5)
    assert started(d) == {"J3": (2, 1), "J4": (0,)}
    assert d.reasons["J2"] == "head of queue: reservation at t=10 needs 4 cores"
    assert d.reason_for("J5").startswith("does not fit")


def test_easy_extra_is_consumed() -> None:
    # Two long single-core jobs: only the first may use the one extra core.
    j1 = job("J1", 2, 10)
    queue = [job("J2", 4, 6, submit=0.1), job("L1", 1, 50, submit=0.2), job("L2", 1, 50, submit=0.3)]
    d = decide("easy", view(5, queue=queue, running=[(j1, Tier.FG, (3, 4), 0.0)]), now=0.5)
    assert list(started(d)) == ["L1"]


def test_easy_long_job_beyond_shadow_without_extra_waits() -> None:
    # Head needs all 5 cores -> extra 0; a 2-core job ending after the shadow may not start.
    j1 = job("J1", 2, 10)
    queue = [job("H", 5, 6, submit=0.1), job("long", 2, 20, submit=0.2), job("short", 2, 9, submit=0.3)]
    d = decide("easy", view(5, queue=queue, running=[(j1, Tier.FG, (3, 4), 0.0)]), now=1)
    assert list(started(d)) == ["short"]  # 1 + 9 = 10 <= shadow 10


def test_easy_shadow_uses_expected_end_order() -> None:
    # Running: A (1 core) ends at 30, B (2 cores) ends at 20, C (1 core) ends at 40. Head needs 3
    # with 1 idle -> B's end (20) brings 3 idle: shadow 20, extra 0.
    a, b, c = job("A", 1, 30), job("B", 2, 20), job("C", 1, 40)
    run = [(a, Tier.FG, (0,), 0.0), (b, Tier.FG, (1, 2), 0.0), (c, Tier.FG, (3,), 0.0)]
    queue = [job("H", 3, 5, submit=1), job("x", 1, 17, submit=2), job("y", 1, 18, submit=3)]
    d = decide("easy", view(5, queue=queue, running=run), now=3)
    assert d.reasons["H"] == "head of queue: reservation at t=20 needs 3 cores"
    assert list(started(d)) == ["x"]  # 3 + 17 = 20 <= 20; y would end at 21 with extra 0


def test_easy_reason_names_the_reservation_exactly_at_epoch_times() -> None:
    # vmctld runs on epoch seconds: "t=1.79546e+09" (6 significant digits) was off by up to an hour.
    now = 1_795_460_000.0
    run = [(job("A", 2, 1234.5, submit=now - 10), Tier.FG, (0, 1), now)]
    queue = [job("H", 3, 5, submit=now - 5), job("x", 1, 5, submit=now - 4)]  # x is backfilled onto core 2
    d = decide("easy", view(3, queue=queue, running=run), now=now)
    assert d.reasons["H"] == "head of queue: reservation at t=1795461234.5 needs 3 cores"


def test_easy_counts_jobs_started_in_the_same_call() -> None:
    # At t=1 FCFS starts A (3 cores, ends at 6); head H needs 4 of 1 idle: shadow 6 (A's end), extra 0.
    queue = [job("A", 3, 5), job("H", 4, 1, submit=0.1), job("s", 1, 5, submit=0.2), job("t", 1, 6, submit=0.3)]
    d = decide("easy", view(4, queue=queue), now=1)
    assert list(started(d)) == ["A", "s"]
    assert d.reasons["H"] == "head of queue: reservation at t=6 needs 4 cores"
    queue2 = [job("A", 3, 5), job("H", 4, 1, submit=0.1), job("t", 1, 6, submit=0.3)]
    assert list(started(decide("easy", view(4, queue=queue2), now=1))) == ["A"]


def test_easy_with_no_idle_core_gives_head_reason() -> None:
    a = job("A", 4, 10)
    d = decide("easy", view(4, queue=[job("H", 2, 1, submit=1)], running=[(a, Tier.FG, (0, 1, 2, 3), 0.0)]), now=1)
    assert d.actions == ()
    assert d.reasons["H"].startswith("head of queue")


def test_easy_job_wider_than_cluster_does_not_block() -> None:
    queue = [job("huge", 9, 10), job("a", 1, 10, submit=1)]
    d = decide("easy", view(4, queue=queue), now=1)
    assert list(started(d)) == ["a"]
    assert "only 4 fg cores" in d.reasons["huge"]


def test_easy_ignores_unusable_cores() -> None:
    d = decide("easy", view(4, queue=[job("a", 3, 10)], unusable=[3]), now=0)
    assert started(d) == {"a": (2, 1, 0)}


# ------------------------------------------------------------------------------------ sjf


def test_sjf_orders_by_estimate_and_skips_wide_jobs() -> None:
    queue = [
        job("long", 1, 100),
        job("wide", 3, 1, submit=1),
        job("mid", 1, 50, submit=2),
        job("short", 1, 10, submit=3),
        job("short2", 1, 10, submit=4),
    ]
    d = decide("sjf", view(3, queue=queue), now=5)
    # wide (estimate 1) is first but needs 3 cores; after "short" only 2 remain... order: wide fits at
    # first (3 of 3 idle) -> it starts and fills the machine.
    assert list(started(d)) == ["wide"]
    d2 = decide("sjf", view(4, queue=queue), now=5)
    assert list(started(d2)) == ["wide", "short"]
    d3 = decide("sjf", view(4, queue=[q for q in queue if q.id != "wide"]), now=5)
    assert list(started(d3)) == ["short", "short2", "mid", "long"]


def test_sjf_has_no_reservation() -> None:
    a = job("A", 2, 10)
    queue = [job("H", 4, 1), job("long", 2, 1000, submit=1)]
    d = decide("sjf", view(4, queue=queue, running=[(a, Tier.FG, (0, 1), 0.0)]), now=1)
    assert list(started(d)) == ["long"]  # EASY would hold it back: it delays H
    assert list(started(decide("easy", view(4, queue=queue, running=[(a, Tier.FG, (0, 1), 0.0)]), now=1))) == []


def test_easy_extra_counts_every_job_ending_at_the_shadow_time() -> None:
    # A (1 core) and B (2 cores) both end at 10, core 3 is idle; head H needs 2. A's end alone would
    # do, but at t=10 B's cores are free too: extra = 1 + 1 + 2 - 2 = 2 (not 0 by tie order).
    a, b = job("A", 1, 10), job("B", 2, 10)
    queue = [job("H", 2, 5, submit=0.1), job("L", 1, 50, submit=0.2)]
    v = view(4, queue=queue, running=[(a, Tier.FG, (0,), 0.0), (b, Tier.FG, (1, 2), 0.0)])
    d = decide("easy", v, now=1)
    assert d.reservation is not None
    assert (d.reservation.shadow_time, d.reservation.extra_cores) == (10.0, 2)
    assert list(started(d)) == ["L"]


def test_fcfs_skips_a_job_wider_than_the_usable_cores() -> None:
    d = decide("fcfs", view(4, queue=[job("huge", 4, 10), job("a", 1, 10, submit=1)], unusable=[0]), now=1)
    assert list(started(d)) == ["a"]
    assert "only 3 fg cores" in d.reasons["huge"]


def test_easy_reservation_is_computed_only_when_something_could_backfill() -> None:
    # Head H needs 3 of 1 idle; the only other job needs 2: nothing fits now, so no reservation.
    a = job("A", 3, 10)
    queue = [job("H", 3, 5, submit=0.1), job("w", 2, 1, submit=0.2)]
    d = decide("easy", view(4, queue=queue, running=[(a, Tier.FG, (0, 1, 2), 0.0)]), now=1)
    assert d.actions == () and d.reservation is None
    assert d.reasons["H"] == "head of queue: needs 3 cores, 1 idle"
    assert d.reason_for("w") == "waiting behind the head H"
