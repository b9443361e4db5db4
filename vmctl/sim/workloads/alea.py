"""Reader of the Alea simulator's extended SWF (the CERIT-SC 2013 trace ``wagap-2013.swf.gz``, paper 001).

Format (see ``../shared/data/traces/README.md``): no ``;`` header; 21 whitespace-separated fields per
line: the 18 SWF fields, then the assigned CPU ids in braces, the PBS queue name and the PBS resource
request. The machine size is in a separate machine file of lines ``id name nodes cpus_per_node speed
ram_kb`` (CERIT-SC: 20 x 80 + 48 x 12 = 2,176 CPUs).

Conventions (as :mod:`vmctl.sim.workloads.swf` where they overlap): processors = allocated (field 5) if
> 0, else requested (8); estimate = requested walltime (9) if > 0, else the run time; submit times are
kept as recorded (Unix seconds); jobs with run time <= 0, no processors, or wider than the machine are
dropped and counted. The **priority** is the job's queue class (:data:`QUEUE_CLASS`): MetaCentrum's
PBS queues are walltime classes, and the shorter the class the higher its priority, as their PBS
configuration orders them; ``backfill`` is the lowest. An unknown queue is an error naming the line.
"""

from __future__ import annotations

import gzip
from os import PathLike
from pathlib import Path

from vmctl.errors import TraceFormatError
from vmctl.sim.workloads.core import Workload, WorkloadJob

#: queue name -> priority class (higher first): 3 short and priority queues, 2 one to two days,
#: 1 four days to a week, 0 two weeks and more, and backfill
QUEUE_CLASS: dict[str, int] = {
    "q_2h": 3, "q_4h": 3, "ops": 3, "priority_long": 3,
    "q_1d": 2, "q_2d": 2,
    "q_4d": 1, "q_1w": 1,
    "q_2w": 0, "q_2w_plus": 0, "backfill": 0,
}
N_FIELDS = 21


def read_machines(path: str | PathLike[str]) -> int:
    """The number of CPUs in an Alea machine file (sum of nodes x cpus_per_node)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TraceFormatError(path=str(p), line=0, problem=f"cannot read the machine file: {exc.strerror}") from exc
    total = 0
    for n, line in enumerate(text.splitlines(), 1):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) != 6 or not tokens[2].isdigit() or not tokens[3].isdigit():
            raise TraceFormatError(path=str(p), line=n,
                                   problem="expected 'id name nodes cpus_per_node speed ram_kb'")
        total += int(tokens[2]) * int(tokens[3])
    if total <= 0:
        raise TraceFormatError(path=str(p), line=0, problem="the machine file lists no CPUs")
    return total


def read_alea_swf(path: str | PathLike[str], machines: str | PathLike[str]) -> Workload:
    """Every job of the trace (module docstring), priority = its queue class."""
    p = Path(path)
    cores = read_machines(machines)
    try:
        with (gzip.open(p, "rt") if p.suffix == ".gz" else p.open()) as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise TraceFormatError(path=str(p), line=0, problem=f"cannot read: {exc}") from exc
    jobs: list[WorkloadJob] = []
    dropped = {"nonpositive_run_time": 0, "nonpositive_procs": 0, "wider_than_machine": 0}
    for n, line in enumerate(lines, 1):
        tokens = line.split()
        if not tokens:
            continue
        if len(tokens) != N_FIELDS:
            raise TraceFormatError(path=str(p), line=n, problem=f"expected {N_FIELDS} fields (extended SWF), "
                                   f"got {len(tokens)}")
        try:
            jid, submit, run = int(tokens[0]), float(tokens[1]), float(tokens[3])
            alloc, req, walltime, user = int(tokens[4]), int(tokens[7]), float(tokens[8]), int(tokens[11])
        except ValueError as exc:
            raise TraceFormatError(path=str(p), line=n, problem=f"a numeric field is not a number ({exc})") from exc
        queue = tokens[19]
        if queue not in QUEUE_CLASS:
            raise TraceFormatError(path=str(p), line=n, problem=f"unknown queue {queue!r} in field 20 (known: "
                                   f"{', '.join(sorted(QUEUE_CLASS))})")
        procs = alloc if alloc > 0 else req
        if run <= 0:
            dropped["nonpositive_run_time"] += 1
        elif procs <= 0:
            dropped["nonpositive_procs"] += 1
        elif procs > cores:
            dropped["wider_than_machine"] += 1
        else:
            jobs.append(WorkloadJob(jid, submit, run, procs, walltime if walltime > 0 else run, None, user,
                                    QUEUE_CLASS[queue]))
    jobs.sort(key=lambda j: (j.submit, j.id))
    return Workload(jobs=jobs, max_procs=cores, source=p.name, dropped={k: v for k, v in dropped.items() if v})
