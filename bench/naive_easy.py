"""A deliberately naive EASY simulator: the baseline that ``python -m bench.sim`` holds vmctl against.

What a researcher would write in an afternoon: its own SWF parser (``split()`` per line, no numpy),
plain lists of tuples, one scheduling pass per event time, no decision objects and no invariant
checking. It follows the conventions of ``vmctl.sim.workloads.swf`` (processors = allocated else
requested; estimate = requested time else the run time; jobs with run time <= 0, no processors or
wider than the machine dropped; sorted by submit time then id) and of vmctl's engine and EASY policy
(a job runs min(run time, estimate); completions at a time come before arrivals, then one pass: FCFS
until the first job that does not fit, then backfill any job that fits now and either ends by the
head's shadow time or fits in the extra cores), so both must give the same waits on the same trace:
the benchmark checks that before it prints a ratio."""

from __future__ import annotations

import gzip
import heapq
from pathlib import Path

EPS = 1e-9


def parse_swf(path: Path) -> tuple[list[tuple[float, int, float, float, int]], int]:
    """(submit, procs, estimate, work, id) sorted by (submit, id), and the machine size."""
    opener = gzip.open if path.suffix == ".gz" else open
    machine = 0
    jobs = []
    with opener(path, "rt", encoding="latin-1") as f:
        for line in f:
            if line.startswith(";"):
                if "MaxProcs:" in line:
                    machine = int(line.split("MaxProcs:")[1].split()[0])
                continue
            fields = line.split()
            if len(fields) < 18:
                continue
            jid, submit, run = int(fields[0]), float(fields[1]), float(fields[3])
            alloc, req, req_time = int(fields[4]), int(fields[7]), float(fields[8])
            procs = alloc if alloc > 0 else req
            if run <= 0 or procs <= 0 or procs > machine:
                continue
            est = req_time if req_time > 0 else run
            jobs.append((submit, procs, est, min(run, est), jid))
    jobs.sort(key=lambda j: (j[0], j[4]))
    return jobs, machine


def simulate(jobs: list[tuple[float, int, float, float, int]], machine: int) -> list[float]:
    """EASY backfilling; returns each job's wait (start - submit) in input order."""
    n = len(jobs)
    wait = [0.0] * n
    free = machine
    running: list[tuple[float, int]] = []  # (expected end = start + estimate, procs)
    done: list[tuple[float, int, int, float]] = []  # heap of (actual end, index, procs, expected end)
    queue: list[int] = []
    nxt = 0
    now = 0.0

    def start(i: int) -> None:
        submit, procs, est, work, _ = jobs[i]
        wait[i] = now - submit
        running.append((now + est, procs))
        heapq.heappush(done, (now + work, i, procs, now + est))

    while nxt < n or queue or done:
        t = done[0][0] if done else float("inf")
        if nxt < n and jobs[nxt][0] < t:
            t = jobs[nxt][0]
        now = max(now, t)
        while done and done[0][0] <= now + EPS:
            _, i, procs, expected = heapq.heappop(done)
            free += procs
            running.remove((expected, procs))
        while nxt < n and jobs[nxt][0] <= now:
            queue.append(nxt)
            nxt += 1
        # FCFS until the first job that does not fit
        while queue and jobs[queue[0]][1] <= free:
            i = queue.pop(0)
            start(i)
            free -= jobs[i][1]
        if not queue or free == 0:
            continue
        # the head's reservation: the earliest expected end by which enough cores are free
        need = jobs[queue[0]][1]
        avail = free
        shadow = now
        for end, procs in sorted(running):
            avail += procs
            if avail >= need:
                shadow = max(end, now)
                break
        extra = free + sum(p for e, p in running if e <= shadow) - need
        for i in list(queue[1:]):
            _, procs, est, _, _ = jobs[i]
            if procs > free:
                continue
            if now + est <= shadow:
                pass
            elif procs <= extra:
                extra -= procs
            else:
                continue
            queue.remove(i)
            start(i)
            free -= procs
    return wait
