"""The real Kueue beside us (hack/local-cluster up --kwok --kueue: Kueue v0.17.0, its webhooks, a
Topology over zone, spine, leaf and hostname, and the ClusterQueue `gpus`). A workload Kueue
manages is never blocked by us: a Kueue TAS Job runs to completion with our webhook installed, and
ours and Kueue's Jobs share the cluster, each counting the other's pods, with no node ever over its
GPUs. The same Kueue Job on a cluster without our webhook shows what Kueue alone does.
"""
from __future__ import annotations

import json

from conftest import eventually
from e2e.conftest import job, lasting, start_cluster, stop_cluster

from hack.kueue import QUEUE, local_queue

LEAF, SPINE, ZONE = "topology.scheduler/leaf", "topology.scheduler/spine", "topology.kubernetes.io/zone"
CONSOLIDATED = {"topology.scheduler/placement-strategy": "consolidated"}


def kueue_job(name: str, pods: int, seconds: float, level: str = LEAF) -> dict:
    """A Job for Kueue's queue `gpus`, created suspended as Kueue wants it, each pod 8 GPUs (and
    the cpu and memory the ClusterQueue also counts), all of them required in one `level` domain."""
    out = lasting(job(name, pods), seconds)
    out["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "1", "memory": "1Gi"}
    out["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": QUEUE}
    out["spec"]["suspend"] = True
    out["spec"]["template"]["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"] = level
    return out


def why_not(cluster, namespace: str, name: str) -> str:
    """What holds a Kueue Job back, for a failure's message: the Job's suspend and conditions, and
    Kueue's last error about it (its middle, the object, left out)."""
    found = cluster.batch.read_namespaced_job(name, namespace)
    errors = [entry for line in (cluster.state / "logs" / "kueue.log").read_text().splitlines()
              if line.startswith("{") and f'"{namespace}/{name}"' in line
              and (entry := json.loads(line)).get("level") == "error"]
    last = f"{errors[-1]['msg']}: {errors[-1].get('error', '')}" if errors else "none"
    return (f"suspend={found.spec.suspend}, conditions={[(c.type, c.status) for c in found.status.conditions or []]}, "
            f"Kueue's last error: {last if len(last) < 400 else last[:160] + ' ... ' + last[-200:]}")


def settles(check, what: str, cluster, namespace: str, name: str, timeout: float) -> None:
    """`eventually(check)`, failing with why_not's account of the Job."""
    try:
        eventually(check, timeout=timeout, what=what)
    except AssertionError as err:
        raise AssertionError(f"{str(err).splitlines()[0]}: {why_not(cluster, namespace, name)}") from None


def finishes(cluster, namespace: str, name: str, timeout: float = 90) -> None:
    settles(lambda: cluster.complete(namespace, name), f"Job {name} Complete", cluster, namespace, name, timeout)


def domains(cluster, namespace: str, name: str, label: str) -> set[str]:
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in cluster.nodes()}
    return {labels[p["spec"]["nodeName"]][label] for p in cluster.pods(namespace, f"job-name={name}")}


def bound(cluster, namespace: str, name: str, count: int) -> bool:
    pods = cluster.pods(namespace, f"job-name={name}")
    return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)


def test_a_kueue_tas_job_runs_to_completion_with_our_webhook_installed(kwok_cluster):
    with kwok_cluster.namespace("kueue-tas") as ns:
        kwok_cluster.apply(local_queue(ns), namespace=ns)
        kwok_cluster.apply(kueue_job("tas", 4, 5), namespace=ns)
        finishes(kwok_cluster, ns, "tas")
        assert len(domains(kwok_cluster, ns, "tas", LEAF)) == 1  # where Kueue's TAS required it
        eventually(lambda: kwok_cluster.holds(ns) == [], timeout=30, what="no hold of ours left")


def test_ours_and_kueues_jobs_share_the_cluster_each_counting_the_others_pods(kwok_cluster):
    cluster = kwok_cluster
    with cluster.namespace("shared") as ns, cluster.sampling_overcommit() as overcommitted:
        cluster.apply(local_queue(ns), namespace=ns)
        taken: list[str] = []
        for name, manifest in (("kueue-1", kueue_job("kueue-1", 4, 60)),
                               ("ours-1", lasting(job("ours-1", 4, annotations=CONSOLIDATED), 60)),
                               ("kueue-2", kueue_job("kueue-2", 4, 60)),
                               ("ours-2", lasting(job("ours-2", 4, annotations=CONSOLIDATED), 60))):
            cluster.apply(manifest, namespace=ns)
            settles(lambda: bound(cluster, ns, name, 4), f"{name}'s 4 pods bound", cluster, ns, name, timeout=60)
            leaves = domains(cluster, ns, name, LEAF)
            assert len(leaves) == 1 and not leaves & set(taken), (name, leaves, taken)  # a leaf no one else uses
            taken += leaves
        for name in ("kueue-1", "ours-1", "kueue-2", "ours-2"):
            finishes(cluster, ns, name, timeout=120)
    assert overcommitted == []


def test_without_our_webhook_a_kueue_tas_job_runs_to_completion_on_generated_nodes(tmp_path):
    """What Kueue alone does with the same Job, on 64 nodes in two zones (--nodes, --shape)."""
    state = tmp_path / "kueue-alone"
    alone = start_cluster(state, "--kwok", "--kueue", "--replicas", "0", "--nodes", "64", "--shape", "2/2/8")
    try:
        nodes = alone.nodes()
        assert len(nodes) == 64
        labels = [n["metadata"]["labels"] for n in nodes]
        assert {label[ZONE] for label in labels} == {"zone-a", "zone-b"}
        assert len({label[LEAF] for label in labels}) == 8 and len({label[SPINE] for label in labels}) == 4
        registered = json.loads(alone.kubectl("get", "mutatingwebhookconfigurations", "-o", "json").stdout)["items"]
        assert [c["metadata"]["name"] for c in registered] == ["kueue-mutating-webhook-configuration"]
        with alone.namespace("kueue-alone") as ns:
            alone.apply(local_queue(ns), namespace=ns)
            manifest = kueue_job("tas", 4, 5)
            del manifest["spec"]["suspend"]  # Kueue's own webhook suspends it
            alone.apply(manifest, namespace=ns)
            finishes(alone, ns, "tas")
            assert len(domains(alone, ns, "tas", LEAF)) == 1
    finally:
        stop_cluster(state)
