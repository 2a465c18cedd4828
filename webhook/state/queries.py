"""The questions asked of the cluster index from outside `state/`.

Callers ask here, never of the index's parts (`tree`, `ledger`, `pods`): free room under a domain,
a key's hold, a workload's gated pods, what the page lists. The parts may then change shape without
their callers changing, and the lock is taken where the parts live (tests/state/test_front.py keeps
it so). The placer is the one caller that holds the lock itself, across a decision and its hold
(placement/placer.py); the claims Lease and the page hold it through `locked` (index.py says why).

Most answers are taken under the lock and are the caller's to keep. A few are the live objects,
not copies, for callers that already hold the lock: the tree (`whole_tree`), which the placer's
pure decisions and the claims' allotment read, the pinned waits the placer protects, and the holds
and reservations the page lists. They are written only by state/.
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Collection, Iterable, Iterator, Mapping

from ..core.model import Decision, PlacementRequest
from ..settings.config import Config
from . import dra
from .devices import Devices
from .filters import ConstrainedSubsets, NodeFilters
from .gated import GatedGroup, GatedPod
from .growth import GrowthState, Pool
from .holds import GpuSet, Reservation, ReservationLedger
from .pods import PodCounts
from .stats import ClusterStats, cluster_stats
from .tree import TopologyTree
from .waits import Waiting


@dataclass(frozen=True, slots=True)
class GatedNow:
    """The releaser's look before a pass, taken at one moment: how many changes the index has
    counted (a pass runs only after one), the pods our gate holds, and those it refuses (pod key
    -> (the pod, why))."""

    changes: int
    gated: frozenset[str]
    refused: dict[str, tuple[Mapping, str]]


class IndexQueries:
    """The index's answers to callers outside `state/` (ClusterIndex is one)."""

    # What ClusterIndex (index.py) sets up; the queries read them under `lock`.
    config: Config
    preset: str | None
    lock: threading.RLock
    tree: TopologyTree
    filters: NodeFilters
    subsets: ConstrainedSubsets
    ledger: ReservationLedger
    pods: PodCounts
    devices: Devices
    growth: GrowthState
    changes: int

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

    # -- holds -------------------------------------------------------------------------------

    def now(self) -> float:
        """The clock holds expire by (the ledger's)."""
        return self.ledger.clock()

    def hold_seconds(self) -> float:
        """How long a firm hold lasts without its pods."""
        return self.ledger.ttl_seconds

    def holds_provisional(self) -> bool:
        """Whether an admission's hold counts only until the watch shows it stored (holds.py)."""
        return self.ledger.provisional_seconds is not None

    def hold(self, key: str) -> Reservation | None:
        """`key`'s newest workload hold, None when there is none."""
        with self.lock:
            return self.ledger.hold(key)

    def group(self, key: str) -> Decision | None:
        """The decision the group `key`'s first member got, or None; asking renews it (holds.py)."""
        with self.lock:
            return self.ledger.group(key)

    def stored_stamp(self, key: str) -> str | None:
        """The admission the stored object under `key` carries, None when none is stored."""
        with self.lock:
            return self.ledger.stored.get(key)

    def workload_holds(self) -> Iterator[tuple[Reservation, bool]]:
        """Every workload hold and whether it is firm (call under the lock: the page's read)."""
        return self.ledger.workload_holds()

    def pod_holds(self) -> Iterable[tuple[str, str, GpuSet]]:
        """(reservation key, node, GPU set) of each unbound pod that holds (call under the lock)."""
        return self.ledger.pod_holds.values()

    # -- the tree, pods and waits --------------------------------------------------------------

    def whole_tree(self) -> TopologyTree:
        """The topology tree, to read under the lock (the placer's, or `locked`); never written outside state/."""
        return self.tree

    def free_gpus_for(self, request: PlacementRequest) -> int:
        """Free GPUs now on the nodes `request` may use."""
        with self.lock:
            return self.restricted_to(request).root.free_gpus

    def pod_reservations(self) -> Mapping[str, str]:
        """Bound pod key -> the reservation key it carries (the live map: read it under the lock)."""
        return self.pods.reservations

    def waited_seconds(self, key: str) -> float:
        """How long workload `key`'s pods have waited in a pinned or gated wait (0: none waits)."""
        with self.lock:
            return self.pods.waiters.waited(key, self.ledger.clock())

    def pinned_waits(self) -> Waiting:
        """Pending pods of pinned waits (placement/protection.py reads them under the placer's lock)."""
        return self.pods.waiters

    def gated_now(self) -> GatedNow:
        """What the releaser looks at before a pass, at one moment."""
        with self.lock:
            return GatedNow(self.changes, frozenset(self.pods.gated.pods), dict(self.pods.gated.refused))

    def bound_or_gone(self, pods_by_key: Mapping[str, Collection[str]]) -> list[str]:
        """The keys of `pods_by_key` whose pods are each counted on a node, or not seen at all."""
        with self.lock:
            seen = self.pods.counted()
            return [key for key, pods in pods_by_key.items()
                    if all(pod in self.pods.on_node or pod not in seen for pod in pods)]
