"""``vmctl whatif``: replay the cluster's own history under other policies on a model of the cluster, beside
what actually happened, and the simulator's error on the policy that was in force (docs/operations.md,
"What if"; the model: :mod:`vmctl.whatif.replay`).

    vmctl whatif --policies easy,measy --since 7d
    vmctl whatif --policies easy,measy,gs-m -p measy.migration_cost=5 -o json

It exports the history through the daemon API (as ``vmctl history export``) into a temporary folder
(``--keep DIR`` keeps the trace there), runs one experiment-runner cell per policy
(:mod:`vmctl.experiments.runner`, a local Dask cluster of ``--workers`` processes), and prints per
policy the mean response, wait and bounded slowdown (with their batch-means 95 % intervals where there
are enough jobs), utilization, migrations and deadlines met.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from vmctl import errors
from vmctl.apiclient import ApiClient
from vmctl.cli.connect import api_options
from vmctl.cli.history import parse_range
from vmctl.cli.render import emit_json, json_safe
from vmctl.policies.registry import parse_policy_params
from vmctl.whatif.export import fetch_trace, write_trace
from vmctl.whatif.report import render, run_whatif


def whatif_params(policies: Sequence[str], items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``-p NAME.KEY=VALUE`` -> policy -> {key: value}, typed as the policy declares (``vmctl sim``'s rule);
    a NAME not in ``--policies`` is an error naming it."""
    raw: dict[str, list[str]] = {p: [] for p in policies}
    for item in items:
        name, dot, rest = item.partition(".")
        if not dot or "=" not in rest:
            raise errors.ValidationError(field="-p", problem=f"expected NAME.KEY=VALUE, got {item[:60]!r}")
        if name not in raw:
            raise errors.ValidationError(field="-p", problem=f"{name!r} is not one of --policies "
                                                             f"({', '.join(policies)})")
        raw[name].append(rest)
    return {p: parse_policy_params(p, tuple(v)) for p, v in raw.items()}


def _policies(text: str) -> list[str]:
    from vmctl.policies.registry import available_policies

    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise errors.ValidationError(field="--policies", problem="give at least one policy (easy,measy,...)")
    known = available_policies()
    for n in names:
        if n not in known:
            raise errors.ValidationError(field="--policies", problem=f"unknown policy {n!r}; known: "
                                                                     f"{', '.join(sorted(known))}")
    return list(dict.fromkeys(names))


@click.command("whatif")
@click.option("--policies", required=True, metavar="LIST", help="Comma-separated policies to replay (easy,measy,...).")
@click.option("--since", default=None, metavar="DURATION|TIME",
              help="Only jobs submitted since then: a duration back from now (2h, 7d) or a time (ISO 8601, epoch).")
@click.option("--until", default=None, metavar="DURATION|TIME", help="Only jobs submitted before then.")
@click.option("-p", "--param", "params", multiple=True, metavar="NAME.KEY=VALUE",
              help="A parameter of one policy (repeatable), e.g. -p measy.migration_cost=5.")
@click.option("--workers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Processes of the local Dask cluster that runs the replays.")
@click.option("--progress", type=click.Choice(["cpu-share", "paper"]), default="cpu-share", show_default=True,
              help="How a two-tier replay's jobs progress: the CPU share rule of vmctld's agents, or MEASY's "
                   "measured model (context-switch loss, bg efficiency).")
@click.option("--boot", type=click.Choice(["own", "median", "none", "bag"]), default="own", show_default=True,
              help="How the jobs' measured start delays (guest boot; the side file's boot) apply in every replay: "
                   "each job its own (a task bag's workers the boot of their node, when the history has node "
                   "boots), every job the history's median, none, or each job its own with a task bag's mean "
                   "on every worker (docs/operations.md).")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Keep the exported trace (history.swf + side file) and the runner's table in DIR.")
@api_options
def whatif(policies: str, since: str | None, until: str | None, params: tuple[str, ...], workers: int,
           progress: str, boot: str, keep: Path | None, url: str | None, token: str | None, ca: str | None,
           output: str) -> None:
    """Replay the cluster's history under each policy on a model of the cluster, beside what happened."""
    names = _policies(policies)
    parsed = whatif_params(names, params)
    s, u = parse_range(since, until)
    client = ApiClient(url, token, ca=ca)
    trace = fetch_trace(client, s, u)
    in_force = trace.side["cluster"]["policy"]
    with tempfile.TemporaryDirectory(prefix="vmctl-whatif-") as tmp:
        folder = Path(tmp) if keep is None else keep
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.ValidationError(field="--keep", problem=f"cannot create {folder}: {exc.strerror}") from None
        path = folder / "history.swf"
        write_trace(trace, path)
        table = folder / "whatif.csv"
        for old in (table, table.with_name(table.name + ".partial.jsonl")):
            old.unlink(missing_ok=True)  # a fresh replay: no resume from an older export's cells
        doc = run_whatif(path, names, parsed, in_force, workers, table, progress, boot)
    if output == "json":
        emit_json(json_safe(doc))
        return
    click.echo(render(doc))
