"""The tree's members: domains and nodes, which answer placement the same read-only questions.

A node is two things kept apart, as Kueue keeps its static topology tree apart from each
snapshot's state: `NodeInfo`, what the Node object says (labels, allocatable, taints, NVLink
domains), frozen and replaced whole when the Node changes; and `NodeState`, the node in a tree,
with its place there (`parent`) and the live counts that pods, holds and claims change (and, for
speed, its facts copied as attributes when it is made). A node's
path in the tree is read from its parent: it is the tree's reading of the labels under its
levels (which `levels: auto` can change), not a fact of the Node.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from ..core.gpus import pick_aligned
from ..core.model import DomainRef, Interconnect
from ..settings.config import HardwareProfile
from ..settings.presets import HOSTNAME_LABEL

_NO_CHILDREN: Mapping[str, "Domain | NodeState"] = MappingProxyType({})


class Domain:
    """One topology domain and the capacity aggregates of the nodes below it.

    Domains and nodes answer the same read-only questions (fits, fits_idle, free_gpus, slots,
    has_free, partly_used, path, ref, label, children), so placement walks the tree without asking
    which one it holds; a node is the tree's leaf, with no children."""

    __slots__ = ("ref", "parent", "children", "free_hist", "pods_now", "pods_idle", "free_gpus", "alloc_gpus", "nodes", "freeing",
                 "partly_used", "touched")

    def __init__(self, ref: DomainRef, parent: "Domain | None", width: int):
        self.ref = ref
        self.parent = parent
        self.children: dict[str, "Domain | NodeState"] = {}  # keyed by the child's label value / node name
        self.free_hist = [0] * (width + 1)  # nodes by free GPUs
        self.pods_now = [0] * (width + 1)  # pods_now[g]: pods of g GPUs that fit whole now
        self.pods_idle = [0] * (width + 1)  # pods_idle[g]: the same on an idle cluster with every node in service
        self.free_gpus = 0
        self.alloc_gpus = 0  # GPUs of nodes in service
        self.freeing = 0  # GPUs of terminating pods: free once they are gone
        self.nodes = 0
        self.partly_used = 0  # nodes with some GPUs taken and some free: where small jobs run
        self.touched = -1  # bestfit.LevelOrders bookkeeping

    def fits_now(self, gpus: int) -> int:
        """Pods of `gpus` GPUs that fit whole now."""
        return self.pods_now[gpus] if gpus < len(self.pods_now) else 0

    def fits_idle(self, gpus: int) -> int:
        """Pods of `gpus` GPUs that would fit with every running pod gone and every node back in
        service: what no amount of waiting can exceed."""
        return self.pods_idle[gpus] if gpus < len(self.pods_idle) else 0

    def slots(self, gpus: int) -> int:
        """Nodes that can take one more pod of `gpus` GPUs (distributed placement counts these)."""
        return sum(self.free_hist[gpus:]) if gpus < len(self.free_hist) else 0

    def has_free(self, count: int) -> bool:
        """Whether some node below has exactly `count` free GPUs."""
        return count < len(self.free_hist) and self.free_hist[count] > 0

    @property
    def most_free(self) -> int:
        """Free GPUs of the freest node below (0 when every node is full)."""
        hist = self.free_hist
        top = len(hist) - 1
        while top and not hist[top]:
            top -= 1
        return top

    @property
    def path(self) -> tuple[tuple[str, str], ...]:
        return self.ref.path

    @property
    def label(self) -> str:
        return str(self.ref)

    def __repr__(self) -> str:
        return f"Domain({self.ref}, free={self.free_gpus})"


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the feed read of a Node object (objects/feed.py): nothing changes it but a new read."""

    name: str
    labels: Mapping[str, str]
    out: str  # why it is out of service for now ("cordoned", "NotReady", a lifecycle taint); "" in service
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect) with NoSchedule/NoExecute
    gpus: int  # its GPUs: allocatable nvidia.com/gpu (device plugin), else its DRA GPU devices (dra.py)
    nvlink_domains: tuple[tuple[int, ...], ...]
    profile: HardwareProfile
    bandwidth_gbps: float | None
    other_allocatable: Mapping[str, int] = field(default_factory=dict)  # every resource but GPUs (resources.py)
    plugin_gpus: int = 0  # allocatable nvidia.com/gpu, whatever DRA says
    declared_domains: tuple[tuple[int, ...], ...] | None = None  # the nvlink-domains annotation, if valid
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()  # DRA GPUs per pool (dra.NodeDevices)


@dataclass(eq=False)
class NodeState:
    """One node in a tree: its facts (`info`), its place, and what runs and is held there; `free`
    is what a new workload may count on. A constrained subset's tree holds a copy of the node
    sharing its facts and its live containers (pods, holds, requests, claims), with a parent and
    `free` of its own."""

    info: NodeInfo
    parent: Domain | None = None
    free: int = 0  # GPUs a new workload may count on; refreshed whenever the node is (re)counted
    pods: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)  # pod key -> (gpus, ids)
    terminating: set[str] = field(default_factory=set)  # keys of its pods being deleted
    # GPU sets the ledger holds here, whoever holds them: the index copies them in place after
    # every ledger change, so constrained subsets (which share this list) see them too.
    held: list[tuple[int, ...]] = field(default_factory=list)
    # Requests of every pod bound here (GPU pods or not), the index's own dict for this node name.
    requested: dict[str, int] = field(default_factory=dict)
    # Indices of its DRA GPUs allocated in ResourceClaims; changed in place, so constrained
    # subsets (which share this set) see it too.
    claimed: set[int] = field(default_factory=set)

    # -- its facts, copied from `info` when the node is made (NodeInfo says what each is) -------
    # Attributes, not properties over `info`: a decision at 10,000 nodes reads them some sixty
    # times, where a property's call costs about three times an attribute's. Nothing replaces
    # `info` under a node (a Node read anew makes a new NodeState), so the copies stay true.
    name: str = field(init=False)
    labels: Mapping[str, str] = field(init=False)
    out: str = field(init=False)
    taints: tuple[tuple[str, str, str], ...] = field(init=False)
    gpus: int = field(init=False)
    nvlink_domains: tuple[tuple[int, ...], ...] = field(init=False)
    profile: HardwareProfile = field(init=False)
    bandwidth_gbps: float | None = field(init=False)
    other_allocatable: Mapping[str, int] = field(init=False)

    def __post_init__(self) -> None:
        info = self.info
        self.name, self.labels, self.out, self.taints, self.gpus = info.name, info.labels, info.out, info.taints, info.gpus
        self.nvlink_domains, self.profile, self.bandwidth_gbps = info.nvlink_domains, info.profile, info.bandwidth_gbps
        self.other_allocatable = info.other_allocatable

    # -- the read-only interface shared with Domain -------------------------------------------
    children = _NO_CHILDREN

    def fits_now(self, gpus: int) -> int:
        return self.free // gpus

    def fits_idle(self, gpus: int) -> int:
        return self.gpus // gpus

    @property
    def free_gpus(self) -> int:
        return self.free

    def slots(self, gpus: int) -> int:
        return 1 if self.free >= gpus else 0

    def has_free(self, count: int) -> bool:
        return self.free == count

    @property
    def partly_used(self) -> int:
        return 1 if 0 < self.free < self.gpus else 0

    @property
    def domain(self) -> Domain:
        """The domain right above the node (the tree's root when no level groups it)."""
        assert self.parent is not None, f"node {self.name} is not in a tree"
        return self.parent

    @property
    def path(self) -> tuple[tuple[str, str], ...]:
        return self.domain.ref.path + ((HOSTNAME_LABEL, self.name),)

    @property
    def ref(self) -> DomainRef:
        return DomainRef(self.domain.ref.level + 1, "node", self.path)

    @property
    def label(self) -> str:
        return f"node {self.name}"

    # -- accounting ------------------------------------------------------------------------------
    @property
    def eligible(self) -> bool:
        return not self.out

    def headroom(self, resource: str) -> int:
        return self.other_allocatable.get(resource, 0) - self.requested.get(resource, 0)

    def pods_fitting(self, wanted: tuple[tuple[str, int], ...]) -> int:
        """How many more pods of this per-pod request (GPUs aside) the node takes now: none where
        its pods already ask more than it has (bound pods can: static pods, a stale view), which
        counted negative free GPUs into a subset's histogram."""
        return max(0, min((self.headroom(name) // amount for name, amount in wanted if amount > 0), default=1 << 30))

    @property
    def freeing(self) -> int:
        return sum(self.pods[key][0] for key in self.terminating)

    @property
    def used(self) -> int:
        return sum(gpus for gpus, _ in self.pods.values()) + len(self.claimed)

    @property
    def held_gpus(self) -> int:
        """GPUs held and not taken by a pod or a ResourceClaim: holds may overlap each other and the
        pods (an allotment holds whole nodes)."""
        if not self.held:
            return 0
        held = {i for ids in self.held for i in ids}
        held.difference_update(i for _, ids in self.pods.values() for i in ids)
        held.difference_update(self.claimed)
        return len(held)

    def compute_free(self) -> int:
        return max(0, self.gpus - self.used - self.held_gpus) if self.eligible else 0

    @property
    def taken_ids(self) -> set[int]:
        taken = {i for _, ids in self.pods.values() for i in ids}
        taken.update(i for ids in self.held for i in ids)
        taken.update(self.claimed)
        return taken

    def link_for(self, ids: tuple[int, ...]) -> Interconnect:
        """The slowest link between a pod's GPUs here: NVLINK when one NVLink domain holds them all."""
        if len(ids) <= 1 or any(set(ids) <= set(group) for group in self.nvlink_domains):
            return Interconnect.NVLINK
        return Interconnect.PCIE

    def pick_gpus(self, count: int, taken: set[int]) -> tuple[int, ...]:
        return pick_aligned(self.nvlink_domains, self.gpus, count, taken)

    def pod_aligned(self, gpus: int) -> bool:
        """Whether a pod of `gpus` GPUs placed here now gets one NVLink domain's GPUs (no pick where one holds all)."""
        return (gpus <= 1 or (len(self.nvlink_domains) == 1 and set(range(self.gpus)) <= set(self.nvlink_domains[0]))
                or self.link_for(self.pick_gpus(gpus, self.taken_ids)) is Interconnect.NVLINK)


def nvlink_domains(declared: tuple[tuple[int, ...], ...] | None, profile: HardwareProfile,
                    gpus: int) -> tuple[tuple[int, ...], ...]:
    """The annotation's domains, else the hardware profile's: GPUs in runs of its domain size."""
    if declared is not None:
        return declared
    size = profile.nvlink_domain_size
    return tuple(tuple(range(s, min(s + size, gpus))) for s in range(0, gpus, size)) if size > 1 else ()


def with_gpus(info: NodeInfo, gpus: int, devices: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> NodeInfo:
    """The node's facts with `gpus` GPUs (its DRA devices, or back to its allocatable)."""
    return dataclasses.replace(info, gpus=gpus, devices=devices,
                               nvlink_domains=nvlink_domains(info.declared_domains, info.profile, gpus))


def placement_fields(info: NodeInfo) -> tuple:
    """What placement reads of a node: an update that changes none of it changes nothing."""
    return (info.labels, info.out, info.taints, info.gpus, info.nvlink_domains, info.profile,
            info.bandwidth_gbps, info.other_allocatable, info.devices)
