"""What a sweep costs before it runs: the opening design, the median of what the adaptive design
spends over simulated curves (the prompt cache's shares included), every item uncached, what
each budget buys, and every budget turned into the input tokens it affords.

The run prices itself at its start and in the dry run (``sweep/run.py``); the simulation it
replays is the sweep's own design and analysis (``sweep/simulate.py``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from context_ceiling.core.prices import Price
from context_ceiling.sweep.plan import Plan
from context_ceiling.sweep.simulate import SimSweep, forecast, random_truth, with_truth
from context_ceiling.sweep.statistics import tolerance_for

__all__ = ["FORECAST_RUNS", "Estimate", "Pricing", "bought", "budget_lines", "cost_line"]

Estimate = tuple[int, int]
"""Calls and input tokens (the output reservation included) of a set of planned calls."""

FORECAST_RUNS = 12
"""How many simulated curves the forecast of what a sweep spends replays (dry run and run)."""


@dataclass
class Pricing:
    """A run's price: its plan, its price per token (None: unknown), what each call may write,
    the task set's items, the items planned and the most the design may draw, and its budgets."""

    plan: Plan
    price: Price | None
    output_reservation: int
    window: int
    task_items: int
    planned: int
    target_items: int
    budget_usd: float | None = None
    max_calls: int | None = None
    max_input_tokens: int | None = None
    #: the prompt cache's read and written shares of the input, as the forecast found them
    cache_shares: tuple[float, float] = (0.0, 0.0)

    def _usd(self, input_tokens: float, output_tokens: float) -> float:
        """Dollars at the run's price with the prompt cache's shares applied."""
        assert self.price is not None
        cached, written = self.cache_shares
        return self.price.cost(
            input_tokens, output_tokens, input_tokens * cached, input_tokens * written
        )

    def budgets(self, calls: int, tokens: int) -> list[dict[str, Any]]:
        """Item counts from 60 to the task set, each with what its opening grid costs (the
        opening's calls on the whole grid, ``calls`` and ``tokens``, scaled, uncached: a fixed
        design measures every level at once) and the tolerance it buys
        (:func:`tolerance_for`)."""
        plan, drawn = self.plan, max(1, len(self.plan.item_ids))
        total = self.task_items
        counts = sorted({n for n in (60, 120, 200, 400, self.planned, total) if 0 < n <= total})
        inp = max(0, tokens - calls * plan.spec.max_tokens)
        rows = []
        for n in counts:
            f = n / drawn
            usd = self._usd(inp * f, calls * f * self.output_reservation) if self.price else None
            rows.append(
                {
                    "items": n,
                    "usd": round(usd, 2) if usd is not None else None,
                    "tolerance": tolerance_for(n, plan.spec.repeats),
                }
            )
        return rows

    def budget_tokens(self, calls: int, tokens: int) -> int | None:
        """Every budget given (``--max-input-tokens``, ``--max-calls``, ``--budget-usd``) as the
        input tokens it affords at the opening's tokens per call, the tightest of them (the
        simulated forecast's cap); dollars at the uncached price, so the forecast never spends
        more than the budget. None: no budget."""
        per_call = max(1.0, tokens / max(1, calls))
        caps: list[float] = []
        if self.max_input_tokens is not None:
            caps.append(self.max_input_tokens)
        if self.max_calls is not None:
            caps.append(self.max_calls * per_call)
        if self.budget_usd is not None and self.price is not None:
            usd = self.price.cost(per_call, self.output_reservation)
            caps.append(self.budget_usd / usd * per_call if usd > 0 else math.inf)
        finite = [c for c in caps if math.isfinite(c)]
        return math.floor(min(finite)) if finite else None

    def simulated(self, budget_tokens: int | None = None) -> SimSweep:
        """This run's design on a simulated endpoint (what :func:`forecast` replays), under the
        run's budget."""
        plan = self.plan
        groups = max(1, plan.groups or 1)
        return SimSweep(
            random_truth(random.Random(0), "cliff"),
            taskset=self.task_items,
            window=self.window,
            levels_spec=plan.spec.levels,
            repeats=plan.spec.repeats,
            tolerance=plan.spec.tolerance,
            margin=plan.spec.margin,
            resolution=plan.spec.resolution,
            low_fill=plan.spec.low_fill,
            reservation=plan.spec.max_tokens,
            output_tokens=self.output_reservation,
            items=plan.spec.items,
            adaptive=plan.adaptive,
            refine=plan.refine,
            group_size=max(1, round(len(plan.item_ids) / groups)),
            budget_tokens=budget_tokens,
        )

    def spend(self, calls: int, tokens: int) -> dict[str, Any]:
        """What the design is expected to spend, priced or not: the median calls and input
        tokens of the adaptive design over a range of simulated curves
        (:func:`context_ceiling.sweep.simulate.forecast`), the prompt cache's read share of
        them, every budget as the input tokens it affords (None: no budget) and the tolerance
        the items it buys resolve. ``calls``, ``tokens``: the opening's, which sets the tokens
        per call (its levels are the grid's cheapest, so a cap on calls becomes no more input
        tokens than those calls spend later in the design). Keeps the cache's shares for
        :meth:`costs`."""
        plan = self.plan
        budget = self.budget_tokens(calls, tokens)
        sim = self.simulated(budget)
        f = forecast(lambda truth, seed: with_truth(sim, truth, seed), runs=FORECAST_RUNS)
        # the prompt cache's share of the input (a shared haystack), as the simulation found it
        self.cache_shares = (f["cached_share"], f["written_share"])
        return {
            "expected_calls": round(f["calls_median"]),
            "expected_input_tokens": round(f["input_tokens_median"]),
            # a sweep whose drop comes early never pays for the grid's top levels: the spread
            "expected_input_tokens_range": [
                round(f["input_tokens_p10"]),
                round(f["input_tokens_p90"]),
            ],
            "expected_cached_share": round(f["cached_share"], 3),
            "budget_input_tokens": budget,
            "budget_tolerance": (
                tolerance_for(round(f["items_median"]), plan.spec.repeats)
                if budget is not None
                else None
            ),
        }

    def costs(
        self,
        calls: int,
        tokens: int,
        spend: dict[str, Any] | None = None,
        grid: Estimate | None = None,
    ) -> dict[str, Any] | None:
        """The run's price in dollars: ``min`` the opening design (``calls``, ``tokens``: it
        is certain to run), ``expected`` what :meth:`spend` forecasts (``spend``: already
        forecast), ``max`` every item the adaptive design may add at every level of the whole
        grid (``grid``: the opening's calls and tokens with the levels it defers; None: the
        same), uncached, or what the tightest budget affords (``max_by``); every call's whole
        output reservation counted; with the forecast's own fields. None: no price."""
        if self.price is None:
            return None
        plan, drawn = self.plan, max(1, len(self.plan.item_ids))
        out = self.output_reservation
        grow = plan.adaptive and not plan.spec.items
        inp = max(0, tokens - calls * plan.spec.max_tokens)  # the estimate holds the reservation
        all_calls, all_tokens = grid or (calls, tokens)
        all_inp = max(0, all_tokens - all_calls * plan.spec.max_tokens)
        cap = max(1.0, self.target_items / drawn) if grow else 1.0
        f = spend if spend is not None else self.spend(calls, tokens)
        got: dict[str, Any] = {
            "min": round(self._usd(inp, calls * out), 2),
            "expected": round(self._usd(f["expected_input_tokens"], f["expected_calls"] * out), 2),
            "max": round(self.price.cost(all_inp * cap, all_calls * cap * out), 2),
            "max_by": "items",  # every item the design may add; "budget": the budget's cap
            **f,
        }
        budget = f["budget_input_tokens"]
        if budget is not None and budget < all_inp * cap:  # every budget stops the run, not only $
            per_call = max(1.0, all_inp / max(1, all_calls))
            budgeted = self.price.cost(budget, budget / per_call * out)
            got["max"] = max(got["min"], round(min(got["max"], budgeted), 2))
            got["max_by"] = "budget"
        got["expected"] = min(max(got["expected"], got["min"]), max(got["max"], got["min"]))
        if self.budget_usd is not None and self.budget_usd < got["max"]:  # stops the run
            got["max"], got["max_by"] = self.budget_usd, "budget"
            got["expected"] = min(got["expected"], self.budget_usd)
        got["price_per_million"] = {
            "input": self.price.input,
            "cached_input": self.price.cached_input,
            "output": self.price.output,
        }
        got["source"] = self.price.source
        got["budget_usd"] = self.budget_usd
        return got


def bought(tolerance: float) -> str:
    """What a number of items buys, in words: the tolerance their ceiling is stated within."""
    if tolerance <= 0.5:  # tolerance_for: 1.0 when not even 50 points
        return f"a ceiling within {tolerance:.1%} of the reference"
    return "too few items for a ceiling within 50 points of the reference"


def cost_line(cost: dict[str, Any] | None, model: str, spend: dict[str, Any]) -> str:
    """One line on what the run is expected to spend (``spend``: :meth:`Pricing.spend`) and
    what it costs (``cost``: :meth:`Pricing.costs`; None: no price known, said so)."""
    cap = ""
    if spend["budget_tolerance"] is not None:
        cap = (
            f"; the budget affords about {spend['budget_input_tokens']:,} input tokens: "
            f"{bought(spend['budget_tolerance'])}"
        )
    low, high = spend["expected_input_tokens_range"]
    expected = (
        f"the median over simulated curves of what the adaptive design spends: "
        f"{spend['expected_calls']:,} calls, {spend['expected_input_tokens']:,} input tokens "
        f"({low:,} to {high:,} from the 10th to the 90th percentile), "
        f"{spend['expected_cached_share']:.0%} read from the prompt cache"
    )
    if cost is None:
        return (
            f"cost: no price known for {model} (say what it costs with --price IN,OUT, dollars "
            f"per million tokens; --price 0 for a self-hosted model); expected: {expected}{cap}"
        )
    if cost["budget_usd"]:
        cap = f"; capped at ${cost['budget_usd']:,.2f} (--budget-usd)" + cap
    p = cost["price_per_million"]
    most = (
        "what the budget affords"
        if cost["max_by"] == "budget"
        else "every item the adaptive design may add, uncached"
    )
    return (
        f"cost: about ${cost['expected']:,.2f} expected ({expected}), "
        f"${cost['min']:,.2f} at least (the opening design), "
        f"${cost['max']:,.2f} at most ({most}){cap}; "
        f"input ${p['input']:g}, cached input ${p['cached_input']:g} and output ${p['output']:g} "
        f"per million tokens ({cost['source']}), the whole output reservation counted"
    )


def budget_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What each budget buys: items, and the tolerance the decision resolves at with them."""
    out = []
    for r in rows:
        usd = f" for ${r['usd']:,.2f}" if r["usd"] is not None else ""
        out.append(f"  {r['items']:>5} items{usd}: {bought(r['tolerance'])}")
    return out
