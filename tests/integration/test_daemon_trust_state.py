"""vmctld's keys and state (issue 9, items 5, 6, 7 and the start-up half of 10), on real ``vmctld``
processes (loopback HTTPS, SQLite in a temporary state directory), each stopped or killed by its pid.

- The state directory is 0700 and every file holding a secret 0600 under a umask of 022; looser modes
  left behind are fixed at start and logged.
- An emptied database or a lost WAL is refused (exit 2, the files named), ``admin.token`` untouched.
- ``vmctld backup`` while the daemon runs, ``vmctld restore`` refused while it holds the lease, then
  accepted: same jobs, same CA, the old tokens work (also into a new state directory).
- ``vmctld token create`` mints a token offline; a minimal config gets ``<state_dir>/admin.token``.
- A start that cannot succeed (port in use, unresolvable ``api.listen``, ``state_dir`` a file, a token
  path that cannot be created, a corrupt row) exits 2 naming the file and key (or table and row),
  without a traceback, and creates nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.daemon import admin_request
from vmctl.localcluster import ManagedProcess

PY = sys.executable


def mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def write_config(path: Path, state_dir: Path, **extra: Any) -> Path:
    # the token path spelled out (its default is test_minimal_config_...): these tests then show what
    # they test on a vmctld without that default as well
    cfg: dict[str, Any] = {"state_dir": str(state_dir), "api": {"listen": "127.0.0.1", "port": 0,
                                                                "bootstrap_token_file": str(state_dir / "admin.token")},
                           "loop": {"tick_s": 0.5}, "lease": {"ttl_s": 3.0}}
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(cfg.get(k), dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


class Vmctld(ManagedProcess):
    """``vmctld --config CONFIG`` started under ``umask 022`` (a login shell's default)."""

    def __init__(self, config: Path, log: Path) -> None:
        cmd = f"umask 022; exec {PY} -m vmctl.daemon.main --config {config}"
        super().__init__("vmctld", ["sh", "-c", cmd], log)
        self.config = config
        self.port = 0
        self.state_dir = Path(yaml.safe_load(config.read_text())["state_dir"])

    def start_ready(self) -> Vmctld:
        self.lines.clear()  # the ready line of an earlier run is not this run's
        self.start()
        line = self.wait_line("vmctld ready", 60)
        self.port = int(line.split("port=")[1].split()[0])
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.stop()

    def request(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        tok = token if token is not None else (self.state_dir / "admin.token").read_text().strip()
        return admin_request(self.port, str(self.state_dir / "ca.pem"), tok, method, path, body)

    def job_ids(self, token: str | None = None) -> list[str]:
        status, body = self.request("GET", "/v1/jobs?limit=1000", token=token)
        assert status == 200, body
        return sorted(j["id"] for j in body["jobs"])


def vmctld_cmd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", 'umask 022; exec "$@"', "sh", PY, "-m", "vmctl.daemon.main", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def daemon(tmp_path: Path, state: Path) -> Iterator[Vmctld]:
    d = Vmctld(write_config(tmp_path / "etc" / "vmctld.yaml", state), tmp_path / "vmctld.log")
    yield d
    d.stop()


def submit(d: Vmctld, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        status, body = d.request("POST", "/v1/jobs", {"procs": 1, "estimate": 3600})
        assert status == 201, body
        ids.append(body["job"]["id"])
    return ids


def assert_private(state: Path) -> None:
    assert mode(state) == 0o700, f"{state} is {mode(state):04o}"
    for p in sorted(state.iterdir()):
        if p.name == "ca.pem":  # the CA certificate: public, holds no key
            text = p.read_text()
            assert "PRIVATE KEY" not in text and "BEGIN CERTIFICATE" in text
            assert not mode(p) & 0o022, f"{p} is {mode(p):04o}"
            continue
        assert p.is_file(), p
        # nobody but the owner may read (the CA private key is in the database, a token in admin.token)
        assert mode(p) == 0o600, f"{p} is {mode(p):04o}"


# ------------------------------------------------------------------------------------- item 5


def test_state_dir_and_secret_files_are_private_under_umask_022(daemon: Vmctld, state: Path) -> None:
    daemon.start_ready()
    submit(daemon, 3)
    names = {p.name for p in state.iterdir()}
    assert {"vmctld.db", "vmctld.db-wal", "vmctld.db-shm", "admin.token", "ca.pem"} <= names, names
    assert_private(state)
    assert daemon.stop() == 0
    assert_private(state)


def test_loose_modes_left_behind_are_fixed_at_start_and_logged(daemon: Vmctld, state: Path) -> None:
    daemon.start_ready()
    submit(daemon, 1)
    daemon.kill9()  # keeps the -wal and -shm files
    os.chmod(state, 0o755)
    for name in ("vmctld.db", "vmctld.db-wal", "vmctld.db-shm", "admin.token"):
        os.chmod(state / name, 0o644)
    daemon.start_ready()
    assert_private(state)
    log = daemon.log_path.read_text()
    for name in ("vmctld.db", "vmctld.db-wal", "vmctld.db-shm", "admin.token"):
        assert f"{state / name} was mode 0644" in log, log
    assert f"state_dir {state} was mode 0755" in log, log


# ------------------------------------------------------------------------------------- item 6


def assert_refused_earlier_cluster(cfg: Path, state: Path, token_before: str, ca_before: str) -> None:
    r = vmctld_cmd("--config", str(cfg), timeout=30)  # a vmctld that starts a new cluster instead times out
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "error: state-conflict" in r.stderr, r.stderr
    assert str(state / "ca.pem") in r.stderr and str(state / "admin.token") in r.stderr, r.stderr
    assert "vmctld restore" in r.stderr and "remove" in r.stderr
    assert digest(state / "admin.token") == token_before  # never overwritten
    assert digest(state / "ca.pem") == ca_before


def test_emptied_database_is_refused_and_admin_token_kept(daemon: Vmctld, state: Path) -> None:
    daemon.start_ready()
    submit(daemon, 2)
    assert daemon.stop() == 0
    token, ca = digest(state / "admin.token"), digest(state / "ca.pem")
    (state / "vmctld.db").write_bytes(b"")  # truncated to 0 bytes
    assert_refused_earlier_cluster(daemon.config, state, token, ca)
    assert (state / "vmctld.db").stat().st_size == 0  # the refused start wrote nothing into it
    # a second attempt is refused the same way
    assert_refused_earlier_cluster(daemon.config, state, token, ca)


def test_deleted_database_is_refused_and_the_refused_start_removes_what_it_created(daemon: Vmctld,
                                                                                   state: Path) -> None:
    daemon.start_ready()
    assert daemon.stop() == 0
    token, ca = digest(state / "admin.token"), digest(state / "ca.pem")
    (state / "vmctld.db").unlink()
    assert_refused_earlier_cluster(daemon.config, state, token, ca)
    # the start created a database file before it could see that the store is empty: it removed it
    # (store.highwater, the store position the state directory saw, belongs to the earlier cluster too)
    assert sorted(p.name for p in state.iterdir()) == ["admin.token", "ca.pem", "store.highwater"]


def test_lost_wal_after_kill9_is_refused_and_admin_token_kept(daemon: Vmctld, state: Path) -> None:
    daemon.start_ready()
    submit(daemon, 2)
    daemon.kill9()
    wal = state / "vmctld.db-wal"
    assert wal.stat().st_size > 0  # the cluster is in the WAL, not yet in the main file
    token, ca = digest(state / "admin.token"), digest(state / "ca.pem")
    wal.unlink()  # e.g. only vmctld.db was copied
    assert_refused_earlier_cluster(daemon.config, state, token, ca)


def test_backup_while_running_then_restore_gives_the_same_cluster(tmp_path: Path, daemon: Vmctld,
                                                                  state: Path) -> None:
    daemon.start_ready()
    before = submit(daemon, 3)
    status, body = daemon.request("POST", "/v1/tokens", {"name": "reader", "role": "read"})
    assert status == 201, body
    reader = body["token"]
    admin = (state / "admin.token").read_text().strip()
    ca = digest(state / "ca.pem")

    backup = tmp_path / "backups" / "vmctld-backup.db"
    backup.parent.mkdir()
    r = vmctld_cmd("backup", str(backup), "--config", str(daemon.config))
    assert r.returncode == 0, r.stderr
    assert f"{backup}: backup of" in r.stdout and "3 jobs" in r.stdout, r.stdout
    assert mode(backup) == 0o600
    assert not Path(f"{backup}-wal").exists()  # one self-contained file
    r = vmctld_cmd("backup", str(backup), "--config", str(daemon.config))
    assert r.returncode == 2 and "never overwrites" in r.stderr, r.stderr

    after = submit(daemon, 1)  # not in the backup
    assert daemon.job_ids() == sorted(before + after)

    r = vmctld_cmd("restore", str(backup), "--config", str(daemon.config))
    assert r.returncode == 2 and "error: lease-held" in r.stderr, r.stderr  # the daemon runs
    assert "Traceback" not in r.stderr

    assert daemon.stop() == 0
    r = vmctld_cmd("restore", str(backup), "--config", str(daemon.config))
    assert r.returncode == 0, r.stderr
    daemon.start_ready()
    assert daemon.job_ids(token=admin) == sorted(before)
    assert daemon.job_ids(token=reader) == sorted(before)
    assert digest(state / "ca.pem") == ca
    assert daemon.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60}, token=admin)[0] == 201
    assert daemon.stop() == 0

    # disaster recovery: the same backup into a new, empty state directory on another machine
    state2 = tmp_path / "state2"
    cfg2 = write_config(tmp_path / "etc" / "vmctld2.yaml", state2)
    r = vmctld_cmd("restore", str(backup), "--config", str(cfg2))
    assert r.returncode == 0, r.stderr
    d2 = Vmctld(cfg2, tmp_path / "vmctld2.log")
    try:
        d2.start_ready()
        assert digest(state2 / "ca.pem") == ca  # the same CA: agent certificates stay valid
        assert not (state2 / "admin.token").exists()  # the store has admin tokens: none minted
        assert d2.job_ids(token=reader) == sorted(before)
        assert d2.request("GET", "/v1/jobs", token=admin)[0] == 200
        assert_private(state2)
    finally:
        assert d2.stop() == 0


def test_restore_refuses_a_backup_of_another_cluster(tmp_path: Path, daemon: Vmctld, state: Path) -> None:
    other = Vmctld(write_config(tmp_path / "etc" / "other.yaml", tmp_path / "other"), tmp_path / "other.log")
    other.start_ready()
    assert other.stop() == 0
    backup = tmp_path / "other-backup.db"
    assert vmctld_cmd("backup", str(backup), "--config", str(other.config)).returncode == 0
    daemon.start_ready()
    assert daemon.stop() == 0
    db = digest(state / "vmctld.db")
    r = vmctld_cmd("restore", str(backup), "--config", str(daemon.config))
    assert r.returncode == 2 and "another cluster" in r.stderr and str(state / "ca.pem") in r.stderr, r.stderr
    assert digest(state / "vmctld.db") == db


# ------------------------------------------------------------------------------------- item 7


def test_minimal_config_writes_the_admin_token_under_state_dir(tmp_path: Path, state: Path) -> None:
    cfg = tmp_path / "minimal.yaml"
    cfg.write_text(f"state_dir: {state}\napi: {{port: 0}}\n", encoding="utf-8")
    d = Vmctld(cfg, tmp_path / "vmctld.log")
    try:
        d.start_ready()
        token_file = state / "admin.token"
        assert f"wrote the bootstrap admin token to {token_file}" in d.log_path.read_text()
        assert mode(token_file) == 0o600
        assert d.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60})[0] == 201
        assert d.stop() == 0
        d.start_ready()  # a restart says where the token is and leaves it alone
        assert f"the bootstrap admin token is in {token_file}" in d.log_path.read_text()
    finally:
        d.stop()


def test_token_create_offline_mints_working_tokens(tmp_path: Path, daemon: Vmctld, state: Path) -> None:
    daemon.start_ready()
    assert daemon.stop() == 0
    out = tmp_path / "ops.token"
    r = vmctld_cmd("token", "create", "--config", str(daemon.config), "--name", "ops", "--role", "admin",
                   "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "written to" in r.stderr  # the token is only in the file
    assert mode(out) == 0o600
    daemon.start_ready()
    ops = out.read_text().strip()
    assert daemon.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60}, token=ops)[0] == 201
    # while the daemon runs: printed once on stdout
    r = vmctld_cmd("token", "create", "--config", str(daemon.config), "--name", "viewer")
    assert r.returncode == 0, r.stderr
    viewer = r.stdout.strip()
    assert viewer.startswith("vmctl_") and "shown once" in r.stderr
    assert daemon.request("GET", "/v1/jobs", token=viewer)[0] == 200
    assert daemon.request("POST", "/v1/jobs", {"procs": 1, "estimate": 60}, token=viewer)[0] == 403
    # never over an existing file
    r = vmctld_cmd("token", "create", "--config", str(daemon.config), "--name", "x", "--out", str(out))
    assert r.returncode == 2 and "exists" in r.stderr and out.read_text().strip() == ops


def test_token_create_refuses_an_unreachable_store(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    cfg = write_config(tmp_path / "c.yaml", missing)
    r = vmctld_cmd("token", "create", "--config", str(cfg), "--name", "ops", "--role", "admin")
    assert r.returncode == 2 and "no database at" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == "" and not missing.exists()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = write_config(tmp_path / "pg.yaml", tmp_path / "pgstate",
                       store={"url": f"postgresql://vmctl@127.0.0.1:{port}/vmctl"})
    r = vmctld_cmd("token", "create", "--config", str(cfg), "--name", "ops")
    assert r.returncode == 2 and "cannot connect" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


# ------------------------------------------------------------------------------------- item 10


def assert_clean_refusal(r: subprocess.CompletedProcess[str], *names: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    assert r.stderr.rstrip().splitlines()[-2 if "hint:" in r.stderr else -1].startswith("error: "), r.stderr
    for n in names:
        assert n in r.stderr, (n, r.stderr)


def test_port_in_use_is_refused_and_creates_nothing(tmp_path: Path, state: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = write_config(tmp_path / "c.yaml", state, api={"port": port})
        r = vmctld_cmd("--config", str(cfg))
    assert_clean_refusal(r, str(cfg), "api.port", str(port), "in use")
    assert not state.exists()


def test_unresolvable_listen_is_refused_and_creates_nothing(tmp_path: Path, state: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", state, api={"listen": "no-such-host.invalid"})
    r = vmctld_cmd("--config", str(cfg))
    assert_clean_refusal(r, str(cfg), "api.listen", "no-such-host.invalid")
    assert not state.exists()


def test_listen_address_not_on_this_host_is_refused(tmp_path: Path, state: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml", state, api={"listen": "192.0.2.1"})  # TEST-NET-1
    r = vmctld_cmd("--config", str(cfg))
    assert_clean_refusal(r, str(cfg), "api.listen", "192.0.2.1")
    assert not state.exists()


def test_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "state"
    f.write_text("not a directory\n")
    cfg = write_config(tmp_path / "c.yaml", f)
    r = vmctld_cmd("--config", str(cfg))
    assert_clean_refusal(r, str(cfg), "state_dir", str(f), "not a directory")
    assert f.read_text() == "not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "state"]


@pytest.mark.parametrize("case", ["under-a-file", "a-directory", "unwritable-dir"])
def test_token_path_that_cannot_be_written_is_refused(tmp_path: Path, state: Path, case: str) -> None:
    if case == "under-a-file":
        (tmp_path / "afile").write_text("x")
        token = tmp_path / "afile" / "admin.token"
    elif case == "a-directory":
        token = tmp_path / "tokendir"
        token.mkdir()
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write in any directory: the other two cases cover root")
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        token = ro / "admin.token"
    cfg = write_config(tmp_path / "c.yaml", state, api={"bootstrap_token_file": str(token)})
    r = vmctld_cmd("--config", str(cfg))
    assert_clean_refusal(r, str(cfg), "api.bootstrap_token_file", str(token))
    assert not state.exists()


def test_corrupt_row_is_refused_naming_table_and_row(daemon: Vmctld, state: Path) -> None:
    daemon.start_ready()
    ids = submit(daemon, 3)
    assert daemon.stop() == 0
    db = state / "vmctld.db"
    with sqlite3.connect(db) as c:
        c.execute("UPDATE jobs SET doc = ? WHERE id = ?", ('{"id": "2", "seq": ', ids[1]))
    c.close()
    before = {p.name: digest(p) for p in state.iterdir() if p.name != "vmctld.db"}
    r = vmctld_cmd("--config", str(daemon.config))
    assert_clean_refusal(r, str(db), "table jobs", f"id='{ids[1]}'")
    assert {p.name: digest(p) for p in state.iterdir() if p.name != "vmctld.db"} == before
    # the refused start freed the lease it took: with the row repaired, vmctld starts at once
    with sqlite3.connect(db) as c:
        c.execute("DELETE FROM jobs WHERE id = ?", (ids[1],))
    c.close()
    daemon.start_ready()
    assert daemon.job_ids() == sorted([ids[0], ids[2]])


def test_port_taken_after_the_check_is_a_config_error(tmp_path: Path) -> None:
    """The listener itself (``DaemonServer.start``) names the key when its bind fails."""
    from vmctl.api.server import DaemonServer
    from vmctl.daemon.config import load_config
    from vmctl.daemon.core import Daemon
    from vmctl.errors import ConfigError
    from vmctl.store import open_store

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = load_config(write_config(tmp_path / "c.yaml", tmp_path / "state", api={"port": port}))
        store = open_store(cfg.store_url)
        server = DaemonServer(Daemon(cfg, store))

        async def go() -> None:
            try:
                await server.start()
            finally:
                await server.stop()

        with pytest.raises(ConfigError) as exc:
            asyncio.run(go())
        store.close()
    assert exc.value.fields["where"] == "api.port" and str(port) in str(exc.value)
