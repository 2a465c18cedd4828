"""The built-in demo cluster: Node and Pod objects shaped exactly like `kubectl get -o yaml` output.

2 spines x 4 leaves x 4 nodes x 8 H100 SXM GPUs (one NVSwitch domain per node) in one zone,
part-occupied by a fixed pattern so a newcomer sees best-fit and fallback decisions at once.
"""
from __future__ import annotations

from ..core.model import GPU_RESOURCE

ZONE = "zone-a"


def make_node(name: str, labels: dict[str, str], gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3",
              annotations: dict[str, str] | None = None, unschedulable: bool = False, ready: bool = True,
              taints: list[dict] | None = None) -> dict:
    """A Node object as the API returns it (only the fields placement reads, plus the usual ones)."""
    node: dict = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus), **labels},
            "annotations": dict(annotations or {}),
        },
        "spec": {"taints": list(taints)} if taints else {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1900Gi", "pods": "110", GPU_RESOURCE: str(gpus)},
            "capacity": {"cpu": "96", "memory": "2000Gi", "pods": "110", GPU_RESOURCE: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}],
        },
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    return node


def make_pod(name: str, node: str | None, gpus: int, namespace: str = "default", phase: str = "Running",
             annotations: dict[str, str] | None = None) -> dict:
    """A Pod bound to `node` (or pending when None) whose one container asks for `gpus` GPUs."""
    spec: dict = {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                  "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                         "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": phase}}


def leaf_spine_nodes(spines: int = 2, leaves: int = 4, nodes: int = 4, gpus: int = 8,
                     product: str = "NVIDIA-H100-80GB-HBM3", zone: str = ZONE) -> list[dict]:
    """Nodes `spine-S-leaf-L-node-N` labelled with zone, spine `spine-S` and leaf `leaf-K` (K global)."""
    out = []
    for s in range(1, spines + 1):
        for lf in range(1, leaves + 1):
            leaf = (s - 1) * leaves + lf
            for n in range(1, nodes + 1):
                labels = {"topology.kubernetes.io/zone": zone, "topology.scheduler/spine": f"spine-{s}",
                          "topology.scheduler/leaf": f"leaf-{leaf}", "topology.scheduler/network-bandwidth": "400Gb"}
                out.append(make_node(f"gpu-s{s}-l{leaf}-n{n}", labels, gpus, product))
    return out


# GPUs in use per node index, repeating: some full nodes, some half-used, some empty.
_DEMO_USAGE = (8, 4, 0, 0, 8, 8, 2, 0, 0, 0, 0, 0, 6, 1, 0, 8)


def demo_cluster() -> tuple[list[dict], list[dict]]:
    """The demo's nodes and the running pods that part-occupy them."""
    nodes = leaf_spine_nodes()
    pods = []
    for i, node in enumerate(nodes):
        used = _DEMO_USAGE[i % len(_DEMO_USAGE)]
        if used:
            name = node["metadata"]["name"]
            pods.append(make_pod(f"busy-{name}", name, used, namespace="research"))
    return nodes, pods
