"""``vmctl plan``: ask a task-bag dispatching policy (paper 001 sec. III) for a plan, offline.

Reads an instance file (workers and jobs, schema in ``vmctl.policies.dispatch.load_instance`` and
docs/policies.md) and prints ``{"assignment": {job: [workers]}, "unassigned_workers": [...],
"run_time_s"}``; nothing is applied anywhere (sec. II-B-3: "other frameworks can easily obtain the
result of the scheduling algorithm")."""

from __future__ import annotations

import json
import time

import click

from vmctl.cli.jsonfile import read_json
from vmctl.errors import InstanceFormatError, ValidationError
from vmctl.policies.dispatch import DISPATCH_POLICIES, load_instance, plan


@click.command("plan")
@click.argument("instance", type=click.Path(dir_okay=False))
@click.option("--policy", type=click.Choice(sorted(DISPATCH_POLICIES)), required=True)
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE",
              help="Policy parameter (repeat): r=0.2 (priority), horizon=3600 (workload), conserving=true.")
@click.option("--output", "-o", type=click.Choice(["json", "table"]), default="table", show_default=True)
def plan_cmd(instance: str, policy: str, params: tuple[str, ...], output: str) -> None:
    """Print the plan of POLICY for the workers and jobs in INSTANCE (JSON); nothing is applied."""
    from vmctl.cli.policy import parse_params

    doc = read_json(instance)
    try:
        workers, jobs = load_instance(doc)
    except ValidationError as exc:
        raise InstanceFormatError(path=instance, where=exc.fields.get("field", "$"),
                                  problem=exc.fields.get("problem", str(exc))) from exc
    t0 = time.perf_counter()
    result = plan(policy, workers, jobs, 0.0, parse_params(params))
    out = {**result.to_dict(), "run_time_s": time.perf_counter() - t0}
    if output == "json":
        click.echo(json.dumps(out, indent=2))
        return
    width = max([len("job"), *(len(j.id) for j in jobs)])
    click.echo(f"{'job':<{width}}  {'workers':>7}  tasks  ids")
    for j in jobs:
        held = result.assignment[j.id]
        click.echo(f"{j.id:<{width}}  {len(held):>7}  {j.tasks:>5}  {', '.join(held) or '-'}")
    click.echo(f"unassigned: {', '.join(result.unassigned) or '-'}")
    click.echo(f"run time: {out['run_time_s'] * 1000:.2f} ms")
