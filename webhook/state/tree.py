"""The topology tree: domains from the widest level down to nodes, with capacity aggregates.

Each change of a node's free GPUs is pushed up its chain of domains (node -> leaf -> spine ->
zone -> cluster), so the placement core reads per-domain capacities in O(1) instead of rescanning
nodes. Per domain the tree keeps, for every pod size g (GPUs per pod):
  pods_now[g]  = sum over its nodes of floor(free / g)   -- pods of size g that fit whole, right now
  pods_idle[g] = sum over its nodes of floor(gpus / g)   -- the same with every running pod gone
and a histogram of nodes by free GPUs. Summing per-node floors (not floors of the summed free
GPUs) is what keeps a 2-GPU pod from "fitting" two nodes with one free GPU each.

Nodes without a level's label are alone at that level: their domain there is keyed by the
node's hostname, so placement never assumes they share a switch with anyone.

The same tree type holds the whole cluster and each constrained subset (the nodes one kind of
request may use); it knows nothing of pods, holds or filters, which the cluster index feeds it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterator, Mapping

from ..core.gpus import pick_aligned
from ..core.model import DomainRef, Interconnect, PlacementRequest
from ..core.orderings import DEFAULT as DEFAULT_ORDERINGS, Orderings
from ..settings.config import Config, HardwareProfile
from ..settings.presets import HOSTNAME_LABEL
from .bestfit import LevelOrders

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


@dataclass(eq=False)
class NodeState:
    """What the index knows of one node; `free` is what a new workload may count on."""

    name: str
    labels: Mapping[str, str]
    out: str  # why it is out of service for now ("cordoned", "NotReady", a lifecycle taint); "" in service
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect) with NoSchedule/NoExecute
    gpus: int  # its GPUs: allocatable nvidia.com/gpu (device plugin), else its DRA GPU devices (dra.py)
    nvlink_domains: tuple[tuple[int, ...], ...]
    profile: HardwareProfile
    bandwidth_gbps: float | None
    other_allocatable: Mapping[str, int] = field(default_factory=dict)  # every resource but GPUs (resources.py)
    parent: Domain | None = None
    free: int = 0  # GPUs a new workload may count on; refreshed whenever the node is (re)counted
    pods: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)  # pod key -> (gpus, ids)
    terminating: set[str] = field(default_factory=set)  # keys of its pods being deleted
    # GPU sets the ledger holds here, whoever holds them: the index copies them in place after
    # every ledger change, so constrained subsets (which share this list) see them too.
    held: list[tuple[int, ...]] = field(default_factory=list)
    # Requests of every pod bound here (GPU pods or not), the index's own dict for this node name.
    requested: dict[str, int] = field(default_factory=dict)
    plugin_gpus: int = 0  # allocatable nvidia.com/gpu, whatever DRA says
    declared_domains: tuple[tuple[int, ...], ...] | None = None  # the nvlink-domains annotation, if valid
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()  # DRA GPUs per pool (dra.NodeDevices)
    # Indices of its DRA GPUs allocated in ResourceClaims; changed in place, so constrained
    # subsets (which share this set) see it too.
    claimed: set[int] = field(default_factory=set)

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


def with_gpus(node: NodeState, gpus: int, devices: tuple[tuple[str, tuple[str, ...]], ...] = ()) -> NodeState:
    """The node counted with `gpus` GPUs (its DRA devices, or back to its allocatable), unattached;
    what it runs and holds is the index's to carry over."""
    return dataclasses.replace(node, gpus=gpus, devices=devices, parent=None, claimed=set(),
                               nvlink_domains=nvlink_domains(node.declared_domains, node.profile, gpus))


def placement_fields(node: NodeState) -> tuple:
    """What placement reads of a node: an update that changes none of it changes nothing."""
    return (node.labels, node.out, node.taints, node.gpus, node.nvlink_domains, node.profile,
            node.bandwidth_gbps, node.other_allocatable, node.devices)


class TopologyTree:
    """Domains and nodes with their aggregates, ranked by `orderings`. `serves`: in a constrained subset,
    the request whose pods it counts GPUs for (see usable_free); None for the whole cluster."""

    def __init__(self, config: Config, width: int = 8, serves: PlacementRequest | None = None, orderings: Orderings = DEFAULT_ORDERINGS):
        self.config = config
        self.orderings = orderings  # the sort keys its level orders keep and placement ranks by
        self.serves = serves
        self.width = width  # largest GPU count of any node seen; aggregates are sized to it
        self.root = Domain(DomainRef(-1, "cluster", ()), None, width)
        self.levels: list[dict[tuple, Domain]] = [{} for _ in config.levels]  # per level: path -> domain
        self.orders: list[LevelOrders[Domain]] = [self._orders_at(i) for i in range(len(config.levels))]
        self.nodes: dict[str, NodeState] = {}
        self.by_value: dict[str, set[tuple]] = {}  # label value / node name -> domain paths (preferred-domain)
        self.out_of_service: dict[str, str] = {}  # GPU node -> why it is out for now (it may return)

    def _orders_at(self, level: int) -> LevelOrders[Domain]:  # over the level's domains as they are when read
        return LevelOrders(lambda: self.levels[level], self.orderings)

    def node_path(self, node: NodeState) -> tuple[tuple[str, str], ...]:
        """The node's domain at every level. A missing label above one the node does carry is an
        unnamed domain shared with the others like it (value ""), so a leaf label still groups
        nodes whose spine is not labelled; from the last label it carries down, the node is alone
        (a domain keyed by its hostname), so it is never assumed to share a switch with anyone."""
        labels = [lv.label for lv in self.config.levels]
        deepest = max((i for i, label in enumerate(labels) if label in node.labels), default=-1)
        return tuple((label, node.labels[label]) if label in node.labels
                     else (label, "") if i < deepest else (HOSTNAME_LABEL, node.name)
                     for i, label in enumerate(labels))

    def _domain_for(self, path: tuple) -> Domain:
        parent = self.root
        for depth in range(len(path)):
            prefix = path[: depth + 1]
            domain = self.levels[depth].get(prefix)
            if domain is None:
                level = self.config.levels[depth]
                domain = Domain(DomainRef(depth, level.name, prefix), parent, self.width)
                self.levels[depth][prefix] = domain
                parent.children[prefix[-1][1]] = domain
                if prefix[-1][0] != HOSTNAME_LABEL and prefix[-1][1]:  # lone and unnamed ones have no name to prefer
                    self.by_value.setdefault(prefix[-1][1], set()).add(prefix)
            parent = domain
        return parent

    def _prune(self, domain: Domain | None) -> None:
        while domain is not None and domain.parent is not None and not domain.children:  # never the root
            path = domain.ref.path
            del self.levels[domain.ref.level][path]
            del domain.parent.children[path[-1][1]]
            paths = self.by_value.get(path[-1][1], set())
            paths.discard(path)
            if not paths:
                self.by_value.pop(path[-1][1], None)
            domain = domain.parent

    def ancestors(self, node: NodeState) -> Iterator[Domain]:
        domain = node.parent
        while domain is not None:
            yield domain
            domain = domain.parent

    def grow(self, width: int) -> None:
        """A node with more GPUs than any before: widen every aggregate and recount (rare)."""
        self.width = width
        for orders in self.orders:
            orders.reset()
        for domain in [self.root, *(d for level in self.levels for d in level.values())]:
            domain.free_hist = [0] * (width + 1)
            domain.pods_now = [0] * (width + 1)
            domain.pods_idle = [0] * (width + 1)
            domain.free_gpus = domain.alloc_gpus = domain.nodes = domain.partly_used = domain.freeing = 0
        for node in self.nodes.values():
            self._account(node, +1)

    def usable_free(self, node: NodeState) -> int:
        """Free GPUs as this tree counts them: all of them, or in a constrained subset only what
        its request's pods can use alongside the node's other resources."""
        free = node.compute_free()
        if self.serves is None or not self.serves.resources:
            return free
        return min(free, node.pods_fitting(self.serves.resources) * self.serves.gpus_per_pod)

    def _account(self, node: NodeState, sign: int) -> None:
        """Add (sign=+1) or remove (-1) a node's contribution along its chain of domains."""
        if sign > 0:
            node.free = self.usable_free(node)
        free = node.free
        alloc = node.gpus if node.eligible else 0
        caps = [0] + [free // g for g in range(1, self.width + 1)]
        evers = [0] + [node.gpus // g for g in range(1, self.width + 1)]  # out of service may return
        bucket = min(free, self.width)
        partly = sign * (0 < free < alloc)
        freeing = sign * node.freeing
        for domain in self.ancestors(node):
            if domain.parent is not None:
                self.orders[domain.ref.level].touch(domain)
            domain.freeing += freeing
            domain.free_hist[bucket] += sign
            domain.partly_used += partly
            cap, ever = domain.pods_now, domain.pods_idle
            for g in range(1, self.width + 1):
                cap[g] += sign * caps[g]
                ever[g] += sign * evers[g]
            domain.free_gpus += sign * free
            domain.alloc_gpus += sign * alloc
            domain.nodes += sign

    def shift_free(self, node: NodeState, before: int, after: int) -> None:
        """Move a node's free GPUs from `before` to `after` in every aggregate above it: only what
        free GPUs feed, since eligibility and allocatable stay as they were."""
        node.free = after
        deltas = [0] + [after // g - before // g for g in range(1, self.width + 1)]
        old_bucket, new_bucket = min(before, self.width), min(after, self.width)
        partly = (0 < after < node.gpus) - (0 < before < node.gpus)
        for domain in self.ancestors(node):
            if domain.parent is not None:
                orders = self.orders[domain.ref.level]
                if domain.touched != orders.epoch:
                    orders.touch(domain)
            domain.free_hist[old_bucket] -= 1
            domain.free_hist[new_bucket] += 1
            domain.partly_used += partly
            cap = domain.pods_now
            for g in range(1, self.width + 1):
                cap[g] += deltas[g]
            domain.free_gpus += after - before

    def attach(self, node: NodeState) -> None:
        if node.out and node.gpus > 0:
            self.out_of_service[node.name] = node.out
        node.parent = self._domain_for(self.node_path(node))
        node.parent.children[node.name] = node
        self.nodes[node.name] = node
        self.by_value.setdefault(node.name, set()).add(node.parent.ref.path + ((HOSTNAME_LABEL, node.name),))
        self._account(node, +1)

    def detach(self, node: NodeState) -> None:
        """Take a node out of the tree (the inverse of attach)."""
        self.out_of_service.pop(node.name, None)
        self._account(node, -1)
        del self.nodes[node.name]
        parent = node.domain
        del parent.children[node.name]
        paths = self.by_value[node.name]
        paths.discard(parent.ref.path + ((HOSTNAME_LABEL, node.name),))
        if not paths:
            del self.by_value[node.name]
        self._prune(parent)
        node.parent = None

    def shift_freeing(self, node: NodeState, delta: int) -> None:
        for domain in self.ancestors(node):
            domain.freeing += delta

