"""Issue 27: the collapsed matrix kept from one event to the next (``KeptCollapse``) against the full
collapse and the full derivation, on random event sequences: jobs end, start, move to other nodes or
rows, get replicated or lose replicas, cells of a move in flight come and go, and some inputs are
broken (two jobs on one slot, a row out of range), which must raise the same error as the full
collapse and leave the kept matrix usable."""

from __future__ import annotations

import random

import pytest

from vmctl.errors import ValidationError
from vmctl.policies.gang_matrix import GangJob, GangParams, KeptCollapse, Matrix, collapse, derive

Running = dict[str, tuple[tuple[int, ...], tuple[int, ...]]]


def _state(m: Matrix) -> tuple[object, ...]:
    """Everything a matrix holds, independent of the order its rows list their jobs."""
    return (m.nodes, m.mpl, m.occ, m.free, m.blocked, m.where, m.bits, m.rows_of,
            [set(js) for js in m.members], m.rows)


def _derivation(d: object) -> tuple[object, ...]:
    return (d.started, d.migrations, d.choices, d.reservation, d.reservations,  # type: ignore[attr-defined]
            d.tasks_migrated, d.steps, _state(d.matrix))  # type: ignore[attr-defined]


def _free_nodes(running: Running, nodes: int, row: int) -> list[int]:
    taken = {n for cells, rows in running.values() if row in rows for n in cells}
    return [n for n in range(nodes) if n not in taken]


def _event(rng: random.Random, running: Running, nodes: int, mpl: int, serial: list[int]) -> None:
    """One random change of ``running`` (kept valid: no two jobs on a slot)."""
    kind = rng.choice(["end", "start", "start", "move", "row", "replicate", "unreplicate", "same-new-tuple"])
    jobs = sorted(running)
    if kind == "end" and jobs:
        del running[rng.choice(jobs)]
    elif kind in ("start", "move") or not jobs:
        if kind == "move" and jobs:
            job = rng.choice(jobs)
            del running[job]
        else:
            serial[0] += 1
            job = f"j{serial[0]}"
        row = rng.randrange(mpl)
        free = _free_nodes(running, nodes, row)
        if free:
            cells = sorted(rng.sample(free, rng.randint(1, min(len(free), 4))))
            running[job] = (tuple(cells), (row,))
    elif kind == "row":
        job = rng.choice(jobs)
        cells, _rows = running.pop(job)
        row = rng.randrange(mpl)
        if set(cells) <= set(_free_nodes(running, nodes, row)):
            running[job] = (cells, (row,))
        else:
            running[job] = (cells, _rows)
    elif kind == "replicate":
        job = rng.choice(jobs)
        cells, rows = running[job]
        for row in rng.sample(range(mpl), mpl):
            if row not in rows and set(cells) <= set(_free_nodes(running, nodes, row)):
                running[job] = (cells, (*rows, row))
                break
    elif kind == "unreplicate":
        job = rng.choice(jobs)
        cells, rows = running[job]
        if len(rows) > 1:
            drop = rng.choice(rows)
            running[job] = (cells, tuple(r for r in rows if r != drop))
    else:  # the same nodes, as an equal tuple that is another object
        job = rng.choice(jobs)
        cells, rows = running[job]
        running[job] = (tuple(list(cells)), rows)


def _blocked(rng: random.Random, running: Running, nodes: int, mpl: int) -> list[tuple[int, int]]:
    if rng.random() < 0.7:
        return []
    row = rng.randrange(mpl)
    free = _free_nodes(running, nodes, row)
    return [(n, row) for n in rng.sample(free, min(len(free), rng.randint(1, 2)))]


def _broken(rng: random.Random, running: Running, nodes: int, mpl: int) -> Running:
    """``running`` with one error a caller could send: two jobs on one slot, or a row out of range."""
    bad = dict(running)
    if rng.random() < 0.5 and running:
        job = rng.choice(sorted(running))
        cells, rows = running[job]
        bad["intruder"] = ((cells[0],), (min(rows),))
    else:
        bad["outside"] = ((0,), (mpl,))
    return bad


@pytest.mark.parametrize("seed", range(6))
def test_kept_collapse_is_the_full_collapse_after_every_event(seed: int) -> None:
    rng = random.Random(seed)
    nodes, mpl = rng.choice([(6, 2), (8, 3), (12, 4), (70, 5)])
    kept = KeptCollapse()
    running: Running = {}
    serial = [0]
    checked = 0
    for _ in range(300):
        for _ in range(rng.randint(1, 3)):
            _event(rng, running, nodes, mpl, serial)
        blocked = _blocked(rng, running, nodes, mpl)
        if rng.random() < 0.05:
            bad = _broken(rng, running, nodes, mpl)
            with pytest.raises(ValidationError) as full_err:
                collapse(nodes, mpl, bad, blocked)
            with pytest.raises(ValidationError) as kept_err:
                kept.collapse(nodes, mpl, bad, blocked)
            assert str(kept_err.value) == str(full_err.value)
            continue
        masks = None
        if rng.random() < 0.5:  # the caller's checked bit sets (as the policies pass them)
            masks = {j: sum(1 << n for n in cells) for j, (cells, _r) in running.items() if rng.random() < 0.8}
        got = kept.collapse(nodes, mpl, running, blocked, masks)
        want = collapse(nodes, mpl, running, blocked, masks)
        assert _state(got) == _state(want)
        for j in list(got.where):  # the derivation changes what it gets: never the kept matrix
            got.remove(j, min(got.rows_of[j]))
        checked += 1
    assert checked > 250 and kept.updates > 200  # the kept matrix was updated, not rebuilt, nearly always


@pytest.mark.parametrize("policy", ["gs", "gs-m", "bgs", "bgs-m", "bgs-cons"])
def test_derive_with_the_kept_collapse_decides_as_the_full_one(policy: str) -> None:
    rng = random.Random(policy)
    nodes, mpl = 16, 4
    params = GangParams(mpl=mpl, backfill=policy.startswith("b"), migration=policy.endswith("-m"), cost=10.0,
                        quota=rng.choice([None, 4]), conservative=policy.endswith("cons"))
    kept = KeptCollapse()
    running: Running = {}
    serial = [0]
    orders: dict[str, float] = {}
    for step in range(250):
        for _ in range(rng.randint(1, 3)):
            _event(rng, running, nodes, mpl, serial)
        for j in running:
            orders.setdefault(j, float(len(orders)))
        jobs = {j: GangJob(j, len(cells), orders[j], rng.uniform(10, 500)) for j, (cells, _r) in running.items()}
        queue = [GangJob(f"q{step}-{i}", rng.randint(1, nodes), 1e6 + i, rng.uniform(10, 500))
                 for i in range(rng.randint(0, 5))]
        blocked = _blocked(rng, running, nodes, mpl)
        full = derive(nodes, running, jobs, queue, params, blocked=blocked)
        fast = derive(nodes, running, jobs, queue, params, blocked=blocked, kept=kept)
        assert _derivation(fast) == _derivation(full)
        if rng.random() < 0.5:  # the next event starts from the derived matrix, as a policy's would
            running = {j: (fast.matrix.where[j], tuple(sorted(rs))) for j, rs in fast.matrix.rows_of.items()}
    assert kept.updates > 200


def test_a_kept_collapse_follows_a_change_of_shape() -> None:
    kept = KeptCollapse()
    run: Running = {"a": ((0, 1), (0,)), "b": ((2,), (1,))}
    assert _state(kept.collapse(4, 2, run)) == _state(collapse(4, 2, run))
    assert _state(kept.collapse(6, 3, run)) == _state(collapse(6, 3, run))  # more nodes and rows: rebuilt
    assert (kept.rebuilds, kept.updates) == (2, 0)
    del run["a"]
    assert _state(kept.collapse(6, 3, run)) == _state(collapse(6, 3, run))
    assert (kept.rebuilds, kept.updates) == (2, 1)
