"""Shared helpers for tests that drive a real ``vmctld`` process or the ``vmctl`` CLI in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import InProcessDaemon
from vmctl import errors
from vmctl.cli.main import main
from vmctl.localcluster import DaemonProcess


def live_daemon(state_dir: Path, **kwargs: Any) -> Iterator[DaemonProcess]:
    """Start a real vmctld on loopback (HTTPS, SQLite in ``state_dir``), yield it, stop it by pid and
    check that it exited cleanly. Use with ``yield from`` inside a fixture."""
    d = DaemonProcess(state_dir, **kwargs)
    try:
        d.start_and_wait(timeout=60)
    except errors.VmctlError as exc:
        d.stop()
        pytest.fail(f"vmctld did not start: {exc}")
    yield d
    rc = d.stop()
    assert rc == 0, f"vmctld exited with {rc}:{d.tail(30)}"


def long_poll_parked(d: InProcessDaemon, node: str) -> bool:
    """True while an agent's desired-state long-poll for ``node`` is parked in an in-process daemon."""
    return bool(d.call(lambda: d.server.polls_waiting[node] > 0))


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``vmctl ARGV`` in-process; return (exit code, stdout, stderr)."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
