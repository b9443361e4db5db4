"""Times as people read them: ISO 8601 with the time zone, a relative age, and reasons whose raw
``t=<epoch seconds>`` is rewritten (the policies print model times, which the daemon runs on the wall
clock; the simulator's small model times are left alone).

- ``iso(t)``: ``2026-11-25T04:05:06+01:00`` in the local time zone (``TZ``), ``iso(t, utc=True)``:
  ``2026-11-25T03:05:06Z`` (what the API puts in text it answers);
- ``relative(t, now)``: ``5.0m ago``, ``in 12s``;
- ``human(t, now)``: ``iso (relative)``;
- ``short(t, now)``: ``14:05:02`` today, ``Nov 27 14:05`` this year, else the date (narrow table columns);
- ``rewrite_times(text, fmt)``: every ``t=<epoch seconds>`` in ``text`` as ``fmt(seconds)``;
  ``rewrite_iso(text, fmt)`` the same of every ISO 8601 UTC time (``...Z``) the API wrote.
"""

from __future__ import annotations

import datetime as _dt
import re
import time
from collections.abc import Callable
from typing import Any

#: below this a ``t=`` is a model time of the simulator (seconds since its start), not a date
EPOCH_MIN = 1e8

_TIME_REF = re.compile(r"\bt=(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)")


def _seconds(t: Any) -> float | None:
    if t is None or isinstance(t, bool):
        return None
    try:
        return float(t)
    except (TypeError, ValueError):
        return None


def iso(t: Any, utc: bool = False) -> str:
    """ISO 8601 to the second with the zone; ``-`` for None, the value itself when it is no time."""
    s = _seconds(t)
    if s is None:
        return "-" if t is None else str(t)
    try:
        d = _dt.datetime.fromtimestamp(s, tz=_dt.UTC)
    except (ValueError, OverflowError, OSError):
        return str(t)
    if utc:
        return d.strftime("%Y-%m-%dT%H:%M:%SZ")
    return d.astimezone().isoformat(timespec="seconds")


def fmt_duration(seconds: Any) -> str:
    """A duration: ``59s``, ``10.0m``, ``1.5h``, ``3.0d``."""
    if seconds is None:
        return "-"
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        return str(seconds)
    if s < 0:
        return f"-{fmt_duration(-s)}"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def relative(t: Any, now: float | None = None) -> str:
    s = _seconds(t)
    if s is None:
        return "-"
    d = (time.time() if now is None else now) - s
    if abs(d) < 1:
        return "now"
    return f"{fmt_duration(d)} ago" if d > 0 else f"in {fmt_duration(-d)}"


def short(t: Any, now: float | None = None) -> str:
    """A time in a narrow table column, local zone (``TZ``): ``14:05:02`` on the day of ``now``,
    ``Nov 27 14:05`` in its year, ``2025-11-27`` before; ``-`` for None (``iso`` has the zone)."""
    s = _seconds(t)
    if s is None:
        return iso(t)
    try:
        d = _dt.datetime.fromtimestamp(s, tz=_dt.UTC).astimezone()
    except (ValueError, OverflowError, OSError):
        return str(t)
    ref = _dt.datetime.fromtimestamp(time.time() if now is None else now, tz=_dt.UTC).astimezone()
    if d.date() == ref.date():
        return d.strftime("%H:%M:%S")
    if d.year == ref.year:
        return f"{d.strftime('%b')} {d.day} {d.strftime('%H:%M')}"
    return d.strftime("%Y-%m-%d")


def human(t: Any, now: float | None = None) -> str:
    """``2026-11-25T04:05:06+01:00 (5.0m ago)``; ``-`` for None."""
    if _seconds(t) is None:
        return iso(t)
    return f"{iso(t)} ({relative(t, now)})"


def rewrite_times(text: str, fmt: Callable[[float], str]) -> str:
    """``text`` with every ``t=<epoch seconds>`` written as ``fmt(seconds)`` (``reservation at
    t=1.79546e+09`` -> ``reservation at 2026-11-25T03:05:06Z``); model times below ``EPOCH_MIN``
    (the simulator's) stay as they are."""
    def one(m: re.Match[str]) -> str:
        s = float(m.group(1))
        return fmt(s) if s >= EPOCH_MIN else m.group(0)

    return _TIME_REF.sub(one, text)


_ISO_UTC = re.compile(r"\b(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z")


def rewrite_iso(text: str, fmt: Callable[[float], str]) -> str:
    """``text`` with every ISO 8601 UTC time to the second (``2026-11-25T03:05:06Z``, as the API writes
    them into reasons and messages) written as ``fmt(seconds)``."""
    def one(m: re.Match[str]) -> str:
        try:
            d = _dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=_dt.UTC)
        except ValueError:  # no date (month 13): left as it is
            return m.group(0)
        return fmt(d.timestamp())

    return _ISO_UTC.sub(one, text)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_time(text: str, local: bool = True) -> float:
    """Epoch seconds from epoch seconds (``1795460000``) or an ISO 8601 time (``2026-11-25T04:05``,
    ``2026-11-25T04:05:06Z``, ``...+01:00``); a time without a zone is local (``TZ``), or UTC when not
    ``local``. ``ValueError`` saying what is accepted otherwise."""
    raw = text.strip()
    try:
        t = float(raw)
    except ValueError:
        try:
            d = _dt.datetime.fromisoformat(raw)
        except ValueError:
            raise ValueError(f"{text[:40]!r} is not a time: give epoch seconds or ISO 8601 like "
                             f"2026-11-25T04:05:06Z") from None
        if d.tzinfo is None:
            d = d.astimezone() if local else d.replace(tzinfo=_dt.UTC)
        t = d.timestamp()
    if not t >= 0 or t == float("inf"):
        raise ValueError(f"{text[:40]!r} is not a time at or after 1970-01-01")
    return t


def parse_since(text: str, now: float | None = None) -> float:
    """``--since``: a duration back from ``now`` (``90s``, ``10m``, ``2h``, ``1d``, ``1w``) or a time
    (``parse_time``, local zone when none is given); epoch seconds."""
    m = _DURATION.match(text)
    if m is not None:
        return (time.time() if now is None else now) - float(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return parse_time(text)
    except ValueError:
        raise ValueError(f"{text[:40]!r} is neither a duration (90s, 10m, 2h, 1d, 1w) nor a time (ISO 8601 "
                         f"like 2026-11-25T04:05, or epoch seconds)") from None
