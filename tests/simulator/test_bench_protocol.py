"""The evaluation protocol's statistics on synthetic paired data whose answer is known."""
import random

import pytest

from bench import protocol


def paired(shift: float, n: int = 40, seed: int = 1) -> tuple[list[float], list[float]]:
    """Per-stream values with a large stream-to-stream spread; ours = theirs + shift + small noise."""
    rng = random.Random(seed)
    theirs = [rng.uniform(20, 200) for _ in range(n)]
    return [t + shift + rng.gauss(0, 1) for t in theirs], theirs


@pytest.mark.parametrize("shift, verdict", [(-3.0, "ahead"), (3.0, "behind"), (0.0, "level")])
def test_a_known_shift_is_found_on_its_side_and_none_is_level(shift, verdict):
    result = protocol.compare(*paired(shift), random.Random(0))
    assert result.verdict == verdict
    assert result.low <= shift <= result.high or shift == 0.0 and result.low < 0 < result.high
    assert result.n == 40 and result.low <= result.mean <= result.high


def test_the_spread_between_streams_does_not_hide_a_shift_because_pairs_cancel_it():
    # Unpaired, a 3 ms shift is lost in 20-200 ms of spread; paired it is plain.
    result = protocol.compare(*paired(-3.0), random.Random(0))
    assert result.high - result.low < 2 and result.wins >= 35


def test_higher_is_better_flips_the_sides():
    ours, theirs = paired(3.0)
    assert protocol.compare(ours, theirs, random.Random(0), lower_is_better=False).verdict == "ahead"


def test_a_fixed_rng_gives_the_same_interval():
    data = paired(0.5, n=8)
    assert protocol.compare(*data, random.Random(7)) == protocol.compare(*data, random.Random(7))


def test_few_noisy_streams_are_level_not_a_verdict():
    ours, theirs = [10.0, 30.0, 16.0], [20.0, 15.0, 14.0]  # one big win, a big and a small loss
    result = protocol.compare(ours, theirs, random.Random(0))
    assert result.verdict == "level" and result.wins == 1


def test_unpaired_input_is_refused():
    with pytest.raises(ValueError):
        protocol.compare([1.0, 2.0], [1.0], random.Random(0))
