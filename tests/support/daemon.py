"""Helpers to run a real vmctld in tests and benchmarks (loopback only).

- ``InProcessDaemon``: the full ``DaemonServer`` (TLS API + decision loop) in a background thread
  with its own event loop; gives the URL, an admin token, the CA file and agent certificates.
- ``PostgresServer``: a throw-away PostgreSQL cluster (``initdb`` + ``pg_ctl`` from
  /usr/lib/postgresql/*/bin) in a temporary directory, run as the unprivileged ``postgres`` user
  when started as root, listening on a Unix socket in that directory and on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import http.client
import json
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from vmctl.daemon.config import DaemonConfig


def admin_request(port: int, ca_file: str, token: str, method: str, path: str, body: Any = None,
                  timeout: float = 20) -> tuple[int, Any]:
    """One HTTPS request to a vmctld on loopback with a bearer token, on a fresh connection that is
    closed after: (status, the JSON answer or None)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None
    finally:
        conn.close()


class InProcessDaemon:
    def __init__(self, config: DaemonConfig, store: Any = None, policy: Any = None, clock: Any = None) -> None:
        from vmctl.store import open_store

        self.config = replace(config, port=0, listen="127.0.0.1", bootstrap_token_file=str(
            Path(config.state_dir) / "admin.token"))
        self.store = store if store is not None else open_store(self.config.store_url)
        self._policy = policy
        self._clock = clock
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.server: Any = None

    def __enter__(self) -> InProcessDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="vmctld-test", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("in-process vmctld did not start within 30 s")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        from vmctl.api.server import DaemonServer
        from vmctl.daemon.core import Daemon

        loop = asyncio.new_event_loop()
        self.loop = loop
        try:
            daemon = Daemon(self.config, self.store, clock=self._clock, policy=self._policy)
            self.server = DaemonServer(daemon)
            loop.run_until_complete(self.server.start())
        except BaseException as exc:  # reported to start()
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self.server.stop())
        # A TLS connection a client keeps open (an agent's keep-alive) is closed by the shutdown with a
        # close_notify, and its socket only once the client answers, which a test's client may never
        # do before the loop closes: abort what is left, so that no socket outlives the loop. (vmctld
        # itself exits its process right after.) ``_transports`` is the selector loop's own registry.
        for transport in list(getattr(loop, "_transports", {}).values()):
            if transport is not None and not transport.is_closing():
                transport.abort()
        # then what asyncio.run does before closing: run the close callbacks (they close the sockets)
        # and stop the worker threads of asyncio.to_thread
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the daemon's loop thread and return its result."""
        assert self.loop is not None

        async def _run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(_run(), self.loop).result(30)

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(30)
        self.store.close()

    @property
    def daemon(self) -> Any:
        return self.server.daemon

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    @property
    def admin_token(self) -> str:
        return (Path(self.config.state_dir) / "admin.token").read_text().strip()

    @property
    def ca_file(self) -> str:
        return str(Path(self.config.state_dir) / "ca.pem")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 20) -> tuple[int, Any]:
        """One HTTPS request as the admin: (status, JSON or None)."""
        return admin_request(self.server.port, self.ca_file, self.admin_token, method, path, body, timeout)

    def agent_cert(self, node: str, directory: Path) -> tuple[str, str]:
        """Issue a client certificate for ``node`` and register it (vmctld accepts no other); returns
        (cert file, key file)."""
        ca = self.server.ca
        cert, key = ca.issue(f"node:{node}")
        self.call(self.server.certs.issued, node, cert, "vmctld", ca.fingerprint())
        directory.mkdir(parents=True, exist_ok=True)
        c, k = directory / f"{node}.crt", directory / f"{node}.key"
        c.write_text(cert)
        k.write_text(key)
        os.chmod(k, 0o600)
        return str(c), str(k)


def find_pg_bin() -> Path | None:
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(cand) / "initdb").exists() and (Path(cand) / "pg_ctl").exists():
            return Path(cand)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """``start()`` returns a DSN; ``stop()`` stops the cluster (``pg_ctl stop -m immediate``)."""

    def __init__(self, directory: Path | None = None) -> None:
        # the postgres user must reach the directory: pytest's tmp dirs sit under a 0700 parent, so
        # the cluster lives in its own directory under /tmp (removed by stop())
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="vmctl-pg-", dir="/tmp"))
        self._given = directory
        self.bin = find_pg_bin()
        self.port = _free_port()
        self.user: str | None = None
        self.started = False

    def unavailable(self) -> str | None:
        if self.bin is None:
            return "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin (apt-get install postgresql)"
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                return "running as root but there is no 'postgres' user to run the server as"
        return None

    def _run(self, args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        cmd = args
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> str:
        problem = self.unavailable()
        if problem:
            raise RuntimeError(problem)
        assert self.bin is not None
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.dir / "data"
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.user = "postgres"
        else:
            self.user = pwd.getpwuid(os.geteuid()).pw_name
        r = self._run([str(self.bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "vmctl", "--no-sync",
                       "-E", "UTF8"])
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed: {r.stderr.strip()[-500:]}")
        opts = f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.dir} " \
               "-c fsync=off -c full_page_writes=off -c synchronous_commit=off"
        r = self._run([str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"), "-o", opts, "-w",
                       "-t", "60", "start"])
        if r.returncode != 0:
            log = (self.dir / "log").read_text()[-800:] if (self.dir / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()[-300:]} {log}")
        self.started = True
        return self.dsn("postgres")

    def dsn(self, db: str) -> str:
        return f"postgresql://vmctl@127.0.0.1:{self.port}/{db}"

    def create_db(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn("postgres"), autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        if self.started and self.bin is not None:
            self._run([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop"])
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def cli_daemon(tmp: Path, monkeypatch: Any, holder: str, **extra: Any) -> Iterator[InProcessDaemon]:
    """An in-process vmctld running EASY (or ``policy_name``) on SQLite in ``tmp``, with ``VMCTL_URL``/``VMCTL_TOKEN``/
    ``VMCTL_CA`` set (``monkeypatch``) so that ``vmctl`` commands reach it."""
    extra = {"policy_name": "easy", **extra}  # EASY unless the test names another policy
    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp / "state"), tick_s=0.2,
                       holder=holder, policy_explicit=True, **extra)
    with InProcessDaemon(cfg) as d:
        monkeypatch.setenv("VMCTL_URL", d.url)
        monkeypatch.setenv("VMCTL_TOKEN", d.admin_token)
        monkeypatch.setenv("VMCTL_CA", d.ca_file)
        yield d


def queued_daemon(tmp: Path, clock: Any, holder: str) -> Any:
    """A started ``Daemon`` (no HTTP) with FCFS, a virtual clock and no node: submitted jobs stay queued."""
    from vmctl.daemon.core import Daemon
    from vmctl.policies.easy_family import FcfsPolicy
    from vmctl.store import open_store

    cfg = DaemonConfig(store_url=f"sqlite:///{tmp}/d.db", state_dir=str(tmp), tick_s=5.0, holder=holder,
                       checkpoint_dir=str(tmp / "ckpt"))
    d = Daemon(cfg, open_store(cfg.store_url), clock=clock, policy=FcfsPolicy())
    assert d.start()
    return d


def wait_for(cond: Any, what: str, limit: float = 30.0) -> None:
    """Poll ``cond()`` every 50 ms until it is true; fail naming ``what`` after ``limit`` seconds."""
    import time

    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
