"""vmctld's queue is kept sorted incrementally (``ClusterState.reindex``): after any sequence of
submissions, state changes and reloads it must equal the queue sorted from scratch (submit time, then
sequence), and a view built from it must carry exactly those jobs in ``queue`` and ``queue_index``."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vmctl.daemon.state import ClusterState
from vmctl.daemon.view import build_view
from vmctl.store.base import JobRecord

STATES = ("queued", "running", "suspended", "done", "cancelled")


def _scratch(state: ClusterState) -> list[str]:
    q = [j for j in state.jobs.values() if j.state == "queued"]
    q.sort(key=lambda j: (j.submit_time, j.seq))
    return [j.id for j in q]


def _check(state: ClusterState) -> None:
    want = _scratch(state)
    assert [j.id for j in state.queue()] == want
    assert state.queue_length() == len(want)
    view, _lay = build_view(state, 0.0)
    assert [j.id for j in view.queue] == want
    assert view.queue_index is not None and sorted(view.queue_index) == sorted(want)
    assert all(view.queue_index[j.id] is j for j in view.queue)


# an operation: (job number, new state) applied in order; submit times collide on purpose (ties by seq)
OPS = st.lists(st.tuples(st.integers(0, 11), st.sampled_from(STATES)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(submits=st.lists(st.integers(0, 4), min_size=1, max_size=12), ops=OPS, reload_at=st.integers(0, 60))
def test_incremental_queue_equals_the_sorted_queue(submits: list[int], ops: list[tuple[int, str]],
                                                   reload_at: int) -> None:
    state = ClusterState()
    for seq, t in enumerate(submits, start=1):
        rec = JobRecord(id=str(seq), seq=seq, name=f"j{seq}", spec={"procs": 1, "estimate": 10.0},
                        state="queued", submit_time=float(t))
        state.jobs[rec.id] = rec
        state.reindex(rec)
    _check(state)
    for step, (k, new) in enumerate(ops):
        rec = state.jobs.get(str(k % len(submits) + 1))
        assert rec is not None
        rec.state = new
        state.reindex(rec)
        _check(state)
        if step == reload_at:  # a restart: the state is loaded again from the records
            state.load(list(state.jobs.values()), [], [], {})
            _check(state)


def test_a_view_keeps_its_queue_when_the_queue_changes_later() -> None:
    """The policy may run on a view in a worker thread while the event loop changes the state."""
    state = ClusterState()
    for seq in (1, 2, 3):
        rec = JobRecord(id=str(seq), seq=seq, name="j", spec={"procs": 1, "estimate": 10.0}, state="queued",
                        submit_time=0.0)
        state.jobs[rec.id] = rec
        state.reindex(rec)
    view, _lay = build_view(state, 0.0)
    state.jobs["2"].state = "cancelled"
    state.reindex(state.jobs["2"])
    assert [j.id for j in view.queue] == ["1", "2", "3"]
    assert view.queue_index is not None and set(view.queue_index) == {"1", "2", "3"}
    later, _lay = build_view(state, 0.0)
    assert [j.id for j in later.queue] == ["1", "3"]
    assert later.queue_index is not None and set(later.queue_index) == {"1", "3"}


# a step: (job number, what happens: a new state, "touch" (a queued job's record changes and is
# stored: a priority update), "undo" (an operator action: a decision of its own whose reasons the caller
# puts back, ``forget_queue_reasons``), "render" (a job list) or None (a decision); the decision's default
# reason (moving like EASY's shadow time: a new one at each decision, or the last one again), the jobs it names)
REASON_OPS = st.lists(st.tuples(st.integers(0, 11),
                                st.sampled_from((*STATES, "touch", "undo", "render", None, None, None)),
                                st.sampled_from(("a", "b", "new")), st.lists(st.integers(0, 11), max_size=3)),
                      max_size=40)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 12), ops=REASON_OPS, reload_at=st.integers(0, 40), cap=st.sampled_from((1, 3, 256)))
def test_queue_reasons_kept_incrementally_equal_a_full_pass(n: int, ops: list[tuple[int, str | None, str, list[int]]],
                                                            reload_at: int, cap: int) -> None:
    """``set_queue_reasons`` writes only the jobs named and those that changed; every queued job's reason as
    operators see it (``reason_of``; a job list's records after ``render_queue_reasons``; a record stored
    after a change) must be what writing all of them gives (its entry of the decision's reasons, else the
    default), whatever jobs left and entered the queue (with other reasons) in between, and an operator
    action leaves every reason as it was. ``cap``: the records are rendered after that many new defaults."""
    was = ClusterState.reasons_past_cap
    ClusterState.reasons_past_cap = cap
    try:
        _reasons_against_a_full_pass(n, ops, reload_at)
    finally:
        ClusterState.reasons_past_cap = was


def _reasons_against_a_full_pass(n: int, ops: list[tuple[int, str | None, str, list[int]]], reload_at: int) -> None:
    state = ClusterState()
    for seq in range(1, n + 1):
        rec = JobRecord(id=str(seq), seq=seq, name=f"j{seq}", spec={"procs": 1, "estimate": 10.0}, state="queued",
                        submit_time=float(seq), reason="submitted")
        state.jobs[rec.id] = rec
        state.reindex(rec)
    want = {j: "submitted" for j in state.jobs}  # each job's reason by a full pass (the truth)
    moving = 0
    for step, (k, new, default, named) in enumerate(ops):
        rec = state.jobs[str(k % n + 1)]
        if new == "touch":
            if rec.state == "queued":
                state.reindex(rec)
                assert rec.reason == want[rec.id]  # the record as the commit stores it
        elif new == "render":
            state.render_queue_reasons()
            for j in state.queue():
                assert j.reason == want[j.id]
        elif new == "undo":
            saved = {j.id: j.reason for j in state.queue()}
            state.set_queue_reasons({}, "waiting")
            for j in state.queue():
                j.reason = saved[j.id]
            state.forget_queue_reasons()
        elif new is not None:
            rec.state = new
            rec.reason = "requeued" if new == "queued" else None
            want[rec.id] = rec.reason
            state.reindex(rec)
        else:
            if default == "new":
                moving += 1
                default = f"would delay the reservation of 1 at t={moving}"
            reasons = {str(j % n + 1): f"named {j}" for j in named}
            state.set_queue_reasons(reasons, default)
            for j in state.queue():
                want[j.id] = reasons.get(j.id, default)
        for j in state.jobs.values():
            assert state.reason_of(j) == want[j.id], (step, j.id, j.state)
        if step == reload_at:
            state.render_queue_reasons()  # (the store holds what a record shows)
            state.load(list(state.jobs.values()), [], [], {})


def test_a_moving_default_reason_is_not_written_to_every_queued_record() -> None:
    """Issue 27: EASY's default reason names the shadow time, which moves at every event; at 100,000 queued
    jobs writing it to every record took 24-28 ms of each decision. A decision with a new default writes
    only the records of the jobs it names (and of those that changed since); the others show it all the
    same (``reason_of``, and their records once a job list renders them)."""
    writes: list[str] = []

    class Counted(JobRecord):
        def __setattr__(self, name: str, value: object) -> None:
            if name == "reason":
                writes.append(self.id)
            super().__setattr__(name, value)

    state = ClusterState()
    for seq in range(1, 1001):
        rec = Counted(id=str(seq), seq=seq, name="j", spec={"procs": 1, "estimate": 10.0}, state="queued",
                      submit_time=float(seq), reason="submitted")
        state.jobs[rec.id] = rec
        state.reindex(rec)
    state.set_queue_reasons({"1": "head of queue"}, "would delay the reservation of 1 at t=10")  # a first pass
    for t in range(11, 21):
        writes.clear()
        state.set_queue_reasons({"1": "head of queue"}, f"would delay the reservation of 1 at t={t}")
        assert len(writes) <= 1, len(writes)
        assert state.reason_of(state.jobs["500"]) == f"would delay the reservation of 1 at t={t}"
        assert state.reason_of(state.jobs["1"]) == "head of queue"
    state.render_queue_reasons()
    assert {j.reason for j in state.queue()} == {"head of queue", "would delay the reservation of 1 at t=20"}
