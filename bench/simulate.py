"""Placement quality benchmark: our placement core against the placements users would otherwise get.

    .venv/bin/python bench/simulate.py            # full run: bench/RESULTS.md and bench/plots/*.png
    .venv/bin/python bench/simulate.py --quick    # seconds: a small cluster, prints the tables
    .venv/bin/python bench/simulate.py --trace-csv my.csv   # also replay a trace in the canonical CSV
    .venv/bin/python bench/simulate.py --networks 1/1/1 1/2/2 2/4/8 --misconfigured 0.5 2 --kueue-modes
        # a sweep: the main grid per network, ours also configured wrong, Kueue in its three modes
    .venv/bin/python bench/simulate.py --quick --releaser-period 0 --patch-latency 0 --foreign-share 0 \
        --decide-when-it-fits   # the cluster as the engine ran it before issue 38 (engine.IDEAL)

Every policy sees the same cluster, the same job stream (fixed seeds) and the same queue discipline
(bench/engine.py). Method and caveats are written into RESULTS.md next to the numbers.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import sys
import time
from dataclasses import dataclass, replace

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import report  # noqa: E402
from bench.costmodel import Network  # noqa: E402
from bench.engine import Runtime, Workload, run  # noqa: E402
from bench.fabric import CLUSTER, HARDWARE, ClusterSpec  # noqa: E402
from bench.policies import (ABLATIONS, BySize, KueueBestFit, Ours, Policy, Without, least_allocated,  # noqa: E402
                            most_allocated, random_fit)
from bench.traces import (SHARE_HIGH, SHARE_LOW, SHARE_MEDIAN, STREAM_VERSIONS, STREAMS, TraceError,  # noqa: E402
                          load_csv, sample_stream)
from webhook.core.model import Strategy  # noqa: E402

SEEDS = (20261122, 20261123, 20261124, 20261125, 20261126)  # the main grid runs every stream under each; sweeps use the first
ALLREDUCE_BYTES = 1e9  # 1 GB of fp16 gradients, as in docs/design/cost-model.md's worked example
# share of run time in all-reduce at the tightest placement, main grid: every job's in version 1
# streams, the median of the jobs' own shares in version 2 (traces.SHARE_MEDIAN)
MAIN_COMM = 0.1
POLICY_KEYS = ("spread", "best-fit", "random", "kueue", "ours-consolidated", "ours-distributed")
# Kueue's other modes (policies.KueueBestFit): required at the narrowest level that holds the job on
# an idle cluster, and StrictFIFO. Run when asked (--kueue-modes), so that the default grid and
# bench/RESULTS.md stay what they were; `kueue` is the preferred mode with BestEffortFIFO.
KUEUE_MODE_KEYS = ("kueue-required", "kueue-strict")
EXTENDED_KEYS = POLICY_KEYS + KUEUE_MODE_KEYS
# Attribution: our decisions for one job shape and Kueue's for the other.
HYBRID_KEYS = ("ours-single+kueue-multi", "kueue-single+ours-multi")
# The two rules of issue 26 switched off, one at a time and together (what ours did before them),
# and the wait weighed with the largest communication share.
WAIT_ABLATIONS: dict[str, dict[str, object]] = {
    "pinned-everywhere": {"pin_only_where_locality_pays": False},
    "unprotected": {"protect_waiting_seconds": 0.0},
    "before-26": {"pin_only_where_locality_pays": False, "protect_waiting_seconds": 0.0},
    # a user who says every second of a run is communication: waits stay narrow unless they save a run or more
    "communication-share-1": {"communication_share": 1.0},
    # a job that fits only across a slower level waits for a tighter domain, as tuned (off by default) ...
    "tighter-wait": {"tight_wait_weight": 2.0},
    # ... or waits for it with no aging bound, as Kueue's required mode does
    "unaged-tighter-wait": {"tight_wait_weight": 2.0, "tight_wait_seconds": 0.0},
}
# Our variants by the strategy a user asks for. Balanced (what a workload without the annotation
# gets) runs as consolidated in the simulator, record for record, so it has no column
# (docs/design/evaluation.md, "Balanced: no column of its own"); `ours-balanced` builds it for ad-hoc runs.
STRATEGY_OF = {"ours-consolidated": "consolidated", "ours-distributed": "distributed",
               **{f"ours-consolidated-{name}": f"consolidated, {name}" for name in WAIT_ABLATIONS}}




def make_policy(key: str, network: Network, comm_fraction: float) -> Policy:
    """The policy `key`; ours is configured with `network` (its levels' oversubscription) and
    `comm_fraction` (its communication share), as an operator configures it: `policy_for` passes
    what a scenario says the operator wrote, which need not be what the simulator charges."""
    def ours(strategy: Strategy = Strategy.CONSOLIDATED, label: str = "", **settings: object) -> Policy:
        return Ours(strategy, network, label=label, **{"communication_share": comm_fraction, **settings})

    makers = {"spread": least_allocated, "best-fit": most_allocated, "random": random_fit, "kueue": KueueBestFit,
              "kueue-required": lambda: KueueBestFit(topology="required"),
              "kueue-strict": lambda: KueueBestFit(strict_fifo=True),
              "ours-consolidated": ours, "ours-distributed": lambda: ours(Strategy.DISTRIBUTED),
              "ours-balanced": lambda: ours(Strategy.BALANCED),
              "ours-single+kueue-multi": lambda: BySize("ours single-pod, Kueue multi-pod", ours(), KueueBestFit()),
              "kueue-single+ours-multi": lambda: BySize("Kueue single-pod, ours multi-pod", KueueBestFit(), ours())}
    makers.update({f"ours-without-{rule}": (lambda rule=rule: Without(rule, network, comm_fraction))
                   for rule in ABLATIONS})
    makers.update({f"ours-consolidated-{name}": (lambda name=name, settings=settings: ours(
        Strategy.CONSOLIDATED, f", {name}", **settings)) for name, settings in WAIT_ABLATIONS.items()})
    return makers[key]()


@dataclass(frozen=True)
class Scenario:
    """One comparison: every policy runs it on identical input.

    The network and the communication share are what the simulator charges (bench/costmodel.py:
    a ring's bandwidth is divided by rho_leaf across leaves, by rho_leaf x rho_spine across spines,
    by rho_leaf x rho_spine x rho_zone across zones; `comm_fraction` of a job's run time stretches
    with it). Ours is configured with `configured_rho` (leaf, spine, zone) and `configured_comm`,
    what the operator wrote in its Config; None, the default, is the charged value: told the truth.

    `streams` is the job streams' version (bench/traces.py). In version 2 every job carries its own
    share, log-uniform between 0.02 and 0.5 when `comm_fraction` is 0.1, their median; another
    `comm_fraction` scales every job's share by comm_fraction / 0.1 (at most 1), so that the comm
    and packing groups sweep it as before. Ours' Config holds one share, so "told the truth" is
    then told the median: ours never learns a job's own share."""

    group: str  # which table/plot it feeds: main, comm, hardware, network, replay, sweep
    trace: str
    load: float
    hardware: str = "h100"
    comm_fraction: float = MAIN_COMM  # charged
    rho_leaf: float = Network().rho_leaf  # charged
    csv_path: str | None = None
    seed: int = SEEDS[0]
    rho_spine: float = Network().rho_spine  # charged
    rho_zone: float = Network().rho_zone  # charged
    configured_rho: tuple[float, float, float] | None = None  # ours' levels' oversubscription; None: charged
    configured_comm: float | None = None  # ours' communication_share; None: charged
    runtime: Runtime = Runtime()  # the releaser's period and latency, the share not ours (bench/engine.py)
    streams: int = STREAMS  # the job streams' version (bench/traces.py)

    @classmethod
    def on(cls, network: Network, group: str, trace: str, load: float, **rest) -> "Scenario":
        """A scenario whose charged network is `network` (the inverse of `network` below)."""
        return cls(group, trace, load, rho_leaf=network.rho_leaf, rho_spine=network.rho_spine,
                   rho_zone=network.rho_zone, **rest)

    @property
    def network(self) -> Network:
        """The network the simulator charges."""
        return Network(rho_leaf=self.rho_leaf, rho_spine=self.rho_spine, rho_zone=self.rho_zone)

    @property
    def configured_network(self) -> Network:
        """The network ours is configured with."""
        return self.network if self.configured_rho is None else Network(*self.configured_rho)

    @property
    def configured_share(self) -> float:
        """The communication share ours is configured with."""
        return self.comm_fraction if self.configured_comm is None else self.configured_comm

    @property
    def told_the_truth(self) -> bool:
        return self.configured_network == self.network and self.configured_share == self.comm_fraction

    @property
    def label(self) -> str:
        text = (f"{self.trace} load {self.load:g}, {self.hardware}, comm {self.comm_fraction:g}, "
                f"rho_leaf {self.rho_leaf:g}")
        default = Network()
        if (self.rho_spine, self.rho_zone) != (default.rho_spine, default.rho_zone):
            text += f", rho_spine {self.rho_spine:g}, rho_zone {self.rho_zone:g}"
        if not self.told_the_truth:
            text += f", ours configured {configured_text(self)}"
        if self.runtime != Runtime():
            text += f", {runtime_text(self.runtime)}"
        if self.streams != STREAMS:
            text += f", streams v{self.streams}"
        return text

    @property
    def policies(self) -> tuple[str, ...]:
        return HYBRID_KEYS if self.group == "attribution" else POLICY_KEYS


def runtime_text(runtime: Runtime) -> str:
    """How the cluster runs, in words: "releaser every 1 s + 50 ms, 30% not ours"."""
    text = (f"releaser every {runtime.releaser_period_s:g} s + {runtime.patch_latency_s * 1e3:g} ms, "
            f"{100 * runtime.foreign_share:g}% not ours")
    if runtime.kueue_ungate_s != Runtime().kueue_ungate_s:
        text += f", Kueue's pods ungated {runtime.kueue_ungate_s:g} s after admission"
    return text + ("" if runtime.decide_at_arrival else ", ours decides when the job fits")


def runtime_flags(runtime: Runtime) -> list[str]:
    """The command-line flags that give `runtime` (none for the default)."""
    default = Runtime()
    return ([f"--releaser-period {runtime.releaser_period_s:g}"] * (runtime.releaser_period_s != default.releaser_period_s)
            + [f"--patch-latency {runtime.patch_latency_s:g}"] * (runtime.patch_latency_s != default.patch_latency_s)
            + [f"--foreign-share {runtime.foreign_share:g}"] * (runtime.foreign_share != default.foreign_share)
            + ["--decide-when-it-fits"] * (not runtime.decide_at_arrival)
            + [f"--kueue-ungate {runtime.kueue_ungate_s:g}"] * (runtime.kueue_ungate_s != default.kueue_ungate_s))


def add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `Runtime`, for simulate.py and evaluate.py alike."""
    default = Runtime()
    group = parser.add_argument_group("the cluster as it runs (bench/engine.py, Runtime)")
    group.add_argument("--releaser-period", type=float, default=default.releaser_period_s, metavar="S",
                       help="seconds between the releaser's passes; a gated job starts at the next one after "
                            f"its GPUs are freed (default {default.releaser_period_s:g}, the webhook's)")
    group.add_argument("--patch-latency", type=float, default=default.patch_latency_s, metavar="S",
                       help=f"seconds from a release to its pods running (default {default.patch_latency_s:g})")
    group.add_argument("--foreign-share", type=float, default=default.foreign_share, metavar="SHARE",
                       help="share of the stream that is not ours, placed by kube-scheduler as it arrives, the "
                            f"same jobs under every policy (default {default.foreign_share:g})")
    group.add_argument("--kueue-ungate", type=float, default=default.kueue_ungate_s, metavar="S",
                       help="seconds from Kueue's admission to its pods running, its topology ungater's batch "
                            f"(default {default.kueue_ungate_s:g})")
    parser.add_argument("--streams", type=int, choices=STREAM_VERSIONS, default=STREAMS,
                        help="the job streams' version (bench/traces.py): 2, joint sizes and durations without a "
                             f"cap, each job's own communication share ({SHARE_LOW:g} to {SHARE_HIGH:g}), some "
                             "multi-node jobs in pods of 4 GPUs; 1, the streams of every run before issue 38 "
                             f"(default {STREAMS})")
    group.add_argument("--decide-when-it-fits", action="store_true",
                       help="ask ours first when the cluster has room for the job, not when its pods are created "
                            "(as before issue 38)")


def runtime_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Runtime:
    try:
        return Runtime(args.releaser_period, args.patch_latency, args.foreign_share, not args.decide_when_it_fits,
                       args.kueue_ungate)
    except ValueError as error:
        parser.error(str(error))


def streams_text(streams: int, share: float = MAIN_COMM) -> str:
    """The job streams in words, with the communication share they are charged."""
    if streams == 1:
        return f"streams v1 (sizes apart from durations, capped; every job comm share {share:g})"
    return (f"streams v{streams} (sizes and durations drawn jointly, no cap; each job's own comm share, "
            f"log-uniform {SHARE_LOW:g}-{SHARE_HIGH:g}, median {share:g}; ours configured with the median)")


def streams_flags(streams: int) -> list[str]:
    """The command-line flag that gives `streams` (none for the default)."""
    return [] if streams == STREAMS else [f"--streams {streams}"]


def network_text(network: Network) -> str:
    """leaf/spine/zone oversubscription, as --networks takes it: 2/4/8."""
    return f"{network.rho_leaf:g}/{network.rho_spine:g}/{network.rho_zone:g}"


def configured_text(scenario: Scenario) -> str:
    """What ours is told, against the truth: "exact", or e.g. "rho 4/8/16 (2x)" and "comm 0.05 (0.5x)"."""
    parts = []
    if scenario.configured_network != scenario.network:
        ratios = {c / t for c, t in zip(scenario.configured_rho or (), (scenario.rho_leaf, scenario.rho_spine,
                                                                          scenario.rho_zone))}
        parts.append(f"rho {network_text(scenario.configured_network)}"
                     + (f" ({ratios.pop():g}x)" if len(ratios) == 1 else ""))
    if scenario.configured_share != scenario.comm_fraction:
        ratio = scenario.configured_share / scenario.comm_fraction if scenario.comm_fraction else float("inf")
        parts.append(f"comm {scenario.configured_share:g} ({ratio:g}x)")
    return ", ".join(parts) or "exact"


def parse_network(text: str) -> Network:
    """'2/4/8' -> Network(rho_leaf=2, rho_spine=4, rho_zone=8); each 1 or more."""
    try:
        values = tuple(float(v) for v in text.split("/"))
    except ValueError:
        values = ()
    if len(values) != 3 or not all(1.0 <= v <= 1000.0 for v in values):
        raise ValueError(f"network {text!r}: expected LEAF/SPINE/ZONE oversubscription, each 1 to 1000 (e.g. 2/4/8)")
    return Network(*values)


MISCONFIGURE = ("network", "share", "both")  # what a misconfiguration factor is applied to


def misconfigured(scenario: Scenario, factor: float, what: str) -> Scenario:
    """The scenario with ours configured `factor` times the truth: its levels' oversubscription
    ("network"), its communication share ("share") or both. Clamped to what a Config accepts
    (oversubscription 1 to 1000, share 0 to 1): on a 1/1/1 network "half" is 1/1/1 again."""
    if what not in MISCONFIGURE:
        raise ValueError(f"misconfigure {what!r}: expected one of {', '.join(MISCONFIGURE)}")
    rho = comm = None
    if what in ("network", "both"):
        rho = tuple(min(1000.0, max(1.0, r * factor)) for r in (scenario.rho_leaf, scenario.rho_spine,
                                                                 scenario.rho_zone))
    if what in ("share", "both"):
        comm = min(1.0, max(0.0, scenario.comm_fraction * factor))
    return replace(scenario, configured_rho=rho, configured_comm=comm)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Settings:
    spec: ClusterSpec
    cap_s: float  # longest run time drawn in version 1 streams; the warm-up in every version
    horizon_s: float  # arrivals stop here
    traces: tuple[str, ...]
    loads: tuple[float, ...]


# cap_s: version 1 streams redraw longer runs; every version measures from cap_s (the warm-up).
FULL = Settings(ClusterSpec(), cap_s=3 * 3600, horizon_s=9 * 3600,
                traces=("philly", "helios_all", "acme_seren"), loads=(0.5, 0.8, 1.2))
QUICK = Settings(ClusterSpec(zones=1, spines_per_zone=2, leaves_per_spine=2, nodes_per_leaf=4),
                 cap_s=1800, horizon_s=3 * 1800, traces=("helios_all",), loads=(0.8,))


def scenarios(settings: Settings, quick: bool, csv_path: str | None, runtime: Runtime = Runtime(),
              streams: int = STREAMS) -> list[Scenario]:
    seeds = SEEDS[:1] if quick else SEEDS
    out = [Scenario("main", t, load, seed=seed) for t in settings.traces for load in settings.loads for seed in seeds]
    if not quick:
        focus = "helios_all"
        out += [Scenario("comm", focus, 0.8, comm_fraction=f) for f in (0.0, 0.3, 0.5)]
        # Packing without placement feeding back into run times: allocation at overload.
        out += [Scenario("packing", t, 1.2, comm_fraction=0.0) for t in settings.traces]
        out += [Scenario("hardware", focus, 0.8, hardware=h) for h in HARDWARE if h != "h100"]
        out += [Scenario("network", focus, 0.8, rho_leaf=r) for r in (1.0, 4.0)]
        out += [Scenario("attribution", focus, 0.8, seed=seed) for seed in seeds]
    if csv_path:
        out.append(Scenario("replay", os.path.basename(csv_path), 0.0, csv_path=csv_path))
    return [replace(scenario, runtime=runtime, streams=streams) for scenario in out]


def workload_for(scenario: Scenario, settings: Settings) -> Workload:
    """What the simulator runs and charges: the cluster, the stream, the charged network and share."""
    spec = replace(settings.spec, hardware=HARDWARE[scenario.hardware])
    network = scenario.network
    if scenario.csv_path:
        jobs = load_csv(scenario.csv_path)
        warmup = 0.0
    else:
        jobs = sample_stream(scenario.trace, scenario.load, spec.gpus, settings.horizon_s, settings.cap_s,
                             scenario.seed, scenario.streams)
        if scenario.comm_fraction != SHARE_MEDIAN:  # version 2's own shares, scaled to the scenario's median
            jobs = [replace(job, comm_share=min(1.0, job.comm_share * scenario.comm_fraction / SHARE_MEDIAN))
                    if job.comm_share is not None else job for job in jobs]
        # Version 1: by then the longest jobs started at time 0 have ended, a steady state. Version 2
        # has no cap: the same warm-up, with jobs of days still running through it.
        warmup = settings.cap_s
    return Workload(spec, network, tuple(jobs), scenario.comm_fraction, ALLREDUCE_BYTES, scenario.seed, warmup,
                    scenario.runtime)


def policy_for(scenario: Scenario, key: str) -> Policy:
    """The policy `key` as the scenario's operator set it up: ours configured with the configured
    network and communication share (the baselines read neither)."""
    return make_policy(key, scenario.configured_network, scenario.configured_share)


def run_one(task: tuple[Scenario, str, Settings]) -> tuple[Scenario, str, report.Summary]:
    scenario, key, settings = task
    workload = workload_for(scenario, settings)
    began = time.perf_counter()
    result = run(workload, policy_for(scenario, key))
    return scenario, key, report.summarize(result, time.perf_counter() - began)


def sweep_scenarios(settings: Settings, seeds: tuple[int, ...], networks: list[Network],
                    factors: tuple[float, ...] = (), targets: tuple[str, ...] = ("network", "share"),
                    runtime: Runtime = Runtime(), streams: int = STREAMS) -> list[Scenario]:
    """The main grid's cells on each network, ours told the truth, and, for each factor and each
    of `targets` (MISCONFIGURE), ours configured that many times the truth. Configurations that
    clamp back to the truth (half of 1/1/1) are left out."""
    out: list[Scenario] = []
    for network in networks:
        for trace in settings.traces:
            for load in settings.loads:
                for seed in seeds:
                    exact = Scenario.on(network, "sweep", trace, load, seed=seed, runtime=runtime, streams=streams)
                    out.append(exact)
                    for factor in factors:
                        for what in targets:
                            wrong = misconfigured(exact, factor, what)
                            if not wrong.told_the_truth and wrong not in out:
                                out.append(wrong)
    return out


def sweep_tasks(scenarios_: list[Scenario], keys: tuple[str, ...], settings: Settings) -> list[tuple]:
    """Every key on a scenario where ours is told the truth; only ours where it is not: the
    baselines read no configuration, so their runs would repeat the exact scenario's."""
    return [(s, key, settings) for s in scenarios_ for key in keys if s.told_the_truth or key.startswith("ours")]


SINGLE_NODE = ("1", "2", "3-4", "5-8")
SWEEP_KEYS = POLICY_KEYS
VERSUS_KUEUE = ("ours-consolidated",)  # set against each Kueue mode


def _mean_jct(summary: report.Summary, buckets: tuple[str, ...]) -> float | None:
    present = [summary.buckets[b] for b in buckets if b in summary.buckets]
    jobs = sum(b.jobs for b in present)
    return sum(b.completion_s * b.jobs for b in present) / jobs if jobs else None


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(header) - 3)) + "|"]
            + ["| " + " | ".join(row) + " |" for row in rows])


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_sweep(results: dict, keys: tuple[str, ...], seeds: tuple[int, ...], settings: Settings, command: str,
                 wall_s: float, runtime: Runtime = Runtime(), streams: int = STREAMS) -> str:
    """Per cell (trace, load): each network and configuration, every policy's JCT by bucket, and
    ours' JCT against each Kueue mode's. Means over the seeds (descriptive: the tuning seeds unless
    --seeds says otherwise; the paired verdicts on fresh seeds are bench/evaluate.py's)."""
    by_cell: dict[Scenario, dict[str, list[report.Summary]]] = {}
    for (scenario, key), summary in results.items():
        by_cell.setdefault(replace(scenario, seed=0), {}).setdefault(key, []).append(summary)
    lines = ["# Network and Kueue-mode sweep", "", f"`{command}`: {wall_s:.0f} s wall; cluster "
             f"{settings.spec.describe()}; seeds {', '.join(map(str, seeds))}; {streams_text(streams)}; "
             f"{runtime_text(runtime)}.",
             "Network: oversubscription leaf/spine/zone the simulator charges (a ring across zones is divided by "
             "their product). Ours configured: what ours' Config says, against that truth. JCT in s, mean per job; "
             "'>8' is every job above one node. Baselines read no configuration: they run once per network.", ""]
    for trace in settings.traces:
        for load in settings.loads:
            cell = sorted((s for s in by_cell if (s.trace, s.load) == (trace, load)),
                          key=lambda s: (s.network.divisor(CLUSTER), s.rho_leaf, s.rho_spine, not s.told_the_truth,
                                         s.configured_rho is None, s.configured_network.divisor(CLUSTER),
                                         s.configured_share))
            if not cell:
                continue
            lines += [f"## {trace}, load {load:g}", ""]
            rows, versus = [], []
            for scenario in cell:
                runs = {key: report.combine(by_cell[scenario][key]) for key in keys if key in by_cell[scenario]}
                truth = by_cell.get(replace(scenario, configured_rho=None, configured_comm=None), {})
                for key, summary in runs.items():
                    rows.append([network_text(scenario.network), configured_text(scenario), summary.policy,
                                 *(_num(_mean_jct(summary, (b,))) for b in report.BUCKETS),
                                 _num(_mean_jct(summary, report.MULTI_NODE)),
                                 f"{report.multi_node_allreduce(summary):.1f}", f"{100 * summary.allocation:.1f}%"])
                for ours in (k for k in runs if k in VERSUS_KUEUE):
                    for kueue in (k for k in keys if k.startswith("kueue") and k in truth):
                        theirs = report.combine(truth[kueue])
                        diff = [None if a is None or b is None else a - b for a, b in (
                            (_mean_jct(runs[ours], report.MULTI_NODE), _mean_jct(theirs, report.MULTI_NODE)),
                            (_mean_jct(runs[ours], SINGLE_NODE), _mean_jct(theirs, SINGLE_NODE)))]
                        versus.append([network_text(scenario.network), configured_text(scenario),
                                       runs[ours].policy, theirs.policy, *(_num(d) for d in diff)])
            lines += _markdown_table(["network", "ours configured", "policy", *(f"JCT {b}" for b in report.BUCKETS),
                                    "JCT >8", "all-reduce ms >8", "allocation"], rows)
            if versus:
                lines += ["", "Ours minus Kueue, mean JCT s (negative: ours ahead):", ""]
                lines += _markdown_table(["network", "ours configured", "ours", "Kueue", "JCT >8", "JCT 1-8"], versus)
            lines += [""]
    return "\n".join(lines)


def run_tasks(tasks: list[tuple], processes: int) -> dict[tuple[Scenario, str], report.Summary]:
    results: dict[tuple[Scenario, str], report.Summary] = {}
    if processes == 1:
        for task in tasks:
            scenario, key, summary = run_one(task)
            results[scenario, key] = summary
    else:
        # Our core's runs are the slowest: start them first so the two workers finish together.
        tasks.sort(key=lambda t: "ours" not in t[1])
        with multiprocessing.Pool(processes) as pool:
            for scenario, key, summary in pool.imap_unordered(run_one, tasks):
                results[scenario, key] = summary
    return results


# Written after reading the numbers of a full run; the tables above it are regenerated each time.
ANALYSIS = """
## Reading the tuning-seed verdict (written after the run of 22 Nov 2026, engine.IDEAL, streams v1, network 2/4/8, Kueue preferred only; the tables above are regenerated, and under other conditions this reading is not theirs)

The rules were chosen while looking at these seeds and at 1000-1011, so this reading is in-sample; the verdict
that counts is the evaluation on fresh seeds at the top of this page (`bench/evaluate.py`).

Every shortfall above rests on a mean over 5 seeds in which ours was ahead in 1 or 2: one seed moves
a bucket's mean by up to 2x (a 256-GPU job finds a whole zone or waits for one). So each cell was
run again on 12 other seeds, ours against Kueue TAS BestFit (`bench/seed_check.py` of the time, since
replaced by `bench/evaluate.py`; seeds 1000-1011, about 5 minutes):

| trace | load | bucket | Kueue mean ms | ours mean ms | ours <= Kueue |
|---|---:|---:|---:|---:|---:|
| philly | 0.5 | 9-64 | 5.2 | 5.2 | 12/12 |
| philly | 0.8 | 9-64 | 21.8 | 19.7 | 10/12 |
| philly | 1.2 | 9-64 | 104.0 | 96.7 | 7/12 |
| helios_all | 0.5 | 9-64 | 7.7 | 6.8 | 10/12 |
| helios_all | 0.5 | 65+ | 77.9 | 69.1 | 11/12 |
| helios_all | 0.8 | 9-64 | 74.1 | 65.8 | 9/12 |
| helios_all | 0.8 | 65+ | 224.4 | 209.9 | 9/12 |
| helios_all | 1.2 | 9-64 | 96.5 | **98.1** | 6/12 |
| helios_all | 1.2 | 65+ | 264.0 | 236.3 | 9/12 |
| acme_seren | 0.5 | 9-64 | 12.5 | 12.5 | 6/12 |
| acme_seren | 0.5 | 65+ | 154.2 | **158.0** | 5/12 |
| acme_seren | 0.8 | 9-64 | 79.4 | 78.1 | 6/12 |
| acme_seren | 0.8 | 65+ | 304.9 | 297.9 | 8/12 |
| acme_seren | 1.2 | 9-64 | 165.3 | 147.0 | 6/12 |
| acme_seren | 1.2 | 65+ | 316.4 | 286.1 | 9/12 |

- Three of the four all-reduce shortfalls above (acme_seren 1.2 65+, helios_all 0.5 9-64,
  helios_all 0.8 65+) reverse on the other seeds. One holds on both: helios_all at load 1.2,
  bucket 9-64 (18% behind Kueue on the main seeds, 1.7% on the other 12); one more cell is behind
  by 2.5% on the other seeds only (acme_seren 0.5 65+). These gaps are smaller than the
  seed-to-seed spread, and their cause is not isolated: the attribution table below shows that
  neither half of our decisions alone explains a gap (each hybrid does worse than either pure
  policy).
- The allocation shortfall (helios_all 0.8, comm share 0, one seed: 2.1 points below best-fit) does
  not hold: on seeds 1000-1007 the same cell gives ours 72.8%, best-fit 72.8%, Kueue 72.7% (means;
  ours within 0.1 point of best-fit on every one of those seeds; an ad-hoc run of `run_one` on
  `Scenario("comm", "helios_all", 0.8, comm_fraction=0.0, seed=s)`).
- What changed since the previous run, where ours trailed Kueue's mean in 7 of these 15 cells on
  the same 12 seeds (by 1-37%; most in philly 0.8 9-64, helios_all 0.5 65+, acme_seren 0.5 65+
  and acme_seren 0.8 9-64, 17-37%): a job that fits one node and must open an idle node now goes
  where small jobs already run (the domain with the most partly used nodes), not into the one idle
  node of a leaf a big job holds. The old "fullest domain first" rule filled
  exactly those gaps, so when the big job ended its leaf or spine was no longer whole for the next
  big job. Kueue's name order happens to avoid this by keeping small jobs in one corner. The
  mirror rule, a job spanning nodes taking among equally fitting domains the one with fewer partly
  used nodes, added a smaller gain (about 4% at most, in 9-64 buckets, none worse by more than 1.2%).
- Against the topology-blind baselines (spread, best-fit, random) ours has the lower all-reduce of
  jobs above 8 GPUs in all 9 cells ("Every load" below: 1.2x at acme_seren 1.2 up to 43x at
  philly 0.5 lower than the best of the three), and in each bucket of the load-0.8 tables (1.4-5.6x).
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small cluster and stream; seconds, for tests")
    parser.add_argument("--out", help="directory for RESULTS.md and plots/ (default: bench/ for a full run; "
                                      "a quick run writes nothing unless given)")
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--trace-csv", help="also replay this trace (canonical CSV, see bench/traces.py)")
    sweep = parser.add_argument_group(
        "sweep (any of these runs the main grid's cells as a sweep, printed, or written to OUT/SWEEP.md with "
        "--out; RESULTS.md is not touched)")
    sweep.add_argument("--networks", nargs="+", metavar="LEAF/SPINE/ZONE",
                       help="networks the simulator charges, e.g. 1/1/1 1/2/2 2/4/8 (default: 2/4/8)")
    sweep.add_argument("--misconfigured", nargs="+", type=float, metavar="FACTOR", default=[],
                       help="also run ours configured FACTOR times the truth, e.g. 0.5 2")
    sweep.add_argument("--misconfigure", nargs="+", choices=MISCONFIGURE, default=["network", "share"],
                       help="what --misconfigured applies to, each its own run: the levels' oversubscription, "
                            "the communication share, or both at once (default: network share)")
    sweep.add_argument("--kueue-modes", action="store_true",
                       help=f"also run {', '.join(KUEUE_MODE_KEYS)} (policies.KueueBestFit)")
    sweep.add_argument("--seeds", nargs="+", type=int, metavar="SEED",
                       help="the sweep's seeds (default: the first of simulate.SEEDS with --quick, else all five)")
    add_runtime_arguments(parser)
    args = parser.parse_args(argv)
    if args.processes < 1:
        parser.error(f"--processes {args.processes}: must be 1 or more")
    runtime = runtime_of(parser, args)
    if args.networks or args.misconfigured or args.kueue_modes or args.seeds:
        if args.trace_csv:
            parser.error("--trace-csv is not part of a sweep")
        try:
            networks = [parse_network(text) for text in args.networks or ["2/4/8"]]
        except ValueError as err:
            parser.error(str(err))
        if any(f <= 0 for f in args.misconfigured):
            parser.error("--misconfigured: factors must be above 0")
        return run_sweep(args, networks, runtime)
    if args.trace_csv:
        try:
            load_csv(args.trace_csv)
        except TraceError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    settings = QUICK if args.quick else FULL
    out_dir = args.out or (None if args.quick else os.path.dirname(os.path.abspath(__file__)))
    tasks = [(s, key, settings) for s in scenarios(settings, args.quick, args.trace_csv, runtime, args.streams)
             for key in s.policies]
    began = time.perf_counter()
    results = run_tasks(tasks, args.processes)
    wall = time.perf_counter() - began
    command = " ".join([".venv/bin/python bench/simulate.py"] + (["--quick"] if args.quick else []) + (
        [f"--trace-csv {args.trace_csv}"] if args.trace_csv else []) + runtime_flags(runtime)
        + streams_flags(args.streams))
    context = report.Context(command=command, seeds=SEEDS[:1] if args.quick else SEEDS, spec=settings.spec,
                             cap_s=settings.cap_s, horizon_s=settings.horizon_s, allreduce_bytes=ALLREDUCE_BYTES,
                             main_comm=MAIN_COMM, wall_s=wall, processes=args.processes, runtime=runtime,
                             streams=args.streams,
                             machine=f"{platform.machine()}, {os.cpu_count()} cores, "
                                     f"Python {platform.python_version()}")
    text = report.render(results, POLICY_KEYS, context, ANALYSIS)
    if out_dir:
        os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
        path = os.path.join(out_dir, "RESULTS.md")
        kept = []
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                kept = report.generated_sections(handle.read())  # the evaluations' verdicts are not this run's
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        for label, section in reversed(kept):  # each goes in after the title: reversed keeps their order
            report.write_into(path, section, label)
        report.plot(results, POLICY_KEYS, os.path.join(out_dir, "plots"))
        print(f"wrote {path} (keeping {len(kept)} evaluation section(s)) and plots/ in {wall:.0f} s")
    else:
        print(text)
    return 0


def run_sweep(args: argparse.Namespace, networks: list[Network], runtime: Runtime) -> int:
    settings = QUICK if args.quick else FULL
    seeds = tuple(args.seeds or (SEEDS[:1] if args.quick else SEEDS))
    keys = SWEEP_KEYS + (KUEUE_MODE_KEYS if args.kueue_modes else ())
    targets = tuple(dict.fromkeys(args.misconfigure))
    tasks = sweep_tasks(sweep_scenarios(settings, seeds, networks, tuple(args.misconfigured), targets, runtime,
                                        args.streams), keys, settings)
    began = time.perf_counter()
    results = run_tasks(tasks, args.processes)
    wall = time.perf_counter() - began
    command = " ".join([".venv/bin/python bench/simulate.py"] + (["--quick"] if args.quick else []) + (
        ["--networks", *map(network_text, networks)] if args.networks else []) + (
        ["--misconfigured", *(f"{f:g}" for f in args.misconfigured), "--misconfigure", *targets]
        if args.misconfigured else []) + (["--kueue-modes"] if args.kueue_modes else []) + (
        ["--seeds", *map(str, seeds)] if args.seeds else []) + runtime_flags(runtime) + streams_flags(args.streams))
    text = render_sweep(results, keys, seeds, settings, command, wall, runtime, args.streams)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "SWEEP.md")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")
        print(f"wrote {path}: {len(tasks)} runs in {wall:.0f} s")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
