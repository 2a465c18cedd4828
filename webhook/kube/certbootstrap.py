"""The webhook's own certificates (the chart's `tls.mode: selfManaged`): one CA and one serving
certificate kept in a Secret, the serving pair written where the server reads it, and the CA put
into the caBundle of the webhook's own MutatingWebhookConfiguration. `serve` runs `ensure` before
gunicorn binds.

Why the process and not the chart: a chart that generates a CA renders differently every time
(`helm template`, Argo CD and Flux cannot look the last one up), so GitOps tools show permanent
drift. Here the chart renders no key material at all, and the replicas agree through the API:

- the first replica to start creates the Secret; one that loses the race (409 AlreadyExists)
  reads the winner's, so every replica serves under one CA;
- a serving certificate that expires within 30 days, was not signed by the CA or does not name
  the Service is issued again under the same CA (an update carrying the resourceVersion read; a
  409 Conflict means another replica did it first: read theirs), so the caBundle never changes;
- each webhook entry whose caBundle is not this CA is patched, by a JSON patch whose `test`
  operations pin every entry's name: an entry list edited meanwhile fails the whole patch (422)
  instead of getting a bundle at the wrong index, and is read and patched again.

The server's worker runs it again hourly (`keep_current`): a pod that runs into its certificate's
last 30 days gets a new one (the server reloads the rewritten files), and a caBundle that a sync
replaced is put back.

Expected failures (RBAC's 403, a missing MutatingWebhookConfiguration, an unreachable API server,
a Secret someone else filled) raise `SelfManagedTLSError` with one line saying what to fix.
"""
from __future__ import annotations

import base64
import datetime
import json
import logging
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from ..credentials import certs

log = logging.getLogger(__name__)

CA_KEY_FILE = "ca.key"  # the CA's private key, next to the kubernetes.io/tls keys in the Secret
ATTEMPTS = 5  # reads and writes per object before giving up on a Secret or configuration that keeps changing
REQUEST_SECONDS = 10.0
RECHECK_SECONDS = 3600.0
MANAGED_BY = {"app.kubernetes.io/managed-by": "topology-webhook"}


class SelfManagedTLSError(certs.CertError):
    """The certificates could not be ensured; the message says which object and what to fix."""


@dataclass(frozen=True)
class SelfManagedTLS:
    """Where the certificates live: the Secret, the Service they name and the configuration to patch."""

    namespace: str
    secret: str
    service: str
    webhook_configuration: str
    cluster_domain: str = "cluster.local"

    @property
    def dns_names(self) -> list[str]:
        return certs.service_names(self.service, self.namespace, self.cluster_domain)


@dataclass(frozen=True)
class Material:
    """What the Secret holds (PEM), and the resourceVersion it was read at."""

    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    resource_version: str | None = None

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode(self.ca_cert).decode("ascii")

    @property
    def ca_fingerprint(self) -> str:
        """For log lines: which CA, without its bytes."""
        return x509.load_pem_x509_certificate(self.ca_cert).fingerprint(hashes.SHA256()).hex()[:16]


_SECRET_KEYS = {"ca_cert": certs.CA_FILE, "ca_key": CA_KEY_FILE, "cert": certs.CERT_FILE, "key": certs.KEY_FILE}


def _issued(material: Material, target: SelfManagedTLS, now: datetime.datetime | None) -> Material:
    cert, key = certs.make_serving_cert(material.ca_cert, material.ca_key, target.dns_names, ["127.0.0.1"],
                                        now=now)
    return replace(material, cert=cert, key=key)


def _new_material(target: SelfManagedTLS, now: datetime.datetime | None) -> Material:
    ca_cert, ca_key = certs.make_ca(f"{target.service}.{target.namespace} webhook CA")
    return _issued(Material(ca_cert, ca_key, b"", b""), target, now)


def _secret_body(material: Material, target: SelfManagedTLS) -> dict:
    metadata: dict[str, Any] = {"name": target.secret, "namespace": target.namespace, "labels": MANAGED_BY}
    if material.resource_version:
        metadata["resourceVersion"] = material.resource_version
    data = {key: base64.b64encode(getattr(material, field)).decode("ascii") for field, key in _SECRET_KEYS.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "kubernetes.io/tls", "data": data}


def _material_of(secret: dict, target: SelfManagedTLS) -> Material:
    data = secret.get("data") or {}
    missing = [key for key in _SECRET_KEYS.values() if not data.get(key)]
    if missing:
        raise SelfManagedTLSError(
            f"Secret {target.namespace}/{target.secret} lacks {', '.join(missing)}: it was not made by the webhook; "
            f"delete it (the webhook then creates a new CA) or name another one")
    pems = {field: base64.b64decode(data[key]) for field, key in _SECRET_KEYS.items()}
    return Material(**pems, resource_version=secret["metadata"].get("resourceVersion"))


def _api_message(err: ApiException) -> str:
    try:
        return json.loads(err.body or "").get("message") or ""
    except (TypeError, ValueError, AttributeError):
        return str(err.reason or "").strip()


def _call(what: str, request: Callable[..., Any], *args: Any, tolerated: tuple[int, ...] = ()) -> dict | None:
    """One API request as parsed JSON; None when it answers one of the `tolerated` statuses.
    Anything else raises SelfManagedTLSError naming `what` and the fix."""
    try:
        response = request(*args, _preload_content=False, _request_timeout=REQUEST_SECONDS)
    except ApiException as err:
        if err.status in tolerated:
            return None
        message = _api_message(err)
        if err.status == 403:
            raise SelfManagedTLSError(
                f"{what}: forbidden ({message}); tls.mode selfManaged needs the chart's Role for this Secret and "
                "ClusterRole for this MutatingWebhookConfiguration (or use another tls.mode)") from None
        raise SelfManagedTLSError(f"{what}: HTTP {err.status} {str(err.reason or '').strip()}: {message}") from None
    except (HTTPError, OSError) as err:
        cause = getattr(err, "reason", None) or err
        raise SelfManagedTLSError(f"{what}: the API server cannot be reached ({cause})") from None
    return json.loads(response.data)


def ensure_secret(core: k8s_client.CoreV1Api, target: SelfManagedTLS,
                  now: datetime.datetime | None = None) -> Material:
    """The CA and a good serving certificate from the Secret, creating or updating it as needed."""
    where = f"Secret {target.namespace}/{target.secret}"
    for _ in range(ATTEMPTS):
        secret = _call(f"reading {where}", core.read_namespaced_secret, target.secret, target.namespace,
                       tolerated=(404,))
        if secret is None:
            body = _secret_body(_new_material(target, now), target)
            created = _call(f"creating {where}", core.create_namespaced_secret, target.namespace, body,
                            tolerated=(409,))
            if created is None:
                log.info("%s was created by another replica meanwhile; using its CA", where)
                continue
            log.info("created %s with a new CA and serving certificate", where)
            return _material_of(created, target)
        material = _material_of(secret, target)
        problem = certs.ca_problem(material.ca_cert, material.ca_key, now)
        if problem:  # a new CA needs every replica restarted onto it: a person's decision, not a start-up's
            raise SelfManagedTLSError(f"the CA in {where}: {problem}; delete the Secret and restart the webhook's "
                                      "pods: the first to start makes a new CA")
        reason = certs.reissue_reason(material.cert, material.key, material.ca_cert, target.dns_names, now)
        if reason is None:
            return material
        log.info("issuing a new serving certificate in %s under the same CA: %s", where, reason)
        updated = _call(f"updating {where}", core.replace_namespaced_secret, target.secret, target.namespace,
                        _secret_body(_issued(material, target, now), target), tolerated=(409,))
        if updated is not None:
            return _material_of(updated, target)
        log.info("%s was changed by another replica meanwhile; reading it again", where)
    raise SelfManagedTLSError(f"{where} changed under every one of {ATTEMPTS} attempts to use it; restart to try again")


def ensure_ca_bundle(admission: k8s_client.AdmissionregistrationV1Api, target: SelfManagedTLS, ca_bundle: str) -> int:
    """Put `ca_bundle` into every webhook entry of the configuration; how many entries changed."""
    where = f"MutatingWebhookConfiguration {target.webhook_configuration}"
    for _ in range(ATTEMPTS):
        configuration = _call(f"reading {where}", admission.read_mutating_webhook_configuration,
                              target.webhook_configuration, tolerated=(404,))
        if configuration is None:
            raise SelfManagedTLSError(f"{where} not found: install it first (the chart does), or pass the name of "
                                      "yours with --webhook-configuration")
        patch = []
        for position, entry in enumerate(configuration.get("webhooks") or []):
            if (entry.get("clientConfig") or {}).get("caBundle") != ca_bundle:
                patch += [{"op": "test", "path": f"/webhooks/{position}/name", "value": entry["name"]},
                          {"op": "add", "path": f"/webhooks/{position}/clientConfig/caBundle", "value": ca_bundle}]
        if not patch:
            return 0
        if _call(f"patching the caBundle of {where}", admission.patch_mutating_webhook_configuration,
                 target.webhook_configuration, patch, tolerated=(409, 422)) is not None:
            log.info("set the caBundle of %d webhook(s) of %s", len(patch) // 2, where)
            return len(patch) // 2
        log.info("%s was changed meanwhile; reading it again", where)
    raise SelfManagedTLSError(f"{where} changed under every one of {ATTEMPTS} attempts to patch it; restart to try again")


def ensure(api_client: k8s_client.ApiClient, target: SelfManagedTLS, cert_path: str, key_path: str,
           now: datetime.datetime | None = None) -> Material:
    """Everything the server needs before it binds: the Secret, the serving pair on disk (key
    first: the reloading server refuses a mismatched pair until both are new) and the caBundle."""
    material = ensure_secret(k8s_client.CoreV1Api(api_client), target, now)
    try:
        for path, data, mode in ((key_path, material.key, 0o600), (cert_path, material.cert, 0o644)):
            if not _holds(path, data):  # unchanged files stay: the server reloads on any replacement
                certs.write_atomically(path, data, mode)
    except OSError as err:
        raise SelfManagedTLSError(f"writing the serving certificate to {cert_path}: {err.strerror}") from None
    ensure_ca_bundle(k8s_client.AdmissionregistrationV1Api(api_client), target, material.ca_bundle)
    return material


def _holds(path: str, data: bytes) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read() == data
    except OSError:
        return False


def keep_current(api_client: k8s_client.ApiClient, target: SelfManagedTLS, cert_path: str, key_path: str,
                 interval: float = RECHECK_SECONDS) -> threading.Event:
    """`ensure` again every `interval` seconds in a daemon thread, while the server runs; a
    failure is logged and tried again at the next turn (the files in place keep serving). Set the
    returned event to stop."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval):
            try:
                ensure(api_client, target, cert_path, key_path)
            except SelfManagedTLSError as err:
                log.warning("self-managed TLS check failed, trying again in %.0f s: %s", interval, err)

    threading.Thread(target=run, name="self-managed-tls", daemon=True).start()
    return stop
