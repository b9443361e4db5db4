"""Test doubles for the simulator tests (a scripted policy, workload records built by hand) and the tests
of the doubles themselves. Test code only: nothing here ships."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from vmctl.model import Action, ClusterView, Decision, Discipline, StartFg
from vmctl.policies.base import Needs, SchedulingPolicy


@dataclass(frozen=True)
class WJ:
    """A workload record as the workload helper defines it (id, submit, run_time, procs, estimate, cpu_usage)."""

    id: int
    submit: float
    run_time: float
    procs: int
    estimate: float
    cpu_usage: tuple[float, ...] | None = None


def wj(jid: int, submit: float, run: float, procs: int, estimate: float | None = None,
       usage: float | Sequence[float] | None = None) -> WJ:
    if usage is None:
        u = None
    elif isinstance(usage, float | int):
        u = (float(usage),) * procs
    else:
        u = tuple(usage)
    return WJ(jid, submit, run, procs, run if estimate is None else estimate, u)


class TinyFcfs(SchedulingPolicy):
    """Strict FCFS on the fg tier, lowest free cores first."""

    name: ClassVar[str] = "tiny-fcfs"

    def decide(self, view: ClusterView, now: float) -> Decision:
        free = sorted(view.idle_fg)
        acts: list[Action] = []
        for job in view.queue:
            if job.procs > len(free):
                break
            cores, free = tuple(free[: job.procs]), free[job.procs :]
            acts.append(StartFg(job.id, cores))
        return Decision(actions=tuple(acts))


Script = Callable[[ClusterView, float], Sequence[Action]]


class Scripted(SchedulingPolicy):
    """Returns the actions listed for the current time (``plan[t]`` may be a function of the view);
    wakes itself up at the next planned time."""

    name: ClassVar[str] = "scripted"

    needs: ClassVar[Needs] = Needs(levels=2, disciplines=frozenset({Discipline.PRIORITY}))

    def __init__(self, plan: dict[float, Sequence[Action] | Script]) -> None:
        super().__init__()
        self.plan = plan
        self.calls: list[float] = []

    def decide(self, view: ClusterView, now: float) -> Decision:
        self.calls.append(now)
        acts: Sequence[Action] = ()
        for t, item in self.plan.items():
            if abs(t - now) < 1e-9:
                acts = item(view, now) if callable(item) else item
        later = [t for t in self.plan if t > now + 1e-9]
        return Decision(actions=tuple(acts), wake_at=min(later) if later else None)


def test_tiny_fcfs_blocks_behind_the_head() -> None:
    from tests.viewbuilder import job, view

    v = view(4, queue=[job(1, 3, 10.0), job(2, 1, 10.0, submit=1.0)], running=[])
    d = TinyFcfs().decide(v, 1.0)
    assert [a.job_id for a in d.actions] == ["1", "2"]
    v = view(2, queue=[job(1, 3, 10.0), job(2, 1, 10.0, submit=1.0)])
    assert TinyFcfs().decide(v, 1.0).actions == ()


def test_scripted_policy_wakes_at_the_next_planned_time() -> None:
    from tests.viewbuilder import view

    pol = Scripted({5.0: [], 9.0: []})
    assert pol.decide(view(1), 0.0).wake_at == 5.0
    assert pol.decide(view(1), 5.0).wake_at == 9.0
    assert pol.decide(view(1), 9.0).wake_at is None
