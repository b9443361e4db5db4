"""Issue 27: ``read_swf`` hands the simulator its jobs as columns (``JobTable``), not one object per
record. The table is a sequence of the same ``WorkloadJob`` records a list would hold, and a run over
it gives exactly the run over that list, job by job."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from vmctl.policies.registry import create_policy
from vmctl.sim.engine import SimConfig, Simulator
from vmctl.sim.workloads import WorkloadJob, read_swf
from vmctl.sim.workloads.core import JobTable


def _trace(tmp_path: Path, seed: int, n: int = 300, machine: int = 16) -> Path:
    rng = random.Random(seed)
    lines = [f"; MaxProcs: {machine}\n"]
    t = 0
    for i in range(1, n + 1):
        t += rng.choice([0, 0, 1, 5, 30, 200])
        run = rng.choice([-1, 1, 10, 100, 1000, 5000]) if i % 50 else -1
        procs = rng.choice([1, 1, 2, 3, 4, 8, 16, 20])
        est = rng.choice([-1, run, 2 * max(run, 1), max(run // 2, 1), 3600])
        lines.append(f"{i} {t} 0 {run} {procs} -1 -1 {procs} {est} -1 1 {rng.randint(-1, 5)} -1 -1 "
                     f"{rng.randint(-1, 3)} -1 -1 -1\n")
    p = tmp_path / f"t{seed}.swf"
    p.write_text("".join(lines))
    return p


def test_read_swf_gives_a_table_equal_to_the_records(tmp_path: Path) -> None:
    w = read_swf(_trace(tmp_path, 1))
    assert isinstance(w.jobs, JobTable)
    records = list(w.jobs)
    assert all(type(j) is WorkloadJob for j in records)
    assert w.jobs == records and records == list(w.jobs)
    assert w.jobs[0] == records[0] and w.jobs[-1] == records[-1] and w.jobs[len(records) - 1] == records[-1]
    with pytest.raises(IndexError):
        w.jobs[len(records)]
    assert isinstance(w.jobs[5:40], JobTable) and list(w.jobs[5:40]) == records[5:40]
    assert list(w.jobs.select(np.asarray([j.procs > 2 for j in records]))) == [j for j in records if j.procs > 2]
    for j in records:
        assert type(j.id) is int and type(j.submit) is float and type(j.run_time) is float
        assert type(j.procs) is int and type(j.estimate) is float and type(j.user) is int
    q = read_swf(_trace(tmp_path, 1), priority_from_queue=True)
    assert [j.priority for j in q.jobs] != [0] * len(q.jobs) and min(j.priority for j in q.jobs) >= 0


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("policy", ["easy", "fcfs", "measy"])
def test_a_run_over_the_table_is_the_run_over_its_records(tmp_path: Path, seed: int, policy: str) -> None:
    w = read_swf(_trace(tmp_path, seed), max_procs=12)  # some jobs wider than the simulated machine too
    cores = 6
    table = Simulator(w.jobs, cores, create_policy(policy), SimConfig(seed=seed))
    listed = Simulator(list(w.jobs), cores, create_policy(policy), SimConfig(seed=seed))
    a, b = table.run(), listed.run()
    assert a.to_dict() == b.to_dict() and a.dropped == b.dropped and a.dropped
    assert list(table.job_rows()) == list(listed.job_rows())


def _usage_seed(seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, 0xC0]))


def test_cpu_usage_on_a_table_stays_columnar_and_equals_the_records(tmp_path: Path) -> None:
    """``vmctl sim run --trace`` (issue 27): the paper usage of a table is a compact ``UsageColumn``
    with the very draws ``assign_cpu_usage`` gives the records; slices and masks keep it aligned."""
    from vmctl.sim.workloads.core import UsageColumn
    from vmctl.sim.workloads.usage import assign_cpu_usage, with_cpu_usage

    w = read_swf(_trace(tmp_path, 5, n=20_000))  # several blocks of usage tuples
    records = assign_cpu_usage(list(w.jobs), _usage_seed(3), "paper")
    got = with_cpu_usage(w, _usage_seed(3), "paper").jobs
    assert isinstance(got, JobTable) and isinstance(got.cpu_usage, UsageColumn)
    assert list(got) == records and got == records
    assert [j.cpu_usage for j in records if j.procs > 1] and all(len(j.cpu_usage or ()) == j.procs for j in records)
    assert got[17] == records[17] and got[-1] == records[-1]
    assert list(got[5000:9000]) == records[5000:9000]
    mask = np.asarray([j.procs > 2 for j in records])
    assert list(got.select(mask)) == [j for j in records if j.procs > 2]
    full = with_cpu_usage(w, _usage_seed(3), "full").jobs
    assert list(full) == assign_cpu_usage(list(w.jobs), _usage_seed(3), "full")


def test_load_scaling_of_a_table_equals_the_records(tmp_path: Path) -> None:
    from vmctl.sim.workloads.core import Workload
    from vmctl.sim.workloads.load import offered_load, scale_to_load

    w = read_swf(_trace(tmp_path, 6))
    listed = Workload(jobs=list(w.jobs), max_procs=w.max_procs, source=w.source, header=dict(w.header))
    assert offered_load(w) == offered_load(listed)
    a, b = scale_to_load(w, 0.7), scale_to_load(listed, 0.7)
    assert isinstance(a.jobs, JobTable) and list(a.jobs) == list(b.jobs) and a.header == b.header


@pytest.mark.parametrize("policy", ["measy", "easy"])
def test_a_run_over_a_table_with_usage_is_the_run_over_its_records(tmp_path: Path, policy: str) -> None:
    """The engine builds a job's usage tuple ahead of its arrival and drops it when the job ends: the
    run is the run over the records with their tuples, and no finished job keeps one."""
    from vmctl.sim.workloads.usage import with_cpu_usage

    w = with_cpu_usage(read_swf(_trace(tmp_path, 7, n=9000), max_procs=12), _usage_seed(1), "paper")
    table = Simulator(w.jobs, 6, create_policy(policy), SimConfig(seed=2))
    listed = Simulator(list(w.jobs), 6, create_policy(policy), SimConfig(seed=2))
    a, b = table.run(), listed.run()
    assert a.to_dict() == b.to_dict() and list(table.job_rows()) == list(listed.job_rows())
    assert all(u is None for u in table._usage) and not any(u is None for u in listed._usage)
