"""Build small ClusterViews by hand for policy and invariant tests."""

from __future__ import annotations

import math
from collections.abc import Iterable

from vmctl.model import ClusterView, Job, RunningJob, Tier


def job(jid: str | int, procs: int, estimate: float, submit: float = 0.0, usage: float | None = None) -> Job:
    cpu = None if usage is None else (usage,) * procs
    return Job(id=str(jid), submit_time=submit, procs=procs, estimate=estimate, cpu_usage=cpu)


def view(
    cores: int,
    queue: Iterable[Job] = (),
    running: Iterable[tuple[Job, Tier, tuple[int, ...], float]] = (),
    fg_util: dict[int, float] | None = None,
    now: float = 0.0,
    unusable: Iterable[int] = (),
    progress: dict[str, float] | None = None,
) -> ClusterView:
    """``running`` holds (job, tier, cores, start_time); fg jobs get expected_end = start + estimate,
    or ``now + estimate - progress`` when ``progress[job id]`` is given (bg jobs keep math.inf)."""
    prog = progress or {}
    fg: list[str | None] = [None] * cores
    bg: list[str | None] = [None] * cores
    util = [0.0] * cores
    run: dict[str, RunningJob] = {}
    for j, tier, cs, start in running:
        slots = fg if tier is Tier.FG else bg
        for i, c in enumerate(cs):
            assert slots[c] is None, f"core {c} {tier} taken twice in the test setup"
            slots[c] = j.id
            if tier is Tier.FG:
                util[c] = j.usage_of(i)
        done = prog.get(j.id)
        if tier is Tier.BG:
            end = math.inf
        elif done is None:
            end = start + j.estimate
        else:
            end = now + j.estimate - done
        run[j.id] = RunningJob(
            job=j, tier=tier, cores=cs, start_time=start, tier_since=start, progress=done or 0.0, expected_end=end
        )
    for c, u in (fg_util or {}).items():
        util[c] = u
    bad = set(unusable)
    usable = [c not in bad for c in range(cores)]
    return ClusterView(
        total_cores=cores,
        queue=sorted(queue, key=lambda j: (j.submit_time, j.id)),
        running=run,
        fg_job=fg,
        bg_job=bg,
        idle_fg={c for c in range(cores) if fg[c] is None and usable[c]},
        idle_bg={c for c in range(cores) if bg[c] is None and usable[c]},
        fg_util=util,
        usable=usable,
    )
