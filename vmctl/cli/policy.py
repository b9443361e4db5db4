"""``vmctl policy``: show, list, set (with ``--relayout``) and cancel a switch of the policy."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click

from vmctl import errors
from vmctl.cli.connect import _client, api_options
from vmctl.cli.render import Grid, show
from vmctl.timefmt import fmt_duration


@click.group()
def policy() -> None:
    """Show or change the daemon's scheduling policy."""


def _layout_text(lay: Mapping[str, Any] | None) -> str:
    if not lay:
        return "-"
    n = lay.get("levels")
    return f"{n} {lay.get('discipline')} level{'s' if n != 1 else ''} per core"


def _needs_text(needs: Mapping[str, Any] | None) -> str:
    if not needs:
        return "-"
    n = needs.get("levels")
    parts = [f"{n} level{'s' if n != 1 else ''}", "/".join(needs.get("disciplines") or []) or "any discipline",
             "/".join(needs.get("shapes") or [])]
    if needs.get("shared_vms"):
        parts.append("shared VMs")
    return ", ".join(parts)


def _params_text(params: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted((params or {}).items())) or "-"


def switch_line(sw: Mapping[str, Any]) -> str:
    """One line of a switch's progress: ``draining 42 s: waiting for ...``."""
    return f"{sw.get('phase')} {fmt_duration(float(sw.get('elapsed_s') or 0.0))}: {sw.get('waiting_for')}"


def policy_text(doc: Mapping[str, Any]) -> str:
    """``vmctl policy show``: the policy, the cluster's layout, what the policy needs and waits for, and a
    switch in progress with each node's layout."""
    lay = doc.get("layout") or {}
    lines = [f"policy   {doc.get('name')} ({_params_text(doc.get('params'))})",
             f"layout   {_layout_text(lay)}" + (f" (set by {lay.get('set_by')})" if lay.get("set_by") else ""),
             f"needs    {_needs_text(doc.get('needs'))}; laid out in "
             f"{_layout_text((doc.get('needs') or {}).get('layout'))}",
             f"waiting  {doc.get('waiting') or '-'}"]
    sw = doc.get("switch")
    if sw:
        lines.append(f"switch   {sw.get('from_policy')} -> {sw.get('policy')} ({_params_text(sw.get('params'))}) on "
                     f"{_layout_text(sw.get('layout'))}: {switch_line(sw)}")
        grid = Grid(("NODE", "STATE", "LAYOUT", "RE-LAID OUT", "WAITING FOR"),
                    [(str(n.get("name")), str(n.get("state")), _layout_text(n.get("layout")),
                      "yes" if n.get("relaid") else "no", str(n.get("waiting_for") or "-"))
                     for n in sw.get("nodes") or []])
        lines += ["", grid.to_text()]
        lines.append("cancel it with: vmctl policy cancel")
    return "\n".join(lines)


@policy.command("show")
@api_options
def policy_show(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """The active policy and its parameters, the cluster's layout, what the policy needs, what it waits
    for, and a policy switch in progress (its phase, the jobs it waits for, each node's layout)."""
    doc = _client(url, token, ca).get_policy()
    show(doc, output, lambda: policy_text(doc))


@policy.command("cancel")
@api_options
def policy_cancel(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Cancel the policy switch in progress: the old policy goes on, and nodes already re-laid out are
    laid out as before."""
    doc = _client(url, token, ca).cancel_policy_switch()
    show(doc, output, lambda: policy_text(doc))


def policy_catalog() -> list[dict[str, Any]]:
    """The registered policies with their summary, parameters (name, type, default, help) and needs (with
    the layout vmctld lays the hosts out in for them, at their default parameters): read from this
    installation, no daemon needed (the simulator takes the same names)."""
    from vmctl.policies.registry import available_policies, create_policy

    out = []
    for name, cls in sorted(available_policies().items()):
        params = [{"name": k, "type": kind.__name__, "default": default, "help": help_}
                  for k, (kind, default, help_) in sorted(cls.parameters.items())]
        try:
            needs = create_policy(name).needs.to_json()
        except errors.VmctlError:
            needs = cls.needs.to_json()
        out.append({"name": name, "summary": str(cls.summary or ""), "params": params, "needs": needs})
    return out


@policy.command("list")
@click.option("--output", "-o", "output", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Human table or JSON for scripts.")
def policy_list(output: str) -> None:
    """The policies vmctld and `vmctl sim run --policy` know, with their needs (VM levels per core,
    discipline, job shapes), the host layout vmctld lays the cluster out in for them
    (`vmctl policy set NAME --relayout`) and their parameters (`-p KEY=VALUE`). Offline: lists this
    installation's registry."""
    pols = policy_catalog()
    show({"policies": pols}, output, lambda: Grid(
        ("NAME", "NEEDS", "LAYOUT", "SUMMARY", "PARAMETERS"),
        [(p["name"], _needs_text(p["needs"]), _layout_text(p["needs"].get("layout")), p["summary"],
          ", ".join(f"{q['name']}={q['default']}" for q in p["params"]) or "-")
         for p in pols], cut=("PARAMETERS", "SUMMARY", "NEEDS")))


def parse_params(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` pairs; values are read as YAML scalars (``3`` int, ``0.5`` float, ``true``)."""
    out: dict[str, Any] = {}
    import yaml

    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise errors.UserError(where="--param", problem=f"{item!r} is not KEY=VALUE")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def parse_layout(text: str) -> dict[str, Any]:
    """``--layout DISCIPLINE:LEVELS`` (``timeslice:3``) as the API's layout object."""
    disc, sep, levels = text.partition(":")
    choices = ("priority", "timeslice", "shared")
    if not sep or disc not in choices or not levels.isdigit():
        raise errors.UserError(where="--layout", problem=f"{text!r} is not DISCIPLINE:LEVELS with DISCIPLINE one of "
                                                          f"{', '.join(choices)} (e.g. timeslice:3)")
    return {"discipline": disc, "levels": int(levels)}


@policy.command("set")
@click.argument("name")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Policy parameter (repeat).")
@click.option("--relayout", is_flag=True,
              help="Switch family: drain (running jobs end, nothing is killed, queued jobs wait), re-lay the hosts "
                   "out in the layout the policy needs, then switch.")
@click.option("--layout", "layout", default=None, metavar="DISCIPLINE:LEVELS",
              help="The layout to re-lay the hosts out in (default: the policy's, `vmctl policy list`); implies "
                   "--relayout.")
@click.option("--wait/--no-wait", "wait", default=True, show_default=True,
              help="With --relayout: follow the switch until it is done, printing what it waits for.")
@click.option("--poll", "poll", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Seconds between looks at the switch's progress.")
@api_options
def policy_set(
    name: str, params: tuple[str, ...], relayout: bool, layout: str | None, wait: bool, poll: float, url: str | None,
    token: str | None, ca: str | None, output: str,
) -> None:
    """Switch to policy NAME (applies from the next scheduling cycle). A policy of another family needs
    another host layout (MEASY: 2 priority levels; gang: MPL timeslice rows; vcsched and task bags:
    shared): `--relayout` drains, re-lays out and switches in one command, showing what it waits for
    (Ctrl-C stops following, not the switch: `vmctl policy show`, `vmctl policy cancel`)."""
    client = _client(url, token, ca)
    lay = parse_layout(layout) if layout is not None else None
    doc = client.set_policy(name, parse_params(params), relayout=relayout or lay is not None, layout=lay)
    sw = doc.get("switch")
    if not sw or not wait:
        show(doc, output, lambda: policy_text(doc))
        return
    import time

    target = sw.get("policy")
    click.echo(f"switching {sw.get('from_policy')} -> {target} on {_layout_text(sw.get('layout'))}", err=True)
    last = ""
    try:
        while doc.get("switch"):
            line = switch_line(doc["switch"])
            if line.split(": ", 1)[-1] != last.split(": ", 1)[-1]:
                click.echo(line, err=True)
            last = line
            time.sleep(poll)
            doc = client.get_policy()
    except KeyboardInterrupt:
        click.echo("stopped following; the switch goes on in vmctld: `vmctl policy show` follows it, "
                   "`vmctl policy cancel` ends it", err=True)
        sys.exit(130)
    if doc.get("name") != target:
        raise errors.Conflict(what="policy switch", problem=f"ended without switching to {target} (cancelled?); "
                                                            f"the policy is {doc.get('name')}")
    click.echo(f"switched to {target} on {_layout_text(doc.get('layout'))}", err=True)
    show(doc, output, lambda: policy_text(doc))
