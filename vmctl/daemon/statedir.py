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
- A damaged SQLite file is refused at start (``refuse_damaged``: ``PRAGMA quick_check`` table by table,
  bounded by ``store.check_timeout_s``), naming the file and what is damaged.
- The state directory remembers how far the store's history went (``HighWater``: STATE_DIR/store.highwater,
  the store's position after every commit of this daemon); a store that is older than that -- a WAL lost
  after a kill -9, an older copy of the database or an older PostgreSQL dump put in place -- is refused
  (``refuse_rollback``) until an operator accepts the loss (``vmctld accept-rollback``) or restores a
  backup (``vmctld restore``), both of which start a new timeline that every state directory accepts.
- ``Created`` remembers what one start created, so that a start that fails removes it again.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
import stat
import threading
import time
import zlib
from pathlib import Path

from vmctl.daemon.config import DaemonConfig
from vmctl.errors import ConfigError, StoreError, UserError
from vmctl.files import replace_file, write_synced
from vmctl.store import sqlite_path
from vmctl.store.base import Store, StoreDamaged, StorePosition

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


def highwater_file(cfg: DaemonConfig) -> Path:
    """Where the state directory keeps the highest store position it saw (``HighWater``)."""
    return Path(cfg.state_dir) / "store.highwater"


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
    fixes.append(private_file(highwater_file(cfg), "state_dir", cfg.path))
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
    found = [p for p in (cfg.ca_pem_path, token_file(cfg), highwater_file(cfg)) if p.exists()]
    if not found:
        return
    where = sqlite_path(cfg.store_url) or "the PostgreSQL database"
    raise StateConflict(problem=(
        f"the store ({where}) holds no cluster, but {' and '.join(str(p) for p in found)} belong to an earlier "
        f"one: refusing to create a new cluster (new CA, new admin token) over it. The database was emptied or "
        f"its WAL lost. Restore a backup (`vmctld restore FILE --config {cfg.path}`, docs/operations.md "
        f"\"Backup and restore\"), or, to start a new cluster deliberately, remove {' and '.join(map(str, found))}"))


# ------------------------------------------------------------------------------------ a damaged store


def refuse_damaged(cfg: DaemonConfig, store: Store) -> None:
    """Raise ``StoreDamaged`` naming the file when SQLite's ``quick_check`` finds the database damaged.
    The check stops after ``store.check_timeout_s`` real seconds (it reads the whole file: about 1 s per
    GB from the page cache, 30 s per GB from a cold disk here); the tables it did not reach are logged,
    and damage found there later takes the running leader out of service (``DaemonBase``). PostgreSQL
    checks its own pages (data checksums) and reports damage as an error vmctld handles the same way."""
    from vmctl.store.sqlite import SqliteStore

    if not isinstance(store, SqliteStore) or store.path == ":memory:" or os.path.getsize(store.path) == 0:
        return
    size = os.path.getsize(store.path)
    report = store.check(cfg.store_check_timeout_s)
    if report.problems:
        shown = report.problems[:5] + ([f"... {len(report.problems) - 5} more"] if len(report.problems) > 5 else [])
        raise StoreDamaged(backend=store.backend, where=store.path,
                           problem="PRAGMA quick_check found: " + "; ".join(shown))
    if report.unchecked:
        log.warning("integrity check of %s (%.0f MB) stopped after %.1f s (store.check_timeout_s): tables %s not "
                    "checked; damage found there later takes vmctld out of service (/healthz 503)", store.path,
                    size / 2**20, report.seconds, ", ".join(report.unchecked))
    else:
        log.info("integrity check of %s (%.0f MB): ok in %.2f s", store.path, size / 2**20, report.seconds)


# ------------------------------------------------------------------------------------ rollback

_MARK = re.compile(r"vmctl-store-highwater timeline=(\d{20}) commits=(\d{20}) job=(\d{20}) event=(\d{20}) "
                   r"crc=([0-9a-f]{8})\n")


def _mark_text(pos: StorePosition) -> str:
    body = (f"vmctl-store-highwater timeline={pos.timeline:020d} commits={pos.commits:020d} job={pos.job:020d} "
            f"event={pos.event:020d}")
    return f"{body} crc={zlib.crc32(body.encode()):08x}\n"


def read_highwater(cfg: DaemonConfig) -> StorePosition | None:
    """The highest store position this state directory saw (None: it never saw one, e.g. a vmctld
    older than the file); a file that cannot be read back is a ``StateConflict`` saying so."""
    path = highwater_file(cfg)
    text = read_text(path, "state_dir", cfg.path)
    if text is None:
        return None
    m = _MARK.fullmatch(text)
    if m is None or f"{zlib.crc32(text[:text.rindex(' crc=')].encode()):08x}" != m.group(5):
        raise StateConflict(problem=(
            f"{path} is not a store high-water mark vmctld wrote (damaged or edited): it cannot tell whether "
            f"the store is older than what this state directory saw. `vmctld accept-rollback --config {cfg.path}` "
            f"rewrites it from the store as it is (docs/operations.md, \"State, backup and restore\")"))
    return StorePosition(int(m.group(1)), int(m.group(2)), job=int(m.group(3)), event=int(m.group(4)))


class HighWater:
    """STATE_DIR/store.highwater: the store position after this daemon's last commit (``Store.on_commit``).
    One line of fixed width with a CRC, rewritten in place after every commit (no fsync there: a kill -9
    leaves the page cache, so the mark is exact; it is fsynced at most once a second, in a thread of its
    own so that a slow disk does not hold up the event loop, and when vmctld stops, so a power loss leaves
    it at most about a second behind). Only ever raised: it is a lower bound of what the store held, so a
    store found below it lost commits (with SQLite's ``synchronous=NORMAL`` WAL, a power loss can take
    commits the mark saw: a real loss, reported)."""

    SYNC_S = 1.0

    def __init__(self, cfg: DaemonConfig) -> None:
        self.cfg = cfg
        self.path = highwater_file(cfg)
        self.last: StorePosition | None = None
        self._fd: int | None = None
        self._synced = 0.0
        self._syncer: threading.Thread | None = None

    def attach(self, store: Store) -> None:
        """Record the store's position now and after every commit."""
        pos = store.position()
        if pos is not None:
            self.record(pos)
        store.on_commit = self.record

    def record(self, pos: StorePosition) -> None:
        if self.last is not None and not self.last.older_than(pos):
            return  # never lowered (a timeline is only changed offline, with the file rewritten there)
        data = _mark_text(pos).encode()
        try:
            if self._fd is None:
                if not self.path.exists():
                    replace_file(self.path, data.decode(), SECRET_MODE)  # whole or absent, never empty
                self._fd = os.open(self.path, os.O_RDWR)
                os.ftruncate(self._fd, len(data))
            os.pwrite(self._fd, data, 0)
            self.last = pos
        except OSError as exc:
            log.error("cannot record the store position in %s: %s", self.path, exc.strerror or exc)
            return
        now = time.monotonic()
        if now - self._synced >= self.SYNC_S and (self._syncer is None or not self._syncer.is_alive()):
            self._synced = now
            self._syncer = threading.Thread(target=self._sync, args=(self._fd,), name="vmctld-highwater-sync",
                                            daemon=True)
            self._syncer.start()

    def _sync(self, fd: int) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            log.error("cannot sync %s: %s", self.path, exc.strerror or exc)

    def close(self) -> None:
        """The last position synced, the file closed."""
        if self._syncer is not None:
            self._syncer.join()
            self._syncer = None
        if self._fd is not None:
            self._sync(self._fd)
            os.close(self._fd)
            self._fd = None


def write_highwater(cfg: DaemonConfig, pos: StorePosition) -> None:
    """Replace the mark (offline commands that start a new timeline: restore, accept-rollback)."""
    try:
        replace_file(highwater_file(cfg), _mark_text(pos), SECRET_MODE)
    except OSError as exc:
        raise ConfigError(path=cfg.path, where="state_dir",
                          problem=f"cannot write {highwater_file(cfg)}: {exc.strerror or exc}") from exc


def describe(pos: StorePosition) -> str:
    return f"commit {pos.commits} of timeline {pos.timeline} (newest job {pos.job}, newest event {pos.event})"


def missing(seen: StorePosition, pos: StorePosition | None) -> str:
    """What a store at ``pos`` lacks of what was seen at ``seen``, in words."""
    if pos is None:
        return f"the store predates schema 7 (no position), the state directory saw {describe(seen)}"
    parts = []
    if pos.timeline == seen.timeline:
        parts.append(f"{seen.commits - pos.commits} committed change(s) (commits {pos.commits + 1} to {seen.commits})")
    else:
        parts.append(f"the store is on timeline {pos.timeline}, older than timeline {seen.timeline} seen here")
    if seen.job > pos.job:
        parts.append(f"job(s) {pos.job + 1} to {seen.job}" if seen.job > pos.job + 1 else f"job {seen.job}")
    if seen.event > pos.event:
        parts.append(f"event(s) {pos.event + 1} to {seen.event}")
    return "; ".join(parts)


def refuse_rollback(cfg: DaemonConfig, store: Store) -> StorePosition | None:
    """Raise ``StateConflict`` when the store is older than what this state directory last saw; changes
    nothing. Returns the mark (None: none yet)."""
    seen = read_highwater(cfg)
    if seen is None:
        return None
    pos = store.position()
    if pos is not None and not pos.older_than(seen):
        if pos.timeline > seen.timeline:
            log.warning("the store was restored or rolled back deliberately since this state directory last saw it "
                        "(timeline %d, %s here; now %s)", seen.timeline, describe(seen), describe(pos))
        return seen
    where = sqlite_path(cfg.store_url) or store.location()
    files = f"{where} together with its {where}-wal" if sqlite_path(cfg.store_url) else where
    raise StateConflict(problem=(
        f"the store ({where}) is older than what this state directory last saw ({highwater_file(cfg)}: "
        f"{describe(seen)}; the store holds {describe(pos) if pos else 'no position'}). Missing: "
        f"{missing(seen, pos)}. A WAL lost after a crash, or an older copy or dump of the store put in place? "
        f"Nothing was changed. Put the newer store back ({files}) if you have it; or restore a backup "
        f"(`vmctld restore FILE --config {cfg.path}`); or accept the loss: `vmctld accept-rollback --config "
        f"{cfg.path}` (logs an event; the agents remove the VMs of jobs the store does not have) "
        f"(docs/operations.md, \"State, backup and restore\")"))


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
        self._files = [f for f in (*sqlite_files(cfg), cfg.ca_pem_path, token_file(cfg), highwater_file(cfg))
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
