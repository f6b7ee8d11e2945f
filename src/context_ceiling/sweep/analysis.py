"""Turn graded calls into a curve, and the curve into a ceiling, or a reason there is none.

Per level: mean accuracy with a studentized 95% interval over items (``context_ceiling.sweep.statistics``: items are
the unit, their repeats stay with them), the min-max of accuracy across repeats, the failure
bucket shares, the planned, logged and errored calls, and how far the sweep's own token count
was from what the upstream reported. Each level above the reference is compared with the
reference paired by item.

What is measured comes from the plan, not from the log: a planned level with missing or errored
calls is incomplete, it cannot pass, and everything above it fails with it (missing data never
raises a ceiling). Items the model answers with no documents (the closed-book control) are left
out of the decision by default and reported apart. Levels below the reference (the low-fill
control) are measured but not in the chain: they show a drop that starts before the reference.

Ceiling rule: the highest level whose paired difference to the reference has a one-sided 95%
lower bound above ``-tolerance`` (a non-inferiority test at 5%; the fixed-sequence chain keeps
the chance of passing any level that really dropped at 5%), with every lower level passing too. The enforced ceiling is that level's measured utilization times ``(1 - margin)``. Levels
are never interpolated: refinement measures new levels where the drop is.

``refusals`` lists every reason the number must not be used (``ceiling sweep derive`` refuses
with exit status 1): a reference below the accuracy floor or not clearly above the closed-book
control, an incomplete level, an unresolved decision (the deciding interval wider than the
tolerance, or a level scored on fewer than ``MIN_ITEMS`` items), a drop before the reference.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from context_ceiling.sweep.calllog import CallLog, Row, sample_key
from context_ceiling.sweep.corpora import extend, reach
from context_ceiling.sweep.external import open_taskset
from context_ceiling.sweep.plan import Plan
from context_ceiling.sweep.scorer import BUCKETS, grade
from context_ceiling.sweep.statistics import (
    GRID_ALPHA,
    MIN_ITEMS,
    accuracy_interval,
    bound_width,
    difference_bounds,
    difference_interval,
    refine_alphas,
)
from context_ceiling.sweep.taskset import Item, TaskSet


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean (``statistics.mean`` is exact with fractions, and much slower)."""
    xs = list(values)
    return sum(xs) / len(xs)


DEFAULT_FLOOR = 0.5
COUNTER_WARN = 0.02
UNRESOLVED = "unresolved"
MAX_TOLERANCE = 0.25
"""The widest tolerance a ceiling is stated at when the data cannot resolve the one asked for."""
TOLERANCE_STEP = 0.005
FUTILITY_SE = 2.0
"""How many standard errors better than it measured a level is given before futility gives up on
it: a level measured on few items (the opening's, a scan point's) reads a few points low by
chance often enough that one standard error gave up on levels with no drop."""


@dataclass(frozen=True)
class Design:
    """What the plan says was to be measured: item ids per level, repeats, control items."""

    levels: dict[float, list[str]]
    repeats: int
    control: list[str]
    reference: float
    #: levels the refinement added (tested at its share of the error)
    refined: tuple[float, ...] = ()
    #: levels the dip scan added between passing levels (tested in the fixed sequence, at the
    #: grid's error, once they look low: :func:`scan_gates`)
    scanned: tuple[float, ...] = ()
    #: the items the pass test's bets are tuned for (fixed before the first call)
    horizon: int | None = None
    #: the most items the design may measure at a level (the task set, or a fixed design)
    cap: int | None = None
    #: items asked a number of times other than ``repeats``
    item_repeats: dict[str, int] = field(default_factory=dict)
    #: levels whose items are asked fewer times than their batches' repeats (the refinement's and
    #: the scan's points: once)
    level_repeats: dict[float, int] = field(default_factory=dict)

    def repeats_of(self, item: str, level: float | None = None) -> int:
        """How many times ``item`` is asked at ``level``."""
        r = self.item_repeats.get(item, self.repeats)
        return min(r, self.level_repeats.get(level, r)) if level is not None else r

    def alpha_at(self, level: float) -> float:
        """The error a level's pass test is run at: the grid's share, or the refinement's share
        its midpoint holds (:func:`refine_alphas`)."""
        if level in self.refined:
            return refine_alphas(self.refined)[self.refined.index(level)]
        return GRID_ALPHA

    @classmethod
    def full(
        cls, levels: Iterable[float], items: list[str], repeats: int, control: bool = True
    ) -> Design:
        lv = sorted(levels)
        return cls({x: list(items) for x in lv}, repeats, list(items) if control else [], lv[0])


@dataclass
class LevelStats:
    level: float
    utilization: float
    n_items: int
    n_calls: int
    accuracy: float
    ci: tuple[float, float]
    repeat_min: float
    repeat_max: float
    buckets: dict[str, float]
    diff: float = 0.0
    diff_ci: tuple[float, float] = (0.0, 0.0)
    diff_lower: float = 0.0  # anytime-valid one-sided lower bound: what the pass is tested on
    alpha: float = GRID_ALPHA  # the error that bound is at
    passes: bool = True
    mean_prompt_tokens: float = 0.0
    gold_position_accuracy: dict[str, float] = field(default_factory=dict)
    # "low_fill" | "reference" | "level" | "scan" (a scanned level that looks low: it gates the
    # chain) | "scanned" (one that does not: shown, not tested)
    role: str = "level"
    planned_calls: int = 0
    missing_calls: int = 0
    errored_calls: int = 0
    counter_error: float | None = None  # mean (ours - reported) / reported
    half_width: float = 0.0
    n_design: int = 0  # items the design measures at this level
    diff_sd: float = 0.0  # the SD of the paired differences (what more items would face)

    @property
    def complete(self) -> bool:
        return self.missing_calls == 0 and self.errored_calls == 0


@dataclass
class Analysis:
    levels: list[LevelStats]
    tolerance: float
    margin: float
    window: int
    ceiling_level: float | None
    ceiling_utilization: float | None
    ceiling_tokens: int | None
    closed_book_flagged: list[str]
    errors: int
    warnings: list[str]
    refusals: list[str] = field(default_factory=list)
    reference_level: float | None = None
    deciding_level: float | None = None
    resolved: bool = False
    closed_book_accuracy: float | None = None
    closed_book_excluded: bool = True
    floor: float = DEFAULT_FLOOR
    #: the tolerance the ceiling is stated at: the one asked for, or, where the data cannot
    #: resolve it (a small task set, a budget), the smallest wider one they resolve
    stated_tolerance: float | None = None
    max_tolerance: float = MAX_TOLERANCE
    #: the level more items could still decide at the asked tolerance (the adaptive design's)
    open_level: float | None = None
    #: the levels the refinement added
    refined: list[float] = field(default_factory=list)
    #: levels the dip scan added
    scanned: list[float] = field(default_factory=list)
    #: the most items the design may measure at a level
    cap: int | None = None
    #: how much of the calls' variance lies between items rather than between an item's repeats
    #: (the intraclass correlation: 1 when an item's repeats always agree; None: no repeats)
    repeat_icc: float | None = None
    #: what the answers measure (the task set's metric): the word every message uses
    metric: str = "accuracy"
    #: the ceiling is the reference level itself: nothing above it was shown to hold, so the
    #: number says little about where the drop is (reported apart, never as an ordinary ceiling)
    at_reference: bool = False
    #: how the deciding level was decided: "drop" (shown below the tolerance), "precision" (its
    #: margin of error within it), "futility" (no more items could make it pass, and it measured
    #: a drop past the tolerance); None while open or when every level passed
    decided_by: str | None = None
    #: items at the deciding level that would resolve the asked tolerance (its measured spread)
    items_to_resolve: int | None = None
    #: what the sweep concluded, one word: "ceiling" (a level above the reference holds,
    #: resolved), "at_reference" (only the reference holds and the next level shows a drop),
    #: "unresolved" (a number, but not one the data decide) or "refused" (no number to use)
    outcome: str = "refused"
    #: the low-fill level while it does not yet show the reference good at the asked tolerance
    #: and more items could (the adaptive design adds them there and at the reference)
    low_fill_open: float | None = None
    #: a refusal no more items can lift (a model shown below the floor, answers shown not to come
    #: from the context): the adaptive design stops at once
    hopeless: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def level(self, lv: float | None) -> LevelStats | None:
        return next((s for s in self.levels if s.level == lv), None)

    @property
    def chain(self) -> list[LevelStats]:
        """The fixed sequence the pass test walks, from the reference up: every level but the
        low-fill control and the scanned levels that do not look low."""
        return [s for s in self.levels if s.role not in ("low_fill", "scanned")]

    def blocking(self, accept_unresolved: bool = False) -> list[str]:
        """The refusals that stand (``--accept-unresolved`` waives only the unresolved one)."""
        return [r for r in self.refusals if not (accept_unresolved and r.startswith(UNRESOLVED))]


def _fill(r: Row) -> float:
    """A measured row's level (a closed-book control's is None: never asked for here)."""
    lv = r["level"]
    assert lv is not None, f"{r['key']}: a closed-book control has no level"
    return lv


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
        cell = by[(r["item"], _fill(r))]
        cell[int(r["repeat"]) if "repeat" in r else len(cell)] = int(r["correct"])
    cells: list[list[float]] = []
    for (item, level), reps in by.items():
        if reference is None:
            cells.append([float(x) for x in reps.values()])
        elif level != reference:
            ref = by.get((item, reference), {})
            cells.append([float(x - ref[k]) for k, x in reps.items() if k in ref])
    values = [x for xs in cells for x in xs]
    within = sum(sum((x - mean(xs)) ** 2 for x in xs) for xs in cells if len(xs) > 1)
    dof = sum(len(xs) - 1 for xs in cells if len(xs) > 1)
    if not dof or len(values) < 2:
        return None
    centre = mean(values)
    total = sum((x - centre) ** 2 for x in values) / (len(values) - 1)
    if total <= 0:
        return None
    return round(min(1.0, max(0.0, 1 - (within / dof) / total)), 4)


def item_means(rows: Iterable[Row]) -> dict[float, dict[str, float]]:
    """level -> item -> mean correctness over its repeats (controls left out)."""
    acc: dict[float, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if not r["control"]:
            acc[_fill(r)][r["item"]].append(int(r["correct"]))
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
        lv = sorted({_fill(r) for r in rows if not r["control"]})
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
            by_level[_fill(r)].append(r)
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
        if s.role == "low_fill":
            s.diff_ci = difference_interval(diffs) if diffs else (-1.0, 1.0)
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
        cap=design.cap,
        repeat_icc=repeat_icc(
            (r for r in rows if not r["control"] and r["item"] not in excluded),
            design.reference,
        ),
    )
    _decide(a, ref, tolerance)
    _judge(a, ref, rows, controls, tolerance)
    a.outcome = outcome_of(a)
    return a


SCAN_LOW = 0.5
"""A scanned level gates the chain once its measured difference from the reference is below
``-SCAN_LOW * tolerance``: half the tolerance down is where a dip starts to matter, and a level
that plainly holds up costs the chain no power."""


def scan_gates(s: LevelStats, tolerance: float) -> bool:
    """Whether a level the dip scan added takes part in the fixed sequence: it looks low (its
    measured difference is below ``-SCAN_LOW * tolerance``), or it is not measured whole yet (a
    level with calls missing proves nothing either way)."""
    return not s.complete or s.diff < -SCAN_LOW * tolerance


def outcome_of(a: Analysis) -> str:
    """The one-word conclusion (:attr:`Analysis.outcome`)."""
    if a.ceiling_level is None or a.blocking(accept_unresolved=True):
        return "refused"
    if not a.resolved or a.blocking():  # only unresolved refusals are left
        return "unresolved"
    return "at_reference" if a.at_reference else "ceiling"


def _level(
    lv: float,
    rs: list[Row],
    im: dict[str, float],
    design: Design,
    by_key: dict[str, Row],
    window: int,
) -> LevelStats:
    keys = [
        sample_key(i, lv, r) for i in design.levels[lv] for r in range(design.repeats_of(i, lv))
    ]
    missing = sum(1 for k in keys if k not in by_key)
    errored = sum(1 for k in keys if k in by_key and by_key[k].get("status") != "ok")
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


def _decide(a: Analysis, ref: LevelStats | None, tolerance: float) -> None:
    """The fixed-sequence chain from the reference up, at the asked tolerance or, where the data
    cannot resolve it, at the smallest wider one they resolve (up to ``a.max_tolerance``); sets
    the ceiling, the deciding level and the stated tolerance."""
    a.max_tolerance = max(a.max_tolerance, tolerance)
    steps = max(0, math.ceil(round((a.max_tolerance - tolerance) / TOLERANCE_STEP, 6)))
    _chain(a, ref, tolerance)
    d = a.level(a.deciding_level)
    if (
        d is not None
        and d.role in ("level", "scan")
        and d.complete
        and not futile(d, tolerance, a.cap)
    ):
        a.open_level = d.level if d.diff_lower <= -tolerance <= d.diff_ci[1] else None
    low = next((s for s in a.levels if s.role == "low_fill" and s.complete and s.n_items), None)
    if low is not None and not reference_shown_good(a, tolerance) and low.diff < tolerance:
        a.low_fill_open = low.level
    for k in range(steps + 1):
        tol = round(tolerance + k * TOLERANCE_STEP, 6)
        _chain(a, ref, tol)
        if a.resolved and reference_shown_good(a, tol):
            a.stated_tolerance = tol
            return
    _chain(a, ref, tolerance)
    a.resolved = False
    d = a.level(a.deciding_level)
    if d is not None and d.diff_sd > 0:
        a.items_to_resolve = items_to_resolve(d, tolerance)


def reference_shown_good(a: Analysis, tolerance: float) -> bool:
    """The low-fill control shows the reference good: the low fill's paired advantage over the
    reference has a 95% upper bound within ``tolerance`` (the burden of proof on the reference:
    a control measured on too few items to show it does not pass). No low-fill level: nothing
    to show."""
    return all(
        s.complete and s.n_items > 0 and s.diff_ci[1] <= tolerance
        for s in a.levels
        if s.role == "low_fill"
    )


def items_to_resolve(s: LevelStats, tolerance: float) -> int:
    """Items at which the pass test's margin of error at ``s`` (its measured spread) is within
    ``tolerance``: the sample that decides it whatever the difference turns out to be."""
    sd = round(max(s.diff_sd, 0.05), 4)
    n = max(s.n_items, MIN_ITEMS)
    while bound_width(n, sd, s.alpha) > tolerance and n < 100_000:
        n = math.ceil(n * 1.25)
    return n


def _chain(a: Analysis, ref: LevelStats | None, tolerance: float) -> None:
    ok = ref is not None and ref.complete and ref.n_items > 0
    if ref is not None:
        ref.passes = ok
    for s in a.chain:
        if s is ref:
            continue
        s.passes = ok and s.complete and s.diff_lower > -tolerance
        ok = s.passes
    for s in a.levels:
        if s.role == "low_fill":
            s.passes = s.complete
    passing = [s for s in a.chain if s.passes]
    a.ceiling_level = a.ceiling_utilization = a.ceiling_tokens = None
    if passing:
        top = passing[-1]
        a.ceiling_level = top.level
        a.ceiling_utilization = round(top.utilization * (1 - a.margin), 4)
        a.ceiling_tokens = math.floor(a.ceiling_utilization * a.window)
    above = [s for s in a.chain if not s.passes]
    a.deciding_level = above[0].level if above else None
    d = a.level(a.deciding_level)
    few = any(s.n_items < MIN_ITEMS for s in a.chain if d is None or s.level <= d.level)
    a.decided_by = decided_by(d, tolerance, a.cap) if d is not None else None
    a.at_reference = bool(passing) and ref is not None and a.ceiling_level == ref.level
    # at the reference, only a measured drop decides (shown, or measured past the tolerance with
    # no more items to add): a level that merely missed the bound with its margin of error as
    # planned says nothing about where the drop is, and the wider tolerances are tried first
    firm = a.decided_by in ("drop", "futility") if a.at_reference else a.decided_by is not None
    a.resolved = bool(passing) and not few and (d is None or firm)


def decided_by(s: LevelStats, tolerance: float, cap: int | None = None) -> str | None:
    """How a failing level is decided, or None while it is open: ``drop`` when its bounds lie
    wholly below ``-tolerance``, ``precision`` when its pass test's margin of error is within
    the tolerance (as precise as asked: a level measured with no drop at all would have
    passed), ``futility`` when no more items could make it pass (:func:`futile`) *and* what it
    measured is itself a drop past the tolerance. A futile level whose measured difference is
    within the tolerance is no evidence of a drop: it stays open (the widening, or a refusal
    that says how many items would decide it)."""
    if not s.complete:
        return None
    if s.diff_ci[1] < -tolerance:
        return "drop"
    if s.half_width <= tolerance:
        return "precision"
    if futile(s, tolerance, cap) and s.diff <= -tolerance:
        return "futility"
    return None


def futile(s: LevelStats, tolerance: float, cap: int | None) -> bool:
    """Even at ``cap`` items (every item the design may measure there), a level whose difference
    is ``FUTILITY_SE`` standard errors better than measured would not pass: more items only
    spend, and the ceiling stays at the level below, on the safe side (futility stopping)."""
    if cap is None or s.n_items < MIN_ITEMS or s.diff_sd <= 0:
        return False
    sd = max(s.diff_sd, 0.05)
    hopeful = s.diff + FUTILITY_SE * sd / math.sqrt(s.n_items)
    return hopeful - bound_width(max(cap, s.n_items), round(sd, 4), s.alpha) <= -tolerance


def _judge_closed_book(
    a: Analysis, ref: LevelStats, rows: list[Row], controls: dict[str, bool]
) -> None:
    """The reference must beat the closed-book control (the same items, no documents) on the
    paired difference, or the answers do not come from the context."""
    w, no = a.warnings, a.refusals
    if controls:
        ref_items: dict[str, list[int]] = defaultdict(list)
        for r in rows:
            if not r["control"] and _fill(r) == ref.level:
                ref_items[r["item"]].append(int(r["correct"]))
        diffs = [mean(v) - float(controls[k]) for k, v in ref_items.items() if k in controls]
        a.closed_book_accuracy = round(mean(controls.values()), 4)
        if diffs:
            lo, hi = difference_interval(diffs)
            if hi <= 0 and len(diffs) >= MIN_ITEMS:
                a.hopeless = (
                    f"the reference is shown no better than the closed-book control (paired 95% "
                    f"upper bound {hi:+.0%}): more items cannot make the answers come from the context"
                )
            if lo <= 0:
                no.append(
                    f"the reference {a.metric} is not clearly above the closed-book control "
                    f"({a.closed_book_accuracy:.0%} with no documents; paired 95% lower bound "
                    f"{lo:+.0%}): the answers do not come from the context"
                )
    else:
        w.append("no closed-book control was run: answers known without documents are scored")


def _judge_floor(a: Analysis, ref: LevelStats) -> None:
    """The reference must be shown above the accuracy floor; one shown below it stops the
    design (no more items can lift it)."""
    no = a.refusals
    if ref.n_items >= MIN_ITEMS and ref.ci[1] < a.floor:
        a.hopeless = (
            f"the reference {a.metric} is shown below the floor (95% upper bound {ref.ci[1]:.0%} "
            f"< {a.floor:.0%}): more items cannot lift it"
        )
    if ref.accuracy < a.floor:
        no.append(
            f"the reference {a.metric} ({ref.accuracy:.0%} at level {ref.level:g}) is below the "
            f"floor ({a.floor:.0%}): the model does not do this task even with little context, "
            "so no fill is safe (--min-accuracy sets the floor)"
        )
    elif ref.ci[0] < a.floor:
        # the burden of proof is on the model, as on the reference against the low fill: a
        # model just under the floor measures above it now and then
        # unresolved, not refused outright: more items can show it (--accept-unresolved)
        no.append(
            f"{UNRESOLVED}: the reference {a.metric} ({ref.accuracy:.0%} at level "
            f"{ref.level:g}) is not shown above the floor ({a.floor:.0%}): its 95% interval "
            f"reaches {ref.ci[0]:.0%}; more items (--items, --budget-usd) can show it, or "
            "--min-accuracy lowers the floor"
        )


def _judge(
    a: Analysis,
    ref: LevelStats | None,
    rows: list[Row],
    controls: dict[str, bool],
    tolerance: float,
) -> None:
    """Warnings (worth reading) and refusals (the number must not be used)."""
    w, no = a.warnings, a.refusals
    for s in a.levels:
        if s.missing_calls or s.errored_calls:
            no.append(
                f"level {s.level:g} is incomplete: {s.missing_calls} of {s.planned_calls} planned "
                f"call(s) missing and {s.errored_calls} errored (ceiling sweep run --resume finishes it)"
            )
        if s.counter_error is not None and abs(s.counter_error) > COUNTER_WARN:
            w.append(
                f"level {s.level:g}: the sweep's token count is {s.counter_error:+.1%} off the "
                "prompt tokens the upstream reported (check --tokenizer / --tokenize-url): every "
                "level's utilization is off by as much"
            )
    if ref is None:
        no.append("the reference level was not measured")
        return
    _judge_floor(a, ref)
    _judge_closed_book(a, ref, rows, controls)
    if a.closed_book_flagged:
        what = "left out of the decision" if a.closed_book_excluded else "scored"
        w.append(
            f"{len(a.closed_book_flagged)} item(s) answered correctly with no documents "
            f"(closed-book), {what}: {', '.join(a.closed_book_flagged[:10])}"
        )
    for s in a.levels:
        if s.role == "low_fill" and s.n_items and s.diff_ci[0] > tolerance:
            no.append(
                f"{a.metric} already falls before the reference: {s.accuracy:.0%} at level "
                f"{s.level:g} against {ref.accuracy:.0%} at {ref.level:g} (paired difference "
                f"{s.diff:+.0%}, 95% CI {s.diff_ci[0]:+.0%}..{s.diff_ci[1]:+.0%}); lower the reference"
            )
    if a.ceiling_level is None and not no:
        no.append("no level passed: the reference level could not be scored")
    if a.ceiling_level is not None and not a.resolved:
        no.append(f"{UNRESOLVED}: {_unresolved_why(a)}")
    elif a.stated_tolerance is not None and a.stated_tolerance > tolerance + 1e-9:
        w.append(
            f"the data resolve a {a.stated_tolerance:.1%} tolerance, not the {tolerance:.0%} "
            f"asked for: the ceiling is stated at it ({a.metric} within "
            f"{a.stated_tolerance * 100:.1f} points of the reference, 95% one-sided); more items "
            "(--items, --budget-usd) narrow it"
        )
    if a.at_reference and a.resolved:
        d = a.level(a.deciding_level)
        w.append(
            f"the ceiling is the reference level itself ({a.ceiling_level:g}): "
            + (
                f"level {d.level:g} measured {d.diff:+.1%} against it (decided by "
                f"{a.decided_by}), and no level between them was measured; a level between "
                "them (--refine) may place the ceiling higher"
                if d is not None
                else "no level above it was measured"
            )
        )
    if a.errors:
        w.append(f"{a.errors} call(s) failed after retries; --resume retries them")


def _unresolved_why(a: Analysis) -> str:
    """Why a ceiling is not resolved, and what would resolve it."""
    d = a.level(a.deciding_level)
    fewest = min(s.n_items for s in a.chain)
    more = (
        f"about {a.items_to_resolve} items at level {d.level:g} would resolve it; "
        if d is not None and a.items_to_resolve
        else ""
    )
    fix = (
        f"{more}add items (a larger --items, --budget-usd or --max-calls, then ceiling sweep "
        "run --resume) or accept it with --accept-unresolved"
    )
    if fewest < MIN_ITEMS:
        return f"a level was scored on {fewest} item(s), fewer than the {MIN_ITEMS} a decision needs; {fix}"
    if not reference_shown_good(a, a.max_tolerance):
        low = next(s for s in a.levels if s.role == "low_fill" and s.diff_ci[1] > a.max_tolerance)
        return (
            f"the reference is not shown good: the low-fill control ({low.level:g}) may score up "
            f"to {low.diff_ci[1]:+.1%} above it (paired 95% upper bound), more than even a "
            f"{a.max_tolerance:.0%} tolerance; lower the reference (--levels) or {fix}"
        )
    if d is None:
        return f"the decision is open; {fix}"
    if a.at_reference:
        return (
            f"the ceiling would be the reference level itself, but level {d.level:g} is not "
            f"shown to drop (it measured {d.diff:+.1%} against it, with a margin of error of "
            f"{d.half_width:.1%}), and no tolerance up to {a.max_tolerance:.0%} lets it pass; {fix}"
        )
    return (
        f"the pass test at the level that decides the ceiling ({d.level:g}) has a margin of "
        f"error of {d.half_width:.1%}, wider than even a {a.max_tolerance:.0%} tolerance; {fix}"
    )


def design_of(plan: Plan) -> Design:
    """What the plan says was to be measured (a plan without a recorded design: every item at every
    planned level)."""
    ids = plan.item_ids
    per = {lv: ids[: plan.items_at(lv)] for lv in plan.levels}
    n_control = plan.n_control if plan.n_control is not None else len(ids)
    control = ids[:n_control] if plan.spec.control else []
    return Design(
        per,
        plan.spec.repeats,
        control,
        plan.chain_reference,
        refined=tuple(plan.refined),
        scanned=tuple(plan.scanned),
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
