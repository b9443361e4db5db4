"""``vmctl config check FILE...``: validate daemon and agent configs offline (no daemon needed).

The kind is detected from the top-level keys (``store``/``api``/``policy``/``loop``/``lease`` mean a
daemon config, ``node``/``backend``/``layout``/``reconcile``/``peers``/``ssh`` an agent config) or given
with ``--kind``. Every problem is reported as ``error: config-invalid: FILE: key.path: problem`` (exit
2) by the very parser the daemon or agent uses at start-up, so a file that passes here starts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from vmctl import errors
from vmctl.config import load_yaml

DAEMON_KEYS = frozenset({"store", "api", "policy", "loop", "lease", "vm", "migration", "state_dir"})
AGENT_KEYS = frozenset({"node", "backend", "layout", "reconcile", "peers", "migrate_uris", "ssh", "desired",
                        "report", "daemon", "metrics"})


def detect_kind(path: str, data: dict[str, Any]) -> str:
    keys = set(data)
    d, a = len(keys & DAEMON_KEYS), len(keys & AGENT_KEYS)
    if d > a:
        return "daemon"
    if a > d:
        return "agent"
    raise errors.ConfigError(
        path=path, where="top level",
        problem="cannot tell a daemon config from an agent config; pass --kind daemon or --kind agent",
    )


def check_file(path: str, kind: str = "auto") -> tuple[str, Any]:
    """Parse ``path`` as a ``kind`` config; returns (kind, parsed config) or raises ConfigError."""
    data = load_yaml(path)
    if kind == "auto":
        kind = detect_kind(path, data)
    if kind == "daemon":
        from vmctl.daemon.config import config_from_dict

        return kind, config_from_dict(data, path)
    from vmctl.agents.config import parse_agent_config

    return kind, parse_agent_config(data, path)


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, str | int | float | bool) or obj is None:
        return obj
    return str(obj)


def summary(kind: str, cfg: Any) -> str:
    if kind == "daemon":
        notes = "".join(f"\nwarning: {note}" for note in cfg.deprecations)
        return (f"daemon config: store {cfg.store_url}, API {cfg.listen}:{cfg.port}, "
                f"policy {cfg.policy_name}, tick {cfg.tick_s} s{notes}")
    uri = f" {cfg.backend.uri}" if cfg.backend.uri else ""
    return f"agent config: node {cfg.node}, backend {cfg.backend.kind}{uri}"


@click.group()
def config() -> None:
    """Offline checks of vmctld and vmctl-agent configuration files."""


@config.command("check")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--kind", type=click.Choice(["auto", "daemon", "agent"]), default="auto", show_default=True)
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json prints the effective config (defaults filled in).")
def check(files: tuple[str, ...], kind: str, output: str) -> None:
    """Validate FILE(s); exit 2 on the first invalid one, naming the file and key."""
    results = []
    for f in files:
        k, cfg = check_file(f, kind)
        results.append({"file": f, "kind": k, "config": _jsonable(cfg)})
        if output == "text":
            click.echo(f"{f}: ok ({summary(k, cfg)})")
    if output == "json":
        click.echo(json.dumps(results, indent=2, sort_keys=True))
