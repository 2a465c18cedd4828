"""Repair in place: a replacement pod whose pinned domain lost the capacity to ever hold it."""
from __future__ import annotations

import copy

from conftest import review_of
from fixtures.builders import workload

from tests.fixtures.shared import LEAF_OF, allowed_nodes, leaves_allowed
from webhook.admission import review
from webhook.cli import file_index
from webhook.kube import demo
from webhook.objects import feed
from webhook.serving.app import create_app
from webhook.serving.metrics import Metrics
from webhook.settings.config import Config
from webhook.state.index import NodeGone

SPINE_OF = {node["metadata"]["name"]: node["metadata"]["labels"]["topology.scheduler/spine"]
            for node in demo.leaf_spine_nodes()}


def pod_of(job: dict, i: int) -> dict:
    """Pod i as the Job controller makes it from the (placed) template."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = {**template.get("metadata", {}), "name": f"{job['metadata']['name']}-{i}", "namespace": "ml",
            "uid": f"uid-train-{i}",
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job["metadata"]["name"],
                                 "uid": "uid-job", "controller": True}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def bound(pod: dict, node: str) -> dict:
    return {**pod, "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": "Running"}}


def running_job_that_lost_a_node(annotations: dict):
    """A 4 x 8 GPU Job placed in an idle leaf, three pods running, the fourth's node deleted."""
    index, _ = file_index(Config(), demo.demo_cluster())
    job = review(review_of(workload("Job", replicas=4, template_annotations=annotations)), index, Config()).admitted
    nodes = sorted(allowed_nodes(job["spec"]["template"]))
    assert len(nodes) == 4 and len({LEAF_OF[n] for n in nodes}) == 1
    for i, node in enumerate(nodes[:3]):
        assert review(review_of(pod_of(job, i)), index, Config()).outcome == "ignored"
        feed.upsert(index, bound(pod_of(job, i), node), "Pod")
    waiting = review(review_of(pod_of(job, 3)), index, Config())
    assert waiting.outcome == "ignored" and not waiting.patch  # its node is there: it waits as placed
    index.apply(NodeGone(nodes[3]))
    return index, job, nodes


def test_a_replacement_pod_whose_leaf_lost_its_node_is_pinned_alone_to_the_nearest_leaf_with_room():
    index, job, nodes = running_job_that_lost_a_node({"topology.scheduler/placement-strategy": "consolidated"})
    result = review(review_of(pod_of(job, 4)), index, Config())
    assert result.outcome == "repaired"
    old_leaf = LEAF_OF[nodes[0]]
    allowed = allowed_nodes(result.admitted)
    assert allowed and old_leaf not in leaves_allowed(result.admitted)
    assert {SPINE_OF[n] for n in allowed} == {SPINE_OF[nodes[0]]}  # nearest by topology: the same spine
    assert any("can no longer hold it" in w and "nearest domain with room" in w for w in result.warnings)
    # the three running pods are where they were, counted on their nodes
    assert all(f"uid-train-{i}" in index.nodes[node].pods for i, node in enumerate(nodes[:3]))


def test_a_repair_is_counted_and_answered_through_the_app():
    index, job, _ = running_job_that_lost_a_node({"topology.scheduler/placement-strategy": "consolidated"})
    metrics = Metrics.create()
    client = create_app(Config(), index, lambda: (True, ""), metrics).test_client()
    answer = client.post("/mutate", json=review_of(pod_of(job, 4)))
    assert answer.status_code == 200 and answer.json["response"]["allowed"] and answer.json["response"]["patch"]
    assert 'outcome="repaired"' in metrics.render()[0].decode()


def test_with_max_domain_leaf_the_replacement_waits_in_its_leaf_instead():
    index, job, nodes = running_job_that_lost_a_node({"topology.scheduler/placement-strategy": "consolidated",
                                                       "topology.scheduler/max-domain": "leaf"})
    result = review(review_of(pod_of(job, 4)), index, Config())
    assert result.outcome == "ignored" and not result.patch
    assert leaves_allowed(result.admitted) == {LEAF_OF[nodes[0]]}
    assert any("max-domain leaf keeps it there" in w for w in result.warnings)


def test_a_leaf_with_room_keeps_the_pod_busy_or_not_and_cordoned_nodes_are_no_room():
    index, _ = file_index(Config(), demo.demo_cluster())
    job = review(review_of(workload("Job", replicas=2, template_annotations={
        "topology.scheduler/placement-strategy": "consolidated"})), index, Config()).admitted
    nodes = sorted(allowed_nodes(job["spec"]["template"]))
    feed.upsert(index, bound(pod_of(job, 0), nodes[0]), "Pod")
    result = review(review_of(pod_of(job, 1)), index, Config())
    assert result.outcome == "ignored" and not result.patch  # nodes[1] can hold it: it waits there
    # every other node of the leaf cordoned (out of service, as a deleted one): no room left
    for node in demo.leaf_spine_nodes():
        if LEAF_OF[node["metadata"]["name"]] == LEAF_OF[nodes[0]] and node["metadata"]["name"] != nodes[0]:
            feed.upsert(index, {**node, "spec": {"unschedulable": True}}, "Node")
    assert review(review_of(pod_of(job, 1)), index, Config()).outcome == "repaired"


class CountingNodes(dict):
    """The index's nodes by name, counting the ones read."""

    reads = 0

    def get(self, name, default=None):
        self.reads += 1
        return super().get(name, default)


def test_the_repair_check_reads_nodes_only_until_one_has_room_and_counts_the_workloads_own_pods():
    index, _ = file_index(Config(), (demo.leaf_spine_nodes(spines=1, leaves=1, nodes=1000), []))
    leaf = [{"key": "topology.scheduler/leaf", "operator": "In", "values": ["leaf-1"]}]
    nodes = CountingNodes(index.tree.nodes)
    assert index.filters.has_room_ever(nodes, leaf, 8, lambda node: 0)
    assert nodes.reads == 1  # a pod of a 1,000-pod burst into this leaf reads one node, not 1,000
    last = sorted(nodes)[-1]
    assert index.filters.has_room_ever(nodes, leaf, 8, lambda node: 0 if node.name == last else 1)
    assert not index.filters.has_room_ever(nodes, leaf, 8, lambda node: 1)  # its own pods keep a GPU on each
    assert index.filters.has_room_ever(nodes, leaf, 7, lambda node: 1)
    assert not index.filters.has_room_ever(nodes, [{**leaf[0], "values": ["leaf-2"]}], 1, lambda node: 0)
