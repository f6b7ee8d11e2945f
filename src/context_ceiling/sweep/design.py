"""Where the next calls go (the experimental design): refinement and adaptive allocation.

A sweep's grid is the low-fill control, the reference, 0.5, 0.8 and the practical limit. It
opens on a quarter of the items its tolerance needs, at the low-fill control and the reference
(the levels above wait: :func:`deferred`), then, one step at a time, until nothing is open or
the budget or the task set runs out:

0. while the reference is not shown above the accuracy floor (its 95% interval reaches below
   it) and does not read far enough below it to stop (``decision.FLOOR_FUTILITY_Z``), add
   items at the reference alone: no ceiling is written without it, and it is the grid's
   cheapest fill; then the opening's second stage, the first level above the reference on the
   opening's items (:func:`staged`), so a model below the floor is refused before the
   opening's dearest level is paid for;
1. while the level that decides the ceiling failed but not clearly (its paired interval still
   contains ``-tolerance``), add a batch of items there and at the reference it is paired with,
   never at levels already decided, up to every item of the task set;
2. once the chain is decided, scan for dips that recover: points between every pair of passing
   grid levels, measured once on the opening's items (:func:`scans`); a scanned level that
   looks low joins the fixed sequence and, unless a drop is shown on the opening's items, goes
   on batch by batch to every item the reference has before it is decided
   (``LevelStats.short``); a dip there lowers the ceiling, and until a gap is scanned the
   ceiling stays below it (:func:`cap_unscanned`);
3. once every level measured passes, measure the next grid level on the opening's items, as the
   opening would have (the practical limit asked once per item: :func:`asked_few`): a level
   above one that failed, or above a dip, cannot move the ceiling, and the grid's top levels
   are a sweep's dearest calls;
4. refine the deciding bracket (the highest passing level and the first failing one) while it
   is wider than the resolution, at most ``MAX_REFINEMENTS`` tested midpoints (each at its
   share of the error): a bracket with a cliff in it is first probed on the opening's items
   (:func:`refinements`) and the highest probe below the drop is tested; a gentler one is
   bisected. A midpoint with a one-time test is measured first on the opening's items: one
   that has clearly dropped fails there, and one that has not goes on, batch by batch as an
   open level does, to the items of its test.

Every look is covered by the pass test's confidence sequence (``statistics``), so adding items
until a level passes does not inflate the chance of passing one that dropped.

``run.py`` and ``benchmarks/validity.py`` (the simulation study) both call :func:`next_step`, so
the study measures the code that runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from context_ceiling.sweep.curve import Analysis, LevelStats
from context_ceiling.sweep.statistics import MAX_REFINEMENTS, MIN_ITEMS


@dataclass(frozen=True)
class Step:
    """Add ``new_items`` items at ``levels`` (kind ``items``), measure ``levels`` on the next
    batch of the items already drawn (kind ``extend``), measure a deferred grid level on the
    opening's items (kind ``grid``; kind ``stage``: the opening's second stage, :func:`staged`),
    or measure the new ``levels`` on the items
    :func:`first_items` gives (kind ``levels``: the refinement's midpoints; kind ``probe``: the
    refinement's probes; kind ``scan``: the dip scan's points)."""

    kind: str
    levels: tuple[float, ...]
    new_items: int = 0


STEEP = 3.0
"""The refinement probes a bracket whose failing level measured a drop of more than this many
times the tolerance: a cliff lies inside it, and a probe past the cliff shows the drop on the
opening's items. A gentler bracket is bisected with every midpoint tested, since a probe there
would show nothing on so few items."""

#: the most points the refinement probes on the opening's items in one sweep
MAX_PROBES = 8


def _bracket(chain: list[LevelStats]) -> tuple[LevelStats, LevelStats] | None:
    """The highest passing level and the first failing one above it, once that one is decided
    (a failing level still measured is open, and refined nothing past it)."""
    for a, b in itertools.pairwise(chain):
        if a.passes and not b.passes:
            return (a, b) if b.complete else None
    return None


def refinements(a: Analysis, resolution: float, probes_left: int) -> Step | None:
    """The next point the refinement measures in the deciding bracket (the highest passing level
    and the first failing one above it), or None when the bracket is within the resolution.

    A bracket with a cliff in it (its failing level measured a drop past ``STEEP`` times the
    tolerance, or a probe has shown one) is first probed: geometric midpoints measured once on
    the opening's items and never tested (role ``probe``, kind ``probe``), between the highest
    probe that has not shown a drop and the lowest that has, until the two lie within the
    resolution. A point past a cliff shows its drop on the opening's items; one before it is a
    candidate whatever it reads short of a shown drop, so the midpoint's one test is not run on
    items chosen for reading well. The highest probe below the drop is then the midpoint (kind
    ``levels``): it goes on to the items of its one test. One test near the cliff, at the first
    share of the refinement's error, replaces a bisection that tests every flat midpoint on its
    way up at a share halved past each failure. A midpoint that fails sends the search to the
    next probe below it.

    A gentler drop gives a probe nothing to show: its bracket is bisected, each geometric
    midpoint tested (a probe already measured near the midpoint is tested in its place). Drops
    between two failing levels cannot move the ceiling and are left alone."""
    pair = _bracket(a.chain)
    if pair is None:
        return None
    lo, hi = pair
    probes = [s for s in a.levels if s.role == "probe" and s.complete and s.level > lo.level]
    shown = [s.level for s in probes if s.diff_ci[1] < -a.tolerance]  # a drop on the opening's
    top = min((lv for lv in shown if lv < hi.level), default=hi.level)
    held = [s.level for s in probes if s.level < top]
    below = max(held, default=lo.level)
    measured = {s.level for s in a.levels}
    # a drop shown by a probe above the bracket (past a midpoint that then failed) still says
    # the fall is a cliff: the search goes on down the probes already measured
    if shown or hi.diff < -STEEP * a.tolerance:
        if top - below > resolution and probes_left > 0:
            mid = round(math.sqrt(below * top), 4)
            if mid not in measured:
                return Step("probe", (mid,))
        if held:
            return Step("levels", (max(held),))
    if top - lo.level <= resolution:
        return None
    mid = round(math.sqrt(lo.level * top), 4)
    near = min(held, key=lambda lv: abs(lv - mid), default=None)
    if near is not None and abs(near - mid) <= resolution:
        return Step("levels", (near,))
    return Step("levels", (mid,)) if mid not in measured else None


def scans(a: Analysis, resolution: float) -> list[float]:
    """Fills between two passing levels of the grid (the chain's passing levels: at or below
    the ceiling the chain reaches) where a dip that recovers would go unseen, not measured yet:
    points evenly spaced between each such pair, no two further apart than the resolution (a
    dip that wide cannot fall between them), measured once on the opening's items. A scanned
    level that looks low then takes part in the fixed sequence (``decision.scan_gates``) and is
    extended to the reference's items before anything but a shown drop decides it: a dip there
    lowers the ceiling below it; one that holds up costs the pass test nothing. Only the grid's
    own pairs are scanned (not refined or scanned levels): one pass, at a bounded cost. Until
    they are measured the ceiling stays below them (:func:`cap_unscanned`)."""
    if a.reference_level is None:
        return []
    grid = [
        s
        for s in a.levels
        if s.role in ("reference", "level") and s.level not in a.refined and s.passes
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


def cap_unscanned(a: Analysis, resolution: float) -> None:
    """A ceiling above grid levels whose fills the dip scan has not measured (the design
    stopped before its scan: a budget, the task set) is not shown free of a dip that recovers
    between them: the ceiling stays at the highest passing level below the first point owed
    (``a.unscanned`` lists them, a warning says so). The design itself reads the chain, not the
    ceiling, so the scan still runs while it can."""
    owed = scans(a, resolution)
    a.unscanned = owed
    if not owed or a.ceiling_level is None:
        return
    below = [s for s in a.chain if s.passes and s.level < min(owed)]
    if not below or below[-1].level >= a.ceiling_level:
        return
    top = below[-1]
    a.ceiling_at(top)
    a.at_reference = top.level == a.reference_level
    a.warnings.append(
        f"the fills from {min(owed):g} to {max(owed):g} were not scanned for a dip that "
        f"recovers (the design stopped before its scan: a budget or the task set), so the "
        f"ceiling stays at {top.level:g} below them; ceiling sweep run --resume with a larger "
        "budget scans them"
    )


def first_items(
    kind: str, final: int, reference_items: int, opening_items: int | None, measured: int = 0
) -> int:
    """The items a level the design adds is first measured on. A scanned point (kind
    ``scan``), a probe (kind ``probe``) and a refined midpoint with a one-time test (kind
    ``levels``, its test on ``final`` items): the opening's, extended batch by batch while it
    stays open (a midpoint past a cliff fails there and costs no more). A midpoint tested at
    every look (too few items for the one-time test: ``final`` 0): every item the reference
    has, at once. A level already ``measured`` on more items (a probe tested as the midpoint)
    keeps them."""
    if opening_items is None or (kind == "levels" and not final):
        return max(measured, reference_items)
    return max(measured, min(reference_items, opening_items))


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


def deferred(levels: list[float], reference: float) -> list[float]:
    """The grid levels an adaptive design does not measure first: every level above the
    reference. The first of them (:func:`staged`) is the opening's second stage, measured on
    the opening's items as soon as the reference is shown above the accuracy floor (step kind
    ``stage``): a model below the floor is refused on the low-fill control and the reference
    alone, the grid's cheapest fills (about a third of the opening's tokens at the default
    levels). Each higher one is measured (step kind ``grid``) once every level below it
    passes; a sweep whose drop lies below 0.5 never pays for 0.8 and the practical limit, the
    two dearest levels of the grid (at the default three repeats, more than half of what
    opening on the whole grid costs)."""
    return sorted(lv for lv in levels if lv > reference)


def staged(levels: list[float], reference: float, waiting: Sequence[float]) -> list[float]:
    """The opening's second stage while it waits: the first grid level above the reference,
    when it is among the ``waiting`` grid levels (none once it is measured, or when the grid
    has no level above the reference). The opening's price and a budget's opening count it:
    every sweep that passes the floor measures it at once."""
    return [lv for lv in sorted(lv for lv in levels if lv > reference)[:1] if lv in waiting]


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


def floor_items(opened: int | None, target_items: int) -> int:
    """Items drawn, before the opening's second stage, past which a reference still reading
    below the accuracy floor (not yet far enough below it for futility) gets no more: as many
    again as the opening drew (``opened``), asked at the reference and the closed-book control
    once each (fewer calls than the second stage's level at its repeats), so a model below the
    floor that read above it on the opening by chance is refused within the calls the opening
    planned. A reference reading above the floor there goes on until it is shown above it (a
    model a few points over the floor needs more items than that); no opening given: no
    limit."""
    return target_items if opened is None else min(target_items, 2 * opened)


def _more_items(
    s: LevelStats, levels: tuple[float, ...], drawn: int, target_items: int, batch: int
) -> Step | None:
    """More items where ``s`` is open: first the items already drawn that ``s`` lacks (the
    reference has them), then a batch of new items at ``levels``; None when the task set has
    no more."""
    if s.n_design < drawn:
        return Step("extend", (s.level,))
    if drawn < target_items:
        return Step("items", levels, min(batch, target_items - drawn))
    return None


def _feed_starved(a: Analysis, drawn: int, target_items: int, batch: int) -> Step | None:
    """While no tolerance resolves the decision (:attr:`Analysis.stated_tolerance` None), more
    items for the lowest level of the chain scored on fewer than ``MIN_ITEMS`` items (a small
    opening, the closed-book items left out): a chain that reaches it at any tolerance is
    unresolved there however it reads, so without them the sweep would end unresolved with
    most of the task set unasked there. None: no such level, or no items left for it."""
    ref = a.reference_level
    if a.stated_tolerance is not None or ref is None:
        return None
    for s in a.chain:
        if s.complete and s.n_items < MIN_ITEMS and s.level != ref:
            step = _more_items(s, (ref, s.level), drawn, target_items, batch)
            if step is not None:
                return step
    return None


def next_step(
    a: Analysis,
    *,
    drawn: int,
    target_items: int,
    refine: bool,
    adaptive: bool,
    resolution: float,
    batch: int,
    grid: Sequence[float] = (),
    opened: int | None = None,
) -> Step | None:
    """What to measure next, or None when the sweep is done (or can only end in a refusal no
    more data lifts: :attr:`Analysis.hopeless`). ``grid``: the deferred grid levels not measured
    yet (:func:`deferred`), lowest first; ``opened``: the items the opening drew (a reference
    still reading below the floor at twice as many, before the second stage, ends the sweep:
    :func:`floor_items`)."""
    if a.hopeless:
        return None
    ref = a.level(a.reference_level)
    # the opening's second stage is measured once any level above the reference is
    staged_yet = ref is not None and any(s.level > ref.level for s in a.levels)
    if adaptive and ref is not None and ref.complete and ref.ci[0] < a.floor:
        # the reference not yet shown above the accuracy floor: no ceiling is written without
        # that, so its items come first (the cheapest fill of the grid); a model below the
        # floor that read above it on the opening by chance reads lower on them and stops
        most = target_items if staged_yet else floor_items(opened, target_items)
        if drawn >= most and ref.accuracy < a.floor:
            return None  # still reading below the floor within the opening's calls: refused
        step = _more_items(ref, (ref.level,), drawn, target_items, batch)
        if step is not None:
            return step
    if grid and ref is not None and not staged_yet:
        # the opening's second stage (the first level above the reference), once the floor
        # holds or no more items can be drawn to show it: what follows is as if the opening
        # had measured it with the reference
        return Step("stage", (min(grid),))
    open_ = open_levels(a) if adaptive else []
    at = a.level(open_[0]) if open_ else None
    if at is not None and a.reference_level is not None:
        step = _more_items(at, (a.reference_level, at.level), drawn, target_items, batch)
        if step is not None:
            return step
    low = a.level(a.low_fill_open) if adaptive else None
    if low is not None and a.reference_level is not None:
        # the low-fill control must show the reference good: more items where it cannot yet
        step = _more_items(low, (low.level, a.reference_level), drawn, target_items, batch)
        if step is not None:
            return step
    if refine:  # before a grid level above: a dip found below it makes that level moot
        dips = scans(a, resolution)
        if dips:
            return Step("scan", tuple(dips))
    step = _feed_starved(a, drawn, target_items, batch) if adaptive else None
    if step is not None:
        return step
    if grid and a.deciding_level is None and a.ceiling_level is not None:
        # every level measured passes (at the tolerance the data resolve): the next grid level
        return Step("grid", (min(grid),))
    if refine and len(a.refined) < MAX_REFINEMENTS:  # the refinement's error is split this far
        return refinements(a, resolution, MAX_PROBES - len(a.probed))
    return None
