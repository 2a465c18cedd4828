"""What the cluster's GPUs are doing, in figures: the gauges of serving/metrics.py and the topology page."""
from __future__ import annotations

from dataclasses import dataclass

from ..settings.config import Config
from .tree import NodeState, TopologyTree


@dataclass(frozen=True)
class ClusterStats:
    gpus_total: int
    gpus_used: int
    gpus_reserved: int
    gpus_provisional: int  # of the GPU sets held, those of admissions not seen stored yet
    allocation_ratio: float
    fragmentation_ratio: float  # free GPUs stranded on partly used nodes / all free GPUs
    domain_utilization: tuple[tuple[str, str, float], ...]  # (level name, domain, used share)
    levels: tuple[str, ...] = ()  # the level label keys in use, widest first
    gated_pods: int = 0  # pending pods our scheduling gate holds
    gated_oldest_seconds: float = 0.0  # how long the one held longest has waited, since this replica saw it
    preset: str = "configured"  # the preset `levels: auto` chose, or "configured"


def reserved_on(node: NodeState) -> int:
    """Held GPUs that are neither free nor used by a pod: a hold over GPUs a pod already has (one
    whose IDs we do not know, or an allotment's whole node) counts once."""
    return min(node.held_gpus, max(0, node.gpus - node.free - node.used))


def cluster_stats(tree: TopologyTree, config: Config, preset: str | None, provisional: int = 0,
                  gated: tuple[int, float] = (0, 0.0)) -> ClusterStats:
    total = tree.root.alloc_gpus
    free = tree.root.free_gpus
    reserved = sum(reserved_on(n) for n in tree.nodes.values() if n.eligible)
    stranded = sum(n.free for n in tree.nodes.values() if 0 < n.free < n.gpus)
    # Domains of several nodes only: a level whose domains are single hosts (GKE's host level,
    # nodes missing a label) would give a series per node, without bound.
    utilization = tuple(
        (config.levels[d.ref.level].name, d.ref.name, round(1 - d.free_gpus / d.alloc_gpus, 6) if d.alloc_gpus else 0.0)
        for level in tree.levels for d in sorted(level.values(), key=lambda d: d.ref.path) if d.nodes > 1)
    return ClusterStats(
        gpus_total=total, gpus_used=total - free - reserved, gpus_reserved=reserved, gpus_provisional=provisional,
        gated_pods=gated[0], gated_oldest_seconds=gated[1],
        allocation_ratio=(total - free) / total if total else 0.0,
        fragmentation_ratio=stranded / free if free else 0.0,
        domain_utilization=utilization, levels=tuple(lv.label for lv in config.levels),
        preset=preset or "configured")
