"""The demo's closing summary: response time, wait and bounded slowdown of the finished jobs (model
seconds), jobs by final state, migrations (between nodes from vmctld's operations, and the jobs' counters).

Bounded slowdown is the simulator's definition (``vmctl.sim.metrics.bounded_slowdown``, threshold
``vmctl.sim.metrics.TAU`` = 10 s, MEASY sec. 3.3), not a second copy: the demo's numbers and
``vmctl sim``'s mean the same thing. The one difference is what is known: a daemon reports a job's
last start and end, so ``run`` here is ``end - start`` of the finished run (the simulator counts the
dedicated-core run time), and the wait is ``start - submit``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vmctl.model import JobState
from vmctl.sim.metrics import TAU, bounded_slowdown

BSLD_TAU = TAU  # bounded-slowdown threshold in (model) seconds: the simulator's


@dataclass
class Summary:
    jobs: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    mean_response: float = math.nan  # model seconds
    mean_wait: float = math.nan
    mean_bsld: float = math.nan
    max_bsld: float = math.nan
    migrations: int = 0
    bg_starts: int = 0


def summarize(jobs: Sequence[dict[str, Any]], speed: float) -> Summary:
    """Response time, wait and bounded slowdown of the finished jobs, in model seconds (real x speed).
    Bounded slowdown: the simulator's ``bounded_slowdown(end - submit, end - start)``, i.e.
    max(1, response / max(run, TAU))."""
    s = Summary(jobs=len(jobs))
    resp: list[float] = []
    waits: list[float] = []
    bsld: list[float] = []
    for j in jobs:
        st = str(j.get("state"))
        s.by_state[st] = s.by_state.get(st, 0) + 1
        s.migrations += int(j.get("migrations") or 0)
        if j.get("tier") == "bg":
            s.bg_starts += 1
        sub, start, end = j.get("submit_time"), j.get("start_time"), j.get("end_time")
        if st == JobState.DONE and sub is not None and start is not None and end is not None:
            r = (float(end) - float(sub)) * speed
            run = (float(end) - float(start)) * speed
            resp.append(r)
            waits.append((float(start) - float(sub)) * speed)
            bsld.append(float(bounded_slowdown(r, run)))
    if resp:
        s.mean_response = sum(resp) / len(resp)
        s.mean_wait = sum(waits) / len(waits)
        s.mean_bsld = sum(bsld) / len(bsld)
        s.max_bsld = max(bsld)
    return s


@dataclass
class Moves:
    """vmctld's migrate operations (``GET /v1/operations``), i.e. the migrations between nodes: how many
    were started (by the policy, by an operator), and how they ended. ``aborted``: the job ended while
    moving (done, killed, requeued ... before both agents confirmed the move; ``why`` counts those
    endings); ``failed``: an agent refused or the move timed out, and it was rolled back (the job ran on
    where it was); ``pending``: still moving when the demo's time was up."""

    started: int = 0
    by_operator: int = 0
    completed: int = 0
    aborted: int = 0
    failed: int = 0
    pending: int = 0
    why: dict[str, int] = field(default_factory=dict)


def count_moves(ops: Sequence[dict[str, Any]]) -> Moves:
    """``Moves`` from the operations list. An aborted operation's note is ``job STATE`` (the state the
    job went to: ``vmctl.daemon.records``); ``why`` counts those states."""
    m = Moves()
    for o in ops:
        if o.get("kind") != "migrate":
            continue
        m.started += 1
        if o.get("origin") == "operator":
            m.by_operator += 1
        st = o.get("state")
        if st == "done":
            m.completed += 1
        elif st == "aborted":
            m.aborted += 1
            note = str(o.get("note") or "")
            key = note[4:] if note.startswith("job ") else (note or "not said")
            m.why[key] = m.why.get(key, 0) + 1
        elif st in ("rolled_back", "failed"):
            m.failed += 1
        else:
            m.pending += 1
    return m


def migration_lines(s: Summary, m: Moves) -> list[str]:
    """The summary's migration lines. Two sources that agree: vmctld's migrate operations (between
    nodes, started and how they ended) and the jobs' counters (``MIG`` in ``vmctl job list``: each
    completed move between nodes, and each re-pin of a process to another core of its node, which needs
    no operation)."""
    ended = ", ".join(f"{v} {k}" for k, v in sorted(m.why.items()))
    who = f"{m.started - m.by_operator} by the policy, {m.by_operator} by an operator"
    parts = [f"{m.completed} completed",
             f"{m.aborted} aborted because the job ended while moving" + (f" ({ended})" if ended else ""),
             f"{m.failed} failed and rolled back (the job ran on where it was)"]
    if m.pending:
        parts.append(f"{m.pending} still moving at the end")
    lines = [f"  migrations between nodes: {m.started} started ({who}): " + ", ".join(parts)]
    repins = s.migrations - m.completed
    if repins >= 0:
        lines.append(f"  jobs' migration counters (MIG in vmctl job list): {s.migrations} = {m.completed} completed "
                     f"between nodes + {repins} re-pin(s) to other cores of the same node")
    else:  # operations the daemon no longer lists (it restarted): say what each source says
        lines.append(f"  jobs' migration counters (MIG in vmctl job list): {s.migrations} completed moves "
                     f"(between nodes and re-pins within a node)")
    return lines
