"""The cluster index: the state placement reads, kept current by the facts the feed brings.

Facts arrive from objects/feed.py (Nodes, Pods, DRA objects, autoscalers' pools, read from the
API's dicts; one code path for watches and files) through `apply`. The index is a thin front over
its parts, each with one concern:
  tree.py     the domain tree and its capacity aggregates (and constrained subsets' trees),
  filters.py  what a workload may use: label/taint/bandwidth/resource indexes, constrained subsets,
  holds.py    GPU sets held for admitted workloads, with their expiry (the ledger),
  pods.py     where each pod is counted (GPUs, other requests, reservations, waits, our gate),
  devices.py  which GPUs DRA gives each node, and which of them claims hold,
  growth.py   how autoscalers can grow the cluster,
  ports.py    what the adapters kube/ builds are to the index (the claims Lease, scale-ups),
and it owns what ties them together: a node's aggregates settled after each change, and the one
lock that watch threads and request threads share.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import threading
import time
from dataclasses import dataclass
from typing import Callable, Collection, Iterable, Iterator, Mapping

from ..core.memo import Memo
from ..core.model import PlacementRequest
from ..core.orderings import DEFAULT as DEFAULT_ORDERINGS, Orderings
from ..settings.config import Config
from ..settings.presets import PRESETS, PresetVotes, preset_marks
from . import dra
from .devices import Devices, DraFact
from .filters import ConstrainedSubsets, NodeFilters
from .gated import GatedGroup, GatedPod
from .growth import GrowthFact, GrowthState, Pool
from .holds import ReservationLedger, Stored
from .pods import PodCounts, PodFacts, PodGone
from .ports import ScaleUps, SharedClaims
from .stats import ClusterStats, cluster_stats
from .tree import Domain, NodeState, TopologyTree, placement_fields



@dataclass(frozen=True, slots=True)
class NodeGone:
    """A Node deleted from the API."""

    name: str


# What the index applies: a Node's facts (a NodeState, unattached), a Pod's, a DRA object's, an
# autoscaler's, or the deletion of one.
Fact = NodeState | NodeGone | PodFacts | PodGone | DraFact | GrowthFact | Stored


def out_of_the_collectors_way() -> None:
    """Collect what a full build or list left behind, then freeze everything the process holds
    (the index above all) out of the cyclic collector's reach. The index lives as long as the
    process: without this, every full collection walks all of it, and one landing in an admission
    stalls it (up to 237 ms on 10,000 nodes, the p99 of a decision with waits pinned; with the
    index frozen, 8 ms). Objects made later are collected as usual; frozen ones are still freed
    when nothing refers to them."""
    gc.collect()
    gc.freeze()


class ClusterIndex:
    """Nodes, pods and reservations, with capacity aggregated per topology domain.

    Holds are the ledger's; the index counts them against the nodes they are on. `clock` is what
    holds expire by (the ledger's own); `orderings`, the sort keys its tree keeps and placement ranks
    by (core/orderings.py).

    Thread safety: `apply` and every other public mutator take `lock`; callers that read and then
    write (place and reserve) hold it across both.
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
            elif isinstance(fact, NodeState):
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

    def _upsert_node(self, node: NodeState) -> None:
        fresh = self.devices.counted(node)
        if not fresh.name:
            return
        old = self.tree.nodes.get(fresh.name)
        if old is not None and placement_fields(old) == placement_fields(fresh):
            return  # kubelet's status updates: nothing placement reads has changed
        self.install(old, fresh)

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

    # -- reading -----------------------------------------------------------------------------

    def claims_demand(self, namespace: str, claims: dra.ClaimRefs) -> dra.ClaimDemand:
        """What a pod spec's resourceClaims ask of GPUs, from the templates and claims known now."""
        with self.lock:
            demand = dra.claims_demand(namespace, claims, self.devices.inventory)
            if not demand.whole_node:
                return demand
            # every GPU of one node: of the largest nodes (the widest g any node holds a pod of)
            ever = self.tree.root.pods_idle
            largest = next((g for g in range(len(ever) - 1, 0, -1) if ever[g] > 0), 0)
            return dataclasses.replace(demand, per_pod=demand.per_pod + largest)

    def pod_group(self, key: str) -> dra.PodGroupFacts | None:
        """The PodGroup namespace/name as last seen, None when not seen."""
        with self.lock:
            return self.devices.inventory.pod_groups.get(key)

    def is_gpu_class(self, name: str) -> bool:
        """Whether DeviceClass `name` selects whole GPUs (dra.py)."""
        with self.lock:
            return self.devices.inventory.is_gpu_class(name)

    def has_level(self, label: str) -> bool:
        return any(level.label == label for level in self.config.levels)

    def keys(self, kind: str) -> set[str]:
        """Keys of the objects of `kind` the index holds, by the feed's keys (a relist forgets the
        others): pods, DRA kinds, workloads stored with an admission's hold, autoscalers' kinds."""
        with self.lock:
            if kind == "Pod":
                return self.pods.counted()
            if kind in dra.DRA_KINDS:
                return self.devices.keys(kind)
            return self.ledger.stored_of(kind) | {key for key in self.growth.objects if key.startswith(kind + "/")}

    def inventory_warnings(self) -> list[str]:
        """What the GPU count per node cannot be sure of now, for people."""
        with self.lock:
            return self.devices.warnings()

    def pools(self) -> tuple[Pool, ...]:
        """Pools that can add nodes, heaviest first (rebuilt only after a change they depend on)."""
        with self.lock:
            return self.growth.pools(self.tree.nodes, self.config)

    def gated_groups(self, started: Collection[str] = (), sizes: Mapping[str, int] | None = None) -> list[GatedGroup]:
        """Workloads held by our gate whose pods all exist, oldest first (gated.py)."""
        with self.lock:
            return self.pods.gated_groups(started, sizes)

    def gated_unsure(self) -> dict[str, GatedPod]:
        """Gated workloads whose pods exist in another number than their request says (gated.py)."""
        with self.lock:
            return self.pods.gated_unsure()

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

    def share_claims(self, claims: SharedClaims) -> None:
        """Holds from now on also go through `claims`, shared with the other replicas."""
        self.shared_claims = claims

    def restricted_to(self, request: PlacementRequest) -> TopologyTree:
        """The whole tree, or the constrained subset holding only the nodes the request may use."""
        if self.filters.filters_nothing(request, self.tree.nodes):
            return self.tree
        return self.subsets.for_request(request, self.tree, self.filters)

    def has_room_ever(self, expressions: Iterable[Mapping], gpus: int, reservation: str | None) -> bool:
        """Whether the in-service nodes matching every `In` and `DoesNotExist` expression could hold
        a pod of `gpus` GPUs once everything else on them has ended, except the bound pods carrying
        `reservation` (the workload's own pods, which run as long as it does). False: that capacity
        is gone, not busy."""
        with self.lock:
            return self.filters.has_room_ever(self.tree.nodes, list(expressions), gpus,
                                              self.pods.staying(reservation))

    def stats(self) -> ClusterStats:
        with self.lock:
            return cluster_stats(self.tree, self.config, self.preset, self.ledger.provisional_gpus(),
                                 self.pods.gated.waited(self.ledger.clock()))


def waited_seconds(index: ClusterIndex, key: str) -> float:
    """How long workload `key`'s pods have waited in a pinned or gated wait (0: none waits). Beside
    ClusterIndex, not in it: the class is at its 300 lines."""
    with index.lock:
        return index.pods.waiters.waited(key, index.ledger.clock())
