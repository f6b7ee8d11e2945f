"""What the context costs: the price of each request's input, split at the running ceiling.

Prices come from the model's ``price`` in the registry when set (a private deployment, a
negotiated rate, a self-hosted model at 0), else from the list price of the model the request
names (or the one the provider answered with) in the genai-prices data set, with its
long-context tiers; a model neither knows is not priced, never guessed.

A request's input of ``I`` tokens, ``C`` of them read from the provider's prompt cache, against a
ceiling of ``T`` tokens: the first ``min(I, T)`` tokens are within the ceiling, the rest above it.
A prompt cache serves a prefix, so the cached tokens are the first ``C``: within the ceiling
first. What trimming removed (enforce) or would have removed (observe) is priced at the uncached
input rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from context_ceiling.core.models import ModelSpec
from context_ceiling.core.prices import MILLION, Price, lookup
from context_ceiling.formats import APIS

__all__ = ["InputCost", "Pricing", "input_cost"]

#: genai-prices' provider ids for the sidecar's upstream APIs (each API module says its own); a
#: route's provider gives its own id (:attr:`~context_ceiling.formats.base.Route.price_provider`)
_PROVIDERS = {api: info.prices for api, info in APIS.items() if info.prices}
#: model names remembered (priced or not): request model names come from clients, so the lookups
#: they cause are bounded; a name past this many is not priced
MAX_NAMES = 1024


class Pricing:
    """The price of each model a request names, looked up once and remembered."""

    def __init__(self, models: Sequence[ModelSpec]) -> None:
        self._overrides = {
            id(m): Price(
                m.price.input,
                m.price.output,
                m.price.cached_input if m.price.cached_input is not None else m.price.input,
                f"models[{m.match}].price",
            )
            for m in models
            if m.price is not None
        }
        self._by_name: dict[tuple[str, str], Price | None] = {}

    def _listed(self, provider: str, name: str) -> Price | None:
        key = (provider, name)
        if key in self._by_name:
            return self._by_name[key]
        if len(self._by_name) >= MAX_NAMES:
            return None
        found = lookup(name, _PROVIDERS.get(provider, provider)) if name else None
        self._by_name[key] = found
        return found

    def price(
        self, spec: ModelSpec | None, provider: str, model: str, response_model: str | None
    ) -> Price | None:
        """The price of a request to ``model`` (of ``provider``: an API's name, or a provider's id in the price data set) that matched registry entry ``spec``; the provider's reported model is tried
        when the requested name is not listed (an Azure deployment name, an alias)."""
        if spec is not None:
            fixed = self._overrides.get(id(spec))
            if fixed is not None:
                return fixed
        found = self._listed(provider, model)
        if found is None and response_model and response_model != model:
            found = self._listed(provider, response_model)
        return found


@dataclass(frozen=True, slots=True)
class InputCost:
    """One request's input price in dollars, by (part, cache) with part within/above/no_ceiling
    and cache cached/uncached; and what trimming removed or would have removed, priced."""

    parts: dict[tuple[str, str], float] = field(default_factory=dict)
    savings: float = 0.0

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def above(self) -> float:
        return sum(v for (part, _), v in self.parts.items() if part == "above")


def input_cost(
    price: Price, tokens: int, cached: int, ceiling: int | None, removed: int = 0, before: int = 0
) -> InputCost:
    """The price of ``tokens`` input tokens (``cached`` of them from a prompt cache) against a
    ``ceiling`` (None: no ceiling), and of the ``removed`` tokens trimming took out of a request
    of ``before`` tokens (at the rates of the request as it arrived)."""
    rates = price.at(tokens)
    cached = max(0, min(cached, tokens))
    if ceiling is None:
        split = {("no_ceiling", "cached"): cached, ("no_ceiling", "uncached"): tokens - cached}
    else:
        within = min(tokens, ceiling)
        within_cached = min(cached, within)
        split = {
            ("within", "cached"): within_cached,
            ("within", "uncached"): within - within_cached,
            ("above", "cached"): cached - within_cached,
            ("above", "uncached"): tokens - within - (cached - within_cached),
        }
    parts = {
        key: n * (rates.cached_input if key[1] == "cached" else rates.input) / MILLION
        for key, n in split.items()
        if n > 0
    }
    savings = removed * price.at(max(before, tokens)).input / MILLION if removed > 0 else 0.0
    return InputCost(parts, savings)
