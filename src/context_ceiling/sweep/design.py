"""Where the next calls go (the experimental design): refinement and adaptive allocation.

A sweep starts with a grid (low-fill control, reference, 0.5, 0.8, the practical limit) on a
quarter of the items its tolerance needs (the practical limit asked once per item:
:func:`asked_few`), then, one step at a time, until nothing is open or the budget or
the task set runs out:

1. while the level that decides the ceiling failed but not clearly (its paired interval still
   contains ``-tolerance``), add a batch of items there and at the reference it is paired with,
   never at levels already decided, up to every item of the task set;
2. once it is decided, scan for dips that recover: points between every pair of passing grid
   levels at or below the ceiling, measured once on the opening's items (:func:`scans`); a
   scanned level that looks low joins the fixed sequence and, unless a drop is shown on the
   opening's items, goes on batch by batch to every item the reference has before it is
   decided (``LevelStats.short``); a dip there lowers the ceiling;
3. measure the geometric midpoint of the deciding bracket (the highest passing level and the
   first failing one) while the bracket is wider than the resolution, at most
   ``MAX_REFINEMENTS`` times (each midpoint is tested at its share of the error); a midpoint
   with a one-time test is measured first on the opening's items: one that has clearly dropped
   (past a cliff) fails there, and one that has not goes on, batch by batch as an open level
   does, to the items of its test.

Every look is covered by the pass test's confidence sequence (``statistics``), so adding items
until a level passes does not inflate the chance of passing one that dropped.

``run.py`` and ``benchmarks/validity.py`` (the simulation study) both call :func:`next_step`, so
the study measures the code that runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from context_ceiling.sweep.curve import Analysis, LevelStats
from context_ceiling.sweep.statistics import MAX_REFINEMENTS, MIN_ITEMS


@dataclass(frozen=True)
class Step:
    """Add ``new_items`` items at ``levels`` (kind ``items``), measure ``levels`` on the next
    batch of the items already drawn (kind ``extend``), or measure the new ``levels`` on the
    items :func:`first_items` gives (kind ``levels``: the refinement's midpoints; kind
    ``scan``: the dip scan's points)."""

    kind: str
    levels: tuple[float, ...]
    new_items: int = 0


def refinements(
    chain: list[LevelStats], tolerance: float, resolution: float, measured: set[float]
) -> list[float]:
    """The geometric midpoint of the bracket that decides the ceiling (the highest passing level
    and the first failing one) while it is wider than the resolution asked for. A gentle drop
    (less than the tolerance across the bracket) is refined too: it is where a gradual curve
    crosses the tolerance. Drops between two failing levels cannot move the ceiling and are left
    alone. ``chain``: the fixed sequence (``Analysis.chain``), from the reference up."""
    del tolerance
    for a, b in itertools.pairwise(chain):
        if a.passes and not b.passes:
            if not b.complete:
                return []
            if b.level - a.level > resolution:
                mid = round(math.sqrt(a.level * b.level), 4)
                if mid not in measured:
                    return [mid]
            return []
    return []


def scans(a: Analysis, resolution: float) -> list[float]:
    """Fills between two passing levels of the grid, at or below the ceiling, where a dip that
    recovers would go unseen: points evenly spaced between each such pair, no two further apart
    than the resolution (a dip that wide cannot fall between them), measured once on the
    opening's items. A scanned level that looks low then takes part in the fixed sequence
    (``decision.scan_gates``) and is extended to the reference's items before anything but a
    shown drop decides it: a dip there lowers the ceiling below it; one that holds up costs
    the pass test nothing. Only the grid's own pairs are
    scanned (not refined or scanned levels): one pass, at a bounded cost."""
    if a.ceiling_level is None or a.reference_level is None:
        return []
    grid = [
        s
        for s in a.levels
        if s.role in ("reference", "level")
        and s.level not in a.refined
        and s.level <= a.ceiling_level
        and s.passes
    ]
    done = {s.level for s in a.levels}
    out = []
    for lo, hi in itertools.pairwise(grid):
        k = math.ceil(round((hi.level - lo.level) / resolution, 6))
        for j in range(1, k):  # evenly spaced, no two points further apart than the resolution
            mid = round(lo.level + j * (hi.level - lo.level) / k, 4)
            if mid not in done and mid not in a.scanned:
                out.append(mid)
    return out


def first_items(kind: str, final: int, reference_items: int, opening_items: int | None) -> int:
    """The items a level the design adds is first measured on. A scanned point (kind ``scan``)
    and a refined midpoint with a one-time test (kind ``levels``, its test on ``final`` items):
    the opening's, extended batch by batch while it stays open (a midpoint past a cliff fails
    there and costs no more). A midpoint tested at every look (too few items for the one-time
    test: ``final`` 0): every item the reference has, at once."""
    if opening_items is None or (kind == "levels" and not final):
        return reference_items
    return min(reference_items, opening_items)


def open_levels(a: Analysis) -> list[float]:
    """The deciding level at the asked tolerance while more items could still change its
    decision: its bounds still straddle ``-tolerance`` (it failed, but not clearly) and more
    items could still make it pass (``decision.futile``)."""
    return [a.open_level] if a.open_level is not None else []


def asked_few(levels: list[float], reference: float) -> list[float]:
    """The grid levels an adaptive design asks as often as its added calls
    (``ADDED_REPEATS``) from the opening on: the highest (the practical limit), when at least
    two levels lie above the reference. It takes part in the decision only when every level
    below it passes, and its repeats would buy the spread at the fill furthest from any ceiling
    at the highest price per call (two repeats of it are a quarter of a default opening's
    tokens)."""
    above = sorted(lv for lv in levels if lv > reference)
    return above[-1:] if len(above) >= 2 else []


START_SHARE = 4
"""The adaptive design opens on this fraction (1/START_SHARE) of the planned items: levels past
the drop are then decided on few items, and items are added only where a decision is open."""


@dataclass(frozen=True)
class Opening:
    """How a sweep starts: ``start`` items drawn for the opening grid, at most ``target`` in all,
    ``batch`` added per adaptive step, the pass test's bets tuned for ``horizon`` items."""

    start: int
    target: int
    batch: int
    horizon: int


def opening(task_items: int, planned: int, fixed: int | None, adaptive: bool) -> Opening:
    """The opening for a task set of ``task_items`` items when the sample-size rule plans
    ``planned``: a fixed design (``fixed`` items) measures them all at once; the adaptive one
    starts on a part of the plan and may grow to every item where a decision stays open; with neither,
    the plan."""
    planned = min(task_items, planned)
    if fixed:
        target = min(task_items, fixed)
        return Opening(target, target, batch_size(planned), target)
    if adaptive:
        start = min(task_items, max(MIN_ITEMS, -(-planned // START_SHARE)))
        return Opening(start, task_items, batch_size(planned), planned)
    return Opening(planned, planned, batch_size(planned), planned)


def affordable(drawn: int, fits: Callable[[int], bool]) -> int:
    """Fixed-budget planning, the one rule the run and the simulation share: the most of the
    ``drawn`` items (at least one) whose opening design fits the budget, ``fits(n)`` saying
    whether an opening on ``n`` items does (its calls and tokens grow with ``n``)."""
    lo, hi = 0, drawn
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return max(lo, 1)


def batch_size(planned_items: int) -> int:
    """Items added per adaptive step: a quarter of the planned sample (small steps stop close to
    the number the decision needed)."""
    return max(MIN_ITEMS // 2, planned_items // 4)


def next_step(
    a: Analysis,
    *,
    drawn: int,
    target_items: int,
    refine: bool,
    adaptive: bool,
    resolution: float,
    batch: int,
) -> Step | None:
    """What to measure next, or None when the sweep is done (or can only end in a refusal no
    more data lifts: :attr:`Analysis.hopeless`)."""
    if a.hopeless:
        return None
    open_ = open_levels(a) if adaptive else []
    at = a.level(open_[0]) if open_ else None
    if at is not None and a.reference_level is not None:
        if at.n_design < drawn:  # items the reference already has: measure them there first
            return Step("extend", (at.level,))
        if drawn < target_items:
            n = min(batch, target_items - drawn)
            return Step("items", (a.reference_level, at.level), n)
    low = a.level(a.low_fill_open) if adaptive else None
    if low is not None and a.reference_level is not None:
        # the low-fill control must show the reference good: more items where it cannot yet
        if low.n_design < drawn:
            return Step("extend", (low.level,))
        if drawn < target_items:
            n = min(batch, target_items - drawn)
            return Step("items", (low.level, a.reference_level), n)
    if refine:
        dips = scans(a, resolution)
        if dips:
            return Step("scan", tuple(dips))
    if refine and len(a.refined) < MAX_REFINEMENTS:  # the refinement's error is split this far
        new = refinements(a.chain, a.tolerance, resolution, {s.level for s in a.levels})
        if new:
            return Step("levels", tuple(new))
    return None
