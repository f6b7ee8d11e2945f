"""Bounds and sample sizes for the sweep's decision (the statistics, apart from the data).

**The pass test** (is a level's accuracy within ``tolerance`` of the reference's?) is a one-sided
lower bound on the mean paired difference (one value per item: the item's mean over its repeats at
the level minus the same at the reference). It is the betting confidence sequence of Waudby-Smith
and Ramdas ("Estimating means of bounded random variables by betting", JRSS-B 86(1), 2024; the
hedged capital process with predictable plug-in bets, one-sided): a bet on each item in turn, and
every candidate mean whose wealth ever reaches ``1/alpha`` is ruled out (Ville's inequality).
Why this and not a t-interval or group-sequential boundaries:

- it is valid at every sample size and at any accuracy, with no normal approximation: a t-bound
  passes a level that really dropped too often when the reference is near 100% (most paired
  differences are 0 and the few failures are what decide);
- it is *anytime-valid*: the adaptive design looks again after every batch of items it adds and
  stops when a level passes, which inflates the error of any fixed-sample bound (optional
  stopping); a confidence sequence keeps its error at ``alpha`` however often it is looked at and
  whenever the looking stops, with no schedule of looks fixed in advance (group-sequential
  boundaries with alpha spending need the looks' information fractions, which a sweep stopped by
  a budget or a task set running out does not know);
- its bets are tuned to a horizon (the items the plan expects at that level), which makes it
  about as tight as a fixed-sample bound there, and still valid before and after.

The error is spent once over everything the sweep tests: the grid's chain (tested from the
reference up, each level only if every lower one passed: a fixed sequence) at ``GRID_ALPHA``, and
the refinement's midpoints, chosen by the data, at ``REFINE_ALPHA`` given out in shares over at
most ``MAX_REFINEMENTS`` of them (:func:`refine_alphas`: a midpoint above a passed one keeps its
share, one below a failed one gets half of what is left; a union bound over the shares): the
chance that any level past the true drop passes is at most ``GRID_ALPHA + REFINE_ALPHA`` = 5%.
A refined midpoint is the exception to "every look": its items are fixed before it is measured
(:func:`refined_items`) and it can pass only once it has them all, on one fixed-sample test
(:func:`refined_bounds`, :func:`fixed_bounds`: Student's t corrected for skewness), which at the
same error lies closer to the mean; before that it can only fail, which never adds a pass.

**Reported intervals**: a level's accuracy has a Wilson score interval over items (valid near 0%
and 100%, where the normal one collapses; conservative when repeats agree); the closed-book
control and the low-fill control keep studentized t-intervals with pseudo-observations (Agresti-
Coull / Agresti-Min style), which ``benchmarks/validity.py`` checks for coverage.

**Sample size** (:func:`items_for`) is planned for power: the items at which a level with no drop
at all passes with probability ``POWER`` on the first look, at a planning SD of the paired
difference; not for an interval's width alone.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

Z95 = 1.959963984540054
Z90 = 1.6448536269514722
MIN_ITEMS = 20
"""Fewer items than this at a level and the level cannot pass or decide anything."""
ALPHA = 0.05
"""The chance, over the whole sweep, that a level past the true drop passes."""
GRID_ALPHA = 0.03
"""The grid's chain's share of ``ALPHA``."""
REFINE_ALPHA = ALPHA - GRID_ALPHA
"""The refinement's share (:func:`refine_alphas`)."""
MAX_REFINEMENTS = 4


def refine_alphas(refined: Sequence[float]) -> list[float]:
    """The error each refined level is tested at, ``refined`` in the order the refinement added
    them. A share of ``REFINE_ALPHA`` can be spent on at most one level past the true drop: the
    chain is tested from the reference up, so a level is reached only if every level below it
    passed. A midpoint added above the one before it (that one passed) therefore takes over its
    share, as a rejected hypothesis passes its error on in a graphical multiple-testing procedure:
    of the levels holding one share, only the lowest past the drop can pass wrongly. A midpoint
    added below the one before it (that one failed) gets half of what is not yet given out. The
    shares given out never exceed ``REFINE_ALPHA``; a bisection that keeps passing tests every
    midpoint at half of it, where halving from one midpoint to the next would test the third at
    an eighth of it."""
    out: list[float] = []
    left = REFINE_ALPHA
    for k, lv in enumerate(refined):
        if k >= MAX_REFINEMENTS:
            out.append(0.0)
        elif k and lv > refined[k - 1] and out[-1] > 0:
            out.append(out[-1])
        else:
            left /= 2
            out.append(left)
    return out


ADDED_REPEATS = 1
"""How many times the calls the design adds after the opening are asked per item and level: the
items it draws where a decision is open, the refinement's and the dip scan's points. The opening
asks every item ``--repeats`` times at every grid level (the spread across repeats is reported
from it). After it, a call buys more as a new item than as a repeat: an item mean over ``r``
repeats has variance ``s_b + s_w / r`` (between items, within an item), so ``r`` calls on new
items give ``r / (s_b + s_w)`` of information and ``r`` repeats of one new item
``1 / (s_b + s_w / r)``, never more; with a deterministic endpoint the repeats agree and add
nothing at all. The pass test's paired difference stays unbiased whatever the repeats (a point
asked once against the reference's mean over its repeats)."""


POWER = 0.8
"""The chance a level with no drop passes on its first look, at the planned sample size."""
REFINE_POWER = 0.8
"""The chance a refined level with no drop passes its one test, on the items planned for it."""
_BET_CAP = 0.75  # the hedged capital's truncation c: a bet stakes at most 3/4 of the wealth

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

# weights chosen by the coverage study: a quarter of Agresti-Min's (its full weights overcover
# at 10-20 items, 98-99%, once items are the unit)
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


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (``p`` > 0.5), by the Cornish-Fisher expansion of the
    normal quantile (as :func:`t95`): within 0.01 of the exact value from 20 degrees of freedom
    at the refinement's error rates."""
    from statistics import NormalDist

    return _t(df, (), NormalDist().inv_cdf(p)) if df > 0 else math.inf


def fixed_width(n_items: int, sd: float, alpha: float) -> float:
    """How far below the mean :func:`fixed_bounds` puts its lower bound at ``n_items`` items
    whose paired differences have SD ``sd``."""
    return t_quantile(1 - alpha, n_items - 1) * sd / math.sqrt(n_items) if alpha > 0 else 2.0


def fixed_bounds(diffs: Sequence[float], alpha: float) -> tuple[float, float]:
    """One-sided lower and upper bounds of a paired difference at ``alpha`` each, for a sample
    whose size was fixed before it was drawn and that is tested once: Student's t with Johnson's
    correction for skewness (Johnson, "Modified t tests and confidence intervals for asymmetrical
    populations", JASA 1978), the variance kept from vanishing by the pseudo-observations. Near
    100% accuracy a drop is a few items answered wrong, the differences are skewed, and the plain
    t bound passes a level that dropped by the tolerance several times as often as its error
    says; the correction holds it there from about ``FIXED_MIN_ITEMS`` items
    (``benchmarks/validity.py``'s coverage table). Narrower than the anytime-valid bounds at the
    same size, and valid only for that one look."""
    n = len(diffs)
    if n < 2 or alpha <= 0:
        return (-1.0, 1.0)
    m, v = mean_and_variance(diffs)
    var = max(sum((x - m) ** 2 for x in diffs) / (n - 1), v * n)  # one item's, floored
    third = sum((x - m) ** 3 for x in diffs) / n
    q = t_quantile(1 - alpha, n - 1) * math.sqrt(v)
    a, b = third / (3 * var * var), third / (6 * var * n)

    def shift(c: float) -> float | None:
        # the d = mean - mu at which Johnson's statistic, (d + b + a d^2) / se, equals c / se
        if abs(a) < 1e-12:
            return c - b
        disc = 1 - 4 * a * (b - c)
        return None if disc < 0 else (-1 + math.sqrt(disc)) / (2 * a)

    low, high = shift(q), shift(-q)
    return (
        round(-1.0 if low is None else max(-1.0, m - low), 6),
        round(1.0 if high is None else min(1.0, m - high), 6),
    )


FIXED_MIN_ITEMS = 300
"""Fewer items planned for a refined level's test than this and it is tested with the
anytime-valid bound at every look instead: below it even the corrected t bound passes a level
that dropped too often at high accuracy (a drop there is a dozen items answered wrong)."""
FIXED_SHARE = 0.75
"""A refined level's fixed-sample test runs at this part of its share of the error: the t
bound is an approximation, and at 95-99% accuracy it passes a level that dropped by exactly the
tolerance up to about 1.5 times as often as its error says (the coverage table); at three
quarters of the share it stays within the share."""


def refined_items(
    tolerance: float, repeats: int, level_repeats: int, alpha: float, cap: int
) -> int:
    """The items a refined level's one pass test is run on, fixed before it is measured: as
    many as a level with no drop needs to pass that test with probability ``REFINE_POWER`` (the
    planning accuracy's spread: ``level_repeats`` calls per item there, ``repeats`` at the
    reference), at most ``cap``."""
    from statistics import NormalDist

    p, w = 0.8, 0.2  # the planning accuracy and within-item agreement of :func:`difference_sd`
    var = p * (1 - p) * sum((1 + (r - 1) * w) / r for r in (max(1, repeats), max(1, level_repeats)))
    z = NormalDist().inv_cdf(REFINE_POWER)
    n = MIN_ITEMS
    a = alpha * FIXED_SHARE
    for _ in range(4):  # the t quantile depends on n: a few rounds settle it
        n = max(MIN_ITEMS, math.ceil((t_quantile(1 - a, n - 1) + z) ** 2 * var / tolerance**2))
    return max(MIN_ITEMS, min(cap, n))


def refined_bounds(
    diffs: Sequence[float], first: Sequence[float], alpha: float, done: bool
) -> tuple[float, float]:
    """The bounds a refined level is tested on. ``first``: its paired differences on the items
    fixed for its one test (:func:`refined_items`, the first drawn), ``done`` once it has them
    all; ``diffs``: all it has, in the order drawn. Before ``done``, no lower bound (it cannot
    pass yet) and the anytime-valid upper one (a level that has clearly dropped fails early);
    then :func:`fixed_bounds` on ``first`` (at ``FIXED_SHARE`` of ``alpha``). A pass is concluded
    at that one look only, so its error is the fixed-sample test's: failing earlier only removes
    passes."""
    if done:
        return fixed_bounds(first, alpha * FIXED_SHARE)
    high = -betting_lower([-d for d in diffs], -1.0, 1.0, alpha) if diffs else 1.0
    return (-1.0, round(high, 6))


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


def mean_and_variance(
    values: Sequence[float], pseudo: Sequence[tuple[float, float]] = DIFFERENCE_PSEUDO
) -> tuple[float, float]:
    """The mean of ``values`` and the variance of that mean, the pseudo-observations keeping the
    variance from vanishing when every value agrees. No values: (0, inf)."""
    n = len(values)
    if n == 0:
        return (0.0, math.inf)
    w = n + sum(wt for _, wt in pseudo)
    m = (sum(values) + sum(v * wt for v, wt in pseudo)) / w
    ss = sum((v - m) ** 2 for v in values) + sum(wt * (v - m) ** 2 for v, wt in pseudo)
    return (sum(values) / n, ss / max(w - 1, 1) / w)


def drop_now_lower(then: Sequence[float], change: Sequence[float], now: Sequence[float]) -> float:
    """A one-sided 95% lower bound for a level's drop from the reference now, from the more
    precise of two estimates: the baseline's drop on all its items plus the change measured on
    the items paired since (precise when the endpoint answers the same calls the same way), and
    the drop measured now alone (precise when it samples fresh answers: the change then carries
    the baseline's noise twice). The choice is made on the two standard errors, never on the
    estimates, so the bound keeps its 95% (a union bound over both, as before, would give each
    only 97.5%, and a sampled endpoint's checks would end inconclusive for nothing)."""
    m1, v1 = mean_and_variance(then)
    m2, v2 = mean_and_variance(change)
    m3, v3 = mean_and_variance(now)
    if v1 + v2 <= v3:
        return round(m1 + m2 - t95(min(len(then), len(change)) - 1) * math.sqrt(v1 + v2), 6)
    return round(m3 - t95(len(now) - 1) * math.sqrt(v3), 6)


def accuracy_interval(item_means: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """A Wilson score interval (95% two-sided) for mean accuracy over items, each item's mean
    over its repeats counted as one observation in [0, 1]: its variance is at most that of one
    Bernoulli call, so the interval is exact in the limit and conservative when repeats agree less
    than perfectly. No items: the whole range."""
    n = len(item_means)
    if n == 0:
        return (0.0, 1.0)
    return wilson(sum(item_means) / n, n, z)


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a mean accuracy ``p`` over ``n`` items at ``z`` standard
    errors (:func:`accuracy_interval`'s, from the mean and the count)."""
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (round(max(0.0, min(centre - half, p)), 6), round(min(1.0, max(centre + half, p)), 6))


def difference_interval(diffs: Sequence[float]) -> tuple[float, float]:
    """A studentized 95% interval for a paired difference (the controls' comparisons)."""
    return interval(diffs, DIFFERENCE_PSEUDO, -1.0, 1.0)


def betting_lower(
    values: Sequence[float], lo: float, hi: float, alpha: float, horizon: int | None = None
) -> float:
    """The anytime-valid lower confidence bound for the mean of ``values`` (each in
    ``[lo, hi]``, in the order they were drawn) at error ``alpha``: the hedged-capital betting
    confidence sequence, one-sided, intersected over time. ``horizon``: the sample size the bets
    are tuned for (predictable: it must not depend on the data; default the sample's own size).
    Never above the sample mean. No values: ``lo``."""
    n = len(values)
    if n == 0:
        return lo
    import numpy as np  # the sweep's extra; only the analysis needs it

    x = (np.asarray(values, dtype=float) - lo) / (hi - lo)
    t = np.arange(1, n + 1)
    mu = (0.5 + np.cumsum(x)) / (t + 1)
    var = (0.25 + np.cumsum((x - mu) ** 2)) / (t + 1)
    before = np.concatenate(([0.25], var[:-1]))  # predictable: through the item before
    log_a = math.log(1 / alpha)
    lam = np.sqrt(2 * log_a / (before * max(horizon or n, 1)))
    mean = float(x.mean())

    def ruled_out(m: float) -> bool:
        bets = np.minimum(lam, _BET_CAP / m)
        return bool(np.cumsum(np.log1p(bets * (x - m))).max() >= log_a)

    if mean <= 0 or not ruled_out(1e-12):
        return lo
    if ruled_out(mean):
        return lo + mean * (hi - lo)
    a, b = 0.0, mean
    while b - a > 1e-5:  # the wealth falls as m rises: bisect for where it stops reaching 1/alpha
        mid = (a + b) / 2
        a, b = (mid, b) if ruled_out(mid) else (a, mid)
    return round(lo + a * (hi - lo), 6)


def difference_bounds(
    diffs: Sequence[float], alpha: float = GRID_ALPHA, horizon: int | None = None
) -> tuple[float, float]:
    """One-sided lower and upper bounds of a paired difference at ``alpha`` each (anytime-valid):
    the lower is what a level's pass is tested on, the upper what says it clearly dropped."""
    low = betting_lower(diffs, -1.0, 1.0, alpha, horizon)
    high = -betting_lower([-d for d in diffs], -1.0, 1.0, alpha, horizon)
    return (low, high)


def difference_lower(
    diffs: Sequence[float], alpha: float = GRID_ALPHA, horizon: int | None = None
) -> float:
    """The anytime-valid lower bound of a paired difference: what a level's pass is tested on."""
    return betting_lower(diffs, -1.0, 1.0, alpha, horizon)


def difference_sd(accuracy: float, repeats: int, within_item: float = 0.2) -> float:
    """Planning value of the SD of one item's paired difference (mean of ``repeats`` calls at a
    level minus the same at the reference): two independent item means of Bernoulli calls whose
    repeats are correlated ``within_item`` (same item, same evidence: they agree more often than
    chance). Conservative: it ignores the part of item difficulty that cancels in the pairing."""
    p = min(max(accuracy, 0.05), 0.95)
    r = max(1, repeats)
    return math.sqrt(2 * p * (1 - p) * (1 + (r - 1) * within_item) / r)


@functools.lru_cache(maxsize=4096)
def bound_width(n_items: int, sd: float, alpha: float = GRID_ALPHA) -> float:
    """How far below the mean the pass test's lower bound lies at ``n_items`` items whose paired
    differences have SD ``sd`` (the bets tuned for ``n_items``): a deterministic sample with that
    spread, so planning needs no simulation."""
    if n_items < 2:
        return 2.0
    s = min(max(sd, 1e-3), 1.0)
    sample = [s if k % 2 else -s for k in range(n_items)]
    return -betting_lower(sample, -1.0, 1.0, alpha)


def expected_half_width(
    n_items: int, repeats: int, accuracy: float = 0.8, alpha: float = GRID_ALPHA
) -> float:
    """How far the pass test's bound is expected to lie from the measured difference."""
    return bound_width(n_items, round(difference_sd(accuracy, repeats), 4), alpha)


def flat_pass_chance(n_items: int, sd: float, tolerance: float, alpha: float = GRID_ALPHA) -> float:
    """The chance a level with no drop at all passes at ``n_items`` items (normal approximation
    of the mean's spread; the bound's width from :func:`bound_width`)."""
    if n_items < MIN_ITEMS:
        return 0.0
    w = bound_width(n_items, round(sd, 4), alpha)
    return 0.5 * (1 + math.erf((tolerance - w) * math.sqrt(n_items) / sd / math.sqrt(2)))


def items_for(
    tolerance: float,
    repeats: int,
    accuracy: float = 0.8,
    power: float = POWER,
    *,
    sd: float | None = None,
    cap: int = 100_000,
) -> int:
    """Items for a level with no drop to pass with probability ``power`` on its first look (at
    least ``MIN_ITEMS``; ``cap`` when even that many do not reach it). ``sd``: a measured SD of
    the paired difference instead of the planning value."""
    s = sd if sd is not None else difference_sd(accuracy, repeats)
    hi = MIN_ITEMS
    while flat_pass_chance(hi, s, tolerance) < power:
        if hi >= cap:
            return cap
        hi = min(cap, hi * 2)
    lo = max(MIN_ITEMS, hi // 2)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if flat_pass_chance(mid, s, tolerance) < power else (lo, mid)
    return hi


def tolerance_for(n_items: int, repeats: int, accuracy: float = 0.8) -> float:
    """The tolerance ``n_items`` items buy: the smallest (in steps of half a point) for which the
    sample-size rule asks no more items than that (1.0 when even a 50-point one asks more)."""
    for k in range(1, 101):
        tol = k * 0.005
        if items_for(tol, repeats, accuracy, cap=n_items + 1) <= n_items:
            return round(tol, 3)
    return 1.0
