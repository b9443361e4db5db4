"""``vmctl events``: the cluster's event log (jobs, nodes, migrations, refusals, policy changes), newest
last, with human times; ``--follow`` keeps printing events as they happen (like ``journalctl -f``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click

from vmctl import errors, timefmt
from vmctl.apiclient import ApiClient
from vmctl.cli.connect import wide_api_options
from vmctl.cli.render import Grid, fmt_column_time, fmt_reason, fmt_time, json_safe, safe_text, show

#: how long one follow request waits on the daemon for an event (it answers at once when one happens)
FOLLOW_WAIT_S = 25.0


def event_row(e: Mapping[str, Any], short: bool = False) -> tuple[str, ...]:
    """An event's cells; ``short``: its time and the times in its message as in a table column."""
    return ((fmt_column_time(e.get("time")) if short else fmt_time(e.get("time"))), str(e.get("kind", "")),
            str(e.get("actor", "")), fmt_reason(e.get("message", ""), short=short))


def event_table(events: Sequence[Mapping[str, Any]], title: str | None = None, wide: bool = False) -> Grid:
    """The event log as a table: times short and WHAT (then BY) cut to fit the screen; ``wide``: ISO times,
    nothing cut."""
    return Grid(("TIME", "EVENT", "BY", "WHAT"), [event_row(e, short=not wide) for e in events], title=title,
                cut=("WHAT", "BY"))


def event_line(e: Mapping[str, Any]) -> str:
    time_, kind, actor, what = event_row(e)
    return safe_text(f"{time_}  {kind:<20} {what}  [{actor}]")


def follow(client: ApiClient, after: int, emit: Callable[[Mapping[str, Any]], None],
           keep_going: Callable[[], bool] = lambda: True, wait: float = FOLLOW_WAIT_S) -> int:
    """Print every event after ``after`` as it happens (one long poll at a time) while ``keep_going()``;
    returns the ``seq`` of the last event seen. A daemon that is briefly unreachable (a restart) is
    retried every 2 s."""
    while keep_going():
        try:
            doc = client.events(after=after, wait=wait)
        except errors.DaemonUnavailable:
            time.sleep(2.0)
            continue
        for e in doc["events"]:
            emit(e)
        last = doc.get("last_seq")
        if isinstance(last, int) and not isinstance(last, bool):
            after = max(after, last)
    return after


@click.command("events")
@click.option("--since", default=None, metavar="DURATION|TIME",
              help="Only events since then: a duration back from now (90s, 10m, 2h, 1d, 1w) or a time "
                   "(ISO 8601, local zone unless given, or epoch seconds).")
@click.option("--limit", type=click.IntRange(1, 10000), default=100, show_default=True,
              help="At most this many events: the newest ones.")
@click.option("--follow", "-f", "follow_", is_flag=True, help="Keep printing events as they happen (Ctrl-C stops).")
@wide_api_options
def events(since: str | None, limit: int, follow_: bool, url: str | None, token: str | None, ca: str | None,
           output: str) -> None:
    """The cluster's event log: jobs submitted, started, requeued, held, moved and ended; nodes joined,
    lost, down, back, drained and removed; migrations; agent refusals; policy changes. Each with the
    token, agent or vmctld that caused it. Oldest first; -o json prints JSON (one object per line with
    --follow)."""
    t_since: float | None = None
    if since is not None:
        try:
            t_since = timefmt.parse_since(since)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from exc
    client = ApiClient(url, token, ca=ca)
    doc = client.events(since=t_since, limit=limit)
    evs = doc["events"]
    if not follow_:
        title = f"the newest {limit} events (--limit for more)" if len(evs) >= limit else None
        show(doc, output, lambda: event_table(evs, title=title, wide=output == "wide") if evs else "no events")
        return

    def emit(e: Mapping[str, Any]) -> None:
        if output == "json":
            click.echo(json.dumps(json_safe(e), sort_keys=True, allow_nan=False))
        else:
            click.echo(event_line(e))

    for e in evs:
        emit(e)
    last = doc.get("last_seq")
    try:
        follow(client, last if isinstance(last, int) and not isinstance(last, bool) else 0, emit)
    except KeyboardInterrupt:
        return
