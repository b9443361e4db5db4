"""Issue 27: the lean loop (``vmctl.sim.engine_lean``) runs every run whose fg jobs advance at rate 1
(off the two-tier architecture: EASY, FCFS, SJF, any policy with ``two_tier`` False). On seeded random
workloads it gives the general loop's run (``Simulator.lean_loop = False``) job by job, and the policy
sees the same view on every pass, read on random passes (the idle set's members; the lean loop may
rebuild the set, so its iteration order is not compared); MEASY off the two-tier architecture takes
the lean loop's fallbacks (bg starts, moves, kills)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from vmctl.model import ClusterView, Decision
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.workloads import WorkloadJob


def _workload(seed: int, n: int = 300, usage: bool = True) -> list[WorkloadJob]:
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for i in range(n):
        t += rng.choice([0.0, 0.0, 1.0, 7.0, 40.0])
        run = rng.choice([1.0, 5.0, 30.0, 200.0, 900.0])
        procs = rng.choice([1, 1, 1, 2, 3, 5, 8])
        est = rng.choice([run, 2 * run, run / 2, 1000.0])
        u = tuple(rng.uniform(0.4, 1.0) for _ in range(procs)) if usage and procs > 1 else None
        jobs.append(WorkloadJob(i + 1, t, run, procs, est, u, rng.randint(0, 3)))
    return jobs


def _run(policy: str, seed: int, lean: bool, usage: bool, config: SimConfig) -> tuple[Any, list[Any], list[Any], int]:
    pol = create_policy(policy)
    decide = pol.decide
    rng = random.Random(seed * 7 + 1)
    seen: list[Any] = []

    def reading(view: ClusterView, now: float) -> Decision:
        if rng.random() < 0.3:  # the same passes read on both paths (same seed, same pass sequence)
            seen.append((now, sorted(view.idle_fg), len(view.idle_fg), sorted(view.idle_bg), list(view.fg_job),
                         list(view.bg_job), list(view.fg_util), [j.id for j in view.queue],
                         [(k, rj.job.id, rj.tier, rj.cores, rj.start_time, rj.tier_since, rj.expected_end, rj.progress)
                          for k, rj in view.running.items()]))
        return decide(view, now)

    pol.decide = reading  # type: ignore[method-assign]
    sim = Simulator(_workload(seed, usage=usage), 12, pol, config)
    sim.lean_loop = lean
    general = sim._run
    used = []

    def general_loop(*args: Any) -> Any:
        used.append(True)
        return general(*args)

    sim._run = general_loop  # type: ignore[method-assign]
    res = sim.run()
    return res.to_dict(), list(sim.job_rows()), seen, not used


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("policy", ["easy", "fcfs", "sjf", "measy"])
@pytest.mark.parametrize("usage", [True, False])
def test_the_lean_loop_gives_the_general_loops_run(policy: str, seed: int, usage: bool) -> None:
    cfg = SimConfig(seed=seed, two_tier=False)  # measy off the two-tier architecture: rate 1, bg jobs
    general = _run(policy, seed, lean=False, usage=usage, config=cfg)
    lean = _run(policy, seed, lean=True, usage=usage, config=cfg)
    assert lean[3] and not general[3]  # the lean loop ran, the general one did not
    assert lean[2] and lean[2] == general[2]
    assert lean[0] == general[0] and lean[1] == general[1]


def test_the_two_tier_architecture_keeps_the_general_loop() -> None:
    """MEASY on the two-tier architecture (fg loss: rates below 1) never takes the lean loop."""
    assert not _run("measy", 1, lean=True, usage=True, config=SimConfig(seed=1))[3]
