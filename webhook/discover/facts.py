"""What discovery knows of a node: the facts read from NVML, and how a run ends (exit codes and
the one error that carries one)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_LIBRARY = 3
EXIT_NO_GPUS = 4
EXIT_NVML = 5
EXIT_API = 6


P2P_OK = 0  # nvmlDeviceGetP2PStatus: the capability is there (PairFacts.p2p_read, p2p_nvlink)


class DiscoveryError(Exception):
    """A failure that ends the run: a one-line message and the documented exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
