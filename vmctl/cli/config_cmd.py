"""``vmctl config check FILE...``: validate daemon and agent configs offline (no daemon needed).

The kind is detected from the top-level keys (``store``/``api``/``policy``/``loop``/``lease`` mean a
daemon config, ``node``/``backend``/``layout``/``reconcile``/``peers``/``ssh`` an agent config) or given
with ``--kind``. Every problem is reported as ``error: config-invalid: FILE: key.path: problem`` (exit
2) by the very parser the daemon or agent uses at start-up, so a file that passes here starts.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
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
    return check_data(path, load_yaml(path), kind)


#: at most this many problems are reported per file
MAX_PROBLEMS = 50
_INDEX = re.compile(r"\[\d+\]$")


def _drop(data: dict[str, Any], where: str) -> bool:
    """Remove the key a problem names (``api.port``, ``api.server_names[1]``: the whole list) from
    ``data``, so that the rest of the file can be checked; False when ``where`` names no key."""
    parts = [_INDEX.sub("", p) for p in where.split(".")]
    node: Any = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict) or parts[-1] not in node:
        return False
    del node[parts[-1]]
    return True


def check_all(path: str, kind: str = "auto") -> tuple[str, Any, list[errors.ConfigError]]:
    """Every problem of ``path``, not only the first: after each one the key it names is dropped (its
    default applies) and the file is checked again. Returns (kind, config or None, problems)."""
    data = load_yaml(path)
    problems: list[errors.ConfigError] = []
    while len(problems) < MAX_PROBLEMS:
        try:
            k, cfg = check_data(path, copy.deepcopy(data), kind)
        except errors.ConfigError as exc:
            problems.append(exc)
            if not _drop(data, str(exc.fields.get("where", ""))):
                break
            continue
        return k, (None if problems else cfg), problems
    return kind, None, problems


def check_data(path: str, data: dict[str, Any], kind: str = "auto") -> tuple[str, Any]:
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
    lc = cfg.layout
    ports = []
    if lc.ssh_ports is not None:
        n = f"{lc.levels * len(lc.cores)} " if lc.cores is not None else ""
        ports.append(f"{n}slots from {lc.ssh_ports}")
    if lc.shared_ssh_ports is not None:
        ports.append(f"shared VMs {lc.shared_ssh_ports}-{lc.shared_ssh_ports + lc.shared_ssh_count - 1}")
    fwd = f", forwarded SSH ports: {', '.join(ports)}" if ports else ""
    return f"agent config: node {cfg.node}, backend {cfg.backend.kind}{uri}{fwd}"


@click.group()
def config() -> None:
    """Offline checks of vmctld and vmctl-agent configuration files."""


@config.command("check")
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("--kind", type=click.Choice(["auto", "daemon", "agent"]), default="auto", show_default=True)
@click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="json prints the effective config (defaults filled in).")
def check(files: tuple[str, ...], kind: str, output: str) -> None:
    """Validate FILE(s): every problem of every file, each naming the file and key (exit 2 if any)."""
    results = []
    problems: list[errors.ConfigError] = []
    for f in files:
        k, cfg, found = check_all(f, kind)
        problems.extend(found)
        if found:
            continue
        results.append({"file": f, "kind": k, "config": _jsonable(cfg)})
        if output == "text":
            click.echo(f"{f}: ok ({summary(k, cfg)})")
    if problems:
        for exc in problems[:-1]:
            click.echo(f"error: {exc.reference}: {exc}", err=True)
        raise problems[-1]
    if output == "json":
        click.echo(json.dumps(results, indent=2, sort_keys=True))
