"""Workloads for the simulator: the SWF reader/writer, the classic workload models (Feitelson 1996,
Jann et al. 1997, Lublin & Feitelson 2003), Tsafrir's user-estimate model, CPU usage assignment
(MEASY sec. 3.1) and load scaling (MEASY sec. 3.3). See docs/workloads.md.
"""

from vmctl.sim.workloads.core import Workload, WorkloadJob, to_model_job
from vmctl.sim.workloads.swf import read_swf, write_swf

__all__ = ["Workload", "WorkloadJob", "read_swf", "to_model_job", "write_swf"]
