"""What tokens cost: per-model prices from a maintained data set, or the user's own.

Prices come from ``genai-prices`` (pydantic's maintained data set, its bundled snapshot: nothing
is fetched at run time), looked up by the model name the upstream is called with. A private
deployment or a self-hosted model has no list price: ``--price IN,OUT[,CACHED]`` (US dollars per
million tokens; ``--price 0`` for a model that costs nothing per token) says what it costs. A
model neither knows is reported as unpriced, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

from context_ceiling.core.errors import UserError

__all__ = ["Price", "Tier", "known_window", "lookup", "parse_price"]

MILLION = 1_000_000
#: the request size prices are read at: under every long-context tier (Anthropic and Google
#: charge more per token past 200k tokens in one request), so the rates are the base rates and a
#: cost of calls past such a threshold is a lower bound
_PROBE = 100_000


@dataclass(frozen=True)
class Tier:
    """The rates of a request whose input reaches ``start`` tokens: the provider then charges
    every token of that request at these (the "long context" tiers of Anthropic and Google)."""

    start: int
    input: float
    output: float
    cached_input: float


@dataclass(frozen=True)
class Price:
    """US dollars per million tokens: input (uncached), output, and input read from a prompt
    cache (the input price when the provider has no cached rate); ``tiers``: the rates of
    requests past a size, lowest start first."""

    input: float
    output: float
    cached_input: float
    source: str
    tiers: tuple[Tier, ...] = ()
    #: input written to a prompt cache (Anthropic charges more than for plain input; None: the
    #: input price)
    cache_write: float | None = None

    def at(self, input_tokens: int) -> Price:
        """The rates one request of ``input_tokens`` input is charged at."""
        chosen: Tier | None = None
        for t in self.tiers:
            if input_tokens >= t.start:
                chosen = t
        if chosen is None:
            return self
        return Price(chosen.input, chosen.output, chosen.cached_input, self.source)

    def cost(
        self,
        input_tokens: float,
        output_tokens: float,
        cached_tokens: float = 0.0,
        written_tokens: float = 0.0,
    ) -> float:
        """Dollars for these tokens; ``cached_tokens`` is the part of ``input_tokens`` read from
        a prompt cache, ``written_tokens`` the part written to one."""
        uncached = max(0.0, input_tokens - cached_tokens - written_tokens)
        write = self.input if self.cache_write is None else self.cache_write
        return (
            uncached * self.input
            + cached_tokens * self.cached_input
            + written_tokens * write
            + output_tokens * self.output
        ) / MILLION


def parse_price(spec: str) -> Price:
    """``IN,OUT[,CACHED]`` in dollars per million tokens, or ``0`` (a self-hosted model)."""
    try:
        parts = [float(x) for x in spec.split(",")]
    except ValueError:
        parts = []
    if len(parts) == 1 and parts[0] == 0:
        return Price(0.0, 0.0, 0.0, "--price 0 (self-hosted)")
    if len(parts) not in (2, 3) or any(p < 0 for p in parts):
        raise UserError(
            f"--price: {spec!r} is not IN,OUT[,CACHED] in dollars per million tokens (or 0)"
        )
    cached = parts[2] if len(parts) == 3 else parts[0]
    return Price(parts[0], parts[1], cached, f"--price {spec}")


def known_window(model: str, provider: str | None = None) -> int | None:
    """The advertised context window of ``model`` in the genai-prices snapshot (the same data set
    the prices come from); None when it lists no such model or no window for it.

    The entry the prices come from is asked first. Some flagship entries list no window where
    an aggregator's entry for the same model does (google's ``gemini-2.5-pro``, openrouter's
    ``google/gemini-2.5-pro``): then the entries for the model under any provider, its own id
    or ``owner/id``, and the window most of them list (the smaller of a tie: a level past the
    real window would be refused by the model)."""
    try:
        from genai_prices import Usage, calc_price, data
    except ImportError:
        return None
    resolved = _resolve(model, provider)
    if resolved is None:
        return None
    model, provider = resolved
    got = calc_price(Usage(input_tokens=1), model_ref=model, provider_id=provider)
    if got.model.context_window:
        return int(got.model.context_window)
    owners = {p.id for p in data.providers if p.find_model(model) is not None}
    refs = [model, *(f"{owner}/{model}" for owner in sorted(owners))]
    listed: dict[int, int] = {}
    for p in data.providers:
        found = {m.id: m for ref in refs if (m := p.find_model(ref)) is not None}
        for m in found.values():
            if m.context_window:
                listed[int(m.context_window)] = listed.get(int(m.context_window), 0) + 1
    if not listed:
        return None
    return min(listed, key=lambda w: (-listed[w], w))


def lookup(model: str, provider: str | None = None, batch: bool = False) -> Price | None:
    """The list price of ``model`` (at ``provider`` when given) from the genai-prices snapshot,
    batch rates with ``batch``; None when the data set has no such model or is not installed."""
    try:
        from genai_prices import Usage, calc_price
    except ImportError:
        return None
    resolved = _resolve(model, provider)
    if resolved is None:
        return None
    model, provider = resolved
    context = {"processing": "batch"} if batch else None

    def per_million(**usage: int) -> float:
        got = calc_price(
            Usage(**usage), model_ref=model, provider_id=provider, price_context=context
        )
        return float(got.total_price) * MILLION / _PROBE

    try:
        inp = per_million(input_tokens=_PROBE)
        out = per_million(output_tokens=_PROBE)
        cached = per_million(input_tokens=_PROBE, cache_read_tokens=_PROBE)
        write = per_million(input_tokens=_PROBE, cache_write_tokens=_PROBE)
        tiers = []
        for start in _tier_starts(model, provider):
            # a request past ``start`` input tokens is charged the tier's rate for every token
            n = start + 1
            rate = n / MILLION
            at = calc_price(Usage(input_tokens=n), model_ref=model, provider_id=provider)
            both = calc_price(
                Usage(input_tokens=n, output_tokens=n),
                model_ref=model,
                provider_id=provider,
            )
            read = calc_price(
                Usage(input_tokens=n, cache_read_tokens=n),
                model_ref=model,
                provider_id=provider,
            )
            t_in = float(at.total_price) / rate
            tiers.append(
                Tier(
                    n,
                    round(t_in, 6),
                    round(float(both.total_price) / rate - t_in, 6),
                    round(float(read.total_price) / rate, 6),
                )
            )
    except LookupError:
        return None
    version = metadata.version("genai-prices")
    where = f"{provider}/" if provider else ""
    return Price(
        inp, out, cached, f"genai-prices {version}: {where}{model}", tuple(tiers), round(write, 6)
    )


#: a gateway's provider prefix (LiteLLM's ``gemini/``, ``bedrock/``) as the data set's provider
_PREFIXES = {"gemini": "google", "vertex_ai": "google", "vertex": "google", "bedrock": "aws"}


def _resolve(model: str, provider: str | None) -> tuple[str, str | None] | None:
    """The (model, provider) the data set knows ``model`` by: as given; else a gateway's
    ``provider/model`` name (LiteLLM's, OpenRouter's; the Gemini API's ``models/...``) as the
    model at that provider, the model alone, then OpenRouter's entry of that name. None: the
    data set does not know it."""
    from genai_prices import Usage, calc_price, data

    candidates: list[tuple[str, str | None]] = [(model, provider)]
    prefix, _, rest = model.partition("/")
    if rest:
        known = {p.id for p in data.providers}
        owner = _PREFIXES.get(prefix.lower(), prefix.lower())
        if owner in known and owner != provider:
            candidates.append((rest, owner))
        candidates.append((rest, provider))
        if "openrouter" in known:
            candidates.append((model, "openrouter"))
    for ref, pid in candidates:
        try:
            calc_price(Usage(input_tokens=1), model_ref=ref, provider_id=pid)
        except LookupError:
            continue
        return ref, pid
    return None


def _tier_starts(model: str, provider: str | None) -> list[int]:
    """Where the model's long-context tiers start (input tokens), from its price record."""
    from genai_prices import Usage, calc_price

    got = calc_price(Usage(input_tokens=1), model_ref=model, provider_id=provider)
    prices: Any = got.model.prices if got.model is not None else None
    if not hasattr(prices, "input_mtok"):  # prices that change by time of day: not tiered
        return []
    starts: set[int] = set()
    for name in ("input_mtok", "output_mtok", "cache_read_mtok"):
        for tier in getattr(getattr(prices, name, None), "tiers", None) or []:
            starts.add(int(tier.start))
    return sorted(starts)
