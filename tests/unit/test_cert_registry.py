"""The agent certificate registry: issued certificates are listed, revocations are stored, so a
restarted (or another) vmctld refuses a revoked certificate too; CSR signing and its bad input."""

from __future__ import annotations

from dataclasses import dataclass

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
