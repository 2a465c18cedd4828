"""Topology levels and the presets of platforms' node labels, and which preset a cluster's nodes
call for (`levels: auto`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Level:
    """One topology level: the node label that names its domains, widest level first."""

    label: str
    name: str  # short name used in reasons and metrics ("zone", "spine", "leaf", "clique")
    link: str  # traffic between nodes inside one domain of this level crosses this link class
    # Bandwidth divisor once traffic crosses this domain's children (leaf->spine uplinks for a
    # spine). Defaults are estimates: leaf uplinks 1-4:1 and zone tiers 4-15:1 are the usual sweep
    # (docs/design/cost-model.md).
    oversubscription: float = 1.0


# Presets: label keys per platform. kubernetes.io/hostname is always the implicit last level.
PRESETS: dict[str, tuple[Level, ...]] = {
    "default": (
        Level("topology.kubernetes.io/zone", "zone", "zone", 4.0),
        Level("topology.scheduler/spine", "spine", "spine", 1.0),
        Level("topology.scheduler/leaf", "leaf", "leaf", 1.0),
    ),
    # GKE: block > sub-block (rack) > physical host (Kueue TAS uses the same levels).
    "gke": (
        Level("cloud.google.com/gce-topology-block", "block", "spine", 2.0),
        Level("cloud.google.com/gce-topology-subblock", "subblock", "leaf", 1.0),
        Level("cloud.google.com/gce-topology-host", "host", "leaf", 1.0),
    ),
    # EKS: layer-1 is the broadest network node, layer-3 the one nearest the instance.
    "aws": (
        Level("topology.k8s.aws/network-node-layer-1", "layer-1", "zone", 4.0),
        Level("topology.k8s.aws/network-node-layer-2", "layer-2", "spine", 1.0),
        Level("topology.k8s.aws/network-node-layer-3", "layer-3", "leaf", 1.0),
    ),
    # Multi-node NVLink (GB200/GB300 NVL72): nodes of one clique share an NVLink fabric.
    "nvl72": (
        Level("topology.kubernetes.io/zone", "zone", "zone", 4.0),
        Level("topology.scheduler/spine", "spine", "spine", 1.0),
        Level("nvidia.com/gpu.clique", "clique", "nvlink", 1.0),
    ),
}


# Labels that only one preset's clusters carry, most specific first: a cluster labelled for
# several (a GKE cluster whose nodes also carry our leaf label) takes the first that covers most nodes.
_PRESET_MARKS: tuple[tuple[str, str], ...] = (
    ("nvl72", "nvidia.com/gpu.clique"),
    ("gke", "cloud.google.com/gce-topology-block"),
    ("aws", "topology.k8s.aws/network-node-layer-1"),
    ("default", "topology.scheduler/leaf"),
    ("default", "topology.scheduler/spine"),
)


def preset_marks(labels: Mapping[str, str]) -> frozenset[str]:
    """The presets whose distinguishing label a node carries."""
    return frozenset(preset for preset, label in _PRESET_MARKS if label in labels)


def detect_preset(node_labels: Iterable[Mapping[str, str]]) -> tuple[str, str | None]:
    """(preset, warning) for a list of nodes' labels: see choose_preset."""
    counts: dict[str, int] = {}
    total = 0
    for labels in node_labels:
        total += 1
        for preset in preset_marks(labels):
            counts[preset] = counts.get(preset, 0) + 1
    return choose_preset(counts, total)


def choose_preset(counts: Mapping[str, int], total: int) -> tuple[str, str | None]:
    """(preset, warning): the preset whose distinguishing label most of `total` nodes carry
    (`counts`: nodes per preset), and a warning when none does (every node is then alone below
    its zone, so placement can only pack single nodes well)."""
    counts = {preset: n for preset, n in counts.items() if n > 0}
    if not counts:
        marks = ", ".join(label for _, label in _PRESET_MARKS)
        return "default", (f"levels: auto found none of {marks} on {total} node(s); using the default preset, "
                           "so every node is its own domain below the zone: label the nodes or set levels")
    order = [preset for preset, _ in _PRESET_MARKS]
    best = max(counts, key=lambda preset: (counts[preset], -order.index(preset)))
    return best, None


class PresetVotes:
    """The presets each node's labels mark (`levels: auto`), counted as nodes come and go."""

    def __init__(self) -> None:
        self._by_node: dict[str, frozenset[str]] = {}
        self._counts: dict[str, int] = {}

    def vote(self, name: str, marks: frozenset[str] | None, chosen: str | None, warned: bool
             ) -> tuple[str, str | None] | None:
        """Count node `name`'s marks (None: the node is gone); the (preset, warning) the nodes call
        for now, or None when that cannot have changed from `chosen` (and its warning, `warned`)."""
        if self._by_node.get(name) == marks:
            return None
        removed = self._by_node.pop(name, ())
        for preset in removed:
            self._counts[preset] -= 1
        if marks is not None:
            self._by_node[name] = marks
            for preset in marks:
                self._counts[preset] = self._counts.get(preset, 0) + 1
            if marks == {chosen} and not removed and not warned:
                return None  # a node adds only to the preset chosen: it stays chosen (most nodes of a list)
        return choose_preset(self._counts, len(self._by_node))

