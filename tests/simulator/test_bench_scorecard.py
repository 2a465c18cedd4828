"""bench/scorecard.py's arithmetic on hand-computed cases: the four metrics, the bootstrap's verdicts
with their margins and Holm, and the must-holds read from rows. No simulation runs.

The bootstrap is made exact where a case is computed by hand: `Exhaustive` hands out every one of the
n**n resamples of n streams once, so a share of resamples is a count over all of them."""
import itertools
import random
from types import SimpleNamespace

import pytest

from bench import scorecard
from bench.scorecard import Pairs


class Exhaustive:
    """Stands in for random.Random in resample_indices: every index tuple of n streams, in turn."""

    def __init__(self) -> None:
        self.draws = None

    def choices(self, population, k):
        if self.draws is None:
            self.draws = itertools.cycle(itertools.product(population, repeat=k))
        return list(next(self.draws))


def relative(ours, theirs, margin=scorecard.MARGIN) -> Pairs:
    return Pairs(tuple(ours), tuple(theirs), relative=True, ahead_below=-margin, behind_above=margin)


def exact(*comparisons, alpha=scorecard.ALPHA, streams=2):
    """Score (Pairs, family) comparisons of `streams` streams over all streams**streams resamples."""
    return scorecard.score(comparisons, Exhaustive(), resamples=streams ** streams, alpha=alpha)


def summary(completion_s=0.0, useful=0.0, buckets=()):
    """A run's summary as the scorecard reads it: buckets {name: (GPU-time share, mean JCT)}."""
    return SimpleNamespace(completion_s=completion_s, useful_allocation=useful, buckets={
        name: SimpleNamespace(weight_share=share, completion_s=jct) for name, (share, jct) in dict(buckets).items()})


# -- the metrics -----------------------------------------------------------------------------------

def test_m2_weights_each_buckets_mean_jct_by_its_share_of_gpu_time():
    run = summary(130.0, 0.815, {"1": (0.1, 100.0), "9-64": (0.3, 400.0), "65+": (0.6, 1000.0)})
    # 0.1 x 100 + 0.3 x 400 + 0.6 x 1000 = 730: the big jobs' JCT dominates, unlike M1's 130.
    assert scorecard.weighted_jct(run) == pytest.approx(730.0)
    assert scorecard.mean_jct(run) == 130.0
    assert scorecard.useful_points(run) == pytest.approx(81.5)


# -- one comparison, every resample counted --------------------------------------------------------

def test_a_ratio_of_means_over_two_streams_by_hand():
    # Resamples of streams (0, 1): (0,0) 1.5/1 - 1 = +0.5, (0,1) and (1,0) 2.48/2 - 1 = +0.24, (1,1) -0.02.
    # Within the margin (<= +1%): 1 of 4, so p = 2 x 1/4; at 99% the interval is every resample.
    (s,) = exact((relative((1.5, 0.98), (1.0, 1.0)), "family"))
    assert s.estimate == pytest.approx(0.24) and (s.low, s.high) == pytest.approx((-0.02, 0.5))
    assert s.p == pytest.approx(0.5) and s.verdict == "level" and s.wide and (s.wins, s.n) == (1, 2)


def test_a_difference_inside_the_margin_is_level_and_one_beyond_it_by_side():
    (inside, faster, slower) = exact((relative((0.995, 0.996), (1.0, 1.0)), "a"),
                                     (relative((0.9, 0.95), (1.0, 1.0)), "b"),
                                     (relative((1.1, 1.2), (1.0, 1.0)), "c"))
    assert (inside.verdict, inside.wide) == ("level", False) and inside.p == 1.0
    assert (faster.verdict, slower.verdict) == ("ahead", "behind") and faster.p == slower.p == 0.0
    assert faster.high < -scorecard.MARGIN and slower.low > scorecard.MARGIN
    # A sure difference smaller than the margin is level, not ahead: 0.5% faster on every stream.
    (sure,) = exact((relative((0.995, 0.995), (1.0, 1.0)), "a"))
    assert sure.verdict == "level" and sure.low == sure.high == pytest.approx(-0.005)


def test_higher_is_better_in_points_for_useful_allocation():
    # ours - theirs: +3 and +1 points; resample means +3, +2, +2, +1: all beyond the 1-point margin but
    # (1,1)'s +1, which is not beyond it: p = 2 x 1/4.
    m4 = Pairs((83.0, 81.0), (80.0, 80.0), relative=False, ahead_below=-1.0, behind_above=1.0, higher_is_better=True)
    (s,) = exact((m4, "f"), alpha=0.6)  # k = floor(0.6 x 4 / 2) = 1: the interval drops one resample each end
    assert s.estimate == pytest.approx(2.0) and (s.low, s.high) == pytest.approx((2.0, 2.0))
    assert s.p == pytest.approx(0.5) and s.verdict == "ahead" and s.wins == 2
    (s,) = exact((m4, "f"))  # at 99% every resample counts, and the +1 one is not beyond the margin
    assert (s.low, s.high) == pytest.approx((1.0, 3.0)) and s.verdict == "level" and s.wide


def test_holm_widens_an_interval_in_a_crowded_family_and_only_there():
    # (0.5, 0.995) against (1, 1): resamples -0.5, -0.2525 twice, -0.005. Not ahead (>= -1%): 1 of 4, p 0.5.
    c = relative((0.5, 0.995), (1.0, 1.0))
    (alone,) = exact((c, "f"), alpha=0.5)  # k = floor(0.5 x 4 / 2) = 1: [-0.2525, -0.2525], ahead
    assert alone.verdict == "ahead" and alone.p == pytest.approx(0.5) and alone.high == pytest.approx(-0.2525)
    # Its twin in the same family: Holm multiplies the smaller p by 2 (and the step-down keeps it),
    # adjusted 1.0, factor 2, k = 0: the whole range, reaching past -1%: level.
    crowded = exact((c, "f"), (c, "f"), alpha=0.5)
    assert [s.verdict for s in crowded] == ["level", "level"] and [s.p for s in crowded] == [1.0, 1.0]
    assert crowded[0].high == pytest.approx(-0.005) and crowded[0].family_size == 2
    apart = exact((c, "f"), (c, "g"), alpha=0.5)
    assert [s.verdict for s in apart] == ["ahead", "ahead"] and apart[0].family_size == 1


def test_identical_runs_are_level_and_settled():
    values = (100.0, 250.5, 31.25, 99.0, 7.5)
    (s,) = scorecard.score([(relative(values, values), "f")], random.Random(1), resamples=500)
    assert (s.estimate, s.low, s.high, s.verdict, s.wide, s.wins) == (0.0, 0.0, 0.0, "level", False, 0)


def test_no_true_difference_is_called_ahead_or_behind_in_a_family_of_nulls():
    rng = random.Random(4)

    def null():  # ours and theirs drawn alike: stream-to-stream spread far above the margin
        theirs = [rng.uniform(5e3, 5e4) for _ in range(24)]
        return relative([t * rng.uniform(0.8, 1.25) for t in theirs], theirs)

    scored = scorecard.score([(null(), "f") for _ in range(60)], random.Random(5), resamples=4000)
    assert not [s for s in scored if s.verdict != "level"] and all(s.wide for s in scored)


def test_the_verdict_is_exactly_the_adjusted_p_at_alpha():
    rng = random.Random(9)
    comparisons = []
    for i in range(40):
        theirs = [rng.uniform(100, 200) for _ in range(rng.choice([6, 12, 24]))]
        shift = rng.choice([0.9, 0.97, 1.0, 1.0, 1.03, 1.1])
        comparisons.append((relative([t * shift * rng.uniform(0.9, 1.1) for t in theirs], theirs), i % 3))
    scored = scorecard.score(comparisons, random.Random(10), resamples=4000)
    assert {s.verdict for s in scored} == {"ahead", "level", "behind"}
    for s in scored:
        assert (s.verdict != "level") == (s.p <= scorecard.ALPHA)
        assert (s.verdict == "ahead") == (s.high < -scorecard.MARGIN)
        assert (s.verdict == "behind") == (s.low > scorecard.MARGIN)


def test_unpaired_input_is_refused_with_a_message():
    with pytest.raises(ValueError, match="equally many paired values"):
        scorecard.score([(relative((1.0, 2.0), (1.0,)), "f")], random.Random(1))


# -- a network's rows from runs --------------------------------------------------------------------

def runs_of(cells, seeds, make):
    """results[trace, load, seed, key] for every key ours and Kueue's modes, from make(key, seed)."""
    return {(trace, load, seed, key): make(key, seed) for trace, load in cells for seed in seeds
            for key in ("ours", "kueue", "kueue-required", "kueue-strict")}


def test_scorecard_compares_every_mode_m4_at_overload_only_and_m3_against_preferred_per_bucket():
    cells, seeds = [("philly", 0.8), ("philly", 1.2)], [1, 2, 3]
    speed = {"ours": 0.8, "kueue": 1.0, "kueue-required": 0.79, "kueue-strict": 2.0}

    def make(key, seed):
        jct = 1000.0 * seed * speed[key]
        # 65+ jobs only on seeds 1 and 2 under ours, only on 2 and 3 under Kueue preferred: paired on seed 2.
        big = {"65+": (0.5, 2.0 * jct)} if (key == "ours" and seed < 3) or (key != "ours" and seed > 1) else {}
        return summary(jct, 0.7 if key == "ours" else 0.65, {"1": (0.5, jct), **big})

    rows = scorecard.scorecard(runs_of(cells, seeds, make), cells, seeds, "ours",
                               ("kueue", "kueue-required", "kueue-strict"), random.Random(1), resamples=27)
    assert {(r.load, r.metric) for r in rows if r.metric == "M4"} == {(1.2, "M4")}
    assert sorted((r.load, r.bucket, r.scored.n) for r in rows if r.metric == "M3") == [
        (0.8, "1", 3), (0.8, "65+", 1), (1.2, "1", 3), (1.2, "65+", 1)]
    assert all(r.against == "kueue" for r in rows if r.metric == "M3")
    m1 = {(r.load, r.against): r for r in rows if r.metric == "M1"}
    assert m1[0.8, "kueue"].scored.estimate == pytest.approx(-0.2) and m1[0.8, "kueue"].word == "ahead"
    assert m1[0.8, "kueue-required"].scored.estimate == pytest.approx(0.8 / 0.79 - 1)  # +1.27%, every stream
    assert m1[0.8, "kueue-required"].word == "behind" and m1[0.8, "kueue-strict"].word == "ahead"
    m4 = next(r for r in rows if r.metric == "M4" and r.against == "kueue")
    assert m4.scored.estimate == pytest.approx(5.0) and m4.word == "ahead"
    assert {r.word for r in rows if r.metric == "M3" and r.bucket == "1"} == {"holds"}  # 20% faster
    families = {(r.metric, r.scored.family_size) for r in rows}
    assert families == {("M1", 6), ("M2", 6), ("M4", 3), ("M3", 4)}


def rows_for(words: dict) -> list:
    """Rows of one network with given verdicts: words[(trace, load, metric, against)] = verdict."""
    made = []
    for (trace, load, metric, against), word in words.items():
        estimate = {"ahead": -0.1, "level": 0.0, "behind": 0.1}[word]
        scored = scorecard.Scored(estimate, estimate, estimate, 0.0, word, False, 0, 24, 1)
        made.append(scorecard.Row(trace, load, metric, against, "65+" if metric == "M3" else "", scored))
    return made


MODES = ("kueue", "kueue-required", "kueue-strict")


def test_must_holds_count_cells_ahead_of_every_mode_and_any_row_behind():
    ahead_everywhere = {("philly", load, "M2", mode): "ahead" for load in (0.8, 1.2) for mode in MODES}
    one_level = {**ahead_everywhere, ("philly", 1.2, "M2", "kueue-strict"): "level",
                 ("philly", 0.5, "M2", "kueue"): "ahead"}  # 0.5 is not a loaded cell
    lines = scorecard.must_holds({"2/4/8": rows_for(one_level), "1/2/2": rows_for(ahead_everywhere)})
    assert "M1 and M2 behind no Kueue mode in any cell: met" == lines[0]
    assert lines[1].startswith("M2 ahead of every Kueue mode in at least 4 of the 2 loaded cells on 2/4/8: "
                               "NOT met (1; philly 0.8)")
    assert lines[2].startswith("M2 ahead of every Kueue mode in at least 1 of the 2 loaded cells on 1/2/2: met (2")
    behind = {**ahead_everywhere, ("helios_all", 0.5, "M1", "kueue-required"): "behind",
              ("helios_all", 0.5, "M3", "kueue"): "behind", ("helios_all", 1.2, "M4", "kueue"): "behind"}
    lines = scorecard.must_holds({"2/4/8": rows_for(behind)})
    assert lines[0].startswith("M1 and M2 behind no Kueue mode in any cell: NOT met; 2/4/8 helios_all 0.5 M1 against "
                               "Kueue required")
    assert lines[2].startswith("M3 no bucket more than 10% slower than Kueue preferred: NOT met (1 break; 2/4/8 "
                               "helios_all 0.5 65+")
    assert lines[3].startswith("M4 useful allocation at overload not below any Kueue mode (1-point margin): NOT met; "
                               "2/4/8 helios_all 1.2 against Kueue preferred")


def test_the_summary_table_counts_each_modes_verdicts_per_metric():
    words = {("philly", 0.8, "M1", "kueue"): "ahead", ("philly", 1.2, "M1", "kueue"): "level",
             ("acme_seren", 1.2, "M1", "kueue"): "behind", ("philly", 0.8, "M2", "kueue"): "ahead",
             ("philly", 1.2, "M4", "kueue-required"): "level"}
    table = scorecard.summary({"1/1/1": rows_for(words)})
    assert "| 1/1/1 | Kueue preferred | 1 / 1 / 1 | 1 / 0 / 0 | 0 / 0 / 0 |" in table
    assert "| 1/1/1 | Kueue required | 0 / 0 / 0 | 0 / 0 / 0 | 0 / 1 / 0 |" in table


def test_settings_search_judges_each_candidate_on_the_scorecard_against_kueue_and_the_default():
    from bench import evaluate, settings_search

    rng = random.Random(2)
    speed = {"default": 1.0, "share-0": 1.3, "kueue": 1.0, "kueue-required": 1.0, "kueue-strict": 1.0}
    results = {}
    for seed in range(24):
        base = rng.uniform(1e3, 1e4)
        for key, factor in speed.items():
            buckets = {b: SimpleNamespace(allreduce_ms=10.0, completion_s=base * factor * rng.uniform(0.99, 1.01),
                                          weight_share=1 / 6) for b in (*evaluate.SINGLE_NODE, *evaluate.BUCKETS)}
            results["2/4/8", "philly", 1.2, seed, key] = SimpleNamespace(
                buckets=buckets, completion_s=base * factor, allocation=0.8, useful_allocation=0.7)
    text = settings_search.judged(results, ["2/4/8"], [("philly", 1.2)], list(range(24)), ["share-0"], 1.0, "cmd")
    default, candidate = text.split("## Ours, default")[1].split("## Ours, share-0")
    assert "M1 and M2 behind no Kueue mode in any cell: met" in default
    assert "M1 and M2 behind no Kueue mode in any cell: NOT met" in candidate
    against_default = candidate.split("## share-0 against today's default")[1].split("## Detail")[0]
    assert "| philly | 1.2 | today's default | +30.0% [" in against_default and "behind" in against_default
