"""GPUs through Dynamic Resource Allocation: nodes whose GPUs are ResourceSlice devices (no
nvidia.com/gpu in allocatable), GPUs in use allocated in ResourceClaims, and the same decisions
as under the device plugin."""
from __future__ import annotations

import copy
import logging

import kubernetes_validate
import pytest
import yaml
from conftest import eventually, review_of

from tests.fixtures.shared import samples
from webhook.objects.feed import index_of
from webhook.objects import feed
from webhook.cli import main
from webhook.state.index import ClusterIndex
from webhook.settings.config import Config
from webhook.settings.presets import PRESETS
from webhook.core.model import Outcome
from webhook.kube import demo
from webhook.admission import review
from tests.fixtures.builders import gpu_job

LEAF = "topology.scheduler/leaf"
FREE_LEAVES = {"leaf-3", "leaf-7"}  # the demo's leaves with four wholly free nodes


def valid_137(obj: dict) -> dict:
    kubernetes_validate.validate(obj, "1.37.0", strict=True)
    return obj


def valid_136(obj: dict) -> dict:
    """Valid for Kubernetes 1.36, the only release serving scheduling.k8s.io/v1alpha2 (1.37 removed it)."""
    kubernetes_validate.validate(obj, "1.36.0", strict=True)
    return obj


VALID_FOR = {"v1beta1": valid_137, "v1alpha2": valid_136}  # by the scheduling.k8s.io version


def leaf_of(index: ClusterIndex, node: str) -> str:
    return index.nodes[node].labels[LEAF]


def placed_leaves(index: ClusterIndex, job: dict) -> set[str]:
    result = review(review_of(job), index, Config())
    assert result.outcome == "placed", result.warnings
    valid_137(result.admitted)
    return {leaf_of(index, a.node) for a in result.decision.assignment}


@pytest.fixture
def dra_cluster():
    return demo.dra_demo_cluster()


def test_the_dra_demo_cluster_is_valid_for_kubernetes_137_and_publishes_no_gpu_allocatable(dra_cluster):
    nodes, claims = dra_cluster
    for obj in nodes + claims:
        valid_137(obj)
    assert not any("nvidia.com/gpu" in n["status"]["allocatable"] for n in nodes if n["kind"] == "Node")


def test_a_dra_only_cluster_counts_slices_and_claims_as_the_device_plugin_cluster_counts_allocatable_and_pods(
        dra_cluster):
    dra_index = index_of(Config(), *dra_cluster)
    plugin_index = index_of(Config(), *demo.demo_cluster())
    assert dra_index.stats() == plugin_index.stats()
    assert {n: (s.gpus, s.free) for n, s in dra_index.nodes.items()} == \
        {n: (s.gpus, s.free) for n, s in plugin_index.nodes.items()}


def test_on_a_dra_only_cluster_a_4x8_consolidated_job_goes_to_a_leaf_of_four_wholly_free_nodes(dra_cluster):
    index = index_of(Config(), *dra_cluster)
    leaves = placed_leaves(index, gpu_job("train", 4, 8, placement_strategy="consolidated"))
    assert len(leaves) == 1 and leaves <= FREE_LEAVES


def test_nodes_whose_devices_are_allocated_in_claims_are_not_counted_free(dra_cluster):
    nodes, claims = dra_cluster
    # one GPU of one node in each wholly free leaf is taken through a claim: no leaf has 4 free nodes
    taken = [demo.make_allocated_claim(f"taken-{leaf}", node, ["gpu-5"], namespace="other")
             for leaf, node in (("3", "gpu-s1-l3-n2"), ("7", "gpu-s2-l7-n4"))]
    index = index_of(Config(), nodes, claims + taken)
    assert index.nodes["gpu-s1-l3-n2"].free == 7
    in_a_leaf = gpu_job("train", 4, 8, placement_strategy="consolidated", max_domain="leaf")
    assert review(review_of(in_a_leaf), index, Config()).decision.outcome is Outcome.WAIT
    spanning = review(review_of(gpu_job("spans", 4, 8, placement_strategy="consolidated")), index, Config())
    assert not {"gpu-s1-l3-n2", "gpu-s2-l7-n4"} & set(spanning.decision.nodes)
    index.release("ml/Job/spans")
    feed.delete(index, taken[0])  # the claim is gone: its node is wholly free again
    assert index.nodes["gpu-s1-l3-n2"].free == 8
    assert placed_leaves(index, gpu_job("train2", 4, 8, placement_strategy="consolidated")) == {"leaf-3"}


def test_a_cluster_mixing_device_plugin_and_dra_nodes_counts_both(dra_cluster):
    plugin_nodes, pods = demo.demo_cluster()
    dra_objects, claims = dra_cluster
    spine_1 = {n["metadata"]["name"] for n in plugin_nodes
               if n["metadata"]["labels"]["topology.scheduler/spine"] == "spine-1"}
    mixed = ([n for n in plugin_nodes if n["metadata"]["name"] in spine_1]
             + [o for o in dra_objects if o["kind"] == "DeviceClass"
                or (o["metadata"]["name"] if o["kind"] == "Node" else o["spec"]["nodeName"]) not in spine_1]
             + [p for p in pods if p["spec"]["nodeName"] in spine_1]
             + [c for c in claims if "gpu-s2" in c["metadata"]["name"]])
    index = index_of(Config(), [o for o in mixed if o["kind"] != "Pod"],
                                      [o for o in mixed if o["kind"] == "Pod"])
    plugin_index = index_of(Config(), plugin_nodes, pods)
    assert index.stats() == plugin_index.stats()
    assert index.nodes["gpu-s1-l1-n2"].info.devices == () and index.nodes["gpu-s2-l5-n2"].gpus == 8
    first = placed_leaves(index, gpu_job("first", 4, 8, placement_strategy="consolidated"))
    second = placed_leaves(index, gpu_job("second", 4, 8, placement_strategy="consolidated"))
    assert first | second == FREE_LEAVES  # one leaf of device-plugin nodes, one of DRA nodes
    assert not index.inventory_warnings()


def test_a_node_with_allocatable_gpus_and_slices_is_counted_once_with_a_warning():
    node = demo.make_node("both", {LEAF: "leaf-1"}, gpus=8)
    index = index_of(Config(), [node, demo.make_resource_slice("both", gpus=8)])
    assert index.nodes["both"].gpus == 8
    assert index.inventory_warnings() == [
        "node both has allocatable nvidia.com/gpu and GPU devices in ResourceSlices; its GPUs are counted once, "
        "from allocatable"]


def scheduler_made(pod: dict, node: str, devices: list[str]) -> tuple[dict, dict]:
    """A running pod asking nvidia.com/gpu on a DRA node and the claim the scheduler made for it."""
    pod = copy.deepcopy(pod)
    claim = demo.make_allocated_claim(f"{pod['metadata']['name']}-gpu-x7k2p", node, devices,
                                      namespace=pod["metadata"]["namespace"], owner_pod=pod, extended=True)
    pod["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": claim["metadata"]["name"],
        "requestMappings": [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "gpu"}]}
    return pod, claim


@pytest.mark.parametrize("order", ["claim first", "pod first"])
@pytest.mark.parametrize("pod_status", ["names its claim", "stripped"])
def test_a_running_pods_extended_resource_request_and_its_scheduler_made_claim_are_counted_once(order, pod_status):
    node = demo.make_node("n1", {LEAF: "leaf-1"}, dra=True)
    pod, claim = scheduler_made(demo.make_pod("trainer", "n1", 4, namespace="ml"), "n1",
                                ["gpu-0", "gpu-1", "gpu-2", "gpu-3"])
    if pod_status == "stripped":  # a snapshot without the pod's status: the claim's owner says it
        pod["status"] = {"phase": "Running"}
    valid_137(pod), valid_137(claim)
    index = index_of(Config(), [node, demo.make_resource_slice("n1")])
    for obj in ([claim, pod] if order == "claim first" else [pod, claim]):
        feed.upsert(index, obj)
    assert index.nodes["n1"].free == 4
    assert index.nodes["n1"].taken_ids == {0, 1, 2, 3}
    feed.delete(index, pod)
    feed.delete(index, claim)
    assert index.nodes["n1"].free == 8


def test_only_the_newest_generation_of_a_pool_counts_and_an_incomplete_pool_counts_none():
    node = demo.make_node("n1", {LEAF: "leaf-1"}, dra=True)
    old = demo.make_resource_slice("n1", gpus=8, generation=1)
    index = index_of(Config(), [node, old])
    assert index.nodes["n1"].gpus == 8
    feed.upsert(index, demo.make_resource_slice("n1", gpus=4, generation=2))
    assert index.nodes["n1"].gpus == 4  # generation 1 is stale once generation 2 is seen
    half = demo.make_resource_slice("n1", generation=3, slice_count=2, devices=["gpu-0", "gpu-1"])
    feed.upsert(index, half)
    assert index.nodes["n1"].gpus == 0
    assert index.inventory_warnings() == [
        "ResourceSlice pool n1 of gpu.nvidia.com has 1 of its 2 slices at generation 3: its GPUs are unknown "
        "until the rest arrive, so none are counted"]
    rest = demo.make_resource_slice("n1", generation=3, slice_count=2, devices=["gpu-2", "gpu-3", "gpu-10"])
    feed.upsert(index, rest)
    assert index.nodes["n1"].gpus == 5 and not index.inventory_warnings()
    assert index.nodes["n1"].info.devices == (("n1", ("gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-10")),)
    for obj in (old, half, rest, demo.make_resource_slice("n1", gpus=4, generation=2)):
        feed.delete(index, obj)
    assert index.nodes["n1"].gpus == 0 and index.stats().gpus_total == 0


def test_mig_devices_are_not_gpus_and_an_allocated_one_takes_its_parent_gpu():
    node = demo.make_node("n1", {LEAF: "leaf-1"}, dra=True)
    published = demo.make_resource_slice("n1", gpus=2)
    published["spec"]["devices"].append({"name": "gpu-1-mig-1g10gb-0-0", "attributes": {
        "type": {"string": "mig"}, "profile": {"string": "1g.10gb"}}})
    valid_137(published)
    claim = demo.make_allocated_claim("mig", "n1", ["gpu-1-mig-1g10gb-0-0"])
    index = index_of(Config(), [node, published], [claim])
    assert index.nodes["n1"].gpus == 2 and index.nodes["n1"].taken_ids == {1}


def test_claims_of_other_drivers_and_unallocated_claims_take_no_gpu():
    node = demo.make_node("n1", {LEAF: "leaf-1"}, dra=True)
    nic = demo.make_allocated_claim("nic", "n1", ["nic-0"])
    nic["status"]["allocation"]["devices"]["results"][0]["driver"] = "rdma.example.com"
    pending = demo.make_allocated_claim("pending", "n1", ["gpu-0"])
    del pending["status"]
    index = index_of(Config(), [node, demo.make_resource_slice("n1")], [nic, pending])
    assert index.nodes["n1"].free == 8


# ----- the feed: files and the live view ------------------------------------------------------------

def test_mutate_reads_dra_kinds_mixed_into_the_nodes_and_pods_files(tmp_path, capsys, dra_cluster):
    nodes, claims = dra_cluster
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": claims}))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(gpu_job("train", 4, 8, placement_strategy="consolidated")))
    assert main(["mutate", "--nodes", str(tmp_path / "nodes.yaml"), "--pods", str(tmp_path / "pods.yaml"),
                 "-f", str(tmp_path / "job.yaml"), "--explain"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    terms = out["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    leaves = {v for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == LEAF
              for v in e["values"]}
    assert leaves and leaves <= FREE_LEAVES


def test_the_live_view_counts_slices_and_claims_and_follows_their_changes(fake, make_view):
    fake.serve_dra = True
    nodes, claims = demo.dra_demo_cluster()
    for obj in nodes:
        fake.put({"Node": "nodes", "ResourceSlice": "resourceslices", "DeviceClass": "deviceclasses"}[obj["kind"]], obj)
    for claim in claims:
        fake.put("resourceclaims", claim)
    fake.put("computedomains", {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                                "metadata": {"name": "train", "namespace": "ml"},
                                "spec": {"channel": {"resourceClaimTemplate": {"name": "train-channel"}}}})
    view = make_view(fake)
    view.start()
    assert view.wait_synced(10)
    eventually(lambda: view.index.stats() == index_of(Config(), nodes, claims).stats(),
               what="the DRA cluster counted")
    assert view.index.devices.inventory.template("ml/train-channel").channel  # known from its ComputeDomain
    fake.delete("resourceclaims", "research/busy-gpu-s1-l1-n1-gpu")
    eventually(lambda: view.index.nodes["gpu-s1-l1-n1"].free == 8, what="the freed node")
    fake.delete("computedomains", "ml/train")
    eventually(lambda: view.index.devices.inventory.template("ml/train-channel") is None, what="the channel forgotten")
    assert view.readiness() == (True, "cluster view in sync")


def test_the_live_view_is_ready_when_the_api_serves_no_dra(fake, make_view):
    for node in demo.leaf_spine_nodes(1, 1, 2):
        fake.put_node(node)
    view = make_view(fake)
    view.start()
    assert view.wait_synced(10)
    assert view.readiness()[0]
    assert {s.kind for s in view.status() if s.synced} >= {"resourceslices", "resourceclaims", "podgroups"}


# ----- demand: GPUs asked through resourceClaims ------------------------------------------------------

def claim_template(name: str = "eight-gpus", namespace: str = "ml", **request) -> dict:
    """A ResourceClaimTemplate with one request `gpu` (ExactCount 8 of gpu.nvidia.com unless given)."""
    exactly = request or {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 8}
    body = {"firstAvailable": request["firstAvailable"]} if "firstAvailable" in request else {"exactly": exactly}
    return valid_137({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                      "metadata": {"name": name, "namespace": namespace},
                      "spec": {"spec": {"devices": {"requests": [{"name": "gpu", **body}]}}}})


def with_claims(job: dict, *claims: dict) -> dict:
    """The job with its pods' GPUs asked through `claims` (resourceClaims entries) instead of limits."""
    spec = job["spec"]["template"]["spec"] if job["kind"] == "Job" else job["spec"]
    spec["resourceClaims"] = list(claims)
    for container in spec["containers"]:
        container["resources"] = {"claims": [{"name": c["name"]} for c in claims]}
    return job


def gpu_claim_job(name: str = "train", pods: int = 4, template: str = "eight-gpus", **annotations) -> dict:
    annotations.setdefault("placement_strategy", "balanced")
    return with_claims(gpu_job(name, pods, 8, **annotations), {"name": "gpus", "resourceClaimTemplateName": template})


@pytest.fixture
def dra_index(dra_cluster):
    nodes, claims = dra_cluster
    return index_of(Config(), nodes, [*claims, claim_template()])


def test_a_job_asking_8_gpus_per_pod_through_a_claim_template_is_placed_like_one_asking_nvidia_gpu_8(dra_cluster):
    nodes, claims = dra_cluster
    by_claims = index_of(Config(), nodes, [*claims, claim_template()])
    by_limits = index_of(Config(), nodes, claims)
    for job_of in (lambda name: gpu_job(name, 4, 8, placement_strategy="consolidated"),
                   lambda name: gpu_job(name, 2, 8, placement_strategy="balanced"),
                   lambda name: gpu_job(name, 3, 8, placement_strategy="distributed")):
        limits = review(review_of(job_of("a")), by_limits, Config())
        job = with_claims(job_of("a"), {"name": "gpus", "resourceClaimTemplateName": "eight-gpus"})
        written = copy.deepcopy(job["spec"]["template"]["spec"]["resourceClaims"])
        claimed = review(review_of(job), by_claims, Config())
        assert claimed.outcome == limits.outcome == "placed"
        assert claimed.decision.request.total_gpus == limits.decision.request.total_gpus
        assert claimed.decision.nodes == limits.decision.nodes and claimed.decision.scope == limits.decision.scope
        admitted = valid_137(claimed.admitted)
        assert admitted["spec"]["template"]["spec"]["resourceClaims"] == written  # left as written
        def placement(obj: dict) -> dict:  # what the webhook writes: the template but for how GPUs are asked
            spec = {k: v for k, v in obj["spec"]["template"]["spec"].items() if k not in ("containers", "resourceClaims")}
            return {"metadata": obj["spec"]["template"]["metadata"], "spec": spec}
        assert placement(admitted) == placement(limits.admitted)
        for index in (by_claims, by_limits):
            index.release("ml/Job/a")


def test_a_claim_template_not_known_at_admission_is_admitted_unchanged_with_a_warning_naming_it(dra_index):
    result = review(review_of(gpu_claim_job(template="later", placement_strategy="consolidated")), dra_index, Config())
    assert result.outcome == "demand-unknown" and not result.patch
    assert result.warnings == ("Job ml/train: asks for devices through ResourceClaimTemplate ml/later, not known to "
                               "the webhook yet, so how many GPUs it needs is unknown and it is admitted without "
                               "placement (create the template before the workload)",)


def with_count(template: dict, count: object, first_available: bool = False) -> dict:
    """The template with its one request's count set to `count` (which the API may refuse)."""
    request = template["spec"]["spec"]["devices"]["requests"][0]
    (request["firstAvailable"][0] if first_available else request["exactly"])["count"] = count
    return template


@pytest.mark.parametrize("count", ["eight", "8", 0, -1, 2.5, True])
def test_a_template_whose_count_is_not_a_whole_number_from_1_denies_its_workload_naming_the_field(dra_index, count):
    feed.upsert(dra_index, with_count(claim_template("t"), count))
    result = review(review_of(gpu_claim_job(template="t")), dra_index, Config())
    assert result.outcome == "denied" and not result.patch
    assert result.review["response"]["status"]["message"] == (
        f"Job ml/train: asks for devices through ResourceClaimTemplate ml/t, whose "
        f"spec.spec.devices.requests[0].exactly.count {count!r} is not allowed; allowed: a whole number >= 1")


def test_a_first_available_count_that_is_not_a_number_denies_naming_its_path(dra_index):
    template = claim_template("t", firstAvailable=[{"name": "four", "deviceClassName": "gpu.nvidia.com", "count": 4}])
    feed.upsert(dra_index, with_count(template, "four", first_available=True))
    result = review(review_of(gpu_claim_job(pods=2, template="t")), dra_index, Config())
    assert result.outcome == "denied"
    assert "ResourceClaimTemplate ml/t, whose spec.spec.devices.requests[0].firstAvailable[0].count 'four' is not " \
        "allowed; allowed: a whole number >= 1" in result.review["response"]["status"]["message"]


def test_mutate_denies_a_workload_whose_template_in_the_same_file_has_a_count_that_is_not_a_number(
        tmp_path, capsys, dra_cluster):
    nodes, claims = dra_cluster
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    template = with_count(claim_template(), "eight")
    job = gpu_claim_job(placement_strategy="consolidated")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump_all([template, job]))
    assert main(["mutate", "--nodes", str(tmp_path / "nodes.yaml"), "-f", str(tmp_path / "job.yaml")]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "Error: Job ml/train denied: asks for devices through ResourceClaimTemplate ml/eight-gpus, whose "
        "spec.spec.devices.requests[0].exactly.count 'eight' is not allowed; allowed: a whole number >= 1"], err


@pytest.mark.parametrize("request_of, per_pod", [
    (dict(deviceClassName="gpu.nvidia.com", allocationMode="All"), 8),  # every GPU of one node
    (dict(deviceClassName="gpu.nvidia.com"), 1),  # count defaults to 1
    (dict(firstAvailable=[{"name": "four", "deviceClassName": "gpu.nvidia.com", "count": 4},
                          {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2}]), 4),
    (dict(deviceClassName="gpu.nvidia.com", count=2, adminAccess=True), 0),  # watches GPUs, takes none
    (dict(deviceClassName="mig.nvidia.com", count=2), 0),  # MIG devices are not whole GPUs
])
def test_gpus_per_pod_from_a_templates_request(dra_index, request_of, per_pod):
    feed.upsert(dra_index, claim_template("t", **request_of))
    result = review(review_of(gpu_claim_job(pods=2, template="t")), dra_index, Config())
    if per_pod:
        assert result.decision.request.gpus_per_pod == per_pod
    else:
        assert result.outcome == "ignored" and "requests no nvidia.com/gpu" in result.warnings[-1]


def test_a_device_class_counts_as_gpus_when_it_maps_nvidia_gpu_or_selects_the_drivers_gpus(dra_index):
    mapped = demo.gpu_device_class() | {"metadata": {"name": "big-gpus.example.com"}}
    mapped["spec"] = {"extendedResourceName": "nvidia.com/gpu"}
    selected = demo.gpu_device_class() | {"metadata": {"name": "h100.example.com"}}
    other = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "nic.example.com"},
             "spec": {"selectors": [{"cel": {"expression": "device.driver == 'rdma.example.com'"}}]}}
    for device_class, counted in ((mapped, True), (selected, True), (other, False)):
        valid_137(device_class)
        feed.upsert(dra_index, device_class)
        feed.upsert(dra_index, claim_template("t", deviceClassName=device_class["metadata"]["name"], count=2))
        result = review(review_of(gpu_claim_job(pods=1, template="t")), dra_index, Config())
        assert (result.outcome == "placed") is counted, result.warnings


def test_an_allocated_named_claim_pins_its_pods_to_its_node_and_an_unallocated_one_counts_once(dra_index):
    claims = ({"name": "gpus", "resourceClaimName": "shared"}, {"name": "more", "resourceClaimTemplateName": "t"})
    pod = with_claims(gpu_pod_of(0), *claims)
    feed.upsert(dra_index, claim_template("t", deviceClassName="gpu.nvidia.com", count=2))
    feed.upsert(dra_index, demo.make_allocated_claim("shared", "gpu-s1-l2-n4", ["gpu-0", "gpu-1"], namespace="ml"))
    pinned = review(review_of(pod), dra_index, Config())
    assert pinned.decision.nodes == ("gpu-s1-l2-n4",) and pinned.decision.request.gpus_per_pod == 2
    unallocated = demo.make_allocated_claim("shared", "gpu-s1-l2-n4", ["gpu-0", "gpu-1"], namespace="ml")
    del unallocated["status"]
    feed.upsert(dra_index, unallocated)
    alone = review(review_of(with_claims(gpu_pod_of(0, "p2"), *claims)), dra_index, Config())
    assert alone.decision.request.gpus_per_pod == 4  # its template's 2 and the named claim's 2
    job = with_claims(gpu_job("pair", 2, 0, placement_strategy="balanced"), {"name": "gpus", "resourceClaimName": "shared"})
    shared = review(review_of(job), dra_index, Config())
    assert shared.outcome == "placed" and shared.decision.request.pods == 1  # one set, both pods on its node
    assert shared.decision.request.gpus_per_pod == 2 and shared.decision.scope.level_name == "node"
    assert "its 2 pods share ResourceClaim ml/shared: placed as its 2 GPUs on one node" in shared.warnings[0]


def test_pods_naming_one_unallocated_claim_share_one_decision_and_its_gpus_are_held_once(dra_index):
    unallocated = demo.make_allocated_claim("pair", "gpu-s1-l3-n1", ["gpu-0", "gpu-1", "gpu-2"], namespace="ml")
    del unallocated["status"]
    feed.upsert(dra_index, unallocated)
    free = dra_index.stats().gpus_total - dra_index.stats().gpus_used - dra_index.stats().gpus_reserved
    results = [review(review_of(with_claims(gpu_pod_of(0, f"p{i}"), {"name": "gpus", "resourceClaimName": "pair"})),
                      dra_index, Config()) for i in range(3)]
    assert {r.outcome for r in results} == {"placed"}
    assert len({r.decision.nodes for r in results}) == 1 and len(results[0].decision.nodes) == 1
    stats = dra_index.stats()
    assert stats.gpus_total - stats.gpus_used - stats.gpus_reserved == free - 3  # the claim's 3 GPUs, once
    assert {r.admitted["metadata"]["annotations"]["topology.scheduler/reservation"] for r in results} == {
        "ml/ResourceClaim/pair"}


def gpu_pod_of(gpus: int, name: str = "p") -> dict:
    """A bare Pod of ours asking `gpus` nvidia.com/gpu."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml",
                         "annotations": {"topology.scheduler/placement-strategy": "balanced"}},
            "spec": gpu_job(name, 1, gpus)["spec"]["template"]["spec"]}


def test_a_bound_pod_with_gpus_from_a_template_confirms_its_workloads_hold(dra_index):
    result = review(review_of(gpu_claim_job(pods=1, name="one")), dra_index, Config())
    node = result.decision.nodes[0]
    assert dra_index.nodes[node].free == 0  # held
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "one-x", "namespace": "ml", "uid": "uid-one-x",
                        "annotations": result.admitted["spec"]["template"]["metadata"]["annotations"]},
           "spec": {**result.admitted["spec"]["template"]["spec"], "nodeName": node}, "status": {"phase": "Running"}}
    feed.upsert(dra_index, demo.make_allocated_claim("one-x-gpus", node, [f"gpu-{i}" for i in range(8)], namespace="ml",
                                               owner_pod=pod))
    feed.upsert(dra_index, pod)
    assert dra_index.nodes[node].free == 0 and not dra_index.nodes[node].held  # counted once: by its claim
    feed.delete(dra_index, pod)
    feed.delete(dra_index, demo.make_allocated_claim("one-x-gpus", node, [], namespace="ml"))
    assert dra_index.nodes[node].free == 8


def test_mutate_takes_a_workloads_claim_template_ahead_of_it_in_the_same_file(tmp_path, capsys, dra_cluster):
    nodes, claims = dra_cluster
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    template = claim_template()
    del template["metadata"]["namespace"]
    job = gpu_claim_job(placement_strategy="consolidated")
    del job["metadata"]["namespace"]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump_all([template, job]))
    assert main(["mutate", "--nodes", str(tmp_path / "nodes.yaml"), "-f", str(tmp_path / "job.yaml")]) == 0
    template_out, job_out = yaml.safe_load_all(capsys.readouterr().out)
    assert template_out == template
    assert "affinity" in job_out["spec"]["template"]["spec"]


# ----- PodGroups ----------------------------------------------------------------------------------------

def pod_group(name: str = "ranks", min_count: int | None = 4, version: str = "v1beta1", claims: tuple = (),
              made: dict | None = None, **annotations) -> dict:
    """A PodGroup; `claims`: its resourceClaims entries, `made`: entry name -> the claim made for it."""
    policy = {"gang": {"minCount": min_count}} if min_count else {"basic": {}}
    group = {"apiVersion": f"scheduling.k8s.io/{version}", "kind": "PodGroup",
             "metadata": {"name": name, "namespace": "ml", "annotations": {
                 f"topology.scheduler/{k.replace('_', '-')}": v for k, v in annotations.items()}},
             "spec": {"schedulingPolicy": policy, **({"resourceClaims": list(claims)} if claims else {})}}
    if made:
        group["status"] = {"resourceClaimStatuses": [{"name": k, "resourceClaimName": v} for k, v in made.items()]}
    return VALID_FOR[version](group)


def member(rank: int, group: str = "ranks", gpus: int = 8) -> dict:
    pod = gpu_pod_of(gpus, f"{group}-{rank}")
    pod["metadata"]["annotations"] = {"topology.scheduler/placement-strategy": "consolidated"}
    pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return valid_136(valid_137(pod))  # the same Pod in both releases


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (3, 1, 0, 2), (2, 3, 1, 0)])
def test_four_pods_of_one_pod_group_are_pinned_to_one_domain_with_room_for_four_in_any_order(dra_index, order):
    feed.upsert(dra_index, pod_group())
    admitted = [review(review_of(member(rank)), dra_index, Config()) for rank in order]
    assert {r.outcome for r in admitted} == {"placed"}
    assert {r.decision.request.pods for r in admitted} == {4}  # sized by the gang's minCount
    affinities = {str(r.admitted["spec"]["affinity"]) for r in admitted}
    assert len(affinities) == 1  # one decision, the first member's, for all
    decision = admitted[0].decision
    assert all(r.decision is decision for r in admitted)
    assert decision.scope.level_name == "leaf" and decision.scope.name in FREE_LEAVES
    for result in admitted:
        valid_137(result.admitted)
        assert result.admitted["spec"]["schedulingGroup"] == {"podGroupName": "ranks"}


def test_pods_of_a_pod_group_follow_its_max_domain_where_they_say_none(dra_index):
    feed.upsert(dra_index, pod_group(min_count=8, max_domain="leaf"))  # 8 x 8 GPUs: no leaf could ever
    result = review(review_of(member(0)), dra_index, Config())
    assert result.outcome == "denied" and "inside one leaf" in result.review["response"]["status"]["message"]


@pytest.mark.parametrize("annotations, own, key", [
    ({"max_domain": "leaf"}, None, "topology.scheduler/leaf"),
    ({"max_domain": "topology.scheduler/spine"}, None, "topology.scheduler/spine"),
    ({"max_domain": "node"}, None, "kubernetes.io/hostname"),
    ({"max_domain": "leaf"}, "topology.kubernetes.io/zone", "topology.kubernetes.io/zone"),  # theirs is kept
    ({}, None, None),  # no level asked for: left alone
])
def test_a_pod_group_asking_a_level_gets_its_label_as_topology_key_unless_it_has_its_own(annotations, own, key):
    group = pod_group(**annotations)
    if own:
        group["spec"]["schedulingConstraints"] = {"topology": [{"key": own}]}
    result = review(review_of(group), index_of(Config(), []), Config())
    assert result.outcome == ("constrained" if key and not own else "ignored")
    admitted = valid_137(result.admitted)
    assert admitted["spec"].get("schedulingConstraints", {}).get("topology") == ([{"key": key}] if key else None)


def test_a_peers_required_topology_on_a_workload_gives_each_of_its_templates_the_key():
    workload = valid_137({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "Workload",
        "metadata": {"name": "train", "namespace": "ml",
                     "annotations": {"kueue.x-k8s.io/podset-required-topology": "topology.scheduler/leaf"}},
        "spec": {"podGroupTemplates": [
            {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}},
            {"name": "own", "schedulingPolicy": {"gang": {"minCount": 2}},
             "schedulingConstraints": {"topology": [{"key": "topology.scheduler/spine"}]}}]}})
    result = review(review_of(workload), index_of(Config(), []), Config())
    templates = valid_137(result.admitted)["spec"]["podGroupTemplates"]
    assert [t["schedulingConstraints"]["topology"] for t in templates] == [
        [{"key": "topology.scheduler/leaf"}], [{"key": "topology.scheduler/spine"}]]


def test_a_pod_group_asking_an_unknown_level_is_denied_naming_the_annotation_and_the_levels():
    result = review(review_of(pod_group(max_domain="rack")), index_of(Config(), []), Config())
    assert result.outcome == "denied"
    assert result.review["response"]["status"]["message"] == (
        'PodGroup ml/ranks: annotation topology.scheduler/max-domain="rack" is not a topology level; allowed: zone, '
        "spine, leaf, node, topology.kubernetes.io/zone, topology.scheduler/spine, topology.scheduler/leaf")


def test_mutate_takes_a_pod_group_ahead_of_its_pods(tmp_path, capsys, dra_cluster):
    nodes, claims = dra_cluster
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": claims}))
    (tmp_path / "group.yaml").write_text(yaml.safe_dump_all([pod_group(max_domain="leaf"),
                                                              *(member(rank) for rank in range(4))]))
    assert main(["mutate", "--nodes", str(tmp_path / "nodes.yaml"), "--pods", str(tmp_path / "pods.yaml"),
                 "-f", str(tmp_path / "group.yaml")]) == 0
    group, *pods = yaml.safe_load_all(capsys.readouterr().out)
    assert group["spec"]["schedulingConstraints"] == {"topology": [{"key": LEAF}]}
    pins = {str(p["spec"]["affinity"]) for p in pods}
    assert len(pins) == 1 and "leaf-3" in pins.pop()


# PodGroups of Kubernetes 1.36 (scheduling.k8s.io/v1alpha2): what we read and write has the same shape

def test_a_v1alpha2_pod_group_sizes_and_places_its_pods_as_a_v1beta1_one_does(dra_cluster):
    decisions = {}
    for version in ("v1beta1", "v1alpha2"):
        index = index_of(Config(), *dra_cluster)
        feed.upsert(index, pod_group(min_count=4, version=version))
        results = [review(review_of(member(rank)), index, Config()) for rank in range(4)]
        assert {r.outcome for r in results} == {"placed"}
        assert all(r.decision is results[0].decision for r in results)
        decisions[version] = results[0].decision
        valid_136(results[0].admitted)
    assert decisions["v1alpha2"].request.pods == 4
    assert decisions["v1alpha2"].request == decisions["v1beta1"].request
    assert decisions["v1alpha2"].nodes == decisions["v1beta1"].nodes


@pytest.mark.parametrize("kind", ["PodGroup", "Workload"])
def test_a_v1alpha2_pod_group_or_workload_asking_a_level_gets_its_label_valid_for_1_36(kind):
    if kind == "PodGroup":
        obj = pod_group(version="v1alpha2", max_domain="leaf")
    else:
        obj = valid_136({"apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "Workload",
                         "metadata": {"name": "train", "namespace": "ml",
                                      "annotations": {"topology.scheduler/max-domain": "leaf"}},
                         "spec": {"podGroupTemplates": [{"name": "workers",
                                                         "schedulingPolicy": {"gang": {"minCount": 4}}}]}})
    result = review(review_of(obj), index_of(Config(), []), Config())
    assert result.outcome == "constrained"
    admitted = valid_136(result.admitted)
    constrained = admitted["spec"] if kind == "PodGroup" else admitted["spec"]["podGroupTemplates"][0]
    assert constrained["schedulingConstraints"] == {"topology": [{"key": LEAF}]}


def test_mutate_reads_a_v1alpha2_pod_group_from_the_pods_file(tmp_path, capsys, dra_cluster):
    nodes, claims = dra_cluster
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": nodes}))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        *claims, pod_group(version="v1alpha2")]}))
    (tmp_path / "ranks.yaml").write_text(yaml.safe_dump_all([member(rank) for rank in range(4)]))
    assert main(["mutate", "--nodes", str(tmp_path / "nodes.yaml"), "--pods", str(tmp_path / "pods.yaml"),
                 "-f", str(tmp_path / "ranks.yaml"), "--explain"]) == 0
    out, err = capsys.readouterr()
    assert "is not known" not in err  # sized by the PodGroup's minCount, not placed pod by pod
    pods = list(yaml.safe_load_all(out))
    (pin,) = {str(valid_136(p)["spec"]["affinity"]) for p in pods}
    assert len(pods) == 4 and any(leaf in pin for leaf in FREE_LEAVES)


@pytest.mark.parametrize("served, watched", [
    (("v1alpha2",), "v1alpha2"),  # Kubernetes 1.36
    (("v1beta1",), "v1beta1"),  # 1.37
    (("v1beta1", "v1alpha2"), "v1beta1"),  # both: the newest
])
def test_the_live_view_reads_pod_groups_from_the_newest_version_served(fake, make_view, served, watched):
    fake.serve_dra = True
    fake.pod_group_versions = served
    fake.put("podgroups", pod_group(min_count=4, version=watched))
    view = make_view(fake)
    view.start()
    assert view.wait_synced(10)
    eventually(lambda: view.index.pod_group("ml/ranks") is not None, what="the v1alpha2 PodGroup listed")
    assert view.index.pod_group("ml/ranks").min_count == 4
    fake.put("podgroups", pod_group(min_count=2, version=watched))  # minCount is mutable: watched
    eventually(lambda: view.index.pod_group("ml/ranks").min_count == 2, what="the change watched")
    (stream,) = [s for s in view.status() if s.kind == "podgroups"]
    assert stream.last_error is None and stream.objects == 1
    watches = {path for path, q in fake.requests if path.endswith("/podgroups") and q.get("watch") in ("1", "true")}
    assert watches == {f"/apis/scheduling.k8s.io/{watched}/podgroups"}
    fake.delete("podgroups", "ml/ranks")
    eventually(lambda: view.index.pod_group("ml/ranks") is None, what="the PodGroup forgotten")


# ResourceClaims on PodGroups (KEP-5729): a pod's entry equal to its PodGroup's is the group's one claim

GROUP_CLAIM = {"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}


def claiming_member(rank: int, *entries: dict) -> dict:
    """A rank of PodGroup ml/ranks with no GPUs but through `entries` (the group's claim unless given)."""
    return valid_137(with_claims(member(rank, gpus=0), *(entries or (GROUP_CLAIM,))))


def free_gpus(index: ClusterIndex) -> int:
    stats = index.stats()
    return stats.gpus_total - stats.gpus_used - stats.gpus_reserved


@pytest.mark.parametrize("version", ["v1beta1", "v1alpha2"])
def test_four_pods_sharing_their_pod_groups_claim_take_its_8_gpus_once_on_one_node(dra_index, version):
    feed.upsert(dra_index, pod_group(version=version, claims=(GROUP_CLAIM,)))
    free = free_gpus(dra_index)
    results = [review(review_of(claiming_member(rank)), dra_index, Config()) for rank in range(4)]
    assert {r.outcome for r in results} == {"placed"}
    decision = results[0].decision
    assert all(r.decision is decision for r in results)
    assert decision.request.total_gpus == 8 and len(decision.nodes) == 1  # one claim of 8, not 4 x 8
    assert free_gpus(dra_index) == free - 8
    assert ("Pod ml/ranks-0: its 4 pods share claim gpus of PodGroup ml/ranks: placed as its 8 GPUs on one node, "
            "where all of them run") in results[0].warnings


@pytest.mark.parametrize("entry", [
    {"name": "own", "resourceClaimTemplateName": "eight-gpus"},  # another name
    {"name": "gpus", "resourceClaimTemplateName": "other-eight"},  # another template
])
def test_pods_whose_claim_is_not_their_pod_groups_count_their_gpus_per_pod(dra_index, entry):
    feed.upsert(dra_index, claim_template("other-eight"))
    feed.upsert(dra_index, pod_group(claims=(GROUP_CLAIM,)))
    result = review(review_of(claiming_member(0, entry)), dra_index, Config())
    assert result.outcome == "placed"
    assert result.decision.request.pods == 4 and result.decision.request.total_gpus == 32


def test_the_claim_made_for_a_pod_group_pins_its_pods_once_allocated(dra_index):
    feed.upsert(dra_index, claim_template("one", deviceClassName="gpu.nvidia.com", count=1))
    feed.upsert(dra_index, demo.make_allocated_claim("ranks-gpus-x7k2p", "gpu-s1-l3-n2", ["gpu-0", "gpu-1", "gpu-2", "gpu-3"],
                                               namespace="ml"))
    feed.upsert(dra_index, pod_group(claims=(GROUP_CLAIM,), made={"gpus": "ranks-gpus-x7k2p"}))
    result = review(review_of(claiming_member(0, GROUP_CLAIM, {"name": "own", "resourceClaimTemplateName": "one"})),
                    dra_index, Config())
    assert result.outcome == "placed" and result.decision.nodes == ("gpu-s1-l3-n2",)  # where its devices are
    assert result.decision.request.total_gpus == 4  # its pods' own GPUs; the group's are counted as allocated


def test_pods_bound_with_their_pod_groups_allocated_claim_confirm_the_hold_of_its_gpus(dra_index):
    feed.upsert(dra_index, pod_group(claims=(GROUP_CLAIM,)))
    result = review(review_of(claiming_member(0)), dra_index, Config())
    (node,) = result.decision.nodes
    assert dra_index.nodes[node].held
    # the claim made for the group, allocated on that node, and its pods bound there
    made = demo.make_allocated_claim("ranks-gpus-x7k2p", node, [f"gpu-{i}" for i in range(8)], namespace="ml")
    feed.upsert(dra_index, made)
    feed.upsert(dra_index, pod_group(claims=(GROUP_CLAIM,), made={"gpus": "ranks-gpus-x7k2p"}))
    for rank in range(4):
        pod = claiming_member(rank)
        pod["metadata"].update(uid=f"uid-ranks-{rank}", annotations=result.admitted["metadata"]["annotations"])
        feed.upsert(dra_index, {**pod, "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": "Running"}})
    assert dra_index.nodes[node].free == 0 and not dra_index.nodes[node].held  # counted once: by the claim


# ----- alignment the allocator honours: constraints on a template that asks for them -----------------

def paired_template(align: str | None, gpus: int = 1, **extra_devices) -> dict:
    template = claim_template("paired", deviceClassName="gpu.nvidia.com", count=gpus)
    template["spec"]["spec"]["devices"]["requests"].append(
        {"name": "nic", "exactly": {"deviceClassName": "rdma-nic.example.com", "count": 1}})
    template["spec"]["spec"]["devices"].update(extra_devices)
    if align is not None:
        template["metadata"]["annotations"] = {"topology.scheduler/align": align}
    return valid_137(template)


@pytest.mark.parametrize("align, gpus, constraint", [
    ("pcie", 1, {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}),
    ("numa", 4, {"matchAttribute": "resource.kubernetes.io/numaNode"}),
])
def test_a_template_asking_for_alignment_gets_the_constraint_the_allocator_enforces(dra_index, align, gpus,
                                                                                     constraint):
    result = review(review_of(paired_template(align, gpus)), dra_index, Config())
    assert result.outcome == "aligned"
    assert valid_137(result.admitted)["spec"]["spec"]["devices"]["constraints"] == [constraint]
    assert result.admitted["spec"]["spec"]["devices"]["requests"] == paired_template(align, gpus)["spec"]["spec"][
        "devices"]["requests"]


def test_pcie_pairing_of_several_gpus_is_left_as_written_with_a_warning(dra_index):
    result = review(review_of(paired_template("pcie", gpus=8)), dra_index, Config())
    assert result.outcome == "ignored" and not result.patch
    assert "pairs one GPU with one NIC" in result.warnings[0]


def test_a_templates_own_constraint_and_templates_not_asking_are_left_alone(dra_index):
    own = {"constraints": [{"requests": ["gpu"], "matchAttribute": "resource.kubernetes.io/pcieRoot"}]}
    for template in (paired_template("pcie", **own), paired_template(None)):
        result = review(review_of(template), dra_index, Config())
        assert result.outcome == "ignored" and not result.patch


def test_an_alignment_not_ours_is_denied_naming_the_annotation():
    result = review(review_of(paired_template("nvlink")), index_of(Config(), []), Config())
    assert result.review["response"]["status"]["message"] == (
        'ResourceClaimTemplate ml/paired: annotation topology.scheduler/align="nvlink" is not allowed; '
        "allowed: pcie, numa")


def test_bare_pods_sharing_a_compute_domain_channel_are_one_group_in_one_clique():
    config = Config(levels=PRESETS["nvl72"])
    index = index_of(config, demo.gb200_dra_cluster())
    feed.upsert(index, {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                  "metadata": {"name": "train", "namespace": "ml"},
                  "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": "train-channel"}}}})
    results = []
    for rank in range(6):
        pod = with_claims(gpu_pod_of(0, f"rank-{rank}"), {"name": "gpus", "resourceClaimTemplateName": "four"},
                          {"name": "imex", "resourceClaimTemplateName": "train-channel"})
        pod["metadata"]["annotations"]["topology.scheduler/group-size"] = "6"
        if rank == 0:
            feed.upsert(index, claim_template("four", deviceClassName="gpu.nvidia.com", count=4))
        results.append(review(review_of(valid_137(pod)), index, config))
    assert {r.outcome for r in results} == {"placed"}
    decision = results[0].decision
    assert all(r.decision is decision for r in results) and decision.request.pods == 6
    assert decision.request.max_domain == "nvidia.com/gpu.clique"
    assert len({index.nodes[n].labels["nvidia.com/gpu.clique"] for n in decision.nodes}) == 1
    assert results[0].admitted["metadata"]["annotations"]["topology.scheduler/reservation"] == \
        "ml/ComputeDomainChannel/train-channel"


def test_a_workload_whose_template_is_unknown_is_counted_by_the_served_webhook(client, metrics):
    answer = client.post("/mutate", json=review_of(gpu_claim_job(template="later")))
    assert answer.status_code == 200 and answer.get_json()["response"]["allowed"]
    assert "patch" not in answer.get_json()["response"]
    assert samples(metrics)[("topology_placement_decisions_total", (
        ("kind", "Job"), ("outcome", "demand-unknown"), ("strategy", "none")))] == 1


def test_the_live_view_is_ready_without_dra_kinds_its_rbac_may_not_read(fake, make_view, caplog):
    caplog.set_level(logging.INFO, logger="webhook.kube.clusterview")
    fake.serve_dra = True
    fake.forbidden = {"resourceslices", "resourceclaims"}
    for node in demo.leaf_spine_nodes(1, 1, 2):
        fake.put_node(node)
    view = make_view(fake)
    view.start()
    assert view.wait_synced(10) and view.readiness()[0]
    assert "resourceslices: the API is not granted by RBAC (403)" in caplog.text


def test_a_channel_named_by_its_compute_domain_outlives_a_relist_of_templates_that_lacks_it():
    index = index_of(Config(), [])
    feed.upsert(index, {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
                  "metadata": {"name": "train", "namespace": "ml"},
                  "spec": {"channel": {"resourceClaimTemplate": {"name": "train-channel"}}}})
    assert "ml/train-channel" not in index.keys("ResourceClaimTemplate")  # a relist has nothing to forget
    made = claim_template("train-channel", deviceClassName="compute-domain-default-channel.nvidia.com")
    feed.upsert(index, made)  # its controller made it: listed, then deleted
    feed.delete(index, made)
    assert index.devices.inventory.template("ml/train-channel").channel
    feed.delete(index, {"kind": "ComputeDomain", "metadata": {"name": "train", "namespace": "ml"}})
    assert index.devices.inventory.template("ml/train-channel") is None
