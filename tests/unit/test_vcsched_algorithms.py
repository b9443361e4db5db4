"""Hand-checked VCSCHED instances for every algorithm (Casanova et al., RR-6692)."""

from __future__ import annotations

import numpy as np
import pytest

from vmctl.policies.vcsched.algorithms import ALGORITHMS, solve
from vmctl.policies.vcsched.avgyield import finish, greedy_average
from vmctl.policies.vcsched.dynamic import dynamic_mcb, dynamic_milp, migration_cost
from vmctl.policies.vcsched.greedy import backtracking, greedy
from vmctl.policies.vcsched.instance import Instance, check_solution, placement_yield
from vmctl.policies.vcsched.mcb import lists, mcb, pack
from vmctl.policies.vcsched.milp import lp_bound, solve_milp, solve_relaxation
from vmctl.policies.vcsched.rounding import randomized_rounding

DETERMINISTIC = [a for a in ALGORITHMS if a not in ("rrnd", "rrnz")]


def test_sec_2_3_example_two_hosts_three_tasks() -> None:
    """2 hosts, 3 tasks of alpha 0.6: two share a host at 0.5 each -> min yield 0.5/0.6."""
    inst = Instance.sequential(2, [0.6] * 3, [0.0] * 3)
    assert lp_bound(inst) == 1.0
    for alg in DETERMINISTIC:
        sol = solve(inst, alg)
        assert sol.status == "ok", alg
        assert sol.min_yield == pytest.approx(0.5 / 0.6), alg
        # the lone task gets its full need: avg yield = (0.833 * 2 + 1) / 3
        assert sol.avg_yield == pytest.approx((2 * 0.5 / 0.6 + 1.0) / 3), alg
        assert sorted(np.bincount(np.asarray(sol.hosts), minlength=2).tolist()) == [1, 2], alg
        assert check_solution(inst, sol) == []


def test_memory_forces_gr_to_fail_and_gb_to_backtrack() -> None:
    # 2 hosts; t0, t1 need half a host's memory each, t2 a whole host
    inst = Instance.sequential(2, [0.5, 0.5, 0.5], [0.5, 0.5, 1.0])
    assert greedy(inst).status == "infeasible"  # t0 -> h0, t1 -> h1 (less loaded), t2 fits nowhere
    gb = backtracking(inst)
    assert gb.status == "ok" and gb.hosts == (0, 0, 1) and gb.min_yield == 1.0
    assert gb.work > 3  # it did backtrack
    sg = greedy(inst, sort_by_memory=True)  # t2 first -> h0, then t0, t1 -> h1
    assert sg.hosts == (1, 1, 0) and sg.min_yield == 1.0
    assert solve(inst, "sgb").hosts == (1, 1, 0)
    assert solve(inst, "milp").min_yield == 1.0
    assert mcb(inst, 8).min_yield == 1.0


def test_backtracking_bound_is_honoured() -> None:
    inst = Instance.sequential(2, [0.5, 0.5, 0.5], [0.5, 0.5, 1.0])
    sol = backtracking(inst, max_attempts=3)
    assert sol.status == "infeasible" and sol.work <= 3


def test_infeasible_instances() -> None:
    too_much = Instance.sequential(2, [0.1] * 3, [0.7] * 3)  # 2.1 memory on 2 hosts
    assert lp_bound(too_much) is None
    assert solve_relaxation(too_much) is None
    # fits in total (1.8 <= 2) but no host can take two tasks
    packing = Instance.sequential(2, [0.1] * 3, [0.6] * 3)
    assert lp_bound(packing) == 1.0
    for alg in ALGORITHMS:
        sol = solve(packing, alg)
        assert sol.status == "infeasible", alg
        assert sol.min_yield == 0.0 and not sol.placed


def test_mcb_two_lists_against_imbalance() -> None:
    inst = Instance.sequential(2, [0.8, 0.8, 0.2, 0.2], [0.2, 0.2, 0.7, 0.7])
    la, lb = lists(8, inst.cpu_a, inst.mem_a)
    assert la.tolist() == [0, 1] and lb.tolist() == [2, 3]
    sol = mcb(inst, 8)
    assert sol.hosts == (0, 1, 0, 1) and sol.min_yield == 1.0 and sol.work == 1


def test_mcb_sort_keys() -> None:
    c = np.array([0.1, 0.5, 0.9, 0.3])
    m = np.array([0.4, 0.1, 0.2, 0.3])
    # CPU-heavy: 1 (0.5/0.1), 2 (0.9/0.2); memory-heavy (m >= c): 0, 3
    expect = {
        1: ([1, 2], [0, 3]),  # sum ascending: 0.6 < 1.1 ; 0.5 < 0.6
        2: ([1, 2], [0, 3]),  # diff ascending: 0.4 < 0.7 ; 0.3 > 0.0 -> 3 first? see below
        5: ([2, 1], [3, 0]),
        8: ([2, 1], [0, 3]),  # max descending: 0.9 > 0.5 ; 0.4 > 0.3
        4: ([1, 2], [3, 0]),
        3: ([1, 2], [3, 0]),  # ratio ascending: 5 < 4.5? no: 4.5 < 5 -> 2 first; fixed below
    }
    expect[2] = ([1, 2], [3, 0])  # diff: task 3 has 0.0, task 0 has 0.3
    expect[3] = ([2, 1], [3, 0])  # ratio: task 2 4.5 < task 1 5.0; task 3 1.0 < task 0 4.0
    for v, (a, b) in expect.items():
        la, lb = lists(v, c, m)
        assert (la.tolist(), lb.tolist()) == (a, b), v


def test_mcb_pack_respects_prefilled_capacity() -> None:
    c = np.array([0.5, 0.5])
    m = np.array([0.1, 0.1])
    la, lb = lists(8, c, m)
    got = pack(c, m, la, lb, np.array([0.4, 1.0]), np.array([1.0, 1.0]))
    assert got is not None and got.tolist() == [1, 1]
    assert pack(c, m, la, lb, np.array([0.4, 0.4]), np.array([1.0, 1.0])) is None


def test_milp_beats_mcb8_where_packing_order_matters() -> None:
    # 2 hosts, CPU only: 0.6, 0.5, 0.5, 0.4 -> optimal {0.6, 0.4} {0.5, 0.5} = yield 1
    inst = Instance.sequential(2, [0.6, 0.5, 0.5, 0.4], [0.0] * 4)
    assert solve_milp(inst).min_yield == pytest.approx(1.0)
    # GR places in order on the least loaded host: 0.6|0.5, then 0.5 -> h1 (1.0), 0.4 -> h0 (1.0)
    assert greedy(inst).min_yield == pytest.approx(1.0)
    # 3 tasks of 0.6 and one of 0.2 on 2 hosts: best max load is 1.2 (0.6+0.6 | 0.6+0.2)
    inst2 = Instance.sequential(2, [0.6, 0.6, 0.6, 0.2], [0.0] * 4)
    assert solve_milp(inst2).min_yield == pytest.approx(1 / 1.2)


def test_rrnd_redraws_when_memory_is_full() -> None:
    # each task needs a whole host's memory: whatever the LP says, the second task must take the other host
    inst = Instance.sequential(2, [0.6, 0.6], [1.0, 1.0])
    for seed in range(5):
        for eps in (0.0, 0.01):
            sol = randomized_rounding(inst, seed=seed, epsilon=eps)
            assert sol.status == "ok" and sorted(sol.hosts) == [0, 1] and sol.min_yield == 1.0


def test_rrnz_only_fails_when_nothing_fits() -> None:
    inst = Instance.sequential(3, [0.3] * 6, [0.5] * 6)
    for seed in range(5):
        sol = randomized_rounding(inst, seed=seed, epsilon=0.01, name="rrnz")
        assert sol.status == "ok"
        assert check_solution(inst, sol) == []


def test_randomized_rounding_is_deterministic_per_seed() -> None:
    rng = np.random.default_rng(3)
    inst = Instance.sequential(4, rng.uniform(0.1, 1, 10).tolist(), rng.uniform(0, 0.3, 10).tolist())
    a = solve(inst, "rrnz", seed=7)
    b = solve(inst, "rrnz", seed=7)
    assert a == b
    assert any(solve(inst, "rrnz", seed=s).hosts != a.hosts for s in range(8, 20))


def test_relaxation_value_is_the_closed_form() -> None:
    rng = np.random.default_rng(5)
    for _ in range(5):
        inst = Instance.sequential(3, rng.uniform(0.05, 1, 7).tolist(), rng.uniform(0, 0.4, 7).tolist())
        got = solve_relaxation(inst)
        assert got is not None
        y, e = got
        assert y == pytest.approx(lp_bound(inst), abs=1e-7)
        assert e.sum(axis=1) == pytest.approx(np.ones(7))


def test_average_pass_smallest_need_first() -> None:
    # one host: needs 0.2, 0.5, 0.6 at Y = 0.5 -> base 0.1, 0.25, 0.3 (0.65 used), 0.35 left:
    # 0.2 gets +0.1 (full), 0.5 gets +0.25 (full), 0.6 gets nothing
    inst = Instance.sequential(1, [0.2, 0.5, 0.6], [0, 0, 0])
    alloc = greedy_average(inst, np.zeros(3, dtype=np.int64), 0.5)
    assert alloc.tolist() == pytest.approx([0.2, 0.5, 0.3])
    # finish() recomputes Y from the placement: load 1.3 -> Y = 1/1.3, nothing left over
    sol = finish(inst, "x", np.zeros(3, dtype=np.int64))
    assert sol.min_yield == pytest.approx(1 / 1.3) and sol.avg_yield == pytest.approx(1 / 1.3)


def test_parallel_job_average_example() -> None:
    """The example of parallel.py: per-job yields (0.714, 0.804, 0.714)."""
    inst = Instance.parallel(2, [(2, 0.5, 0.1), (1, 0.8, 0.1), (1, 0.9, 0.1)])
    sol = finish(inst, "x", np.array([0, 1, 0, 1], dtype=np.int64))
    assert sol.alloc[0] == pytest.approx(sol.alloc[1])
    assert sol.alloc[0] / 0.5 == pytest.approx(1 / 1.4)
    assert sol.alloc[2] / 0.8 == pytest.approx((1 - 0.5 / 1.4) / 0.8)
    assert sol.avg_yield == pytest.approx((2 / 1.4 + (1 - 0.5 / 1.4) / 0.8) / 3)
    assert check_solution(inst, sol) == []


def test_parallel_milp_equal_allocations() -> None:
    inst = Instance.parallel(2, [(2, 0.6, 0.2), (1, 0.6, 0.2)])
    sol = solve_milp(inst)
    assert sol.status == "ok" and sol.min_yield == pytest.approx(0.5 / 0.6)
    assert sol.alloc[0] == pytest.approx(sol.alloc[1])
    assert check_solution(inst, sol) == []


def test_dynamic_example_budget_zero_and_more() -> None:
    """dynamic.py example: A, B share host 0, C arrives; optimum is 0.833 either way."""
    inst = Instance.sequential(2, [0.6, 0.6, 0.6], [0.5, 0.5, 0.1])
    prev = np.array([0, 0, -1])
    for b in (0.0, 0.5):
        for sol in (dynamic_mcb(inst, prev, b), dynamic_milp(inst, prev, b)):
            assert sol.status == "ok" and sol.min_yield == pytest.approx(0.5 / 0.6)
            assert migration_cost(inst, prev, sol.hosts) <= b + 1e-9
    assert dynamic_mcb(inst, prev, 0.0).hosts == (0, 0, 1)


def test_dynamic_budget_limits_the_gain() -> None:
    # host 0 holds three tasks of 0.5 (load 1.5), host 1 is empty
    inst = Instance.sequential(2, [0.5, 0.5, 0.5], [0.3, 0.3, 0.3])
    prev = np.array([0, 0, 0])
    stuck = dynamic_milp(inst, prev, 0.0)
    assert stuck.min_yield == pytest.approx(1 / 1.5) and stuck.hosts == (0, 0, 0)
    assert dynamic_mcb(inst, prev, 0.0).min_yield == pytest.approx(1 / 1.5)
    for sol in (dynamic_milp(inst, prev, 0.3), dynamic_mcb(inst, prev, 0.3)):
        assert sol.min_yield == pytest.approx(1.0)
        assert migration_cost(inst, prev, sol.hosts) == pytest.approx(0.3)
    assert dynamic_mcb(inst, prev, 0.29).min_yield == pytest.approx(1 / 1.5)


def test_placement_yield_reports_memory_overflow() -> None:
    inst = Instance.sequential(1, [0.5, 0.5], [0.6, 0.6])
    assert placement_yield(inst, np.array([0, 0])) == -1.0
