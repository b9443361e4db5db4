"""Cells held by a move in flight (issue 28): vmctld keeps a migrating job's source slots reserved until
the move is confirmed; the gang derivation receives them as blocked cells and neither places a job
there nor clears them, so that its decisions stay valid while a gang migration is in flight."""

from __future__ import annotations

import pytest

from tests.support.gang_reference import reference_decide
from vmctl.errors import InvariantViolation, ValidationError
from vmctl.model import ClusterView, Discipline, Job, Replicate, RunningJob, Start, tier_of_level
from vmctl.policies.gang_matrix import GangJob, GangParams, collapse, derive
from vmctl.policies.invariants import check_decision
from vmctl.policies.registry import create_policy


def test_a_queued_job_does_not_start_on_a_blocked_cell() -> None:
    # 4 nodes, MPL 1: a on nodes 0-1, node 2 held by a move in flight: q (2 tasks) does not fit, r (1) takes 3
    running = {"a": ((0, 1), [0])}
    known = {"a": GangJob("a", 2, 0)}
    free = derive(4, running, known, [GangJob("q", 2, 1)], GangParams(mpl=1))
    assert free.started == {"q": 0} and free.matrix.where["q"] == (2, 3)
    d = derive(4, running, known, [GangJob("q", 2, 1), GangJob("r", 1, 2)], GangParams(mpl=1, backfill=True),
               blocked=[(2, 0)])
    assert d.started == {"r": 0} and d.matrix.where["r"] == (3,)
    assert d.matrix.free == [0] and d.matrix.blocked == [0b0100]


def test_compaction_does_not_move_onto_a_blocked_cell_nor_clear_it() -> None:
    # row 0: a on 0-1; row 1: b on 2, node 3 of row 0 blocked. Without the block b moves to row 0 keeping
    # node 2 (free there); with node 2 of row 0 blocked it may not, and with migration it moves to node 3
    running = {"a": ((0, 1), [0]), "b": ((2,), [1])}
    known = {"a": GangJob("a", 2, 0), "b": GangJob("b", 1, 1)}
    plain = derive(4, running, known, [], GangParams(mpl=2))
    assert plain.matrix.where["b"] == (2,) and plain.matrix.rows_of["b"] == {0}
    kept = derive(4, running, known, [], GangParams(mpl=2), blocked=[(2, 0)])
    assert kept.matrix.rows_of["b"] == {1} and [s.kind for s in kept.steps] == ["replicate"]  # a into row 1
    moved = derive(4, running, known, [], GangParams(mpl=2, migration=True), blocked=[(2, 0)])
    assert moved.matrix.where["b"] == (3,) and moved.matrix.rows_of["b"] == {0}
    assert [(m.job, m.new_nodes) for m in moved.migrations] == [("b", (3,))]


def test_expansion_does_not_replicate_over_a_blocked_cell() -> None:
    # row 0: a on 0-1, x on 2-3; row 1: b on 2-3. Expansion replicates a into row 1 unless node 1 there is blocked
    running = {"a": ((0, 1), [0]), "x": ((2, 3), [0]), "b": ((2, 3), [1])}
    known = {"a": GangJob("a", 2, 0), "x": GangJob("x", 2, 1), "b": GangJob("b", 2, 2)}
    plain = derive(4, running, known, [], GangParams(mpl=2))
    assert plain.matrix.rows_of["a"] == {0, 1}
    d = derive(4, running, known, [], GangParams(mpl=2, migration=True), blocked=[(1, 1)])
    assert d.matrix.rows_of["a"] == {0} and d.steps == []


def test_a_blocked_cell_under_a_running_job_or_outside_the_matrix_is_refused() -> None:
    with pytest.raises(ValidationError, match="job a runs there"):
        collapse(4, 2, {"a": ((0, 1), [0])}, blocked=[(1, 0)])
    with pytest.raises(ValidationError, match="outside"):
        collapse(4, 2, {}, blocked=[(4, 0)])
    with pytest.raises(ValidationError, match="outside"):
        collapse(4, 2, {}, blocked=[(0, 2)])


def _view_with_a_move_in_flight() -> tuple[ClusterView, list[Job]]:
    """4 cores, 2 levels: x on level 0 cores 0-1; m migrated to level 0 cores 2-3, its source slots (level 1,
    cores 0-1) still reserved as vmctld's view keeps them; q (2 processes) queued."""
    x, m, q = (Job(id=i, submit_time=t, procs=2, estimate=100.0) for i, t in (("x", 0.0), ("m", 1.0), ("q", 2.0)))
    slots: list[list[str | None]] = [["x", "x", "m", "m"], ["m", "m", None, None]]
    running = {j.id: RunningJob(job=j, tier=tier_of_level(0), cores=cs, start_time=0.0, tier_since=0.0, level=0)
               for j, cs in ((x, (0, 1)), (m, (2, 3)))}
    idle = [{c for c in range(4) if slots[lv][c] is None} for lv in range(2)]
    view = ClusterView.leveled(4, [q], running, slots, idle, Discipline.TIMESLICE, [0.0] * 4, [True] * 4)
    return view, [x, m, q]


@pytest.mark.parametrize("policy", ["gs", "gs-m", "bgs", "bgs-m"])
def test_a_decision_made_while_a_migration_is_in_flight_is_accepted(policy: str) -> None:
    view, _jobs = _view_with_a_move_in_flight()
    pol = create_policy(policy, mpl=2)
    d = pol.decide(view, 10.0)
    check_decision(view, d, 10.0)  # raises if an action lands on the reserved source slots
    assert Start("q", (2, 3), 1) in d.actions
    assert not any(isinstance(a, Replicate) and a.job == "x" for a in d.actions)
    # the derivation before blocked cells opened row 1 on cores 0-1, which the check refuses whole
    with pytest.raises(InvariantViolation):
        check_decision(view, reference_decide(pol, view, 10.0), 10.0)
