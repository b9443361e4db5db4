"""YAML configuration loading with errors that name the file and the key.

Each component (daemon, agent, simulator sweeps) describes its config as a frozen dataclass and
builds it with the helpers here, so every problem is reported as ``FILE: key.path: problem`` and
nothing is half-applied (a config is either fully valid or rejected).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from vmctl.errors import ConfigError

T = TypeVar("T")

#: the largest integer magnitude a config may hold (what a 64-bit field holds)
MAX_INT = 2**63 - 1


def _abbrev(value: int) -> str:
    text = str(value) if value.bit_length() < 4000 else "a huge integer"
    return text if len(text) <= 24 else f"{text[:12]}...{text[-6:]} ({len(text)} digits)"


def check_finite(value: Any, path: str, where: str) -> None:
    """Every number inside ``value`` (nested mappings and lists, such as policy parameters) is finite
    and within 64 bits; else ``ConfigError`` naming ``where.key[i]``."""
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(path=path, where=where, problem=f"must be a finite number, got {value}")
    if isinstance(value, int) and abs(value) > MAX_INT:
        raise ConfigError(path=path, where=where, problem=f"{_abbrev(value)} is out of range (at most 2^63-1)")
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_finite(v, path, f"{where}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_finite(v, path, f"{where}[{i}]")


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping. Missing file, unreadable file, bad YAML or a non-mapping top level are
    ``ConfigError`` with the location."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(path=str(p), where="file", problem="does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(path=str(p), where="file", problem=f"cannot be read: {exc}") from exc
    return parse_yaml(text, str(p))


def parse_yaml(text: str, path: str = "<string>") -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise ConfigError(path=path, where="document", problem=f"not valid YAML: {exc}") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "document"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(path=path, where=where, problem=f"not valid YAML: {problem}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(path=path, where="top level", problem=f"must be a mapping, got {type(data).__name__}")
    return data


class Section:
    """A typed reader over one mapping of a config document. Records the keys it read so that
    ``finish()`` can reject unknown keys (typos are the most common config error)."""

    def __init__(self, data: Mapping[str, Any], path: str, prefix: str = "") -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(path=path, where=prefix or "top level", problem="must be a mapping")
        self._data = data
        self._path = path
        self._prefix = prefix
        self._seen: set[str] = set()

    def _where(self, key: str) -> str:
        return f"{self._prefix}.{key}" if self._prefix else key

    def error(self, key: str, problem: str) -> ConfigError:
        return ConfigError(path=self._path, where=self._where(key), problem=problem)

    def has(self, key: str) -> bool:
        return key in self._data

    def get(self, key: str, kind: type[T], default: T | None = None, *, required: bool = False) -> T:
        self._seen.add(key)
        if key not in self._data or self._data[key] is None:
            if required:
                raise self.error(key, "is required")
            return default  # type: ignore[return-value]
        value = self._data[key]
        if kind is not bool and isinstance(value, bool):
            raise self.error(key, f"must be {kind.__name__}, got a boolean")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            raise self.error(key, f"{_abbrev(value)} is out of range (at most 2^63-1 in magnitude)")
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind):
            raise self.error(key, f"must be {kind.__name__}, got {type(value).__name__} {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            # YAML's .nan and .inf: a NaN passes every range check (a resync period of NaN spins a core)
            raise self.error(key, f"must be a finite number, got {value}")
        return value

    def number(
        self, key: str, default: float | None = None, *, lo: float | None = None, hi: float | None = None,
        required: bool = False,
    ) -> float:
        v = self.get(key, float, default, required=required)
        if v is None:
            raise self.error(key, "is required")
        if lo is not None and v < lo:
            raise self.error(key, f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise self.error(key, f"must be <= {hi}, got {v}")
        return v

    def integer(
        self, key: str, default: int | None = None, *, lo: int | None = None, hi: int | None = None,
        required: bool = False,
    ) -> int:
        v = self.get(key, int, default, required=required)
        if v is None:
            raise self.error(key, "is required")
        if lo is not None and v < lo:
            raise self.error(key, f"must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            raise self.error(key, f"must be <= {hi}, got {v}")
        return v

    def choice(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        v = self.get(key, str, default)
        if v not in choices:
            raise self.error(key, f"must be one of {', '.join(choices)}, got {v!r}")
        return v

    def section(self, key: str) -> Section:
        self._seen.add(key)
        return Section(self._data.get(key) or {}, self._path, self._where(key))

    def finish(self) -> None:
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise self.error(unknown[0], f"unknown key (known: {', '.join(sorted(self._seen)) or 'none'})")
