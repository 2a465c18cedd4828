"""Certificates the apiserver accepts, and a server context that follows rotated files."""
import base64
import datetime
import ipaddress
import os
import ssl

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from webhook.credentials import certs


@pytest.fixture(scope="module")
def issued(tmp_path_factory):
    out = tmp_path_factory.mktemp("certs")
    return certs.write_certs(str(out), "topo", "gpu-system")


def load(path):
    with open(path, "rb") as handle:
        return x509.load_pem_x509_certificate(handle.read())


def test_serving_cert_names_every_address_of_the_service_and_localhost(issued):
    sans = load(issued.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        "topo", "topo.gpu-system", "topo.gpu-system.svc", "topo.gpu-system.svc.cluster.local", "localhost"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_serving_cert_is_signed_by_the_ca_and_is_no_ca_itself(issued):
    ca, cert = load(issued.ca), load(issued.cert)
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    assert cert.issuer == ca.subject
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def handshake(client: ssl.SSLContext, server: ssl.SSLContext, hostname: str | None = None) -> ssl.SSLObject:
    """A TLS handshake through memory pipes; returns the client end."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_end = client.wrap_bio(client_in, client_out, server_hostname=hostname)
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    for _ in range(10):  # a handshake takes a few round trips
        for end in (client_end, server_end):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                pass
        to_server.write(client_out.read())
        client_in.write(to_client.read())
    return client_end


def served_serial(context: ssl.SSLContext) -> int:
    """The serial number of the certificate a server context presents."""
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    return x509.load_der_x509_certificate(handshake(client, context).getpeercert(binary_form=True)).serial_number


def test_a_tls_client_trusting_the_ca_accepts_the_serving_cert(issued):
    client_end = handshake(ssl.create_default_context(cafile=issued.ca),
                           certs.server_context(issued.cert, issued.key), "topo.gpu-system.svc")
    assert client_end.version() in ("TLSv1.2", "TLSv1.3")
    assert client_end.getpeercert()["subject"] == ((("commonName", "topo"),),)


def test_private_key_is_readable_by_its_owner_only(issued):
    assert os.stat(issued.key).st_mode & 0o077 == 0


def test_ca_bundle_is_the_base64_of_the_ca_pem(issued):
    with open(issued.ca, "rb") as handle:
        assert base64.b64decode(certs.ca_bundle(issued.ca)) == handle.read()


def test_server_context_refuses_tls_below_1_2(issued):
    assert certs.server_context(issued.cert, issued.key).minimum_version == ssl.TLSVersion.TLSv1_2


def test_dev_certs_are_generated_once_then_reused(tmp_path):
    first = certs.ensure_dev_certs(str(tmp_path))
    pem = open(first.cert, "rb").read()
    assert open(certs.ensure_dev_certs(str(tmp_path)).cert, "rb").read() == pem


def test_missing_certificate_file_is_named(tmp_path):
    with pytest.raises(certs.CertError, match="nope.crt"):
        certs.server_context(str(tmp_path / "nope.crt"), str(tmp_path / "nope.key"))


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_reloading_context_serves_a_rotated_certificate_after_the_check_interval(tmp_path):
    paths = certs.write_certs(str(tmp_path), "topo", "ns")
    clock = FakeClock()
    reloading = certs.ReloadingContext(paths.cert, paths.key, check_interval=5.0, clock=clock)
    before = served_serial(reloading.current())
    certs.write_certs(str(tmp_path), "topo", "ns")
    assert served_serial(reloading.current()) == before  # not checked yet
    clock.now = 6.0
    after = served_serial(reloading.current())
    assert after != before and after == load(paths.cert).serial_number


def test_reloading_context_keeps_the_old_certificate_when_the_new_pair_is_broken(tmp_path):
    paths = certs.write_certs(str(tmp_path), "topo", "ns")
    clock = FakeClock()
    reloading = certs.ReloadingContext(paths.cert, paths.key, check_interval=1.0, clock=clock)
    old = reloading.current()
    certs.write_atomically(paths.key, b"not a key", 0o600)
    clock.now = 2.0
    assert reloading.current() is old


# ----- when a kept certificate must be issued again (tls.mode selfManaged) -----------------------

CA = certs.make_ca("kept CA")
NAMES = certs.service_names("topo", "gpu-system")
NOW = datetime.datetime.now(datetime.timezone.utc)


def serving(ca=CA, names=NAMES):
    return certs.make_serving_cert(*ca, names, [])


@pytest.mark.parametrize("pair, at, names, reason", [
    (serving(), NOW, NAMES, None),
    (serving(), NOW, [*NAMES, "extra.example"], "it names topo, topo.gpu-system"),
    (serving(), NOW + datetime.timedelta(days=certs.SERVING_DAYS - certs.RENEW_BEFORE_DAYS + 1), NAMES,
     "within 30 days"),
    (serving(certs.make_ca("another CA")), NOW, NAMES, "the CA did not sign it"),
    ((serving()[0], serving()[1]), NOW, NAMES, "its key does not belong to the certificate"),
    ((b"garbage", b"garbage"), NOW, NAMES, "cannot be read"),
], ids=["good", "other names", "ending", "another CA", "another key", "unreadable"])
def test_reissue_reason_says_why_a_serving_pair_is_issued_again(pair, at, names, reason):
    said = certs.reissue_reason(*pair, CA[0], names, at)
    assert said == reason if reason is None else reason in said


@pytest.mark.parametrize("ca, at, problem", [
    (CA, NOW, None),
    (CA, NOW + datetime.timedelta(days=certs.CA_DAYS - 1), "within 30 days"),
    ((CA[0], certs.make_ca("other")[1]), NOW, "its key does not belong to it"),
    (serving(), NOW, "it is no CA"),
], ids=["good", "ending", "another key", "a serving certificate"])
def test_ca_problem_says_what_keeps_a_ca_from_signing(ca, at, problem):
    said = certs.ca_problem(*ca, at)
    assert said == problem if problem is None else problem in said
