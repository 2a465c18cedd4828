"""What hack/local-cluster makes before anything runs, checked without Go: its generated GPU nodes
(the demo's 32 exactly, or N in the demo's shape), KWOK's Lease period and Kueue's queue over them.
The e2e tests (tests/e2e/test_kwok.py, test_kueue.py) start them for real."""
from __future__ import annotations

import collections
import pathlib

import pytest
import yaml

from hack import cluster_nodes, kueue, kwok
from tests.fixtures.builders import valid

ROOT = pathlib.Path(__file__).resolve().parents[2]
LABELS = ("topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf")


def test_the_default_nodes_are_the_demos_32():
    demo = yaml.safe_load((ROOT / "tests" / "fixtures" / "demo-nodes.yaml").read_text())["items"]
    assert cluster_nodes.gpu_nodes() == demo


def test_n_nodes_fill_leaf_by_leaf_spine_by_spine_zone_by_zone():
    nodes = [valid(node) for node in cluster_nodes.gpu_nodes(70, (2, 2, 8))]
    assert len({n["metadata"]["name"] for n in nodes}) == 70
    per = {label: collections.Counter(n["metadata"]["labels"][label] for n in nodes) for label in LABELS}
    assert per["topology.kubernetes.io/zone"] == {"zone-a": 32, "zone-b": 32, "zone-c": 6}
    assert set(per["topology.scheduler/spine"].values()) == {16, 6}  # the last spine is partly filled
    assert list(per["topology.scheduler/leaf"].values()) == [8] * 8 + [6]
    last = nodes[-1]["metadata"]
    assert last["name"] == "gpu-s5-l9-n6" and last["labels"]["topology.scheduler/spine"] == "spine-5"
    assert all(n["status"]["allocatable"]["nvidia.com/gpu"] == "8" for n in nodes)


def test_nodes_for_kwok_wait_for_it_to_make_them_ready():
    conditions = {c["type"]: c["status"] for n in cluster_nodes.gpu_nodes(4, ready=False)
                  for c in n["status"]["conditions"]}
    assert conditions == {"Ready": "False"}  # KWOK's node-initialize stage selects nodes not Ready


@pytest.mark.parametrize("text", ["2/4", "2/4/0", "a/b/c", "2/4/4/4", "1001/1/1"])
def test_a_bad_shape_is_named(text):
    with pytest.raises(ValueError, match="expected SPINES/LEAVES/NODES"):
        cluster_nodes.parse_shape(text)


def test_zones_are_lettered_past_z():
    assert [cluster_nodes.zone_name(i) for i in (0, 25, 26, 27)] == ["zone-a", "zone-z", "zone-aa", "zone-ab"]


def test_node_leases_are_a_kubelets_until_renewing_them_would_outrun_the_machine():
    assert kwok.lease_seconds(32) == 40
    assert kwok.lease_seconds(10_000) == 400  # renewed every 100 s: 100 Leases a second


def test_kueues_queue_covers_the_nodes_allocatable():
    topology, flavor, queue, local = kueue.queue_objects(cluster_nodes.gpu_nodes(), strict_fifo=False)
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]] == [*LABELS, "kubernetes.io/hostname"]
    assert flavor["spec"] == {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                              "topologyName": topology["metadata"]["name"]}
    quota = {r["name"]: r["nominalQuota"] for r in queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"]}
    assert quota == {"nvidia.com/gpu": 256, "cpu": f"{32 * 96_000}m", "memory": 32 * 1900 * 2**30}
    assert queue["spec"]["queueingStrategy"] == "BestEffortFIFO"
    assert local == kueue.local_queue("default") and local["spec"]["clusterQueue"] == queue["metadata"]["name"]
    strict = kueue.queue_objects(cluster_nodes.gpu_nodes(), strict_fifo=True)[2]
    assert strict["spec"]["queueingStrategy"] == "StrictFIFO"
