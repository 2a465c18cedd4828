"""The Helm chart, rendered by Helm's own engine (helm-python-sdk), checked against the server and
the official Kubernetes schemas.

Supported Kubernetes versions: 1.30 to 1.37 with the default values; 1.28 and 1.29 with
webhook.matchConditions.enabled=false. cert-manager (cert-manager.io) and Prometheus Operator
(monitoring.coreos.com) objects have no schema in kubernetes-validate, so they are skipped there and
checked field by field below; Prometheus Operator's also against its CRDs' schemas
(tests/fixtures/crds).
"""
from __future__ import annotations

import base64
import datetime
import functools
import json
from pathlib import Path

import celpy
import gzip
import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.verification import DNSName, PolicyBuilder, Store

from tests.fixtures.shared import ci_script
from webhook.objects.feed import STORED_KINDS
from webhook.objects.kinds import REGISTRY
from webhook.serving.paths import DEFAULT_PORT, HEALTHZ_PATH, METRICS_PATH, MUTATE_PATH, READYZ_PATH
from webhook.settings.config import DEFAULT_NCCL_PROFILES, LINK_CLASSES, Config, HardwareProfile
from webhook.settings.loading import FILE_KEYS, config_from_mapping
from webhook.settings.presets import PRESETS

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "topology-webhook"
RELEASE = "tw"
NAMESPACE = "gpu-infra"
FULLNAME = "tw-topology-webhook"
POD_ENV = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
SERVICE_DNS_NAMES = [FULLNAME, f"{FULLNAME}.{NAMESPACE}", f"{FULLNAME}.{NAMESPACE}.svc",
                     f"{FULLNAME}.{NAMESPACE}.svc.cluster.local"]
WITH_MATCH_CONDITIONS = [f"1.{minor}.0" for minor in range(30, 38)]
WITHOUT_MATCH_CONDITIONS = [f"1.{minor}.0" for minor in range(28, 38)]
SCHEMALESS_API_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")

# A CA of our own for the existing-Secret mode (any PEM will do: the chart only passes it through).
OWN_CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()

VALUE_SETS = {
    "defaults": {},  # tls.mode selfManaged
    "generated": {"tls": {"mode": "generated"}},
    "cert-manager": {"tls": {"mode": "certManager"}, "crdCheck": False},
    "cert-manager-own-issuer": {"crdCheck": False, "tls": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
    "existing-secret": {"tls": {"mode": "existingSecret", "existingSecret": {
        "name": "corp-webhook-tls", "caBundle": OWN_CA_BUNDLE}}},
    "one-replica": {"replicas": 1},
    "three-replicas-hard-anti-affinity": {"replicas": 3, "podAntiAffinity": "hard"},
    "fail-closed": {"webhook": {"failurePolicy": "Fail"}},
    # What a cluster before 1.30 can run: no matchConditions, no gated waits.
    "no-match-conditions": {"webhook": {"matchConditions": {"enabled": False}}, "config": {"gate_waits": False}},
    # Mutual TLS with the apiserver: the CA that signed its client certificate, from a ConfigMap.
    "client-certificates": {"tls": {"clientCA": {"configMap": "apiserver-client-ca"}}},
    "operators": {"webhook": {"operators": ["jobset.x-k8s.io", "kubeflow.org", "ray.io"]}},
    # The metrics port open (a cluster that fronts it itself), scraped over plain HTTP.
    "metrics-open": {"metrics": {"secure": False}, "serviceMonitor": {"enabled": True}, "crdCheck": False},
    # Readers bound to the chart's reader roles; the CA for Prometheus from the values.
    "metrics-readers": {"metrics": {"readers": [{"kind": "ServiceAccount", "name": "prometheus-k8s",
                                                 "namespace": "monitoring"}],
                                    "topologyReaders": [{"kind": "Group", "name": "platform-team"}]},
                        "serviceMonitor": {"enabled": True}, "crdCheck": False,
                        "tls": {"mode": "existingSecret", "existingSecret": {
                            "name": "corp-webhook-tls", "caBundle": OWN_CA_BUNDLE}}},
    # The keys platform teams expect of a chart, all set at once.
    "platform-team": {
        "nameOverride": "gpu-placer", "fullnameOverride": "gpu-placement", "commonLabels": {"team": "ml-platform"},
        "serviceAccount": {"create": False, "name": "platform-sa"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "node-role.kubernetes.io/infra", "operator": "Exists"}]}]}}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                       "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {
                                           "app.kubernetes.io/component": "webhook"}}}],
        "podSecurityContext": {"fsGroupChangePolicy": "OnRootMismatch"}, "hostNetwork": True,
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy.corp:3128"}],
        "extraArgs": ["--log-level", "debug"],
        "webhook": {"objectSelector": {"matchLabels": {"topology.scheduler/managed": "true"}}},
        "discovery": {"enabled": True, "nodeSelector": {"pool": "gpu"}},
        "serviceMonitor": {"enabled": True, "relabelings": [{"action": "labeldrop", "regex": "pod"}]},
        "crdCheck": False,
    },
    "everything-on": {
        "discovery": {"enabled": True}, "serviceMonitor": {"enabled": True}, "crdCheck": False,
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboard": {"enabled": True},
        "webhook": {"namespaceLabels": {"topology.scheduler/enabled": "true"}},
        "config": {"levels": [{"label": "example.com/rack", "link": "leaf"}, "example.com/host-group"],
                   "max_body_bytes": 3145728, "nccl_profiles": {"leaf": {"NCCL_IB_HCA": "mlx5"}},
                   "profiles": [{"name": "h100-sxm", "match": "H100", "nvlink_gbs": 370, "pcie_gbs": 50,
                                 "nic_gbs": 48, "nics_per_node": 8, "nvlink_domain_size": 8}],
                   "scheduler_names": ["topology-aware-scheduler", "gpu-scheduler"]},
    },
}


def kube_versions(case: str) -> list[str]:
    enabled = VALUE_SETS[case].get("webhook", {}).get("matchConditions", {}).get("enabled", True)
    return WITH_MATCH_CONDITIONS if enabled else WITHOUT_MATCH_CONDITIONS


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART_DIR)


@functools.cache
def rendered(case: str) -> tuple[dict, ...]:
    """Every object the chart renders for a value set, rendered once per test session."""
    manifests = chart().render(VALUE_SETS[case], name=RELEASE, namespace=NAMESPACE)
    return tuple(obj for path, text in sorted(manifests.items()) if path.endswith(".yaml")
                 for obj in yaml.safe_load_all(text) if obj)


def objects(case: str, kind: str) -> list[dict]:
    return [obj for obj in rendered(case) if obj["kind"] == kind]


def one(case: str, kind: str, name: str | None = None) -> dict:
    found = [obj for obj in objects(case, kind) if name is None or obj["metadata"]["name"] == name]
    assert len(found) == 1, f"{case}: expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


PLACEMENT_WEBHOOK = "placement.topology.scheduler"


def webhook_entries(case: str) -> dict[str, dict]:
    return {entry["name"]: entry for entry in one(case, "MutatingWebhookConfiguration")["webhooks"]}


def webhook_entry(case: str, name: str = PLACEMENT_WEBHOOK) -> dict:
    return webhook_entries(case)[name]


def webhook_container(case: str) -> dict:
    (container,) = one(case, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def arg_after(container: dict, flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


# --- Helm's own checks ---------------------------------------------------------------------------

# One value set per template branch; the others change scalars that the schema tests already cover.
@pytest.mark.parametrize("case", ["defaults", "generated", "cert-manager", "cert-manager-own-issuer", "existing-secret", "platform-team",
                                  "no-match-conditions", "everything-on"])
def test_lint_reports_no_errors(case):
    report = helm_python.lint(CHART_DIR, VALUE_SETS[case], namespace=NAMESPACE,
                              kube_version=f"v{kube_versions(case)[0]}")
    assert report["errors"] == [], report["messages"]


@pytest.mark.parametrize("kube_version, refused", [("v1.29.0", True), ("v1.30.0", False)])
def test_match_conditions_on_a_cluster_older_than_1_30_are_refused_with_the_fix(capfd, kube_version, refused):
    # Only lint takes a Kubernetes version, and in lint mode Helm logs a template's `fail` to
    # stderr instead of raising it; `helm install` on such a cluster stops with the same message.
    helm_python.lint(CHART_DIR, {}, namespace=NAMESPACE, kube_version=kube_version)
    message = f"needs Kubernetes 1.30 or newer, this cluster is {kube_version}; set webhook.matchConditions.enabled=false"
    assert (message in capfd.readouterr().err) is refused


@pytest.mark.parametrize("values, message", [
    pytest.param({"replicas": 0}, "at '/replicas': minimum: got 0, want 1", id="zero replicas"),
    pytest.param({"webhook": {"failurePolicy": "fail"}}, "'/webhook/failurePolicy': value must be one of 'Ignore', 'Fail'",
                 id="failurePolicy spelt wrong"),
    pytest.param({"webhook": {"timeoutSeconds": 60}}, "'/webhook/timeoutSeconds': maximum: got 60, want 30",
                 id="timeout above the apiserver's limit"),
    pytest.param({"tls": {"mode": "selfSigned"}}, "'/tls/mode': value must be one of 'selfManaged', 'generated', 'certManager', 'existingSecret'",
                 id="unknown certificate mode"),
    pytest.param({"tls": {"mode": "existingSecret"}}, "'/tls/existingSecret/caBundle': minLength: got 0, want 1",
                 id="existing Secret without its CA"),
    pytest.param({"config": {"levles": "gke"}}, "'/config': additional properties 'levles' not allowed",
                 id="typo in a server setting"),
    pytest.param({"config": {"levels": "azure"}}, "value must be one of 'auto', 'default', 'gke', 'aws', 'nvl72'",
                 id="unknown levels preset"),
    pytest.param({"containerPort": 443}, "'/containerPort': minimum: got 443, want 1,024",
                 id="privileged port without capabilities"),
    pytest.param({"replica": 3}, "additional properties 'replica' not allowed", id="typo at the top level"),
])
def test_wrong_values_fail_at_install_naming_the_key_and_what_is_allowed(values, message):
    with pytest.raises(helm_python.HelmValuesError) as caught:
        chart().render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(caught.value)


def test_schema_knows_exactly_the_server_settings():
    """values.schema.json and webhook.settings cannot drift: same settings, presets and classes."""
    config_schema = chart().schema["properties"]["config"]
    # Every key a settings file may hold; levels_auto (set by `levels: auto`) and seal_key (from
    # --gate-key-secret) are Config fields that no file holds.
    assert set(config_schema["properties"]) == FILE_KEYS == set(Config.__dataclass_fields__) - {"levels_auto",
                                                                                                 "seal_key"}
    levels = config_schema["properties"]["levels"]["oneOf"]
    assert set(levels[0]["enum"]) == set(PRESETS) | {"auto"}
    assert set(levels[1]["items"]["oneOf"][1]["properties"]["link"]["enum"]) == set(LINK_CLASSES)
    assert set(config_schema["properties"]["nccl_profiles"]["propertyNames"]["enum"]) == set(DEFAULT_NCCL_PROFILES)
    assert set(config_schema["properties"]["profiles"]["items"]["properties"]) == set(HardwareProfile.__dataclass_fields__)


# --- Kubernetes schemas --------------------------------------------------------------------------

@functools.cache
def validate(obj_json: str, version: str) -> None:
    """One validation per distinct object and version: value sets share most of their objects."""
    kubernetes_validate.validate(json.loads(obj_json), version, strict=True)


@pytest.mark.parametrize("case, version", [(case, version) for case in VALUE_SETS for version in kube_versions(case)])
def test_every_object_passes_the_kubernetes_schema(case, version):
    checked = [obj for obj in rendered(case) if not obj["apiVersion"].startswith(SCHEMALESS_API_GROUPS)]
    assert checked
    for obj in checked:
        validate(json.dumps(obj, sort_keys=True), version)


def strict(schema):
    """A CRD's schema as kubectl's strict field validation applies it: no field it does not name
    (a structural schema prunes them silently instead). Go's `^(?i)...` patterns are written the
    way Python's re takes them, `(?i)^...`."""
    if isinstance(schema, list):
        return [strict(value) for value in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if "properties" in out and "additionalProperties" not in out \
            and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    if isinstance(out.get("pattern"), str) and out["pattern"].startswith("^(?i)"):
        out["pattern"] = "(?i)^" + out["pattern"].removeprefix("^(?i)")
    return out


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.protocols.Validator:
    group, _, version = api_version.partition("/")
    path = CHART_DIR.parents[1] / "tests" / "fixtures" / "crds" / f"{group}_{version}_{kind}.json.gz"
    schema = strict(json.loads(gzip.decompress(path.read_bytes())))
    return jsonschema.validators.validator_for(schema)(schema)


def assert_passes_its_crd(obj: dict) -> None:
    crd_validator(obj["apiVersion"], obj["kind"]).validate(obj)


@pytest.mark.parametrize("case", [case for case in VALUE_SETS
                                  if any(o["apiVersion"].startswith("monitoring.coreos.com/") for o in rendered(case))])
def test_every_prometheus_operator_object_passes_its_crd_schema(case):
    for obj in rendered(case):
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            assert_passes_its_crd(obj)


# --- The chart agrees with the server ------------------------------------------------------------

@pytest.mark.parametrize("case", VALUE_SETS)
def test_webhook_service_name_port_and_path_reach_the_server(case):
    service = one(case, "Service")
    port, metrics = service["spec"]["ports"]
    for entry in webhook_entries(case).values():
        client = entry["clientConfig"]["service"]
        assert (client["name"], client["namespace"]) == (service["metadata"]["name"], NAMESPACE)
        assert client["path"] == MUTATE_PATH
        assert port["port"] == client["port"] == 443
    container = webhook_container(case)
    container_port, metrics_port = container["ports"]
    assert port["targetPort"] == container_port["name"]
    assert container_port["containerPort"] == DEFAULT_PORT
    assert arg_after(container, "--bind") == f"0.0.0.0:{DEFAULT_PORT}"
    assert metrics["targetPort"] == metrics_port["name"] == "metrics"
    assert arg_after(container, "--metrics-bind") == f"0.0.0.0:{metrics_port['containerPort']}"
    assert container["args"][0] == "serve"
    # kubelet's probes carry no client certificate: with one required they ask the metrics port
    probed = ("HTTPS", "metrics") if "--client-ca" in container["args"] else ("HTTPS", "https")
    assert container["livenessProbe"]["httpGet"] == {"scheme": probed[0], "port": probed[1], "path": HEALTHZ_PATH}
    assert container["readinessProbe"]["httpGet"] == {"scheme": probed[0], "port": probed[1], "path": READYZ_PATH}


def test_client_certificates_are_required_against_the_ca_mounted_from_its_configmap():
    assert "--client-ca" not in webhook_container("defaults")["args"]  # off unless asked
    volume, mount, file_name = mounted_file("client-certificates", "--client-ca")
    assert volume["configMap"] == {"name": "apiserver-client-ca", "items": [{"key": "ca.crt", "path": file_name}]}
    assert mount["readOnly"] and "subPath" not in mount  # kubelet swaps a changed CA in; the server reloads it
    from webhook import cli
    args = cli.build_parser().parse_args(webhook_container("client-certificates")["args"])
    assert args.client_ca == f"{mount['mountPath']}/{file_name}"


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


SCRAPER = f"{FULLNAME}-metrics-scraper"


@pytest.mark.parametrize("case, ca", [
    ("everything-on", {"secret": {"name": f"{FULLNAME}-self-managed-tls", "key": "ca.crt"}}),
    ("metrics-readers", {"configMap": {"name": f"{FULLNAME}-metrics-ca", "key": "ca.crt"}}),
])
def test_service_monitor_scrapes_over_https_with_a_token_allowed_metrics_checking_our_certificate(case, ca):
    (endpoint,) = one(case, "ServiceMonitor")["spec"]["endpoints"]
    # On the metrics port, apart from the TLS port the apiserver calls (issue 14); HTTPS with a
    # token the webhook checks (issue 41), through `authorization`, not the deprecated bearerTokenFile.
    assert (endpoint["port"], endpoint["scheme"], endpoint["path"]) == ("metrics", "https", METRICS_PATH)
    assert "bearerTokenFile" not in endpoint
    assert endpoint["authorization"] == {"type": "Bearer", "credentials": {"name": f"{SCRAPER}-token", "key": "token"}}
    token = one(case, "Secret", f"{SCRAPER}-token")
    assert token["type"] == "kubernetes.io/service-account-token" and "data" not in token  # Kubernetes fills it
    assert token["metadata"]["annotations"] == {"kubernetes.io/service-account.name": SCRAPER}
    assert one(case, "ServiceAccount", SCRAPER)["automountServiceAccountToken"] is False
    binding = one(case, "ClusterRoleBinding", SCRAPER)  # get on /metrics, nothing else
    assert binding["roleRef"]["name"] == f"{FULLNAME}-metrics-reader"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": NAMESPACE}]
    assert endpoint["tlsConfig"] == {"serverName": f"{FULLNAME}.{NAMESPACE}.svc", "ca": ca}
    assert f"{FULLNAME}.{NAMESPACE}.svc" in SERVICE_DNS_NAMES  # the serving certificate names it
    if "configMap" in ca:
        config_map = one(case, "ConfigMap", f"{FULLNAME}-metrics-ca")
        assert config_map["data"]["ca.crt"] == base64.b64decode(OWN_CA_BUNDLE).decode()
    assert not objects("defaults", "ServiceMonitor")


def test_service_monitor_takes_your_tls_config_and_scrapes_plain_http_when_the_port_is_open():
    manifests = chart().render({"serviceMonitor": {"enabled": True, "tlsConfig": {"insecureSkipVerify": True}},
                                "crdCheck": False}, name=RELEASE, namespace=NAMESPACE)
    (monitor,) = [obj for path, text in manifests.items() if path.endswith("servicemonitor.yaml")
                  for obj in yaml.safe_load_all(text) if obj and obj["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["endpoints"][0]["tlsConfig"] == {"insecureSkipVerify": True}
    (endpoint,) = one("metrics-open", "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint and "bearerTokenFile" not in endpoint
    assert "--no-metrics-secure" in webhook_container("metrics-open")["args"]
    assert "--no-metrics-secure" not in webhook_container("defaults")["args"]  # a live `serve` is secure by default
    assert not [obj for obj in rendered("metrics-open") if obj["metadata"]["name"].startswith(SCRAPER)]


@pytest.mark.parametrize("values, endpoint_token, scrape_class", [
    pytest.param({"token": "bearerTokenFile"}, {"bearerTokenFile": SERVICE_ACCOUNT_TOKEN}, None,
                 id="an operator older than authorization: Prometheus' own token, deprecated field"),
    pytest.param({"token": "scrapeClass", "scrapeClass": "service-account-token"}, {}, "service-account-token",
                 id="the scrape class brings the authorization (its credentialsFile)"),
])
def test_service_monitor_other_tokens_make_no_scraper_identity(values, endpoint_token, scrape_class):
    manifests = chart().render({"serviceMonitor": {"enabled": True, **values}, "crdCheck": False},
                               name=RELEASE, namespace=NAMESPACE)
    objs = [obj for path, text in manifests.items() if path.endswith("servicemonitor.yaml")
            for obj in yaml.safe_load_all(text) if obj]
    (monitor,) = objs  # no ServiceAccount, token Secret or binding of ours
    (endpoint,) = monitor["spec"]["endpoints"]
    assert {k: v for k, v in endpoint.items() if k in ("bearerTokenFile", "authorization")} == endpoint_token
    assert monitor["spec"].get("scrapeClass") == scrape_class
    assert_passes_its_crd(monitor)


def test_the_webhook_may_ask_who_reads_its_metrics_port_and_readers_get_roles_of_their_own():
    assert rules_of("defaults", f"{FULLNAME}-metrics-auth") == [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]
    binding = one("defaults", "ClusterRoleBinding", f"{FULLNAME}-metrics-auth")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert rules_of("defaults", f"{FULLNAME}-metrics-reader") == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert rules_of("defaults", f"{FULLNAME}-topology-reader") == [
        {"nonResourceURLs": ["/topology", "/topology.json"], "verbs": ["get"]}]
    bound = {obj["metadata"]["name"] for obj in objects("defaults", "ClusterRoleBinding")}
    assert f"{FULLNAME}-metrics-reader" not in bound and f"{FULLNAME}-topology-reader" not in bound
    readers = one("metrics-readers", "ClusterRoleBinding", f"{FULLNAME}-metrics-reader")
    assert readers["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}]
    platform = one("metrics-readers", "ClusterRoleBinding", f"{FULLNAME}-topology-reader")
    assert platform["roleRef"]["name"] == f"{FULLNAME}-topology-reader"
    assert platform["subjects"] == [{"kind": "Group", "name": "platform-team", "apiGroup": "rbac.authorization.k8s.io"}]
    assert not [obj for obj in rendered("metrics-open") if "metrics-" in obj["metadata"]["name"]
                or obj["metadata"]["name"].endswith("topology-reader")]


def mounted_file(case: str, flag: str) -> tuple[dict, dict, str]:
    """The volume, its mount and the file name behind a path argument such as --config."""
    pod = one(case, "Deployment")["spec"]["template"]["spec"]
    container = webhook_container(case)
    path = arg_after(container, flag)
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume, mount, path[len(mount["mountPath"]) + 1:]


def server_config(case: str) -> Config:
    """The Config the server builds from the file the chart mounts at its --config path."""
    volume, _, file_name = mounted_file(case, "--config")
    config_map = one(case, "ConfigMap", volume["configMap"]["name"])
    return config_from_mapping(yaml.safe_load(config_map["data"][file_name]))


def test_default_values_give_the_server_defaults():
    assert server_config("defaults") == Config()


def test_config_values_reach_the_server():
    loaded = server_config("everything-on")
    assert [(level.label, level.link) for level in loaded.levels] == [("example.com/rack", "leaf"),
                                                                       ("example.com/host-group", "leaf")]
    assert loaded.max_body_bytes == 3145728 and isinstance(loaded.max_body_bytes, int)
    assert loaded.nccl_profiles["leaf"] == {"NCCL_IB_HCA": "mlx5"}
    assert loaded.scheduler_names == ("topology-aware-scheduler", "gpu-scheduler")
    assert [profile.name for profile in loaded.profiles] == ["h100-sxm", "generic-pcie"]
    assert loaded.profile_for("NVIDIA-H100-80GB-HBM3").nvlink_domain_size == 8


def test_config_change_rolls_the_pods():
    checksum = lambda case: one(case, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]  # noqa: E731
    assert checksum("defaults") == checksum("fail-closed") != checksum("everything-on")


# --- Certificates --------------------------------------------------------------------------------

@pytest.mark.parametrize("case, secret_name", [
    ("generated", f"{FULLNAME}-tls"), ("cert-manager", f"{FULLNAME}-tls"), ("existing-secret", "corp-webhook-tls")])
def test_tls_secret_is_mounted_as_a_directory_so_rotation_reaches_the_server(case, secret_name):
    """kubelet swaps a Secret volume atomically through a symlink; a subPath mount never sees the swap."""
    for flag, key in (("--cert", "tls.crt"), ("--key", "tls.key")):
        volume, mount, file_name = mounted_file(case, flag)
        assert volume["secret"]["secretName"] == secret_name
        assert {"key": key, "path": file_name} in volume["secret"]["items"]
        assert "subPath" not in mount and "subPathExpr" not in mount


def generated_material(case: str = "generated"):
    secret = one(case, "Secret", f"{FULLNAME}-tls")
    assert secret["type"] == "kubernetes.io/tls"
    decode = lambda key: base64.b64decode(secret["data"][key])  # noqa: E731
    (ca_bundle,) = {base64.b64decode(e["clientConfig"]["caBundle"]) for e in webhook_entries(case).values()}
    return ca_bundle, decode("tls.crt"), decode("tls.key"), decode("ca.crt")


def test_generated_ca_bundle_verifies_the_serving_certificate_for_every_service_name():
    ca_bundle, cert_pem, key_pem, ca_crt = generated_material()
    assert ca_crt == ca_bundle  # what Prometheus verifies with is what the apiserver trusts
    cert = x509.load_pem_x509_certificate(cert_pem)
    store = Store(x509.load_pem_x509_certificates(ca_bundle))
    now = datetime.datetime.now(datetime.timezone.utc)
    for name in SERVICE_DNS_NAMES:
        verifier = PolicyBuilder().store(store).time(now).build_server_verifier(DNSName(name))
        verifier.verify(cert, [])  # raises VerificationError when the chain or the SAN does not hold
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(sans.get_values_for_type(x509.DNSName)) == sorted(SERVICE_DNS_NAMES)
    key = serialization.load_pem_private_key(key_pem, password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()


def test_generated_ca_is_kept_in_its_own_secret_and_not_mounted():
    ca_secret = one("generated", "Secret", f"{FULLNAME}-ca")
    ca_bundle, *_ = generated_material()
    assert base64.b64decode(ca_secret["data"]["tls.crt"]) == ca_bundle
    volumes = one("generated", "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert all(v.get("secret", {}).get("secretName") != f"{FULLNAME}-ca" for v in volumes)


def render_text(values: dict) -> dict[str, str]:
    """A fresh render (never the cached one): file name -> text, as `helm template` prints it."""
    return helm_python.Chart.load(CHART_DIR).render(values, name=RELEASE, namespace=NAMESPACE)


def test_two_renders_of_the_default_values_are_byte_identical():
    """GitOps tools (Argo CD, Flux) render on every sync: any difference is drift they never settle."""
    assert render_text({}) == render_text({})
    generated = {"tls": {"mode": "generated"}}  # what the default was: a new CA on every render
    assert render_text(generated) != render_text(generated)


SELF_MANAGED_SECRET = f"{FULLNAME}-self-managed-tls"


def self_managed_target(case: str = "defaults"):
    """What the server makes of the Deployment's arguments (webhook.cli, as `serve` parses them)."""
    from webhook import cli
    args = cli.build_parser().parse_args(webhook_container(case)["args"])
    return cli.self_managed_tls(args)


def test_self_managed_mode_renders_no_key_material_and_points_the_server_at_its_objects():
    assert not objects("defaults", "Secret") and not objects("defaults", "Certificate")
    assert all("caBundle" not in entry["clientConfig"] for entry in webhook_entries("defaults").values())
    target = self_managed_target()
    assert (target.namespace, target.secret) == (NAMESPACE, SELF_MANAGED_SECRET)
    assert target.service == one("defaults", "Service")["metadata"]["name"]
    assert target.webhook_configuration == one("defaults", "MutatingWebhookConfiguration")["metadata"]["name"]
    assert sorted(target.dns_names) == sorted([*SERVICE_DNS_NAMES, "localhost"])
    # The server writes the pair it took from the Secret into a memory-backed directory of its own.
    for flag in ("--cert", "--key"):
        volume, mount, _ = mounted_file("defaults", flag)
        assert volume["emptyDir"]["medium"] == "Memory" and mount["readOnly"] is False
    assert self_managed_target("generated") is None


def test_self_managed_rbac_names_exactly_the_secret_and_the_webhook_configuration():
    role = one("defaults", "Role", SELF_MANAGED_SECRET)
    assert role["metadata"]["namespace"] == NAMESPACE
    # create cannot be narrowed by resourceNames: Kubernetes authorizes a create before the name exists.
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SELF_MANAGED_SECRET], "verbs": ["get", "update"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]
    assert rules_of("defaults", f"{FULLNAME}-ca-bundle") == [
        {"apiGroups": ["admissionregistration.k8s.io"], "resources": ["mutatingwebhookconfigurations"],
         "resourceNames": [one("defaults", "MutatingWebhookConfiguration")["metadata"]["name"]],
         "verbs": ["get", "patch"]}]
    for kind, name in (("RoleBinding", SELF_MANAGED_SECRET), ("ClusterRoleBinding", f"{FULLNAME}-ca-bundle")):
        binding = one("defaults", kind, name)
        assert binding["roleRef"]["name"] == name
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    for case in ("generated", "cert-manager", "existing-secret"):  # only the webhook's own certificates need it
        assert not [obj for obj in rendered(case) if obj["metadata"]["name"] in (SELF_MANAGED_SECRET, f"{FULLNAME}-ca-bundle")]


def test_cert_manager_renews_the_serving_certificate_under_a_stable_ca():
    configuration = one("cert-manager", "MutatingWebhookConfiguration")
    assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NAMESPACE}/{FULLNAME}-serving"
    assert all("caBundle" not in e["clientConfig"] for e in webhook_entries("cert-manager").values())
    serving = one("cert-manager", "Certificate", f"{FULLNAME}-serving")["spec"]
    assert sorted(serving["dnsNames"]) == sorted(SERVICE_DNS_NAMES)
    assert serving["secretName"] == f"{FULLNAME}-tls"
    # The serving certificate comes from a CA Issuer, never straight from the self-signed one: a
    # renewal then keeps ca.crt, so the injected caBundle stays valid while kubelet swaps the files.
    ca_issuer = one("cert-manager", "Issuer", serving["issuerRef"]["name"])
    ca_certificate = one("cert-manager", "Certificate", f"{FULLNAME}-ca")["spec"]
    assert ca_issuer["spec"] == {"ca": {"secretName": ca_certificate["secretName"]}}
    assert ca_certificate["isCA"] is True and ca_certificate["duration"] == "87600h"  # tls.caValidityDays
    assert ca_certificate["privateKey"]["rotationPolicy"] == "Never"  # a renewed CA still verifies older certificates
    assert "selfSigned" in one("cert-manager", "Issuer", ca_certificate["issuerRef"]["name"])["spec"]
    assert not [s for s in objects("cert-manager", "Secret")]


def test_cert_manager_with_an_issuer_of_your_own_creates_no_issuer():
    serving = one("cert-manager-own-issuer", "Certificate")["spec"]
    assert serving["issuerRef"] == VALUE_SETS["cert-manager-own-issuer"]["tls"]["certManager"]["issuerRef"]
    assert not objects("cert-manager-own-issuer", "Issuer")


def test_existing_secret_mode_passes_the_ca_bundle_through_and_creates_no_secret():
    assert {e["clientConfig"]["caBundle"] for e in webhook_entries("existing-secret").values()} == {OWN_CA_BUNDLE}
    assert not objects("existing-secret", "Secret")
    assert not objects("existing-secret", "Certificate")


# --- Webhook registration ------------------------------------------------------------------------

@pytest.mark.parametrize("case, failure_policy", [("defaults", "Ignore"), ("fail-closed", "Fail")])
def test_webhook_registration(case, failure_policy):
    entry = webhook_entry(case)
    assert entry["admissionReviewVersions"] == ["v1"]
    assert entry["sideEffects"] == "NoneOnDryRun"
    assert entry["failurePolicy"] == failure_policy
    assert entry["timeoutSeconds"] == 5
    assert entry["reinvocationPolicy"] == "IfNeeded"
    registered = {(group, resource) for rule in entry["rules"] for group in rule["apiGroups"]
                  for resource in rule["resources"]}
    assert registered == {("", "pods"), ("batch", "jobs"), ("batch", "cronjobs"), ("apps", "deployments"),
                          ("apps", "statefulsets"), ("apps", "replicasets")}
    assert all(rule["scope"] == "Namespaced" for rule in entry["rules"])
    # UPDATE only where a queue un-suspends (Jobs); other updates keep the placement made at creation
    assert {resource for rule in entry["rules"] if rule["operations"] != ["CREATE"]
            for resource in rule["resources"]} == {"jobs"}


@pytest.mark.parametrize("case", VALUE_SETS)
def test_webhook_never_gates_its_own_namespace_or_the_control_plane(case):
    for entry in webhook_entries(case).values():
        (expression,) = entry["namespaceSelector"]["matchExpressions"]
        assert expression["key"] == "kubernetes.io/metadata.name" and expression["operator"] == "NotIn"
        assert {"kube-system", "kube-node-lease", NAMESPACE} <= set(expression["values"])


def test_namespace_opt_in_labels_narrow_the_selector():
    for entry in webhook_entries("everything-on").values():
        assert entry["namespaceSelector"]["matchLabels"] == {"topology.scheduler/enabled": "true"}
    assert "matchLabels" not in webhook_entry("defaults")["namespaceSelector"]


def evaluate_match_condition(expression: str, obj: dict | None = None, old: dict | None = None) -> bool:
    """The chart's CEL evaluated by a CEL implementation (cel-python), with the variables the
    apiserver binds: `object` (null on DELETE) and `oldObject` (null on CREATE). An evaluation
    error raises: the apiserver would then skip the webhook, or reject the request under
    failurePolicy Fail, so a condition must answer false for objects that lack its fields."""
    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    result = program.evaluate({"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old)})
    assert isinstance(result, celpy.celtypes.BoolType), result
    return bool(result)


def pod_template(annotations: dict | None = None, scheduler: str | None = None) -> dict:
    template: dict = {"metadata": {}, "spec": {"containers": [{"name": "main", "image": "trainer"}]}}
    if annotations is not None:
        template["metadata"]["annotations"] = annotations
    if scheduler is not None:
        template["spec"]["schedulerName"] = scheduler
    return template


def workload(kind: str, template: dict) -> dict:
    if kind == "Pod":
        return {"apiVersion": "v1", "kind": "Pod", **template}
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": kind, "metadata": {"name": "nightly"},
                "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}}}
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": "train"}, "spec": {"template": template}}


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "Job", "CronJob"])
@pytest.mark.parametrize("template, called", [
    pytest.param(pod_template({"topology.scheduler/gpu-count": "8"}), True, id="topology annotation"),
    pytest.param(pod_template(scheduler="topology-aware-scheduler"), True, id="the seed's schedulerName"),
    pytest.param(pod_template({"kueue.x-k8s.io/podset-required-topology": "topology.scheduler/leaf"}), True,
                 id="Kueue's topology annotation"),
    pytest.param(pod_template({"kai.scheduler/topology-preferred-placement": "topology.scheduler/leaf"}), True,
                 id="KAI's topology annotation"),
    pytest.param(pod_template({"kueue.x-k8s.io/queue-name": "team-a"}), False, id="queued, no topology"),
    pytest.param(pod_template(), False, id="no annotations at all"),
    pytest.param(pod_template({"prometheus.io/scrape": "true"}), False, id="other annotations"),
    pytest.param(pod_template({"topology.scheduler.example.com/x": "1"}), False, id="look-alike prefix"),
    pytest.param(pod_template(scheduler="volcano"), False, id="another scheduler"),
])
def test_match_condition_calls_the_webhook_only_for_topology_workloads(kind, template, called):
    (condition,) = webhook_entry("defaults")["matchConditions"]
    assert evaluate_match_condition(condition["expression"], workload(kind, template)) is called


def test_match_condition_uses_the_configured_scheduler_names():
    (condition,) = webhook_entry("everything-on")["matchConditions"]
    assert evaluate_match_condition(condition["expression"], workload("Pod", pod_template(scheduler="gpu-scheduler")))


def rules(case: str) -> dict[tuple[str, str], list[str]]:
    """(API group, resource) -> operations, of the placement webhook."""
    return {(group, resource): rule["operations"] for rule in webhook_entry(case)["rules"]
            for group in rule["apiGroups"] for resource in rule["resources"]}


def test_operators_are_registered_when_listed_and_jobs_also_on_update_for_queues():
    listed = rules("operators")
    for group, resource in [("jobset.x-k8s.io", "jobsets"), ("kubeflow.org", "pytorchjobs"), ("kubeflow.org", "mpijobs"),
                            ("ray.io", "rayclusters"), ("ray.io", "rayjobs")]:
        assert listed[(group, resource)] == ["CREATE", "UPDATE"]
        assert (group, resource) not in rules("defaults")  # auto: only APIs the cluster serves
    assert rules("defaults")[("batch", "jobs")] == ["CREATE", "UPDATE"]  # un-suspended by a queue
    assert rules("defaults")[("batch", "cronjobs")] == ["CREATE"]


def test_match_conditions_can_be_switched_off():
    assert all("matchConditions" not in e for e in webhook_entries("no-match-conditions").values())


@pytest.mark.parametrize("case", ["defaults", "everything-on", "no-match-conditions"])
def test_no_entry_sees_deletions_and_the_role_watches_every_kind_whose_holds_the_watch_confirms(case):
    """A DELETE review would free nothing (state/holds.py): deletions come from the watch, so the
    role lists and watches every kind an admission holds GPUs for (objects/feed.py STORED_KINDS)."""
    assert set(webhook_entries(case)) == {PLACEMENT_WEBHOOK}
    assert not any("DELETE" in rule["operations"] for rule in webhook_entry(case)["rules"])
    watched = {(group, resource) for rule in rules_of(case, FULLNAME) if {"list", "watch"} <= set(rule["verbs"])
               for group in rule["apiGroups"] for resource in rule["resources"]}
    wanted = {(kind.group, kind.resource[1]) for kind in STORED_KINDS.values()}
    assert wanted <= watched


# --- A safe deployment ---------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["defaults", "everything-on"])
def test_every_pod_meets_the_restricted_pod_security_standard(case):
    pods = [obj["spec"]["template"]["spec"] for obj in rendered(case) if obj["kind"] in ("Deployment", "DaemonSet")]
    pods += [obj["spec"] for obj in rendered(case) if obj["kind"] == "Pod"]  # `helm test`
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert all(set(volume) & {"configMap", "secret", "emptyDir"} for volume in pod.get("volumes", []))
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert "resources" in container and container["resources"]["requests"]


def test_network_policy_admits_only_the_webhook_and_metrics_ports():
    policy = one("defaults", "NetworkPolicy")
    assert policy["spec"]["podSelector"] == one("defaults", "Deployment")["spec"]["selector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    webhook, metrics = policy["spec"]["ingress"]
    # The apiserver's calls, through the konnectivity agents of GKE (k8s-app) and AKS (app); no other pod.
    system = {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
    assert webhook == {"ports": [{"port": "https", "protocol": "TCP"}], "from": [
        {"namespaceSelector": system, "podSelector": {"matchLabels": {"k8s-app": "konnectivity-agent"}}},
        {"namespaceSelector": system, "podSelector": {"matchLabels": {"app": "konnectivity-agent"}}}]}
    # The metrics port: the release's own namespace and namespaces labelled for monitoring, not every one.
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}},
        {"namespaceSelector": {"matchLabels": {"topology.scheduler/monitoring": "true"}}}]}
    closed = chart().render({"networkPolicy": {"metricsFrom": []}}, name=RELEASE, namespace=NAMESPACE)
    (closed_policy,) = [obj for path, text in closed.items() if path.endswith("networkpolicy.yaml")
                        for obj in yaml.safe_load_all(text) if obj]
    assert closed_policy["spec"]["ingress"] == [webhook]  # empty: no source, never every source
    for webhook_from, sources in (([{"ipBlock": {"cidr": "10.0.0.0/28"}}], [{"ipBlock": {"cidr": "10.0.0.0/28"}}]),
                                  ([], None)):  # a control plane's own range (EKS); or any source
        (opened,) = [obj for path, text in chart().render({"networkPolicy": {"webhookFrom": webhook_from}},
                                                          name=RELEASE, namespace=NAMESPACE).items()
                     if path.endswith("networkpolicy.yaml") for obj in yaml.safe_load_all(text) if obj]
        assert opened["spec"]["ingress"][0].get("from") == sources
    assert "kind: NetworkPolicy" not in "".join(
        chart().render({"networkPolicy": {"enabled": False}}, name=RELEASE, namespace=NAMESPACE).values())


def test_helm_test_asks_a_webhook_pod_whether_it_is_ready_through_the_service():
    pod = one("defaults", "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    (container,) = pod["spec"]["containers"]
    assert container["image"] == webhook_container("defaults")["image"]
    service = one("defaults", "Service")["metadata"]["name"]
    assert f"https://{service}.{NAMESPACE}.svc:9090{READYZ_PATH}" in container["command"][-1]
    (open_pod,) = [obj for obj in rendered("metrics-open") if obj["kind"] == "Pod"]
    assert f"http://{service}.{NAMESPACE}.svc:9090{READYZ_PATH}" in open_pod["spec"]["containers"][0]["command"][-1]


def test_an_image_digest_pins_the_image_by_digest():
    digest = "sha256:" + "ab" * 32
    manifests = chart().render({"image": {"repository": "registry.example/topology-webhook", "digest": digest}},
                               name=RELEASE, namespace=NAMESPACE)
    assert f"image: registry.example/topology-webhook@{digest}" in "".join(manifests.values())


@pytest.mark.parametrize("case, replicas", [("defaults", 2), ("one-replica", 1), ("three-replicas-hard-anti-affinity", 3)])
def test_replicas_spread_across_nodes_behind_a_disruption_budget(case, replicas):
    deployment = one(case, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    anti_affinity = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    if case.endswith("hard-anti-affinity"):
        (term,) = anti_affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    else:
        (preferred,) = anti_affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        term = preferred["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    budget = one(case, "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1  # one replica can still be drained: a budget never blocks a node drain forever
    assert budget["selector"]["matchLabels"].items() <= pod_labels.items()


def test_discovery_pods_are_not_selected_by_the_webhook_deployment():
    selector = one("everything-on", "Deployment")["spec"]["selector"]["matchLabels"]
    discovery_labels = one("everything-on", "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= discovery_labels.items()
    assert one("everything-on", "Service")["spec"]["selector"] == selector


def rules_of(case: str, role_name: str) -> list[dict]:
    return one(case, "ClusterRole", role_name)["rules"]


def test_webhook_reads_nodes_pods_workloads_gpu_devices_claims_pod_groups_and_compute_domains_and_patches_only_pods():
    read, watch = ["get", "list", "watch"], ["list", "watch"]
    assert rules_of("defaults", FULLNAME) == [
        {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": read},
        # the metadata of every workload kind an admission holds GPUs for (files/kinds.yaml)
        *({"apiGroups": [kind.group], "resources": [kind.resource[1]], "verbs": watch}
          for kind in STORED_KINDS.values()),
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},  # gate_waits (on by default): the releaser
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get"]},  # ... asks a gated Job's owner
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},  # ... names a pod it refuses
        {"apiGroups": ["resource.k8s.io"],
         "resources": ["resourceslices", "resourceclaims", "resourceclaimtemplates", "deviceclasses"], "verbs": read},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["podgroups"], "verbs": read},
        {"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"], "verbs": read}]
    binding = one("defaults", "ClusterRoleBinding", FULLNAME)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    assert one("defaults", "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == FULLNAME


def test_pods_may_be_patched_only_when_waits_are_gated():
    manifests = chart().render({"config": {"scheduler_names": ["topology-aware-scheduler"], "gate_waits": False}},
                               name=RELEASE, namespace=NAMESPACE)
    (role,) = [obj for path, text in manifests.items() if path.endswith(".yaml") for obj in yaml.safe_load_all(text)
               if obj and obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == FULLNAME]
    assert not any("patch" in rule["verbs"] for rule in role["rules"])
    assert role["rules"][0] == {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}
    assert "gate_waits: false" in next(text for path, text in manifests.items() if path.endswith("configmap.yaml"))


def test_webhook_writes_only_leases_in_the_release_namespace():
    role = one("defaults", "Role", f"{FULLNAME}-claims")
    assert role["metadata"]["namespace"] == NAMESPACE
    # delete: a replica's record of its decisions is owned by its Pod, which OwnerReferencesPermissionEnforcement
    # lets only those who may delete the record set.
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "list", "watch", "create", "update", "delete"]}]
    binding = one("defaults", "RoleBinding", f"{FULLNAME}-claims")
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["metadata"]["namespace"] == NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]


def test_each_replica_knows_its_pod_for_the_topology_page_and_its_decisions_lease():
    assert webhook_container("defaults")["env"] == POD_ENV


def test_webhook_may_read_the_autoscalers_pools_and_nothing_else_of_theirs():
    assert rules_of("defaults", f"{FULLNAME}-autoscalers") == [
        {"apiGroups": ["karpenter.sh"], "resources": ["nodepools"], "verbs": ["get", "list", "watch"]}]
    role = one("defaults", "Role", f"{FULLNAME}-autoscaler-status")
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["cluster-autoscaler-status"], "verbs": ["get", "list", "watch"]}]
    binding = one("defaults", "RoleBinding", f"{FULLNAME}-autoscaler-status")
    assert binding["metadata"]["namespace"] == "kube-system" and binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    manifests = chart().render({"autoscalers": {"read": False}}, name=RELEASE, namespace=NAMESPACE)
    assert "autoscaler" not in "".join(manifests.values())


def test_provisioning_requests_may_be_created_and_deleted_only_when_a_class_is_set():
    assert not [r for r in objects("defaults", "ClusterRole") if r["metadata"]["name"].endswith("-provisioning")]
    manifests = chart().render({"config": {"scheduler_names": ["topology-aware-scheduler"],
                                           "provisioning_request_class": "check-capacity.autoscaling.x-k8s.io"}},
                               name=RELEASE, namespace=NAMESPACE)
    roles = [obj for path, text in manifests.items() if path.endswith(".yaml") for obj in yaml.safe_load_all(text)
             if obj and obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == f"{FULLNAME}-provisioning"]
    assert [role["rules"] for role in roles] == [[
        {"apiGroups": ["autoscaling.x-k8s.io"], "resources": ["provisioningrequests"], "verbs": ["get", "create", "delete"]},
        {"apiGroups": [""], "resources": ["podtemplates"], "verbs": ["get", "create", "delete"]}]]


def test_discovery_agent_runs_on_gpu_nodes_only_with_node_patch_rights_only():
    assert not objects("defaults", "DaemonSet")
    name = f"{FULLNAME}-discovery"
    assert rules_of("everything-on", name) == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    pod = one("everything-on", "DaemonSet", name)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == name and pod["runtimeClassName"] == "nvidia"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [  # separate terms are ORed
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]},
        {"matchExpressions": [{"key": "feature.node.kubernetes.io/pci-10de.present", "operator": "In", "values": ["true"]}]},
    ]
    (container,) = pod["containers"]
    assert container["args"] == ["discover", "--node", "$(NODE_NAME)", "--interval", "300"]
    (node_name,) = [env for env in container["env"] if env["name"] == "NODE_NAME"]
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert not any("nvidia.com/gpu" in section for section in container["resources"].values())


# --- custom resources and observability -------------------------------------------------------------

@pytest.mark.parametrize("values, crd", [
    ({"tls": {"mode": "certManager"}}, "cert-manager.io/v1/Certificate"),
    ({"serviceMonitor": {"enabled": True}}, "monitoring.coreos.com/v1/ServiceMonitor"),
    ({"prometheusRule": {"enabled": True}}, "monitoring.coreos.com/v1/PrometheusRule"),
])
def test_a_custom_resource_without_its_crd_stops_the_install_naming_the_crd(values, crd):
    with pytest.raises(helm_python.HelmError) as err:
        chart().render(values, name=RELEASE, namespace=NAMESPACE)
    assert f"needs the CRD {crd}, which this cluster does not have" in str(err.value)


def test_the_prometheus_rule_carries_the_alert_file_checked_by_promtool_for_this_release():
    rule = one("everything-on", "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # The file is written for release topology-webhook in topology-system; this one is tw in gpu-infra.
    text = (CHART_DIR / "files" / "alerts.yaml").read_text()
    for default, ours in (('namespace="topology-system"', f'namespace="{NAMESPACE}"'),
                          ('job="topology-webhook"', f'job="{FULLNAME}"'),
                          ('deployment="topology-webhook"', f'deployment="{FULLNAME}"')):
        assert default in text
        text = text.replace(default, ours)
    assert rule["spec"] == yaml.safe_load(text)
    assert one("everything-on", "Service")["metadata"]["name"] == FULLNAME  # the ServiceMonitor's job
    assert one("everything-on", "Deployment")["metadata"]["name"] == FULLNAME
    assert not objects("defaults", "PrometheusRule")


def test_chart_metadata_names_home_sources_maintainers_and_an_icon_in_the_repository():
    metadata = chart().metadata  # what Artifact Hub shows
    assert metadata["sources"] == [metadata["home"]] and metadata["maintainers"]
    raw = metadata["home"].replace("https://github.com/", "https://raw.githubusercontent.com/") + "/main/"
    assert metadata["icon"].startswith(raw) and (CHART_DIR.parents[1] / metadata["icon"].removeprefix(raw)).is_file()
    assert {"gpu", "nvlink", "topology"} <= set(metadata["keywords"])


def test_the_dashboard_is_a_configmap_for_the_grafana_sidecar_over_metrics_we_export():
    import re
    from webhook.serving import metrics
    (configmap,) = [c for c in objects("everything-on", "ConfigMap") if c["metadata"]["name"].endswith("-dashboard")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["topology-webhook.json"])
    ours = {value for name, value in vars(metrics).items() if name.isupper() and isinstance(value, str)
            and value.startswith("topology_")}
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"topology_[a-z_]+", target["expr"])}
    assert used and {name.removesuffix("_bucket") for name in used} <= ours


def test_the_keys_platform_teams_expect_reach_the_objects():
    case = "platform-team"
    deployment = one(case, "Deployment")
    assert deployment["metadata"]["name"] == "gpu-placement"
    assert all(obj["metadata"]["labels"]["team"] == "ml-platform" for obj in rendered(case) if obj["kind"] != "Pod")
    assert deployment["metadata"]["labels"]["app.kubernetes.io/name"] == "gpu-placer"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "platform-sa"
    assert not [obj for obj in objects(case, "ServiceAccount") if obj["metadata"]["name"] == "platform-sa"]  # yours
    bindings = [subject["name"] for obj in rendered(case) if obj["kind"] in ("ClusterRoleBinding", "RoleBinding")
                and not obj["metadata"]["name"].endswith(("-discovery", "-metrics-scraper"))  # their own accounts
                for subject in obj["subjects"]]
    assert bindings and set(bindings) == {"platform-sa"}
    assert pod["affinity"] == VALUE_SETS[case]["affinity"]  # replaces the built-in anti-affinity
    assert pod["topologySpreadConstraints"] == VALUE_SETS[case]["topologySpreadConstraints"]
    assert pod["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch" and pod["securityContext"]["runAsNonRoot"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    container = webhook_container(case)
    assert container["env"] == POD_ENV + VALUE_SETS[case]["extraEnv"] and container["args"][-2:] == ["--log-level", "debug"]
    assert all(entry["objectSelector"] == {"matchLabels": {"topology.scheduler/managed": "true"}}
               for entry in webhook_entries(case).values())
    (daemonset,) = objects(case, "DaemonSet")
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    (endpoint,) = one(case, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["relabelings"] == [{"action": "labeldrop", "regex": "pod"}]



def chart_readme():
    """.ci/chart_readme.py, the writer of the chart README's values table."""
    return ci_script("chart_readme")


def test_the_chart_readme_lists_every_value_as_values_yaml_says():
    generator = chart_readme()
    assert (CHART_DIR / "README.md").read_text() == generator.render(), "run: python .ci/chart_readme.py"
    listed = {line.split("`")[1] for line in generator.render().splitlines() if line.startswith("| `")}
    assert set(yaml.safe_load((CHART_DIR / "values.yaml").read_text())) <= listed


def test_each_value_is_described_by_its_own_comment():
    text = (CHART_DIR / "values.yaml").read_text()
    described = {key: description for key, _, description in chart_readme().rows(text, yaml.safe_load(text))}
    # replicas' comment is its own, not podAntiAffinity's; fullnameOverride has one of its own
    assert "per process" in described["replicas"] and "per process" not in described["podAntiAffinity"]
    assert described["podAntiAffinity"].startswith("How replicas keep off each other's nodes.")
    assert described["fullnameOverride"].startswith("Replaces the whole release-scoped name")
    assert "fullnameOverride" not in described["nameOverride"]


@pytest.mark.parametrize("text, undescribed", [
    pytest.param("# Names.\nnameOverride: ''\nfullnameOverride: ''\n", "fullnameOverride", id="one comment, two keys"),
    pytest.param("# A note on what follows.\n\nreplicas: 2\n", "replicas", id="a comment ended by a blank line"),
    pytest.param("# The image.\nimage:\n  tag: ''  # the tag\n  # more about the tag\nreplicas: 2\n", "replicas",
                 id="a comment of the block above"),
])
def test_a_value_without_a_comment_of_its_own_stops_the_readme(text, undescribed):
    with pytest.raises(SystemExit, match=f"say what {undescribed} is for"):
        chart_readme().rows(text, yaml.safe_load(text))


def test_the_nccl_profiles_example_in_values_keeps_the_built_in_variables_of_its_class():
    # A class given in nccl_profiles replaces that class's whole built-in set: an example that only
    # added NCCL_IB_HCA would silently drop NCCL_NET_GDR_LEVEL and NCCL_CROSS_NIC.
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("# nccl_profiles:"))
    example = next(line.split("#", 1)[1].strip() for line in lines[start:] if "{NCCL_" in line)
    link, _, variables = example.partition(":")
    config = config_from_mapping({"nccl_profiles": {link: yaml.safe_load(variables)}})
    assert DEFAULT_NCCL_PROFILES[link].items() < config.nccl_profiles[link].items()


# --- gated waits: the key's RBAC, the policy bounding the releaser, the uninstall hook (issue 37) ------

@pytest.mark.parametrize("kube_version, refused", [("v1.29.0", True), ("v1.30.0", False)])
def test_gated_waits_on_a_cluster_older_than_1_30_are_refused_with_the_fix(capfd, kube_version, refused):
    helm_python.lint(CHART_DIR, {"webhook": {"matchConditions": {"enabled": False}}}, namespace=NAMESPACE,
                     kube_version=kube_version)
    message = f"config.gate_waits=true needs Kubernetes 1.30 or newer, this cluster is {kube_version}; " \
              "set config.gate_waits=false"
    assert (message in capfd.readouterr().err) is refused


def test_the_releasers_policy_and_the_uninstall_hook_are_rendered_by_default_and_only_with_gate_waits():
    policy = one("defaults", "ValidatingAdmissionPolicy")
    account = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"
    assert policy["spec"]["matchConditions"][0]["expression"] == f"request.userInfo.username == '{account}'"
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}]
    binding = one("defaults", "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    hook = one("defaults", "Job")
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    pod = hook["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["ungate", "--all"] and pod["serviceAccountName"] == FULLNAME
    assert arg_after(webhook_container("defaults"), "--gate-key-secret") == f"{NAMESPACE}/{FULLNAME}-gate-key"
    key_role = one("defaults", "Role", f"{FULLNAME}-gate-key")
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [f"{FULLNAME}-gate-key"],
            "verbs": ["get"]} in key_role["rules"]
    assert not objects("defaults", "Secret")  # the webhook makes the key: every render stays identical
    for kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Job"):
        assert not objects("no-match-conditions", kind)
    assert "--gate-key-secret" not in webhook_container("no-match-conditions")["args"]


def test_the_charts_kinds_are_the_webhooks_own_table():
    """files/kinds.yaml, which the webhook rules and RBAC range over, is what .ci/chart_kinds.py
    writes from webhook/objects/kinds.py: a kind added there reaches the chart by running it."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("chart_kinds", CHART_DIR.parents[1] / ".ci" / "chart_kinds.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert (CHART_DIR / "files" / "kinds.yaml").read_text() == generator.render()
    assert (CHART_DIR / "values.schema.json").read_text() == generator.schema()
    groups = sorted({kind.group for kind in REGISTRY} - {"", "batch", "apps"})
    rendered_now = chart().render({"webhook": {"operators": groups}}, name=RELEASE, namespace=NAMESPACE)
    (configuration,) = [obj for path, text in rendered_now.items() if path.endswith(".yaml")
                        for obj in yaml.safe_load_all(text) if obj and obj["kind"] == "MutatingWebhookConfiguration"]
    registered = {(group, resource, tuple(rule["operations"])) for rule in configuration["webhooks"][0]["rules"]
                  for group in rule["apiGroups"] for resource in rule["resources"]}
    assert {(kind.group, kind.resource[1], kind.registered) for kind in REGISTRY} <= registered
