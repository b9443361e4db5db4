"""The demo's closing summary: response time, wait and bounded slowdown of the finished jobs (model
seconds), jobs by final state, migrations.

Bounded slowdown is the simulator's definition (``vmctl.sim.metrics.bounded_slowdown``, threshold
``vmctl.sim.metrics.TAU`` = 10 s, MEASY sec. 3.3), not a second copy: the demo's numbers and
``vmctl sim``'s mean the same thing. The one difference is what is known: a daemon reports a job's
last start and end, so ``run`` here is ``end - start`` of the finished run (the simulator counts the
dedicated-core run time), and the wait is ``start - submit``.
"""

from __future__ import annotations

import contextlib
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


def migration_outcomes(metrics_text: str) -> dict[str, float]:
    """``vmctl_migrations_total{outcome="..."}`` of vmctld's /metrics: migrations between nodes by outcome."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("vmctl_migrations_total{"):
            continue
        labels, _, value = line.partition("} ")
        for part in labels.split("{", 1)[1].split(","):
            key, _, val = part.partition("=")
            if key.strip() == "outcome":
                with contextlib.suppress(ValueError):
                    out[val.strip().strip('"')] = out.get(val.strip().strip('"'), 0.0) + float(value)
    return out
