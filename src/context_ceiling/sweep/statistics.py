"""Intervals and sample sizes for the sweep's decision (the statistics, apart from the data).

Why not a percentile bootstrap: at the item counts a sweep can afford
and the accuracies a good model reaches, it undercovers on the optimistic side (at 10 items the
lower bound of a paired difference lay above the truth in up to 47% of simulated data sets) and
returns zero-width intervals whenever every item agrees. The intervals here are studentized
(t with n-1 degrees of freedom, items as the unit, so repeats stay with their item) and computed
with pseudo-observations in the manner of Agresti-Coull (one level's accuracy: a quarter item
always right, a quarter always wrong) and Agresti-Min (a paired difference: an eighth of an item
at +1, an eighth at -1, a quarter at 0). The pseudo-items keep an interval from collapsing to a point when all items agree and
vanish in weight as items are added. ``benchmarks/validity.py`` measures their coverage against
known truth at every item count the sweep allows; the table is on the docs' validity page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054
Z90 = 1.6448536269514722
MIN_ITEMS = 20
"""Fewer items than this at a level and the level cannot pass or decide anything."""

_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_T95 = (
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
    1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
    1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
)  # fmt: skip

# weights chosen by the coverage study: a quarter of Agresti-Coull's / Agresti-Min's (their full
# weights overcover at 10-20 items, 98-99%, once items are the unit)
ACCURACY_PSEUDO: tuple[tuple[float, float], ...] = ((1.0, 0.25), (0.0, 0.25))
DIFFERENCE_PSEUDO: tuple[tuple[float, float], ...] = ((1.0, 0.125), (-1.0, 0.125), (0.0, 0.25))


def t975(df: int) -> float:
    """The 97.5% quantile of Student's t (a table to 30, a Cornish-Fisher expansion above)."""
    return _t(df, _T975, Z95)


def t95(df: int) -> float:
    """The 95% quantile of Student's t: the one-sided 95% bound."""
    return _t(df, _T95, Z90)


def _t(df: int, table: tuple[float, ...], z: float) -> float:
    if df < 1:
        return math.inf
    if df <= len(table):
        return table[df - 1]
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def interval(
    values: Sequence[float],
    pseudo: Sequence[tuple[float, float]],
    lo: float,
    hi: float,
    one_sided: bool = False,
) -> tuple[float, float]:
    """A two-sided 95% interval for the mean of ``values`` (one per item), clipped to
    ``[lo, hi]`` and widened if need be to contain the plain mean; ``one_sided``: the bounds of
    a 90% interval, each a one-sided 95% bound. No values: the whole range."""
    n = len(values)
    if n == 0:
        return (lo, hi)
    w = n + sum(wt for _, wt in pseudo)
    m = (sum(values) + sum(v * wt for v, wt in pseudo)) / w
    ss = sum((v - m) ** 2 for v in values) + sum(wt * (v - m) ** 2 for v, wt in pseudo)
    q = t95(n - 1) if one_sided else t975(n - 1)
    h = q * math.sqrt(ss / (w - 1) / w) if n > 1 else hi - lo
    raw = sum(values) / n
    return (round(max(lo, min(m - h, raw)), 6), round(min(hi, max(m + h, raw)), 6))


def accuracy_interval(item_means: Sequence[float]) -> tuple[float, float]:
    return interval(item_means, ACCURACY_PSEUDO, 0.0, 1.0)


def difference_interval(diffs: Sequence[float]) -> tuple[float, float]:
    return interval(diffs, DIFFERENCE_PSEUDO, -1.0, 1.0)


def difference_lower(diffs: Sequence[float]) -> float:
    """The one-sided 95% lower bound of a paired difference: what a level's pass is tested on
    (non-inferiority at 5%, the fixed-sequence chain keeping the familywise error at 5%)."""
    return interval(diffs, DIFFERENCE_PSEUDO, -1.0, 1.0, one_sided=True)[0]


def difference_sd(accuracy: float, repeats: int, within_item: float = 0.2) -> float:
    """Planning value of the SD of one item's paired difference (mean of ``repeats`` calls at a
    level minus the same at the reference): two independent item means of Bernoulli calls whose
    repeats are correlated ``within_item`` (same item, same evidence: they agree more often than
    chance). Conservative: it ignores the part of item difficulty that cancels in the pairing."""
    p = min(max(accuracy, 0.05), 0.95)
    r = max(1, repeats)
    return math.sqrt(2 * p * (1 - p) * (1 + (r - 1) * within_item) / r)


def expected_half_width(n_items: int, repeats: int, accuracy: float = 0.8) -> float:
    """The half-width a two-sided 95% paired-difference interval is expected to have."""
    if n_items < 2:
        return 1.0
    return t975(n_items - 1) * difference_sd(accuracy, repeats) / math.sqrt(n_items)


def items_for(half_width: float, repeats: int, accuracy: float = 0.8) -> int:
    """Items needed for a paired-difference interval of ``half_width`` (at least MIN_ITEMS)."""
    sd = difference_sd(accuracy, repeats)
    n = max(MIN_ITEMS, math.ceil((Z95 * sd / half_width) ** 2))
    while expected_half_width(n, repeats, accuracy) > half_width:
        n += 1
    return n
