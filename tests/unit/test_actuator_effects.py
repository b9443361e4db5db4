"""The actuator commits the occupancy model's effects (``vmctl.daemon.actuator``): a move between hosts
that the daemon's guard refuses is taken back from the model, so a later action of the same decision may
use the slots it would have taken; the same move within the limits begins one migration that holds its
source slot; a start keeps its reason."""

from __future__ import annotations

from vmctl.daemon.actuator import Actuator, Changes
from vmctl.daemon.config import MigrationLimits
from vmctl.daemon.state import ClusterState
from vmctl.daemon.view import build_view
from vmctl.model import Decision, Migrate, Start, StartFg, Tier
from vmctl.store.base import JobRecord, NodeRecord, Slot

NOW = 100.0


def _state() -> ClusterState:
    """Nodes a and b of 2 cores; job 1 runs fg on a:0; jobs 2 and 3 (1 process) wait."""
    st = ClusterState()
    spec = {"procs": 1, "estimate": 1000.0}
    jobs = [JobRecord(id="1", seq=1, name="one", spec=spec, state="running", submit_time=0.0, start_time=0.0,
                      slots=[Slot("a", 0, 0)], run=1, tier_since=0.0),
            JobRecord(id="2", seq=2, name="two", spec=spec, state="queued", submit_time=1.0),
            JobRecord(id="3", seq=3, name="three", spec=spec, state="queued", submit_time=2.0)]
    st.load(jobs, [NodeRecord(name="a", cores=2), NodeRecord(name="b", cores=2)], [], {})
    return st


def _apply(st: ClusterState, limits: MigrationLimits, *actions: object) -> tuple[Actuator, Changes, list[str]]:
    act = Actuator(st, limits)
    view, lay = build_view(st, NOW)
    ch = Changes()
    res = act.apply(Decision(actions=tuple(actions)), view, lay, NOW, ch)  # type: ignore[arg-type]
    return act, ch, [f"{a.kind} {a.job_id}: {why}" for a, why in res.skipped]


def test_a_refused_migration_is_taken_back_from_the_model() -> None:
    st = _state()
    _act, _ch, skipped = _apply(st, MigrationLimits(max_per_cluster=0),
                                Migrate("1", (2,), Tier.FG), StartFg("2", (2,)))
    assert skipped == ["migrate 1: cluster migration limit 0 reached"]
    assert st.jobs["1"].slots == [Slot("a", 0, 0)] and st.jobs["1"].migrating is None
    assert st.jobs["2"].slots == [Slot("b", 0, 0)] and st.jobs["2"].state == "running"


def test_a_migration_begins_once_and_holds_its_source() -> None:
    st = _state()
    _act, ch, skipped = _apply(st, MigrationLimits(), Migrate("1", (2,), Tier.FG), StartFg("2", (0,)),
                               Start("3", (3,), reason="why here"))
    # the source slot a:0 stays held for job 1 until the agents confirm the move: job 2 cannot take it
    assert skipped and skipped[0].startswith("start_fg 2:")
    op = st.ops[str(st.jobs["1"].migrating)]
    assert op.kind == "migrate" and op.detail["moves"] == [{"index": 0, "from": ["a", 0], "to": ["b", 0],
                                                            "mode": "live"}]
    assert (op.detail["hosts"], op.detail["from_tier"], op.detail["tier"]) == (["a", "b"], "fg", "fg")
    assert st.jobs["1"].slots == [Slot("b", 0, 0)] and set(ch.ops) == {op.id}
    assert st.jobs["3"].width_reason == "why here" and st.jobs["3"].slots == [Slot("b", 1, 0)]
