"""The cluster's security material held by vmctld: the cluster CA (created once, kept in the store,
``ca.pem`` in the state directory) and its rotation, API tokens, the bootstrap admin token file, and the
registry of the agent certificates it issued -- an allow-list: an agent certificate that is not in it
is refused, whichever CA signed it.

A CA rotation (``vmctl ca rotate``, then ``vmctl ca finish``) replaces a CA whose key may have leaked
without stopping a job: ``rotate`` makes a new CA that signs every certificate issued from then on
while vmctld keeps presenting a server certificate of the old one (agents trust only it) and accepts
the registered certificates of both; each agent is told in its heartbeat answer to renew and does so
over its own mTLS connection (``POST /v1/agent/nodes/<n>/cert``), getting the new certificate and the
bundle of both CAs; ``finish`` switches the server certificate to the new CA and retires every
certificate of the old one (refused from then on), and agents fetch the bundle without the old CA.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vmctl import auth
from vmctl.daemon import statedir
from vmctl.daemon.base import NotLeader
from vmctl.daemon.core import Daemon
from vmctl.errors import Conflict, NotFound, Unauthenticated, VmctlError
from vmctl.store.base import TokenRecord, WriteBatch
from vmctl.timefmt import iso

log = logging.getLogger("vmctld.api")

#: store keys: the CA being replaced during a rotation ({cert_pem, key_pem, since}), and the CAs a
#: rotation retired ([{fingerprint, cert_pem, retired}]: their certificates are refused)
CA_PREVIOUS_KEY = "ca_previous"
CA_RETIRED_KEY = "ca_retired"


@dataclass
class CaState:
    """The cluster's CAs as the store has them. ``current`` signs every agent certificate issued;
    ``previous`` is the CA a rotation in progress replaces: still trusted for the registered
    certificates it signed, and the signer of vmctld's server certificate (the agents that did not
    renew yet trust only it). ``retired``: the CAs earlier rotations dropped."""

    current: auth.ClusterCA
    previous: auth.ClusterCA | None = None
    since: float | None = None
    retired: list[dict[str, Any]] = field(default_factory=list)

    @property
    def signer(self) -> auth.ClusterCA:
        """The CA of vmctld's server certificate."""
        return self.previous or self.current

    def bundle_pem(self) -> str:
        """What a client must trust: the current CA, and the previous one during a rotation (``ca.pem``,
        the agents' ``ca_file``)."""
        return "".join(ca.cert_pem for ca in (self.current, self.previous) if ca is not None)

    def bundle_sha256(self) -> str:
        return hashlib.sha256(self.bundle_pem().encode()).hexdigest()

    def known(self) -> set[str]:
        """Fingerprints of every CA this cluster had."""
        out = {ca.fingerprint() for ca in (self.current, self.previous) if ca is not None}
        return out | {str(r.get("fingerprint")) for r in self.retired}

    def doc(self) -> dict[str, Any]:
        """``GET /v1/ca``, without the registry's view (``ca_status``)."""
        return {"fingerprint": self.current.fingerprint(),
                "previous": None if self.previous is None else self.previous.fingerprint(),
                "rotating_since": self.since, "server_ca": self.signer.fingerprint(),
                "bundle_sha256": self.bundle_sha256(),
                "retired": [{"fingerprint": r.get("fingerprint"), "retired": r.get("retired")} for r in self.retired]}


def read_ca_state(d: Daemon) -> CaState | None:
    """The CAs in the store; None when the store holds no cluster yet."""
    saved = d.store.get_kv("ca")
    if not (isinstance(saved, dict) and "cert_pem" in saved and "key_pem" in saved):
        return None
    state = CaState(auth.load_stored_ca(saved, d.store))
    prev = d.store.get_kv(CA_PREVIOUS_KEY)
    if isinstance(prev, dict) and "cert_pem" in prev:
        state.previous = auth.load_stored_ca(prev, d.store)
        since = prev.get("since")
        state.since = float(since) if isinstance(since, int | float) else None
    retired = d.store.get_kv(CA_RETIRED_KEY)
    state.retired = [dict(r) for r in retired if isinstance(r, dict)] if isinstance(retired, list) else []
    return state


def load_ca(d: Daemon) -> CaState:
    """The cluster CA from the store, created on the first start only: never over the ``ca.pem``
    or the admin token of an earlier cluster (``statedir.refuse_new_cluster``). ``ca.pem``
    (certificates only, no key: the current CA, and the previous one during a rotation) is written
    when missing and must hold a CA of the store's cluster (else ``StateConflict``); one of an earlier
    step of a rotation is rewritten."""
    cfg = d.config
    pem_path = cfg.ca_pem_path
    state = read_ca_state(d)
    on_disk: str | None = None
    if state is not None:
        on_disk = statedir.read_text(pem_path, "state_dir", cfg.path)
        if on_disk is not None and on_disk.strip() != state.bundle_pem().strip():
            try:
                found = {auth.ca_fingerprint(c) for c in auth.pem_certificates(on_disk)}
            except ValueError:
                found = set()
            if not found & state.known():
                raise statedir.StateConflict(problem=(
                    f"{pem_path} is not the CA of the cluster in the store ({d.store.location()}): the store "
                    f"or the state directory belongs to another cluster. Restore the matching backup, or remove "
                    f"{pem_path} deliberately (vmctld writes the store's CA there)"))
            log.warning("%s held the CA bundle of an earlier step of a CA rotation: rewritten", pem_path)
            on_disk = None
    else:
        if not d.leader:
            raise NotLeader(holder=d.store.lease().holder or "none")
        statedir.refuse_new_cluster(cfg, d.store)
        ca = auth.ClusterCA.create()
        d.store.write(d.epoch, WriteBatch(kv={"ca": {"cert_pem": ca.cert_pem, "key_pem": ca.key_pem}}))
        log.info("created the cluster CA (kept in the store)")
        state = CaState(ca)
    fixed = statedir.private_dir(Path(cfg.state_dir), "state_dir", cfg.path)
    if fixed:
        log.warning("%s: made it 0700", fixed)
    if on_disk is None:
        statedir.write_public(pem_path, state.bundle_pem(), "state_dir", cfg.path)
    if state.previous is not None:
        log.warning("a CA rotation is in progress since %s: run `vmctl ca finish` once every agent renewed "
                    "(`vmctl ca show`)", iso(state.since or 0.0, utc=True))
    return state


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


#: store key of the agent certificate registry: serial -> {node, issued, expires, revoked, key_from,
#: fingerprint (SHA-256 of the DER), ca (fingerprint of the CA that signed it), retired}
CERTS_KEY = "agent_certs"
#: an agent is told to renew a certificate that expires within this many seconds
RENEW_BEFORE_S = 30 * 86400.0


class CertRegistry:
    """The agent certificates vmctld issued (``vmctl cert list|revoke``): the only ones it accepts.

    Kept in the store (key ``agent_certs``), so a revocation holds across restarts and fail-overs. The
    authentication middleware asks :meth:`accept` on every request made with a client certificate: the
    certificate must be registered under its serial for its node with the same SHA-256 fingerprint, and
    be neither revoked nor retired (its CA dropped by a rotation). A certificate the CA signed but the
    registry does not hold -- issued before vmctld kept one, or minted with a leaked CA key -- is
    refused. The registry is cached for ``ttl_s`` seconds (a change made by this process takes effect
    at once, one made by another vmctld holding the lease within ``ttl_s``); an unknown serial rereads
    it at most every ``miss_reread_s``.

    Entries written before fingerprints were kept (an upgrade) are pinned the first time their agent
    presents them: the fingerprint is added to the entry then, and only that certificate is accepted
    under the serial from then on."""

    def __init__(self, d: Daemon, ttl_s: float = 2.0, miss_reread_s: float = 0.5) -> None:
        self.d = d
        self.ttl_s = ttl_s
        self.miss_reread_s = miss_reread_s
        self._doc: dict[str, dict[str, object]] = {}
        self._read_at = -1e18
        #: serial -> when (monotonic) an agent last presented it to this process (``vmctl ca show``)
        self.seen: dict[str, float] = {}
        #: serial -> when (monotonic) its refusal was last logged (one line a minute per certificate)
        self._refusals: dict[str, float] = {}
        self._event_at = -1e18

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

    def lookup(self, serial: str) -> dict[str, object] | None:
        entry = self.entries().get(serial)
        if entry is None and time.monotonic() - self._read_at > self.miss_reread_s:
            entry = self.entries(fresh=True).get(serial)  # issued by another vmctld since the last read
        return entry if isinstance(entry, dict) else None

    def accept(self, node: str, serial: str, der: bytes | None, not_before: str = "") -> dict[str, object]:
        """The registry entry of the certificate an agent presented (``der``: its DER bytes), or
        ``Unauthenticated`` saying why it is refused and what to do (and a warning in the log)."""
        entry = self.lookup(serial)
        what = f"the client certificate of node {node} (serial {serial})"
        if entry is None:
            raise self._refuse(node, serial, (
                f"{what}{f', valid from {not_before},' if not_before else ''} is not in vmctld's registry of "
                f"issued certificates: it was issued before vmctld kept one (an older vmctl), or minted by "
                f"someone else holding the CA's key. Give the node a new one: 'vmctl cert issue {node}'"))
        if entry.get("node") != node:
            raise self._refuse(node, serial, f"{what} is registered for node {entry.get('node')!r}, not {node!r}")
        at = entry.get("revoked")
        if isinstance(at, int | float):
            raise self._refuse(node, serial, (
                f"{what} was revoked at {iso(float(at), utc=True)}: issue a new one with 'vmctl cert issue {node}'"))
        at = entry.get("retired")
        if isinstance(at, int | float):
            raise self._refuse(node, serial, (
                f"{what} was issued by a CA that a rotation retired at {iso(float(at), utc=True)} ('vmctl ca "
                f"finish'): issue a new one with 'vmctl cert issue {node}'"))
        fp = auth.fingerprint_der(der) if der else None
        pinned = entry.get("fingerprint")
        if pinned is None and fp is not None and getattr(self.d, "leader", False):
            self._pin(serial, fp)
        elif pinned is not None and pinned != fp:
            raise self._refuse(node, serial, (
                f"{what} is not the certificate registered under that serial (same serial, other content: "
                f"minted with the CA's key?). Revoke the node's certificates and give it a new one: "
                f"'vmctl cert revoke {node}', 'vmctl cert issue {node}'; rotate the CA if its key leaked "
                f"('vmctl ca rotate')"))
        self.seen[serial] = time.monotonic()
        return entry

    def _refuse(self, node: str, serial: str, problem: str) -> Unauthenticated:
        """The refusal, logged (WARNING) and recorded as a ``cert.refused`` event: once a minute per
        certificate, and at most one event a second in all (certificates minted in bulk with a
        leaked key cannot flood the store)."""
        now = time.monotonic()
        if now - self._refusals.get(serial, -1e18) >= 60.0:
            if len(self._refusals) > 4096:
                self._refusals.clear()
            self._refusals[serial] = now
            log.warning("refused an agent certificate: %s", problem)
            d = self.d
            if getattr(d, "leader", False) and now - self._event_at >= 1.0:
                self._event_at = now
                try:
                    d.events.add(d.clock.now(), "cert.refused", f"refused {problem}", node=node, actor="vmctld")
                    d.store_write(WriteBatch(events=d.events.take()))
                except VmctlError as exc:
                    log.warning("the cert.refused event was not stored: %s", exc)
        return Unauthenticated(problem=problem)

    def _pin(self, serial: str, fp: str) -> None:
        doc = {s: dict(e) for s, e in self.entries(fresh=True).items()}
        if serial in doc and doc[serial].get("fingerprint") is None:
            doc[serial]["fingerprint"] = fp
            self._save(doc)
            log.info("agent certificate %s of node %s: registered before fingerprints were kept, pinned to "
                     "SHA-256 %s (the first certificate presented under that serial since the upgrade)",
                     serial, doc[serial].get("node"), fp)

    def _save(self, doc: dict[str, dict[str, object]]) -> None:
        self.d.store.write(self.d.epoch, WriteBatch(kv={CERTS_KEY: doc}))
        self._doc = doc
        self._read_at = time.monotonic()

    def issued(self, node: str, cert_pem: str, key_from: str, ca: str | None = None) -> str:
        """Record a certificate just issued (``ca``: the fingerprint of the CA that signed it);
        returns its serial."""
        facts = auth.cert_facts(cert_pem)
        doc = dict(self.entries(fresh=True))
        doc[facts["serial"]] = {"node": node, "issued": time.time(), "expires": facts["not_after"], "revoked": None,
                                "key_from": key_from, "fingerprint": facts["fingerprint"], "ca": ca,
                                "retired": None}
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

    def upgrade(self, ca: CaState) -> None:
        """Start-up step for a registry written by an older vmctld: its entries do not say which CA
        signed them. With no rotation ever made there was one CA, the current one: they are stamped
        with it (else every agent would be told to renew). Entries without a fingerprint are pinned
        when their agent first presents its certificate (``accept``); the count is logged."""
        if not getattr(self.d, "leader", False):
            return
        doc = {s: dict(e) for s, e in self.entries(fresh=True).items() if isinstance(e, dict)}
        stamp = [s for s, e in doc.items() if e.get("ca") is None]
        if stamp and ca.previous is None and not ca.retired:
            for s in stamp:
                doc[s]["ca"] = ca.current.fingerprint()
            self._save(doc)
            log.info("agent certificate registry: %d entr%s from before CAs were recorded, recorded as issued by "
                     "CA %s (the only one this cluster had)", len(stamp), "y" if len(stamp) == 1 else "ies",
                     ca.current.fingerprint())
        unpinned = sum(1 for e in doc.values() if e.get("fingerprint") is None and e.get("revoked") is None)
        if unpinned:
            log.info("agent certificate registry: %d certificate(s) registered before fingerprints were kept: each "
                     "is pinned to the certificate its agent presents first", unpinned)

    def needs_renewal(self, entry: dict[str, object], ca: CaState) -> bool:
        """An agent presenting this certificate should get a new one: another CA than the current one
        signed it (a rotation), or it expires within ``RENEW_BEFORE_S``."""
        expires = entry.get("expires")
        soon = isinstance(expires, int | float) and float(expires) - time.time() < RENEW_BEFORE_S
        return entry.get("ca") != ca.current.fingerprint() or soon

    def usable(self, e: dict[str, object], now: float) -> bool:
        expires = e.get("expires")
        return (e.get("revoked") is None and e.get("retired") is None
                and not (isinstance(expires, int | float) and float(expires) < now))

    def rotation_status(self, ca: CaState) -> list[dict[str, Any]]:
        """Per node with a usable certificate: whether it has one of the current CA, whether its agent
        presented one lately, and whether it still holds one of the previous CA (``vmctl ca show``)."""
        now, mono = time.time(), time.monotonic()
        cur = ca.current.fingerprint()
        nodes: dict[str, dict[str, Any]] = {}
        for serial, e in self.entries(fresh=True).items():
            if not isinstance(e, dict) or not self.usable(e, now):
                continue
            n = nodes.setdefault(str(e.get("node")), {"node": str(e.get("node")), "current_ca": False,
                                                       "other_ca": False, "seen_current_s": None})
            if e.get("ca") == cur:
                n["current_ca"] = True
                seen = self.seen.get(serial)
                if seen is not None:
                    ago = mono - seen
                    n["seen_current_s"] = ago if n["seen_current_s"] is None else min(n["seen_current_s"], ago)
            else:
                n["other_ca"] = True
        return [nodes[k] for k in sorted(nodes)]


def begin_rotation(d: Daemon, ca: CaState, registry: CertRegistry) -> CaState:
    """``vmctl ca rotate``: a new CA signs from now on, the current one becomes the previous one
    (still trusted, still the server certificate's signer). Entries issued before CAs were recorded
    are stamped with the CA they came from (the only one there was). One store transaction."""
    if ca.previous is not None:
        raise Conflict(what="the cluster CA", problem=(
            f"a rotation is in progress since {iso(ca.since or 0.0, utc=True)}: finish it first ('vmctl ca finish')"))
    now = time.time()
    new = auth.ClusterCA.create(f"{auth.CA_NAME} {iso(now, utc=True)}")
    old_fp = ca.current.fingerprint()
    doc = {s: dict(e) for s, e in registry.entries(fresh=True).items()}
    for e in doc.values():
        if e.get("ca") is None:
            e["ca"] = old_fp
    d.events.add(d.clock.now(), "ca.rotation_started",
                 f"CA rotation started: new CA {new.fingerprint()} replaces {old_fp}")
    d.store_write(WriteBatch(kv={"ca": {"cert_pem": new.cert_pem, "key_pem": new.key_pem},
                                 CA_PREVIOUS_KEY: {"cert_pem": ca.current.cert_pem, "key_pem": ca.current.key_pem,
                                                   "since": now},
                                 CERTS_KEY: doc}, events=d.events.take()))
    registry._doc, registry._read_at = doc, time.monotonic()
    log.warning("CA rotation started: new CA %s, previous %s (trusted until 'vmctl ca finish')", new.fingerprint(),
                old_fp)
    return CaState(new, ca.current, now, list(ca.retired))


def finish_rotation(d: Daemon, ca: CaState, registry: CertRegistry, force: bool) -> tuple[CaState, list[str]]:
    """``vmctl ca finish``: the previous CA is dropped -- its key forgotten, its certificates retired
    (refused from now on). Refused (``Conflict``) while a node has a usable certificate of the previous
    CA only, unless ``force``. Returns the new state and the serials retired."""
    if ca.previous is None:
        raise Conflict(what="the cluster CA", problem="no rotation is in progress: start one with 'vmctl ca rotate'")
    prev = ca.previous.fingerprint()
    behind = [n["node"] for n in registry.rotation_status(ca) if n["other_ca"] and not n["current_ca"]]
    if behind and not force:
        raise Conflict(what="the CA rotation", problem=(
            f"node(s) {', '.join(behind)} hold only certificates of the previous CA: their agents did not renew "
            f"yet (an agent renews within a heartbeat when it can write its certificate files; else give it one "
            f"with 'vmctl cert issue NODE'; a node gone for good: 'vmctl cert revoke NODE'). Wait, or finish "
            f"with --force: their agents are refused then"))
    now = time.time()
    doc = {s: dict(e) for s, e in registry.entries(fresh=True).items()}
    retired = [s for s, e in doc.items() if e.get("ca") in (prev, None) and e.get("retired") is None]
    for s in retired:
        doc[s]["retired"] = now
    gone = [*ca.retired, {"fingerprint": prev, "cert_pem": ca.previous.cert_pem, "retired": now}]
    d.events.add(d.clock.now(), "ca.rotation_finished",
                 f"CA rotation finished: CA {prev} retired with {len(retired)} certificate(s)"
                 + (f"; forced, nodes without a new certificate: {', '.join(behind)}" if behind else ""))
    d.store_write(WriteBatch(kv={CA_PREVIOUS_KEY: None, CA_RETIRED_KEY: gone, CERTS_KEY: doc},
                             events=d.events.take()))
    registry._doc, registry._read_at = doc, time.monotonic()
    log.warning("CA rotation finished: CA %s retired, %d certificate(s) of it refused from now on", prev, len(retired))
    return CaState(ca.current, None, None, gone), retired
