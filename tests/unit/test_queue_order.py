"""The EASY family's multifactor queue order (issue 14: priorities were accepted and ignored)."""

from __future__ import annotations

import pytest

from tests.viewbuilder import view as make_view
from vmctl.errors import PolicyParameterError
from vmctl.model import Job, StartFg, Tier
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import create_policy

DAY = 86400.0


def job(jid: str, submit: float, procs: int = 2, priority: int = 0, estimate: float = 100.0) -> Job:
    return Job(jid, submit, procs, estimate, priority=priority)


def started(policy: str, jobs: list[Job], cores: int, now: float, **params: object) -> list[str]:
    view = make_view(cores, queue=jobs, now=now)
    d = create_policy(policy, **params).decide(view, now)
    check_decision(view, d, now)
    return [a.job_id for a in d.actions if isinstance(a, StartFg)]


@pytest.mark.parametrize("policy", ["fcfs", "easy", "keasy", "reasy", "measy"])
def test_submit_order_is_the_default_and_ignores_priority(policy: str) -> None:
    jobs = [job("old", 0.0, priority=0), job("urgent", DAY, priority=10)]
    assert started(policy, jobs, 2, 2 * DAY) == ["old"]


@pytest.mark.parametrize("policy", ["fcfs", "easy", "keasy", "reasy", "measy"])
def test_multifactor_puts_a_high_priority_job_first(policy: str) -> None:
    # old waited 2 days (age 2/7), urgent 1 day (1/7) with the top priority (1): 2/7 < 1/7 + 1
    jobs = [job("old", 0.0, priority=0), job("urgent", DAY, priority=10)]
    assert started(policy, jobs, 2, 2 * DAY, queue_order="multifactor") == ["urgent"]
    # without a priority weight, age decides again
    assert started(policy, jobs, 2, 2 * DAY, queue_order="multifactor", priority_weight=0.0) == ["old"]


def test_multifactor_size_weight_and_age_saturation() -> None:
    jobs = [job("wide", 0.0, procs=4), job("narrow", 0.0, procs=1)]
    # equal age and priority: a negative size weight favours the narrow job (it starts first, then wide
    # no longer fits 4 cores)
    assert started("fcfs", jobs, 4, 10.0, queue_order="multifactor", size_weight=-1.0) == ["narrow"]
    assert started("fcfs", jobs, 4, 10.0, queue_order="multifactor", size_weight=1.0) == ["wide"]
    # ages beyond age_max_s count as 1: two very old jobs tie on age, then arrival order decides
    old = [job("a", 0.0, procs=4), job("b", 50.0, procs=4)]
    assert started("fcfs", old, 4, 1000.0, queue_order="multifactor", age_max_s=10.0) == ["a"]


def test_easy_reserves_for_the_multifactor_head() -> None:
    # 4 cores idle; the head in multifactor order (priority) needs 6 and gets the reservation
    jobs = [job("small", 0.0, procs=2, estimate=10.0), job("big", 1.0, procs=6, priority=5)]
    view = make_view(8, queue=jobs, running=[(Job("r", 0.0, 4, 50.0), Tier.FG, (0, 1, 2, 3), 0.0)], now=2.0)
    d = create_policy("easy", queue_order="multifactor").decide(view, 2.0)
    check_decision(view, d, 2.0)
    assert d.reservation is not None and d.reservation.job_id == "big"
    assert [a.job_id for a in d.actions] == ["small"]  # backfilled: ends at 12 <= the shadow time 50


def test_bad_parameters_name_the_field_and_declare_what_is_used() -> None:
    with pytest.raises(PolicyParameterError, match="queue_order"):
        create_policy("easy", queue_order="priority")
    with pytest.raises(PolicyParameterError, match="age_max_s"):
        create_policy("measy", queue_order="multifactor", age_max_s=0.0)
    with pytest.raises(PolicyParameterError, match="unknown"):
        create_policy("sjf", queue_order="multifactor")  # sjf's order is its rule
    assert create_policy("easy").job_fields == frozenset()  # type: ignore[attr-defined]
    assert create_policy("easy", queue_order="multifactor").job_fields == {"priority"}  # type: ignore[attr-defined]


def test_vmctld_stops_warning_about_priorities_under_a_multifactor_order() -> None:
    from types import SimpleNamespace

    from vmctl.daemon.jobs import JobEvents

    specs = [{"procs": 1, "estimate": 5, "priority": 3}]
    plain = JobEvents.ignored_fields(SimpleNamespace(policy=create_policy("easy")), specs)  # type: ignore[arg-type]
    assert len(plain) == 1 and "queue_order=multifactor" in plain[0]
    multi = SimpleNamespace(policy=create_policy("measy", queue_order="multifactor"))
    assert JobEvents.ignored_fields(multi, specs) == []  # type: ignore[arg-type]
