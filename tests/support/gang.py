"""A timeslice cluster for gang-scheduling tests and benchmarks: vmctld (in-process, SQLite, a virtual
clock) and one mock agent per node (the real reconciler on the mock backend, in-memory desired state
and reports), stepped by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.agents.sources import MemoryReporter, MemorySource
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.model import Discipline
from vmctl.nodedoc import PowerState
from vmctl.store import open_store

SLICE = 10.0
NODES = ("a", "b")


def gang_daemon(tmp: Path, clock: VirtualClock, params: dict[str, object] | None = None, **cfg: Any) -> Daemon:
    config = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0, holder="gang-test",
                          checkpoint_dir=str(tmp / "ckpt"), policy_name="gs-m",
                          policy_params=params if params is not None else {"mpl": 3, "slice": SLICE}, **cfg)
    d = Daemon(config, open_store(config.store_url), clock=clock)
    assert d.start()
    return d


class Cluster:
    """vmctld and one mock agent per node (2 cores each), stepped by hand on one virtual clock."""

    def __init__(self, tmp: Path, levels: int = 3, inactive: str = "pause", fabric: MockFabric | None = None,
                 nodes: tuple[str, ...] = NODES, **cfg: Any) -> None:
        self.tmp, self.clock, self.levels, self.inactive = tmp, VirtualClock(1000.0), levels, inactive
        self.d = gang_daemon(tmp, self.clock, **cfg)
        self.agents: dict[str, Reconciler] = {}
        self.peers = {n: f"mock://{n}" for n in nodes} if fabric is not None else {}
        for n in nodes:
            self.d.register_node(n, 2, n, "mock", levels=levels, discipline=Discipline.TIMESLICE)
            self.agents[n] = self.agent(n, MockBackend(hostname=n, cores=2, clock=self.clock, fabric=fabric,
                                                       uri=f"mock://{n}", migration_seconds=2.0))

    def agent(self, node: str, backend: MockBackend) -> Reconciler:
        lay = Layout(host=node, cores=(0, 1), levels=self.levels, discipline=Discipline.TIMESLICE,
                     inactive=self.inactive)
        return Reconciler(backend, lay, MemorySource(), MemoryReporter(), clock=self.clock,
                          runner=MockProcessRunner(backend), peers={p: u for p, u in self.peers.items() if p != node})

    def step(self, dt: float = 0.0, decide: bool = True, errors_ok: bool = False) -> None:
        """Advance the clock by ``dt``; vmctld's pass (unless ``decide`` is false); every agent fetches its
        desired state, reconciles (with no error unless ``errors_ok``) and reports."""
        self.clock.advance(dt)
        if decide:
            self.d.run_once()
        for n, rec in self.agents.items():
            rec.source.set(self.d.desired(n))  # type: ignore[attr-defined]
            res = rec.run_once()
            assert errors_ok or not res.errors, res.errors
            assert res.observed is not None
            self.d.report(res.observed)

    def power(self) -> dict[str, PowerState]:
        """Power state of every job VM, over both agents."""
        return {v.name: v.power for rec in self.agents.values() for v in rec.backend.list_vms()
                if v.name.startswith("j")}
