"""The simulator engine on hand-checked scenarios: FCFS/EASY timelines, the progress model of MEASY
sec. 3.2 (fg loss, bg with an idle fg, bg under a 50 % fg, no bg progress above 96 %, slowest process,
migration cost, kill and restart, promote keeps progress), kill at the estimate, determinism."""

from __future__ import annotations

import numpy as np
import pytest
from test_sim_support import Scripted, TinyFcfs, wj

from vmctl.errors import InvariantViolation, SimulationError
from vmctl.model import Kill, Migrate, Promote, SetCap, StartBg, StartFg, Tier
from vmctl.policies.registry import create_policy
from vmctl.progress import ProgressModel
from vmctl.sim.engine import SimConfig, Simulator

# fixed draws: loss 2 %, beta 0.9 (one process) / 0.5 (several)
FIXED = ProgressModel(loss_low=0.02, loss_high=0.02, beta_single_low=0.9, beta_single_high=0.9,
                      beta_multi_mean=0.5, beta_multi_sigma=0.0)
TWO_TIER = SimConfig(progress=FIXED, two_tier=True)


def run(jobs: list, cores: int, policy: object, config: SimConfig | None = None) -> Simulator:
    sim = Simulator(jobs, cores, policy, config)  # type: ignore[arg-type]
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim


# ------------------------------------------------------------------------------ FCFS / EASY timelines

THREE = [wj(1, 0, 100, 2), wj(2, 0, 50, 3), wj(3, 10, 20, 1)]


def test_fcfs_timeline_by_hand() -> None:
    # 4 cores. J1 (2 cores) runs 0-100. J2 needs 3: waits until 100, ends 150. J3 (1 core) arrives at
    # 10 and is stuck behind J2 under FCFS: starts at 100 on the fourth core, ends 120.
    sim = run(THREE, 4, create_policy("fcfs"))
    assert sim.outcome("1") == (0.0, 100.0)
    assert sim.outcome("2") == (100.0, 150.0)
    assert sim.outcome("3") == (100.0, 120.0)
    m = sim.result.metrics  # type: ignore[attr-defined]
    assert m.avg_response == pytest.approx((100 + 150 + 110) / 3)
    assert m.avg_wait == pytest.approx((0 + 100 + 90) / 3)


def test_easy_timeline_and_metrics_by_hand() -> None:
    # EASY: the head J2 gets a reservation at 100 (J1's end); J3 ends at 10+20 = 30 <= 100: backfilled.
    sim = run(THREE, 4, create_policy("easy"))
    assert sim.outcome("3") == (10.0, 30.0)
    assert sim.outcome("2") == (100.0, 150.0)
    res = sim.result  # type: ignore[attr-defined]
    m = res.metrics
    assert res.jobs == 3
    assert m.avg_response == pytest.approx((100 + 150 + 20) / 3)
    assert m.avg_wait == pytest.approx(100 / 3)
    # bounded slowdown: 100/100, 150/50, 20/20
    assert m.avg_bounded_slowdown == pytest.approx((1 + 3 + 1) / 3)
    # useful work 2*100 + 3*50 + 1*20 = 370 over 4 cores x 150 s
    assert m.utilization == pytest.approx(370 / 600)
    assert m.makespan == 150.0
    assert res.migrations == 0 and res.estimate_kills == 0 and res.policy_kills == 0


def test_any_iterable_of_records_runs_as_the_list() -> None:
    # a driver may hand the engine a generator (a progress wrapper): the same run as the list
    listed = run(THREE, 4, create_policy("easy"))
    streamed = run(iter(THREE), 4, create_policy("easy"))  # type: ignore[arg-type]
    assert [streamed.outcome(j) for j in "123"] == [listed.outcome(j) for j in "123"]
    assert list(streamed.job_rows()) == list(listed.job_rows())
    assert streamed.result.to_dict() == listed.result.to_dict()  # type: ignore[attr-defined]


def test_easy_does_not_backfill_a_job_that_would_delay_the_head() -> None:
    # J3 (1 core, 200 s) would end after the shadow time 100 and the extra is 1 core -> it may run;
    # J4 (2 cores, 200 s) needs more than the extra: waits for J2.
    jobs = [wj(1, 0, 100, 2), wj(2, 0, 50, 3), wj(3, 10, 200, 1), wj(4, 11, 200, 1)]
    sim = run(jobs, 4, create_policy("easy"))
    assert sim.outcome("3")[0] == 10.0  # uses the one extra core
    assert sim.outcome("4")[0] == 150.0  # extra used up: waits until J2 ends (J3 still holds a core)
    assert sim.outcome("2") == (100.0, 150.0)


def test_bounded_slowdown_uses_ten_seconds_for_short_jobs() -> None:
    jobs = [wj(1, 0, 100, 1), wj(2, 0, 2, 1)]
    sim = run(jobs, 1, create_policy("fcfs"))
    # J2 waits 100 s, runs 2 s: response 102, bounded by max(2, 10) = 10 -> 10.2
    assert sim.result.metrics.avg_bounded_slowdown == pytest.approx((1 + 10.2) / 2)  # type: ignore[attr-defined]


def test_kill_at_estimate() -> None:
    # runs 100 s but estimated 60: killed at 60; its run time for the metrics is 60
    sim = run([wj(1, 0, 100, 1, estimate=60)], 1, create_policy("fcfs"))
    assert sim.outcome("1") == (0.0, 60.0)
    res = sim.result  # type: ignore[attr-defined]
    assert res.estimate_kills == 1
    assert res.metrics.utilization == pytest.approx(1.0)


def test_jobs_wider_than_the_machine_are_dropped_and_counted() -> None:
    sim = run([wj(1, 0, 10, 8), wj(2, 0, 10, 2)], 4, TinyFcfs())
    assert sim.result.jobs == 1  # type: ignore[attr-defined]
    assert sim.result.dropped == {"wider than the machine": 1}  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ progress model


def test_fg_loss_only_on_the_two_tier_architecture() -> None:
    jobs = [wj(1, 0, 98, 1, usage=1.0)]
    two = run(jobs, 1, Scripted({0.0: [StartFg("1", (0,))]}), TWO_TIER)
    assert two.outcome("1")[1] == pytest.approx(100.0)  # 98 s of work at rate 0.98
    one = run(jobs, 1, Scripted({0.0: [StartFg("1", (0,))]}), SimConfig(progress=FIXED, two_tier=False))
    assert one.outcome("1")[1] == pytest.approx(98.0)


def test_bg_with_idle_fg_runs_like_fg() -> None:
    sim = run([wj(1, 0, 98, 1)], 1, Scripted({0.0: [StartBg("1", (0,))]}), TWO_TIER)
    assert sim.outcome("1")[1] == pytest.approx(100.0)


def test_bg_under_a_half_busy_fg() -> None:
    # fg A uses 50 % of core 0; bg B (100 % usage, one process, beta 0.9) gets 0.9 * min(1, 0.5/1) = 0.45
    jobs = [wj(1, 0, 1000, 2, usage=0.5), wj(2, 0, 45, 1, usage=1.0)]
    plan = {0.0: [StartFg("1", (0, 1)), StartBg("2", (0,))]}
    sim = run(jobs, 2, Scripted(plan), TWO_TIER)
    assert sim.outcome("2")[1] == pytest.approx(100.0)


def test_bg_that_needs_less_than_the_idle_cycles_is_limited_by_beta_only() -> None:
    # fg uses 40 %, bg needs 50 %: min(1, 0.6 / 0.5) = 1 -> rate = beta = 0.5 (multi-process job)
    jobs = [wj(1, 0, 1000, 2, usage=0.4), wj(2, 0, 50, 2, usage=0.5)]
    sim = run(jobs, 2, Scripted({0.0: [StartFg("1", (0, 1)), StartBg("2", (0, 1))]}), TWO_TIER)
    assert sim.outcome("2")[1] == pytest.approx(100.0)


def test_no_bg_progress_above_96_percent() -> None:
    # fg A at 97 % for 49 s of work (rate 0.98 -> ends at 50): B makes no progress until 50, then runs
    # alone at 0.98: 49 s of work -> ends at 100
    jobs = [wj(1, 0, 49, 1, usage=0.97), wj(2, 0, 49, 1, usage=1.0)]
    sim = run(jobs, 1, Scripted({0.0: [StartFg("1", (0,)), StartBg("2", (0,))]}), TWO_TIER)
    assert sim.outcome("1")[1] == pytest.approx(50.0)
    assert sim.outcome("2")[1] == pytest.approx(100.0)


def test_at_exactly_96_percent_bg_still_progresses() -> None:
    jobs = [wj(1, 0, 1000, 1, usage=0.96), wj(2, 0, 3.6, 1, usage=1.0)]
    sim = run(jobs, 1, Scripted({0.0: [StartFg("1", (0,)), StartBg("2", (0,))]}), TWO_TIER)
    assert sim.outcome("2")[1] == pytest.approx(3.6 / (0.9 * 0.04))


def test_a_job_advances_at_its_slowest_process() -> None:
    # B (2 processes, beta 0.5) on cores 0 and 1; core 0's fg uses 50 %, core 1's fg slot is idle:
    # process rates 0.5 * 0.5 = 0.25 and 0.98 -> the job advances at 0.25; 25 s of work -> 100
    jobs = [wj(1, 0, 1000, 1, usage=0.5), wj(2, 0, 25, 2, usage=1.0)]
    sim = run(jobs, 2, Scripted({0.0: [StartFg("1", (0,)), StartBg("2", (0, 1))]}), TWO_TIER)
    assert sim.outcome("2")[1] == pytest.approx(100.0)


def test_bg_speeds_up_when_its_fg_leaves() -> None:
    # A (fg, 50 %, 49 s of work, ends at 50); B in bg at 0.45 until 50 (22.5 s of work), then 0.98:
    # 71.5 - 22.5 = 49 more seconds of work -> ends at 100
    jobs = [wj(1, 0, 49, 1, usage=0.5), wj(2, 0, 71.5, 1, usage=1.0)]
    sim = run(jobs, 1, Scripted({0.0: [StartFg("1", (0,)), StartBg("2", (0,))]}), TWO_TIER)
    assert sim.outcome("2")[1] == pytest.approx(100.0)


def test_promote_keeps_progress() -> None:
    # same as above, and B is promoted to fg at 60: its progress is kept, the rate stays 0.98
    jobs = [wj(1, 0, 49, 1, usage=0.5), wj(2, 0, 71.5, 1, usage=1.0)]
    pol = Scripted({0.0: [StartFg("1", (0,)), StartBg("2", (0,))], 60.0: [Promote("2")]})
    sim = run(jobs, 1, pol, TWO_TIER)
    assert 60.0 in pol.calls
    assert sim.outcome("2")[1] == pytest.approx(100.0)
    assert sim.result.migrations == 0  # type: ignore[attr-defined]


def test_migration_costs_time_and_keeps_progress() -> None:
    # B stuck in bg under a 97 % fg (no progress); at 10 it migrates to core 1's fg slot with cost 20:
    # no progress until 30, then 0.98: 49 s of work -> ends at 80
    jobs = [wj(1, 0, 1000, 1, usage=0.97), wj(2, 0, 49, 1, usage=1.0)]
    pol = Scripted({0.0: [StartFg("1", (0,)), StartBg("2", (0,))], 10.0: [Migrate("2", (1,), Tier.FG, cost=20.0)]})
    sim = run(jobs, 2, pol, TWO_TIER)
    assert sim.outcome("2") == (0.0, pytest.approx(80.0))
    assert sim.result.migrations == 1  # type: ignore[attr-defined]


def test_migration_after_progress_keeps_it() -> None:
    # B runs alone in bg (rate 0.98) for 50 s: 49 s of work; migrates at 50 with cost 10; 49 s left at
    # 0.98 -> 50 + 10 + 50 = 110
    jobs = [wj(2, 0, 98, 1, usage=1.0)]
    pol = Scripted({0.0: [StartBg("2", (0,))], 50.0: [Migrate("2", (1,), Tier.FG, cost=10.0)]})
    sim = run(jobs, 2, pol, TWO_TIER)
    assert sim.outcome("2")[1] == pytest.approx(110.0)


def test_kill_and_restart_loses_progress() -> None:
    # J1 runs in fg from 0; at 50 it is killed and restarted on core 1: 98 s of work from scratch
    jobs = [wj(1, 0, 98, 1, usage=1.0)]
    pol = Scripted({0.0: [StartFg("1", (0,))], 50.0: [Kill("1", requeue=True), StartFg("1", (1,))]})
    sim = run(jobs, 2, pol, TWO_TIER)
    assert sim.outcome("1") == (0.0, pytest.approx(150.0))  # first start kept for the wait time
    res = sim.result  # type: ignore[attr-defined]
    assert res.policy_kills == 1
    assert res.wasted_work == pytest.approx(49.0)
    assert res.metrics.avg_wait == 0.0


def test_view_progress_and_expected_end_are_live() -> None:
    seen: list[tuple[float, float, float]] = []

    def look(view, now):  # type: ignore[no-untyped-def]
        rj = view.running["1"]
        seen.append((now, rj.progress, rj.expected_end))
        return []

    jobs = [wj(1, 0, 98, 1, estimate=200, usage=1.0)]
    run(jobs, 1, Scripted({0.0: [StartFg("1", (0,))], 50.0: look}), TWO_TIER)
    _now, progress, end = seen[0]
    assert progress == pytest.approx(49.0)
    assert end == pytest.approx(50.0 + 200.0 - 49.0)  # now + estimate - progress (ARCHITECTURE contract)


def test_invariants_are_checked_on_every_decision() -> None:
    jobs = [wj(1, 0, 10, 1), wj(2, 0, 10, 1)]
    with pytest.raises(InvariantViolation, match="two-fg"):
        run(jobs, 1, Scripted({0.0: [StartFg("1", (0,)), StartFg("2", (0,))]}), TWO_TIER)


def test_unmodelled_action_is_a_clear_error() -> None:
    jobs = [wj(1, 0, 10, 1)]
    with pytest.raises(SimulationError, match="set_cap"):
        run(jobs, 1, Scripted({0.0: [StartFg("1", (0,))], 1.0: [SetCap("1", 0.5)]}), TWO_TIER)


def test_a_policy_that_never_starts_a_job_is_reported() -> None:
    with pytest.raises(SimulationError, match="left 1 job"):
        run([wj(1, 0, 10, 1)], 1, Scripted({}), TWO_TIER)


def test_queue_order_is_submit_then_workload_order_and_requeue_goes_back_in_place() -> None:
    orders: list[list[str]] = []

    def look(view, now):  # type: ignore[no-untyped-def]
        orders.append([j.id for j in view.queue])
        return [Kill("1", requeue=True)]

    jobs = [wj(1, 0, 100, 1), wj(2, 1, 10, 1), wj(3, 1, 10, 1)]
    pol = Scripted({0.0: [StartFg("1", (0,))], 1.0: look, 2.0: lambda v, n: [StartFg("1", (0,))]})
    # J2, J3 never start: the run ends with an error, but we look at the queue on the way
    with pytest.raises(SimulationError):
        run(jobs, 1, pol, TWO_TIER)
    assert orders == [["2", "3"]]


def test_queue_index_is_exactly_the_queue_at_every_decision() -> None:
    """The view's ``queue_index`` (which the invariant checker trusts instead of scanning the queue)
    names exactly the queued jobs, through starts from the middle of the queue and a requeue."""
    seen: list[tuple[list[str], dict[str, object]]] = []

    def look(acts):  # type: ignore[no-untyped-def]
        def f(view, now):  # type: ignore[no-untyped-def]
            assert view.queue_index is not None
            seen.append(([j.id for j in view.queue], dict(view.queue_index)))
            return acts
        return f

    jobs = [wj(1, 0, 100, 1), wj(2, 0, 10, 1), wj(3, 0, 10, 1), wj(4, 1, 10, 1)]
    pol = Scripted({
        0.0: look([StartFg("3", (0,))]),  # from the middle of the queue
        1.0: look([Kill("3", requeue=True), StartFg("2", (0,))]),
        2.0: look([StartFg("1", (1,))]),
    })
    with pytest.raises(SimulationError):  # J3, J4 are never started again
        run(jobs, 2, pol, TWO_TIER)
    assert [ids for ids, _ in seen] == [["1", "2", "3"], ["1", "2", "4"], ["1", "3", "4"]]
    for ids, index in seen:
        assert sorted(index) == sorted(ids)
        assert all(index[k].id == k for k in ids)  # type: ignore[attr-defined]


def test_jobs_the_policy_sees_equal_jobs_built_and_validated_by_the_model() -> None:
    """The engine builds queued jobs without ``Job.__post_init__`` (it validates the workload once);
    they must be indistinguishable from jobs built the ordinary way."""
    from vmctl.model import Job

    got: list[Job] = []

    def look(view, now):  # type: ignore[no-untyped-def]
        got.extend(view.queue)
        return [StartFg(j.id, (i,)) for i, j in enumerate(view.queue)]

    run([wj(7, 0, 10, 1, 20.0), wj(8, 0, 10, 1)], 2, Scripted({0.0: look}), TWO_TIER)
    assert got == [Job("7", 0.0, 1, 20.0, (1.0,)), Job("8", 0.0, 1, 10.0, (1.0,))]


@pytest.mark.parametrize(
    ("job", "field", "problem"),
    [
        (wj(5, 0, 10, 1, 0.0), "job 5.estimate", "positive number"),
        (wj(5, 0, 10, 1, float("inf")), "job 5.estimate", "positive number"),
        (wj(5, 0, 10, 0), "job 5.procs", "must be > 0"),
        (wj(5, 0, 10, 2, None, (0.5, 1.5)), "job 5.cpu_usage", "1.5 not in"),
    ],
)
def test_a_malformed_job_is_refused_before_the_run_with_its_id(job: object, field: str, problem: str) -> None:
    from vmctl.errors import ValidationError

    with pytest.raises(ValidationError) as err:
        Simulator([wj(1, 0, 10, 1), job], 4, create_policy("easy"))  # type: ignore[list-item]
    assert field in str(err.value) and problem in str(err.value)


@pytest.mark.parametrize(
    ("jobs", "field", "problem"),
    [
        ([wj(1, 5, 10, 1), wj(2, 3, 10, 1)], "job 2.submit", "sorted by submit time"),
        ([wj(1, 0, 10, 1), wj(1, 1, 10, 1)], "workload", "not unique"),
        ([wj(1, 0, 10, 1), wj(5, 0, 10, 2, None, (0.5,))], "job 5.cpu_usage", "1 entries for 2 processes"),
        ([wj(1, 0, 10, 1), wj(5, 0, 10, 1, float("nan"))], "job 5.estimate", "positive number"),
    ],
)
def test_a_malformed_workload_is_refused_naming_the_job(jobs: list, field: str, problem: str) -> None:
    from vmctl.errors import ValidationError

    with pytest.raises(ValidationError) as err:
        Simulator(jobs, 4, create_policy("easy"))
    assert field in str(err.value) and problem in str(err.value)


def test_jobs_wider_than_the_machine_are_dropped_and_the_rest_keep_their_order() -> None:
    sim = Simulator([wj(1, 0, 10, 1), wj(2, 0, 10, 9), wj(3, 1, 10, 2)], 4, create_policy("easy"))
    res = sim.run()
    assert res.dropped == {"wider than the machine": 1} and res.jobs == 2
    assert [r["id"] for r in sim.job_rows()] == ["1", "3"]


# ------------------------------------------------------------------------------ determinism


def _random_jobs(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    out = []
    t = 0.0
    for i in range(n):
        t += float(rng.exponential(30.0))
        procs = int(rng.choice([1, 1, 2, 4, 8, 16]))
        run_t = float(rng.exponential(600.0)) + 1.0
        est = run_t * float(rng.uniform(0.8, 3.0))
        usage = tuple(float(u) for u in rng.uniform(0.4, 1.0, procs)) if procs > 1 else (1.0,)
        out.append(wj(i + 1, t, run_t, procs, est, usage))
    return out


@pytest.mark.parametrize("policy", ["easy", "keasy", "reasy", "measy"])
def test_same_seed_same_result(policy: str) -> None:
    jobs = _random_jobs(400, 7)
    a = Simulator(jobs, 32, create_policy(policy), SimConfig(seed=3)).run().to_dict()
    b = Simulator(jobs, 32, create_policy(policy), SimConfig(seed=3)).run().to_dict()
    assert a == b
    assert a["jobs"] == 400


def test_another_seed_changes_two_tier_results() -> None:
    jobs = _random_jobs(400, 7)
    a = Simulator(jobs, 32, create_policy("measy"), SimConfig(seed=3)).run()
    b = Simulator(jobs, 32, create_policy("measy"), SimConfig(seed=4)).run()
    assert a.metrics.avg_response != b.metrics.avg_response


def test_draws_are_per_job_and_independent_of_the_rest_of_the_workload() -> None:
    procs = np.array([1, 4, 1, 8, 2])
    loss, beta = ProgressModel().draw(11, procs)
    loss2, beta2 = ProgressModel().draw(11, procs[:3])
    assert loss[:3] == loss2 and beta[:3] == beta2
    assert all(0.005 <= x <= 0.04 for x in loss)
    assert 0.80 <= beta[0] <= 0.92 and 0.198 <= beta[1] <= 0.766


def test_no_cpu_info_hides_usage_from_the_policy() -> None:
    seen: list[object] = []

    def look(view, now):  # type: ignore[no-untyped-def]
        seen.extend(j.cpu_usage for j in view.queue)
        return [StartFg("1", (0, 1))]

    jobs = [wj(1, 0, 10, 2, usage=0.5)]
    run(jobs, 2, Scripted({0.0: look}), SimConfig(cpu_info=False))
    run(jobs, 2, Scripted({0.0: look}), SimConfig(cpu_info=True))
    assert seen == [None, (0.5, 0.5)]


def test_full_cpu_usage_overrides_the_workload() -> None:
    # the workload says 50 % for both; "full" makes the fg process 100 % (> 96 %): B waits for A
    jobs = [wj(1, 0, 1000, 1, usage=0.5), wj(2, 0, 45, 1, usage=0.5)]
    plan = {0.0: [StartFg("1", (0,)), StartBg("2", (0,))]}
    paper = run(jobs, 1, Scripted(plan), TWO_TIER)
    full = run(jobs, 1, Scripted(plan), SimConfig(progress=FIXED, two_tier=True, cpu_usage="full"))
    assert paper.outcome("2")[1] == pytest.approx(50.0)  # 0.9 * min(1, 0.5/0.5) = 0.9
    assert full.outcome("2")[1] == pytest.approx(1000 / 0.98 + 45 / 0.98)


@pytest.mark.parametrize(
    ("u_fg", "u_bg", "expected"),
    [(None, 1.0, 0.98), (0.5, 1.0, 0.45), (0.4, 0.5, 0.9), (0.97, 1.0, 0.0), (0.96, 1.0, 0.9 * 0.04)],
)
def test_bg_process_rate_formula(u_fg: float | None, u_bg: float, expected: float) -> None:
    assert FIXED.bg_process_rate(0.9, 0.02, u_bg, u_fg) == pytest.approx(expected)


@pytest.mark.parametrize("policy", ["fcfs", "easy", "sjf", "keasy", "reasy", "measy"])
def test_every_job_respects_causality_and_the_work_it_needs(policy: str) -> None:
    """No job starts before its submission or runs faster than a dedicated core; one-tier jobs run
    exactly their work; the dedicated-core work done never exceeds one slot per core (one tier) or two
    (two tiers: a bg process turns idle fg cycles into work, so utilization may pass 1)."""
    jobs = _random_jobs(300, 11)
    sim = Simulator(jobs, 24, create_policy(policy), SimConfig(seed=5))
    res = sim.run()
    assert res.jobs == 300
    busy = 0.0
    for j in jobs:
        start, end = sim.outcome(str(j.id))
        work = min(j.run_time, j.estimate)
        assert start >= j.submit - 1e-9
        assert end - start >= work - 1e-6  # rates never exceed 1
        if not create_policy(policy).needs.two_tier:
            assert end - start == pytest.approx(work)  # dedicated cores, no kills, no loss
        busy += work * j.procs
    assert res.metrics.utilization == pytest.approx(busy / (24 * res.metrics.makespan))
    assert res.metrics.utilization <= (2.0 if create_policy(policy).needs.two_tier else 1.0)
