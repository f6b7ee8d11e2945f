"""The decision on a measured curve: the fixed-sequence chain from the reference up at the
asked tolerance or the smallest wider one the data resolve, how a failing level is decided
(a shown drop, precision, futility), the low-fill control's burden of proof, the dip scan's
gate, and the judgements that refuse a number (incomplete levels, the accuracy floor, the
closed-book control, an unresolved decision) or warn about it.

Ceiling rule: the highest level whose paired difference to the reference has an anytime-valid
one-sided lower bound above ``-tolerance`` at its share of the 5% error (a non-inferiority test;
the fixed-sequence chain keeps the chance of passing any level that really dropped within it),
with every lower level passing too. The enforced ceiling is that level's measured utilization
times ``(1 - margin)``. Levels are never interpolated: refinement measures new levels where the
drop is.

``refusals`` lists every reason the number must not be used (``ceiling sweep derive`` refuses
with exit status 1): a reference below the accuracy floor or not clearly above the closed-book
control, an incomplete level, an unresolved decision (the deciding interval wider than the
tolerance, or a level scored on fewer than ``MIN_ITEMS`` items), a drop before the reference.
"""

from __future__ import annotations

import math
from collections import defaultdict

from context_ceiling.sweep.calllog import Row
from context_ceiling.sweep.curve import UNRESOLVED, Analysis, LevelStats, fill_of, mean
from context_ceiling.sweep.statistics import (
    FIXED_SHARE,
    MIN_ITEMS,
    bound_width,
    difference_interval,
    fixed_width,
    wilson,
)

__all__ = [
    "FLOOR_FUTILITY_Z",
    "FUTILITY_SE",
    "SCAN_LOW",
    "TOLERANCE_STEP",
    "decide",
    "decided_by",
    "futile",
    "items_to_resolve",
    "judge",
    "outcome_of",
    "reference_shown_good",
    "scan_gates",
]

COUNTER_WARN = 0.02
TOLERANCE_STEP = 0.005
FUTILITY_SE = 2.0
"""How many standard errors better than it measured a level is given before futility gives up on
it: a level measured on few items (the opening's, a scan point's) reads a few points low by
chance often enough that one standard error gave up on levels with no drop."""


FLOOR_FUTILITY_Z = 0.5
"""A reference that reads more than this many standard errors below the accuracy floor stops the
adaptive design (futility): its final reading is refused unless more items lift it above the
floor and then show it above with 95% confidence, which a model reading this low almost never
does. On the opening's 180 items of a default sweep, a model 10 points above the floor reads
this low about 0.1% of the time, 5 points above about 3%, one exactly at the floor about 31%."""


SCAN_LOW = 0.0
"""A scanned level gates the chain once its measured difference from the reference is below
``-SCAN_LOW * tolerance``: below the reference at all. The screen runs on the opening's items,
which every scan point shares with the reference's chance highs and lows, so in a sweep whose
reference read low on them every point of a dip reads high together: at a fifth of the
tolerance, 8-point dips 0.03-0.06 of the window wide went unseen in 5% of sweeps at half the
default spacing, a scan point inside every one of them (each read less than a point down). A
flat stretch reads below the reference about half the time; such a point is extended to the
items drawn and usually passes its test, but now and then fails it by chance and holds the
ceiling below it: the screen buys safety on narrow dips with some placement
(docs/validity.md)."""


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


def decide(a: Analysis, ref: LevelStats | None, tolerance: float) -> None:
    """The fixed-sequence chain from the reference up, at the asked tolerance or, where the data
    cannot resolve it, at the smallest wider one they resolve (up to ``a.max_tolerance``); sets
    the ceiling, the deciding level and the stated tolerance."""
    a.max_tolerance = max(a.max_tolerance, tolerance)
    steps = max(0, math.ceil(round((a.max_tolerance - tolerance) / TOLERANCE_STEP, 6)))
    _chain(a, ref, tolerance)
    d = a.level(a.deciding_level)
    if d is not None and d.final:
        # a refined level goes on to the items of its one test unless decided before them
        undecided = decided_by(d, tolerance, a.cap) is None
        a.open_level = d.level if d.complete and d.waiting and undecided else None
    elif (
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
            _open_refined(a, tol)
            return
    _chain(a, ref, tolerance)
    a.resolved = False
    d = a.level(a.deciding_level)
    if d is not None and d.diff_sd > 0:
        a.items_to_resolve = items_to_resolve(d, tolerance)


def _open_refined(a: Analysis, tolerance: float) -> None:
    """At the tolerance the data resolve, the level that decides may be a refined one still
    short of the items of its one test (the asked tolerance's chain stopped below it): it goes on
    to them, as at the asked tolerance, before anything is refined past it."""
    d = a.level(a.deciding_level)
    if (
        d is not None
        and d.final
        and d.complete
        and d.waiting
        and decided_by(d, tolerance, a.cap) is None
    ):
        a.open_level = d.level


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
        a.ceiling_at(passing[-1])
    above = [s for s in a.chain if not s.passes]
    a.deciding_level = above[0].level if above else None
    d = a.level(a.deciding_level)
    few = any(s.n_items < MIN_ITEMS for s in a.chain if d is None or s.level <= d.level)
    a.decided_by = decided_by(d, tolerance, a.cap) if d is not None else None
    if d is not None and d.waiting and a.decided_by is None:
        # a refinement left short of its items (a budget ran out) refines nothing: the level
        # above it that failed decides, as before the midpoint was added
        later = next((s for s in above[1:] if not s.waiting), None)
        a.decided_by = decided_by(later, tolerance, a.cap) if later is not None else None
    a.at_reference = bool(passing) and ref is not None and a.ceiling_level == ref.level
    # at the reference, only a measured drop decides (shown, or measured past the tolerance with
    # no more items to add): a level that merely missed the bound with its margin of error as
    # planned says nothing about where the drop is, and the wider tolerances are tried first;
    # one past the tolerance at that margin is not counted either: a reference that read high
    # by chance makes the next level read so, and a ceiling there gives up the window above
    firm = a.decided_by in ("drop", "futility") if a.at_reference else a.decided_by is not None
    a.resolved = bool(passing) and not few and (d is None or firm)


def decided_by(s: LevelStats, tolerance: float, cap: int | None = None) -> str | None:
    """How a failing level is decided, or None while it is open: ``drop`` when its bounds lie
    wholly below ``-tolerance``, ``precision`` when its pass test's margin of error is within
    the tolerance (as precise as asked: a level measured with no drop at all would have
    passed), ``futility`` when no more items could make it pass (:func:`futile`) *and* what it
    measured is itself a drop past the tolerance. A futile level whose measured difference is
    within the tolerance is no evidence of a drop: it stays open (the widening, or a refusal
    that says how many items would decide it). A dip-scan point short of the reference's items
    (:attr:`LevelStats.short`) is decided by a shown drop only."""
    if not s.complete:
        return None
    if s.diff_ci[1] < -tolerance:
        return "drop"
    if s.short:
        return None
    if s.half_width <= tolerance:
        return "precision"
    if futile(s, tolerance, cap) and s.diff <= -tolerance:
        return "futility"
    return None


def futile(s: LevelStats, tolerance: float, cap: int | None) -> bool:
    """Even at ``cap`` items (every item the design may measure there), a level whose difference
    is ``FUTILITY_SE`` standard errors better than measured would not pass: more items only
    spend, and the ceiling stays at the level below, on the safe side (futility stopping). Never
    for a dip-scan point short of the reference's items (:attr:`LevelStats.short`)."""
    if s.short:
        return False
    if s.final and not s.waiting:  # a refined level's one test is done
        return s.diff_lower <= -tolerance
    if cap is None or s.n_items < MIN_ITEMS or s.diff_sd <= 0:
        return False
    sd = max(s.diff_sd, 0.05)
    hopeful = s.diff + FUTILITY_SE * sd / math.sqrt(s.n_items)
    if s.final:  # its test: the fixed-sample one, on its final items
        return hopeful - fixed_width(s.final, sd, s.alpha * FIXED_SHARE) <= -tolerance
    return hopeful - bound_width(max(cap, s.n_items), round(sd, 4), s.alpha) <= -tolerance


def _judge_closed_book(
    a: Analysis,
    ref: LevelStats,
    rows: list[Row],
    controls: dict[str, bool],
    tolerance: float,
) -> None:
    """The reference must beat the closed-book control (the same items, no documents) on the
    paired difference, or the answers do not come from the context. Shown to beat it by less
    than ``tolerance`` (a model that knows the answers, a task set answered without its
    documents) the design stops and the number is refused: no fill's loss can be told apart
    from what the documents add at all."""
    w, no = a.warnings, a.refusals
    if controls:
        ref_items: dict[str, list[int]] = defaultdict(list)
        for r in rows:
            if not r["control"] and fill_of(r) == ref.level:
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
            elif hi < tolerance and len(diffs) >= MIN_ITEMS:
                a.hopeless = (
                    f"the documents add at most {hi:+.0%} to the closed-book control's "
                    f"{a.metric} ({a.closed_book_accuracy:.0%} with no documents; paired 95% "
                    f"upper bound), less than the {tolerance:.0%} tolerance: the answers hardly "
                    "depend on the context, so no fill's loss can be measured on this task set"
                )
                no.append(a.hopeless)
            if lo <= 0:
                no.append(
                    f"the reference {a.metric} is not clearly above the closed-book control "
                    f"({a.closed_book_accuracy:.0%} with no documents; paired 95% lower bound "
                    f"{lo:+.0%}): the answers do not come from the context"
                )
    else:
        w.append("no closed-book control was run: answers known without documents are scored")


def _judge_floor(a: Analysis, ref: LevelStats) -> None:
    """The reference must be shown above the accuracy floor; one shown below it, or reading
    below it by more than ``FLOOR_FUTILITY_Z`` standard errors, stops the design (more items
    cannot lift it, or almost never would)."""
    no = a.refusals
    if ref.n_items >= MIN_ITEMS:
        up = wilson(ref.accuracy, ref.n_items, FLOOR_FUTILITY_Z)[1]
        if ref.ci[1] < a.floor:
            a.hopeless = (
                f"the reference {a.metric} is shown below the floor (95% upper bound "
                f"{ref.ci[1]:.0%} < {a.floor:.0%}): more items cannot lift it"
            )
        elif up < a.floor:
            a.hopeless = (
                f"the reference {a.metric} reads below the floor ({ref.accuracy:.0%} on "
                f"{ref.n_items} items, {a.floor:.0%} asked; {FLOOR_FUTILITY_Z:g} standard "
                f"errors up is {up:.0%}): a model that reads this low is almost never shown "
                "above it with more items, so none are added (--min-accuracy lowers the floor)"
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


def judge(
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
    _judge_closed_book(a, ref, rows, controls, tolerance)
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
    if a.errors:
        w.append(f"{a.errors} call(s) failed after retries; --resume retries them")
    if a.hopeless:  # refused on what no more data lifts: nothing more to say of a ceiling
        return
    if a.ceiling_level is not None and not a.resolved:
        no.append(f"{UNRESOLVED}: {_unresolved_why(a)}")
    elif a.stated_tolerance is not None and a.stated_tolerance > tolerance + 1e-9:
        w.append(
            f"the data resolve a {a.stated_tolerance:.1%} tolerance, not the {tolerance:.0%} "
            f"asked for: the ceiling is stated at it ({a.metric} within "
            f"{a.stated_tolerance * 100:.1f} points of the reference, 95% one-sided); more items "
            "(--items, --budget-usd) narrow it"
        )
    if a.at_reference and a.resolved and not a.unscanned:  # else the scan's warning says why
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
