"""bench/evaluate.py's statistics and seed rules on synthetic per-seed results: no simulation runs."""
import contextlib
import pathlib
import pickle
import random
import re
import statistics
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest

from bench import engine, evaluate, simulate

Comparison = evaluate.Comparison


def noisy(shift: float, n: int, rng: random.Random, spread: float = 5.0) -> Comparison:
    """Per-stream values with a large stream-to-stream spread; ours = theirs + shift + noise."""
    theirs = [rng.uniform(80, 120) for _ in range(n)]
    return Comparison(tuple(t + shift + rng.gauss(0, spread) for t in theirs), tuple(theirs))


# -- Student's t and Holm -------------------------------------------------------------------------

@pytest.mark.parametrize("df, tail, critical", [(7, 0.025, 2.364624), (23, 0.025, 2.068658), (1, 0.025, 12.706205),
                                                (11, 0.005, 3.105807), (23, 0.0005, 3.767627)])
def test_t_critical_values_match_the_tables(df, tail, critical):
    assert evaluate.t_quantile(tail, df) == pytest.approx(critical, abs=1e-5)
    assert evaluate.t_sf(critical, df) == pytest.approx(tail, rel=1e-5)
    assert evaluate.t_sf(-critical, df) == pytest.approx(1 - evaluate.t_sf(critical, df), rel=1e-12)


def test_holm_adjusts_a_known_family_as_by_hand():
    # Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, raised to the 0.06
    # before it (step-down: adjusted p-values never fall with rank).
    assert evaluate.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # At 5% Holm rejects the first two; Bonferroni (x 4) would reject only 0.005.
    assert [p <= 0.05 for p in evaluate.holm([0.01, 0.04, 0.03, 0.005])] == [True, False, False, True]
    assert evaluate.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert evaluate.holm([0.02]) == [0.02]  # a family of one is not adjusted


def test_holm_adjusts_within_a_family_not_across_families():
    rng = random.Random(3)
    cell = noisy(-4.0, 12, rng)
    alone = evaluate.judge([cell])[0]
    crowded = evaluate.judge([cell] + [noisy(0.0, 12, rng) for _ in range(49)])[0]
    apart = evaluate.judge([cell] + [Comparison(c.ours, c.theirs, family=("other",))
                                     for c in (noisy(0.0, 12, rng) for _ in range(49))])[0]
    assert alone.family_size == apart.family_size == 1 and crowded.family_size == 50
    assert alone == apart and crowded.p >= alone.p and crowded.high - crowded.low > alone.high - alone.low


# -- verdicts -------------------------------------------------------------------------------------

def test_no_true_difference_is_never_called_ahead_or_behind_across_a_family():
    rng = random.Random(11)
    family = [noisy(0.0, 24, rng) for _ in range(200)]
    judged = evaluate.judge(family)
    assert not [j for j in judged if j.verdict in ("ahead", "behind")]
    # Unadjusted (each its own family of one), 5% of these null cells come out ahead or behind:
    # the false calls the correction removes.
    unadjusted = evaluate.judge([Comparison(c.ours, c.theirs, family=(i,)) for i, c in enumerate(family)])
    assert 3 <= sum(j.verdict in ("ahead", "behind") for j in unadjusted) <= 20


def test_identical_results_are_level():
    values = (10.0, 250.5, 31.25, 99.0, 7.5, 12.0, 18.0, 40.0)
    (judged,) = evaluate.judge([Comparison(values, values)])
    assert judged.verdict == "level" and judged.mean == 0 and judged.low == judged.high == 0 and judged.wins == 0
    # Float noise from summing in another order is no difference either.
    (judged,) = evaluate.judge([Comparison(tuple(v + 1e-12 for v in values), values)])
    assert judged.verdict == "level"


def test_a_big_consistent_difference_is_ahead_or_behind_by_side():
    rng = random.Random(5)
    family = [noisy(-20.0, 24, rng), noisy(20.0, 24, rng)] + [noisy(0.0, 24, rng) for _ in range(100)]
    ahead, behind = evaluate.judge(family)[:2]
    assert (ahead.verdict, behind.verdict) == ("ahead", "behind")
    assert ahead.high < 0 < behind.low and ahead.wins == 24
    higher_is_better = Comparison(family[0].ours, family[0].theirs, lower_is_better=False)
    assert evaluate.judge([higher_is_better])[0].verdict == "behind"


def test_the_margin_is_two_percent_of_the_baselines_mean():
    rng = random.Random(8)
    theirs = tuple(rng.uniform(150, 250) for _ in range(24))
    margin = 0.02 * statistics.fmean(theirs)

    def judged(shift: float, spread: float = 0.01):
        return evaluate.judge([Comparison(tuple(t + shift + rng.gauss(0, spread) for t in theirs), theirs)])[0]

    assert judged(0.0).margin == pytest.approx(margin)
    # A precise shift of half the margin is a real difference (ahead wins over level)...
    assert judged(-0.5 * margin).verdict == "ahead"
    # ...noise that cannot be told from 0 but stays well inside the margin is level...
    inside = judged(0.0, spread=0.2 * margin)
    assert inside.verdict == "level" and -margin < inside.level_low < inside.level_high < margin
    # ...and noise five margins wide, over 24 streams, is neither.
    wide = judged(0.0, spread=5 * margin)
    assert wide.verdict == "inconclusive" and (wide.level_low <= -margin or wide.level_high >= margin)
    assert wide.low < 0 < wide.high


def test_few_noisy_streams_are_inconclusive_not_level():
    (judged,) = evaluate.judge([Comparison((10.0, 30.0, 16.0), (20.0, 15.0, 14.0))])
    assert judged.verdict == "inconclusive" and judged.wins == 1
    (one,) = evaluate.judge([Comparison((10.0,), (10.0,))])  # one stream says nothing about the spread
    assert one.verdict == "inconclusive"


def test_each_interval_says_exactly_what_its_verdict_says():
    rng = random.Random(21)
    family = [noisy(rng.choice([-6.0, -1.0, 0.0, 0.0, 1.0, 6.0]), rng.choice([8, 12, 24]), rng,
                    spread=rng.choice([0.5, 2.0, 8.0])) for _ in range(150)]
    judged = evaluate.judge(family)
    assert {j.verdict for j in judged} == {"ahead", "behind", "level", "inconclusive"}
    for j in judged:
        assert j.low <= j.mean <= j.high and j.level_low <= j.mean <= j.level_high
        assert (j.verdict in ("ahead", "behind")) == (j.low > 0 or j.high < 0)
        if j.verdict != "ahead" and j.verdict != "behind":
            assert (j.verdict == "level") == (-j.margin < j.level_low and j.level_high < j.margin)


def test_unpaired_input_is_refused():
    with pytest.raises(ValueError):
        evaluate.judge([Comparison((1.0, 2.0), (1.0,))])


# -- what an evaluation reads and reports ----------------------------------------------------------

def fake_results(seeds, shift: float = 0.0, traces=(("helios_all", 1.2),)) -> dict:
    """Summaries with the fields verdicts() and the scorecard read, for every policy evaluate runs."""
    rng = random.Random(0)
    results = {}
    for trace, load in traces:
        for seed in seeds:
            base = rng.uniform(50, 150)
            for key in (*evaluate.OURS_VARIANTS, *evaluate.BASELINES, *evaluate.KUEUE_MODES):
                mine = shift if key in evaluate.OURS_VARIANTS else 0.0
                buckets = {b: SimpleNamespace(allreduce_ms=base + mine + rng.gauss(0, 1),
                                              completion_s=10 * base + rng.gauss(0, 10), weight_share=1 / 6)
                           for b in (*evaluate.SINGLE_NODE, *evaluate.BUCKETS)}
                results[trace, load, seed, key] = SimpleNamespace(buckets=buckets, allocation=0.8,
                                                                 completion_s=10 * base + rng.gauss(0, 10),
                                                                 useful_allocation=0.7 + (0.05 if mine else 0.0))
    return results


def test_every_family_is_one_strategy_and_one_metric():
    seeds = list(range(100, 124))
    rows = evaluate.verdicts(fake_results(seeds, shift=-30.0), [("helios_all", 1.2)], seeds, evaluate.OURS_VARIANTS)
    sizes = {(row[5], evaluate.family_of(row[2], row[3], row[5])[1]): row[4].family_size for row in rows}
    per_cell = len(evaluate.BASELINES)
    assert sizes == {(v, metric): size * per_cell for v in evaluate.OURS_VARIANTS
                     for metric, size in (("all-reduce", 2), ("JCT", 6), ("allocation", 1), ("useful allocation", 1))}
    assert {row[4].verdict for row in rows if row[2] in evaluate.BUCKETS} == {"ahead"}
    assert {row[4].verdict for row in rows if row[2] == "allocation"} == {"level"}  # same allocation
    assert {row[4].verdict for row in rows if row[2] == "useful allocation"} == {"ahead"}  # 5 points more work


def test_the_report_says_when_it_is_underpowered_or_in_sample():
    def section(seeds, gpus):
        rows = evaluate.verdicts(fake_results(seeds), [("helios_all", 1.2)], seeds)
        return evaluate.render(rows, seeds, gpus, 1.0, "bench/evaluate.py ...")

    fresh = list(range(100, 124))
    assert "Underpowered" not in section(fresh, 512) and "in sample" not in section(fresh, 512)
    assert "**Underpowered:** 8 streams per cell, fewer than the 24" in section(fresh[:8], 512)
    assert "Underpowered" not in section(fresh[:12], 8192)
    assert "fewer than the 12 the protocol asks at 8192 GPUs" in section(fresh[:11], 8192)
    seen = section([*fresh[:23], 302], 512)
    assert "### Evaluation in sample (seen seeds)" in seen and "**in sample**: 302 was looked at before" in seen
    assert evaluate.interpreter() in seen


# -- seeds nobody may evaluate on -------------------------------------------------------------------

def test_the_seeds_looked_at_are_all_excluded():
    assert {*simulate.SEEDS, *range(1000, 1012), 301, 302, 303, 304, 11, 12, 424242, 7, 8, 9} <= evaluate.SEEN_SEEDS
    assert evaluate.TUNING_SEEDS is evaluate.SEEN_SEEDS  # what bench/ablation.py refuses


def test_every_seed_the_bench_pages_name_is_excluded():
    # a seed whose runs a page reports has been looked at: a later verdict on it would be in sample
    bench = pathlib.Path(evaluate.__file__).parent
    named = set()
    for page in bench.glob("*.md"):
        for line in page.read_text().splitlines():
            if "seed" in line.lower():
                named |= {int(number) for number in re.findall(r"(?<![\w.,])\d{6,10}(?![\w.,])", line)}
    assert len(named) > 100  # the pages name seeds, and the pattern reads them
    missing = sorted(seed for seed in named - evaluate.SEEN_SEEDS if seed < 2**31)  # fresh_seeds draws below 2**31
    assert not missing, f"named on a bench page, missing from evaluate.SEEN_SEEDS: {missing}"


def test_fresh_seeds_never_draw_a_seen_one(monkeypatch):
    draws = iter([301, 11, simulate.SEEDS[0], 5, 1000, 5, 6, 12, 7, 10])

    class Rigged:
        def __init__(self, seed):
            pass

        def randrange(self, _):
            return next(draws)

    monkeypatch.setattr(evaluate.random, "Random", Rigged)
    assert evaluate.fresh_seeds(3) == [5, 6, 10]  # 7 was looked at (issue 38)


def test_seen_seeds_given_explicitly_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        evaluate.main(["--quick", "--seeds", "5", "302", "--processes", "1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "302 is a seen seed" in err and "--allow-seen" in err
    assert " 5 " not in err


class InProcessPool:
    """multiprocessing.Pool's part main() uses, run in this process."""

    def __init__(self, _processes):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    @staticmethod
    def imap_unordered(function, tasks):
        return map(function, tasks)


@contextlib.contextmanager
def no_simulation(monkeypatch, made_by=None):
    """main() with every run answered from fake_results, by `made_by` (default: this interpreter)."""
    results = fake_results([11, 5], traces=(("helios_all", 1.2),))
    monkeypatch.setattr(evaluate.multiprocessing, "Pool", InProcessPool)
    monkeypatch.setattr(evaluate, "run_here", lambda task: (
        task[0], task[1], results[task[0].trace, task[0].load, task[0].seed, task[1]],
        made_by or evaluate.interpreter()))
    yield


def test_allow_seen_runs_them_and_the_report_says_in_sample(monkeypatch, capsys):
    with no_simulation(monkeypatch):
        assert evaluate.main(["--quick", "--cells", "helios_all:1.2", "--seeds", "11", "5", "--allow-seen"]) == 0
    out = capsys.readouterr().out
    assert "in sample" in out and "--seeds 11 5 --allow-seen" in out and "Underpowered" in out


def test_runs_of_another_interpreter_are_refused(monkeypatch, capsys):
    with no_simulation(monkeypatch, made_by="cpython-3.12.3"), pytest.raises(SystemExit) as exit_:
        evaluate.main(["--quick", "--cells", "helios_all:1.2", "--seeds", "5"])
    assert exit_.value.code == 2 and "never combined" in capsys.readouterr().err


# -- the resume key -------------------------------------------------------------------------------

def task(seed: int = 5, key: str = "kueue") -> tuple:
    return simulate.Scenario("main", "helios_all", 1.2, seed=seed), key, simulate.QUICK


def test_the_resume_key_names_the_interpreter(monkeypatch, tmp_path):
    monkeypatch.setattr(evaluate, "code_digest", lambda: "code")
    paths = {}
    for version in ((3, 11, 7, "final", 0), (3, 12, 3, "final", 0)):
        with monkeypatch.context() as patched:
            patched.setattr(sys, "version_info", version)
            kept = evaluate.Kept(str(tmp_path), 512)
            paths[version[:2]] = kept.path(task())
            kept.keep(task(), "summary")
    assert paths[3, 11] != paths[3, 12]
    assert f"-kueue-{sys.implementation.name}-3.11.7-code.pickle" in paths[3, 11]
    assert f"-{sys.implementation.name}-3.12.3-" in paths[3, 12]
    with monkeypatch.context() as patched:
        patched.setattr(sys, "version_info", (3, 12, 3, "final", 0))
        assert evaluate.Kept(str(tmp_path), 512).read(task()) == "summary"
        assert evaluate.Kept(str(tmp_path), 512).read(task(seed=6)) is None  # never made


def test_a_kept_run_of_another_interpreter_is_refused_even_under_this_ones_name(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(evaluate, "code_digest", lambda: "code")
    kept = evaluate.Kept(str(tmp_path), simulate.QUICK.spec.gpus)
    for key in (*evaluate.OURS_VARIANTS, *evaluate.BASELINES):  # copied in from a 3.12 machine and renamed
        with open(kept.path(task(key=key)), "wb") as handle:
            pickle.dump({"interpreter": "cpython-3.12.3", "summary": None}, handle)
    with pytest.raises(evaluate.MixedInterpreters, match="never combined"):
        kept.read(task())
    with pytest.raises(SystemExit) as exit_:
        evaluate.main(["--quick", "--cells", "helios_all:1.2", "--seeds", "5", "--resume", str(tmp_path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "made by cpython-3.12.3" in err


# -- other networks, Kueue's modes, ours configured wrong (issue 38) ---------------------------------

@contextlib.contextmanager
def recorded_tasks(monkeypatch):
    """main() answered from fake_results, and the list of tasks it ran."""
    ran: list[tuple] = []
    with no_simulation(monkeypatch):
        answer = evaluate.run_here
        monkeypatch.setattr(evaluate, "run_here", lambda task: (ran.append(task), answer(task))[1])
        yield ran


def test_the_default_run_is_todays_and_2_4_8_is_the_default(monkeypatch, capsys):
    argv = ["--quick", "--cells", "helios_all:1.2", "--seeds", "11", "5", "--allow-seen"]
    outputs, task_lists = [], []
    for extra in ([], ["--networks", "2/4/8"]):
        with recorded_tasks(monkeypatch) as ran:
            assert evaluate.main(argv + extra) == 0
        outputs.append(capsys.readouterr().out)
        task_lists.append(ran)
    assert task_lists[0] == task_lists[1]
    # exactly the tasks an evaluation made before --networks: the main scenario, ours and the four baselines
    today = [(simulate.Scenario("main", "helios_all", 1.2, seed=seed), key, simulate.QUICK)
             for seed in (11, 5) for key in (*evaluate.OURS_VARIANTS, *evaluate.BASELINES)]
    assert task_lists[0] == sorted(today, key=lambda t: t[1] not in evaluate.OURS_VARIANTS)  # ours first, as ever
    assert outputs[0] == outputs[1]
    # every section names its conditions, the default run's too (issue 38, item 8)
    assert ("### Evaluation in sample (seen seeds), 128 GPUs, network 2/4/8 (leaf/spine/zone oversubscription), "
            "Kueue preferred only, releaser every 1 s + 50 ms, 30% not ours, streams v2\n") in outputs[0]


def test_the_resume_key_names_the_network_the_configuration_and_the_runtime(monkeypatch, tmp_path):
    monkeypatch.setattr(evaluate, "code_digest", lambda: "code")
    kept = evaluate.Kept(str(tmp_path), 512)
    main = simulate.Scenario("main", "helios_all", 1.2, seed=5)
    flat = replace(main, rho_leaf=1.0, rho_spine=1.0, rho_zone=1.0)
    scenarios = [main, flat, simulate.misconfigured(main, 2, "network"), simulate.misconfigured(flat, 2, "network"),
                 simulate.misconfigured(main, 2, "share"), replace(main, runtime=engine.IDEAL),
                 *(replace(main, runtime=replace(engine.Runtime(), **change)) for change in (
                     {"releaser_period_s": 2.0}, {"patch_latency_s": 0.0}, {"foreign_share": 0.5},
                     {"decide_at_arrival": False})), replace(main, streams=1)]
    paths = [kept.path((s, "ours-consolidated", simulate.QUICK)) for s in scenarios]
    assert len(set(paths)) == len(paths)
    assert ("-rho2_4_8-comm0.1-configured2_4_8_0.1-release1_0.05-foreign0.3-at_arrival-streams2-ours-consolidated-"
            in paths[0])
    assert "-at_arrival-streams1-" in paths[-1]
    assert "-rho1_1_1-comm0.1-configured2_2_2_0.1-" in paths[3]
    assert "-release0_0-foreign0-when_it_fits-" in paths[5]
    kept.keep((flat, "kueue", simulate.QUICK), "on 1/1/1")
    assert kept.read((main, "kueue", simulate.QUICK)) is None  # another network's run is never read back
    assert kept.read((flat, "kueue", simulate.QUICK)) == "on 1/1/1"


def test_networks_kueue_modes_and_a_wrong_configuration_are_judged_per_network(monkeypatch, capsys):
    argv = ["--quick", "--cells", "helios_all:1.2", "--seeds", "11", "5", "--allow-seen",
            "--networks", "1/1/1", "2/4/8", "--kueue-modes", "--misconfigured", "0.5", "2"]
    with recorded_tasks(monkeypatch) as ran:
        assert evaluate.main(argv) == 0
    out, card = capsys.readouterr().out.split("### Scorecard")
    sections = out.split("### Evaluation")[1:]
    # One scorecard after the detail, a table per network, each Kueue mode a row; M4 at overload only.
    assert card.startswith(" in sample (seen seeds), 128 GPUs, networks 1/1/1 2/4/8, releaser every 1 s")
    assert card.count("| helios_all | 1.2 | Kueue ") == 6 and "Holm families (this network): M1 3, M2 3, M4 3" in card
    assert [s.splitlines()[0] for s in sections] == [
        f" in sample (seen seeds), 128 GPUs, network {net} (leaf/spine/zone oversubscription), Kueue preferred, "
        "required and StrictFIFO, releaser every 1 s + 50 ms, 30% not ours, streams v2" for net in ("1/1/1", "2/4/8")]
    assert "--networks 1/1/1 2/4/8 --kueue-modes --misconfigured 0.5 2" in out
    # half of 1/1/1 clamps back to the truth: not run; the baselines never run configured wrong
    wrong = [(t[0].network, t[0].configured_rho, t[1]) for t in ran if not t[0].told_the_truth]
    assert sorted(wrong, key=str) == sorted(((simulate.Network(*rho), tuple(r * f for r in rho), key)
                                             for rho, factors in (((1, 1, 1), (2,)), ((2, 4, 8), (0.5, 2)))
                                             for f in factors for key in evaluate.OURS_VARIANTS for _ in (11, 5)),
                                            key=str)
    for section, factors in zip(sections, (("2",), ("0.5", "2"))):
        rows = [[c.strip() for c in line.strip("| ").split("|")] for line in section.splitlines()
                if line.startswith("| helios_all")]
        assert {r[3] for r in rows} == {*evaluate.BASELINES, *evaluate.KUEUE_MODES}
        assert {r[10] for r in rows} == {f"consolidated{f}" for f in ("", *(f", configured {x}x" for x in factors))}
        assert "Each network is its own family" in section and "against Kueue required ahead in" in section
        # a family: one strategy (configured or not) x one metric x the six baselines, this network's only
        assert f"all-reduce against baselines {2 * 6}" in section


def test_the_scorecard_judge_runs_ours_and_kueues_three_modes_on_the_three_networks(monkeypatch, capsys, tmp_path):
    argv = ["--quick", "--cells", "helios_all:1.2", "--seeds", "11", "5", "--allow-seen", "--scorecard"]
    results = tmp_path / "RESULTS.md"
    results.write_text("# Title\n\nkept\n")
    monkeypatch.setattr(evaluate, "RESULTS_PATH", str(results))
    with recorded_tasks(monkeypatch) as ran:
        assert evaluate.main(argv + ["--write"]) == 0
    out = capsys.readouterr().out
    assert {t[1] for t in ran} == {evaluate.OURS, "kueue", *evaluate.KUEUE_MODES}
    assert sorted({simulate.network_text(t[0].network) for t in ran}) == ["1/1/1", "1/2/2", "2/4/8"]
    assert "--networks 1/1/1 1/2/2 2/4/8 --scorecard" in out
    # --write puts the scorecard alone under the title, the detail stays in the output.
    written = results.read_text()
    assert written.startswith("# Title\n\n<!-- generated by bench/evaluate.py or bench/ablation.py with --write: "
                              "scorecard, 128 -->\n### Scorecard in sample")
    assert "### Evaluation" not in written and "### Evaluation" in out and written.endswith("kept\n")
