"""Topology page cost: time to snapshot and render, page size, and how long the index lock is held.

    python bench/page_bench.py [--sizes 1000 10000 100000] [--repeat 5]

Clusters are placement_bench's (zones > spines > leaves of 32 nodes x 8 H100, part-occupied with a
fixed seed), with one hold per 50 nodes (a 1 x 8-GPU workload each) and 500 recorded decisions.
Per size: the median over `--repeat` runs of the snapshot (of which the part under the index lock:
what admissions wait for), the HTML render, the JSON encoding, and the sizes of both; at sizes
above the node detail limit, also the page with one leaf opened (`?focus=`).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.placement_bench import cluster  # noqa: E402
from webhook.objects.feed import index_of  # noqa: E402
from webhook.state.index import ClusterIndex  # noqa: E402
from webhook.settings.config import Config  # noqa: E402
from webhook.serving.page.snapshot import NODE_DETAIL_LIMIT, RecordedDecision, Selection, snapshot  # noqa: E402
from webhook.serving.page.render import render  # noqa: E402

DECISIONS = 500
NODES_PER_HOLD = 50


class TimedLock:
    """The index's lock, recording how long each outermost hold lasts."""

    def __init__(self, lock) -> None:
        self.lock, self.depth, self.held = lock, 0, []

    def __enter__(self):
        self.lock.acquire()
        self.depth += 1
        if self.depth == 1:
            self.started = time.perf_counter()
        return self

    def __exit__(self, *_exc):
        self.depth -= 1
        if self.depth == 0:
            self.held.append(time.perf_counter() - self.started)
        self.lock.release()


def build(size: int) -> tuple[ClusterIndex, list[RecordedDecision]]:
    nodes, pods = cluster(size)
    index = index_of(Config(), nodes, pods)
    idle = [name for name, node in index.nodes.items() if node.free == node.gpus]
    decisions = []
    for i, name in enumerate(idle[::NODES_PER_HOLD]):
        index.reserve(f"ml/Job/job-{i}", {name: [tuple(range(8))]})
    for i in range(DECISIONS):
        decisions.append(RecordedDecision(at=float(i), namespace="ml", kind="Job", name=f"job-{i}",
                                          outcome="placed" if i % 3 else "waiting", gpus=8, domain="leaf l1",
                                          code=None if i % 3 else "NoRoomNow",
                                          reasons=("4 pod(s) x 8 GPU(s) in leaf l1: the tightest leaf",),
                                          nodes=("n00001",)))
    return index, decisions


def measure(index: ClusterIndex, decisions: list[RecordedDecision], repeat: int, selection: Selection) -> dict:
    timed = TimedLock(index.lock)
    index.lock = timed
    snap, html, encode = [], [], []
    for _ in range(repeat):
        started = time.perf_counter()
        data = snapshot(index, decisions, now=1e9, selection=selection)
        snap.append(time.perf_counter() - started)
        started = time.perf_counter()
        page = render(data, refresh_seconds=10)
        html.append(time.perf_counter() - started)
        started = time.perf_counter()
        body = json.dumps(data, separators=(",", ":"))
        encode.append(time.perf_counter() - started)
    index.lock = timed.lock
    return {"snapshot_ms": statistics.median(snap) * 1000, "locked_ms": statistics.median(timed.held) * 1000,
            "render_ms": statistics.median(html) * 1000, "json_ms": statistics.median(encode) * 1000,
            "html_kb": len(page.encode()) / 1024, "json_kb": len(body) / 1024, "drawn": data["nodes_drawn"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}; node detail limit {NODE_DETAIL_LIMIT}")
    print(f"{'nodes':>7} {'view':>11} {'snapshot':>9} {'locked':>8} {'render':>8} {'json':>8} {'html':>9} {'json':>9}")
    for size in args.sizes:
        started = time.perf_counter()
        index, decisions = build(size)
        built = time.perf_counter() - started
        views = [("all", Selection())]
        if size > NODE_DETAIL_LIMIT:
            views.append(("focus leaf", Selection.of(focus="l1")))
        for view, selection in views:
            row = measure(index, decisions, args.repeat, selection)
            print(f"{size:>7} {view:>11} {row['snapshot_ms']:>7.1f}ms {row['locked_ms']:>6.1f}ms "
                  f"{row['render_ms']:>6.1f}ms {row['json_ms']:>6.1f}ms {row['html_kb']:>7.0f}KB {row['json_kb']:>7.0f}KB"
                  + ("" if view != "all" else f"   (index built in {built:.1f} s)"))


if __name__ == "__main__":
    main()
