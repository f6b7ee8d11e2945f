"""Simulated sweeps: the sweep's own design and analysis, run on outcomes drawn from known curves.

A :class:`Truth` is an accuracy curve item by item (an item's chance of a right answer at a fill),
of one of the shapes sweeps meet: a cliff, a gradual fall after a knee, a gentle decline from the
start, a plateau with a dip before a cliff, a fragile subset of items that fails early, items
that are either always right or always wrong, repeats that agree fully or not at all.
:class:`SimSweep` runs ``ceiling sweep run``'s design on it (the same level grid, sample size,
opening, adaptive steps and refinement: :mod:`context_ceiling.sweep.design`, and the same
analysis: :func:`context_ceiling.sweep.analysis.analyse_graded`) with simulated calls, and counts
what it spent: calls, input tokens, the part of them a prompt cache serves, items.

Two users: the dry run's expected cost (:func:`forecast`: the spread of what the adaptive design
spends over a range of plausible curves, not the opening grid alone) and the validity study
(``benchmarks/validity.py``: how often the number is right, against the truth).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from context_ceiling.core.prices import Price
from context_ceiling.sweep.analysis import analyse_graded, final_items
from context_ceiling.sweep.calllog import Row
from context_ceiling.sweep.curve import Analysis, Design
from context_ceiling.sweep.design import (
    Opening,
    affordable,
    asked_few,
    deferred,
    first_items,
    next_step,
    opening,
    staged,
)
from context_ceiling.sweep.plan import levels_for
from context_ceiling.sweep.statistics import ADDED_REPEATS, items_for

__all__ = [
    "SHAPES",
    "SimSweep",
    "Spend",
    "Truth",
    "forecast",
    "random_truth",
    "truths",
    "with_truth",
]

SHAPES = ("cliff", "gradual", "gentle", "dip", "fragile", "bimodal", "recover")
_FLOOR = 0.15  # where a cliff or a fall ends
_QUAD = 24  # quadrature points over the item effects


def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x > -700 else 0.0


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _hermite(n: int) -> list[tuple[float, float]]:
    """Gauss-Hermite nodes and weights for a standard normal (probabilists' form), by the
    Golub-Welsch recurrence solved with numpy."""
    import numpy as np

    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    total = float(weights.sum())
    return [(float(x), float(w) / total) for x, w in zip(nodes, weights, strict=True)]


@dataclass(frozen=True)
class Truth:
    """A known curve. ``base``: accuracy on the plateau; ``knee``: where the fall starts;
    ``sigma``: the spread of item difficulty (logit SD); ``rho``: the chance a repeat copies the
    first call's outcome (near-greedy sampling repeats itself); ``known``: the share of items
    the model answers with no documents. Shape-specific: ``slope`` (gentle: accuracy points lost
    per unit of fill from the start), ``dip_at``/``dip`` (a plateau that dips ``dip`` accuracy
    points at ``dip_at`` and stays there until the cliff; ``recover``: for ``dip_width`` of fill,
    then recovers), ``fragile``/``fragile_at`` (that share of items falls at that
    fill), ``bimodal`` (items either nearly always right or nearly always wrong)."""

    shape: str
    base: float
    knee: float
    sigma: float = 1.0
    rho: float = 0.5
    known: float = 0.05
    slope: float = 0.0
    dip_at: float = 0.0
    dip: float = 0.0
    dip_width: float = 0.0
    fragile: float = 0.0
    fragile_at: float = 0.0

    def _fall(self, u: float, knee: float) -> float:
        """The logit shift of a cliff or a gradual fall at ``knee`` (0 before it)."""
        fall = 8.0 if self.shape == "bimodal" else _logit(self.base) - _logit(_FLOOR)
        if self.shape == "gradual":
            return -fall * max(0.0, u - knee) / 0.3
        return -fall / (1 + math.exp(-(u - knee - 0.015) / 0.005))

    def effects(self) -> list[tuple[float, float]]:
        """The distribution of item effects as (value, weight)."""
        if self.shape == "bimodal":
            return [(4.0, self.base), (-4.0, 1 - self.base)]
        return [(self.sigma * x, w) for x, w in _hermite(_QUAD)]

    def p_item(self, effect: float, u: float, fragile: bool = False) -> float:
        """An item's chance of a right answer at fill ``u``: a logit curve (the cliff or fall)
        and, for the gentle and dip shapes, a loss in accuracy points on top."""
        centre = 0.0 if self.shape == "bimodal" else _logit(self.base)
        fall = 0.0 if self.shape == "gentle" else self._fall(u, self.knee)
        if fragile:
            fall = self._fall(u, self.fragile_at)
        p = _sig(centre + effect + fall)
        if self.shape == "gentle":
            p -= self.slope * u
        elif self.shape == "dip":  # a step down of ``dip`` points, kept until the cliff
            p -= self.dip / (1 + math.exp(-(u - self.dip_at - 0.025) / 0.008))
        elif self.shape == "recover":  # ``dip`` points down over ``dip_width``, then back up
            p -= self.dip * (
                _sig((u - self.dip_at) / 0.008) - _sig((u - self.dip_at - self.dip_width) / 0.008)
            )
        return min(1.0, max(0.0, p))

    def p(self, u: float) -> float:
        """Population accuracy at fill ``u`` of the items not known closed-book."""
        total = 0.0
        for e, w in self.effects():
            robust = self.p_item(e, u)
            if self.fragile:
                robust = (1 - self.fragile) * robust + self.fragile * self.p_item(e, u, True)
            total += w * robust
        return total

    def drop_point(self, reference: float, limit: float, tolerance: float) -> float:
        """The true drop point: the highest fill up to which every fill is within ``tolerance``
        of the reference's accuracy (a dip below it counts, even if accuracy recovers)."""
        p0 = self.p(reference)
        u = reference
        for k in range(round(reference * 1000), round(limit * 1000) + 1):
            if self.p(k / 1000) - p0 < -tolerance:
                break
            u = k / 1000
        return u


def random_truth(rng: random.Random, shape: str, **over: Any) -> Truth:
    """A curve of ``shape`` with its parameters drawn from the ranges the validity study uses
    (knees uniform over 0.3-0.9, base accuracy over 0.6-0.98); ``over`` fixes any of them."""
    base = rng.uniform(0.6, 0.98)
    knee = rng.uniform(0.3, 0.9)
    kw: dict[str, Any] = {"shape": shape, "base": base, "knee": knee}
    if shape == "gentle":
        kw |= {"slope": rng.uniform(0.2, 0.4), "knee": 2.0}
    elif shape == "dip":
        kw |= {"dip": 0.06, "knee": rng.uniform(0.6, 0.95), "dip_at": rng.uniform(0.25, 0.5)}
    elif shape == "recover":
        kw |= {
            "dip": 0.08,
            "knee": rng.uniform(0.7, 0.95),
            "dip_at": rng.uniform(0.25, 0.45),
            "dip_width": rng.uniform(0.08, 0.15),
        }
    elif shape == "fragile":
        kw |= {"fragile": 0.2, "fragile_at": rng.uniform(0.3, 0.5), "knee": rng.uniform(0.6, 0.95)}
    elif shape == "bimodal":
        kw |= {"base": rng.uniform(0.6, 0.9)}
    kw |= over
    return Truth(**kw)


@dataclass
class _Items:
    """One task set's items under a truth: effects, fragile and closed-book flags."""

    truth: Truth
    effects: list[float]
    fragile: list[bool]
    known: list[bool]
    rng: random.Random

    @classmethod
    def draw(cls, truth: Truth, n: int, rng: random.Random) -> _Items:
        if truth.shape == "bimodal":
            effects = [4.0 if rng.random() < truth.base else -4.0 for _ in range(n)]
        else:
            effects = [rng.gauss(0, truth.sigma) for _ in range(n)]
        fragile = [rng.random() < truth.fragile for _ in range(n)]
        known = [rng.random() < truth.known for _ in range(n)]
        return cls(truth, effects, fragile, known, rng)

    def outcomes(self, i: int, u: float | None, repeats: int) -> list[int]:
        r = self.rng.random
        if self.known[i]:
            return [int(r() < 0.97) for _ in range(1 if u is None else repeats)]
        if u is None:
            return [int(r() < 0.02)]
        p = self.truth.p_item(self.effects[i], u, self.fragile[i])
        first = int(r() < p)
        rho = self.truth.rho
        return [first] + [first if r() < rho else int(r() < p) for _ in range(repeats - 1)]


@dataclass
class Spend:
    """What a sweep spent: calls, input tokens, the parts of them written to and read from a
    prompt cache (a shared haystack: a group's questions follow one another, the first writes
    the haystack, the others read it), output tokens, items drawn."""

    calls: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    #: input written to the cache (the first question on each shared haystack)
    written_tokens: int = 0
    output_tokens: int = 0
    items: int = 0

    def dollars(self, price: Price, *, cache: bool = True) -> float:
        """The cost at ``price`` (pass the batch rates for a batch run); ``cache``: the cached
        part at the cached rate and the written part at the write rate, else all uncached."""
        if not cache:
            return price.cost(self.input_tokens, self.output_tokens)
        return price.cost(
            self.input_tokens, self.output_tokens, self.cached_tokens, self.written_tokens
        )


@dataclass
class SimSweep:
    """One sweep as ``ceiling sweep run`` runs it, on simulated calls.

    ``items``: a fixed design of that many items (None: the adaptive default); ``budget``: a cap
    on the input tokens the design may plan (it stops adding items where the next step would
    cross it, as the run does)."""

    truth: Truth
    taskset: int = 960
    window: int = 131_072
    levels_spec: str = "0.2,0.5,0.8,max"
    repeats: int = 3
    tolerance: float = 0.05
    margin: float = 0.05
    resolution: float = 0.05
    low_fill: float = 0.1
    reservation: int = 100
    output_tokens: int = 20
    items: int | None = None
    adaptive: bool = True
    refine: bool = True
    budget_tokens: int | None = None
    #: items sharing one haystack (``--shared-haystack``; 1: a haystack per item, nothing cached)
    group_size: int = 1
    seed: int = 0
    records: list[Row] = field(default_factory=list)
    spend: Spend = field(default_factory=Spend)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.model = _Items.draw(self.truth, self.taskset, self.rng)
        self.order = list(range(self.taskset))
        self.rng.shuffle(self.order)
        self.position = {i: k for k, i in enumerate(self.order)}
        self._written: set[tuple[int, float, int]] = set()
        self.levels = levels_for(self.levels_spec, self.window, self.reservation, self.low_fill)
        self.reference = min(lv for lv in self.levels if lv != self.low_fill)
        self.refined: list[float] = []
        self.scanned: list[float] = []
        self.probed: list[float] = []
        self.item_reps: dict[int, int] = {}  # items asked other than ``repeats`` times
        #: how often the design's added calls are asked (as run.py's plan: ``ADDED_REPEATS``)
        self.added_reps = min(self.repeats, ADDED_REPEATS)
        #: grid levels asked as often as the added calls (as run.py's plan: ``asked_few``)
        adaptive = self.adaptive and self.items is None
        self.few = asked_few(self.levels, self.reference) if adaptive else []
        #: grid levels not measured yet (as run.py's plan: ``deferred``)
        self.grid_left = deferred(self.levels, self.reference) if adaptive else []
        self.open: Opening = opening(
            self.taskset,
            items_for(self.tolerance, self.repeats),
            self.items,
            adaptive,
        )
        self.drawn = self.open.start
        if self.budget_tokens is not None:
            self.drawn = affordable(self.drawn, self._opening_fits)
        self.n_at = {lv: 0 if lv in self.grid_left else self.drawn for lv in self.levels}
        self.n_control = self.drawn
        self.batches = [self.drawn]

    def _opening_fits(self, n: int) -> bool:
        assert self.budget_tokens is not None
        return self._opening_tokens(n) <= self.budget_tokens

    def _opening_tokens(self, n: int) -> int:
        opening = [*self._measured_levels(), *staged(self.levels, self.reference, self.grid_left)]
        return n * (
            1 + sum(self._reps(lv) * round(lv * self.window) for lv in opening)
        ) + n * round(0.002 * self.window)

    def _measured_levels(self) -> list[float]:
        """The levels measured so far (the plan's ``measured_levels``)."""
        return [lv for lv in self.levels if lv not in self.grid_left]

    def _reps(self, lv: float) -> int:
        """How often an item is asked at ``lv``: the refinement's and the scan's points and the
        grid levels asked few times as often as added calls are."""
        return self.added_reps if lv in self._at_added_repeats() else self.repeats

    def _at_added_repeats(self) -> tuple[float, ...]:
        """The levels asked as often as added calls are (the plan's ``at_added_repeats``)."""
        return (*self.refined, *self.scanned, *self.probed, *self.few)

    def _call_tokens(self, lv: float | None) -> int:
        return round((lv if lv is not None else 0.002) * self.window)

    def _measure(self, lv: float | None, ids: list[int]) -> None:
        tokens = self._call_tokens(lv)
        at = self.repeats if lv is None else self._reps(lv)
        for i in ids:
            outs = self.model.outcomes(i, lv, min(self.item_reps.get(i, self.repeats), at))
            for r, ok in enumerate(outs):
                self.spend.calls += 1
                self.spend.input_tokens += tokens
                self.spend.output_tokens += self.output_tokens
                if self.group_size > 1 and lv is not None:
                    # one haystack per group, level and repeat: the first question writes it to
                    # the prompt cache, the group's other questions read it
                    key = (self.position[i] // self.group_size, lv, r)
                    if key in self._written:
                        self.spend.cached_tokens += tokens
                    else:
                        self._written.add(key)
                        self.spend.written_tokens += tokens
                self.records.append(
                    {
                        "key": f"i{i}@closed" if lv is None else f"i{i}@{lv:.4f}#{r}",
                        "item": f"i{i}",
                        "level": lv,
                        "repeat": r,
                        "control": lv is None,
                        "correct": bool(ok),
                        "bucket": "correct" if ok else "missed",
                        "utilization": lv or 0.0,
                        "prompt_tokens": tokens,
                        "status": "ok",
                    }
                )

    def design(self) -> Design:
        ids = [f"i{i}" for i in self.order]
        return Design(
            {lv: ids[: self.n_at[lv]] for lv in self._measured_levels()},
            self.repeats,
            ids[: self.n_control],
            self.reference,
            refined=tuple(self.refined),
            scanned=tuple(self.scanned),
            probed=tuple(self.probed),
            scan_resolution=self.resolution if self.refine else None,
            horizon=self.open.horizon,
            cap=self.open.target,
            item_repeats={f"i{i}": r for i, r in self.item_reps.items()},
            level_repeats={
                lv: self.added_reps
                for lv in self._at_added_repeats()
                if self.added_reps < self.repeats
            },
        )

    def analyse(self, tolerance: float | None = None) -> Analysis:
        return analyse_graded(
            self.records,
            self.records,
            self.window,
            self.tolerance if tolerance is None else tolerance,
            self.margin,
            design=self.design(),
        )

    def _fits(self, calls_tokens: int) -> bool:
        if self.budget_tokens is None:
            return True
        return self.spend.input_tokens + calls_tokens <= self.budget_tokens

    def run(self) -> Analysis:
        self._measure(None, self.order[: self.n_control])
        for lv in self.levels:
            self._measure(lv, self.order[: self.n_at[lv]])
        while True:
            a = self.analyse()
            step = next_step(
                a,
                drawn=self.drawn,
                target_items=self.open.target,
                refine=self.refine,
                adaptive=self.adaptive,
                resolution=self.resolution,
                batch=self.open.batch,
                grid=self.grid_left,
                opened=self.batches[0],
            )
            if step is None:
                break
            if step.kind in ("grid", "stage"):
                [lv] = step.levels
                n = self.batches[0]
                if not self._fits(n * self._reps(lv) * self._call_tokens(lv)):
                    break
                self.grid_left.remove(lv)
                self._measure(lv, self.order[:n])
                self.n_at[lv] = n
            elif step.kind == "extend":
                [lv] = step.levels
                hi = min(b for b in self.batches if b > self.n_at[lv])
                cost = (hi - self.n_at[lv]) * self._reps(lv) * self._call_tokens(lv)
                if not self._fits(cost):
                    break
                self._measure(lv, self.order[self.n_at[lv] : hi])
                self.n_at[lv] = hi
            elif step.kind == "items":
                new = self.order[self.drawn : self.drawn + step.new_items]
                reps = self.added_reps
                cost = len(new) * (
                    self._call_tokens(None)
                    + reps * sum(self._call_tokens(lv) for lv in step.levels)
                )
                if not new or not self._fits(cost):
                    break
                if reps != self.repeats:
                    self.item_reps |= dict.fromkeys(new, reps)
                self.drawn += len(new)
                self.batches.append(self.drawn)
                self._measure(None, new)
                self.n_control = self.drawn
                for lv in step.levels:
                    self._measure(lv, self.order[self.n_at[lv] : self.drawn])
                    self.n_at[lv] = self.drawn
            else:
                added = {"scan": self.scanned, "probe": self.probed}.get(step.kind, self.refined)
                added.extend(step.levels)  # a midpoint's share of the error follows its place
                design = self.design() if step.kind == "levels" else None  # as run.py
                have = {lv: self.n_at.get(lv, 0) for lv in step.levels}  # a probe: its items
                first = {
                    lv: first_items(
                        step.kind,
                        final_items(design, lv, self.tolerance) if design is not None else 0,
                        self.n_at[self.reference],
                        self.batches[0] if self.batches else None,
                        have[lv],
                    )
                    for lv in step.levels
                }
                cost = sum(
                    (n - have[lv]) * self.added_reps * self._call_tokens(lv)
                    for lv, n in first.items()
                )
                if not self._fits(cost):
                    del added[-len(step.levels) :]
                    break
                for lv, n in first.items():
                    self._measure(lv, self.order[have[lv] : n])
                    self.n_at[lv] = n
                    self.levels = sorted({*self.levels, lv})
        self.spend.items = self.drawn
        return self.analyse()


def truths(rng: random.Random, shapes: tuple[str, ...] = SHAPES) -> Iterator[Truth]:
    """Curves of the given shapes in turn, parameters drawn at random."""
    k = 0
    while True:
        yield random_truth(rng, shapes[k % len(shapes)])
        k += 1


def forecast(
    make: Callable[[Truth, int], SimSweep],
    runs: int = 24,
    seed: int = 0,
) -> dict[str, float]:
    """What the design spends over ``runs`` plausible curves (every shape in turn): the median,
    the 10th and the 90th percentile of calls and input tokens, and the median cached share.
    ``make(truth, seed)`` builds the sweep with the run's own settings."""
    rng = random.Random(seed)
    spends: list[Spend] = []
    gen = truths(rng)
    for k in range(runs):
        sim = make(next(gen), seed * 1000 + k)
        sim.run()
        spends.append(sim.spend)

    def q(values: list[int], at: float) -> float:
        xs = sorted(values)
        return float(xs[min(len(xs) - 1, int(at * len(xs)))])

    calls = [s.calls for s in spends]
    tokens = [s.input_tokens for s in spends]
    return {
        "calls_median": statistics.median(calls),
        "calls_p10": q(calls, 0.1),
        "calls_p90": q(calls, 0.9),
        "input_tokens_median": statistics.median(tokens),
        "input_tokens_p10": q(tokens, 0.1),
        "input_tokens_p90": q(tokens, 0.9),
        "cached_share": statistics.median(
            s.cached_tokens / s.input_tokens if s.input_tokens else 0.0 for s in spends
        ),
        "written_share": statistics.median(
            s.written_tokens / s.input_tokens if s.input_tokens else 0.0 for s in spends
        ),
        "items_median": statistics.median(s.items for s in spends),
    }


def with_truth(sim: SimSweep, truth: Truth, seed: int) -> SimSweep:
    """The same settings on another curve, from scratch."""
    return replace(sim, truth=truth, seed=seed, records=[], spend=Spend())
