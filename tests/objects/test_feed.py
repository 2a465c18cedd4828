"""The feed, as a table: an object in YAML as the API (or `kubectl get -o yaml`) gives it, in; the
fact the index applies, out. What the index does with facts is tests/state/test_index.py's."""
from __future__ import annotations

import pytest
import yaml

from webhook.core.injection import GPU_IDS, HOLD_SEAL, RESERVATION, WAITING_FOR, seal_hold
from webhook.objects import feed
from webhook.settings.config import Config
from webhook.state.devices import DraFact
from webhook.state.dra import GPU_DRIVER, ClaimRefs, SliceFacts
from webhook.state.growth import GrowthFact
from webhook.state.index import NodeGone
from webhook.state.pods import PodFacts, PodGone
from webhook.state.members import NodeInfo

CONFIG = Config()

NODE = """
kind: Node
metadata:
  name: n1
  labels: {topology.scheduler/leaf: leaf-1, nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3,
           topology.scheduler/network-bandwidth: 400Gb}
  annotations: {topology.scheduler/nvlink-domains: "0-3,4-7"}
spec:
  taints:
  - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
  - {key: example.com/soft, effect: PreferNoSchedule}
status:
  allocatable: {nvidia.com/gpu: "8", cpu: "96", memory: 1Ti, pods: "110"}
  conditions: [{type: Ready, status: "True"}]
"""

NODES = [  # (why, the YAML, what the NodeInfo says)
    ("GPUs, NVLink domains, bandwidth, blocking taints and other allocatable", NODE,
     dict(name="n1", gpus=8, out="", nvlink_domains=((0, 1, 2, 3), (4, 5, 6, 7)), bandwidth_gbps=400.0,
          taints=(("nvidia.com/gpu", "present", "NoSchedule"),), other_allocatable={"cpu": 96000, "memory": 2**40,
                                                                                  "pods": 110})),
    ("cordoned", NODE.replace("spec:\n", "spec:\n  unschedulable: true\n"), dict(out="cordoned")),
    ("not ready", NODE.replace('status: "True"', 'status: "False"'), dict(out="NotReady")),
    ("a lifecycle taint makes it out of service, not a filter", NODE.replace(
        "example.com/soft, effect: PreferNoSchedule", "node.kubernetes.io/unreachable, effect: NoExecute"),
     dict(out="tainted node.kubernetes.io/unreachable", taints=(("nvidia.com/gpu", "present", "NoSchedule"),))),
    ("a malformed GPU count is no GPUs, not an error", NODE.replace('nvidia.com/gpu: "8"', "nvidia.com/gpu: eight"),
     dict(gpus=0)),
    ("no kind: a Node", NODE.replace("kind: Node\n", ""), dict(name="n1", gpus=8)),
]


@pytest.mark.parametrize("text, expected", [(text, expected) for _, text, expected in NODES],
                         ids=[why for why, _, _ in NODES])
def test_a_node_is_read_into_its_facts(text, expected):
    fact = feed.fact_of(yaml.safe_load(text), CONFIG)
    assert isinstance(fact, NodeInfo)
    assert {field: getattr(fact, field) for field in expected} == expected


POD = """
kind: Pod
metadata: {name: train-0, namespace: ml, uid: u-1}
spec:
  containers:
  - name: main
    resources:
      limits: {nvidia.com/gpu: "4"}
      requests: {cpu: "8", memory: 64Gi}
"""
BOUND = POD + "  nodeName: n1\nstatus: {phase: Running}\n"
PENDING = POD + "status: {phase: Pending}\n"


def pod_with(text: str, annotations: dict[str, str] | None = None, **metadata: object) -> dict:
    obj = yaml.safe_load(text)
    obj["metadata"].update(metadata, annotations=annotations or {})
    return obj


AFFINITY_TO_N2 = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}]}}}


def pending_single_placement(seal: str | None = None) -> dict:
    """A pod we placed alone on n2, with our seal over its hold (or the one given)."""
    sealed = seal_hold(CONFIG.seal_key, "ml/Pod/train-0", "0-3", "n2") if seal is None else seal
    obj = pod_with(PENDING, {RESERVATION: "ml/Pod/train-0", GPU_IDS: "0-3", HOLD_SEAL: sealed})
    obj["spec"]["affinity"] = AFFINITY_TO_N2
    return obj


PODS = [  # (why, the object, what the PodFacts say)
    ("bound: its node, GPUs and every other request", pod_with(BOUND, {RESERVATION: "ml/Job/train"}),
     dict(key="u-1", namespace="ml", node_name="n1", finished=False, gpus=4,
          requests=(("cpu", 8000), ("memory", 64 * 2**30), ("pods", 1)), reservation="ml/Job/train", waiting_for=None,
          held=None, gate=None, claims=ClaimRefs())),
    ("finished", pod_with(BOUND.replace("Running", "Succeeded")), dict(finished=True, requests=())),
    ("being deleted", pod_with(BOUND, deletionTimestamp="2026-11-26T00:00:00Z"), dict(terminating=True)),
    ("pending in a pinned wait", pod_with(PENDING, {WAITING_FOR: "topology.scheduler/leaf=leaf-2"}),
     dict(node_name=None, requests=(), waiting_for=(("topology.scheduler/leaf", "leaf-2"),))),
    ("pending, placed alone on one node: it holds its GPU set there", pending_single_placement(),
     dict(held=("ml/Pod/train-0", "n2", (0, 1, 2, 3)))),
    ("a hint the API never sees as ours holds nothing", pod_with(PENDING, {GPU_IDS: "0-3"}), dict(held=None)),
    ("our annotations copied without our seal hold nothing", pending_single_placement(seal="forged"),
     dict(held=None)),
    ("nor do they sealed for another node", {**pending_single_placement(), "spec": {
        **pending_single_placement()["spec"], "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n3"]}]}]}}}}}, dict(held=None)),
    ("its GPUs came through a claim the scheduler made", {**pod_with(BOUND), "status": {
        "phase": "Running", "extendedResourceClaimStatus": {"resourceClaimName": "train-0-gpu"}}},
     dict(covered_by_claim=True)),
    ("its resource claims and PodGroup", {**pod_with(BOUND), "spec": {
        **pod_with(BOUND)["spec"], "schedulingGroup": {"podGroupName": "g"},
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight"}]}},
     dict(claims=ClaimRefs((("gpus", "", "eight"),), "g"))),
    ("gated by us without our seal: refused, with why", {**pod_with(PENDING), "spec": {
        **pod_with(PENDING)["spec"], "schedulingGates": [{"name": "topology.scheduler/placement"}]}},
     dict(gate="it lacks one of topology.scheduler/reservation, topology.scheduler/gated-request, "
               "topology.scheduler/waiting-for, topology.scheduler/gate-seal")),
]


@pytest.mark.parametrize("obj, expected", [(obj, expected) for _, obj, expected in PODS], ids=[why for why, _, _ in PODS])
def test_a_pod_is_read_into_its_facts(obj, expected):
    fact = feed.fact_of(obj, CONFIG)
    assert isinstance(fact, PodFacts) and fact.obj is obj
    assert {field: getattr(fact, field) for field in expected} == expected


SLICE = """
kind: ResourceSlice
metadata: {name: n1-gpu}
spec:
  driver: gpu.nvidia.com
  nodeName: n1
  pool: {name: n1, generation: 2, resourceSliceCount: 1}
  devices:
  - {name: gpu-10, attributes: {type: {string: gpu}}}
  - {name: gpu-2, attributes: {type: {string: gpu}}}
  - {name: gpu-2-mig-1g, attributes: {type: {string: mig}}}
"""

OTHERS = [  # (why, the YAML, the kind a list names or None, the fact)
    ("a ResourceSlice: its whole GPUs, in device-number order", SLICE, None,
     DraFact("ResourceSlice", "n1-gpu", SliceFacts((GPU_DRIVER, "n1"), 2, 1, (("n1", ("gpu-2", "gpu-10")),)))),
    ("another driver's slice holds no GPU of ours", SLICE.replace("driver: gpu.nvidia.com", "driver: x.example.com"),
     None, DraFact("ResourceSlice", "n1-gpu", None)),
    ("a list item carries no kind: the list names it", SLICE.replace("kind: ResourceSlice\n", ""), "ResourceSlice",
     DraFact("ResourceSlice", "n1-gpu", SliceFacts((GPU_DRIVER, "n1"), 2, 1, (("n1", ("gpu-2", "gpu-10")),)))),
    ("a DeviceClass that maps nvidia.com/gpu", "kind: DeviceClass\nmetadata: {name: gpus}\n"
     "spec: {extendedResourceName: nvidia.com/gpu}", None, DraFact("DeviceClass", "gpus", True)),
    ("a ComputeDomain names its channel template in its namespace",
     "kind: ComputeDomain\nmetadata: {name: cd, namespace: ml}\n"
     "spec: {channel: {resourceClaimTemplate: {name: cd-channel}}}", None,
     DraFact("ComputeDomain", "ml/cd", "ml/cd-channel")),
    ("cluster-autoscaler's status: its healthy groups' room",
     "kind: ConfigMap\nmetadata: {name: cluster-autoscaler-status, namespace: kube-system}\n"
     "data: {status: 'nodeGroups: [{name: gke-a-h100-x-grp, health: {status: Healthy, maxSize: 6, "
     "cloudProviderTarget: 2}}, {name: sick, health: {status: Unhealthy, maxSize: 9}}]'}", None,
     GrowthFact("ConfigMap/kube-system/cluster-autoscaler-status", (("gke-a-h100-x-grp", 4),))),
    ("another ConfigMap is none of ours", "kind: ConfigMap\nmetadata: {name: other, namespace: kube-system}", None,
     None),
    ("a kind the index does not read", "kind: Service\nmetadata: {name: s}", None, None),
]


@pytest.mark.parametrize("text, kind, expected", [row[1:] for row in OTHERS], ids=[row[0] for row in OTHERS])
def test_dra_and_autoscaler_objects_are_read_into_their_facts(text, kind, expected):
    assert feed.fact_of(yaml.safe_load(text), CONFIG, kind) == expected


def test_a_nodepool_is_read_into_its_pool_without_its_nodes():
    fact = feed.fact_of(yaml.safe_load("""
kind: NodePool
apiVersion: karpenter.sh/v1
metadata: {name: h100}
spec:
  weight: 10
  limits: {nvidia.com/gpu: "64"}
  template:
    spec:
      requirements:
      - {key: node.kubernetes.io/instance-type, operator: In, values: [p5.48xlarge]}
      - {key: topology.kubernetes.io/zone, operator: In, values: [us-east-1a, us-east-1b]}
status: {resources: {nvidia.com/gpu: "16"}}
"""), CONFIG)
    assert isinstance(fact, GrowthFact) and fact.key == "NodePool//h100" and not fact.gone
    pool = fact.facts
    assert (pool.gpus_per_node, pool.room_gpus, pool.weight, pool.members) == (8, 48, 10, frozenset())
    assert pool.choices["topology.kubernetes.io/zone"] == ("us-east-1a", "us-east-1b")


@pytest.mark.parametrize("obj, kind, expected", [
    ({"kind": "Node", "metadata": {"name": "n1"}}, None, NodeGone("n1")),
    ({"metadata": {"uid": "u-1", "namespace": "ml", "annotations": {RESERVATION: "ml/Pod/p"}}}, "Pod",
     PodGone("u-1", "ml", "ml/Pod/p")),
    ({"metadata": {"name": "t", "namespace": "ml"}}, "ResourceClaimTemplate", DraFact("ResourceClaimTemplate", "ml/t", None)),
    ({"metadata": {"name": "h100"}}, "NodePool", GrowthFact("NodePool//h100", None, gone=True)),
], ids=["a Node", "a Pod and the reservation it ends", "a DRA object", "a NodePool"])
def test_a_deletion_reads_only_what_names_the_object(obj, kind, expected):
    assert feed.gone_of(obj, kind) == expected
