"""The evaluation protocol's statistics: paired differences, a bootstrap interval and a verdict, and Holm's step-down
(holm_steps), which bench/evaluate.py's detail rows and bench/scorecard.py both adjust their families with.

Each evaluation seed gives one stream that ours and a baseline both run, so their difference on
that stream is one observation; seeds are independent draws. The verdict reads the 95% bootstrap
interval of the mean difference: "ahead" only if all of it lies on our side, "behind" only if all
of it lies on theirs, anything else "level" (the seeds cannot tell them apart).
"""
from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Sequence

RESAMPLES = 4000
LEVEL = 0.95


@dataclass(frozen=True)
class Paired:
    mean: float  # mean of ours - theirs
    low: float
    high: float
    wins: int  # streams on which ours was strictly better
    n: int
    verdict: str  # ahead, level or behind


def compare(ours: list[float], theirs: list[float], rng: random.Random, lower_is_better: bool = True,
            resamples: int = RESAMPLES, level: float = LEVEL) -> Paired:
    """Paired comparison of two policies over the same streams (ours[i] and theirs[i] share stream i)."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"need equally many paired values, at least one: {len(ours)} and {len(theirs)}")
    # Rounded: means summed in another order differ by float noise (1e-13), which must not count
    # as a difference when the streams ran alike.
    diffs = [round(o - t, 9) for o, t in zip(ours, theirs)]
    n = len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    tail = (1 - level) / 2
    low, high = means[int(tail * resamples)], means[min(resamples - 1, int((1 - tail) * resamples))]
    better = (lambda d: d < 0) if lower_is_better else (lambda d: d > 0)
    if better(high) and better(low):
        verdict = "ahead"
    elif better(-low) and better(-high):
        verdict = "behind"
    else:
        verdict = "level"
    return Paired(statistics.fmean(diffs), low, high, sum(map(better, diffs)), n, verdict)


def holm_steps(pvalues: Sequence[float]) -> list[tuple[float, float]]:
    """(adjusted p-value, factor) of each p-value of one family, in their order. Holm's step-down:
    with p(1) <= ... <= p(m) sorted, the k-th is adjusted to min(1, max over j <= k of
    (m - j + 1) p(j)). The factor c is that maximum over p(k) itself (m - k + 1 <= c <= m): a test
    or interval at level alpha / c rejects exactly when the adjusted p-value is at most alpha."""
    m = len(pvalues)
    steps = [(1.0, float(m))] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: pvalues[i]), 1):
        running = max(running, (m - rank + 1) * pvalues[i])
        steps[i] = (min(1.0, running), running / pvalues[i] if pvalues[i] > 0 else float(m - rank + 1))
    return steps
