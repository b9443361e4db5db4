"""What every operator command shares: ``--url`` / ``--token`` / ``--ca`` / ``--output``, the API
client they make, and shell completion.

The operator commands (``vmctl vm|worker|job|node|top|migrate|op|policy|token|cert|ca``, one module per
group) talk to the daemon's HTTP API only (``vmctl.apiclient``), never to its store. Every command takes
``--url`` / ``--token`` / ``--ca`` (env ``VMCTL_URL``, ``VMCTL_TOKEN``, ``VMCTL_CA``) and
``--output table|json`` (``table|wide|json`` where a table leaves columns out): human tables by
default (rich, ``vmctl.cli.render``), JSON for scripts (the API object itself, so a script sees
the same fields as the API documents). Errors are vmctl errors, printed by
``vmctl.cli.main`` as ``error: <reference>: message`` with the exit code of their class.

Shell completion: ``eval "$(_VMCTL_COMPLETE=bash_source vmctl)"`` (zsh: ``zsh_source``, fish:
``fish_source``); job ids, node names and VM names complete from the daemon when it is reachable.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.shell_completion import CompletionItem

from vmctl import errors
from vmctl.apiclient import ApiClient

F = TypeVar("F", bound=Callable[..., Any])


def api_options(f: F) -> F:
    """``--url``, ``--token``, ``--ca``, ``--output`` on a leaf command (env vars as fallbacks)."""
    return _api_options(f, ("table", "json"), "Human table or JSON for scripts.")


def wide_api_options(f: F) -> F:
    """:func:`api_options` of a command whose table leaves columns out to fit 100 columns: ``-o wide``
    prints every column (``vmctl job list``, ``node list``, ``vm list``)."""
    return _api_options(f, ("table", "wide", "json"),
                        "Human table fitting the screen (COLUMNS, else the terminal, else 100 columns), "
                        "wide (every column, nothing cut) or JSON for scripts.")


def _api_options(f: F, outputs: tuple[str, ...], help_text: str) -> F:
    f = click.option(
        "--output", "-o", "output", type=click.Choice(outputs), default="table", show_default=True, help=help_text,
    )(f)
    f = click.option("--ca", envvar="VMCTL_CA", default=None, metavar="PEM",
                     help="CA bundle to verify an https:// daemon [env VMCTL_CA].")(f)
    f = click.option("--token", envvar="VMCTL_TOKEN", default=None, metavar="TOKEN",
                     help="Bearer token [env VMCTL_TOKEN].")(f)
    f = click.option("--url", envvar="VMCTL_URL", default=None, metavar="URL",
                     help="Daemon URL, default https://127.0.0.1:8443 [env VMCTL_URL].")(f)
    return f


def _client(url: str | None, token: str | None, ca: str | None) -> ApiClient:
    return ApiClient(url, token, ca=ca)


def _completion_client(ctx: click.Context) -> ApiClient:
    p = ctx.params
    return ApiClient(p.get("url") or os.environ.get("VMCTL_URL"), p.get("token"), ca=p.get("ca"), timeout=2.0)


def _complete(kind: str) -> Callable[[click.Context, click.Parameter, str], list[CompletionItem]]:
    def complete(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
        try:
            c = _completion_client(ctx)
            if kind == "job":
                names = [str(j.get("id")) for j in c.list_jobs(limit=200, order="newest")]
            elif kind == "node":
                names = [str(n.get("name")) for n in c.list_nodes()]
            else:
                names = [str(v.get("name")) for v in c.list_vms()]
        except errors.VmctlError:
            return []
        return [CompletionItem(n) for n in names if n.startswith(incomplete)]

    return complete
