"""Two sets of repeated measurements compared, and the words a sentence about them may use.

On a shared 2-core machine one timing of each side decides nothing: the next run may reverse
it. `compare(a, b)` takes the repeats of each side and gives
- the ratio a / b as the median of every pairwise ratio a_i / b_j (the Hodges-Lehmann estimate
  on a log scale: one slow outlier moves it little);
- an interval for that ratio: the ratios at which SciPy's exact Mann-Whitney test (two-sided,
  on the logarithms) stops rejecting, at the given level (90 % by default). With 3 repeats a
  side, that interval is the range of the 9 pairwise ratios, so a direction is said only when
  every repeat of one side beats every repeat of the other; 2 repeats a side can never resolve
  one at 90 %, and the comparison says so;
- the word: `more` when the interval lies above 1, `less` below, else no word, and `says()`
  prints "no difference this machine can resolve".

`compare_paired(a, b)` is the same for paired measurements (a_i and b_i share a seed, a data
order or a moment of the machine): the difference a - b, as the median of the Walsh averages of
the per-pair differences, with the interval at which SciPy's exact Wilcoxon signed-rank test stops
rejecting. With 3 pairs no direction can be resolved at 90 % (the smallest two-sided p-value is
1/4); 5 pairs that all agree resolve one.

The tests and their inversion are standard (Hollander, Wolfe and Chicken, *Nonparametric
Statistical Methods*, ch. 4); SciPy has the test but not the interval, so the inversion is ours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

UNRESOLVED = "no difference this machine can resolve"


def _checked(name: str, values: Sequence[float]) -> tuple[float, ...]:
    out = tuple(float(v) for v in values)
    if len(out) < 2:
        raise ValueError(
            f"compare: {name} has {len(out)} measurement(s) {list(out)}: repeat it at least "
            f"twice (3 or more to be able to resolve a difference at 90 %)"
        )
    bad = [v for v in out if not (math.isfinite(v) and v > 0)]
    if bad:
        raise ValueError(
            f"compare: {name} holds {bad[0]!r}: give positive, finite measurements "
            f"(times, rates, losses), compared as ratios"
        )
    return out


def _check_level(name: str, level: float) -> None:
    if not 0.5 <= level < 1:
        raise ValueError(f"{name}: level {level!r} must be in [0.5, 1), for example 0.9")


def _not_rejected(points: np.ndarray, p_values, level: float) -> tuple[float, float]:
    """The shifts a test does not reject at 1 - level, as (low, high), infinite when unbounded.

    A rank test's p-value changes only at `points` (the pairwise differences, or the Walsh
    averages), so one shift in each gap between them decides the whole gap. `p_values` maps
    an array of shifts to the test's p-value at each (one vectorised SciPy call)."""
    points = np.sort(points)
    edges = np.concatenate(([points[0] - 1.0], (points[:-1] + points[1:]) / 2, [points[-1] + 1]))
    # exact p-values are fractions: 1/10 must reject at 90 %, whatever its rounding
    ok = [bool(p > 1 - level + 1e-9) for p in np.asarray(p_values(edges), dtype=float)]
    if not any(ok):  # cannot happen for level < 1; kept as a clear failure, not a wrong interval
        raise ValueError(f"compare: no shift is accepted at level {level}")
    first = ok.index(True)
    last = len(ok) - 1 - ok[::-1].index(True)
    low = -math.inf if first == 0 else float(points[first - 1])
    high = math.inf if last == len(ok) - 1 else float(points[last])
    return low, high


def _interval(log_a: np.ndarray, log_b: np.ndarray, level: float) -> tuple[float, float]:
    """The shifts of log a that SciPy's exact two-sided Mann-Whitney test does not reject."""
    from scipy.stats import mannwhitneyu

    def p_values(shifts: np.ndarray) -> np.ndarray:  # a row of log a - shift per shift
        rows = log_a[None, :] - shifts[:, None]
        return mannwhitneyu(
            rows, log_b[None, :], alternative="two-sided", method="exact", axis=1
        ).pvalue

    return _not_rejected(np.subtract.outer(log_a, log_b).ravel(), p_values, level)


@dataclass(frozen=True)
class _Verdict:
    """Two sides' measurements, an interval for how they differ, and the words for a sentence."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    low: float
    high: float
    level: float
    more: str  # the word when a is larger than b ("slower" for times, "higher" for accuracy)
    less: str
    NO_DIFFERENCE: ClassVar[float]  # 1 for a ratio, 0 for a difference

    @property
    def direction(self) -> int:
        """+1 when a is larger than b beyond doubt at this level, -1 when smaller, else 0."""
        null = self.NO_DIFFERENCE
        return 1 if self.low > null else -1 if self.high < null else 0

    @property
    def word(self) -> str | None:
        return {1: self.more, -1: self.less, 0: None}[self.direction]

    def interval(self) -> str:
        raise NotImplementedError

    def says(self, a_name: str, b_name: str, unresolved: str = UNRESOLVED) -> str:
        """'A against B: slower, 1.31x (...)' or 'A against B: no difference ..., 1.02x (...)';
        `unresolved` names what could not resolve it (pairs of seeds are not "this machine")."""
        return f"{a_name} against {b_name}: {self.word or unresolved}, {self.interval()}"

    def _text(self, estimate: float, value, counts: str) -> str:
        """The estimate and its interval, each figure written by `value`, then the counts."""
        level = f"{self.level * 100:.0f} %"
        if math.isinf(self.high) or math.isinf(self.low) or self.low == 0 < self.NO_DIFFERENCE:
            return f"{value(estimate)} ({counts}: too few to bound it at {level})"
        return (
            f"{value(estimate)} ({value(self.low)} to {value(self.high)}, {level} interval, "
            f"{counts})"
        )


@dataclass(frozen=True)
class Comparison(_Verdict):
    """a against b: `ratio` a / b, its interval [low, high], and the word a sentence may use."""

    ratio: float = 1.0
    NO_DIFFERENCE: ClassVar[float] = 1.0

    def interval(self) -> str:
        """'1.11x (0.95x to 1.30x, 90 % interval, 3 and 3 repeats)'."""
        counts = f"{len(self.a)} and {len(self.b)} repeats"
        return self._text(self.ratio, lambda v: f"{v:.2f}x", counts)


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    more: str = "larger",
    less: str = "smaller",
    level: float = 0.9,
) -> Comparison:
    """Repeated measurements a against b (see the module's docstring); raises on bad input."""
    _check_level("compare", level)
    a, b = _checked("a", a), _checked("b", b)
    log_a, log_b = np.log(a), np.log(b)
    low, high = _interval(log_a, log_b, level)
    center = float(np.median(np.subtract.outer(log_a, log_b)))
    return Comparison(
        a, b, math.exp(low), math.exp(high), level, more, less, ratio=math.exp(center)
    )


def _walsh(d: np.ndarray) -> np.ndarray:
    """The averages of every pair of differences, each with itself too (Walsh averages)."""
    return np.array([(d[i] + d[j]) / 2 for i in range(len(d)) for j in range(i, len(d))])


def _paired_interval(d: np.ndarray, level: float) -> tuple[float, float]:
    """The shifts of the differences SciPy's exact Wilcoxon signed-rank test does not reject."""
    from scipy.stats import wilcoxon

    def p_values(shifts: np.ndarray) -> np.ndarray:  # a row of d - shift per shift
        return wilcoxon(d[None, :] - shifts[:, None], method="exact", axis=1).pvalue

    return _not_rejected(_walsh(d), p_values, level)


@dataclass(frozen=True)
class PairedComparison(_Verdict):
    """a - b over pairs: `difference`, its interval [low, high], and the word."""

    difference: float = 0.0
    NO_DIFFERENCE: ClassVar[float] = 0.0

    def interval(self, digits: int = 4) -> str:
        """'+0.0030 (-0.0010 to +0.0050, 90 % interval, 5 pairs)'."""
        return self._text(self.difference, lambda v: f"{v:+.{digits}f}", f"{len(self.a)} pairs")


def compare_paired(
    a: Sequence[float],
    b: Sequence[float],
    *,
    more: str = "larger",
    less: str = "smaller",
    level: float = 0.9,
    method: str = "wilcoxon",
) -> PairedComparison:
    """Paired measurements a_i against b_i (see the module's docstring); raises on bad input.

    method="t" gives the mean difference and Student's t interval instead: it assumes the
    differences are roughly normal (which a handful of pairs cannot show), and in exchange it
    can resolve a large, consistent difference from 3 pairs, where the rank test cannot. It
    bounds nothing from 2 pairs (one degree of freedom)."""
    if method not in ("wilcoxon", "t"):
        raise ValueError(f"compare_paired: method {method!r} is not 'wilcoxon' or 't'")
    _check_level("compare_paired", level)
    a, b = (tuple(float(v) for v in x) for x in (a, b))
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"compare_paired: a has {len(a)} values and b {len(b)}: give one value of each per "
            f"pair, at least 2 pairs (5 or more to be able to resolve a difference at 90 %)"
        )
    bad = [v for v in a + b if not math.isfinite(v)]
    if bad:
        raise ValueError(f"compare_paired: {bad[0]!r} is not a finite measurement")
    d = np.subtract(a, b)
    if np.all(d == 0):
        return PairedComparison(a, b, 0.0, 0.0, level, more, less, difference=0.0)
    if method == "t":
        from scipy.stats import t

        mean = float(d.mean())
        if len(d) < 3:  # one degree of freedom: its spread is a guess, so no bound
            return PairedComparison(a, b, -math.inf, math.inf, level, more, less, difference=mean)
        half = t.ppf((1 + level) / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
        return PairedComparison(a, b, mean - half, mean + half, level, more, less, difference=mean)
    low, high = _paired_interval(d, level)
    median = float(np.median(_walsh(d)))
    return PairedComparison(a, b, low, high, level, more, less, difference=median)


@dataclass(frozen=True)
class BootstrapComparison(PairedComparison):
    """a - b, the mean of per-example scores on the same examples, with a bootstrap interval."""

    draws: int = 0

    def interval(self, digits: int = 3) -> str:
        """'+0.012 (+0.004 to +0.020, 90 % bootstrap interval over 5,000 examples)'; with more
        digits where an end that is not 0 would read as one (a resolved +0.0004 is not +0.000)."""
        level = f"{self.level * 100:.0f} %"
        ends = (self.difference, self.low, self.high)
        while digits < 6 and any(v != 0 and round(v, digits) == 0 for v in ends):
            digits += 1
        return (
            f"{self.difference:+.{digits}f} ({self.low:+.{digits}f} to {self.high:+.{digits}f}, "
            f"{level} bootstrap interval over {len(self.a):,} examples)"
        )


def compare_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    *,
    more: str = "higher",
    less: str = "lower",
    level: float = 0.9,
    draws: int = 1000,
    seed: int = 0,
) -> BootstrapComparison:
    """Per-example scores a_i and b_i of two models on the same held-out examples (1 for a
    correct prediction, 0 for a wrong one): the difference of their means, and the percentile
    interval of that difference over `draws` redraws of the examples with replacement (Efron and
    Tibshirani, *An Introduction to the Bootstrap*, ch. 13). It measures how much the sample of
    examples alone could move the difference, not a change of training seed."""
    _check_level("compare_bootstrap", level)
    a, b = (np.asarray(x, dtype=float).ravel() for x in (a, b))
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(
            f"compare_bootstrap: a has {len(a)} scores and b {len(b)}: give one score of each "
            f"per example, on the same examples"
        )
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("compare_bootstrap: every score must be finite (NaN or inf given)")
    if not (isinstance(draws, int) and draws >= 100):
        raise ValueError(f"compare_bootstrap: draws {draws!r} must be an integer >= 100")
    d = a - b
    rows = np.random.default_rng(seed).integers(0, len(d), size=(draws, len(d)))
    low, high = np.percentile(d[rows].mean(axis=1), [50 * (1 - level), 50 * (1 + level)])
    return BootstrapComparison(
        tuple(a),
        tuple(b),
        float(low),
        float(high),
        level,
        more,
        less,
        difference=float(d.mean()),
        draws=draws,
    )
