"""``vmctl cert``: issue (the key made here or on the node), list and revoke agent certificates."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from vmctl import errors
from vmctl.cli.connect import _client, api_options, wide_api_options
from vmctl.cli.render import Grid, _now, emit_json, fmt_column_time, fmt_time, show


@click.group()
def cert() -> None:
    """Client certificates for node agents (from the cluster CA)."""


@cert.command("issue")
@click.argument("node_name", metavar="NODE")
@click.option("--out-dir", type=click.Path(file_okay=False), default=None,
              help="Write NODE.crt, NODE.key (mode 0600; not with --csr) and ca.crt here.")
@click.option("--csr", "csr_file", type=click.Path(dir_okay=False), default=None,
              help="Sign this certificate signing request (PEM, made on the node: its key stays there) "
                   "instead of making a key here.")
@api_options
def cert_issue(
    node_name: str, out_dir: str | None, csr_file: str | None, url: str | None, token: str | None, ca: str | None,
    output: str,
) -> None:
    """Issue a client certificate for the agent of NODE (CN=node:NODE). The private key is made here
    (or, with --csr, on the node) and only a signing request goes to vmctld: the key never travels."""
    if out_dir is None and output != "json":
        raise errors.UserError(where="cert issue", problem="give --out-dir DIR (or --output json to print the PEMs)")
    from vmctl import auth, files

    auth.check_node_name(node_name, "NODE")  # the rule vmctld applies: a name that fits CN=node:<name>
    key_pem: str | None = None
    if csr_file is not None:
        try:
            csr_pem = Path(csr_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise errors.UserError(where=f"--csr {csr_file}", problem=f"cannot read it: {exc}") from exc
    else:
        csr_pem, key_pem = auth.new_csr(node_name)
    doc = _client(url, token, ca).issue_cert(node_name, csr_pem)
    doc.pop("key_pem", None)
    if key_pem is not None:
        doc["key_pem"] = key_pem
    if out_dir is None:
        emit_json(doc)
        return
    written = files.write_cert_files(Path(out_dir), node_name, doc)
    show({"files": [str(p) for p in written]}, output, lambda: "\n".join(f"wrote {p}" for p in written))


#: hex digits of a serial as the CLI prints it: 20 bytes, the most RFC 5280 allows and what vmctld's
#: random serials fill (159 random bits); shorter ones are zero-padded so that every serial has one width
SERIAL_DIGITS = 40


def fmt_serial(serial: Any) -> str:
    """A certificate serial at a fixed width: upper-case hex zero-padded to ``SERIAL_DIGITS`` digits. The
    API answers it without leading zeros (its canonical form, how vmctld keys its registry: an integer
    with about one chance in 16 of a leading zero digit printed 39 digits wide, 1 in 256 of 38 ...);
    ``cert revoke`` takes either. Anything else (not hex, or longer) is printed as it came."""
    text = str(serial or "")
    if not text or len(text) > SERIAL_DIGITS or any(ch not in "0123456789abcdefABCDEF" for ch in text):
        return text or "-"
    return text.upper().rjust(SERIAL_DIGITS, "0")


def cert_table(certs: Sequence[Mapping[str, Any]], wide: bool = False) -> Grid:
    """The certificates, a row each: the full 40-digit serial (what ``cert revoke`` takes), node, validity and
    state, fitting 100 columns (short times, a retired one's time left out, NODE then STATE cut first);
    ``wide`` adds KEY MADE BY and every time in ISO 8601."""
    now = _now()

    def state(c: Mapping[str, Any]) -> str:
        if c.get("revoked") is not None:
            return f"revoked {fmt_column_time(c.get('revoked'), wide)}"
        if c.get("retired") is not None:
            when = f" {fmt_time(c.get('retired'))}" if wide else ""
            return f"retired{when} (its CA rotated out)"
        expires = c.get("expires")
        return "expired" if isinstance(expires, int | float) and expires < now else "valid"

    headers = ("SERIAL", "NODE", "ISSUED", "EXPIRES", "STATE") + (("KEY MADE BY",) if wide else ())
    rows = [(fmt_serial(c.get("serial")), str(c.get("node", "")), fmt_column_time(c.get("issued"), wide),
             fmt_column_time(c.get("expires"), wide), state(c)) + ((str(c.get("key_from") or "-"),) if wide else ())
            for c in certs]
    return Grid(headers, rows, cut=("NODE", "STATE"))


@cert.command("list")
@wide_api_options
def cert_list(url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """List the agent certificates vmctld issued: serial, node, validity, revoked or not (never a key)."""
    certs = _client(url, token, ca).list_certs()
    show({"certs": certs}, output, lambda: cert_table(certs, wide=output == "wide"))


@cert.command("revoke")
@click.argument("key", metavar="SERIAL|NODE")
@api_options
def cert_revoke(key: str, url: str | None, token: str | None, ca: str | None, output: str) -> None:
    """Revoke one certificate by its serial (from `cert list`; leading zeros optional), or every valid
    certificate of NODE. Its agent is refused from then on (401) until it gets a new certificate (`cert
    issue NODE`)."""
    revoked = _client(url, token, ca).revoke_cert(key)
    show({"revoked": revoked}, output, lambda: "\n".join(
        f"revoked certificate {fmt_serial(c.get('serial'))} of node {c.get('node')}" for c in revoked)
        or "nothing to revoke")
