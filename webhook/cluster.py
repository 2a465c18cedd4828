"""The cluster view: an incremental per-domain free-GPU index built from Node and Pod objects.

Nodes and pods arrive as the dicts the API returns (from a watch or from `kubectl get -o yaml`
files: one code path). Each event changes one node's free-GPU count, and that change is pushed
up its chain of domains (node -> leaf -> spine -> zone -> cluster), so the placement core reads
per-domain capacities in O(1) instead of rescanning nodes.

Per domain the index keeps, for every pod size g (GPUs per pod):
  cap[g]  = sum over its nodes of floor(free / g)   -- pods of size g that fit whole, right now
  ever[g] = sum over its nodes of floor(alloc / g)  -- the same with every running pod gone
and a histogram of nodes by free GPUs. Summing per-node floors (not floors of the summed free
GPUs) is what keeps a 2-GPU pod from "fitting" two nodes with one free GPU each.

Nodes without a level's label are alone at that level: their domain there is keyed by the
node's hostname, so placement never assumes they share a switch with anyone.
"""
from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping

from .config import HOSTNAME_LABEL, Config, HardwareProfile
from .gpus import NVLINK_DOMAINS_ANNOTATION, parse_bandwidth_gbps, parse_nvlink_domains, pod_gpus, quantity_to_int
from .ledger import ReservationLedger, held_by
from .model import GPU_RESOURCE, DomainRef, PlacementRequest

BANDWIDTH_LABEL = "topology.scheduler/network-bandwidth"
PRODUCT_LABEL = "nvidia.com/gpu.product"
RESERVATION_ANNOTATION = "topology.scheduler/reservation"
GPU_IDS_ANNOTATION = "topology.scheduler/gpu-ids"
_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
_FINISHED_PHASES = ("Succeeded", "Failed")
MAX_SUBSETS = 32


class Domain:
    """One topology domain and the capacity aggregates of the nodes below it."""

    __slots__ = ("ref", "parent", "children", "free_hist", "cap", "ever", "free_gpus", "alloc_gpus", "nodes",
                 "partly_used")

    def __init__(self, ref: DomainRef, parent: "Domain | None", width: int):
        self.ref = ref
        self.parent = parent
        self.children: dict[str, "Domain | NodeState"] = {}  # keyed by the child's label value / node name
        self.free_hist = [0] * (width + 1)  # nodes by free GPUs
        self.cap = [0] * (width + 1)  # cap[g]: pods of g GPUs that fit whole now
        self.ever = [0] * (width + 1)  # ever[g]: the same on an idle cluster
        self.free_gpus = 0
        self.alloc_gpus = 0  # GPUs of eligible nodes
        self.nodes = 0
        self.partly_used = 0  # nodes with some GPUs taken and some free: where small jobs run

    def slots(self, gpus: int) -> int:
        """Nodes that can take one more pod of `gpus` GPUs (distributed placement counts these)."""
        return sum(self.free_hist[gpus:]) if gpus < len(self.free_hist) else 0

    def __repr__(self) -> str:
        return f"Domain({self.ref}, free={self.free_gpus})"


@dataclass(eq=False)
class NodeState:
    """What the index knows of one node; `free` is what a new workload may count on."""

    name: str
    labels: Mapping[str, str]
    eligible: bool  # Ready and not cordoned
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect) with NoSchedule/NoExecute
    alloc: int  # allocatable nvidia.com/gpu
    nvlink_domains: tuple[tuple[int, ...], ...]
    profile: HardwareProfile
    bandwidth_gbps: float | None
    parent: Domain | None = None
    free: int = 0  # GPUs a new workload may count on; refreshed whenever the node is (re)counted
    pods: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)  # pod key -> (gpus, ids)
    # GPU sets the ledger holds here, whoever holds them: the index copies them in place after
    # every ledger change, so constrained subsets (which share this list) see them too.
    held: list[tuple[int, ...]] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(gpus for gpus, _ in self.pods.values())

    @property
    def held_gpus(self) -> int:
        return sum(len(ids) for ids in self.held)

    def compute_free(self) -> int:
        return max(0, self.alloc - self.used - self.held_gpus) if self.eligible else 0

    @property
    def taken_ids(self) -> set[int]:
        taken = {i for _, ids in self.pods.values() for i in ids}
        taken.update(i for ids in self.held for i in ids)
        return taken

    def nvlink_groups(self) -> list[tuple[int, ...]]:
        """Every GPU index in exactly one group: the NVLink domains plus singletons for the rest."""
        listed = {i for d in self.nvlink_domains for i in d}
        return list(self.nvlink_domains) + [(i,) for i in range(self.alloc) if i not in listed]

    def pick_gpus(self, count: int, taken: set[int]) -> tuple[int, ...]:
        """An NVLink-aligned set: the smallest group that holds `count` (best fit), else the
        fullest groups first, so a pod spans as few NVLink domains as possible."""
        groups = [[i for i in g if i not in taken and i < self.alloc] for g in self.nvlink_groups()]
        groups = [g for g in groups if g]
        fitting = [g for g in groups if len(g) >= count]
        if fitting:
            return tuple(min(fitting, key=lambda g: (len(g), g[0]))[:count])
        chosen: list[int] = []
        for group in sorted(groups, key=lambda g: (-len(g), g[0])):
            chosen.extend(group[: count - len(chosen)])
            if len(chosen) == count:
                break
        return tuple(sorted(chosen))


@dataclass(frozen=True)
class ClusterStats:
    gpus_total: int
    gpus_used: int
    gpus_reserved: int
    allocation_ratio: float
    fragmentation_ratio: float  # free GPUs stranded on partly used nodes / all free GPUs
    domain_utilization: tuple[tuple[str, str, float], ...]  # (level name, domain, used share)


def _node_profile(labels: Mapping[str, str], config: Config) -> HardwareProfile:
    return config.profile_for(labels.get(PRODUCT_LABEL, ""))


def parse_node(node: Mapping, config: Config) -> NodeState:
    """A NodeState from a Node object; malformed fields count as 'no GPUs', never as an error."""
    meta = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = dict(meta.get("labels") or {})
    annotations = meta.get("annotations") or {}
    try:
        alloc = quantity_to_int((status.get("allocatable") or {}).get(GPU_RESOURCE, 0))
    except ValueError:
        alloc = 0
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
    taints = tuple((t.get("key", ""), t.get("value", "") or "", t.get("effect", ""))
                   for t in spec.get("taints") or () if t.get("effect") in _BLOCKING_EFFECTS)
    profile = _node_profile(labels, config)
    try:
        domains = parse_nvlink_domains(annotations[NVLINK_DOMAINS_ANNOTATION])
    except (KeyError, ValueError):
        size = profile.nvlink_domain_size
        domains = tuple(tuple(range(s, min(s + size, alloc))) for s in range(0, alloc, size)) if size > 1 else ()
    try:
        bandwidth = parse_bandwidth_gbps(labels[BANDWIDTH_LABEL])
    except (KeyError, ValueError):
        bandwidth = None
    return NodeState(name=meta.get("name", ""), labels=labels, eligible=ready and not spec.get("unschedulable"),
                     taints=taints, alloc=alloc, nvlink_domains=domains, profile=profile, bandwidth_gbps=bandwidth)


def _placement_fields(node: NodeState) -> tuple:
    """What placement reads of a node: an update that changes none of it changes nothing."""
    return (node.labels, node.eligible, node.taints, node.alloc, node.nvlink_domains, node.profile,
            node.bandwidth_gbps)


def pod_key(pod: Mapping) -> str:
    meta = pod.get("metadata") or {}
    return meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def pending_hold(annotations: Mapping, spec: Mapping, gpus: int) -> tuple[str, str, tuple[int, ...]] | None:
    """(reservation key, node, GPU set) an unbound pod holds: one carrying our reservation key and
    the GPU set we chose, with node affinity naming one node (a single-pod placement). A pod
    pinned to a domain of several nodes names no node: its workload's hold covers it."""
    reservation, hinted = annotations.get(RESERVATION_ANNOTATION), annotations.get(GPU_IDS_ANNOTATION)
    if not reservation or not hinted or gpus <= 0:
        return None
    try:
        held = tuple(i for d in parse_nvlink_domains(str(hinted)) for i in d)
    except ValueError:
        return None
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms")
    preferred = affinity.get("preferredDuringSchedulingIgnoredDuringExecution") or ()
    terms = [*(required or ()), *(p.get("preference") for p in preferred)]
    named: set[str] = set()
    for term in terms:
        for expr in (term or {}).get("matchExpressions") or ():
            values = expr.get("values") or ()
            if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In" and len(values) == 1:
                named.add(str(values[0]))
    if len(named) != 1 or len(held) != gpus:
        return None
    return str(reservation), named.pop(), held


def tolerates(tolerations: Iterable[Mapping], taint: tuple[str, str, str]) -> bool:
    key, value, effect = taint
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != effect:
            continue
        if tol.get("operator") == "Exists":
            if not tol.get("key") or tol.get("key") == key:
                return True
        elif tol.get("key") == key and (tol.get("value") or "") == value:
            return True
    return False


def _expression_matches(expr: Mapping, labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def node_matches(node: NodeState, request: PlacementRequest) -> bool:
    """The workload's own constraints: nodeSelector, required node affinity, taints, bandwidth."""
    if any(node.labels.get(k) != v for k, v in request.node_selector.items()):
        return False
    if request.required_node_terms:
        fields = {"metadata.name": node.name}
        if not any(all(_expression_matches(e, node.labels) for e in term.get("matchExpressions") or ())
                   and all(_expression_matches(e, fields) for e in term.get("matchFields") or ())
                   for term in request.required_node_terms):
            return False
    if any(not tolerates(request.tolerations, t) for t in node.taints):
        return False
    if request.min_bandwidth_gbps and (node.bandwidth_gbps or 0) < request.min_bandwidth_gbps:
        return False
    return True


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
        self.ledger = ReservationLedger(config.reservation_ttl_seconds, clock)
        self.claims = None  # placer.SharedClaims when replicas share their holds (set by the live view)
        self.width = width  # largest GPU count of any node seen; aggregates are sized to it
        self.root = Domain(DomainRef(-1, "cluster", ()), None, width)
        self.levels: list[dict[tuple, Domain]] = [{} for _ in config.levels]  # per level: path -> domain
        self.nodes: dict[str, NodeState] = {}
        self.by_value: dict[str, set[tuple]] = {}  # label value / node name -> domain paths (preferred-domain)
        self.orphan_pods: dict[str, dict[str, tuple[int, tuple[int, ...]]]] = {}  # pods bound to unknown nodes
        self.pod_nodes: dict[str, str] = {}  # pod key -> node name it is counted on
        # Inverted indexes over GPU nodes, to judge a request's node constraints without a scan.
        self.taint_counts: dict[tuple[str, str, str], int] = {}
        self.by_label: dict[tuple[str, str], set[str]] = {}  # (key, value) -> node names
        self.key_counts: dict[str, int] = {}
        self.bandwidth_counts: dict[float, int] = {}  # advertised Gb/s (0 = none) -> nodes
        self.gpu_nodes = 0
        # Constrained subsets: for a request whose node constraints leave nodes out, a tree of just
        # the nodes it may use, by the request's constraints. Kept exact on every event: pod and
        # hold changes shift their aggregates, a changed node moves in or out of each one.
        self.subsets: OrderedDict[tuple, tuple[PlacementRequest, ClusterIndex]] = OrderedDict()

    @classmethod
    def from_objects(cls, config: Config, nodes: Iterable[Mapping], pods: Iterable[Mapping] = (),
                     clock: Callable[[], float] = time.monotonic) -> "ClusterIndex":
        nodes = list(nodes)
        width = max([8] + [parse_node(n, config).alloc for n in nodes])
        index = cls(config, width, clock)
        for node in nodes:
            index.upsert_node(node)
        for pod in pods:
            index.upsert_pod(pod)
        return index

    # -- structure -------------------------------------------------------------------------

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
        while domain is not None and domain is not self.root and not domain.children:
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

    def _grow(self, width: int) -> None:
        """A node with more GPUs than any before: widen every aggregate and recount (rare)."""
        self.width = width
        self.subsets.clear()  # built for the old width; rebuilt on next use
        for domain in [self.root, *(d for level in self.levels for d in level.values())]:
            domain.free_hist = [0] * (width + 1)
            domain.cap = [0] * (width + 1)
            domain.ever = [0] * (width + 1)
            domain.free_gpus = domain.alloc_gpus = domain.nodes = domain.partly_used = 0
        for node in self.nodes.values():
            self._account(node, +1)

    def _account(self, node: NodeState, sign: int) -> None:
        """Add (sign=+1) or remove (-1) a node's contribution along its chain of domains."""
        if sign > 0:
            node.free = node.compute_free()
        free = node.free
        alloc = node.alloc if node.eligible else 0
        caps = [0] + [free // g for g in range(1, self.width + 1)]
        evers = [0] + [alloc // g for g in range(1, self.width + 1)]
        bucket = min(free, self.width)
        partly = sign * (0 < free < alloc)
        for domain in self.ancestors(node):
            domain.free_hist[bucket] += sign
            domain.partly_used += partly
            cap, ever = domain.cap, domain.ever
            for g in range(1, self.width + 1):
                cap[g] += sign * caps[g]
                ever[g] += sign * evers[g]
            domain.free_gpus += sign * free
            domain.alloc_gpus += sign * alloc
            domain.nodes += sign

    def _change(self, node: NodeState, mutate: Callable[[], None]) -> None:
        """Apply `mutate` (pods or holds, never labels or allocatable) to a node, with its
        aggregates, and those of subsets holding it, kept exact."""
        before = node.free
        mutate()
        after = node.compute_free()
        if after == before:
            return
        self._shift_free(node, before, after)
        for _, subset in self.subsets.values():
            copy = subset.nodes.get(node.name)
            if copy is not None:
                subset._shift_free(copy, before, after)

    def _shift_free(self, node: NodeState, before: int, after: int) -> None:
        """Move a node's free GPUs from `before` to `after` in every aggregate above it: only what
        free GPUs feed, since eligibility and allocatable stay as they were."""
        node.free = after
        deltas = [0] + [after // g - before // g for g in range(1, self.width + 1)]
        old_bucket, new_bucket = min(before, self.width), min(after, self.width)
        partly = (0 < after < node.alloc) - (0 < before < node.alloc)
        for domain in self.ancestors(node):
            domain.free_hist[old_bucket] -= 1
            domain.free_hist[new_bucket] += 1
            domain.partly_used += partly
            cap = domain.cap
            for g in range(1, self.width + 1):
                cap[g] += deltas[g]
            domain.free_gpus += after - before

    # -- nodes -------------------------------------------------------------------------------

    def upsert_node(self, obj: Mapping) -> None:
        with self.lock:
            fresh = parse_node(obj, self.config)
            if not fresh.name:
                return
            old = self.nodes.get(fresh.name)
            if old is not None and _placement_fields(old) == _placement_fields(fresh):
                return  # kubelet's status updates: nothing placement reads has changed
            if fresh.alloc > self.width:
                self._grow(fresh.alloc)
            if old is not None:
                fresh.pods = old.pods
                self._count_labels(old, -1)
                self._detach(old)
            else:
                fresh.pods = self.orphan_pods.pop(fresh.name, {})
            fresh.held = list(self.ledger.held_on(fresh.name))
            self._attach(fresh)
            self._count_labels(fresh, +1)
            for request, subset in self.subsets.values():  # move the node in or out of each subset
                if fresh.name in subset.nodes:
                    subset._detach(subset.nodes[fresh.name])
                if node_matches(fresh, request):
                    subset._attach(dataclasses.replace(fresh, parent=None))  # shares pods and holds

    def _attach(self, node: NodeState) -> None:
        node.parent = self._domain_for(self.node_path(node))
        node.parent.children[node.name] = node
        self.nodes[node.name] = node
        self.by_value.setdefault(node.name, set()).add(node.parent.ref.path + ((HOSTNAME_LABEL, node.name),))
        self._account(node, +1)

    def delete_node(self, name: str) -> None:
        with self.lock:
            node = self.nodes.get(name)
            if node is not None:
                for _, subset in self.subsets.values():
                    if name in subset.nodes:
                        subset._detach(subset.nodes[name])
                self._count_labels(node, -1)
                self._detach(node)
                if node.pods:  # its pods may still be deleted later; keep them until then
                    self.orphan_pods[name] = node.pods

    def _detach(self, node: NodeState) -> None:
        """Take a node out of the tree (the inverse of _attach)."""
        self._account(node, -1)
        del self.nodes[node.name]
        del node.parent.children[node.name]
        paths = self.by_value[node.name]
        paths.discard(node.parent.ref.path + ((HOSTNAME_LABEL, node.name),))
        if not paths:
            del self.by_value[node.name]
        self._prune(node.parent)
        node.parent = None

    def _count_labels(self, node: NodeState, sign: int) -> None:
        if node.alloc <= 0:
            return
        self.gpu_nodes += sign
        for item in node.labels.items():
            names = self.by_label.setdefault(item, set())
            (names.add if sign > 0 else names.discard)(node.name)
            if not names:
                del self.by_label[item]
            self.key_counts[item[0]] = self.key_counts.get(item[0], 0) + sign
        for taint in node.taints:
            self.taint_counts[taint] = self.taint_counts.get(taint, 0) + sign
        bandwidth = node.bandwidth_gbps or 0.0
        self.bandwidth_counts[bandwidth] = self.bandwidth_counts.get(bandwidth, 0) + sign

    # -- pods --------------------------------------------------------------------------------

    def upsert_pod(self, pod: Mapping) -> None:
        with self.lock:
            key = pod_key(pod)
            spec = pod.get("spec") or {}
            node_name = spec.get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            try:
                gpus = pod_gpus(spec)
            except ValueError:
                gpus = 0
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            if not node_name or phase in _FINISHED_PHASES or gpus <= 0:
                self._forget_pod(key)
                pending = None if node_name or phase in _FINISHED_PHASES else pending_hold(annotations, spec, gpus)
                if pending is None:
                    self._recount(self.ledger.drop_pod(key))
                else:
                    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
                    self._recount(self.ledger.hold_pod(key, pending[0], namespace, pending[1], pending[2]))
                return
            counted = self.nodes.get(node_name)
            if self.pod_nodes.get(key) == node_name and counted is not None and counted.pods[key][0] == gpus:
                return  # status updates of a counted pod change nothing we count
            self._forget_pod(key)
            self._recount(self.ledger.drop_pod(key))
            node = self.nodes.get(node_name)
            self.pod_nodes[key] = node_name
            reservation = annotations.get(RESERVATION_ANNOTATION)
            if node is None:
                self.orphan_pods.setdefault(node_name, {})[key] = (gpus, ())
                return
            self._change(node, lambda: self._bind(node, key, gpus, annotations.get(GPU_IDS_ANNOTATION)))
            if reservation:
                namespace = str((pod.get("metadata") or {}).get("namespace") or "")
                self._recount(self.ledger.confirm(reservation, key, namespace, node_name))

    def _bind(self, node: NodeState, key: str, gpus: int, hinted: str | None) -> None:
        taken = {i for _, ids in node.pods.values() for i in ids}
        ids: tuple[int, ...] = ()
        if hinted:
            try:
                wanted = tuple(i for d in parse_nvlink_domains(hinted) for i in d)
            except ValueError:
                wanted = ()
            if len(wanted) == gpus and not taken.intersection(wanted) and all(i < node.alloc for i in wanted):
                ids = wanted  # the device plugin honoured our hint (or we assume it did)
        node.pods[key] = (gpus, ids or node.pick_gpus(gpus, taken))

    def delete_pod(self, pod: Mapping) -> None:
        """A pod is gone. A pod placed on its own (not from a workload's template) is its own
        workload: its deletion ends the reservation it may still hold."""
        with self.lock:
            self._forget_pod(pod_key(pod))
            self._recount(self.ledger.drop_pod(pod_key(pod)))
            meta = pod.get("metadata") or {}
            reservation = str((meta.get("annotations") or {}).get(RESERVATION_ANNOTATION) or "")
            if reservation and held_by(reservation, str(meta.get("namespace") or ""), "Pod"):
                self.release(reservation)

    def _forget_pod(self, key: str) -> None:
        node_name = self.pod_nodes.pop(key, None)
        if node_name is None:
            return
        node = self.nodes.get(node_name)
        if node is not None:
            self._change(node, lambda: node.pods.pop(key, None))
        else:
            orphans = self.orphan_pods.get(node_name, {})
            orphans.pop(key, None)
            if not orphans:
                self.orphan_pods.pop(node_name, None)

    # -- reservations ------------------------------------------------------------------------

    def reserve(self, key: str, sets_per_node: Mapping[str, list[tuple[int, ...]]], ttl: float | None = None) -> None:
        """Hold GPU sets on nodes for a workload until its pods are seen bound or it expires.
        Reserving a key again replaces the old hold, so re-placing a workload never double-books."""
        with self.lock:
            self._recount(self.ledger.reserve(key, {n: s for n, s in sets_per_node.items() if n in self.nodes}, ttl))

    def release(self, key: str) -> None:
        with self.lock:
            self._recount(self.ledger.release(key))

    def expire_reservations(self) -> None:
        with self.lock:
            self._recount(self.ledger.expire())

    def _recount(self, names: Iterable[str]) -> None:
        """Copy the ledger's holds onto the nodes they changed on, with their aggregates."""
        for name in names:
            node = self.nodes.get(name)
            if node is not None:
                self._change(node, lambda n=node: n.held.__setitem__(slice(None), self.ledger.held_on(n.name)))

    # -- reading -----------------------------------------------------------------------------

    def _matching(self, key: str, values: Iterable[str]) -> int:
        return sum(len(self.by_label.get((key, v), ())) for v in values)

    def _admits_all(self, expr: Mapping) -> bool:
        """Whether one matchExpression admits every GPU node, from the label counts alone."""
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or ()
        if op == "In":
            return self._matching(key, values) == self.gpu_nodes
        if op == "NotIn":
            return self._matching(key, values) == 0
        if op == "Exists":
            return self.key_counts.get(key, 0) == self.gpu_nodes
        if op == "DoesNotExist":
            return self.key_counts.get(key, 0) == 0
        return False  # Gt/Lt: decided node by node

    def filters_nothing(self, request: PlacementRequest) -> bool:
        """True when the request's node constraints admit every GPU node, judged from label,
        taint and bandwidth counts without visiting nodes (the common case)."""
        if any(not tolerates(request.tolerations, t) for t, n in self.taint_counts.items() if n > 0):
            return False
        if any(len(self.by_label.get(item, ())) != self.gpu_nodes for item in request.node_selector.items()):
            return False
        if request.required_node_terms and not any(
                not term.get("matchFields") and all(self._admits_all(e) for e in term.get("matchExpressions") or ())
                for term in request.required_node_terms):
            return False
        wanted = request.min_bandwidth_gbps or 0
        return all(bw >= wanted for bw, n in self.bandwidth_counts.items() if n > 0)

    def _candidates(self, request: PlacementRequest) -> Iterable[NodeState]:
        """Nodes worth testing against the request: narrowed by nodeSelector and `In` terms."""
        narrowed: list[set[str]] = [self.by_label.get(item, set()) for item in request.node_selector.items()]
        per_term = []
        for term in request.required_node_terms:
            ins = [set().union(*(self.by_label.get((e.get("key"), v), set()) for v in e.get("values") or ()))
                   for e in term.get("matchExpressions") or () if e.get("operator") == "In"]
            if not ins:
                per_term = []
                break
            per_term.append(set.intersection(*ins))
        if per_term:
            narrowed.append(set().union(*per_term))
        if not narrowed:
            return self.nodes.values()
        return [self.nodes[name] for name in sorted(set.intersection(*narrowed)) if name in self.nodes]

    def restricted_to(self, request: PlacementRequest) -> "ClusterIndex":
        """This index, or the constrained subset holding only the nodes the request may use.
        Subsets are cached by the request's constraints (at most `MAX_SUBSETS`), so repeated
        selectors cost one build."""
        if self.filters_nothing(request):
            return self
        signature = (tuple(sorted(request.node_selector.items())), request.min_bandwidth_gbps,
                     json.dumps([request.required_node_terms, request.tolerations], sort_keys=True))
        cached = self.subsets.get(signature)
        if cached is None:
            subset = ClusterIndex(self.config, self.width)
            for node in self._candidates(request):
                if node_matches(node, request):
                    subset._attach(dataclasses.replace(node, parent=None))  # shares pods and holds
            cached = self.subsets[signature] = (request, subset)
            if len(self.subsets) > MAX_SUBSETS:
                self.subsets.popitem(last=False)
        self.subsets.move_to_end(signature)
        return cached[1]

    def stats(self) -> ClusterStats:
        with self.lock:
            total = self.root.alloc_gpus
            free = self.root.free_gpus
            reserved = sum(n.held_gpus for n in self.nodes.values() if n.eligible)
            stranded = sum(n.free for n in self.nodes.values() if 0 < n.free < n.alloc)
            utilization = tuple(
                (self.config.levels[d.ref.level].name, d.ref.name,
                 round(1 - d.free_gpus / d.alloc_gpus, 6) if d.alloc_gpus else 0.0)
                for level in self.levels for d in sorted(level.values(), key=lambda d: d.ref.path))
            return ClusterStats(
                gpus_total=total, gpus_used=total - free - reserved, gpus_reserved=reserved,
                allocation_ratio=(total - free) / total if total else 0.0,
                fragmentation_ratio=stranded / free if free else 0.0,
                domain_utilization=utilization)
