"""What clients can make vmctld hold: memory per connection, and the API's latency meanwhile
(``python -m bench.api_memory [--quick]``; issue 23 items 4 and 5).

A real vmctld (a subprocess, SQLite, TLS on loopback) is measured from outside: its resident set
(``VmRSS`` of ``/proc/PID/status``) and the latency of ``GET /healthz`` on one keep-alive
connection. The baseline, in the same run, is the same daemon before any load.

1. Idle unauthenticated connections: ``--idle`` (2,000) TLS connections that finish their
   handshake and send nothing. RSS before, with them open, and after they close: KB per connection
   and the share of it returned.
2. Event followers: ``--followers`` (1,000) clients each following the event log
   (``GET /v1/events?after=SEQ&wait=60``, asking again at once with the new ``last_seq`` after every
   answer) while a client submits a job every ``--submit-every`` seconds (each submission writes an
   event, which wakes every follower). RSS per follower and returned after they close;
   ``/healthz`` and submission latency (p50/p99) beside the baseline.
3. ``POST /v1/plan``: 4 clients with read tokens loop a plan of ``--plan-workers`` (10,000) workers;
   ``/healthz`` p50/p99 beside the baseline, and how many plans were answered and refused (429).

Each load is measured twice, alternating with a fresh baseline (the machine may be shared: the
1-minute load average is printed beside every number). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import resource
import selectors
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from vmctl.localcluster import DaemonProcess


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting until {what}")
        time.sleep(0.1)


def settled_rss(pid: int, secs: float = 1.5) -> int:
    """RSS once the daemon had ``secs`` to settle (its idle timers, a garbage collection)."""
    time.sleep(secs)
    return rss_kb(pid)


class Latency:
    """Times ``GET /healthz`` on one keep-alive connection every ``every`` seconds, in a thread."""

    def __init__(self, d: DaemonProcess, ctx: ssl.SSLContext, path: str = "/healthz", every: float = 0.02) -> None:
        self.d, self.ctx, self.path, self.every = d, ctx, path, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", self.d.port, context=self.ctx, timeout=60)
        try:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                conn.request("GET", self.path)
                conn.getresponse().read()
                self.samples.append(time.perf_counter() - t0)
                self._stop.wait(self.every)
        finally:
            conn.close()

    def __enter__(self) -> Latency:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(70)

    def text(self) -> str:
        ms = [s * 1000 for s in self.samples]
        return f"p50 {pct(ms, 50):7.1f} ms  p99 {pct(ms, 99):7.1f} ms  max {max(ms, default=0):7.1f} ms  (n={len(ms)})"


def healthz_baseline(d: DaemonProcess, ctx: ssl.SSLContext, secs: float) -> Latency:
    with Latency(d, ctx) as lat:
        time.sleep(secs)
    return lat


def tls_connect(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    return ctx.wrap_socket(s, server_hostname="127.0.0.1")


@contextlib.contextmanager
def idle_connections(port: int, ctx: ssl.SSLContext, n: int) -> Iterator[list[ssl.SSLSocket]]:
    socks: list[ssl.SSLSocket] = []
    try:
        for _ in range(n):
            socks.append(tls_connect(port, ctx))
        yield socks
    finally:
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()


class Followers:
    """``n`` clients following the event log, each on its own TLS connection, served by one
    selector thread (asking again as soon as an answer arrives)."""

    def __init__(self, d: DaemonProcess, ctx: ssl.SSLContext, n: int, token: str) -> None:
        self.d, self.ctx, self.n, self.token = d, ctx, n, token
        self.answers = 0
        self.errors = 0
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._socks: list[ssl.SSLSocket] = []
        self._t = threading.Thread(target=self._run, daemon=True)

    def _ask(self, s: ssl.SSLSocket, after: int) -> None:
        req = (f"GET /v1/events?after={after}&wait=60 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               f"Authorization: Bearer {self.token}\r\n\r\n").encode()
        s.setblocking(True)
        s.sendall(req)
        s.setblocking(False)

    def open(self, after: int) -> None:
        for _ in range(self.n):
            s = tls_connect(self.d.port, self.ctx)
            self._socks.append(s)
            self._ask(s, after)
            self._sel.register(s, selectors.EVENT_READ, bytearray())
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(0.2):
                s: ssl.SSLSocket = key.fileobj  # type: ignore[assignment]
                buf: bytearray = key.data
                try:
                    while True:
                        chunk = s.recv(65536)
                        if not chunk:
                            self._sel.unregister(s)
                            self.errors += 1
                            break
                        buf += chunk
                except (ssl.SSLWantReadError, BlockingIOError):
                    pass
                except OSError:
                    self._sel.unregister(s)
                    self.errors += 1
                    continue
                head, sep, body = bytes(buf).partition(b"\r\n\r\n")
                if not sep:
                    continue
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                if len(body) < length:
                    continue
                del buf[:]
                self.answers += 1
                try:
                    self._ask(s, int(json.loads(body[:length])["last_seq"]))
                except (OSError, ValueError, KeyError):
                    self.errors += 1

    def close(self) -> None:
        self._stop.set()
        if self._t.is_alive():
            self._t.join(10)
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.close()
        self._sel.close()


class FollowersProcess:
    """``Followers`` in a child process (``--follow-child``): their client work must not hold up the
    thread that times ``/healthz`` (one interpreter lock)."""

    def __init__(self, d: DaemonProcess, n: int, token: str, after: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.api_memory", "--follow-child", str(n), str(d.port), str(d.ca_path),
             str(after)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, "VMCTL_BENCH_TOKEN": token})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the followers' process failed: {line!r}")

    def answers(self) -> tuple[int, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("count\n")
        self.proc.stdin.flush()
        a, e = self.proc.stdout.readline().split()
        return int(a), int(e)

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def follow_child(n: int, port: int, ca: str, after: int) -> int:
    ctx = ssl.create_default_context(cafile=ca)

    class _D:  # what Followers needs of a DaemonProcess
        pass

    d: Any = _D()
    d.port = port
    f = Followers(d, ctx, n, os.environ["VMCTL_BENCH_TOKEN"])
    f.open(after)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "count":
            print(f.answers, f.errors, flush=True)
    f.close()
    return 0


class Submitter:
    """Submits one job every ``every`` seconds (each writes an event) and times the submissions."""

    def __init__(self, d: DaemonProcess, ctx: ssl.SSLContext, token: str, every: float) -> None:
        self.d, self.ctx, self.token, self.every = d, ctx, token, every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = http.client.HTTPSConnection("127.0.0.1", self.d.port, context=self.ctx, timeout=60)
        body = json.dumps({"procs": 1, "estimate": 60.0, "work_seconds": 60.0}).encode()
        hdrs = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        try:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                conn.request("POST", "/v1/jobs", body=body, headers=hdrs)
                conn.getresponse().read()
                self.samples.append(time.perf_counter() - t0)
                self._stop.wait(self.every)
        finally:
            conn.close()

    def __enter__(self) -> Submitter:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(70)


def api(d: DaemonProcess, ctx: ssl.SSLContext, method: str, path: str, token: str, body: Any = None,
        timeout: float = 120) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", d.port, context=ctx, timeout=timeout)
    try:
        hdrs = {"Authorization": f"Bearer {token}"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            hdrs["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def last_seq(d: DaemonProcess, ctx: ssl.SSLContext, token: str) -> int:
    status, _h, raw = api(d, ctx, "GET", "/v1/events?limit=1", token)
    assert status == 200, raw
    return int(json.loads(raw)["last_seq"])


def quiet_fds(d: DaemonProcess, base_fds: int) -> None:
    assert d.proc is not None
    wait_until(lambda: open_fds(d.proc.pid) <= base_fds + 4, 120, "the daemon closed the connections")  # type: ignore[union-attr]


def bench_idle(d: DaemonProcess, ctx: ssl.SSLContext, n: int, rounds: int) -> None:
    assert d.proc is not None
    pid = d.proc.pid
    print(f"\n1. {n} idle unauthenticated TLS connections (handshake done, nothing sent)")
    base_fds = open_fds(pid)
    for r in range(rounds):
        before = settled_rss(pid)
        base = healthz_baseline(d, ctx, 2.0)
        t0 = time.perf_counter()
        with idle_connections(d.port, ctx, n):
            opened = time.perf_counter() - t0
            wait_until(lambda: open_fds(pid) >= base_fds + n - 5, 60, f"the daemon holds {n} connections")
            with_ = settled_rss(pid)
            with Latency(d, ctx) as lat:
                time.sleep(2.0)
        quiet_fds(d, base_fds)
        after = settled_rss(pid, 3.0)
        grown = with_ - before
        print(f"  round {r + 1} ({load()}): RSS before {before / 1024:.1f} MB, with {with_ / 1024:.1f} MB, "
              f"after close {after / 1024:.1f} MB; {grown / n:.1f} KB per connection "
              f"(target <= 50), {100 * (with_ - after) / max(1, grown):.0f} % returned; opened in {opened:.1f} s")
        print(f"    /healthz baseline {base.text()}")
        print(f"    /healthz with     {lat.text()}")


def bench_followers(d: DaemonProcess, ctx: ssl.SSLContext, n: int, every: float, secs: float, rounds: int) -> None:
    assert d.proc is not None
    pid = d.proc.pid
    token = d.token()
    print(f"\n2. {n} event followers (GET /v1/events?after=SEQ&wait=60), one job submitted every {every:g} s")
    base_fds = open_fds(pid)
    for r in range(rounds):
        before = settled_rss(pid)
        with Submitter(d, ctx, token, every) as base_sub, Latency(d, ctx) as base:
            time.sleep(secs)
        f = FollowersProcess(d, n, token, last_seq(d, ctx, token))
        try:
            wait_until(lambda: open_fds(pid) >= base_fds + n - 5, 60, f"the daemon holds {n} followers")
            with_ = settled_rss(pid)
            answered, _e = f.answers()
            with Submitter(d, ctx, token, every) as sub, Latency(d, ctx) as lat:
                time.sleep(secs)
            with_load = rss_kb(pid)
            now_answered, errors = f.answers()
            answered = now_answered - answered
        finally:
            f.close()
        quiet_fds(d, base_fds)
        after = settled_rss(pid, 3.0)
        grown = with_ - before
        print(f"  round {r + 1} ({load()}): RSS before {before / 1024:.1f} MB, with {with_ / 1024:.1f} MB "
              f"(after {secs:g} s of events {with_load / 1024:.1f} MB), after close {after / 1024:.1f} MB; "
              f"{grown / n:.1f} KB per follower (target <= 50), {100 * (with_ - after) / max(1, grown):.0f} % returned")
        print(f"    answers to followers during the load: {answered} ({errors} errors)")
        print(f"    /healthz baseline {base.text()}")
        print(f"    /healthz with     {lat.text()}  (target p99 <= 100 ms)")
        sub_ms = [s * 1000 for s in sub.samples]
        base_sub_ms = [s * 1000 for s in base_sub.samples]
        print(f"    submit baseline p50 {pct(base_sub_ms, 50):.1f} ms p99 {pct(base_sub_ms, 99):.1f} ms; "
              f"with followers p50 {pct(sub_ms, 50):.1f} ms p99 {pct(sub_ms, 99):.1f} ms")


def plan_instance(workers: int) -> dict[str, Any]:
    return {"policy": "workload",
            "workers": [{"id": f"w{i}", "node": f"n{i // 32}", "speed": 1.0 + (i % 3) / 2} for i in range(workers)],
            "jobs": [{"id": f"j{i}", "tasks": 2000 + 100 * i, "work": 10.0 + i, "priority": i % 4} for i in range(20)]}


def plan_loop(d: DaemonProcess, ctx: ssl.SSLContext, body: bytes, token: str, stop: threading.Event,
              counts: dict[int, int], lock: threading.Lock) -> None:
    """Asks for the plan again as soon as it is answered (after Retry-After when refused) until ``stop``."""
    conn = http.client.HTTPSConnection("127.0.0.1", d.port, context=ctx, timeout=300)
    hdrs = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    try:
        while not stop.is_set():
            conn.request("POST", "/v1/plan", body=body, headers=hdrs)
            resp = conn.getresponse()
            resp.read()
            with lock:
                counts[resp.status] = counts.get(resp.status, 0) + 1
            if resp.status == 429:
                stop.wait(float(resp.getheader("Retry-After") or 1))
    finally:
        conn.close()


def bench_plan(d: DaemonProcess, ctx: ssl.SSLContext, workers: int, clients: int, secs: float, rounds: int) -> None:
    admin = d.token()
    tokens = []
    for i in range(clients):
        status, _h, raw = api(d, ctx, "POST", "/v1/tokens", admin, {"name": f"planner{i}", "role": "read"})
        assert status == 201, raw
        tokens.append(json.loads(raw)["token"])
    body = json.dumps(plan_instance(workers)).encode()
    t0 = time.perf_counter()
    status, _h, raw = api(d, ctx, "POST", "/v1/plan", tokens[0], body)
    one = time.perf_counter() - t0
    print(f"\n3. {clients} read-token clients looping POST /v1/plan ({workers} workers, {len(body) / 1e6:.2f} MB): "
          f"one plan alone answers {status} in {one:.2f} s")
    for r in range(rounds):
        base = healthz_baseline(d, ctx, secs)
        stop = threading.Event()
        counts: dict[int, int] = {}
        lock = threading.Lock()

        threads = [threading.Thread(target=plan_loop, args=(d, ctx, body, t, stop, counts, lock), daemon=True)
                   for t in tokens]
        for t in threads:
            t.start()
        time.sleep(0.5)
        with Latency(d, ctx) as lat:
            time.sleep(secs)
        stop.set()
        for t in threads:
            t.join(300)
        print(f"  round {r + 1} ({load()}): answers by status {dict(sorted(counts.items()))}")
        print(f"    /healthz baseline {base.text()}")
        print(f"    /healthz with     {lat.text()}  (target p99 <= 100 ms)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.api_memory", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 connections, 300 followers, 1,000 workers, 1 round")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--followers", type=int, default=1000)
    ap.add_argument("--submit-every", type=float, default=0.5)
    ap.add_argument("--plan-workers", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--secs", type=float, default=10.0, help="seconds each latency measurement lasts")
    ap.add_argument("--only", choices=("idle", "followers", "plan"), action="append")
    ap.add_argument("--daemon-code", metavar="DIR",
                    help="run vmctld from the vmctl package in DIR (an older commit's tree: git archive) to compare")
    ap.add_argument("--follow-child", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.follow_child:
        n, port, ca, after = a.follow_child
        return follow_child(int(n), int(port), ca, int(after))
    if a.quick:
        # above the 256 closed connections after which vmctld gives memory back (vmctl.api.listener)
        a.idle, a.followers, a.plan_workers, a.rounds, a.secs = 300, 300, 1000, 1, 3.0
    need = a.idle + a.followers + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise SystemExit(f"the open-file limit {hard} is below the {need} this benchmark needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    only = [k for k in ("idle", "followers", "plan") if k in (a.only or ("idle", "followers", "plan"))]
    for what in only:
        # a fresh daemon for each load: memory freed (or not) by one does not serve the next
        with tempfile.TemporaryDirectory(prefix="vmctl-bench-apimem-") as tmp:
            d = DaemonProcess(Path(tmp) / "d", policy="easy", tick_s=0.5)
            if a.daemon_code:  # ahead of the working directory, which -m would put first
                boot = (f"import runpy, sys; sys.path.insert(0, {str(Path(a.daemon_code).resolve())!r}); "
                        "runpy.run_module('vmctl.daemon.main', run_name='__main__', alter_sys=True)")
                d.argv = [sys.executable, "-c", boot, *d.argv[3:]]
            d.start_and_wait(timeout=60)
            try:
                assert d.proc is not None
                ctx = ssl.create_default_context(cafile=str(d.ca_path))
                healthz_baseline(d, ctx, 1.0)  # warm up
                print(f"\nvmctld pid {d.proc.pid}: RSS {rss_kb(d.proc.pid) / 1024:.1f} MB after start ({load()}, "
                      f"{os.cpu_count()} cores){' code from ' + a.daemon_code if a.daemon_code else ''}")
                if what == "idle":
                    bench_idle(d, ctx, a.idle, a.rounds)
                elif what == "followers":
                    bench_followers(d, ctx, a.followers, a.submit_every, a.secs, a.rounds)
                else:
                    bench_plan(d, ctx, a.plan_workers, 4, a.secs, a.rounds)
            finally:
                d.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
