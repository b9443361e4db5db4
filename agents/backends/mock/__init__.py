"""An in-memory hypervisor (``MockBackend``): deterministic, with fault injection and a journal of what
it did; a real backend (the contract suite runs against it) that models CPU sharing well enough for
the demo and the daemon's tests. Three jobs, three modules, on the records of ``host.py``:

- ``backend.py``: the fake itself: the CPU model (strict priority by weight on a core, caps, job
  processes progressing at their share times the host's speed), faults, the journal, the
  ``HypervisorBackend`` operations and ``MockProcessRunner``;
- ``fabric.py``: migrations: between the backends of one process (``MockFabric``) and between agent
  processes through a shared directory (``fabric_dir``, inboxes of offers);
- ``store.py``: persistence: the host's state file (guests outlive the agent process), checkpoint
  files, the atomic writes.
"""

from __future__ import annotations

from vmctl.agents.backends.mock.backend import Fault, Hold, JournalEntry, MockBackend, MockProcessRunner
from vmctl.agents.backends.mock.fabric import inbox_name
from vmctl.agents.backends.mock.host import KILLED_EXIT, MockFabric
from vmctl.agents.backends.mock.store import MockStateError
from vmctl.cpushare import share_core

__all__ = ["KILLED_EXIT", "Fault", "Hold", "JournalEntry", "MockBackend", "MockFabric", "MockProcessRunner",
           "MockStateError", "inbox_name", "share_core"]
