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

import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from vmctl import errors
from vmctl.apiclient import ApiClient
from vmctl.cli.history import fetch_trace, parse_range, write_trace
from vmctl.cli.ops import api_options, emit_json, json_safe


def parse_policy_params(policies: Sequence[str], items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``-p NAME.KEY=VALUE`` -> policy -> {key: value}, typed as the policy declares (``vmctl sim``'s rule);
    a NAME not in ``--policies`` is an error naming it."""
    from vmctl.cli.sim import _parse_params

    raw: dict[str, list[str]] = {p: [] for p in policies}
    for item in items:
        name, dot, rest = item.partition(".")
        if not dot or "=" not in rest:
            raise errors.ValidationError(field="-p", problem=f"expected NAME.KEY=VALUE, got {item[:60]!r}")
        if name not in raw:
            raise errors.ValidationError(field="-p", problem=f"{name!r} is not one of --policies "
                                                             f"({', '.join(policies)})")
        raw[name].append(rest)
    return {p: _parse_params(p, tuple(v)) for p, v in raw.items()}


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


def run_whatif(trace: Path, policies: Sequence[str], params: Mapping[str, Mapping[str, Any]],
               in_force: Mapping[str, Any], workers: int, table: Path, progress: str = "cpu-share") -> dict[str, Any]:
    """The replays (one runner cell per policy, plus the policy in force with its own parameters when it
    is not among ``policies``), the actual run, and the simulator's error on the policy in force."""
    from vmctl.cli.sim import _parse_params
    from vmctl.experiments.runner import cell, run_grid
    from vmctl.policies.registry import policy_class
    from vmctl.sim.workloads.swf import read_side_file
    from vmctl.whatif.replay import actual, error, replay_cell

    force_name = in_force.get("name")
    force_params: dict[str, Any] = {}
    if force_name:  # as GET /v1/policy reports them (an unlimited quota as "inf"): typed as the policy declares
        known = policy_class(force_name).parameters
        force_params = _parse_params(force_name, tuple(
            f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (in_force.get("params") or {}).items()
            if k in known))
    runs: list[tuple[str, dict[str, Any]]] = [(p, dict(params.get(p, {}))) for p in policies]
    if force_name and force_name not in policies:
        runs.append((force_name, force_params))
    elif force_name:
        i = list(policies).index(force_name)
        runs[i] = (force_name, {**force_params, **runs[i][1]})
    cells = [cell(replay_cell, trace=str(trace), policy=p, params=json.dumps(prm, sort_keys=True), seed=1,
                  progress=progress) for p, prm in runs]
    res = run_grid(cells, table, workers=max(1, min(workers, len(cells))), progress=False, label="what-if")
    side = read_side_file(trace)
    assert side is not None
    act = actual(trace)
    submits = {k: float(e["submit"]) for k, e in side["jobs"].items()}
    out: list[dict[str, Any]] = []
    err: dict[str, Any] | None = None
    for (p, prm), row in zip(runs, res.rows, strict=True):
        if row.get("error"):
            out.append({"policy": p, "params": prm, "error": row["error"]})
            continue
        doc = {"policy": p, "params": prm, **{k: row.get(k) for k in (
            "family", "jobs", "avg_response", "ci_avg_response", "avg_wait", "ci_avg_wait", "avg_bounded_slowdown",
            "ci_avg_bounded_slowdown", "utilization", "migrations", "deadlines_met")}, "in_force": p == force_name}
        if p == force_name:
            err = error(row, act, submits)
            for pj in err["per_job"]:
                pj["vmctl_id"] = side["jobs"][pj["job"]].get("vmctl_id")
        out.append(doc)
    actual_doc = {k: v for k, v in act.items() if k not in ("jobs_json", "family")}
    return {"trace": str(trace), "cluster": side["cluster"], "jobs": len(side["jobs"]), "progress": progress,
            "policies": out,
            "actual": {"policy": force_name, **actual_doc}, "error_in_force": err}


def _f(v: Any, fmt: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return format(float(v), fmt)


def _ci(mean: Any, hw: Any) -> str:
    return _f(mean) if hw is None else f"{_f(mean)} ±{_f(hw)}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Plain aligned columns (numbers right-aligned)."""
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in
                               enumerate(zip(r, widths, strict=True))).rstrip() for r in (head, *rows))


def render(doc: Mapping[str, Any]) -> str:
    head = ("POLICY", "FAMILY", "JOBS", "RESPONSE (s)", "WAIT (s)", "BSLD", "UTIL", "MIGR", "DEADLINES MET")
    rows: list[tuple[str, ...]] = []
    failed: list[str] = []
    for r in doc["policies"]:
        if r.get("error"):
            rows.append((r["policy"], "", "", "failed", "", "", "", "", ""))
            failed.append(f"{r['policy']} failed: {r['error']}")
            continue
        rows.append((r["policy"] + (" (in force)" if r["in_force"] else ""), str(r["family"]), str(r["jobs"]),
                     _ci(r["avg_response"], r["ci_avg_response"]), _ci(r["avg_wait"], r["ci_avg_wait"]),
                     _ci(r["avg_bounded_slowdown"], r["ci_avg_bounded_slowdown"]), _f(r["utilization"], ".2f"),
                     str(r["migrations"]), "-" if r["deadlines_met"] is None else f"{r['deadlines_met']:.0%}"))
    a = doc["actual"]
    rows.append((f"actual ({a['policy']})", "vmctld", str(a["jobs"]), _ci(a["avg_response"], a["ci_avg_response"]),
                 _ci(a["avg_wait"], a["ci_avg_wait"]), _ci(a["avg_bounded_slowdown"], a["ci_avg_bounded_slowdown"]),
                 _f(a["utilization"], ".2f"), str(a["migrations"]),
                 "-" if a["deadlines_met"] is None else f"{a['deadlines_met']:.0%}"))
    cl = doc["cluster"]
    cores = sum(int(n["cores"]) for n in cl["nodes"])
    lines = [f"what if: {doc['jobs']} finished jobs replayed on {len(cl['nodes'])} nodes / {cores} cores "
             f"(the cluster now; ± = 95 % batch-means interval where there are enough jobs)",
             _table(head, rows)]
    lines.extend(failed)
    e = doc.get("error_in_force")
    if e is not None:
        rel = e["avg_response_relative"]
        s, r = e["start"], e["response"]
        lines.append(f"simulator vs actual on {a['policy']} (the policy in force), {e['jobs_compared']} jobs: mean "
                     f"response {_f(e['means']['avg_response'], '+.1f')} s"
                     f"{'' if rel is None else f' ({rel:+.1%})'}, mean wait {_f(e['means']['avg_wait'], '+.1f')} s; "
                     f"per job start: mean {_f(s['mean'], '+.1f')} s, median {_f(s['median'], '+.1f')} s, "
                     f"90% within {_f(s['p90_abs'])} s, largest {_f(s['max_abs'])} s; per job response: "
                     f"mean {_f(r['mean'], '+.1f')} s, largest {_f(r['max_abs'])} s")
    return "\n".join(lines)


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
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              help="Keep the exported trace (history.swf + side file) and the runner's table in DIR.")
@api_options
def whatif(policies: str, since: str | None, until: str | None, params: tuple[str, ...], workers: int,
           progress: str, keep: Path | None, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Replay the cluster's history under each policy on a model of the cluster, beside what happened."""
    names = _policies(policies)
    parsed = parse_policy_params(names, params)
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
        doc = run_whatif(path, names, parsed, in_force, workers, table, progress)
    if output == "json":
        emit_json(json_safe(doc))
        return
    click.echo(render(doc))
