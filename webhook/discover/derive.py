"""Node topology discovery: NVML facts -> NodeTopology -> the annotations and labels placement reads.
This module derives them from the facts (pure) and prints them for people.

Runs as `topology-webhook discover` on each GPU node (a DaemonSet), in the manner of GPU Feature
Discovery: one small function reads one fact through NVML, pure functions derive what placement
needs from those facts, and one function patches them onto the agent's own Node.

NVML is reached through one seam: every reader takes `nvml`, a module with the pynvml API of
nvidia-ml-py (imported lazily by `load_nvml`, never at import time), so tests pass fake modules.

Published on the Node (keys this agent owns; it never touches any other key):

annotations
  topology.scheduler/nvlink-domains   GPU sets that reach each other over NVLink, directly or through
                                      NVSwitch, in webhook.core.gpus notation (`0-7`, `0-3,4-7`, `0+2,1+3`);
                                      empty when no two GPUs share NVLink. Placement reads this.
  topology.scheduler/gpu-link-matrix  the `nvidia-smi topo -m` GPU matrix: rows by GPU index joined by
                                      `;`, cells joined by `,`; codes X (self), NV<links>, PIX, PXB,
                                      PHB, NODE, SYS, and `-` where the GPU or the NVML call failed.
  topology.scheduler/numa-groups      GPUs sharing host NUMA affinity, one GPU set each (`0-3,4-7`).
  topology.scheduler/gpus-unreadable  GPUs that failed mid-read and were left out (absent when none).
labels
  topology.scheduler/gpu-link         weakest link between two GPUs of one NVLink domain, over all
                                      domains: `nvswitch` when every such pair goes through NVSwitch,
                                      `nvlink` when some pair is joined by direct NVLink only (bridge
                                      or mesh, possibly through a third GPU); `pcie` when the node has
                                      two or more GPUs but no NVLink domain; `none` with fewer than two.
  topology.scheduler/nvlink-domain-size  GPUs in the largest NVLink domain (`0` when there is none),
                                      so selectors can ask `Gt 3`.
  topology.scheduler/gpu-clique       `<cluster UUID>.<clique ID>` of a multi-node NVLink fabric
                                      (GB200/GB300 NVL72), same value as GFD's nvidia.com/gpu.clique;
                                      only when every GPU reports the same completed fabric.

Exit codes of `run`: 0 ok, 2 bad arguments or no node name, 3 no NVML library or driver,
4 no GPUs, 5 NVML error, 6 Kubernetes API or kubeconfig error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Mapping

from ..core.gpus import NVLINK_DOMAINS_ANNOTATION, format_gpu_set, format_nvlink_domains
from ..core.model import ANNOTATION_PREFIX
from .facts import P2P_OK, GpuFacts, NodeTopology, PairFacts

MATRIX_ANNOTATION = ANNOTATION_PREFIX + "gpu-link-matrix"
NUMA_ANNOTATION = ANNOTATION_PREFIX + "numa-groups"
UNREADABLE_ANNOTATION = ANNOTATION_PREFIX + "gpus-unreadable"
LINK_LABEL = ANNOTATION_PREFIX + "gpu-link"
DOMAIN_SIZE_LABEL = ANNOTATION_PREFIX + "nvlink-domain-size"
CLIQUE_LABEL = ANNOTATION_PREFIX + "gpu-clique"
OWNED_ANNOTATIONS = (NVLINK_DOMAINS_ANNOTATION, MATRIX_ANNOTATION, NUMA_ANNOTATION, UNREADABLE_ANNOTATION)
OWNED_LABELS = (LINK_LABEL, DOMAIN_SIZE_LABEL, CLIQUE_LABEL)

TOPOLOGY_CODES = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}  # 0 = same board (K80)
P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
UNKNOWN = "-"


def _switches(gpu: GpuFacts) -> set[str]:
    # A switch without a PCI address here is a fabric outside the host; the node sees one of those.
    return {link.remote_bus_id or "fabric" for link in gpu.nvlinks if link.remote == "switch"}


def _direct_links(gpu: GpuFacts, peer: GpuFacts) -> int:
    return sum(1 for link in gpu.nvlinks if link.remote == "gpu" and link.remote_bus_id == peer.bus_id)


def nvlink_count(a: GpuFacts, b: GpuFacts) -> tuple[int, bool]:
    """NVLinks joining two GPUs as `nvidia-smi topo -m` counts them, and whether through NVSwitch.

    Through a switch, every link of the less-connected GPU reaches the other (NV18 on DGX H100)."""
    direct = min(_direct_links(a, b), _direct_links(b, a))
    if _switches(a) & _switches(b):
        switched = min(sum(1 for link in g.nvlinks if link.remote == "switch") for g in (a, b))
        return direct + switched, True
    return direct, False


def _pair(topology: NodeTopology, a: int, b: int) -> PairFacts | None:
    return topology.pairs.get((min(a, b), max(a, b)))


def nvlinked(topology: NodeTopology, a: GpuFacts, b: GpuFacts) -> bool:
    """Two GPUs share NVLink that CUDA can use: links join them, and NVML does not deny P2P over it
    (an unknown P2P status trusts the links)."""
    pair = _pair(topology, a.index, b.index)
    p2p = pair.p2p_nvlink if pair else None
    return nvlink_count(a, b)[0] > 0 and p2p in (None, P2P_OK)


def nvlink_domains(topology: NodeTopology) -> tuple[tuple[int, ...], ...]:
    """Connected components of the NVLink graph with two or more GPUs, by lowest index."""
    parent = {g.index: g.index for g in topology.gpus}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a in topology.gpus:
        for b in topology.gpus:
            if a.index < b.index and nvlinked(topology, a, b):
                parent[root(b.index)] = root(a.index)
    groups: dict[int, list[int]] = {}
    for g in topology.gpus:
        groups.setdefault(root(g.index), []).append(g.index)
    return tuple(sorted(tuple(m) for m in groups.values() if len(m) > 1))


def unusable_nvlinks(topology: NodeTopology) -> tuple[str, ...]:
    """One warning when some GPUs have NVLinks that NVML denies P2P over (on NVSwitch systems: the
    fabric manager is not running), naming the GPUs concerned."""
    pairs = [(a.index, b.index) for a in topology.gpus for b in topology.gpus
             if a.index < b.index and nvlink_count(a, b)[0] and not nvlinked(topology, a, b)]
    if not pairs:
        return ()
    gpus = format_gpu_set(i for pair in pairs for i in pair).replace("+", ",")
    return (f"GPUs {gpus} have NVLinks but NVML reports P2P over NVLink not supported for {len(pairs)} "
            f"pair(s) (fabric manager not running?); those links are left out of the NVLink domains",)


def gpu_link_class(topology: NodeTopology) -> str:
    """The `gpu-link` label: see the module docstring."""
    if len(topology.gpus) < 2:
        return "none"
    domains = nvlink_domains(topology)
    if not domains:
        return "pcie"
    weakest = "nvswitch"
    for domain in domains:
        members = [gpu for gpu in map(topology.gpu, domain) if gpu is not None]
        for a in members:
            for b in members:
                if a.index < b.index and not (nvlinked(topology, a, b) and nvlink_count(a, b)[1]):
                    weakest = "nvlink"
    return weakest


def link_code(topology: NodeTopology, a: int, b: int) -> str:
    """One cell of the `nvidia-smi topo -m` GPU matrix."""
    if a == b:
        return "X"
    first, second = topology.gpu(a), topology.gpu(b)
    if first is None or second is None:
        return UNKNOWN
    links = nvlink_count(first, second)[0]
    if links:
        return f"NV{links}"
    pair = _pair(topology, a, b)
    return TOPOLOGY_CODES.get(pair.ancestor, UNKNOWN) if pair and pair.ancestor is not None else UNKNOWN


def link_matrix(topology: NodeTopology) -> tuple[tuple[str, ...], ...]:
    indices = range(topology.gpu_count)
    return tuple(tuple(link_code(topology, a, b) for b in indices) for a in indices)


def p2p_read_code(topology: NodeTopology, a: int, b: int) -> str:
    if a == b:
        return "X"
    pair = _pair(topology, a, b)
    return P2P_CODES.get(pair.p2p_read, UNKNOWN) if pair and pair.p2p_read is not None else UNKNOWN


def numa_groups(topology: NodeTopology) -> tuple[tuple[int, ...], ...]:
    """GPUs with the same host NUMA affinity, by lowest index; GPUs NVML places nowhere are left out."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for gpu in topology.gpus:
        if gpu.numa_nodes:
            groups.setdefault(gpu.numa_nodes, []).append(gpu.index)
    return tuple(sorted(tuple(g) for g in groups.values()))


def fabric_clique(topology: NodeTopology) -> str | None:
    """`<cluster UUID>.<clique ID>` when every GPU read reports one and the same fabric, as GFD does."""
    fabrics = {gpu.fabric for gpu in topology.gpus}
    if len(fabrics) != 1 or None in fabrics:
        return None
    return str(fabrics.pop())


@dataclass(frozen=True)
class Publication:
    """The owned annotations and labels of one node, with their values."""

    annotations: Mapping[str, str]
    labels: Mapping[str, str]


def publication(topology: NodeTopology) -> Publication:
    domains = nvlink_domains(topology)
    annotations = {
        NVLINK_DOMAINS_ANNOTATION: format_nvlink_domains(domains),
        MATRIX_ANNOTATION: ";".join(",".join(row) for row in link_matrix(topology)),
        NUMA_ANNOTATION: ",".join(format_gpu_set(g) for g in numa_groups(topology)),
    }
    if topology.unreadable:
        annotations[UNREADABLE_ANNOTATION] = format_gpu_set(i for i, _ in topology.unreadable)
    labels = {
        LINK_LABEL: gpu_link_class(topology),
        DOMAIN_SIZE_LABEL: str(max((len(d) for d in domains), default=0)),
    }
    clique = fabric_clique(topology)
    if clique:
        labels[CLIQUE_LABEL] = clique
    return Publication(annotations, labels)


def node_patch(node: Mapping, wanted: Publication) -> dict | None:
    """The JSON merge patch that brings the node's owned keys to `wanted`, or None when they match.

    Owned keys the node has but `wanted` lacks are removed (null); other keys are never mentioned."""
    metadata = node.get("metadata") or {}
    patch: dict = {}
    for section, owned, values in (("annotations", OWNED_ANNOTATIONS, wanted.annotations),
                                   ("labels", OWNED_LABELS, wanted.labels)):
        current = metadata.get(section) or {}
        changes = {key: values.get(key) for key in owned if current.get(key) != values.get(key)}
        if changes:
            patch[section] = changes
    return {"metadata": patch} if patch else None


def _cpu_list(cpus: tuple[int, ...]) -> str:
    return format_gpu_set(cpus).replace("+", ",") if cpus else "N/A"


def format_matrix(topology: NodeTopology) -> str:
    """The GPU part of `nvidia-smi topo -m` (plus CPU and NUMA affinity), then `topo -p2p r`."""
    indices = range(topology.gpu_count)
    header = [""] + [f"GPU{i}" for i in indices]
    rows = [header + ["CPU Affinity", "NUMA Affinity"]]
    matrix = link_matrix(topology)
    for i in indices:
        gpu = topology.gpu(i)
        affinity = [_cpu_list(gpu.cpus), ",".join(map(str, gpu.numa_nodes)) or "N/A"] if gpu else ["N/A", "N/A"]
        rows.append([f"GPU{i}"] + list(matrix[i]) + affinity)
    p2p = [header] + [[f"GPU{i}"] + [p2p_read_code(topology, i, j) for j in indices] for i in indices]
    lines = [_table(rows), "", "Legend:",
             "  X    = Self",
             "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes",
             "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
             "within a NUMA node",
             "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
             "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
             "  PIX  = Connection traversing at most a single PCIe bridge",
             "  NV#  = Connection traversing a bonded set of # NVLinks",
             "  -    = unknown: the GPU or the NVML call failed",
             "", "P2P read status:", _table(p2p), "",
             "  OK = supported, CNS = chipset not supported, GNS = GPU not supported, TNS = topology not "
             "supported, DR = disabled by regkey, NS = not supported, U = unknown", ""]
    lines += [f"GPU{g.index}: {g.name} ({g.uuid}) bus {g.bus_id}" for g in topology.gpus]
    lines += [f"GPU{i}: unreadable: {why}" for i, why in topology.unreadable]
    return "\n".join(lines)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[c]) for row in rows if c < len(row)) for c in range(max(map(len, rows)))]
    return "\n".join("  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip() for row in rows)


def format_publication(node_name: str | None, wanted: Publication) -> str:
    """What would be published, as the metadata a `kubectl get node -o json` would then show."""
    body = {"node": node_name, "metadata": {"annotations": dict(sorted(wanted.annotations.items())),
                                            "labels": dict(sorted(wanted.labels.items()))}}
    return json.dumps(body, indent=2)
