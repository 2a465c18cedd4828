"""Job completion time, taken apart: per size bucket, wait, run and all-reduce, how often each policy
answered "wait", how full the queue was, what shape the free capacity had and whose waits the idle
GPUs sat through, for ours (both strategies), Kueue TAS BestFit and the two hybrids, on given streams.

    .venv/bin/python bench/diagnose_jct.py --cells acme_seren:1.2 --seeds 11 12           # as the cluster runs
    .venv/bin/python bench/diagnose_jct.py --cells acme_seren:1.2 --seeds 11 12 --before  # as the simulator ran

`--before` is the simulator before 25 Nov 2026: a pass looked at the first 64 queued jobs
(engine.WINDOW) and ours was decided afresh at every pass (no pin or preference written on a wait).
`--window N` and `--unpinned` set either apart. The seeds given are looked at: a rule chosen from
what this prints must be judged on fresh seeds (bench/evaluate.py).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
import time
from dataclasses import replace

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import engine, protocol, simulate  # noqa: E402
from bench.evaluate import CLUSTERS  # noqa: E402
from bench.fabric import GPUS_PER_NODE  # noqa: E402
from bench.policies import BySize, KueueBestFit, Ours, PodPlacement, Policy  # noqa: E402
from bench.traces import Job  # noqa: E402
from webhook.core.model import Strategy  # noqa: E402

BUCKETS = ("1", "2-8", "9-64", "65+")
POLICIES = ("ours-consolidated", "ours-balanced", "kueue", "ours-single+kueue-multi", "kueue-single+ours-multi")


def bucket_of(gpus: int) -> str:
    return "1" if gpus == 1 else "2-8" if gpus <= GPUS_PER_NODE else "9-64" if gpus <= 64 else "65+"


class Observed(Policy):
    """A policy, unchanged, that notes where each job of fewer GPUs than a node went: onto an idle
    node (opening it) or a partly used one, and whether that node's leaf was whole (every node idle)
    before."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.name, self.strict_fifo = inner, inner.name, inner.strict_fifo
        self.ungated_by_kueue = inner.ungated_by_kueue
        self.opened = self.into_whole_leaf = self.single = 0
        self.starts = self.into_a_pin = 0  # jobs started; ... on a node some other job waits pinned to
        self.pinned_share = 0.0  # sum over starts of the share of nodes under some other job's pin
        self.ours = [p for p in (inner, getattr(inner, "single", None), getattr(inner, "multi", None))
                     if isinstance(p, Ours)]

    def reset(self, cluster, seed: int) -> None:
        super().reset(cluster, seed)
        self.inner.reset(cluster, seed)

    def tick(self, now: float) -> None:
        self.inner.tick(now)

    def place(self, job: Job) -> list[PodPlacement] | None:
        pods = self.inner.place(job)
        if pods is not None:
            self.starts += 1
            pinned = {i for ours in self.ours for other, (wait, nodes) in ours.waiting.items()
                      if other != job.job_id and not ours.anywhere_for(wait) for i in nodes}
            self.into_a_pin += any(self.cluster.position[node] in pinned for node, _ in pods)
            self.pinned_share += len(pinned) / len(self.cluster.nodes)
        if pods is not None and job.pods == 1 and job.gpus < GPUS_PER_NODE:
            cluster = self.cluster
            node = cluster.by_name[pods[0][0]]
            self.single += 1
            if cluster.free_count[cluster.position[node.name]] == GPUS_PER_NODE:
                self.opened += 1
                if cluster.histogram["leaf"][node.leaf][GPUS_PER_NODE] == len(cluster.members["leaf"][node.leaf]):
                    self.into_whole_leaf += 1
        return pods

    def held_to(self, job: Job) -> frozenset[str] | None:
        return self.inner.held_to(job)

    def decides_at_arrival(self, job: Job) -> bool:
        return self.inner.decides_at_arrival(job)

    def fit_class(self, shape: tuple[int, int]) -> object:
        return self.inner.fit_class(shape)

    def redecided(self, job: Job) -> bool:
        return self.inner.redecided(job)

    def started(self, job: Job, pods: list[PodPlacement]) -> None:
        self.inner.started(job, pods)

    def finished(self, job: Job, pods: list[PodPlacement]) -> None:
        self.inner.finished(job, pods)


def make(key: str, network, comm_fraction: float, pinned: bool) -> Policy:
    def ours(strategy: Strategy = Strategy.CONSOLIDATED) -> Policy:
        return Ours(strategy, network, pinned=pinned, communication_share=comm_fraction)

    if key.startswith("ours-consolidated-"):  # a rule of issue 26 switched off
        return Ours(Strategy.CONSOLIDATED, network, pinned=pinned, label=key[len("ours-consolidated"):],
                    **{"communication_share": comm_fraction, **simulate.WAIT_ABLATIONS[key[len("ours-consolidated-"):]]})
    return {"ours-consolidated": ours, "ours-balanced": lambda: ours(Strategy.BALANCED), "kueue": KueueBestFit,
            "ours-single+kueue-multi": lambda: BySize("ours single, Kueue multi", ours(), KueueBestFit()),
            "kueue-single+ours-multi": lambda: BySize("Kueue single, ours multi", KueueBestFit(), ours())}[key]()


def one(task) -> tuple:
    trace, load, seed, key, gpus, window, pinned, network, runtime, streams = task
    settings = simulate.QUICK if gpus == simulate.QUICK.spec.gpus else replace(simulate.FULL, spec=CLUSTERS[gpus])
    scenario = simulate.Scenario.on(network, "main", trace, load, seed=seed, runtime=runtime, streams=streams)
    workload = simulate.workload_for(scenario, settings)
    policy = Observed(make(key, workload.network, workload.comm_fraction, pinned))
    began = time.perf_counter()
    result = engine.run(workload, policy, window=window)
    return task, figures(result, policy, window), time.perf_counter() - began


def figures(result: engine.RunResult, observed: Observed, window: int | None) -> dict:
    out: dict = {}
    for name in BUCKETS:
        recs = [r for r in result.records if bucket_of(r.job.gpus) == name]
        if not recs:
            continue
        weight = sum(r.job.gpus * r.job.duration_s for r in recs)
        out[name] = {"jobs": len(recs), "wait": statistics.fmean(r.wait_s for r in recs),
                     "run": statistics.fmean(r.run_s for r in recs),
                     "jct": statistics.fmean(r.completion_s for r in recs),
                     "allreduce": sum(r.allreduce_s * 1e3 * r.job.gpus * r.job.duration_s for r in recs) / weight,
                     "waits": sum(result.waits.get(r.job.job_id, 0) for r in recs) / len(recs),
                     "waited": sum(r.job.job_id in result.waits for r in recs) / len(recs),
                     "leaves": statistics.fmean(r.leaves for r in recs)}
    states = [s for s in result.states if result.window[0] <= s.time_s <= result.window[1]] or result.states
    head = window or engine.WINDOW
    out["cluster"] = {
        "queued": statistics.fmean(len(s.queued) for s in states),
        "head_multi": statistics.fmean(sum(g > GPUS_PER_NODE for g in s.queued[:head]) for s in states),
        "free": statistics.fmean(s.free_gpus for s in states),
        "partly": statistics.fmean(s.partly_used_nodes for s in states),
        "idle": statistics.fmean(s.idle_nodes for s in states),
        "leaves_partly": statistics.fmean(s.leaves_with_partly_used for s in states),
        "whole_leaves": statistics.fmean(s.whole_leaves for s in states),
        "fgd": statistics.fmean(f for _, f in result.fragmentation) if result.fragmentation else 0.0,
        "opened": observed.opened / max(1, observed.single),
        "whole_leaf": observed.into_whole_leaf / max(1, observed.single),
        "into_pin": observed.into_a_pin / max(1, observed.starts),
        "pinned_nodes": observed.pinned_share / max(1, observed.starts),
        "unstarted": result.unstarted, "allocation": 100 * result.allocation,
        **{f"idle {bucket}": share for bucket, share in idle_while_waiting(result).items()}}
    return out


def idle_while_waiting(result: engine.RunResult) -> dict[str, float]:
    """Idle GPU time in the measured window, in % of all GPU time there, by whose wait it fell in:
    while a job of ours of 65+ GPUs waited, while only jobs of 9-64 did, or otherwise (the three
    add up to 100 - allocation). A split by precedence, not by cause: any time a 65+ job waits
    counts to it, and under overload one waits most of the time. It says when the idle GPUs sat,
    which a policy's allocation shortfall can be compared by, not why. Jobs never started are not
    counted as waiting."""
    low, high = result.window
    events: list[tuple[float, int, int, int]] = []  # time, change of GPUs used, of 65+ and of 9-64 waiting
    for record in (*result.records, *result.foreign):
        events += [(record.start_s, record.job.gpus, 0, 0), (record.start_s + record.run_s, -record.job.gpus, 0, 0)]
    for record in result.records:
        if record.wait_s > 0 and record.job.gpus > GPUS_PER_NODE:
            large = int(record.job.gpus > 64)
            events += [(record.job.submit_s, 0, large, 1 - large), (record.start_s, 0, -large, large - 1)]
    idle = {"65+": 0.0, "9-64": 0.0, "otherwise": 0.0}
    used = large_waiting = middle_waiting = 0
    since = low
    for time_s, gpus, large, middle in sorted(events, key=lambda event: event[0]) + [(high, 0, 0, 0)]:
        begin, end = max(since, low), min(time_s, high)
        if end > begin:
            bucket = "65+" if large_waiting else "9-64" if middle_waiting else "otherwise"
            idle[bucket] += (result.cluster_gpus - used) * (end - begin)
        since = max(since, time_s)
        used, large_waiting, middle_waiting = used + gpus, large_waiting + large, middle_waiting + middle
    whole = result.cluster_gpus * (high - low)
    return {bucket: 100 * seconds / whole if whole > 0 else 0.0 for bucket, seconds in idle.items()}


def render(results: dict, cells, seeds, keys) -> str:
    lines = []
    for trace, load in cells:
        lines += [f"#### {trace}, load {load:g}: means over seeds {' '.join(map(str, seeds))}", "",
                  "| bucket | policy | jobs | wait s | run s | JCT s | all-reduce ms | tries that did not start, per job | jobs told to wait | leaves |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for bucket in BUCKETS:
            for key in keys:
                per_seed = [results[trace, load, s, key][bucket] for s in seeds if bucket in results[trace, load, s, key]]
                if not per_seed:
                    continue
                mean = {f: statistics.fmean(p[f] for p in per_seed) for f in per_seed[0]}
                lines.append(f"| {bucket} | {key} | {mean['jobs']:.0f} | {mean['wait']:,.0f} | {mean['run']:,.0f} | "
                             f"{mean['jct']:,.0f} | {mean['allreduce']:.1f} | {mean['waits']:.2f} | {100 * mean['waited']:.0f}% | "
                             f"{mean['leaves']:.2f} |")
        lines += ["", "| policy | queued jobs | 9+ GPU jobs in the first 64 | free GPUs | partly used nodes | "
                      "idle nodes | whole leaves | leaves with a partly used node | FGD | jobs of 1-7 GPUs opening an "
                      "idle node | ... in a whole leaf | jobs started inside another's pin | nodes under a pin then | unstarted | "
                      "allocation % | idle GPU-% while a 65+ job waits | ... while only 9-64 wait | ... otherwise |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for key in keys:
            c = {f: statistics.fmean(results[trace, load, s, key]["cluster"][f] for s in seeds)
                 for f in results[trace, load, seeds[0], key]["cluster"]}
            lines.append(f"| {key} | {c['queued']:.0f} | {c['head_multi']:.1f} | {c['free']:.0f} | {c['partly']:.1f} | "
                         f"{c['idle']:.1f} | {c['whole_leaves']:.2f} | {c['leaves_partly']:.1f} | {c['fgd']:.3f} | {100 * c['opened']:.1f}% | "
                         f"{100 * c['whole_leaf']:.1f}% | {100 * c['into_pin']:.1f}% | {100 * c['pinned_nodes']:.0f}% | "
                         f"{c['unstarted']:.0f} | {c['allocation']:.1f} | {c['idle 65+']:.1f} | {c['idle 9-64']:.1f} | "
                         f"{c['idle otherwise']:.1f} |")
        if "kueue" in keys and len(seeds) > 1:
            lines += ["", "Paired against Kueue TAS BestFit on the same streams (bench/protocol.py; mean JCT, s):", "",
                      "| bucket | policy | - Kueue | 95% interval | won | verdict |", "|---|---|---:|---:|---:|---|"]
            rng = random.Random(0)
            for bucket in BUCKETS:
                for key in keys:
                    pairs = [(results[trace, load, s, key][bucket]["jct"], results[trace, load, s, "kueue"][bucket]["jct"])
                             for s in seeds if bucket in results[trace, load, s, key]]
                    if key == "kueue" or not pairs:
                        continue
                    p = protocol.compare(*map(list, zip(*pairs)), rng)
                    lines.append(f"| {bucket} | {key} | {p.mean:+,.0f} | [{p.low:+,.0f}, {p.high:+,.0f}] | {p.wins}/{p.n} | "
                                 f"{p.verdict} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", metavar="TRACE:LOAD", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--gpus", type=int, choices=sorted(CLUSTERS), default=512)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES),
                        choices=POLICIES + tuple(f"ours-consolidated-{name}" for name in simulate.WAIT_ABLATIONS))
    parser.add_argument("--before", action="store_true", help="window 64 and ours unpinned: the old simulator")
    parser.add_argument("--window", type=int, help="queued jobs a pass looks at (default: all)")
    parser.add_argument("--unpinned", action="store_true", help="ours decided afresh at every pass")
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="the quick cluster and stream of simulate.py; for tests")
    parser.add_argument("--network", default=simulate.network_text(simulate.Network()), metavar="LEAF/SPINE/ZONE",
                        help="the network the simulator charges and ours is told (default: %(default)s)")
    simulate.add_runtime_arguments(parser)
    args = parser.parse_args(argv)
    network, runtime = simulate.parse_network(args.network), simulate.runtime_of(parser, args)
    gpus = simulate.QUICK.spec.gpus if args.quick else args.gpus
    cells = [(trace, float(load)) for trace, load in (c.split(":") for c in args.cells)]
    window = engine.WINDOW if args.before else args.window
    pinned = not (args.before or args.unpinned)
    keys = [k for k in args.policies if pinned or k != "ours-balanced"]  # unpinned, balanced decides as consolidated
    tasks = [(t, load, s, k, gpus, window, pinned, network, runtime, args.streams)
             for t, load in cells for s in args.seeds for k in keys]
    tasks.sort(key=lambda t: "ours" not in t[3])
    began = time.perf_counter()
    results = {}
    with multiprocessing.Pool(args.processes) as pool:
        for task, found, wall in (pool.imap_unordered(one, tasks) if args.processes > 1 else map(one, tasks)):
            results[task[:4]] = found
            print(f"  {task[0]} {task[1]:g} seed {task[2]} {task[3]}: {wall:.0f} s", file=sys.stderr, flush=True)
    print(f"window {window or 'none (whole queue)'}, ours {'pinned/preferred on a wait' if pinned else 'unpinned'}; "
          f"{gpus} GPUs; network {args.network}, {simulate.runtime_text(runtime)}, {simulate.streams_text(args.streams)}; "
          f"{time.perf_counter() - began:.0f} s wall\n")
    print(render(results, cells, args.seeds, keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
