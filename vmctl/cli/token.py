"""``vmctl token``: issue, list and revoke API tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from vmctl.cli.connect import _client, api_options
from vmctl.cli.render import Grid, fmt_time, kv_table, show


@click.group()
def token() -> None:
    """API tokens for operators and scripts."""


@token.command("issue")
@click.option("--name", required=True, help="Who or what the token is for.")
@click.option("--role", type=click.Choice(["read", "admin"]), default="read", show_default=True)
@click.option("--ttl", "ttl", type=click.FloatRange(min=0, min_open=True), default=None, help="Lifetime in seconds.")
@api_options
def token_issue(
    name: str, role: str, ttl: float | None, url: str | None, token: str | None, ca: str | None, output: str,
) -> None:
    """Issue a bearer token (needs an admin token). The token is shown once."""
    doc = _client(url, token, ca).issue_token(name, role, ttl)
    show(doc, output, lambda: kv_table(doc, [k for k in ("token", "name", "role", "expires") if k in doc]))


def token_table(tokens: Sequence[Mapping[str, Any]]) -> Grid:
    return Grid(("ID", "NAME", "ROLE", "CREATED", "EXPIRES"),
                [(str(t.get("id", "")), str(t.get("name", "")), str(t.get("role", "")), fmt_time(t.get("created")),
                  "never" if t.get("expires") is None else fmt_time(t.get("expires"))) for t in tokens])


@token.command("list")
@api_options
def token_list(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List the API tokens (needs an admin token): id, name, role, expiry; never the tokens themselves."""
    tokens = _client(url, token, ca).list_tokens()
    show({"tokens": tokens}, output, lambda: token_table(tokens))


@token.command("revoke")
@click.argument("token_id", metavar="ID|NAME")
@api_options
def token_revoke(token_id: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Revoke a token by its id (from `token list`) or its name (when one token has it). The last
    admin token cannot be revoked (exit 4): issue another one first."""
    t = _client(url, token, ca).revoke_token(token_id)
    show({"token": t}, output, lambda: f"revoked token {t.get('id')} ({t.get('name')}, {t.get('role')})")
