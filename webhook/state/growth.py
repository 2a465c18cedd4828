"""How the cluster can grow, from what autoscalers publish: their facts in (webhook/objects/
autoscaler_objects.py reads them from the API's objects), pools out. Pure.

Two kinds of pool, one model (`Pool`): what labels every node the pool adds will carry, which are
known before the node exists, its GPUs per node, and how many more nodes or GPUs it may add.

- Karpenter `NodePool` (karpenter.sh/v1): the template's labels and requirements say what a new
  node carries (https://karpenter.sh/docs/concepts/nodepools/); `spec.limits` less
  `status.resources` is its room. Its nodes carry `karpenter.sh/nodepool`. A pool with
  `spec.replicas` (static capacity) or `Ready=False` does not grow for pods.
- cluster-autoscaler node groups: the `cluster-autoscaler-status` ConfigMap in kube-system (YAML
  since cluster-autoscaler 1.30) gives each group's size, maximum and health, by the cloud
  group's name (GKE MIG, AWS ASG, Azure VMSS), which holds the pool's name. What a new node of
  the group looks like is learnt as cluster-autoscaler itself learns it: from a node of the pool
  there is (https://github.com/kubernetes/autoscaler/blob/master/cluster-autoscaler/FAQ.md),
  found by the platform's pool label (GKE `cloud.google.com/gke-nodepool`, EKS
  `eks.amazonaws.com/nodegroup`, AKS `kubernetes.azure.com/agentpool`).

A pin on a label whose value a new node only gets after it is launched (a block, a network node
layer) stops Karpenter from launching any node for the pod, and makes cluster-autoscaler scale the
wrong group, so only the pool's identity and the topology labels known in advance are pinned:
its single zone, placement group, reservation, or any topology label a compact pool's nodes share.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..core.model import PlacementRequest
from ..settings.config import LABEL_VALUE_MAX, Config
from ..settings.presets import HOSTNAME_LABEL
from .filters import tolerates
from .tree import NodeState

NODEPOOL_KIND = "NodePool"
NODEPOOL_GROUP = "karpenter.sh"
NODEPOOL_LABEL = "karpenter.sh/nodepool"
CA_STATUS_NAMESPACE = "kube-system"
CA_STATUS_NAME = "cluster-autoscaler-status"
# The label each platform puts on every node of a node group (cluster-autoscaler sets none itself).
GROUP_LABELS = ("cloud.google.com/gke-nodepool", "eks.amazonaws.com/nodegroup", "kubernetes.azure.com/agentpool")
# The label naming a node's pool, whichever autoscaler grows it.
POOL_LABELS = (NODEPOOL_LABEL, *GROUP_LABELS)
ZONE_LABEL = "topology.kubernetes.io/zone"
# Topology labels a pool fixes before its nodes exist: pinning one of them keeps a group in one
# domain without keeping new nodes out.
TOPOLOGY_IN_ADVANCE = (ZONE_LABEL, "topology.k8s.aws/zone-id", "karpenter.k8s.aws/placement-group-id",
                       "karpenter.k8s.aws/capacity-reservation-id", "cloud.google.com/gke-placement-group",
                       "kubernetes.azure.com/ppg")
# A pool whose nodes share one of these sits in one placement domain (GKE compact placement, an EC2
# placement group, an Azure proximity placement group): the topology labels they share are the
# pool's own, known for the nodes it adds too.
COMPACT_LABELS = ("cloud.google.com/gke-placement-group", "karpenter.k8s.aws/placement-group-id",
                  "kubernetes.azure.com/ppg")
# Labels that Karpenter sets from its instance catalog: a pod may require them though the NodePool
# does not name them (Karpenter picks an instance type that has them). Any other key a NodePool
# does not define keeps Karpenter from launching a node for the pod.
_KARPENTER_WELL_KNOWN = frozenset((ZONE_LABEL, "topology.kubernetes.io/region", "node.kubernetes.io/instance-type",
                                   "kubernetes.io/arch", "kubernetes.io/os", "karpenter.sh/capacity-type",
                                   "node.kubernetes.io/windows-build", "topology.k8s.aws/zone-id"))
_KARPENTER_CATALOG_PREFIXES = ("karpenter.k8s.aws/instance-", "karpenter.azure.com/sku-", "eks.amazonaws.com/instance-")
@dataclass(frozen=True)
class Pool:
    """A set of nodes that can grow, and what the nodes it adds will carry."""

    kind: str  # "NodePool" (Karpenter) or "node group" (cluster-autoscaler)
    name: str
    identity: tuple[str, str]  # the label naming the pool on each of its nodes
    fixed: Mapping[str, str]  # labels every new node carries, with values known now (identity included)
    choices: Mapping[str, tuple[str, ...]]  # labels a new node carries with one of these values
    unknown: frozenset[str]  # labels a new node carries with a value known only once it exists
    excluded: Mapping[str, frozenset[str]] = field(default_factory=dict)  # values a new node never has
    absent: frozenset[str] = frozenset()  # labels a new node never carries
    catalog_keys: bool = False  # Karpenter: well-known labels not named here are still chosen for the pod
    taints: tuple[tuple[str, str, str], ...] = ()
    gpus_per_node: int | None = None  # None: not known before a node exists
    other_allocatable: Mapping[str, int] = field(default_factory=dict)  # other resources of a node ({}: unknown)
    bandwidth_gbps: float | None = None
    room_nodes: int | None = None  # nodes it may still add; None: no limit known
    room_gpus: int | None = None
    weight: int = 0  # Karpenter's weight: the heavier pool is tried first
    members: frozenset[str] = frozenset()  # its nodes there are

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    def _values(self, key: str) -> tuple[frozenset[str] | None, bool]:
        """(the values a new node may carry for `key`, None for any; whether it may lack the key)."""
        excluded = self.excluded.get(key, frozenset())
        if key in self.fixed:
            return frozenset((self.fixed[key],)) - excluded, False
        if key in self.choices:
            return frozenset(self.choices[key]) - excluded, False
        if key in self.unknown or key in self.excluded:
            return None, False
        if key in self.absent:
            return frozenset(), True
        if self.catalog_keys and (key in _KARPENTER_WELL_KNOWN or key.startswith(_KARPENTER_CATALOG_PREFIXES)):
            return None, True
        return frozenset(), True

    def allows(self, expression: Mapping) -> bool:
        """Whether some node the pool adds can satisfy one matchExpression."""
        key, op = str(expression.get("key")), expression.get("operator")
        wanted: list = list(expression.get("values") or ())
        values, may_lack = self._values(key)
        excluded = self.excluded.get(key, frozenset())
        if op == "In":
            return bool(set(map(str, wanted)) - excluded) if values is None else bool(values & set(map(str, wanted)))
        if op == "NotIn":
            return may_lack or values is None or bool(values - set(map(str, wanted)))
        if op == "Exists":
            return values is None or bool(values)
        if op == "DoesNotExist":
            return may_lack
        if op in ("Gt", "Lt"):
            if values is None:
                return True
            try:
                bound = int(wanted[0])
            except (IndexError, ValueError):
                return False
            return any(v.isdigit() and (int(v) > bound if op == "Gt" else int(v) < bound) for v in values)
        return False

    def takes(self, request: PlacementRequest) -> bool:
        """Whether nodes this pool adds may take the request's pods: its selectors and affinity,
        taints, bandwidth, and one pod's size."""
        if self.gpus_per_node is not None and request.gpus_per_pod > self.gpus_per_node:
            return False
        if any(self.other_allocatable.get(name, amount) < amount for name, amount in request.resources):
            return False
        if request.min_bandwidth_gbps and (self.bandwidth_gbps or 0) < request.min_bandwidth_gbps:
            return False
        if any(not tolerates(request.tolerations, taint) for taint in self.taints):
            return False
        if not all(self.allows({"key": k, "operator": "In", "values": [v]}) for k, v in request.node_selector.items()):
            return False
        terms = request.required_node_terms
        return not terms or any(not term.get("matchFields") and all(self.allows(e) for e in term.get("matchExpressions")
                                                                      or ()) for term in terms)

    def room_for(self, request: PlacementRequest, free_pods: int) -> bool:
        """Whether the pool, with `free_pods` of the request's pods fitting on its nodes now, has
        room to add nodes for the rest."""
        left = request.pods - free_pods
        if left <= 0:
            return True
        if self.gpus_per_node is None:
            return self.room_gpus is None or self.room_gpus >= left * request.gpus_per_pod
        nodes = math.ceil(left / (self.gpus_per_node // request.gpus_per_pod))
        return ((self.room_nodes is None or self.room_nodes >= nodes)
                and (self.room_gpus is None or self.room_gpus >= nodes * self.gpus_per_node))


@dataclass(frozen=True, slots=True)
class GrowthFact:
    """An autoscaler's object, by its key: a NodePool's pool (None: it does not grow for pods), or
    cluster-autoscaler's node groups; `gone` when it is deleted."""

    key: str
    facts: "Pool | NodeGroups | None"
    gone: bool = False


# cluster-autoscaler's healthy node groups not backing off: (cloud group name, nodes it may still add)
NodeGroups = tuple[tuple[str, int], ...]


class GrowthState:
    """The autoscaler objects seen, and the nodes of each pool, for `pools()` to read. The index
    feeds it; `pools()` is rebuilt only after something it reads has changed."""

    def __init__(self) -> None:
        # by object key: a NodePool's pool (None: it does not grow for pods), or cluster-autoscaler's
        # node groups
        self.objects: dict[str, Pool | NodeGroups | None] = {}
        self.members: dict[tuple[str, str], set[str]] = {}  # (pool label, value) -> node names
        self._cached: tuple[Pool, ...] | None = None
        self._levels: tuple = ()  # the levels the cache was made for (`levels: auto` may change them)

    def put(self, key: str, facts: Pool | NodeGroups | None) -> None:
        self.objects[key] = facts
        self._cached = None

    def forget(self, key: str) -> None:
        if self.objects.pop(key, None) is not None:
            self._cached = None

    def node_changed(self, name: str, before: Mapping[str, str], after: Mapping[str, str]) -> None:
        """A node was added (`before` empty), removed (`after` empty) or changed. A pool's new nodes
        are modelled on its nodes there are, so any change to one of them counts."""
        member = False
        for key in POOL_LABELS:
            member = member or key in before or key in after
            if before.get(key) == after.get(key):
                continue
            if key in before:
                names = self.members.get((key, before[key]), set())
                names.discard(name)
                if not names:
                    self.members.pop((key, before[key]), None)
            if key in after:
                self.members.setdefault((key, after[key]), set()).add(name)
        if member:
            self._cached = None

    def pools(self, nodes: Mapping[str, NodeState], config: Config) -> tuple[Pool, ...]:
        """Every pool that can grow, heaviest first."""
        if self._cached is None or self._levels != config.levels:
            self._levels = config.levels
            found: list[Pool] = []
            for facts in self.objects.values():
                if isinstance(facts, Pool):
                    found.append(_with_members(facts, self._nodes_of(facts.identity, nodes)))
                elif facts is not None:
                    found.extend(self._groups(facts, nodes, config))
            self._cached = tuple(sorted(found, key=lambda p: (-p.weight, p.kind, p.name)))
        return self._cached

    def _nodes_of(self, member: tuple[str, str], nodes: Mapping[str, NodeState]) -> list[NodeState]:
        return [nodes[n] for n in sorted(self.members.get(member, ())) if n in nodes]

    def _groups(self, groups: NodeGroups, nodes: Mapping[str, NodeState], config: Config) -> list[Pool]:
        """Pools from cluster-autoscaler's node groups, each matched to the pool label value its
        cloud group's name holds (the longest, when several do); groups of one pool add up."""
        room: dict[tuple[str, str], int] = {}
        for group, headroom in groups:
            # the pools whose names the group's name holds, looked up by its parts: linear in the
            # status, where matching every group against every pool would be quadratic
            candidates = [(label, name) for name in _dash_runs(group) for label in GROUP_LABELS
                          if (label, name) in self.members]
            if candidates:
                member = max(candidates, key=lambda m: (len(m[1]), m))
                room[member] = room.get(member, 0) + headroom
        return [node_group(member, self._nodes_of(member, nodes), headroom, config)
                for member, headroom in sorted(room.items()) if headroom > 0 and self.members.get(member)]


def _dash_runs(group: str) -> Iterable[str]:
    """The pool names a cloud group's name may hold as a whole dash-separated part
    (gke-<cluster>-<pool>-<hash>-grp, eks-<pool>-<uuid>, aks-<pool>-<n>-vmss): every run of its
    parts that a label value can be (at most 63 characters), so at most 32 runs per part."""
    parts = group.split("-")
    for start in range(len(parts)):
        run = parts[start]
        for end in range(start + 1, len(parts) + 1):
            if len(run) > LABEL_VALUE_MAX:
                break
            yield run
            if end < len(parts):
                run = f"{run}-{parts[end]}"


def node_group(member: tuple[str, str], sample: list[NodeState], headroom: int, config: Config) -> Pool:
    """A cluster-autoscaler node group, its new nodes modelled on the nodes there are: the labels
    they all share, without the hostname and without topology labels a new node only learns once
    launched (unless the pool is compact: then they are the pool's own)."""
    shared = dict(sample[0].labels)
    seen: dict[str, set[str]] = {}
    for node in sample:
        for key, value in node.labels.items():
            seen.setdefault(key, set()).add(value)
        shared = {k: v for k, v in shared.items() if node.labels.get(k) == v}
    compact = any(key in shared for key in COMPACT_LABELS)
    launched = ({lv.label for lv in config.levels} - set(TOPOLOGY_IN_ADVANCE)) | {HOSTNAME_LABEL}
    unknown = {k for k in launched if k in seen and not (compact and k in shared and k != HOSTNAME_LABEL)}
    fixed = {k: v for k, v in shared.items() if k not in unknown}
    choices = {k: tuple(sorted(seen[k])) for k in TOPOLOGY_IN_ADVANCE if k in seen and k not in shared}
    unknown -= set(choices)
    bandwidths = {node.bandwidth_gbps for node in sample}
    return Pool("node group", member[1], member, fixed, choices, frozenset(unknown),
                taints=tuple(sorted(set.intersection(*(set(n.taints) for n in sample)))),
                gpus_per_node=min(node.gpus for node in sample),
                other_allocatable={k: min(n.other_allocatable.get(k, 0) for n in sample) for k in sample[0].other_allocatable},
                bandwidth_gbps=bandwidths.pop() if len(bandwidths) == 1 else None,
                room_nodes=headroom, members=frozenset(n.name for n in sample))


def _with_members(pool: Pool, members: list[NodeState]) -> Pool:
    """A NodePool with its nodes there are; a GPU count nothing else says is the largest of theirs."""
    gpus = pool.gpus_per_node if pool.gpus_per_node is not None else max((n.gpus for n in members), default=None)
    return dataclasses.replace(pool, gpus_per_node=gpus, members=frozenset(n.name for n in members))
