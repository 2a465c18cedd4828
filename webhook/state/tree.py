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
Its members, Domain and NodeState (a node's fixed facts apart from its live counts), are
members.py's; the rest of the package imports them from here, with the tree.
"""
from __future__ import annotations

from typing import Iterator

from ..core.model import DomainRef, PlacementRequest
from ..core.orderings import DEFAULT as DEFAULT_ORDERINGS, Orderings
from ..settings.config import Config
from ..settings.presets import HOSTNAME_LABEL
from .bestfit import LevelOrders
from .members import Domain, NodeState


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

