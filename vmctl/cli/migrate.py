"""``vmctl migrate JOB --to NODE``: an operator migration."""

from __future__ import annotations

import click

from vmctl.cli.connect import _client, _complete, api_options
from vmctl.cli.render import show


@click.command()
@click.argument("job_id", metavar="JOB", shell_complete=_complete("job"))
@click.option("--to", "to_node", required=True, metavar="NODE", help="Target node.", shell_complete=_complete("node"))
@api_options
def migrate(job_id: str, to_node: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Migrate a running JOB to NODE (asynchronous: prints the operation)."""
    op = _client(url, token, ca).migrate_job(job_id, to_node)
    show({"operation": op}, output,
         lambda: f"operation {op.get('id')}: {op.get('kind')} {op.get('state')} (job {job_id} -> {to_node}); "
                 f"follow it with `vmctl op show {op.get('id')}`")
