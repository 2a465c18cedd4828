"""Clusters that grow: pools read from what autoscalers publish, and workloads the nodes there are
cannot hold steered onto the nodes a pool will add, never kept out of them.

"Allowed" is judged as kube-scheduler judges a node: every nodeSelector label equal, and the
required nodeSelectorTerms ORed with each term's matchExpressions ANDed
(https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#node-affinity).
"""
from __future__ import annotations

import copy

import pytest
import yaml
from conftest import assert_valid_kubernetes_object, eventually, review_of

from tests.fixtures.builders import gpu_job
from tests.fixtures.shared import GPU_TOLERATION, NODEPOOL, karpenter_nodes
from webhook.admission import review
from webhook.cli import main
from webhook.core.model import (EXCEEDS_CLUSTER, EXCEEDS_NODES, GROWS_POOL, NO_ROOM_NOW, Outcome, PlacementRequest,
                                Strategy)
from webhook.kube.demo import make_node, make_pod
from webhook.objects import feed
from webhook.objects.autoscaler_objects import node_groups, nodepool
from webhook.objects.feed import index_of
from webhook.placement.placer import place
from webhook.settings.config import Config
from webhook.settings.presets import PRESETS
from webhook.state.filters import expression_matches
from webhook.state.growth import NODEPOOL_LABEL
from webhook.state.index import NodeGone

ZONE = "topology.kubernetes.io/zone"
SPINE, LEAF = "topology.scheduler/spine", "topology.scheduler/leaf"
GKE_POOL = "cloud.google.com/gke-nodepool"
BLOCK, SUBBLOCK, HOST = (lv.label for lv in PRESETS["gke"])


def scheduler_allows(pod_spec: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if not required:
        return True
    return any(all(expression_matches(e, labels) for e in term.get("matchExpressions") or ())
               for term in required["nodeSelectorTerms"])


def required_keys(pod_spec: dict) -> set[str]:
    required = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return {e["key"] for term in required["nodeSelectorTerms"] for e in term["matchExpressions"]}




def node_karpenter_would_add(pod_spec: dict) -> dict:
    """Labels of a node the NodePool adds for the pod: the template's labels, the pool's name, and
    for each requirement a value it allows (the one the pod asks for where it asks), plus labels
    no one knows before launch (a new hostname, new network nodes)."""
    spec = NODEPOOL["spec"]["template"]
    labels = {**spec["metadata"]["labels"], NODEPOOL_LABEL: NODEPOOL["metadata"]["name"]}
    required = pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    asked = {e["key"]: e["values"] for term in required["nodeSelectorTerms"] for e in term["matchExpressions"]
             if e["operator"] == "In"}
    for req in spec["spec"]["requirements"]:
        values = [v for v in req["values"] if v in asked.get(req["key"], req["values"])]
        assert values, f"the pod asks for {req['key']} outside what the NodePool allows"
        labels[req["key"]] = values[0]
    return {**labels, "kubernetes.io/hostname": "ip-10-0-9-9", SPINE: "nn-spine-7", LEAF: "nn-leaf-42"}


def mutate(capsys, tmp_path, job: dict, *cluster: dict, config: str = "") -> tuple[int, dict | None, str]:
    """`mutate` with the cluster as `kubectl get nodes,nodepools -o yaml` prints it: one List."""
    nodes = tmp_path / "cluster.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(cluster)}))
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    extra = []
    if config:
        (tmp_path / "config.yaml").write_text(config)
        extra = ["--config", str(tmp_path / "config.yaml")]
    code = main(["mutate", "-f", str(manifest), "--nodes", str(nodes), *extra])
    out, err = capsys.readouterr()
    return code, (yaml.safe_load(out) if out.strip() else None), err


def tolerating(job: dict) -> dict:
    job = copy.deepcopy(job)
    job["spec"]["template"]["spec"]["tolerations"] = GPU_TOLERATION
    return job


# -- Karpenter ----------------------------------------------------------------------------------------

def test_a_job_no_existing_node_fits_is_steered_to_the_nodepool_and_a_node_it_adds_is_allowed(tmp_path, capsys):
    job = tolerating(gpu_job("big", 5, 8, placement_strategy="consolidated"))
    code, mutated, err = mutate(capsys, tmp_path, job, *karpenter_nodes(), NODEPOOL)
    assert code == 0, err
    assert_valid_kubernetes_object(mutated)
    assert "NodePool gpu-h100 can add nodes of 8 GPUs, 12 more at most: steered to it, inside " \
           "topology.kubernetes.io/zone=us-east-1a" in err
    pod_spec = mutated["spec"]["template"]["spec"]
    assert scheduler_allows(pod_spec, node_karpenter_would_add(pod_spec))
    # Every key it requires is one the NodePool defines, else Karpenter launches nothing for it.
    template = NODEPOOL["spec"]["template"]
    defined = {*template["metadata"]["labels"], NODEPOOL_LABEL, *(r["key"] for r in template["spec"]["requirements"])}
    assert required_keys(pod_spec) <= defined
    # The pool's nodes there are stay allowed too; nodes of no pool do not.
    assert scheduler_allows(pod_spec, karpenter_nodes()[0]["metadata"]["labels"])
    assert not scheduler_allows(pod_spec, make_node("fixed", {ZONE: "us-east-1a"})["metadata"]["labels"])
    annotations = mutated["spec"]["template"]["metadata"]["annotations"]
    assert annotations["topology.scheduler/placement"].startswith("waiting (consolidated) for NodePool gpu-h100")


def test_a_nodepool_at_zero_nodes_takes_a_job_that_selects_it():
    job = PlacementRequest("Job ml/x", 2, 8, Strategy.CONSOLIDATED, node_selector={NODEPOOL_LABEL: "gpu-h100"},
                           tolerations=tuple(GPU_TOLERATION))
    index = index_of(Config(), [make_node("other", {ZONE: "us-east-1a"}), NODEPOOL])
    decision = place(index, job)
    assert (decision.outcome, decision.code) == (Outcome.WAIT, GROWS_POOL)
    assert [(r.key, r.values) for r in decision.requirements] == [(NODEPOOL_LABEL, ("gpu-h100",)),
                                                                 (ZONE, ("us-east-1a",))]


def test_the_user_s_own_zone_is_the_one_kept():
    job = PlacementRequest("Job ml/x", 6, 8, Strategy.CONSOLIDATED, node_selector={ZONE: "us-east-1b"},
                           tolerations=tuple(GPU_TOLERATION))
    decision = place(index_of(Config(), [*karpenter_nodes(), NODEPOOL]), job)
    assert decision.code == GROWS_POOL and (ZONE, ("us-east-1b",)) in [(r.key, r.values) for r in decision.requirements]


@pytest.mark.parametrize("change, why", [
    (lambda p: p["spec"].update(replicas=4), "static capacity: it does not grow for pods"),
    (lambda p: p["spec"]["limits"].update({"nvidia.com/gpu": "40"}), "its GPU limit leaves room for one node"),
    (lambda p: p["status"]["conditions"][0].update(status="False"), "not Ready"),
    (lambda p: p["spec"]["template"]["spec"]["requirements"][1].update(values=["4"]), "its nodes are too small"),
    (lambda p: p["spec"]["template"]["spec"].update(taints=[{"key": "team", "value": "a", "effect": "NoSchedule"}]),
     "a taint the job does not tolerate"),
])
def test_a_nodepool_that_cannot_take_the_job_is_not_used(change, why):
    pool = copy.deepcopy(NODEPOOL)
    change(pool)
    index = index_of(Config(), [*karpenter_nodes(), pool])
    decision = place(index, PlacementRequest("Job ml/x", 6, 8, Strategy.CONSOLIDATED, tolerations=tuple(GPU_TOLERATION)))
    assert (decision.outcome, decision.code) == (Outcome.WAIT, EXCEEDS_NODES), why
    assert decision.requirements == ()


def test_a_label_the_nodepool_does_not_define_keeps_the_pool_out():
    """Karpenter launches no node for a pod that requires a label its NodePool does not define."""
    job = PlacementRequest("Job ml/x", 6, 8, Strategy.CONSOLIDATED, node_selector={"example.com/team": "a"},
                           tolerations=tuple(GPU_TOLERATION))
    decision = place(index_of(Config(), [*karpenter_nodes(), NODEPOOL]), job)
    assert decision.code != GROWS_POOL
    well_known = PlacementRequest("Job ml/x", 6, 8, Strategy.CONSOLIDATED, tolerations=tuple(GPU_TOLERATION),
                                  node_selector={"kubernetes.io/arch": "amd64"})
    assert place(index_of(Config(), [*karpenter_nodes(), NODEPOOL]), well_known).code == GROWS_POOL


def test_a_pod_larger_than_every_node_is_taken_by_a_pool_of_larger_nodes():
    pool = copy.deepcopy(NODEPOOL)
    pool["spec"]["template"]["spec"]["requirements"][1]["values"] = ["16"]
    pool["spec"]["template"]["spec"]["requirements"][0]["values"] = ["p6e-gb200.36xlarge"]
    request = PlacementRequest("Job ml/x", 1, 16, Strategy.CONSOLIDATED, tolerations=tuple(GPU_TOLERATION))
    assert place(index_of(Config(), karpenter_nodes()), request).code == EXCEEDS_CLUSTER
    decision = place(index_of(Config(refuse_unplaceable=True), [*karpenter_nodes(), pool]), request)
    assert (decision.outcome, decision.code) == (Outcome.WAIT, GROWS_POOL)


def test_a_wait_for_busy_pool_nodes_is_steered_to_the_pool_not_pinned_to_a_leaf():
    nodes = karpenter_nodes()
    busy = [make_pod(f"busy-{n['metadata']['name']}", n["metadata"]["name"], 8) for n in nodes]
    request = PlacementRequest("Job ml/x", 2, 8, Strategy.CONSOLIDATED, tolerations=tuple(GPU_TOLERATION))
    pin_leaf = Config(pin_only_where_locality_pays=False)  # else the wait is pinned to the leaf's spine
    without = place(index_of(pin_leaf, nodes, busy), request)
    assert without.code == NO_ROOM_NOW and LEAF in {r.key for r in without.requirements}
    decision = place(index_of(pin_leaf, [*nodes, NODEPOOL], busy), request)
    assert decision.code == GROWS_POOL and LEAF not in {r.key for r in decision.requirements}


def test_a_workload_that_fits_today_places_exactly_as_without_pools():
    request = PlacementRequest("Job ml/x", 2, 8, Strategy.CONSOLIDATED, tolerations=tuple(GPU_TOLERATION))
    without = place(index_of(Config(), karpenter_nodes()), request)
    with_pool = place(index_of(Config(), [*karpenter_nodes(), NODEPOOL]), request)
    assert with_pool.outcome is Outcome.PLACED and with_pool == without


def test_nodepool_model_reads_labels_requirements_limits_and_gpus():
    pool = nodepool(NODEPOOL)
    assert pool.fixed[NODEPOOL_LABEL] == "gpu-h100" and pool.fixed["example.com/gpu-pool"] == "h100"
    assert pool.choices[ZONE] == ("us-east-1a", "us-east-1b")
    assert (pool.gpus_per_node, pool.room_gpus, pool.room_nodes, pool.weight) == (8, 96, 12, 50)
    assert pool.allows({"key": "example.com/undefined", "operator": "DoesNotExist"})
    assert not pool.allows({"key": "example.com/undefined", "operator": "In", "values": ["x"]})
    assert not pool.allows({"key": ZONE, "operator": "In", "values": ["eu-west-1a"]})


# -- cluster-autoscaler (GKE node pools) ---------------------------------------------------------------

def ca_status(*groups: tuple[str, int, int], health: str = "Healthy", scale_up: str = "NoActivity") -> dict:
    """cluster-autoscaler's status ConfigMap as it writes it since 1.30 (YAML status)."""
    status = {"time": "2026-11-03 10:00:00.1 +0000 UTC", "autoscalerStatus": "Running",
              "nodeGroups": [{"name": name, "health": {"status": health, "cloudProviderTarget": target,
                                                       "minSize": 0, "maxSize": most},
                              "scaleUp": {"status": scale_up}} for name, target, most in groups]}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-status", "namespace": "kube-system"},
            "data": {"status": yaml.safe_dump(status)}}


def gke_nodes(pool: str, count: int, compact: bool = False) -> list[dict]:
    extra = {"cloud.google.com/gke-placement-group": "pg-1"} if compact else {}
    return [make_node(f"gke-prod-{pool}-{i}", {GKE_POOL: pool, "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
                                              ZONE: "us-central1-a", BLOCK: "block-1",
                                              SUBBLOCK: f"sub-{i // 2}", HOST: f"host-{i}", **extra})
            for i in range(count)]


def new_gke_node(sample: dict, name: str, block: str) -> dict:
    """A node the group adds: its sample's labels, with its own name and the place it lands."""
    labels = dict(sample["metadata"]["labels"])
    labels.update({"kubernetes.io/hostname": name, BLOCK: block, SUBBLOCK: f"{block}-sub-9", HOST: f"{name}-host"})
    return labels


def test_a_gke_node_pool_that_can_grow_takes_the_job_and_a_node_it_adds_later_is_allowed(tmp_path, capsys):
    nodes = gke_nodes("h100", 4) + gke_nodes("l4", 2)
    status = ca_status(("gke-prod-h100-1a2b3c4d-grp", 4, 16), ("gke-prod-l4-5e6f7a8b-grp", 2, 2))
    job = gpu_job("big", 7, 8, placement_strategy="consolidated")  # 6 nodes of 8 GPUs
    code, mutated, err = mutate(capsys, tmp_path, job, *nodes, status, config="levels: gke\n")
    assert code == 0, err
    assert_valid_kubernetes_object(mutated)
    assert "node group h100 can add nodes of 8 GPUs, 12 more at most: steered to it" in err
    pod_spec = mutated["spec"]["template"]["spec"]
    assert scheduler_allows(pod_spec, new_gke_node(nodes[0], "gke-prod-h100-9", "block-7"))
    assert not scheduler_allows(pod_spec, nodes[-1]["metadata"]["labels"])  # the l4 pool cannot grow
    assert required_keys(pod_spec) == {GKE_POOL, ZONE}  # nothing a new node learns only once launched


def test_a_compact_pool_is_one_domain_so_its_block_is_pinned():
    nodes = gke_nodes("h100", 4, compact=True)
    index = index_of(Config(levels=PRESETS["gke"]), [*nodes, ca_status(("gke-prod-h100-x-grp", 4, 8))])
    decision = place(index, PlacementRequest("Job ml/x", 6, 8, Strategy.CONSOLIDATED))
    assert decision.code == GROWS_POOL
    assert {r.key: r.values for r in decision.requirements}[BLOCK] == ("block-1",)


@pytest.mark.parametrize("status, why", [
    (ca_status(("gke-prod-h100-x-grp", 16, 16)), "at its maximum"),
    (ca_status(("gke-prod-h100-x-grp", 4, 16), scale_up="Backoff"), "backing off"),
    (ca_status(("gke-prod-h100-x-grp", 4, 16), health="Unhealthy"), "unhealthy"),
    (ca_status(("gke-prod-a100-x-grp", 4, 16)), "another pool"),
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cluster-autoscaler-status",
                                                            "namespace": "kube-system"},
      "data": {"status": "Cluster-autoscaler status at 2023-01-01: Health: Healthy"}}, "the old free-text status"),
])
def test_a_node_group_that_cannot_grow_is_not_used(status, why):
    index = index_of(Config(levels=PRESETS["gke"]), [*gke_nodes("h100", 4), status])
    decision = place(index, PlacementRequest("Job ml/x", 6, 8, Strategy.CONSOLIDATED))
    assert decision.code == EXCEEDS_NODES, why


def test_node_groups_of_one_pool_in_several_zones_add_up():
    status = ca_status(("gke-prod-h100-aaaa-grp", 2, 3), ("gke-prod-h100-bbbb-grp", 2, 3))
    assert node_groups(status) == [("gke-prod-h100-aaaa-grp", 1), ("gke-prod-h100-bbbb-grp", 1)]
    nodes = gke_nodes("h100", 4)
    index = index_of(Config(levels=PRESETS["gke"]), [*nodes, status])
    assert place(index, PlacementRequest("Job ml/x", 6, 8, Strategy.CONSOLIDATED)).code == GROWS_POOL
    assert place(index, PlacementRequest("Job ml/x", 7, 8, Strategy.CONSOLIDATED)).code == EXCEEDS_NODES


def test_pools_follow_their_nodes_and_objects():
    index = index_of(Config(levels=PRESETS["gke"]), gke_nodes("h100", 2))
    assert index.pools() == ()
    feed.upsert(index, ca_status(("gke-prod-h100-x-grp", 2, 4)))
    assert [p.name for p in index.pools()] == ["h100"]
    index.apply(NodeGone("gke-prod-h100-0"))
    index.apply(NodeGone("gke-prod-h100-1"))
    assert index.pools() == ()  # no node left to learn what the group's nodes look like
    feed.upsert(index, gke_nodes("h100", 1)[0], "Node")
    assert [p.members for p in index.pools()] == [frozenset({"gke-prod-h100-0"})]
    feed.delete(index, ca_status(("gke-prod-h100-x-grp", 2, 4)))
    assert index.pools() == ()


def test_a_nodes_file_may_only_hold_nodes_and_autoscaler_objects(tmp_path, capsys):
    stray = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": "kube-system"}}
    code, _, err = mutate(capsys, tmp_path, gpu_job("j", 1, 8), *gke_nodes("h100", 1), stray)
    assert code == 2 and "ConfigMap other found; this file may only hold Node objects, Karpenter NodePools" in err


# -- the live view ----------------------------------------------------------------------------------------

def test_the_live_view_watches_nodepools_when_served(fake, make_view):
    fake.serve_nodepools = True
    for node in karpenter_nodes():
        fake.put_node(node)
    fake.put("nodepools", NODEPOOL)
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    eventually(lambda: [p.name for p in view.index.pools()] == ["gpu-h100"], what="the NodePool")
    assert {s.kind: s.objects for s in view.status()}["nodepools"] == 1
    static = copy.deepcopy(NODEPOOL)
    static["spec"]["replicas"] = 4
    fake.put("nodepools", static)
    eventually(lambda: view.index.pools() == (), what="the NodePool made static")
    fake.delete("nodepools", "gpu-h100")
    eventually(lambda: view.index.keys("NodePool") == set(), what="the NodePool deleted")


def test_without_karpenter_or_cluster_autoscaler_the_live_view_is_ready_and_knows_no_pool(fake, make_view):
    for node in karpenter_nodes():
        fake.put_node(node)
    view = make_view(fake)
    view.start()
    assert view.wait_synced(15)
    assert view.readiness()[0] and view.index.pools() == ()
    assert {s.kind: s.last_error for s in view.status()}["nodepools"] == "not served"


def test_a_single_zone_node_group_keeps_its_zone_when_zone_is_a_topology_level():
    """The zone of a node group's nodes is its own, known before a node exists; the leaf is not."""
    nodes = [make_node(f"gke-prod-h100-{i}", {GKE_POOL: "h100", ZONE: "us-central1-a", SPINE: "s1", LEAF: f"l{i}"})
             for i in range(2)]
    index = index_of(Config(), [*nodes, ca_status(("gke-prod-h100-x-grp", 2, 8))])
    decision = place(index, PlacementRequest("Job ml/x", 4, 8, Strategy.CONSOLIDATED))
    assert {r.key: r.values for r in decision.requirements} == {GKE_POOL: ("h100",), ZONE: ("us-central1-a",)}


def test_pools_follow_the_levels_auto_chooses():
    """A block label is a level only on the gke preset: only then is it one a new node learns at launch."""
    index = index_of(Config(), [*gke_nodes("h100", 2), ca_status(("gke-prod-h100-x-grp", 2, 8))])
    assert index.preset == "gke" and BLOCK in index.pools()[0].unknown
    for i in range(3):  # more nodes marking the default preset than the gke one: the levels change
        feed.upsert(index, make_node(f"rack-{i}", {SPINE: "s1", LEAF: "l1"}), "Node")
    assert index.preset == "default" and index.pools()[0].fixed[BLOCK] == "block-1"


def test_pods_of_a_job_steered_to_a_pool_at_zero_nodes_keep_the_pool_not_repaired_onto_other_nodes():
    """The pool's nodes are yet to come: that is not capacity lost, so no pod is moved to the nodes there are."""
    fixed = [make_node(f"fixed-{i}", {ZONE: "us-east-1a", SPINE: "s1", LEAF: "l1"}) for i in range(2)]
    index = index_of(Config(), [*fixed, NODEPOOL])
    job = tolerating(gpu_job("big", 5, 8, placement_strategy="consolidated"))
    admitted = review(review_of(job), index, Config()).admitted
    template = copy.deepcopy(admitted["spec"]["template"])
    pod = {"apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
           "metadata": {**template["metadata"], "name": "big-0", "namespace": "ml", "uid": "uid-big-0",
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "big", "uid": "uid-job",
                                             "controller": True}]}}
    result = review(review_of(pod), index, Config())
    assert result.outcome == "ignored" and not result.patch


@pytest.mark.parametrize("requirements, members, gpus", [
    ([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge", "p4d.24xlarge"]}], 0, 8),
    ([{"key": "eks.amazonaws.com/instance-gpu-count", "operator": "Lt", "values": ["5"]}], 0, 4),
    ([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["x9.metal"]}], 2, 8),  # its nodes say
    ([{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["x9.metal"]}], 0, None),
], ids=["instance types", "a GPU count bound", "from its nodes", "unknown"])
def test_a_nodepool_s_gpus_per_node_come_from_what_it_says_else_from_its_nodes(requirements, members, gpus):
    pool = copy.deepcopy(NODEPOOL)
    pool["spec"]["template"]["spec"]["requirements"] = requirements
    assert [p.gpus_per_node for p in index_of(Config(), [*karpenter_nodes(members), pool]).pools()] == [gpus]
