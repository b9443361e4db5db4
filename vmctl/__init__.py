"""vmctl: a virtualization control plane for parallel (HPC) jobs on two-tier VMs."""

__version__ = "0.1.0"
