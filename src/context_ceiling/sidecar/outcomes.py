"""How a request ended: one vocabulary for the log line, the metrics and the traces.

Every path that finishes a request (measured routes, streams, the pass-through, the sidecar's own
refusals) names its end with an :data:`Outcome`, and an upstream's answer is named by its status
through :func:`outcome_of` alone, so a status means the same outcome on every route.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import httpx

__all__ = ["OUTCOMES", "TRANSPORT_ERRORS", "Failure", "Outcome", "failure_of", "outcome_of"]

#: ok: the upstream answered 2xx; upstream_3xx / upstream_4xx / upstream_5xx: its other answers,
#: relayed as they came; invalid: rejected by the sidecar (400/413/431); rejected: over the
#: ceiling and could not be trimmed to fit (enforce mode); timeout: 504; unreachable: 502;
#: cancelled: the client went away mid-request; upstream_truncated: a stream that ended without
#: its last event, or mid-event (the client got an error event and an aborted body); shutdown: a
#: stream still running when the shutdown grace ran out (ended with the provider-shaped error
#: event); internal_error: a bug in the sidecar (500, logged with its traceback).
Outcome = Literal[
    "ok",
    "upstream_3xx",
    "upstream_4xx",
    "upstream_5xx",
    "invalid",
    "rejected",
    "timeout",
    "unreachable",
    "cancelled",
    "upstream_truncated",
    "shutdown",
    "internal_error",
]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


def outcome_of(status: int) -> Outcome:
    """The outcome of an upstream answer with this status. A redirect is not an answer to a
    model call, nor an error of the upstream's: it has its own name, on every route."""
    if status < 300:
        return "ok"
    if status < 400:
        return "upstream_3xx"
    return "upstream_4xx" if status < 500 else "upstream_5xx"


@dataclass(frozen=True, slots=True)
class Failure:
    """What the client gets when the upstream call itself failed: a status, an outcome, words."""

    status: int
    outcome: Outcome
    message: str


#: the one table from an upstream call's exception to the client's answer, most specific first
#: (a timeout is a transport error too; asyncio's own deadline counts as a timeout); any other
#: failure of the call is the last row's
TRANSPORT_ERRORS: tuple[tuple[tuple[type[BaseException], ...], int, Outcome, str], ...] = (
    ((httpx.TimeoutException, TimeoutError), 504, "timeout", "upstream timed out"),
    ((BaseException,), 502, "unreachable", "upstream unreachable"),
)


def failure_of(exc: BaseException) -> Failure:
    """The answer for an exception raised by an upstream call, by :data:`TRANSPORT_ERRORS` (a
    502 names the exception's class, never its message: it may hold a URL with credentials)."""
    _, status, outcome, words = next(row for row in TRANSPORT_ERRORS if isinstance(exc, row[0]))
    detail = "" if status == 504 else f": {type(exc).__name__}"
    return Failure(status, outcome, words + detail)
