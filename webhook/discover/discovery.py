"""Node topology discovery: NVML facts -> NodeTopology -> the annotations and labels placement reads.

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

import argparse
import ctypes
import json
import math
import os
import signal
import sys
import threading
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..core.gpus import NVLINK_DOMAINS_ANNOTATION, format_gpu_set, format_nvlink_domains
from ..core.model import ANNOTATION_PREFIX

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_LIBRARY = 3
EXIT_NO_GPUS = 4
EXIT_NVML = 5
EXIT_API = 6

MATRIX_ANNOTATION = ANNOTATION_PREFIX + "gpu-link-matrix"
NUMA_ANNOTATION = ANNOTATION_PREFIX + "numa-groups"
UNREADABLE_ANNOTATION = ANNOTATION_PREFIX + "gpus-unreadable"
LINK_LABEL = ANNOTATION_PREFIX + "gpu-link"
DOMAIN_SIZE_LABEL = ANNOTATION_PREFIX + "nvlink-domain-size"
CLIQUE_LABEL = ANNOTATION_PREFIX + "gpu-clique"
OWNED_ANNOTATIONS = (NVLINK_DOMAINS_ANNOTATION, MATRIX_ANNOTATION, NUMA_ANNOTATION, UNREADABLE_ANNOTATION)
OWNED_LABELS = (LINK_LABEL, DOMAIN_SIZE_LABEL, CLIQUE_LABEL)

# NVML constants used by value: the same in every nvidia-ml-py release, and NVML_P2P_CAPS_INDEX_READ
# is the tuple (0,) in 13.615.71 (a trailing comma), which ctypes refuses as an argument.
P2P_CAPS_READ = 0
P2P_CAPS_NVLINK = 2
P2P_OK = 0
NVLINK_REMOTE_GPU = 0
NVLINK_REMOTE_SWITCH = 2
FABRIC_STATE_COMPLETED = 3
CPU_SET_WORDS = 64  # 4096 CPUs: bitmask words of 64 CPUs each; NVML fills what the host has
NUMA_SET_WORDS = 4  # 256 NUMA nodes
API_TIMEOUT_SECONDS = 30  # per API request, so a stuck connection cannot hang the agent

TOPOLOGY_CODES = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}  # 0 = same board (K80)
P2P_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DR", 5: "NS", 6: "U"}
UNKNOWN = "-"


class DiscoveryError(Exception):
    """A failure that ends the run: a one-line message and the documented exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------------------------------
# Facts as read from NVML


@dataclass(frozen=True)
class NvLink:
    """One active NVLink of a GPU and what sits at its far end."""

    remote: str  # "gpu", "switch" or "other"
    remote_bus_id: str | None  # None when NVML cannot say (switches outside this host)


@dataclass(frozen=True)
class Fabric:
    """A multi-node NVLink fabric the GPU registered with (nvmlDeviceGetGpuFabricInfoV)."""

    cluster_uuid: str
    clique_id: int

    def __str__(self) -> str:
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True)
class GpuFacts:
    index: int
    name: str
    uuid: str
    bus_id: str
    nvlinks: tuple[NvLink, ...]
    cpus: tuple[int, ...]  # CPU affinity; empty when NVML does not know
    numa_nodes: tuple[int, ...]  # host NUMA nodes of the GPU's memory affinity; empty when unknown
    fabric: Fabric | None


@dataclass(frozen=True)
class PairFacts:
    """What NVML says about two GPUs; None where the call failed."""

    ancestor: int | None  # nvmlDeviceGetTopologyCommonAncestor level
    p2p_read: int | None  # nvmlDeviceGetP2PStatus, read capability
    p2p_nvlink: int | None  # nvmlDeviceGetP2PStatus, NVLink capability


@dataclass(frozen=True)
class NodeTopology:
    gpu_count: int  # as NVML counts them, readable or not
    gpus: tuple[GpuFacts, ...]  # the GPUs read completely, by index
    pairs: Mapping[tuple[int, int], PairFacts] = field(default_factory=dict)  # (a, b) with a < b
    unreadable: tuple[tuple[int, str], ...] = ()  # (index, why) of GPUs that failed mid-read
    warnings: tuple[str, ...] = ()

    def gpu(self, index: int) -> GpuFacts | None:
        return next((g for g in self.gpus if g.index == index), None)


def load_nvml():
    """The real NVML bindings (module `pynvml` of nvidia-ml-py), imported only when discovery runs."""
    try:
        import pynvml
    except ImportError:
        raise DiscoveryError("Python package nvidia-ml-py is not installed (module pynvml)", EXIT_NO_LIBRARY) from None
    return pynvml


def _text(value: str | bytes) -> str:
    # nvidia-ml-py decodes strings since 11.x; older bindings and some structures hand back bytes.
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_bus_id(value: str | bytes) -> str:
    """`0000:18:00.0` or b`00000000:18:00.0` -> `00000000:18:00.0`, so bus IDs compare equal.
    Text that is not a bus ID comes back as given (upper-cased): it can only equal itself."""
    text = _text(value).strip().upper()
    try:
        domain, bus, rest = text.split(":")
        device, function = rest.split(".")
        return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{int(function, 16):X}"
    except ValueError:
        return text


def _bits(words: Iterable[int]) -> tuple[int, ...]:
    """Set bit positions of an NVML bitmask array (64 bits per c_ulonglong word)."""
    return tuple(w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1)


def read_nvlinks(nvml, handle) -> tuple[NvLink, ...]:
    links = []
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_InvalidArgument):
            continue  # no such link on this GPU, or no NVLink at all
        kind = nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
        remote = {NVLINK_REMOTE_GPU: "gpu", NVLINK_REMOTE_SWITCH: "switch"}.get(kind, "other")
        try:
            bus_id = normalize_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        except nvml.NVMLError_NotSupported:
            bus_id = None  # e.g. an NVSwitch tray outside this host: no PCI address here
        links.append(NvLink(remote, bus_id))
    return tuple(links)


def _absent(nvml) -> tuple[type[BaseException], ...]:
    """Errors that mean an optional fact is not there: the GPU lacks it, or the driver predates the call."""
    return nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound


def read_cpu_affinity(nvml, handle) -> tuple[int, ...]:
    try:
        return _bits(nvml.nvmlDeviceGetCpuAffinity(handle, CPU_SET_WORDS))
    except _absent(nvml):
        return ()


def read_numa_nodes(nvml, handle) -> tuple[int, ...]:
    try:
        return _bits(nvml.nvmlDeviceGetMemoryAffinity(handle, NUMA_SET_WORDS, nvml.NVML_AFFINITY_SCOPE_NODE))
    except _absent(nvml):
        return ()


def read_fabric(nvml, handle) -> Fabric | None:
    """The GPU's multi-node NVLink fabric: only a COMPLETED registration with a non-zero cluster UUID
    counts (single-node NVSwitch systems report COMPLETED with a zero UUID)."""
    info = nvml.c_nvmlGpuFabricInfoV_t()  # sets the struct version the V call checks
    try:
        nvml.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    except _absent(nvml):
        return None
    raw = bytes(info.clusterUuid)
    if info.state != FABRIC_STATE_COMPLETED or info.status != 0 or not any(raw):
        return None
    return Fabric(str(uuidlib.UUID(bytes=raw)), int(info.cliqueId))


def read_gpu(nvml, index: int, handle) -> GpuFacts:
    return GpuFacts(
        index=index,
        name=_text(nvml.nvmlDeviceGetName(handle)),
        uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
        bus_id=normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
        nvlinks=read_nvlinks(nvml, handle),
        cpus=read_cpu_affinity(nvml, handle),
        numa_nodes=read_numa_nodes(nvml, handle),
        fabric=read_fabric(nvml, handle),
    )


def read_pair(nvml, first, second) -> tuple[PairFacts, list[str]]:
    """Pairwise facts; a failed call leaves its fact unknown and says why."""
    problems: list[str] = []

    def ask(what: str, call, *call_args):
        try:
            return call(*call_args)
        except nvml.NVMLError as err:
            problems.append(f"{what}: {err}")
            return None

    return PairFacts(
        ancestor=ask("topology", nvml.nvmlDeviceGetTopologyCommonAncestor, first, second),
        p2p_read=ask("P2P read", nvml.nvmlDeviceGetP2PStatus, first, second, P2P_CAPS_READ),
        p2p_nvlink=ask("P2P NVLink", nvml.nvmlDeviceGetP2PStatus, first, second, P2P_CAPS_NVLINK),
    ), problems


def _start(nvml) -> int:
    """nvmlInit and the GPU count, with NVML's failures turned into exit codes."""
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError_LibraryNotFound, nvml.NVMLError_DriverNotLoaded) as err:
        raise DiscoveryError(f"NVML cannot start: {err} (is the NVIDIA driver installed and the "
                             f"library mounted into this container?)", EXIT_NO_LIBRARY) from None
    except nvml.NVMLError as err:
        raise DiscoveryError(f"NVML cannot start: {err}", EXIT_NVML) from None
    try:
        count = nvml.nvmlDeviceGetCount()
    except nvml.NVMLError as err:
        nvml.nvmlShutdown()
        raise DiscoveryError(f"NVML cannot count GPUs: {err}", EXIT_NVML) from None
    if count == 0:
        nvml.nvmlShutdown()
        raise DiscoveryError("NVML sees no GPUs on this node", EXIT_NO_GPUS)
    return count


def read_node(nvml) -> NodeTopology:
    """Every fact of this node. A GPU that fails mid-read is reported and left out, not fatal."""
    count = _start(nvml)
    try:
        gpus, handles, unreadable, warnings = [], {}, [], []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                gpus.append(read_gpu(nvml, index, handle))
                handles[index] = handle
            except nvml.NVMLError as err:
                unreadable.append((index, str(err)))
                warnings.append(f"GPU {index} skipped: NVML error while reading it: {err}")
        if not gpus:
            raise DiscoveryError(f"NVML could not read any of the {count} GPUs: {unreadable[0][1]}", EXIT_NVML)
        pairs = {}
        for a in handles:
            for b in handles:
                if a < b:
                    pairs[(a, b)], problems = read_pair(nvml, handles[a], handles[b])
                    warnings.extend(f"GPU {a} and GPU {b}: {p}" for p in problems)
        return NodeTopology(count, tuple(gpus), pairs, tuple(unreadable), tuple(warnings))
    finally:
        nvml.nvmlShutdown()


# ---------------------------------------------------------------------------------------------
# What placement needs, derived from the facts (pure)


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


# ---------------------------------------------------------------------------------------------
# Output for people


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


# ---------------------------------------------------------------------------------------------
# Publishing through the Kubernetes API


class NodeApi:
    """GET and merge-PATCH one Node through the `kubernetes` client."""

    def __init__(self, kubeconfig: str | None) -> None:
        from kubernetes import client

        from ..kube.kubeclient import KubeconfigError, api_client_from
        try:
            self._api = client.CoreV1Api(api_client_from(kubeconfig))
        except KubeconfigError as err:
            raise DiscoveryError(f"Kubernetes {err}", EXIT_API) from None

    def _call(self, what: str, call, *call_args, **kwargs):
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call(*call_args, **kwargs)
        except ApiException as err:
            raise DiscoveryError(f"Kubernetes API: {what}: {err.status} {err.reason}", EXIT_API) from None
        except HTTPError as err:
            raise DiscoveryError(f"Kubernetes API: {what}: {type(err).__name__}: {err}", EXIT_API) from None

    def get(self, name: str) -> dict:
        response = self._call(f"GET node {name}", self._api.read_node, name, _preload_content=False,
                              _request_timeout=API_TIMEOUT_SECONDS)
        return json.loads(response.data)

    def patch(self, name: str, body: dict) -> None:
        self._call(f"PATCH node {name}", self._api.patch_node, name, body,
                   _content_type="application/merge-patch+json", _request_timeout=API_TIMEOUT_SECONDS)


def publish(api: NodeApi, node_name: str, wanted: Publication) -> dict | None:
    """Patch the node's owned keys when they differ; returns the patch sent, or None."""
    patch = node_patch(api.get(node_name), wanted)
    if patch:
        api.patch(node_name, patch)
    return patch


# ---------------------------------------------------------------------------------------------
# Command line: `topology-webhook discover`


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "discover", help="read this node's GPU topology with NVML and publish it on the Node",
        description="Read GPUs, NVLinks, P2P, PCIe and NUMA topology with NVML; publish NVLink domains, "
                    "the link matrix and labels on this node. Exit codes: 0 ok, 2 bad arguments or no "
                    "node name, 3 no NVML library or driver, 4 no GPUs, 5 NVML error, 6 Kubernetes API error.")
    parser.add_argument("--node", help="this node's name (default: env NODE_NAME)")
    parser.add_argument("--dry-run", action="store_true", help="print what would be published; change nothing")
    parser.add_argument("--interval", type=_seconds, metavar="SECONDS",
                        help="keep running, re-reading and publishing every SECONDS (default: once)")
    parser.add_argument("--print-matrix", action="store_true",
                        help="print the matrix in the style of `nvidia-smi topo -m` instead of publishing")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account)")
    parser.set_defaults(func=run)
    return parser


def _say(message: str) -> None:
    print(f"discover: {message}", file=sys.stderr, flush=True)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    return stop


def run(args: argparse.Namespace, nvml=None, stop: threading.Event | None = None) -> int:
    """One discovery (or one every --interval seconds until SIGTERM or `stop`); returns the exit code.

    `nvml` replaces the real bindings (tests pass fakes). With --interval, Kubernetes API errors are
    reported and retried at the next round; NVML failures end the run with their exit code."""
    publishing = not (args.dry_run or args.print_matrix)
    node_name = getattr(args, "node", None) or os.environ.get("NODE_NAME")
    try:
        if publishing and not node_name:
            raise DiscoveryError("no node name: pass --node or set NODE_NAME (the downward API's "
                                 "spec.nodeName)", EXIT_USAGE)
        nvml = nvml or load_nvml()
        api = NodeApi(getattr(args, "kubeconfig", None)) if publishing else None
        if args.interval and stop is None:
            stop = _stop_on_signals()
        while True:
            topology = read_node(nvml)
            for warning in topology.warnings + unusable_nvlinks(topology):
                _say(warning)
            wanted = publication(topology)
            if args.print_matrix:
                print(format_matrix(topology), flush=True)
            if args.dry_run:
                print(format_publication(node_name, wanted), flush=True)
            if api is not None and node_name:  # publishing: checked above that it has a name
                try:
                    patch = publish(api, node_name, wanted)
                    _say(f"node {node_name}: " + (f"patched {json.dumps(patch, sort_keys=True)}" if patch
                                                   else "up to date"))
                except DiscoveryError as err:
                    if not args.interval:
                        raise
                    _say(f"{err}; retrying in {args.interval:g}s")
            if not args.interval or stop is None or stop.wait(args.interval):
                return EXIT_OK
    except DiscoveryError as err:
        _say(str(err))
        return err.exit_code
