"""vmctld with a gang migration in flight (issue 28): the migrating job's source slot stays reserved in
vmctld's view until the move is confirmed, and gs-m's decisions made meanwhile are accepted (the
derivation receives the reserved slot as a blocked cell) instead of refused whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.gang import Cluster
from tests.support.gang_reference import reference_decide
from vmctl.agents.backends.mock import MockFabric
from vmctl.daemon.actuator import Changes
from vmctl.errors import InvariantViolation
from vmctl.model import ClusterView, Decision, Move


def _job(work: float, procs: int, estimate: float = 500.0) -> dict[str, object]:
    return {"procs": procs, "estimate": estimate, "work_seconds": work}


@pytest.mark.parametrize("reference", [False, True])
def test_a_job_starts_while_a_gang_migration_is_in_flight(tmp_path: Path, reference: bool) -> None:
    c = Cluster(tmp_path, fabric=MockFabric())
    d = c.d
    if reference:  # the derivation before blocked cells
        pol = d.policy
        object.__setattr__(pol, "decide", lambda view, now: reference_decide(pol, view, now))
    (j,) = d.submit([_job(500, 1)])
    c.step()
    view: ClusterView = d.view()
    a0 = view.node_of_core.index("a")
    ch = Changes()
    res = d.actuator.apply(Decision(actions=(Move(j.id, (view.node_of_core.index("b"),), 1, 5.0),)), view,
                           d.state.layout(), c.clock.now(), ch)
    d.commit(ch)
    assert not res.skipped and j.migrating
    assert d.view().slot_job[0][a0] == j.id  # the source slot is reserved while the move is in flight
    (k,) = d.submit([_job(500, 4)])  # needs a whole row: row 0 holds the reserved slot, row 1 holds j
    if reference:  # the row opened on the reserved slot: the check refuses the whole decision
        with pytest.raises(InvariantViolation, match="two-fg: start"):
            d.run_once()
        return
    d.run_once()
    assert j.migrating  # still in flight: the agents have not run
    assert k.placement and k.level == 2 and len(k.placement) == 4
