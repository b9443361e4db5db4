"""The libvirt HypervisorBackend (QEMU/KVM, QEMU/TCG, Xen, libvirt's test driver).

The only place in vmctl that imports ``libvirt``. Import the backend lazily from
``vmctl.agents.backends.libvirt.backend`` so that the pure modules (tuning, xml, guests) work on a
machine without libvirt-python.
"""
