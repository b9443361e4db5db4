"""Hand-checked scenarios for the two-tier policies keasy, reasy, measy (MEASY paper sec. 2.2-2.3)."""

from __future__ import annotations

import pytest

from tests.viewbuilder import job, view
from vmctl.errors import PolicyParameterError
from vmctl.model import ClusterView, Decision, Job, Kill, Migrate, Promote, Reservation, StartBg, StartFg, Tier
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import create_policy

TWO_TIER = ("keasy", "reasy", "measy")
KILL = "restarted in the fg tier (KEASY)"


def run(policy: str, v: ClusterView, now: float, **params: object) -> Decision:
    d = create_policy(policy, **params).decide(v, now)
    check_decision(v, d, now)
    return d


def bg_starts(d: Decision) -> dict[str, tuple[int, ...]]:
    return {a.job_id: a.cores for a in d.actions if isinstance(a, StartBg)}


# ------------------------------------------------------------------------------------ parameters


def test_parameters_are_validated() -> None:
    # the paper's parameters; the queue-order options (default: submit order) are left out of reports
    assert create_policy("measy").reported_params() == {"bg_util_threshold": 0.96, "use_cpu_info": True,
                                                        "migration_cost": 20.0}
    assert create_policy("measy").params["queue_order"] == "submit"
    assert create_policy("measy", migration_cost=5).params["migration_cost"] == 5.0
    with pytest.raises(PolicyParameterError, match="bg_util_threshold"):
        create_policy("keasy", bg_util_threshold=1.5)
    with pytest.raises(PolicyParameterError, match="migration_cost"):
        create_policy("measy", migration_cost=-1.0)
    with pytest.raises(PolicyParameterError, match="unknown"):
        create_policy("keasy", migration_cost=1.0)
    with pytest.raises(PolicyParameterError, match="must be bool"):
        create_policy("reasy", use_cpu_info=1)


# ------------------------------------------------------------------------------------ deploy


def test_promote_in_place_when_own_fg_slots_are_idle() -> None:
    b = job("b", 2, 50, usage=0.5)
    v = view(4, running=[(b, Tier.BG, (1, 2), 0.0)], now=10.0)
    for name in TWO_TIER:
        assert run(name, v, 10.0).actions == (Promote("b"),), name


def _moving_view() -> ClusterView:
    # 4 cores. F (fg, core 1) ends at 100. B (bg on 0-1, progress 10) arrived after the queued head H
    # (4 cores): H's reservation is at t=100 with extra 0, so B may only be backfilled if it ends
    # by 100. Cores 0, 2, 3 have idle fg slots.
    f = job("F", 1, 100)
    b = job("B", 2, 50, submit=1)
    h = job("H", 4, 10, submit=0.5)
    return view(4, queue=[h], running=[(f, Tier.FG, (1,), 0.0), (b, Tier.BG, (0, 1), 1.0)], now=10.0,
                progress={"B": 10})  # fmt: skip


def test_keasy_kills_and_restarts_from_scratch() -> None:
    d = run("keasy", _moving_view(), 10.0)
    # 10 + 50 (full estimate: a restart loses the progress) <= 100. Idle fg cores 3, 2, 0 all carry
    # no other bg process: highest index first.
    assert d.actions == (Kill("B", requeue=True, reason=KILL), StartFg("B", (3, 2)))
    assert d.reasons["H"] == "head of queue: reservation at t=100 needs 4 cores"


def test_measy_migrates_with_cost() -> None:
    d = run("measy", _moving_view(), 10.0)
    assert d.actions == (Migrate("B", (3, 2), Tier.FG, 20.0),)  # 10 + 20 + 50 = 80 <= 100
    d2 = run("measy", _moving_view(), 10.0, migration_cost=45.0)
    assert d2.actions == ()  # 10 + 45 + 50 = 105 > 100 and no extra core


def test_reasy_never_moves_a_bg_job() -> None:
    assert run("reasy", _moving_view(), 10.0).actions == ()


def test_step1_fcfs_runs_over_queue_and_bg_jobs_in_arrival_order() -> None:
    # B (bg, arrived at 0) comes before the queued Q (arrived at 1): FCFS deploys B first, even if
    # that means a kill (no reservation is involved in step 1). Q then does not fit.
    f = job("F", 1, 100)
    b = job("B", 2, 50)
    q = job("Q", 2, 5, submit=1)
    v = view(3, queue=[q], running=[(f, Tier.FG, (0,), 0.0), (b, Tier.BG, (0, 1), 0.0)], now=2.0)
    d = run("keasy", v, 2.0)
    assert d.actions[:2] == (Kill("B", requeue=True, reason=KILL), StartFg("B", (2, 1)))
    assert all(a.job_id != "Q" or isinstance(a, StartBg) for a in d.actions)
    d = run("measy", v, 2.0)
    assert d.actions[0] == Migrate("B", (2, 1), Tier.FG, 20.0)


# ------------------------------------------------------------------------------------ REASY reservation


def test_reasy_figure5_shadow_and_extra_for_a_bg_head() -> None:
    # Figure 5: J3 runs in bg on P2-3 under J1 (fg, ends at 10); P1's fg is idle. Reservation for J3:
    # shadow 10, extra = P1. A long job may use P1 (extra), then nothing else fits.
    j1 = job("J1", 2, 10)
    j3 = job("J3", 2, 8)
    queue = [job("J4", 1, 50, submit=1), job("J5", 1, 3, submit=1.5)]
    v = view(3, queue=queue, running=[(j1, Tier.FG, (1, 2), 0.0), (j3, Tier.BG, (1, 2), 0.0)], now=2.0)
    d = run("reasy", v, 2.0)
    assert [a for a in d.actions if not isinstance(a, StartBg)] == [StartFg("J4", (0,))]
    assert "reservation of J3 at t=10" in d.default_reason
    assert d.reservation == Reservation("J3", 10.0, 1)
    # KEASY on the same view: J3 (2 cores) does not fit in 1 idle core -> ordinary reservation at 10
    # with extra 1 + 2 - 2 = 1: the same backfill.
    dk = run("keasy", v, 2.0)
    assert [a for a in dk.actions if not isinstance(a, StartBg)] == [StartFg("J4", (0,))]
    # With J1 ending at 60, KEASY's shadow moves to 60 while REASY's stays J1's end too; a 3-core
    # cluster where J1 holds only P3 separates them: REASY shadow = J1's end, extra = P1 only.
    j1b = job("J1", 1, 60)
    v2 = view(3, queue=queue, running=[(j1b, Tier.FG, (2,), 0.0), (j3, Tier.BG, (1, 2), 0.0)], now=2.0)
    d2 = run("reasy", v2, 2.0)
    assert "reservation of J3 at t=60" in d2.default_reason
    assert [a for a in d2.actions if isinstance(a, StartFg)] == [StartFg("J4", (0,)), StartFg("J5", (1,))]
    # KEASY deploys J3 at once (2 idle fg cores): kill and restart on P2-P1.
    dk2 = run("keasy", v2, 2.0)
    assert dk2.actions[:2] == (Kill("J3", requeue=True, reason=KILL), StartFg("J3", (1, 0)))


def test_reasy_long_backfill_avoids_the_heads_cores() -> None:
    # Head H runs in bg on cores 1-2; core 2's fg runs F until 10, core 1's fg is idle, core 0 idle.
    # extra = 1 (core 0). L (long) must not take core 1 (H needs it at 10); S (short) may.
    f = job("F", 1, 10)
    h = job("H", 2, 20)
    x = job("X", 1, 100)
    queue = [job("L", 1, 50, submit=1), job("S", 1, 3, submit=1.5)]
    running = [(f, Tier.FG, (2,), 0.0), (h, Tier.BG, (1, 2), 0.0), (x, Tier.FG, (3,), 0.0)]
    v = view(4, queue=queue, running=running, now=2.0)
    d = run("reasy", v, 2.0)
    fg = [a for a in d.actions if isinstance(a, StartFg)]
    assert fg == [StartFg("L", (0,)), StartFg("S", (1,))]


def test_reasy_long_backfill_waits_when_only_head_cores_are_idle() -> None:
    f = job("F", 1, 10)
    h = job("H", 2, 20)
    x = job("X", 1, 100)
    queue = [job("L", 1, 50, submit=1)]
    running = [(f, Tier.FG, (2,), 0.0), (h, Tier.BG, (1, 2), 0.0), (x, Tier.FG, (0,), 0.0)]
    v = view(3, queue=queue, running=running, now=2.0)
    d = run("reasy", v, 2.0)
    assert [a for a in d.actions if isinstance(a, StartFg)] == []


# ------------------------------------------------------------------------------------ bg tier


def _busy_view(utils: dict[int, float], queue: list) -> ClusterView:  # type: ignore[type-arg]
    # Every core's fg runs a single long job; the queue head H (wide) blocks the fg tier.
    n = len(utils)
    big = job("BIG", n, 1000)
    return view(n, queue=[job("H", n, 10_000), *queue], running=[(big, Tier.FG, tuple(range(n)), 0.0)],
                fg_util=utils, now=1.0)  # fmt: skip


def test_bg_only_under_the_threshold() -> None:
    q = [job("a", 1, 10, submit=0.1), job("b", 1, 20, submit=0.2), job("c", 1, 30, submit=0.3)]
    v = _busy_view({0: 0.95, 1: 0.97, 2: 0.5}, q)
    for name in TWO_TIER:
        d = run(name, v, 1.0)
        # shortest first onto the least-utilized core: a -> core 2 (0.5), b -> core 0 (0.95)
        assert bg_starts(d) == {"a": (2,), "b": (0,)}, name
        assert d.reason_for("c")
    assert bg_starts(run("keasy", v, 1.0, bg_util_threshold=0.99)) == {"a": (2,), "b": (0,), "c": (1,)}
    assert bg_starts(run("keasy", v, 1.0, bg_util_threshold=0.5)) == {}


def test_without_cpu_info_bg_goes_only_under_idle_fg() -> None:
    q = [job("a", 1, 2000, submit=0.1), job("b", 1, 3000, submit=0.2)]
    v = _busy_view({0: 0.1, 1: 0.2, 2: 0.3}, q)
    assert bg_starts(run("measy", v, 1.0, use_cpu_info=False)) == {}
    # Same with one idle fg core: the bg slot under it is usable.
    f = job("F", 2, 1000)
    v2 = view(3, queue=[job("H", 3, 5), *q], running=[(f, Tier.FG, (0, 1), 0.0)], fg_util={0: 0.1, 1: 0.1}, now=1.0)
    d = run("measy", v2, 1.0, use_cpu_info=False)
    assert bg_starts(d) == {"a": (2,)}


def test_bg_job_needs_all_its_processes_to_fit() -> None:
    q = [job("wide", 3, 1, submit=0.1, usage=0.5), job("two", 2, 50, submit=0.2, usage=0.5)]
    v = _busy_view({0: 0.5, 1: 0.99, 2: 0.5}, q)
    d = run("keasy", v, 1.0)
    assert bg_starts(d) == {"two": (2, 0)}


def test_bg_sjf_order_ties_by_arrival() -> None:
    q = [job("late", 1, 10, submit=0.5), job("early", 1, 10, submit=0.2), job("long", 1, 5000, submit=0.1)]
    v = _busy_view({0: 0.3, 1: 0.6}, q)
    d = run("keasy", v, 1.0)
    assert bg_starts(d) == {"early": (0,), "late": (1,)}


def test_dispatch_bg_matches_heavy_processes_to_light_cores() -> None:
    j = Job(id="m", submit_time=0.1, procs=3, estimate=10, cpu_usage=(0.3, 0.9, 0.6))
    v = _busy_view({0: 0.4, 1: 0.7, 2: 0.1}, [j])
    d = run("keasy", v, 1.0)
    # processes by usage: p1 (0.9), p2 (0.6), p0 (0.3); cores by fg util: 2 (0.1), 0 (0.4), 1 (0.7)
    assert bg_starts(d) == {"m": (1, 2, 0)}


def test_dispatch_fg_puts_heavy_processes_where_no_bg_process_suffers() -> None:
    # Idle fg cores 0, 1, 2; their bg slots run processes of usage 0.8 (core 0), nothing (core 1),
    # 0.3 (core 2). A queued 2-process job (usages 0.2, 1.0): p1 (1.0) -> core 1, p0 (0.2) -> core 2.
    # b1 and b2 arrive after q so that q comes first in the merged list.
    b1 = Job(id="b1", submit_time=0.5, procs=1, estimate=500, cpu_usage=(0.8,))
    b2 = Job(id="b2", submit_time=0.6, procs=1, estimate=500, cpu_usage=(0.3,))
    q = Job(id="q", submit_time=0.0, procs=2, estimate=10, cpu_usage=(0.2, 1.0))
    blocker = job("X", 1, 100)
    running = [(b1, Tier.BG, (0,), 0.5), (b2, Tier.BG, (2,), 0.6), (blocker, Tier.FG, (3,), 0.0)]
    v = view(4, queue=[q], running=running, now=1.0)
    d = run("keasy", v, 1.0)
    assert d.actions[0] == StartFg("q", (2, 1))
    # the remaining idle fg core 0 lets b1 promote in place; b2's core now has q's fg process
    assert Promote("b1") in d.actions


def test_queue_empty_but_bg_job_promotable() -> None:
    b = job("b", 1, 50)
    v = view(2, running=[(b, Tier.BG, (0,), 0.0), (job("f", 1, 9), Tier.FG, (1,), 0.0)], now=1.0)
    for name in TWO_TIER:
        assert run(name, v, 1.0).actions == (Promote("b"),)


def test_no_bg_on_core_whose_fg_was_just_given_a_heavy_process() -> None:
    # 2 cores, both idle. FCFS starts A (1 core, 100 %) and H (needs 2) blocks. Step 3 must see A's
    # 100 % fg process on its core and put the bg job only on the other (idle-fg) core.
    queue = [job("A", 1, 100, usage=1.0), job("H", 2, 5, submit=0.1), job("s", 1, 3, submit=0.2)]
    v = view(2, queue=queue, now=1.0)
    d = run("keasy", v, 1.0)
    assert d.actions[0] == StartFg("A", (1,))
    # s ends at 4 > shadow 101? no: shadow = 101, s ends at 4 -> backfilled to fg core 0 instead.
    assert d.actions[1] == StartFg("s", (0,))
    queue2 = [job("A", 1, 100, usage=1.0), job("H", 2, 5, submit=0.1), job("s", 1, 300, submit=0.2)]
    d2 = run("keasy", view(2, queue=queue2, now=1.0), 1.0)
    assert d2.actions == (StartFg("A", (1,)), StartBg("s", (0,)))


def test_migration_prefers_own_cores_then_cores_without_bg_work() -> None:
    # B (bg on 0-1) arrived first; F holds core 1's fg. X and Y (later) run in bg on cores 2 and 3.
    # Idle fg: 0, 2, 3. B's own core 0 will have an empty bg slot once B leaves it: key 0, first.
    # Then cores 3 and 2 both carry a 100 % bg process: highest index first -> B goes to (0, 3).
    # X can then be promoted in place on core 2; Y's core now has B's fg process.
    f = job("F", 1, 100)
    b = job("B", 2, 50)
    x = job("X", 1, 30, submit=1)
    y = job("Y", 1, 30, submit=2)
    running = [(f, Tier.FG, (1,), 0.0), (b, Tier.BG, (0, 1), 0.0), (x, Tier.BG, (2,), 1.0), (y, Tier.BG, (3,), 2.0)]
    v = view(4, running=running, now=5.0)
    d = run("measy", v, 5.0)
    assert d.actions == (Migrate("B", (0, 3), Tier.FG, 20.0), Promote("X"))
    dk = run("keasy", v, 5.0)
    assert dk.actions == (Kill("B", requeue=True, reason=KILL), StartFg("B", (0, 3)), Promote("X"))


def test_without_cpu_info_fg_dispatch_ignores_usages() -> None:
    # Idle fg cores 0 and 2 both carry a bg process (usage 0.2 on core 0, 0.9 on core 2); cores 1 and
    # 3 are busy in fg. With usage known, q (arrived first) goes where the bg process is lighter
    # (core 0); without CPU information both count as 1.0 and the higher index wins (core 2).
    q = job("q", 1, 10)
    b1 = Job(id="b1", submit_time=1.0, procs=1, estimate=500, cpu_usage=(0.2,))
    b2 = Job(id="b2", submit_time=1.0, procs=1, estimate=500, cpu_usage=(0.9,))
    f1, f3 = job("F1", 1, 100), job("F3", 1, 100)
    running = [(b1, Tier.BG, (0,), 1.0), (b2, Tier.BG, (2,), 1.0), (f1, Tier.FG, (1,), 0.0), (f3, Tier.FG, (3,), 0.0)]
    v = view(4, queue=[q], running=running, now=2.0)
    assert run("keasy", v, 2.0).actions[0] == StartFg("q", (0,))
    assert run("keasy", v, 2.0, use_cpu_info=False).actions[0] == StartFg("q", (2,))


# ------------------------------------------------------------------------------------ waiting reasons


def test_queued_jobs_behind_a_running_bg_job_are_told_so_not_that_a_head_blocks_them() -> None:
    # issue 25 item 2: F holds every fg core, B runs in bg (submitted before Q). The first job of the
    # merged list is B, a running job: Q's reason said "waiting behind the head B", which reads as if a
    # queued job B were ahead of it; it waits for fg cores, which B gets first.
    f = job("F", 2, 100, usage=0.5)
    b = job("B", 2, 50)
    q = job("Q", 2, 5, submit=1)
    v = view(2, queue=[q], running=[(f, Tier.FG, (0, 1), 0.0), (b, Tier.BG, (0, 1), 0.0)], now=2.0)
    for name in TWO_TIER:
        d = run(name, v, 2.0)
        assert d.actions == () and d.reservation is None, name
        assert d.reason_for("Q") == ("waiting for fg cores (none idle): bg job B, running and submitted earlier, "
                                     "goes to fg before it"), name
        assert "head" not in d.reason_for("Q")
    # under the multifactor order the bg job is ahead by that order, not by its submission
    d = run("measy", v, 2.0, queue_order="multifactor")
    assert "ahead of it in the multifactor order" in d.reason_for("Q")


def test_the_reason_names_a_bg_job_s_reservation_as_its_move_to_fg() -> None:
    # REASY: B (bg on cores 1-2) can reach fg only on its own cores, under F (fg, ends at 10): B holds
    # the reservation; Q, wider than what is left, waits for it.
    f = job("F", 2, 10)
    b = job("B", 2, 8)
    q = job("Q", 3, 50, submit=1)
    v = view(3, queue=[q], running=[(f, Tier.FG, (1, 2), 0.0), (b, Tier.BG, (1, 2), 0.0)], now=2.0)
    d = run("reasy", v, 2.0)
    assert d.reservation == Reservation("B", 10.0, 1)
    assert d.reason_for("Q") == ("does not fit, or would delay the reservation of B at t=10 (bg job B, running "
                                 "and submitted earlier, goes to fg by then)")
