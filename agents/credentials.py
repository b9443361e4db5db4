"""The agent keeps its own credentials current: it renews its client certificate and replaces its CA
bundle when vmctld says so, over the mTLS connection it already has (no operator step, no restart).

vmctld's heartbeat answer carries ``renew_cert`` (the certificate this agent presented is of a CA that
a rotation replaces, or expires soon) and ``ca_sha256`` (the digest of the CA bundle an agent must
trust: both CAs during a rotation, the new one only after it). ``CertRenewer.handle`` acts on them:

- renew: a new key and a signing request made here (the key never travels), ``POST
  /v1/agent/nodes/<node>/cert`` authenticated with the current certificate; the answer's certificate
  and CA bundle are written over ``daemon.cert_file``, ``daemon.key_file`` and ``daemon.ca_file``;
- CA bundle: ``GET /v1/agent/nodes/<node>/ca`` when ``ca_file`` differs, written over it.

Every connection of the agent notices the changed files at its next request and reconnects with them
(``http_source._Conn``). The key and the certificate are first written next to their files as
``<file>.new`` and then renamed, key first; a crash between the renames is finished by
``finish_renewal`` at the next start, so the agent never starts with a key that does not match its
certificate. A renewal that fails (files not writable, vmctld unreachable) is logged and tried again
at a later heartbeat; the agent keeps working with what it has.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

from vmctl import auth
from vmctl.agents.http_source import AgentEndpoint, _Conn
from vmctl.errors import VmctlError
from vmctl.files import replace_file

log = logging.getLogger("vmctl.agent.credentials")

#: after a failed renewal, wait this long before the next attempt (the heartbeat asks every beat)
RETRY_S = 30.0


def _new(path: str) -> Path:
    return Path(path + ".new")


def finish_renewal(ep: AgentEndpoint) -> bool:
    """Complete a renewal a crash interrupted between writing and renaming the new key and
    certificate (``<file>.new``); True when there was one."""
    key_new, cert_new = _new(ep.key_file), _new(ep.cert_file)
    if not cert_new.exists():
        key_new.unlink(missing_ok=True)  # the certificate never came: the old pair is intact
        return False
    if key_new.exists():
        os.replace(key_new, ep.key_file)
    os.replace(cert_new, ep.cert_file)
    log.warning("finished an interrupted certificate renewal: %s, %s", ep.cert_file, ep.key_file)
    return True


class CertRenewer:
    def __init__(self, ep: AgentEndpoint, retry_s: float = RETRY_S) -> None:
        self.ep = ep
        self.retry_s = retry_s
        self._conn: _Conn | None = None
        self._failed_at = -1e18
        self.renewals = 0
        self.ca_updates = 0
        self._warned_foreign = False

    def handle(self, answer: Any) -> None:
        """Act on a heartbeat answer (see the module doc). Never raises: a failure is logged."""
        if not isinstance(answer, dict) or time.monotonic() - self._failed_at < self.retry_s:
            return
        try:
            if answer.get("renew_cert") is True:
                self.renew()
            want = answer.get("ca_sha256")
            if isinstance(want, str) and want != self._ca_digest():
                self.update_ca(want)
        except (VmctlError, OSError, ValueError) as exc:
            self._failed_at = time.monotonic()
            log.error("could not renew the agent's credentials (retrying in %.0f s): %s", self.retry_s, exc)

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        if self._conn is None:
            self._conn = _Conn(self.ep)
        try:
            _status, doc = self._conn.request(method, f"/v1/agent/nodes/{self.ep.node}{path}", body)
        finally:
            self._conn.close()  # each renewal step on a fresh connection, with the files as they are now
        if not isinstance(doc, dict) or not isinstance(doc.get("ca_pem"), str):
            raise ValueError(f"vmctld's answer to {method} {path} has no ca_pem")
        return doc

    def _ca_digest(self) -> str | None:
        try:
            return hashlib.sha256(Path(self.ep.ca_file).read_bytes()).hexdigest()
        except OSError:
            return None

    def _ours(self) -> bool:
        try:
            return auth.only_cluster_cas(Path(self.ep.ca_file).read_text(encoding="utf-8", errors="replace"))
        except OSError:
            return False

    def renew(self) -> str:
        """A new key and certificate from vmctld; returns the new serial."""
        csr_pem, key_pem = auth.new_csr(self.ep.node)
        doc = self._request("POST", "/cert", {"csr_pem": csr_pem})
        cert_pem = doc.get("cert_pem")
        if not isinstance(cert_pem, str):
            raise ValueError("vmctld's renewal answer has no cert_pem")
        # the bundle first (it trusts the old CA and the new one), then the pair, key first
        if self._ours():
            replace_file(Path(self.ep.ca_file), str(doc["ca_pem"]), 0o644)
        replace_file(_new(self.ep.key_file), key_pem, 0o600)
        replace_file(_new(self.ep.cert_file), cert_pem, 0o644)
        finish_renewal(self.ep)
        self.renewals += 1
        serial = str(doc.get("serial", "?"))
        log.warning("renewed the agent's certificate: serial %s, written to %s", serial, self.ep.cert_file)
        return serial

    def update_ca(self, want: str) -> None:
        """Replace ``ca_file`` by vmctld's bundle: only a file of vmctl cluster CAs (one that holds any
        other certificate, a system bundle, is the operator's and is left alone, logged once)."""
        if not self._ours():
            if not self._warned_foreign:
                self._warned_foreign = True
                log.warning("%s holds certificates other than vmctl cluster CAs: not replacing it with vmctld's "
                            "CA bundle (put the cluster's ca.pem there yourself after a CA rotation)", self.ep.ca_file)
            return
        doc = self._request("GET", "/ca")
        pem = str(doc["ca_pem"])
        if hashlib.sha256(pem.encode()).hexdigest() != want:
            return  # changed again meanwhile: the next heartbeat tells the newer digest
        replace_file(Path(self.ep.ca_file), pem, 0o644)
        self.ca_updates += 1
        log.warning("replaced the CA bundle %s (%d CA certificate(s))", self.ep.ca_file,
                    pem.count("BEGIN CERTIFICATE"))
