"""``vmctl node``: list, show, drain, undrain and remove nodes, confirm a node's cores."""

from __future__ import annotations

import click

from vmctl import errors
from vmctl.cli.connect import _client, _complete, api_options, wide_api_options
from vmctl.cli.render import node_table, node_text, show


@click.group()
def node() -> None:
    """List and show nodes; drain a node before maintenance and undrain it after."""


@node.command("list")
@wide_api_options
def node_list(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List nodes: state, cores busy with fg/bg VMs, utilization, the generation their agents applied,
    how long ago they reported and were seen, their agents' last error. -o wide adds the group, VM
    levels, core speed, memory, orphan VMs and migration peers."""
    nodes = _client(url, token, ca).list_nodes()
    show({"nodes": nodes}, output, lambda: node_table(nodes, wide=output == "wide"))


@node.command("show")
@click.argument("name", shell_complete=_complete("node"))
@api_options
def node_show(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """One node: state, the nodes it can migrate to, and its agent's last errors (a refused migration). A
    lost or down node shows what its agent last observed, with the report's age, beside what vmctld holds."""
    client = _client(url, token, ca)
    n = next((x for x in client.list_nodes() if x.get("name") == name), None)
    if n is None:
        raise errors.NotFound(kind="node", name=name)
    # a lost or down node's agent is silent: its VMs as last reported, for what it last observed
    vms = client.list_vms(name) if n.get("state") in ("lost", "down") and output != "json" else None
    show({"node": n}, output, lambda: node_text(n, vms))


@node.command("drain")
@click.argument("name", shell_complete=_complete("node"))
@click.option("--reason", default=None, metavar="TEXT", help="Why (shown in node list and node show).")
@api_options
def node_drain(name: str, reason: str | None, url: str | None, token: str | None, ca: str | None,
               output: str) -> None:
    """Stop placing new work on NAME (running jobs finish or are migrated by the policy)."""
    n = _client(url, token, ca).drain_node(name, reason)
    show({"node": n}, output, lambda: node_table([n]))


@node.command("remove")
@click.argument("name", shell_complete=_complete("node"))
@api_options
def node_remove(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Forget NAME for good: only a lost, down or drained node that holds no process (exit 4 otherwise).
    Its agent registering again brings it back."""
    n = _client(url, token, ca).remove_node(name)
    show({"node": n}, output, lambda: f"node {n.get('name')} removed (was {n.get('was')})")


@node.command("cores")
@click.argument("name", shell_complete=_complete("node"))
@click.argument("cores", type=click.IntRange(1, 4096))
@api_options
def node_cores(name: str, cores: int, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Confirm that NAME has CORES cores. A registered node's core count changes only this way: its
    agent's registration with another count is refused (node show: pending) until an operator confirms
    it. The count the agent asked for applies at once, another one when the agent registers it; NAME's
    current count declines what its agent asked for. Each is an event (vmctl events --node NAME)."""
    n = _client(url, token, ca).confirm_cores(name, cores)
    if n.get("cores") == cores:
        note = f"node {name} has {cores} cores"
    else:
        note = f"node {name} has {n.get('cores')} cores; {cores} applies when its agent registers that count"
    show({"node": n}, output, lambda: note)


@node.command("undrain")
@click.argument("name", shell_complete=_complete("node"))
@api_options
def node_undrain(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Make NAME schedulable again."""
    n = _client(url, token, ca).undrain_node(name)
    show({"node": n}, output, lambda: node_table([n]))
