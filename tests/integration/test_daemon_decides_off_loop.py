"""vmctld keeps serving its API while the policy decides: the policy runs in a worker thread, not on
the event loop (``DaemonRuntime._loop``, ``Daemon.choose``). The policy here blocks until the test lets
it go, so the test needs no timing: if the decision held the event loop, the requests below could not
be answered before it is released (they would time out)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import ClassVar

from tests.livedaemon import long_poll_parked
from tests.support.daemon import InProcessDaemon
from vmctl.daemon.config import DaemonConfig
from vmctl.model import ClusterView, Decision
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.registry import create_policy


class HeldPolicy(SchedulingPolicy):
    """EASY, except that the first decision with a queued job waits for ``release``."""

    name: ClassVar[str] = "held-easy"

    def __init__(self) -> None:
        super().__init__()
        self.inner = create_policy("easy")
        self.entered = threading.Event()
        self.release = threading.Event()
        self.decided = threading.Event()
        self.thread: str | None = None

    def decide(self, view: ClusterView, now: float) -> Decision:
        if view.queue and not self.entered.is_set():
            self.thread = threading.current_thread().name
            self.entered.set()
            assert self.release.wait(60), "the test never released the decision"
            out = self.inner.decide(view, now)
            self.decided.set()
            return out
        return self.inner.decide(view, now)


def test_the_api_answers_while_the_policy_decides(tmp_path: Path) -> None:
    policy = HeldPolicy()
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), tick_s=0.5,
                       holder="off-loop-test")
    with InProcessDaemon(cfg, policy=policy) as d:
        try:
            status, first = d.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60})
            assert status == 201
            assert policy.entered.wait(20), "no decision started after a submission"
            # the decision is under way and blocked: the API still answers, reads and writes alike
            assert d.request("GET", "/v1/health")[0] == 200
            status, second = d.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60})
            assert status == 201
            status, jobs = d.request("GET", "/v1/jobs")
            assert status == 200
            assert {j["id"] for j in jobs["jobs"]} >= {first["job"]["id"], second["job"]["id"]}
            assert not policy.decided.is_set()
            assert policy.thread is not None and policy.thread != "vmctld-test"  # not the loop's thread
        finally:
            policy.release.set()
        assert policy.decided.wait(20)


def test_shutdown_answers_waiting_long_polls_instead_of_waiting_them_out(tmp_path: Path) -> None:
    """An agent's long-poll (here 30 s) is always out; stopping vmctld answers it at once (304)
    rather than holding the shutdown until the poll's time is up."""
    import gc
    import time
    import warnings

    from vmctl.agents.http_source import AgentEndpoint, HttpSource

    cfg = DaemonConfig(store_url=f"sqlite:///{tmp_path}/d.db", state_dir=str(tmp_path / "state"), tick_s=0.5,
                       holder="shutdown-test", policy_name="easy", policy_explicit=True)
    d = InProcessDaemon(cfg)
    d.start()
    cert, key = d.agent_cert("n1", tmp_path / "certs")
    src = HttpSource(AgentEndpoint(d.url, "n1", cert, key, d.ca_file), wait_s=30)
    src.register(cores=2, hostname="n1", backend="mock")
    first = src.fetch()
    assert first is not None
    answers: list[object] = []

    def poll() -> None:  # one long-poll with nothing new to wait for
        try:
            answers.append(src._poll(30.0, src._conn))
        except Exception as exc:
            answers.append(exc)

    th = threading.Thread(target=poll)
    th.start()
    deadline = time.monotonic() + 30
    while not long_poll_parked(d, "n1"):  # the request is waiting on the server (not merely sent)
        assert time.monotonic() < deadline, "the long-poll never reached the server"
        time.sleep(0.02)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        t = time.monotonic()
        d.stop()
        stopped_in = time.monotonic() - t
        th.join(10)
        gc.collect()
    src.stop()
    assert stopped_in < 10, f"vmctld took {stopped_in:.1f} s to stop with a 30 s long-poll out"
    assert answers == [None]  # 304: nothing new, the agent polls again (and finds the daemon gone)
    # the agent's connection was still open (keep-alive): the stopped server left no socket behind
    assert not [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
