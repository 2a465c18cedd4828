"""The cluster index: Node and Pod objects in, the state placement reads out.

Nodes and pods arrive as the dicts the API returns (from a watch or from `kubectl get -o yaml`
files: one code path). The index is a thin front over its parts, each with one concern:
  topology.py  the domain tree and its capacity aggregates (and constrained subsets' trees),
  filters.py   what a workload may use: label/taint/bandwidth/resource indexes, constrained subsets,
  ledger.py    GPU sets held for admitted workloads, with their expiry,
and it owns what ties them together: pods counted on nodes (GPUs, and every other resource they
request), and the one lock that watch threads and request threads share.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Hashable, Iterable, Iterator, Mapping, Protocol, Sequence, TypeVar

from ..core.gpus import parse_gpu_set, pod_gpus
from ..core.injection import GPU_IDS, RESERVATION, WAITING_FOR, parse_domain_path
from ..core.model import GPU_RESOURCE, PlacementRequest
from ..core.resources import pod_requests
from ..settings.config import Config
from ..settings.presets import HOSTNAME_LABEL, PRESETS, choose_preset, preset_marks
from . import dra
from .filters import ConstrainedSubsets, NodeFilters
from .gated import GatedGroup, GatedPod, GatedPods
from .growth import GrowthState, Pool, is_growth_object, object_key
from .holds import ReservationLedger, held_by, in_namespace
from .tree import Domain, NodeState, TopologyTree, parse_node, placement_fields, with_gpus
from .usage import ResourceUsage
from .waits import Waiter, Waiting

_FINISHED_PHASES = ("Succeeded", "Failed")
T = TypeVar("T")
# From files, what a kind's count depends on is read before it: slices before the nodes they
# name, claims and templates before the pods that use them.
_FEED_ORDER = {"DeviceClass": 0, "ResourceSlice": 1, "Node": 2, "ResourceClaimTemplate": 3, "ResourceClaim": 3,
               "PodGroup": 3, "ComputeDomain": 3, "Pod": 4}


def _replace_set(target: set[int], values: set[int]) -> None:
    """Change a set in place (a node's claimed GPUs, shared with the subsets that hold it)."""
    target.clear()
    target.update(values)


def _feed_order(obj: Mapping) -> int:
    return _FEED_ORDER.get(str(obj.get("kind", "Node")), 2)  # others (autoscalers' pools) with the Nodes


@dataclass(frozen=True)
class ClusterStats:
    gpus_total: int
    gpus_used: int
    gpus_reserved: int
    allocation_ratio: float
    fragmentation_ratio: float  # free GPUs stranded on partly used nodes / all free GPUs
    domain_utilization: tuple[tuple[str, str, float], ...]  # (level name, domain, used share)
    levels: tuple[str, ...] = ()  # the level label keys in use, widest first
    preset: str = "configured"  # the preset `levels: auto` chose, or "configured"


def out_of_the_collectors_way() -> None:
    """Collect what a full build or list left behind, then freeze everything the process holds
    (the index above all) out of the cyclic collector's reach. The index lives as long as the
    process: without this, every full collection walks all of it, and one landing in an admission
    stalls it (up to 237 ms on 10,000 nodes, the p99 of a decision with waits pinned; with the
    index frozen, 8 ms). Objects made later are collected as usual; frozen ones are still freed
    when nothing refers to them."""
    gc.collect()
    gc.freeze()


def pod_key(pod: Mapping) -> str:
    meta = pod.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def demand_shape(spec: Mapping) -> str:
    """All that a pod's demand (gpus.pod_gpus, resources.pod_requests) reads of its spec: every
    container's resources, then, where the spec has either, each init container's with its
    restartPolicy and the overhead, as text (repr tells JSON values apart, and a list's repr
    ends where it ends). Pods made from one template share it."""
    shape = repr([container.get("resources") for container in spec.get("containers") or ()])
    if "initContainers" in spec or "overhead" in spec:
        shape += repr(([(init.get("resources"), init.get("restartPolicy")) for init in spec.get("initContainers") or ()],
                       spec.get("overhead")))
    return shape


def _gpus_asked(spec: Mapping) -> int:
    try:
        return pod_gpus(spec)
    except ValueError:
        return 0


class _Memo:
    """Answers of a pure function by a key that holds all it reads: counting 1M pods asks the
    same few questions again and again (pods made from one template, empty nodes of one kind),
    and answering afresh cost more than the rest of counting a pod. Forgotten wholesale past
    `limit` keys, so that a cluster of ever-new questions holds no more than that."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._answers: dict[Hashable, Any] = {}

    def get(self, key: Hashable, answer: Callable[[], T]) -> T:
        found = self._answers.get(key)
        if found is None:
            found = answer()
            if len(self._answers) >= self.limit:
                self._answers.clear()
            self._answers[key] = found
        return found


def pending_hold(annotations: Mapping, spec: Mapping, gpus: int) -> tuple[str, str, tuple[int, ...]] | None:
    """(reservation key, node, GPU set) an unbound pod holds: one carrying our reservation key and
    the GPU set we chose, with node affinity naming one node (a single-pod placement). A pod
    pinned to a domain of several nodes names no node: its workload's hold covers it."""
    reservation, hinted = annotations.get(RESERVATION), annotations.get(GPU_IDS)
    if not reservation or not hinted or gpus <= 0:
        return None
    try:
        held = parse_gpu_set(str(hinted))
    except ValueError:
        return None
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    preferred = affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    terms = [*(required or ()), *(p.get("preference") for p in preferred)]
    named: set[str] = set()
    for term in terms:
        for expr in (term or {}).get("matchExpressions") or ():
            values: Sequence = expr.get("values") or ()
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In" and len(values) == 1:
                named.add(str(values[0]))
    if len(named) != 1 or len(held) != gpus:
        return None
    return str(reservation), named.pop(), held


class SharedClaims(Protocol):
    """Holds shared with other replicas; see webhook/kube/shared_claims.py."""

    budget_seconds: float

    def basis(self) -> int: ...  # the claims version decisions now see (read under the index lock)
    def claim(self, key: str, basis: int, deadline: float) -> str | None: ...  # None, CONFLICT or why not
    def unclaim(self, key: str, deadline: float) -> str | None: ...
    def alone(self, what: str, why: str) -> str: ...  # counts and logs; the warning to give


class ScaleUps(Protocol):
    """Scale-up requests (ProvisioningRequests) made for groups that wait for nodes; see
    webhook/kube/scaleups.py."""

    def create(self, objects: Sequence[Mapping]) -> str | None: ...  # None: they exist now; else why not
    def delete(self, namespace: str, name: str) -> None: ...


class ClusterIndex:
    """Nodes, pods and reservations, with capacity aggregated per topology domain.

    Holds are the ledger's; the index counts them against the nodes they are on. `clock` is what
    holds expire by (the ledger's own).

    Thread safety: every public mutator takes `lock`; callers that read and then write (place and
    reserve) hold it across both.
    """

    def __init__(self, config: Config, width: int = 8, clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.lock = threading.RLock()
        self.tree = TopologyTree(config, width)
        self.filters = NodeFilters()
        self.subsets = ConstrainedSubsets()
        self.ledger = ReservationLedger(config.reservation_ttl_seconds, clock)
        self.shared_claims: SharedClaims | None = None  # holds shared with other replicas (share_claims)
        self.orphan_pods: dict[str, dict[str, tuple[int, tuple[int, ...]]]] = {}  # pods bound to unknown nodes
        self.pod_nodes: dict[str, str] = {}  # pod key -> node name its GPUs are counted on
        self.usage = ResourceUsage()  # bound pods' requests of every resource but GPUs
        self.holders: dict[str, set[str]] = {}  # reservation key -> bound pods carrying it
        self.pod_reservations: dict[str, str] = {}  # bound pod key -> the reservation key it carries
        self.waiters = Waiting()  # pending pods of pinned waits (protection.py)
        self.gated = GatedPods(config.seal_key)  # pending pods held by our scheduling gate (gating.py)
        # Counts changes of free GPUs, nodes and gated pods: the releaser passes only after one.
        self.changes = 0
        self.dra = dra.DraInventory()
        self.both_sources: set[str] = set()  # nodes with allocatable nvidia.com/gpu and DRA GPUs
        self.growth = GrowthState()  # autoscalers' pools: how the cluster can grow
        self.scale_ups: ScaleUps | None = None  # ProvisioningRequests, with a class configured and an API
        # `levels: auto`: the preset the nodes' labels call for (None: levels as configured), the
        # presets each node's labels mark and how many nodes mark each, and why none fits.
        self.preset: str | None = None
        self._node_presets: dict[str, frozenset[str]] = {}
        self._preset_counts: dict[str, int] = {}
        self.levels_warning: str | None = None
        self._unsettled: dict[str, NodeState] | None = None  # nodes changed in the open batch()
        # GPUs and other requests by demand_shape, and GPU sets picked by (NVLink domains, GPUs,
        # count, taken): what NodeState.pick_gpus reads
        self._gpus_by_shape: _Memo = _Memo()
        self._requests_by_shape: _Memo = _Memo()
        self._picks: _Memo = _Memo()

    @classmethod
    def from_objects(cls, config: Config, nodes: Iterable[Mapping], pods: Iterable[Mapping] = (),
                     clock: Callable[[], float] = time.monotonic) -> "ClusterIndex":
        """The index of these objects: Nodes and Pods, and any of the DRA kinds (dra.DRA_KINDS)
        mixed in, as `kubectl get nodes,resourceslices,deviceclasses -o yaml` prints them."""
        objects = [*nodes, *pods]
        width = max([8] + [parse_node(n, config).gpus for n in objects if n.get("kind", "Node") == "Node"])
        index = cls(config, width, clock)
        for obj in sorted(objects, key=_feed_order):  # what a pod's GPUs depend on comes first
            index.upsert(obj)
        return index

    def upsert(self, obj: Mapping) -> None:
        """An object of any kind the index reads, added or changed (files and watch events alike)."""
        kind = obj.get("kind", "Node")
        if kind == "Node":
            self.upsert_node(obj)
        elif kind == "Pod":
            self.upsert_pod(obj)
        elif kind in dra.DRA_KINDS:
            self.put_dra(kind, obj, present=True)
        elif is_growth_object(obj):
            self.upsert_growth(obj)

    def delete(self, obj: Mapping) -> None:
        """An object of any kind the index reads is gone."""
        kind = obj.get("kind", "Node")
        if kind == "Node":
            self.delete_node(str((obj.get("metadata") or {}).get("name", "")))
        elif kind == "Pod":
            self.delete_pod(obj)
        elif kind in dra.DRA_KINDS:
            self.put_dra(kind, obj, present=False)
        elif is_growth_object(obj):
            self.delete_growth(obj)

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

    def _change(self, node: NodeState, mutate: Callable[[], object]) -> None:
        """Apply `mutate` (pods, holds or requests, never labels or allocatable) to a node, with
        its aggregates, and those of subsets holding it, kept exact."""
        mutate()
        self._changed(node)

    def _changed(self, node: NodeState) -> None:
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

    def upsert_node(self, obj: Mapping) -> None:
        with self.lock:
            fresh = self._counted(parse_node(obj, self.config))
            if not fresh.name:
                return
            old = self.tree.nodes.get(fresh.name)
            if old is not None and placement_fields(old) == placement_fields(fresh):
                return  # kubelet's status updates: nothing placement reads has changed
            self._install(old, fresh)

    def _install(self, old: NodeState | None, fresh: NodeState) -> None:
        """Put `fresh` in the tree in place of `old` (None: a new node), keeping what runs and is held there."""
        if fresh.gpus > self.tree.width:
            self.subsets.clear()  # built for the old width; rebuilt on next use
            self.tree.grow(fresh.gpus)
        if old is not None:
            fresh.pods, fresh.terminating = old.pods, old.terminating
            self.filters.count(old, -1)
            self.tree.detach(old)
        else:
            fresh.pods = self.orphan_pods.pop(fresh.name, {})
        self.growth.node_changed(fresh.name, old.labels if old is not None else {}, fresh.labels)
        fresh.held = list(self.ledger.held_on(fresh.name))
        fresh.requested = self.usage.on_node(fresh.name)
        self.tree.attach(fresh)
        self.filters.count(fresh, +1)
        self.filters.note_headroom(fresh.name)
        self.subsets.node_changed(fresh)
        self._mark_presets(fresh.name, preset_marks(fresh.labels))
        self.changes += 1

    def delete_node(self, name: str) -> None:
        with self.lock:
            self.both_sources.discard(name)
            node = self.tree.nodes.get(name)
            if node is not None:
                self.growth.node_changed(name, node.labels, {})
                self.subsets.node_deleted(name)
                self.filters.count(node, -1)
                self.tree.detach(node)
                if node.pods:  # its pods may still be deleted later; keep them until then
                    self.orphan_pods[name] = node.pods
                self._mark_presets(name, None)

    def _mark_presets(self, name: str, marks: frozenset[str] | None) -> None:
        """With `levels: auto`, count the presets a node's labels mark (None: the node is gone)
        and move to the levels the nodes now call for when that changes."""
        if not self.config.levels_auto or self._node_presets.get(name) == marks:
            return
        for preset in self._node_presets.pop(name, ()):
            self._preset_counts[preset] -= 1
        if marks is not None:
            self._node_presets[name] = marks
            for preset in marks:
                self._preset_counts[preset] = self._preset_counts.get(preset, 0) + 1
        preset, self.levels_warning = choose_preset(self._preset_counts, len(self._node_presets))
        if preset != self.preset:
            self._relevel(preset)

    def _relevel(self, preset: str) -> None:
        """Rebuild the tree on the preset's levels, every node with its pods and holds: O(nodes),
        and rare (the first nodes read, a relist, nodes of another kind joining)."""
        self.preset = preset
        self.config = dataclasses.replace(self.config, levels=PRESETS[preset])
        tree = TopologyTree(self.config, self.tree.width)
        for node in list(self.tree.nodes.values()):
            node.parent = None
            tree.attach(node)
        self.tree = tree
        self.subsets.clear()

    # -- DRA: slices, claims, their templates, device classes, pod groups (dra.py) ---------------

    def _counted(self, node: NodeState) -> NodeState:
        """The node with the GPUs it is counted with: allocatable nvidia.com/gpu when it has any
        (the device plugin), else its GPU devices in ResourceSlices, never both."""
        gpus = self.dra.node_gpus(node.name)
        if node.plugin_gpus and gpus:
            self.both_sources.add(node.name)
        else:
            self.both_sources.discard(node.name)
        if node.plugin_gpus or not gpus:
            return node if node.gpus == node.plugin_gpus and not node.devices else with_gpus(node, node.plugin_gpus)
        counted = with_gpus(node, sum(len(names) for _, names in gpus), gpus)
        counted.claimed.update(self.dra.claimed(node.name, gpus))
        return counted

    def put_dra(self, kind: str, obj: Mapping, present: bool) -> None:
        """A DRA object (or PodGroup) of `kind` added or changed (`present`), or deleted (only its
        metadata is read); the nodes whose GPUs or GPUs in use it changes are recounted, no others."""
        with self.lock:
            key = dra.object_key(obj)
            if kind == "ResourceSlice":
                self._recount_gpus(self.dra.put_slice(key, dra.parse_slice(obj) if present else None))
            elif kind == "ResourceClaim":
                facts = dra.parse_claim(obj) if present else None
                self._recount_gpus(self.dra.put_claim(key, facts))
                if facts is not None and facts.scheduler_made_for in self.pod_nodes:
                    self._forget_gpus(facts.scheduler_made_for)  # the claim counts its pod's GPUs now
            elif kind == "ResourceClaimTemplate":
                self._keep(self.dra.templates, key, dra.parse_template(obj) if present else None)
            elif kind == "ComputeDomain":
                # it names its channel template before its controller makes it: workloads created with
                # it are not left unknown
                channel = dra.channel_template(obj) if present else None
                self.dra.put_compute_domain(key, f"{key.rpartition('/')[0]}/{channel}" if channel else None)
            elif kind == "DeviceClass":
                self._keep(self.dra.classes, key, dra.selects_gpus(obj) if present else None)
            elif kind == "PodGroup":
                self._keep(self.dra.pod_groups, key, dra.parse_pod_group(obj) if present else None)

    @staticmethod
    def _keep(table: dict, key: str, value: object) -> None:
        if value is not None:
            table[key] = value
        else:
            table.pop(key, None)

    def _recount_gpus(self, names: Iterable[str]) -> None:
        for name in names:
            node = self.tree.nodes.get(name)
            if node is None:
                continue
            fresh = self._counted(node)
            if placement_fields(fresh) != placement_fields(node):
                self._install(node, fresh)
            elif fresh.claimed != node.claimed:
                self._change(node, functools.partial(_replace_set, node.claimed, fresh.claimed))

    def _claims_gpus(self, namespace: str, spec: Mapping) -> bool:
        if not spec.get("resourceClaims"):
            return False
        demand = dra.claims_demand(namespace, spec, self.dra)
        return bool(demand.per_pod or demand.whole_node or demand.shared or demand.group_shared or demand.pinned)

    def claims_demand(self, namespace: str, spec: Mapping) -> dra.ClaimDemand:
        """What a pod spec's resourceClaims ask of GPUs, from the templates and claims known now."""
        with self.lock:
            demand = dra.claims_demand(namespace, spec, self.dra)
            if not demand.whole_node:
                return demand
            # every GPU of one node: of the largest nodes (the widest g any node holds a pod of)
            ever = self.tree.root.pods_idle
            largest = next((g for g in range(len(ever) - 1, 0, -1) if ever[g] > 0), 0)
            return dataclasses.replace(demand, per_pod=demand.per_pod + largest)

    def pod_group(self, key: str) -> dra.PodGroupFacts | None:
        """The PodGroup namespace/name as last seen, None when not seen."""
        with self.lock:
            return self.dra.pod_groups.get(key)

    def is_gpu_class(self, name: str) -> bool:
        """Whether DeviceClass `name` selects whole GPUs (dra.py)."""
        with self.lock:
            return self.dra.is_gpu_class(name)

    def has_level(self, label: str) -> bool:
        return any(level.label == label for level in self.config.levels)

    def dra_keys(self, kind: str) -> set[str]:
        """Keys of the DRA objects of `kind` the index holds (a relist forgets the others)."""
        with self.lock:
            tables: dict[str, Mapping[str, object]] = {
                "ResourceSlice": self.dra.slices, "ResourceClaim": self.dra.claims,
                "ResourceClaimTemplate": self.dra.templates, "DeviceClass": self.dra.classes,
                "PodGroup": self.dra.pod_groups, "ComputeDomain": self.dra.compute_domains}
            return set(tables[kind])

    def inventory_warnings(self) -> list[str]:
        """What the GPU count per node cannot be sure of now, for people."""
        with self.lock:
            both = [f"node {name} has allocatable {GPU_RESOURCE} and GPU devices in ResourceSlices; its GPUs "
                    "are counted once, from allocatable" for name in sorted(self.both_sources)]
            return [*(self.dra.incomplete[pool] for pool in sorted(self.dra.incomplete)), *both]

    # -- autoscalers' pools ------------------------------------------------------------------

    def upsert_growth(self, obj: Mapping) -> None:
        """A NodePool or cluster-autoscaler's status ConfigMap, added or changed."""
        with self.lock:
            self.growth.upsert(obj)

    def delete_growth(self, obj: Mapping) -> None:
        with self.lock:
            self.growth.forget(object_key(obj))

    def growth_keys(self, kind: str) -> set[str]:
        """Keys of the autoscaler objects of `kind` the index holds (a relist forgets the others)."""
        with self.lock:
            return {key for key in self.growth.objects if key.startswith(kind + "/")}

    def forget_growth(self, key: str) -> None:
        with self.lock:
            self.growth.forget(key)

    def pools(self) -> tuple[Pool, ...]:
        """Pools that can add nodes, heaviest first (rebuilt only after a change they depend on)."""
        with self.lock:
            return self.growth.pools(self.tree.nodes, self.config)

    # -- pods --------------------------------------------------------------------------------

    def upsert_pod(self, pod: Mapping) -> None:
        with self.lock:
            key = pod_key(pod)
            meta = pod.get("metadata") or {}
            spec = pod.get("spec") or {}
            status = pod.get("status") or {}
            node_name = spec.get("nodeName")
            phase = status.get("phase")
            shape = demand_shape(spec)
            gpus = self._gpus_by_shape.get(shape, lambda: _gpus_asked(spec))
            # covered_by_claim reads only this field, which most pods lack: looked at first, it spares
            # them the call (its type checks cost more than the rest of this line)
            through_claims = bool(status.get("extendedResourceClaimStatus")) and dra.covered_by_claim(pod) \
                or key in self.dra.scheduler_made
            if through_claims:
                gpus = 0  # its claim's devices are what it uses: counted once, there
            annotations = meta.get("annotations") or {}
            namespace = str(meta.get("namespace") or "")
            pending = not node_name and phase not in _FINISHED_PHASES
            self._note_waiter(key, annotations if pending else None, gpus)
            if self.gated.note(key, pod if pending else None, self.ledger.clock()):
                self.changes += 1
            if not node_name or phase in _FINISHED_PHASES:
                self._forget_pod(key)
                hold = pending_hold(annotations, spec, gpus) if pending else None
                if hold is None:
                    self._recount(self.ledger.drop_pod(key))
                else:
                    self._recount(self.ledger.hold_pod(key, hold[0], namespace, hold[1], hold[2]))
                return
            self._use(key, node_name, self._requests_by_shape.get(
                shape, lambda: tuple(sorted(pod_requests(spec).items()))))
            reservation = annotations.get(RESERVATION)
            if gpus <= 0:
                self._forget_gpus(key)
                self._recount(self.ledger.drop_pod(key))
                if reservation and (through_claims or self._claims_gpus(namespace, spec)):
                    # GPUs from claims: bound, its devices are allocated and counted, so the hold goes
                    self._recount(self.ledger.confirm(str(reservation), key, namespace, node_name))
                return
            terminating = bool(meta.get("deletionTimestamp"))
            node = self.tree.nodes.get(node_name)
            if self.pod_nodes.get(key) == node_name and node is not None and node.pods[key][0] == gpus:
                if terminating and key not in node.terminating:
                    self._mark_terminating(node, key)
                return  # other status updates of a counted pod change nothing we count
            self._forget_gpus(key)
            self._recount(self.ledger.drop_pod(key))
            self.pod_nodes[key] = node_name
            if reservation:
                self.pod_reservations[key] = str(reservation)
                if in_namespace(str(reservation), namespace):
                    # a key is its own namespace's: a pod elsewhere never counts as another's running pod
                    self.holders.setdefault(str(reservation), set()).add(key)
            if node is None:
                self.orphan_pods.setdefault(node_name, {})[key] = (gpus, ())
                return
            self._bind(node, key, gpus, annotations.get(GPU_IDS))
            self._changed(node)
            if terminating:
                self._mark_terminating(node, key)
            if reservation:
                self._recount(self.ledger.confirm(reservation, key, namespace, node_name))

    def _note_waiter(self, key: str, pending: Mapping | None, gpus: int) -> None:
        """Keep or forget a pod as a waiter: pending (`pending` holds its annotations), asking for
        GPUs, with our `waiting-for`. It keeps the time it was first seen waiting."""
        path = parse_domain_path(pending.get(WAITING_FOR)) if pending is not None and gpus > 0 else None
        if pending is None or path is None:
            self.waiters.forget(key)
            return
        seen = self.waiters.get(key)
        since = seen.since if seen is not None and seen.path == path else self.ledger.clock()
        self.waiters.put(key, Waiter(str(pending.get(RESERVATION) or key), path, gpus, since))

    def _mark_terminating(self, node: NodeState, key: str) -> None:
        """A counted pod is being deleted: its GPUs are still taken, and free soon."""
        node.terminating.add(key)
        self._shift_freeing(node, node.pods[key][0])

    def _shift_freeing(self, node: NodeState, delta: int) -> None:
        self.tree.shift_freeing(node, delta)
        self.subsets.shift_freeing(node.name, delta)

    def _bind(self, node: NodeState, key: str, gpus: int, hinted: str | None) -> None:
        taken = {i for _, ids in node.pods.values() for i in ids}
        ids: tuple[int, ...] = ()
        if hinted:
            try:
                wanted = parse_gpu_set(hinted)
            except ValueError:
                wanted = ()
            if len(wanted) == gpus and not taken.intersection(wanted) and all(i < node.gpus for i in wanted):
                ids = wanted  # the device plugin honoured our hint (or we assume it did)
        node.pods[key] = (gpus, ids or self._picks.get((node.nvlink_domains, node.gpus, gpus, frozenset(taken)),
                                                       lambda: node.pick_gpus(gpus, taken)))

    def delete_pod(self, pod: Mapping) -> None:
        """A pod is gone. A pod placed on its own (not from a workload's template) is its own
        workload: its deletion ends the reservation it may still hold."""
        with self.lock:
            self._forget_pod(pod_key(pod))
            self.waiters.forget(pod_key(pod))
            self.gated.deleted(pod_key(pod))
            self._recount(self.ledger.drop_pod(pod_key(pod)))
            meta = pod.get("metadata") or {}
            reservation = str((meta.get("annotations") or {}).get(RESERVATION) or "")
            if reservation and held_by(reservation, str(meta.get("namespace") or ""), "Pod"):
                self.release(reservation)

    def _forget_pod(self, key: str) -> None:
        self._forget_gpus(key)
        self._use(key, None, ())

    def _use(self, key: str, node_name: str | None, requests: tuple[tuple[str, int], ...]) -> None:
        """Count a pod's requests of other resources on the node it is bound to (None: nowhere)."""
        for changed in self.usage.use(key, node_name, requests):
            node = self.tree.nodes.get(changed)
            if node is not None:  # its free GPUs are as they were; what uses them may not be
                self._changed(node)

    def counted_pods(self) -> set[str]:
        """Keys of every pod the index counts (a relist forgets the others)."""
        return (set(self.pod_nodes) | self.usage.pods() | set(self.waiters.pods) | set(self.gated.pods)
                | set(self.gated.refused))

    def gated_groups(self, started: Collection[str] = (), sizes: Mapping[str, int] | None = None) -> list[GatedGroup]:
        """Workloads held by our gate whose pods all exist, oldest first (gating.py)."""
        with self.lock:
            return self.gated.ready({key: len(pods) for key, pods in self.holders.items()}, started, sizes)

    def gated_unsure(self) -> dict[str, GatedPod]:
        """Gated workloads whose pods exist in another number than their request says (gating.py)."""
        with self.lock:
            return self.gated.unsure({key: len(pods) for key, pods in self.holders.items()})

    def _forget_gpus(self, key: str) -> None:
        node_name = self.pod_nodes.pop(key, None)
        if node_name is None:
            return
        reservation = self.pod_reservations.pop(key, None)
        holders = self.holders.get(reservation or "")
        if holders is not None:
            holders.discard(key)
            if not holders:
                del self.holders[str(reservation)]
        node = self.tree.nodes.get(node_name)
        if node is not None:
            if key in node.terminating:
                self._shift_freeing(node, -node.pods[key][0])
                node.terminating.discard(key)
            self._change(node, lambda: node.pods.pop(key, None))
        else:
            orphans = self.orphan_pods.get(node_name, {})
            orphans.pop(key, None)
            if not orphans:
                self.orphan_pods.pop(node_name, None)

    # -- reservations ------------------------------------------------------------------------

    def reserve(self, key: str, sets_per_node: Mapping[str, list[tuple[int, ...]]], ttl: float | None = None) -> None:
        """Hold GPU sets on nodes for a workload until its pods are seen bound or it expires.
        Reserving a key again replaces the old hold, so re-placing a workload never double-books.
        A node not seen yet keeps its sets in the ledger and counts them when it arrives: another
        replica's claims can be read before this replica has listed every node."""
        with self.lock:
            self._recount(self.ledger.reserve(key, sets_per_node, ttl))

    def release(self, key: str) -> None:
        with self.lock:
            self._recount(self.ledger.release(key))

    def expire_reservations(self) -> None:
        with self.lock:
            self._recount(self.ledger.expire())

    def _recount(self, names: Iterable[str]) -> None:
        """Copy the ledger's holds onto the nodes they changed on, with their aggregates."""
        for name in names:
            node = self.tree.nodes.get(name)
            if node is not None:
                self._change(node, functools.partial(self._copy_holds, node))

    def _copy_holds(self, node: NodeState) -> None:
        node.held[:] = self.ledger.held_on(node.name)

    # -- reading -----------------------------------------------------------------------------

    def share_claims(self, claims: SharedClaims) -> None:
        """Holds from now on also go through `claims`, shared with the other replicas."""
        self.shared_claims = claims

    def restricted_to(self, request: PlacementRequest) -> TopologyTree:
        """The whole tree, or the constrained subset holding only the nodes the request may use."""
        if self.filters.filters_nothing(request, self.tree.nodes):
            return self.tree
        return self.subsets.for_request(request, self.tree, self.filters)

    def room_ever(self, expressions: Iterable[Mapping], gpus: int, reservation: str | None) -> int:
        """Pods of `gpus` GPUs that the in-service nodes matching every `In` and `DoesNotExist`
        expression could hold once everything else on them has ended, except the bound pods
        carrying `reservation` (the workload's own pods, which run as long as it does). 0: that
        capacity is gone, not busy."""
        with self.lock:
            expressions = list(expressions)
            wanted = [(str(e.get("key")), {str(v) for v in e.get("values") or ()}) for e in expressions
                      if e.get("operator") == "In"]
            absent = {str(e.get("key")) for e in expressions if e.get("operator") == "DoesNotExist"}
            if not wanted:
                return 0
            narrowest = min(wanted, key=lambda kv: sum(len(self.filters.by_label.get((kv[0], v), ())) for v in kv[1]))
            names = {name for value in narrowest[1] for name in self.filters.by_label.get((narrowest[0], value), ())}
            siblings: dict[str, int] = {}
            for pod in self.holders.get(reservation or "", ()):
                node_name = self.pod_nodes[pod]
                node = self.tree.nodes.get(node_name)
                if node is not None and pod in node.pods:
                    siblings[node_name] = siblings.get(node_name, 0) + node.pods[pod][0]
            room = 0
            for name in names:
                node = self.tree.nodes.get(name)
                if node is not None and node.eligible and all(node.labels.get(k) in values for k, values in wanted) \
                        and absent.isdisjoint(node.labels):
                    room += (node.gpus - siblings.get(name, 0)) // gpus
            return room

    def stats(self) -> ClusterStats:
        with self.lock:
            total = self.tree.root.alloc_gpus
            free = self.tree.root.free_gpus
            reserved = sum(n.held_gpus for n in self.nodes.values() if n.eligible)
            stranded = sum(n.free for n in self.nodes.values() if 0 < n.free < n.gpus)
            # Domains of several nodes only: a level whose domains are single hosts (GKE's host
            # level, nodes missing a label) would give a series per node, without bound.
            utilization = tuple(
                (self.config.levels[d.ref.level].name, d.ref.name,
                 round(1 - d.free_gpus / d.alloc_gpus, 6) if d.alloc_gpus else 0.0)
                for level in self.levels for d in sorted(level.values(), key=lambda d: d.ref.path) if d.nodes > 1)
            return ClusterStats(
                gpus_total=total, gpus_used=total - free - reserved, gpus_reserved=reserved,
                allocation_ratio=(total - free) / total if total else 0.0,
                fragmentation_ratio=stranded / free if free else 0.0,
                domain_utilization=utilization, levels=tuple(lv.label for lv in self.config.levels),
                preset=self.preset or "configured")
