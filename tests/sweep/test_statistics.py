"""The pass test's bound, the accuracy interval and the sample size: properties that hold for any
data (the error rates against known truth are measured in ``benchmarks/validity.py``)."""

from __future__ import annotations

import random

import pytest

from context_ceiling.sweep.statistics import (
    FIXED_MIN_ITEMS,
    FIXED_SHARE,
    GRID_ALPHA,
    MAX_REFINEMENTS,
    MIN_ITEMS,
    POWER,
    REFINE_ALPHA,
    REFINE_POWER,
    accuracy_interval,
    betting_lower,
    difference_bounds,
    drop_now_lower,
    fixed_bounds,
    flat_pass_chance,
    items_for,
    mean_and_variance,
    refine_alphas,
    refined_bounds,
    refined_items,
    t95,
    t_quantile,
)


def test_the_bound_never_exceeds_the_mean_and_respects_the_range() -> None:
    rng = random.Random(3)
    for _ in range(50):
        n = rng.randint(1, 200)
        xs = [rng.choice([-1, -2 / 3, -1 / 3, 0, 1 / 3, 2 / 3, 1]) for _ in range(n)]
        lo = betting_lower(xs, -1.0, 1.0, GRID_ALPHA)
        assert -1.0 <= lo <= sum(xs) / n + 1e-9
        low, high = difference_bounds(xs)
        assert low <= sum(xs) / n <= high + 1e-9
    assert betting_lower([], -1.0, 1.0, 0.05) == -1.0


def test_all_agreeing_items_give_a_bound_near_the_exact_one() -> None:
    """30 items that all agree cannot rule out that a tenth of items fail (0.9^30 = 4%): the
    bound says so instead of collapsing to zero, and it tightens as items are added."""
    at30 = betting_lower([0.0] * 30, -1.0, 1.0, GRID_ALPHA)
    assert -0.2 < at30 < -0.05
    assert betting_lower([0.0] * 300, -1.0, 1.0, GRID_ALPHA) > at30 / 4


def test_a_level_that_dropped_past_the_tolerance_rarely_passes_at_high_accuracy() -> None:
    """A reference at 99% and a level at 94% (a drop of exactly the 5-point tolerance, one repeat):
    the bound stays below -0.05 in all but about alpha of data sets, at 20 items and at 200."""
    rng = random.Random(11)
    for n in (20, 200):
        passes = 0
        runs = 300
        for _ in range(runs):
            ref = [int(rng.random() < 0.99) for _ in range(n)]
            lvl = [int(rng.random() < 0.94) for _ in range(n)]
            passes += (
                betting_lower([b - a for a, b in zip(ref, lvl, strict=True)], -1, 1, GRID_ALPHA)
                > -0.05
            )
        assert passes / runs <= GRID_ALPHA + 0.03, (n, passes / runs)


def test_looking_after_every_batch_does_not_inflate_the_error() -> None:
    """Optional stopping: adding 20 items at a time and stopping at the first pass, a level that
    truly dropped past the tolerance passes in about alpha of runs, not the several times alpha a
    fixed-sample bound gives when it is looked at 15 times."""
    rng = random.Random(5)
    runs, passed = 150, 0
    for _ in range(runs):
        diffs: list[float] = []
        for _look in range(15):
            for _ in range(20):
                p = rng.random() < 0.8
                q = rng.random() < 0.74  # a drop of 6 points against a 5-point tolerance
                diffs.append(int(q) - int(p))
            if betting_lower(diffs, -1, 1, GRID_ALPHA, horizon=150) > -0.05:
                passed += 1
                break
    assert passed / runs <= GRID_ALPHA + 0.04


def test_accuracy_interval_is_a_score_interval() -> None:
    lo, hi = accuracy_interval([1.0] * 30)
    assert hi == 1.0 and 0.85 < lo < 0.9  # Wilson at 30 of 30: 0.886
    lo, hi = accuracy_interval([0.0] * 10)
    assert lo == 0.0 and 0.2 < hi < 0.35
    assert accuracy_interval([]) == (0.0, 1.0)


def test_sample_size_plans_for_the_power_to_pass_a_flat_level() -> None:
    n = items_for(0.05, 3)
    assert flat_pass_chance(n, 0.3864, 0.05) >= POWER
    assert flat_pass_chance(n - 1, 0.3864, 0.05) < POWER + 0.01
    assert items_for(0.1, 3) < n < items_for(0.05, 1)
    assert items_for(0.5, 3) == MIN_ITEMS
    assert items_for(0.05, 3, sd=0.1) < n  # a measured spread below the planning value


def test_the_regression_bound_takes_the_more_precise_of_the_paired_and_the_direct_estimate() -> (
    None
):
    then = [0.0, -1 / 3, 0.0, 1 / 3, 0.0, 0.0, -1 / 3, 0.0] * 50
    same = [0.0] * 100
    # answers repeated: the change is nil and the bound leans on the baseline's 400 items
    now_few = [random.Random(k).choice([-1 / 3, 0.0, 1 / 3]) for k in range(100)]
    assert drop_now_lower(then, same, now_few) == pytest.approx(sum(then) / len(then), abs=0.05)
    # fresh answers: the change carries both samples' noise; the drop measured now is tighter
    now = [random.Random(7 + k).choice([-1 / 3, 0.0, 0.0, 1 / 3]) for k in range(400)]
    noisy = [b - a for a, b in zip(then, now, strict=True)]
    m2, v2 = mean_and_variance(noisy)
    m1, v1 = mean_and_variance(then)
    paired_alone = m1 + m2 - t95(399) * (v1 + v2) ** 0.5
    assert drop_now_lower(then, noisy, now) > paired_alone
    # the more precise estimate, chosen by its standard error, at one-sided 95%
    m3, v3 = mean_and_variance(now)
    assert v3 < v1 + v2
    assert drop_now_lower(then, noisy, now) == pytest.approx(m3 - t95(399) * v3**0.5, abs=1e-6)


def test_the_tolerance_a_budget_buys_inverts_the_sample_size() -> None:
    from context_ceiling.sweep.statistics import tolerance_for

    assert tolerance_for(items_for(0.05, 3), 3) == 0.05
    assert tolerance_for(items_for(0.05, 3) - 1, 3) > 0.05
    bought = [tolerance_for(n, 3) for n in (60, 120, 200, 400)]
    assert bought == sorted(bought, reverse=True) and bought[-1] < bought[0]


def test_a_midpoint_above_a_passed_one_keeps_its_share_and_one_below_gets_half_the_rest() -> None:
    # passes all the way up: one share, half of the refinement's error, for every midpoint
    up = refine_alphas([0.632, 0.711, 0.754, 0.777])
    assert up == [REFINE_ALPHA / 2] * 4
    # fails all the way down: half of what is left each time
    down = refine_alphas([0.632, 0.562, 0.53, 0.515])
    assert down == [REFINE_ALPHA / 2, REFINE_ALPHA / 4, REFINE_ALPHA / 8, REFINE_ALPHA / 16]
    # fail, then pass: the midpoint above the passed one takes over that one's share
    mixed = refine_alphas([0.632, 0.562, 0.596])
    assert mixed == [REFINE_ALPHA / 2, REFINE_ALPHA / 4, REFINE_ALPHA / 4]
    # the shares given out never exceed the refinement's error, and past the limit nothing
    past = refine_alphas([0.5 + k / 100 * (-1) ** k for k in range(MAX_REFINEMENTS + 2)])
    assert past[MAX_REFINEMENTS:] == [0.0, 0.0]
    assert sum(set(past)) <= REFINE_ALPHA + 1e-12


def test_a_refined_level_is_tested_once_on_items_fixed_before_it_is_measured() -> None:
    """A refined level cannot pass before it has the items of its one test; after, it is tested
    on exactly those (the first ones drawn) with Student's t, whatever else was measured."""
    assert t_quantile(0.95, 30) == pytest.approx(t95(30), abs=2e-3)
    assert t_quantile(0.99, 1000) == pytest.approx(2.330, abs=2e-3)
    flat = [0.0, 1 / 3, -1 / 3, 0.0, -2 / 3, 2 / 3, 0.0, 0.0] * 60
    low, high = refined_bounds(flat[:100], flat[:100], 0.01, done=False)
    assert low == -1.0 and high < 1.0  # it may fail early, never pass
    done = refined_bounds(flat, flat[:400], 0.01, done=True)
    assert done == fixed_bounds(flat[:400], 0.01 * FIXED_SHARE)
    # clearly dropped: the early upper bound already lies past the tolerance
    assert refined_bounds([-1.0, -2 / 3, -1.0] * 40, [], 0.01, done=False)[1] < -0.05
    # the items planned: more for a smaller error, never past the cap, never under MIN_ITEMS
    n1, n2 = refined_items(0.05, 3, 1, 0.01, 10**6), refined_items(0.05, 3, 1, 0.0025, 10**6)
    assert MIN_ITEMS <= n1 < n2 and refined_items(0.05, 3, 1, 0.0025, 300) == 300
    assert refined_items(0.5, 3, 1, 0.01, 10**6) == MIN_ITEMS
    # a level with no drop, one call per item against three at the reference (the planning
    # spread), passes its test at about REFINE_POWER on those items
    rng = random.Random(2)
    runs, passed = 300, 0
    for _ in range(runs):
        d = []
        for _ in range(n1):
            ref = sum(rng.random() < 0.8 for _ in range(3)) / 3
            d.append(int(rng.random() < 0.8) - ref)
        passed += fixed_bounds(d, 0.01 * FIXED_SHARE)[0] > -0.05
    assert passed / runs >= REFINE_POWER - 0.08


def test_a_refined_level_past_the_tolerance_passes_its_one_test_in_about_alpha() -> None:
    """A drop of exactly the tolerance at a refined level (one call per item against the
    reference's mean of three): its fixed-sample test, run as the sweep runs it, passes in at
    most about its share of the error, at 300 items and at 900, at 80% accuracy and at 97%
    (where the differences are skewed: a drop is a few items answered wrong)."""
    rng = random.Random(13)
    alpha, runs = 0.01, 800
    for n, acc in ((300, 0.8), (300, 0.97), (900, 0.97)):
        passed = 0
        for _ in range(runs):
            d = []
            for _ in range(n):
                ref = sum(rng.random() < acc for _ in range(3)) / 3
                d.append(int(rng.random() < acc - 0.05) - ref)
            passed += refined_bounds(d, d, alpha, done=True)[0] > -0.05
        assert passed / runs <= alpha + 0.01, (n, acc, passed / runs)
    assert FIXED_MIN_ITEMS >= 300  # below it the sweep tests a refined level anytime-valid
