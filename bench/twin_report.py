"""What bench/twin.py prints: the replays, the scorecard of the twin and of the simulator on the same
cut streams (bench/scorecard.py, from report.summarize), mean JCT per size bucket, and the fidelity
table (bench/twin_model.py): per job and policy, the simulator's start and domain against the twin's."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import report, scorecard, simulate
from .engine import RunResult, Workload
from .fabric import SimCluster
from .twin_kube import KUEUE_MODES, OURS
from .twin_model import Fidelity, FidelityRow, Placed, fidelity, fidelity_rows, placements
from .twin_replay import Replayed

SHOWN = 40  # disagreements printed; fidelity.tsv has every row


@dataclass
class Stream:
    trace: str
    seed: int
    scenario: simulate.Scenario
    workload: Workload
    foreign: frozenset[str]
    simulated: dict[str, RunResult] = field(default_factory=dict)
    twin: dict[str, RunResult] = field(default_factory=dict)
    outcomes: dict[str, Replayed] = field(default_factory=dict)

    def rows(self, key: str) -> list[FidelityRow]:
        cluster = SimCluster(self.workload.spec)
        return fidelity_rows(self.workload.jobs, self.foreign, placements(self.simulated[key], cluster),
                             placements(self.twin[key], cluster))


def render(streams: list[Stream], policies: tuple[str, ...], seeds: list[int], command: str, wall_s: float,
           machine: str) -> tuple[str, str]:
    """The report (Markdown) and the fidelity table (tab-separated, every job)."""
    network = simulate.network_text(streams[0].scenario.network)
    jobs = len(streams[0].workload.jobs)
    lines = [f"## The twin: {len(seeds)} seeds x {', '.join(dict.fromkeys(s.trace for s in streams))}, load "
             f"{streams[0].scenario.load:g}, network {network}, the first {jobs} jobs of each stream", "",
             f"`{command}`: {wall_s / 60:.1f} min wall on {machine}. 512 GPUs (64 KWOK nodes of 8, 2 zones x 2 spines "
             f"x 2 leaves x 8 nodes), the real kube-apiserver, kube-scheduler and kube-controller-manager v1.37.2, "
             f"one replica of ours or Kueue v0.17.0; {simulate.streams_text(streams[0].scenario.streams)}; "
             f"{simulate.runtime_text(streams[0].scenario.runtime)}.", "", "### Replays", "",
             "| trace | seed | policy | events | wall s | virtual s | of it skipped | not started | stalls |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for stream in streams:
        for key in policies:
            o, r = stream.outcomes[key], stream.twin[key]
            lines.append(f"| {stream.trace} | {stream.seed} | {key} | {o.events} | {o.wall_s:.0f} | {o.virtual_s:,.0f} | "
                         f"{o.skipped_s:,.0f} | {r.unstarted + r.foreign_unstarted}"
                         f"{' (timed out)' if o.timed_out else ''} | {o.stalls} |")
    lines += [""] + scorecards(streams, policies, seeds, network) + buckets(streams, policies)
    text, table = fidelity_section(streams, policies)
    return "\n".join(lines + text) + "\n", table


def summaries(streams: list[Stream], policies: tuple[str, ...], side: str) -> dict[tuple, report.Summary]:
    return {(s.trace, s.scenario.load, s.seed, key): report.summarize(getattr(s, side)[key], 0.0)
            for s in streams for key in policies}


def scorecards(streams: list[Stream], policies: tuple[str, ...], seeds: list[int], network: str) -> list[str]:
    """The scorecard of the twin and the simulator's on the same cut streams, and where they part."""
    against = [key for key in KUEUE_MODES if key in policies]
    if OURS not in policies or not against:
        return ["(no scorecard: it needs ours and a Kueue mode)", ""]
    cells = list(dict.fromkeys((s.trace, s.scenario.load) for s in streams))
    rows = {side: scorecard.scorecard(summaries(streams, policies, side), cells, seeds, OURS, against,
                                      scorecard.rng_for(seeds, network))
            for side in ("twin", "simulated")}
    out = ["### Scorecard of the twin", "", scorecard.render(rows["twin"], network),
           "### Scorecard of the simulator, the same cut streams", "", scorecard.render(rows["simulated"], network),
           "### Where the verdicts moved (twin against simulator)", "",
           "| trace | metric | against | bucket | twin | simulator | moved |", "|---|---|---|---|---|---|---:|"]
    for mine, theirs in zip(rows["twin"], rows["simulated"]):
        scale = 1 if mine.metric == "M4" else 100
        out.append(f"| {mine.trace} | {mine.metric} | {scorecard.NAMES.get(mine.against, mine.against)} | "
                   f"{mine.bucket} | {scorecard.cell_text(mine)} | {scorecard.cell_text(theirs)} | "
                   f"{scale * (mine.scored.estimate - theirs.scored.estimate):+.1f}"
                   f"{'' if mine.metric == 'M4' else ' pp'} |")
    return out + [""]


def buckets(streams: list[Stream], policies: tuple[str, ...]) -> list[str]:
    """Mean JCT per size bucket over the seeds, twin / simulator."""
    out = ["### Mean JCT per size bucket, s: twin / simulator", "",
           "| trace | policy | " + " | ".join(report.BUCKETS) + " | all |",
           "|---|---|" + "---:|" * (len(report.BUCKETS) + 1)]
    for trace in dict.fromkeys(s.trace for s in streams):
        mine = [s for s in streams if s.trace == trace]
        for key in policies:
            pair = [report.combine([report.summarize(getattr(s, side)[key], 0.0) for s in mine])
                    for side in ("twin", "simulated")]
            cells = [" / ".join(f"{p.buckets[b].completion_s:,.0f}" if b in p.buckets else "-" for p in pair)
                     for b in report.BUCKETS]
            out.append(f"| {trace} | {key} | " + " | ".join(cells) + f" | {pair[0].completion_s:,.0f} / "
                       f"{pair[1].completion_s:,.0f} |")
    return out + [""]


def _fidelity_line(label: str, f: Fidelity) -> str:
    share = f"{100 * f.same_domain / f.jobs:.0f}%" if f.jobs else "-"
    level = f"{100 * f.same_level / f.jobs:.0f}%" if f.jobs else "-"
    within = f"{100 * f.within_1s / f.compared:.0f}%" if f.compared else "-"
    return (f"| {label} | {f.jobs} | {share} | {level} | {f.compared} | {within} | {f.error_p50_s:,.1f} | "
            f"{f.error_p90_s:,.1f} | {f.error_max_s:,.1f} | {f.mean_error_s:+,.1f} | {f.only_simulated} / {f.only_twin} |")


def fidelity_section(streams: list[Stream], policies: tuple[str, ...]) -> tuple[list[str], str]:
    header = ["| runs | jobs | same domain | same level | started in both | start within 1 s | |error| p50 s "
              "| p90 s | max s | mean error s | started in one only (sim / twin) |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    rows = {(s.trace, s.seed, key): s.rows(key) for s in streams for key in policies}
    out = ["### Fidelity: each job's start and domain, simulator against twin", "",
           "Domain: the narrowest one holding the job's pods (node, leaf, spine, zone or cluster). Error: the twin's "
           "start minus the simulator's (virtual seconds). Every job of the cut streams, ours and foreign.", ""]
    out += header + [_fidelity_line(key, fidelity([r for (_, _, k), rs in rows.items() if k == key for r in rs]))
                     for key in policies]
    out += ["", "Per stream:", ""] + header + [
        _fidelity_line(f"{trace} {seed} {key}", fidelity(rs)) for (trace, seed, key), rs in rows.items()]
    notes = {(s.trace, s.seed, key): s.outcomes[key].notes for s in streams for key in policies}
    disagreements = [(where, r) for where, rs in rows.items() for r in rs
                     if not r.same_domain or r.error_s is None or abs(r.error_s) > 1.0]
    out += ["", f"Disagreements: {len(disagreements)} (the first {min(SHOWN, len(disagreements))}; fidelity.tsv has "
                "every job):", "",
            "| trace | seed | policy | job | GPUs | foreign | simulator start, domain | twin start, domain | twin's placer said |",
            "|---|---:|---|---|---:|---|---|---|---|"]
    for (trace, seed, key), r in disagreements[:SHOWN]:
        out.append(f"| {trace} | {seed} | {key} | {r.job.job_id} | {r.job.gpus} ({r.job.pods}x{r.job.gpus_per_pod}) | "
                   f"{'yes' if r.foreign else ''} | {_placed(r.simulated)} | {_placed(r.twin)} | "
                   f"{notes[trace, seed, key].get(r.job.job_id, '')[:120]} |")
    table = ["trace\tseed\tpolicy\tjob\tpods\tgpus_per_pod\tforeign\tsubmit_s\tsim_start_s\tsim_domain\ttwin_start_s"
             "\ttwin_domain\terror_s\tsame_domain\ttwin_note"]
    for (trace, seed, key), rs in rows.items():
        for r in rs:
            table.append("\t".join(map(str, (trace, seed, key, r.job.job_id, r.job.pods, r.job.gpus_per_pod,
                                             int(r.foreign), f"{r.job.submit_s:.3f}", _num(r.simulated.start_s),
                                             r.simulated.domain or "", _num(r.twin.start_s), r.twin.domain or "",
                                             _num(r.error_s), int(r.same_domain),
                                             notes[trace, seed, key].get(r.job.job_id, "").replace("\t", " ")))))
    return out + [""], "\n".join(table) + "\n"


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def _placed(placed: Placed) -> str:
    return "not started" if placed.start_s is None else f"{placed.start_s:,.1f} s, {placed.domain}"
