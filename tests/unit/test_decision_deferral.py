"""Issue 27: the runtime's decision loop puts off a decision the policy cannot act on (``cannot_act``: no idle
core, or no queued job) for up to ``reasons_defer_s`` after the last one the policy made: a burst of batched
submissions into a full cluster woke one O(queue) decision after another, each of which could only rewrite
the queued jobs' reasons. What must hold: no job is lost, and no job starts later or elsewhere than with a
decision at every pass (the reference); the reasons put off arrive with the pass at ``reasons_due``.

Two daemons of ``test_daemon_core``'s in-process cluster (mock agents) get the same random submissions at
the same model times; one passes as the runtime does with deferral, the other decides at every pass."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.unit.test_daemon_core import Cluster
from vmctl.daemon.core import Daemon
from vmctl.policies.registry import create_policy


def _pass(d: Daemon, defer: bool) -> None:
    """One pass of ``DaemonRuntime._loop`` (``defer``) or of ``run_once`` (not), in the loop's steps."""
    now = d.housekeeping_pass()
    if now is not None and d.decision_due():
        pending = d.begin_decision(now, defer=defer)
        d.finish_decision(pending, d.choose(pending))


class _Deferring(Cluster):
    def __init__(self, tmp: Path, nodes: dict[str, int], policy: str, defer: bool) -> None:
        super().__init__(tmp, nodes, policy=create_policy(policy))
        self.defer = defer
        self.daemon.reasons_defer_s = 1e9  # (real seconds: every pass inside the window, whatever the machine)

    def step(self, dt: float = 1.0) -> None:
        self.clock.advance(dt)
        _pass(self.daemon, self.defer)
        for _name, (rec, src, rep, _be) in self.agents.items():
            src.set(self.daemon.desired(_name))
            rec.run_once()
            assert rep.last is not None
            self.daemon.report(rep.last)
        _pass(self.daemon, self.defer)


def _jobs(c: Cluster) -> dict[str, tuple[str, tuple[tuple[str, int], ...], float | None, int]]:
    return {j.id: (str(j.state), tuple(j.placement), j.start_time, j.run) for j in c.daemon.state.jobs.values()}


@pytest.mark.parametrize("policy", ["fcfs", "easy", "sjf"])
@pytest.mark.parametrize("seed", [1, 2])
def test_deferred_decisions_start_every_job_when_deciding_at_every_pass_does(tmp_path: Path, policy: str,
                                                                             seed: int) -> None:
    nodes = {"n1": 4, "n2": 4}
    a = _Deferring(tmp_path / "a", nodes, policy, defer=True)
    b = _Deferring(tmp_path / "b", nodes, policy, defer=False)
    rng = random.Random(seed)
    submitted = 0
    for _step in range(120):
        if rng.random() < 0.5:  # a burst: a batch of 1-8 jobs, sometimes two batches between passes
            for _batch in range(rng.choice([1, 1, 2])):
                specs = [{"procs": rng.choice([1, 2, 3, 4]), "estimate": float(rng.randint(5, 40)),
                          "work_seconds": float(rng.randint(2, 40))} for _ in range(rng.randint(1, 8))]
                for c in (a, b):
                    c.daemon.submit([dict(s) for s in specs])
                submitted += len(specs)
        a.step()
        b.step()
        # every job in both, in the same state, on the same cores, started at the same time: a start is
        # never later than the pass at which the reference made it
        assert _jobs(a) == _jobs(b)
    assert len(a.daemon.state.jobs) == submitted
    stored = {j.id: str(j.state) for j in a.daemon.store.load_jobs()}
    assert stored == {j.id: str(j.state) for j in b.daemon.store.load_jobs()}  # nothing lost in the store
    assert len(stored) == submitted
    assert sum(1 for j in a.daemon.state.jobs.values() if j.run > 0) > 10  # jobs did start
    # deferral happened (the test is not vacuous) and saved decisions
    assert a.daemon.deferred_decisions > 10
    assert b.daemon.deferred_decisions == 0
    assert a.daemon.decisions < b.daemon.decisions
    # the reasons put off: while deferred, a queued job may show an older one; once ``reasons_due`` has come
    # (the real seconds are moved back here), the next pass decides and they match the reference
    d = a.daemon
    for _step in range(200):  # more bursts until a step ends with a decision put off
        for c in (a, b):
            c.daemon.submit([{"procs": 4, "estimate": 30.0, "work_seconds": 30.0} for _ in range(3)])
        a.step()
        b.step()
        assert _jobs(a) == _jobs(b)
        if d.reasons_due is not None and d.state.queue():
            break
    assert d.reasons_due is not None, "no decision put off"
    due = d.reasons_due
    assert due is not None and d.housekeeping_pass() is None  # not due yet: nothing happened since
    d.full_decision_at -= d.reasons_defer_s
    d.reasons_due = due - d.reasons_defer_s
    before = d.decisions
    _pass(d, True)
    assert d.decisions == before + 1 and d.reasons_due is None
    for rec in b.daemon.state.queue():
        assert d.state.reason_of(d.job(rec.id)) == b.daemon.state.reason_of(rec), rec.id
    a.close()
    b.close()


def test_a_decision_that_can_act_is_never_put_off(tmp_path: Path) -> None:
    """Idle cores and a queued job that fits: the pass decides (and starts it) even inside the window."""
    c = _Deferring(tmp_path, {"n1": 4}, "fcfs", defer=True)
    first = c.submit(4, 50, 50)
    c.step()
    assert c.state(first) == "running"
    behind = c.submit(2, 50, 50)
    c.step()  # no idle core: put off
    assert c.daemon.deferred_decisions >= 1 and c.state(behind) == "queued"
    c.run_until(lambda: c.state(first) == "done")
    # the pass after the cores came free decided (the job started in it), inside the deferral window
    assert c.state(behind) == "running"
    c.close()
