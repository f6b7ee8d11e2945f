"""Turn a run's graded calls into the measured curve, then hand it to the decision.

Per level: mean accuracy with a studentized 95% interval over items (``context_ceiling.sweep.statistics``:
items are the unit, their repeats stay with them), the min-max of accuracy across repeats, the
failure bucket shares, the planned, logged and errored calls, and how far the sweep's own token
count was from what the upstream reported. Each level above the reference is compared with the
reference paired by item: the paired difference and its anytime-valid bounds at the level's
share of the error.

What is measured comes from the plan, not from the log: a planned level with missing or errored
calls is incomplete, it cannot pass, and everything above it fails with it (missing data never
raises a ceiling). Items the model answers with no documents (the closed-book control) are left
out of the decision by default and reported apart. Levels below the reference (the low-fill
control) are measured but not in the chain: they show a drop that starts before the reference.

The ceiling, the outcome and the refusals are decided in :mod:`context_ceiling.sweep.decision`;
the curve's types are :mod:`context_ceiling.sweep.curve`'s; :func:`analysis_of` reads a run
directory and does all of it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from context_ceiling.sweep.calllog import CallLog, Row, sample_key
from context_ceiling.sweep.corpora import extend, reach
from context_ceiling.sweep.curve import DEFAULT_FLOOR, Analysis, Design, LevelStats, fill_of, mean
from context_ceiling.sweep.decision import decide, judge, outcome_of, scan_gates
from context_ceiling.sweep.design import cap_unscanned
from context_ceiling.sweep.external import open_taskset
from context_ceiling.sweep.plan import Plan
from context_ceiling.sweep.scorer import BUCKETS, grade
from context_ceiling.sweep.statistics import (
    FIXED_MIN_ITEMS,
    accuracy_interval,
    difference_bounds,
    difference_interval,
    refined_bounds,
    refined_items,
)
from context_ceiling.sweep.taskset import Item, TaskSet


def graded(
    records: Iterable[Row],
    items: Mapping[str, Item],
    docs: Mapping[str, str] | None = None,
) -> list[Row]:
    """Each ok record with its grade (the scorer applied to the log; re-grading is free)."""
    out = []
    for r in records:
        if r.get("status") != "ok" or r["item"] not in items:
            continue
        g = grade(items[r["item"]], r.get("text"), r.get("finish_reason"), r.get("shown"), docs)
        out.append(r | {"correct": g.correct, "bucket": g.bucket})
    return out


def repeat_icc(rows: Iterable[Row], reference: float | None = None) -> float | None:
    """How much an item's repeats agree on what the pass test uses: the intraclass correlation
    of the paired differences (a repeat at a level minus the same repeat at the reference),
    within (item, level): 1 - their pooled variance between an item's repeats over their
    variance across all pairs (one-way ANOVA). Agreement of the outcomes alone would read items
    that differ from each other (some easy, some hard) as repeats that agree. Without a
    ``reference`` the outcomes themselves are used. None when no item has two repeats at a level
    and the reference, or every pair agrees."""
    by: dict[tuple[str, float], dict[int, int]] = defaultdict(dict)
    for r in rows:
        cell = by[(r["item"], fill_of(r))]
        cell[int(r["repeat"]) if "repeat" in r else len(cell)] = int(r["correct"])
    cells: list[list[float]] = []
    for (item, level), reps in by.items():
        if reference is None:
            cells.append([float(x) for x in reps.values()])
        elif level != reference:
            ref = by.get((item, reference), {})
            cells.append([float(x - ref[k]) for k, x in reps.items() if k in ref])
    values = [x for xs in cells for x in xs]
    within = sum(_squares(xs) for xs in cells if len(xs) > 1)
    dof = sum(len(xs) - 1 for xs in cells if len(xs) > 1)
    if not dof or len(values) < 2:
        return None
    centre = mean(values)
    total = sum((x - centre) ** 2 for x in values) / (len(values) - 1)
    if total <= 0:
        return None
    return round(min(1.0, max(0.0, 1 - (within / dof) / total)), 4)


def _squares(xs: list[float]) -> float:
    """The sum of squared deviations from the mean (the mean taken once)."""
    m = mean(xs)
    return sum((x - m) ** 2 for x in xs)


def item_means(rows: Iterable[Row]) -> dict[float, dict[str, float]]:
    """level -> item -> mean correctness over its repeats (controls left out)."""
    acc: dict[float, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if not r["control"]:
            acc[fill_of(r)][r["item"]].append(int(r["correct"]))
    return {lv: {k: mean(v) for k, v in d.items()} for lv, d in acc.items()}


def analyse(
    records: Iterable[Row],
    items: Mapping[str, Item],
    window: int,
    tolerance: float = 0.05,
    margin: float = 0.05,
    *,
    design: Design | None = None,
    docs: Mapping[str, str] | None = None,
    floor: float = DEFAULT_FLOOR,
    include_closed_book: bool = False,
    metric: str = "accuracy",
) -> Analysis:
    """The analysis of a run's call records (``records``): graded against the items, then
    :func:`analyse_graded`."""
    all_records = list(records)
    return analyse_graded(
        all_records,
        graded(all_records, items, docs),
        window,
        tolerance,
        margin,
        design=design,
        floor=floor,
        include_closed_book=include_closed_book,
        metric=metric,
    )


def analyse_graded(
    all_records: list[Row],
    rows: list[Row],
    window: int,
    tolerance: float,
    margin: float,
    *,
    design: Design | None = None,
    floor: float = DEFAULT_FLOOR,
    include_closed_book: bool = False,
    metric: str = "accuracy",
) -> Analysis:
    """The analysis of records already graded (``rows``: the ok ones, with ``correct`` and
    ``bucket``); the validity benchmark drives this with simulated outcomes."""
    by_key = {r["key"]: r for r in all_records if "key" in r}
    if design is None:
        lv = sorted({fill_of(r) for r in rows if not r["control"]})
        ids = sorted({r["item"] for r in rows})
        reps = max((int(r["repeat"]) + 1 for r in rows if not r["control"]), default=1)
        design = Design.full(lv or [0.2], ids, reps, any(r["control"] for r in rows))
    controls = {r["item"]: bool(r["correct"]) for r in rows if r["control"]}
    flagged = sorted(k for k, ok in controls.items() if ok)
    excluded = set() if include_closed_book else set(flagged)
    means = item_means(r for r in rows if r["item"] not in excluded)
    by_level: dict[float, list[Row]] = defaultdict(list)
    for r in rows:
        if not r["control"] and r["item"] not in excluded:
            by_level[fill_of(r)].append(r)
    errors = sum(1 for r in all_records if r.get("status") != "ok")
    stats = [
        _level(lv, by_level.get(lv, []), means.get(lv, {}), design, by_key, window)
        for lv in sorted(design.levels)
    ]
    ref = next((s for s in stats if s.level == design.reference), None)
    ref_means = means.get(design.reference, {})
    order = {k: n for n, k in enumerate(design.levels.get(design.reference, []))}
    for s in stats:
        if s is ref:
            s.role, s.diff_ci = "reference", (0.0, 0.0)
            continue
        s.role = "low_fill" if s.level < design.reference else "level"
        at = means.get(s.level, {})
        common = sorted((k for k in ref_means if k in at), key=lambda k: order.get(k, len(order)))
        diffs = [at[k] - ref_means[k] for k in common]  # in the order the items were drawn
        s.diff = mean(diffs) if diffs else 0.0
        if len(diffs) > 1:
            s.diff_sd = math.sqrt(sum((x - s.diff) ** 2 for x in diffs) / (len(diffs) - 1))
        if s.level in design.scanned:
            s.role = "scan" if scan_gates(s, tolerance) else "scanned"
            s.reach = ref.n_design if ref is not None else 0
        if s.level in design.probed and s.level not in design.refined:
            s.role = "probe"
        if s.role == "low_fill":
            s.diff_ci = difference_interval(diffs) if diffs else (-1.0, 1.0)
            s.diff_lower = s.diff_ci[0]
        elif s.level in design.refined and (final := final_items(design, s.level, tolerance)):
            # tested once, on items fixed before it was measured (statistics.refined_bounds)
            s.alpha, s.final = design.alpha_at(s.level), final
            first = [d for k, d in zip(common, diffs, strict=True) if order.get(k, final) < final]
            s.diff_ci = refined_bounds(diffs, first, s.alpha, not s.waiting)
            s.diff_lower = s.diff_ci[0]
        else:
            s.alpha = design.alpha_at(s.level)
            s.diff_ci = difference_bounds(diffs, s.alpha, design.horizon) if diffs else (-1.0, 1.0)
            s.diff_lower = s.diff_ci[0]
        # the pass test's margin of error: how far below the measured difference its bound lies
        s.half_width = round(max(0.0, s.diff - s.diff_lower), 6)
    a = Analysis(
        stats,
        tolerance,
        margin,
        window,
        None,
        None,
        None,
        flagged,
        errors,
        [],
        reference_level=design.reference,
        closed_book_excluded=not include_closed_book,
        metric=metric,
        floor=floor,
        refined=list(design.refined),
        scanned=list(design.scanned),
        probed=list(design.probed),
        cap=design.cap,
        repeat_icc=repeat_icc(
            (r for r in rows if not r["control"] and r["item"] not in excluded),
            design.reference,
        ),
    )
    decide(a, ref, tolerance)
    if design.scan_resolution:
        cap_unscanned(a, design.scan_resolution)
    judge(a, ref, rows, controls, tolerance)
    a.outcome = outcome_of(a)
    return a


def final_items(design: Design, level: float, tolerance: float) -> int:
    """The items a refined level's one test is run on, or 0 when too few are planned for the
    fixed-sample test to hold its error (``FIXED_MIN_ITEMS``): that level is tested with the
    anytime-valid bound at every look, as a grid level is."""
    n = refined_items(
        tolerance,
        design.repeats,
        design.level_repeats.get(level, design.repeats),
        design.alpha_at(level),
        design.cap or len(design.levels.get(design.reference, [])),
    )
    return n if n >= FIXED_MIN_ITEMS else 0


def _level(
    lv: float,
    rs: list[Row],
    im: dict[str, float],
    design: Design,
    by_key: dict[str, Row],
    window: int,
) -> LevelStats:
    at = sample_key("", lv, 0)[:-1]  # "@{level}#": the key's level part, formatted once
    keys = [f"{i}{at}{r}" for i in design.levels[lv] for r in range(design.repeats_of(i, lv))]
    found = [by_key.get(k) for k in keys]
    missing = found.count(None)
    errored = sum(1 for f in found if f is not None and f.get("status") != "ok")
    per_repeat: dict[int, list[int]] = defaultdict(list)
    pos: dict[str, list[int]] = defaultdict(list)
    for r in rs:
        per_repeat[int(r["repeat"])].append(int(r["correct"]))
        p = r.get("gold_position")
        if p is not None:
            pos["front" if p < 1 / 3 else "middle" if p < 2 / 3 else "back"].append(
                int(r["correct"])
            )
    reps = [mean(v) for v in per_repeat.values()] or [0.0]
    counts = Counter(r["bucket"] for r in rs)
    ratios = [
        (r["prompt_tokens"] - reported) / reported
        for r in rs
        if (reported := r.get("usage_prompt")) is not None and reported > 0
    ]
    acc = mean(int(r["correct"]) for r in rs) if rs else 0.0
    return LevelStats(
        level=lv,
        utilization=round(mean(r["utilization"] for r in rs), 4) if rs else lv,
        n_items=len(im),
        n_calls=len(rs),
        accuracy=acc,
        ci=accuracy_interval(list(im.values())),
        repeat_min=min(reps),
        repeat_max=max(reps),
        buckets={b: counts.get(b, 0) / len(rs) if rs else 0.0 for b in BUCKETS},
        mean_prompt_tokens=round(mean(r["prompt_tokens"] for r in rs), 1) if rs else 0.0,
        gold_position_accuracy={k: round(mean(v), 3) for k, v in sorted(pos.items())},
        planned_calls=len(keys),
        n_design=len(design.levels[lv]),
        missing_calls=missing,
        errored_calls=errored,
        counter_error=round(mean(ratios), 5) if ratios else None,
    )


def design_of(plan: Plan) -> Design:
    """What the plan says was to be measured (a plan without a recorded design: every item at every
    planned level)."""
    ids = plan.item_ids
    per = {lv: ids[: plan.items_at(lv)] for lv in plan.measured_levels}
    n_control = plan.n_control if plan.n_control is not None else len(ids)
    control = ids[:n_control] if plan.spec.control else []
    return Design(
        per,
        plan.spec.repeats,
        control,
        plan.chain_reference,
        refined=tuple(plan.refined),
        scanned=tuple(plan.scanned),
        probed=tuple(plan.probed),
        scan_resolution=plan.spec.resolution if plan.refine else None,
        horizon=plan.horizon
        or min(plan.planned_items or len(ids), plan.item_cap or len(ids))
        or None,
        cap=plan.item_cap,
        item_repeats=plan.item_repeats(),
        level_repeats=plan.level_repeats(),
    )


@dataclass(frozen=True)
class RunAnalysis:
    """A run directory read and analysed: its plan, its calls (as rows) and its task set."""

    analysis: Analysis
    plan: Plan
    rows: list[Row]
    taskset: TaskSet


def analysis_of(
    out: Path,
    tolerance: float | None = None,
    margin: float | None = None,
    floor: float | None = None,
    include_closed_book: bool = False,
) -> RunAnalysis:
    """Read ``out`` (plan, call log, task set) and analyse it; the tolerance, margin and floor
    default to the plan's."""
    plan = Plan.load(out)
    ts = open_taskset(plan.spec.taskset)
    if plan.window:  # the corpus the run measured: extended for its window, as run.py does
        ts = extend(ts, reach(plan.levels, plan.window))
    wanted = set(plan.item_ids)
    items = {i.id: i for i in ts.items if i.id in wanted}
    rows = [r.row() for r in CallLog(out / "calls.jsonl").records().values()]
    assert plan.window is not None, "a saved plan has its window"
    a = analyse(
        rows,
        items,
        plan.window,
        tolerance if tolerance is not None else plan.spec.tolerance,
        margin if margin is not None else plan.spec.margin,
        design=design_of(plan),
        docs={d.id: d.text for d in ts.docs.values()},
        floor=floor if floor is not None else (plan.min_accuracy or DEFAULT_FLOOR),
        include_closed_book=include_closed_book,
        metric=ts.metric,
    )
    return RunAnalysis(a, plan, rows, ts)
