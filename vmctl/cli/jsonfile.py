"""Reading a JSON input file for a command (an instance, a plan request): errors name the file and
the line and column, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vmctl.errors import InstanceFormatError


def read_json(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InstanceFormatError(path=path, where="$", problem=f"cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise InstanceFormatError(path=path, where="$", problem="not UTF-8 text") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InstanceFormatError(path=path, where=f"line {exc.lineno} column {exc.colno}", problem=exc.msg) from exc
