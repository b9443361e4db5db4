"""Paper 002 (HSRET): the task model and the four policies on cases small enough to check by hand."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from vmctl.errors import UnknownPolicyError, ValidationError
from vmctl.policies.moldable import AFCFS, CBSP, HSRET, AllEFT, make_policy
from vmctl.policies.moldable.availability import earliest_start, earliest_starts, reach, reach_rows, reserve
from vmctl.policies.moldable.hsret import edf_pack, getnet, load_case, select_net, slot_loads
from vmctl.policies.moldable.model import Clusters, Profile, SlotView, check_slot, check_task, hopeless

Waiting = tuple[float, float, float, int]  # arrival, deadline, length, profile
Active = tuple[float, float, float, int, int, int, int]  # arrival, deadline, length, profile, cluster, width, rem


def view(now: int, slot: float, nodes: Sequence[int], speed: Sequence[float], profiles: Sequence[Profile],
         waiting: Sequence[Waiting] = (), active: Sequence[Active] = (),
         finished: Sequence[Waiting] = ()) -> SlotView:
    w = np.array(waiting, dtype=np.float64).reshape(-1, 4)
    a = np.array(active, dtype=np.float64).reshape(-1, 7)
    f = np.array(finished, dtype=np.float64).reshape(-1, 4)
    return SlotView(
        now=now, slot=slot, clusters=Clusters(tuple(nodes), tuple(speed)), profiles=tuple(profiles),
        w_id=np.arange(len(w), dtype=np.int64), w_arrival=w[:, 0], w_deadline=w[:, 1], w_length=w[:, 2],
        w_profile=w[:, 3].astype(np.int64),
        a_id=np.arange(100, 100 + len(a), dtype=np.int64), a_arrival=a[:, 0], a_deadline=a[:, 1],
        a_length=a[:, 2], a_profile=a[:, 3].astype(np.int64), a_cluster=a[:, 4].astype(np.int64),
        a_width=a[:, 5].astype(np.int64), a_rem=a[:, 6].astype(np.int64),
        f_arrival=f[:, 0], f_deadline=f[:, 1], f_length=f[:, 2], f_profile=f[:, 3].astype(np.int64))


def starts(decision: object) -> list[tuple[int, int, int]]:
    return [(s.task, s.cluster, s.width) for s in decision.starts]  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------- the model


def test_profile_normalized_time_eq7() -> None:
    p = Profile("x", (1, 2, 4), (100.0, 60.0, 40.0))
    # (et - min) / (max - min): (100-40)/60, (60-40)/60, 0
    assert p.net.tolist() == pytest.approx([1.0, 1 / 3, 0.0])
    assert p.r.tolist() == pytest.approx([1.0, 0.6, 0.4])
    assert [p.index_for_net(x) for x in (1.0, 0.5, 1 / 3, 0.2, 0.0)] == [0, 1, 1, 2, 2]
    assert p.minstep() == pytest.approx(1 / 3)
    assert (p.minp, p.maxp) == (1, 4)
    assert Profile("flat", (2, 4), (10.0, 10.0)).net.tolist() == [0.0, 0.0]


@pytest.mark.parametrize(("widths", "times", "field"), [
    ((1, 2, 4), (100.0, 110.0, 40.0), "shape.times[1]"),   # not monotone: slower on more nodes
    ((1, 4, 2), (100.0, 60.0, 40.0), "shape.widths[2]"),    # widths not increasing
    ((1, 2), (100.0, 0.0), "shape.times[1]"),               # not positive
    ((1, 2), (100.0,), "shape.times"),                      # one time per width
    ((0, 2), (100.0, 50.0), "shape.widths"),                # width < 1
    ((), (), "shape.widths"),
])
def test_profile_bad_input_names_the_field(widths: tuple[int, ...], times: tuple[float, ...], field: str) -> None:
    with pytest.raises(ValidationError) as exc:
        Profile("x", widths, times)
    assert exc.value.fields["field"] == field


def test_width_outside_the_profile_is_refused() -> None:
    p = Profile("x", (4, 8, 16), (10.0, 6.0, 4.0))
    assert p.index(8) == 1
    for bad in (2, 12, 32):
        with pytest.raises(ValidationError) as exc:
            p.index(bad)
        assert exc.value.fields["field"] == "width"
        assert "minp 4, maxp 16" in str(exc.value)


def test_bad_slot_task_and_clusters() -> None:
    for bad in (0, -360, float("nan"), True):
        with pytest.raises(ValidationError) as exc:
            check_slot(bad)  # type: ignore[arg-type]
        assert exc.value.fields["field"] == "slot"
    with pytest.raises(ValidationError) as exc:
        check_task(100.0, 50.0, 10.0)
    assert exc.value.fields["field"] == "task.deadline"
    with pytest.raises(ValidationError) as exc:
        check_task(0.0, 50.0, 0.0)
    assert exc.value.fields["field"] == "task.length"
    with pytest.raises(ValidationError) as exc:
        Clusters((10, 0), (1.0, 1.0))
    assert exc.value.fields["field"] == "clusters.nodes[1]"
    with pytest.raises(ValidationError) as exc:
        Clusters((10,), (-1.0,))
    assert exc.value.fields["field"] == "clusters.speed[0]"
    with pytest.raises(UnknownPolicyError):
        make_policy("sjf", np.random.default_rng(1))


def test_slots_needed_and_deadline_check() -> None:
    # the model's example: length 500, rel (1, 0.55), speed 1.1, SL 360
    p = Profile("x", (4, 8), (1.0, 0.55))
    v = view(3, 360.0, [16], [1.1], [p])
    n = v.slots_needed(500.0, p)
    assert n.tolist() == [[2, 1]]
    assert v.meets(n, 1440.0).tolist() == [[False, True]]   # (3 + 1) * 360 = 1440
    assert v.meets(n, 1439.0).tolist() == [[False, False]]


# ----------------------------------------------------------------------------- AFCFS


P24 = Profile("p", (2, 4), (1.0, 0.5))


def test_afcfs_docstring_example_and_random_cluster() -> None:
    v = view(0, 100.0, [8, 8], [1.0, 0.8], [P24], waiting=[(0.0, 250.0, 300.0, 0)])
    seen = set()
    for seed in range(20):
        d = AFCFS(np.random.default_rng(seed)).decide(v)
        (task, c, w), = starts(d)
        assert (task, w) == (0, 4)   # width 2 needs 3 slots on both clusters: too late
        seen.add(c)
    assert seen == {0, 1}            # both clusters qualify, drawn at random


def test_afcfs_smallest_width_only_qualifying_cluster_and_waiting() -> None:
    # speed 0.5: width 4 needs ceil(150 / 0.5 / 100) = 3 slots there; only cluster 0 meets 250
    v = view(0, 100.0, [8, 8], [1.0, 0.5], [P24], waiting=[(0.0, 250.0, 300.0, 0), (0.0, 1000.0, 300.0, 0)])
    assert starts(AFCFS(np.random.default_rng(0)).decide(v)) in ([(0, 0, 4), (1, 0, 2)], [(0, 0, 4), (1, 1, 2)])
    # cluster 0 full: the urgent task cannot be served now but could later (its deadline is far): waits
    busy = [(0.0, 9999.0, 100.0, 0, 0, 8, 1)]
    v = view(0, 100.0, [8, 8], [1.0, 0.5], [P24], waiting=[(0.0, 599.0, 300.0, 0)], active=busy)
    # cluster 1 (speed 0.5): width 2 takes 300 / 0.5 = 600 min, 6 slots: misses 599; width 4: 3 slots
    assert starts(AFCFS(np.random.default_rng(0)).decide(v)) == [(0, 1, 4)]
    v = view(0, 100.0, [8, 8], [1.0, 0.5], [P24], waiting=[(0.0, 250.0, 300.0, 0)], active=busy)
    assert hopeless(v, 0) is False
    assert starts(AFCFS(np.random.default_rng(0)).decide(v)) == []   # only cluster 0 could, it is full


def test_afcfs_runs_a_hopeless_task_at_its_smallest_width() -> None:
    v = view(5, 100.0, [8], [1.0], [P24], waiting=[(0.0, 550.0, 300.0, 0)])
    assert hopeless(v, 0)
    assert starts(AFCFS(np.random.default_rng(0)).decide(v)) == [(0, 0, 2)]


# ----------------------------------------------------------------------------- availability / ALL-EFT


def test_reach_and_earliest_start_docstring_example() -> None:
    row = np.array([2, 4, 4, 1, 4], dtype=np.int64)
    r = reach(row, 3)
    assert r[:4].tolist() == [0, 2, 2, 2] and r[4] > 10**6
    assert earliest_start(r, np.array([1, 2, 3])).tolist() == [1, 1, 4]
    both = reach_rows(row, np.array([3, 5], dtype=np.int64))
    assert both[0].tolist() == r.tolist()
    assert both[1].tolist() == [0, 0, 0, 0, 0]
    st = earliest_starts(both, np.array([[1, 1], [3, 3]], dtype=np.int64))
    assert st[:, 0].tolist() == [1, 4] and (st[:, 1] >= len(row)).all()   # width 5 never fits
    grown = reserve(row[None, :].copy(), 0, 4, 3, 2)
    assert grown[0].tolist() == [2, 4, 4, 1, 2, 2, 2, 4]


P48 = Profile("p", (4, 8), (3.0, 2.0))   # L 300, SL 100: 3 slots at width 4, 2 at width 8


def test_alleft_docstring_example() -> None:
    # 4 of 8 nodes busy for 2 more slots: width 4 now ends at 3, width 8 starts at 2 and ends at 4
    v = view(0, 100.0, [8], [1.0], [P48], waiting=[(0.0, 9999.0, 300.0, 0)],
             active=[(0.0, 9999.0, 100.0, 0, 0, 4, 2)])
    assert starts(AllEFT().decide(v)) == [(0, 0, 4)]
    # busy for 1 more slot: width 8 from slot 1 also ends at 3 and runs shorter: reserved, nothing starts
    v = view(0, 100.0, [8], [1.0], [P48], waiting=[(0.0, 9999.0, 300.0, 0)],
             active=[(0.0, 9999.0, 100.0, 0, 0, 4, 1)])
    d = AllEFT().decide(v)
    assert starts(d) == [] and d.running.tolist() == [True]


def test_alleft_min_min_over_tasks() -> None:
    p = Profile("rigid", (4,), (1.0,))
    # one cluster of 4 nodes: B (1 slot) has the earliest finish, then A starts after it (reserved)
    v = view(0, 100.0, [4], [1.0], [p], waiting=[(0.0, 9999.0, 300.0, 0), (0.0, 9999.0, 100.0, 0)])
    assert starts(AllEFT().decide(v)) == [(1, 0, 4)]
    # two clusters, the faster one gets the long task's EFT
    v = view(0, 100.0, [4, 4], [1.0, 1.5], [p], waiting=[(0.0, 9999.0, 300.0, 0), (0.0, 9999.0, 100.0, 0)])
    assert sorted(starts(AllEFT().decide(v))) == [(0, 1, 4), (1, 0, 4)]


# ----------------------------------------------------------------------------- CBSP


def test_cbsp_docstring_example() -> None:
    p = Profile("p", (2, 4, 8), (1.0, 0.6, 0.4))
    v = view(0, 100.0, [8, 8], [1.0, 1.2], [p], waiting=[(0.0, 999.0, 100.0, 0)] * 3)
    assert starts(CBSP().decide(v)) == [(0, 1, 4), (1, 0, 4)]


def test_cbsp_waits_for_its_width_and_never_suspends() -> None:
    p = Profile("p", (2, 4, 8), (1.0, 0.6, 0.4))
    v = view(0, 100.0, [8], [1.0], [p], waiting=[(0.0, 999.0, 100.0, 0)], active=[(0.0, 999.0, 100.0, 0, 0, 6, 3)])
    d = CBSP().decide(v)
    assert starts(d) == [(0, 0, 2)] and d.running.tolist() == [True]   # share = 2 free // 1 task: width 2
    v2 = view(0, 100.0, [8], [1.0], [p], waiting=[(0.0, 999.0, 100.0, 0)], active=[(0.0, 999.0, 100.0, 0, 0, 7, 3)])
    assert starts(CBSP().decide(v2)) == []   # 1 free node < minp 2: waits


# ----------------------------------------------------------------------------- HSRET


P124 = Profile("p", (1, 2, 4), (100.0, 60.0, 40.0))


def test_hsret_load_cases_eqs_3_to_6() -> None:
    task = [(0.0, 100.0, 100.0, 0)]
    # TP = 2: crmin = 1 * 100 / (100 * 2) = 0.5, crmax = 4 * 40 / 200 = 0.8: Case 1, every task at its fastest
    v = view(0, 10.0, [2], [1.0], [P124], waiting=task)
    assert load_case(v) == (1, pytest.approx(0.5), pytest.approx(0.8))
    assert select_net(v) == (1, 0.0)
    # TP = 1: crmin 1.0: Case 2, every task at its smallest width
    v = view(0, 10.0, [1], [1.0], [P124], waiting=task)
    assert load_case(v)[0] == 2 and select_net(v) == (2, 1.0)
    # TP = 1.25: 0.8 at width 1, 0.96 at width 2, 1.28 at width 4: Case 3, Getnet settles on width 2
    v = view(0, 10.0, [1], [1.25], [P124], waiting=task)
    case, crmin, crmax = load_case(v)
    assert (case, crmin, crmax) == (3, pytest.approx(0.8), pytest.approx(1.28))
    snet = getnet(v)
    assert 1 / 3 <= snet < 1 / 3 + P124.minstep()
    assert P124.index_for_net(snet) == 1
    assert float(slot_loads(v, snet).max()) == pytest.approx(0.96)


def test_hsret_jset_counts_active_and_finished_tasks_until_their_deadline() -> None:
    task = (0.0, 100.0, 100.0, 0)
    alone = view(0, 10.0, [2], [1.0], [P124], waiting=[task])
    with_done = view(0, 10.0, [2], [1.0], [P124], waiting=[task], finished=[task, task])
    assert load_case(with_done)[1] == pytest.approx(3 * load_case(alone)[1])
    expired = view(0, 10.0, [2], [1.0], [P124], waiting=[task], finished=[(-200.0, -10.0, 100.0, 0)])
    assert load_case(expired)[1] == pytest.approx(load_case(alone)[1])
    # per slot: the load ends with each task's window (eq. 8)
    v = view(0, 10.0, [2], [1.0], [P124], waiting=[(0.0, 50.0, 100.0, 0), (0.0, 100.0, 100.0, 0)])
    loads = slot_loads(v, 1.0)
    assert loads[:5] == pytest.approx([1.0 + 0.5] * 5)    # 100 / (50 * 2) + 100 / (100 * 2)
    assert loads[5:10] == pytest.approx([0.5] * 5)


def test_hsret_picks_the_reference_width_on_the_fastest_cluster() -> None:
    p = Profile("p", (2, 4, 8), (1.0, 0.6, 0.4))
    # tiny load: Case 1, snet 0: width 8; two clusters fit, the faster wins
    v = view(0, 100.0, [1000, 1000], [0.9, 1.1], [p], waiting=[(0.0, 5000.0, 100.0, 0)])
    d = HSRET().decide(v)
    assert starts(d) == [(0, 1, 8)]
    assert d.notes == {"case": 1.0, "snet": 0.0}


def test_hsret_enhances_the_normalized_time_when_the_reference_does_not_fit() -> None:
    p = Profile("p", (2, 4, 8), (1.0, 0.6, 0.4))
    # only 5 free nodes: width 8 does not fit, width 4 (one minstep up) does and meets the deadline
    v = view(0, 100.0, [1000], [1.0], [p], waiting=[(0.0, 5000.0, 100.0, 0)],
             active=[(0.0, 99999.0, 100.0, 0, 0, 995, 50)])
    assert starts(HSRET().decide(v)) == [(0, 0, 4)]


def test_hsret_suspends_tasks_with_slack_for_an_urgent_task_sec_3_3() -> None:
    # the motivating example: b and c run on 4 nodes; d must run at width 4 now to meet its deadline
    p = Profile("p", (2, 4), (1.0, 0.5))
    b = (0.0, 1000.0, 200.0, 0, 0, 2, 2)
    c = (0.0, 1000.0, 100.0, 0, 0, 2, 1)
    d_task = (250.0, 400.0, 200.0, 0)   # now = slot 3 (t 300): width 4 needs 1 slot, ends at 400
    v = view(3, 100.0, [4], [1.0], [p], waiting=[d_task], active=[b, c])
    d = HSRET().decide(v)
    assert starts(d) == [(0, 0, 4)]
    assert d.running.tolist() == [False, False]
    # with a later deadline d can wait a slot: nobody is suspended
    v = view(3, 100.0, [4], [1.0], [p], waiting=[(250.0, 500.0, 200.0, 0)], active=[b, c])
    d = HSRET().decide(v)
    assert starts(d) == [] and d.running.tolist() == [True, True]
    # b and c without slack (deadline 500: b needs slots 3-4, c slot 3): d is not served by suspending them
    tight_b = (0.0, 500.0, 200.0, 0, 0, 2, 2)
    tight_c = (0.0, 400.0, 100.0, 0, 0, 2, 1)
    v = view(3, 100.0, [4], [1.0], [p], waiting=[d_task], active=[tight_b, tight_c])
    d = HSRET().decide(v)
    assert starts(d) == [] and d.running.tolist() == [True, True]


def test_hsret_edf_packing_of_active_tasks() -> None:
    p = Profile("p", (2, 4), (1.0, 0.5))
    # three tasks of width 2 on 4 nodes (after a suspension): the two earliest deadlines run, but a task
    # that can no longer make its deadline goes after those that can
    act = [(0.0, 900.0, 100.0, 0, 0, 2, 1), (0.0, 500.0, 100.0, 0, 0, 2, 1), (0.0, 150.0, 100.0, 0, 0, 2, 1)]
    v = view(3, 100.0, [4], [1.0], [p], active=act)
    assert edf_pack(v).tolist() == [True, True, False]
