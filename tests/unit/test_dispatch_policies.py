"""Paper 001's four dispatching policies (sec. III), hand-checked cases and properties."""

from __future__ import annotations

import math
import random

import pytest

from vmctl.errors import PolicyParameterError, UnknownPolicyError, ValidationError
from vmctl.policies.dispatch import PlanJob, PlanWorker, load_instance, plan


def workers(n: int, speed: float = 1.0) -> list[PlanWorker]:
    return [PlanWorker(f"w{i:02d}", f"n{i // 2}", speed) for i in range(n)]


def counts(p: dict[str, list[str]]) -> dict[str, int]:
    return {j: len(ws) for j, ws in p.items()}


ABC = [PlanJob("A", 20, 2000.0, priority=3), PlanJob("B", 5, 500.0, priority=2), PlanJob("C", 5, 500.0, priority=1)]


def test_priority_r_02_ten_workers_three_jobs() -> None:
    p = plan("priority", workers(10), ABC, params={"r": 0.2})
    assert counts(p.assignment) == {"A": 8, "B": 1, "C": 1}
    assert p.unassigned == []


def test_priority_literal_leaves_workers_idle_and_the_conserving_variant_does_not() -> None:
    jobs = [PlanJob("A", 3, 300.0, priority=3), *ABC[1:]]
    p = plan("priority", workers(10), jobs, params={"r": 0.2})
    assert counts(p.assignment) == {"A": 3, "B": 1, "C": 1} and len(p.unassigned) == 5
    p = plan("priority", workers(10), jobs, params={"r": 0.2, "conserving": True})
    assert counts(p.assignment) == {"A": 3, "B": 5, "C": 2} and p.unassigned == []


def test_conserving_priority_keeps_the_top_job_within_1_minus_r_while_others_wait() -> None:
    # B has 20 tasks: A stays at floor(0.5 * 10) = 5, B takes the 4 idle workers
    jobs = [PlanJob("A", 50, 5000.0, priority=3), PlanJob("B", 20, 10.0, priority=1)]
    assert counts(plan("priority", workers(10), jobs, params={"r": 0.5}).assignment) == {"A": 5, "B": 1}
    assert counts(plan("priority", workers(10), jobs, params={"r": 0.5, "conserving": True}).assignment) == {
        "A": 5, "B": 5}
    # B needs no more than its 1 task: nobody waits for the reserved workers, so A may take them
    jobs = [PlanJob("A", 50, 5000.0, priority=3), PlanJob("B", 1, 10.0, priority=1)]
    assert counts(plan("priority", workers(10), jobs, params={"r": 0.5, "conserving": True}).assignment) == {
        "A": 9, "B": 1}
    # B needs 2 more: it is served before A, then nobody waits and A takes the last idle worker
    jobs = [PlanJob("A", 50, 5000.0, priority=3), PlanJob("B", 3, 10.0, priority=1), PlanJob("C", 1, 1.0)]
    p = plan("priority", workers(10), jobs, params={"r": 0.5, "conserving": True})
    assert counts(p.assignment) == {"A": 6, "B": 3, "C": 1} and p.unassigned == []


def test_priority_top_job_gets_the_fastest_workers() -> None:
    ws = [PlanWorker("slow", speed=0.5), PlanWorker("fast", speed=2.0), PlanWorker("mid", speed=1.0)]
    p = plan("priority", ws, [PlanJob("A", 1, 10.0, priority=2), PlanJob("B", 1, 10.0, priority=1)], params={"r": 0.0})
    assert p.assignment == {"A": ["fast"], "B": ["mid"]} and p.unassigned == ["slow"]


def test_proportion_shares_by_remaining_work() -> None:
    jobs = [PlanJob("A", 50, 600.0, priority=1), PlanJob("B", 50, 300.0), PlanJob("C", 50, 100.0)]
    assert counts(plan("proportion", workers(10), jobs).assignment) == {"A": 6, "B": 3, "C": 1}
    # a job never holds more workers than unfinished tasks
    jobs = [PlanJob("A", 2, 600.0, priority=1), PlanJob("B", 50, 300.0), PlanJob("C", 50, 100.0)]
    assert counts(plan("proportion", workers(10), jobs).assignment) == {"A": 2, "B": 3, "C": 1}


def test_workload_greedy_on_heterogeneous_workers() -> None:
    ws = [PlanWorker(name, speed=v) for name, v in (("a", 1.0), ("b", 3.0), ("c", 2.0), ("d", 1.0))]
    # A: 4 tasks, 18,000 s of work in a 3,600 s horizon needs 5 work-s/s: b (3) + c (2)
    jobs = [PlanJob("A", 4, 18000.0, priority=2), PlanJob("B", 4, 3600.0, priority=1)]
    p = plan("workload", ws, jobs)
    assert p.assignment == {"A": ["b", "c"], "B": ["a"]} and p.unassigned == ["d"]
    # per-job throughput overrides speed (a job profile): A runs best on d
    jobs = [PlanJob("A", 1, 100.0, priority=2, throughput={"d": 10.0}), PlanJob("B", 1, 1.0)]
    assert plan("workload", ws, jobs).assignment["A"] == ["d"]


def test_deadline_takes_enough_workers_to_finish_in_time() -> None:
    # 100 s of work due in 50 s on speed-1 workers: 2 workers; 10 tasks allow it
    jobs = [PlanJob("A", 10, 100.0, deadline=50.0, priority=1), PlanJob("B", 10, 90.0, deadline=30.0)]
    p = plan("deadline", workers(6), jobs)
    assert counts(p.assignment) == {"A": 2, "B": 3}
    # a deadline already passed: as many workers as tasks; no deadline: one worker
    jobs = [PlanJob("A", 3, 100.0, deadline=5.0, priority=1), PlanJob("B", 9, 90.0)]
    p = plan("deadline", workers(6), jobs, now=10.0)
    assert counts(p.assignment) == {"A": 3, "B": 1}


@pytest.mark.parametrize("policy", ["priority", "proportion", "workload", "deadline"])
@pytest.mark.parametrize("conserving", [False, True])
def test_properties_on_random_instances(policy: str, conserving: bool) -> None:
    rng = random.Random(1)
    for _ in range(300):
        ws = [PlanWorker(f"w{i}", speed=rng.choice([0.5, 1.0, 1.5])) for i in range(rng.randint(0, 30))]
        jobs = [PlanJob(f"j{i}", rng.randint(1, 12), rng.uniform(0, 5000), priority=rng.randint(0, 3),
                        deadline=rng.choice([None, rng.uniform(10, 5000)]), order=float(i))
                for i in range(rng.randint(0, 8))]
        r = rng.choice([0.0, 0.2, 0.5, 1.0])
        params: dict[str, object] = {"conserving": conserving}
        if policy == "priority":
            params["r"] = r
        p = plan(policy, ws, jobs, params=params)
        held = [w for lst in p.assignment.values() for w in lst]
        assert len(held) == len(set(held))  # no worker assigned twice
        assert sorted(held + p.unassigned) == sorted(w.id for w in ws)
        for j in jobs:
            assert len(p.assignment[j.id]) <= j.tasks
        if policy == "priority" and jobs and not conserving:
            top = min(jobs, key=lambda j: (-j.priority, j.order))
            assert len(p.assignment[top.id]) <= max(1, math.floor((1 - r) * len(ws)))
        if conserving:  # no worker idles while a job has a task without a worker
            waiting = [j for j in jobs if len(p.assignment[j.id]) < j.tasks]
            assert not (p.unassigned and waiting)


def _greedy_by_definition(ws: list[PlanWorker], jobs: list[PlanJob], now: float, horizon: float | None
                          ) -> dict[str, list[str]]:
    """Algorithms 3/4 as the module header states them, with a full sort of the free workers per job:
    the reference the planner's merged order must match."""
    speed = {w.id: w.speed for w in ws}
    free = [w.id for w in sorted(ws, key=lambda w: (-w.speed, w.id))]
    out: dict[str, list[str]] = {j.id: [] for j in jobs}
    for j in sorted(jobs, key=lambda j: (-j.priority, j.order, j.id)):
        if not free:
            break
        if horizon is not None:
            enough = j.work / horizon
        else:
            enough = 0.0 if j.deadline is None else math.inf if j.deadline <= now else j.work / (j.deadline - now)

        def th(w: str, j: PlanJob = j) -> float:
            return j.throughput.get(w, speed[w] * j.profile)

        ranked = sorted(free, key=lambda w: (-th(w), w))
        total, k = 0.0, 0
        while k < len(ranked) and k < j.tasks and (total < enough or k == 0):
            total += th(ranked[k])
            k += 1
        out[j.id] = ranked[:k]
        free = [w for w in free if w not in set(ranked[:k])]
    return out


@pytest.mark.parametrize("policy", ["workload", "deadline"])
def test_the_greedy_matches_its_definition_with_observed_throughputs(policy: str) -> None:
    """The planner ranks a job's observed workers into the speed order instead of sorting the pool per
    job (decision time at 10,000 workers); it must give what a full sort gives. Speeds distinct per worker
    and profiles powers of two, so that speed x profile keeps every tie of the definition."""
    rng = random.Random(3)
    for _ in range(400):
        n = rng.randint(1, 40)
        ws = [PlanWorker(f"w{i:02d}", speed=s) for i, s in enumerate(rng.sample(range(1, 200), n))]
        jobs = []
        for i in range(rng.randint(1, 8)):
            seen = rng.sample([w.id for w in ws], rng.randint(0, min(5, n)))
            jobs.append(PlanJob(f"j{i}", rng.randint(1, 12), rng.uniform(0, 20000), priority=rng.randint(0, 3),
                                deadline=rng.choice([None, 5.0, rng.uniform(10, 5000)]), order=float(i),
                                throughput={w: rng.choice([rng.uniform(1, 300), 50.0]) for w in seen},
                                profile=rng.choice([0.5, 1.0, 2.0])))
        params = {"horizon": 100.0} if policy == "workload" else {}
        got = plan(policy, ws, jobs, now=10.0, params=params).assignment
        want = _greedy_by_definition(ws, jobs, 10.0, 100.0 if policy == "workload" else None)
        assert got == want


def test_deadline_meets_every_feasible_deadline_on_an_empty_enough_cluster() -> None:
    rng = random.Random(2)
    for _ in range(200):
        ws = [PlanWorker(f"w{i}", speed=rng.choice([0.5, 1.0, 2.0])) for i in range(60)]
        jobs = [PlanJob(f"j{i}", 20, rng.uniform(10, 400), deadline=rng.uniform(50, 300), priority=rng.randint(0, 5))
                for i in range(rng.randint(1, 4))]
        p = plan("deadline", ws, jobs)
        speed = {w.id: w.speed for w in ws}
        for j in jobs:
            assert j.deadline is not None
            can = sum(sorted(speed.values(), reverse=True)[: j.tasks]) * j.deadline >= j.work
            got = sum(speed[w] for w in p.assignment[j.id]) * j.deadline
            if can:  # 60 workers: never fewer free than one job's 20 tasks need
                assert got >= j.work - 1e-9


def test_instance_file_errors_name_the_field() -> None:
    ok = {"workers": [{"id": "w1", "node": "n1", "speed": 1.0}], "jobs": [{"id": "A", "tasks": 2, "work": 10}]}
    ws, js = load_instance(ok)
    assert ws[0].id == "w1" and js[0].tasks == 2
    bad = [
        ({"workers": [], "jobs": [{"id": "A", "tasks": 0, "work": 1}]}, r"jobs\[0\]\.tasks"),
        ({"workers": [], "jobs": [{"id": "A", "tasks": 1, "work": -1}]}, r"jobs\[0\]\.work"),
        ({"workers": [], "jobs": [{"id": "A", "tasks": 1, "work": 1, "deadline": -5}]}, r"jobs\[0\]\.deadline"),
        ({"workers": [{"id": "w1"}], "jobs": [{"id": "A", "tasks": 1, "work": 1, "throughput": {"w9": 1}}]},
         r"throughput"),
        ({"workers": [{"id": "w1"}], "jobs": [{"id": "A", "tasks": 1, "work": 1, "throughput": {"w1": 0}}]},
         r"throughput\.w1"),
        ({"workers": [{"id": "w1", "speed": 0}], "jobs": []}, r"workers\[0\]\.speed"),
        ({"workers": [{"id": "w1"}, {"id": "w1"}], "jobs": []}, r"worker w1"),
        ({"jobs": []}, r"instance\.workers"),
        ([], r"instance"),
    ]
    for doc, where in bad:
        with pytest.raises(ValidationError, match=where):
            load_instance(doc)
    with pytest.raises(PolicyParameterError, match="r"):
        plan("priority", [], [], params={"r": 1.5})
    with pytest.raises(UnknownPolicyError):
        plan("fifo", [], [])
