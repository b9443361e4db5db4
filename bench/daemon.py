"""Benchmarks of vmctld (``python -m bench.daemon [--quick] [--nodes N] [--queued Q]``; issue 27's size:
``--nodes 10000``, 100,000 queued).

1. Decision latency: a cluster of 1,000 nodes x 32 cores (the mock backend's shape; the agents are
   replaced by direct reports), full of running jobs, with 10,000 jobs queued, under MEASY. One event
   is "a running job's processes exited" reported by its agent; the latency is from the report to the
   new desired state committed to the store (report + housekeeping + view + policy + invariant check +
   actuation + one SQLite transaction). Baseline in the same process: ``policy.decide`` alone on the
   same view, so the ratio is the daemon's overhead around the policy. Also printed: the view kept between
   decisions against one built from every record (``build_view(full=True)``), and the process's peak RSS.
2. API latency while the policy decides: the same cluster served by a real vmctld (TLS on loopback);
   one client thread submits jobs in a loop, each submission waking a MEASY decision, while another
   times ``GET /healthz`` (and ``GET /v1/health``, authenticated). The policy runs in a worker thread
   (``Daemon.choose``), so the API should answer in milliseconds while decisions take far longer.
   Baseline in the same process: the same requests with no decision running.
3. API throughput: job submissions over loopback HTTPS (one keep-alive connection, bearer token), one
   job per ``POST /v1/jobs`` and 100 per ``POST /v1/jobs:batch``. Baseline: ``Daemon.submit`` called
   in-process (the store write without HTTP, TLS, auth and validation). The event log's cost: the same
   100-job store transaction written with and without its 100 ``job.submitted`` events.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import resource
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from tests.support.daemon import InProcessDaemon
from vmctl.clock import VirtualClock
from vmctl.daemon.config import DaemonConfig
from vmctl.daemon.core import Daemon
from vmctl.daemon.decisions import cyclic_gc_paused
from vmctl.daemon.state import ClusterState
from vmctl.daemon.view import build_view
from vmctl.model import JobState
from vmctl.nodedoc import NodeObserved, PowerState, VmObserved
from vmctl.policies.base import SchedulingPolicy
from vmctl.policies.registry import create_policy
from vmctl.store import open_store
from vmctl.store.base import EventRecord, JobRecord, WriteBatch


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def _populated(nodes: int, cores: int, queued: int, tmp: Path, name: str) -> tuple[Daemon, VirtualClock]:
    """A daemon on a fresh SQLite store: ``nodes`` x ``cores``, every core busy, ``queued`` waiting."""
    clock = VirtualClock(1_000_000.0)
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/{name}.db", state_dir=str(tmp / name), holder="bench",
                       tick_s=3600, node_timeout_s=1e9, kill_at_estimate=False)
    d = Daemon(cfg, open_store(cfg.store_url), clock=clock, policy=create_policy("measy"))
    d.start()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(nodes):
        d.register_node(f"n{i:04d}", cores, f"n{i:04d}", "mock")
    rng = random.Random(1)
    # fill every core with one-node jobs, then queue the backlog
    d.submit([{"procs": cores, "estimate": 3600.0, "work_seconds": 3600.0} for _ in range(nodes)])
    clock.advance(1)
    d.run_once()
    d.submit([{"procs": rng.choice([1, 2, 4, 8, 16, 32, 64]), "estimate": rng.uniform(60, 7200),
               "cpu_usage": None} for _ in range(queued)])
    clock.advance(1)
    d.run_once()
    print(f"setup: {nodes} nodes x {cores} cores, {len(d.state.active())} running jobs, {len(d.state.queue())} "
          f"queued ({time.perf_counter() - t0:.1f} s, {time.process_time() - c0:.1f} s CPU)")
    return d, clock


def decision_latency(nodes: int, cores: int, queued: int, events: int, tmp: Path) -> None:
    d, clock = _populated(nodes, cores, queued, tmp, "bench")
    assert d.policy is not None
    policy = d.policy
    rng = random.Random(1)
    lat: list[float] = []
    base: list[float] = []
    kept: list[float] = []
    fresh: list[float] = []
    cpu: list[float] = []
    # issue 27: every other event writes every queued job's reason at the decision, as before (the baseline
    # of the reasons' cost: MEASY's default names the moving shadow time)
    old_cpu: list[float] = []
    for k in range(events):
        ClusterState.reasons_written_through = k % 2 == 1
        clock.advance(5)
        fg = [j for j in d.state.active() if j.tier == "fg" and j.placement]
        job = rng.choice(fg)
        node = job.placement[0][0]
        vms = tuple(VmObserved(job.vm_name(i), PowerState.RUNNING, core=c, process_job=job.id, process_index=i,
                               process_exit=0) for i, (n, c) in enumerate(job.placement) if n == node)
        others = {n for n, _c in job.placement} - {node}
        t, c = time.perf_counter(), time.thread_time()
        d.report(NodeObserved(node=node, generation_applied=d.state.generation.get(node, 0), cores=cores, vms=vms))
        for n in sorted(others):
            vv = tuple(VmObserved(job.vm_name(i), PowerState.RUNNING, core=c, process_job=job.id, process_index=i,
                                  process_exit=0) for i, (nn, c) in enumerate(job.placement) if nn == n)
            d.report(NodeObserved(node=n, generation_applied=0, cores=cores, vms=vv))
        d.run_once()
        if ClusterState.reasons_written_through:
            old_cpu.append(time.thread_time() - c)
        else:
            lat.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
        ClusterState.reasons_written_through = False
        base.append(decide_seconds(d, policy, clock))
        t = time.perf_counter()
        build_view(d.state, clock.now())
        kept.append(time.perf_counter() - t)
        t = time.perf_counter()
        build_view(d.state, clock.now(), full=True)
        fresh.append(time.perf_counter() - t)
    print_against_decide(f"decision latency (event -> desired state committed), {len(lat)} of {events} events (the "
                         f"others: the reasons' baseline below), MEASY:", lat, base,
                         "the policy")
    print(f"  vmctld CPU  p50 {pct(cpu, 50) * 1e3:8.1f} ms   p99 {pct(cpu, 99) * 1e3:8.1f} ms   (thread CPU time of "
          f"the same events: what a shared machine's load does not add)")
    print(f"  vmctld CPU  p90 {pct(cpu, 90) * 1e3:8.1f} ms   max {max(cpu) * 1e3:8.1f} ms;  wall p90 "
          f"{pct(lat, 90) * 1e3:8.1f} ms   (with {events} events the p99 is the slowest)")
    print(f"  queue reasons: vmctld CPU p50 {pct(cpu, 50) * 1e3:8.1f} ms  p99 {pct(cpu, 99) * 1e3:8.1f} ms  "
          f"(the {len(cpu)} events whose reasons render at read time); written to every queued record as before "
          f"issue 27: p50 {pct(old_cpu, 50) * 1e3:8.1f} ms  p99 {pct(old_cpu, 99) * 1e3:8.1f} ms (the other "
          f"{len(old_cpu)}); ratio p50 {pct(cpu, 50) / pct(old_cpu, 50):.2f}x")
    print(f"  view kept p50 {pct(kept, 50) * 1e3:8.1f} ms   p99 {pct(kept, 99) * 1e3:8.1f} ms;  built from every "
          f"record p50 {pct(fresh, 50) * 1e3:8.1f} ms   p99 {pct(fresh, 99) * 1e3:8.1f} ms")
    print(f"  peak RSS {peak_mb():.0f} MB")
    d.close()
    d.store.close()


def peak_mb() -> float:
    """This process's peak resident set (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def decide_seconds(d: Daemon, policy: SchedulingPolicy, clock: VirtualClock) -> float:
    """The baseline: ``policy.decide`` alone on a fresh view of ``d``'s state, with the cyclic collector
    paused as vmctld pauses it around its own decide (``cyclic_gc_paused``): else a full collection of the
    daemon's objects falls into the baseline now and then."""
    with cyclic_gc_paused():
        view, _lay = build_view(d.state, clock.now())
        t = time.perf_counter()
        policy.decide(view, clock.now())
        return time.perf_counter() - t


def print_against_decide(title: str, lat: list[float], base: list[float], around: str, note: str = "") -> None:
    """p50/p99 of the daemon's latencies beside ``policy.decide``'s, and their ratio."""
    p50, p99 = pct(lat, 50) * 1e3, pct(lat, 99) * 1e3
    b50, b99 = pct(base, 50) * 1e3, pct(base, 99) * 1e3
    print(title)
    print(f"  vmctld      p50 {p50:8.1f} ms   p99 {p99:8.1f} ms{note}")
    print(f"  decide only p50 {b50:8.1f} ms   p99 {b99:8.1f} ms   (baseline: policy.decide on the same view)")
    print(f"  ratio p50 {p50 / b50:.2f}x  (daemon overhead around {around})")


def _health_times(port: int, ca_file: str, token: str, path: str, n: int | None,
                  until: float = math.inf) -> list[float]:
    """Seconds of each ``GET path`` on one keep-alive connection (``n`` of them, or until ``until``)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
    hdr = {"Authorization": f"Bearer {token}"}
    out: list[float] = []
    while (n is None or len(out) < n) and time.perf_counter() < until:
        t = time.perf_counter()
        conn.request("GET", path, headers=hdr if path == "/v1/health" else {})
        r = conn.getresponse()
        r.read()
        out.append(time.perf_counter() - t)
        time.sleep(0.002)
    conn.close()
    return out


def _submitter(port: int, ca_file: str, token: str, stop: threading.Event) -> None:
    """One job submitted every 50 ms until ``stop``: each wakes a decision."""
    ctx = ssl.create_default_context(cafile=ca_file)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
    hdr = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    body = json.dumps({"procs": 1, "estimate": 600.0})
    while not stop.is_set():
        conn.request("POST", "/v1/jobs", body=body, headers=hdr)
        r = conn.getresponse()
        r.read()
        time.sleep(0.05)
    conn.close()


def client_main(argv: list[str]) -> None:
    """``python -m bench.daemon --client PORT CA_FILE TOKEN_FILE IDLE_N BUSY_SECONDS``: the API client of
    ``api_during_decisions`` in its own process (so that its TLS and JSON do not take the server's
    interpreter lock, as no real client does); prints the latencies as JSON."""
    port, ca, token_file, idle_n, busy_s = int(argv[0]), argv[1], argv[2], int(argv[3]), float(argv[4])
    token = Path(token_file).read_text().strip()
    paths = ("/healthz", "/v1/health")
    idle = {p: _health_times(port, ca, token, p, idle_n) for p in paths}
    print(json.dumps({"idle": idle}), flush=True)
    sys.stdin.readline()  # the server cleared its decision times: go
    stop = threading.Event()
    th = threading.Thread(target=_submitter, args=(port, ca, token, stop))
    th.start()
    busy = {p: _health_times(port, ca, token, p, None, time.perf_counter() + busy_s / 2) for p in paths}
    stop.set()
    th.join()
    print(json.dumps({"busy": busy}), flush=True)


def api_during_decisions(nodes: int, cores: int, queued: int, seconds: float, tmp: Path) -> None:
    d, _clock = _populated(nodes, cores, queued, tmp, "busy")
    cfg = replace(d.config, state_dir=str(tmp / "busy-server"), holder="bench-busy", tick_s=3600)
    d.close()
    d.store.close()
    with InProcessDaemon(cfg, policy=create_policy("measy")) as srv:
        time.sleep(1.0)  # let the first decision after loading pass
        token_file = tmp / "busy-token"
        token_file.write_text(srv.admin_token)
        child = subprocess.Popen([sys.executable, "-m", "bench.daemon", "--client", str(srv.server.port),
                                  str(srv.ca_file), str(token_file), "200", str(seconds)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        idle = json.loads(child.stdout.readline())["idle"]
        srv.call(lambda: srv.daemon.decision_seconds.clear())
        child.stdin.write("go\n")
        child.stdin.flush()
        busy = json.loads(child.stdout.readline())["busy"]
        child.wait(60)
        cycles = list(srv.call(lambda: list(srv.daemon.decision_seconds)))
    print(f"API latency while MEASY decides ({nodes} nodes x {cores} cores, {queued} queued, {seconds:.0f} s of "
          f"submissions; the client in another process):")
    print(f"  decisions      {len(cycles):6d}   cycle p50 {pct(cycles, 50) * 1e3:8.1f} ms   p99 "
          f"{pct(cycles, 99) * 1e3:8.1f} ms   max {max(cycles) * 1e3:8.1f} ms" if cycles else "  no decision ran")
    for p in ("/healthz", "/v1/health"):
        b, i = busy[p], idle[p]
        print(f"  GET {p:11s} {len(b):6d}   p50 {pct(b, 50) * 1e3:8.1f} ms   p99 {pct(b, 99) * 1e3:8.1f} ms   "
              f"max {max(b) * 1e3:8.1f} ms   (during decisions)")
        print(f"  GET {p:11s} {len(i):6d}   p50 {pct(i, 50) * 1e3:8.1f} ms   p99 {pct(i, 99) * 1e3:8.1f} ms   "
              f"(baseline: no decision running)")
        print(f"  ratio p99 busy/idle {pct(b, 99) / pct(i, 99):.2f}x" + (
            f"; max {p} / max cycle {max(b) / max(cycles):.2f}" if cycles else ""))


def submit_client_main(argv: list[str]) -> None:
    """``python -m bench.daemon --submit-client PORT CA_FILE TOKEN_FILE JOBS PER_REQUEST MINIMAL``: submit
    ``JOBS`` jobs in batches over one keep-alive connection from a process of its own (as a real client
    is), with ``Prefer: return=minimal`` when MINIMAL is 1, after one warm-up batch; prints the wall and
    CPU seconds of this client as JSON after a line ``ready`` and a line from stdin."""
    port, ca, token_file = int(argv[0]), argv[1], argv[2]
    jobs, per, minimal = int(argv[3]), int(argv[4]), argv[5] == "1"
    token = Path(token_file).read_text().strip()
    ctx = ssl.create_default_context(cafile=ca)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=60)
    hdr = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if minimal:
        hdr["Prefer"] = "return=minimal"
    body = json.dumps({"jobs": [{"procs": 4, "estimate": 100.0}] * per})

    def one() -> None:
        conn.request("POST", "/v1/jobs:batch", body=body, headers=hdr)
        r = conn.getresponse()
        doc = json.loads(r.read())
        assert r.status == 201 and len(doc["jobs"]) == per, r.status
        assert minimal == (r.getheader("Preference-Applied") == "return=minimal")

    one()
    print("ready", flush=True)
    sys.stdin.readline()
    t, c = time.perf_counter(), time.process_time()
    for _ in range(jobs // per):
        one()
    print(json.dumps({"wall": time.perf_counter() - t, "cpu": time.process_time() - c}), flush=True)
    conn.close()


def _batched_from_another_process(d: InProcessDaemon, jobs: int, per: int, minimal: bool,
                                  tmp: Path) -> tuple[float, float, float, int, int]:
    """Jobs per second of ``POST /v1/jobs:batch`` sent by a client process: wall, per CPU second of the
    server (this process) and per CPU second of the server and the client together."""
    token_file = tmp / "submit-token"
    token_file.write_text(d.admin_token)
    child = subprocess.Popen([sys.executable, "-m", "bench.daemon", "--submit-client", str(d.server.port),
                              str(d.ca_file), str(token_file), str(jobs), str(per), "1" if minimal else "0"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    decided, deferred = d.daemon.decisions, d.daemon.deferred_decisions
    c = time.process_time()
    child.stdin.write("go\n")
    child.stdin.flush()
    out = json.loads(child.stdout.readline())
    server_cpu = time.process_time() - c
    child.wait(60)
    n = jobs // per * per
    return (n / out["wall"], n / server_cpu, n / (server_cpu + out["cpu"]), d.daemon.decisions - decided,
            d.daemon.deferred_decisions - deferred)


def api_throughput(jobs: int, tmp: Path) -> None:
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/api.db", state_dir=str(tmp / "state"), holder="bench-api",
                       policy_name="fcfs", policy_explicit=True, tick_s=3600)
    with InProcessDaemon(cfg) as d:
        ctx = ssl.create_default_context(cafile=d.ca_file)
        conn = http.client.HTTPSConnection("127.0.0.1", d.server.port, context=ctx, timeout=30)
        hdr = {"Authorization": f"Bearer {d.admin_token}", "Content-Type": "application/json"}
        body = json.dumps({"procs": 4, "estimate": 100.0})
        t = time.perf_counter()
        for _ in range(jobs):
            conn.request("POST", "/v1/jobs", body=body, headers=hdr)
            r = conn.getresponse()
            r.read()
            assert r.status == 201, r.status
        single = jobs / (time.perf_counter() - t)
        batch = json.dumps({"jobs": [{"procs": 4, "estimate": 100.0}] * 100})
        t, c = time.perf_counter(), time.process_time()
        for _ in range(jobs // 100):
            conn.request("POST", "/v1/jobs:batch", body=batch, headers=hdr)
            r = conn.getresponse()
            r.read()
            assert r.status == 201, r.status
        batched = (jobs // 100) * 100 / (time.perf_counter() - t)
        batched_cpu = (jobs // 100) * 100 / (time.process_time() - c)
        conn.close()
        t = time.perf_counter()
        for _ in range(jobs):
            d.call(d.daemon.submit, [{"procs": 4, "estimate": 100.0}])
        direct = jobs / (time.perf_counter() - t)
        specs = [{"procs": 4, "estimate": 100.0}] * 100
        t, c = time.perf_counter(), time.process_time()
        for _ in range(jobs // 100):
            d.call(d.daemon.submit, specs)
        direct_batch = (jobs // 100) * 100 / (time.perf_counter() - t)
        direct_batch_cpu = (jobs // 100) * 100 / (time.process_time() - c)
        daemon_log = d.call(submit_log_cost, d.daemon, specs, max(10, jobs // 100))
    # batched, each on a fresh daemon (the queue grows alike): the in-process baseline, then a client process
    big = 5 * jobs
    with InProcessDaemon(replace(cfg, store_url=f"sqlite:///{tmp}/api-0.db", state_dir=str(tmp / "state-0"))) as d:
        specs = [{"procs": 4, "estimate": 100.0}] * 100
        runtime = d.server.runtime

        def submit_and_kick() -> None:  # as the handler does: the decision loop is woken
            d.daemon.submit(specs)
            runtime.kick()

        t, c = time.perf_counter(), time.process_time()
        for _ in range(big // 100):
            d.call(submit_and_kick)
        base_wall, base_cpu = big // 100 * 100 / (time.perf_counter() - t), big // 100 * 100 / (time.process_time() - c)
    apart = {}
    for k, (per, minimal) in enumerate(((100, False), (100, True), (1000, True))):
        with InProcessDaemon(replace(cfg, store_url=f"sqlite:///{tmp}/api-{k + 1}.db",
                                     state_dir=str(tmp / f"state-{k + 1}"))) as d:
            apart[per, minimal] = _batched_from_another_process(d, big, per, minimal, tmp)
    with_log, without = event_log_cost(max(20, jobs // 100), tmp)
    print(f"API job submission on loopback HTTPS ({jobs} jobs):")
    print(f"  POST /v1/jobs         {single:8.0f} jobs/s")
    print(f"  POST /v1/jobs:batch   {batched:8.0f} jobs/s  (100 per request; {batched_cpu:.0f} jobs per CPU second of "
          f"client and server)")
    print(f"  in-process submit     {direct:8.0f} jobs/s  (baseline: Daemon.submit, no HTTP)")
    print(f"  in-process batch      {direct_batch:8.0f} jobs/s  (baseline: Daemon.submit of 100, no HTTP; "
          f"{direct_batch_cpu:.0f} per CPU second)")
    print(f"  ratio single/baseline {single / direct:.2f}x, batch/baseline {batched / direct_batch:.2f}x")
    print(f"batched submission, {big} jobs into a fresh daemon each (the decisions they wake included):")
    print(f"  in-process batch      {base_wall:8.0f} jobs/s  (baseline: Daemon.submit of 100 on the loop and a kick of "
          f"the decision loop, no HTTP; {base_cpu:.0f} per CPU second)")
    for (per, m), (wall, server, both, decided, deferred) in apart.items():
        answer = "Prefer: return=minimal" if m else "every job document"
        print(f"  POST /v1/jobs:batch   {wall:8.0f} jobs/s  ({per} per request, {answer}; the client in another "
              f"process; {server:.0f} jobs per CPU second of the server, {both:.0f} of both; wall "
              f"{wall / base_wall:.2f}x the baseline; {decided} decisions made, {deferred} put off)")
    print(f"  event log: a 100-job store write {with_log * 1e3:.2f} ms CPU with its 100 events, {without * 1e3:.2f} "
          f"ms without ({(with_log - without) / 100 * 1e6:.1f} us per job, {with_log / without - 1:+.0%})")
    on, off = daemon_log
    print(f"  event log in Daemon.submit of 100 (the events made, encoded and stored): {on * 1e3:.2f} ms CPU with, "
          f"{off * 1e3:.2f} ms without ({(on - off) / 100 * 1e6:.1f} us per job, {on / off - 1:+.0%})")


def submit_log_cost(d: Daemon, specs: list[dict[str, float]], rounds: int) -> tuple[float, float]:
    """Median thread CPU seconds of ``Daemon.submit`` of ``specs`` with the event log, and with the jobs'
    ``job.submitted`` events not made (their history entries are kept), alternated on the same daemon."""
    sink = d.history.sink
    timed: dict[bool, list[float]] = {True: [], False: []}
    try:
        for k in range(2 * rounds):
            log = k % 2 == 0
            d.history.sink = sink if log else None
            c = time.thread_time()
            d.submit(specs)
            timed[log].append(time.thread_time() - c)
    finally:
        d.history.sink = sink
    return pct(timed[True], 50), pct(timed[False], 50)


def event_log_cost(batches: int, tmp: Path) -> tuple[float, float]:
    """Median thread CPU seconds of one store transaction of 100 new jobs with their 100 ``job.submitted``
    events, and of the same without the events (alternated, on one SQLite store)."""
    store = open_store(f"sqlite:///{tmp}/events.db")
    store.migrate()
    epoch = store.acquire_lease("bench", 3600, time.time())
    assert epoch is not None
    seq = 1
    timed: dict[bool, list[float]] = {True: [], False: []}
    for k in range(2 * batches):
        log = k % 2 == 0
        recs = {}
        events = []
        for _ in range(100):
            rec = JobRecord(id=str(seq), seq=seq, name=f"job-{seq}", spec={"procs": 4, "estimate": 100.0},
                            state=JobState.QUEUED, submit_time=1000.0, reason="submitted")
            recs[rec.id] = rec
            if log:
                events.append(EventRecord(seq=seq, time=1000.0, kind="job.submitted", message=f"job {seq} submitted",
                                          job_id=rec.id, actor="token admin"))
            seq += 1
        t = time.thread_time()
        store.write(epoch, WriteBatch(jobs=recs, events=events))
        timed[log].append(time.thread_time() - t)
    store.close()
    return pct(timed[True], 50), pct(timed[False], 50)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        client_main(sys.argv[2:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--submit-client":
        submit_client_main(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--nodes", type=int, default=1000, help="nodes of 32 cores (default 1000; issue 27: 10000)")
    ap.add_argument("--queued", type=int, default=None, help="jobs queued (default 10 per node)")
    ap.add_argument("--events", type=int, default=40, help="events timed (default 40)")
    ap.add_argument("--seconds", type=float, default=20.0, help="seconds of submissions while timing the API")
    ap.add_argument("--only", choices=("latency", "api", "submit"), action="append",
                    help="run only these parts (repeatable)")
    a = ap.parse_args()
    parts = set(a.only or ("latency", "api", "submit"))
    nodes, queued, events, seconds, jobs = a.nodes, a.queued, a.events, a.seconds, 2000
    if a.quick:
        nodes, queued, events, seconds, jobs = 50, 500, 10, 3.0, 200
    queued = 10 * nodes if queued is None else queued
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        if "latency" in parts:
            decision_latency(nodes, 32, queued, events, Path(tmp))
        if "api" in parts:
            api_during_decisions(nodes, 32, queued, seconds, Path(tmp))
        if "submit" in parts:
            api_throughput(jobs, Path(tmp))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
