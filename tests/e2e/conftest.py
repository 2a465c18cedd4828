"""The real control plane for end-to-end tests: `hack/local-cluster up` once per session and mode.

`cluster` is the demo topology's 32 device-plugin nodes (2 spines x 4 leaves x 4 nodes x 8 H100, as
tests/fixtures/demo-nodes.yaml has them) with two webhook replicas sharing claims; `dra_cluster`
the same nodes under DRA. Both are the real kube-apiserver, kube-scheduler and
kube-controller-manager built from Kubernetes' published modules (hack/kube/). There are no
kubelets: the scheduler binds pods, which stay Pending-bound; a test ends a pod by patching its
status, as a kubelet would. `kwok_cluster` is the same 32 nodes played by KWOK (pods go Running and
Jobs' pods finish after the time `lasting` gives them) with Kueue beside the two replicas. Each test
works in a namespace of its own, which `Cluster.namespace` force-deletes afterwards (no kubelet
confirms a graceful deletion), so the GPUs are free again.

Everything here is marked `e2e` (`pytest -m "not e2e"` runs the rest without Go).
"""
from __future__ import annotations

import contextlib
import json
import pathlib
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Iterator

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
UP_SECONDS = 3600  # a cold build on a fresh 2-core machine is in there
HERE = pathlib.Path(__file__).resolve().parent
GPU = "nvidia.com/gpu"
FINISHED = ("Succeeded", "Failed")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class Cluster:
    state: pathlib.Path
    kubeconfig: str
    binary: str
    api: k8s_client.ApiClient

    @property
    def core(self) -> k8s_client.CoreV1Api:
        return k8s_client.CoreV1Api(self.api)

    @property
    def batch(self) -> k8s_client.BatchV1Api:
        return k8s_client.BatchV1Api(self.api)

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([self.binary, "kubectl", "--kubeconfig", self.kubeconfig, *args], input=stdin,
                                capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result

    def apply(self, *objects: dict, namespace: str, dry_run: bool = False) -> subprocess.CompletedProcess:
        args = ["apply", "-n", namespace, "-o", "json", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
        return self.kubectl(*args, stdin=yaml.safe_dump_all(objects))

    def local_cluster(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(ROOT / "hack" / "local-cluster"), "--state", str(self.state), *args],
                              capture_output=True, text=True, timeout=300)

    def pods(self, namespace: str, selector: str = "") -> list[dict]:
        answer = self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        return json.loads(answer.data)["items"]

    def all_pods(self) -> list[dict]:
        return json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]

    def nodes(self) -> list[dict]:
        return json.loads(self.core.list_node(_preload_content=False).data)["items"]

    @contextlib.contextmanager
    def namespace(self, prefix: str) -> Iterator[str]:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        self.core.create_namespace({"metadata": {"name": name}})
        try:
            yield name
        finally:
            self.clear(name)
            self.core.delete_namespace(name)

    def clear(self, namespace: str) -> None:
        """Delete the namespace's workloads and force-delete its pods (no kubelet confirms)."""
        propagation = {"propagation_policy": "Background"}
        for job in self.batch.list_namespaced_job(namespace).items:
            self.batch.delete_namespaced_job(job.metadata.name, namespace, **propagation)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pods = self.pods(namespace)
            if not pods:
                return
            for pod in pods:
                with contextlib.suppress(k8s_client.ApiException):
                    self.core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
            time.sleep(0.3)

    def finish(self, pod: dict) -> None:
        """End a running pod as its kubelet would: phase Succeeded, through the status subresource."""
        meta = pod["metadata"]
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": {"phase": "Succeeded"}})

    def complete(self, namespace: str, name: str) -> bool:
        """Whether the Job is Complete."""
        conditions = self.batch.read_namespaced_job_status(name, namespace).status.conditions or []
        return any(c.type == "Complete" and c.status == "True" for c in conditions)

    def overcommitted(self) -> list[str]:
        """Nodes whose bound, unfinished pods ask more GPUs than the node has, as `node used/allocatable`."""
        used: dict[str, int] = {}
        for pod in self.all_pods():
            node = pod["spec"].get("nodeName")
            if node and pod.get("status", {}).get("phase") not in FINISHED:
                used[node] = used.get(node, 0) + gpus_of(pod)
        allocatable = {n["metadata"]["name"]: int(n["status"]["allocatable"].get(GPU, 0)) for n in self.nodes()}
        return [f"{node} {count}/{allocatable[node]}" for node, count in sorted(used.items())
                if count > allocatable[node]]

    @contextlib.contextmanager
    def sampling_overcommit(self, every: float = 0.5) -> Iterator[list[str]]:
        """While the block runs, `overcommitted()` every `every` s; the list it yields collects what
        any sample found."""
        found: list[str] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(every):
                found.extend(self.overcommitted())
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            yield found
        finally:
            done.set()
            sampler.join()
            found.extend(self.overcommitted())

    def topology_pages(self) -> list[dict]:
        """Each replica's /topology.json, read with the admin's token (it may read everything)."""
        token = yaml.safe_load(pathlib.Path(self.kubeconfig).read_text())["users"][0]["user"]["token"]
        replies = answers(self, "/topology.json", token)
        assert replies and all(status == 200 for status, _ in replies), replies
        return [json.loads(body) for _, body in replies]

    def holds(self, namespace: str) -> list[dict]:
        """The GPU holds any replica keeps for `namespace`'s workloads."""
        return [hold for page in self.topology_pages() for hold in page["holds"] if hold["namespace"] == namespace]


def start_cluster(state: pathlib.Path, *flags: str) -> Cluster:
    try:
        result = subprocess.run([str(ROOT / "hack" / "local-cluster"), "--state", str(state), "up", *flags],
                                capture_output=True, text=True, timeout=UP_SECONDS)
    except subprocess.TimeoutExpired:
        stop_cluster(state)  # `up` was killed: what it had started is stopped by PID
        raise
    assert result.returncode == 0, f"hack/local-cluster up failed: {result.stderr.strip()[-2000:]}"
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("export KUBECONFIG="), result.stdout
    kubeconfig = last.partition("=")[2]
    info = json.loads((state / "cluster.json").read_text())
    return Cluster(state, kubeconfig, info["binary"], k8s_config.new_client_from_config(kubeconfig))


def stop_cluster(state: pathlib.Path) -> None:
    result = subprocess.run([str(ROOT / "hack" / "local-cluster"), "--state", str(state), "down"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("local-cluster")
    running = start_cluster(state, "--replicas", "2")
    yield running
    stop_cluster(state)


@pytest.fixture(scope="session")
def dra_cluster(tmp_path_factory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("local-cluster-dra")
    running = start_cluster(state, "--dra", "--replicas", "1")
    yield running
    stop_cluster(state)


@pytest.fixture(scope="session")
def kwok_cluster(tmp_path_factory) -> Iterator[Cluster]:
    state = tmp_path_factory.mktemp("local-cluster-kwok")
    running = start_cluster(state, "--kwok", "--kueue", "--replicas", "2")
    yield running
    stop_cluster(state)


def job(name: str, pods: int, gpus: int = 8, annotations: dict | None = None, **template_spec) -> dict:
    """An annotated Job of `pods` pods asking `gpus` GPUs each through the device plugin."""
    spec = {"restartPolicy": "Never", "containers": [{
        "name": "trainer", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        **template_spec}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": spec}}}


def filler(node: str, gpus: int = 8) -> dict:
    """A pod holding `gpus` GPUs of `node`, bound there directly (the scheduler and the webhook
    leave a bound pod alone): someone else's work."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"fill-{node}"},
            "spec": {"nodeName": node, "restartPolicy": "Never", "containers": [{
                "name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def label_of(cluster: Cluster, node: str, label: str) -> str:
    return next(n for n in cluster.nodes() if n["metadata"]["name"] == node)["metadata"]["labels"][label]


def lasting(workload: dict, seconds: float) -> dict:
    """`workload` (a Job) whose pods KWOK finishes `seconds` after they run: the delay and its
    jitter both, so the time is exact."""
    metadata = workload["spec"]["template"].setdefault("metadata", {})
    metadata.setdefault("annotations", {}).update({f"pod-complete.stage.kwok.x-k8s.io/{key}": f"{seconds}s"
                                                   for key in ("delay", "jitter-delay")})
    return workload


def gpus_of(pod: dict) -> int:
    return sum(int((c.get("resources") or {}).get("limits", {}).get(GPU, 0)) for c in pod["spec"]["containers"])


def metrics_ports(cluster) -> list[str]:
    commands = json.loads((cluster.state / "commands.json").read_text())
    return [argv[argv.index("--metrics-bind") + 1].rpartition(":")[2] for name, command in sorted(commands.items())
            if name.startswith("webhook-") and (argv := command["argv"])]


def answers(cluster, path: str, token: str | None) -> list[tuple[int, str]]:
    """What each replica answers on its metrics port (each shows the decisions it made): status, body."""
    context = ssl.create_default_context(cafile=str(cluster.state / "pki" / "ca.crt"))
    out = []
    for port in metrics_ports(cluster):
        request = urllib.request.Request(f"https://127.0.0.1:{port}{path}",
                                         headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as answer:  # noqa: S310 - loopback
                out.append((answer.status, answer.read().decode()))
        except urllib.error.HTTPError as err:
            out.append((err.code, err.read().decode()))
    return out


def read(cluster, path: str, token: str | None) -> tuple[set[int], str]:
    """Every replica's answer: the statuses, and the bodies."""
    replies = answers(cluster, path, token)
    return {status for status, _ in replies}, "\n".join(body for _, body in replies)
