"""The built-in demo cluster: Node and Pod objects shaped exactly like `kubectl get -o yaml` output.

2 spines x 4 leaves x 4 nodes x 8 H100 SXM GPUs (one NVSwitch domain per node) in one zone,
part-occupied by a fixed pattern so a newcomer sees best-fit and fallback decisions at once.
`dra_demo_cluster` is the same cluster with its GPUs managed by NVIDIA's DRA driver: published
as ResourceSlices, no `nvidia.com/gpu` in any node's allocatable, GPUs in use allocated in
ResourceClaims (resource.k8s.io/v1, as kubernetes-sigs/dra-driver-nvidia-gpu publishes them).
"""
from __future__ import annotations

from ..core.model import GPU_RESOURCE

ZONE = "zone-a"


def make_node(name: str, labels: dict[str, str], gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3",
              annotations: dict[str, str] | None = None, unschedulable: bool = False, ready: bool = True,
              taints: list[dict] | None = None, dra: bool = False) -> dict:
    """A Node object as the API returns it (only the fields placement reads, plus the usual ones);
    `dra`: its GPUs are DRA devices, so its allocatable has no nvidia.com/gpu."""
    gpu = {} if dra else {GPU_RESOURCE: str(gpus)}
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
            "allocatable": {"cpu": "96", "memory": "1900Gi", "pods": "110", **gpu},
            "capacity": {"cpu": "96", "memory": "2000Gi", "pods": "110", **gpu},
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
                     product: str = "NVIDIA-H100-80GB-HBM3", zone: str = ZONE, dra: bool = False) -> list[dict]:
    """Nodes `spine-S-leaf-L-node-N` labelled with zone, spine `spine-S` and leaf `leaf-K` (K global)."""
    out = []
    for s in range(1, spines + 1):
        for lf in range(1, leaves + 1):
            leaf = (s - 1) * leaves + lf
            for n in range(1, nodes + 1):
                labels = {"topology.kubernetes.io/zone": zone, "topology.scheduler/spine": f"spine-{s}",
                          "topology.scheduler/leaf": f"leaf-{leaf}", "topology.scheduler/network-bandwidth": "400Gb"}
                out.append(make_node(f"gpu-s{s}-l{leaf}-n{n}", labels, gpus, product, dra=dra))
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


# ----- the same cluster under DRA ----------------------------------------------------------------

GPU_DRIVER = "gpu.nvidia.com"


def gpu_device_class() -> dict:
    """NVIDIA's DeviceClass of whole GPUs, as its Helm chart installs it on resource.k8s.io/v1."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_DRIVER},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                          "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
                     "extendedResourceName": GPU_RESOURCE}}


def make_resource_slice(node: str, gpus: int = 8, generation: int = 1, slice_count: int = 1,
                        product: str = "NVIDIA H100 80GB HBM3", devices: list[str] | None = None) -> dict:
    """The driver's ResourceSlice of one node: a pool named after the node, devices gpu-0..gpu-(n-1)."""
    names = devices if devices is not None else [f"gpu-{i}" for i in range(gpus)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{GPU_DRIVER}-{generation}-{len(names)}"},
            "spec": {"driver": GPU_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": slice_count},
                     "devices": [{"name": name, "attributes": {
                         "type": {"string": "gpu"}, "productName": {"string": product},
                         "uuid": {"string": f"GPU-{node}-{name}"},
                         "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{i // 2:02x}"}},
                         "capacity": {"memory": {"value": "80Gi"}}} for i, name in enumerate(names)]}}


def make_allocated_claim(name: str, node: str, devices: list[str], namespace: str = "default",
                         owner_pod: dict | None = None, extended: bool = False) -> dict:
    """A ResourceClaim the scheduler allocated `devices` of `node` to; `owner_pod`: made for it (from
    its template, or by the scheduler for its nvidia.com/gpu when `extended`)."""
    meta: dict = {"name": name, "namespace": namespace, "uid": f"uid-claim-{namespace}-{name}"}
    if owner_pod is not None:
        pod_meta = owner_pod["metadata"]
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": pod_meta["name"],
                                    "uid": pod_meta["uid"], "controller": True, "blockOwnerDeletion": True}]
    if extended:
        meta["annotations"] = {"resource.kubernetes.io/extended-resource-claim": "true"}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": GPU_DRIVER, "allocationMode": "ExactCount", "count": len(devices)}}]}},
            "status": {"allocation": {
                "devices": {"results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": node, "device": device}
                                        for device in devices]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}


def dra_demo_cluster() -> tuple[list[dict], list[dict]]:
    """The demo cluster under DRA: Nodes, ResourceSlices and the GPU DeviceClass, and the allocated
    ResourceClaims that part-occupy it as the demo's pods do."""
    nodes = leaf_spine_nodes(dra=True)
    claims = []
    for i, node in enumerate(nodes):
        used = _DEMO_USAGE[i % len(_DEMO_USAGE)]
        if used:
            name = node["metadata"]["name"]
            claims.append(make_allocated_claim(f"busy-{name}-gpu", name, [f"gpu-{g}" for g in range(used)],
                                               namespace="research"))
    slices = [make_resource_slice(n["metadata"]["name"]) for n in nodes]
    return [*nodes, *slices, gpu_device_class()], claims


def gb200_dra_cluster(cliques: int = 2, nodes_per_clique: int = 18) -> list[dict]:
    """GB200 NVL72 racks under DRA: per clique (one multi-node NVLink domain, GPU Feature
    Discovery's `nvidia.com/gpu.clique` label) 18 nodes of 4 GPUs, their ResourceSlices and the GPU
    DeviceClass; the levels are the `nvl72` preset's."""
    out: list[dict] = [gpu_device_class()]
    for c in range(cliques):
        for n in range(1, nodes_per_clique + 1):
            name = f"gb200-c{c}-n{n:02d}"
            labels = {"topology.kubernetes.io/zone": ZONE, "topology.scheduler/spine": "spine-1",
                      "nvidia.com/gpu.clique": f"7f1c52a4-0d3e-4b8e-9c61-2a7d5e0f9b13.{c}"}
            out.append(make_node(name, labels, 4, "NVIDIA-GB200", dra=True))
            out.append(make_resource_slice(name, 4, product="NVIDIA GB200"))
    return out
