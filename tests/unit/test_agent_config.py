"""Agent config, desired-state documents, the layout helpers and the vmctl-agent CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.agents import swap_tiers
from vmctl.agents.config import load_agent_config, parse_agent_config
from vmctl.agents.layout import Layout, check_naming
from vmctl.agents.main import build_agent, main
from vmctl.agents.sources import FileReporter, FileSource
from vmctl.errors import ConfigError, OutOfRange, ValidationError
from vmctl.nodedoc import MigrationSpec, NodeDesired, PowerState, ProcessSpec, VmDesired, VmRole
from vmctl.wire import desired_from_json, desired_to_json, observed_from_json, observed_to_json

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "etc" / "vmctl-agent.yaml"


def test_the_commented_example_is_valid() -> None:
    cfg = load_agent_config(EXAMPLE)
    assert cfg.node == "node1" and cfg.backend.kind == "mock"
    assert cfg.layout.cores == (0, 1) and cfg.layout.fg_weight == 10000 and cfg.layout.bg_weight == 1
    assert cfg.peers == {"node2": "mock://node2"}
    agent = build_agent(cfg)
    res = agent.reconciler.run_once()
    assert res.converged and len(agent.backend.list_vms()) == 4


def test_defaults_from_an_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "a.yaml"
    p.write_text("")
    cfg = load_agent_config(p)
    assert cfg.node  # hostname
    assert cfg.layout.cores is None and cfg.reconcile.resync_seconds == 30.0


BAD_CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown top key", {"nod": "x"}, "nod: unknown key"),
    ("unknown backend", {"backend": {"kind": "vmware"}}, "backend.kind: must be one of mock, libvirt"),
    ("libvirt needs uri", {"backend": {"kind": "libvirt"}}, "backend.uri: is required"),
    ("mock cores 0", {"backend": {"cores": 0}}, "backend.cores: must be >= 1"),
    ("cores not a list", {"layout": {"cores": 3}}, "layout.cores: must be list"),
    ("core negative", {"layout": {"cores": [0, -1]}}, "layout.cores[1]: must be a non-negative core id"),
    ("core twice", {"layout": {"cores": [1, 1]}}, "layout.cores: lists a core twice"),
    ("empty cores", {"layout": {"cores": []}}, "layout.cores: must list at least one core"),
    ("fg weight too big", {"layout": {"fg_weight": 20000}}, "layout.fg_weight: must be <= 10000"),
    ("bg weight 0", {"layout": {"bg_weight": 0}}, "layout.bg_weight: must be >= 1"),
    ("fg not above bg", {"layout": {"fg_weight": 5, "bg_weight": 5}}, "layout.fg_weight: must exceed bg_weight"),
    ("naming without tier", {"layout": {"naming": "{host}-{core}"}}, "layout.naming: must contain {core} and {tier}"),
    ("naming bad field", {"layout": {"naming": "{host}-{core}-{tier}-{zone}"}}, "layout.naming: unknown field"),
    ("naming bad chars", {"layout": {"naming": "{host} {core}/{tier}"}}, "layout.naming: gives names like"),
    ("image relative", {"layout": {"image": "disk.img"}}, "layout.image: must be an absolute path"),
    ("memory too small", {"layout": {"memory_mib": 8}}, "layout.memory_mib: must be >= 16"),
    ("resync 0", {"reconcile": {"resync_seconds": 0}}, "reconcile.resync_seconds: must be >= 0.01"),
    ("backoff inverted", {"reconcile": {"backoff_initial_seconds": 5, "backoff_max_seconds": 1}},
     "reconcile.backoff_max_seconds: must be >= backoff_initial_seconds"),
    ("peer not a string", {"peers": {"n2": 7}}, "peers.n2: must map a name"),
    ("migrate uri without peer", {"migrate_uris": {"n3": "tcp://x"}}, "migrate_uris.n3: names a node"),
    ("ssh without key", {"ssh": {"enabled": True, "known_hosts": "/k"}}, "ssh.key_file: is required"),
    ("ssh without known_hosts", {"ssh": {"enabled": True, "key_file": "/k"}}, "ssh.known_hosts: is required"),
    ("ssh port", {"ssh": {"port": 70000}}, "ssh.port: must be <= 65535"),
    ("ssh enabled not bool", {"ssh": {"enabled": "yes"}}, "ssh.enabled: must be bool"),
    ("typo in section", {"reconcile": {"resync_secs": 3}}, "reconcile.resync_secs: unknown key"),
    ("log level", {"log_level": "loud"}, "log_level: must be one of"),
    ("sftp without hosts", {"checkpoints": {"transfer": "sftp"}}, "checkpoints.hosts: must name the host"),
    ("sftp without key", {"checkpoints": {"transfer": "sftp", "hosts": {"n2": "10.0.0.2"}}},
     "ssh.key_file: is required by checkpoints.transfer: sftp"),
    ("transfer kind", {"checkpoints": {"transfer": "nfs"}}, "checkpoints.transfer: must be one of shared, sftp"),
]


@pytest.mark.parametrize(("data", "needle"), [c[1:] for c in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_configs_name_file_and_key(tmp_path: Path, data: dict[str, Any], needle: str) -> None:
    p = tmp_path / "agent.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as ei:
        load_agent_config(p)
    assert str(ei.value).startswith(f"{p}: ")
    assert needle in str(ei.value)


def test_unreadable_and_malformed_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_agent_config(tmp_path / "missing.yaml")
    p = tmp_path / "bad.yaml"
    p.write_text("layout: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line 2, column 1: not valid YAML"):
        load_agent_config(p)


def test_layout_cores_must_exist_on_the_host(tmp_path: Path) -> None:
    cfg = parse_agent_config({"node": "n", "backend": {"cores": 2}, "layout": {"cores": [0, 5]}}, "x.yaml")
    with pytest.raises(ConfigError, match=r"x.yaml: layout.cores: core 5 does not exist"):
        build_agent(cfg)


# ------------------------------------------------------------------------------------ layout


def test_layout_names_weights_and_physical_cores() -> None:
    lay = Layout("h7", (4, 6), naming="vm-{host}-{core}{tier}")
    assert lay.vm_name(1, "bg") == "vm-h7-1bg"
    assert lay.physical(1) == 6 and lay.local(6) == 1 and lay.local(5) is None
    with pytest.raises(OutOfRange, match="core = 2"):
        lay.physical(2)
    vms = lay.pair_vms()
    assert [(v.name, v.core, v.role, v.weight) for v in vms] == [
        ("vm-h7-0fg", 0, VmRole.FG, 10000), ("vm-h7-0bg", 0, VmRole.BG, 1),
        ("vm-h7-1fg", 1, VmRole.FG, 10000), ("vm-h7-1bg", 1, VmRole.BG, 1)]
    spec = lay.spec_for(vms[1])
    assert spec.metadata == {"vmctl.managed": "1", "vmctl.node": "h7", "vmctl.role": "bg", "vmctl.core": "0"}
    assert lay.is_ours("vm-h7-0fg", {}) and not lay.is_ours("other", {})


def test_layout_complete_fills_only_free_slots() -> None:
    lay = Layout("n", (0, 1))
    swapped = swap_tiers(lay.base_desired(1), 0)
    assert lay.complete(swapped) is swapped  # every slot named: nothing added
    partial = NodeDesired("n", 2, (VmDesired("job-a", 0, VmRole.FG, 10000),))
    done = lay.complete(partial)
    assert [v.name for v in done.vms] == ["job-a", "n-c0-bg", "n-c1-fg", "n-c1-bg"]


def test_layout_rejects_bad_parameters() -> None:
    with pytest.raises(ValidationError, match=r"layout\.cores"):
        Layout("n", ())
    with pytest.raises(ValidationError, match="must exceed"):
        Layout("n", (0,), fg_weight=1, bg_weight=1)
    with pytest.raises(OutOfRange):
        Layout("n", (0,), fg_weight=0)
    assert check_naming("{host}-c{core}-{tier}") is None
    assert check_naming("{core}-{tier") is not None


def test_swap_tiers_needs_a_pair() -> None:
    with pytest.raises(ValidationError, match="exactly one fg and one bg"):
        swap_tiers(NodeDesired("n", 1, ()), 0)


# ------------------------------------------------------------------------------------ documents


FULL = NodeDesired("n1", 9, (
    VmDesired("a", 0, VmRole.FG, 10000, cap=0.5, process=ProcessSpec("j", 2, "run it", 30.0, 0.25)),
    VmDesired("b", -1, VmRole.SHARED, 40, power=PowerState.SAVED, checkpoint_path="/ck/b",
              migration=MigrationSpec("m", "n1", "n2", 1, "running", "checkpoint"), memory_mib=128),
))


def test_desired_round_trip_through_yaml_and_json(tmp_path: Path) -> None:
    assert desired_from_json(desired_to_json(FULL)) == FULL
    for suffix, dump in ((".yaml", yaml.safe_dump), (".json", json.dumps)):
        p = tmp_path / f"d{suffix}"
        p.write_text(dump(desired_to_json(FULL)))
        assert FileSource(p).fetch() == FULL


BAD_DOCS: list[tuple[str, Any, str]] = [
    ("no node", {"generation": 1}, "node: is required"),
    ("bad generation", {"node": "n", "generation": -1}, "generation: must be >= 0"),
    ("vms not a list", {"node": "n", "generation": 1, "vms": {}}, "vms: must be list"),
    ("vm not a mapping", {"node": "n", "generation": 1, "vms": [3]}, "vms[0]: must be an object"),
    ("bad role", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "boss", "weight": 1}]},
     "vms[0].role: must be one of"),
    ("bad power", {"node": "n", "generation": 1,
                   "vms": [{"name": "a", "core": 0, "role": "fg", "weight": 1, "power": "crashed"}]},
     "vms[0].power: must be one of"),
    ("weight not int", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "fg", "weight": "x"}]},
     "vms[0].weight: must be int"),
    ("process usage", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "fg", "weight": 1,
                                                               "process": {"job_id": "j", "cpu_usage": 1.5}}]},
     "vms[0].process.cpu_usage: must be <= 1.0"),
    ("migration phase", {"node": "n", "generation": 1, "vms": [{
        "name": "a", "core": 0, "role": "fg", "weight": 1,
        "migration": {"migration_id": "m", "source_node": "n", "target_node": "o", "target_core": 0,
                      "phase": "flying"}}]}, "vms[0].migration.phase: must be one of"),
    ("process typo", {"node": "n", "generation": 1, "vms": [{"name": "a", "core": 0, "role": "fg", "weight": 1,
                                                              "process": {"job_id": "j", "wrk": 3}}]},
     "vms[0].process.wrk: unknown key"),
]


@pytest.mark.parametrize(("data", "needle"), [c[1:] for c in BAD_DOCS], ids=[c[0] for c in BAD_DOCS])
def test_bad_desired_documents_name_file_and_key(tmp_path: Path, data: Any, needle: str) -> None:
    p = tmp_path / "desired.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as ei:
        FileSource(p).fetch()
    assert str(ei.value).startswith(f"{p}: ") and needle in str(ei.value)


def test_file_source_missing_file_and_caching(tmp_path: Path) -> None:
    p = tmp_path / "d.yaml"
    src = FileSource(p)
    assert src.fetch() is None
    p.write_text(yaml.safe_dump(desired_to_json(FULL)))
    first = src.fetch()
    assert first == FULL and src.fetch() is first  # unchanged file: not re-parsed


def test_observed_round_trip_and_file_reporter(tmp_path: Path) -> None:
    from vmctl.nodedoc import NodeObserved, VmObserved

    vm = VmObserved("a", PowerState.RUNNING, 0, 10000, 0.5, 3.5, 0.7, "j", 1, None, "running")
    o = NodeObserved("n1", 4, 2, (vm,), 0.35, ("boom",), 12.5)
    assert observed_from_json(observed_to_json(o)) == o
    p = tmp_path / "out" / "observed.json"
    FileReporter(p).report(o)
    assert observed_from_json(json.loads(p.read_text())) == o


# ------------------------------------------------------------------------------------ CLI


def _write_cfg(tmp_path: Path, **extra: Any) -> Path:
    data = {"node": "n1", "backend": {"kind": "mock", "cores": 2}, **extra}
    p = tmp_path / "agent.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_cli_once_with_a_desired_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    desired = Layout("n1", (0, 1)).base_desired(7)
    dp = tmp_path / "desired.yaml"
    dp.write_text(yaml.safe_dump(desired_to_json(swap_tiers(desired, 1, generation=7))))
    report = tmp_path / "obs.json"
    main(["--config", str(_write_cfg(tmp_path)), "--once", "--desired", str(dp), "--report", str(report),
          "--log-level", "error"])
    out = json.loads(capsys.readouterr().out)
    assert out["generation_applied"] == 7
    weights = {v["name"]: v["weight"] for v in out["vms"]}
    assert weights == {"n1-c0-fg": 10000, "n1-c0-bg": 1, "n1-c1-fg": 1, "n1-c1-bg": 10000}
    assert json.loads(report.read_text()) == out


def test_cli_bad_desired_state_exits_7_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dp = tmp_path / "desired.yaml"
    dp.write_text(yaml.safe_dump({"node": "n1", "generation": 2,
                                  "vms": [{"name": "n1-c0-fg", "core": 9, "role": "fg", "weight": 10000}]}))
    with pytest.raises(SystemExit) as ei:
        main(["--config", str(_write_cfg(tmp_path)), "--once", "--desired", str(dp), "--log-level", "error"])
    assert ei.value.code == 7
    err = capsys.readouterr().err
    assert "validation-failed" in err and "vms[0](n1-c0-fg).core: 9 out of range 0..1" in err


def test_cli_bad_config_is_exit_2_without_traceback(tmp_path: Path) -> None:
    p = _write_cfg(tmp_path, layout={"fg_weight": 0})
    proc = subprocess.run([sys.executable, "-m", "vmctl.agents.main", "--config", str(p), "--once"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"error: config-invalid: {p}: layout.fg_weight: must be >= 1")
    assert "Traceback" not in proc.stderr


def test_cli_libvirt_backend_missing_is_exit_6(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # as if not installed: both the package and the module the agent imports (an earlier test may have
    # imported the real one; then only the package entry would not stop the import, and the agent would
    # talk to a libvirtd that happens to run)
    monkeypatch.setitem(sys.modules, "vmctl.agents.backends.libvirt", None)
    monkeypatch.setitem(sys.modules, "vmctl.agents.backends.libvirt.backend", None)
    p = _write_cfg(tmp_path, backend={"kind": "libvirt", "uri": "qemu:///system"})
    with pytest.raises(SystemExit) as ei:
        main(["--config", str(p), "--once", "--log-level", "error"])
    assert ei.value.code == 6
    assert "error: hypervisor-unavailable: libvirt: cannot reach qemu:///system" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ daemon mode

DAEMON = {"url": "https://127.0.0.1:8443", "cert_file": "/c.pem", "key_file": "/k.pem", "ca_file": "/ca.pem"}

BAD_DAEMON: list[tuple[str, dict[str, Any], str]] = [
    ("plain http", {"daemon": {**DAEMON, "url": "http://x:1"}}, "daemon.url: must be an https:// URL"),
    ("no cert", {"daemon": {k: v for k, v in DAEMON.items() if k != "cert_file"}}, "daemon.cert_file: is required"),
    ("two sources", {"daemon": DAEMON, "desired": {"file": "/d.yaml"}}, "desired.file: cannot be used together"),
    ("daemon typo", {"daemon": {**DAEMON, "wait": 3}}, "daemon.wait: unknown key"),
    ("metrics listen", {"metrics": {"listen": "9100"}}, "metrics.listen: must be HOST:PORT"),
]


@pytest.mark.parametrize(("data", "needle"), [c[1:] for c in BAD_DAEMON], ids=[c[0] for c in BAD_DAEMON])
def test_bad_daemon_sections(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as ei:
        parse_agent_config(data, "a.yaml")
    assert str(ei.value).startswith("a.yaml: ") and needle in str(ei.value)


def test_daemon_section_parses_and_missing_tls_files_are_named() -> None:
    cfg = parse_agent_config({"node": "n1", "daemon": DAEMON, "metrics": {"listen": "127.0.0.1:9100"}}, "a.yaml")
    assert cfg.daemon is not None and cfg.daemon.url == "https://127.0.0.1:8443" and cfg.daemon.wait_seconds == 30
    assert cfg.metrics_listen == "127.0.0.1:9100"
    with pytest.raises(ConfigError, match=r"a.yaml: daemon\.cert_file: /c.pem does not exist"):
        build_agent(cfg)
    # the --desired seam wins over the daemon (no TLS files needed then)
    assert build_agent(cfg, desired="/nonexistent.yaml").http_source is None


def test_serve_reconciles_exposes_metrics_and_notifies_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket as sk
    import threading
    import time
    import urllib.request

    from vmctl.agents.main import serve

    notify = sk.socket(sk.AF_UNIX, sk.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(30)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    with sk.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = parse_agent_config({"node": "n1", "backend": {"cores": 2}, "metrics": {"listen": f"127.0.0.1:{port}"},
                              "reconcile": {"resync_seconds": 0.05}}, "a.yaml")
    agent = build_agent(cfg)
    stop = threading.Event()
    th = threading.Thread(target=serve, args=(agent, stop), daemon=True)
    th.start()
    try:
        msg = notify.recv(4096).decode()
        assert "READY=1" in msg and "node n1: 2 cores" in msg
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            if 'vmctl_agent_actions_total{action="start",outcome="applied"} 4.0' in text:
                break
            time.sleep(0.05)
        assert 'vmctl_agent_actions_total{action="start",outcome="applied"} 4.0' in text
        assert "vmctl_agent_hypervisor_up 1.0" in text
    finally:
        stop.set()
        agent.reconciler.wake()
        th.join(timeout=10)
        notify.close()
    assert not th.is_alive()


@pytest.mark.parametrize("which", ["ca_file", "cert_file"])
def test_an_empty_tls_file_is_a_named_config_error(tmp_path: Path, which: str) -> None:
    """A CA or certificate file that exists but holds no certificate (it was once read while a harness
    rewrote it) is a config error naming the key and the file, before any thread starts: no traceback."""
    from vmctl.auth import ClusterCA

    ca = ClusterCA.create("test-ca")
    cert, key = ca.issue("n1")
    files = {"ca_file": ca.cert_pem, "cert_file": cert, "key_file": key}
    files[which] = ""  # empty, as a reader saw a file being rewritten in place
    tls = {}
    for k, text in files.items():
        (tmp_path / k).write_text(text)
        tls[k] = str(tmp_path / k)
    p = _write_cfg(tmp_path, daemon={"url": "https://127.0.0.1:9", **tls})
    proc = subprocess.run([sys.executable, "-m", "vmctl.agents.main", "--config", str(p)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: config-invalid: {p}: daemon.{which}"), proc.stderr
    assert str(tmp_path / which) in proc.stderr and "Traceback" not in proc.stderr


def test_cert_files_are_replaced_atomically(tmp_path: Path) -> None:
    """``write_cert_files`` (the ``vmctl cert`` CLI, the testbeds) replaces each file by a rename: a reader
    holding the old ca.crt open keeps reading the old content, the new one is complete, and the key is 0600."""
    import os
    import stat

    from vmctl.files import write_cert_files

    doc = {"cert_pem": "CERT1\n", "key_pem": "KEY1\n", "ca_pem": "CA1\n"}
    write_cert_files(tmp_path, "n1", doc)
    with open(tmp_path / "ca.crt") as old:
        write_cert_files(tmp_path, "n2", {**doc, "ca_pem": "CA2\n"})
        assert old.read() == "CA1\n"  # the old inode, untouched (an in-place rewrite would show "" or "CA2")
    assert (tmp_path / "ca.crt").read_text() == "CA2\n"
    assert stat.S_IMODE(os.stat(tmp_path / "n2.key").st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "n1.crt", "n1.key", "n2.crt", "n2.key"]
