"""Live cluster view benchmark: initial sync, event throughput, memory, admission latency under churn.

    .venv/bin/python -m bench.clusterview_bench              # 1k, 5k, 10k nodes (under 5 min)
    .venv/bin/python -m bench.clusterview_bench --nodes 1000 # one size
    nice -n 5 .venv/bin/python -m bench.clusterview_bench --nodes 100000  # 1M pods (about 3 min)

Each size runs in a fresh process (so resident memory is that size's alone) holding one
ApiFeed, the real `kubernetes` client and the real ClusterIndex; the fake API server
(tests/integration/fakeapiserver.py) runs in a second process, so the two do not share a core or the GIL;
it sorts its lists before the clock starts, as the apiserver serves them from its watch cache.
Per node there are 10 pods: 6 ask for one GPU each, 4 for none (8-GPU nodes, 75 % allocated).

Figures:
- sync_s: from start() until both lists (pages of 500) are applied.
- rss_mib: VmRSS of the view's process after the sync, and its growth over the pre-sync baseline.
- events_per_s: pod MODIFIED events (phase Running <-> Succeeded, so every one changes GPU
  accounting) queued by the server while it holds the watch, then released at once: events
  divided by the time from release until the view applied the last (the view's drain rate).
- admission p50/p99 ms, 50 per second from one thread, first idle, then while 200 and 2000 pod
  events per second stream in: the whole review through the Flask app (a dry-run Job of 2 x 2
  GPUs, so nothing is reserved and the cluster does not fill up; no TLS or gunicorn), and the
  `place_and_reserve` decision alone. This is what a review costs in the webhook's one worker
  process while the watch thread competes for the GIL.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import time

SIZES = (1000, 5000, 10000)
PODS_PER_NODE = 10
GPU_PODS_PER_NODE = 6
CHURN_EVENTS = 20000
STREAM_RATES = (200, 2000)  # pod events per second during the latency measurements
STREAM_SECONDS = 8
ADMISSIONS_PER_SECOND = 50


def shape(nodes: int) -> tuple[int, int, int]:
    """(spines, leaves per spine, nodes per leaf) for a leaf-spine cluster of `nodes` nodes."""
    return {1000: (5, 10, 20), 5000: (10, 25, 20), 10000: (10, 25, 40), 50000: (25, 50, 40),
            100000: (50, 50, 40)}.get(nodes, (1, 1, nodes))


def rss_mib() -> float:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ---- the fake API server's process --------------------------------------------------------------
def serve_fake(conn, nodes: int) -> None:
    """Build the cluster, serve it, and run churn commands sent over `conn` until told to stop."""
    from tests.integration.fakeapiserver import FakeApiServer
    from webhook.kube.demo import leaf_spine_nodes, make_pod

    server = FakeApiServer(bookmark_interval=5.0)
    pods = []
    for node in leaf_spine_nodes(*shape(nodes)):
        name = node["metadata"]["name"]
        server.put_node(node)
        for j in range(PODS_PER_NODE):
            pod = make_pod(f"{name}-p{j}", name, 1 if j < GPU_PODS_PER_NODE else 0, namespace="bench")
            server.put_pod(pod)
            pods.append(pod)
    server.compact()  # clients list first; history of the build is not needed
    server.prepare_lists("nodes", "pods")  # sorted before the clock, as a real apiserver's cache is
    server.start()
    conn.send(server.url)
    def churn(count: int, rate: float) -> None:
        started = time.monotonic()
        for i in range(count):
            pod = pods[i % len(pods)]
            pod["status"]["phase"] = "Succeeded" if pod["status"]["phase"] == "Running" else "Running"
            server.put_pod(pod)
            if rate:
                time.sleep(max(0.0, started + (i + 1) / rate - time.monotonic()))

    while True:
        command = conn.recv()
        if command[0] == "backlog":  # queue events unseen, then let them go at once on "release"
            server.hold_watches()
            churn(command[1], 0)
            conn.send("queued")
            conn.recv()
            server.release_watches()
        elif command[0] == "stream":
            churn(command[1], command[2])
            conn.send("sent")
        else:
            break
    server.stop()


def bench_job() -> dict:
    """A Job of 2 pods x 2 GPUs that asks to be consolidated."""
    from webhook.core.model import GPU_RESOURCE

    container = {"name": "main", "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                 "resources": {"limits": {GPU_RESOURCE: "2"}}}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "bench",
                         "annotations": {"topology.scheduler/placement-strategy": "consolidated"}},
            "spec": {"parallelism": 2, "completions": 2,
                     "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}}


# ---- the view's process -------------------------------------------------------------------------
def measure(nodes: int) -> dict:
    from kubernetes.client import ApiClient, Configuration

    from webhook.admission import make_review
    from webhook.serving.app import create_app
    from webhook.cli.live import live_view
    from webhook.serving.paths import MUTATE_PATH
    from webhook.settings.config import Config
    from webhook.serving.metrics import Metrics
    from webhook.core.model import PlacementRequest, Strategy
    from webhook.placement.placer import place_and_reserve

    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    server = ctx.Process(target=serve_fake, args=(theirs, nodes), daemon=True)
    server.start()
    url = ours.recv()
    baseline = rss_mib()
    view = live_view(Config(), ApiClient(Configuration(host=url)))
    started = time.monotonic()
    view.start()
    assert view.wait_synced(240), view.readiness()[1]
    result = {"nodes": nodes, "pods": nodes * PODS_PER_NODE, "sync_s": time.monotonic() - started}
    result["rss_mib"] = rss_mib()
    result["rss_growth_mib"] = result["rss_mib"] - baseline

    def pod_events() -> int:
        return next(s.events for s in view.status() if s.kind == "pods")

    # Throughput: the server queues a backlog while holding the watch, then releases it, so the
    # figure is the view's drain rate, not how fast the fake can produce events.
    ours.send(("backlog", CHURN_EVENTS))
    ours.recv()
    target = pod_events() + CHURN_EVENTS
    started = time.monotonic()
    ours.send(("release",))
    deadline = started + 120
    while pod_events() < target and time.monotonic() < deadline:
        time.sleep(0.002)
    result["events_per_s"] = (CHURN_EVENTS - (target - pod_events())) / (time.monotonic() - started)

    # Admissions: the decision alone, and the whole review through the Flask app (parse, read the
    # workload, place, mutate, JSONPatch, answer) without TLS and gunicorn, in this process.
    request = PlacementRequest(workload="Job bench/train", pods=2, gpus_per_pod=2, strategy=Strategy.CONSOLIDATED)
    client = create_app(view.config, view.index, view.readiness, Metrics.create()).test_client()
    review = make_review(bench_job(), dry_run=True)  # dry run: nothing reserved, the cluster does not fill up

    def latencies(seconds: float) -> tuple[list[float], list[float]]:
        decide, whole = [], []
        for _ in range(int(seconds * ADMISSIONS_PER_SECOND)):
            begin = time.perf_counter()
            place_and_reserve(view.index, request, None)
            middle = time.perf_counter()
            answer = client.post(MUTATE_PATH, json=review)
            end = time.perf_counter()
            assert answer.status_code == 200 and answer.json["response"]["auditAnnotations"]["outcome"] == "placed"
            decide.append((middle - begin) * 1000)
            whole.append((end - middle) * 1000)
            time.sleep(max(0.0, 1 / ADMISSIONS_PER_SECOND - (time.perf_counter() - begin)))
        return sorted(decide), sorted(whole)

    def pct(values: list[float], q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))]

    def record(phase: str, samples: tuple[list[float], list[float]]) -> None:
        decide, whole = samples
        result.update({f"decide_{phase}_p50_ms": pct(decide, 0.5), f"decide_{phase}_p99_ms": pct(decide, 0.99),
                       f"review_{phase}_p50_ms": pct(whole, 0.5), f"review_{phase}_p99_ms": pct(whole, 0.99)})

    record("idle", latencies(STREAM_SECONDS / 2))
    for rate in STREAM_RATES:
        before = pod_events()
        ours.send(("stream", rate * STREAM_SECONDS, rate))
        record(str(rate), latencies(STREAM_SECONDS))
        ours.recv()
        drain_deadline = time.monotonic() + 30
        while pod_events() - before < rate * STREAM_SECONDS and time.monotonic() < drain_deadline:
            time.sleep(0.01)
        result[f"applied_{rate}"] = pod_events() - before
    view.stop()
    ours.send(("stop",))
    server.join(10)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="cluster size; repeatable (default 1k, 5k, 10k)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one size, JSON out
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.nodes[0])))
        return 0
    phases = ["idle", *map(str, STREAM_RATES)]
    print("admission columns: whole review p50/p99 ms (decision alone p99 ms)")
    print(f"{'nodes':>6} {'pods':>7} {'sync s':>7} {'RSS MiB':>8} {'+MiB':>6} {'events/s':>9} "
          + " ".join(f"{'idle' if p == 'idle' else p + ' ev/s':>20}" for p in phases))
    for nodes in args.nodes or SIZES:
        child = subprocess.run([sys.executable, "-m", "bench.clusterview_bench", "--one", "--nodes", str(nodes)],
                               capture_output=True, text=True, check=False)
        if child.returncode:
            print(f"{nodes} nodes failed:\n{child.stderr}", file=sys.stderr)
            return 1
        r = json.loads(child.stdout.strip().splitlines()[-1])
        cells = [f"{r[f'review_{p}_p50_ms']:.2f}/{r[f'review_{p}_p99_ms']:.2f} ({r[f'decide_{p}_p99_ms']:.2f})"
                 for p in phases]
        print(f"{r['nodes']:>6} {r['pods']:>7} {r['sync_s']:>7.2f} {r['rss_mib']:>8.0f} {r['rss_growth_mib']:>6.0f} "
              f"{r['events_per_s']:>9.0f} " + " ".join(f"{cell:>20}" for cell in cells), flush=True)
        lagging = [rate for rate in STREAM_RATES if r[f"applied_{rate}"] < rate * STREAM_SECONDS]
        if lagging:
            print(f"       the view fell behind at {lagging} events/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
