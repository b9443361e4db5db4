"""Authentication for the daemon API: a cluster CA for mTLS (agents), bearer tokens with roles
(operators), and the rule table of who may call what.

- Agents present a client certificate issued by the cluster CA with subject CN ``node:<name>``; they
  may call only ``/v1/agent/nodes/<name>/...`` of their own node.
- Operators present ``Authorization: Bearer <token>``. Tokens are random (256 bits), shown once, and
  stored only as SHA-256 hashes. Role ``read``: GETs and ``/metrics``; role ``admin``: everything.

The CA (EC P-256) is created on the first start and kept in the store (``kv`` key ``ca``) so that a
standby daemon serves with the same CA; its certificate is also written to ``<state_dir>/ca.pem``.

A neutral module (no HTTP): the API server authenticates requests with it, and vmctld's offline
commands (``vmctld token create``, backup summaries) mint tokens and read the CA without ``vmctl.api``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import secrets
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from vmctl.errors import UserError, ValidationError
from vmctl.files import replace_file
from vmctl.store.base import CorruptRecord, Store

ROLES = ("read", "admin")
TOKEN_PREFIX = "vmctl_"
NODE_CN_PREFIX = "node:"
#: an X.509 common name holds at most 64 characters (RFC 5280, ub-common-name), and an agent's is
#: ``node:<name>``: every node name that passes ``check_node_name`` can get a certificate
NODE_NAME_MAX = 64 - len(NODE_CN_PREFIX)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def looks_like_token(text: str) -> bool:
    """``text`` has the form of a token ``new_token`` makes."""
    body = text[len(TOKEN_PREFIX):]
    return (text.startswith(TOKEN_PREFIX) and len(body) >= 40
            and all(ch.isascii() and (ch.isalnum() or ch in "-_") for ch in body))


def load_stored_ca(saved: dict[str, Any], store: Store) -> ClusterCA:
    """The CA kept in the store (``kv`` key ``ca``); unreadable, it is a ``CorruptRecord`` naming the row."""
    try:
        return ClusterCA.from_pem(str(saved["cert_pem"]), str(saved["key_pem"]))
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRecord(backend=store.backend, where=store.location(), table="kv", row="key='ca'",
                            problem=f"the cluster CA cannot be loaded ({exc}); restore a backup") from exc


@dataclass(frozen=True, slots=True)
class Principal:
    kind: str  # "operator" | "agent"
    name: str
    role: str  # "read" | "admin" | "agent"

    @property
    def node(self) -> str | None:
        return self.name if self.kind == "agent" else None

    def describe(self) -> str:
        return f"agent of node {self.name}" if self.kind == "agent" else f"token {self.name!r} (role {self.role})"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


#: the subject of every cluster CA vmctld makes (a rotation's new CA adds when it was made: two CAs
#: trusted at once must not share a name, or a TLS client may check a signature against the wrong one)
CA_NAME = "vmctl cluster CA"


def only_cluster_cas(text: str) -> bool:
    """``text`` is a PEM bundle of vmctl cluster CAs only (what vmctld writes as ``ca.pem`` and an
    agent's ``ca_file``), not a bundle someone else maintains."""
    try:
        certs = pem_certificates(text)
    except ValueError:
        return False
    return all(c.subject.rfc4514_string().startswith(f"CN={CA_NAME}") for c in certs)


class ClusterCA:
    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, name: str = CA_NAME) -> ClusterCA:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def from_pem(cls, cert_pem: str, key_pem: str) -> ClusterCA:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("CA key is not an EC key")
        return cls(cert, key)

    def _aki(self) -> x509.AuthorityKeyIdentifier:
        """Names this CA's key in the certificates it signs: a client trusting two CAs during a rotation
        finds the right one (their names differ too)."""
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key())

    def fingerprint(self) -> str:
        """SHA-256 of the CA certificate (DER), as ``openssl x509 -fingerprint -sha256`` shows it."""
        return ca_fingerprint(self.cert)

    @property
    def cert_pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()

    @property
    def key_pem(self) -> str:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode()

    def issue(self, common_name: str, *, server_names: tuple[str, ...] = (), days: int = 365) -> tuple[str, str]:
        """A leaf certificate signed by the CA: (cert PEM, key PEM). ``server_names`` adds DNS/IP SANs
        and the server-auth usage; otherwise it is a client certificate."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        b = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(self._aki(), critical=False)
        )
        if server_names:
            sans: list[x509.GeneralName] = []
            for n in server_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(n)))
                except ValueError:
                    sans.append(x509.DNSName(n))
            b = b.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        else:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        cert = b.sign(self.key, hashes.SHA256())
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem

    def sign_csr(self, csr_pem: str, common_name: str, *, days: int = 365) -> str:
        """A client certificate for the public key of a certificate signing request (PKCS#10, PEM): the
        key never leaves the machine that made the request. The subject is ``common_name`` whatever the
        request asks for; the request must be self-signed by its key (proof of possession).
        ``ValidationError`` (field ``csr_pem``) names what is wrong."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode())
        except (ValueError, TypeError) as exc:
            raise ValidationError(field="csr_pem", problem=f"not a PEM certificate signing request ({exc})") from exc
        if not csr.is_signature_valid:
            raise ValidationError(field="csr_pem", problem="its signature does not verify with its own key")
        pub = csr.public_key()
        if isinstance(pub, rsa.RSAPublicKey):
            if pub.key_size < 2048:
                raise ValidationError(field="csr_pem", problem=f"RSA key of {pub.key_size} bits: use 2048 or more")
        elif not isinstance(pub, ec.EllipticCurvePublicKey):
            raise ValidationError(field="csr_pem", problem="the key must be EC or RSA")
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject).public_key(pub)
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(self._aki(), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM).decode()

    def server_context(self, server_names: tuple[str, ...], workdir: Path,
                       also_trust: tuple[ClusterCA, ...] = ()) -> ssl.SSLContext:
        """TLS context for the API: our server certificate (signed by this CA); client certificates
        optional but, when given, verified against this CA and ``also_trust`` (the other CA of a
        rotation). The handshake only proves a CA signed it: the API then accepts no certificate
        that is not in its registry (``vmctl.api.security.CertRegistry``)."""
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.load_server_cert(ctx, server_names, workdir)
        for ca in (self, *also_trust):
            ctx.load_verify_locations(cadata=ca.cert_pem)
        ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def load_server_cert(self, ctx: ssl.SSLContext, server_names: tuple[str, ...], workdir: Path) -> None:
        """Give ``ctx`` a fresh server certificate signed by this CA: connections accepted from now on
        present it (a CA rotation switches the server's certificate in the running context)."""
        cert_pem, key_pem = self.issue("vmctld", server_names=server_names)
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=workdir) as tmp:
            cp, kp = Path(tmp) / "server.pem", Path(tmp) / "server.key"
            cp.write_text(cert_pem)
            kp.touch(mode=0o600)
            kp.write_text(key_pem)
            ctx.load_cert_chain(str(cp), str(kp))


def new_csr(node: str) -> tuple[str, str]:
    """A fresh EC key and a certificate signing request for the agent of ``node``: (CSR PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NODE_CN_PREFIX + node)]))
           .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    return csr.public_bytes(serialization.Encoding.PEM).decode(), key_pem


def write_cert_files(out: Path, node_name: str, doc: Mapping[str, Any]) -> list[Path]:
    """The files of a node certificate the API issued (``vmctl cert issue``, the testbeds): NODE.crt,
    NODE.key (mode 0600; only when the answer carries a key) and ca.crt, in that order."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        crt, key, ca_path = out / f"{node_name}.crt", out / f"{node_name}.key", out / "ca.crt"
        written = [crt]
        # each file replaced atomically: an agent already started from this folder may be reading the
        # shared ca.crt while the next node's files are written (it read an empty file once)
        if "key_pem" in doc:
            replace_file(key, str(doc["key_pem"]), 0o600)
            written.append(key)
        replace_file(crt, str(doc["cert_pem"]), 0o644)
        replace_file(ca_path, str(doc["ca_pem"]), 0o644)
    except OSError as exc:
        raise UserError(where=f"--out-dir {out}", problem=str(exc)) from exc
    return [*written, ca_path]


def cert_facts(cert_pem: str) -> dict[str, Any]:
    """Serial (upper-case hex, as ``SSLSocket.getpeercert()`` and ``openssl x509 -serial`` show it),
    validity (epoch seconds) and SHA-256 fingerprint (of the DER, ``fingerprint_der``) of a PEM certificate."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return {"serial": format(cert.serial_number, "X"),
            "not_before": cert.not_valid_before_utc.timestamp(), "not_after": cert.not_valid_after_utc.timestamp(),
            "fingerprint": fingerprint_der(cert.public_bytes(serialization.Encoding.DER))}


def fingerprint_der(der: bytes) -> str:
    """The SHA-256 of a certificate in DER form, lower-case hex: what the registry of agent
    certificates keeps to recognise the very certificate it issued (a serial alone can be copied into
    a certificate minted with a leaked CA key)."""
    return hashlib.sha256(der).hexdigest()


def ca_fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of a CA certificate (DER), as ``openssl x509 -fingerprint -sha256`` shows it."""
    return cert.fingerprint(hashes.SHA256()).hex(":").upper()


def pem_certificates(text: str) -> list[x509.Certificate]:
    """The certificates of a PEM bundle (``ca.pem`` during a CA rotation holds two); ``ValueError``
    when there is none or one cannot be read."""
    certs = x509.load_pem_x509_certificates(text.encode())
    if not certs:
        raise ValueError("no certificate in it")
    return certs


def serial_from_peercert(peercert: object) -> str | None:
    """The serial of a verified client certificate, upper-case hex without leading zeros, or None."""
    if not isinstance(peercert, dict):
        return None
    serial = peercert.get("serialNumber")
    if not isinstance(serial, str) or not serial:
        return None
    return serial.upper().lstrip("0") or "0"


def node_from_peercert(peercert: object) -> str | None:
    """The node name of a verified client certificate (``CN=node:<name>``), or None."""
    if not isinstance(peercert, dict):
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and isinstance(value, str) and value.startswith(NODE_CN_PREFIX):
                name = value[len(NODE_CN_PREFIX):]
                return name or None
    return None


def check_node_name(name: object, field: str = "node") -> str:
    """The one rule for a node name wherever it enters (agent config, registration, certificates,
    request bodies): letters, digits, '-', '_' and '.', at most ``NODE_NAME_MAX`` characters, so that
    its agent's certificate subject ``CN=node:<name>`` fits in the 64 characters X.509 allows."""
    if not isinstance(name, str) or not name:
        raise ValidationError(field=field, problem="must be a non-empty string")
    if not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ValidationError(field=field, problem=f"{name[:40]!r}: use letters, digits, '-', '_' and '.'")
    if len(name) > NODE_NAME_MAX:
        raise ValidationError(field=field, problem=(
            f"{name[:40]!r}...: {len(name)} characters, at most {NODE_NAME_MAX} (its agent's certificate "
            f"subject CN={NODE_CN_PREFIX}<name> holds at most 64)"))
    return name
