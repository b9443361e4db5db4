"""Writing files that other processes may read at any moment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vmctl.errors import UserError


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


def write_cert_files(out: Path, node_name: str, doc: Mapping[str, Any]) -> list[Path]:
    """NODE.crt, NODE.key (mode 0600; only when the answer carries a key) and ca.crt, in that order."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        crt, key, ca_path = out / f"{node_name}.crt", out / f"{node_name}.key", out / "ca.crt"
        written = [crt]
        # each file replaced atomically: an agent already started from this folder may be reading the
        # shared ca.crt while the next node's files are written (it read an empty file once)
        if "key_pem" in doc:
            replace_file(key, str(doc["key_pem"]), 0o600)
            written.append(key)
        replace_file(crt, str(doc["cert_pem"]), 0o644)
        replace_file(ca_path, str(doc["ca_pem"]), 0o644)
    except OSError as exc:
        raise UserError(where=f"--out-dir {out}", problem=str(exc)) from exc
    return [*written, ca_path]
