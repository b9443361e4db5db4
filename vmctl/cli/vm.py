"""``vmctl vm``: list and show VMs, show and set a VM's priority."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from vmctl import errors
from vmctl.cli.connect import _client, _complete, api_options, wide_api_options
from vmctl.cli.render import fmt_cap, fmt_names, show, vm_table, vm_text


@click.group()
def vm() -> None:
    """Inspect VMs and change their CPU priority (tier, weight, cap, pinning)."""


@vm.command("list")
@click.option("--node", default=None, help="Only VMs of this node.", shell_complete=_complete("node"))
@wide_api_options
def vm_list(node: str | None, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List VMs as their agents report them (desired beside, where it differs): the job VMs and the
    idle VMs of each core's fg and bg slot (with libvirt layouts). Long cells are cut to fit the
    screen; -o wide prints them in full."""
    vms = _client(url, token, ca).list_vms(node)
    show({"vms": vms}, output, lambda: vm_table(vms))


@vm.command("show")
@click.argument("name", shell_complete=_complete("vm"))
@api_options
def vm_show(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Show one VM."""
    v = _client(url, token, ca).get_vm(name)
    show({"vm": v}, output, lambda: vm_text(v))


@vm.group("priority")
def vm_priority() -> None:
    """CPU priority of a VM: show it, or set it."""


def _core(c: Any) -> str:
    """A VM's core; ``-`` for none (an unpinned shared VM reports -1)."""
    return "-" if c is None or (isinstance(c, int) and c < 0) else str(c)


def priority_text(v: Mapping[str, Any]) -> str:
    """``vmctl vm priority show``: the VM's tier, weight, cap and core as vmctld wants them and as its
    agent last reported them, and how to change them."""
    name, o = v.get("name"), v.get("observed")
    head = f"vm {name} on {v.get('node')}"
    seen = ""
    if isinstance(o, Mapping):
        w = o.get("weight")
        seen = (f"observed: weight {'-' if w is None else w}, cap {fmt_cap(o.get('cap'))}, core "
                f"{_core(o.get('core'))} (as {o.get('node') or v.get('node')}'s agent last reported)")
    if v.get("managed") is False or not v.get("job_id"):
        lines = [f"{head}: no job; its priority is the agent's layout's ({v.get('role') or '-'} slot), which "
                 f"`vm priority set` does not change"]
        return "\n".join([*lines, seen] if seen else lines)
    lines = [f"{head}: job {v.get('job_id')}",
             f"desired:  tier {v.get('role')}, weight {v.get('weight')}, cap {fmt_cap(v.get('cap'))}, core "
             f"{_core(v.get('core'))}",
             seen or "observed: not reported by its agent yet"]
    diff = [str(k) for k in v.get("differs") or ()]
    if diff:
        lines.append("differs in: " + ", ".join(diff) + " (not applied by its agent yet, or refused: see "
                     "`vmctl node show`)")
    lines.append(f"tier, weight and cap are the job's (every VM of job {v.get('job_id')}); change them with "
                 f"vmctl vm priority set {name} --tier fg|bg --weight N --cap PCT|none, or pin this VM with --pin CORE")
    return "\n".join(lines)


@vm_priority.command("show")
@click.argument("name", shell_complete=_complete("vm"))
@api_options
def vm_priority_show(name: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Show the CPU priority of VM NAME: its tier, weight, cap and core, desired and as its agent reports
    them (-o json: the VM document, as `vm show` prints it)."""
    v = _client(url, token, ca).get_vm(name)
    show({"vm": v}, output, lambda: priority_text(v))


def parse_cap(value: str | None) -> tuple[bool, float | None]:
    """``--cap`` is a percentage of one core in (0, 100], or ``none`` to uncap. Returns (given, cap)."""
    if value is None:
        return False, None
    if value.strip().lower() in ("none", "off", "unlimited"):
        return True, None
    try:
        pct = float(value.rstrip("%"))
    except ValueError as exc:
        raise errors.UserError(where="--cap", problem=f"{value!r} is not a percentage or 'none'") from exc
    if not 0 < pct <= 100:
        raise errors.OutOfRange(what="--cap", value=value, allowed="0 < PCT <= 100, or 'none'")
    return True, pct / 100.0


@vm_priority.command("set")
@click.argument("name", shell_complete=_complete("vm"))
@click.option("--tier", type=click.Choice(["fg", "bg"]), default=None,
              help="Move the VM's job (all its VMs) to the fg or bg tier.")
@click.option("--weight", type=click.IntRange(1, 10000), default=None,
              help="CPU weight 1..10000 of every VM of the job.")
@click.option("--cap", "cap", default=None, metavar="PCT",
              help="CPU cap of every VM of the job, in percent of one core, or 'none'.")
@click.option("--pin", type=click.IntRange(min=0), default=None, metavar="CORE",
              help="Move VM NAME alone to this local core of its node.")
@api_options
def vm_priority_set(
    name: str, tier: str | None, weight: int | None, cap: str | None, pin: int | None,
    url: str | None, token: str | None, ca: str | None, output: str,
) -> None:
    """Change the CPU priority of the job VM NAME runs, or pin VM NAME.

    A job's processes share one tier, weight and cap, so --tier, --weight and --cap apply to every VM
    of the job (the output lists them); --pin moves VM NAME alone. Idle core VMs (no job) keep the
    priority of the agent's layout: changing one is a conflict (exit 4)."""
    body = build_priority_body(tier, weight, cap, pin)
    doc = _client(url, token, ca).set_vm_priority_doc(name, body)
    v = doc.get("vm") or {}
    applied = [str(x) for x in doc.get("applied_to") or ()]

    def text() -> str:
        out = vm_text(v)
        if applied:
            out += f"\napplied to {len(applied)} VM(s): {fmt_names(applied)}"
        return out

    show(doc, output, text)


def build_priority_body(tier: str | None, weight: int | None, cap: str | None, pin: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if tier is not None:
        body["tier"] = tier
    if weight is not None:
        body["weight"] = weight
    given, capv = parse_cap(cap)
    if given:
        body["cap"] = capv
    if pin is not None:
        body["pin"] = pin
    if not body:
        raise errors.UserError(where="vm priority set", problem="give at least one of --tier, --weight, --cap, --pin")
    return body
