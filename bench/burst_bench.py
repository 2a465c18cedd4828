"""A controller's burst of pods through the real control plane, with the webhook in the path and
without it: how long the pods of one large Job take to be created, and what the apiserver says
our webhook cost them.

What runs: `hack/local-cluster up --replicas 2` (etcd, kube-apiserver, kube-scheduler and
kube-controller-manager built from Kubernetes' published modules; the chart's two webhook replicas
sharing claims behind the relay that stands in for the Service; `--replicas 1`: one, called
directly), in a state folder of the bench's
own, with `--controller-qps Q` where asked (0: the controller-manager's own rate limit, 20 requests
per second, burst 30). The bench adds a zone of idle 8-GPU nodes that holds the Job, then, per
round, creates one Indexed Job of `--pods` pods of one GPU each (parallelism = completions) in a
fresh namespace and counts its pods as they appear:

- **with the webhook**: the Job carries `topology.scheduler/placement-strategy`, so the apiserver
  sends it to us (placed once: one claim), then sends us each of its pods as the Job controller
  creates them (a pod of a workload we placed: kept with its placement);
- **without**: the same Job without our annotation, which the chart's match conditions keep from
  us, so neither it nor its pods reach the webhook.

Rounds alternate which goes first. Per round: seconds from the Job's create until the apiserver
holds all its pods (and its first), counted every 50 ms, and the apiserver's own account of
calls to `placement.topology.scheduler` in that time (`apiserver_admission_webhook_admission_duration_seconds`:
count, mean and the sum over the burst, TLS and the relay included) beside the replicas' own
(`topology_scheduler_latency_seconds`). Between rounds the namespace is cleared and the bench waits
until every replica's view holds no GPU of it again.

    .venv/bin/python -m bench.burst_bench                       # 1,000 pods, 3 rounds, qps 0 and 500
    .venv/bin/python -m bench.burst_bench --pods 200 --rounds 1 --controller-qps 500
    .venv/bin/python -m bench.burst_bench --controller-qps 500 --replicas 1     # no relay between
"""
from __future__ import annotations

import argparse
import json
import pathlib
import ssl
import statistics
import sys
import tempfile
import time
import urllib.request

import orjson
from kubernetes import client as k8s_client
from prometheus_client.parser import text_string_to_metric_families

from bench.admission_bench import machine
from bench.control_plane import apiserver_metrics
from tests.conftest import eventually
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster
from webhook.kube.demo import make_node

PLACEMENT_WEBHOOK = "placement.topology.scheduler"
ZONE = "zone-burst"
LEAVES_PER_SPINE, NODES_PER_LEAF = 4, 8
POLL_SECONDS = 0.05  # between two counts of a round's pods
SETTLE_SECONDS = 2  # for the last calls to reach the apiserver's histogram after their pods are stored
IDLE_SECONDS = 120  # for both replicas' views to let go of a round's GPUs


def burst_nodes(gpus: int) -> list[dict]:
    """Idle 8-GPU nodes in a zone of their own, leaves of 8 nodes, spines of 4 leaves: at least `gpus`
    GPUs (not demo.leaf_spine_nodes: its names are the local cluster's demo nodes')."""
    count = -(-gpus // 8)
    out = []
    for i in range(count):
        spine, leaf = i // (LEAVES_PER_SPINE * NODES_PER_LEAF) + 1, i // NODES_PER_LEAF + 1
        labels = {"topology.kubernetes.io/zone": ZONE, "topology.scheduler/spine": f"burst-spine-{spine}",
                  "topology.scheduler/leaf": f"burst-leaf-{leaf}", "topology.scheduler/network-bandwidth": "400Gb"}
        out.append(make_node(f"burst-l{leaf}-n{i % NODES_PER_LEAF + 1}", labels, 8, "NVIDIA-H100-80GB-HBM3"))
    return out


def burst_job(pods: int, ours: bool) -> dict:
    """An Indexed Job of `pods` pods of one GPU each, all at once; `ours`: annotated for placement."""
    annotations = {"topology.scheduler/placement-strategy": "consolidated"} if ours else {}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "burst", "annotations": annotations},
            "spec": {"parallelism": pods, "completions": pods, "completionMode": "Indexed", "backoffLimit": 0,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [{
                         "name": "worker", "image": "busybox",
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def pods_created(core: k8s_client.CoreV1Api, namespace: str, pods: int, begun: float) -> tuple[float, float]:
    """Seconds from `begun` until the namespace holds its first pod and until it holds `pods`, by
    counting them every POLL_SECONDS: a list of one item and the count of the rest (the apiserver
    counts without sending them). A watch was tried first; on this 2-core machine its events came
    late or stopped coming under the burst."""
    first = None
    deadline = begun + 600
    while time.monotonic() < deadline:
        page = core.list_namespaced_pod(namespace, limit=1, _preload_content=False)
        answer = orjson.loads(page.data)
        count = len(answer["items"]) + (answer["metadata"].get("remainingItemCount") or 0)
        now = time.monotonic()
        if count and first is None:
            first = now - begun
        if count >= pods:
            return first or 0.0, now - begun
        time.sleep(POLL_SECONDS)
    raise RuntimeError(f"fewer than {pods} pods created in 600 s")


def apiserver_webhook_calls(api: k8s_client.ApiClient) -> dict[str, float]:
    """What the apiserver has counted of its calls to our placement webhook since it started:
    calls, seconds waiting on them, calls slower than 1 s, and calls not answered 200 (a timeout or
    a refused connection, which failurePolicy Ignore turns into an admission without us)."""
    counted = {"calls": 0.0, "seconds": 0.0, "over_1s": 0.0, "not_200": 0.0}
    for family in text_string_to_metric_families(apiserver_metrics(api)):
        for sample in family.samples:
            if sample.labels.get("name") != PLACEMENT_WEBHOOK:
                continue
            if sample.name == "apiserver_admission_webhook_admission_duration_seconds_count":
                counted["calls"] += sample.value
                counted["over_1s"] += sample.value
            elif sample.name == "apiserver_admission_webhook_admission_duration_seconds_sum":
                counted["seconds"] += sample.value
            elif sample.name == "apiserver_admission_webhook_admission_duration_seconds_bucket" and float(sample.labels["le"]) == 1.0:
                counted["over_1s"] -= sample.value
            elif sample.name == "apiserver_admission_webhook_request_total" and sample.labels.get("code") != "200":
                counted["not_200"] += sample.value
    return counted


def replica_reviews(cluster: Cluster, token: str) -> list[tuple[float, float]]:
    """Per replica, (reviews, seconds) it has spent on them since it started."""
    return [_sum_count(text, "topology_scheduler_latency_seconds") for text in _replica_metrics(cluster, token)]


def replica_gpus(cluster: Cluster, token: str) -> list[dict[str, float]]:
    """Per replica, its view's GPUs by state (total, used, reserved)."""
    out = []
    for text in _replica_metrics(cluster, token):
        out.append({sample.labels["state"]: sample.value for family in text_string_to_metric_families(text)
                    for sample in family.samples if sample.name == "topology_cluster_gpus"})
    return out


def _replica_metrics(cluster: Cluster, token: str) -> list[str]:
    commands = json.loads((cluster.state / "commands.json").read_text())
    context = ssl.create_default_context(cafile=str(cluster.state / "pki" / "ca.crt"))
    texts = []
    for name in sorted(n for n in commands if n.startswith("webhook-")):
        argv = commands[name]["argv"]
        address = argv[argv.index("--metrics-bind") + 1]
        request = urllib.request.Request(f"https://{address}/metrics", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            texts.append(answer.read().decode())
    return texts


def _sum_count(text: str, histogram: str) -> tuple[float, float]:
    samples = {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name in (f"{histogram}_count", f"{histogram}_sum")}
    return samples.get(f"{histogram}_count", 0.0), samples.get(f"{histogram}_sum", 0.0)


def wait_idle(cluster: Cluster, token: str, total: float) -> None:
    """Until every replica sees every GPU of the cluster and none used or reserved."""
    eventually(lambda: all(v.get("total") == total and not v.get("used") and not v.get("reserved")
                           for v in replica_gpus(cluster, token)),
               timeout=IDLE_SECONDS, what="every replica's view idle again")


def one_round(cluster: Cluster, token: str, pods: int, ours: bool, label: str) -> dict:
    namespace = f"burst-{label}"
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    try:
        calls_before, replicas_before = apiserver_webhook_calls(cluster.api), replica_reviews(cluster, token)
        begun = time.monotonic()
        cluster.batch.create_namespaced_job(namespace, burst_job(pods, ours), _preload_content=False)
        created = time.monotonic() - begun
        first, last = pods_created(cluster.core, namespace, pods, begun)
        time.sleep(SETTLE_SECONDS)
        calls_after, replicas_after = apiserver_webhook_calls(cluster.api), replica_reviews(cluster, token)
    finally:
        cluster.clear(namespace)
        cluster.core.delete_namespace(namespace)
    calls = {key: calls_after[key] - calls_before[key] for key in calls_before}
    return {"with": ours, "job_create_ms": created * 1000, "first_pod_s": first,
            "last_pod_s": last, "webhook_calls": int(calls["calls"]),
            "webhook_seconds": calls["seconds"], "webhook_over_1s": int(calls["over_1s"]),
            "webhook_not_200": int(calls["not_200"]),
            "replica_reviews": [int(a[0] - b[0]) for a, b in zip(replicas_after, replicas_before)],
            "replica_seconds": [a[1] - b[1] for a, b in zip(replicas_after, replicas_before)]}


def one_cluster(pods: int, rounds: int, qps: int, replicas: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="burst-") as folder:
        state = pathlib.Path(folder) / "cluster"
        cluster = start_cluster(state, "--replicas", str(replicas), *(["--controller-qps", str(qps)] if qps else []))
        try:
            token = (state / "tokens.csv").read_text().split(",", 1)[0]  # the admin's: system:masters
            for node in burst_nodes(pods):
                cluster.core.create_node(node, _preload_content=False)
            total = sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in cluster.nodes())
            wait_idle(cluster, token, total)
            results = []
            for i in range(rounds):
                for ours in ((True, False) if i % 2 == 0 else (False, True)):
                    result = one_round(cluster, token, pods, ours, f"{'with' if ours else 'without'}-{i}")
                    results.append({**result, "qps": qps})
                    print(json.dumps(result), file=sys.stderr)
                    wait_idle(cluster, token, total)
            return results
        finally:
            cluster.api.close()
            stop_cluster(state)


def report(results: list[dict], pods: int, replicas: int) -> None:
    print(f"\n{pods} pods of one Job, {replicas} webhook replica(s), {machine()}\n")
    print("| controller qps | webhook | rounds | last pod s (median, range) | first pod s | pods/s | "
          "webhook calls | apiserver's mean per call ms | calls over 1 s | calls not answered 200 | "
          "replicas' own s (split) |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    for qps in sorted({r["qps"] for r in results}):
        for ours in (False, True):
            runs = [r for r in results if r["qps"] == qps and r["with"] is ours]
            last = [r["last_pod_s"] for r in runs]
            calls = sum(r["webhook_calls"] for r in runs)
            mean_ms = sum(r["webhook_seconds"] for r in runs) / calls * 1000 if calls else 0.0
            own = statistics.median(sum(r["replica_seconds"]) for r in runs)
            split = "; ".join("/".join(str(n) for n in r["replica_reviews"]) for r in runs)
            print(f"| {qps or '20 (its own)'} | {'with' if ours else 'without'} | {len(runs)} | "
                  f"{statistics.median(last):.1f} ({min(last):.1f}-{max(last):.1f}) | "
                  f"{statistics.median(r['first_pod_s'] for r in runs):.2f} | {pods / statistics.median(last):.0f} | "
                  f"{calls} | {mean_ms:.1f} | {sum(r['webhook_over_1s'] for r in runs)} | "
                  f"{sum(r['webhook_not_200'] for r in runs)} | {own:.2f} ({split}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000, help="pods of the Job (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode and cluster (default 3)")
    parser.add_argument("--controller-qps", type=int, nargs="+", default=[0, 500],
                        help="kube-controller-manager's requests per second, one cluster each; 0: its own (default 0 500)")
    parser.add_argument("--replicas", type=int, default=2,
                        help="webhook replicas (default 2, the chart's; 1: the apiserver calls it directly, no relay)")
    args = parser.parse_args()
    results = [r for qps in args.controller_qps for r in one_cluster(args.pods, args.rounds, qps, args.replicas)]
    report(results, args.pods, args.replicas)


if __name__ == "__main__":
    main()
