"""The real control plane for a bench: `hack/local-cluster up --bare` (etcd, kube-apiserver,
kube-scheduler and kube-controller-manager built from Kubernetes' published modules, with no
nodes and no webhook) in a state folder of the bench's own, the bench's cluster created through
the API, and the apiserver's own count of Lease writes (its `apiserver_request_total`).

Where the benches' fake API server (tests/integration/fakeapiserver.py) stands in for it, this
says what the real one does with the same load: its storage is etcd, its writes are
compare-and-swap on etcd revisions, and its watches are what a cluster's are.
"""
from __future__ import annotations

import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from prometheus_client.parser import text_string_to_metric_families

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOADERS = 8  # threads creating the cluster's objects: the apiserver takes them in parallel


class RealControlPlane:
    """Started by `start()`, stopped by `stop()` (also when start failed halfway)."""

    def __init__(self, state: pathlib.Path) -> None:
        self.state = state
        self.kubeconfig = ""
        self.api: Any = None

    def _local_cluster(self, *args: str) -> str:
        done = subprocess.run([sys.executable, str(ROOT / "hack" / "local_cluster.py"), "--state", str(self.state),
                               *args], capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"hack/local-cluster {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def start(self) -> str:
        """Up, and the admin's kubeconfig path (system:masters: the bench's webhooks need no RBAC)."""
        self.kubeconfig = self._local_cluster("up", "--bare").strip().splitlines()[-1].removeprefix("export KUBECONFIG=")
        configuration = k8s_client.Configuration()
        k8s_config.load_kube_config(self.kubeconfig, client_configuration=configuration)
        configuration.connection_pool_maxsize = LOADERS
        self.api = k8s_client.ApiClient(configuration)
        return self.kubeconfig

    def load(self, nodes: list[dict], pods: list[dict], namespaces: list[str]) -> None:
        """Namespaces, then nodes with their status (the apiserver keeps it on create: no kubelet
        will write it), then pods bound at create (spec.nodeName), as a running cluster has them."""
        core = k8s_client.CoreV1Api(self.api)
        for name in namespaces:
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        with ThreadPoolExecutor(LOADERS) as pool:
            list(pool.map(lambda node: core.create_node(node, _preload_content=False), nodes))
            list(pool.map(lambda pod: core.create_namespaced_pod(pod["metadata"]["namespace"], pod,
                                                                 _preload_content=False), pods))

    def lease_writes(self) -> tuple[int, int]:
        """(Lease writes, those answered 409) the apiserver has served since it started: every
        PUT and POST on leases, the apiserver's own identity Lease (one renewal in 10 s) included."""
        method, url, headers, body, _ = self.api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
        response = self.api.call_api(method, url, header_params=headers, body=body)
        response.read()
        writes = conflicts = 0
        for family in text_string_to_metric_families(response.data.decode()):
            for sample in family.samples:
                labels = sample.labels
                if (sample.name == "apiserver_request_total" and labels.get("resource") == "leases"
                        and labels.get("verb") in ("PUT", "POST")):
                    writes += int(sample.value)
                    conflicts += int(sample.value) if labels.get("code") == "409" else 0
        return writes, conflicts

    def stop(self) -> None:
        if self.api is not None:
            self.api.close()
        self._local_cluster("down")
