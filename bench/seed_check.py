"""Re-run main-grid cells of the quality benchmark on more seeds, ours against Kueue TAS BestFit.

The main grid's verdict compares means over a few seeds, and one seed can move a bucket's mean
all-reduce by 2x (a 256-GPU job that finds a whole zone or not). This prints, per cell and bucket,
the mean and median over other seeds and in how many of them ours was at least as good: every
cell, so wins are checked as hard as losses.

    .venv/bin/python bench/seed_check.py                     # all main-grid cells, 12 seeds (~5 min)
    .venv/bin/python bench/seed_check.py --cells helios_all:0.8 --seeds 4
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import simulate  # noqa: E402
from bench.traces import SIZE_SHARES  # noqa: E402

FIRST_SEED = 1000  # apart from simulate.SEEDS, so these are streams the main grid never saw
BUCKETS = ("9-64", "65+")
POLICIES = ("kueue", "ours-consolidated")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="*", metavar="TRACE:LOAD",
                        help="default: every trace and load of the main grid")
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    settings = simulate.FULL
    try:
        cells = [(trace, float(load)) for trace, load in (c.split(":") for c in args.cells)] if args.cells else [
            (trace, load) for trace in settings.traces for load in settings.loads]
    except ValueError:
        parser.error("--cells takes TRACE:LOAD, for example helios_all:0.8")
    unknown = sorted({trace for trace, _ in cells} - set(SIZE_SHARES))
    if unknown:
        parser.error(f"--cells: unknown trace {', '.join(unknown)}; known: {', '.join(SIZE_SHARES)}")
    seeds = range(FIRST_SEED, FIRST_SEED + args.seeds)
    tasks = [(simulate.Scenario("main", trace, load, seed=seed), key, settings)
             for trace, load in cells for seed in seeds for key in POLICIES]
    with multiprocessing.Pool(args.processes) as pool:
        results = {(s.trace, s.load, s.seed, key): summary for s, key, summary in pool.imap_unordered(
            simulate.run_one, tasks)}

    print(f"seeds {seeds.start}-{seeds.stop - 1}; all-reduce ms of 1 GB, GPU-time weighted; "
          f"'ours <= Kueue' counts seeds\n")
    print("| trace | load | bucket | Kueue mean | ours mean | Kueue median | ours median | ours <= Kueue |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for trace, load in cells:
        for bucket in BUCKETS:
            pairs = [tuple(results[trace, load, seed, key].buckets[bucket].allreduce_ms for key in POLICIES)
                     for seed in seeds if all(bucket in results[trace, load, seed, key].buckets for key in POLICIES)]
            if not pairs:
                continue
            kueue, ours = zip(*pairs)
            print(f"| {trace} | {load:g} | {bucket} | {statistics.fmean(kueue):.1f} | {statistics.fmean(ours):.1f} | "
                  f"{statistics.median(kueue):.1f} | {statistics.median(ours):.1f} | "
                  f"{sum(o <= k for k, o in pairs)}/{len(pairs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
