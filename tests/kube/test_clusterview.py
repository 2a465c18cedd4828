"""The live cluster view against a local fake of the API's list/watch protocol, through the real client.

Every test runs the real `kubernetes` client over HTTP against tests/integration/fakeapiserver.py; nothing in
the client library is mocked. Waits are bounded polls (`eventually`), never bare sleeps.
"""
from __future__ import annotations

import gc
import random
import socket
import time

import pytest

from tests.integration.fakeapiserver import FakeApiServer
from conftest import LABELS, LEAF, ApiServer, eventually, start_server, stop_server, write_kubeconfig
from webhook.core.injection import RESERVATION as RESERVATION_ANNOTATION
from webhook.kube.clusterview import ApiFeed
from webhook.kube.streams import Backoff
from webhook.settings.config import Config, ConfigError
from webhook.credentials.kubeclient import api_client_from
from webhook.kube.demo import demo_cluster, make_node, make_pod
from webhook.core.model import Outcome, PlacementRequest, Strategy
from webhook.placement.placer import place_and_reserve

def status_of(view: ApiFeed, kind: str):
    return next(s for s in view.status() if s.kind == kind)


def gpus(view: ApiFeed) -> tuple[int, int]:
    stats = view.index.stats()
    return stats.gpus_total, stats.gpus_used


def leaves(view: ApiFeed) -> set[str]:
    with view.index.lock:
        return {domain.ref.name for domain in view.index.levels[-1].values()}  # the default preset's leaf level


def load_demo(server: FakeApiServer) -> None:
    nodes, pods = demo_cluster()
    for node in nodes:
        server.put_node(node)
    for pod in pods:
        server.put_pod(pod)


# ---- initial sync and readiness --------------------------------------------------------------
def test_initial_sync_lists_in_pages_then_watches_from_the_lists_version(fake, make_view):
    load_demo(fake)
    view = make_view(fake, page_size=7)
    assert view.readiness()[0] is False
    view.start()
    assert view.wait_synced(15)
    assert gpus(view) == (32 * 8, 90)
    assert view.readiness() == (True, "cluster view in sync")
    node_lists = fake.list_requests("nodes")
    assert len(node_lists) == 5 and all(q["limit"] == "7" for q in node_lists)  # 32 nodes in pages of 7
    assert "continue" not in node_lists[0] and all("continue" in q for q in node_lists[1:])
    watch = eventually(lambda: fake.watch_requests("nodes"), what="a node watch")[0]
    assert watch["resourceVersion"] == str(fake.resource_version)
    assert watch["allowWatchBookmarks"] == "true" and watch["timeoutSeconds"] == "5"


def test_after_a_full_list_the_index_is_out_of_the_collectors_way(fake, make_view):
    """A full collection walking the index in the middle of an admission was the p99 of a decision
    with waits pinned (bench/README.md): after each list the index is frozen out of its reach."""
    load_demo(fake)
    gc.unfreeze()
    view = make_view(fake)
    try:
        view.start()
        assert view.wait_synced(15)
        node = eventually(lambda: next(iter(view.index.nodes.values()), None), what="a node in the index")
        eventually(lambda: gc.get_freeze_count() > 0 and not any(o is node for o in gc.get_objects()),
                   what="the index frozen")
        assert gc.isenabled(), "the collector, off while the lists were applied, is on again"
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual


def test_not_ready_until_both_kinds_are_listed_and_says_which(fake, make_view):
    fake.delay_seconds = 0.5  # slow responses
    view = make_view(fake)
    view.start()
    ready, reason = view.readiness()
    assert not ready and "waiting for the first list of nodes" in reason
    assert view.wait_synced(15)
    assert view.readiness()[0]


def test_api_unreachable_at_start_then_recovering(make_view):
    with socket.socket() as probe:  # a port nobody listens on yet
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = FakeApiServer(port=port)
    load_demo(server)
    view = make_view(server)
    view.start()
    eventually(lambda: "Connection refused" in view.readiness()[1], what="a connection-refused reason")
    ready, reason = view.readiness()
    assert not ready and "waiting for the first list of" in reason
    server.start()
    try:
        assert view.wait_synced(15)
        assert gpus(view) == (256, 90) and view.readiness()[0]
    finally:
        server.stop()


def test_stale_when_no_progress_for_longer_than_configured_and_recovers(fake, make_view, clock):
    load_demo(fake)
    view = make_view(fake, Config(stale_after_seconds=60))
    view.start()
    assert view.wait_synced(15)
    fake.stop()  # the API goes away: lists and watches fail from now on
    # Both streams must have seen it: the reason below names the nodes stream's last error.
    eventually(lambda: status_of(view, "pods").failures and status_of(view, "nodes").failures,
               what="a failed watch on both streams")
    clock.now += 30
    assert view.readiness()[0], "30s without progress is within the 60s limit"
    clock.now += 31
    ready, reason = view.readiness()
    assert not ready
    assert reason.startswith("cluster view is stale: no list or watch progress on nodes for 61s (limit 60s)")
    assert "last error:" in reason
    fake.start()
    eventually(lambda: view.readiness()[0], what="readiness after the API came back")


def test_the_feeds_age_is_the_time_since_its_least_recent_progress(fake, make_view, clock):
    load_demo(fake)
    view = make_view(fake)
    assert view.age() is None  # nothing listed yet
    view.start()
    assert view.wait_synced(15)
    fake.stop()  # no more progress from here
    eventually(lambda: status_of(view, "pods").failures and status_of(view, "nodes").failures,
               what="both streams cut off")
    settled = view.age()
    clock.now += 42
    assert view.age() == settled + 42


def test_forbidden_list_is_named_in_readiness_then_recovers(fake, make_view):
    fake.put_node(make_node("n1", LABELS))
    fake.answer_status = 403  # RBAC without list on nodes/pods
    view = make_view(fake)
    view.start()
    eventually(lambda: "HTTP 403 Forbidden" in view.readiness()[1], what="the 403 in the readiness reason")
    fake.answer_status = None
    assert view.wait_synced(15)
    assert gpus(view) == (8, 0)


def test_continue_token_expired_mid_list_restarts_the_list(fake, make_view):
    load_demo(fake)
    fake.delay_seconds = 0.2  # pages slow enough to compact between the first and second page
    view = make_view(fake, page_size=7)
    view.start()
    eventually(lambda: fake.list_requests("nodes"), what="the first page of nodes")
    fake.compact()  # the first page's snapshot (and its continue token) is gone
    assert view.wait_synced(15)
    assert gpus(view) == (256, 90)
    fresh_starts = [q for q in fake.list_requests("nodes") if "continue" not in q]
    assert len(fresh_starts) == 2, "the list restarts from the beginning after 410 on a continue token"


# ---- events --------------------------------------------------------------------------------
def test_pods_bound_finished_and_deleted_change_used_gpus(fake, make_view):
    fake.put_node(make_node("n1", LABELS))
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    pending = make_pod("train-0", None, 4, phase="Pending")
    fake.put_pod(pending)
    eventually(lambda: status_of(view, "pods").events == 1, what="the pending pod")
    assert gpus(view) == (8, 0), "an unbound pod holds no GPUs"
    pending["spec"]["nodeName"] = "n1"
    fake.put_pod(pending)
    eventually(lambda: gpus(view) == (8, 4), what="the bound pod counted")
    fake.put_pod(make_pod("other", "n1", 2))
    eventually(lambda: gpus(view) == (8, 6), what="a second pod counted")
    finished = fake.get("pods", "default/train-0")
    finished["status"]["phase"] = "Succeeded"
    fake.put_pod(finished)
    eventually(lambda: gpus(view) == (8, 2), what="the finished pod released")
    fake.delete("pods", "default/other")
    eventually(lambda: gpus(view) == (8, 0), what="the deleted pod released")


def test_node_added_cordoned_relabelled_and_deleted(fake, make_view):
    fake.put_node(make_node("n1", LABELS))
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    fake.put_node(make_node("n2", LABELS, gpus=4))
    eventually(lambda: gpus(view)[0] == 12, what="the new node")
    fake.put_node(make_node("n1", LABELS, unschedulable=True))
    eventually(lambda: gpus(view)[0] == 4, what="the cordoned node's GPUs gone")
    fake.put_node(make_node("n1", LABELS))
    fake.put_node(make_node("n2", {**LABELS, LEAF: "leaf-2"}, gpus=4))
    eventually(lambda: leaves(view) == {"leaf-1", "leaf-2"} and gpus(view)[0] == 12, what="n2 moved to leaf-2")
    fake.delete("nodes", "n1")
    eventually(lambda: leaves(view) == {"leaf-2"} and gpus(view)[0] == 4, what="n1 and its leaf gone")


def test_an_object_the_index_cannot_read_is_skipped_not_retried_forever(fake, make_view):
    fake.put_node(make_node("n1", LABELS))
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    broken = make_pod("broken", "n1", 1)
    broken["spec"] = "not a pod spec"
    fake.put_pod(broken)
    fake.put_pod(make_pod("fine", "n1", 2))
    eventually(lambda: gpus(view)[1] == 2, what="the pod after the broken one")
    assert status_of(view, "pods").failures == 0


# ---- broken watches, 410, bookmarks ------------------------------------------------------------
def test_watch_broken_mid_stream_resumes_from_last_version_without_relisting(fake, make_view):
    fake.put_node(make_node("n1", LABELS))
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    fake.put_pod(make_pod("a", "n1", 1))
    eventually(lambda: gpus(view)[1] == 1, what="pod a")
    watches_before = len(fake.watch_requests("pods"))
    version_at_break = str(fake.resource_version)
    fake.break_watches()
    fake.put_pod(make_pod("b", "n1", 2))
    eventually(lambda: gpus(view)[1] == 3, what="pod b after the break")
    assert status_of(view, "pods").failures >= 1
    assert "IncompleteRead" in status_of(view, "pods").last_error
    resumed = fake.watch_requests("pods")[watches_before]
    assert resumed["resourceVersion"] == version_at_break  # from where it was, not from scratch
    assert len(fake.list_requests("pods")) == 1, "a broken watch must not cost a relist"


@pytest.mark.parametrize("gone_as_status", [False, True], ids=["ERROR event 410", "HTTP 410"])
def test_gone_relists_and_forgets_what_was_deleted_meanwhile(fake, make_view, gone_as_status):
    fake.gone_as_status = gone_as_status
    fake.put_node(make_node("n1", LABELS))
    fake.put_node(make_node("n2", LABELS))
    fake.put_pod(make_pod("a", "n1", 4))
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    assert gpus(view) == (16, 4)
    fake.stop()  # while the view is away: n2 goes, pod a is recreated smaller, b comes; history compacted
    fake.delete("nodes", "n2")
    fake.delete("pods", "default/a")
    recreated = make_pod("a", "n1", 2)
    recreated["metadata"]["uid"] = "uid-second-a"
    fake.put_pod(recreated)
    fake.put_pod(make_pod("b", "n1", 1))
    fake.compact()
    fake.start()
    eventually(lambda: status_of(view, "pods").lists == 2 and status_of(view, "nodes").lists == 2,
               what="a relist of both kinds")
    assert gpus(view) == (8, 3), "the first pod a is forgotten, the second one counted once"
    assert status_of(view, "nodes").objects == 1 and status_of(view, "pods").objects == 2


class _FirstContinueExpires(dict):
    """Paging snapshots of the fake: the first one is never kept (its continue token answers 410
    Expired), and while it is made, `on_first` runs, under the fake's lock."""

    def __init__(self, on_first) -> None:
        super().__init__()
        self.on_first = on_first

    def __setitem__(self, key, value) -> None:
        if self.on_first is None:
            super().__setitem__(key, value)
            return
        on_first, self.on_first = self.on_first, None
        on_first()


def test_a_first_list_broken_after_a_page_relists_and_forgets_what_went_meanwhile(fake, make_view):
    # The first list of a kind keeps no keys when nothing of it is counted (a million pods); once a
    # page of a broken list is applied something is, and the next list must forget what it lacks.
    fake.put_node(make_node("n1", LABELS))
    for name in ("a", "b", "c"):
        fake.put_pod(make_pod(name, "n1", 1))
    fake._snapshots = _FirstContinueExpires(lambda: fake.delete("pods", "default/a"))  # after page 1 is cut
    view = make_view(fake, page_size=2)
    view.start()
    assert view.wait_synced(15)
    eventually(lambda: status_of(view, "pods").lists == 1, what="the pods listed")
    assert [q.get("continue") is None for q in fake.list_requests("pods")][:3] == [True, False, True]
    assert gpus(view) == (8, 2), "pod a, in the broken list's first page, was deleted before the next list"
    assert status_of(view, "pods").objects == 2


def test_bookmarks_move_the_resume_point(fake, make_view):
    fake.put_node(make_node("n1", LABELS))
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    for i in range(3):  # pod writes move the shared resourceVersion; the node watch only gets bookmarks
        fake.put_pod(make_pod(f"p{i}", "n1", 1))
    target = str(fake.resource_version)
    eventually(lambda: status_of(view, "nodes").resource_version == target, what="a bookmark on the node watch")
    assert status_of(view, "nodes").events == 0
    fake.break_watches()
    eventually(lambda: len(fake.watch_requests("nodes")) >= 2, what="the node watch resumed")
    assert fake.watch_requests("nodes")[-1]["resourceVersion"] == target


def test_watch_that_ends_at_its_timeout_is_reopened(fake, make_view):
    fake.put_node(make_node("n1", LABELS))
    view = make_view(fake, watch_timeout_seconds=1)
    view.start()
    assert view.wait_synced(15)
    eventually(lambda: len(fake.watch_requests("pods")) >= 2, timeout=4, what="a second watch")
    assert status_of(view, "pods").failures == 0
    fake.put_pod(make_pod("a", "n1", 3))
    eventually(lambda: gpus(view)[1] == 3, what="an event on the reopened watch")


def test_stop_is_prompt_with_watches_open(fake, make_view):
    view = make_view(fake, watch_timeout_seconds=60)
    view.start()
    assert view.wait_synced(15)
    eventually(lambda: fake.watch_requests("pods") and fake.watch_requests("nodes"), what="open watches")
    started = time.monotonic()
    assert view.stop(timeout=5)
    assert time.monotonic() - started < 3


# ---- backoff and client construction ------------------------------------------------------------
def test_backoff_grows_with_jitter_up_to_the_cap_and_resets():
    backoff = Backoff(base=1.0, cap=8.0, rng=random.Random(3))
    delays = [backoff.next_delay() for _ in range(6)]
    for delay, ceiling in zip(delays, (1, 2, 4, 8, 8, 8)):
        assert ceiling / 2 <= delay <= ceiling
    assert len(set(delays)) == 6, "jitter: no two reconnects at the same instant"
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_api_client_from_kubeconfig_reaches_the_server(fake, tmp_path):
    fake.put_node(make_node("n1", LABELS))
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake)
    from kubernetes.client import CoreV1Api
    nodes = CoreV1Api(api_client_from(kubeconfig)).list_node()
    assert [n.metadata.name for n in nodes.items] == ["n1"]


@pytest.mark.parametrize("kubeconfig, message", [
    ("/nonexistent/kubeconfig", "kubeconfig /nonexistent/kubeconfig: "),
    (None, "in-cluster config: "),
], ids=["missing file", "not in a pod"])
def test_api_client_from_bad_config_is_one_clear_line(kubeconfig, message, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError) as err:
        api_client_from(kubeconfig)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# ---- reservations ------------------------------------------------------------------------------
def whole_node(name: str) -> PlacementRequest:
    return PlacementRequest(workload=f"Job ml/{name}", pods=1, gpus_per_pod=8, strategy=Strategy.CONSOLIDATED)


def test_reservations_never_share_the_last_domain_are_confirmed_by_binding_and_expire(fake, make_view, clock):
    fake.put_node(make_node("n1", LABELS))
    fake.put_node(make_node("n2", {**LABELS, LEAF: "leaf-2"}))
    view = make_view(fake, Config(reservation_ttl_seconds=300))
    view.start()
    assert view.wait_synced(15)
    first = place_and_reserve(view.index, whole_node("a"), "ml/a")
    second = place_and_reserve(view.index, whole_node("b"), "ml/b")
    third = place_and_reserve(view.index, whole_node("c"), "ml/c")
    assert (first.outcome, second.outcome, third.outcome) == (Outcome.PLACED, Outcome.PLACED, Outcome.WAIT)
    assert {first.nodes, second.nodes} == {("n1",), ("n2",)}
    assert view.index.stats().gpus_reserved == 16
    assert place_and_reserve(view.index, whole_node("d"), None).outcome is Outcome.WAIT

    bound = make_pod("a-0", first.nodes[0], 8, "ml", annotations={RESERVATION_ANNOTATION: "ml/a"})
    fake.put_pod(bound)
    eventually(lambda: view.index.stats().gpus_reserved == 8, what="ml/a confirmed by its bound pod")
    assert gpus(view) == (16, 8)

    clock.now += 301  # ml/b's pods never came: its hold lapses and the domain is free again
    eventually(lambda: view.index.stats().gpus_reserved == 0, what="ml/b expired")
    assert place_and_reserve(view.index, whole_node("c"), "ml/c").nodes == second.nodes


# ---- through the real gunicorn server ---------------------------------------------------------
# What `serve --kubeconfig FILE` runs in its worker: the live view behind the real app, one worker
# process with threads, so every request thread shares one index and one reservation ledger.
@pytest.fixture
def start_live_server(fake, tmp_path):
    """Starts `topology-webhook serve --kubeconfig` (gunicorn over TLS) fed by the fake API server;
    returns an apiserver-like client once /healthz answers. Stopped at teardown."""
    servers = []

    def start() -> ApiServer:
        server = start_server(tmp_path, "--kubeconfig", write_kubeconfig(tmp_path / "kubeconfig", fake))
        servers.append(server)
        return server.client()

    yield start
    for server in servers:
        stop_server(server)


def test_gunicorn_fails_open_until_synced_then_never_double_books_concurrent_admissions(fake, start_live_server):
    from concurrent.futures import ThreadPoolExecutor

    from conftest import review_of
    from tests.fixtures.builders import gpu_pod

    fake.refuse_until = time.monotonic() + 3600  # the API does not answer yet
    live_server = start_live_server()
    ready = live_server.get("/readyz")
    assert ready.status_code == 503 and "not synced yet" in ready.text
    early = review_of(gpu_pod("early", 8, gpu_count="8", placement_strategy="consolidated"))
    answer = live_server.post(early).json()["response"]
    assert answer["allowed"] and "patch" not in answer
    assert any("not ready" in w and "not synced yet" in w for w in answer["warnings"])

    for leaf in range(4):  # four whole nodes, one per leaf: room for exactly four 8-GPU pods
        fake.put_node(make_node(f"n{leaf}", {**LABELS, LEAF: f"leaf-{leaf}"}))
    fake.refuse_until = 0
    eventually(lambda: live_server.get("/readyz").status_code == 200, timeout=30, what="/readyz after the sync")

    reviews = [review_of(gpu_pod(f"train-{i}", 8, gpu_count="8", placement_strategy="consolidated"))
               for i in range(12)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(lambda r: live_server.post(r).json()["response"], reviews))
    audits = [a["auditAnnotations"] for a in answers]
    placed = [a["domain"] for a in audits if a["outcome"] == "placed"]
    assert sorted(placed) == ["node n0", "node n1", "node n2", "node n3"], audits
    assert sum(a["outcome"] == "waiting" for a in audits) == 8
