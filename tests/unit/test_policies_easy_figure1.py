"""The paper's Figure 1 example (MEASY paper sec. 2.2.2 and 2.3.1), driven through ``decide``.

The job sizes and times in the figure were lost in conversion; this is a set consistent with every
sentence of the text. Processors P1..P5 are cores 0..4. Single-process jobs use 100 % CPU, the
processes of multi-process jobs 50 % (under the 96 % threshold), as the example assumes.

    job  procs estimate       job  procs estimate
    J01  2     10             J07  1     5
    J02  4     6              J08  1     4
    J03  2     5              J09  1     5
    J04  1     11             J10  1     6
    J05  1     2              J11  5     10
    J06  1     3              J12  2     8

t=0: J01 by FCFS onto P4-5; J02 (4) does not fit -> reservation at t=10 (J01 ends), extra 1; J03 ends at
5 <= 10 and J04 uses the extra core: both backfilled onto P1-3; SJF puts J05, J06, J08, J07 (estimates
2, 3, 4, 5) onto the bg of P5, P4, P3, P2 (P1's fg runs a 100 % process: no bg there).
t=5 (J03 and J05 done, J05-J08 advanced 2): J06 is killed and restarted on P3's fg, J07 is promoted in
place on P2, J09 and J10 go to the bg of P5 and P4.
t=8 (J06, J07 done): J08 cannot be backfilled (8 + 4 > 10) and stays in bg.
t=11 (J04 done, J02 runs on P2-5 since t=10): KEASY restarts J09, the head, on P1's fg; REASY keeps
J09 pinned in bg and makes a reservation for it instead.
"""

from __future__ import annotations

from tests.viewbuilder import job, view
from vmctl.model import Action, ClusterView, Decision, Job, Kill, Migrate, Promote, StartBg, StartFg, Tier
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import create_policy

P1, P2, P3, P4, P5 = range(5)


def _j(n: int, procs: int, est: float) -> Job:
    return job(f"J{n:02d}", procs, est, usage=1.0 if procs == 1 else 0.5)


J = {
    n: _j(n, p, e)
    for n, p, e in [
        (1, 2, 10), (2, 4, 6), (3, 2, 5), (4, 1, 11), (5, 1, 2), (6, 1, 3),
        (7, 1, 5), (8, 1, 4), (9, 1, 5), (10, 1, 6), (11, 5, 10), (12, 2, 8),
    ]
}  # fmt: skip


def run(policy: str, v: ClusterView, now: float, **params: object) -> Decision:
    d = create_policy(policy, **params).decide(v, now)
    check_decision(v, d, now)
    return d


def view_t0() -> ClusterView:
    return view(5, queue=J.values())


T0_ACTIONS: tuple[Action, ...] = (
    StartFg("J01", (P5, P4)),
    StartFg("J03", (P3, P2)),
    StartFg("J04", (P1,)),
    StartBg("J05", (P5,)),
    StartBg("J06", (P4,)),
    StartBg("J08", (P3,)),
    StartBg("J07", (P2,)),
)


def test_t0_all_two_tier_policies() -> None:
    for name in ("keasy", "reasy", "measy"):
        d = run(name, view_t0(), 0.0)
        assert d.actions == T0_ACTIONS, name
        assert d.reasons["J02"] == "head of queue: reservation at t=10 needs 4 cores"


def test_t0_easy_is_the_fg_part() -> None:
    d = run("easy", view_t0(), 0.0)
    assert d.actions == T0_ACTIONS[:3]


def view_t5() -> ClusterView:
    running = [
        (J[1], Tier.FG, (P5, P4), 0.0),
        (J[4], Tier.FG, (P1,), 0.0),
        (J[6], Tier.BG, (P4,), 0.0),
        (J[7], Tier.BG, (P2,), 0.0),
        (J[8], Tier.BG, (P3,), 0.0),
    ]
    queue = [J[2], J[9], J[10], J[11], J[12]]
    return view(5, queue=queue, running=running, now=5.0, progress={"J06": 2, "J07": 2, "J08": 2})


def test_t5_keasy_kills_and_restarts_j6_promotes_j7() -> None:
    d = run("keasy", view_t5(), 5.0)
    assert d.actions == (
        Kill("J06", requeue=True, reason="restarted in the fg tier (KEASY)"),
        StartFg("J06", (P3,)),
        Promote("J07"),
        StartBg("J09", (P5,)),
        StartBg("J10", (P4,)),
    )
    assert d.reasons["J02"] == "head of queue: reservation at t=10 needs 4 cores"


def test_t5_measy_migrates_instead_of_killing() -> None:
    d = run("measy", view_t5(), 5.0, migration_cost=0.5)
    assert d.actions == (
        Migrate("J06", (P3,), Tier.FG, 0.5),
        Promote("J07"),
        StartBg("J09", (P5,)),
        StartBg("J10", (P4,)),
    )


def test_t5_measy_default_cost_makes_j6_miss_the_shadow() -> None:
    # 5 + 20 + 3 > 10 and no extra core: J06 stays; J07 and then J08 (5 + 4 <= 10) promote in place.
    d = run("measy", view_t5(), 5.0)
    assert d.actions == (Promote("J07"), Promote("J08"), StartBg("J09", (P5,)))


def test_t5_reasy_keeps_j6_pinned() -> None:
    d = run("reasy", view_t5(), 5.0)
    assert all(a.job_id != "J06" for a in d.actions)
    assert d.actions == (Promote("J07"), Promote("J08"), StartBg("J09", (P5,)))


def view_t8() -> ClusterView:
    running = [
        (J[1], Tier.FG, (P5, P4), 0.0),
        (J[4], Tier.FG, (P1,), 0.0),
        (J[8], Tier.BG, (P3,), 0.0),
        (J[9], Tier.BG, (P5,), 5.0),
        (J[10], Tier.BG, (P4,), 5.0),
    ]
    queue = [J[2], J[11], J[12]]
    return view(5, queue=queue, running=running, now=8.0, progress={"J08": 2.1, "J09": 0.5, "J10": 0.5})


def test_t8_j8_cannot_be_backfilled() -> None:
    for name in ("keasy", "reasy", "measy"):
        d = run(name, view_t8(), 8.0)
        # J08's own fg slot is idle but 8 + 4 > 10 (shadow) and there is no extra core.
        assert d.actions == (), name
        assert d.reasons["J02"] == "head of queue: reservation at t=10 needs 4 cores"


def view_t11() -> ClusterView:
    running = [
        (J[2], Tier.FG, (P3, P2, P5, P4), 10.0),
        (J[9], Tier.BG, (P5,), 5.0),
        (J[10], Tier.BG, (P4,), 5.0),
    ]
    queue = [J[11], J[12]]
    return view(5, queue=queue, running=running, now=11.0, progress={"J09": 2, "J10": 1})


def test_t11_keasy_restarts_the_head_j9_on_p1() -> None:
    d = run("keasy", view_t11(), 11.0)
    kill = Kill("J09", requeue=True, reason="restarted in the fg tier (KEASY)")
    assert d.actions[:2] == (kill, StartFg("J09", (P1,)))


def test_t11_reasy_reserves_for_the_bg_head_j9() -> None:
    d = run("reasy", view_t11(), 11.0)
    # J09 is pinned to P5 whose fg runs J02 until 16: nothing moves to fg. The one idle fg core P1
    # is J09's extra; J11 (5 cores) and J12 (2 cores) do not fit; J12 goes nowhere in bg either
    # (P1's bg is the only empty bg slot).
    assert [a for a in d.actions if not isinstance(a, StartBg)] == []
    assert "reservation of J09 at t=16" in d.default_reason
