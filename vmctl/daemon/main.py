"""``vmctld --config FILE``: the central daemon's console script and composition root.

``serve`` wires the pieces of one vmctld process together: the store, the ``Daemon``, and the HTTP
server of ``vmctl.api.server`` built on the daemon's runtime (``vmctl.daemon.runtime``: decision loop,
lease, waiters). This module is the vmctld process, the top layer with the ``vmctl`` command
(docs/architecture.md, "Layers"): it is the one module under ``vmctl/daemon/`` that imports
``vmctl.api`` (only ``vmctl.api.server``; tests/unit/test_import_boundaries.py checks it), and nothing
imports it. The daemon itself does not know the HTTP layer. The offline commands (backup, restore,
token create) use the neutral ``vmctl.auth``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from vmctl.errors import ConfigError, ValidationError, VmctlError
from vmctl.sdnotify import Notifier

if TYPE_CHECKING:
    from vmctl.daemon.config import DaemonConfig
    from vmctl.store import Store


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vmctld", description="vmctl central daemon (decision loop + HTTP API). Without a command: run it.",
        epilog="offline commands: vmctld backup FILE, vmctld restore FILE, vmctld accept-rollback, vmctld token create "
               "(each takes --config)")
    p.add_argument("--config", "-c", help="daemon YAML (see etc/vmctld.yaml)")
    p.add_argument("--check", action="store_true", help="validate the config and exit")
    p.add_argument("--port", type=int, default=None, help="override api.port (0 = any free port)")
    cfg = argparse.ArgumentParser(add_help=False)
    cfg.add_argument("--config", "-c", default=argparse.SUPPRESS, help="daemon YAML (see etc/vmctld.yaml)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    b = sub.add_parser("backup", parents=[cfg], help="consistent copy of the SQLite store, also while vmctld runs",
                       description="Copy the whole SQLite store into the new file FILE (mode 0600) with SQLite's "
                                   "online backup API: consistent while vmctld runs. PostgreSQL: use pg_dump.")
    b.add_argument("file", metavar="FILE", help="the backup file to create (never overwritten)")
    r = sub.add_parser("restore", parents=[cfg], help="replace the SQLite store by a backup (vmctld stopped)",
                       description="Replace the whole SQLite store by the backup FILE. Refused while a vmctld holds "
                                   "the leader lease: stop it first.")
    r.add_argument("file", metavar="FILE", help="a file made by `vmctld backup`")
    sub.add_parser("accept-rollback", parents=[cfg], help="accept a store older than the state directory saw",
                   description="vmctld refuses to start on a store older than what its state directory last saw "
                               "(error: state-conflict: a WAL lost after a crash, an older copy or dump put in "
                               "place). With vmctld stopped, this accepts that store as it is: the changes it lacks "
                               "are lost for good (the agents remove the VMs of jobs it does not have). It starts a "
                               "new timeline in the store, logs the event store.rollback_accepted and records the "
                               "new position in the state directory; any other state directory (a standby's) "
                               "accepts it too.")
    t = sub.add_parser("token", help="offline token management (writes to the store directly)")
    tsub = t.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    tc = tsub.add_parser("create", parents=[cfg], help="mint an operator token without the API",
                         description="Mint an operator token directly in the store (works while vmctld runs or "
                                     "stopped; refused when the store is unreachable or holds no cluster). The token "
                                     "is printed once, or written to --out with mode 0600.")
    tc.add_argument("--name", required=True, help="a name for the token (shown in logs)")
    tc.add_argument("--role", choices=("read", "admin"), default="read")
    tc.add_argument("--ttl", type=float, default=None, help="seconds until the token expires (default: never)")
    tc.add_argument("--out", default=None, help="write the token to this new file (mode 0600) instead of stdout")
    return p


async def serve(config_path: str, port: int | None) -> int:
    from dataclasses import replace

    from vmctl.api.server import DaemonServer
    from vmctl.clock import accelerated_clock
    from vmctl.daemon import statedir
    from vmctl.daemon.config import load_config
    from vmctl.daemon.core import Daemon
    from vmctl.store import open_store

    cfg = load_config(config_path)
    if port is not None:
        cfg = replace(cfg, port=port)
    logging.basicConfig(level=cfg.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("vmctld")
    # a repeated warning or error is logged once per interval with a count; the open-file limit is the
    # hard one (the API's connection limit is sized from it)
    from vmctl.daemon import limits

    limits.install_repeat_filter()
    log.info("open-file limit: %d", limits.raise_nofile_limit()[0])
    try:
        # everything that can fail half-way is checked before anything is created
        statedir.preflight(cfg)
    except VmctlError as exc:
        raise Refused(exc) from exc
    created = statedir.Created(cfg)
    highwater = statedir.HighWater(cfg)
    store: Store | None = None
    daemon: Daemon | None = None
    server: DaemonServer | None = None
    try:
        statedir.make_private(cfg)
        store = open_store(cfg.store_url, config_path=cfg.path)
        statedir.refuse_damaged(cfg, store)  # a damaged file is not served
        statedir.refuse_new_cluster(cfg, store)  # before the schema is created in an emptied database
        statedir.refuse_rollback(cfg, store)  # a store older than this state directory saw is not served
        daemon = Daemon(cfg, store, clock=accelerated_clock(cfg.clock_speed, cfg.clock_epoch))
        if daemon.speed != 1.0:
            log.info("accelerated clock: %g model seconds per real second", daemon.speed)
        server = DaemonServer(daemon)
        await server.start()
        highwater.attach(store)  # the store's position now (schema 007 in force) and after every commit
    except (VmctlError, OSError) as exc:
        # a start that fails leaves nothing it created behind (and frees the lease it took)
        with contextlib.suppress(Exception):
            if server is not None:
                await server.stop()
            elif daemon is not None:
                daemon.close()
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        highwater.close()
        removed = created.remove()
        if removed:
            log.info("removed what this failed start created: %s", ", ".join(map(str, removed)))
        error = exc if isinstance(exc, VmctlError) else statedir.StartupError(
            problem=f"{str(exc.filename) + ': ' if exc.filename else ''}{exc.strerror or exc}")
        raise Refused(error) from exc
    # SIGTERM handled before readiness is announced: a stop right after "ready" is a clean stop
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # systemd readiness and the port actually bound (tests start us with port 0)
    print(f"vmctld ready port={server.port} leader={daemon.leader}", flush=True)
    notifier = Notifier()
    notifier.ready(f"port {server.port}, leader={daemon.leader}")
    # WATCHDOG=1 only while the decision loop keeps passing (it passes at least every loop.tick_s)
    limit = watchdog_limit(cfg.tick_s)
    notifier.start_watchdog(lambda: daemon_healthy(daemon.last_pass, limit))
    try:
        await stop.wait()
    finally:
        notifier.stopping()
        notifier.close()
    await server.stop()
    store.close()
    highwater.close()
    return 0


def watchdog_limit(tick_s: float) -> float:
    """Real seconds without a decision-loop pass after which vmctld stops pinging the watchdog."""
    return 3.0 * tick_s + 10.0


def daemon_healthy(last_pass: float, limit: float, now: float | None = None) -> bool:
    """The decision loop passed (``time.monotonic()`` of ``last_pass``) within ``limit`` seconds."""
    return (time.monotonic() if now is None else now) - last_pass < limit


class Refused(Exception):
    """vmctld refused to start or an offline command refused (exit code 2); ``error`` says why, and a
    refused start removed what it had created."""

    def __init__(self, error: VmctlError) -> None:
        super().__init__(str(error))
        self.error = error


def _sqlite_only(cfg: DaemonConfig, what: str, instead: str) -> str:
    from vmctl.store import sqlite_path

    db = sqlite_path(cfg.store_url, config_path=cfg.path)
    if db is None or db == ":memory:":
        raise Refused(ConfigError(path=cfg.path, where="store.url", problem=(
            f"vmctld {what} works on a SQLite store; for PostgreSQL use {instead} (docs/operations.md, "
            f"\"Backup and restore\")")))
    return db


def _same_cluster(ca_pem: str, cas: list[object]) -> bool:
    """``ca_pem`` (a CA certificate or a rotation's bundle) holds a CA of the backup's cluster:
    ``cas`` are the backup's ``ca``, ``ca_previous`` and ``ca_retired`` values."""
    from vmctl import auth

    pems: list[str] = []
    for c in cas:
        for item in c if isinstance(c, list) else [c]:
            if isinstance(item, dict) and isinstance(item.get("cert_pem"), str):
                pems.append(item["cert_pem"])
    try:
        on_disk = {auth.ca_fingerprint(c) for c in auth.pem_certificates(ca_pem)}
        theirs = {auth.ca_fingerprint(c) for p in pems for c in auth.pem_certificates(p)}
    except ValueError:
        return False
    return bool(on_disk & theirs)


def _summary(store: Store) -> str:
    from vmctl import auth

    ca = store.get_kv("ca")
    fp = auth.load_stored_ca(ca, store).fingerprint() if isinstance(ca, dict) else "none"
    return f"schema {store.schema_version()}, {len(store.load_jobs())} jobs, {len(store.list_tokens())} tokens, CA {fp}"


def _open_cluster_store(cfg: DaemonConfig, no_cluster: str) -> Store:
    """The configured store, which must exist and hold a cluster; else ``Refused`` (``no_cluster`` says
    why that matters to the command). Never creates a database file."""
    from vmctl.daemon import statedir
    from vmctl.store import open_store

    try:
        store = open_store(cfg.store_url, config_path=cfg.path, must_exist=True)
    except VmctlError as exc:
        raise Refused(exc) from exc
    try:
        has_cluster = statedir.store_has_cluster(store)
    except VmctlError as exc:
        store.close()
        raise Refused(exc) from exc
    if not has_cluster:
        store.close()
        raise Refused(statedir.StateConflict(problem=f"the store ({store.location()}) holds no cluster: {no_cluster}"))
    return store


def backup(config_path: str, file: str) -> int:
    """``vmctld backup FILE``: SQLite's online backup API into the new file FILE (0600)."""
    from vmctl.daemon import statedir
    from vmctl.daemon.config import load_config
    from vmctl.store.sqlite import SqliteStore

    cfg = load_config(config_path)
    db = _sqlite_only(cfg, "backup", "pg_dump --format=custom --file=FILE DSN")
    dest = Path(file)
    if dest.exists() or dest.is_symlink():
        raise Refused(statedir.StartupError(problem=f"{dest} exists: vmctld backup never overwrites a file"))
    store = _open_cluster_store(cfg, "nothing to back up")
    try:
        assert isinstance(store, SqliteStore)
        store.backup(dest)
        summary = _summary(store)
    except VmctlError as exc:
        raise Refused(exc) from exc
    except OSError as exc:
        raise Refused(statedir.StartupError(problem=f"cannot create {dest}: {exc.strerror or exc}")) from exc
    finally:
        store.close()
    print(f"{dest}: backup of {db} ({summary})", flush=True)
    return 0


def restore(config_path: str, file: str) -> int:
    """``vmctld restore FILE``: the SQLite store replaced by a backup while no daemon holds the lease."""
    import sqlite3

    from vmctl.daemon import statedir
    from vmctl.daemon.config import load_config
    from vmctl.store import open_store
    from vmctl.store.sqlite import SqliteStore

    cfg = load_config(config_path)
    db = _sqlite_only(cfg, "restore", "pg_restore --clean --if-exists --dbname=DSN FILE")
    src = Path(file)
    try:
        conn = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        try:
            row = conn.execute("SELECT value FROM kv WHERE key = 'ca'").fetchone()
            # the CAs the backup's cluster had before (a CA rotation): ca.pem may hold one of them
            others = [json.loads(r[0]) for r in conn.execute(
                "SELECT value FROM kv WHERE key IN ('ca_previous', 'ca_retired')").fetchall()]
        finally:
            conn.close()
        ca = json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError) as exc:
        raise Refused(statedir.StartupError(problem=f"{src} is not a vmctld backup: {exc}")) from exc
    if not isinstance(ca, dict) or "cert_pem" not in ca:
        raise Refused(statedir.StartupError(problem=f"{src} is not a vmctld backup (no cluster CA in it)"))
    try:
        on_disk = statedir.read_text(cfg.ca_pem_path, "state_dir", cfg.path)
        if on_disk is not None and on_disk.strip() != str(ca["cert_pem"]).strip() and not _same_cluster(
                on_disk, [ca, *others]):
            raise statedir.StateConflict(problem=(
                f"{src} is a backup of another cluster than the one whose CA is {cfg.ca_pem_path}: refusing to "
                f"restore it here (remove {cfg.ca_pem_path} first if you mean to)"))
        statedir.make_private(cfg)
        store = open_store(cfg.store_url, config_path=cfg.path)
    except VmctlError as exc:
        raise Refused(exc) from exc
    try:
        seen = statedir.read_highwater(cfg)
    except VmctlError:
        seen = None  # an unreadable mark is replaced below
    try:
        assert isinstance(store, SqliteStore)
        store.restore(src)
        # a deliberate rollback: a new timeline, which this state directory (and any other) accepts
        store.migrate()
        before = store.position()
        pos = store.fork_timeline(
            seen.timeline if seen else 0, "store.restored",
            f"store restored from {src} by an operator (vmctld restore): the backup holds "
            f"{statedir.describe(before) if before else 'no position'}"
            + (f"; this state directory had seen {statedir.describe(seen)}" if seen else "")
            + "; a new timeline starts", "operator (vmctld restore)", time.time())
        statedir.write_highwater(cfg, pos)
        summary = _summary(store)
    except VmctlError as exc:
        raise Refused(exc) from exc
    finally:
        store.close()
    print(f"{db}: restored from {src} ({summary}); start vmctld now", flush=True)
    return 0


def accept_rollback(config_path: str) -> int:
    """``vmctld accept-rollback``: the store as it is becomes what this state directory expects (a new
    timeline, the event ``store.rollback_accepted``), while no daemon holds the lease."""
    from vmctl.daemon import statedir
    from vmctl.daemon.config import load_config

    cfg = load_config(config_path)
    store = _open_cluster_store(cfg, "nothing to accept (start vmctld: it creates the cluster)")
    location = store.location()
    try:
        statedir.refuse_damaged(cfg, store)
        try:
            seen = statedir.read_highwater(cfg)
        except statedir.StateConflict:
            seen, unreadable = None, True  # rewritten from the store below
        else:
            unreadable = False
        if seen is None and not unreadable:
            print(f"{location}: {statedir.highwater_file(cfg)} does not exist (this state directory has seen no "
                  f"store position): nothing to accept", flush=True)
            return 0
        log_seen = statedir.describe(seen) if seen else "an unreadable high-water mark"
        pos = store.position()  # None: a store older than schema 7, older than any mark
        if pos is not None and seen is not None and not pos.older_than(seen):
            print(f"{location}: the store ({statedir.describe(pos)}) is not older than what "
                  f"{statedir.highwater_file(cfg)} records ({log_seen}): nothing to accept", flush=True)
            return 0
        lost = statedir.missing(seen, pos) if seen is not None else "not known (the high-water mark was unreadable)"
        store.migrate()
        pos = store.position()
        assert pos is not None
        new = store.fork_timeline(
            seen.timeline if seen else 0, "store.rollback_accepted",
            f"an operator accepted the store as it is (vmctld accept-rollback): the state directory "
            f"{cfg.state_dir} had seen {log_seen}, the store holds {statedir.describe(pos)}; lost: {lost}",
            "operator (vmctld accept-rollback)", time.time())
        statedir.write_highwater(cfg, new)
        summary = _summary(store)
    except VmctlError as exc:
        raise Refused(exc) from exc
    finally:
        store.close()
    print(f"{location}: rollback accepted, lost: {lost}; now timeline {new.timeline} ({summary}); "
          f"start vmctld now", flush=True)
    return 0


def token_create(config_path: str, name: str, role: str, ttl: float | None, out: str | None) -> int:
    """``vmctld token create``: a token minted straight into the store (no API, no lease needed)."""
    from vmctl import auth
    from vmctl.daemon import statedir
    from vmctl.daemon.config import load_config
    from vmctl.store.base import TokenRecord

    cfg = load_config(config_path)
    if not name.strip() or len(name) > 100 or not name.isprintable():
        raise Refused(ValidationError(field="--name", problem="must be 1 to 100 printable characters"))
    if ttl is not None and not (1.0 <= ttl < 1e12):
        raise Refused(ValidationError(field="--ttl", problem=f"must be between 1 and 1e12 seconds, got {ttl}"))
    out_path = Path(out) if out else None
    if out_path is not None and (out_path.exists() or out_path.is_symlink()):
        raise Refused(statedir.StartupError(problem=f"{out_path} exists: the token is written to a new file only"))
    store = _open_cluster_store(cfg, (
        f"start vmctld once (it creates the cluster and writes an admin token to {statedir.token_file(cfg)})"))
    try:
        token = auth.new_token()
        now = time.time()
        rec = TokenRecord(hash=auth.hash_token(token), name=name, role=role, created=now,
                          expires=None if ttl is None else now + ttl)
        if out_path is not None:
            statedir.write_secret_file(out_path, token + "\n", "--out", "vmctld token create")
            try:
                store.insert_token(rec)
            except BaseException:
                out_path.unlink(missing_ok=True)
                raise
        else:
            store.insert_token(rec)
    except VmctlError as exc:
        raise Refused(exc) from exc
    finally:
        location = store.location()
        store.close()
    where = f"written to {out_path} (mode 0600)" if out_path is not None else "shown once below"
    print(f"token {name!r} (role {role}) created in {location}; {where}", file=sys.stderr, flush=True)
    if out_path is None:
        print(token, flush=True)
    return 0


def _print_error(exc: VmctlError) -> None:
    print(f"error: {exc.reference}: {exc.message}", file=sys.stderr)
    if exc.hint:
        print(f"hint: {exc.hint}", file=sys.stderr)


def use_system_malloc() -> None:
    """Serve with the C library's allocator for every Python object (``PYTHONMALLOC=malloc``): the
    process executes itself again (same pid) unless ``PYTHONMALLOC`` is set already (any value: an
    operator's choice is kept).

    Why: the interpreter's own small-object allocator keeps a 1 MiB arena as long as one object in
    it lives; after 2,000 connections closed, vmctld gave back only ~70 % of what they took (issue 23,
    ``python -m bench.api_memory``). With glibc's allocator the freed pages go back (the API trims
    the heap after many connections close, ``vmctl.api.listener.release_free_memory``): 95-99 %.
    """
    if "PYTHONMALLOC" in os.environ or not getattr(sys, "orig_argv", None):
        return
    env = {**os.environ, "PYTHONMALLOC": "malloc"}
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, env)
    except OSError as exc:  # cannot execute itself (a frozen binary): serve with the allocator it has
        logging.getLogger("vmctld").warning("could not restart with PYTHONMALLOC=malloc: %s", exc)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("--config FILE is required")
    # every file vmctld creates is private whatever umask it was started with (the unit's UMask=
    # covers only systemd starts); files holding secrets are also created 0600 explicitly
    os.umask(os.umask(0o077) | 0o077)
    try:
        if args.command == "backup":
            sys.exit(backup(args.config, args.file))
        if args.command == "restore":
            sys.exit(restore(args.config, args.file))
        if args.command == "accept-rollback":
            sys.exit(accept_rollback(args.config))
        if args.command == "token":
            sys.exit(token_create(args.config, args.name, args.role, args.ttl, args.out))
        if args.check:
            from vmctl.daemon.config import load_config

            cfg = load_config(args.config)
            print(f"{args.config}: ok (policy {cfg.policy_name}, store {cfg.store_url})")
            sys.exit(0)
        if argv is None:
            use_system_malloc()
        sys.exit(asyncio.run(serve(args.config, args.port)))
    except Refused as exc:
        _print_error(exc.error)
        sys.exit(2)
    except VmctlError as exc:
        _print_error(exc)
        sys.exit(2 if exc.http_status < 500 else 1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
