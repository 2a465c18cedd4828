"""The cluster index: the state placement reads, kept current by the facts the feed brings.

Facts arrive from objects/feed.py (Nodes, Pods, DRA objects, autoscalers' pools, read from the
API's dicts; one code path for watches and files) through `apply`; callers outside `state/` ask
it questions (queries.py) and never reach its parts, each with one concern:
  tree.py     the domain tree and its capacity aggregates (and constrained subsets' trees),
  filters.py  what a workload may use: label/taint/bandwidth/resource indexes, constrained subsets,
  holds.py    GPU sets held for admitted workloads, with their expiry (the ledger),
  pods.py     where each pod is counted (GPUs, other requests, reservations, waits, our gate),
  devices.py  which GPUs DRA gives each node, and which of them claims hold,
  growth.py   how autoscalers can grow the cluster,
  ports.py    what the adapters kube/ builds are to the index (the claims Lease, scale-ups),
and it owns what ties them together: a node's aggregates settled after each change, and the one
lock that watch threads and request threads share. Its methods take that lock; outside `state/`
only the placer holds it across several calls (decide, then hold), and the claims Lease and the
page through `locked` (its docstring says why).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping

from ..core.memo import Memo
from ..core.model import Decision
from ..core.orderings import DEFAULT as DEFAULT_ORDERINGS, Orderings
from ..settings.config import Config
from ..settings.presets import PRESETS, PresetVotes, preset_marks
from .devices import Devices, DraFact
from .filters import ConstrainedSubsets, NodeFilters
from .growth import GrowthFact, GrowthState
from .holds import GpuSet, ReservationLedger, Stored
from .pods import PodCounts, PodFacts, PodGone
from .ports import ScaleUps, SharedClaims
from .queries import IndexQueries
from .members import Domain, NodeInfo, NodeState, placement_fields
from .tree import TopologyTree


@dataclass(frozen=True, slots=True)
class NodeGone:
    """A Node deleted from the API."""

    name: str


# What the index applies: a Node's facts, a Pod's, a DRA object's, an autoscaler's, or the
# deletion of one.
Fact = NodeInfo | NodeGone | PodFacts | PodGone | DraFact | GrowthFact | Stored


def out_of_the_collectors_way() -> None:
    """Collect what a full build or list left behind, then freeze everything the process holds
    (the index above all) out of the cyclic collector's reach. The index lives as long as the
    process: without this, every full collection walks all of it, and one landing in an admission
    stalls it (up to 237 ms on 10,000 nodes, the p99 of a decision with waits pinned; with the
    index frozen, 8 ms). Objects made later are collected as usual; frozen ones are still freed
    when nothing refers to them."""
    gc.collect()
    gc.freeze()


class ClusterIndex(IndexQueries):
    """Nodes, pods and reservations, with capacity aggregated per topology domain.

    Holds are the ledger's; the index counts them against the nodes they are on. `clock` is what
    holds expire by (the ledger's own); `orderings`, the sort keys its tree keeps and placement ranks
    by (core/orderings.py).

    Thread safety: `apply`, every other public mutator and the queries take `lock`; the placer,
    which reads and then writes (decide and hold), holds it across both.
    """

    def __init__(self, config: Config, width: int = 8, clock: Callable[[], float] = time.monotonic,
                 orderings: Orderings = DEFAULT_ORDERINGS):
        self.config = config
        self.lock = threading.RLock()
        self.tree = TopologyTree(config, width, orderings=orderings)
        self.filters = NodeFilters()
        self.subsets = ConstrainedSubsets()
        self.ledger = ReservationLedger(config.reservation_ttl_seconds, clock)
        self.shared_claims: SharedClaims | None = None  # holds shared with other replicas (share_claims)
        self.pods = PodCounts(self)
        self.devices = Devices(self)
        # Counts changes of free GPUs, nodes and gated pods: the releaser passes only after one.
        self.changes = 0
        self.growth = GrowthState()  # autoscalers' pools: how the cluster can grow
        self.scale_ups: ScaleUps | None = None  # ProvisioningRequests, with a class configured and an API
        # `levels: auto`: the preset the nodes' labels call for (None: levels as configured), the
        # presets each node's labels mark and how many nodes mark each, and why none fits.
        self.preset: str | None = None
        self._preset_votes = PresetVotes()
        self.levels_warning: str | None = None
        self._unsettled: dict[str, NodeState] | None = None  # nodes changed in the open batch()
        self._picks: Memo = Memo()  # GPU sets picked by (NVLink domains, GPUs, count, taken)

    def apply(self, fact: Fact) -> None:
        """A fact the feed read from an object added, changed or deleted (objects/feed.py)."""
        with self.lock:
            if isinstance(fact, PodFacts):
                self.pods.apply(fact)
            elif isinstance(fact, NodeInfo):
                self._upsert_node(fact)
            elif isinstance(fact, PodGone):
                self.pods.gone(fact)
            elif isinstance(fact, NodeGone):
                self._delete_node(fact.name)
            elif isinstance(fact, DraFact):
                self.devices.apply(fact)
            elif isinstance(fact, Stored):
                self.recount(self.ledger.apply(fact))
            elif fact.gone:
                self.growth.forget(fact.key)
            else:
                self.growth.put(fact.key, fact.facts)

    @property
    def nodes(self) -> Mapping[str, NodeState]:
        return self.tree.nodes

    @property
    def levels(self) -> list[dict[tuple, Domain]]:
        return self.tree.levels

    @property
    def root(self) -> Domain:
        return self.tree.root

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the lock for several changes (a page of a list) and settle each changed node's
        aggregates once at the end, not once per change: the same state as the changes made
        one by one, at a fraction of the cost where a node's pods come together."""
        with self.lock:
            if self._unsettled is not None:  # inside another batch: that one settles
                yield
                return
            self._unsettled = {}
            try:
                yield
            finally:
                unsettled, self._unsettled = self._unsettled, None
                for node in unsettled.values():
                    if self.tree.nodes.get(node.name) is node:  # not replaced or deleted meanwhile
                        self._settle(node)

    def changed(self, node: NodeState) -> None:
        """A node's pods, holds or requests (never labels or allocatable) changed: its aggregates,
        and those of subsets holding it, are settled now, or at the end of the open batch."""
        if self._unsettled is None:
            self._settle(node)
        else:
            self._unsettled[node.name] = node

    def _settle(self, node: NodeState) -> None:
        """Bring the aggregates above a node, and those of subsets holding it, to its pods and
        holds now. Until then `node.free` is what they count, so a node taken out of the tree
        unsettled takes out exactly what it put in."""
        after = node.compute_free()
        if after != node.free:
            self.tree.shift_free(node, node.free, after)
            self.changes += 1
        self.filters.note_headroom(node.name)
        self.subsets.recount(node.name)

    # -- nodes -------------------------------------------------------------------------------

    def node(self, name: str) -> NodeState | None:
        return self.tree.nodes.get(name)

    def _upsert_node(self, info: NodeInfo) -> None:
        counted, claimed = self.devices.counted(info)
        if not info.name:
            return
        old = self.tree.nodes.get(info.name)
        if old is not None and placement_fields(old.info) == placement_fields(counted):
            return  # kubelet's status updates: nothing placement reads has changed
        self.install(old, NodeState(counted, claimed=set(claimed)))

    def install(self, old: NodeState | None, fresh: NodeState) -> None:
        """Put `fresh` in the tree in place of `old` (None: a new node), keeping what runs and is held there."""
        if fresh.gpus > self.tree.width:
            self.subsets.clear()  # built for the old width; rebuilt on next use
            self.tree.grow(fresh.gpus)
        if old is not None:
            fresh.pods, fresh.terminating = old.pods, old.terminating
            self.filters.count(old, -1)
            self.tree.detach(old)
        else:
            self.pods.adopt(fresh)
        self.growth.node_changed(fresh.name, old.labels if old is not None else {}, fresh.labels)
        fresh.held = list(self.ledger.held_on(fresh.name))
        fresh.requested = self.pods.usage.on_node(fresh.name)
        self.tree.attach(fresh)
        self.filters.count(fresh, +1)
        self.filters.note_headroom(fresh.name)
        self.subsets.node_changed(fresh)
        self._mark_presets(fresh.name, preset_marks(fresh.labels))
        self.changes += 1

    def _delete_node(self, name: str) -> None:
        self.devices.both_sources.discard(name)
        node = self.tree.nodes.get(name)
        if node is not None:
            self.growth.node_changed(name, node.labels, {})
            self.subsets.node_deleted(name)
            self.filters.count(node, -1)
            self.tree.detach(node)
            self.pods.orphan(node)
            self._mark_presets(name, None)

    def _mark_presets(self, name: str, marks: frozenset[str] | None) -> None:
        """With `levels: auto`, count the presets a node's labels mark (None: the node is gone)
        and move to the levels the nodes now call for when that changes."""
        if not self.config.levels_auto:
            return
        voted = self._preset_votes.vote(name, marks, self.preset, self.levels_warning is not None)
        if voted is not None:
            preset, self.levels_warning = voted
            if preset != self.preset:
                self._relevel(preset)

    def _relevel(self, preset: str) -> None:
        """Rebuild the tree on the preset's levels, every node with its pods and holds: O(nodes),
        and rare (the first nodes read, a relist, nodes of another kind joining)."""
        self.preset = preset
        self.config = dataclasses.replace(self.config, levels=PRESETS[preset])
        tree = TopologyTree(self.config, self.tree.width, orderings=self.tree.orderings)
        for node in list(self.tree.nodes.values()):
            node.parent = None
            tree.attach(node)
        self.tree = tree
        self.subsets.clear()

    # -- what the parts ask of the nodes (pods.py, devices.py) -----------------------------------

    def set_claimed(self, node: NodeState, claimed: frozenset[int]) -> None:
        node.claimed.clear()  # in place: the subsets holding the node share the set
        node.claimed.update(claimed)
        self.changed(node)

    def count_through_claim(self, pod: str) -> None:
        self.pods.forget_gpus(pod)

    def through_claims(self, pod: PodFacts) -> bool:
        return pod.covered_by_claim or pod.key in self.devices.inventory.scheduler_made

    def shift_freeing(self, node: NodeState, delta: int) -> None:
        self.tree.shift_freeing(node, delta)
        self.subsets.shift_freeing(node.name, delta)

    def pick(self, node: NodeState, gpus: int, taken: set[int]) -> tuple[int, ...]:
        return self._picks.get((node.nvlink_domains, node.gpus, gpus, frozenset(taken)), node.pick_gpus, gpus, taken)

    def recount(self, names: Iterable[str]) -> None:
        """Copy the ledger's holds onto the nodes they changed on, with their aggregates."""
        for name in names:
            node = self.tree.nodes.get(name)
            if node is not None:
                node.held[:] = self.ledger.held_on(node.name)
                self.changed(node)

    # -- reservations ------------------------------------------------------------------------

    def reserve(self, key: str, sets_per_node: Mapping[str, list[tuple[int, ...]]], ttl: float | None = None,
                stamp: str | None = None) -> None:
        """Hold GPU sets on nodes for a workload until its pods are seen bound or it expires;
        provisionally, for an admission's `stamp`, until the watch shows it stored (holds.py).
        Reserving a key again replaces the old hold, so re-placing a workload never double-books.
        A node not seen yet keeps its sets in the ledger and counts them when it arrives: another
        replica's claims can be read before this replica has listed every node."""
        with self.lock:
            self.recount(self.ledger.reserve(key, sets_per_node, ttl, stamp))

    def release(self, key: str, stamp: str | None = None) -> None:
        """Drop `key`'s holds (with an admission's `stamp`: the one that admission would replace)."""
        with self.lock:
            self.recount(self.ledger.release(key, stamp))

    def expire_reservations(self) -> None:
        with self.lock:
            self.recount(self.ledger.expire())

    def renew(self, key: str, sets_per_node: Mapping[str, Iterable[GpuSet]], ttl: float) -> bool:
        """Make `key`'s hold last `ttl` from now when it holds exactly these sets: no node changes,
        so nothing is counted again. False, changing nothing, otherwise (holds.py)."""
        with self.lock:
            return self.ledger.renew(key, sets_per_node, ttl)

    def remember_group(self, key: str, decision: Decision) -> None:
        """Keep the decision of the group `key`'s first member for the members to come."""
        with self.lock:
            self.ledger.remember_group(key, decision)

    def hold_provisionally(self, seconds: float | None) -> None:
        """An admission's hold counts for `seconds` until the watch shows what was admitted stored
        (None: no watch, every hold is firm when made; holds.py)."""
        self.ledger.provisional_seconds = seconds

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """The index held still across several steps, for the two callers outside `state/` and the
        placer that need one moment: the claims Lease (kube/shared_claims.py), whose applied
        claims and allotment the placer reads under this lock (ports.SharedClaims) and so must
        change under it too, and the topology page, whose snapshot sums the tree and the holds as
        they are at once. Nothing in it may wait on the API."""
        with self.lock:
            yield

    def share_claims(self, claims: SharedClaims) -> None:
        """Holds from now on also go through `claims`, shared with the other replicas."""
        self.shared_claims = claims
