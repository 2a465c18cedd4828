"""Speed and scale through the real apiserver, on KWOK nodes (issue 58 item 5): what users feel,
where the in-process benches (clusterview_bench, admission_bench) measured the webhook alone.

What runs: `hack/local-cluster up --kwok --nodes N --replicas 1 --controller-qps Q` (etcd,
kube-apiserver, kube-scheduler and kube-controller-manager from Kubernetes' published modules;
KWOK v0.8.0 as every node's kubelet: Ready nodes with Leases, bound pods Running; one webhook
replica with the chart's RBAC), in a state folder of the bench's own. Then:

1. **Sync and memory.** `--pods P` pods are created bound to the nodes (`spec.nodeName`, 10 a
   node: 4 of one GPU, 6 of none), then one more replica of the webhook is started beside the
   cluster's (`serve --kubeconfig`, not registered: its view alone), and the bench times it from
   its start until its /readyz answers 200 (the view listed every kind; Python's start, about a
   second here, included) and reads the resident memory of its processes (gunicorn's arbiter and
   its worker, which holds the view) then. With `--burst 0` neither KWOK nor the chart is needed:
   the nodes are made Ready and the pods stay Pending-bound, which the view counts the same.
2. **Bursts.** `--burst B` pods from Jobs of 4 pods of one GPU each, created at once over 16
   connections, with the webhook registered (the Jobs annotated `placement-strategy:
   consolidated`, so their pods pass through it) and without it (the MutatingWebhookConfiguration
   deleted: the same Jobs reach no webhook), `--rounds` of each, alternating which goes first:
   - pods per second to Running: B over the seconds from the first Job's create until B pods of the
     round are Running or past it (KWOK runs a pod once kube-scheduler binds it, and ends a Job's a
     few seconds later), counted every 0.5 s;
   - p99 of pod-create latency: the apiserver's own `apiserver_request_duration_seconds` for
     POST pods over the round (the Job controller's creates, our webhook's call included), from its
     histogram's buckets, interpolated as Prometheus' histogram_quantile does.
   Ratios: with over without, per round pair.

    .venv/bin/python -m bench.scale_bench                                  # 10,000 nodes, 100,000 pods
    .venv/bin/python -m bench.scale_bench --nodes 1000 --pods 10000 --burst 1000 --rounds 1
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench.admission_bench import machine
from bench.control_plane import apiserver_metrics
from hack.cluster_nodes import admin_https, post_all
from tests.e2e.conftest import ROOT, Cluster, start_cluster, stop_cluster

POLL_SECONDS = 0.5
PODS_PER_NODE, GPU_PODS_PER_NODE = 10, 4
JOB_PODS = 4
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


class Api:
    """Plain HTTPS to the apiserver with the admin's token, as hack/local-cluster creates its nodes:
    objects serialized once and POSTed over its connections at once."""

    def __init__(self, kubeconfig: str) -> None:
        self.connection, self.headers = admin_https(kubeconfig)

    def post_all(self, path: str, objects: list[dict]) -> None:
        post_all(self.connection, self.headers, path, [orjson.dumps(obj) for obj in objects])

    def get(self, path: str) -> dict:
        connection = self.connection()
        try:
            connection.request("GET", path, headers=self.headers)
            answer = connection.getresponse()
            return orjson.loads(answer.read())
        finally:
            connection.close()

    def count(self, path: str) -> int:
        """Objects a list path holds: their metadata alone (a field selector leaves the apiserver
        no count of the rest to give, as `limit=1` would)."""
        connection = self.connection()
        try:
            connection.request("GET", path, headers={**self.headers, "Accept": METADATA_LIST})
            answer = connection.getresponse()
            return len(orjson.loads(answer.read()).get("items") or [])
        finally:
            connection.close()


def bound_pods(nodes: list[str], per_node: int) -> list[dict]:
    out = []
    for node in nodes:
        for i in range(per_node):
            gpus = {"limits": {"nvidia.com/gpu": "1"}} if i < GPU_PODS_PER_NODE else {"requests": {"cpu": "100m"}}
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{node}-{i}", "namespace": "fill"},
                        "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                            "name": "c", "image": "busybox", "resources": gpus}]}})
    return out


def burst_jobs(count: int, ours: bool) -> list[dict]:
    annotations = {"topology.scheduler/placement-strategy": "consolidated"} if ours else {}
    return [{"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"b{i}", "annotations": annotations},
             "spec": {"parallelism": JOB_PODS, "completions": JOB_PODS, "backoffLimit": 0,
                      "template": {"spec": {"restartPolicy": "Never", "containers": [{
                          "name": "worker", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
            for i in range(count)]


def pod_create_buckets(cluster: Cluster) -> dict[float, float]:
    """The apiserver's cumulative histogram of POST pods durations: upper bound -> count."""
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(apiserver_metrics(cluster.api)):
        for sample in family.samples:
            labels = sample.labels
            if (sample.name == "apiserver_request_duration_seconds_bucket" and labels.get("verb") == "POST"
                    and labels.get("resource") == "pods" and not labels.get("subresource")):
                bound = float(labels["le"])
                buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return buckets


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """histogram_quantile(q) of the calls between two readings, in seconds."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, cumulative in zip(bounds, counts):
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(cumulative - below, 1e-9)
        lower, below = bound, cumulative
    return lower


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (gunicorn's worker holds the view)."""
    total, pids = 0.0, [pid]
    while pids:
        current = pids.pop()
        try:
            status = pathlib.Path(f"/proc/{current}/status").read_text()
            children = pathlib.Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")) / 1024
        pids += [int(child) for child in children]
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready(url: str, ca: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=ssl.create_default_context(cafile=ca)) as answer:
            return answer.status == 200
    except (OSError, ssl.SSLError):
        return False


def sync(cluster: Cluster, api: Api, nodes: int, pods: int) -> dict:
    """Fill the nodes with bound pods, then start one replica of the webhook (`serve`, with the
    admin's kubeconfig: not registered, only its view) and time it until /readyz answers 200."""
    names = [n["metadata"]["name"] for n in cluster.nodes()][:nodes]
    cluster.core.create_namespace({"metadata": {"name": "fill"}})
    begun = time.monotonic()
    api.post_all("/api/v1/namespaces/fill/pods", bound_pods(names, -(-pods // len(names)))[:pods])
    created = time.monotonic() - begun
    pki, port = cluster.state / "pki", free_port()
    log = open(cluster.state / "logs" / "scale-webhook.log", "wb")  # noqa: SIM115 - the child keeps it
    begun = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "webhook", "serve", "--kubeconfig", cluster.kubeconfig,
                                "--cert", str(pki / "webhook.crt"), "--key", str(pki / "webhook.key"),
                                "--bind", f"127.0.0.1:{port}", "--metrics-bind", f"127.0.0.1:{free_port()}"],
                               stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                   filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))})
    try:
        while not ready(f"https://127.0.0.1:{port}/readyz", str(pki / "ca.crt")):
            if process.poll() is not None or time.monotonic() - begun > 600:
                raise RuntimeError(f"the webhook did not become ready: {pathlib.Path(log.name).read_text()[-1500:]}")
            time.sleep(0.1)
        synced = time.monotonic() - begun
        return {"nodes": len(names), "pods": api.count("/api/v1/pods"), "create_pods_s": round(created, 1),
                "start_to_ready_s": round(synced, 1), "rss_mib": round(rss_mib(process.pid), 1)}
    finally:
        process.terminate()
        process.wait(30)


def one_burst(cluster: Cluster, api: Api, pods: int, ours: bool, label: str) -> dict:
    namespace = f"burst-{label}"
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    before = pod_create_buckets(cluster)
    begun = time.monotonic()
    api.post_all(f"/apis/batch/v1/namespaces/{namespace}/jobs", burst_jobs(pods // JOB_PODS, ours))
    # Running, or past it (KWOK ends a Job's pods a few seconds after they run)
    running = f"/api/v1/namespaces/{namespace}/pods?fieldSelector=status.phase%21%3DPending"
    deadline = begun + 1800
    while api.count(running) < pods:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{label}: fewer than {pods} pods Running in 30 min")
        time.sleep(POLL_SECONDS)
    seconds = time.monotonic() - begun
    time.sleep(2)  # the last creates reach the apiserver's histogram
    after = pod_create_buckets(cluster)
    return {"with": ours, "seconds": round(seconds, 1), "pods_per_s": round(pods / seconds, 1),
            "create_p99_ms": round(1000 * quantile(0.99, before, after), 1),
            "create_p50_ms": round(1000 * quantile(0.5, before, after), 1)}


def bursts(cluster: Cluster, api: Api, pods: int, rounds: int) -> list[dict]:
    configuration = json.loads(cluster.kubectl("get", "mutatingwebhookconfiguration", "-o", "json").stdout)["items"]
    saved = [{k: v for k, v in c.items() if k != "status"} for c in configuration]
    for c in saved:
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"):
            c["metadata"].pop(key, None)
    results = []
    for i in range(rounds):
        for ours in ((False, True) if i % 2 == 0 else (True, False)):
            if ours:
                cluster.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": saved}))
                time.sleep(2)  # the apiserver's webhook configuration cache
            else:
                cluster.kubectl("delete", "mutatingwebhookconfiguration", "--all")
                time.sleep(2)
            results.append(one_burst(cluster, api, pods, ours, f"{i}-{'with' if ours else 'without'}"))
            print(json.dumps(results[-1]), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--burst", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--controller-qps", type=int, default=500)
    parser.add_argument("--allotments", action="store_true", help="the webhook with --claims-allotments")
    parser.add_argument("--json", metavar="FILE", help="write the figures here too")
    args = parser.parse_args(argv)
    folder = pathlib.Path(tempfile.mkdtemp(prefix="scale-"))
    state = folder / "cluster"
    begun = time.monotonic()
    # Bursts need pods that run (KWOK) and the webhook registered (the chart, rendered by Helm's
    # engine); the sync alone needs neither: nodes made Ready, pods bound and left Pending-bound.
    cluster = start_cluster(state, *(("--kwok", "--replicas", "1") if args.burst else ("--replicas", "0")),
                            *(("--allotments",) if args.allotments else ()),
                            "--nodes", str(args.nodes), "--controller-qps", str(args.controller_qps))
    try:
        figures: dict = {"machine": machine(), "up_s": round(time.monotonic() - begun, 1)}
        api = Api(cluster.kubeconfig)
        figures["sync"] = sync(cluster, api, args.nodes, args.pods)
        print(json.dumps(figures), flush=True)
        figures["bursts"] = bursts(cluster, api, args.burst, args.rounds) if args.burst else []
        pairs = list(zip([r for r in figures["bursts"] if r["with"]], [r for r in figures["bursts"] if not r["with"]]))
        figures["ratios"] = [{"pods_per_s": round(w["pods_per_s"] / o["pods_per_s"], 3),
                              "create_p99_ms_added": round(w["create_p99_ms"] - o["create_p99_ms"], 1)}
                             for w, o in pairs]
        print(json.dumps(figures, indent=1))
        if args.json:
            pathlib.Path(args.json).write_text(json.dumps(figures, indent=1))
    finally:
        stop_cluster(state)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
