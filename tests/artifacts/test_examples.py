"""The manifests in examples/ as a platform team's CI would run them: each placed on the demo
cluster, and every object we emit valid against its CRD schema (or the official Kubernetes
schema for built-in kinds)."""
from __future__ import annotations

import gzip
import json
import pathlib

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import assert_valid_kubernetes_object, review_of

from tests.fixtures.shared import LEAF_OF, admit, allowed_nodes, lws_pods
from webhook.objects.kinds import BY_KEY, kind_of_object
from webhook.objects import feed
from webhook.kube import demo
from webhook.admission import review
from webhook.cli import file_index, main
from webhook.settings.config import Config
from webhook.settings.presets import PRESETS
from webhook.state.dra import DRA_KINDS
from webhook.objects.templates import pod_templates

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRDS = pathlib.Path(__file__).parents[1] / "fixtures" / "crds"


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
        for found in pod_templates(kind_of_object(obj), obj):
            assert_valid_kubernetes_object({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                                            **{k: v for k, v in found.template.items() if k != "metadata"}})


def leaves(template: dict) -> set[str]:
    return {LEAF_OF[name] for name in allowed_nodes(template)}


@pytest.fixture
def demo_index():
    index, _ = file_index(Config(), demo.demo_cluster())
    return index


@pytest.mark.parametrize("name, pods", [("jobset.yaml", 8), ("pytorchjob.yaml", 4), ("mpijob.yaml", 2),
                                        ("raycluster.yaml", 4), ("training-job.yaml", 4)])
def test_each_operator_example_is_placed_whole_in_one_leaf_and_stays_schema_valid(name, pods, demo_index):
    obj = example(name)
    assert_valid(obj)
    result = review(review_of(obj), demo_index, Config())
    assert result.outcome == "placed", result.warnings
    assert result.decision.request.pods == pods
    assert_valid(result.admitted)
    templates = pod_templates(kind_of_object(obj), result.admitted)
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
    (template,) = pod_templates(BY_KEY["Job"], result.admitted)
    terms = template.template["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [{"matchExpressions": [
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu-h100"]},
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1a"]}]}]


# ----- Dynamic Resource Allocation and PodGroups: placed on the DRA demo cluster, valid for 1.37 ------

DRA_SCHEMA_VERSION = "1.37.0"


def valid_137(obj: dict) -> dict:
    kubernetes_validate.validate(obj, DRA_SCHEMA_VERSION, strict=True)
    return obj


def documents(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((ROOT / "examples" / name).read_text()) if doc]


@pytest.fixture
def dra_index():
    index, _ = file_index(Config(), demo.dra_demo_cluster())
    return index


def admit_all(docs: list[dict], index, config: Config = Config()) -> list:
    """Each object reviewed at its CREATE, in order, and fed to the index as `mutate -f` does."""
    results = []
    for doc in docs:
        result = review(review_of(doc), index, config)
        results.append(result)
        if doc["kind"] in DRA_KINDS:
            feed.upsert(index, result.admitted)
    return results


def test_the_dra_cluster_snapshot_is_valid_and_its_gpus_are_counted_from_slices_and_claims(tmp_path, capsys):
    snapshot = example("dra-cluster.yaml")
    for obj in snapshot["items"]:
        valid_137(obj)
    index, _ = file_index(Config(), (snapshot["items"], []))
    assert index.stats().gpus_total == 32 and index.nodes["gpu-s1-l1-n1"].free == 6
    assert main(["mutate", "--nodes", str(ROOT / "examples" / "dra-cluster.yaml"),
                 "-f", str(ROOT / "examples" / "dra-job.yaml")]) == 0
    template, job = yaml.safe_load_all(capsys.readouterr().out)
    valid_137(template), valid_137(job)


def test_the_dra_job_example_is_placed_in_one_free_leaf_with_its_claims_as_written(dra_index):
    template, job = documents("dra-job.yaml")
    results = admit_all([template, job], dra_index)
    assert results[0].outcome == "ignored" and results[1].outcome == "placed"
    admitted = valid_137(results[1].admitted)
    assert admitted["spec"]["template"]["spec"]["resourceClaims"] == job["spec"]["template"]["spec"]["resourceClaims"]
    assert results[1].decision.request.pods == 4 and results[1].decision.request.gpus_per_pod == 8
    found = {LEAF_OF[name] for name in results[1].decision.nodes}
    assert found in ({"leaf-3"}, {"leaf-7"})


def test_the_podgroup_example_gets_the_leaf_key_and_its_four_ranks_one_leaf(dra_index):
    group, rank = documents("podgroup-job.yaml")
    results = admit_all([group, *(rank_pod(rank, i) for i in range(4))], dra_index)
    assert valid_137(results[0].admitted)["spec"]["schedulingConstraints"] == {
        "topology": [{"key": "topology.scheduler/leaf"}]}
    pods = [valid_137(r.admitted) for r in results[1:]]
    assert {r.outcome for r in results[1:]} == {"placed"} and results[1].decision.request.pods == 4
    assert len({json.dumps(p["spec"]["affinity"], sort_keys=True) for p in pods}) == 1
    assert {LEAF_OF[name] for name in results[1].decision.nodes} in ({"leaf-3"}, {"leaf-7"})


def rank_pod(pod: dict, rank: int) -> dict:
    out = json.loads(json.dumps(pod))
    out["metadata"]["name"] = f"bert-rank-{rank}"
    return out


def test_the_gb200_example_keeps_the_whole_job_in_one_nvlink_domain():
    config = Config(levels=PRESETS["nvl72"])
    index, _ = file_index(config, (demo.gb200_dra_cluster(), []))
    compute_domain, template, job = documents("gb200-computedomain.yaml")
    assert compute_domain["spec"]["channel"]["resourceClaimTemplate"]["name"] == "imex-channel"
    results = admit_all([compute_domain, template, job], index, config)
    placed = results[2]
    assert placed.outcome == "placed", placed.warnings
    valid_137(template), valid_137(placed.admitted)
    assert placed.decision.request.gpus_per_pod == 4 and placed.decision.request.pods == 16
    cliques = {index.nodes[name].labels["nvidia.com/gpu.clique"] for name in placed.decision.nodes}
    assert len(cliques) == 1
    too_big = json.loads(json.dumps(job))
    too_big["metadata"]["name"] = "too-big"
    too_big["spec"]["parallelism"] = too_big["spec"]["completions"] = 19  # 76 GPUs: more than one NVL72 holds
    denied = review(review_of(too_big), index, config)
    assert denied.outcome == "denied" and "inside one clique" in denied.review["response"]["status"]["message"]
