"""What-if: replay an exported history under several policies (one experiments-runner cell each) beside
what actually happened, and render the answer (``vmctl whatif``, ``bench/whatif.py``)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def run_whatif(trace: Path, policies: Sequence[str], params: Mapping[str, Mapping[str, Any]],
               in_force: Mapping[str, Any], workers: int, table: Path, progress: str = "cpu-share",
               boot: str = "own") -> dict[str, Any]:
    """The replays (one runner cell per policy, plus the policy in force with its own parameters when it
    is not among ``policies``), the actual run, and the simulator's error on the policy in force.
    ``boot``: how the side file's boot delays apply (:mod:`vmctl.whatif.replay`)."""
    from vmctl.experiments.runner import cell, run_grid
    from vmctl.policies.registry import parse_policy_params, policy_class
    from vmctl.sim.workloads.swf import read_side_file
    from vmctl.whatif.replay import actual, boot_summary, error, replay_cell

    force_name = in_force.get("name")
    force_params: dict[str, Any] = {}
    if force_name:  # as GET /v1/policy reports them (an unlimited quota as "inf"): typed as the policy declares
        known = policy_class(force_name).parameters
        force_params = parse_policy_params(force_name, tuple(
            f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in (in_force.get("params") or {}).items()
            if k in known))
    runs: list[tuple[str, dict[str, Any]]] = [(p, dict(params.get(p, {}))) for p in policies]
    if force_name and force_name not in policies:
        runs.append((force_name, force_params))
    elif force_name:
        i = list(policies).index(force_name)
        runs[i] = (force_name, {**force_params, **runs[i][1]})
    cells = [cell(replay_cell, trace=str(trace), policy=p, params=json.dumps(prm, sort_keys=True), seed=1,
                  progress=progress, **({} if boot == "own" else {"boot": boot})) for p, prm in runs]
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
    boots = boot_summary(trace)
    return {"trace": str(trace), "cluster": side["cluster"], "jobs": len(side["jobs"]), "progress": progress,
            **({"boot": {"mode": boot, **boots}} if boots["jobs"] else {}), "policies": out,
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
    b = doc.get("boot")
    if b:  # only when the history has measured boot delays (the output is unchanged otherwise)
        how = {"own": "each job its own (the median for a job without one)", "median": "every job the median",
               "none": "not replayed (--boot none)", "bag": "each job its own, a task bag's mean on each of its "
               "workers (--boot bag)"}.get(str(b.get("mode")), str(b.get("mode")))
        if b.get("node_boots") and b.get("mode") == "own":
            how += "; a task bag's workers the boot of the node they run on (" + ", ".join(
                f"{n} {_f(v)} s" for n, v in b["node_boots"].items()) + ")"
        if b.get("mode") != "none" and any(p.get("family") == "gang" for p in doc["policies"]):
            how += "; under a gang policy in wall time, not by the job's row (a boot holds its row's paused slices)"
        lines.append(f"boot delays (start -> every process running) measured for {b['jobs']} jobs: median "
                     f"{_f(b['median'])} s, max {_f(b['max'])} s; in every replay: {how}")
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
