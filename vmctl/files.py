"""Writing files that other processes may read at any moment."""

from __future__ import annotations

import os
from pathlib import Path


def write_synced(fd: int, text: str) -> None:
    """Write all of ``text`` to the open file ``fd`` and sync it to disk."""
    data = text.encode("utf-8")
    while data:
        data = data[os.write(fd, data):]
    os.fsync(fd)


def replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically with ``mode`` (whatever the umask): a reader sees the old
    content or the new, never an empty or partial file (a temporary file in the same folder, synced,
    then renamed over ``path``). A failed write leaves ``path`` as it was and no temporary file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            os.fchmod(fd, mode)
            write_synced(fd, text)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
