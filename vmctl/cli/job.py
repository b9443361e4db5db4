"""``vmctl job``: submit, list, show, cancel, hold, release, requeue, update and explain jobs."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Group
from rich.text import Text

from vmctl import errors, timefmt
from vmctl.apiclient import ApiClient
from vmctl.cli.connect import _client, _complete, api_options, wide_api_options
from vmctl.cli.render import (
    fmt_blocked,
    fmt_cap,
    fmt_reason,
    fmt_runs_as,
    fmt_when,
    fmt_widths,
    job_kind,
    job_table,
    kv_table,
    safe_lines,
    safe_text,
    show,
)
from vmctl.model import JobState
from vmctl.timefmt import fmt_duration

JOB_STATES = tuple(s.value for s in JobState)  # queued, running, suspended, done, killed, failed, cancelled


@click.group()
def job() -> None:
    """Submit, list, inspect, cancel and explain jobs."""


def parse_cpu_usage(value: str | None, procs: int | None) -> list[float] | None:
    if value is None:
        return None
    try:
        usage = [float(x) for x in value.split(",") if x.strip()]
    except ValueError as exc:
        raise errors.UserError(
            where="--cpu-usage", problem=f"{value!r} is not a comma-separated list of numbers"
        ) from exc
    if procs is not None and len(usage) == 1 and procs > 1:
        usage = usage * procs
    for u in usage:
        if not 0 < u <= 1:
            raise errors.OutOfRange(what="--cpu-usage", value=u, allowed="0 < u <= 1")
    if procs is not None and len(usage) != procs:
        raise errors.UserError(where="--cpu-usage", problem=f"{len(usage)} values for {procs} processes")
    return usage


def parse_shape_option(text: str) -> dict[str, Any]:
    """``--shape``: a job shape as JSON (the API's form, docs/workloads.md), or ``@FILE`` holding it
    (JSON or YAML); checked here so that a mistake is named before anything is sent."""
    import yaml

    from vmctl.shapes import shape_from_json, shape_to_json

    where = "--shape"
    if text.startswith("@"):
        where = text[1:]
        try:
            text = Path(where).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.ConfigError(path=where, where="file", problem=f"cannot be read: {exc}") from exc
    try:
        raw: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.UserError(where=where, problem="not valid JSON/YAML (e.g. '{\"kind\": \"moldable\", "
                                                    "\"table\": {\"2\": 100, \"4\": 60}}')") from exc
    return shape_to_json(shape_from_json(raw, "--shape"))


def build_job_spec(
    *, procs: int | None, estimate: float | None, name: str | None = None, priority: int | None = None,
    deadline: float | None = None, cpu_usage: str | None = None, command: str | None = None,
    work_seconds: float | None = None, cpu_need: float | None = None, mem: float | None = None,
    user: str | None = None, account: str | None = None, shape: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body for the command-line options (only the given optional fields). A
    shaped job (``shape``, from ``--shape``) may leave out procs and estimate (the daemon derives them)."""
    if shape is None and (procs is None or estimate is None):
        raise errors.UserError(where="job submit", problem="--procs and --estimate are required (or --shape, "
                                                           "or --file)")
    if procs is not None and procs < 1:
        raise errors.OutOfRange(what="--procs", value=procs, allowed=">= 1")
    if estimate is not None and not estimate > 0:
        raise errors.OutOfRange(what="--estimate", value=estimate, allowed="> 0 seconds")
    spec: dict[str, Any] = {}
    if procs is not None:
        spec["procs"] = procs
    if estimate is not None:
        spec["estimate"] = estimate
    if shape is not None:
        spec["shape"] = shape
    if name is not None:
        spec["name"] = name
    if priority is not None:
        spec["priority"] = priority
    if deadline is not None:
        spec["deadline"] = deadline
    if user is not None:
        spec["user"] = user
    if account is not None:
        spec["account"] = account
    usage = parse_cpu_usage(cpu_usage, procs)
    if usage is not None:
        spec["cpu_usage"] = usage
    if command is not None:
        spec["command"] = command
    if work_seconds is not None:
        if work_seconds < 0:
            raise errors.OutOfRange(what="--work-seconds", value=work_seconds, allowed=">= 0")
        spec["work_seconds"] = work_seconds
    if cpu_need is not None:
        if not 0 < cpu_need <= 1:
            raise errors.OutOfRange(what="--cpu-need", value=cpu_need, allowed="0 < x <= 1 (fraction of one host core)")
        spec["cpu_need"] = cpu_need
    if mem is not None:
        if not 0 <= mem <= 1:
            raise errors.OutOfRange(what="--mem", value=mem, allowed="0 <= x <= 1 (fraction of one host's memory)")
        spec["mem"] = mem
    return spec


def load_job_file(path: str) -> list[dict[str, Any]]:
    """A job spec file: YAML or JSON holding one spec, a list of specs, or ``{"jobs": [...]}``."""
    import yaml

    if path == "-":
        text = sys.stdin.read()
        path = "<stdin>"
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise errors.ConfigError(path=path, where="file", problem="does not exist") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.ConfigError(path=path, where="file", problem=f"cannot be read: {exc}") from exc
    try:
        doc: Any = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "document"
        raise errors.ConfigError(path=path, where=where, problem="not valid YAML/JSON") from exc
    if isinstance(doc, dict) and "jobs" in doc:
        doc = doc["jobs"]
    specs = [doc] if isinstance(doc, dict) else doc
    if not isinstance(specs, list) or not specs:
        raise errors.ConfigError(
            path=path, where="top level", problem="expected a job spec, a list of them or {jobs: [...]}"
        )
    for i, s in enumerate(specs):
        if not isinstance(s, dict):
            problem = f"must be a mapping, got {type(s).__name__}"
            raise errors.ConfigError(path=path, where=f"jobs[{i}]", problem=problem)
        if ("procs" not in s or "estimate" not in s) and "shape" not in s:
            raise errors.ConfigError(path=path, where=f"jobs[{i}]", problem="needs 'procs' and 'estimate' (or a "
                                                                           "'shape')")
    return [dict(s) for s in specs]


@job.command("submit")
@click.option("--procs", "-n", type=int, default=None, help="Number of processes (one core each).")
@click.option("--estimate", "-t", type=float, default=None, help="Run-time estimate in seconds (killed after).")
@click.option("--name", default=None)
@click.option("--priority", type=int, default=None)
@click.option("--deadline", type=float, default=None, help="Deadline, epoch seconds.")
@click.option("--user", default=None, help="The user the job runs for (a printable name).")
@click.option("--account", default=None, help="The account (project) charged, like Slurm's --account.")
@click.option("--cpu-usage", default=None, help="Estimated CPU use per process, e.g. 0.5 or 0.5,0.9.")
@click.option("--command", "command_", default=None, help="Command each process runs in its VM.")
@click.option("--work-seconds", type=float, default=None, help="Mock backend: work per process in seconds.")
@click.option("--cpu-need", type=float, default=None,
              help="vcsched: CPU need per VM, fraction of one host core (0 < x <= 1).")
@click.option("--mem", type=float, default=None, help="vcsched: memory need per VM, fraction of one host (0..1).")
@click.option("--shape", "shape_", default=None, metavar="JSON|@FILE",
              help="A moldable job or a task bag, e.g. '{\"kind\": \"moldable\", \"table\": {\"2\": 100, \"4\": 60}}' "
                   "or '{\"kind\": \"task-bag\", \"tasks\": [10, 10, 10], \"max_workers\": 2}' "
                   "(docs/workloads.md); --procs and --estimate then default from it.")
@click.option("--file", "-f", "file_", default=None, metavar="PATH",
              help="YAML/JSON job spec(s) ('-' for stdin); several are submitted as one batch.")
@api_options
def job_submit(
    procs: int | None, estimate: float | None, name: str | None, priority: int | None, deadline: float | None,
    cpu_usage: str | None, command_: str | None, work_seconds: float | None, cpu_need: float | None,
    mem: float | None, user: str | None, account: str | None, shape_: str | None, file_: str | None,
    url: str | None, token: str | None, ca: str | None, output: str,
) -> None:
    """Submit a job (options) or jobs (--file)."""
    client = _client(url, token, ca)
    if file_ is not None:
        if procs is not None or estimate is not None or shape_ is not None:
            raise errors.UserError(where="job submit",
                                   problem="give either --file or --procs/--estimate/--shape, not both")
        specs = load_job_file(file_)
    else:
        spec = build_job_spec(
            procs=procs, estimate=estimate, name=name, priority=priority, deadline=deadline, cpu_usage=cpu_usage,
            command=command_, work_seconds=work_seconds, cpu_need=cpu_need, mem=mem, user=user, account=account,
            shape=None if shape_ is None else parse_shape_option(shape_),
        )
        specs = [spec]
    jobs, warnings = client.submit(specs)
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    show(submit_envelope(jobs, warnings, one=file_ is None), output, lambda: job_table(jobs, title="submitted"))


def submit_envelope(jobs: list[dict[str, Any]], warnings: list[str], one: bool) -> dict[str, Any]:
    """``job submit -o json``, as the API answers (docs/operations.md "JSON envelopes"): ``jobs`` holds
    every job submitted (a file is a batch, even of one job), and a job submitted by options is also
    under ``job``, as ``job show`` prints it; ``warnings`` is always there (a list, often empty)."""
    doc: dict[str, Any] = {"job": jobs[0]} if one and len(jobs) == 1 else {}
    doc.update(jobs=jobs, warnings=warnings)
    return doc


@job.command("list")
@click.option("--state", type=click.Choice(JOB_STATES), default=None)
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="At most this many jobs: the newest ones (--oldest: the oldest ones).")
@click.option("--oldest", is_flag=True, help="With --limit, keep the oldest jobs instead of the newest.")
@wide_api_options
def job_list(
    state: str | None, limit: int | None, oldest: bool, url: str | None, token: str | None, ca: str | None,
    output: str,
) -> None:
    """List jobs in submission order (oldest first); --limit N keeps the newest N.

    Each job in its shape's terms: WIDTH is a rigid job's processes, a moldable job's chosen width of
    its allowed ones (4 of 1..8), a task bag's workers now; TIME the estimate, the moldable job's time at
    its width, the task bag's tasks done and work left. STATE says how a job's VMs run: fg/bg, a gang
    job's row (row 1+2: replicated in row 2), a shared VM's CPU cap. The last column is where the job
    runs, else its reason. -o wide adds the priority, submit and end times, migrations and the reason
    beside the placement."""
    if oldest:
        jobs = _client(url, token, ca).list_jobs(state, limit)
    else:
        jobs = list(reversed(_client(url, token, ca).list_jobs(state, limit, order="newest")))
    title = None
    if limit is not None and len(jobs) >= limit:
        other = "" if oldest else " (--oldest for the oldest)"
        title = f"the {'oldest' if oldest else 'newest'} {limit} jobs{other}"
    show({"jobs": jobs}, output, lambda: job_table(jobs, title=title, wide=output == "wide"))


JOB_KEYS = ("id", "name", "user", "account", "state", "tier", "procs", "shape", "width", "width_reason", "estimate",
            "work_left", "priority", "deadline",
            "submit_time", "start_time", "end_time", "placement", "runs", "requeues", "migrations", "reason", "tasks")


def history_text(history: Any) -> str:
    """A job's history, one line per entry: time, event, detail."""
    entries = [h for h in history or () if isinstance(h, Mapping)]
    if not entries:
        return "history: none recorded"
    lines = ["history:"]
    for h in entries:
        detail = f": {h['detail']}" if h.get("detail") else ""
        # each entry on its own line: a break inside a detail is shown as an escape, not as a new entry
        lines.append(safe_text(f"  {fmt_when(h.get('time'))}  {h.get('event')}{fmt_reason(detail)}"))
    return "\n".join(lines)


def shape_text(raw: Any) -> str:
    """A job's shape as ``job show`` prints it: ``rigid`` or one line (``vmctl.shapes.shape_summary``);
    a shape this client cannot read is printed as it came."""
    if raw is None:
        return "rigid"
    from vmctl.shapes import shape_from_json, shape_summary

    try:
        return shape_summary(shape_from_json(raw))
    except errors.ValidationError:
        return str(raw)


def gang_text(g: Mapping[str, Any]) -> str:
    """A gang job's row and times: ``row 1 (+ rows 2); run 1 h 20 min, of which active 32 min; the
    limit (estimate) counts active time``."""
    reps = [str(r) for r in g.get("replicas") or []]
    rows = f"row {g.get('row')}" + (f" (+ row{'s' if len(reps) > 1 else ''} {', '.join(reps)})" if reps else "")
    if g.get("run_s") is None:
        return rows
    return (f"{rows}; run {fmt_duration(g['run_s'])}, of which active {fmt_duration(g.get('active_s') or 0)}; "
            "the limit (estimate) counts active time")


#: fields ``job show`` prints inside others (width, tasks), in the job's shape's terms
_FOLDED = ("width_time", "tasks_total", "tasks_done", "tasks_left")


def shape_view(j: Mapping[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """``job show``'s fields in the job's shape's terms, and the fields it leaves out: a moldable job's
    chosen width of its allowed ones with its time there (not the spec's procs and estimate: its
    smallest width and the time there), a task bag's workers now and work left (not its procs, the
    most workers), a gang job's row, a shared VM's cap (``-o json`` has every field)."""
    shown: dict[str, Any] = dict(j)
    hidden = set(_FOLDED)
    kind = job_kind(j)
    raw = j.get("shape")
    shape: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    if "shape" in j:
        shown["shape"] = shape_text(j.get("shape"))
    width = j.get("width")
    if kind == "moldable":
        hidden.update(("procs", "estimate"))
        allowed = fmt_widths(shape.get("widths") or ())
        if width is None:
            shown["width"] = f"not chosen yet (widths {allowed})"
        else:
            at = j.get("width_time")
            ended = "" if j.get("placement") else " (its last run)"
            shown["width"] = f"{width} of widths {allowed}{ended}" + (
                f", {fmt_duration(at)} at that width" if at is not None else "")
    elif kind == "task-bag":
        hidden.add("procs")
        most = shape.get("max_workers", j.get("procs"))
        shown["width"] = f"{width or 'no'} worker{'s' if width != 1 else ''} now (at most {most})"
        if j.get("work_left") is not None:
            shown["work_left"] = f"{fmt_duration(j.get('work_left'))} of work (on a standard core) in " \
                                 f"{int(j.get('tasks_total') or 0) - int(j.get('tasks_done') or 0)} task(s)"
    else:
        hidden.add("work_left")
    gang = j.get("gang")
    if isinstance(gang, Mapping):
        shown["gang"] = gang_text(gang)
        shown["tier"] = f"{fmt_runs_as(j)} (gang: a row of the timeslice matrix)"
    elif j.get("tier") == "shared":
        cap = "no cap" if j.get("cap") is None else f"each VM capped at {fmt_cap(j.get('cap'))} of a core"
        shown["tier"] = f"shared (unpinned VMs, {cap})"
    return shown, hidden


@job.command("show")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@api_options
def job_show(job_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Show one job in its shape's terms (a moldable job's chosen width and its time there, a task bag's
    workers and work left, a gang job's row, a shared VM's cap) and its history."""
    j = _client(url, token, ca).get_job(job_id)
    keys = [k for k in JOB_KEYS if k in j] + [k for k in j if k not in JOB_KEYS and k != "history"]

    def render() -> Any:
        shown, hidden = shape_view(j)
        kept = [k for k in keys if k not in hidden]
        if "history" not in j:
            return kv_table(shown, kept)
        return Group(kv_table(shown, kept), Text(safe_lines(history_text(j.get("history")))))

    show({"job": j}, output, render)


def _job_verb(name: str, help_text: str, call: Callable[[ApiClient, str], dict[str, Any]],
              said: Callable[[Mapping[str, Any]], str]) -> None:
    """A ``vmctl job NAME JOB`` command that calls the daemon once and says what became of the job."""

    @job.command(name, help=help_text)
    @click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
    @api_options
    def verb(job_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
        j = call(_client(url, token, ca), job_id)
        show({"job": j}, output, lambda: said(j))


_job_verb("cancel", "Cancel a job (idempotent).", ApiClient.cancel_job,
          lambda j: f"job {j.get('id')}: {j.get('state')}")


_job_verb("release", "Release a held job back to its place in the queue.", ApiClient.release_job,
          lambda j: f"job {j.get('id')}: released")


@job.command("hold")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--reason", default=None, metavar="TEXT", help="Why (shown as the job's reason and in the events).")
@api_options
def job_hold(job_id: str, reason: str | None, url: str | None, token: str | None, ca: str | None,
             output: str) -> None:
    """Hold a queued job: it stays queued but does not start until released (kept across daemon restarts)."""
    j = _client(url, token, ca).hold_job(job_id, reason)
    show({"job": j}, output, lambda: f"job {j.get('id')}: held" + (f" ({reason})" if reason else ""))


@job.command("requeue")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--reason", default=None, metavar="TEXT", help="Why (shown as the job's reason and in the events).")
@click.option("--hold", is_flag=True, help="Hold it as it goes back (it does not start until released).")
@api_options
def job_requeue(job_id: str, reason: str | None, hold: bool, url: str | None, token: str | None, ca: str | None,
                output: str) -> None:
    """Put a running or suspended job back in the queue. Its VMs are removed and its progress is LOST: the
    next start is a new run from the beginning. It keeps its place in the queue (its submit time)."""
    j = _client(url, token, ca).requeue_job(job_id, reason, hold)
    show({"job": j}, output, lambda: f"job {j.get('id')}: requeued{' and held' if hold else ''} "
                                     f"(run {j.get('runs')} ended; its progress is lost, the next run starts over)")


@job.command("update")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--estimate", "-t", type=float, default=None, help="New run-time estimate in seconds.")
@click.option("--priority", type=int, default=None, help="New priority.")
@click.option("--deadline", default=None, metavar="TIME",
              help="New deadline: epoch seconds or ISO 8601 (local zone unless given); 'none' removes it.")
@api_options
def job_update(job_id: str, estimate: float | None, priority: int | None, deadline: str | None, url: str | None,
               token: str | None, ca: str | None, output: str) -> None:
    """Change the estimate, priority or deadline of a queued job (a running job: requeue it first)."""
    changes: dict[str, Any] = {}
    if estimate is not None:
        changes["estimate"] = estimate
    if priority is not None:
        changes["priority"] = priority
    if deadline is not None:
        try:
            changes["deadline"] = None if deadline.strip().lower() == "none" else timefmt.parse_time(deadline)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--deadline") from exc
    if not changes:
        raise errors.UserError(where="job update", problem="give at least one of --estimate, --priority, --deadline")
    j = _client(url, token, ca).update_job(job_id, changes)
    show({"job": j}, output, lambda: kv_table(j, ["id", "name", "state", "estimate", "priority", "deadline",
                                                   "reason"]))


def explain_text(doc: Mapping[str, Any]) -> str:
    """A sentence or three on why a job waits. The position counts the queued jobs only, in the order the
    policy considers them (``SchedulingPolicy.queue_order``: multifactor, SJF): under a two-tier
    policy (KEASY, REASY, MEASY) a running bg job submitted earlier goes to fg before them, and the
    reason says so; only the migrations of the current run are listed (the daemon leaves out earlier
    runs')."""
    job_id = doc.get("job_id")
    state = doc.get("state")
    lines = [f"job {job_id} is {state}"]
    pos = doc.get("queue_position")
    if isinstance(pos, int) and not isinstance(pos, bool):  # the API counts from 0 (the first queued job)
        ahead = "no queued job ahead of it" if pos == 0 else f"{pos} queued job(s) ahead of it"
        lines[0] += f", position {pos + 1} in the queue ({ahead})"
    if doc.get("reason"):
        lines.append(f"reason: {fmt_reason(doc['reason'])}")
    if doc.get("held"):
        lines.append(f"held: it does not start until released (vmctl job release {job_id})")
    run = doc.get("run")
    if state == JobState.QUEUED and isinstance(run, int) and not isinstance(run, bool) and run > 0:
        lines.append(f"run {run} ended (requeued); its next start is run {run + 1}, from the beginning")
    blocked = fmt_blocked(doc.get("blocked_by"))
    if blocked:
        lines.append(f"nodes: only {blocked} keep it waiting: the ready nodes have too few cores for it; it can "
                     f"start once enough of them are back (vmctl node undrain, or their agents report again)")
    res = doc.get("reservation")
    if isinstance(res, dict) and res:
        holder = res.get("job_id")
        when = f"{fmt_when(res.get('shadow_time'))} (shadow time)"
        extra = f"{res.get('extra_cores')} extra core(s) may be backfilled until then"
        if str(holder) == str(job_id):
            what = ("this job holds the reservation: it moves to fg" if res.get("holder_tier") == "bg"
                    else "this job holds the reservation: it starts")
        elif res.get("holder_tier") == "bg":
            what = f"job {holder}, running in bg, holds the reservation: it moves to fg"
        else:
            what = f"job {holder} holds the reservation: it starts"
        lines.append(f"reservation: {what} at the latest at {when}; {extra}")
    elif state == JobState.QUEUED and not doc.get("held"):
        lines.append("reservation: none held now (no job has cores reserved for it)")
    for m in doc.get("migrations") or ():
        if isinstance(m, Mapping):
            to = ", ".join(str(t) for t in m.get("to") or ()) or "-"
            note = f": {m['note']}" if m.get("note") else ""
            lines.append(f"migration {m.get('id')} to {to} ({m.get('origin') or 'policy'}): {m.get('state')}{note}")
    return "\n".join(lines)


@job.command("explain")
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@api_options
def job_explain(job_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Why is a job waiting, and which reservation blocks it."""
    doc = _client(url, token, ca).explain_job(job_id)
    show(doc, output, lambda: explain_text(doc))
