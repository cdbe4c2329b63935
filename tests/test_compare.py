"""helpers.compare: the interval, the word chosen from it, and bad input named."""

import itertools
import math
import re

import numpy as np
import pytest

from helpers.compare import UNRESOLVED, compare, compare_bootstrap, compare_paired


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


def test_paired_five_agreeing_pairs_resolve_and_the_interval_spans_the_walsh_extremes():
    d = [0.5, 1.0, 2.0, 3.0, 4.0]
    c = compare_paired(d, [0.0] * 5, more="higher", less="lower")
    walsh = sorted((d[i] + d[j]) / 2 for i in range(5) for j in range(i, 5))
    assert (c.low, c.high) == pytest.approx((walsh[0], walsh[-1]))
    assert c.difference == pytest.approx(np.median(walsh))
    assert c.direction == 1 and c.word == "higher"
    assert c.says("fold", "drop") == (
        "fold against drop: higher, +2.0000 (+0.5000 to +4.0000, 90 % interval, 5 pairs)"
    )
    assert c.interval(digits=2) == "+2.00 (+0.50 to +4.00, 90 % interval, 5 pairs)"
    assert "these seeds" in compare_paired([1, 2, 3], [0] * 3).says("a", "b", "these seeds")


def test_paired_three_pairs_never_resolve_and_one_disagreeing_pair_of_five_is_no_direction():
    assert compare_paired([1, 2, 3], [0, 0, 0]).direction == 0
    assert "3 pairs: too few to bound it at 90 %" in compare_paired([1, 2, 3], [0, 0, 0]).says(
        "a", "b"
    )
    c = compare_paired([1, 2, 3, 4, -5], [0] * 5)
    assert c.direction == 0 and c.low < 0 < c.high and UNRESOLVED in c.says("a", "b")


def test_paired_equal_samples_are_called_different_at_most_at_the_stated_rate():
    rng = np.random.default_rng(3)
    said = [compare_paired(rng.normal(size=6), rng.normal(size=6)).direction for _ in range(300)]
    assert np.mean(np.abs(said)) < 0.14
    assert compare_paired([1.0, 2.0], [1.0, 2.0]).direction == 0  # identical: a zero difference


@pytest.mark.parametrize(
    "a, b, named",
    [
        ([1.0, 2.0], [1.0], "a has 2 values and b 1"),
        ([1.0], [1.0], "a has 1 values and b 1"),
        ([1.0, math.inf], [1.0, 2.0], "inf is not a finite measurement"),
    ],
)
def test_paired_bad_input_is_named(a, b, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        compare_paired(a, b)


def test_paired_t_interval_is_students_and_resolves_a_consistent_difference_of_three_pairs():
    a, b = [1.0, 1.2, 1.1], [0.0, 0.1, 0.05]
    c = compare_paired(a, b, method="t")
    d = np.subtract(a, b)
    half = 2.919986 * d.std(ddof=1) / np.sqrt(3)  # t(0.95, 2 degrees of freedom)
    assert (c.difference, c.low, c.high) == pytest.approx(
        (d.mean(), d.mean() - half, d.mean() + half), rel=1e-5
    )
    assert c.direction == 1 and compare_paired(a, b).direction == 0  # the rank test cannot
    two = compare_paired([1.0, 1.01], [0.0, 0.0], method="t")
    assert two.direction == 0 and "2 pairs: too few to bound it" in two.says("a", "b")
    with pytest.raises(ValueError, match="method 'z' is not"):
        compare_paired(a, b, method="z")


def test_bootstrap_interval_holds_the_difference_and_resolves_a_clear_one():
    rng = np.random.default_rng(1)
    b = (rng.random(2000) < 0.80).astype(int)
    a = np.where(rng.random(2000) < 0.5, 1, b)  # a fixes about half of b's mistakes
    verdict = compare_bootstrap(a, b, more="more accurate", less="less accurate")
    assert verdict.low < verdict.difference < verdict.high
    assert verdict.difference == pytest.approx(a.mean() - b.mean())
    assert verdict.word == "more accurate" and verdict.low > 0
    assert "over 2,000 examples" in verdict.says("a", "b")
    flipped = compare_bootstrap(b, a, more="more accurate", less="less accurate")
    assert flipped.word == "less accurate"


def test_bootstrap_names_no_direction_for_two_samples_of_one_model():
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(200):
        a, b = ((rng.random(300) < 0.9).astype(int) for _ in range(2))
        hits += compare_bootstrap(a, b, draws=200).direction != 0
    # two models of equal accuracy: a 90 % interval names a direction about 10 % of the time
    # (20 of 200 expected, standard deviation about 4)
    assert hits < 40, hits
    same = compare_bootstrap([1, 0, 1, 1], [1, 0, 1, 1])
    assert same.direction == 0 and same.says("a", "b").startswith("a against b: no difference")


@pytest.mark.parametrize(
    "a,b,kwargs,message",
    [
        ([1, 0, 1], [1, 0], {}, "a has 3 scores and b 2"),
        ([1, float("nan")], [1, 0], {}, "every score must be finite"),
        ([1, 0], [1, 0], {"draws": 10}, "draws 10 must be an integer >= 100"),
        ([1, 0], [1, 0], {"level": 1.2}, "level 1.2 must be in"),
    ],
)
def test_bootstrap_names_bad_input(a, b, kwargs, message):
    with pytest.raises(ValueError, match=message):
        compare_bootstrap(a, b, **kwargs)


def test_a_bootstrap_end_near_zero_gets_the_digits_that_show_its_sign():
    rng = np.random.default_rng(0)
    a = (rng.random(20_000) < 0.5004).astype(float)
    v = compare_bootstrap(a, np.zeros_like(a) + 0.5, seed=0)
    text = v.interval()
    assert "+0.000 " not in text and "-0.000 " not in text and "to +0.000," not in text, text
    assert compare_bootstrap([1.0, 0.0] * 50, [1.0, 0.0] * 50).interval().startswith("+0.000 (")
