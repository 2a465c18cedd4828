"""The scorecard (issue 60): what users weigh a cluster by, per (network, trace, load) cell, ours against
each Kueue mode on the same held-out streams.

- **M1** mean job completion time (JCT) over all of ours' jobs: "don't hurt the many".
- **M2** GPU-time-weighted JCT: the sum over size buckets of the bucket's share of GPU time (at each
  job's tightest placement, report.BucketStats.weight_share) x the bucket's mean JCT: "speed up the big".
- **M3** no size bucket more than 10% slower (mean JCT) than under Kueue preferred: no class sacrificed.
- **M4** useful allocation at overload (load above 1): GPU time counted at each job's tightest speed,
  as report.py counts it (engine.RunResult.useful_allocation), in GPU-% points.

Each comparison pairs ours and one Kueue mode over the streams (seeds) of one cell. M1-M3 compare the
ratio of the two means (ours / theirs - 1, resampled as a ratio), M4 the mean difference in points.
A paired bootstrap resamples the streams; the p-values of the resamples falling on either side of
the margin are Holm-adjusted within one family (one network x one metric: `score` is called per
network), and each interval is the percentile interval at the level Holm gives its row, so it
lies wholly beyond the margin exactly when the verdict is ahead or behind. The margin is 1% for M1 and
M2 and 1 point for M4: a difference must be larger than it, with 99% family-wise confidence, to be
ahead or behind; anything else is level, "wide" when the interval reaches past the margin (the
streams cannot tell). M3's line is +10%: a bucket breaks it when its interval lies wholly above,
holds when wholly below, and is unsettled otherwise. docs/design/evaluation.md says why this replaced
per-bucket dominance. The resamples are drawn from a generator seeded by the seeds, so a scorecard
is reproduced from its seeds alone.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from .protocol import holm_steps
from .report import BUCKETS, Summary

ALPHA = 0.01  # family-wise error of each family's verdicts: intervals at 99%
RESAMPLES = 20_000  # enough for Holm at 99% over the 54 rows of M3's family: alpha / (2 x 54) x 20,000 = 1.85
MARGIN = 0.01  # M1, M2: a relative difference within 1% is level
POINTS = 1.0  # M4: within 1 GPU-% point is level
SLOWER = 0.10  # M3: no bucket more than 10% slower than under Kueue preferred
PREFERRED = "kueue"
METRICS = ("M1", "M2", "M3", "M4")
AHEAD, LEVEL, BEHIND = "ahead", "level", "behind"
HOLDS, UNSETTLED, BREAKS = "holds", "unsettled", "breaks"  # M3's words for ahead, level and behind


def mean_jct(summary: Summary) -> float:
    """M1: mean submit-to-finish time over every job of ours that ran (foreign jobs are apart)."""
    return summary.completion_s


def weighted_jct(summary: Summary) -> float:
    """M2: each bucket's mean JCT weighted by its share of GPU time (at the tightest placement), summed."""
    return sum(stats.weight_share * stats.completion_s for stats in summary.buckets.values())


def useful_points(summary: Summary) -> float:
    """M4: useful allocation in GPU-% points."""
    return 100 * summary.useful_allocation


@dataclass(frozen=True)
class Pairs:
    """One comparison: ours[i] and theirs[i] ran stream i. `relative`: the statistic is mean(ours) /
    mean(theirs) - 1, else mean(ours - theirs). Verdicts read the cost (the statistic, negated when
    higher is better): ahead below `ahead_below`, behind above `behind_above`."""
    ours: tuple[float, ...]
    theirs: tuple[float, ...]
    relative: bool
    ahead_below: float
    behind_above: float
    higher_is_better: bool = False


@dataclass(frozen=True)
class Scored:
    estimate: float  # ours against theirs on every stream: a share (M1-M3, +0.05 is 5% more) or points (M4)
    low: float  # the percentile interval of that estimate at the row's Holm-adjusted level
    high: float
    p: float  # Holm-adjusted p-value of "within the margin" (two-sided)
    verdict: str  # ahead, level or behind
    wide: bool  # level, but the interval reaches past the margin: the streams cannot tell
    wins: int  # streams on which ours was strictly better
    n: int
    family_size: int


def _statistic(pairs: Pairs) -> Callable[[Sequence[int]], float]:
    ours, theirs, sign = pairs.ours, pairs.theirs, -1.0 if pairs.higher_is_better else 1.0
    if pairs.relative:
        return lambda idx: sign * (sum(map(ours.__getitem__, idx)) / sum(map(theirs.__getitem__, idx)) - 1)
    diffs = [o - t for o, t in zip(ours, theirs)]
    return lambda idx: sign * sum(map(diffs.__getitem__, idx)) / len(idx)


def resample_indices(n: int, count: int, rng: random.Random) -> list[tuple[int, ...]]:
    """`count` draws of n stream indices with replacement."""
    choices = range(n)
    return [tuple(rng.choices(choices, k=n)) for _ in range(count)]


def score(comparisons: Sequence[tuple[Pairs, tuple]], rng: random.Random, resamples: int = RESAMPLES,
          alpha: float = ALPHA) -> list[Scored]:
    """The verdict of each (Pairs, family) comparison, Holm-adjusted within its family. Every
    comparison of n streams is resampled with the same `resamples` index draws."""
    draws: dict[int, list[tuple[int, ...]]] = {}
    costs, pvalues = [], []
    for pairs, _ in comparisons:
        n = len(pairs.ours)
        if n != len(pairs.theirs) or not n:
            raise ValueError(f"need equally many paired values, at least one: {n} and {len(pairs.theirs)}")
        if n not in draws:
            draws[n] = resample_indices(n, resamples, rng)
        statistic = _statistic(pairs)
        sample = sorted(round(statistic(idx), 12) for idx in draws[n])
        costs.append(sample)
        not_behind = bisect.bisect_right(sample, pairs.behind_above) / resamples
        not_ahead = (resamples - bisect.bisect_left(sample, pairs.ahead_below)) / resamples
        pvalues.append(min(1.0, 2 * min(not_behind, not_ahead)))
    families: dict[tuple, list[int]] = {}
    for i, (_, family) in enumerate(comparisons):
        families.setdefault(family, []).append(i)
    scored: list[Scored | None] = [None] * len(comparisons)
    for members in families.values():
        for i, (adjusted, factor) in zip(members, holm_steps([pvalues[i] for i in members])):
            pairs, sample = comparisons[i][0], costs[i]
            k = min((resamples - 1) // 2, math.floor(alpha * resamples / (2 * factor)))
            low, high = sample[k], sample[resamples - 1 - k]
            verdict = BEHIND if low > pairs.behind_above else AHEAD if high < pairs.ahead_below else LEVEL
            point = _statistic(pairs)(range(len(pairs.ours)))
            sign = -1.0 if pairs.higher_is_better else 1.0
            better = sum((o - t) * sign < 0 for o, t in zip(pairs.ours, pairs.theirs))
            scored[i] = Scored(sign * point, *sorted((sign * low, sign * high)), adjusted, verdict,
                               verdict == LEVEL and (low < pairs.ahead_below or high > pairs.behind_above),
                               better, len(pairs.ours), len(members))
    return [s for s in scored if s is not None]


@dataclass(frozen=True)
class Row:
    trace: str
    load: float
    metric: str  # M1 to M4
    against: str  # a Kueue mode's key
    bucket: str  # M3's size bucket, "" for the others
    scored: Scored

    @property
    def word(self) -> str:
        """The verdict in the metric's words: M3 holds, is unsettled or breaks."""
        if self.metric == "M3":
            return {AHEAD: HOLDS, LEVEL: UNSETTLED, BEHIND: BREAKS}[self.scored.verdict]
        return self.scored.verdict


def scorecard(results: dict, cells, seeds, ours: str, against: Sequence[str], rng: random.Random,
              resamples: int = RESAMPLES) -> list[Row]:
    """Rows of one network: results[trace, load, seed, key] is a Summary; every metric of `ours`
    against each of `against` (M3 against Kueue preferred only, when it is there), one Holm family
    per metric (and per `ours`, so that candidates called one by one never share a family)."""
    keys: list[tuple] = []
    comparisons: list[tuple[Pairs, tuple]] = []

    def add(trace, load, metric, mode, bucket, values, **how) -> None:
        if values:
            keys.append((trace, load, metric, mode, bucket))
            comparisons.append((Pairs(tuple(v[0] for v in values), tuple(v[1] for v in values), **how),
                                (ours, metric)))

    for trace, load in cells:
        runs = {key: [results[trace, load, s, key] for s in seeds] for key in (ours, *against)}
        for mode in against:
            for metric, value in (("M1", mean_jct), ("M2", weighted_jct)):
                add(trace, load, metric, mode, "", [(value(o), value(t)) for o, t in zip(runs[ours], runs[mode])],
                    relative=True, ahead_below=-MARGIN, behind_above=MARGIN)
            if load > 1:
                add(trace, load, "M4", mode, "", [(useful_points(o), useful_points(t))
                                                  for o, t in zip(runs[ours], runs[mode])],
                    relative=False, ahead_below=-POINTS, behind_above=POINTS, higher_is_better=True)
        if PREFERRED in against:
            for bucket in BUCKETS:
                add(trace, load, "M3", PREFERRED, bucket,
                    [(o.buckets[bucket].completion_s, t.buckets[bucket].completion_s)
                     for o, t in zip(runs[ours], runs[PREFERRED]) if bucket in o.buckets and bucket in t.buckets],
                    relative=True, ahead_below=SLOWER, behind_above=SLOWER)
    return [Row(*key, scored) for key, scored in zip(keys, score(comparisons, rng, resamples))]


def rng_for(seeds: Sequence[int], network: str) -> random.Random:
    """The bootstrap's generator: seeded by the streams and the network, so a scorecard is reproducible."""
    return random.Random(f"scorecard {network} {' '.join(map(str, sorted(seeds)))}")


# ---- rendering -----------------------------------------------------------------------------------

NAMES = {"kueue": "Kueue preferred", "kueue-required": "Kueue required", "kueue-strict": "Kueue StrictFIFO"}
LOADED = 0.8  # the must-holds' loaded cells: load 0.8 and above


def _share(x: float) -> str:
    return f"{100 * x:+.1f}%"


def cell_text(row: Row) -> str:
    """`-3.7% [-9.0, +1.5] level`: the estimate (a share; points for M4), its Holm-adjusted interval and
    the verdict, "wide" when level with an interval reaching past the margin."""
    s, scale, unit = row.scored, (1 if row.metric == "M4" else 100), ("" if row.metric == "M4" else "%")
    word = row.word + (", wide" if s.wide and row.metric != "M3" else "")
    return f"{scale * s.estimate:+.1f}{unit} [{scale * s.low:+.1f}, {scale * s.high:+.1f}] {word}"


def cell_m3(rows: list[Row]) -> str:
    """A cell's M3: its slowest bucket against Kueue preferred, and how many buckets hold, are unsettled, break."""
    if not rows:
        return ""
    worst = max(rows, key=lambda r: r.scored.estimate)
    counts = {word: sum(r.word == word for r in rows) for word in (HOLDS, UNSETTLED, BREAKS)}
    return (f"{worst.bucket}: {cell_text(worst)}; " + ", ".join(f"{n} {w}" for w, n in counts.items() if n))


def render(rows: list[Row], network: str) -> str:
    """One network's scorecard: a row per cell and Kueue mode, then each mode's tally."""
    modes = list(dict.fromkeys(r.against for r in rows if r.metric != "M3"))
    lines = [f"| trace | load | against | M1 mean JCT | M2 GPU-time-weighted JCT | M4 useful allocation, points "
             f"| M3 slowest bucket against Kueue preferred (network {network}) |",
             "|---|---:|---|---|---|---|---|"]
    cells = list(dict.fromkeys((r.trace, r.load) for r in rows))
    for trace, load in cells:
        mine = [r for r in rows if (r.trace, r.load) == (trace, load)]
        for mode in modes:
            found = {r.metric: cell_text(r) for r in mine if r.against == mode and r.metric != "M3"}
            m3 = cell_m3([r for r in mine if r.metric == "M3"]) if mode == PREFERRED else ""
            lines.append(f"| {trace} | {load:g} | {NAMES.get(mode, mode)} | {found.get('M1', '')} | "
                         f"{found.get('M2', '')} | {found.get('M4', '')} | {m3} |")
    lines.append("")
    for mode in modes:
        lines.append(f"- against {NAMES.get(mode, mode)}: " + "; ".join(
            f"{metric} " + tally([r for r in rows if r.against == mode and r.metric == metric])
            for metric in ("M1", "M2", "M4")))
    m3 = [r for r in rows if r.metric == "M3"]
    if m3:
        lines.append(f"- M3 against {NAMES[PREFERRED]}, {len(m3)} (cell, bucket) rows: "
                     + ", ".join(f"{sum(r.word == w for r in m3)} {w}" for w in (HOLDS, UNSETTLED, BREAKS))
                     + f"; slowest {max(m3, key=lambda r: r.scored.estimate).bucket} at "
                       f"{_share(max(r.scored.estimate for r in m3))}")
    families = dict.fromkeys((r.metric, r.scored.family_size) for r in rows)
    lines.append("- Holm families (this network): " + ", ".join(f"{metric} {size}" for metric, size in families)
                 + " comparisons.")
    return "\n".join(lines) + "\n"


def tally(rows: list[Row]) -> str:
    """`ahead 2, level 7 (3 wide), behind 0 of 9`."""
    wide = sum(r.scored.wide for r in rows)
    return (f"ahead {sum(r.word == AHEAD for r in rows)}, level {sum(r.word == LEVEL for r in rows)}"
            + (f" ({wide} wide)" if wide else "") + f", behind {sum(r.word == BEHIND for r in rows)} of {len(rows)}")


def ahead_of_every_mode(rows: list[Row], metric: str, modes: Sequence[str]) -> list[tuple[str, float]]:
    """The loaded cells where `metric` is ahead against every one of `modes`."""
    cells = dict.fromkeys((r.trace, r.load) for r in rows if r.load >= LOADED)
    return [cell for cell in cells
            if all(any(r.word == AHEAD for r in rows if (r.trace, r.load) == cell and r.metric == metric
                       and r.against == mode) for mode in modes)]


def summary(by_network: dict[str, list[Row]]) -> str:
    """The table README states: network x Kueue mode, M1, M2 and M4 counts of ahead / level / behind,
    with M2's loaded cells ahead of every mode, and M3 per network."""
    lines = ["| network | against | M1 mean JCT | M2 GPU-time-weighted JCT | M4 useful allocation at overload |",
             "|---|---|---|---|---|"]
    for network, rows in by_network.items():
        for mode in dict.fromkeys(r.against for r in rows if r.metric != "M3"):
            lines.append(f"| {network} | {NAMES.get(mode, mode)} | " + " | ".join(
                "{} / {} / {}".format(*(sum(r.word == w for r in rows if r.against == mode and r.metric == metric)
                                        for w in (AHEAD, LEVEL, BEHIND))) for metric in ("M1", "M2", "M4")) + " |")
    return "\n".join(lines) + "\n"


def must_holds(by_network: dict[str, list[Row]]) -> list[str]:
    """Issue 60's must-holds, each with whether these rows meet it."""
    out = []
    behind = [(n, r) for n, rows in by_network.items() for r in rows if r.metric in ("M1", "M2") and r.word == BEHIND]
    out.append(f"M1 and M2 behind no Kueue mode in any cell: {'met' if not behind else 'NOT met'}"
               + "".join(f"; {n} {r.trace} {r.load:g} {r.metric} against {NAMES.get(r.against, r.against)} "
                         f"{cell_text(r)}" for n, r in behind))
    for network, need in (("2/4/8", 4), ("1/2/2", 1)):
        rows = by_network.get(network)
        if rows:
            modes = list(dict.fromkeys(r.against for r in rows if r.metric == "M2"))
            cells = ahead_of_every_mode(rows, "M2", modes)
            loaded = len(dict.fromkeys((r.trace, r.load) for r in rows if r.load >= LOADED))
            out.append(f"M2 ahead of every Kueue mode in at least {need} of the {loaded} loaded cells on {network}: "
                       f"{'met' if len(cells) >= need else 'NOT met'} ({len(cells)}"
                       + "".join(f"; {t} {load:g}" for t, load in cells) + ")")
    m3 = [(n, r) for n, rows in by_network.items() for r in rows if r.metric == "M3"]
    broken = [(n, r) for n, r in m3 if r.word == BREAKS]
    over = [(n, r) for n, r in m3 if r.scored.estimate > SLOWER]
    out.append(f"M3 no bucket more than {100 * SLOWER:g}% slower than Kueue preferred: "
               + ("met" if not broken else "NOT met") + f" ({len(broken)} break"
               + "".join(f"; {n} {r.trace} {r.load:g} {r.bucket} {cell_text(r)}" for n, r in broken)
               + f"; {len(over)} of {len(m3)} with an estimate above {100 * SLOWER:g}%, not shown"
               + "".join(f": {n} {r.trace} {r.load:g} {r.bucket} {cell_text(r)}" for n, r in over if r.word != BREAKS)
               + ")")
    m4 = [(n, r) for n, rows in by_network.items() for r in rows if r.metric == "M4" and r.word == BEHIND]
    out.append(f"M4 useful allocation at overload not below any Kueue mode ({POINTS:g}-point margin): "
               + ("met" if not m4 else "NOT met")
               + "".join(f"; {n} {r.trace} {r.load:g} against {NAMES.get(r.against, r.against)} {cell_text(r)}"
                         for n, r in m4))
    return out


def plot(by_network: dict[str, list[Row]], path: str) -> None:
    """M1 and M2 of every cell against each Kueue mode, with their Holm-adjusted intervals: one panel
    per network and metric (matplotlib, the bench extra)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = ("M1", "M2")
    fig, axes = plt.subplots(len(metrics), len(by_network), figsize=(4.2 * len(by_network), 6.4), sharey="row",
                             squeeze=False)
    colours = {"kueue": "tab:blue", "kueue-required": "tab:orange", "kueue-strict": "tab:green"}
    for column, (network, rows) in enumerate(by_network.items()):
        cells = list(dict.fromkeys((r.trace, r.load) for r in rows))
        modes = list(dict.fromkeys(r.against for r in rows if r.metric != "M3"))
        for line, metric in enumerate(metrics):
            ax = axes[line][column]
            ax.axhspan(-100 * MARGIN, 100 * MARGIN, color="0.85", zorder=0)
            ax.axhline(0, color="0.4", linewidth=0.8)
            for m, mode in enumerate(modes):
                found = {(r.trace, r.load): r.scored for r in rows if r.metric == metric and r.against == mode}
                xs = [i + (m - (len(modes) - 1) / 2) * 0.22 for i, cell in enumerate(cells) if cell in found]
                got = [found[cell] for cell in cells if cell in found]
                ax.errorbar(xs, [100 * s.estimate for s in got],
                            yerr=[[100 * (s.estimate - s.low) for s in got], [100 * (s.high - s.estimate) for s in got]],
                            fmt="o", markersize=3.5, capsize=2, linewidth=1, color=colours.get(mode),
                            label=f"against {NAMES.get(mode, mode)}")
            ax.set_xticks(range(len(cells)))
            ax.set_xticklabels([f"{t.split('_')[0]}\n{load:g}" for t, load in cells], fontsize=7)
            ax.set_title(f"{metric}, network {network}", fontsize=9)
            if column == 0:
                ax.set_ylabel(f"{metric}: ours / Kueue - 1, % (lower is better)", fontsize=8)
    axes[0][0].legend(fontsize=7, loc="lower left")
    fig.suptitle("Ours against Kueue TAS: mean JCT (M1) and GPU-time-weighted JCT (M2), paired bootstrap, "
                 f"Holm-adjusted {100 * (1 - ALPHA):g}% intervals; grey: the {100 * MARGIN:g}% margin", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
