"""tls.mode selfManaged: the webhook keeps its own CA in a Secret and patches its own caBundle,
against the fake API server (tests/integration/fakeapiserver.py) with the real `kubernetes` client, and the
real server (gunicorn over TLS) serving what it ensured."""
import base64
import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import threading

import pytest
from cryptography import x509
from cryptography.x509.verification import DNSName, PolicyBuilder, Store
from kubernetes.client import AdmissionregistrationV1Api, ApiClient, Configuration

from webhook.kube import certbootstrap
from webhook.credentials import certs
from webhook.kube.certbootstrap import SelfManagedTLS, SelfManagedTLSError

from conftest import ROOT, eventually, free_port, review_of, start_server, stop_server, write_kubeconfig
from tests.fixtures.builders import gpu_pod

NAMESPACE, SERVICE, CONFIGURATION = "gpu-infra", "tw-topology-webhook", "tw-topology-webhook"
TARGET = SelfManagedTLS(NAMESPACE, "tw-topology-webhook-self-managed-tls", SERVICE, CONFIGURATION)
ENTRIES = ("placement.topology.scheduler", "release.topology.scheduler")
NOW = datetime.datetime.now(datetime.timezone.utc)


def webhook_configuration() -> dict:
    """As the chart renders it in selfManaged mode: every entry without a caBundle."""
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION},
            "webhooks": [{"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "NoneOnDryRun",
                          "clientConfig": {"service": {"name": SERVICE, "namespace": NAMESPACE, "path": "/mutate",
                                                       "port": 443}}} for name in ENTRIES]}


@pytest.fixture
def cluster(fake):
    """The fake API server holding the webhook's configuration, as after `helm install`."""
    fake.put("mutatingwebhookconfigurations", webhook_configuration())
    return fake


def start(server, workdir, name="replica", target=TARGET, now=None) -> certbootstrap.Material:
    """One replica's start-up: what `serve --tls-secret` runs before binding."""
    api = ApiClient(Configuration(host=server.url))
    out = workdir / name
    out.mkdir(exist_ok=True)
    return certbootstrap.ensure(api, target, str(out / "tls.crt"), str(out / "tls.key"), now)


def stored_secret(server) -> dict:
    return server.get("secrets", f"{NAMESPACE}/{TARGET.secret}")


def ca_bundles(server) -> list[str]:
    return [(entry["clientConfig"].get("caBundle")) for entry in
            server.get("mutatingwebhookconfigurations", CONFIGURATION)["webhooks"]]


def verify(cert_pem: bytes, ca_bundle: str, names, at: datetime.datetime | None = None) -> None:
    """As the apiserver checks a webhook, at `at` (default: now, not NOW: a certificate issued minutes
    after the module was imported is not valid yet at NOW): the chain to caBundle and the Service
    name (raises otherwise)."""
    store = Store(x509.load_pem_x509_certificates(base64.b64decode(ca_bundle)))
    for name in names:
        PolicyBuilder().store(store).time(at or datetime.datetime.now(datetime.timezone.utc)).build_server_verifier(
            DNSName(name)).verify(
            x509.load_pem_x509_certificate(cert_pem), [])


def writes_of(server, resource: str) -> list[tuple[str, int]]:
    return [(method, status) for method, path, status in server.writes if f"/{resource}" in path]


def test_first_start_creates_the_secret_and_puts_its_ca_into_every_webhook(cluster, tmp_path):
    material = start(cluster, tmp_path)
    secret = stored_secret(cluster)
    assert secret["type"] == "kubernetes.io/tls"
    assert {base64.b64decode(secret["data"][key]) for key in ("ca.crt", "tls.crt", "tls.key")} == {
        material.ca_cert, material.cert, material.key}
    assert ca_bundles(cluster) == [material.ca_bundle] * len(ENTRIES)
    served = (tmp_path / "replica" / "tls.crt").read_bytes()
    assert served == material.cert and (tmp_path / "replica" / "tls.key").read_bytes() == material.key
    verify(served, material.ca_bundle, [f"{SERVICE}.{NAMESPACE}.svc", f"{SERVICE}.{NAMESPACE}.svc.cluster.local"])
    assert writes_of(cluster, "secrets") == [("POST", 201)]
    assert writes_of(cluster, "mutatingwebhookconfigurations") == [("PATCH", 200)]


def test_a_second_start_reuses_the_ca_and_writes_nothing(cluster, tmp_path):
    first = start(cluster, tmp_path, "first")
    writes = len(cluster.writes)
    second = start(cluster, tmp_path, "second")
    assert second.ca_cert == first.ca_cert and second.cert == first.cert
    assert ca_bundles(cluster) == [first.ca_bundle] * len(ENTRIES)
    assert len(cluster.writes) == writes  # the caBundle was current: not even a patch


def test_replicas_starting_together_agree_on_one_ca(cluster, tmp_path):
    cluster.write_delay_seconds = 0.2  # every replica reads "not found" before the first create lands
    barrier = threading.Barrier(4)
    results: dict[int, certbootstrap.Material] = {}

    def replica(number: int) -> None:
        barrier.wait(timeout=10)
        results[number] = start(cluster, tmp_path, f"replica-{number}")

    threads = [threading.Thread(target=replica, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 4
    assert len({material.ca_cert for material in results.values()}) == 1
    assert len({material.cert for material in results.values()}) == 1
    assert base64.b64decode(stored_secret(cluster)["data"]["ca.crt"]) == results[0].ca_cert
    assert set(ca_bundles(cluster)) == {results[0].ca_bundle}
    assert [status for method, status in writes_of(cluster, "secrets") if status == 201] == [201]


def test_a_replica_that_loses_the_create_race_uses_the_winners_ca(cluster, tmp_path, monkeypatch):
    """Deterministically: another replica creates the Secret between this one's read and create."""
    made = certbootstrap._new_material
    winner = {}

    def another_replica_wins_meanwhile(target, now):
        if not winner:
            winner["material"] = None  # the winner's own call makes its material unhindered
            winner["material"] = start(cluster, tmp_path, "winner")
        return made(target, now)

    monkeypatch.setattr(certbootstrap, "_new_material", another_replica_wins_meanwhile)
    loser = start(cluster, tmp_path, "loser")
    assert loser.ca_cert == winner["material"].ca_cert and loser.cert == winner["material"].cert
    assert writes_of(cluster, "secrets") == [("POST", 201), ("POST", 409)]
    assert ca_bundles(cluster) == [loser.ca_bundle] * len(ENTRIES)


@pytest.mark.parametrize("why, later, target", [
    ("expires within 30 days", NOW + datetime.timedelta(days=certs.SERVING_DAYS - 20), TARGET),
    ("expired", NOW + datetime.timedelta(days=certs.SERVING_DAYS + 1), TARGET),
    ("names another Service", NOW, SelfManagedTLS(NAMESPACE, TARGET.secret, "renamed", CONFIGURATION)),
])
def test_a_serving_certificate_that_is_due_is_issued_again_under_the_same_ca(cluster, tmp_path, why, later, target):
    first = start(cluster, tmp_path, "first")
    again = start(cluster, tmp_path, "again", target, now=later)
    assert again.ca_cert == first.ca_cert and again.cert != first.cert
    assert ca_bundles(cluster) == [first.ca_bundle] * len(ENTRIES)  # the apiserver's trust did not move
    verify(again.cert, first.ca_bundle, [f"{target.service}.{NAMESPACE}.svc"], at=later)
    assert base64.b64decode(stored_secret(cluster)["data"]["tls.crt"]) == again.cert
    assert writes_of(cluster, "secrets") == [("POST", 201), ("PUT", 200)]
    assert start(cluster, tmp_path, "then", target, now=later).cert == again.cert  # issued once


def test_a_replica_that_loses_the_reissue_race_uses_the_winners_certificate(cluster, tmp_path, monkeypatch):
    start(cluster, tmp_path, "first")
    later = NOW + datetime.timedelta(days=certs.SERVING_DAYS - 1)
    issue = certbootstrap._issued
    winner = {}

    def another_replica_reissues_meanwhile(material, target, now):
        if not winner:
            winner["material"] = None  # the winner's own call issues unhindered
            winner["material"] = start(cluster, tmp_path, "winner", now=later)
        return issue(material, target, now)

    monkeypatch.setattr(certbootstrap, "_issued", another_replica_reissues_meanwhile)
    loser = start(cluster, tmp_path, "loser", now=later)
    assert loser.cert == winner["material"].cert
    assert writes_of(cluster, "secrets") == [("POST", 201), ("PUT", 200), ("PUT", 409)]


def test_a_webhook_entry_already_carrying_the_ca_is_left_alone(cluster, tmp_path):
    material = start(cluster, tmp_path)
    configuration = cluster.get("mutatingwebhookconfigurations", CONFIGURATION)
    del configuration["webhooks"][1]["clientConfig"]["caBundle"]  # e.g. a sync that replaced the object
    cluster.put("mutatingwebhookconfigurations", configuration)
    api = AdmissionregistrationV1Api(ApiClient(Configuration(host=cluster.url)))
    assert certbootstrap.ensure_ca_bundle(api, TARGET, material.ca_bundle) == 1
    assert ca_bundles(cluster) == [material.ca_bundle] * len(ENTRIES)


def test_entries_reordered_between_read_and_patch_fail_the_patch_and_are_read_again(cluster, tmp_path):
    """The JSON patch pins each entry's name: a bundle is never written at an index that now holds another entry."""
    material = start(cluster, tmp_path)
    configuration = cluster.get("mutatingwebhookconfigurations", CONFIGURATION)
    configuration["webhooks"][0]["clientConfig"].pop("caBundle")
    cluster.put("mutatingwebhookconfigurations", configuration)

    class ReorderedAfterTheFirstRead(AdmissionregistrationV1Api):
        reads = 0

        def read_mutating_webhook_configuration(self, *args, **kwargs):
            answer = super().read_mutating_webhook_configuration(*args, **kwargs)
            if not self.reads:  # e.g. `helm upgrade` rewrites the object meanwhile
                changed = cluster.get("mutatingwebhookconfigurations", CONFIGURATION)
                changed["webhooks"].reverse()
                cluster.put("mutatingwebhookconfigurations", changed)
            self.reads += 1
            return answer

    api = ReorderedAfterTheFirstRead(ApiClient(Configuration(host=cluster.url)))
    assert certbootstrap.ensure_ca_bundle(api, TARGET, material.ca_bundle) == 1
    assert writes_of(cluster, "mutatingwebhookconfigurations")[-2:] == [("PATCH", 422), ("PATCH", 200)]
    entries = cluster.get("mutatingwebhookconfigurations", CONFIGURATION)["webhooks"]
    assert [entry["name"] for entry in entries] == list(reversed(ENTRIES))
    assert ca_bundles(cluster) == [material.ca_bundle] * len(ENTRIES)


def test_a_running_server_puts_back_a_ca_bundle_a_sync_removed_and_keeps_its_files(cluster, tmp_path):
    material = start(cluster, tmp_path)
    served = tmp_path / "replica" / "tls.crt"
    before = served.stat().st_ino
    configuration = cluster.get("mutatingwebhookconfigurations", CONFIGURATION)
    for entry in configuration["webhooks"]:
        del entry["clientConfig"]["caBundle"]  # e.g. a sync that replaced the whole object
    cluster.put("mutatingwebhookconfigurations", configuration)
    stop = certbootstrap.keep_current(ApiClient(Configuration(host=cluster.url)), TARGET, str(served),
                                      str(tmp_path / "replica" / "tls.key"), interval=0.05)
    try:
        eventually(lambda: ca_bundles(cluster) == [material.ca_bundle] * len(ENTRIES), what="the caBundle put back")
    finally:
        stop.set()
    assert served.stat().st_ino == before  # an unchanged certificate is not rewritten: no needless reload


@pytest.mark.parametrize("forbidden, message", [
    ("secrets", f'reading Secret {NAMESPACE}/{TARGET.secret}: forbidden (secrets "{TARGET.secret}" is forbidden: '
                f'User "system:serviceaccount:{NAMESPACE}:webhook" cannot get resource "secrets" in API group ""'),
    ("mutatingwebhookconfigurations", f"reading MutatingWebhookConfiguration {CONFIGURATION}: forbidden "
                                      f'(mutatingwebhookconfigurations.admissionregistration.k8s.io "{CONFIGURATION}" '
                                      "is forbidden"),
])
def test_missing_rbac_stops_start_up_with_what_was_forbidden(cluster, tmp_path, forbidden, message):
    cluster.forbidden = {forbidden}
    with pytest.raises(SelfManagedTLSError) as err:
        start(cluster, tmp_path)
    assert message in str(err.value)
    assert "tls.mode selfManaged needs the chart's Role" in str(err.value)


def test_a_missing_webhook_configuration_is_named(fake, tmp_path):
    with pytest.raises(SelfManagedTLSError, match=f"MutatingWebhookConfiguration {CONFIGURATION} not found"):
        start(fake, tmp_path)


def test_a_secret_the_webhook_did_not_make_is_refused_with_the_fix(cluster, tmp_path):
    cluster.put("secrets", {"metadata": {"name": TARGET.secret, "namespace": NAMESPACE}, "type": "Opaque",
                            "data": {"password": base64.b64encode(b"hunter2").decode()}})
    with pytest.raises(SelfManagedTLSError, match="lacks ca.crt, ca.key, tls.crt, tls.key: .* delete it"):
        start(cluster, tmp_path)


def test_a_ca_near_its_end_stops_start_up_with_how_to_replace_it(cluster, tmp_path):
    start(cluster, tmp_path)
    with pytest.raises(SelfManagedTLSError, match=r"the CA in Secret .*: it ends at .* within 30 days; delete the "
                                                  r"Secret and restart the webhook's pods"):
        start(cluster, tmp_path, now=NOW + datetime.timedelta(days=certs.CA_DAYS - 10))


def test_an_unreachable_api_server_is_one_line(tmp_path):
    api = ApiClient(Configuration(host="http://127.0.0.1:9"))  # discard port: nothing listens
    api.configuration.retries = False
    with pytest.raises(SelfManagedTLSError, match="reading Secret .*: the API server cannot be reached"):
        certbootstrap.ensure(api, TARGET, str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))


# ----- serve --tls-secret -------------------------------------------------------------------------

def serve_flags(kubeconfig: str) -> list[str]:
    return ["--kubeconfig", kubeconfig, "--tls-secret", f"{NAMESPACE}/{TARGET.secret}", "--tls-service", SERVICE,
            "--webhook-configuration", CONFIGURATION]


def test_serve_verifies_against_the_ca_bundle_it_patched_into_its_configuration(cluster, tmp_path):
    trusted = tmp_path / "trusted-ca.crt"
    trusted.write_bytes(certs.make_ca("not the webhook's CA")[0])  # until the webhook has patched its own in

    def trust_the_patched_bundle():
        bundle = eventually(lambda: ca_bundles(cluster)[0], timeout=60, what="the caBundle patch")
        trusted.write_bytes(base64.b64decode(bundle))

    threading.Thread(target=trust_the_patched_bundle, daemon=True).start()
    served = tmp_path / "served"
    served.mkdir()
    server = start_server(tmp_path, *serve_flags(write_kubeconfig(tmp_path / "kubeconfig", cluster)),
                          cert=str(served / "tls.crt"), key=str(served / "tls.key"), ca=str(trusted))
    try:
        (bundle,) = set(ca_bundles(cluster))
        assert bundle == stored_secret(cluster)["data"]["ca.crt"]
        context = ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            # The name the apiserver dials for a service reference: <service>.<namespace>.svc
            with context.wrap_socket(raw, server_hostname=f"{SERVICE}.{NAMESPACE}.svc") as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
        assert server.client().admit(review_of(gpu_pod("placed", 1)))
        lines = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
        assert any(line["message"].startswith(f"created Secret {NAMESPACE}/{TARGET.secret}") for line in lines)
    finally:
        stop_server(server)


def test_serve_without_rights_exits_with_the_reason_and_no_traceback(cluster, tmp_path):
    cluster.forbidden = {"secrets"}
    command = [sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{free_port()}",
               "--metrics-bind", f"127.0.0.1:{free_port()}",
               "--cert", str(tmp_path / "tls.crt"), "--key", str(tmp_path / "tls.key"),
               *serve_flags(write_kubeconfig(tmp_path / "kubeconfig", cluster))]
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    (last,) = [json.loads(line) for line in done.stderr.splitlines() if "forbidden" in line]
    assert last["level"] == "error" and 'cannot get resource "secrets"' in last["message"]


@pytest.mark.parametrize("flags, message", [
    (["--tls-secret", "just-a-name"], "is not NAMESPACE/NAME"),
    (["--tls-secret", f"{NAMESPACE}/x", "--tls-service", SERVICE, "--webhook-configuration", CONFIGURATION],
     "--tls-secret writes the serving certificate to --cert and --key: give both"),
    (["--tls-secret", f"{NAMESPACE}/x", "--cert", "c", "--key", "k", "--webhook-configuration", CONFIGURATION],
     "--tls-secret needs --tls-service NAME"),
    (["--tls-secret", f"{NAMESPACE}/x", "--cert", "c", "--key", "k", "--tls-service", SERVICE],
     "--tls-secret needs --webhook-configuration NAME"),
    (["--webhook-configuration", CONFIGURATION], "--webhook-configuration only goes with --tls-secret"),
])
def test_tls_secret_flags_that_do_not_fit_together_are_one_usage_line(flags, message):
    from webhook import cli
    with pytest.raises(cli.UsageError, match=message):
        cli.self_managed_tls(cli.build_parser().parse_args(["serve", *flags]))
