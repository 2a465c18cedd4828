"""Who reads what on the metrics port (webhook/credentials/access.py): the decision and its cache
against fake TokenReview and SubjectAccessReview functions, the page's filtering for a reader who
may see some namespaces only, and, over random clusters, that such a reader meets no workload name
of any other namespace in the page or its JSON."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.builders import gpu_pod
from webhook.objects.feed import index_of
from webhook.objects import feed
from webhook.settings.config import Config
from webhook.kube import demo
from webhook.kube.access import subject_access_review
from webhook import admission
from webhook.admission.recent import RecentDecisions
from webhook.serving.page.snapshot import namespaces_present
from webhook.credentials.access import (EVERYTHING, SCOPE_ENVIRON_KEY, Access, NonResourceURL, PageScope, Reader,
                                    ResourceAction, ReviewError, bearer_token, guarded, visible_namespaces)
from webhook.serving.page.render import page_app

LEVELS = ("topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf")
TENANT = Reader("alice", "u1", ("team-a-devs",))
PLATFORM = Reader("bob", "", ("platform",))
SCRAPER = Reader("system:serviceaccount:monitoring:prometheus-k8s")
TOKENS = {"tenant": TENANT, "platform": PLATFORM, "scraper": SCRAPER}
GRANTS = {(TENANT, ResourceAction("team-a", "list", "pods")),
          (PLATFORM, NonResourceURL("/metrics")), (PLATFORM, NonResourceURL("/topology")),
          (PLATFORM, NonResourceURL("/topology.json")), (SCRAPER, NonResourceURL("/metrics"))}


class FakeCluster:
    """TokenReview and SubjectAccessReview answers from TOKENS and GRANTS, counting the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.down = False

    def review_token(self, token: str) -> Reader | None:
        self.calls.append(("token", token))
        if self.down:
            raise ReviewError("unreachable")
        return TOKENS.get(token)

    def authorize(self, reader: Reader, question) -> bool:
        self.calls.append(("sar", reader, question))
        if self.down:
            raise ReviewError("unreachable")
        return (reader, question) in GRANTS


@pytest.fixture
def fake_cluster() -> FakeCluster:
    return FakeCluster()


@pytest.fixture
def failures() -> list[str]:
    return []


@pytest.fixture
def access(fake_cluster, failures, clock) -> Access:
    return Access(fake_cluster.review_token, fake_cluster.authorize, on_failure=failures.append, clock=clock)


def call(app, path: str, token: str | None = None, method: str = "GET", query: str = "") -> tuple[str, dict, bytes, dict]:
    answer: dict = {}

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = status, dict(headers)

    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query}
    if token is not None:
        environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    body = b"".join(app(environ, start_response))
    return answer["status"], answer["headers"], body, environ


def echo(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"served\n"]


# ----- the decision --------------------------------------------------------------------------------

@pytest.mark.parametrize("header, token", [
    ("Bearer abc.def", "abc.def"), ("bearer  abc ", "abc"), ("Basic dXNlcg==", None), ("Bearer", None),
    ("Bearer ", None), ("", None), (None, None),
])
def test_only_a_bearer_token_is_taken(header, token):
    assert bearer_token(header) == token


@pytest.mark.parametrize("token, path, status, reason", [
    (None, "/metrics", "401 Unauthorized", "no_token"),
    ("forged", "/metrics", "401 Unauthorized", "bad_token"),
    ("tenant", "/metrics", "403 Forbidden", "forbidden"),
    ("tenant", "/elsewhere", "403 Forbidden", "forbidden"),
    ("scraper", "/metrics", "200 OK", None),
    ("platform", "/metrics", "200 OK", None),
    (None, "/topology", "401 Unauthorized", "no_token"),
    ("forged", "/topology.json", "401 Unauthorized", "bad_token"),
    ("tenant", "/topology", "200 OK", None),
    ("scraper", "/topology.json", "200 OK", None),
    (None, "/healthz", "200 OK", None),
    (None, "/readyz", "200 OK", None),
])
def test_each_reader_gets_what_the_cluster_allows_on_each_path(access, failures, token, path, status, reason):
    app = guarded(echo, access, open_paths=("/healthz", "/readyz"), page_paths=("/topology", "/topology.json"))
    answer, headers, body, _ = call(app, path, token)
    assert answer == status
    assert failures == ([reason] if reason else [])
    if status.startswith("401"):
        assert headers["WWW-Authenticate"].startswith('Bearer realm="topology-webhook"')
        assert (b"Bearer" if token is None else b"does not accept this token") in body
    if status.startswith("403"):
        assert b"alice" in body and path.encode() in body


def test_the_page_gets_everything_for_a_reader_allowed_it_and_a_namespace_check_for_others(access):
    app = guarded(echo, access, open_paths=(), page_paths=("/topology",))
    *_, environ = call(app, "/topology", "platform")
    assert environ[SCOPE_ENVIRON_KEY] is EVERYTHING
    *_, environ = call(app, "/topology", "tenant")
    scope = environ[SCOPE_ENVIRON_KEY]
    assert not scope.everything and scope.may_list("team-a") and not scope.may_list("team-b")


def test_a_cluster_that_cannot_answer_is_503_counted_and_not_cached(access, fake_cluster, failures):
    app = guarded(echo, access, open_paths=(), page_paths=())
    fake_cluster.down = True
    status, headers, _, _ = call(app, "/metrics", "scraper")
    assert status == "503 Service Unavailable" and headers["Retry-After"] == "5" and failures == ["review_error"]
    fake_cluster.down = False
    assert call(app, "/metrics", "scraper")[0] == "200 OK"


def test_a_namespace_the_cluster_cannot_answer_for_is_not_shown(access, fake_cluster, failures):
    fake_cluster.down = True
    assert access.may_list_pods(TENANT, "team-a") is False and failures == ["review_error"]
    fake_cluster.down = False
    assert access.may_list_pods(TENANT, "team-a") is True


def test_answers_are_cached_ten_seconds_when_allowed_two_when_not(access, fake_cluster, clock):
    for _ in range(3):
        assert access.reader("scraper") == SCRAPER and access.allows(SCRAPER, NonResourceURL("/metrics"))
        assert access.reader("forged") is None and not access.allows(TENANT, NonResourceURL("/metrics"))
    assert len(fake_cluster.calls) == 4
    clock.now += 2.5  # the denials expire
    access.reader("scraper"), access.reader("forged"), access.allows(TENANT, NonResourceURL("/metrics"))
    assert len(fake_cluster.calls) == 6
    clock.now += 8  # now the allowed ones too
    access.reader("scraper")
    assert len(fake_cluster.calls) == 7


def test_the_caches_are_bounded_and_keep_no_token(fake_cluster, clock):
    access = Access(fake_cluster.review_token, fake_cluster.authorize, clock=clock, entries=2)
    for token in ("tenant", "platform", "scraper", "forged"):
        access.reader(token)
    assert len(access._readers) == 2
    assert "scraper" not in repr(access._readers._items) and "forged" not in repr(access._readers._items)
    access.reader("tenant")  # dropped when full: asked again
    assert fake_cluster.calls[-1] == ("token", "tenant")


def test_visible_namespaces_asks_in_name_order_up_to_the_limit():
    asked = []

    def may_list(namespace):
        asked.append(namespace)
        return namespace != "b"

    assert visible_namespaces({"c", "a", "b", "d"}, may_list, limit=3) == (frozenset({"a", "c"}), 1)
    assert asked == ["a", "b", "c"]


def test_the_subject_access_reviews_ask_what_rbac_knows():
    url = subject_access_review(TENANT, NonResourceURL("/metrics"))
    assert url == {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {
        "user": "alice", "uid": "u1", "groups": ["team-a-devs"],
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}}
    pods = subject_access_review(Reader("bob", extra=(("scopes", ("a", "b")),)), ResourceAction("team-a", "list", "pods"))
    assert pods["spec"] == {"user": "bob", "groups": [], "extra": {"scopes": ["a", "b"]}, "resourceAttributes": {
        "namespace": "team-a", "verb": "list", "resource": "pods", "group": ""}}


# ----- the page for a reader of some namespaces ---------------------------------------------------

def page(index, decisions, scope: PageScope, path: str = "/topology.json", query: str = "") -> bytes:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, SCOPE_ENVIRON_KEY: scope}
    answer = {}
    body = b"".join(page_app(index, decisions, clock=lambda: 0.0)(environ, lambda s, h: answer.update(status=s)))
    assert answer["status"] == "200 OK", body
    return body


def strip_marks(block: dict) -> dict:
    return {key: ([strip_marks(c) for c in value] if key in ("children", "node_list") else value)
            for key, value in block.items() if key != "marked"}


def marked_nodes(block: dict) -> set[str]:
    found = {node["name"] for node in block.get("node_list", ()) if node["marked"]}
    for child in block.get("children", ()):
        found |= marked_nodes(child)
    return found


NAMESPACES = ("team-a", "team-b", "team-c")


@st.composite
def clusters(draw):
    """Nodes of a random zone/spine/leaf tree (some out of service), then workloads of random
    namespaces admitted in turn (placed, waiting or denied, each holding GPUs when placed), some
    extra holds without a decision, and some admitted pods pending with our placement (held
    until they bind). Workload names carry their namespace, so no name is part of another's."""
    nodes = []
    for i in range(draw(st.integers(1, 10))):
        labels = dict(zip(LEVELS, draw(st.sampled_from([("z0", "s0", "l0"), ("z0", "s0", "l1"), ("z0", "s1", "l2"),
                                                        ("z1", "s2", "l3")]))))
        nodes.append(demo.make_node(f"n{i}", labels, draw(st.sampled_from([0, 4, 8])),
                                    unschedulable=draw(st.booleans()) and draw(st.booleans())))
    index = index_of(Config(), nodes, [])
    decisions = RecentDecisions()
    names: dict[str, set[str]] = {namespace: set() for namespace in NAMESPACES}
    for i in range(draw(st.integers(0, 12))):
        namespace = draw(st.sampled_from(NAMESPACES))
        name = f"{namespace}-w{i}-{draw(st.text('xyz', min_size=1, max_size=3))}"
        names[namespace].add(name)
        gpus = draw(st.sampled_from([1, 2, 4, 8, 16]))
        pod = gpu_pod(name, gpus, namespace=namespace, placement_strategy=draw(st.sampled_from(
            ["consolidated", "balanced"])))
        result = admission.review(admission.make_review(pod), index, Config())
        decisions.record(result, float(i))
        if result.outcome == "placed" and draw(st.booleans()):  # its pod exists, pending: held until it binds
            index.release(f"{namespace}/Pod/{name}")
            feed.upsert(index, {**result.admitted, "metadata": {**result.admitted["metadata"], "uid": f"u{i}"}}, "Pod")
    gpu_nodes = [node["metadata"]["name"] for node in nodes if int(node["status"]["allocatable"].get(
        "nvidia.com/gpu", "0"))]
    for i in range(draw(st.integers(0, 3))):  # holds whose decisions another replica made
        if gpu_nodes:
            namespace = draw(st.sampled_from(NAMESPACES))
            name = f"{namespace}-h{i}"
            names[namespace].add(name)
            index.reserve(f"{namespace}/Job/{name}", {draw(st.sampled_from(gpu_nodes)): [(0,)]})
    allowed = draw(st.sets(st.sampled_from(NAMESPACES)))
    query = draw(st.sampled_from(["", "namespace=team-a", "namespace=team-b", "workload=w1", "workload=team-b",
                                  "workload=h", "namespace=team-c&workload=x"]))
    return index, decisions, names, allowed, query


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clusters())
def test_a_reader_of_some_namespaces_meets_no_workload_name_of_another(cluster):
    index, decisions, names, allowed, query = cluster
    scope = PageScope(lambda namespace: namespace in allowed)
    hidden = [name for namespace, found in names.items() if namespace not in allowed for name in found]
    html = page(index, decisions, scope, "/topology", query).decode()
    text = page(index, decisions, scope, "/topology.json", query).decode()
    for name in hidden:
        assert name not in html and name not in text, name
    data, everything = json.loads(text), json.loads(page(index, decisions, EVERYTHING, "/topology.json", query))
    # The capacity is the whole cluster's; the lists are everyone's, less the other namespaces'.
    assert strip_marks(data["tree"]) == strip_marks(everything["tree"])
    assert data["out_of_service"] == everything["out_of_service"]
    assert data["workloads"] == [w for w in everything["workloads"] if w["namespace"] in allowed]
    assert data["holds"] == [h for h in everything["holds"] if h["namespace"] in allowed]
    assert data["holds_total"] == len(data["holds"])
    shown = set(data["namespaces_shown"])
    assert shown <= allowed and shown <= namespaces_present(index, decisions.entries())
    # Outlined: only where its own selected workloads are placed or held.
    own = {node for hold in data["holds"] for node in hold["nodes"]} | {
        node for w in data["workloads"] if w["outcome"] in ("placed", "repaired") for node in w["nodes"]}
    assert marked_nodes(data["tree"]) <= own
