"""Stopping the processes a test started, by their Popen handle (never by name)."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_process(proc: subprocess.Popen[Any], timeout: float = 30) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; a process that already exited is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
