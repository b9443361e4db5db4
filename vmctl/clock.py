"""Clocks. Every loop and policy gets time from one of these (or as an argument), never from
``time.time()`` directly, so the simulator and accelerated demos can replace it.

- ``SystemClock``: wall time for timestamps, monotonic sleeps.
- ``VirtualClock``: advances only when told to (simulator, unit tests).
- ``ScaledClock``: wall time sped up by a factor from a fixed origin (the demo's accelerated clock).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (or since the simulation start for virtual clocks)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """A clock that moves only through ``advance``/``set``; ``sleep`` advances it."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        with self._lock:
            if t < self._now:
                raise ValueError(f"virtual clock cannot go back from {self._now} to {t}")
            self._now = float(t)

    def advance(self, dt: float) -> None:
        if dt < 0:
            raise ValueError(f"cannot advance by a negative amount {dt}")
        with self._lock:
            self._now += dt

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))


class ScaledClock:
    """Wall time sped up ``factor`` times: one real second is ``factor`` clock seconds."""

    def __init__(self, factor: float, origin: float | None = None, real0: float | None = None) -> None:
        """``origin`` is the clock's time at the monotonic instant ``real0`` (default: now)."""
        if factor <= 0:
            raise ValueError(f"clock factor must be > 0, got {factor}")
        self.factor = float(factor)
        self._real0 = time.monotonic() if real0 is None else float(real0)
        self._origin = time.time() if origin is None else float(origin)

    def now(self) -> float:
        return self._origin + (time.monotonic() - self._real0) * self.factor

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds / self.factor)


def accelerated_clock(speed: float, epoch: float | None = None) -> Clock:
    """A clock for ``clock: {speed: N, epoch: T}`` in the daemon's and the agents' configs: model
    time equals wall time at the wall-clock instant ``epoch`` (default: now) and runs ``speed`` times
    faster from there. Processes given the same ``speed`` and ``epoch`` agree on the time (as far as
    their wall clocks agree). ``speed == 1`` without an epoch is the plain ``SystemClock``."""
    if speed == 1.0 and epoch is None:
        return SystemClock()
    mono, now = time.monotonic(), time.time()  # one instant on both clocks: a pause after it shifts nothing
    e = now if epoch is None else float(epoch)
    return ScaledClock(speed, origin=e + (now - e) * speed, real0=mono)
