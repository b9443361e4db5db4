"""Workloads for the simulator: the SWF reader/writer, the classic workload models (Feitelson 1996,
Jann et al. 1997, Lublin & Feitelson 2003), Tsafrir's user-estimate model, CPU usage assignment
(MEASY sec. 3.1) and load scaling (MEASY sec. 3.3). See docs/workloads.md.

    >>> from vmctl.sim.workloads import generate_model, read_swf
    >>> w = generate_model("jann97", 1000, 320, seed=1, load=0.7)
    >>> len(w.jobs), w.max_procs
    (1000, 320)
"""

from vmctl.sim.workloads.core import JobArrays, Workload, WorkloadJob, make_job
from vmctl.sim.workloads.load import offered_load, scale_to_load
from vmctl.sim.workloads.lublin99 import lublin_sizes
from vmctl.sim.workloads.registry import MODELS, generate_model
from vmctl.sim.workloads.swf import read_swf, write_swf
from vmctl.sim.workloads.tsafrir05 import assign_estimates
from vmctl.sim.workloads.usage import assign_cpu_usage, with_cpu_usage

__all__ = [
    "MODELS",
    "JobArrays",
    "Workload",
    "WorkloadJob",
    "assign_cpu_usage",
    "assign_estimates",
    "generate_model",
    "lublin_sizes",
    "make_job",
    "offered_load",
    "read_swf",
    "scale_to_load",
    "with_cpu_usage",
    "write_swf",
]
