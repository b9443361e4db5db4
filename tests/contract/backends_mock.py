"""The mock backend in the contract suite: full capabilities (in memory, and with its guests in state
files), and a minimal variant (define and lifecycle only) that exercises the OperationNotSupported
paths."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vmctl.agents.backends.base import Capability, HypervisorBackend, VmSpec
from vmctl.agents.backends.mock import MockBackend, MockFabric, MockProcessRunner
from vmctl.clock import VirtualClock
from vmctl.nodedoc import ProcessSpec


@dataclass
class MockHarness:
    backend: MockBackend
    peer: MockBackend | None
    clock: VirtualClock
    peer_uri: str = ""
    migrate_uri: str | None = None
    cpu_stats_real: bool = True
    extra: list[HypervisorBackend] = field(default_factory=list)

    def spec(self, name: str) -> VmSpec:
        return VmSpec(name=name, vcpus=1, memory_mib=32, metadata={"vmctl.test": "contract"})

    def busy_spec(self, name: str) -> VmSpec | None:
        return self.spec(name)

    def make_busy(self, name: str) -> None:
        """Mock guests are idle until a process runs: give a started VM a spinning one."""
        MockProcessRunner(self.backend).start(name, ProcessSpec(job_id="spin", index=0, work_seconds=1e9))

    def wait(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def close(self) -> None:
        self.backend.close()
        if self.peer is not None:
            self.peer.close()


def make_mock(tmp: Path) -> MockHarness:
    clock = VirtualClock(1000.0)
    fabric = MockFabric()
    a = MockBackend("ct-a", cores=2, clock=clock, fabric=fabric, migration_seconds=0.5)
    b = MockBackend("ct-b", cores=2, clock=clock, fabric=fabric, migration_seconds=0.5)
    return MockHarness(backend=a, peer=b, clock=clock, peer_uri=b.uri)


def make_mock_persistent(tmp: Path) -> MockHarness:
    """The full mock with its guests in state files (as ``vmctl-agent`` runs it): the same contract."""
    clock = VirtualClock(1000.0)
    fabric = MockFabric()
    a = MockBackend("ct-a", cores=2, clock=clock, fabric=fabric, migration_seconds=0.5, state_file=tmp / "ct-a.state")
    b = MockBackend("ct-b", cores=2, clock=clock, fabric=fabric, migration_seconds=0.5, state_file=tmp / "ct-b.state")
    return MockHarness(backend=a, peer=b, clock=clock, peer_uri=b.uri)


def make_mock_minimal(tmp: Path) -> MockHarness:
    clock = VirtualClock(1000.0)
    a = MockBackend("ct-min", cores=2, clock=clock, capabilities=(Capability.DEFINE, Capability.LIFECYCLE))
    return MockHarness(backend=a, peer=None, clock=clock)


FACTORIES: dict[str, Callable[[Path], MockHarness]] = {"mock": make_mock, "mock-persistent": make_mock_persistent,
                                                      "mock-minimal": make_mock_minimal}
