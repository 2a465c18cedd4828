"""Which of ours' existing settings close the gaps to Kueue (issue 38, item 7): tuned on seen seeds, judged on fresh ones.

Ours (consolidated: balanced runs as it in the simulator) is run with its default Config and with
named variants of it (`VARIANTS`: existing webhook Config fields only, nothing new), beside Kueue in
its three modes, on the same streams under the default engine (ours decides at arrival, releaser
every 1 s + 50 ms, 30% of each stream not ours, streams v2).

    # tuning: seen seeds only (refuses others), means over seeds, no verdicts
    .venv/bin/python bench/settings_search.py tune --seeds 20261122 20261123 20261124 --out /tmp/tune
    # judging: fresh seeds (refuses seen ones), on the scorecard (bench/scorecard.py: M1-M4 against Kueue's
    # modes and against today's default), with evaluate.py's per-bucket verdicts as detail
    .venv/bin/python bench/settings_search.py judge --candidates unprotected share-0.2 --n-seeds 12 --out /tmp/judge

The 24 seeds of the judgement in bench/SETTINGS-SEARCH.md have since been added to
evaluate.SEEN_SEEDS: repeating it with `--seeds ... --allow-seen` reproduces its tables, marked in sample.

Both run in one process (the project's 2-core VM is shared), keep each finished run in --out (a
later call with the same code, interpreter and settings reads it back), and walk the seeds in the
outer loop, so a run stopped early has every cell on fewer seeds. bench/SETTINGS-SEARCH.md has the
grid, the candidates chosen before the fresh draw and the verdicts.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import statistics
import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import evaluate, report, scorecard, simulate  # noqa: E402
from bench.engine import run  # noqa: E402
from bench.policies import Ours  # noqa: E402
from webhook.core.model import Strategy  # noqa: E402

# ours' settings tried, by name: Config fields (docs/reference/settings.md) over the defaults. "default" is today's.
VARIANTS: dict[str, dict[str, object]] = {
    "default": {},
    "unprotected": {"protect_waiting_seconds": 0.0},
    "protect-300": {"protect_waiting_seconds": 300.0},
    "protect-600": {"protect_waiting_seconds": 600.0},
    "share-0": {"communication_share": 0.0},
    "share-0.02": {"communication_share": 0.02},
    "share-0.05": {"communication_share": 0.05},
    "share-0.2": {"communication_share": 0.2},
    "share-0.5": {"communication_share": 0.5},
    "share-1": {"communication_share": 1.0},  # the dial's far end (bench/SETTINGS-SEARCH.md, section 9)
    "ungated": {"gate_waits": False},
    "unpinned": {"pin_when_waiting": False},
    "pin-where-fits": {"pin_only_where_locality_pays": False},
    "unprotected+share-0.02": {"protect_waiting_seconds": 0.0, "communication_share": 0.02},
    "unprotected+share-0.05": {"protect_waiting_seconds": 0.0, "communication_share": 0.05},
    "unprotected+share-0.2": {"protect_waiting_seconds": 0.0, "communication_share": 0.2},
    "unprotected+share-0.5": {"protect_waiting_seconds": 0.0, "communication_share": 0.5},
    "unprotected+ungated": {"protect_waiting_seconds": 0.0, "gate_waits": False},
    # pods smaller than a node's NICs placed in groups that fill them (bench/SETTINGS-SEARCH.md, section 8)
    "fill-nics": {"fill_nics": True},
}
KUEUES = ("kueue", "kueue-required", "kueue-strict")
NETWORKS = ("1/2/2", "2/4/8")
CELLS = tuple((trace, load) for load in (1.2, 0.8) for trace in ("philly", "helios_all", "acme_seren"))
MULTI = evaluate.BUCKETS  # 9-64, 65+
SINGLE = evaluate.SINGLE_NODE


def policy(key: str, scenario: simulate.Scenario):
    """Kueue's modes as simulate builds them; ours' variants with their settings over the configured share."""
    if key in KUEUES:
        return simulate.policy_for(scenario, key)
    settings = {"communication_share": scenario.configured_share, **VARIANTS[key]}
    return Ours(Strategy.CONSOLIDATED, scenario.configured_network, label=f", {key}", **settings)


def run_path(folder: str, digest: str, scenario: simulate.Scenario, key: str) -> str:
    what = repr(sorted(VARIANTS.get(key, {}).items())).encode()
    return os.path.join(folder, f"{scenario.trace}-{scenario.load:g}-{scenario.seed}-"
                                f"{evaluate.scenario_key(scenario)}-{key}-"
                                f"{hashlib.sha256(what).hexdigest()[:8]}-{evaluate.interpreter()}-{digest}.pickle")


def run_all(folder: str, networks, cells, seeds, keys) -> tuple[dict, float, int]:
    """Every (network, trace, load, seed, key) run, seeds outermost; kept in `folder` as they finish."""
    os.makedirs(folder, exist_ok=True)
    digest = evaluate.code_digest()
    results, made, began = {}, 0, time.perf_counter()
    for seed in seeds:
        for text in networks:
            network = simulate.parse_network(text)
            for trace, load in cells:
                scenario = simulate.Scenario.on(network, "main", trace, load, seed=seed)
                for key in keys:
                    path = run_path(folder, digest, scenario, key)
                    if os.path.exists(path):
                        with open(path, "rb") as handle:
                            summary = pickle.load(handle)
                    else:
                        t0 = time.perf_counter()
                        summary = report.summarize(run(simulate.workload_for(scenario, simulate.FULL),
                                                       policy(key, scenario)), time.perf_counter() - t0)
                        with open(path + ".part", "wb") as handle:
                            pickle.dump(summary, handle)
                        os.replace(path + ".part", path)
                        made += 1
                    results[text, trace, load, seed, key] = summary
        print(f"seed {seed} done, {time.perf_counter() - began:.0f} s, {made} runs made", flush=True)
    return results, time.perf_counter() - began, made


def _mean(values) -> float:
    values = list(values)
    return statistics.fmean(values) if values else float("nan")


def bucket_mean(results, net, trace, load, seeds, key, bucket, field) -> float | None:
    """Mean over seeds where every policy compared ran jobs of the bucket (the caller's `seeds`)."""
    values = [getattr(results[net, trace, load, s, key].buckets[bucket], field) for s in seeds
              if bucket in results[net, trace, load, s, key].buckets]
    return _mean(values) if values else None


def tune_table(results, networks, cells, seeds, keys) -> str:
    """Per variant and network: how many multi-node JCT cells ours loses to some Kueue mode (mean
    over seeds, ours > theirs), the largest loss, allocation at 1.2 against Kueue preferred, all-reduce
    above one node against today's default and against Kueue preferred, single-node JCT at 1.2."""
    lines = ["| ours' setting | network | multi-node JCT cells behind a Kueue mode (of) | of them behind required "
             "| behind by over 5% | worst, s (cell, mode) "
             "| sum of losses, s | allocation at 1.2 - Kueue pref., points (philly / helios / acme) "
             "| all-reduce >1 node - default, ms (mean) | all-reduce >1 node - Kueue pref., ms (mean) "
             "| single-node JCT at 1.2 behind a Kueue mode (of) |",
             "|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|"]
    for key in keys:
        if key in KUEUES:
            continue
        for net in networks:
            behind, total, worst, losses, required, clear = 0, 0, (0.0, ""), 0.0, 0, 0
            ar_default, ar_kueue, single_behind, single_total = [], [], 0, 0
            for trace, load in cells:
                def common(bucket):
                    return [s for s in seeds if all(bucket in results[net, trace, load, s, k].buckets
                                                    for k in (key, "default", *KUEUES))]
                for bucket in MULTI:
                    have = common(bucket)
                    if not have:
                        continue
                    ours = bucket_mean(results, net, trace, load, have, key, bucket, "completion_s")
                    for mode in KUEUES:
                        theirs = bucket_mean(results, net, trace, load, have, mode, bucket, "completion_s")
                        total += 1
                        if ours > theirs:
                            behind += 1
                            required += mode == "kueue-required"
                            clear += ours > 1.05 * theirs
                            losses += ours - theirs
                            if ours - theirs > worst[0]:
                                worst = (ours - theirs, f"{trace} {load:g} {bucket}, {mode}")
                    ar = bucket_mean(results, net, trace, load, have, key, bucket, "allreduce_ms")
                    ar_default.append(ar - bucket_mean(results, net, trace, load, have, "default", bucket,
                                                       "allreduce_ms"))
                    ar_kueue.append(ar - bucket_mean(results, net, trace, load, have, "kueue", bucket,
                                                     "allreduce_ms"))
                if load > 1:
                    for bucket in SINGLE:
                        have = common(bucket)
                        if not have:
                            continue
                        ours = bucket_mean(results, net, trace, load, have, key, bucket, "completion_s")
                        for mode in KUEUES:
                            single_total += 1
                            single_behind += ours > bucket_mean(results, net, trace, load, have, mode, bucket,
                                                                "completion_s")
            allocation = " / ".join(
                f"{100 * _mean(results[net, t, 1.2, s, key].allocation - results[net, t, 1.2, s, 'kueue'].allocation for s in seeds):+.1f}"
                for t in ("philly", "helios_all", "acme_seren") if (t, 1.2) in cells)
            lines.append(f"| {key} | {net} | {behind} ({total}) | {required} | {clear} | {worst[0]:+,.0f} ({worst[1]}) "
                         f"| {losses:,.0f} "
                         f"| {allocation} | {_mean(ar_default):+.1f} | {_mean(ar_kueue):+.1f} "
                         f"| {single_behind} ({single_total}) |")
    return "\n".join(lines) + "\n"


def cell_table(results, networks, cells, seeds, keys) -> str:
    """Per network and cell: mean JCT of each bucket above one node, every key."""
    lines = ["| network | cell | bucket | " + " | ".join(keys) + " |", "|---|---|---|" + "---:|" * len(keys)]
    for net in networks:
        for trace, load in cells:
            for bucket in MULTI:
                have = [s for s in seeds if all(bucket in results[net, trace, load, s, k].buckets for k in keys)]
                if have:
                    lines.append(f"| {net} | {trace} {load:g} | {bucket} | " + " | ".join(
                        f"{bucket_mean(results, net, trace, load, have, k, bucket, 'completion_s'):,.0f}"
                        for k in keys) + " |")
            if load > 1:
                lines.append(f"| {net} | {trace} {load:g} | allocation % | " + " | ".join(
                    f"{100 * _mean(results[net, trace, load, s, k].allocation for s in seeds):.1f}" for k in keys)
                             + " |")
    return "\n".join(lines) + "\n"


def tune_scorecard(results, networks, cells, seeds, keys) -> str:
    """Per variant and network, the scorecard's means over the seeds (in sample: no verdicts): for M1
    and M2 the cells where ours' mean is above some Kueue mode's and the worst such share; M4 at
    overload against each mode's, in points."""
    lines = ["| ours' setting | network | M1 cells above a Kueue mode (of), worst | M2 cells above a Kueue mode (of), "
             "worst | M2 loaded cells below every Kueue mode (of) | M4 at overload - the best Kueue mode, points, worst |",
             "|---|---|---|---|---|---|"]
    metrics = {"M1": scorecard.mean_jct, "M2": scorecard.weighted_jct}
    for key in keys:
        if key in KUEUES:
            continue
        for net in networks:
            def mean(trace, load, k, value):
                return _mean(value(results[net, trace, load, s, k]) for s in seeds)

            words = []
            for value in metrics.values():
                shares = [mean(t, l, key, value) / mean(t, l, mode, value) - 1 for t, l in cells for mode in KUEUES]
                above = [x for x in shares if x > 0]
                words.append(f"{len(above)} ({len(shares)}), {100 * max(shares):+.1f}%")
            loaded = [(t, l) for t, l in cells if l >= scorecard.LOADED]
            below = sum(all(mean(t, l, key, scorecard.weighted_jct) < mean(t, l, mode, scorecard.weighted_jct)
                            for mode in KUEUES) for t, l in loaded)
            m4 = [mean(t, l, key, scorecard.useful_points) - max(mean(t, l, mode, scorecard.useful_points)
                                                                 for mode in KUEUES) for t, l in cells if l > 1]
            lines.append(f"| {key} | {net} | {words[0]} | {words[1]} | {below} ({len(loaded)}) | "
                         + (f"{min(m4):+.2f}" if m4 else "") + " |")
    return "\n".join(lines) + "\n"


def judged(results, networks, cells, seeds, candidates, wall: float, command: str) -> str:
    """The scorecard (bench/scorecard.py) of the default and of each candidate against Kueue's three
    modes, and of each candidate against the default (candidate / default - 1), per network; then
    evaluate.py's per-bucket verdicts (rings and JCT per bucket) as detail."""
    names = {"default": evaluate.OURS, **{c: f"setting-{c}" for c in candidates}}
    for key, name in names.items():
        simulate.STRATEGY_OF.setdefault(name, "consolidated" + ("" if key == "default" else f", {key}"))
    scorecard.NAMES.setdefault(evaluate.OURS, "today's default")
    cards: dict[str, dict[str, list]] = {name: {} for name in names.values()}
    against_default: dict[str, dict[str, list]] = {c: {} for c in candidates}
    detail = []
    for net in networks:
        mine = {(t, l, s, names.get(k, k)): v for (n, t, l, s, k), v in results.items() if n == net}
        for name in names.values():
            cards[name][net] = scorecard.scorecard(mine, cells, seeds, name, KUEUES, scorecard.rng_for(seeds, net))
        for c in candidates:
            against_default[c][net] = scorecard.scorecard(mine, cells, seeds, names[c], (evaluate.OURS,),
                                                          scorecard.rng_for(seeds, net))
        rows = evaluate.verdicts(mine, cells, seeds, tuple(names.values()), KUEUES)
        conditions = evaluate.conditions_of(simulate.parse_network(net), True, simulate.Runtime())
        detail.append(evaluate.render(rows, seeds, simulate.FULL.spec.gpus, wall, command, 0, conditions))
    out = []
    runtime = f"{simulate.runtime_text(simulate.Runtime())}, streams v{simulate.STREAMS}"
    for key, name in names.items():
        out.append(f"## Ours, {key}\n\n" + evaluate.scorecard_section(cards[name], seeds, simulate.FULL.spec.gpus,
                                                                       wall, command, 0, runtime))
    for c in candidates:
        out.append(f"## {c} against today's default (candidate / default - 1; Holm per candidate x metric x "
                   "network)\n\n" + "\n".join(f"#### Network {net}\n\n" + scorecard.render(rows, net)
                                             for net, rows in against_default[c].items()))
    out.append("## Detail: rings and per-bucket completion time (evaluate.py's verdicts)\n")
    return "\n".join(out + detail)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("tune", "judge"))
    parser.add_argument("--seeds", type=int, nargs="+")
    parser.add_argument("--n-seeds", type=int, help="judge: how many fresh seeds to draw")
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), help="tune: default every one")
    parser.add_argument("--candidates", nargs="+", choices=sorted(set(VARIANTS) - {"default"}),
                        help="judge: at most two, chosen before the fresh draw")
    parser.add_argument("--networks", nargs="+", default=list(NETWORKS))
    parser.add_argument("--cells", nargs="+", metavar="TRACE:LOAD")
    parser.add_argument("--out", required=True, help="folder keeping each finished run")
    parser.add_argument("--allow-seen", action="store_true",
                        help="judge: let --seeds name seen seeds (to repeat a judgement whose seeds were since "
                             "added to evaluate.SEEN_SEEDS); the report then says it is in sample")
    args = parser.parse_args(argv)
    cells = ([(t, float(l)) for t, l in (c.split(":") for c in args.cells)] if args.cells else list(CELLS))
    if args.mode == "tune":
        seeds = args.seeds or list(simulate.SEEDS[:3])
        unseen = [s for s in seeds if s not in evaluate.SEEN_SEEDS]
        if unseen:
            parser.error(f"tune runs on seen seeds only (evaluate.SEEN_SEEDS); not seen: {unseen}")
        keys = [*KUEUES, *(args.variants or VARIANTS)]
        if "default" not in keys:
            keys.append("default")
        results, wall, made = run_all(args.out, args.networks, cells, seeds, keys)
        print(f"\n{made} runs made in {wall:.0f} s; seeds {' '.join(map(str, seeds))} (seen: in sample)\n")
        print(tune_scorecard(results, args.networks, cells, seeds, keys))
        print(tune_table(results, args.networks, cells, seeds, keys))
        print(cell_table(results, args.networks, cells, seeds, keys))
        return 0
    if not args.candidates or len(args.candidates) > 2:
        parser.error("judge takes one or two --candidates, chosen before the fresh draw")
    if args.seeds:
        seen = [s for s in args.seeds if s in evaluate.SEEN_SEEDS]
        if seen and not args.allow_seen:
            parser.error(f"--seeds: {seen} seen (evaluate.SEEN_SEEDS): a judgement needs fresh seeds")
        seeds = args.seeds
    else:
        seeds = evaluate.fresh_seeds(args.n_seeds or 12)
    print(f"seeds {' '.join(map(str, seeds))} (repeat with --seeds {' '.join(map(str, seeds))})", flush=True)
    keys = [*KUEUES, "default", *args.candidates]
    results, wall, made = run_all(args.out, args.networks, cells, seeds, keys)
    command = (f"bench/settings_search.py judge --candidates {' '.join(args.candidates)} --seeds "
               f"{' '.join(map(str, seeds))} --networks {' '.join(args.networks)}"
               + (" --allow-seen" if any(s in evaluate.SEEN_SEEDS for s in seeds) else ""))
    print(judged(results, args.networks, cells, seeds, args.candidates, wall, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
