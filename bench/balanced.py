"""Where balanced could differ from consolidated, counted on the simulator's runs (issue 60, item 4).

The core decides the two alike and pins their waits alike; what differs is only what a placed
job's pods get, required node affinity (consolidated) or a preference (balanced), and that matters
only if the domain has no room when they bind. The simulator binds a decision at once, except a
gated job the releaser starts: it holds its GPUs from the tick and runs from the tick plus the
patch latency. In a cluster the hold is in our claims, which kube-scheduler does not read, so a pod
that is not ours arriving inside that latency could take those GPUs: then consolidated's pods would
wait pinned and balanced's spill elsewhere. This counts, per run, ours' jobs, those the releaser
started, and the releases with a foreign arrival inside their latency (an upper bound on the jobs
whose strategy could matter), and whether balanced's records are consolidated's.

    .venv/bin/python bench/balanced.py --seeds 1541047349 683293669 2144695239
"""
from __future__ import annotations

import argparse
import bisect
import multiprocessing
import os
import sys

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import simulate  # noqa: E402
from bench.engine import RunResult, run  # noqa: E402

CELLS = tuple((trace, load) for trace in ("philly", "helios_all", "acme_seren") for load in (0.8, 1.2))
NETWORKS = ("1/2/2", "2/4/8")


def raced_releases(result: RunResult, latency_s: float) -> tuple[int, int]:
    """(jobs the releaser started, of them those with a foreign job arriving inside their latency):
    a released job starts at a tick, a whole second, plus the latency, later than it arrived."""
    released = [r for r in result.records if r.start_s > r.job.submit_s + 1e-9
                and abs((r.start_s - latency_s) - round(r.start_s - latency_s)) < 1e-6]
    arrivals = sorted(f.job.submit_s for f in result.foreign)
    raced = sum(bisect.bisect_left(arrivals, r.start_s) > bisect.bisect_right(arrivals, r.start_s - latency_s)
                for r in released)
    return len(released), raced


def count(task: tuple[str, str, float, int]) -> tuple:
    network, trace, load, seed = task
    scenario = simulate.Scenario.on(simulate.parse_network(network), "main", trace, load, seed=seed)
    workload = simulate.workload_for(scenario, simulate.FULL)
    runs = {key: run(workload, simulate.policy_for(scenario, key)) for key in ("ours-consolidated", "ours-balanced")}
    consolidated = runs["ours-consolidated"]
    same = [(r.job.job_id, r.start_s, r.run_s, r.nodes) for r in consolidated.records] == [
        (r.job.job_id, r.start_s, r.run_s, r.nodes) for r in runs["ours-balanced"].records]
    return (task, len(consolidated.records), *raced_releases(consolidated, scenario.runtime.patch_latency_s), same)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    tasks = [(n, t, load, s) for n in NETWORKS for t, load in CELLS for s in args.seeds]
    with multiprocessing.Pool(args.processes) as pool:
        out = pool.map(count, tasks)
    print("| network | trace | load | seed | ours' jobs | started by the releaser | with a foreign arrival inside "
          "the latency | balanced's records are consolidated's |\n|---|---|---:|---:|---:|---:|---:|---|")
    for (network, trace, load, seed), jobs, released, raced, same in out:
        print(f"| {network} | {trace} | {load:g} | {seed} | {jobs} | {released} | {raced} | {'yes' if same else 'NO'} |")
    print(f"\n{len(out)} runs, {sum(o[-1] for o in out)} with identical records; {sum(o[1] for o in out):,} jobs, "
          f"{sum(o[2] for o in out)} started by the releaser, {sum(o[3] for o in out)} with a foreign arrival inside "
          "the latency")
    return 0


if __name__ == "__main__":
    sys.exit(main())
