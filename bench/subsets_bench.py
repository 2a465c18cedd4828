"""Constrained subsets for requests that name nodes: one moved against one built, in one run.

    .venv/bin/python bench/subsets_bench.py [--nodes 10000] [--named 66] [--changed 10] [--rounds 200]

An allotment's nodes for spreads (allotment.py) change by a few at each of its replica's writes,
and every spread decided on them asks the index for the subset of those nodes, in each pod size
the bench's mix has. This times `ClusterIndex.restricted_to` for requests naming a set of nodes
that changes by `--changed` each round, over the admission bench's cluster: with the subsets
kept, so that a subset naming other nodes is moved (filters.ConstrainedSubsets), and with them
cleared before each request, so that each is built afresh: two indexes of the same cluster, the
two timed alternately.
"""
from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.admission_bench import cluster  # noqa: E402
from webhook.core.model import PlacementRequest, Strategy  # noqa: E402
from webhook.objects.feed import index_of  # noqa: E402
from webhook.core.model import on_nodes  # noqa: E402
from webhook.settings.config import Config  # noqa: E402

POD_SIZES = (1, 2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--named", type=int, default=66, help="nodes named (the bench's nodes for spreads)")
    parser.add_argument("--changed", type=int, default=10, help="of them, changed each round")
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    nodes, pods = cluster(args.nodes)
    indexes = {"moved": index_of(Config(), nodes, pods), "built": index_of(Config(), nodes, pods)}
    gc.collect()
    gc.freeze()
    rng = random.Random(1)
    names = sorted(indexes["moved"].nodes)
    named = rng.sample(names, args.named)
    seconds = {"moved": 0.0, "built": 0.0}
    for _ in range(args.rounds):
        gone = set(rng.sample(named, args.changed))
        named = [name for name in named if name not in gone] + rng.sample(names, args.changed)
        for how, index in indexes.items():
            for gpus in POD_SIZES:  # resources make the pod size part of a subset's key
                request = on_nodes(PlacementRequest("Job ml/spread", 2, gpus, Strategy.DISTRIBUTED,
                                                    resources=(("cpu", 1000),)), named)
                with index.lock:
                    if how == "built":
                        index.subsets.clear()
                    start = time.perf_counter()
                    index.restricted_to(request)
                    seconds[how] += time.perf_counter() - start
    asks = args.rounds * len(POD_SIZES)
    print(f"machine: {os.cpu_count()} CPUs, Python {platform.python_version()}; {len(names)} nodes, "
          f"{args.named} named, {args.changed} changed per round, {asks} requests each")
    for how, total in seconds.items():
        print(f"{how}: {total / asks * 1000:.3f} ms per request")
    print(f"moved / built: {seconds['moved'] / seconds['built']:.2f}")


if __name__ == "__main__":
    main()
