"""Dynamic Resource Allocation (`resource.k8s.io/v1`) and PodGroups (`scheduling.k8s.io`), read
as GPUs per node: API objects in, GPU devices per node, GPUs in use and GPU demand out. Pure.

Inventory. A node whose GPUs the NVIDIA DRA driver manages advertises no `nvidia.com/gpu` in its
allocatable; its GPUs are the devices of driver `gpu.nvidia.com` with attribute `type: gpu` in
the ResourceSlices that name it (`spec.nodeName`, or a device's own `nodeName` under
`perDeviceNodeSelection`). Per (driver, pool) only the slices of the newest `pool.generation`
count, and a pool that has fewer of them than its `resourceSliceCount` is still being published:
its GPUs are unknown, so none are counted and a warning says so (KEP-4381). Slices for several
nodes (`nodeSelector`, `allNodes`) are multi-host devices, not a node's GPUs, and are left out.
MIG devices are not GPUs here: a GPU with one of its MIG devices allocated counts as in use.
A node's GPUs are numbered 0..n-1 in the order of their device names (gpu-0, gpu-1, ... gpu-10).

In use: the GPU devices allocated in ResourceClaims (`status.allocation.devices.results`), on the
node its `status.allocation.nodeSelector` names, each device once however many claims hold it.
A pod whose `nvidia.com/gpu` was turned into a claim by the scheduler (DRA extended resources,
KEP-5004) is counted through that claim only: the pod names it in
`status.extendedResourceClaimStatus`, and the claim carries the extended-resource-claim
annotation with the pod as its controller.

Demand. A pod's `spec.resourceClaims` name ResourceClaimTemplates or ResourceClaims; a request on
a GPU DeviceClass (one that maps `nvidia.com/gpu` or selects the driver's `type == 'gpu'`
devices; NVIDIA's `gpu.nvidia.com` when no DeviceClass of that name is known) asks for GPUs:
`exactly.count` (default 1), `allocationMode: All` every GPU of one node, `firstAvailable` its
first choice (the scheduler tries it first). CEL selectors are not evaluated: a selector narrows
which GPUs, never how many. A pod's entry equal to one of its PodGroup's `resourceClaims` (KEP-5729)
is the one claim made for the whole group, so its GPUs are shared by the group's pods.

ComputeDomains (NVIDIA's multi-node NVLink, GB200 NVL72): a ComputeDomain names the
ResourceClaimTemplate of its IMEX channel, which its controller creates; pods that claim from it
are one workload's ranks and must share one NVLink domain. No device attribute says which NVLink
domain a GPU is in (the `nvidia.com/gpu.clique` node label does), so that is a node-level
constraint: the workload is kept inside one clique (webhook/objects/workload.py).
"""
from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..core.model import GPU_RESOURCE

RESOURCE_GROUP = "resource.k8s.io"
SCHEDULING_GROUP = "scheduling.k8s.io"
GPU_DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"  # NVIDIA's DeviceClass of whole GPUs (its Helm chart)
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
DRA_KINDS = ("ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", "DeviceClass", "PodGroup", "ComputeDomain")
CHANNEL_CLASS = "compute-domain-default-channel.nvidia.com"  # a ComputeDomain's IMEX channel
COMPUTE_DOMAIN_LABEL = "resource.nvidia.com/computeDomain"  # on the channel template its controller makes
CLIQUE_LABEL = "nvidia.com/gpu.clique"  # the NVLink domain of a node (GPU Feature Discovery)
CLUSTER_SCOPED = ("ResourceSlice", "DeviceClass")
RESOURCE_SLICE_MAX_DEVICES = 128  # ResourceSliceMaxDevices of resource.k8s.io/v1: more, and the API refuses the slice
_GPU_TYPE = re.compile(r"""\.type\s*==\s*['"]gpu['"]""")
_MIG_SUFFIX = re.compile(r"-mig-.*$")
_NUMBER = re.compile(r"(\d+)")

Pool = tuple[str, str]  # (driver, pool name)
Device = tuple[str, str]  # (pool name, device name) of the GPU driver
# A node's GPUs: per pool, its device names in order; GPU i is the i-th name of them all.
NodeDevices = tuple[tuple[str, tuple[str, ...]], ...]


def _mapping(value: object) -> Mapping:
    return value if isinstance(value, Mapping) else {}


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


def _device_order(name: str) -> list:
    """gpu-2 before gpu-10: numbers compared as numbers."""
    return [int(part) if part.isdigit() else part for part in _NUMBER.split(name)]


# ----- ResourceSlices ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SliceFacts:
    """What one ResourceSlice of the GPU driver says: its pool's generation and slice count, and
    its whole-GPU devices by node (one node, unless devices name their own)."""

    pool: Pool
    generation: int
    slice_count: int
    gpus: tuple[tuple[str, tuple[str, ...]], ...]  # (node, its device names in order)


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
    gpus = tuple((node, tuple(sorted(names, key=_device_order))) for node, names in by_node.items())
    return SliceFacts((GPU_DRIVER, sys.intern(str(pool.get("name", "")))), _int(pool.get("generation"), 0),
                      max(1, _int(pool.get("resourceSliceCount"), 1)), gpus)


# ----- ResourceClaims, their templates and DeviceClasses ----------------------------------------

@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One request of a claim, as its first choice: `count` devices of `device_class`, or every
    matching device of a node (`whole_node`)."""

    device_class: str
    count: int
    whole_node: bool = False
    admin: bool = False  # adminAccess: watches devices, takes none
    # A count the API would refuse (not a whole number >= 1): "devices.requests[0].exactly.count 'eight'"
    bad_count: str | None = None


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


@dataclass(frozen=True)
class TemplateFacts:
    requests: tuple[DeviceRequest, ...]
    channel: bool = False  # a ComputeDomain's IMEX channel: who claims from it shares an NVLink domain


_CHANNEL_ONLY = TemplateFacts((), channel=True)  # a channel template known from its ComputeDomain only


def parse_template(obj: Mapping) -> TemplateFacts:
    requests = parse_requests(_mapping(_mapping(obj.get("spec")).get("spec")))
    labels = _mapping(_mapping(obj.get("metadata")).get("labels"))
    return TemplateFacts(requests, COMPUTE_DOMAIN_LABEL in labels or any(r.device_class == CHANNEL_CLASS for r in requests))


def channel_template(compute_domain: Mapping) -> str | None:
    """The name of the channel template a ComputeDomain makes (`spec.channel.resourceClaimTemplate.name`)."""
    name = _mapping(_mapping(_mapping(compute_domain.get("spec")).get("channel")).get("resourceClaimTemplate")).get("name")
    return str(name) if name else None


@dataclass(frozen=True, slots=True)
class ClaimFacts:
    """A ResourceClaim: what it asks for, and where and which GPU-driver devices it got."""

    requests: tuple[DeviceRequest, ...]
    node: str | None  # where its devices are (status.allocation.nodeSelector); None: not allocated
    devices: tuple[Device, ...]  # allocated devices of the GPU driver
    scheduler_made_for: str | None  # uid of the pod whose nvidia.com/gpu the scheduler made it for


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


# ----- PodGroups ----------------------------------------------------------------------------------

# A `resourceClaims` entry of a Pod or PodGroup: (name, resourceClaimName, resourceClaimTemplateName),
# "" where unset. A pod's entry equal to one of its PodGroup's is that group's claim (KEP-5729).
ClaimEntry = tuple[str, str, str]


def claim_entry(entry: Mapping) -> ClaimEntry:
    return (str(entry.get("name") or ""), str(entry.get("resourceClaimName") or ""),
            str(entry.get("resourceClaimTemplateName") or ""))


@dataclass(frozen=True)
class PodGroupFacts:
    min_count: int | None  # the gang's minCount; None for a basic (non-gang) policy
    annotations: Mapping[str, str]  # its annotations, which its pods' placement reads under their own
    claims: frozenset[ClaimEntry] = frozenset()  # its spec.resourceClaims, shared by the pods that name them
    made: Mapping[str, str] = field(default_factory=dict)  # entry name -> the claim made from its template


_NO_GROUP = PodGroupFacts(None, {})  # a pod in no PodGroup (or one not seen): it shares no group claim


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


# ----- the inventory ------------------------------------------------------------------------------

@dataclass
class DraInventory:
    """Every DRA object the cluster view has seen, kept per object so that an added, changed or
    deleted one touches only the nodes it concerns (each change returns their names)."""

    slices: dict[str, SliceFacts] = field(default_factory=dict)  # by slice name
    pool_slices: dict[Pool, set[str]] = field(default_factory=dict)  # every generation's slices
    pool_nodes: dict[Pool, set[str]] = field(default_factory=dict)  # nodes the pool's slices name
    node_pools: dict[str, set[Pool]] = field(default_factory=dict)  # the reverse
    claims: dict[str, ClaimFacts] = field(default_factory=dict)  # namespace/name
    claims_on: dict[str, set[str]] = field(default_factory=dict)  # node -> allocated claims there
    templates: dict[str, TemplateFacts] = field(default_factory=dict)  # namespace/name
    # ComputeDomain (namespace/name) -> its channel template's key, known before its controller makes
    # it; kept apart from the templates listed, which a relist of templates would otherwise forget
    compute_domains: dict[str, str] = field(default_factory=dict)
    channels: dict[str, int] = field(default_factory=dict)  # channel template key -> ComputeDomains naming it
    classes: dict[str, bool] = field(default_factory=dict)  # DeviceClass -> selects whole GPUs
    pod_groups: dict[str, PodGroupFacts] = field(default_factory=dict)  # namespace/name
    scheduler_made: dict[str, str] = field(default_factory=dict)  # pod uid -> its scheduler-made claim
    incomplete: dict[Pool, str] = field(default_factory=dict)  # pools being published, why

    # -- slices ----------------------------------------------------------------------------------
    def put_slice(self, name: str, facts: SliceFacts | None) -> set[str]:
        """Add, change (facts) or remove (None) one slice; the nodes whose GPUs may have changed."""
        old = self.slices.pop(name, None)
        touched: set[str] = set()
        for pool in {f.pool for f in (old, facts) if f is not None}:
            touched |= self.pool_nodes.get(pool, set())
        if old is not None:
            self.pool_slices[old.pool].discard(name)
        if facts is not None:
            self.slices[name] = facts
            self.pool_slices.setdefault(facts.pool, set()).add(name)
        for pool in {f.pool for f in (old, facts) if f is not None}:
            nodes = {node for s in self.pool_slices.get(pool, ()) for node, _ in self.slices[s].gpus}
            touched |= nodes
            for gone in self.pool_nodes.get(pool, set()) - nodes:
                self.node_pools[gone].discard(pool)
                if not self.node_pools[gone]:
                    del self.node_pools[gone]
            for node in nodes:
                self.node_pools.setdefault(node, set()).add(pool)
            if self.pool_slices.get(pool):
                self.pool_nodes[pool] = nodes
            else:
                self.pool_slices.pop(pool, None)
                self.pool_nodes.pop(pool, None)
            self._check_complete(pool)
        return touched

    def _newest(self, pool: Pool) -> list[SliceFacts]:
        listed = [self.slices[name] for name in self.pool_slices.get(pool, ())]
        newest = max((s.generation for s in listed), default=0)
        return [s for s in listed if s.generation == newest]

    def _check_complete(self, pool: Pool) -> None:
        newest = self._newest(pool)
        if newest and len(newest) < newest[0].slice_count:
            self.incomplete[pool] = (f"ResourceSlice pool {pool[1]} of {pool[0]} has {len(newest)} of its "
                                     f"{newest[0].slice_count} slices at generation {newest[0].generation}: its "
                                     "GPUs are unknown until the rest arrive, so none are counted")
        else:
            self.incomplete.pop(pool, None)

    def node_gpus(self, node: str) -> NodeDevices:
        """The node's whole GPUs per pool, in device-name order; empty without DRA GPUs."""
        out = []
        for pool in sorted(self.node_pools.get(node, ())):
            if pool in self.incomplete:
                continue
            found = [names for facts in self._newest(pool) for on, names in facts.gpus if on == node]
            if len(found) == 1:
                out.append((pool[1], found[0]))  # the slice's own tuple: nothing copied per node
            elif found:
                out.append((pool[1], tuple(sorted({n for names in found for n in names}, key=_device_order))))
        return tuple(out)

    # -- claims ----------------------------------------------------------------------------------
    def put_claim(self, key: str, facts: ClaimFacts | None) -> set[str]:
        """Add, change (facts) or remove (None) one claim; the nodes whose GPUs in use may have changed."""
        old = self.claims.pop(key, None)
        touched = set()
        if old is not None:
            if old.node is not None:
                self.claims_on[old.node].discard(key)
                if not self.claims_on[old.node]:
                    del self.claims_on[old.node]
                touched.add(old.node)
            if old.scheduler_made_for and self.scheduler_made.get(old.scheduler_made_for) == key:
                del self.scheduler_made[old.scheduler_made_for]
        if facts is not None:
            self.claims[key] = facts
            if facts.node is not None:
                self.claims_on.setdefault(facts.node, set()).add(key)
                touched.add(facts.node)
            if facts.scheduler_made_for:
                self.scheduler_made[facts.scheduler_made_for] = key
        return touched

    def claimed(self, node: str, gpus: NodeDevices) -> frozenset[int]:
        """Indices of the node's GPUs allocated in some claim (a GPU under an allocated MIG device too)."""
        index = {gpu: i for i, gpu in enumerate((pool, name) for pool, names in gpus for name in names)}
        taken = set()
        for key in self.claims_on.get(node, ()):
            for pool, device in self.claims[key].devices:
                found = index.get((pool, device), index.get((pool, _MIG_SUFFIX.sub("", device))))
                if found is not None:
                    taken.add(found)
        return frozenset(taken)

    # -- demand ----------------------------------------------------------------------------------
    def put_compute_domain(self, key: str, channel: str | None) -> None:
        """A ComputeDomain naming its channel template (namespace/name), or gone (None)."""
        old = self.compute_domains.pop(key, None)
        if old is not None:
            self.channels[old] -= 1
            if not self.channels[old]:
                del self.channels[old]
        if channel is not None:
            self.compute_domains[key] = channel
            self.channels[channel] = self.channels.get(channel, 0) + 1

    def template(self, key: str) -> TemplateFacts | None:
        """A ResourceClaimTemplate as listed, else as its ComputeDomain names it (a channel)."""
        return self.templates.get(key) or (_CHANNEL_ONLY if key in self.channels else None)

    def is_gpu_class(self, name: str) -> bool:
        return self.classes.get(name, name == GPU_CLASS)


@dataclass(frozen=True)
class ClaimDemand:
    """GPUs a pod asks for through its `resourceClaims`."""

    per_pod: int = 0  # from templates: every pod gets its own claim
    whole_node: bool = False  # a request for every GPU of one node (allocationMode All)
    shared: tuple[tuple[str, int], ...] = ()  # (claim, GPUs) of named claims not yet allocated
    # (which, GPUs) of its PodGroup's claims from templates (KEP-5729), one per PodGroup, not made yet
    group_shared: tuple[tuple[str, int], ...] = ()
    pinned: tuple[str, ...] = ()  # nodes of named claims already allocated (their pods go there)
    unknown: tuple[str, ...] = ()  # "ResourceClaimTemplate ml/x": not known, so its GPUs are not
    channel: str | None = None  # the ComputeDomain channel template (namespace/name) its pods share
    # "ResourceClaimTemplate ml/x, whose spec.spec.devices.requests[0].exactly.count 'eight'": a
    # request the API would refuse, so how many devices it asks for is not a number to place
    bad_counts: tuple[str, ...] = ()


def _bad_counts(what: str, prefix: str, requests: Iterable[DeviceRequest]) -> list[str]:
    return [f"{what}, whose {prefix}{r.bad_count}" for r in requests if r.bad_count is not None]


def _gpus(requests: Iterable[DeviceRequest], inventory: DraInventory) -> tuple[int, bool]:
    wanted = [r for r in requests if not r.admin and inventory.is_gpu_class(r.device_class)]
    return sum(r.count for r in wanted), any(r.whole_node for r in wanted)


def claims_demand(namespace: str, pod_spec: Mapping, inventory: DraInventory) -> ClaimDemand:
    """What the pod's `spec.resourceClaims` ask of GPUs, from the templates and claims known now.
    An entry equal to one of its PodGroup's (KEP-5729) is the group's one claim: from a template,
    its GPUs are shared by the group's pods; once the PodGroup names the claim made for it, that
    claim is read as a named one."""
    per_pod, whole, shared, group_shared, pinned, unknown, channel = 0, False, [], [], [], [], None
    bad: list[str] = []
    group_name = pod_group_of(pod_spec)
    group = inventory.pod_groups.get(f"{namespace}/{group_name}", _NO_GROUP) if group_name else _NO_GROUP
    for entry in map(_mapping, _list(pod_spec.get("resourceClaims"))):
        template, claim = entry.get("resourceClaimTemplateName"), entry.get("resourceClaimName")
        of_group = bool(template) and claim_entry(entry) in group.claims
        made = group.made.get(str(entry.get("name"))) if of_group else None
        if made and f"{namespace}/{made}" in inventory.claims:
            template, claim, of_group = None, made, False
        if template:
            key = f"{namespace}/{template}"
            facts = inventory.template(key)
            if facts is None:
                unknown.append(f"ResourceClaimTemplate {key}")
                continue
            channel = key if facts.channel else channel
            bad += _bad_counts(f"ResourceClaimTemplate {key}", "spec.spec.", facts.requests)
            gpus, all_of_node = _gpus(facts.requests, inventory)
            if not of_group:
                per_pod += gpus
            elif gpus or all_of_node:
                group_shared.append((f"claim {entry.get('name')} of PodGroup {namespace}/{group_name}", gpus))
            whole = whole or all_of_node
        elif claim:
            key = f"{namespace}/{claim}"
            claim_facts = inventory.claims.get(key)
            if claim_facts is None:
                unknown.append(f"ResourceClaim {key}")
                continue
            bad += _bad_counts(f"ResourceClaim {key}", "spec.", claim_facts.requests)
            gpus, all_of_node = _gpus(claim_facts.requests, inventory)
            if claim_facts.node is not None:
                if gpus or all_of_node:
                    pinned.append(claim_facts.node)
            elif gpus or all_of_node:
                shared.append((key, gpus))
                whole = whole or all_of_node
    return ClaimDemand(per_pod, whole, tuple(shared), tuple(group_shared), tuple(dict.fromkeys(pinned)),
                       tuple(unknown), channel, tuple(bad))
