"""A twin of the cluster (issue 58, item 4): the simulator's job streams replayed through the real
control plane, KWOK's kubelets and the real Kueue, under ours and Kueue TAS's three modes, judged on
the scorecard, with each job's start and domain set against the simulator's.

    nice .venv/bin/python bench/twin.py                      # 3 fresh seeds x helios_all, acme_seren, load 1.2, 2/4/8
    nice .venv/bin/python bench/twin.py --seeds 11 12 --allow-seen --traces acme_seren --jobs 40   # a quick look

Each stream is `simulate.workload_for`'s (streams v2, the default Runtime: 30% of jobs not ours, the
same under every policy), cut to its first `--jobs` jobs; the simulator runs the same cut stream
(bench/engine.py) for the fidelity table and its own scorecard. Each policy's replay starts on an
idle cluster of 512 GPUs in the simulator's shape (bench/twin_kube.py), and times are virtual
(bench/twin_model.py: the clock runs at `--pace` while the stack may act and jumps the idle gaps).
A job starts when its last pod binds; its run time is the simulator's charge for the nodes it
landed on (engine.started_record), and the twin ends its pods then (bench/twin_replay.py). A job
that is not ours is steered to the nodes the simulator gave it under the same policy (a preferred
node affinity): kube-scheduler breaks its ties at random, and what packs next to it would follow.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import evaluate, simulate  # noqa: E402
from bench.admission_bench import machine  # noqa: E402
from bench.engine import RunResult, Runtime, Workload, foreign_jobs, run  # noqa: E402
from bench.fabric import SimCluster  # noqa: E402
from bench.policies import KueueBestFit  # noqa: E402
from bench.traces import SIZE_SHARES  # noqa: E402
from bench.twin_kube import (KUEUE_MODES, MODES, NODES, OURS, Kube, cluster_queue, partition_of,  # noqa: E402
                             real_names, up_kueue, up_ours)
from bench.twin_model import Charge, max_pace, node_names, run_result  # noqa: E402
from bench.twin_replay import Replay, Replayed  # noqa: E402
from bench.twin_report import Stream, render  # noqa: E402
from tests.e2e.conftest import stop_cluster  # noqa: E402

TRACES = ("helios_all", "acme_seren")
LOAD = 1.2
NETWORK = "2/4/8"
JOBS = 80  # per stream: 24 replays within 45 minutes on the shared 2-core VM beside other sessions (RESULTS.md)
SEEDS = 3
POLICIES = (OURS, *KUEUE_MODES)


def stream_of(trace: str, seed: int, network: simulate.Network, jobs: int) -> tuple[simulate.Scenario, Workload]:
    """The simulator's stream of (trace, seed), its first `jobs` jobs, measured from time 0."""
    scenario = simulate.Scenario.on(network, "main", trace, LOAD, seed=seed, runtime=Runtime())
    workload = simulate.workload_for(scenario, simulate.FULL)
    return scenario, replace(workload, jobs=workload.jobs[:jobs], warmup_s=0.0)


def simulated(scenario: simulate.Scenario, workload: Workload, key: str) -> RunResult:
    return run(workload, simulate.policy_for(scenario, key))


def replayed(kube: Kube, stream: Stream, key: str, names: dict[str, str], pace: float, timeout_s: float,
             partition: int | None = None) -> None:
    """One policy's replay of one stream, from an idle cluster (or partition) to every job started (or
    the timeout), leaving it idle again; its run and what it saw go into `stream`."""
    workload, mode = stream.workload, MODES[key]
    namespace = f"twin-{stream.trace.replace('_', '-')}-{stream.seed}-{key}"
    cluster = SimCluster(workload.spec)
    required = KueueBestFit("required")
    required.reset(cluster, stream.seed)
    kube.namespace(namespace, None if partition is None else cluster_queue(partition, mode))
    try:
        pinned = {job_id: stream.simulated[key].placed.get(job_id, ()) for job_id in stream.foreign}
        outcome = Replay(kube, namespace, mode, list(workload.jobs), pinned, Charge(workload), names, required,
                         pace, timeout_s, "" if partition is None else partition_of(partition)).run()
    finally:
        kube.clear(namespace)
    records = [outcome.records[i] for i in range(len(workload.jobs)) if i in outcome.records]
    ours = [r for r in records if r.job.job_id not in stream.foreign]
    theirs = [r for r in records if r.job.job_id in stream.foreign]
    result = run_result(key, ours, theirs, (0.0, workload.jobs[-1].submit_s), workload.spec.gpus,
                        sum(j.job_id not in stream.foreign for j in workload.jobs) - len(ours),
                        sum(j.job_id in stream.foreign for j in workload.jobs) - len(theirs))
    result.placed = dict(outcome.placed)
    stream.twin[key], stream.outcomes[key] = result, outcome
    print(f"  {stream.trace} seed {stream.seed} {key}: {outcome.events} events in {outcome.wall_s:.0f} s wall, "
          f"{outcome.virtual_s:,.0f} s virtual ({outcome.skipped_s:,.0f} skipped), "
          f"{result.unstarted + result.foreign_unstarted} not started, {outcome.stalls} stalls"
          + (", TIMED OUT" if outcome.timed_out else "") + "; waited for: " + ", ".join(
              f"{kind} {seconds:.0f} s" for kind, seconds in sorted(outcome.busy_wall.items(), key=lambda i: -i[1])[:4]),
          flush=True)


def twin(streams: list[Stream], policies: tuple[str, ...], state: pathlib.Path, network: simulate.Network,
         pace: float, timeout_s: float) -> None:
    """Ours' replays on its cluster, one stream after the other; then each Kueue mode's, every stream
    at once on a partition of Kueue's cluster (bench/twin_kube.py)."""
    sim = SimCluster(streams[0].workload.spec)
    if OURS in policies:
        began = time.monotonic()
        cluster = up_ours(state / "ours", network, simulate.MAIN_COMM)
        print(f"ours' cluster up in {time.monotonic() - began:.0f} s", flush=True)
        kube = Kube(cluster)
        try:
            for stream in streams:
                replayed(kube, stream, OURS, node_names(sim, real_names(1)), pace, timeout_s)
        finally:
            kube.close()
            stop_cluster(state / "ours")
    modes = [key for key in KUEUE_MODES if key in policies]
    if not modes:
        return
    began = time.monotonic()
    cluster = up_kueue(state / "kueue", len(streams), sim)
    print(f"Kueue's cluster ({len(streams)} partitions of {NODES} nodes) up in {time.monotonic() - began:.0f} s",
          flush=True)
    kube = Kube(cluster)
    names = real_names(len(streams))
    try:
        for key in modes:
            with ThreadPoolExecutor(len(streams)) as pool:
                list(pool.map(lambda p: replayed(kube, streams[p], key, node_names(sim, names[NODES * p:NODES * (p + 1)]),
                                                 pace, timeout_s, p), range(len(streams))))
    finally:
        kube.close()
        stop_cluster(state / "kueue")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--n-seeds", type=int, default=SEEDS, help="fresh seeds to draw (default: %(default)s)")
    group.add_argument("--seeds", type=int, nargs="+", help="repeat a run on these seeds")
    parser.add_argument("--allow-seen", action="store_true", help="let --seeds name seeds of evaluate.SEEN_SEEDS")
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=sorted(SIZE_SHARES))
    parser.add_argument("--network", default=NETWORK, help="LEAF/SPINE/ZONE oversubscription (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=JOBS, help="jobs of each stream replayed, from its start "
                                                               "(default: %(default)s)")
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--pace", type=float,
                        help="virtual seconds per wall second while the stack may act (default: 1, or less where a "
                             "stream needs it); at most 1%% of each stream's median job per second of the releaser's "
                             "or Kueue's period")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="S", help="wall seconds per replay "
                                                                                    "(default: %(default)s)")
    parser.add_argument("--state", help="folder for the clusters' state (default: a temporary one)")
    parser.add_argument("--out", help="write the per-job fidelity table there (fidelity.tsv) and the report")
    args = parser.parse_args(argv)
    try:
        network = simulate.parse_network(args.network)
    except ValueError as error:
        parser.error(str(error))
    if args.jobs < 2 or (args.pace is not None and args.pace <= 0) or args.timeout <= 0 or (args.seeds is None and args.n_seeds < 1):
        parser.error("--jobs must be 2 or more, --pace, --timeout and --n-seeds above 0")
    seen = sorted(set(args.seeds or ()) & evaluate.SEEN_SEEDS)
    if seen and not args.allow_seen:
        parser.error(f"--seeds: {' '.join(map(str, seen))} seen before (evaluate.SEEN_SEEDS); --allow-seen runs "
                     "them in sample")
    seeds = args.seeds or evaluate.fresh_seeds(args.n_seeds)
    print(f"seeds {' '.join(map(str, seeds))} (repeat with --seeds {' '.join(map(str, seeds))}"
          f"{' --allow-seen' if seen else ''})", flush=True)
    began = time.monotonic()
    streams, paces = [], []
    for trace in args.traces:
        for seed in seeds:
            scenario, workload = stream_of(trace, seed, network, args.jobs)
            fastest = max_pace(job.duration_s for job in workload.jobs)
            paces.append(fastest)
            if args.pace is not None and args.pace > fastest:
                parser.error(f"--pace {args.pace:g}: {trace} seed {seed}'s median job is {100 * fastest:.0f} s, so "
                             f"a 1 s period is 1% of it only at pace {fastest:.2f} or less")
            stream = Stream(trace, seed, scenario, workload, foreign_jobs(workload.jobs, Runtime().foreign_share, seed))
            for key in args.policies:
                stream.simulated[key] = simulated(scenario, workload, key)
            streams.append(stream)
    print(f"simulated {len(streams)} streams x {len(args.policies)} policies in {time.monotonic() - began:.0f} s",
          flush=True)
    pace = args.pace if args.pace is not None else min(1.0, *paces)
    with tempfile.TemporaryDirectory(prefix="twin-") as scratch:
        twin(streams, tuple(args.policies), pathlib.Path(args.state or scratch), network, pace, args.timeout)
    wall = time.monotonic() - began
    command = (f"nice .venv/bin/python bench/twin.py --seeds {' '.join(map(str, seeds))}"
               + (" --allow-seen" if seen else "") + f" --traces {' '.join(args.traces)} --network {args.network}"
               + f" --jobs {args.jobs}" + (f" --pace {pace:.2f}" if pace != 1 else "")
               + (f" --policies {' '.join(args.policies)}" if tuple(args.policies) != POLICIES else ""))
    text, table = render(streams, tuple(args.policies), seeds, command, wall, machine())
    print(text)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "twin.md").write_text(text)
        (out / "fidelity.tsv").write_text(table)
        print(f"wrote {out / 'twin.md'} and {out / 'fidelity.tsv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
