"""``vmctl ca``: show the cluster CA, rotate it and finish a rotation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from vmctl.cli.connect import _client, api_options
from vmctl.cli.render import Grid, fmt_time, show


@click.group("ca")
def ca_group() -> None:
    """The cluster CA: show it, and replace it (a leaked key) without stopping a job.

    \b
    1. vmctl ca rotate   a new CA signs from now on; both are trusted; agents renew by themselves
    2. copy STATE_DIR/ca.pem (both CAs) to every client's --ca, and wait until `vmctl ca show`
       lists every node on the new CA
    3. vmctl ca finish   the old CA is dropped: its certificates are refused from then on
    """


def ca_text(doc: Mapping[str, Any]) -> str:
    lines = [f"CA           {doc.get('fingerprint')}"]
    if doc.get("previous"):
        lines.append(f"previous CA  {doc.get('previous')} (rotation since {fmt_time(doc.get('rotating_since'))}; "
                     f"the server certificate is still of it; 'vmctl ca finish' drops it)")
    for r in doc.get("retired") or []:
        lines.append(f"retired CA   {r.get('fingerprint')} ({fmt_time(r.get('retired'))})")
    nodes = doc.get("nodes") or []
    if nodes:
        grid = Grid(("NODE", "CURRENT CA CERT", "PRESENTED", "OLD CA CERT"),
                    [(str(n.get("node")), "yes" if n.get("current_ca") else "no",
                      "-" if n.get("seen_current_s") is None else f"{float(n['seen_current_s']):.0f} s ago",
                      "yes" if n.get("other_ca") else "no") for n in nodes])
        lines += ["", grid.to_text()]
    if doc.get("retired_certs"):
        lines.append(f"retired {len(doc['retired_certs'])} certificate(s) of the previous CA")
    return "\n".join(lines)


@ca_group.command("show")
@api_options
def ca_show(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """The cluster CA's fingerprint, a rotation in progress, and per node whether its agent holds (and
    presented) a certificate of the current CA."""
    doc = _client(url, token, ca).ca_info()
    show(doc, output, lambda: ca_text(doc))


@ca_group.command("rotate")
@api_options
def ca_rotate(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Start replacing the cluster CA: a new CA signs every certificate from now on, certificates of
    both are accepted, and each agent renews its own over its connection (its heartbeat tells it)."""
    doc = _client(url, token, ca).rotate_ca()
    show(doc, output, lambda: ca_text(doc) + "\nnext: copy STATE_DIR/ca.pem (both CAs) to the clients' --ca; "
                                             "when every node shows a current CA certificate: vmctl ca finish")


@ca_group.command("finish")
@click.option("--force", is_flag=True, help="Drop the old CA even though some nodes did not renew (their agents "
                                            "are refused until they get a new certificate).")
@api_options
def ca_finish(force: bool, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Finish a rotation: vmctld presents a server certificate of the new CA and refuses every
    certificate of the old one; agents replace their CA bundle by the new CA alone."""
    doc = _client(url, token, ca).finish_ca(force)
    show(doc, output, lambda: ca_text(doc))
