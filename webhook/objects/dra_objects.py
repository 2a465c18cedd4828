"""DRA objects and PodGroups read into the facts state/dra.py keeps: ResourceSlices, ResourceClaims,
their templates, DeviceClasses, ComputeDomains and PodGroups, and a pod spec's claim references.
What each field means, and why it is read so, is told in state/dra.py."""
from __future__ import annotations

import functools
import re
import sys
from typing import Mapping

from ..core.model import GPU_RESOURCE, MAPPINGS
from ..state.devices import DraFact
from ..state.dra import (CHANNEL_CLASS, CLUSTER_SCOPED, COMPUTE_DOMAIN_LABEL, EXTENDED_RESOURCE_CLAIM, GPU_DRIVER,
                         ClaimEntry, ClaimFacts, ClaimRefs, DeviceRequest, PodGroupFacts, SliceFacts, TemplateFacts,
                         device_order)

_GPU_TYPE = re.compile(r"""\.type\s*==\s*['"]gpu['"]""")


def _mapping(value: object) -> Mapping:
    return value if isinstance(value, MAPPINGS) else {}


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def object_key(obj: Mapping) -> str:
    """namespace/name of a namespaced object, name of a cluster-scoped one."""
    meta = _mapping(obj.get("metadata"))
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name', '')}" if namespace else str(meta.get("name", ""))


def in_namespace(obj: Mapping, namespace: str) -> Mapping:
    """A namespaced DRA object from a manifest, with the namespace it is created in."""
    if obj.get("kind") in CLUSTER_SCOPED:
        return obj
    return {**obj, "metadata": {**_mapping(obj.get("metadata")), "namespace": namespace}}



def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _is_gpu(device: Mapping) -> bool:
    attributes = _mapping(device.get("attributes"))
    kind = _mapping(attributes.get("type") or attributes.get(f"{GPU_DRIVER}/type"))
    return kind.get("string") == "gpu"


def parse_slice(obj: Mapping) -> SliceFacts | None:
    """The GPU facts of a ResourceSlice; None for another driver's."""
    spec = _mapping(obj.get("spec"))
    if spec.get("driver") != GPU_DRIVER:
        return None
    pool = _mapping(spec.get("pool"))
    per_device = spec.get("perDeviceNodeSelection") is True
    by_node: dict[str, list[str]] = {}
    for device in _list(spec.get("devices")):
        device = _mapping(device)
        node = device.get("nodeName") if per_device else spec.get("nodeName")
        if node and device.get("name") and _is_gpu(device):
            by_node.setdefault(sys.intern(str(node)), []).append(sys.intern(str(device["name"])))
    gpus = tuple((node, tuple(sorted(names, key=device_order))) for node, names in by_node.items())
    return SliceFacts((GPU_DRIVER, sys.intern(str(pool.get("name", "")))), _int(pool.get("generation"), 0),
                      max(1, _int(pool.get("resourceSliceCount"), 1)), gpus)



@functools.lru_cache(maxsize=1024)
def _shared(requests: tuple[DeviceRequest, ...]) -> tuple[DeviceRequest, ...]:
    """One copy of each distinct request list: thousands of claims ask the same."""
    return requests


def parse_requests(claim_spec: Mapping) -> tuple[DeviceRequest, ...]:
    """The requests of a ResourceClaimSpec (`spec` of a claim, `spec.spec` of a template)."""
    out = []
    for i, request in enumerate(_list(_mapping(claim_spec.get("devices")).get("requests"))):
        request = _mapping(request)
        choice, where = _mapping(request.get("exactly")), f"devices.requests[{i}].exactly"
        if not choice:
            choice, where = _mapping(next(iter(_list(request.get("firstAvailable"))), None)), \
                f"devices.requests[{i}].firstAvailable[0]"
        if not choice.get("deviceClassName"):
            continue
        whole = choice.get("allocationMode") == "All"
        count = choice.get("count")
        bad = None
        if not whole and count is not None and not (_int(count, 0) >= 1):
            text = repr(count)
            bad = f"{where}.count {text if len(text) <= 40 else text[:37] + '...'}"
        out.append(DeviceRequest(str(choice["deviceClassName"]), 0 if whole else max(0, _int(count, 1)),
                                 whole, choice.get("adminAccess") is True, bad))
    return _shared(tuple(out))


def selects_gpus(device_class: Mapping) -> bool:
    """A DeviceClass of whole NVIDIA GPUs: it maps `nvidia.com/gpu`, or a selector picks the GPU
    driver's `type == 'gpu'` devices (read as text: the CEL is not evaluated)."""
    spec = _mapping(device_class.get("spec"))
    if spec.get("extendedResourceName") == GPU_RESOURCE:
        return True
    for selector in _list(spec.get("selectors")):
        expression = str(_mapping(_mapping(selector).get("cel")).get("expression", ""))
        if GPU_DRIVER in expression and _GPU_TYPE.search(expression):
            return True
    return False



def parse_template(obj: Mapping) -> TemplateFacts:
    requests = parse_requests(_mapping(_mapping(obj.get("spec")).get("spec")))
    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    return TemplateFacts(requests, COMPUTE_DOMAIN_LABEL in labels or any(r.device_class == CHANNEL_CLASS for r in requests))


def channel_template(compute_domain: Mapping) -> str | None:
    """The name of the channel template a ComputeDomain makes (`spec.channel.resourceClaimTemplate.name`)."""
    name = _mapping(_mapping(_mapping(compute_domain.get("spec")).get("channel")).get("resourceClaimTemplate")).get("name")
    return str(name) if name else None



def _allocated_node(allocation: Mapping) -> str | None:
    """The one node a node-local allocation names: `metadata.name In [node]` (or the hostname label)."""
    for term in _list(_mapping(allocation.get("nodeSelector")).get("nodeSelectorTerms")):
        term = _mapping(term)
        for expression in (*_list(term.get("matchFields")), *_list(term.get("matchExpressions"))):
            expression = _mapping(expression)
            values = _list(expression.get("values"))
            if (expression.get("key") in ("metadata.name", "kubernetes.io/hostname")
                    and expression.get("operator") == "In" and len(values) == 1):
                return str(values[0])
    return None


def parse_claim(obj: Mapping) -> ClaimFacts:
    meta = _mapping(obj.get("metadata"))
    allocation = _mapping(_mapping(obj.get("status")).get("allocation"))
    devices = tuple((sys.intern(str(r.get("pool"))), sys.intern(str(r.get("device"))))
                    for r in map(_mapping, _list(_mapping(allocation.get("devices")).get("results")))
                    if r.get("driver") == GPU_DRIVER and r.get("adminAccess") is not True)
    made_for = None
    if EXTENDED_RESOURCE_CLAIM in _mapping(meta.get("annotations")):
        made_for = next((str(o.get("uid")) for o in map(_mapping, _list(meta.get("ownerReferences")))
                         if o.get("kind") == "Pod" and o.get("controller") is True and o.get("uid")), None)
    return ClaimFacts(parse_requests(_mapping(obj.get("spec"))), _allocated_node(allocation) if allocation else None,
                      devices, made_for)


def covered_by_claim(pod: Mapping) -> bool:
    """The scheduler turned the pod's extended resources into a claim (it names it in its status):
    its GPUs are counted through that claim's devices."""
    status = _mapping(_mapping(pod.get("status")).get("extendedResourceClaimStatus"))
    return bool(status.get("resourceClaimName"))



def claim_entry(entry: Mapping) -> ClaimEntry:
    return (str(entry.get("name") or ""), str(entry.get("resourceClaimName") or ""),
            str(entry.get("resourceClaimTemplateName") or ""))



def parse_pod_group(obj: Mapping) -> PodGroupFacts:
    spec = _mapping(obj.get("spec"))
    gang = _mapping(_mapping(spec.get("schedulingPolicy")).get("gang"))
    count = gang.get("minCount")
    annotations = {str(k): str(v) for k, v in _mapping(_mapping(obj.get("metadata")).get("annotations")).items()}
    claims = frozenset(claim_entry(entry) for entry in map(_mapping, _list(spec.get("resourceClaims"))))
    made = {str(status["name"]): str(status["resourceClaimName"])
            for status in map(_mapping, _list(_mapping(obj.get("status")).get("resourceClaimStatuses")))
            if status.get("name") and status.get("resourceClaimName")}
    return PodGroupFacts(count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None,
                         annotations, claims, made)


def pod_group_of(pod_spec: Mapping) -> str | None:
    """The PodGroup a pod names (`spec.schedulingGroup.podGroupName`, Kubernetes 1.36+)."""
    name = _mapping(pod_spec.get("schedulingGroup")).get("podGroupName")
    return str(name) if name else None


def claim_refs(pod_spec: Mapping) -> ClaimRefs:
    """The claims a pod spec names, and its PodGroup."""
    return ClaimRefs(tuple(claim_entry(entry) for entry in map(_mapping, _list(pod_spec.get("resourceClaims")))),
                     pod_group_of(pod_spec))


def dra_fact(kind: str, obj: Mapping) -> DraFact:
    """A DRA object (or PodGroup, or ComputeDomain) of `kind` added or changed."""
    key = object_key(obj)
    facts: object
    if kind == "ResourceSlice":
        facts = parse_slice(obj)
    elif kind == "ResourceClaim":
        facts = parse_claim(obj)
    elif kind == "ResourceClaimTemplate":
        facts = parse_template(obj)
    elif kind == "ComputeDomain":
        # it names its channel template before its controller makes it: workloads created with it
        # are not left unknown
        channel = channel_template(obj)
        facts = f"{key.rpartition('/')[0]}/{channel}" if channel else None
    elif kind == "DeviceClass":
        facts = selects_gpus(obj)
    else:
        facts = parse_pod_group(obj)
    return DraFact(kind, key, facts)


def dra_gone(kind: str, obj: Mapping) -> DraFact:
    """A DRA object of `kind` deleted: only its metadata is read."""
    return DraFact(kind, object_key(obj), None)
