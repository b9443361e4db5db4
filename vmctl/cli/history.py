"""``vmctl history export``: the cluster's finished jobs (job archive included) as a Standard Workload
Format trace plus a side file of what SWF cannot hold (docs/operations.md, "What if" and "The export
format"); ``vmctl sim run --trace FILE`` and ``vmctl whatif`` read both.

    vmctl history export --swf week.swf --since 7d
    vmctl history export --swf nov.swf.gz --since 2026-11-01T00:00Z --until 2026-12-01T00:00Z

It talks to the daemon API only (``GET /v1/history``, ``/v1/nodes``, ``/v1/policy``). An empty range
or history and an ``--until`` not after ``--since`` are errors naming the problem (exit 2).
"""

from __future__ import annotations

from pathlib import Path

import click

from vmctl import errors, timefmt
from vmctl.apiclient import ApiClient
from vmctl.cli.connect import api_options
from vmctl.cli.render import emit_json
from vmctl.whatif.export import fetch_trace, write_trace


def parse_range(since: str | None, until: str | None) -> tuple[float | None, float | None]:
    """``--since``/``--until``: a duration back from now (90s, 10m, 2h, 1d, 1w) or a time (ISO 8601, local
    zone when none is given, or epoch seconds). ``--until`` not after ``--since`` is an error."""
    out: list[float | None] = []
    for name, text in (("--since", since), ("--until", until)):
        if text is None:
            out.append(None)
            continue
        try:
            out.append(timefmt.parse_since(text))
        except ValueError as exc:
            raise errors.ValidationError(field=name, problem=str(exc)) from None
    s, u = out
    if s is not None and u is not None and u <= s:
        raise errors.ValidationError(field="--until", problem=f"{timefmt.iso(u)} is not after --since "
                                                              f"{timefmt.iso(s)}: the range is empty")
    return s, u


@click.group()
def history() -> None:
    """The cluster's finished jobs as a trace (vmctl history export)."""


@history.command("export")
@click.option("--swf", "swf", required=True, type=click.Path(dir_okay=False, path_type=Path), metavar="FILE",
              help="Write the SWF trace here (.gz: compressed) and the side file to FILE.vmctl.json.")
@click.option("--since", default=None, metavar="DURATION|TIME",
              help="Only jobs submitted since then: a duration back from now (2h, 7d) or a time (ISO 8601, epoch).")
@click.option("--until", default=None, metavar="DURATION|TIME", help="Only jobs submitted before then.")
@api_options
def export_cmd(swf: Path, since: str | None, until: str | None, url: str | None, token: str | None, ca: str | None,
               output: str) -> None:
    """Export the finished jobs (job archive included) as SWF plus a side file (shapes, priority, deadline)."""
    s, u = parse_range(since, until)
    trace = fetch_trace(ApiClient(url, token, ca=ca), s, u)
    side = write_trace(trace, swf)
    doc = {"swf": str(swf), "side_file": str(side), "jobs": trace.jobs, "never_started": trace.never_started,
           "policy": trace.side["cluster"]["policy"], "nodes": len(trace.side["cluster"]["nodes"])}
    if output == "json":
        emit_json(doc)
        return
    never = f" ({trace.never_started} never started: in the trace with run -1)" if trace.never_started else ""
    click.echo(f"wrote {trace.jobs} finished jobs{never} to {swf} and {side}")
