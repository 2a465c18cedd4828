"""Evaluate ours against every baseline on fresh job streams: paired differences, 95% intervals, verdicts.

The placement rules were chosen while looking at the tuning seeds (simulate.SEEDS and 1000-1011,
the old seed_check range); a verdict read on them flatters whatever was tuned. This draws new seeds
every run (printed, so `--seeds` repeats a run exactly), runs ours and each baseline on the same
stream of each seed, and reports per cell and bucket the mean paired difference (ours - theirs),
its 95% bootstrap interval, the win count and the verdict of bench/protocol.py.

    .venv/bin/python bench/evaluate.py                      # main grid, 512 GPUs, 8 fresh seeds
    .venv/bin/python bench/evaluate.py --gpus 8192 --n-seeds 8
    .venv/bin/python bench/evaluate.py --seeds 123 456 --cells helios_all:0.8   # repeat given seeds
    .venv/bin/python bench/evaluate.py --write              # also put the verdict into bench/RESULTS.md
    .venv/bin/python bench/evaluate.py --gpus 8192 --seeds ... --resume bench/.runs   # keep each run, go on later

`--resume DIR` keeps every finished run (one policy on one stream) in DIR under a digest of the
code that made it (webhook/ and the simulator's modules), and a later call with the same code reads those instead of
running them again: an evaluation longer than one sitting goes on where it stopped.
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import pickle
import random
import sys
import time
from dataclasses import replace

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import protocol, report, simulate  # noqa: E402
from bench.fabric import ClusterSpec  # noqa: E402
from bench.traces import SIZE_SHARES  # noqa: E402

TUNING_SEEDS = frozenset(simulate.SEEDS) | frozenset(range(1000, 1012))
OURS = "ours-consolidated"
# Both strategies users get from us: balanced is the default, consolidated the one asked for.
OURS_VARIANTS = (OURS, "ours-balanced")
BASELINES = ("spread", "best-fit", "random", "kueue")
BUCKETS = ("9-64", "65+")  # buckets above one node
SINGLE_NODE = ("1", "2", "3-4", "5-8")  # report.bucket_of
JCT = "JCT "  # a row's bucket starts with it when it compares mean job completion time
# Same zone > spine > leaf > node shape at three sizes; load is relative to the cluster's GPUs.
CLUSTERS = {512: ClusterSpec(),
            2048: ClusterSpec(zones=2, spines_per_zone=4, leaves_per_spine=4, nodes_per_leaf=8),
            8192: ClusterSpec(zones=4, spines_per_zone=4, leaves_per_spine=8, nodes_per_leaf=8)}


def code_digest() -> str:
    """A digest of every Python file a run's result may depend on: all of webhook/, and the modules
    of bench/ this evaluation imports (so that a new benchmark beside them changes nothing)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [os.path.join(folder, name) for folder, _, files in os.walk(os.path.join(root, "webhook"))
             for name in files if name.endswith(".py")]
    paths += [str(module.__file__) for module in list(sys.modules.values())
              if module.__name__.startswith("bench.") and getattr(module, "__file__", None)]
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        digest.update(os.path.relpath(path, root).encode() + b"\0")
        with open(path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()[:16]


class Kept:
    """Finished runs kept in a folder, one file per (cluster, trace, load, seed, policy) and code
    digest: a result is only ever read back by the code that made it."""

    def __init__(self, folder: str, gpus: int) -> None:
        self.folder, self.gpus, self.digest = folder, gpus, code_digest()
        os.makedirs(folder, exist_ok=True)

    def path(self, task: tuple) -> str:
        scenario, key, _ = task
        return os.path.join(self.folder, f"{self.gpus}-{scenario.trace}-{scenario.load:g}-{scenario.seed}-{key}-"
                                         f"{self.digest}.pickle")

    def read(self, task: tuple):
        try:
            with open(self.path(task), "rb") as handle:
                return pickle.load(handle)
        except FileNotFoundError:
            return None

    def keep(self, task: tuple, summary) -> None:
        partial = self.path(task) + ".part"
        with open(partial, "wb") as handle:
            pickle.dump(summary, handle)
        os.replace(partial, self.path(task))


def fresh_seeds(count: int) -> list[int]:
    """Seeds nobody tuned with: from os.urandom, never one of the tuning seeds."""
    rng = random.Random(int.from_bytes(os.urandom(8), "big") ^ time.time_ns())
    seeds: list[int] = []
    while len(seeds) < count:
        seed = rng.randrange(2**31)
        if seed not in TUNING_SEEDS and seed not in seeds:
            seeds.append(seed)
    return seeds


def verdicts(results, cells, seeds, rng: random.Random, variants=(OURS,)) -> list[tuple]:
    """Rows (trace, load, bucket or 'allocation', baseline, protocol.Paired, ours' variant) for every
    comparison."""
    rows = []
    ablated = tuple(v for v in variants if v.startswith(f"{OURS}-"))  # also paired with ours: what each rule buys
    for variant in variants:
        for trace, load in cells:
            for baseline in BASELINES + (ablated if variant == OURS else ()):
                for bucket in BUCKETS:
                    pairs = [(results[trace, load, s, variant].buckets[bucket].allreduce_ms,
                              results[trace, load, s, baseline].buckets[bucket].allreduce_ms)
                             for s in seeds
                             if all(bucket in results[trace, load, s, k].buckets for k in (variant, baseline))]
                    if pairs:
                        rows.append((trace, load, bucket, baseline, protocol.compare(*map(list, zip(*pairs)), rng),
                                     variant))
                for bucket in (*SINGLE_NODE, *BUCKETS):
                    pairs = [(results[trace, load, s, variant].buckets[bucket].completion_s,
                              results[trace, load, s, baseline].buckets[bucket].completion_s)
                             for s in seeds
                             if all(bucket in results[trace, load, s, k].buckets for k in (variant, baseline))]
                    if pairs:
                        rows.append((trace, load, JCT + bucket, baseline,
                                     protocol.compare(*map(list, zip(*pairs)), rng), variant))
                if load > 1 and baseline in BASELINES:  # below overload, allocation grows with slow placements (jobs run longer)
                    ours = [100 * results[trace, load, s, variant].allocation for s in seeds]
                    theirs = [100 * results[trace, load, s, baseline].allocation for s in seeds]
                    rows.append((trace, load, "allocation", baseline,
                                 protocol.compare(ours, theirs, rng, lower_is_better=False), variant))
    return rows


def render(rows, seeds, gpus: int, wall_s: float, command: str, resumed: int = 0) -> str:
    lines = [f"### Evaluation on fresh seeds, {gpus} GPUs",
             "",
             f"`{command}` drew seeds {' '.join(map(str, seeds))} ({len(seeds)} streams per cell, none of them a "
             f"tuning seed); {wall_s:.0f} s wall"
             + (f" for the runs this call made, {resumed} more read back from earlier calls on the same code" if resumed
                else "") + ". Each row pairs ours (with the strategy in the last column) with "
             "one baseline on the same streams: "
             "mean of ours - theirs, its 95% bootstrap interval, streams ours won, verdict (ahead/behind only "
             "if the whole interval lies on one side). Bucket `9-64`, `65+`: all-reduce in ms of 1 GB (lower is "
             "better); `JCT` and a bucket: mean job completion time, submit to finish, in s (lower is better); "
             "allocation in GPU-% points (higher is better), at overload only: below it, a slower placement "
             "makes jobs run longer and so holds more GPUs.",
             ""]
    def tally(found: list, what: str) -> str:
        found = [row for row in found if row[3] in BASELINES]
        kueue = [row[4] for row in found if row[3] == "kueue"]
        counts = {v: sum(row[4].verdict == v for row in found) for v in ("ahead", "level", "behind")}
        return (f"{what}: ahead {counts['ahead']}, level {counts['level']}, behind {counts['behind']} of {len(found)} "
                f"comparisons; against Kueue TAS BestFit ahead in {sum(p.verdict == 'ahead' for p in kueue)} of "
                f"{len(kueue)}, behind in {sum(p.verdict == 'behind' for p in kueue)}")

    for variant in dict.fromkeys(row[5] for row in rows):
        mine = [row for row in rows if row[5] == variant]
        lines.append(f"{simulate.STRATEGY_OF[variant]}: "
                     + "; ".join([tally([r for r in mine if r[2] in BUCKETS], "all-reduce above one node"),
                                  tally([r for r in mine if r[2].removeprefix(JCT) in BUCKETS and r[2] != r[2].removeprefix(JCT)],
                                        "JCT above one node"),
                                  tally([r for r in mine if r[2].removeprefix(JCT) in SINGLE_NODE
                                         and r[2] != r[2].removeprefix(JCT)], "JCT on one node")]) + ".")
        lines.append("")
    lines += ["| trace | load | bucket | baseline | ours - theirs | 95% interval | ours won | verdict | ours |",
              "|---|---:|---:|---|---:|---:|---:|---|---|"]
    for trace, load, bucket, baseline, p, variant in rows:
        mark = f"**{p.verdict}**" if p.verdict == "behind" else p.verdict
        lines.append(f"| {trace} | {load:g} | {bucket} | {baseline} | {p.mean:+.1f} | [{p.low:+.1f}, {p.high:+.1f}] "
                     f"| {p.wins}/{p.n} | {mark} | {simulate.STRATEGY_OF[variant]} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, choices=sorted(CLUSTERS), default=512)
    parser.add_argument("--cells", nargs="*", metavar="TRACE:LOAD",
                        help="default: every trace and load of the main grid")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--n-seeds", type=int, default=8, help="how many fresh seeds to draw")
    group.add_argument("--seeds", type=int, nargs="+", help="repeat a run on these seeds")
    parser.add_argument("--quick", action="store_true", help="the quick cluster and stream of simulate.py; for tests")
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--write", action="store_true", help="put the result into bench/RESULTS.md")
    parser.add_argument("--resume", metavar="DIR",
                        help="keep each finished run in DIR and read back those the same code already made")
    parser.add_argument("--ablations", nargs="*", metavar="NAME", choices=sorted(simulate.WAIT_ABLATIONS),
                        help="also run consolidated with issue 26's rules switched off: these of "
                             "simulate.WAIT_ABLATIONS, every one when none is named")
    args = parser.parse_args(argv)
    settings = simulate.QUICK if args.quick else replace(simulate.FULL, spec=CLUSTERS[args.gpus])
    try:
        cells = [(trace, float(load)) for trace, load in (c.split(":") for c in args.cells)] if args.cells else [
            (trace, load) for trace in settings.traces for load in settings.loads]
    except ValueError:
        parser.error("--cells takes TRACE:LOAD, for example helios_all:0.8")
    unknown = sorted({trace for trace, _ in cells} - set(SIZE_SHARES))
    if unknown:
        parser.error(f"--cells: unknown trace {', '.join(unknown)}; known: {', '.join(SIZE_SHARES)}")
    tuned = sorted(set(args.seeds or ()) & TUNING_SEEDS)
    if tuned:
        parser.error(f"--seeds: {', '.join(map(str, tuned))} are tuning seeds; an evaluation must not use them")
    seeds = args.seeds or fresh_seeds(args.n_seeds)
    print(f"seeds {' '.join(map(str, seeds))} (repeat with --seeds {' '.join(map(str, seeds))})", flush=True)
    ablations = () if args.ablations is None else tuple(args.ablations or simulate.WAIT_ABLATIONS)
    variants = OURS_VARIANTS + tuple(f"{OURS}-{name}" for name in ablations)
    tasks = [(simulate.Scenario("main", trace, load, seed=seed), key, settings)
             for trace, load in cells for seed in seeds for key in (*variants, *BASELINES)]
    tasks.sort(key=lambda t: t[1] not in variants)  # our core's runs are the slowest: start them first
    kept = Kept(args.resume, settings.spec.gpus) if args.resume else None
    results: dict[tuple[str, float, int, str], object] = {}
    if kept is not None:
        for task in list(tasks):
            summary = kept.read(task)
            if summary is not None:
                results[task[0].trace, task[0].load, task[0].seed, task[1]] = summary
                tasks.remove(task)
        print(f"{len(results)} runs read back from {args.resume}; {len(tasks)} to run", flush=True)
    resumed = len(results)
    began = time.perf_counter()
    with multiprocessing.Pool(args.processes) as pool:
        for s, key, summary in pool.imap_unordered(simulate.run_one, tasks):
            results[s.trace, s.load, s.seed, key] = summary
            if kept:
                kept.keep((s, key, settings), summary)
    wall = time.perf_counter() - began
    gpus = settings.spec.gpus
    section = render(verdicts(results, cells, seeds, random.Random(0), variants), seeds, gpus, wall,
                     f"bench/evaluate.py --gpus {gpus} --seeds {' '.join(map(str, seeds))}"
                     + (f" --ablations {' '.join(ablations)}" if ablations else ""), resumed)
    print(section)
    if args.write:
        report.write_into(os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"), section, gpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
