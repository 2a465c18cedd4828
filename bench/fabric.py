"""The simulated cluster: zones > spines > leaves > nodes > NVLink domains > GPUs.

The layout is synthetic (no public GPU trace records racks: Philly, Helios, Acme, Alibaba PAI). Nodes are
built as real Node objects with webhook.kube.demo.make_node, so our placement core reads exactly what it
would read from the API server; `SimCluster` is the simulator's own ground truth of which GPU ids
are busy, shared by every policy.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from webhook.core.gpus import NVLINK_DOMAINS_ANNOTATION, format_nvlink_domains, parse_nvlink_domains
from webhook.kube.demo import make_node
from webhook.settings.config import DEFAULT_PROFILES, HardwareProfile

ZONE_LABEL = "topology.kubernetes.io/zone"
SPINE_LABEL = "topology.scheduler/spine"
LEAF_LABEL = "topology.scheduler/leaf"
GPUS_PER_NODE = 8

# Span levels, tightest first: where the traffic of a placement has to go.
NVLINK, NODE, LEAF, SPINE, ZONE, CLUSTER = range(6)
SPAN_NAMES = ("nvlink-domain", "node", "leaf", "spine", "zone", "cluster")


def profile_named(name: str) -> HardwareProfile:
    """A hardware profile of webhook/settings/config.py by name (the figures are never copied here)."""
    for profile in DEFAULT_PROFILES:
        if profile.name == name:
            return profile
    raise ValueError(f"hardware profile {name!r} is not one of {', '.join(p.name for p in DEFAULT_PROFILES)}")


@dataclass(frozen=True)
class Hardware:
    """One node type: the product label our core matches profiles on, and its NVLink islands."""

    key: str  # scenario name used in RESULTS.md
    product: str  # nvidia.com/gpu.product label value
    profile_name: str  # the webhook/settings/config.py profile that product matches
    nvlink_domains: str  # topology.scheduler/nvlink-domains annotation value

    @property
    def profile(self) -> HardwareProfile:
        return profile_named(self.profile_name)

    @property
    def domains(self) -> tuple[tuple[int, ...], ...]:
        return parse_nvlink_domains(self.nvlink_domains)


HARDWARE = {
    "h100": Hardware("h100", "NVIDIA-H100-80GB-HBM3", "h100-sxm", "0-7"),
    # Two 4-GPU NVLink islands joined by PCIe/UPI inside the node (the worked example in docs/design/cost-model.md).
    "a100-4x2": Hardware("a100-4x2", "NVIDIA-A100-SXM4-80GB", "a100-sxm", "0-3,4-7"),
    "h100-pcie": Hardware("h100-pcie", "NVIDIA-H100-PCIe", "h100-pcie", "0-1,2-3,4-5,6-7"),
}


@dataclass(frozen=True)
class ClusterSpec:
    zones: int = 2
    spines_per_zone: int = 2
    leaves_per_spine: int = 2
    nodes_per_leaf: int = 8
    hardware: Hardware = HARDWARE["h100"]

    @property
    def nodes(self) -> int:
        return self.zones * self.spines_per_zone * self.leaves_per_spine * self.nodes_per_leaf

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS_PER_NODE

    def describe(self) -> str:
        return (f"{self.zones} zones x {self.spines_per_zone} spines x {self.leaves_per_spine} leaves x "
                f"{self.nodes_per_leaf} nodes x {GPUS_PER_NODE} GPUs = {self.gpus} GPUs, "
                f"{self.hardware.product}, NVLink domains {self.hardware.nvlink_domains}, "
                f"{self.hardware.profile.nics_per_node} NICs per node")


@dataclass
class SimNode:
    name: str
    zone: str
    spine: str
    leaf: str
    domains: tuple[tuple[int, ...], ...]
    free: set[int] = field(default_factory=lambda: set(range(GPUS_PER_NODE)))

    def free_in_domains(self) -> list[int]:
        return [len(self.free.intersection(d)) for d in self.domains]


def build_nodes(spec: ClusterSpec) -> list[dict]:
    """Node objects in topology order (zone, spine, leaf, node), labelled as our levels expect."""
    out = []
    annotations = {NVLINK_DOMAINS_ANNOTATION: format_nvlink_domains(spec.hardware.domains)}
    for z in range(spec.zones):
        for s in range(spec.spines_per_zone):
            spine = f"z{z}-s{s}"
            for lf in range(spec.leaves_per_spine):
                leaf = f"{spine}-l{lf}"
                for n in range(spec.nodes_per_leaf):
                    labels = {ZONE_LABEL: f"z{z}", SPINE_LABEL: spine, LEAF_LABEL: leaf}
                    out.append(make_node(f"{leaf}-n{n}", labels, GPUS_PER_NODE, spec.hardware.product,
                                         annotations=annotations))
    return out


DOMAIN_KEYS = ("leaf", "spine", "zone")


class SimCluster:
    """Which GPU ids are busy on which node; the single truth all policies and metrics read.

    Besides the GPU ids it keeps, exactly and only through `take` and `give_back`, the counts the
    policies and metrics ask for on every job, so none of them rescans every node: the nodes by free
    GPU count (`by_free[f]`: node positions with f free, in node order, which is name order), each
    domain's histogram of free counts (`histogram[key][domain][f]`), and how many nodes have f GPUs
    free in one NVLink domain at most (`nvlink_histogram`)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.node_objects = build_nodes(spec)
        domains = spec.hardware.domains
        self.nodes = [SimNode(o["metadata"]["name"], o["metadata"]["labels"][ZONE_LABEL],
                              o["metadata"]["labels"][SPINE_LABEL], o["metadata"]["labels"][LEAF_LABEL], domains)
                      for o in self.node_objects]
        if [n.name for n in self.nodes] != sorted(n.name for n in self.nodes):
            raise ValueError("node order must be name order: policies break ties by name through it")
        self.by_name = {n.name: n for n in self.nodes}
        self.position = {n.name: i for i, n in enumerate(self.nodes)}
        self.used = 0
        self.free_count = [GPUS_PER_NODE] * len(self.nodes)
        self.by_free: list[list[int]] = [[] for _ in range(GPUS_PER_NODE + 1)]
        self.by_free[GPUS_PER_NODE] = list(range(len(self.nodes)))
        self.histogram: dict[str, dict[str, list[int]]] = {key: {} for key in DOMAIN_KEYS}
        self.members: dict[str, dict[str, list[int]]] = {key: {} for key in DOMAIN_KEYS}  # node positions
        for i, node in enumerate(self.nodes):
            for key in DOMAIN_KEYS:
                domain = getattr(node, key)
                self.histogram[key].setdefault(domain, [0] * (GPUS_PER_NODE + 1))[GPUS_PER_NODE] += 1
                self.members[key].setdefault(domain, []).append(i)
        self.nvlink_histogram = [0] * (GPUS_PER_NODE + 1)
        self.nvlink_free = [max(node.free_in_domains()) for node in self.nodes]
        for free in self.nvlink_free:
            self.nvlink_histogram[free] += 1

    def take(self, node: str, gpu_ids: tuple[int, ...]) -> None:
        sim = self.by_name[node]
        if not sim.free.issuperset(gpu_ids):
            raise RuntimeError(f"GPUs {sorted(set(gpu_ids) - sim.free)} of {node} are already in use")
        sim.free.difference_update(gpu_ids)
        self.used += len(gpu_ids)
        self._recount(self.position[node])

    def give_back(self, node: str, gpu_ids: tuple[int, ...]) -> None:
        self.by_name[node].free.update(gpu_ids)
        self.used -= len(gpu_ids)
        self._recount(self.position[node])

    def _recount(self, i: int) -> None:
        node = self.nodes[i]
        old, new = self.free_count[i], len(node.free)
        if old != new:
            self.by_free[old].pop(bisect.bisect_left(self.by_free[old], i))
            bisect.insort(self.by_free[new], i)
            self.free_count[i] = new
            for key in DOMAIN_KEYS:
                histogram = self.histogram[key][getattr(node, key)]
                histogram[old] -= 1
                histogram[new] += 1
        nvlink = max(node.free_in_domains())
        if nvlink != self.nvlink_free[i]:
            self.nvlink_histogram[self.nvlink_free[i]] -= 1
            self.nvlink_histogram[nvlink] += 1
            self.nvlink_free[i] = nvlink

    def fitting(self, key: str, domain: str, gpus_per_pod: int) -> int:
        """Pods of `gpus_per_pod` GPUs the domain's nodes hold now, each pod whole on one node."""
        return sum(count * (free // gpus_per_pod) for free, count in enumerate(self.histogram[key][domain]))


def pick_gpus(node: SimNode, count: int) -> tuple[int, ...]:
    """The GPU ids the device plugin hands a pod: the NVLink domain that fits most tightly, else the
    fullest domains first (what NVIDIA's device plugin GetPreferredAllocation aims at), lowest ids first.
    Every policy gets this, so baselines are not penalised for GPU choice inside a node."""
    fitting = [d for d in node.domains if len(node.free.intersection(d)) >= count]
    if fitting:
        best = min(fitting, key=lambda d: (len(node.free.intersection(d)), d))
        return tuple(sorted(node.free.intersection(best)))[:count]
    chosen: list[int] = []
    for d in sorted(node.domains, key=lambda d: -len(node.free.intersection(d))):
        chosen.extend(sorted(node.free.intersection(d))[:count - len(chosen)])
        if len(chosen) == count:
            break
    return tuple(sorted(chosen))


def span_level(cluster: SimCluster, placement: dict[str, tuple[int, ...]]) -> int:
    """The narrowest level that holds every GPU of a placement {node: gpu ids}."""
    nodes = [cluster.by_name[n] for n in placement]
    if len(nodes) == 1:
        ids = set(next(iter(placement.values())))
        return NVLINK if any(ids.issubset(d) for d in nodes[0].domains) else NODE
    for level, key in ((LEAF, "leaf"), (SPINE, "spine"), (ZONE, "zone")):
        if len({getattr(n, key) for n in nodes}) == 1:
            return level
    return CLUSTER


def static_tightest(spec: ClusterSpec, pods: int, gpus_per_pod: int) -> int:
    """The narrowest level that could hold the job in an empty cluster."""
    if pods == 1:
        return NVLINK if gpus_per_pod <= max(len(d) for d in spec.hardware.domains) else NODE
    per_leaf = spec.nodes_per_leaf
    for level, nodes in ((LEAF, per_leaf), (SPINE, per_leaf * spec.leaves_per_spine),
                         (ZONE, per_leaf * spec.leaves_per_spine * spec.spines_per_zone)):
        if pods <= nodes:
            return level
    return CLUSTER


def dynamic_tightest(cluster: SimCluster, pods: int, gpus_per_pod: int) -> int | None:
    """The narrowest level at which some domain has room for the whole job now, over every domain
    (from the cluster's counts); None when nothing has room. Pod shape counts: a domain has room for
    pods that fit nodes."""
    if pods == 1:
        if any(cluster.nvlink_histogram[gpus_per_pod:]):
            return NVLINK
        return NODE if any(cluster.by_free[gpus_per_pod:]) else None
    for level, key in ((LEAF, "leaf"), (SPINE, "spine"), (ZONE, "zone")):
        if any(sum(histogram[gpus_per_pod:]) >= pods for histogram in cluster.histogram[key].values()):
            return level
    return CLUSTER if sum(len(nodes) for nodes in cluster.by_free[gpus_per_pod:]) >= pods else None
