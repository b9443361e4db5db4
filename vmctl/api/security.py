"""The cluster's security material held by vmctld: the cluster CA (created once, kept in the store,
``ca.pem`` in the state directory), API tokens, the bootstrap admin token file, and the registry of the
agent certificates it issued (listed, revocable).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from vmctl import auth
from vmctl.daemon import statedir
from vmctl.daemon.base import NotLeader
from vmctl.daemon.core import Daemon
from vmctl.errors import NotFound
from vmctl.store.base import TokenRecord, WriteBatch

log = logging.getLogger("vmctld.api")


def load_ca(d: Daemon) -> auth.ClusterCA:
    """The cluster CA from the store, created on the first start only: never over the ``ca.pem``
    or the admin token of an earlier cluster (``statedir.refuse_new_cluster``). ``ca.pem``
    (the certificate only, no key) is written when missing and must match the store's CA."""
    cfg = d.config
    saved = d.store.get_kv("ca")
    pem_path = cfg.ca_pem_path
    if isinstance(saved, dict) and "cert_pem" in saved and "key_pem" in saved:
        ca = auth.load_stored_ca(saved, d.store)
        on_disk = statedir.read_text(pem_path, "state_dir", cfg.path)
        if on_disk is not None and on_disk.strip() != ca.cert_pem.strip():
            raise statedir.StateConflict(problem=(
                f"{pem_path} is not the CA of the cluster in the store ({d.store.location()}): the store "
                f"or the state directory belongs to another cluster. Restore the matching backup, or remove "
                f"{pem_path} deliberately (vmctld writes the store's CA there)"))
    else:
        if not d.leader:
            raise NotLeader(holder=d.store.lease().holder or "none")
        statedir.refuse_new_cluster(cfg, d.store)
        ca = auth.ClusterCA.create()
        d.store.write(d.epoch, WriteBatch(kv={"ca": {"cert_pem": ca.cert_pem, "key_pem": ca.key_pem}}))
        log.info("created the cluster CA (kept in the store)")
        on_disk = None
    fixed = statedir.private_dir(Path(cfg.state_dir), "state_dir", cfg.path)
    if fixed:
        log.warning("%s: made it 0700", fixed)
    if on_disk is None:
        statedir.write_public(pem_path, ca.cert_pem, "state_dir", cfg.path)
    return ca


def add_token(d: Daemon, name: str, role: str, ttl: float | None) -> tuple[str, TokenRecord]:
    token = auth.new_token()
    now = time.time()
    rec = TokenRecord(hash=auth.hash_token(token), name=name, role=role, created=now,
                      expires=None if ttl is None else now + ttl)
    d.store.write(d.epoch, WriteBatch(tokens=[rec]))
    return token, rec


def bootstrap_token(d: Daemon) -> None:
    """The first start writes an admin token to ``api.bootstrap_token_file`` (default
    ``<state_dir>/admin.token``, mode 0600); an existing file is never overwritten."""
    cfg = d.config
    p = statedir.token_file(cfg)
    if not d.leader:
        return
    admins = [t for t in d.store.list_tokens() if t.role == "admin"]
    text = statedir.read_text(p, "api.bootstrap_token_file", cfg.path)
    if text is not None:
        token = text.strip()
        if admins or d.store.find_token(auth.hash_token(token)) is not None:
            log.info("the bootstrap admin token is in %s", p)
        elif auth.looks_like_token(token):
            # written by a start that stopped before its store write: the file is the only copy
            rec = TokenRecord(hash=auth.hash_token(token), name="bootstrap-admin", role="admin",
                              created=time.time(), expires=None)
            d.store.write(d.epoch, WriteBatch(tokens=[rec]))
            log.warning("the store had no admin token: registered the one in %s", p)
        else:
            log.error("%s holds no vmctl token and the store has no admin token: mint one with "
                      "`vmctld token create --config %s --name NAME --role admin`", p, cfg.path)
        return
    if admins:
        log.info("no admin token file at %s (the store has admin tokens); mint another one with "
                 "`vmctld token create --config %s --name NAME --role admin`", p, cfg.path)
        return
    token = auth.new_token()
    statedir.write_secret_file(p, token + "\n", "api.bootstrap_token_file", cfg.path)
    rec = TokenRecord(hash=auth.hash_token(token), name="bootstrap-admin", role="admin", created=time.time(),
                      expires=None)
    try:
        d.store.write(d.epoch, WriteBatch(tokens=[rec]))
    except BaseException:
        p.unlink(missing_ok=True)  # a token the store does not know is no token
        raise
    log.info("wrote the bootstrap admin token to %s", p)


#: store key of the agent certificate registry: serial -> {node, issued, expires, revoked, key_from}
CERTS_KEY = "agent_certs"


class CertRegistry:
    """The agent certificates vmctld issued, and which are revoked (``vmctl cert list|revoke``).

    Kept in the store (key ``agent_certs``), so a revocation holds across restarts and fail-overs. The
    authentication middleware asks :meth:`revoked` on every request made with a client certificate; the
    answer is cached for ``ttl_s`` seconds (a revocation made by this process takes effect at once, one
    made by another vmctld holding the lease within ``ttl_s``). Certificates issued before this registry
    existed are not in it: they stay valid until they expire (their serials cannot be listed)."""

    def __init__(self, d: Daemon, ttl_s: float = 2.0) -> None:
        self.d = d
        self.ttl_s = ttl_s
        self._doc: dict[str, dict[str, object]] = {}
        self._read_at = -1e18

    def entries(self, fresh: bool = False) -> dict[str, dict[str, object]]:
        now = time.monotonic()
        if fresh or now - self._read_at > self.ttl_s:
            doc = self.d.store.get_kv(CERTS_KEY)
            self._doc = dict(doc) if isinstance(doc, dict) else {}
            self._read_at = now
        return self._doc

    def revoked(self, serial: str) -> float | None:
        """When the certificate with this serial was revoked, or None (valid or unknown)."""
        entry = self.entries().get(serial)
        at = entry.get("revoked") if isinstance(entry, dict) else None
        return float(at) if isinstance(at, int | float) else None

    def _save(self, doc: dict[str, dict[str, object]]) -> None:
        self.d.store.write(self.d.epoch, WriteBatch(kv={CERTS_KEY: doc}))
        self._doc = doc
        self._read_at = time.monotonic()

    def issued(self, node: str, cert_pem: str, key_from: str) -> str:
        """Record a certificate just issued; returns its serial."""
        facts = auth.cert_facts(cert_pem)
        doc = dict(self.entries(fresh=True))
        doc[facts["serial"]] = {"node": node, "issued": time.time(), "expires": facts["not_after"], "revoked": None,
                                "key_from": key_from}
        self._save(doc)
        return str(facts["serial"])

    def revoke(self, key: str) -> list[str]:
        """Revoke the certificate with serial ``key``, or every unrevoked certificate of node ``key``;
        returns the serials revoked now. ``NotFound`` when nothing matches."""
        doc = {s: dict(e) for s, e in self.entries(fresh=True).items()}
        serial = key.upper().lstrip("0") or "0"
        if serial in doc:
            hits = [serial]
        else:
            hits = [s for s, e in doc.items() if e.get("node") == key and e.get("revoked") is None]
        if not hits:
            raise NotFound(kind="certificate", name=key)
        now = time.time()
        fresh = [s for s in hits if doc[s].get("revoked") is None]
        for s in fresh:
            doc[s]["revoked"] = now
        if fresh:
            self._save(doc)
            log.warning("revoked agent certificate(s) %s", ", ".join(fresh))
        return fresh
