"""Process limits and log flood control for vmctld.

- ``raise_nofile_limit``: the soft open-file limit is raised to the hard one at start (the
  default soft limit of 1,024 is what a few hundred clients use up); the API's listener then sizes
  its connection limit from it (``vmctl.api.listener.fd_budget``).
- ``RepeatFilter``: one log line per distinct warning or error per interval. The same problem
  repeated (a client hammering a failing route, accept() failing under a file-limit squeeze) is
  logged once per interval; its next line after the interval says how many were left out. Debug and
  info lines pass untouched.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections.abc import Callable

#: a warning or error with the same origin and text is logged at most once per this many seconds
REPEAT_INTERVAL_S = 30.0
#: distinct messages of one kind logged per interval (see RepeatFilter)
BURST = 20
#: kinds of problems remembered at once (the oldest are forgotten first)
MAX_TRACKED = 1000


def raise_nofile_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (no privilege needed); returns (soft, hard) in
    force afterwards. A platform that refuses keeps its limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft, hard


class RepeatFilter(logging.Filter):
    """Limits WARNING-or-worse records per *kind* (logger, level, message template, exception type)
    and interval: each distinct message of a kind is logged once per interval, at most ``burst``
    distinct ones ("node n1 lost", "node n2 lost", ...), the rest are counted; the first line of the
    kind in the next interval says how many were left out. A flood of one problem (a client hammering
    a failing route, accept() failing under a file-limit squeeze) is then a line per interval, and
    its varying details (paths, peers) cannot turn it back into a flood."""

    def __init__(self, interval: float = REPEAT_INTERVAL_S, burst: int = BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval = interval
        self.burst = burst
        self._clock = clock
        self._lock = threading.Lock()
        #: kind -> (interval start, messages logged in it, records left out in it)
        self._seen: dict[tuple[str, int, str, str], tuple[float, set[str], list[int]]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        exc = record.exc_info[0].__name__ if record.exc_info and record.exc_info[0] else ""
        key = (record.name, record.levelno, str(record.msg), exc)
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit: the handler reports that itself
            message = str(record.msg)
        now = self._clock()
        with self._lock:
            entry = self._seen.get(key)
            if entry is not None and now - entry[0] < self.interval:
                if message in entry[1] or len(entry[1]) >= self.burst:
                    entry[2][0] += 1
                    return False
                entry[1].add(message)
                return True
            left_out = entry[2][0] if entry is not None else 0
            since = now - entry[0] if entry is not None else 0.0
            self._seen.pop(key, None)
            self._seen[key] = (now, {message}, [0])
            while len(self._seen) > MAX_TRACKED:
                del self._seen[next(iter(self._seen))]
        if left_out:
            record.msg = f"{record.msg} [{left_out} more like this in the last {since:.0f} s were not logged]"
        return True


def install_repeat_filter(interval: float = REPEAT_INTERVAL_S) -> RepeatFilter:
    """Attach one ``RepeatFilter`` to every handler of the root logger (call after logging is set up)."""
    f = RepeatFilter(interval)
    for h in logging.getLogger().handlers:
        h.addFilter(f)
    return f
