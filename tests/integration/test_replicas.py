"""Replicas that agree: two real `serve --kubeconfig --claims-namespace` processes against one fake
API server, sharing holds through the claims Lease (webhook/kube/shared_claims.py).

Each replica is the real gunicorn server over TLS with its live view of tests/integration/fakeapiserver.py;
requests go to them as the apiserver's Service would spread them. Waits are bounded polls.
"""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from conftest import (LABELS, LEAF, RunningServer, eventually, patched_object, review_of, start_server, stop_server,
                      write_kubeconfig)
from tests.fixtures.builders import gpu_job
from tests.fixtures.shared import deletion

from webhook.kube.claims_text import CLAIMS_ANNOTATION, LEASE_NAME, read_claims
from webhook.kube.demo import make_node

NAMESPACE = "topology-webhook"
NODES = 16
BURST = 40


@pytest.fixture
def replicas(fake, tmp_path):
    """`start(name, *flags)` runs one replica in its own directory, once /readyz answers 200;
    `stop(name)` ends it. Every replica still running is stopped at teardown."""
    running = {}
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", fake)

    def start(name: str, *flags: str) -> RunningServer:
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        # --no-metrics-secure: `metric()` scrapes plain HTTP, as a cluster that fronts the port itself would.
        running[name] = start_server(workdir, "--kubeconfig", kubeconfig, "--claims-namespace", NAMESPACE,
                                     "--no-metrics-secure", *flags)
        client = running[name].client()
        eventually(lambda: client.get("/readyz").status_code == 200, timeout=30, what=f"replica {name} ready")
        return running[name]

    def stop(name: str) -> None:
        stop_server(running.pop(name))

    yield start, stop
    for server in running.values():
        stop_server(server)


def whole_node_jobs(count: int, prefix: str = "train") -> list[dict]:
    return [review_of(gpu_job(f"{prefix}-{i}", 1, 8, gpu_count="8", placement_strategy="consolidated"))
            for i in range(count)]


def add_nodes(fake, count: int = NODES) -> None:
    for i in range(count):
        fake.put_node(make_node(f"n{i}", {**LABELS, LEAF: f"leaf-{i // 4}"}))


def admit_all(replicas: list[RunningServer], reviews: list[dict]) -> list[dict]:
    """Send every review at once, the i-th to replicas[i % len(replicas)]; the answers in order."""
    targets = [replica.client() for replica in replicas]
    with ThreadPoolExecutor(max_workers=len(reviews)) as pool:
        return list(pool.map(lambda pair: pair[0].post(pair[1], timeout_seconds=60).json()["response"],
                             [(targets[i % len(targets)], r) for i, r in enumerate(reviews)]))


def placed_nodes(answers: list[dict]) -> list[str]:
    return [a["auditAnnotations"]["domain"] for a in answers if a["auditAnnotations"]["outcome"] == "placed"]


def metric(replica: RunningServer, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", replica.metrics(), re.MULTILINE)
    return float(match.group(1)) if match else 0.0


RESERVED = 'topology_cluster_gpus{state="reserved"}'
ALONE = "topology_claims_decided_alone_total"


def test_two_replicas_never_give_a_node_twice_in_a_concurrent_burst(fake, replicas):
    add_nodes(fake)
    start, _ = replicas
    a, b = start("a", "--claims-budget", "30"), start("b", "--claims-budget", "30")
    answers = admit_all([a, b], whole_node_jobs(BURST))
    placed = placed_nodes(answers)
    assert len(placed) == NODES and len(set(placed)) == NODES, placed
    assert sum(x["auditAnnotations"]["outcome"] == "waiting" for x in answers) == BURST - NODES
    assert not any("decided without the other replicas" in w for x in answers for w in x.get("warnings", ()))
    eventually(lambda: metric(a, RESERVED) == metric(b, RESERVED) == NODES * 8, what="every claim on both")
    writes = [w for w in fake.writes if w[2] < 300 and w[1].endswith(f"/{LEASE_NAME}")]  # not the decisions' records
    assert 0 < len(writes) <= NODES, "at most one write per placed workload (claims decided together share one)"


def test_a_replica_restarted_in_the_burst_still_gives_no_node_twice(fake, replicas):
    add_nodes(fake)
    start, stop = replicas
    a, b = start("a", "--claims-budget", "30"), start("b", "--claims-budget", "30")
    reviews = whole_node_jobs(BURST)
    first = admit_all([a, b], reviews[:10])
    stop("b")  # its holds lived in its memory; what it claimed is in the Lease
    with ThreadPoolExecutor(max_workers=2) as pool:
        during = pool.submit(admit_all, [a], reviews[10:20])  # the burst goes on through a meanwhile
        restarted = pool.submit(start, "b", "--claims-budget", "30").result()
        rest = during.result() + admit_all([a, restarted], reviews[20:])
    placed = placed_nodes(first + rest)
    assert len(placed) == NODES and len(set(placed)) == NODES, placed
    eventually(lambda: metric(restarted, RESERVED) == NODES * 8, what="every claim on the restarted replica")


def test_a_workload_admitted_on_one_replica_and_deleted_is_released_on_both_when_their_watches_see_it(
        fake, replicas):
    """A DELETE review, sent to either, frees nothing: each replica frees what its own watch shows
    deleted."""
    add_nodes(fake, 1)
    start, _ = replicas
    a, b = start("a"), start("b")
    sent = whole_node_jobs(1, "solo")[0]
    stored = patched_object(sent, a.client().post(sent).json())
    fake.put("jobs", stored)  # the apiserver stored it as admitted
    eventually(lambda: metric(b, RESERVED) == 8, what="the claim seen by b")
    answer = b.client().post(deletion(stored)).json()["response"]
    assert answer["allowed"] and "patch" not in answer and "auditAnnotations" not in answer  # ignored
    assert metric(a, RESERVED) == metric(b, RESERVED) == 8
    fake.delete("jobs", "ml/solo-0")
    eventually(lambda: metric(a, RESERVED) == metric(b, RESERVED) == 0, what="the hold gone on both")
    again = a.client().post(whole_node_jobs(1, "next")[0]).json()["response"]
    assert again["auditAnnotations"] == {**again["auditAnnotations"], "outcome": "placed", "domain": "node n0"}


def test_a_review_the_apiserver_never_stored_is_held_on_no_replica_past_its_window(fake, replicas, tmp_path):
    """A CREATE POSTed straight to one replica's port (or refused after us): its claim reaches the
    other replica as provisional too, and both let it go."""
    add_nodes(fake, 1)
    settings = tmp_path / "settings.yaml"
    settings.write_text("provisional_hold_seconds: 2\n")
    start, _ = replicas
    a, b = start("a", "--config", str(settings)), start("b", "--config", str(settings))
    forged = whole_node_jobs(1, "forged")[0]
    assert a.client().post(forged).json()["response"]["auditAnnotations"]["outcome"] == "placed"
    eventually(lambda: metric(b, RESERVED) == 8, what="the claim seen by b")
    eventually(lambda: metric(a, RESERVED) == metric(b, RESERVED) == 0, timeout=15, what="lapsed on both")
    real = whole_node_jobs(1, "real")[0]
    assert b.client().post(real).json()["response"]["auditAnnotations"]["outcome"] == "placed"


def test_with_writes_hanging_admissions_answer_within_the_budget_and_count_it(fake, replicas):
    add_nodes(fake, 2)
    start, _ = replicas
    a = start("a", "--claims-budget", "1")
    fake.write_delay_seconds = 30  # the API takes writes but never answers them in time
    started = time.monotonic()
    answer = a.client().post(whole_node_jobs(1)[0], timeout_seconds=30).json()["response"]
    elapsed = time.monotonic() - started
    assert answer["allowed"] and answer["auditAnnotations"]["outcome"] == "placed"
    assert any("decided without the other replicas" in w for w in answer["warnings"])
    assert elapsed < 1 + 4, f"answered after {elapsed:.1f}s with a 1s claims budget"  # generous: a noisy machine
    assert metric(a, ALONE) == 1
    fake.write_delay_seconds = 0
    fake.refuse_writes = True  # and when the API hangs up on writes at once
    answer = a.client().post(whole_node_jobs(1, "other")[0]).json()["response"]
    assert any("decided without the other replicas" in w for w in answer["warnings"])
    assert metric(a, ALONE) == 2


def test_a_replica_shut_down_gracefully_gives_its_allotment_back(fake, replicas):
    add_nodes(fake)
    start, stop = replicas
    a = start("a", "--claims-allotments")
    answer = a.client().post(review_of(gpu_job("small", 1, 1, gpu_count="1"))).json()["response"]
    assert answer["auditAnnotations"]["outcome"] == "placed"

    def claimed() -> set[str]:
        return set(read_claims(fake.get("leases", f"{NAMESPACE}/{LEASE_NAME}")))
    assert any(key.startswith("allotment/") for key in claimed()), "the rest of its node, claimed ahead"
    stop("a")  # SIGTERM: gunicorn's graceful shutdown, the worker's exit handlers
    assert claimed() == {"ml/Job/small"}


def test_both_replicas_pages_list_the_decisions_of_both_naming_the_replica_that_made_each(fake, replicas):
    add_nodes(fake)
    start, _ = replicas
    a, b = start("a"), start("b")
    for replica, review in zip((a, b), whole_node_jobs(2, prefix="page")):
        assert replica.client().post(review).json()["response"]["auditAnnotations"]["outcome"] == "placed"

    def listed(replica: RunningServer) -> list[tuple[str, str]]:
        page = requests.get(f"http://127.0.0.1:{replica.metrics_port}/topology.json", timeout=5).json()
        return sorted((entry["name"], entry["replica"]) for entry in page["workloads"])
    eventually(lambda: len(listed(a)) == 2 and listed(a) == listed(b), timeout=20, what="one list on both pages")
    (first, made_first), (second, made_second) = listed(a)
    assert (first, second) == ("page-0", "page-1") and made_first != made_second  # each by the replica it went to
    lease_names = {path.rpartition("/")[2] for method, path, code in fake.writes if "decisions" in path}
    assert len(lease_names) == 2, "one record per replica"
