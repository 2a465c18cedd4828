"""Bursts of Jobs through the real apiserver, scheduler and Job controller (issue 59 item 6): what
the webhook holds for a Job is what kube-scheduler is told, so no placed pod is left unbound by
another Job taking its nodes, no Job is split over nodes it was not given, and no node goes over
its allocatable; on two replicas sharing claims, and on one."""
from __future__ import annotations

import random
import time

import pytest
from conftest import eventually
from e2e.conftest import job

GATE = "topology.scheduler/placement"
JOBS = 50


def gated(pod: dict) -> bool:
    return {"name": GATE} in (pod["spec"].get("schedulingGates") or [])


def held_nodes(pod: dict) -> set[str] | None:
    """The nodes a pod's required affinity names (None: it names no node)."""
    terms = (((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {})
             .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for expression in term.get("matchExpressions") or ():
            if expression["key"] == "kubernetes.io/hostname" and expression["operator"] == "In":
                return set(expression["values"])
    return None


def settled(cluster, namespace: str, seconds: float = 8.0) -> list[dict]:
    """The namespace's pods once nothing has been bound or released for `seconds`."""
    last, since = None, time.monotonic()
    while True:
        pods = cluster.pods(namespace)
        state = sorted((p["metadata"]["name"], p["spec"].get("nodeName") or "", gated(p)) for p in pods)
        if state != last:
            last, since = state, time.monotonic()
        elif time.monotonic() - since >= seconds:
            return pods
        time.sleep(1)


def check(cluster, namespace: str) -> None:
    pods = settled(cluster, namespace)
    used: dict[str, int] = {}
    for pod in pods:
        node = pod["spec"].get("nodeName")
        if node:
            used[node] = used.get(node, 0) + int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    everyone = [p for p in cluster.all_pods() if p["spec"].get("nodeName") and p["status"].get("phase") not in
                ("Succeeded", "Failed")]
    for node in used:
        total = sum(int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
                    for p in everyone if p["spec"]["nodeName"] == node for c in p["spec"]["containers"])
        assert total <= 8, f"node {node} over its allocatable: {total} GPUs bound"
    stranded = [p["metadata"]["name"] for p in pods if not gated(p) and not p["spec"].get("nodeName")]
    assert not stranded, f"placed pods left unbound: {stranded}"
    split = [(p["metadata"]["name"], p["spec"]["nodeName"]) for p in pods if p["spec"].get("nodeName")
             and held_nodes(p) is not None and p["spec"]["nodeName"] not in held_nodes(p)]
    assert not split, f"pods bound outside the nodes held for them: {split}"


def burst(cluster, namespace: str, seed: int) -> list[str]:
    rng = random.Random(seed)
    jobs = [job(f"b{seed}-{i}", rng.choice((2, 3, 4)), annotations={
        "topology.scheduler/placement-strategy": rng.choice(("consolidated", "consolidated", "balanced"))})
        for i in range(JOBS)]
    cluster.apply(*jobs, namespace=namespace)
    return [j["metadata"]["name"] for j in jobs]


@pytest.mark.parametrize("replicas, seed", [(2, 11), (2, 12), (1, 13)])
def test_a_burst_of_jobs_then_deletions_strands_no_placed_pod(cluster, replicas, seed):
    if replicas == 1:
        cluster.local_cluster("stop", "webhook-1")
    try:
        with cluster.namespace(f"burst{seed}") as namespace:
            names = burst(cluster, namespace, seed)
            eventually(lambda: len(cluster.pods(namespace)) >= JOBS * 2, timeout=120, what="the pods made")
            check(cluster, namespace)
            running = sorted({p["metadata"]["labels"]["job-name"] for p in cluster.pods(namespace)
                              if p["spec"].get("nodeName")})
            for name in random.Random(seed).sample(running, len(running) // 2):
                cluster.kubectl("delete", "job", name, "-n", namespace, "--wait=false")
                for pod in cluster.pods(namespace, f"job-name={name}"):  # no kubelet confirms a graceful delete
                    cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", namespace, "--grace-period=0",
                                    "--force", check=False)
            check(cluster, namespace)
            assert names
    finally:
        if replicas == 1:
            result = cluster.local_cluster("restart", "webhook-1")
            assert result.returncode == 0, result.stderr
