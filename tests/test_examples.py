"""The manifests in examples/ as a platform team's CI would run them: each placed on the demo
cluster, and every object we emit valid against its CRD schema (or the official Kubernetes
schema for built-in kinds)."""
from __future__ import annotations

import gzip
import json
import pathlib

import jsonschema
import pytest
import yaml
from conftest import assert_valid_kubernetes_object, review_of
from test_groups import LEAF_OF, admit, lws_pods
from test_idempotence_properties import allowed_nodes

from webhook.kube import demo
from webhook.objects.admission import review
from webhook.cli import file_index
from webhook.core.config import Config
from webhook.objects.workload import pod_templates

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRDS = pathlib.Path(__file__).parent / "fixtures" / "crds"


def example(name: str) -> dict:
    return yaml.safe_load((ROOT / "examples" / name).read_text())


def assert_valid(obj: dict) -> None:
    """Against the operator's CRD schema, or the official Kubernetes schema for built-in kinds;
    a PyTorchJob (no CRD schema published with a version we pin) is checked template by template."""
    group, _, version = obj["apiVersion"].rpartition("/")
    schema_file = CRDS / f"{group}_{version}_{obj['kind']}.json.gz"
    if schema_file.exists():
        jsonschema.validate(obj, json.loads(gzip.decompress(schema_file.read_bytes())))
    elif not group or group in ("batch", "apps"):
        assert_valid_kubernetes_object(obj)
    else:
        for found in pod_templates(obj["kind"], obj):
            assert_valid_kubernetes_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                                            **{k: v for k, v in found.template.items() if k != "metadata"}})


def leaves(template: dict) -> set[str]:
    return {LEAF_OF[name] for name in allowed_nodes(template)}


@pytest.fixture
def demo_index():
    index, _ = file_index(Config(), demo.demo_cluster())
    return index


@pytest.mark.parametrize("name, pods", [("jobset.yaml", 8), ("pytorchjob.yaml", 4), ("mpijob.yaml", 2),
                                        ("raycluster.yaml", 4)])
def test_each_operator_example_is_placed_whole_in_one_leaf_and_stays_schema_valid(name, pods, demo_index):
    obj = example(name)
    assert_valid(obj)
    result = review(review_of(obj), demo_index, Config())
    assert result.outcome == "placed", result.warnings
    assert result.decision.request.pods == pods
    assert_valid(result.admitted)
    templates = pod_templates(obj["kind"], result.admitted)
    found = {frozenset(leaves(t.template)) for t in templates}
    assert len(found) == 1 and len(next(iter(found))) == 1, found  # every template, GPU-less ones too
    # re-applying the webhook to its own output changes nothing
    again = review(review_of(result.admitted), demo_index, Config())
    assert not again.patch


def test_the_leaderworkerset_example_places_each_group_in_one_leaf(demo_index):
    obj = example("leaderworkerset.yaml")
    assert_valid(obj)
    assert review(review_of(obj), demo_index, Config()).outcome == "ignored"  # placed per group, at its pods
    size = obj["spec"]["leaderWorkerTemplate"]["size"]
    for group in range(obj["spec"]["replicas"]):
        members = [admit(pod, demo_index).admitted for pod in lws_pods(obj["metadata"]["name"], group, size)]
        found = {frozenset(leaves(pod)) for pod in members}
        assert len(found) == 1 and len(next(iter(found))) == 1
        for pod in members:
            assert_valid_kubernetes_object(pod)


def test_the_nodepool_example_steers_a_job_larger_than_the_cluster_to_nodes_the_pool_adds():
    nodepool, job = yaml.safe_load_all((ROOT / "examples" / "karpenter-nodepool.yaml").read_text())
    assert_valid(nodepool)
    nodes, pods = demo.demo_cluster()
    index, _ = file_index(Config(), ([*nodes, nodepool], pods))
    result = review(review_of(job), index, Config())
    assert result.outcome == "waiting-for-growth", result.warnings
    assert any("NodePool gpu-h100 can add nodes of 8 GPUs" in w for w in result.warnings)
    assert_valid(result.admitted)
    (template,) = pod_templates("Job", result.admitted)
    terms = template.template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu-h100"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}]
