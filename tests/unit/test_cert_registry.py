"""The agent certificate registry: issued certificates are listed, revocations are stored, so a
restarted (or another) vmctld refuses a revoked certificate too; CSR signing and its bad input."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509

from vmctl import auth
from vmctl.api.security import CertRegistry
from vmctl.errors import NotFound, ValidationError
from vmctl.store.base import Store


@dataclass
class FakeDaemon:
    store: Store
    epoch: int


def test_revocations_survive_a_restart(store: Store) -> None:
    epoch = store.acquire_lease("t", 30, 0)
    assert epoch is not None
    ca = auth.ClusterCA.create()
    reg = CertRegistry(FakeDaemon(store, epoch))  # type: ignore[arg-type]
    csr, _key = auth.new_csr("n1")
    cert = ca.sign_csr(csr, "node:n1")
    serial = reg.issued("n1", cert, "csr")
    other = reg.issued("n2", ca.issue("node:n2")[0], "vmctld")
    assert reg.revoked(serial) is None and set(reg.entries()) == {serial, other}
    assert reg.revoke("n1") == [serial]
    with pytest.raises(NotFound):
        reg.revoke("n1")  # nothing valid left for n1
    with pytest.raises(NotFound):
        reg.revoke("DEADBEEF")
    # a new registry on the same store (a restarted vmctld) sees the revocation at once
    again = CertRegistry(FakeDaemon(store, epoch), ttl_s=0.0)  # type: ignore[arg-type]
    assert again.revoked(serial) is not None and again.revoked(other) is None
    assert again.revoked("0" + serial) is None  # callers normalise (serial_from_peercert strips zeros)


def test_a_signed_request_keeps_the_requesters_key_and_the_node_subject() -> None:
    ca = auth.ClusterCA.create()
    csr, _key_pem = auth.new_csr("ignored-name")
    cert = x509.load_pem_x509_certificate(ca.sign_csr(csr, "node:n7").encode())
    assert cert.subject.rfc4514_string() == "CN=node:n7"  # the subject is the node's, not the request's
    req = x509.load_pem_x509_csr(csr.encode())
    assert cert.public_key().public_numbers() == req.public_key().public_numbers()  # type: ignore[union-attr]
    facts = auth.cert_facts(ca.sign_csr(csr, "node:n7"))
    assert facts["not_after"] > facts["not_before"] and facts["serial"] == facts["serial"].upper()


BROKEN = "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"


@pytest.mark.parametrize("pem", ["", "garbage", BROKEN])
def test_bad_signing_requests_name_the_field(pem: str) -> None:
    with pytest.raises(ValidationError) as err:
        auth.ClusterCA.create().sign_csr(pem, "node:n1")
    assert err.value.fields["field"] == "csr_pem"


def test_serials_from_peercert_are_normalised() -> None:
    assert auth.serial_from_peercert({"serialNumber": "0a1B"}) == "A1B"
    assert auth.serial_from_peercert({}) is None and auth.serial_from_peercert(None) is None


# ------------------------------------------------------------------ node names, agent credentials


def test_one_node_name_rule_bounded_by_the_certificate_subject(tmp_path: Path) -> None:
    from vmctl.agents.config import parse_agent_config
    from vmctl.errors import ConfigError

    longest = "a" * auth.NODE_NAME_MAX
    assert auth.check_node_name(longest) == longest
    cert = x509.load_pem_x509_certificate(auth.ClusterCA.create().issue(auth.NODE_CN_PREFIX + longest)[0].encode())
    assert len(cert.subject.rfc4514_string()) == len("CN=") + 64
    for bad in ("a" * (auth.NODE_NAME_MAX + 1), "a" * 128, "a b", ""):
        with pytest.raises(ValidationError) as err:
            auth.check_node_name(bad, "node")
        assert err.value.fields["field"] == "node"
    assert parse_agent_config({"node": longest}, "a.yaml").node == longest
    with pytest.raises(ConfigError, match=r"a\.yaml.*node.*at most 59"):
        parse_agent_config({"node": "a" * 60}, "a.yaml")


def test_an_interrupted_renewal_is_finished_at_start(tmp_path: Path) -> None:
    from vmctl.agents.credentials import finish_renewal
    from vmctl.agents.http_source import AgentEndpoint

    ep = AgentEndpoint("https://h:1", "n1", str(tmp_path / "n1.crt"), str(tmp_path / "n1.key"), str(tmp_path / "ca"))
    (tmp_path / "n1.crt").write_text("old cert")
    (tmp_path / "n1.key").write_text("old key")
    assert finish_renewal(ep) is False  # nothing pending
    # crashed after writing both .new files: both renamed, key first
    (tmp_path / "n1.key.new").write_text("new key")
    (tmp_path / "n1.crt.new").write_text("new cert")
    assert finish_renewal(ep) is True
    assert (tmp_path / "n1.key").read_text() == "new key" and (tmp_path / "n1.crt").read_text() == "new cert"
    # crashed between the two renames: the certificate follows its key
    (tmp_path / "n1.key").write_text("newer key")
    (tmp_path / "n1.crt.new").write_text("newer cert")
    assert finish_renewal(ep) is True and (tmp_path / "n1.crt").read_text() == "newer cert"
    # crashed before the certificate was written: the half-made key is dropped, the old pair kept
    (tmp_path / "n1.key.new").write_text("orphan key")
    assert finish_renewal(ep) is False and (tmp_path / "n1.key").read_text() == "newer key"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n1.crt", "n1.key"]


def test_an_agent_replaces_only_a_ca_file_of_cluster_cas(tmp_path: Path) -> None:
    """A ca_file the operator pointed at a bundle of other CAs (a system bundle) is never overwritten."""
    from vmctl.agents.credentials import CertRenewer
    from vmctl.agents.http_source import AgentEndpoint

    first, second = auth.ClusterCA.create(), auth.ClusterCA.create(f"{auth.CA_NAME} 2026-11-29T00:00:00Z")
    assert auth.only_cluster_cas(first.cert_pem + second.cert_pem)
    rogue = auth.ClusterCA.create("Some Root CA")
    assert not auth.only_cluster_cas(first.cert_pem + rogue.cert_pem) and not auth.only_cluster_cas("junk")
    ca_file = tmp_path / "bundle.pem"
    ca_file.write_text(first.cert_pem + rogue.cert_pem)
    ep = AgentEndpoint("https://127.0.0.1:1", "n1", str(tmp_path / "c"), str(tmp_path / "k"), str(ca_file))
    renewer = CertRenewer(ep)
    renewer.update_ca("0" * 64)  # no request is made: the file is not vmctl's to replace
    assert ca_file.read_text() == first.cert_pem + rogue.cert_pem and renewer.ca_updates == 0


def test_restore_recognises_the_ca_pem_of_any_step_of_a_rotation() -> None:
    """``vmctld restore`` refuses a backup of another cluster by its CA; during and after a CA rotation
    ``ca.pem`` holds the new CA, or both, or an older one of the same cluster."""
    from vmctl.daemon.main import _same_cluster

    old, new, foreign = auth.ClusterCA.create(), auth.ClusterCA.create(f"{auth.CA_NAME} x"), auth.ClusterCA.create()
    backup = [{"cert_pem": new.cert_pem}, {"cert_pem": old.cert_pem}, []]  # ca, ca_previous, ca_retired
    assert _same_cluster(new.cert_pem + old.cert_pem, backup) and _same_cluster(old.cert_pem, backup)
    after = [{"cert_pem": new.cert_pem}, None, [{"fingerprint": old.fingerprint(), "cert_pem": old.cert_pem}]]
    assert _same_cluster(old.cert_pem, after) and _same_cluster(new.cert_pem, after)
    assert not _same_cluster(foreign.cert_pem, after) and not _same_cluster("junk", after)
