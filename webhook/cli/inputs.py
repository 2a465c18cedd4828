"""What `serve` and `mutate` read: the cluster from --nodes/--pods files (or the built-in demo
cluster), each file and object within the size limits, and the cluster index made of them."""
from __future__ import annotations

import argparse
import json
import logging
from typing import Callable

from ..kube import demo
from ..objects import feed
from ..objects.autoscaler_objects import is_growth_object
from ..objects.manifests import ManifestError, read_objects
from ..serving.app import Readiness
from ..settings.config import Config
from ..state.dra import DRA_KINDS, RESOURCE_SLICE_MAX_DEVICES
from ..state.index import ClusterIndex
from .program import UsageError, log

# What the input files may hold (docs/reference/cli.md#input-limits): larger files are refused before they
# are parsed, and no object is larger than the apiserver would store.
MiB = 1024 * 1024
CLUSTER_FILE_MAX_BYTES = 64 * MiB  # --nodes, --pods: a cluster of thousands of nodes and their pods
MANIFEST_FILE_MAX_BYTES = 16 * MiB  # each -f file (or stdin)
OBJECT_MAX_BYTES = 3 * MiB  # the apiserver's request body limit: no object it holds is larger


def within_api_limits(path: str, objects: list[dict]) -> list[dict]:
    """The objects, refused (ManifestError naming the file and the object) where the apiserver
    would refuse them: larger than its request limit as JSON, or a ResourceSlice with more devices
    than resource.k8s.io/v1 allows (ResourceSliceMaxDevices)."""
    source = "stdin" if path == "-" else path
    for obj in objects:
        meta = obj.get("metadata") or {}
        namespace = f"{meta['namespace']}/" if meta.get("namespace") else ""
        name = f"{obj['kind']} {namespace}{meta.get('name') or meta.get('generateName') or '?'}"
        try:
            text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=str)
        except (RecursionError, ValueError):
            raise ManifestError(f"{source}: {name}: nested too deeply or recursive; no Kubernetes object is") from None
        size = len(text) if len(text) > OBJECT_MAX_BYTES else len(text.encode("utf-8", "surrogatepass"))
        if size > OBJECT_MAX_BYTES:
            raise ManifestError(f"{source}: {name} is {size} bytes as JSON; allowed: at most {OBJECT_MAX_BYTES} "
                                "bytes (3 MiB, the apiserver's request limit)")
        devices = (obj.get("spec") or {}).get("devices") if obj["kind"] == "ResourceSlice" else None
        if isinstance(devices, list) and len(devices) > RESOURCE_SLICE_MAX_DEVICES:
            raise ManifestError(f"{source}: {name}: spec.devices: Too many: {len(devices)}: must have at most "
                                f"{RESOURCE_SLICE_MAX_DEVICES} items")
    return objects


def read_cluster(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Node and Pod objects from --nodes / --pods, each file with any of the DRA kinds mixed in
    (ResourceSlices, DeviceClasses, ResourceClaims, their templates, PodGroups), or the built-in
    demo cluster without --nodes."""
    if not args.nodes:
        if args.pods:
            raise UsageError("--pods needs --nodes (without --nodes the built-in demo cluster is used)")
        return demo.demo_cluster()
    nodes = node_file(args.nodes)
    pods = within_api_limits(args.pods, read_objects(args.pods, kind=("Pod", *DRA_KINDS),
                                                     max_bytes=CLUSTER_FILE_MAX_BYTES)) if args.pods else []
    return nodes, pods


def node_file(path: str) -> list[dict]:
    """Node objects, with the autoscaler objects that say how the cluster can grow among them, as
    `kubectl get nodes,nodepools -o yaml` prints them (plus cluster-autoscaler's status ConfigMap),
    and any of the DRA kinds (state/dra.py), as `kubectl get nodes,resourceslices,deviceclasses`."""
    objects = read_objects(path, max_bytes=CLUSTER_FILE_MAX_BYTES)
    for obj in objects:
        if obj["kind"] != "Node" and obj["kind"] not in DRA_KINDS and not is_growth_object(obj, obj["kind"]):
            raise ManifestError(f"{path}: {obj['kind']} {(obj.get('metadata') or {}).get('name', '?')} found; this "
                                "file may only hold Node objects, Karpenter NodePools, the ConfigMap "
                                "kube-system/cluster-autoscaler-status and DRA objects (ResourceSlices, "
                                "DeviceClasses...)")
    return within_api_limits(path, objects)


def say_levels(index: ClusterIndex, warn: Callable[[str], None], level: int = logging.INFO) -> None:
    """Which levels `levels: auto` chose from the nodes' labels, and through `warn` why none fit."""
    if index.preset is None:
        return
    log.log(level, "levels: auto chose the %s preset: %s", index.preset, ", ".join(lv.label for lv in index.config.levels))
    if index.levels_warning:
        warn(index.levels_warning)


def file_index(config: Config, cluster: tuple[list[dict], list[dict]]) -> tuple[ClusterIndex, Readiness]:
    """The cluster index and its readiness check from files or the demo: complete at once, so
    always ready."""
    nodes, pods = cluster
    index = feed.index_of(config, nodes, pods)
    for warning in index.inventory_warnings():
        log.warning("%s", warning)
    return index, lambda: (True, "")
