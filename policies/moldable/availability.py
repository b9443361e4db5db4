"""Free nodes of each cluster over the coming slots, and the earliest slot a width fits for n slots in a
row (used by ALL-EFT, whose reservations make the free-node profile go down as well as up).

``free[c, t]`` is the number of nodes of cluster ``c`` free in slot ``now + t``, assuming every active
task runs each slot until its forecast end. For width ``w``, ``reach(free[c], w)[t]`` is the longest run
of slots starting at some ``t' <= t`` in which ``w`` nodes are free; it never decreases, so the earliest
start for ``n`` slots is ``searchsorted(reach, n)``. Past the end of the array every node is free.

Example: ``free`` = [2, 4, 4, 1, 4] (the last entry stands for "for ever"), ``w`` = 3: the runs start
at t = 1 (2 slots) and t = 4 (unbounded), so ``reach`` = [0, 2, 2, 2, inf] and a task of 2 slots
starts at t = 1, one of 3 slots at t = 4.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from vmctl.policies.moldable.model import SlotView

#: a run that lasts for ever (any task length is far below it)
UNBOUNDED = 10**9


def free_profile(view: SlotView, running: NDArray[np.bool_], extra: int = 1) -> NDArray[np.int64]:
    """``free[c, t]`` for t in [0, max forecast end + extra); the last column has every node free."""
    horizon = int(view.a_rem.max(initial=0)) + extra
    nodes = view.clusters.n
    free = np.repeat(nodes[:, None], horizon, axis=1)
    if len(view.a_id):
        # each active task holds its width from now (if running now) or from the next slot (suspended)
        # until its forecast end; a difference array per cluster, then a running sum
        delta = np.zeros((len(nodes), horizon + 1), dtype=np.int64)
        begin = np.where(running, 0, 1)
        end = np.minimum(view.a_rem + begin, horizon)
        np.add.at(delta, (view.a_cluster, begin), view.a_width)
        np.add.at(delta, (view.a_cluster, end), -view.a_width)
        free -= np.cumsum(delta, axis=1)[:, :horizon]
    return free


def reach(row: NDArray[np.int64], width: int) -> NDArray[np.int64]:
    """The non-decreasing "longest run of >= width free nodes started so far" of one cluster's row."""
    h = len(row)
    ok = row >= width
    idx = np.arange(h, dtype=np.int64)
    nf = np.where(ok, h, idx)
    next_false = np.minimum.accumulate(nf[::-1])[::-1]
    run = np.where(next_false == h, UNBOUNDED, next_false - idx)
    run = np.where(ok, run, 0)
    return np.maximum.accumulate(run)


def reach_rows(row: NDArray[np.int64], widths: NDArray[np.int64]) -> NDArray[np.int64]:
    """:func:`reach` for several widths at once: one row per width."""
    h = len(row)
    ok = row[None, :] >= widths[:, None]
    idx = np.arange(h, dtype=np.int64)
    nf = np.where(ok, h, idx[None, :])
    next_false = np.minimum.accumulate(nf[:, ::-1], axis=1)[:, ::-1]
    run = np.where(next_false == h, UNBOUNDED, next_false - idx[None, :])
    run = np.where(ok, run, 0)
    return np.maximum.accumulate(run, axis=1)


def earliest_starts(rows: NDArray[np.int64], n: NDArray[np.int64]) -> NDArray[np.int64]:
    """``earliest_start(rows[j], n[:, j])`` for every column ``j`` of ``n`` in one search: row ``j`` is
    shifted by ``j * 2 * UNBOUNDED`` so the stacked rows stay sorted."""
    j_count, h = rows.shape
    shift = (np.arange(j_count, dtype=np.int64) * 2 * UNBOUNDED)
    flat = (rows + shift[:, None]).ravel()
    pos: NDArray[np.int64] = np.searchsorted(flat, (n + shift[None, :]), side="left").astype(np.int64)
    out: NDArray[np.int64] = pos - (np.arange(j_count, dtype=np.int64) * h)[None, :]
    return out


def earliest_start(reach_row: NDArray[np.int64], n: NDArray[np.int64]) -> NDArray[np.int64]:
    """The first slot offset where ``n`` slots in a row fit (``len(reach_row)`` or more: never)."""
    return np.searchsorted(reach_row, n, side="left").astype(np.int64)


def reserve(free: NDArray[np.int64], c: int, start: int, n: int, width: int) -> NDArray[np.int64]:
    """Take ``width`` nodes of cluster ``c`` for slots [start, start + n); grows the array as needed
    (the last column keeps standing for "every later slot")."""
    need = start + n + 1
    if need > free.shape[1]:
        tail = np.repeat(free[:, -1:], need - free.shape[1], axis=1)
        free = np.concatenate([free, tail], axis=1)
    free[c, start:start + n] -= width
    return free
