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
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client as k8s_client
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import Cluster, start_cluster, stop_cluster

LOADERS = 8  # threads creating the cluster's objects: the apiserver takes them in parallel


def apiserver_metrics(api: k8s_client.ApiClient) -> str:
    """The apiserver's own /metrics, read with the client's credentials."""
    method, url, headers, body, _ = api.param_serialize("GET", "/metrics", auth_settings=["BearerToken"])
    response = api.call_api(method, url, header_params=headers, body=body)
    response.read()
    return response.data.decode()


class RealControlPlane:
    """Started by `start()` (the end-to-end tests' own start, with --bare), stopped by `stop()`
    (also when start failed halfway)."""

    def __init__(self, state: pathlib.Path) -> None:
        self.state = state
        self.cluster: Cluster | None = None

    @property
    def api(self) -> Any:
        assert self.cluster is not None, "start() first"
        return self.cluster.api

    def start(self) -> str:
        """Up, and the admin's kubeconfig path (system:masters: the bench's webhooks need no RBAC)."""
        self.cluster = start_cluster(self.state, "--bare")
        return self.cluster.kubeconfig

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
        writes = conflicts = 0
        for family in text_string_to_metric_families(apiserver_metrics(self.api)):
            for sample in family.samples:
                labels = sample.labels
                if (sample.name == "apiserver_request_total" and labels.get("resource") == "leases"
                        and labels.get("verb") in ("PUT", "POST")):
                    writes += int(sample.value)
                    conflicts += int(sample.value) if labels.get("code") == "409" else 0
        return writes, conflicts

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.api.close()
        stop_cluster(self.state)
