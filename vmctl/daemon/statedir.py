"""vmctld's state directory and the files in it.

- Everything that can make a start fail is checked before anything is created (``preflight``): the
  state directory, the SQLite file and the admin-token file can be created or written, ``api.listen``
  resolves to an address of this host and ``api.port`` is free. Each problem is a ``ConfigError``
  naming the config file and the key.
- The state directory is 0700 and every file holding a secret (the SQLite database with its
  ``-wal``/``-shm``/``-journal``, which hold the cluster CA's private key and the token hashes, and the
  admin token file) is 0600 whatever the umask; looser modes left by an older vmctld are fixed at start
  and logged (``make_private``).
- A store that holds no cluster next to the CA certificate or the admin token of an earlier one is an
  emptied or lost database, not a first start: vmctld refuses to create a new cluster over it
  (``refuse_new_cluster``).
- ``Created`` remembers what one start created, so that a start that fails removes it again.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
from pathlib import Path

from vmctl.daemon.config import DaemonConfig
from vmctl.errors import ConfigError, StoreError, UserError
from vmctl.files import replace_file, write_synced
from vmctl.store import sqlite_path
from vmctl.store.base import Store

log = logging.getLogger("vmctld")

DIR_MODE = 0o700
SECRET_MODE = 0o600
SQLITE_SIDECARS = ("-wal", "-shm", "-journal")


class StateConflict(UserError):
    """The state directory and the store do not belong together (an emptied or lost database)."""

    reference = "state-conflict"
    template = "{problem}"


class StartupError(UserError):
    """A file vmctld needs could not be used (named in the message)."""

    reference = "startup-failed"
    template = "{problem}"


def token_file(cfg: DaemonConfig) -> Path:
    return Path(cfg.bootstrap_token_file or Path(cfg.state_dir) / "admin.token")


def sqlite_files(cfg: DaemonConfig) -> list[Path]:
    """The SQLite database and the files SQLite keeps next to it (none for PostgreSQL)."""
    db = sqlite_path(cfg.store_url)
    if db is None or db == ":memory:":
        return []
    return [Path(db)] + [Path(db + s) for s in SQLITE_SIDECARS]


def secret_files(cfg: DaemonConfig) -> list[Path]:
    return [*sqlite_files(cfg), token_file(cfg)]


# ------------------------------------------------------------------------------------ preflight


def preflight(cfg: DaemonConfig) -> None:
    """Check, creating nothing, what would make a start fail half-way; ``ConfigError`` names the key."""
    _dir_target(cfg, "state_dir", Path(cfg.state_dir))
    db = sqlite_path(cfg.store_url)
    if db is not None and db != ":memory:":
        _file_target(cfg, "store.url", Path(db))
    _file_target(cfg, "api.bootstrap_token_file", token_file(cfg))
    _check_listen(cfg)


def _err(cfg: DaemonConfig, key: str, problem: str) -> ConfigError:
    return ConfigError(path=cfg.path, where=key, problem=problem)


def _dir_target(cfg: DaemonConfig, key: str, path: Path, for_file: Path | None = None) -> None:
    """``path`` is a directory we may write in, or can be created as one."""
    pre = f"cannot create {for_file}: " if for_file is not None else ""
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise _err(cfg, key, f"{pre}{path} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise _err(cfg, key, f"{pre}directory {path} is not writable by uid {os.geteuid()}")
        return
    parent = path.parent
    while not (parent.exists() or parent.is_symlink()):
        parent = parent.parent
    what = for_file if for_file is not None else path
    if not parent.is_dir():
        raise _err(cfg, key, f"cannot create {what}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _err(cfg, key, f"cannot create {what}: {parent} is not writable by uid {os.geteuid()}")


def _file_target(cfg: DaemonConfig, key: str, path: Path) -> None:
    """``path`` is a regular file we may read and write, or can be created."""
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise _err(cfg, key, f"{path} exists and is not a regular file")
        if not os.access(path, os.R_OK | os.W_OK):
            raise _err(cfg, key, f"{path} is not readable and writable by uid {os.geteuid()}")
        return
    _dir_target(cfg, key, path.parent, for_file=path)


def _check_listen(cfg: DaemonConfig) -> None:
    try:
        infos = socket.getaddrinfo(cfg.listen, cfg.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise _err(cfg, "api.listen",
                   f"cannot resolve {cfg.listen!r}: {getattr(exc, 'strerror', None) or exc}") from exc
    for family, kind, proto, _canon, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the API's listener does
            try:
                s.bind(addr)
            except OSError as exc:
                raise bind_error(cfg, str(addr[0]), exc) from exc


def bind_error(cfg: DaemonConfig, host: str, exc: OSError) -> ConfigError:
    """A failed bind of the API listener as a ``ConfigError`` naming the key at fault."""
    if exc.errno == errno.EADDRINUSE:
        return _err(cfg, "api.port", f"{host} port {cfg.port} is already in use (another vmctld? "
                                     f"`ss -ltnp 'sport = :{cfg.port}'` shows who holds it)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return _err(cfg, "api.listen", f"{cfg.listen!r} ({host}) is not an address of this host")
    if exc.errno == errno.EACCES:
        return _err(cfg, "api.port", f"binding port {cfg.port} needs privileges vmctld does not have")
    return _err(cfg, "api.listen", f"cannot listen on {host} port {cfg.port}: {exc.strerror or exc}")


# ------------------------------------------------------------------------------------ modes


def private_dir(path: Path, key: str = "state_dir", cfg_path: str = "<config>") -> str | None:
    """Create ``path`` (0700) or make it 0700; says what it fixed (None: nothing)."""
    created = False
    fixed = None
    try:
        if not path.is_dir():
            path.mkdir(mode=DIR_MODE, parents=True)
            created = True
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode != DIR_MODE:
            os.chmod(path, DIR_MODE)
            if not created:
                fixed = f"{key} {path} was mode {mode:04o}"
    except OSError as exc:
        raise ConfigError(path=cfg_path, where=key, problem=f"cannot make {path} a private directory: "
                                                            f"{exc.strerror or exc}") from exc
    return fixed


def private_file(path: Path, key: str, cfg_path: str = "<config>") -> str | None:
    """Make an existing file 0600; says what it fixed (None: nothing)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(path=cfg_path, where=key, problem=f"cannot inspect {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        return None
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        try:
            os.chmod(path, SECRET_MODE)
        except OSError as exc:
            raise ConfigError(path=cfg_path, where=key, problem=f"{path} is mode {mode:04o} and cannot be made "
                                                                f"{SECRET_MODE:04o}: {exc.strerror or exc}") from exc
        return f"{path} was mode {mode:04o}"
    return None


def make_private(cfg: DaemonConfig) -> list[str]:
    """The state directory 0700 and every existing secret file 0600; the fixes are logged (one line)
    and returned."""
    fixes = [private_dir(Path(cfg.state_dir), "state_dir", cfg.path)]
    fixes += [private_file(p, "store.url", cfg.path) for p in sqlite_files(cfg)]
    fixes.append(private_file(token_file(cfg), "api.bootstrap_token_file", cfg.path))
    done = [f for f in fixes if f is not None]
    if done:
        log.warning("state readable by other users (it holds the CA key and tokens), made private (directory "
                    "%04o, files %04o): %s", DIR_MODE, SECRET_MODE, "; ".join(done))
    return done


def write_secret(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 (whatever the umask) and write ``text``; never overwrites
    (``FileExistsError``). A failed write leaves no file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, SECRET_MODE)
    try:
        os.fchmod(fd, SECRET_MODE)
        write_synced(fd, text)
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise
    os.close(fd)


def write_secret_file(path: Path, text: str, key: str, cfg_path: str) -> None:
    """``write_secret`` (its directory created 0700 if missing); an ``OSError`` becomes a
    ``ConfigError`` naming the file and the key."""
    try:
        if not path.parent.is_dir():
            path.parent.mkdir(mode=DIR_MODE, parents=True)
        write_secret(path, text)
    except OSError as exc:
        raise ConfigError(path=cfg_path, where=key, problem=f"cannot write {path}: {exc.strerror or exc}") from exc


def write_public(path: Path, text: str, key: str, cfg_path: str) -> None:
    """Write a file that holds no secret (the CA certificate) atomically, mode 0644."""
    try:
        replace_file(path, text, 0o644)
    except OSError as exc:
        raise ConfigError(path=cfg_path, where=key, problem=f"cannot write {path}: {exc.strerror or exc}") from exc


def read_text(path: Path, key: str, cfg_path: str) -> str | None:
    """The text of ``path``, None when it does not exist; other problems name the file and key."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(path=cfg_path, where=key, problem=f"cannot read {path}: {why}") from exc


# ------------------------------------------------------------------------------------ earlier cluster


def store_has_cluster(store: Store) -> bool:
    """The store holds a cluster: its schema and the cluster CA."""
    if store.schema_version() == 0:
        return False
    try:
        return store.get_kv("ca") is not None
    except StoreError:
        return False


def refuse_new_cluster(cfg: DaemonConfig, store: Store) -> None:
    """Raise ``StateConflict`` when the store holds no cluster but the state directory holds the CA
    certificate or the admin token of an earlier one (an emptied database, a lost WAL)."""
    if store_has_cluster(store):
        return
    found = [p for p in (cfg.ca_pem_path, token_file(cfg)) if p.exists()]
    if not found:
        return
    where = sqlite_path(cfg.store_url) or "the PostgreSQL database"
    raise StateConflict(problem=(
        f"the store ({where}) holds no cluster, but {' and '.join(str(p) for p in found)} belong to an earlier "
        f"one: refusing to create a new cluster (new CA, new admin token) over it. The database was emptied or "
        f"its WAL lost. Restore a backup (`vmctld restore FILE --config {cfg.path}`, docs/operations.md "
        f"\"Backup and restore\"), or, to start a new cluster deliberately, remove {' and '.join(map(str, found))}"))


# ------------------------------------------------------------------------------------ clean-up


class Created:
    """What one start of vmctld created (the state directory, the SQLite files, ca.pem, the token
    file), so that a start that fails removes exactly that and nothing else."""

    def __init__(self, cfg: DaemonConfig) -> None:
        self._dirs: list[Path] = []
        p = Path(cfg.state_dir)
        while not (p.exists() or p.is_symlink()):
            self._dirs.append(p)
            p = p.parent
        for extra in (*sqlite_files(cfg), token_file(cfg)):
            q = extra.parent
            while not (q.exists() or q.is_symlink()) and q not in self._dirs:
                self._dirs.append(q)
                q = q.parent
        self._files = [f for f in (*sqlite_files(cfg), cfg.ca_pem_path, token_file(cfg))
                       if not (f.exists() or f.is_symlink())]

    def remove(self) -> list[Path]:
        """Remove what did not exist before; returns what was removed."""
        removed: list[Path] = []
        for f in self._files:
            try:
                f.unlink()
                removed.append(f)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("could not remove %s created by this start: %s", f, exc)
        for d in sorted(self._dirs, key=lambda x: len(x.parts), reverse=True):
            try:
                d.rmdir()
                removed.append(d)
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("could not remove %s created by this start: %s", d, exc)
        return removed
