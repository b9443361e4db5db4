"""The gang-scheduling matrix derivation (paper 004 sec. 2), on hand-checked small matrices."""

from __future__ import annotations

import itertools
import random

import pytest

from vmctl.errors import ValidationError
from vmctl.policies.gang_matrix import GangJob, GangParams, Matrix, collapse, derive


def jobs(**sizes: int) -> dict[str, GangJob]:
    return {name: GangJob(name, size, order=i) for i, (name, size) in enumerate(sizes.items())}


def rows_of(m: Matrix) -> list[list[str | None]]:
    return [list(r) for r in m.rows]


def test_collapse_keeps_nodes_and_the_lowest_row() -> None:
    m = collapse(4, 3, {"a": ((0, 1), [2, 0]), "b": ((2,), [1])})
    assert rows_of(m) == [["a", "a", None, None], [None, None, "b", None], [None] * 4]
    assert m.rows_of == {"a": {0}, "b": {1}}


@pytest.mark.parametrize("running", [
    {"a": ((0, 1), [0]), "b": ((1, 2), [0])},   # two jobs on one slot
    {"a": ((0, 0), [0])},                        # a node twice
    {"a": ((4,), [0])},                          # no such node
    {"a": ((0,), [3])},                          # no such row
    {"a": ((0,), [])},                           # no row
])
def test_collapse_refuses_a_broken_matrix(running: dict[str, tuple[tuple[int, ...], list[int]]]) -> None:
    with pytest.raises(ValidationError):
        collapse(4, 3, running)


def test_compact_without_migration_moves_only_onto_free_nodes() -> None:
    # row 0: a on {0,1}; row 1: b on {2,3}: a fits on its own nodes in row 1 -> row 0 empties
    d = derive(4, {"a": ((0, 1), [0]), "b": ((2, 3), [1])}, jobs(a=2, b=2), [], GangParams(mpl=2))
    assert rows_of(d.matrix) == [[None] * 4, ["a", "a", "b", "b"]]
    assert d.migrations == [] and d.tasks_migrated == 0


def test_compact_blocked_without_migration() -> None:
    d = derive(4, {"a": ((0, 1), [0]), "b": ((0,), [1])}, jobs(a=2, b=1), [], GangParams(mpl=2))
    assert rows_of(d.matrix) == [["a", "a", None, None], ["b", None, None, None]]


def test_compact_migration_option_2_is_the_docstring_example() -> None:
    # b (1 task, row 1) is blocked by a (2 tasks) on node 0 of row 0: option 1 costs 5 + 20 = 25,
    # option 2 costs 10 + 10 = 20 -> b moves to the lowest free node of row 0
    d = derive(4, {"a": ((0, 1), [0]), "b": ((0,), [1])}, jobs(a=2, b=1), [],
               GangParams(mpl=2, migration=True, cost=10.0))
    assert rows_of(d.matrix) == [["a", "a", "b", None], [None] * 4]
    assert [(g.job, g.old_nodes, g.new_nodes) for g in d.migrations] == [("b", (0,), (2,))]
    assert [(c.option, c.loss, c.tasks) for c in d.choices] == [(2, 20.0, 1)]
    assert d.capacity_loss == 20.0 and d.tasks_migrated == 1


def test_compact_migration_option_1_when_the_jobs_in_the_way_are_smaller() -> None:
    # row 0 (least populated, 2 tasks): a on {0,1}; row 1 (3 tasks): b on {1}, c on {3}... a is
    # blocked by b only (1 task < |a| = 2): option 1 (b moves away, 5*2*... ) is cheaper
    running = {"a": ((0, 1), [0]), "b": ((1,), [1]), "c": ((2, 3), [1])}
    d = derive(5, running, jobs(a=2, b=1, c=2), [], GangParams(mpl=2, migration=True, cost=10.0))
    # option 1: 10/2*2 + 10*1 = 20; option 2: 10*2 + 10/2*1 = 25
    assert rows_of(d.matrix) == [[None] * 5, ["a", "a", "c", "c", "b"]]
    assert [(g.job, g.old_nodes, g.new_nodes) for g in d.migrations] == [("b", (1,), (4,))]
    assert [(c.job, c.option, c.loss, c.tasks) for c in d.choices] == [("a", 1, 20.0, 1)]


def test_zero_cost_ties_go_to_fewer_tasks_then_option_2() -> None:
    # |S(A)| == |A|: equal tasks either way, so option 2 (A moves) wins the tie
    running = {"a": ((0,), [0]), "b": ((0,), [1]), "x": ((1, 2), [1])}
    d = derive(4, running, jobs(a=1, b=1, x=2), [], GangParams(mpl=2, migration=True, cost=0.0))
    assert [(c.job, c.option) for c in d.choices] == [("a", 2)]
    assert rows_of(d.matrix) == [[None] * 4, ["b", "x", "x", "a"]]


def test_quota_limits_migrated_tasks() -> None:
    running = {"a": ((0, 1), [0]), "b": ((0,), [1])}
    d = derive(4, running, jobs(a=2, b=1), [], GangParams(mpl=2, migration=True, cost=10.0, quota=0))
    assert d.migrations == [] and rows_of(d.matrix)[1][0] == "b"


def test_gs_stops_at_the_first_job_that_does_not_fit() -> None:
    running = {"a": ((0, 1, 2), [0]), "b": ((0, 1, 2), [1])}
    queue = [GangJob("big", 2, 10, 50.0), GangJob("small", 1, 11, 10.0)]
    d = derive(3, running, jobs(a=3, b=3), queue, GangParams(mpl=2))
    assert d.started == {}
    # one row free: big takes it, small then fits beside it
    d = derive(3, {"a": ((0, 1, 2), [0])}, jobs(a=3), queue, GangParams(mpl=2))
    assert d.started == {"big": 1, "small": 1}


def test_bgs_backfills_without_delaying_the_reserved_job() -> None:
    # 4 nodes, MPL 2: row 0 a (3 tasks, 100 s left), row 1 b (2 tasks, 10 s left).
    # head needs 3: fits nowhere; row 1 frees 4 slots... at 10 s -> reservation row 1, shadow 10, extra 1
    running = {"a": ((0, 1, 2), [0]), "b": ((0, 1), [1])}
    known = {"a": GangJob("a", 3, 0, 100.0), "b": GangJob("b", 2, 1, 10.0)}
    queue = [GangJob("head", 3, 2, 50.0), GangJob("long1", 1, 3, 500.0), GangJob("long2", 1, 4, 500.0),
             GangJob("short", 1, 5, 5.0)]
    d = derive(4, running, known, queue, GangParams(mpl=2, backfill=True))
    assert d.reservation == ("head", 1, 10.0)
    # long1 fits row 0 (not reserved); long2 fits only row 1 (reserved), ends after the shadow but fits
    # the 1 extra slot; short ends before the shadow, so it may take the last slot of row 1
    assert d.started == {"long1": 0, "long2": 1, "short": 1}
    # without backfilling nothing past the head starts
    assert derive(4, running, known, queue, GangParams(mpl=2)).started == {}


def test_bgs_refuses_a_long_job_in_the_reserved_row_beyond_extra() -> None:
    running = {"a": ((0, 1, 2, 3), [0]), "b": ((0, 1), [1])}
    known = {"a": GangJob("a", 4, 0, 100.0), "b": GangJob("b", 2, 1, 10.0)}
    queue = [GangJob("head", 4, 2, 50.0), GangJob("long", 1, 3, 500.0), GangJob("short", 2, 4, 10.0)]
    d = derive(4, running, known, queue, GangParams(mpl=2, backfill=True))
    assert d.reservation == ("head", 1, 10.0)  # extra 0
    assert d.started == {"short": 1}


def test_expansion_replicates_into_rows_where_the_nodes_are_free() -> None:
    running = {"a": ((0, 1), [0]), "b": ((2, 3), [1]), "c": ((0,), [1])}
    d = derive(4, running, jobs(a=2, b=2, c=1), [], GangParams(mpl=2))
    # compaction: row 0 (2 tasks) first: a's nodes {0,1} in row 1: node 0 has c -> stays
    # expansion in FCFS order: a cannot enter row 1 (c on 0); b enters row 0 on {2,3}; c cannot (a)
    assert rows_of(d.matrix) == [["a", "a", "b", "b"], ["c", None, "b", "b"]]
    assert d.matrix.rows_of["b"] == {0, 1}


def test_expansion_with_migration_moves_blockers_with_option_1() -> None:
    # row 0 full (a on {0,1}, y on {2,3}); row 1: c on {1}. Compaction cannot move c (row 0 is full).
    # Expansion, FCFS: a is blocked in row 1 by c only -> c moves to node 2 (option 1), a replicates;
    # y is then blocked by c, which has nowhere else to go; c cannot enter row 0 (full)
    running = {"a": ((0, 1), [0]), "y": ((2, 3), [0]), "c": ((1,), [1])}
    d = derive(4, running, jobs(a=2, y=2, c=1), [], GangParams(mpl=2, migration=True, cost=10.0))
    assert rows_of(d.matrix) == [["a", "a", "y", "y"], ["a", "a", "c", None]]
    assert [(g.job, g.old_nodes, g.new_nodes, g.phase) for g in d.migrations] == [("c", (1,), (2,), "expand")]
    assert [(c.job, c.option, c.loss, c.tasks) for c in d.choices] == [("a", 1, 20.0, 1)]  # 10/2*2 + 10*1
    # without migration a stays in one row; y's nodes are free in row 1, so y is replicated
    d = derive(4, running, jobs(a=2, y=2, c=1), [], GangParams(mpl=2))
    assert rows_of(d.matrix) == [["a", "a", "y", "y"], [None, "c", "y", "y"]]


def test_expansion_never_breaks_the_same_nodes_rule() -> None:
    running = {"a": ((0, 1), [0]), "x": ((2,), [0]), "b": ((2, 3), [1]), "c": ((0,), [1])}
    d = derive(5, running, jobs(a=2, x=1, b=2, c=1), [], GangParams(mpl=2, migration=True, cost=0.0))
    m = d.matrix
    for job, nodes in m.where.items():
        for r in m.rows_of[job]:
            assert [n for n, j in enumerate(m.rows[r]) if j == job] == list(nodes)


def test_derive_does_not_change_its_input_and_is_deterministic() -> None:
    running = {"a": ((0, 1), [0, 1]), "b": ((2,), [1])}
    before = {k: (v[0], list(v[1])) for k, v in running.items()}
    first = derive(4, running, jobs(a=2, b=1), [GangJob("q", 2, 9, 1.0)], GangParams(mpl=3, migration=True))
    again = derive(4, running, jobs(a=2, b=1), [GangJob("q", 2, 9, 1.0)], GangParams(mpl=3, migration=True))
    assert {k: (v[0], list(v[1])) for k, v in running.items()} == before
    assert rows_of(first.matrix) == rows_of(again.matrix)


@pytest.mark.parametrize(("backfill", "migration", "conservative"),
                         [(b, m, c) for b, m, c in itertools.product([False, True], repeat=3) if b or not c])
def test_random_matrices_keep_the_invariants(backfill: bool, migration: bool, conservative: bool) -> None:
    rng = random.Random(4)
    for _ in range(200):
        n, mpl = rng.randint(2, 8), rng.randint(1, 4)
        m = Matrix(n, mpl)
        known: dict[str, GangJob] = {}
        for i in range(rng.randint(0, 8)):
            size = rng.randint(1, n)
            r = rng.randrange(mpl)
            free = m.free_nodes(r)
            if len(free) >= size:
                nodes = tuple(sorted(rng.sample(free, size)))
                m.place(f"j{i}", r, nodes)
                known[f"j{i}"] = GangJob(f"j{i}", size, i, rng.uniform(1, 100))
        running = {j: (m.where[j], sorted(m.rows_of[j])) for j in m.where}
        queue = [GangJob(f"q{i}", rng.randint(1, n), 100 + i, rng.uniform(1, 100)) for i in range(rng.randint(0, 6))]
        quota = rng.choice([None, 0, 1, 3])
        d = derive(n, running, known, queue, GangParams(mpl=mpl, backfill=backfill, migration=migration, quota=quota,
                                                          conservative=conservative))
        out = d.matrix
        assert set(out.where) == set(running) | set(d.started)
        for job, nodes in out.where.items():
            assert len(nodes) == (known[job].size if job in known else next(q.size for q in queue if q.id == job))
            for r in out.rows_of[job]:
                assert [k for k, j in enumerate(out.rows[r]) if j == job] == list(nodes)
        for r in range(mpl):
            assert out.free[r] == sum(1 for j in out.rows[r] if j is None)
        if not migration:
            assert d.migrations == [] and d.tasks_migrated == 0
            for job in running:  # without migration a running job never changes nodes
                assert out.where[job] == running[job][0]
        if quota is not None:
            assert d.tasks_migrated <= quota
        if not backfill:  # FCFS: started jobs are a prefix of the queue
            ids = [q.id for q in queue]
            assert list(d.started) == ids[: len(d.started)]


def test_bad_parameters_name_the_field() -> None:
    with pytest.raises(ValidationError, match="mpl"):
        GangParams(mpl=0)
    with pytest.raises(ValidationError, match="cost"):
        GangParams(cost=-1.0)
    with pytest.raises(ValidationError, match="quota"):
        GangParams(quota=-1)
    with pytest.raises(ValidationError, match=r"q\.size"):
        derive(4, {}, {}, [GangJob("q", 5, 0)], GangParams())


# ------------------------------------------------------------------------------ conservative backfilling

def _cons(depth: int | None = None) -> GangParams:
    return GangParams(mpl=1, backfill=True, conservative=True, depth=depth)


def test_conservative_reserves_every_blocked_job_the_header_example() -> None:
    running = {"a": ((0, 1), [0])}
    known = {"a": GangJob("a", 2, 0, 100.0)}
    queue = [GangJob("H", 3, 1, 50.0), GangJob("J", 2, 2, 30.0), GangJob("S", 1, 3, 500.0)]
    d = derive(3, running, known, queue, _cons())
    assert d.started == {}
    assert d.reservations == [("H", 0, 100.0), ("J", 0, 150.0), ("S", 0, 150.0)]
    assert d.reservation == ("H", 0, 100.0)
    # EASY: only H is reserved (shadow 100, extra 0); nothing starts either
    easy = derive(3, running, known, queue, GangParams(mpl=1, backfill=True))
    assert easy.reservation == ("H", 0, 100.0) and easy.reservations == [] and easy.started == {}
    # S with a 90 s estimate ends before H's reservation: both variants start it now
    short = [queue[0], queue[1], GangJob("S", 1, 3, 90.0)]
    assert derive(3, running, known, short, _cons()).started == {"S": 0}
    assert derive(3, running, known, short, GangParams(mpl=1, backfill=True)).started == {"S": 0}


def test_conservative_protects_the_second_reservation_where_easy_does_not() -> None:
    # 4 nodes, one row: a (2 tasks) ends in 100 s. H needs 4 (reserved at 100 for 100 s); J needs 3
    # (after H: 200); K (2 tasks, 150 s) could start now on the 2 free nodes: it would end at 150, inside
    # H's window -> refused by both. L (1 task, 250 s) fits now but would run into [100, 300), where H
    # and J hold 4 then 3 slots: EASY starts it (beyond the shadow, but ... extra 0: refused too);
    # M (2 tasks, 90 s) ends before 100: both start it.
    running = {"a": ((0, 1), [0])}
    known = {"a": GangJob("a", 2, 0, 100.0)}
    queue = [GangJob("H", 4, 1, 100.0), GangJob("J", 3, 2, 100.0), GangJob("K", 2, 3, 150.0),
             GangJob("M", 2, 4, 90.0)]
    d = derive(4, running, known, queue, _cons())
    assert d.started == {"M": 0}
    assert [r[0] for r in d.reservations] == ["H", "J", "K"]
    assert d.reservations[1] == ("J", 0, 200.0)
    # K (2 tasks) fits beside J only from 300 on (J holds 3 of 4 in [200, 300))
    assert d.reservations[2] == ("K", 0, 300.0)


def test_conservative_depth_limits_the_reservations() -> None:
    running = {"a": ((0, 1), [0])}
    known = {"a": GangJob("a", 2, 0, 100.0)}
    queue = [GangJob("H", 3, 1, 50.0), GangJob("J", 2, 2, 30.0), GangJob("S", 1, 3, 500.0)]
    d = derive(3, running, known, queue, _cons(depth=1))
    assert d.reservations == [("H", 0, 100.0)]
    # depth 0: no reservation, S (one free node now) starts at once: pure greedy backfilling
    assert derive(3, running, known, queue, _cons(depth=0)).started == {"S": 0}
    with pytest.raises(ValidationError, match="depth"):
        GangParams(depth=-1)


def test_conservative_opens_a_new_row_before_any_reservation() -> None:
    running = {"a": ((0, 1), [0])}
    known = {"a": GangJob("a", 2, 0, 100.0)}
    queue = [GangJob("H", 3, 1, 50.0), GangJob("S", 1, 2, 500.0)]
    d = derive(3, running, known, queue, GangParams(mpl=2, backfill=True, conservative=True))
    assert d.started == {"H": 1, "S": 0} and d.reservations == []


@pytest.mark.parametrize("migration", [False, True])
def test_conservative_never_starts_a_job_into_a_reserved_window(migration: bool) -> None:
    """Random rows: every job started now fits the row beside the running jobs, and at every time the
    reserved and started jobs of a row never need more slots than the running ones leave."""
    rng = random.Random(7)
    for _ in range(300):
        n, mpl = rng.randint(2, 8), rng.randint(1, 3)
        m = Matrix(n, mpl)
        known: dict[str, GangJob] = {}
        for i in range(rng.randint(0, 8)):
            size = rng.randint(1, n)
            r = rng.randrange(mpl)
            free = m.free_nodes(r)
            if len(free) >= size:
                nodes = tuple(sorted(rng.sample(free, size)))
                m.place(f"j{i}", r, nodes)
                known[f"j{i}"] = GangJob(f"j{i}", size, i, float(rng.randint(1, 100)))
        running = {j: (m.where[j], sorted(m.rows_of[j])) for j in m.where}
        queue = [GangJob(f"q{i}", rng.randint(1, n), 100 + i, float(rng.randint(1, 100)))
                 for i in range(rng.randint(0, 8))]
        params = GangParams(mpl=mpl, backfill=True, conservative=True, migration=migration)
        d = derive(n, running, known, queue, params)
        out = d.matrix
        by_id = {q.id: q for q in queue}
        assert set(d.started).isdisjoint(r[0] for r in d.reservations)
        assert set(d.started) | {r[0] for r in d.reservations} <= set(by_id)
        placed = {j: min(rows) for j, (_nodes, rows) in running.items()}  # collapse: the lowest row
        for step in d.steps:
            if step.kind == "move" and step.job in placed:  # compaction (and expansion's clearing) moves
                placed[step.job] = step.row
        assert out.in_use() or not running
        for row in range(mpl):
            # the running jobs in this row after compaction (not expansion replicas), with their remaining
            base = [(known[j].remaining, known[j].size) for j, r in placed.items() if r == row]
            held = [(0.0, by_id[j].remaining, by_id[j].size) for j, r in d.started.items() if r == row]
            held += [(s, s + by_id[j].remaining, by_id[j].size) for j, r, s in d.reservations if r == row]
            times = sorted({0.0, *(b[0] for b in base), *(h[0] for h in held)})
            for t in times:
                busy = sum(sz for rem, sz in base if rem > t or t == 0.0)
                need = sum(sz for s, e, sz in held if s <= t < e)
                assert busy + need <= n, (row, t, base, held)
