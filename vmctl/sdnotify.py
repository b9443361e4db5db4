"""sd_notify(3) without a dependency: READY=1, WATCHDOG=1, STATUS=..., STOPPING=1 over ``$NOTIFY_SOCKET``.

systemd starts ``Type=notify`` services with ``NOTIFY_SOCKET`` set to a datagram socket path (or an
abstract socket name starting with ``@``) and, with ``WatchdogSec=``, ``WATCHDOG_USEC`` (and
``WATCHDOG_PID``). Outside systemd ``NOTIFY_SOCKET`` is unset and every call is a cheap no-op, so the
daemon and the agent call these unconditionally.

    n = Notifier()                 # reads the environment once
    n.ready("serving on :8080")   # after start-up (the agent: after its first successful relist)
    n.watchdog()                   # from the main loop, at least every n.watchdog_interval() seconds
    n.start_watchdog(lambda: time.monotonic() - last_pass < 10)   # or: pings while the loop is healthy
    n.stopping()
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        e = os.environ if env is None else env
        addr = e.get("NOTIFY_SOCKET", "")
        self._addr: str | bytes | None = None
        if addr:
            # abstract namespace socket: leading '@' stands for a NUL byte
            self._addr = b"\0" + addr[1:].encode() if addr.startswith("@") else addr
        self._watchdog_usec = 0
        usec = e.get("WATCHDOG_USEC", "")
        pid = e.get("WATCHDOG_PID", "")
        if usec.isdigit() and (not pid or (pid.isdigit() and int(pid) == os.getpid())):
            self._watchdog_usec = int(usec)
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._stop = threading.Event()

    @property
    def enabled(self) -> bool:
        return self._addr is not None

    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG pings: half the configured timeout, None when no watchdog."""
        return self._watchdog_usec / 2e6 if self._watchdog_usec else None

    def notify(self, *fields: str) -> bool:
        """Send ``KEY=VALUE`` lines; False when not under systemd or the send failed (never raises:
        a missing notification must not take the service down)."""
        if self._addr is None:
            return False
        msg = "\n".join(fields).encode("utf-8")
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                self._sock.sendto(msg, self._addr)
                return True
            except OSError:
                if self._sock is not None:
                    self._sock.close()
                    self._sock = None
                return False

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *(f"STATUS={status}",) if status else ())

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def start_watchdog(self, healthy: Callable[[], bool]) -> threading.Thread | None:
        """Ping WATCHDOG=1 from a daemon thread every ``watchdog_interval()`` seconds, but only while
        ``healthy()`` is true (e.g. "the main loop completed a pass in the last N seconds"), so a hung
        loop stops the pings and systemd restarts the service. None when there is no watchdog."""
        interval = self.watchdog_interval()
        if interval is None or not self.enabled:
            return None

        def run() -> None:
            while not self._stop.wait(interval):
                try:
                    ok = healthy()
                except Exception:
                    ok = False
                if ok:
                    self.watchdog()

        t = threading.Thread(target=run, name="sd-watchdog", daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


_default: Notifier | None = None


def default() -> Notifier:
    """A process-wide notifier built from the environment on first use."""
    global _default
    if _default is None:
        _default = Notifier()
    return _default


def ready(status: str | None = None) -> bool:
    return default().ready(status)


def watchdog() -> bool:
    return default().watchdog()
