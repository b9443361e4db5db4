"""Node agents (import name ``vmctl.agents``): reconcile a node's desired state against what the
hypervisor reports, through a ``HypervisorBackend`` (libvirt or mock). Never imports policies or the
daemon; only ``backends/libvirt`` imports ``libvirt``."""
