"""Dynamic Resource Allocation (`resource.k8s.io/v1`) and PodGroups (`scheduling.k8s.io`), read
as GPUs per node: their facts in (webhook/objects/dra_objects.py reads them from the API's
objects), GPU devices per node, GPUs in use and GPU demand out. Pure.

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

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

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
_MIG_SUFFIX = re.compile(r"-mig-.*$")
_NUMBER = re.compile(r"(\d+)")

Pool = tuple[str, str]  # (driver, pool name)
Device = tuple[str, str]  # (pool name, device name) of the GPU driver
# A node's GPUs: per pool, its device names in order; GPU i is the i-th name of them all.
NodeDevices = tuple[tuple[str, tuple[str, ...]], ...]


def device_order(name: str) -> list:
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


@dataclass(frozen=True)
class TemplateFacts:
    requests: tuple[DeviceRequest, ...]
    channel: bool = False  # a ComputeDomain's IMEX channel: who claims from it shares an NVLink domain


_CHANNEL_ONLY = TemplateFacts((), channel=True)  # a channel template known from its ComputeDomain only


@dataclass(frozen=True, slots=True)
class ClaimFacts:
    """A ResourceClaim: what it asks for, and where and which GPU-driver devices it got."""

    requests: tuple[DeviceRequest, ...]
    node: str | None  # where its devices are (status.allocation.nodeSelector); None: not allocated
    devices: tuple[Device, ...]  # allocated devices of the GPU driver
    scheduler_made_for: str | None  # uid of the pod whose nvidia.com/gpu the scheduler made it for


# ----- PodGroups ----------------------------------------------------------------------------------

# A `resourceClaims` entry of a Pod or PodGroup: (name, resourceClaimName, resourceClaimTemplateName),
# "" where unset. A pod's entry equal to one of its PodGroup's is that group's claim (KEP-5729).
ClaimEntry = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class ClaimRefs:
    """A pod spec's `resourceClaims` entries, and the PodGroup it names (Kubernetes 1.36+)."""

    entries: tuple[ClaimEntry, ...] = ()
    pod_group: str | None = None


@dataclass(frozen=True)
class PodGroupFacts:
    min_count: int | None  # the gang's minCount; None for a basic (non-gang) policy
    annotations: Mapping[str, str]  # its annotations, which its pods' placement reads under their own
    claims: frozenset[ClaimEntry] = frozenset()  # its spec.resourceClaims, shared by the pods that name them
    made: Mapping[str, str] = field(default_factory=dict)  # entry name -> the claim made from its template


_NO_GROUP = PodGroupFacts(None, {})  # a pod in no PodGroup (or one not seen): it shares no group claim


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
                out.append((pool[1], tuple(sorted({n for names in found for n in names}, key=device_order))))
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


def claims_demand(namespace: str, refs: ClaimRefs, inventory: DraInventory) -> ClaimDemand:
    """What the pod's `spec.resourceClaims` ask of GPUs, from the templates and claims known now.
    An entry equal to one of its PodGroup's (KEP-5729) is the group's one claim: from a template,
    its GPUs are shared by the group's pods; once the PodGroup names the claim made for it, that
    claim is read as a named one."""
    per_pod, whole, shared, group_shared, pinned, unknown, channel = 0, False, [], [], [], [], None
    bad: list[str] = []
    group_name = refs.pod_group
    group = inventory.pod_groups.get(f"{namespace}/{group_name}", _NO_GROUP) if group_name else _NO_GROUP
    for entry in refs.entries:
        name, claim, template = entry
        of_group = bool(template) and entry in group.claims
        made = group.made.get(name) if of_group else None
        if made and f"{namespace}/{made}" in inventory.claims:
            template, claim, of_group = "", made, False
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
                group_shared.append((f"claim {name} of PodGroup {namespace}/{group_name}", gpus))
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
