"""The fast gang derivation (bit sets, a lazily read queue) gives exactly what the reference derivation
of ``tests/support/gang_reference.py`` (the code before issue 27's speed-up) gives: the same matrix,
starts, steps, migrations, priced options and reservations, on random matrices of every shape (jobs in
several rows, consecutive and scattered nodes, every variant and quota)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.support import gang_reference as ref
from vmctl.policies import gang_matrix as fast


def _summary(d: Any) -> tuple[Any, ...]:
    m = d.matrix
    return (m.rows, m.free, m.where, m.rows_of, d.started, [repr(x) for x in d.migrations],
            [repr(c) for c in d.choices], d.reservation, d.reservations, d.tasks_migrated, [repr(s) for s in d.steps])


Case = tuple[int, dict[str, Any], dict[str, fast.GangJob], list[tuple[Any, ...]], dict[str, Any]]


def _case(rng: random.Random) -> Case:
    n, mpl = rng.randint(2, 80), rng.randint(1, 5)
    m = ref.Matrix(n, mpl)
    known: dict[str, fast.GangJob] = {}
    for i in range(rng.randint(0, 30)):
        size = rng.choice([1, 1, 2, rng.randint(1, n)])
        rows = rng.sample(range(mpl), rng.choice([1, 1, 1, 2, 3]) if mpl >= 3 else 1)
        free = [k for k in range(n) if all(m.rows[r][k] is None for r in rows)]
        if len(free) < size:
            continue
        if rng.random() < 0.5:  # consecutive nodes, as the lowest-free rule makes them
            runs = [free[k:k + size] for k in range(len(free) - size + 1) if free[k + size - 1] - free[k] == size - 1]
            nodes = tuple(rng.choice(runs)) if runs else tuple(sorted(rng.sample(free, size)))
        else:
            nodes = tuple(sorted(rng.sample(free, size)))
        for r in rows:
            m.place(f"j{i}", r, nodes)
        remaining = rng.choice([rng.uniform(0, 100), float(rng.randint(0, 5) * 10)])
        known[f"j{i}"] = fast.GangJob(f"j{i}", size, rng.choice([i, rng.randint(0, 5)]), remaining)
    running = {j: (m.where[j], sorted(m.rows_of[j])) for j in m.where}
    queue = [(f"q{i}", rng.choice([1, 2, rng.randint(1, n)]), 100 + i, rng.choice([rng.uniform(1, 100), 20.0]))
             for i in range(rng.randint(0, 12))]
    params: dict[str, Any] = {"mpl": mpl, "backfill": rng.random() < 0.5, "migration": rng.random() < 0.6,
                              "quota": rng.choice([None, None, 0, 1, 3, 8]), "cost": rng.choice([0.0, 10.0, 3.0])}
    params["conservative"] = params["backfill"] and rng.random() < 0.3
    if params["conservative"]:
        params["depth"] = rng.choice([None, 0, 1, 2])
    return n, running, known, queue, params


@pytest.mark.parametrize("seed", range(4))
def test_the_fast_derivation_is_the_reference_one(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(600):
        n, running, known, queue, params = _case(rng)
        want = _summary(ref.derive(n, running, known, [fast.GangJob(*q) for q in queue], fast.GangParams(**params)))
        assert _summary(fast.derive(n, running, known, [fast.GangJob(*q) for q in queue],
                                    fast.GangParams(**params))) == want
        # a policy's lazily read queue (checked=True) changes nothing either
        lazy = fast.derive(n, running, known, iter([fast.GangJob(*q) for q in queue]), fast.GangParams(**params),
                           checked=True)
        assert _summary(lazy) == want
        # a policy's form: checked bit sets for the running jobs (``masks``) and their remaining time asked
        # for through ``remaining`` (their GangJobs carry inf), as ``decide`` passes them
        masks = {j: fast._checked_mask(nodes, n) for j, (nodes, _rows) in running.items()}
        blind = {j: g._replace(remaining=float("inf")) for j, g in known.items()}
        asked: list[str] = []

        def remaining(j: str, asked: list[str] = asked, known: dict[str, fast.GangJob] = known) -> float:
            asked.append(j)
            return known[j].remaining

        memo = fast.derive(n, running, blind, iter([fast.GangJob(*q) for q in queue]), fast.GangParams(**params),
                           checked=True, masks=masks, remaining=remaining)
        assert _summary(memo) == want
        assert len(asked) == len(set(asked)) and set(asked) <= set(running)


def test_a_queue_behind_a_blocked_head_is_not_read_under_gs() -> None:
    seen: list[str] = []

    def queue() -> Any:
        for i, size in enumerate((2, 4, 1, 1)):
            seen.append(f"q{i}")
            yield fast.GangJob(f"q{i}", size, i)

    d = fast.derive(4, {"a": ((0, 1), [0])}, {"a": fast.GangJob("a", 2, -1)}, queue(), fast.GangParams(mpl=1),
                    checked=True)
    assert d.started == {"q0": 0} and seen == ["q0", "q1"]
