"""Validity of the sweep's number, and what it costs: a simulation study against known truth.

It runs the sweep's own code (:mod:`context_ceiling.sweep.simulate`: the level grid, sample size,
opening, adaptive steps and refinement of ``ceiling sweep run``, the analysis of ``ceiling sweep
derive``, the regression check of ``--reduced``) on outcomes drawn from accuracy curves that are
known exactly, at a 128k-token window:

- **regimes**: cliffs, gradual falls after a knee, gentle declines from the start (2-4 points
  per 0.1 of fill), a plateau with a 6-point dip before a cliff, a fifth of the items fragile
  early, bimodal items (nearly always right or nearly always wrong), repeats that agree fully and
  repeats that are independent, drops just past a grid level, task sets of 60, 200 and 960 items,
  and a fixed budget; and, kept out of the "all" row, a model below the accuracy floor, a model
  that knows the answers (every item answered with no documents), a reference level that reads
  4 points high, and an 8-point dip that recovers within 3-6% of the window (narrower than the
  dip scan's spacing), at the default resolution and at 0.025; knees uniform over 0.3-0.9, base
  accuracy over 0.6-0.98, item difficulty with a logit SD of 1, 5% of items known closed-book,
  repeats copying the first call with probability 0.5 unless the regime says otherwise;
- **truth**: the population accuracy curve; the true drop point is the highest fill up to which
  every fill is within the tolerance of the reference (at the tolerance the ceiling is stated at);
- **per regime**: how often a ceiling is written, how often the enforced ceiling is at or below
  the true drop point (the safe side), how often the ceiling level is within 0.05 below it, the
  tolerance stated, median items, calls, input tokens and dollars (batch rates with the prompt
  cache serving each item's repeats after the first), and the same sweep under the previous
  release's rule (a studentized t-bound at 5% per level with no sequential control, an opening of
  half of 232 items, synchronous uncached calls) as the cost baseline, in the same run;
- the coverage of the reported intervals and the one-sided error of the pass test at every item
  count, accuracy and repeat count; the regression check's verdicts on unchanged curves and on
  curves whose drop really moved below the stored ceiling; the two refusal cases.

``python -m benchmarks.validity [--runs N] [--seed S] [--jobs J] [--json FILE]``;
``make bench-validity``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import random
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from context_ceiling.core.prices import Price, lookup
from context_ceiling.sweep import analysis, curve, decision, design, simulate
from context_ceiling.sweep.analysis import analyse_graded, item_means
from context_ceiling.sweep.curve import Analysis
from context_ceiling.sweep.price import FORECAST_RUNS
from context_ceiling.sweep.regression import compare_means, reduced_levels
from context_ceiling.sweep.simulate import (
    SHAPES,
    SimSweep,
    Truth,
    forecast,
    random_truth,
    with_truth,
)
from context_ceiling.sweep.statistics import (
    FIXED_SHARE,
    GRID_ALPHA,
    Z95,
    accuracy_interval,
    betting_lower,
    fixed_bounds,
    interval,
    items_for,
    refine_alphas,
)

TOL = 0.05
WINDOW = 131_072
#: the largest share of the error a refined midpoint is tested at (``refine_alphas``)
REFINE_FIRST = refine_alphas([0.5])[0]
PRICED = ("gpt-4.1", "claude-sonnet-4-5")
#: a fixed budget of input tokens for the fixed-budget regime (about 200 items' opening grid)
BUDGET_TOKENS = 150_000_000

# -- regimes ------------------------------------------------------------------------------------


def _mixed(rng: random.Random, k: int, **over: Any) -> Truth:
    return random_truth(rng, SHAPES[k % len(SHAPES)], **over)


def _just_past(rng: random.Random, k: int) -> Truth:
    """The true drop just past the 0.5 grid level (the cliff's centre sits 0.015 past the knee)."""
    shape = "cliff" if k % 2 == 0 else "gradual"
    knee = rng.uniform(0.49, 0.52) if shape == "cliff" else rng.uniform(0.5, 0.52)
    return random_truth(rng, shape, knee=knee)


def _below_floor(rng: random.Random, k: int) -> Truth:
    """A model that reads the task set worse than the accuracy floor (0.5) even at low fill."""
    return random_truth(rng, SHAPES[k % len(SHAPES)], base=rng.uniform(0.25, 0.45))


def _memoriser(rng: random.Random, k: int) -> Truth:
    """A model that knows the answers: every item answered right with no documents (97% of
    the time), so the documents add nothing a fill could take away."""
    return _mixed(rng, k, known=1.0)


def _high_reference(rng: random.Random, k: int) -> Truth:
    """A reference level that reads 4 points above the plateau around it (a bump at 0.2): every
    other level looks 4 points down, inside the tolerance, near its edge."""
    del k
    return random_truth(
        rng, "recover", dip=-0.04, dip_at=0.17, dip_width=0.06, knee=rng.uniform(0.4, 0.9)
    )


def _narrow_dip(rng: random.Random, k: int) -> Truth:
    """An 8-point dip that recovers, narrower than the dip scan's spacing at the default
    resolution (3-6% of the window wide, starting between 0.22 and 0.45)."""
    del k
    return random_truth(
        rng, "recover", dip_at=rng.uniform(0.22, 0.45), dip_width=rng.uniform(0.03, 0.06)
    )


Regime = tuple[str, Callable[[random.Random, int], Truth], dict[str, Any]]

REGIMES: list[Regime] = [
    *[(shape, (lambda s: lambda rng, k: random_truth(rng, s))(shape), {}) for shape in SHAPES],
    ("repeats agree fully", lambda rng, k: _mixed(rng, k, rho=1.0), {}),
    ("repeats independent", lambda rng, k: _mixed(rng, k, rho=0.0), {}),
    ("drop just past a level", _just_past, {}),
    ("60-item task set", _mixed, {"taskset": 60}),
    ("200-item task set", _mixed, {"taskset": 200}),
    ("fixed budget", _mixed, {"budget_tokens": BUDGET_TOKENS}),
    # reported after "all" (they are not in it): what the design must refuse or report
    ("model below the floor", _below_floor, {}),
    ("reference reads 4 points high", _high_reference, {}),
    # a dip narrower than the scan's spacing, at the default resolution and at half of it
    ("dip narrower than the scan", _narrow_dip, {}),
    ("the same at --resolution 0.025", _narrow_dip, {"resolution": 0.025}),
    # last, so the regimes above keep their draws at a given seed
    ("model that knows the answers", _memoriser, {}),
]
#: regimes kept out of the "all" row: a model below the floor, a model that knows the answers,
#: a reference that reads high, dips narrower than the scan's spacing (a limit of the default
#: resolution, and its remedy)
APART = (
    "model below the floor",
    "model that knows the answers",
    "reference reads 4 points high",
    "dip narrower than the scan",
    "the same at --resolution 0.025",
)

# -- the previous release's rule, for the cost baseline -----------------------------------------


def _legacy_items(tolerance: float, repeats: int, accuracy: float = 0.8, **_: Any) -> int:
    """The previous sample-size rule: a two-sided 95% t-interval of the paired difference no
    wider than the tolerance (232 items at 0.05 and 3 repeats)."""
    p = min(max(accuracy, 0.05), 0.95)
    sd = math.sqrt(2 * p * (1 - p) * (1 + (repeats - 1) * 0.2) / repeats)
    return max(20, math.ceil((Z95 * sd / tolerance) ** 2))


def _legacy_bounds(
    diffs: list[float], alpha: float = 0.05, horizon: int | None = None
) -> tuple[float, float]:
    del alpha, horizon
    pseudo = ((1.0, 0.125), (-1.0, 0.125), (0.0, 0.25))
    lower = interval(diffs, pseudo, -1.0, 1.0, one_sided=True)[0]
    return (lower, interval(diffs, pseudo, -1.0, 1.0)[1])


def _legacy_decided(s: Any, tolerance: float, cap: int | None = None) -> bool:
    """The previous rule's "resolved": a clear drop, or a two-sided interval no wider than
    twice the tolerance."""
    del cap
    return bool(
        s.complete and (s.diff_ci[1] < -tolerance or (s.diff_ci[1] - s.diff_ci[0]) / 2 <= tolerance)
    )


@contextlib.contextmanager
def legacy() -> Iterator[None]:
    """The previous release's design: t-bounds at 5% for every level (no sequential control,
    no split for refinement), its resolution rule, no futility stop, the opening on half of its
    planned items, every item asked ``repeats`` times."""
    patches: list[tuple[object, str, object]] = [
        (analysis, "difference_bounds", _legacy_bounds),
        # refined levels tested as every other level, measured on every item at once
        (analysis, "final_items", lambda *_: 0),
        (simulate, "final_items", lambda *_: 0),
        (decision, "futile", lambda *_: False),
        # its resolution rule: any decided level settles the ceiling (at the reference too),
        # and the low-fill control only refuses a drop shown before the reference
        (decision, "decided_by", lambda *a: "drop" if _legacy_decided(*a) else None),
        (decision, "reference_shown_good", lambda *_: True),
        (curve, "GRID_ALPHA", 0.05),
        (curve, "refine_alphas", lambda r: [0.05] * len(r)),
        (simulate, "items_for", _legacy_items),
        (simulate, "ADDED_REPEATS", 3),
        (design, "START_SHARE", 2),
        # it opened on the whole grid and wrote a ceiling above fills its scan never reached
        (simulate, "deferred", lambda *_: []),
        (analysis, "cap_unscanned", lambda *_: None),
    ]
    saved = [(m, name, getattr(m, name)) for m, name, _ in patches]
    for m, name, value in patches:
        setattr(m, name, value)
    try:
        yield
    finally:
        for m, name, value in saved:
            setattr(m, name, value)


# -- one sweep ----------------------------------------------------------------------------------


def _prices() -> dict[str, tuple[Price, Price]]:
    out = {}
    for m in PRICED:
        sync, batch = lookup(m), lookup(m, batch=True)
        assert sync is not None and batch is not None, f"genai-prices has no {m}"
        out[m] = (sync, batch)
    return out


def group_size() -> int:
    """How many items of the bundled task set share one haystack at this window
    (``--shared-haystack``: the evidence of as many items as fill 80% of the smallest level)."""
    from context_ceiling.core.tokenizers import TiktokenCounter
    from context_ceiling.sweep.prompts import ContextBuilder, Meter, group_items
    from context_ceiling.sweep.taskset import load_taskset

    ts = load_taskset("contracts")
    builder = ContextBuilder(ts, Meter(TiktokenCounter("o200k_base")), 0)
    groups = group_items(builder, ts.items, round(0.1 * WINDOW), True)
    return max(1, round(len(ts.items) / len(groups)))


def one(task: tuple[int, int, int, int]) -> dict[str, Any]:
    """Regime ``r``, run ``k``: the sweep under today's rule (its haystacks shared by groups of
    ``g`` items, so the prompt cache serves them) and under the previous one (a haystack per
    item, uncached)."""
    r, k, seed, g = task
    name, make, over = REGIMES[r]
    rng = random.Random(seed * 1_000_003 + r * 10_007 + k)
    truth = make(rng, k)
    prices = _prices()
    sim = SimSweep(
        truth, window=WINDOW, tolerance=TOL, seed=rng.randrange(2**31), group_size=g, **over
    )
    a = sim.run()
    stated = a.stated_tolerance or TOL
    limit = sim.levels[-1]
    u_star = truth.drop_point(sim.reference, limit, stated)
    u_asked = truth.drop_point(sim.reference, limit, TOL)
    written = not a.blocking()
    row: dict[str, Any] = {
        "regime": name,
        "base": truth.base,
        "written": written,
        # a written ceiling that is the reference level itself (reported as such: the outcome)
        "at_reference": written and a.ceiling_level == a.reference_level,
        "reported_at_reference": a.outcome == "at_reference",
        "below_drop": u_star - (a.ceiling_utilization or 0) if written else None,
        "stated": stated if written else None,
        "safe": (not written) or (a.ceiling_utilization or 0) <= u_star,
        "safe_asked": (not written) or (a.ceiling_utilization or 0) <= u_asked,
        "placed": written
        and a.ceiling_level is not None
        and u_star - 0.05 <= a.ceiling_level <= u_star,
        "items": sim.spend.items,
        "calls": sim.spend.calls,
        "tokens": sim.spend.input_tokens,
        "cached_share": sim.spend.cached_tokens / max(1, sim.spend.input_tokens),
        "usd": {m: sim.spend.dollars(b) for m, (_, b) in prices.items()},
        "usd_sync": {m: sim.spend.dollars(sync) for m, (sync, _) in prices.items()},
    }
    if over.get("budget_tokens") is None:
        with legacy():
            old = replace(sim, records=[], spend=simulate.Spend(), group_size=1)
            b = old.run()
        # the previous rule wrote a ceiling only when resolved at the tolerance asked for
        old_written = not b.blocking() and b.resolved and (b.stated_tolerance or TOL) <= TOL
        row["legacy"] = {
            "written": old_written,
            "safe": not old_written or (b.ceiling_utilization or 0) <= u_asked,
            "placed": old_written
            and b.ceiling_level is not None
            and u_asked - 0.05 <= b.ceiling_level <= u_asked,
            "items": old.spend.items,
            "calls": old.spend.calls,
            "tokens": old.spend.input_tokens,
            "usd": {m: old.spend.dollars(s, cache=False) for m, (s, _) in prices.items()},
        }
    if r < len(SHAPES) and written and a.ceiling_level not in (None, a.reference_level):
        row["regression"] = regression(sim, a, truth, rng)
    return row


def regression(
    base: SimSweep, a: Analysis, truth: Truth, rng: random.Random
) -> tuple[str, str, str]:
    """(verdict on the unchanged curve, the same with fresh answers, verdict on a curve whose
    drop moved below the stored ceiling level), each from a reduced sweep as ``--reduced`` plans
    it: three levels, three repeats, the baseline's items. Re-asked calls of an unchanged
    endpoint repeat the baseline's answer with the repeats' agreement, or, with fresh answers (a
    sampled endpoint, a provider without deterministic replay), are drawn anew."""
    levels = reduced_levels(a)
    n = min(base.spend.items, items_for(TOL / 2**0.5, 3))
    ids = base.order[:n]
    then = item_means(base.records)
    old = {r["key"]: r["correct"] for r in base.records}

    def reduced(truth_now: Truth, same: bool) -> str:
        sim = SimSweep(truth_now, window=WINDOW, tolerance=TOL, seed=rng.randrange(2**31))
        sim.model = replace(base.model, truth=truth_now, rng=sim.rng)
        sim.order, sim.levels = base.order, levels
        sim.few = []  # a reduced sweep asks every level its three repeats
        sim.n_at, sim.n_control = dict.fromkeys(levels, n), 0
        for lv in levels:
            sim._measure(lv, ids)
        if same:
            for rec in sim.records:
                if rec["key"] in old and sim.rng.random() < truth_now.rho:
                    rec["correct"] = old[rec["key"]]
        now = item_means(sim.records)
        return compare_means(a, sim.analyse(), then, now).outcome

    unchanged = reduced(truth, same=True)
    fresh = reduced(truth, same=False)
    ref, lv = a.reference_level or 0.2, a.ceiling_level or 0.2
    for _ in range(50):
        moved = random_truth(
            rng, "cliff", base=truth.base, knee=rng.uniform(max(0.21, lv - 0.3), lv)
        )
        if moved.p(lv) - moved.p(ref) < -TOL:
            return unchanged, fresh, reduced(moved, same=False)
    return unchanged, fresh, "n/a"


# -- intervals ----------------------------------------------------------------------------------


def coverage(rng: random.Random, sets: int) -> list[dict[str, Any]]:
    """Per items, accuracy and repeats: how often the accuracy interval covers the truth, how
    often the pass test's lower bound (at the grid's error) lies above the true difference, and
    how often a refined midpoint's one fixed-sample test does (at its largest share, 1%, as the
    sweep runs it; one call per item at the level against ``reps`` at the reference)."""
    out = []
    for n in (20, 60, 300, 900):
        for acc in (0.6, 0.8, 0.95, 0.99):
            for reps in (1, 3):
                cov = above = fixed_above = 0
                for _ in range(sets):
                    eff = [rng.gauss(0, 0.5) for _ in range(n)]
                    drop = TOL  # the level exactly at the tolerance: the hardest case
                    p0 = [1 / (1 + math.exp(-(math.log(acc / (1 - acc)) + e))) for e in eff]
                    p1 = [max(0.0, p - drop) for p in p0]
                    truth0 = sum(p0) / n
                    m0 = [sum(rng.random() < p for _ in range(reps)) / reps for p in p0]
                    m1 = [sum(rng.random() < p for _ in range(reps)) / reps for p in p1]
                    lo, hi = accuracy_interval(m0)
                    cov += lo <= truth0 <= hi
                    d = [b - x for x, b in zip(m0, m1, strict=True)]
                    true_diff = -(sum(p0) - sum(p1)) / n
                    above += betting_lower(d, -1.0, 1.0, GRID_ALPHA) > true_diff
                    once = [int(rng.random() < p) - x for x, p in zip(m0, p1, strict=True)]
                    fixed_above += fixed_bounds(once, REFINE_FIRST * FIXED_SHARE)[0] > true_diff
                out.append(
                    {
                        "items": n,
                        "accuracy": acc,
                        "repeats": reps,
                        "covers": cov / sets,
                        "lower_above_truth": above / sets,
                        "refined_above_truth": fixed_above / sets,
                    }
                )
    return out


def refusal_cases(seed: int) -> dict[str, bool]:
    """Does the analysis refuse a model at 0%, and one that answers from memory?"""
    zero = Truth("cliff", base=1e-4, knee=0.6, known=0.0)
    memory = Truth("cliff", base=1e-4, knee=2.0, known=0.7)
    res = {}
    for name, t in (("zero_accuracy", zero), ("answers_from_memory", memory)):
        sim = SimSweep(t, window=WINDOW, taskset=200, seed=seed)
        res[name + "_refused"] = bool(sim.run().blocking())
        b = analyse_graded(
            sim.records,
            sim.records,
            WINDOW,
            TOL,
            0.1,
            design=sim.design(),
            include_closed_book=True,
        )
        res[name + "_refused_with_closed_book_items"] = bool(b.blocking())
    return res


def forecasts(g: int) -> dict[str, float]:
    """The dry run's forecast for each regime's settings (the median input tokens over the
    simulated curves the run itself prices with, :meth:`Pricing.costs`): what a user is told
    before the sweep, to hold against what the regime's sweeps spent. The forecast knows the
    settings (task set, budget), not the regime's curves."""
    out: dict[str, float] = {}
    memo: dict[str, float] = {}
    for name, _, over in REGIMES:
        key = json.dumps(over, sort_keys=True)
        if key not in memo:
            sim = SimSweep(
                random_truth(random.Random(0), "cliff"),
                window=WINDOW,
                tolerance=TOL,
                group_size=g,
                **over,
            )
            memo[key] = forecast(functools.partial(with_truth, sim), runs=FORECAST_RUNS)[
                "input_tokens_median"
            ]
        out[name] = memo[key]
    return out


def study(runs: int, seed: int, jobs: int, coverage_sets: int | None = None) -> dict[str, Any]:
    t0 = time.perf_counter()
    g = group_size()
    tasks = [(r, k, seed, g) for r in range(len(REGIMES)) for k in range(runs)]
    with ProcessPoolExecutor(jobs) as pool:
        rows = list(pool.map(one, tasks, chunksize=4))
    rng = random.Random(seed)
    return {
        "group_size": g,
        "runs": rows,
        "forecast": forecasts(g),
        "coverage": coverage(rng, coverage_sets or max(100, 3 * runs)),
        "refusals": refusal_cases(seed),
        "seconds": round(time.perf_counter() - t0, 1),
    }


# -- tables -------------------------------------------------------------------------------------


def _share(rows: list[dict[str, Any]], key: str) -> str:
    return f"{sum(bool(r[key]) for r in rows) / len(rows):.1%}" if rows else "-"


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _forecast_cells(told: dict[str, float], name: str, rs: list[dict[str, Any]]) -> str:
    """The regime's forecast and the share of its sweeps that spent within 1.5x of it (each
    sweep against its own regime's forecast, for "all")."""
    fs = [(told.get(r["regime"]), r["tokens"]) for r in rs]
    fs_known = [(f, t) for f, t in fs if f]
    if not fs_known:
        return "- | -"
    within = sum(f / 1.5 <= t <= f * 1.5 for f, t in fs_known) / len(fs_known)
    own = told.get(name)
    return (f"{own / 1e6:,.0f}M" if own else "per regime") + f" | {within:.1%}"


def table(res: dict[str, Any]) -> str:
    m0, m1 = PRICED
    lines = [
        "| regime | runs | ceiling written | of them at the reference | reported so | enforced ceiling <= true drop point | level within 0.05 below it (base >= 0.8) | median distance below the drop | tolerance stated (median, max) | previous rule: written | previous rule: <= true drop | previous rule: within 0.05 (base >= 0.8) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = [n for n, _, _ in REGIMES]
    groups = []
    for name in [*(n for n in names if n not in APART), "all", *APART]:
        rs = [
            r
            for r in res["runs"]
            if r["regime"] == name or (name == "all" and r["regime"] not in APART)
        ]
        if rs:
            groups.append((name, rs))
    for name, rs in groups:
        hi = [r for r in rs if r["base"] >= 0.8]
        stated = [r["stated"] for r in rs if r["stated"] is not None]
        old = [r["legacy"] for r in rs if "legacy" in r]
        old_hi = [r["legacy"] for r in hi if "legacy" in r]
        wr = [r for r in rs if r["written"]]
        at = [r for r in wr if r["at_reference"]]
        below = [r["below_drop"] for r in wr if r["below_drop"] is not None]
        lines.append(
            f"| {name} | {len(rs)} | {_share(rs, 'written')} | {_share(wr, 'at_reference')} | "
            f"{_share(at, 'reported_at_reference')} | {_share(rs, 'safe')} | "
            # nothing written: nothing to place (a regime the design must refuse)
            f"{_share(hi, 'placed') if wr else '-'} | "
            + (f"{_med(below):.3f} | " if below else "- | ")
            + (f"{_med(stated):.3f}, {max(stated):.3f}" if stated else "-")
            + f" | {_share(old, 'written')} | {_share(old, 'safe')} | "
            + f"{_share(old_hi, 'placed') if any(o['written'] for o in old) else '-'} |"
        )
    lines += [
        "",
        f"| regime | median items | median calls | median input tokens | cached | median $ {m0} (cache) | median $ {m0} (batch + cache) | median $ {m1} (batch + cache) | previous rule: median input tokens | previous rule: median $ {m0} | cost / previous | dry-run forecast | spent within 1.5x of it |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    told = res.get("forecast", {})
    for name, rs in groups:
        old = [r["legacy"] for r in rs if "legacy" in r]
        new_usd = _med([r["usd"][m0] for r in rs])
        old_usd = _med([o["usd"][m0] for o in old])
        lines.append(
            f"| {name} | {_med([r['items'] for r in rs]):.0f} | {_med([r['calls'] for r in rs]):,.0f} | "
            f"{_med([r['tokens'] for r in rs]) / 1e6:,.0f}M | "
            f"{_med([r['cached_share'] for r in rs]):.0%} | "
            f"${_med([r['usd_sync'][m0] for r in rs]):,.0f} | ${new_usd:,.0f} | "
            f"${_med([r['usd'][m1] for r in rs]):,.0f} | "
            + (
                f"{_med([o['tokens'] for o in old]) / 1e6:,.0f}M | ${old_usd:,.0f} | {new_usd / old_usd:.2f}"
                if old
                else "- | - | -"
            )
            + f" | {_forecast_cells(told, name, rs)} |"
        )
    lines += [
        "",
        "| items | accuracy | repeats | accuracy CI covers | pass-test bound above the truth (at a drop of exactly the tolerance) | refined midpoint's test (1%) above the truth |",
        "|---|---|---|---|---|---|",
    ]
    for c in res["coverage"]:
        lines.append(
            f"| {c['items']} | {c['accuracy']:.2f} | {c['repeats']} | {c['covers']:.1%} | "
            f"{c['lower_above_truth']:.1%} | {c['refined_above_truth']:.1%} |"
        )
    regs = [r["regression"] for r in res["runs"] if r.get("regression")]
    same = [r[0] for r in regs]
    fresh = [r[1] for r in regs]
    moved = [r[2] for r in regs if r[2] != "n/a"]
    lines += [
        "",
        "| regression check | cases | holds | moved | inconclusive |",
        "|---|---|---|---|---|",
    ]
    for name, vs in (
        ("curve unchanged, answers repeated", same),
        ("curve unchanged, fresh answers", fresh),
        ("drop moved below the stored ceiling", moved),
    ):
        if vs:
            lines.append(
                f"| {name} | {len(vs)} | "
                + " | ".join(
                    f"{vs.count(o) / len(vs):.1%}" for o in ("holds", "moved", "inconclusive")
                )
                + " |"
            )
    lines += ["", "| refusal case | derive refuses |", "|---|---|"]
    for k, v in res["refusals"].items():
        lines.append(f"| {k.replace('_', ' ')} | {'yes' if v else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=100, help="simulated sweeps per regime")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--coverage-sets", type=int, help="data sets per cell of the interval table")
    ap.add_argument("--json", help="write the raw results here")
    args = ap.parse_args(argv)
    res = study(args.runs, args.seed, args.jobs, args.coverage_sets)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    print(table(res))
    print(
        f"\n({args.runs} simulated sweeps per regime, {len(REGIMES)} regimes, seed {args.seed}, "
        f"{res['seconds']} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
