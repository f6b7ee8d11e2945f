"""The measured curve, as the analysis hands it to the decision, the report and the design:
what was to be measured (:class:`Design`), each level's statistics (:class:`LevelStats`) and the
whole analysis with its ceiling, outcome and refusals (:class:`Analysis`)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from context_ceiling.sweep.calllog import Row
from context_ceiling.sweep.statistics import GRID_ALPHA, refine_alphas

__all__ = [
    "DEFAULT_FLOOR",
    "MAX_TOLERANCE",
    "UNRESOLVED",
    "Analysis",
    "Design",
    "LevelStats",
    "fill_of",
    "mean",
]


def mean(values: Iterable[float]) -> float:
    """The arithmetic mean (``statistics.mean`` is exact with fractions, and much slower)."""
    xs = list(values)
    return sum(xs) / len(xs)


DEFAULT_FLOOR = 0.5
UNRESOLVED = "unresolved"
MAX_TOLERANCE = 0.25
"""The widest tolerance a ceiling is stated at when the data cannot resolve the one asked for."""


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
    #: levels the refinement probed inside the deciding bracket on the opening's items, to find
    #: where the drop is before a midpoint is tested (shown, never tested, unless refined)
    probed: tuple[float, ...] = ()
    #: the items the pass test's bets are tuned for (fixed before the first call)
    horizon: int | None = None
    #: the dip scan's spacing when the design scans between passing grid levels (``--refine``):
    #: a gap it has not scanned yet caps the ceiling below it (None: the design does not scan)
    scan_resolution: float | None = None
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
    #: a refined level's pass is tested once, on this many items fixed before it is measured
    #: (``statistics.refined_items``); 0 for the other levels (anytime-valid bounds)
    final: int = 0
    #: a dip scan point that looks low (role ``scan``): the items the reference has, every one of
    #: which it is measured on before anything but a shown drop decides it
    reach: int = 0

    @property
    def short(self) -> bool:
        """A dip scan point that looks low, still short of the reference's items: the opening's
        items it was scanned on share the reference's own chance highs and lows with every other
        scan point, so only a drop shown there decides it; otherwise it goes on, batch by batch,
        as an open level does."""
        return self.role == "scan" and self.n_design < self.reach

    @property
    def waiting(self) -> bool:
        """A refined level still short of the items its one test is run on."""
        return bool(self.final) and self.n_design < self.final

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
    #: levels the refinement probed (:attr:`Design.probed`)
    probed: list[float] = field(default_factory=list)
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
    #: dip-scan points the design has not measured between passing grid levels (it stopped
    #: first: a budget, the task set): the ceiling stays at the grid level below the first
    unscanned: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def level(self, lv: float | None) -> LevelStats | None:
        return next((s for s in self.levels if s.level == lv), None)

    def ceiling_at(self, top: LevelStats) -> None:
        """The ceiling at passing level ``top``: its fill less the margin, in tokens of the
        window."""
        self.ceiling_level = top.level
        self.ceiling_utilization = round(top.utilization * (1 - self.margin), 4)
        self.ceiling_tokens = math.floor(self.ceiling_utilization * self.window)

    @property
    def chain(self) -> list[LevelStats]:
        """The fixed sequence the pass test walks, from the reference up: every level but the
        low-fill control, the scanned levels that do not look low and the refinement's probes
        (shown, never tested)."""
        return [s for s in self.levels if s.role not in ("low_fill", "scanned", "probe")]

    def blocking(self, accept_unresolved: bool = False) -> list[str]:
        """The refusals that stand (``--accept-unresolved`` waives only the unresolved one)."""
        return [r for r in self.refusals if not (accept_unresolved and r.startswith(UNRESOLVED))]


def fill_of(r: Row) -> float:
    """A measured row's level (a closed-book control's is None: never asked for here)."""
    lv = r["level"]
    assert lv is not None, f"{r['key']}: a closed-book control has no level"
    return lv
