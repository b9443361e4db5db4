"""SIGTERM as Ctrl-C: a long command that owns things on the host (a demo's daemons and VMs, a local
Dask cluster's worker processes and scratch directory) removes them when it is told to stop by ``kill``,
systemd or a CI timeout, through the same ``finally`` blocks that a Ctrl-C runs."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block a SIGTERM raises ``KeyboardInterrupt`` in the main thread; the previous handler
    is put back on exit. Off the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
