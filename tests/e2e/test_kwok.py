"""Pods that run and finish (hack/local-cluster up --kwok): KWOK plays every node's kubelet, so Jobs
complete by themselves, a gated wait is started by our releaser when another Job finishes, replicas
keep every node within its GPUs under a stream of Jobs, and the chart's uninstall hook runs on a
node. No test here patches a pod's status.
"""
from __future__ import annotations

import datetime
import json
import pathlib
import subprocess
import sys

import yaml
from conftest import eventually
from e2e.conftest import FINISHED, ROOT, filler, gpus_of, job, lasting

from hack.local_cluster import NAMESPACE, hook_of, rendered_chart

GATE = "topology.scheduler/placement"
CONSOLIDATED = {"topology.scheduler/placement-strategy": "consolidated"}
SPINE, LEAF = "topology.scheduler/spine", "topology.scheduler/leaf"


def at(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def gated(pod: dict) -> bool:
    return {"name": GATE} in (pod["spec"].get("schedulingGates") or [])


def behind_our_gate(cluster, namespace: str, name: str, count: int) -> bool:
    """The Job's `count` pods are made, all held unbound by our gate."""
    pods = cluster.pods(namespace, f"job-name={name}")
    return len(pods) == count and all(gated(p) and not p["spec"].get("nodeName") for p in pods)


def scheduled_at(pod: dict) -> datetime.datetime:
    return at(next(c["lastTransitionTime"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"))


def finished_at(pod: dict) -> datetime.datetime:
    return at(pod["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])


def test_kwok_keeps_every_node_ready_with_a_lease_and_runs_a_jobs_pods_for_their_time(kwok_cluster):
    nodes = kwok_cluster.nodes()
    assert len(nodes) == 32
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True", node["metadata"]["name"]
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    leases = json.loads(kwok_cluster.kubectl("get", "leases", "-n", "kube-node-lease", "-o", "json").stdout)["items"]
    assert {lease["metadata"]["name"] for lease in leases} == {n["metadata"]["name"] for n in nodes}
    assert all(lease["spec"]["holderIdentity"] and lease["spec"]["renewTime"] for lease in leases)
    with kwok_cluster.namespace("kwok-runs") as ns:
        kwok_cluster.apply(lasting(job("short", 2), 8), namespace=ns)
        running = eventually(lambda: [p for p in kwok_cluster.pods(ns) if p["status"].get("phase") == "Running"],
                             timeout=60, what="a pod Running")
        assert running[0]["status"]["podIP"]
        eventually(lambda: kwok_cluster.complete(ns, "short"), timeout=60, what="the Job Complete")
        for pod in kwok_cluster.pods(ns):
            assert pod["status"]["phase"] == "Succeeded"
            ran = finished_at(pod) - at(pod["status"]["startTime"])
            # 8 s, to the second and KWOK's reaction: not KWOK's 1 to 5 s without the annotation
            assert datetime.timedelta(seconds=7) <= ran <= datetime.timedelta(seconds=12), ran


def test_a_gated_wait_is_released_when_another_job_finishes(kwok_cluster):
    with kwok_cluster.namespace("released") as ns, kwok_cluster.sampling_overcommit() as overcommitted:
        kwok_cluster.apply(lasting(job("filler", 32), 20), namespace=ns)  # someone's Job on every node
        eventually(lambda: sum(bool(p["spec"].get("nodeName")) for p in kwok_cluster.pods(ns, "job-name=filler")) == 32,
                   timeout=60, what="the filler on every node")
        kwok_cluster.apply(lasting(job("waiter", 4, annotations=CONSOLIDATED), 3), namespace=ns)
        eventually(lambda: behind_our_gate(kwok_cluster, ns, "waiter", 4), timeout=60,
                   what="the 4x8 waiter behind our gate")
        assert not any(p["status"].get("phase") in FINISHED for p in kwok_cluster.pods(ns, "job-name=filler"))

        eventually(lambda: kwok_cluster.complete(ns, "waiter"), timeout=120, what="the waiter Complete")
        assert kwok_cluster.complete(ns, "filler")
        waiter = kwok_cluster.pods(ns, "job-name=waiter")
        first_end = min(finished_at(p) for p in kwok_cluster.pods(ns, "job-name=filler"))
        assert all(scheduled_at(p) >= first_end for p in waiter)  # started by the filler's end, not before
        spines = {kwok_cluster.core.read_node(p["spec"]["nodeName"]).metadata.labels[SPINE] for p in waiter}
        assert len(spines) == 1, spines  # consolidated: one spine at least
    assert overcommitted == []


def test_thirty_jobs_from_two_replicas_run_to_completion_and_no_node_is_ever_over_its_gpus(kwok_cluster):
    # 350 GPUs asked of 256, in several sizes and both strategies: some wait behind our gate.
    sizes = [(4, 8), (2, 8), (1, 8), (2, 4), (1, 4), (1, 2)]
    jobs = [lasting(job(f"stream-{i}", pods, gpus, annotations={
        "topology.scheduler/placement-strategy": "consolidated" if i % 2 else "balanced"}), 4 + i % 5)
        for i, (pods, gpus) in enumerate(sizes * 5)]
    with kwok_cluster.namespace("stream") as ns, kwok_cluster.sampling_overcommit() as overcommitted:
        kwok_cluster.apply(*jobs, namespace=ns)
        eventually(lambda: any(map(gated, kwok_cluster.pods(ns))), timeout=60, what="a wait behind our gate")
        names = [j["metadata"]["name"] for j in jobs]
        eventually(lambda: all(kwok_cluster.complete(ns, name) for name in names), timeout=240,
                   what="all 30 Jobs Complete")
        pods = kwok_cluster.pods(ns)
        assert sum(gpus_of(p) for p in pods if p["status"]["phase"] == "Succeeded") == 350
        assert not [p["metadata"]["name"] for p in pods if gated(p)]  # none stranded behind our gate
        eventually(lambda: kwok_cluster.holds(ns) == [], timeout=60, what="no hold left")
        deciders = [{w["name"] for w in page["workloads"] if w["namespace"] == ns}
                    for page in kwok_cluster.topology_pages()]
        assert len(deciders) == 2 and all(deciders), deciders  # both replicas placed some of them
    assert overcommitted == []


def test_the_uninstall_hook_job_runs_on_a_node_and_lifts_our_gates(kwok_cluster, tmp_path):
    """KWOK runs no container: the hook's pod "runs" while KWOK holds it Running, and meanwhile the
    test runs what its container runs (`topology-webhook ungate --all`, the image's entrypoint and
    the hook's args) with a token of the pod's ServiceAccount bound to that pod, as the kubelet
    would mount it."""
    cluster = kwok_cluster
    hook = next(o for o in rendered_chart(2, []) if o["kind"] == "Job" and hook_of(o) == "pre-delete")
    assert hook["spec"]["template"]["spec"]["containers"][0]["args"] == ["ungate", "--all"]
    with cluster.namespace("uninstall") as ns:
        cluster.apply(*(filler(n["metadata"]["name"]) for n in cluster.nodes()), namespace=ns)  # no GPU free
        cluster.apply(job("waiter", 2, annotations=CONSOLIDATED), namespace=ns)
        eventually(lambda: behind_our_gate(cluster, ns, "waiter", 2), timeout=60, what="the waiter behind our gate")
        cluster.apply(lasting(hook, 30), namespace=NAMESPACE)
        name = hook["metadata"]["name"]
        try:
            pod = eventually(lambda: next((p for p in cluster.pods(NAMESPACE, f"job-name={name}")
                                           if p["status"].get("phase") == "Running"), None),
                             timeout=60, what="the hook's pod Running")
            assert pod["spec"]["nodeName"] in {n["metadata"]["name"] for n in cluster.nodes()}
            result = subprocess.run([sys.executable, "-m", "webhook", "ungate", "--all", "--kubeconfig",
                                     bound_kubeconfig(cluster, pod, tmp_path)], capture_output=True, text=True,
                                    timeout=120, cwd=ROOT)
            assert result.returncode == 0, result.stderr
            assert "2 pod(s) lifted" in result.stderr, result.stderr
            assert cluster.core.read_namespaced_pod(pod["metadata"]["name"], NAMESPACE).status.phase == "Running"
            eventually(lambda: cluster.complete(NAMESPACE, name), timeout=60, what="the hook Job Complete")
            assert not any(gated(p) for p in cluster.pods(ns, "job-name=waiter"))
        finally:
            cluster.batch.delete_namespaced_job(name, NAMESPACE, propagation_policy="Background")


def bound_kubeconfig(cluster, pod: dict, folder) -> str:
    """A kubeconfig with a token of the pod's ServiceAccount bound to the pod (what the kubelet
    projects into it)."""
    meta = pod["metadata"]
    token = cluster.core.create_namespaced_service_account_token(pod["spec"]["serviceAccountName"], meta["namespace"], {
        "spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]},
                 "expirationSeconds": 600}}).status.token
    config = yaml.safe_load(pathlib.Path(cluster.kubeconfig).read_text())
    config["users"][0]["user"] = {"token": token}
    path = folder / "hook.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return str(path)
