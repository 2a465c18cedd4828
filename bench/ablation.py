"""What each of our placement rules buys: ours with and without it, paired on fresh seeds.

Every rule of `bench.policies.ABLATIONS` is switched off on its own (`ours-without-RULE`), and each
variant runs the same streams as ours with every rule on. Per cell and bucket, one seed gives one
paired difference, with - without, read by bench/protocol.py: "helps" when the whole 95% interval
lies on the side of having the rule, "hurts" on the other side, "no effect seen" otherwise.

    .venv/bin/python bench/ablation.py                  # main grid, 512 GPUs, 8 fresh seeds
    .venv/bin/python bench/ablation.py --write          # also into bench/RESULTS.md
    .venv/bin/python bench/ablation.py --seeds 12 34    # repeat a run
    .venv/bin/python bench/ablation.py --hardware h100-pcie   # nodes of 2-GPU NVLink pairs
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import time
from dataclasses import replace

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import evaluate, protocol, report, simulate  # noqa: E402
from bench.fabric import HARDWARE  # noqa: E402
from bench.policies import ABLATIONS  # noqa: E402

WORDS = {"ahead": "helps", "behind": "hurts", "level": "no effect seen"}
MARK = "ablation"


def rows(results, cells, seeds, rng: random.Random) -> list[tuple]:
    """(trace, load, bucket or 'allocation', rule, protocol.Paired of with - without)."""
    out = []
    for trace, load in cells:
        for rule in ABLATIONS:
            without = f"ours-without-{rule}"
            for bucket in ("2", "3-4", "5-8", *evaluate.BUCKETS):  # 1 GPU: no all-reduce
                pairs = [(results[trace, load, s, evaluate.OURS].buckets[bucket].allreduce_ms,
                          results[trace, load, s, without].buckets[bucket].allreduce_ms)
                         for s in seeds if all(bucket in results[trace, load, s, k].buckets
                                               for k in (evaluate.OURS, without))]
                if pairs:
                    out.append((trace, load, bucket, rule, protocol.compare(*map(list, zip(*pairs)), rng)))
            if load > 1:
                out.append((trace, load, "allocation", rule, protocol.compare(
                    [100 * results[trace, load, s, evaluate.OURS].allocation for s in seeds],
                    [100 * results[trace, load, s, without].allocation for s in seeds], rng, lower_is_better=False)))
    return out


def render(found, seeds, gpus: int, hardware: str, wall_s: float, command: str) -> str:
    lines = [f"### Ablation: what each rule buys, {gpus} GPUs, {hardware} nodes", "",
             f"`{command}` ({len(seeds)} fresh streams per cell; {wall_s:.0f} s wall). Each row pairs ours with all "
             "rules on against ours with one rule off, on the same streams: mean of with - without (all-reduce ms "
             "of 1 GB, lower is better; allocation in GPU-% points at overload, higher is better), its 95% "
             "bootstrap interval, and what the rule does there.", ""]
    for rule in ABLATIONS:
        mine = [r for r in found if r[3] == rule]
        counts = {w: sum(WORDS[p.verdict] == w for *_, p in mine) for w in WORDS.values()}
        lines.append(f"- `{rule}`: helps in {counts['helps']}, hurts in {counts['hurts']}, no effect seen in "
                     f"{counts['no effect seen']} of {len(mine)} rows")
    lines += ["", "| trace | load | bucket | rule off | with - without | 95% interval | with won | reading |",
              "|---|---:|---:|---|---:|---:|---:|---|"]
    for trace, load, bucket, rule, p in found:
        word = WORDS[p.verdict]
        lines.append(f"| {trace} | {load:g} | {bucket} | {rule} | {p.mean:+.2f} | [{p.low:+.2f}, {p.high:+.2f}] | "
                     f"{p.wins}/{p.n} | {f'**{word}**' if word == 'hurts' else word} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, choices=sorted(evaluate.CLUSTERS), default=512)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--n-seeds", type=int, default=8)
    group.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--hardware", choices=sorted(HARDWARE), default="h100",
                        help="node type (default: %(default)s, one 8-GPU NVLink domain per node)")
    parser.add_argument("--quick", action="store_true", help="the quick cluster and stream; for tests")
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--write", action="store_true", help="put the result into bench/RESULTS.md")
    args = parser.parse_args(argv)
    tuned = sorted(set(args.seeds or ()) & evaluate.TUNING_SEEDS)
    if tuned:
        parser.error(f"--seeds: {', '.join(map(str, tuned))} are tuning seeds; an evaluation must not use them")
    settings = simulate.QUICK if args.quick else replace(simulate.FULL, spec=evaluate.CLUSTERS[args.gpus])
    cells = [(trace, load) for trace in settings.traces for load in settings.loads]
    seeds = args.seeds or evaluate.fresh_seeds(args.n_seeds)
    print(f"seeds {' '.join(map(str, seeds))}", flush=True)
    keys = (evaluate.OURS, *(f"ours-without-{rule}" for rule in ABLATIONS))
    tasks = [(simulate.Scenario("main", trace, load, hardware=args.hardware, seed=seed), key, settings)
             for trace, load in cells for seed in seeds for key in keys]
    began = time.perf_counter()
    with multiprocessing.Pool(args.processes) as pool:
        results = {(s.trace, s.load, s.seed, key): summary
                   for s, key, summary in pool.imap_unordered(simulate.run_one, tasks)}
    section = render(rows(results, cells, seeds, random.Random(0)), seeds, settings.spec.gpus, args.hardware,
                     time.perf_counter() - began, f"bench/ablation.py --gpus {settings.spec.gpus} --hardware "
                     f"{args.hardware} --seeds {' '.join(map(str, seeds))}")
    print(section)
    if args.write:
        report.write_into(os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md"), section,
                            f"{MARK} {settings.spec.gpus} {args.hardware}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
