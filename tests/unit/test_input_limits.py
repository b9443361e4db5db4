"""Bounds on what clients and config files can feed vmctld (issue 9 items 8-10): the one JSON body
reader, strict JSON out, the CLI's rendering of stored bad strings, finite numbers in every config,
the open-file limit and the log flood filter. The live API is tested in
tests/integration/test_api_bad_input.py, test_api_fuzz.py and test_api_connections.py."""

from __future__ import annotations

import json
import logging
import math
import resource
from typing import Any

import pytest

from tests.livedaemon import run_cli
from vmctl.api import schemas
from vmctl.api.listener import FD_RESERVE, fd_budget
from vmctl.api.plumbing import json_dumps
from vmctl.cli.render import Grid, json_safe, kv_table, safe_text
from vmctl.config import Section
from vmctl.daemon import limits
from vmctl.errors import ConfigError, ValidationError

# ------------------------------------------------------------------------------ the body reader


@pytest.mark.parametrize(("raw", "field", "words"), [
    (b'{"procs":1,"estimate":1' + b"0" * 400 + b"}", "estimate", "out of range"),
    (b'{"procs":' + b"9" * 5000 + b"}", "procs", "5000 characters"),
    (b'{"a":9223372036854775808}', "a", "out of range"),
    (b'{"a":-9223372036854775808}', "a", "out of range"),
    (b'{"a":1e400}', "a", "too large for a 64-bit float"),
    (b'{"a":[1,NaN]}', "a[1]", "NaN is not a JSON number"),
    (b'[Infinity]', "body[0]", "Infinity"),
    (b"-Infinity", "body", "Infinity"),
    (b"[" * 100_000 + b"]" * 100_000, "body", "nested deeper than 32"),
    (b'{"a":' * 33 + b"1" + b"}" * 33, "body", "nested deeper than 32"),
    (b'{"name":"\\ud800"}', "name", "lone UTF-16 surrogate"),
    (b'{"jobs":[{},{"tasks":[{"command":"x\\udfff"}]}]}', "jobs[1].tasks[0].command", "surrogate"),
    (b'{"\\udc00":1}', "\\udc00", "field name"),
    (b'"\\udc00\\ud800"', "body", "surrogate"),
    (b"", "body", "empty"),
    (b"\xff\xfe{}", "body", "not UTF-8"),
    (b'{"a":1', "body", "not valid JSON"),
])
def test_the_reader_refuses_what_no_handler_can_take(raw: bytes, field: str, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        schemas.parse_body(raw)
    assert err.value.fields["field"] == field
    assert words in err.value.message


@pytest.mark.parametrize(("raw", "value"), [
    (b'{"a":9223372036854775807,"b":-9223372036854775807}', {"a": 2**63 - 1, "b": -(2**63 - 1)}),
    (b'{"a":1e308,"b":5e-324,"c":1e-400,"d":-0.0}', {"a": 1e308, "b": 5e-324, "c": 0.0, "d": -0.0}),
    (b'{"a":"\\ud83d\\ude00","b":"\\\\ud800","c":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}',
     {"a": "\U0001f600", "b": "\\ud800", "c": "[" * 38}),
    (b"[" * 32 + b"]" * 32, json.loads("[" * 32 + "]" * 32)),
    (b'{"a":"\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}', {"a": '"' + "[" * 40}),
])
def test_the_reader_takes_what_is_fine(raw: bytes, value: Any) -> None:
    assert schemas.parse_body(raw) == value


def test_names_are_printable_and_strings_hold_no_nul() -> None:
    for bad in ("", "a\nb", "\x1b[2J", "a\u200bb", "\x00"):
        with pytest.raises(ValidationError):
            schemas.job_spec({"procs": 1, "estimate": 1, "name": bad})
    for bad_cmd in ("a\x00b", "\ud800"):
        with pytest.raises(ValidationError) as err:
            schemas.job_spec({"procs": 1, "estimate": 1, "command": bad_cmd})
        assert err.value.fields["field"] == "command"
    spec = schemas.job_spec({"procs": 1, "estimate": 1, "name": "[/x] é 名前", "command": "echo a\n\techo b"})
    assert spec["name"] == "[/x] é 名前"
    for key, value in (("estimate", 1e11), ("deadline", 1e13), ("work_seconds", 1e300)):
        with pytest.raises(ValidationError) as err:
            schemas.job_spec({"procs": 1, "estimate": 1, key: value})
        assert err.value.fields["field"] == key
    with pytest.raises(ValidationError):  # a number beyond a float given as a Python int
        schemas.number({"x": 10**400}, "x", "")


def test_answers_are_strict_json() -> None:
    with pytest.raises(ValueError):
        json_dumps({"speed": math.nan})
    with pytest.raises(ValueError):
        json_dumps([math.inf])
    out = json_dumps({"name": "\ud800x", "ok": "é\U0001f600"})
    assert json.loads(out.decode("utf-8")) == {"name": "\ufffdx", "ok": "é\U0001f600"}


# ------------------------------------------------------------------------------ the CLI's rendering


def test_the_cli_renders_stored_bad_strings() -> None:
    assert safe_text("[/x] ok é") == "[/x] ok é"
    assert safe_text("a\x1b[2J\ud800\u200b\n") == "a\\x1b[2J\\ud800\\u200b\\n"
    doc = json_safe({"jobs": [{"name": "\ud800", "estimate": math.nan, "\udfff": [math.inf, 1.5]}]})
    assert json.dumps(doc, allow_nan=False).encode("utf-8")
    assert doc == {"jobs": [{"name": "\ufffd", "estimate": None, "\ufffd": [None, 1.5]}]}
    grid = Grid(("NAME",), [("[/x]\x1b\ud800",)])
    assert grid.to_text().splitlines()[1] == "[/x]\\x1b\\ud800"
    from rich.console import Console

    console = Console(width=80, record=True, color_system=None)
    console.print(grid.to_rich())  # "[/x]" is no markup: rich raised MarkupError before
    console.print(kv_table({"name": "[bold]\ud800"}))
    text = console.export_text()
    assert "[/x]\\x1b\\ud800" in text and "[bold]\\ud800" in text


# ------------------------------------------------------------------------------ configs


def _number_keys(parse: Any, data: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key a config parser reads as a number (``Section.number``), as a dotted path."""
    seen: list[str] = []
    real = Section.number

    def spy(self: Section, key: str, *args: Any, **kwargs: Any) -> float:
        seen.append(self._where(key))
        return real(self, key, *args, **kwargs)

    monkeypatch.setattr(Section, "number", spy)
    parse(data)
    monkeypatch.setattr(Section, "number", real)
    return list(dict.fromkeys(seen))


def _set(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(data))
    cur = out
    *parents, last = dotted.split(".")
    for p in parents:
        cur = cur.setdefault(p, {})
    cur[last] = value
    return out


DAEMON_BASE: dict[str, Any] = {"state_dir": "/tmp/vmctl-test-never-created", "clock": {"epoch": 0.0}}
AGENT_BASE: dict[str, Any] = {
    "node": "n1", "clock": {"epoch": 0.0},
    "daemon": {"url": "https://127.0.0.1:1", "cert_file": "/c", "key_file": "/k", "ca_file": "/ca"},
}


def _parse_daemon(data: dict[str, Any]) -> Any:
    from vmctl.daemon.config import config_from_dict

    return config_from_dict(data, "vmctld.yaml")


def _parse_agent(data: dict[str, Any]) -> Any:
    from vmctl.agents.config import parse_agent_config

    return parse_agent_config(data, "agent.yaml")


@pytest.mark.parametrize(("parse", "base", "fname", "minimum"), [
    (_parse_daemon, DAEMON_BASE, "vmctld.yaml", 12),
    (_parse_agent, AGENT_BASE, "agent.yaml", 10),
])
def test_every_float_in_the_configs_must_be_finite(parse: Any, base: dict[str, Any], fname: str, minimum: int,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    keys = _number_keys(parse, base, monkeypatch)
    assert len(keys) >= minimum and "clock.speed" in keys, keys
    for key in keys:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ConfigError) as err:
                parse(_set(base, key, bad))
            assert err.value.message.startswith(f"{fname}: {key}: must be a finite number"), err.value.message
        with pytest.raises(ConfigError) as err:
            parse(_set(base, key, 10**30))  # in no range, and beyond 64 bits
        assert err.value.message.startswith(f"{fname}: {key}: "), err.value.message


def test_policy_params_and_huge_integers_in_the_daemon_config() -> None:
    with pytest.raises(ConfigError) as err:
        _parse_daemon({**DAEMON_BASE, "policy": {"name": "easy", "params": {"x": [1, math.nan]}}})
    assert err.value.message.startswith("vmctld.yaml: policy.params.x[1]: must be a finite number")
    with pytest.raises(ConfigError) as err:
        _parse_daemon({**DAEMON_BASE, "api": {"max_body_bytes": 10**400}})
    assert "api.max_body_bytes" in err.value.message and "out of range" in err.value.message


@pytest.mark.parametrize(("text", "where"), [
    ("state_dir: /tmp/vmctl-never\nclock:\n  speed: .nan\n", "clock.speed"),
    ("state_dir: /tmp/vmctl-never\nloop:\n  estimate_grace_s: .inf\n", "loop.estimate_grace_s"),
    ("node: n1\nreconcile:\n  resync_seconds: .nan\n", "reconcile.resync_seconds"),
    ("node: n1\nbackend:\n  poll_seconds: -.inf\n", "backend.poll_seconds"),
    ("node: n1\nbackend:\n  memory_mib: " + "9" * 5000 + "\n", "document"),
])
def test_config_check_names_the_file_and_key(tmp_path: Any, capsys: pytest.CaptureFixture[str], text: str,
                                             where: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    code, out, err = run_cli(capsys, "config", "check", str(f))
    assert code == 2, (out, err)
    assert f"error: config-invalid: {f}: {where}: " in err


# ------------------------------------------------------------------------------ limits and logging


def test_connection_budget_follows_the_open_file_limit() -> None:
    assert fd_budget(4096, 1024) == 1024 - FD_RESERVE
    assert fd_budget(100, 1 << 20) == 100
    assert fd_budget(4096, 20) == 16
    assert fd_budget(4096, resource.RLIM_INFINITY) == 4096


def test_raise_nofile_limit_raises_the_soft_limit_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lower = min(soft, 256)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lower, hard))
    try:
        got = limits.raise_nofile_limit()
        assert got == (hard, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_repeated_errors_are_logged_once_per_interval_with_a_count() -> None:
    clock = _Clock()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    handler.addFilter(limits.RepeatFilter(interval=30.0, burst=5, clock=clock))
    log = logging.getLogger("vmctld.test-repeat")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        for _ in range(1000):
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                log.exception("accept() failed: %s", "Too many open files")
        for i in range(100):  # one kind, many details: at most `burst` of them
            log.warning("node %s lost", f"n{i}")
        log.error("another problem")
        for i in range(3):
            log.info("info line %d", i)  # never limited
        assert [r.getMessage() for r in records] == [
            "accept() failed: Too many open files", *(f"node n{i} lost" for i in range(5)), "another problem",
            "info line 0", "info line 1", "info line 2"]
        del records[:]
        clock.t += 29.0
        log.error("accept() failed: %s", "Too many open files", exc_info=OSError(24, "Too many open files"))
        assert records == []
        clock.t += 2.0
        log.error("accept() failed: %s", "Too many open files", exc_info=OSError(24, "Too many open files"))
        log.warning("node %s lost", "n7")
        assert [r.getMessage() for r in records] == [
            "accept() failed: Too many open files [1000 more like this in the last 31 s were not logged]",
            "node n7 lost [95 more like this in the last 31 s were not logged]"]
    finally:
        log.removeHandler(handler)
