"""The commented example etc/vmctld.yaml is valid, states the defaults, and bad files name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vmctl.daemon.config import DaemonConfig, load_config, parse_config
from vmctl.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "etc" / "vmctld.yaml"


def test_example_config_loads_and_matches_the_defaults() -> None:
    cfg = load_config(EXAMPLE)
    d = DaemonConfig()
    assert cfg.store_url == "sqlite:////var/lib/vmctl/vmctld.db"
    assert (cfg.port, cfg.listen, cfg.max_body_bytes) == (d.port, d.listen, d.max_body_bytes)
    assert (cfg.policy_name, cfg.tick_s, cfg.node_timeout_s, cfg.lease_ttl_s) == ("measy", d.tick_s,
                                                                                  d.node_timeout_s, d.lease_ttl_s)
    assert (cfg.fg_weight, cfg.bg_weight, cfg.min_interval_s) == (d.fg_weight, d.bg_weight, d.min_interval_s)
    assert cfg.migration == d.migration


def test_every_key_of_the_example_is_known() -> None:
    # the loader rejects unknown keys, so a typo in the example would fail the test above; here we
    # check the reverse: a mistyped key in a copy of the example is reported with its path
    text = EXAMPLE.read_text().replace("max_per_host:", "max_per_hots:")
    with pytest.raises(ConfigError, match=r"migration\.max_per_hots: unknown key"):
        parse_config(text, "copy.yaml")


@pytest.mark.parametrize(("text", "where"), [
    ("api: {port: 70000}", "api.port"),
    ("store: {url: 'mysql://x'}", "store.url"),
    ("vm: {fg_weight: 5, bg_weight: 10}", "vm.bg_weight"),
    ("loop: {tick_s: 0}", "loop.tick_s"),
    ("policy: {kind: magic}", "policy.kind"),
    ("policy: {name: easy, params: {nosuch: 1}}", "policy"),
    ("lease: [1, 2]", "lease"),
])
def test_bad_values_name_the_key(text: str, where: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "bad.yaml")
    assert f"bad.yaml: {where}" in str(exc.value)


def test_vmctld_check_cli(tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "vmctl.daemon.main", "--config", str(EXAMPLE), "--check"],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "ok" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("api: {port: -1}\n")
    r = subprocess.run([sys.executable, "-m", "vmctl.daemon.main", "--config", str(bad), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "config-invalid" in r.stderr and "api.port" in r.stderr
    assert "Traceback" not in r.stderr


def test_clock_section_accelerates_the_daemon() -> None:
    from vmctl.clock import ScaledClock, SystemClock, accelerated_clock
    from vmctl.daemon.config import parse_config

    cfg = parse_config("clock: {speed: 50, epoch: 1000}\n")
    assert (cfg.clock_speed, cfg.clock_epoch) == (50.0, 1000.0)
    assert parse_config("{}").clock_speed == 1.0 and parse_config("{}").clock_epoch is None
    with pytest.raises(ConfigError, match=r"clock\.speed"):
        parse_config("clock: {speed: 0}\n")
    with pytest.raises(ConfigError, match=r"clock\.tempo"):
        parse_config("clock: {tempo: 3}\n")
    assert isinstance(accelerated_clock(1.0), SystemClock)
    import time

    epoch = time.time() - 10
    a, b = accelerated_clock(50.0, epoch), accelerated_clock(50.0, epoch)
    assert isinstance(a, ScaledClock)
    # two processes with the same epoch agree: both read epoch + 50 x (real time since the epoch), e.g.
    # 500 model seconds 10 real seconds after it. Bounds, not a tolerance (a loaded machine may pause the
    # test between any two lines): a reading lies between the model times of the instants before and after
    # it (the clock takes the wall and the monotonic time of one instant, so no pause while it was set up
    # shifts it; 10 ms of slack = 0.2 ms of wall/monotonic disagreement)
    for clock in (a, b):
        before = time.time()
        now = clock.now()
        after = time.time()
        assert epoch + (before - epoch) * 50 - 1e-2 <= now <= epoch + (after - epoch) * 50 + 1e-2
        assert now >= before + 490 - 1e-2


def test_daemon_watchdog_health() -> None:
    from vmctl.daemon.main import daemon_healthy, watchdog_limit

    limit = watchdog_limit(0.5)
    assert daemon_healthy(100.0, limit, now=100.0 + limit - 0.1)
    assert not daemon_healthy(100.0, limit, now=100.0 + limit + 0.1)
