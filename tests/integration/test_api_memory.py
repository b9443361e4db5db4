"""What an idle client or an event follower costs vmctld, and that it is given back (issue 23 item 4).

A real vmctld (a subprocess, as shipped: it serves with ``PYTHONMALLOC=malloc``) is measured from
outside through ``VmRSS``. The bounds are generous (twice the target of docs/daemon.md, a third of
what a connection cost before: ~280 KB), so that a loaded machine does not fail them; the numbers
themselves come from ``python -m bench.api_memory``. Waits are on progress (descriptors closed, RSS
falling), never on a time window.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from vmctl.localcluster import DaemonProcess

N = 600
#: KB of RSS a connection may add (the target is 50; it was ~280)
BOUND_KB = 100

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _steady(pid: int) -> bool:
    first = _rss_kb(pid)
    time.sleep(1.0)
    return abs(_rss_kb(pid) - first) <= first // 200


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.1)


@pytest.fixture()
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < N + 256:
        if hard != resource.RLIM_INFINITY and hard < N + 256:
            pytest.skip(f"the hard open-file limit {hard} is below the {N + 256} this test needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (N + 256, hard))
    d = DaemonProcess(tmp_path / "d", policy="easy", tick_s=0.5)
    d.start_and_wait(timeout=60)
    try:
        yield d
    finally:
        assert d.stop() == 0
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _tls(d: DaemonProcess, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    return ctx.wrap_socket(socket.create_connection(("127.0.0.1", d.port), timeout=60), server_hostname="127.0.0.1")


@contextlib.contextmanager
def _clients(d: DaemonProcess, n: int, request: bytes | None) -> Iterator[None]:
    ctx = ssl.create_default_context(cafile=str(d.ca_path))
    socks: list[ssl.SSLSocket] = []
    try:
        for _ in range(n):
            s = _tls(d, ctx)
            socks.append(s)
            if request is not None:
                s.sendall(request)
        yield
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


def _measure(d: DaemonProcess, request: bytes | None, what: str) -> None:
    pid = d.pid
    assert pid is not None
    base_fds = _fds(pid)
    before = _rss_kb(pid)
    with _clients(d, N, request):
        _wait(lambda: _fds(pid) >= base_fds + N - 2, 120, f"vmctld holds the {N} {what}")
        _wait(lambda: _steady(pid), 120, "vmctld's RSS stopped growing")  # the requests are parked
        grown = _rss_kb(pid) - before
    per = grown / N
    assert per <= BOUND_KB, f"{what}: {per:.0f} KB of RSS each (bound {BOUND_KB}; target 50)"
    _wait(lambda: _fds(pid) <= base_fds + 2, 120, f"vmctld closed the {what}")
    # most of it comes back: RSS falls below half of what the connections took
    _wait(lambda: _rss_kb(pid) - before <= max(grown // 2, 2048), 120,
          f"vmctld gave back the memory of the {what} (took {grown} KB, now {_rss_kb(pid) - before} KB above)")


def test_idle_tls_connections_cost_little_and_their_memory_comes_back(daemon: DaemonProcess) -> None:
    _measure(daemon, None, "idle TLS connections")
    _measure(daemon, None, "idle TLS connections (again)")  # and a second wave takes no more than the first


def test_event_followers_cost_little_and_their_memory_comes_back(daemon: DaemonProcess) -> None:
    req = (f"GET /v1/events?after=1000000&wait=60 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           f"Authorization: Bearer {daemon.token()}\r\n\r\n").encode()
    _measure(daemon, req, "event followers")
