"""helpers.compare: the interval, the word chosen from it, and bad input named."""

import itertools
import math
import re

import numpy as np
import pytest

from helpers.compare import UNRESOLVED, compare


def test_three_repeats_a_side_bound_the_ratio_by_the_range_of_the_nine_pairwise_ratios():
    a, b = [1.0, 1.1, 1.25], [1.5, 1.6, 1.7]
    c = compare(a, b, more="slower", less="faster")
    ratios = sorted(x / y for x, y in itertools.product(a, b))
    assert c.low == pytest.approx(ratios[0]) and c.high == pytest.approx(ratios[-1])
    assert c.ratio == pytest.approx(ratios[4])  # the median of the nine
    assert c.direction == -1 and c.word == "faster"
    assert c.says("one replica", "two") == (
        f"one replica against two: faster, {c.ratio:.2f}x ({ratios[0]:.2f}x to "
        f"{ratios[-1]:.2f}x, 90 % interval, 3 and 3 repeats)"
    )
    assert compare(b, a, more="slower", less="faster").word == "slower"


def test_one_overlapping_repeat_is_no_direction_and_the_sentence_says_so():
    c = compare([1.0, 1.2, 1.6], [1.5, 1.1, 1.7], more="slower", less="faster")
    assert c.direction == 0 and c.word is None
    assert c.low < 1 < c.high
    assert UNRESOLVED in c.says("A", "B") and "slower" not in c.says("A", "B")


def test_two_repeats_a_side_never_resolve_a_difference_at_90_percent():
    c = compare([1.0, 1.01], [9.0, 9.5])
    assert c.direction == 0
    assert "too few to bound it at 90 %" in c.says("A", "B")


def test_more_repeats_give_a_narrower_interval_inside_the_pairwise_range():
    rng = np.random.default_rng(1)
    a, b = rng.lognormal(0.0, 0.1, 12), rng.lognormal(0.5, 0.1, 12)
    c = compare(a, b)
    ratios = np.divide.outer(a, b).ravel()
    assert ratios.min() < c.low < c.ratio < c.high < ratios.max()
    assert c.word == "smaller"


def test_equal_distributions_are_called_different_at_most_at_the_stated_rate():
    # the interval's promise: under no difference, a direction in at most 10 % of comparisons
    # (exactly 10 % at 3 a side: complete separation has probability 2/20)
    rng = np.random.default_rng(0)
    said = [compare(rng.lognormal(size=3), rng.lognormal(size=3)).direction for _ in range(500)]
    share = np.mean(np.abs(said))
    assert 0.06 < share < 0.14  # 3 binomial standard deviations
    said = [compare(rng.lognormal(size=6), rng.lognormal(size=6)).direction for _ in range(200)]
    assert np.mean(np.abs(said)) < 0.13


def test_a_real_difference_is_found_with_five_repeats():
    rng = np.random.default_rng(2)
    found = [
        compare(rng.lognormal(0, 0.05, 5), rng.lognormal(0.3, 0.05, 5)).direction
        for _ in range(100)
    ]
    assert np.mean(np.array(found) == -1) > 0.95


@pytest.mark.parametrize(
    "a, b, named",
    [
        ([1.0], [1.0, 2.0], "a has 1 measurement(s) [1.0]"),
        ([1.0, 2.0], [], "b has 0 measurement(s)"),
        ([1.0, -2.0], [1.0, 2.0], "a holds -2.0"),
        ([1.0, 2.0], [1.0, math.nan], "b holds nan"),
        ([0.0, 2.0], [1.0, 2.0], "a holds 0.0"),
    ],
)
def test_bad_measurements_are_named(a, b, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        compare(a, b)


def test_a_level_outside_its_range_is_named():
    with pytest.raises(ValueError, match="level 1.0 must be in"):
        compare([1, 2], [1, 2], level=1.0)
