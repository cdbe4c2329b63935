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

The test and its inversion are standard (Hollander, Wolfe and Chicken, *Nonparametric
Statistical Methods*, ch. 4); SciPy has the test but not the interval, so the inversion is ours.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

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


def _accepted(log_a: np.ndarray, log_b: np.ndarray, shift: float, alpha: float) -> bool:
    """Whether a shift of log a by `shift` is not rejected by the two-sided Mann-Whitney test."""
    from scipy.stats import mannwhitneyu

    p = mannwhitneyu(log_a - shift, log_b, alternative="two-sided", method="exact").pvalue
    return bool(p > alpha + 1e-9)  # exact p-values are fractions: 1/10 must reject at 90 %


def _interval(log_a: np.ndarray, log_b: np.ndarray, level: float) -> tuple[float, float]:
    """The shifts of log a not rejected at 1 - level: (low, high), infinite when unbounded."""
    diffs = np.sort(np.subtract.outer(log_a, log_b).ravel())
    # the test's p-value changes only at the pairwise differences: try one shift in each gap
    edges = np.concatenate(([diffs[0] - 1.0], (diffs[:-1] + diffs[1:]) / 2, [diffs[-1] + 1.0]))
    ok = [_accepted(log_a, log_b, s, 1 - level) for s in edges]
    if not any(ok):  # cannot happen for level < 1; kept as a clear failure, not a wrong interval
        raise ValueError(f"compare: no ratio is accepted at level {level}")
    first = ok.index(True)
    last = len(ok) - 1 - ok[::-1].index(True)
    low = -math.inf if first == 0 else float(diffs[first - 1])
    high = math.inf if last == len(ok) - 1 else float(diffs[last])
    return low, high


@dataclass(frozen=True)
class Comparison:
    """a against b: `ratio` a / b, its interval [low, high], and the word a sentence may use."""

    a: tuple[float, ...]
    b: tuple[float, ...]
    ratio: float
    low: float
    high: float
    level: float
    more: str  # the word when a is larger than b ("slower" for times, "higher" for accuracy)
    less: str

    @property
    def direction(self) -> int:
        """+1 when a is larger than b beyond doubt at this level, -1 when smaller, else 0."""
        return 1 if self.low > 1 else -1 if self.high < 1 else 0

    @property
    def word(self) -> str | None:
        return {1: self.more, -1: self.less, 0: None}[self.direction]

    def interval(self) -> str:
        """'1.11x (0.95x to 1.30x, 90 % interval, 3 and 3 repeats)'."""
        counts = f"{len(self.a)} and {len(self.b)} repeats"
        level = f"{self.level * 100:.0f} %"
        if math.isinf(self.high) or self.low == 0:
            return f"{self.ratio:.2f}x ({counts}: too few to bound it at {level})"
        return (
            f"{self.ratio:.2f}x ({self.low:.2f}x to {self.high:.2f}x, {level} interval, {counts})"
        )

    def says(self, a_name: str, b_name: str) -> str:
        """'A against B: slower, 1.31x (...)' or 'A against B: no difference ..., 1.02x (...)'."""
        return f"{a_name} against {b_name}: {self.word or UNRESOLVED}, {self.interval()}"


def compare(
    a: Sequence[float],
    b: Sequence[float],
    *,
    more: str = "larger",
    less: str = "smaller",
    level: float = 0.9,
) -> Comparison:
    """Repeated measurements a against b (see the module's docstring); raises on bad input."""
    if not 0.5 <= level < 1:
        raise ValueError(f"compare: level {level!r} must be in [0.5, 1), for example 0.9")
    a, b = _checked("a", a), _checked("b", b)
    log_a, log_b = np.log(a), np.log(b)
    low, high = _interval(log_a, log_b, level)
    center = float(np.median(np.subtract.outer(log_a, log_b)))
    return Comparison(a, b, math.exp(center), math.exp(low), math.exp(high), level, more, less)
