"""``vmctl config check``: offline validation of daemon and agent configs, located errors, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.livedaemon import run_cli

ROOT = Path(__file__).resolve().parents[2]


run = run_cli


def test_valid_daemon_and_agent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "vmctld.yaml"
    d.write_text("store: {url: 'sqlite:///tmp/x.db'}\napi: {port: 8080}\npolicy: {name: easy}\n")
    a = tmp_path / "agent.yaml"
    a.write_text("node: n7\nbackend: {kind: mock, cores: 4}\n")
    code, out, _ = run(capsys, "config", "check", str(d), str(a))
    assert code == 0
    assert f"{d}: ok (daemon config: store sqlite:///tmp/x.db, API 127.0.0.1:8080, policy easy" in out
    assert f"{a}: ok (agent config: node n7, backend mock)" in out
    code, out, _ = run(capsys, "config", "check", "-o", "json", str(a))
    doc = json.loads(out)
    assert doc[0]["kind"] == "agent" and doc[0]["config"]["backend"]["cores"] == 4


@pytest.mark.parametrize(
    ("text", "kind", "expect"),
    [
        ("api: {port: 99999}\n", "auto", "api.port: must be <= 65535, got 99999"),
        ("store: {url: 'mysql://x'}\n", "auto", "store.url: unsupported store"),
        ("policy: {name: easy, params: {bogus: 1}}\n", "auto", "policy"),
        ("loop: {tick_s: 1}\nlease: {ttl: 3}\n", "auto", "lease.ttl: unknown key"),
        ("node: n1\nbackend: {kind: xen}\n", "auto", "backend.kind: must be one of mock, libvirt"),
        ("node: n1\nbackend: {kind: libvirt}\n", "auto", "backend.uri: is required"),
        ("colour: blue\n", "auto", "pass --kind daemon or --kind agent"),
        ("colour: blue\n", "daemon", "colour: unknown key"),
        ("api: [1, 2\n", "auto", "not valid YAML"),
    ],
)
def test_invalid_configs_are_located(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, kind: str,
                                     expect: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    code, _, err = run(capsys, "config", "check", "--kind", kind, str(f))
    assert code == 2, err
    assert err.startswith(f"error: config-invalid: {f}: ")
    assert expect in err
    assert "Traceback" not in err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "config", "check", str(tmp_path / "nope.yaml"))
    assert code == 2 and "does not exist" in err


EXAMPLES = sorted({*(ROOT / "etc").glob("vmctld*.yaml"), *(ROOT / "etc").glob("*agent*.yaml")})


@pytest.mark.parametrize("path", EXAMPLES or [None], ids=lambda p: p.name if p else "none")
def test_shipped_examples_pass(path: Path | None, capsys: pytest.CaptureFixture[str]) -> None:
    if path is None:
        pytest.skip("no example configs in etc/ yet")
    code, _, err = run(capsys, "config", "check", str(path))
    assert code == 0, err


def test_every_problem_is_reported_not_only_the_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "vmctld.yaml"
    d.write_text("api: {port: 99999, colour: blue}\nloop: {tick_s: -1}\nlease: {ttl: 3}\npolicy: {name: easy}\n")
    ok = tmp_path / "agent.yaml"
    ok.write_text("node: n7\nbackend: {kind: mock, cores: 4}\n")
    code, out, err = run(capsys, "config", "check", str(d), str(ok))
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 4, err
    for want in ("api.port: must be <= 65535", "api.colour: unknown key", "loop.tick_s", "lease.ttl: unknown key"):
        assert sum(want in line for line in lines) == 1, (want, err)
    assert all(line.startswith(f"error: config-invalid: {d}: ") for line in lines)
    assert f"{ok}: ok" in out  # the other file is still checked
