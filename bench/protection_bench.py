"""Decision latency with pinned waits in the cluster: what protecting the waiting costs a placement.

    .venv/bin/python bench/protection_bench.py [--nodes 10000] [--waiting 0 100] [--repeat 300]

The cluster is placement_bench's (zones > spines > leaves of 32 nodes x 8 GPUs, a third full, a
third idle, the rest partly used). Each waiting workload is 2-32 pending pods of 8 GPUs carrying
`waiting-for` a zone, a spine or a leaf (a fixed seed picks which), as the mutation writes them on
a pinned wait; the index sees them as the live view would. Every placed decision whose nodes lie
in a domain something waits in then works out the GPUs set aside and, where it takes some, decides
again with them held (webhook/placement/protection.py). placement_bench has no waiters: this is the
part of the decision path it does not time. Compare trees by running each tree's own copy of this
file (it imports the tree it sits in).
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.placement_bench import LEVELS, SHAPES, cluster, decision_times, percentile  # noqa: E402
from webhook.core.injection import RESERVATION, WAITING_FOR, format_domain_path  # noqa: E402
from webhook.core.model import PlacementRequest, Strategy  # noqa: E402
from webhook.kube.demo import make_pod  # noqa: E402
from webhook.objects.feed import index_of  # noqa: E402
from webhook.settings.config import Config  # noqa: E402
from webhook.state.index import out_of_the_collectors_way  # noqa: E402


def waiting_pods(nodes: list[dict], workloads: int, seed: int = 11) -> list[dict]:
    rng = random.Random(seed)
    pods = []
    for w in range(workloads):
        labels = rng.choice(nodes)["metadata"]["labels"]
        path = tuple((key, labels[key]) for key in LEVELS[:rng.choice((1, 2, 3))])  # a zone, spine or leaf
        pods += [make_pod(f"wait{w}-{i}", None, 8, "ml", phase="Pending", annotations={
                     WAITING_FOR: format_domain_path(path), RESERVATION: f"ml/Job/wait{w}"})
                 for i in range(rng.choice((2, 4, 8, 16, 32)))]
    return pods


def run(size: int, workloads: int, repeat: int) -> tuple[int, float, float]:
    """(waiting pods, median ms, p99 ms) of `repeat` consolidated decisions over placement_bench's shapes."""
    nodes, bound = cluster(size)
    waiting = waiting_pods(nodes, workloads)
    index = index_of(Config(), nodes, bound + waiting)
    out_of_the_collectors_way()  # as `serve` does once the index is built
    requests = [PlacementRequest("bench", pods, gpus, Strategy.CONSOLIDATED) for pods, gpus in SHAPES]
    decision_times(index, requests, len(requests))  # the first decision per pod size sorts each level once (bestfit.py)
    times = decision_times(index, requests, repeat)
    return len(waiting), 1e3 * statistics.median(times), 1e3 * percentile(times, 0.99)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[10000])
    parser.add_argument("--waiting", type=int, nargs="+", default=[0, 100], help="pinned waiting workloads")
    parser.add_argument("--repeat", type=int, default=300)
    args = parser.parse_args(argv)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}")
    print("| nodes | waiting workloads | their pods | decision p50 (ms) | p99 (ms) |\n|---:|---:|---:|---:|---:|")
    for size in args.nodes:
        for workloads in args.waiting:
            pods, median, p99 = run(size, workloads, args.repeat)
            print(f"| {size} | {workloads} | {pods} | {median:.2f} | {p99:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
