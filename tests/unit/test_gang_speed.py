"""Issue 27's gang speed-ups keep every decision and result: the policies' memo of the running jobs'
nodes (kept from one event to the next) against the reference ``decide`` over whole simulations and
over random event sequences, the time-slice model re-rating only the rows whose turn changes, and the
calibration grid's early stop (the same loads as the whole grid)."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.support.gang_reference import reference_decide
from vmctl.experiments import gang as exp
from vmctl.model import ClusterView, Decision, Discipline, Job, RunningJob, SliceSchedule, Tier
from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.timeslice import TimeSliceModel
from vmctl.sim.workloads.registry import generate_model


def _run(policy: str, jobs: int, load: float, reference: bool, seed: int = 3) -> tuple[str, list[Decision]]:
    wl = generate_model("jann97", jobs, 64, seed, load, usage="full")
    pol = create_policy(policy, mpl=4)
    decide = pol.decide
    decisions: list[Decision] = []

    def wrapped(view: ClusterView, now: float) -> Decision:
        d = reference_decide(pol, view, now) if reference else decide(view, now)
        decisions.append(d)
        return d

    pol.decide = wrapped  # type: ignore[method-assign]
    sim = Simulator(wl.jobs, 64, pol, SimConfig(seed=1, cpu_usage="full", execution=lambda: TimeSliceModel(4)))
    sim.run()
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in sim.job_rows()]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest(), decisions


@pytest.mark.parametrize("policy", ["gs", "gs-m", "bgs", "bgs-m"])
def test_a_whole_run_decides_as_the_reference(policy: str) -> None:
    fast, fast_d = _run(policy, 300, 1.1, reference=False)
    ref, ref_d = _run(policy, 300, 1.1, reference=True)
    assert len(fast_d) == len(ref_d)
    for a, b in zip(fast_d, ref_d, strict=True):
        assert (a.actions, a.reasons, a.schedule) == (b.actions, b.reasons, b.schedule)
    assert fast == ref


def _view(cores: int, levels: int, jobs: dict[str, RunningJob], queue: list[Job]) -> ClusterView:
    slots: list[list[str | None]] = [[None] * cores for _ in range(levels)]
    for jid, rj in jobs.items():
        for lv in (rj.level, *rj.replicas):
            for c in rj.cores:
                slots[lv][c] = jid
    idle = [{c for c in range(cores) if line[c] is None} for line in slots]
    return ClusterView.leveled(cores, queue, dict(jobs), slots, idle, Discipline.TIMESLICE, [0.0] * cores,
                               [True] * cores)


def _step(rng: random.Random, cores: int, levels: int, jobs: dict[str, RunningJob], n: int) -> None:
    """One random event on the running jobs: one ends, one moves to other cores or rows (a new cores
    tuple, or the same tuple object on another row), or one starts; every change keeps the slots
    disjoint."""
    def free_in(rows: tuple[int, ...], skip: str | None = None) -> list[int]:
        taken = {(c, lv) for j, rj in jobs.items() if j != skip for lv in (rj.level, *rj.replicas) for c in rj.cores}
        return [c for c in range(cores) if all((c, r) not in taken for r in rows)]

    kind = rng.random()
    if jobs and kind < 0.3:
        del jobs[rng.choice(sorted(jobs))]
        return
    if jobs and kind < 0.7:
        jid = rng.choice(sorted(jobs))
        rj = jobs[jid]
        rows = tuple(rng.sample(range(levels), rng.choice([1, 1, 2])))
        room = free_in(rows, skip=jid)
        if rng.random() < 0.5 and all(c in room for c in rj.cores):
            cores_t = rj.cores  # the same tuple object, other rows
        elif len(room) >= len(rj.cores):
            cores_t = tuple(rng.sample(room, len(rj.cores)))
        else:
            return
        jobs[jid] = RunningJob(job=rj.job, tier=Tier.FG if rows[0] == 0 else Tier.BG, cores=cores_t,
                               start_time=rj.start_time, tier_since=0.0, level=rows[0], replicas=rows[1:],
                               progress=rj.progress + 1.0)
        return
    rows = (rng.randrange(levels),)
    room = free_in(rows)
    if not room:
        return
    size = rng.randint(1, min(len(room), 6))
    job = Job(id=f"r{n}", submit_time=float(rng.randint(0, 50)), procs=size,
              estimate=float(rng.choice([100, 500, 900])))
    jobs[job.id] = RunningJob(job=job, tier=Tier.FG if rows[0] == 0 else Tier.BG, cores=tuple(rng.sample(room, size)),
                              start_time=0.0, tier_since=0.0,
                              level=rows[0], progress=float(rng.randint(0, 90)))


@pytest.mark.parametrize("policy", ["gs-m", "bgs-m", "bgs"])
def test_random_event_sequences_decide_as_from_scratch(policy: str) -> None:
    """One policy instance (its memo kept across events) decides every view of a random event sequence as
    the reference does from scratch; views share the cores tuples of jobs that did not move, as the
    simulator's do."""
    rng = random.Random(policy)
    cores, levels = 24, 3
    pol = create_policy(policy, mpl=levels)
    for _seq in range(15):
        jobs: dict[str, RunningJob] = {}
        for n in range(40):
            _step(rng, cores, levels, jobs, n)
            queue = [Job(id=f"q{n}-{i}", submit_time=100.0 + i, procs=rng.randint(1, cores),
                         estimate=float(rng.choice([20, 300]))) for i in range(rng.randint(0, 4))]
            view = _view(cores, levels, jobs, queue)
            now = float(n * 37)
            got, want = pol.decide(view, now), reference_decide(pol, view, now)
            assert (got.actions, got.reasons, got.schedule) == (want.actions, want.reasons, want.schedule)
    assert len(pol._memo) <= 2 * cores + 64  # pruned to the running jobs


def test_a_schedule_that_keeps_the_active_row_rerates_nothing() -> None:
    class _Run:
        def __init__(self, level: int, replicas: tuple[int, ...] = ()) -> None:
            self.level, self.replicas, self.stopped = level, replicas, False

    class _State:
        now = 0.0
        runs: ClassVar[dict[str, Any]] = {}

    m = TimeSliceModel(3, 10.0)
    state = _State()
    a, b, c, d = _Run(0), _Run(1), _Run(2), _Run(2, (0,))
    state.runs = {"a": a, "b": b, "c": c, "d": d}
    m.bind(state)  # type: ignore[arg-type]
    m.on_event(0.0)  # follows the boundaries (not stalled)
    assert m.active_row == 0
    # the same row stays active at 5: nobody's rate changes
    assert list(m.on_schedule(SliceSchedule(10.0, (0, 1, 2), 0.0), 5.0)) == []
    assert list(m.on_schedule(SliceSchedule(10.0, (0, 2), 0.0), 5.0)) == []
    # at 15 row 2 is active under (0, 2): the runs of rows 0 and 2 change, b (row 1) does not
    assert m.active_row == 0
    changed = m.on_schedule(SliceSchedule(10.0, (0, 2), 0.0), 15.0)
    assert set(map(id, changed)) == {id(a), id(c), id(d)}
    assert m.rate(a) == 0.0 and m.rate(c) == 1.0 and m.rate(d) == 1.0 and m.rate(b) == 0.0


def test_the_calibration_stops_once_the_highest_target_is_reached(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    from vmctl.experiments import runner

    asked: list[float] = []
    reached = {0.5: 0.497, 0.6: 0.594, 0.7: 0.691, 0.8: 0.788, 0.9: 0.884, 1.0: 0.956, 1.1: 0.988, 1.2: 0.977}
    short = {0.5: 0.477, 0.6: 0.567, 0.7: 0.655, 0.8: 0.738, 0.9: 0.801, 1.0: 0.851, 1.1: 0.886, 1.2: 0.916}

    def fake(curve: dict[float, float]) -> Any:
        def run_grid(cells: Any, table: Any, **_kw: Any) -> Any:
            rows = []
            for c in cells:
                load = float(c.inputs["load"])
                asked.append(load)
                rows.append({**c.inputs, "utilization": curve[load], "error": None})
            return runner.GridResult(rows=rows, ran=len(rows), skipped=0, wall_s=0.0, workers=1)
        return run_grid

    targets = [exp.target_utilization(w) for w in range(9)]
    monkeypatch.setattr(runner, "run_grid", fake(reached))
    _curve, loads = exp.calibrate(20000, 1, tmp_path, 1, None, False)
    assert asked == [0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]  # 1.2 is not run
    assert loads == exp.loads_for_targets(sorted(reached.items()), targets)  # the whole grid's loads
    asked.clear()
    monkeypatch.setattr(runner, "run_grid", fake(short))
    _curve, loads = exp.calibrate(2000, 1, tmp_path, 1, None, False)
    assert asked == list(exp.CALIBRATION_LOADS)  # never reached: the whole grid
    assert loads == exp.loads_for_targets(sorted(short.items()), targets)
