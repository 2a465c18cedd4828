"""TLS material: a CA and a serving certificate for the webhook Service, and a server SSLContext
that picks up rotated certificate files without a restart.

Rotation: kubelet updates a mounted Secret by swapping a symlink, so the certificate and key
change together. `ReloadingContext.current()` is asked for a context on every new connection
(gunicorn's `ssl_context` hook); it compares the files' identity at most once per
`check_interval` seconds and, when they changed, builds a complete new SSLContext and swaps the
reference. New handshakes get the new certificate; connections already open keep the context
they were wrapped with, so nothing in flight is dropped. A half-written or mismatched pair is
refused with a log line and the old context stays in use until the next check. A client CA
(`serve --client-ca`, mutual TLS with the apiserver) is watched the same way: a rotated bundle is
trusted from the next handshake on.
"""
from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

CA_FILE = "ca.crt"  # the names a kubernetes.io/tls Secret (plus ca.crt) uses, so a Secret mounts as-is
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_DAYS = 3650
SERVING_DAYS = 365
# A serving certificate this close to its end is issued again (selfManaged mode, at start).
RENEW_BEFORE_DAYS = 30


class CertError(ValueError):
    """Certificate material is missing or unusable; the message names the file."""


@dataclass(frozen=True)
class CertPaths:
    ca: str
    cert: str
    key: str


def service_names(service: str, namespace: str, cluster_domain: str = "cluster.local") -> list[str]:
    """DNS names the apiserver may use for the Service, plus localhost for local runs."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.{cluster_domain}", "localhost"]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(common_name: str, days: int = CA_DAYS) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, private key PEM). P-256 keys: small and fast handshakes."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_serving_cert(ca_cert_pem: bytes, ca_key_pem: bytes, dns_names: list[str], ip_addresses: list[str],
                      days: int = SERVING_DAYS, now: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    """A server certificate signed by the CA, with the names as SANs, valid from `now` (default:
    the current time): (certificate PEM, key PEM)."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise CertError(f"the CA key is a {type(ca_key).__name__}; an EC or RSA key can sign certificates")
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or datetime.datetime.now(datetime.timezone.utc)
    sans = [x509.DNSName(n) for n in dns_names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    cert = (x509.CertificateBuilder()
            .subject_name(_name(dns_names[0])).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _same_key(key: PrivateKeyTypes, cert: x509.Certificate) -> bool:
    raw = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*raw) == cert.public_key().public_bytes(*raw)


def ca_problem(ca_cert_pem: bytes, ca_key_pem: bytes, now: datetime.datetime | None = None,
               renew_before_days: int = RENEW_BEFORE_DAYS) -> str | None:
    """What keeps a CA from signing serving certificates, or None: it cannot be read, its key is
    not the certificate's, it is no CA, or it ends within `renew_before_days`."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
        ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
        is_ca = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except (ValueError, TypeError, x509.ExtensionNotFound):
        return "it or its key cannot be read as a CA"
    if not _same_key(ca_key, ca_cert):
        return "its key does not belong to it"
    if not is_ca:
        return "it is no CA"
    if ca_cert.not_valid_after_utc - now < datetime.timedelta(days=renew_before_days):
        return f"it ends at {ca_cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, within {renew_before_days} days"
    return None


def reissue_reason(cert_pem: bytes, key_pem: bytes, ca_cert_pem: bytes, dns_names: list[str],
                   now: datetime.datetime | None = None, renew_before_days: int = RENEW_BEFORE_DAYS) -> str | None:
    """Why a serving pair must be issued again under this CA, or None while it is good: it cannot
    be read, its key is not the certificate's, the CA did not sign it, it expires within
    `renew_before_days`, or its DNS names are not exactly `dns_names`."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    except (ValueError, TypeError):
        return "the certificate or its key cannot be read"
    if not _same_key(key, cert):
        return "its key does not belong to the certificate"
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return "the CA did not sign it"
    if cert.not_valid_after_utc - now < datetime.timedelta(days=renew_before_days):
        return f"it expires at {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC, within {renew_before_days} days"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "it names no DNS names"
    if sorted(names.get_values_for_type(x509.DNSName)) != sorted(dns_names):
        return f"it names {', '.join(names.get_values_for_type(x509.DNSName))}, not {', '.join(dns_names)}"
    return None


def write_atomically(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write via a temporary file and rename, so a watching server never reads half a file."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_certs(out_dir: str, service: str, namespace: str) -> CertPaths:
    """A new CA and a serving certificate for `service.namespace` in out_dir (ca.crt, tls.crt, tls.key)."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        paths = CertPaths(*(os.path.join(out_dir, f) for f in (CA_FILE, CERT_FILE, KEY_FILE)))
        ca_cert, ca_key = make_ca(f"{service}.{namespace} webhook CA")
        cert, key = make_serving_cert(ca_cert, ca_key, service_names(service, namespace), ["127.0.0.1"])
        write_atomically(paths.ca, ca_cert)
        write_atomically(paths.key, key, 0o600)
        write_atomically(paths.cert, cert)
    except OSError as err:
        raise CertError(f"certificate directory {out_dir}: {err.strerror}") from None
    return paths


def ensure_dev_certs(out_dir: str, service: str = "topology-webhook", namespace: str = "default") -> CertPaths:
    """The certificates in out_dir, generated first when any of the three files is missing."""
    paths = CertPaths(*(os.path.join(out_dir, f) for f in (CA_FILE, CERT_FILE, KEY_FILE)))
    if all(os.path.exists(p) for p in (paths.ca, paths.cert, paths.key)):
        return paths
    return write_certs(out_dir, service, namespace)


def ca_bundle(ca_path: str) -> str:
    """The caBundle value of a webhook configuration: base64 of the CA PEM."""
    try:
        with open(ca_path, "rb") as handle:
            return base64.b64encode(handle.read()).decode("ascii")
    except OSError as err:
        raise CertError(f"CA file {ca_path}: {err.strerror}") from None


# TLS 1.2 suites: forward-secret AEAD only (no CBC); TLS 1.3 suites are all AEAD and not set here.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(cert_path: str, key_path: str, client_ca: str | None = None) -> ssl.SSLContext:
    """A server-side context, TLS 1.2 or newer, serving the certificate chain in cert_path; with
    client_ca, clients must present a certificate that CA signed (mutual TLS)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS12_CIPHERS)
    try:
        context.load_cert_chain(cert_path, key_path)
        if client_ca:
            context.load_verify_locations(cafile=client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
    except FileNotFoundError as err:
        raise CertError(f"certificate file {err.filename or cert_path}: not found") from None
    except (ssl.SSLError, OSError) as err:
        raise CertError(f"certificate {cert_path} / key {key_path}: cannot load ({err})") from None
    return context


def _identity(path: str) -> tuple:
    """What changes when the file is replaced: the real file behind symlinks, and its stat."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return real, st.st_ino, st.st_mtime_ns, st.st_size


class ReloadingContext:
    """The current server SSLContext for a certificate/key pair that may be replaced on disk."""

    def __init__(self, cert_path: str, key_path: str, check_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, client_ca: str | None = None) -> None:
        self.cert_path, self.key_path, self.client_ca = cert_path, key_path, client_ca
        self.check_interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._seen = self._identities()
        self._context = server_context(cert_path, key_path, client_ca)  # raises CertError: fail at start-up
        self._next_check = clock() + check_interval

    def _identities(self) -> tuple | None:
        try:
            return tuple(_identity(path) for path in (self.cert_path, self.key_path, self.client_ca) if path)
        except OSError:
            return None  # mid-swap or deleted: compare as "changed" and retry at the next check

    def current(self) -> ssl.SSLContext:
        now = self._clock()
        if now < self._next_check:
            return self._context
        with self._lock:
            if now >= self._next_check:
                self._next_check = now + self.check_interval
                seen = self._identities()
                if seen is not None and seen != self._seen:
                    try:
                        self._context = server_context(self.cert_path, self.key_path, self.client_ca)
                        self._seen = seen
                        log.info("reloaded TLS certificate %s", self.cert_path)
                    except CertError as err:
                        log.warning("keeping the previous TLS certificate: %s", err)
        return self._context
