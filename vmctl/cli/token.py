"""``vmctl token``: issue, list and revoke API tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import click

from vmctl import auth, errors
from vmctl.apiclient import ApiClient
from vmctl.cli.connect import _client, api_options, wide_api_options
from vmctl.cli.render import Grid, fmt_column_time, kv_table, show


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


def token_table(tokens: Sequence[Mapping[str, Any]], wide: bool = False) -> Grid:
    return Grid(("ID", "NAME", "ROLE", "CREATED", "EXPIRES"),
                [(str(t.get("id", "")), str(t.get("name", "")), str(t.get("role", "")),
                  fmt_column_time(t.get("created"), wide),
                  "never" if t.get("expires") is None else fmt_column_time(t.get("expires"), wide)) for t in tokens],
                cut=("NAME",))


@token.command("list")
@wide_api_options
def token_list(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List the API tokens (needs an admin token): id, name, role, expiry; never the tokens themselves."""
    tokens = _client(url, token, ca).list_tokens()
    show({"tokens": tokens}, output, lambda: token_table(tokens, wide=output == "wide"))


def _own_token(client: ApiClient, key: str) -> Mapping[str, Any] | None:
    """The token ``key`` (an id or a name, as ``revoke`` takes it) when it is the one ``client`` sends
    (``--token`` / ``VMCTL_TOKEN``), else None. The ids are the first digits of the token's hash."""
    if not client.token:
        return None
    mine = auth.hash_token(client.token)
    tokens = client.list_tokens()
    hit = [t for t in tokens if t.get("id") == key] or [t for t in tokens if t.get("name") == key]
    if len(hit) == 1 and isinstance(hit[0].get("id"), str) and hit[0]["id"] and mine.startswith(hit[0]["id"]):
        return hit[0]
    return None  # not ours, or a name several tokens share (the daemon refuses that one)


@token.command("revoke")
@click.argument("token_id", metavar="ID|NAME")
@click.option("--force", is_flag=True, help="Revoke it even when it is the token this command uses (every later "
                                            "command with it then fails with 'unknown token').")
@api_options
def token_revoke(token_id: str, force: bool, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Revoke a token by its id (from `token list`) or its name (when one token has it). The last
    admin token cannot be revoked (exit 4): issue another one first. The token this command uses is
    revoked only with --force (exit 4 without): the commands after it would be refused."""
    client = _client(url, token, ca)
    if not force:
        own = _own_token(client, token_id)
        if own is not None:
            raise errors.Conflict(
                what=f"token {own.get('id')} ({own.get('name')}, {own.get('role')})",
                problem="is the token this command uses (--token / VMCTL_TOKEN): once revoked, every later "
                        "command with it fails with 'unknown token'. Switch to another admin token first "
                        "(vmctl token issue --name NAME --role admin), or add --force to revoke it anyway")
    t = client.revoke_token(token_id)
    mine = " (the token this command used: later commands need another one)" if force and client.token and \
        auth.hash_token(client.token).startswith(str(t.get("id") or "-")) else ""
    show({"token": t}, output, lambda: f"revoked token {t.get('id')} ({t.get('name')}, {t.get('role')}){mine}")
