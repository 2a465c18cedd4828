"""Ring all-reduce time of a placement, as NVIDIA/nccl-tests doc/PERFORMANCE.md defines bus bandwidth.

    T = 2(n-1)/n * S / B(P) + 2(n-1) * alpha(P)

B(P) is the bus bandwidth of the bottleneck tier the ring crosses. Per-GPU-class figures (NVLink,
PCIe, NIC, NICs per node) come from webhook/settings/config.py DEFAULT_PROFILES; the oversubscription of the
fabric and the per-hop latencies are parameters of the simulated network (estimates, swept).
"""
from __future__ import annotations

from dataclasses import dataclass

from webhook.settings.config import HardwareProfile

from .fabric import CLUSTER, GPUS_PER_NODE, LEAF, NODE, NVLINK, SPAN_NAMES, SPINE, ZONE, SimCluster, span_level

GB = 1e9
# Per-hop latency by span level (s): NVLink 1 us, PCIe 2 us, same-leaf IB 3 us, +1 us per extra
# switch tier: estimates (an 8-byte all_reduce takes about 17 us end to end, NVIDIA/nccl-tests#293).
ALPHA_S = {NVLINK: 1e-6, NODE: 2e-6, LEAF: 3e-6, SPINE: 4e-6, ZONE: 5e-6, CLUSTER: 6e-6}


@dataclass(frozen=True)
class Network:
    """Oversubscription divisors, applied cumulatively as a ring climbs the tree."""

    rho_leaf: float = 2.0  # leaf->spine uplinks: ring spans leaves under one spine (swept 1, 2, 4)
    rho_spine: float = 4.0  # spine->zone: ring spans spines in one zone (zone tiers swept 4, 8, 15)
    rho_zone: float = 8.0  # ring spans zones (webhook Config.cluster_oversubscription)

    def divisor(self, level: int) -> float:
        factors = {LEAF: 1.0, SPINE: self.rho_leaf, ZONE: self.rho_leaf * self.rho_spine,
                   CLUSTER: self.rho_leaf * self.rho_spine * self.rho_zone}
        return factors.get(level, 1.0)


def intra_node_gbs(profile: HardwareProfile, domains: tuple[tuple[int, ...], ...], gpu_ids: tuple[int, ...]) -> float:
    """Bus bandwidth of the part of a ring inside one node: NVLink when one domain holds it, else PCIe."""
    if len(gpu_ids) <= 1:
        return float("inf")
    ids = set(gpu_ids)
    return profile.nvlink_gbs if any(ids.issubset(d) for d in domains) else profile.pcie_gbs


def bus_bandwidth_gbs(cluster: SimCluster, profile: HardwareProfile, network: Network,
                      placement: dict[str, tuple[int, ...]]) -> float:
    """B(P): NVLink or PCIe inside one node; across nodes min_i(min(k_i, NICs) * B_nic, intra-node
    link of node i), divided by the oversubscription of every tier above the leaf the ring crosses."""
    level = span_level(cluster, placement)
    if level <= NODE:
        node, ids = next(iter(placement.items()))
        return intra_node_gbs(profile, cluster.by_name[node].domains, ids)
    per_node = (min(min(len(ids), profile.nics_per_node) * profile.nic_gbs,
                    intra_node_gbs(profile, cluster.by_name[node].domains, ids))
                for node, ids in placement.items())
    return min(per_node) / network.divisor(level)


def allreduce_seconds(cluster: SimCluster, profile: HardwareProfile, network: Network,
                      placement: dict[str, tuple[int, ...]], size_bytes: float) -> float:
    """Ring all-reduce time of `size_bytes` over the placement's GPUs; 0 for a single GPU."""
    n = sum(len(ids) for ids in placement.values())
    if n <= 1:
        return 0.0
    level = span_level(cluster, placement)
    bandwidth = bus_bandwidth_gbs(cluster, profile, network, placement) * GB
    return 2 * (n - 1) / n * size_bytes / bandwidth + 2 * (n - 1) * ALPHA_S[level]


def ideal_placement(cluster: SimCluster, pods: int, gpus_per_pod: int) -> dict[str, tuple[int, ...]]:
    """The tightest placement in an empty cluster: the first pods' worth of GPUs in topology order,
    NVLink-aligned by the same GPU choice every policy gets. Job durations from traces are taken to
    be run times at this placement (trace durations are placement-blind)."""
    if pods == 1:
        domains = cluster.nodes[0].domains
        fitting = [d for d in domains if len(d) >= gpus_per_pod]
        ids = min(fitting, key=len)[:gpus_per_pod] if fitting else tuple(range(gpus_per_pod))
        return {cluster.nodes[0].name: tuple(ids)}
    return {cluster.nodes[i].name: tuple(range(GPUS_PER_NODE))[:gpus_per_pod] for i in range(pods)}


def profile_table(profile: HardwareProfile, network: Network, size_bytes: float) -> list[tuple[str, str]]:
    """The figures the estimate used, for printing in RESULTS.md."""
    rows = [("hardware profile (webhook/settings/config.py)", f"{profile.name}{' (has estimates)' if profile.estimate else ''}"),
            ("B_nvlink, ring busbw inside one NVLink domain", f"{profile.nvlink_gbs:g} GB/s"),
            ("B_pcie, ring leaving an NVLink domain inside a node", f"{profile.pcie_gbs:g} GB/s"),
            ("B_nic per NIC x NICs per node", f"{profile.nic_gbs:g} GB/s x {profile.nics_per_node}"),
            ("rho_leaf (ring spans leaves of one spine)", f"{network.rho_leaf:g}"),
            ("rho_spine (extra, spans spines of one zone)", f"{network.rho_spine:g}"),
            ("rho_zone (extra, spans zones)", f"{network.rho_zone:g}"),
            ("alpha per hop by span", ", ".join(f"{SPAN_NAMES[k]} {v * 1e6:g} us" for k, v in ALPHA_S.items())),
            ("all-reduce message S", f"{size_bytes / GB:g} GB")]
    return rows
