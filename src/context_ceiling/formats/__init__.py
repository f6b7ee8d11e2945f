"""The wire formats, one module each, and the registry that the rest of the product reads.

A format module fills in one :class:`~context_ceiling.formats.base.Format` (its shape checks
and count, its trimming rules, usage readers and stream tap, answer reader, capture view and
error body) and lists its :class:`~context_ceiling.formats.base.Route` s. Adding a provider is
a module and a line in :data:`MODULES`; the sidecar's routes, the counter, the trimmer, the
answer checker and the error renderer all come from here.

:func:`count` and :func:`fit` are the public entry points an application uses to count and
trim its own requests the way the sidecar does (re-exported from ``context_ceiling``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from types import MappingProxyType, ModuleType
from typing import Any, Literal

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN, RequestCount
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.tokenizers import CountCache, TextCounter, TiktokenCounter
from context_ceiling.core.trim import FitReport, Policy, fit_with
from context_ceiling.core.vocabulary import Api, Shape
from context_ceiling.formats import (
    anthropic,
    azure,
    bedrock,
    gemini,
    openai_chat,
    responses,
    vertex_anthropic,
)
from context_ceiling.formats.base import ApiInfo, Format, Route

__all__ = [
    "APIS",
    "API_FORMATS",
    "FORMATS",
    "GENERATION_APIS",
    "MODULES",
    "ROUTES",
    "SHARED_CACHE",
    "SWEEP_APIS",
    "client_api_of",
    "count",
    "error_body",
    "fit",
    "format_of",
    "route_for",
]

#: every format module, in the order their routes are matched
MODULES: tuple[ModuleType, ...] = (
    openai_chat,
    responses,
    anthropic,
    gemini,
    azure,
    vertex_anthropic,
    bedrock,
)

#: every measured route
ROUTES: tuple[Route, ...] = tuple(r for m in MODULES for r in m.ROUTES)

#: every API a client may speak, by name: the modules that define one (``API``)
APIS: Mapping[Api, ApiInfo] = MappingProxyType(
    {m.API.name: m.API for m in MODULES if isinstance(getattr(m, "API", None), ApiInfo)}
)


def _own(group: Callable[[Format], str], other: Callable[[Format], str]) -> dict[str, Format]:
    """Each group's own format: the first of the group in registry order, unless a later one is
    named after the group on its other side too (Anthropic messages on Bedrock share Anthropic's
    shape; the format whose API is ``anthropic`` is the shape's own, and the Converse format,
    not the InvokeModel one, is Bedrock's own only by order)."""
    out: dict[str, Format] = {}
    for f in (r.format for r in ROUTES):
        key = group(f)
        if key not in out or (other(out[key]) != key and other(f) == key):
            out[key] = f
    return out


#: each body shape's own format (the public :func:`count` and :func:`fit` take a shape)
FORMATS: Mapping[Shape, Format] = MappingProxyType(_own(lambda f: f.shape, lambda f: f.api))

#: each API's own format (the one whose shape is named after the API, else its first): it
#: renders the API's errors and knows its clients
API_FORMATS: Mapping[Api, Format] = MappingProxyType(_own(lambda f: f.api, lambda f: f.shape))


#: the APIs the sweep can call: each API whose own format writes a question (:attr:`Format.ask`)
SWEEP_APIS: Mapping[Api, Format] = MappingProxyType(
    {api: f for api, f in API_FORMATS.items() if f.ask is not None}
)


#: the ``api`` label values of requests that generate (a model call, not a token count): the
#: denominator of every per-request share on the dashboard and in the rules
GENERATION_APIS: tuple[str, ...] = tuple(
    dict.fromkeys(r.metric_api for r in ROUTES if not r.count_only)
)

_EXACT: Mapping[str, Route] = MappingProxyType({p: r for r in ROUTES for p in r.paths})
_PATTERNS: tuple[Route, ...] = tuple(r for r in ROUTES if r.pattern is not None)


def route_for(path: str) -> Route | None:
    """The measured route a POST to ``path`` is (None: not a measured route)."""
    route = _EXACT.get(path)
    if route is not None:
        return route
    return next((r for r in _PATTERNS if r.answers(path)), None)


def client_api_of(headers: Mapping[str, str], path: str) -> Api:
    """The API a client speaks, from the headers only its SDKs send or the paths only its
    routes have (checked in registry order); the OpenAI-style API when nothing says."""
    for api, fmt in API_FORMATS.items():
        if any(h in headers for h in fmt.client_headers) or path.startswith(fmt.client_paths):
            return api
    return "openai"


def format_of(shape: Shape | Format) -> Format:
    """The format of a body shape (a :class:`Format` is its own: a route's format may be a
    shape's variant on another API, as Anthropic messages on Bedrock)."""
    return shape if isinstance(shape, Format) else FORMATS[shape]


def error_body(api: Api, status: int, message: str, code: str | None = None) -> bytes:
    """An error response body in the format ``api``'s clients parse."""
    return API_FORMATS[api].error_body(status, message, code)


def _pattern(chunk_pattern: str | re.Pattern[str] | None) -> re.Pattern[str] | None:
    return re.compile(chunk_pattern) if isinstance(chunk_pattern, str) else chunk_pattern


#: the count cache :func:`count` and :func:`fit` share unless told otherwise: an application
#: calls them every turn with its whole history, and with the messages it counted before
#: remembered a turn costs about what it added (bounded; in process memory only)
SHARED_CACHE = CountCache(64 * 2**20)


def _cached(
    counter: TextCounter | None, cache: CountCache | Literal[False] | None
) -> tuple[TextCounter, CountCache | None]:
    memo = SHARED_CACHE if cache is None else (cache or None)
    base = counter or TiktokenCounter("o200k_base")
    return (memo.wrap(base) if memo is not None else base), memo


def _format(shape: Shape | Format | None, api: Shape | Format | None, caller: str) -> Format:
    """The format ``shape`` names; ``api=`` is its former name, taken with a warning."""
    if api is not None:
        warnings.warn(
            f"{caller}(api=...) is deprecated and goes in the next minor release: "
            f"pass shape=... (the body's shape: {', '.join(FORMATS)})",
            DeprecationWarning,
            stacklevel=3,
        )
        shape = api if shape is None else shape
    if shape is None:
        raise TypeError(f"{caller}() needs shape= (one of {', '.join(FORMATS)})")
    return format_of(shape)


def count(
    body: Mapping[str, Any],
    *,
    shape: Shape | Format | None = None,
    counter: TextCounter | None = None,
    chat_format: ChatFormat | None = None,
    chunk_pattern: str | re.Pattern[str] | None = DEFAULT_CHUNK_PATTERN,
    cache: CountCache | Literal[False] | None = None,
    api: Shape | Format | None = None,
) -> RequestCount:
    """Count a request body the way the sidecar does: its input tokens (``.total``) and their
    breakdown by component, with ``counter`` (default: tiktoken's ``o200k_base``) and the
    model's ``chat_format`` framing. ``shape``: the body's shape (``openai``, ``responses``,
    ``anthropic``, ``gemini``, ``converse``; ``api=`` is its deprecated former name). Raises
    :class:`ValueError` for a body of the wrong shape.

    ``cache``: where the counts of long texts and whole messages are remembered (default: one
    cache shared by :func:`count` and :func:`fit`, 64 MiB; ``False``: none), so an agent that
    counts its growing history every turn pays for what the turn added."""
    fmt = _format(shape, api, "count")
    counter, memo = _cached(counter, cache)
    return fmt.count(body, counter, chat_format, _pattern(chunk_pattern), memo=memo)


def fit(
    body: Mapping[str, Any],
    *,
    shape: Shape | Format | None = None,
    budget: int,
    counter: TextCounter | None = None,
    count: RequestCount | None = None,
    policy: Policy | None = None,
    chat_format: ChatFormat | None = None,
    chunk_pattern: str | re.Pattern[str] | None = DEFAULT_CHUNK_PATTERN,
    cache: CountCache | Literal[False] | None = None,
    api: Shape | Format | None = None,
) -> tuple[dict[str, Any], FitReport]:
    """Fit an OpenAI chat, OpenAI Responses, Anthropic messages, Gemini or Bedrock Converse body
    (any registered format; ``shape``: its shape, ``api=`` its deprecated former name) into
    ``budget`` input tokens.

    Returns the fitted body (the input is never mutated; untouched messages are shared, not
    copied) and a report whose ``after`` is a recount of that body. ``report.fits`` is False
    when even the full policy cannot make it fit; the body returned then is the best effort. Pass
    ``count`` to reuse an existing count (of ``body``, with ``counter``); ``cache`` as for
    :func:`count`.
    """
    fmt = _format(shape, api, "fit")
    counter, memo = _cached(counter, cache)
    pattern = _pattern(chunk_pattern)
    if count is None:
        count = fmt.count(body, counter, chat_format, pattern, memo=memo)
    return fit_with(
        body,
        fmt.count,
        fmt.trim,
        budget=budget,
        counter=counter,
        count=count,
        policy=policy,
        chat_format=chat_format,
        pattern=pattern,
    )
