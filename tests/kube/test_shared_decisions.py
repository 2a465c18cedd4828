"""Every replica's recent decisions on every replica's page, in process: live views of one fake API
server, each writing its record Lease and watching the others' (webhook/kube/shared_decisions.py),
through the real `kubernetes` client. Two `serve` processes: tests/integration/test_replicas.py."""
from __future__ import annotations

import logging

import pytest
from conftest import LABELS, LEAF, eventually
from kubernetes.client import ApiClient, Configuration

from tests.fixtures.builders import gpu_job
from webhook import admission
from webhook.kube.demo import make_node
from webhook.kube.shared_decisions import RECORD_ANNOTATION, ApiDecisionRecords, record_name
from webhook.admission.recent import RecentDecisions
from webhook.settings.config import Config

NAMESPACE = "tw"
POD = {"apiVersion": "v1", "kind": "Pod", "name": "webhook-0", "uid": "uid-of-webhook-0"}


def records_of(fake, replica: str, owner: dict | None = None) -> ApiDecisionRecords:
    """A replica's records, never written on its own (write_seconds: a day): the test says when."""
    return ApiDecisionRecords(RecentDecisions(replica=replica), ApiClient(Configuration(host=fake.url)), NAMESPACE,
                              owner, write_seconds=86400)


def admit(view, records: ApiDecisionRecords, name: str) -> None:
    review = admission.make_review(gpu_job(name, 1, 8, placement_strategy="consolidated"))
    records.decisions.record(admission.review(review, view.index, Config()), 1000.0)


def lease_writes(fake) -> list[tuple[str, str, int]]:
    return [write for write in fake.writes if "/leases" in write[1]]


@pytest.fixture
def pair(fake, make_view):
    """Two replicas' views with their records, synced; no claims (their Lease writes are not these)."""
    for i in range(4):
        fake.put_node(make_node(f"n{i}", {**LABELS, LEAF: f"leaf-{i}"}))
    out = []
    for replica in ("webhook-0", "webhook-1"):
        records = records_of(fake, replica, POD if replica == "webhook-0" else None)
        view = make_view(fake, decision_records=records)
        view.start()
        assert view.wait_synced(15)
        out.append((view, records))
    return out


def listed(records: ApiDecisionRecords) -> list[tuple[str, str]]:
    return sorted((entry.name, entry.replica) for entry in records.decisions.entries())


def test_both_replicas_list_the_decisions_of_both_each_named_by_its_replica(pair):
    (view_a, a), (view_b, b) = pair
    admit(view_a, a, "train-a")
    admit(view_b, b, "train-b")
    assert a.write() and b.write()
    expected = [("train-a", "webhook-0"), ("train-b", "webhook-1")]
    eventually(lambda: listed(a) == listed(b) == expected, timeout=10, what="both decisions on both replicas")


def test_an_admission_writes_nothing_and_a_burst_is_one_write_of_its_record(fake, pair):
    (view_a, a), _ = pair
    before = len(lease_writes(fake))
    for i in range(20):
        admit(view_a, a, f"burst-{i}")
    assert len(lease_writes(fake)) == before  # nothing on the admission path
    assert a.write() and not a.write()  # one write for the twenty; none while nothing is new
    assert [code for *_, code in lease_writes(fake)[before:]] == [201]
    lease = fake.get("leases", f"{NAMESPACE}/{record_name('webhook-0')}")
    assert lease["metadata"]["ownerReferences"] == [POD]  # goes with its Pod
    assert lease["spec"]["holderIdentity"] == "webhook-0"
    assert lease["metadata"]["labels"]["topology.scheduler/record"] == "decisions"


def test_a_restarted_replica_takes_its_decisions_back_and_writes_on_in_the_same_record(fake, pair):
    (view_a, a), (_, b) = pair
    admit(view_a, a, "before")
    assert a.write()
    again = records_of(fake, "webhook-0", POD)
    again.read_own()
    assert [entry.name for entry in again.decisions.own()] == ["before"]
    admit(view_a, again, "after")
    assert again.write()
    assert [code for *_, code in lease_writes(fake)] == [201, 200]  # the same Lease, replaced at its version
    eventually(lambda: [name for name, _ in listed(b)] == ["after", "before"], timeout=10,
               what="the other replica seeing the restarted one's record")


def test_a_record_that_cannot_be_read_is_left_out_with_a_warning_and_the_rest_listed(fake, pair, caplog):
    (view_a, a), (_, b) = pair
    admit(view_a, a, "fine")
    assert a.write()
    fake.put("leases", {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {
        "name": record_name("webhook-9"), "namespace": NAMESPACE, "labels": {"topology.scheduler/record": "decisions"},
        "annotations": {RECORD_ANNOTATION: "edited by hand"}}, "spec": {"holderIdentity": "webhook-9"}})
    with caplog.at_level(logging.WARNING):
        eventually(lambda: "not a decisions record" in caplog.text, timeout=10, what="the warning")
    eventually(lambda: listed(b) == [("fine", "webhook-0")], timeout=10, what="the readable record listed")


def test_a_write_the_api_refuses_is_tried_again_at_the_next_turn(fake, pair, caplog):
    (view_a, a), _ = pair
    admit(view_a, a, "late")
    fake.refuse_writes = True
    with caplog.at_level(logging.WARNING):
        assert not a.write()
    assert "cannot write Lease" in caplog.text
    fake.refuse_writes = False
    assert a.write()
