"""The view vmctld's policy sees is kept between decisions and updated job by job (``vmctl.daemon.view``):
after any sequence of events it must equal the view built from scratch from every record."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.daemon.view import build_view
from vmctl.model import ClusterView
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.policies.registry import create_policy
from vmctl.store import open_store

NODES, CORES = 4, 4


def _fields(view: ClusterView) -> dict[str, Any]:
    return {
        "total": view.total_cores, "levels": view.levels, "discipline": view.discipline,
        "queue": [j.id for j in view.queue], "queue_index": dict(view.queue_index),
        "running": dict(view.running), "running_order": list(view.running),
        "slots": [list(row) for row in view.slot_job], "idle": [set(s) for s in view.idle],
        "fg_util": list(view.fg_util), "usable": list(view.usable),
    }


def _assert_same(d: Daemon) -> None:
    now = d.clock.now()
    kept, _ = build_view(d.state, now)
    fresh, _ = build_view(d.state, now, full=True)
    assert _fields(kept) == _fields(fresh)


def _report(d: Daemon, node: str, rng: random.Random, end: str | None) -> None:
    """The agent of ``node`` reports its VMs (measured utilization drawn at random); the processes of job
    ``end`` exited."""
    vms = []
    for rec in d.state.jobs_on(node):
        for i, (n, c) in enumerate(rec.placement):
            if n != node:
                continue
            vms.append(VmObserved(rec.vm_name(i), PowerState.RUNNING, core=c, process_job=rec.id, process_index=i,
                                  process_exit=0 if rec.id == end else None,
                                  utilization=rng.choice([0.0, 0.3, 0.5, 0.99, 1.0])))
    d.report(NodeObserved(node=node, generation_applied=d.state.generation.get(node, 0), cores=CORES,
                          vms=tuple(vms)))


def _daemon(tmp_path: Path, policy: str) -> Daemon:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/v.db", state_dir=str(tmp_path / "state"), holder="t",
                       tick_s=3600, node_timeout_s=1e9, kill_at_estimate=False)
    d = Daemon(cfg, open_store(cfg.store_url), clock=VirtualClock(1000.0), policy=create_policy(policy))
    d.start()
    for i in range(NODES):
        d.register_node(f"n{i}", CORES, f"n{i}", "mock")
    return d


@pytest.mark.parametrize("policy", ["measy", "keasy"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_kept_view_equals_a_fresh_one_after_random_events(tmp_path: Path, policy: str, seed: int) -> None:
    rng = random.Random(seed)
    d = _daemon(tmp_path, policy)
    reused = 0
    try:
        for _step in range(120):
            d.clock.advance(rng.uniform(1, 50))
            what = rng.random()
            active = d.state.active()
            if what < 0.3:
                specs = []
                for _ in range(rng.randint(1, 4)):
                    procs = rng.choice([1, 2, 3, 4, 6, 8])
                    specs.append({"procs": procs, "estimate": rng.uniform(20, 400),
                                  "cpu_usage": rng.choice([None, [0.2] * procs, [0.5] * procs])})
                d.submit(specs)
            elif what < 0.55 and active:
                rec = rng.choice(active)
                for node in sorted({n for n, _c in rec.placement}):
                    _report(d, node, rng, rec.id)
            elif what < 0.7:
                _report(d, f"n{rng.randrange(NODES)}", rng, None)
            elif what < 0.78 and active:
                d.cancel(rng.choice(active).id)
            elif what < 0.85:
                node = f"n{rng.randrange(NODES)}"
                d.set_node_state(node, drain=d.state.nodes[node].state == "ready")
            elif what < 0.9 and d.state.queue():
                job = rng.choice(d.state.queue()).id
                d.hold(job)
                if rng.random() < 0.5:
                    d.release(job)
            cells = d.state._vcells
            _assert_same(d)  # between events, with changes pending
            d.run_once()
            reused += d.state._vcells is cells and cells is not None
            _assert_same(d)
        assert d.state.active(), "the sequence kept some jobs running"
        assert reused > 50, "most views were updated, not rebuilt"
    finally:
        d.close()
        d.store.close()


def test_a_fresh_view_leaves_the_kept_arrays_alone(tmp_path: Path) -> None:
    d = _daemon(tmp_path, "measy")
    try:
        d.submit([{"procs": 2, "estimate": 100.0}, {"procs": 4, "estimate": 100.0}])
        d.run_once()
        cells = d.state._vcells
        assert cells is not None
        build_view(d.state, d.clock.now(), full=True)
        assert d.state._vcells is cells
        view, _ = build_view(d.state, d.clock.now())
        held = list(view.fg_job)
        d.submit([{"procs": 4, "estimate": 100.0}] * 3)
        d.clock.advance(1)
        d.run_once()
        assert list(view.fg_job) == held, "a view outlives later changes unaltered"
    finally:
        d.close()
        d.store.close()
