"""Decision latency and index memory: a cluster whose GPUs come through DRA against the same cluster
under the device plugin, measured in one run.

    python bench/dra_bench.py [--nodes 10000] [--claims-per-node 5] [--repeat 200]

Both clusters have the same nodes (zones > spines > leaves of 32 nodes x 8 GPUs) and the same GPUs
in use, drawn with a fixed seed: under the device plugin, pods asking `nvidia.com/gpu` and nodes
with allocatable GPUs; under DRA, one ResourceSlice per node (8 GPU devices, no GPU allocatable)
and ResourceClaims allocated one device each (`--claims-per-node` on average, 0 to 8 per node). Decisions
(PlacementRequests of several shapes, nothing held) alternate between the indexes, so all see the
same machine load; the built indexes are frozen out of the garbage collector first. A second
device-plugin index built from the same objects is timed too: its p99 against the first's is what
the machine's noise alone does to a ratio of p99s (an A/A control), which the DRA ratio is read
against. Memory is what tracemalloc counts as allocated by building each
index from its objects (the objects themselves excluded), per node.
"""
from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import time
import tracemalloc

from webhook.core.model import PlacementRequest, Strategy
from webhook.kube.demo import gpu_device_class, make_allocated_claim, make_node, make_pod, make_resource_slice
from webhook.objects.feed import index_of
from webhook.placement.placer import place
from webhook.settings.config import Config
from webhook.state.index import ClusterIndex

LEVELS = ("topology.kubernetes.io/zone", "topology.scheduler/spine", "topology.scheduler/leaf")
SHAPES = ((1, 1), (1, 4), (1, 8), (2, 8), (4, 8), (16, 8))  # (pods, GPUs per pod)


def clusters(size: int, claims_per_node: float, seed: int = 7) -> tuple[list[dict], list[dict]]:
    """(device-plugin objects, DRA objects): the same nodes and the same GPUs in use."""
    rng = random.Random(seed)
    plugin: list[dict] = []
    dra: list[dict] = [gpu_device_class()]
    for i in range(size):
        leaf, spine, zone = i // 32, i // 512, i // 4096
        name = f"n{i:05d}"
        labels = dict(zip(LEVELS, (f"z{zone}", f"s{spine}", f"l{leaf}")))
        plugin.append(make_node(name, labels))
        dra += [make_node(name, labels, dra=True), make_resource_slice(name)]
        spread = min(claims_per_node, 8 - claims_per_node)  # claims of one GPU each, claims_per_node on average
        for c in range(rng.randint(round(claims_per_node - spread), round(claims_per_node + spread))):
            plugin.append(make_pod(f"p-{name}-{c}", name, 1))
            dra.append(make_allocated_claim(f"c-{name}-{c}", name, [f"gpu-{c}"]))
    return plugin, dra


def build(objects: list[dict]) -> tuple[ClusterIndex, int]:
    """The index of `objects` and the bytes building it allocated (still held)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = index_of(Config(), [o for o in objects if o["kind"] != "Pod"],
                                      [o for o in objects if o["kind"] == "Pod"])
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return index, held


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--claims-per-node", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=200, help="decisions per shape and cluster")
    args = parser.parse_args()
    started = time.perf_counter()
    plugin_objects, dra_objects = clusters(args.nodes, args.claims_per_node)
    claims = sum(1 for o in dra_objects if o["kind"] == "ResourceClaim")
    slices = sum(1 for o in dra_objects if o["kind"] == "ResourceSlice")
    plugin, plugin_bytes = build(plugin_objects)
    control, _ = build(plugin_objects)
    dra, dra_bytes = build(dra_objects)
    assert plugin.stats() == dra.stats(), "the two clusters must count the same GPUs"
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}; {args.nodes} nodes, "
          f"{slices} ResourceSlices, {claims} allocated ResourceClaims (device plugin: {claims} pods); "
          f"{plugin.stats().gpus_used} of {plugin.stats().gpus_total} GPUs in use")
    print(f"index memory per node: device plugin {plugin_bytes / args.nodes / 1024:.2f} KiB, "
          f"DRA {dra_bytes / args.nodes / 1024:.2f} KiB (x{dra_bytes / plugin_bytes:.2f})")
    print(f"{'shape':>10} {'plugin p50':>11} {'p99':>8} {'DRA p50':>9} {'p99':>8} {'p99 ratio':>9} "
          f"{'A/A p99 ratio':>13}")
    worst = worst_control = 0.0
    # Both indexes are long-lived: out of the collector's way, as a server's would be after start-up;
    # otherwise a collection of the build's garbage lands in whichever decision runs then.
    gc.collect()
    gc.freeze()
    for pods, gpus in SHAPES:
        request = PlacementRequest("bench", pods, gpus, Strategy.CONSOLIDATED)
        times: dict[str, list[float]] = {"plugin": [], "dra": [], "control": []}
        for _ in range(args.repeat):
            for label, index in (("plugin", plugin), ("dra", dra), ("control", control)):
                start = time.perf_counter()
                place(index, request)
                times[label].append((time.perf_counter() - start) * 1e3)
        p99 = {label: percentile(values, 0.99) for label, values in times.items()}
        worst = max(worst, p99["dra"] / p99["plugin"])
        worst_control = max(worst_control, p99["control"] / p99["plugin"])
        print(f"{pods:>4} x {gpus:<3} {statistics.median(times['plugin']):>10.3f}ms {p99['plugin']:>7.3f}ms "
              f"{statistics.median(times['dra']):>8.3f}ms {p99['dra']:>7.3f}ms {p99['dra'] / p99['plugin']:>8.2f}x "
              f"{p99['control'] / p99['plugin']:>12.2f}x")
    print(f"worst p99 ratio DRA / device plugin: {worst:.2f}x; the same for two device-plugin indexes (A/A): "
          f"{worst_control:.2f}x; {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
