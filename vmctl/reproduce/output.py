"""``claims.md`` and ``claims.parquet``: one row per claim (the paper's figure, ours with its 95 %
interval, the verdict, the rule, the cause and the experiments behind it, and the size and command
that produced it)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmctl.errors import ValidationError
from vmctl.reproduce.base import RULES, Claim, Outcome, Paper, Results, Size

#: the columns of claims.parquet, in order, with their Arrow types
COLUMNS: tuple[tuple[str, str], ...] = (
    ("paper", "string"), ("paper_title", "string"), ("claim", "string"), ("text", "string"),
    ("where", "string"), ("metric", "string"), ("paper_value", "string"), ("ours", "string"),
    ("ours_mean", "float64"), ("ours_lo", "float64"), ("ours_hi", "float64"), ("n_seeds", "int64"),
    ("unit", "string"), ("verdict", "string"), ("rule", "string"), ("detail", "string"), ("cause", "string"),
    ("evidence", "string"), ("mode", "string"), ("size", "string"), ("reduced", "string"), ("command", "string"),
    ("wall_s", "float64"), ("vmctl_version", "string"),
)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What produced the outcomes: the size, the command line and the wall time of the run."""

    size: Size
    command: str
    wall_s: float


def claim_row(paper: Paper, claim: Claim, out: Outcome, info: RunInfo) -> dict[str, Any]:
    from vmctl import __version__

    return {
        "paper": paper.id, "paper_title": paper.title, "claim": claim.id, "text": claim.text,
        "where": claim.where, "metric": claim.metric, "paper_value": claim.paper, "ours": out.ours.text(out.unit),
        "ours_mean": out.ours.mean, "ours_lo": out.ours.lo, "ours_hi": out.ours.hi, "n_seeds": out.ours.n,
        "unit": out.unit, "verdict": out.verdict, "rule": out.rule, "detail": out.detail, "cause": out.cause,
        "evidence": ", ".join(out.evidence), "mode": info.size.name, "size": info.size.description,
        "reduced": info.size.reduced, "command": info.command, "wall_s": round(info.wall_s, 1),
        "vmctl_version": __version__,
    }


def write_parquet(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    types = {"string": pa.string(), "float64": pa.float64(), "int64": pa.int64()}
    schema = pa.schema([(name, types[t]) for name, t in COLUMNS])
    tbl = pa.Table.from_pylist([{c: r.get(c) for c, _ in COLUMNS} for r in rows], schema=schema)
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(tbl, tmp)
    os.replace(tmp, path)


def read_claims(path: Path) -> list[dict[str, Any]]:
    """The rows of a claims.parquet (a clear error when it is missing or not one)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise ValidationError(field=str(path), problem="no claims.parquet there (run vmctl reproduce PAPER --out DIR "
                                                       "first)")
    try:
        tbl = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise ValidationError(field=str(path), problem=f"not a claims table: {exc}") from exc
    missing = [c for c, _ in COLUMNS if c not in tbl.column_names]
    if missing:
        raise ValidationError(field=str(path), problem=f"not a claims table (no column {', '.join(missing)})")
    rows: list[dict[str, Any]] = tbl.to_pylist()
    return rows


def cell_text(text: object) -> str:
    """A value safe inside a Markdown table cell."""
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def claims_table(rows: Sequence[Mapping[str, Any]], with_paper: bool = False) -> str:
    head = (["paper"] if with_paper else []) + ["claim", "the paper says", "paper", "ours (mean [95 % CI], seeds)",
                                                 "verdict", "cause where it differs", "evidence"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ours = r["ours"] + (f"; {r['detail']}" if r.get("detail") else "")
        cells = ([r["paper"]] if with_paper else []) + [
            r["claim"], f"{r['text']} ({r['where']})", r["paper_value"], ours, f"**{r['verdict']}**",
            r["cause"] or "-", r["evidence"] or "-"]
        lines.append("| " + " | ".join(cell_text(c) for c in cells) + " |")
    return "\n".join(lines)


def rules_text() -> str:
    return "\n".join(f"- `{name}`: {text}." for name, text in RULES.items())


def claims_markdown(paper: Paper, rows: Sequence[Mapping[str, Any]], info: RunInfo, results: Results,
                    tables: Mapping[str, str]) -> str:
    """claims.md: the claims, the verdict rules, then each experiment's table (the evidence)."""
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in ("holds", "differs", "contradicted")}
    out = [
        f"# Paper {paper.id}: {paper.title}",
        "",
        f"Source: `{paper.source}`. Generated by `{info.command}` (vmctl {rows[0]['vmctl_version'] if rows else ''}, "
        f"{info.wall_s:.0f} s of wall time for this run, finished cells of earlier runs reused).",
        "",
        f"**Size ({info.size.name})**: {info.size.description}."
        + (f" Reduced from the paper's: {info.size.reduced}." if info.size.reduced else ""),
        "",
        f"Verdicts: {counts['holds']} hold, {counts['differs']} differ, {counts['contradicted']} contradicted "
        f"(of {len(rows)}).",
        "",
        claims_table(rows),
        "",
        "## Verdict rules",
        "",
        rules_text(),
        "",
    ]
    if paper.notes:
        out += ["## Notes", "", paper.notes.strip(), ""]
    out += ["## Experiments (the evidence)", ""]
    for e in paper.experiments:
        out += [f"### `{e.name}`: {e.title}", "", f"Table: `{tables[e.name]}` "
                f"({len(results.rows(e.name))} cells).", ""]
        if e.summary is not None:
            out += [e.summary(results).strip(), ""]
    return "\n".join(out)


def write_claims(paper: Paper, claims: Sequence[tuple[Claim, Outcome]], info: RunInfo, results: Results,
                 out_dir: Path, tables: Mapping[str, str]) -> list[dict[str, Any]]:
    rows = [claim_row(paper, c, o, info) for c, o in claims]
    write_parquet(rows, out_dir / "claims.parquet")
    text = claims_markdown(paper, rows, info, results, tables)
    tmp = out_dir / ".claims.md.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out_dir / "claims.md")
    return rows
