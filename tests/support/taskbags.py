"""Mock worker hosts for task-bag tests: ``WorkerHosts`` runs one agent (the real reconciler over HTTPS
on the mock backend, real clock) per host in a thread, each host with ``cores`` cores of a ``shared``
layout of ``levels`` workers per core (paper 001's testbed: 1 core, 2 workers)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from vmctl.agents.backends.mock import MockBackend, MockProcessRunner
from vmctl.agents.http_source import AgentEndpoint, HttpReporter, HttpSource
from vmctl.agents.layout import Layout
from vmctl.agents.reconciler import Reconciler
from vmctl.clock import SystemClock
from vmctl.model import Discipline


class WorkerHosts:
    def __init__(self, daemon: Any, directory: Path, hosts: int, cores: int = 1, levels: int = 2,
                 speeds: tuple[float, ...] = ()) -> None:
        self.daemon = daemon
        self.stop_event = threading.Event()
        self.parts: list[tuple[HttpSource, HttpReporter, MockBackend]] = []
        self.agents: list[Reconciler] = []
        self.threads: list[threading.Thread] = []
        for h in range(hosts):
            name = f"w{h:02d}"
            cert, key = daemon.agent_cert(name, directory / "certs")
            ep = AgentEndpoint(daemon.url, name, cert, key, daemon.ca_file)
            source, reporter = HttpSource(ep, wait_s=0.5), HttpReporter(ep)
            speed = speeds[h] if h < len(speeds) else None
            # the backend runs its processes at the speed the agent registers (as vmctl-agent does)
            backend = MockBackend(hostname=name, cores=cores, uri=f"mock://{name}", clock=SystemClock(),
                                  poll_seconds=0.02, speed=1.0 if speed is None else speed)
            layout = Layout(host=name, cores=tuple(range(cores)), levels=levels, discipline=Discipline.SHARED)
            agent = Reconciler(backend, layout, source, reporter, runner=MockProcessRunner(backend),
                               resync_seconds=0.2)
            source.register(cores, name, "mock", levels=levels, discipline="shared",
                            speed=speed)
            self.parts.append((source, reporter, backend))
            self.agents.append(agent)

    def start(self) -> WorkerHosts:
        for agent in self.agents:
            th = threading.Thread(target=agent.run, args=(self.stop_event,), kwargs={"max_wait": 0.05}, daemon=True)
            th.start()
            self.threads.append(th)
        return self

    def close(self) -> None:
        self.stop_event.set()
        for agent in self.agents:
            agent.wake()
        for th in self.threads:
            th.join(10)
        for source, reporter, backend in self.parts:
            source.stop()
            reporter.close()
            backend.close()

    def __enter__(self) -> WorkerHosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
