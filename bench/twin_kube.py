"""The twin's side of the real cluster (bench/twin.py): the clusters the policies run on, a Job of
the stream as each policy writes it, the API calls a replay makes and the watches it reads.

Ours runs on a cluster of its own, `hack/local-cluster up --kwok --nodes 64 --shape 2/2/8` (the
simulator's 512 GPUs: 2 zones x 2 spines x 2 leaves x 8 nodes of 8 H100) with one webhook replica
configured as the simulator configures ours (policies.core_config: the network's oversubscription
per level, the communication share), one stream after the other. Kueue's three modes run on one
cluster with Kueue v0.17.0 and no webhook of ours (`--kueue --replicas 0`) of 64 nodes per stream,
each stream on a partition of its own that is the simulator's cluster again: its nodes labelled
`twin.bench/partition`, their zone, spine, leaf and hostname labels named as the simulator names
them (`p1-z0-s1-l0`: Kueue breaks ties by these values, in the simulator's order; the hostname
label stays the node's name, which Kueue's TAS reads as such), a
ResourceFlavor of them and, per mode, a ClusterQueue over that flavor alone (BestEffortFIFO, or
StrictFIFO) that the stream's LocalQueue feeds. So a mode's streams run at once, each with a
Kueue queue, TAS view and GPUs of its own: Kueue's 1 s waits (the requeue batch, the topology
ungater's batch) and the Job controller's are spent side by side.
"""
from __future__ import annotations

import http.client
import pathlib
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
import yaml

from hack import kueue
from hack.cluster_nodes import gpu_nodes, parse_shape
from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

from .costmodel import Network
from .fabric import LEAF_LABEL, SPINE_LABEL, ZONE_LABEL, SimCluster
from .policies import KueueBestFit, core_config
from .scale_bench import Api
from .traces import Job

SHAPE = "2/2/8"  # spines per zone, leaves per spine, nodes per leaf: fabric.ClusterSpec()'s
NODES = 64
CONTROLLER_QPS = 200  # the Job controller creates a 32-pod Job's pods without waiting on its API rate
OURS = "ours-consolidated"
KUEUE_MODES = ("kueue", "kueue-required", "kueue-strict")
KWOK = "stage.kwok.x-k8s.io"
# KWOK runs a bound pod at once; the twin ends it (pod-complete's delay is a year: never KWOK's).
KWOK_TIMES = {**{f"pod-{stage}.{KWOK}/{delay}": "0s" for stage in ("create", "ready")
                 for delay in ("delay", "jitter-delay")},
              **{f"pod-complete.{KWOK}/{delay}": "8760h" for delay in ("delay", "jitter-delay")}}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PARTITION = "twin.bench/partition"
KUEUE_LEVEL_LABELS = dict(zip(("zone", "spine", "leaf", "hostname"), kueue.LEVELS))
# What a pod asks besides its GPUs, per GPU: an eighth of a KWOK node's allocatable (96 cpu, 1900Gi;
# webhook/kube/demo.make_node). kube-scheduler scores cpu and memory only (NodeResourcesFit's default
# resources), so in proportion its LeastAllocated spreads by GPUs, as the simulator models it
# (policies.least_allocated); at 1 cpu a pod it spread by pod count.
CPU_PER_GPU, MEMORY_PER_GPU_GI = 12, 237


@dataclass(frozen=True)
class Mode:
    """How one policy runs: what it writes on the jobs that are its own."""
    key: str
    kueue: bool
    topology: str = "preferred"  # Kueue's: the TAS annotation of a multi-pod job
    strict_fifo: bool = False


MODES = {OURS: Mode(OURS, False), "kueue": Mode("kueue", True), "kueue-required": Mode("kueue-required", True, "required"),
         "kueue-strict": Mode("kueue-strict", True, strict_fifo=True)}


def job_manifest(job: Job, name: str, mode: Mode, foreign: bool, required: KueueBestFit, partition: str = "",
                 pinned: tuple[str, ...] = ()) -> dict:
    """The Job of one stream job: its pods of `gpus_per_pod` GPUs (and cpu and memory in proportion,
    which Kueue's ClusterQueue also counts), KWOK's times; ours annotated consolidated; Kueue's queued,
    suspended, a multi-pod job with the TAS annotation the simulator's model gives it (`required`:
    policies.KueueBestFit in the required mode, reset on the cluster); a foreign job bare, kept to
    its stream's `partition` by a nodeSelector where there is one (its flavor keeps Kueue's there)
    and steered to the nodes it had in the simulation (`pinned`, when it started there) by a preferred
    node affinity, which outweighs kube-scheduler's resource scores."""
    asks = {"cpu": str(CPU_PER_GPU * job.gpus_per_pod), "memory": f"{MEMORY_PER_GPU_GI * job.gpus_per_pod}Gi"}
    template: dict = {"metadata": {"annotations": dict(KWOK_TIMES)}, "spec": {
        "restartPolicy": "Never", "containers": [{"name": "trainer", "image": "busybox", "resources": {
            "requests": asks, "limits": {**asks, "nvidia.com/gpu": str(job.gpus_per_pod)}}}]}}
    out: dict = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "annotations": {"twin.bench/job": job.job_id}},
                 "spec": {"parallelism": job.pods, "completions": job.pods, "backoffLimit": 0, "template": template}}
    if foreign:
        if partition:
            template["spec"]["nodeSelector"] = {PARTITION: partition}
        if pinned:  # preferred, not required: where the twin has parted from the simulation, it goes elsewhere
            template["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": list(pinned)}]}}]}}
        return out
    if not mode.kueue:
        out["metadata"]["annotations"]["topology.scheduler/placement-strategy"] = "consolidated"
        return out
    out["metadata"]["labels"] = {QUEUE_LABEL: kueue.QUEUE}
    out["spec"]["suspend"] = True
    if job.pods > 1:
        level = required.required_level(job.pods, job.gpus_per_pod) if mode.topology == "required" else None
        key = "required" if level else "preferred"
        template["metadata"]["annotations"][f"kueue.x-k8s.io/podset-{key}-topology"] = KUEUE_LEVEL_LABELS[
            level or "leaf"]
    return out


def webhook_settings(rendered: str, network: Network, share: float) -> str:
    """The chart's config.yaml with the levels, their oversubscription and the communication share
    of ours in the simulator (policies.core_config; simulate.policy_for)."""
    config = core_config(network)
    settings = yaml.safe_load(rendered)
    settings.update(levels=[{"label": level.label, "name": level.name, "link": level.link,
                             "oversubscription": level.oversubscription} for level in config.levels],
                    cluster_oversubscription=config.cluster_oversubscription, communication_share=share)
    return yaml.safe_dump(settings)


def cluster_flags(nodes: int) -> tuple[str, ...]:
    return ("--kwok", "--nodes", str(nodes), "--shape", SHAPE, "--controller-qps", str(CONTROLLER_QPS))


def up_ours(state: pathlib.Path, network: Network, share: float) -> Cluster:
    """Ours' cluster, up, its webhook configured as the simulator's ours."""
    cluster = start_cluster(state, *cluster_flags(NODES), "--replicas", "1")
    settings = state / "webhook" / "config.yaml"
    settings.write_text(webhook_settings(settings.read_text(), network, share))
    restarted = cluster.local_cluster("restart", "webhook-0")
    if restarted.returncode:
        stop_cluster(state)
        raise RuntimeError(f"restarting the webhook with the simulator's settings: {restarted.stderr.strip()}")
    return cluster


def real_names(partitions: int) -> list[str]:
    """The nodes `hack/local-cluster up --nodes` makes, in topology order: 64 per partition."""
    return [node["metadata"]["name"] for node in gpu_nodes(NODES * partitions, parse_shape(SHAPE))]


def partition_of(index: int) -> str:
    return f"p{index}"


def partition_labels(sim: SimCluster, index: int) -> list[dict[str, str]]:
    """The labels of partition `index`'s nodes, in topology order: the simulator's names, prefixed."""
    prefix = partition_of(index)
    return [{PARTITION: prefix, ZONE_LABEL: f"{prefix}-{n.zone}", SPINE_LABEL: f"{prefix}-{n.spine}",
             LEAF_LABEL: f"{prefix}-{n.leaf}"} for n in sim.nodes]


def up_kueue(state: pathlib.Path, partitions: int, sim: SimCluster) -> Cluster:
    """Kueue's cluster, up, its nodes labelled into `partitions` partitions and a ResourceFlavor of each."""
    cluster = start_cluster(state, *cluster_flags(NODES * partitions), "--kueue", "--replicas", "0")
    kube = Kube(cluster)
    try:
        names = real_names(partitions)
        patches = [(names[NODES * p + i], labels) for p in range(partitions)
                   for i, labels in enumerate(partition_labels(sim, p))]
        list(kube.pool.map(lambda item: kube.call("PATCH", f"/api/v1/nodes/{item[0]}", {"metadata": {"labels": item[1]}},
                                                  "application/merge-patch+json"), patches))
        for p in range(partitions):
            kube.call("POST", f"/apis/{kueue.API}/resourceflavors", flavor(p))
    finally:
        kube.close()
    return cluster


def flavor(index: int) -> dict:
    return {"apiVersion": kueue.API, "kind": "ResourceFlavor", "metadata": {"name": f"twin-{partition_of(index)}"},
            "spec": {"nodeLabels": {kueue.GPU_PRODUCT[0]: kueue.GPU_PRODUCT[1], PARTITION: partition_of(index)},
                     "topologyName": kueue.TOPOLOGY}}


def cluster_queue(index: int, mode: Mode) -> dict:
    """A ClusterQueue over partition `index`'s flavor, quota its 64 nodes' allocatable, as `mode` queues."""
    queue_ = kueue.queue_objects(gpu_nodes(NODES, parse_shape(SHAPE)), mode.strict_fifo)[2]  # its ClusterQueue
    queue_["metadata"]["name"] = f"twin-{mode.key}-{partition_of(index)}"
    for group in queue_["spec"]["resourceGroups"]:
        for entry in group["flavors"]:
            entry["name"] = f"twin-{partition_of(index)}"
    return queue_


class Kube:
    """The replay's API calls, over connections of its own (one per thread), JSON by orjson."""

    def __init__(self, cluster: Cluster) -> None:
        self.api = Api(cluster.kubeconfig)
        self.local = threading.local()
        self.pool = ThreadPoolExecutor(8)

    def call(self, method: str, path: str, body: object = None, kind: str = "application/json") -> dict:
        for attempt in range(3):
            connection = getattr(self.local, "connection", None) or self.api.connection()
            self.local.connection = connection
            try:
                connection.request(method, path, None if body is None else orjson.dumps(body),
                                   {**self.api.headers, "Content-Type": kind})
                answer = connection.getresponse()
                data = answer.read()
            except (OSError, http.client.HTTPException):
                self.local.connection = None
                if attempt == 2:
                    raise
                continue
            if answer.status >= 400:
                raise RuntimeError(f"{method} {path}: HTTP {answer.status} {data[:300]!r}")
            return orjson.loads(data) if data else {}
        raise AssertionError("unreachable")

    def create_job(self, namespace: str, manifest: dict) -> None:
        self.call("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", manifest)

    def finish_pods(self, namespace: str, names: list[str]) -> None:
        """End the pods as their kubelet would: phase Succeeded, through the status subresource."""
        list(self.pool.map(lambda name: self.call(
            "PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", {"status": {"phase": "Succeeded"}},
            "application/merge-patch+json"), names))

    def namespace(self, name: str, queue_: dict | None = None) -> None:
        """The replay's namespace, with a LocalQueue feeding `queue_` (a ClusterQueue, made if new)."""
        self.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if queue_ is not None:
            found = self.call("GET", f"/apis/{kueue.API}/clusterqueues")["items"]
            if queue_["metadata"]["name"] not in {q["metadata"]["name"] for q in found}:
                self.call("POST", f"/apis/{kueue.API}/clusterqueues", queue_)
            self.wait_active(queue_["metadata"]["name"])
            local = kueue.local_queue(name)
            local["spec"]["clusterQueue"] = queue_["metadata"]["name"]
            self.call("POST", f"/apis/{kueue.API}/namespaces/{name}/localqueues", local)

    def wait_active(self, name: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            found = self.call("GET", f"/apis/{kueue.API}/clusterqueues/{name}")
            if any(c["type"] == "Active" and c["status"] == "True" for c in (found.get("status") or {}).get("conditions") or ()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"ClusterQueue {name} not Active after {seconds:.0f} s")

    def clear(self, name: str, seconds: float = 120) -> None:
        """Delete the namespace's Jobs and pods (force: no kubelet confirms) and wait until none and
        no Kueue Workload is left, so the next replay starts on an idle cluster; then the namespace."""
        self.call("DELETE", f"/apis/batch/v1/namespaces/{name}/jobs?propagationPolicy=Background")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.call("DELETE", f"/api/v1/namespaces/{name}/pods?gracePeriodSeconds=0")
            left = len(self.call("GET", f"/api/v1/namespaces/{name}/pods")["items"])
            try:
                left += len(self.call("GET", f"/apis/{kueue.API}/namespaces/{name}/workloads")["items"])
            except RuntimeError:  # no Kueue on this cluster
                pass
            if not left:
                self.call("DELETE", f"/api/v1/namespaces/{name}")
                return
            time.sleep(0.5)
        raise RuntimeError(f"namespace {name}: pods or Workloads still there after {seconds:.0f} s")

    def close(self) -> None:
        self.pool.shutdown()


class Watch(threading.Thread):
    """A list and then a watch of one collection, each object handed on as (kind, event type,
    object, wall time received) to `into`; a watch that ends or expires is resumed or listed again."""

    def __init__(self, api: Api, kind: str, path: str, into: queue.Queue) -> None:
        super().__init__(daemon=True, name=f"watch {kind}")
        self.api, self.kind, self.path, self.into = api, kind, path, into
        self.stopped = threading.Event()
        self.connection: http.client.HTTPSConnection | None = None

    def run(self) -> None:
        version = None
        while not self.stopped.is_set():
            try:
                if version is None:
                    listing = self.api.get(self.path)
                    now = time.monotonic()
                    for item in listing.get("items") or ():
                        self.into.put((self.kind, "ADDED", item, now))
                    version = listing["metadata"]["resourceVersion"]
                version = self._follow(version)
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                if self.stopped.is_set():
                    return
                time.sleep(0.2)

    def _follow(self, version: str) -> str | None:
        self.connection = self.api.connection()
        self.connection.request("GET", f"{self.path}?watch=1&allowWatchBookmarks=true&timeoutSeconds=240"
                                       f"&resourceVersion={version}", headers=self.api.headers)
        answer = self.connection.getresponse()
        if answer.status != 200:
            return None
        while not self.stopped.is_set():
            line = answer.readline()
            if not line:
                return version
            event = orjson.loads(line)
            if event["type"] == "ERROR":
                return None  # expired: list again
            version = event["object"]["metadata"]["resourceVersion"]
            if event["type"] != "BOOKMARK":
                self.into.put((self.kind, event["type"], event["object"], time.monotonic()))
        return version

    def stop(self) -> None:
        self.stopped.set()
        if self.connection is not None and self.connection.sock is not None:
            try:
                self.connection.sock.shutdown(2)
            except OSError:
                pass
