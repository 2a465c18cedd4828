"""The metrics port as a reader meets it: HTTPS with the serving certificate and every reader
checked by the cluster (a TokenReview and SubjectAccessReviews through the real `kubernetes`
client, answered by tests/integration/fakeapiserver.py), or plain and open without a cluster; the
same security headers on every answer, whatever the path or status."""
from __future__ import annotations

import json
import socket

import pytest
import requests
from kubernetes.client import ApiClient, Configuration

from webhook.objects.feed import index_of
from webhook.settings.config import Config
from webhook.kube import demo
from webhook.kube.access import cluster_access
from webhook import admission
from webhook.admission.recent import RecentDecisions
from webhook.credentials import certs
from webhook.serving.app import create_app
from webhook.credentials.certs import ReloadingContext
from webhook.serving.metrics import Metrics
from webhook.serving.metrics_port import SECURITY_HEADERS, start_metrics_server
from webhook.serving.page.render import CONTENT_SECURITY_POLICY, page_app

from tests.fixtures.builders import gpu_pod
from tests.integration.fakeapiserver import FakeApiServer

OWN, OTHER = "alpha-train", "bravo-secret"  # workloads of team-a and team-b
TENANT, PLATFORM, PROMETHEUS = "tenant-token", "platform-token", "prometheus-token"
PROMETHEUS_SA = "system:serviceaccount:monitoring:prometheus-k8s"
PAGES = ("/topology", "/topology.json")


@pytest.fixture(scope="module")
def cluster():
    """The fake API's readers: a tenant of team-a, a platform engineer, Prometheus' ServiceAccount."""
    fake = FakeApiServer().start()
    fake.tokens.update({
        TENANT: {"username": "alice", "uid": "u-alice", "groups": ["team-a-devs", "system:authenticated"]},
        PLATFORM: {"username": "bob", "groups": ["platform", "system:authenticated"]},
        PROMETHEUS: {"username": PROMETHEUS_SA, "groups": ["system:serviceaccounts", "system:authenticated"]}})
    fake.grants.update({("team-a-devs", "list", "pods/team-a"),
                        ("platform", "get", "/metrics"), ("platform", "get", "/topology"),
                        ("platform", "get", "/topology.json"), ("platform", "list", "pods/*"),
                        (PROMETHEUS_SA, "get", "/metrics")})
    yield fake
    fake.stop()


def metrics_port(tmp_path_factory, api: FakeApiServer | None) -> tuple[str, certs.CertPaths, Metrics]:
    """A metrics port on 127.0.0.1 over the demo cluster with one workload placed in each of two
    namespaces: HTTPS and checked by `api`, or plain and open (None)."""
    paths = certs.write_certs(str(tmp_path_factory.mktemp("metrics-tls")), "topology-webhook", "default")
    index = index_of(Config(), *demo.demo_cluster())
    decisions = RecentDecisions()
    for name, namespace in ((OWN, "team-a"), (OTHER, "team-b")):
        result = admission.review(admission.make_review(gpu_pod(name, 2, namespace=namespace,
                                                               placement_strategy="consolidated")), index, Config())
        decisions.record(result, 0.0)
    metrics = Metrics.create()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    app = create_app(Config(), index, lambda: (True, ""), metrics)
    access = None if api is None else cluster_access(ApiClient(Configuration(host=api.url)), metrics.access_failed)
    start_metrics_server(listener, metrics.registry, app, page_app(index, decisions),
                         tls=None if api is None else ReloadingContext(paths.cert, paths.key).current, access=access)
    return (f"https://localhost:{port}" if api else f"http://127.0.0.1:{port}"), paths, metrics


@pytest.fixture(scope="module")
def secure(tmp_path_factory, cluster):
    return metrics_port(tmp_path_factory, cluster)


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return metrics_port(tmp_path_factory, None)


def get(port, path: str, token: str | None = None, **kwargs) -> requests.Response:
    base, paths, _ = port
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(f"{base}{path}", headers=headers, verify=paths.ca, timeout=10, **kwargs)


def assert_secured(response: requests.Response) -> None:
    for name, value in SECURITY_HEADERS:
        assert response.headers[name] == value, (response.url, response.status_code, name)


# ----- who reads what --------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/metrics", *PAGES, "/elsewhere"])
@pytest.mark.parametrize("token", [None, "not-a-token-the-cluster-knows"])
def test_a_reader_without_a_token_the_cluster_accepts_gets_401_on_every_path(secure, path, token):
    response = get(secure, path, token)
    assert response.status_code == 401 and response.headers["WWW-Authenticate"].startswith("Bearer")
    assert OWN not in response.text and OTHER not in response.text
    assert_secured(response)


def test_probes_need_no_token(secure):
    for path in ("/healthz", "/readyz"):
        response = get(secure, path)
        assert response.status_code == 200 and response.text == "ok\n"
        assert_secured(response)


def test_prometheus_scrapes_with_its_service_accounts_token(secure):
    response = get(secure, "/metrics", PROMETHEUS)
    assert response.status_code == 200 and "topology_cluster_gpus" in response.text
    assert_secured(response)


def test_a_tenant_may_not_scrape_and_sees_only_its_own_namespaces_workloads(secure):
    refused = get(secure, "/metrics", TENANT)
    assert refused.status_code == 403 and "alice" in refused.text and "/metrics" in refused.text
    assert_secured(refused)
    page = get(secure, "/topology", TENANT)
    assert page.status_code == 200 and f"team-a/{OWN}" in page.text and OTHER not in page.text
    assert "team-b" not in page.text and "where you may list pods only (team-a)" in page.text
    assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    data = get(secure, "/topology.json", TENANT).json()
    assert [w["name"] for w in data["workloads"]] == [OWN] and [h["name"] for h in data["holds"]] == [OWN]
    assert data["namespaces_shown"] == ["team-a"] and OTHER not in json.dumps(data)
    everything = get(secure, "/topology.json", PLATFORM).json()
    assert data["tree"]["gpus"] == everything["tree"]["gpus"]  # the capacity is everyone's
    # Asking for another namespace, or for a name of theirs, shows and outlines nothing of it.
    for query in ({"namespace": "team-b"}, {"workload": "bravo"}):
        filtered = get(secure, "/topology.json", TENANT, params=query).json()
        assert not filtered["workloads"] and not filtered["holds"] and filtered["holds_total"] == 0
        assert not any(node["marked"] for node in nodes(filtered["tree"]))
    assert get(secure, "/elsewhere", TENANT).status_code == 403


def test_a_reader_allowed_the_page_sees_every_namespace(secure):
    data = get(secure, "/topology.json", PLATFORM).json()
    assert {w["name"] for w in data["workloads"]} == {OWN, OTHER} and data["namespaces_shown"] is None
    page = get(secure, "/topology", PLATFORM)
    assert OWN in page.text and OTHER in page.text and "where you may list pods" not in page.text
    assert get(secure, "/metrics", PLATFORM).status_code == 200


def test_a_reader_allowed_only_metrics_sees_capacity_and_no_workload_on_the_page(secure):
    data = get(secure, "/topology.json", PROMETHEUS).json()
    assert data["workloads"] == [] and data["holds"] == [] and data["namespaces_shown"] == []
    assert data["tree"]["gpus"]["held"] == 4  # both holds still count as capacity taken


def test_answers_are_cached_so_a_scrape_asks_the_cluster_once_per_period(secure, cluster):
    token = "cache-check"
    cluster.tokens[token] = {"username": PROMETHEUS_SA, "groups": ["system:serviceaccounts"]}
    before = len(cluster.reviews)
    for _ in range(5):
        assert get(secure, "/metrics", token).status_code == 200
    kinds = [review["kind"] for review in cluster.reviews[before:]]
    assert kinds.count("TokenReview") == 1 and kinds.count("SubjectAccessReview") <= 1  # the SAR may be cached already


def test_when_the_cluster_cannot_answer_the_reader_gets_503_and_it_is_counted(secure, cluster):
    cluster.tokens["new-reader"] = {"username": "carol", "groups": []}
    cluster.answer_status = 500
    try:
        response = get(secure, "/metrics", "new-reader")
    finally:
        cluster.answer_status = None
    assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    assert_secured(response)
    scraped = get(secure, "/metrics", PROMETHEUS).text
    assert 'topology_metrics_access_failures_total{reason="review_error"}' in scraped
    assert get(secure, "/metrics", "new-reader").status_code == 403  # asked again, not a cached failure


def test_plain_http_on_the_https_port_is_told_to_use_https(secure):
    port = int(secure[0].rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 400 ") and b"use https://" in answer
    assert b"X-Content-Type-Options: nosniff" in answer


# ----- every answer carries the headers ----------------------------------------------------------

@pytest.mark.parametrize("path, params, method, status", [
    ("/metrics", None, "GET", 200), ("/healthz", None, "GET", 200), ("/readyz", None, "GET", 200),
    ("/topology", None, "GET", 200), ("/topology.json", None, "GET", 200), ("/topology", None, "HEAD", 200),
    ("/elsewhere", None, "GET", 404), ("/topology", {"refresh": "-1"}, "GET", 400),
    ("/topology.json", {"refresh": "x"}, "GET", 400), ("/topology", None, "POST", 405),
])
def test_every_answer_of_the_open_local_port_carries_nosniff_and_the_pages_csp(local, path, params, method, status):
    base, _, _ = local
    response = requests.request(method, f"{base}{path}", params=params, timeout=10)
    assert response.status_code == status
    assert_secured(response)


def test_a_malformed_request_is_answered_with_the_headers_too(local):
    port = int(local[0].rpartition(":")[2])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        headers = "".join(f"X-{i}: 1\r\n" for i in range(101))  # answered by http.server itself: too many
        raw.sendall(f"GET /metrics HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n".encode())
        answer = raw.recv(65536)
    assert answer.split(b" ")[1] == b"431" and b"X-Content-Type-Options: nosniff" in answer
    assert f"Content-Security-Policy: {CONTENT_SECURITY_POLICY}".encode() in answer


def test_an_app_that_fails_is_answered_500_with_the_headers_too():
    def broken(_environ, _start_response):
        raise RuntimeError("bug")

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    server = start_metrics_server(listener, Metrics.create().registry, broken)
    try:
        response = requests.get(f"http://127.0.0.1:{listener.getsockname()[1]}/healthz", timeout=10)
        assert response.status_code == 500
        assert_secured(response)
    finally:
        server.stop()


def test_the_local_port_is_open_and_shows_everything(local):
    base, _, _ = local
    data = requests.get(f"{base}/topology.json", timeout=10).json()
    assert {w["name"] for w in data["workloads"]} == {OWN, OTHER} and data["namespaces_shown"] is None


def nodes(block: dict) -> list[dict]:
    found = list(block.get("node_list", ()))
    for child in block.get("children", ()):
        found += nodes(child)
    return found


# ----- `serve` wires it: checked against a cluster, open on files --------------------------------

def test_serve_against_a_cluster_serves_the_metrics_port_over_https_to_readers_the_cluster_allows(fake, tmp_path):
    from conftest import start_server, stop_server, write_kubeconfig

    fake.tokens[PROMETHEUS] = {"username": PROMETHEUS_SA, "groups": ["system:serviceaccounts"]}
    fake.grants.add((PROMETHEUS_SA, "get", "/metrics"))
    server = start_server(tmp_path, "--kubeconfig", write_kubeconfig(tmp_path / "kubeconfig", fake))
    try:
        base = f"https://localhost:{server.metrics_port}"
        assert requests.get(f"{base}/healthz", verify=server.paths.ca, timeout=10).status_code == 200
        assert requests.get(f"{base}/metrics", verify=server.paths.ca, timeout=10).status_code == 401
        scraped = requests.get(f"{base}/metrics", headers={"Authorization": f"Bearer {PROMETHEUS}"},
                               verify=server.paths.ca, timeout=10)
        assert scraped.status_code == 200 and "topology_webhook_build_info" in scraped.text
        page = requests.get(f"{base}/topology.json", headers={"Authorization": f"Bearer {PROMETHEUS}"},
                            verify=server.paths.ca, timeout=10)
        assert page.status_code == 200 and page.json()["namespaces_shown"] == []
        plain = requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10)
        assert plain.status_code == 400 and "use https://" in plain.text
    finally:
        stop_server(server)
