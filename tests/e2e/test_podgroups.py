"""Gang scheduling with PodGroups (scheduling.k8s.io/v1beta1), against the real kube-apiserver and
kube-scheduler (hack/local-cluster: GenericWorkload and TopologyAwareWorkloadScheduling on).

At a PodGroup's CREATE the webhook turns `topology.scheduler/max-domain: leaf` into
`spec.schedulingConstraints.topology: [{key: topology.scheduler/leaf}]`; the group's pods, which
name it in `spec.schedulingGroup.podGroupName`, are decided once for the whole gang (sized by its
minCount) and pinned to one leaf. Only the real components show that the key survives the
apiserver (it drops the field when the alpha gate is off), that kube-scheduler binds the gang all
or none inside the leaf we pinned, and that the key alone keeps a gang together.
"""
from __future__ import annotations

import copy
import json
import pathlib
import time

import yaml
from conftest import eventually
from e2e.conftest import filler, label_of
from kubernetes import client as k8s_client

ROOT = pathlib.Path(__file__).resolve().parents[2]
LEAF = "topology.scheduler/leaf"


def example() -> tuple[dict, dict]:
    """examples/podgroup-job.yaml's PodGroup and its rank-0 Pod, without their namespace."""
    group, pod = (doc for doc in yaml.safe_load_all((ROOT / "examples" / "podgroup-job.yaml").read_text()) if doc)
    for obj in (group, pod):
        del obj["metadata"]["namespace"]
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 4
    assert pod["spec"]["schedulingGroup"]["podGroupName"] == group["metadata"]["name"]
    return group, pod


def rank(pod: dict, index: int, annotated: bool = True) -> dict:
    out = copy.deepcopy(pod)
    out["metadata"]["name"] = f"rank-{index}"
    if not annotated:
        out["metadata"].pop("annotations", None)
    out["spec"]["containers"][0]["command"] = [f"--node-rank={index}" if a.startswith("--node-rank") else a
                                               for a in out["spec"]["containers"][0]["command"]]
    return out


def podgroup(cluster, namespace: str, name: str) -> dict:
    return k8s_client.CustomObjectsApi(cluster.api).get_namespaced_custom_object(
        "scheduling.k8s.io", "v1beta1", namespace, "podgroups", name)


def condition(group: dict, kind: str = "PodGroupInitiallyScheduled") -> dict | None:
    return next((c for c in (group.get("status") or {}).get("conditions") or () if c["type"] == kind), None)


def ranks(cluster, namespace: str) -> list[dict]:
    return [p for p in cluster.pods(namespace) if p["metadata"]["name"].startswith("rank-")]


def all_bound(cluster, namespace: str) -> list[dict] | None:
    """The 4 ranks once every one is bound, else None."""
    found = ranks(cluster, namespace)
    return found if len(found) == 4 and all(p["spec"].get("nodeName") for p in found) else None


def refused(cluster, namespace: str, name: str) -> dict | None:
    """The PodGroup's scheduling condition once kube-scheduler has tried the gang and refused it."""
    found = condition(podgroup(cluster, namespace, name))
    return found if found and (found["status"], found["reason"]) == ("False", "Unschedulable") else None


def pinned_leaves(pod: dict) -> set[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return {v for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"] if e["key"] == LEAF
            for v in e["values"]}


def test_a_gang_gets_our_leaf_key_and_binds_in_the_leaf_we_pinned_all_or_none(cluster):
    group, pod = example()
    with cluster.namespace("gang") as ns:
        created = json.loads(cluster.apply(group, namespace=ns).stdout)
        assert created["spec"]["schedulingConstraints"] == {"topology": [{"key": LEAF}]}
        assert podgroup(cluster, ns, group["metadata"]["name"])["spec"]["schedulingConstraints"] == {
            "topology": [{"key": LEAF}]}  # stored as written: the apiserver kept it

        cluster.apply(*(rank(pod, i) for i in range(3)), namespace=ns)  # 3 of the 4 the gang needs
        members = ranks(cluster, ns)
        for member in members:
            annotations = member["metadata"]["annotations"]
            assert annotations["topology.scheduler/reservation"] == f"{ns}/PodGroup/{group['metadata']['name']}"
            assert "as 4 pod(s) x 8" in annotations["topology.scheduler/placement"]  # sized by minCount
        leaves = {frozenset(pinned_leaves(m)) for m in members}
        assert len(leaves) == 1 and len(next(iter(leaves))) == 1, leaves
        (leaf,) = next(iter(leaves))
        assert not any(m["spec"].get("schedulingGates") for m in members)  # nothing of ours holds them back
        time.sleep(2)  # the scheduler binds a pod it can place within about a second
        assert not any(m["spec"].get("nodeName") for m in ranks(cluster, ns)), "a gang of 3 of 4 was bound"

        # Someone else takes one node of our leaf: 3 ranks would still fit there, the gang does not.
        taken = sorted(n["metadata"]["name"] for n in cluster.nodes() if n["metadata"]["labels"][LEAF] == leaf)[0]
        cluster.apply(filler(taken), namespace=ns)
        cluster.apply(rank(pod, 3), namespace=ns)
        last = next(m for m in ranks(cluster, ns) if m["metadata"]["name"] == "rank-3")
        assert pinned_leaves(last) == {leaf}  # joins the group's decision
        eventually(lambda: refused(cluster, ns, group["metadata"]["name"]), timeout=60,
                   what="kube-scheduler to try the whole gang and refuse it")
        assert not any(m["spec"].get("nodeName") for m in ranks(cluster, ns)), "part of the gang was bound"

        cluster.core.delete_namespaced_pod(f"fill-{taken}", ns, grace_period_seconds=0)
        members = eventually(lambda: all_bound(cluster, ns), timeout=60,
                             what="the whole gang bound once the leaf has room")
        nodes = {m["spec"]["nodeName"] for m in members}
        assert len(nodes) == 4 and {label_of(cluster, node, LEAF) for node in nodes} == {leaf}
        assert condition(podgroup(cluster, ns, group["metadata"]["name"]))["status"] == "True"


def test_the_key_we_write_alone_keeps_a_gang_we_do_not_place_in_the_one_leaf_it_fits(cluster):
    group, pod = example()
    with cluster.namespace("gang-key") as ns:
        # Every leaf but one gets a node taken, so one leaf alone holds 4 free nodes: the gang fits
        # there and nowhere else, while 4 single pods would fit in 25 places.
        busy = {p["spec"]["nodeName"] for p in cluster.all_pods() if p["spec"].get("nodeName")
                and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        by_leaf: dict[str, list[str]] = {}
        for node in cluster.nodes():
            by_leaf.setdefault(node["metadata"]["labels"][LEAF], []).append(node["metadata"]["name"])
        whole = sorted(leaf for leaf, nodes in by_leaf.items() if not busy & set(nodes))
        assert whole, f"no leaf with all its nodes free: {sorted(busy)}"
        target = whole[-1]
        cluster.apply(*(filler(sorted(by_leaf[leaf])[0]) for leaf in whole[:-1]), namespace=ns)
        cluster.apply(group, namespace=ns)
        cluster.apply(*(rank(pod, i, annotated=False) for i in range(4)), namespace=ns)
        members = eventually(lambda: all_bound(cluster, ns), timeout=60, what="the gang bound")
        for member in members:  # not ours: no affinity, no annotation of ours
            assert not member["spec"].get("affinity")
            assert not any(k.startswith("topology.scheduler/") for k in member["metadata"].get("annotations") or {})
        nodes = {m["spec"]["nodeName"] for m in members}
        assert len(nodes) == 4 and {label_of(cluster, node, LEAF) for node in nodes} == {target}, nodes
