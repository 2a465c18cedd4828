"""The estimate every placed decision carries: the slowest link its collective traffic crosses
and the all-reduce bus bandwidth that leaves, from the hardware profiles and the levels' links
and oversubscription (docs/design/cost-model.md). Pure: it reads the tree, changes nothing."""
from __future__ import annotations

import math

from ..core.model import Interconnect, NodeAssignment, PlacementRequest
from ..settings.config import HardwareProfile
from ..state.tree import NodeState, TopologyTree


def bus_bandwidth(subset: TopologyTree, request: PlacementRequest, assignment: list[NodeAssignment]
                  ) -> tuple[Interconnect, float, HardwareProfile]:
    """Bottleneck all-reduce bus bandwidth (as nccl-tests' doc/PERFORMANCE.md defines busbw): the
    slowest pod inside, then the NICs of the node with the fewest job GPUs, then switch
    oversubscription."""
    nodes = [subset.nodes[a.node] for a in assignment]
    profile = min((n.profile for n in nodes), key=lambda p: p.nvlink_gbs)
    intra = min(p.nvlink_gbs if a.interconnect is Interconnect.NVLINK else p.pcie_gbs
                for a, p in zip(assignment, (n.profile for n in nodes)))
    if len(assignment) == 1 and assignment[0].pods == 1:
        return assignment[0].interconnect, intra, profile
    gpus = request.gpus_per_pod
    if len(assignment) == 1:
        return Interconnect.NODE, min(intra, _nics_of_one_node(nodes[0], gpus)), profile
    common = _common_prefix([n.domain.ref.path for n in nodes])
    link, divisor = crossing(subset, len(common) - 1)
    if link == "nvlink":
        return Interconnect.NVLINK, profile.nvlink_gbs, profile
    network = min(min(a.pods * gpus, n.profile.nics_per_node) * n.profile.nic_gbs for a, n in zip(assignment, nodes))
    return Interconnect(link), min(intra, network / divisor), profile


def _nics_of_one_node(node: NodeState, gpus_per_pod: int) -> float:
    """What the pods of one job on one node reach each other through: ranks in different pods share
    no NVLink (NCCL needs one host and /dev/shm), so the NICs, each pod its share of them."""
    return max(1, node.profile.nics_per_node * gpus_per_pod // max(node.gpus, 1)) * node.profile.nic_gbs


def crossing(subset: TopologyTree, level: int) -> tuple[str, float]:
    """The link traffic takes between the nodes of one domain of `level` (-1: the cluster) and
    what divides the nodes' NIC bandwidth there: the oversubscription of that level and every
    level below it."""
    levels = subset.config.levels
    divisor = math.prod(lv.oversubscription for lv in levels[max(level, 0):])
    if level < 0:
        return "cluster", divisor * subset.config.cluster_oversubscription
    return levels[level].link, divisor


def bandwidth_across(subset: TopologyTree, request: PlacementRequest, level: int, node: NodeState) -> float:
    """The bus bandwidth `bus_bandwidth` would give the request's pods on nodes like `node`
    spanning the children of one domain of `level` (-1: the cluster; len(levels): several pods on
    that one node, which talk over its NICs, their share of them): NVLink where the nodes share a
    fabric, else each node's NICs divided by the oversubscription crossed."""
    profile = node.profile
    if level >= len(subset.config.levels):
        return min(profile.nvlink_gbs, _nics_of_one_node(node, request.gpus_per_pod))
    link, divisor = crossing(subset, level)
    if link == "nvlink":
        return profile.nvlink_gbs
    nics = min(request.gpus_per_pod, profile.nics_per_node) * profile.nic_gbs
    return min(profile.nvlink_gbs, nics / divisor)


def spill_costs(subset: TopologyTree, request: PlacementRequest, level: int) -> bool:
    """Whether the request's estimate would drop if it spanned a domain one level wider than
    `level` (len(levels): a node). A pod never spans nodes, so one pod loses nothing anywhere;
    pods leaving one node go from its GPU links to the NICs (unless the nodes share an NVLink
    fabric, as an NVL72 rack's do); wider still, they lose when the link or the oversubscription
    changes."""
    if request.pods == 1:
        return False
    if level >= len(subset.config.levels):
        return crossing(subset, level - 1)[0] != "nvlink"
    return _speed(subset, level - 1) != _speed(subset, level)


def _speed(subset: TopologyTree, level: int) -> tuple[bool, float]:
    """What sets the bandwidth across a level: NVLink, or the NICs and that divisor."""
    link, divisor = crossing(subset, level)
    return link == "nvlink", 1.0 if link == "nvlink" else divisor


def _common_prefix(paths: list[tuple]) -> tuple:
    first = paths[0]
    size = 0
    while size < len(first) and all(len(p) > size and p[size] == first[size] for p in paths):
        size += 1
    return first[:size]
