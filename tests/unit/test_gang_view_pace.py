"""vmctld's view gives a running gang job the progress of its rows' share of the slices (``row_pace``);
``prepare_view`` computes that share once per distinct set of rows of a view (issue 27). After random
events on a gang cluster, every running gang job's progress in the view must be what ``row_pace`` of its
own record gives."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.support.gang import gang_daemon
from vmctl.clock import VirtualClock
from vmctl.daemon.core import Daemon
from vmctl.daemon.state import row_pace
from vmctl.daemon.view import build_view
from vmctl.model import Discipline, JobState
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.store.base import JobRecord

NODES, CORES, ROWS = 4, 4, 3


def _end(d: Daemon, rec: JobRecord) -> None:
    """The agents report the processes of ``rec`` exited."""
    by_node: dict[str, list[VmObserved]] = {}
    for i, (n, c) in enumerate(rec.placement):
        by_node.setdefault(n, []).append(VmObserved(rec.vm_name(i), PowerState.RUNNING, core=c, process_job=rec.id,
                                                    process_index=i, process_exit=0))
    for n, vms in sorted(by_node.items()):
        d.report(NodeObserved(node=n, generation_applied=d.state.generation.get(n, 0), cores=CORES, vms=tuple(vms)))


@pytest.mark.parametrize("seed", [1, 2])
def test_each_gang_jobs_view_progress_is_its_own_rows_pace(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    clock = VirtualClock(1000.0)
    d = gang_daemon(tmp_path, clock, {"mpl": ROWS, "slice": 10.0}, node_timeout_s=1e9, kill_at_estimate=False)
    try:
        for i in range(NODES):
            d.register_node(f"n{i}", CORES, f"n{i}", "mock", levels=ROWS, discipline=Discipline.TIMESLICE)
        checked, row_sets = 0, set()
        for _step in range(60):
            clock.advance(rng.uniform(1, 30))
            if rng.random() < 0.5:
                d.submit([{"procs": rng.choice([1, 2, 3, 4, 6, 8, 16]), "estimate": rng.uniform(50, 900),
                           "work_seconds": 5000.0} for _ in range(rng.randint(1, 3))])
            else:
                live = [r for r in d.state.active() if r.state == JobState.RUNNING and r.placement]
                if live:
                    _end(d, rng.choice(live))
            d.run_once()
            now = clock.now()
            view, _lay = build_view(d.state, now)
            slices = d.state.slices
            for rec in d.state.active():
                rj = view.running.get(rec.id)
                if rj is None or not rec.gang or rec.state != JobState.RUNNING or rec.tier_since is None \
                        or rec.suspended or rec.checkpointed or rec.migrating:
                    continue
                want = rec.progress_base + max(0.0, now - rec.tier_since) * row_pace(rec, slices)
                assert rj.progress == want, (rec.id, rec.level, rec.replicas, rj.progress, want)
                checked += 1
                row_sets.add((rec.level, tuple(rec.replicas)))
        # the test means something only with jobs in several sets of rows, some replicated
        assert checked > 100
        assert len(row_sets) >= 3 and any(reps for _lv, reps in row_sets), row_sets
    finally:
        d.close()
        d.store.close()
