"""Speedup models of moldable jobs: how much faster a job runs on ``n`` processors than on one.

A moldable :class:`vmctl.model.JobShape` gives its execution time at each allowed width either as a
table (measured) or as one of these models plus the time at its smallest width; the time at width
``w`` is then ``time_at_min * S(min_width) / S(w)``. Both models are written here from their published
definitions:

- **Downey** (A. B. Downey, "A model for speedup of parallel programs", UC Berkeley technical report
  UCB/CSD-97-933, 1997, sec. 3): a program of average parallelism ``A`` (>= 1) whose parallelism
  varies by ``sigma`` (>= 0; 0 = perfectly parallel up to A). With low variance (``sigma <= 1``)::

      S(n) = A n / (A + sigma (n - 1) / 2)             1 <= n <= A
      S(n) = A n / (sigma (A - 1/2) + n (1 - sigma/2))  A <= n <= 2A - 1
      S(n) = A                                         n >= 2A - 1

  and with high variance (``sigma >= 1``)::

      S(n) = n A (sigma + 1) / (sigma (n + A - 1) + A)  1 <= n <= A + A sigma - sigma
      S(n) = A                                          n >= A + A sigma - sigma

  The pieces meet at their boundaries, and the two families agree at ``sigma = 1``.
- **Amdahl** (G. M. Amdahl, "Validity of the single processor approach to achieving large scale
  computing capabilities", AFIPS 1967): a serial fraction ``f`` in [0, 1] of the work does not
  parallelize, so ``S(n) = 1 / (f + (1 - f) / n)``.

Each model is a frozen dataclass with a ``name`` (its JSON tag) and ``speedup(n)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from vmctl.errors import ValidationError

#: the most a model parameter may be (keeps the JSON and the arithmetic finite)
MAX_PARALLELISM = 1_000_000.0


def _finite(value: float, where: str, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not (
            lo <= value <= hi):
        raise ValidationError(field=where, problem=f"must be a number in [{lo:g}, {hi:g}], got {value!r}")


@dataclass(frozen=True, slots=True)
class Downey:
    """Downey's (1997) speedup model: average parallelism ``A`` >= 1 and variance ``sigma`` >= 0."""

    A: float
    sigma: float
    name: Literal["downey"] = "downey"

    def __post_init__(self) -> None:
        _finite(self.A, "shape.speedup.A", 1.0, MAX_PARALLELISM)
        _finite(self.sigma, "shape.speedup.sigma", 0.0, MAX_PARALLELISM)

    def speedup(self, n: float) -> float:
        a, s = self.A, self.sigma
        if n < 1:
            raise ValidationError(field="width", problem=f"must be >= 1, got {n}")
        if s <= 1.0:
            if n <= a:
                return a * n / (a + s * (n - 1) / 2)
            if n <= 2 * a - 1:
                return a * n / (s * (a - 0.5) + n * (1 - s / 2))
            return a
        if n <= a + a * s - s:
            return n * a * (s + 1) / (s * (n + a - 1) + a)
        return a

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "A": self.A, "sigma": self.sigma}


@dataclass(frozen=True, slots=True)
class Amdahl:
    """Amdahl's (1967) law: a serial fraction ``serial`` in [0, 1] of the work."""

    serial: float
    name: Literal["amdahl"] = "amdahl"

    def __post_init__(self) -> None:
        _finite(self.serial, "shape.speedup.serial", 0.0, 1.0)

    def speedup(self, n: float) -> float:
        if n < 1:
            raise ValidationError(field="width", problem=f"must be >= 1, got {n}")
        return 1.0 / (self.serial + (1.0 - self.serial) / n)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "serial": self.serial}


Speedup: TypeAlias = Downey | Amdahl
SPEEDUP_MODELS = ("downey", "amdahl")


def times_from_model(model: Speedup, widths: tuple[int, ...], time_at_min: float) -> tuple[float, ...]:
    """The execution time at each of ``widths`` (increasing) on standard resources, when the smallest
    takes ``time_at_min`` seconds: ``time_at_min * S(widths[0]) / S(w)``."""
    _finite(time_at_min, "shape.time_at_min", 0.0, 1e12)
    if not time_at_min > 0:
        raise ValidationError(field="shape.time_at_min", problem=f"must be > 0, got {time_at_min}")
    base = time_at_min * model.speedup(widths[0])
    return tuple(base / model.speedup(w) for w in widths)
