"""Utilization: the one definition of how full a context window is.

utilization = input tokens / context window. The output (and reasoning) reservation is not part
of the input; the practical limit of a window is therefore (window - reservation) / window.
"""

from __future__ import annotations

from enum import StrEnum


class Component(StrEnum):
    """Where the input tokens of a request came from."""

    SYSTEM = "system"
    HISTORY = "history"
    RETRIEVED = "retrieved"
    TOOL_RESULTS = "tool_results"
    TOOL_DEFINITIONS = "tool_definitions"
    LATEST_USER = "latest_user"


COMPONENTS: tuple[Component, ...] = tuple(Component)


def utilization(input_tokens: int, window: int) -> float:
    """Fraction of the context window the input occupies (may exceed 1.0 for oversize input)."""
    if window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    return input_tokens / window


def practical_limit(window: int, reservation: int) -> float:
    """The highest utilization an input can have and still leave ``reservation`` for output."""
    if not 0 <= reservation < window:
        raise ValueError(f"reservation {reservation} must be in [0, window={window})")
    return (window - reservation) / window


#: the upper edges of the fill buckets live answers are grouped in (the sidecar's answer
#: signals, the dashboard) and a sweep's levels are named by, so the two can be put side by side
FILL_EDGES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
#: the bucket of a request whose fill is not known (no window, nothing counted or reported)
UNKNOWN_FILL = "unknown"
#: every fill bucket's name, lowest first: ``0.0-0.1`` ... ``0.9-1.0`` (past the window: the last)
FILL_BUCKETS: tuple[str, ...] = tuple(
    f"{lo:.1f}-{hi:.1f}" for lo, hi in zip((0.0, *FILL_EDGES), FILL_EDGES, strict=False)
)


def fill_bucket(ratio: float | None) -> str:
    """The name of the fill bucket ``ratio`` (input tokens / window) falls in: half-open
    intervals ``[lo, hi)``, the last one closed and holding anything past the window."""
    if ratio is None or ratio != ratio or ratio < 0:  # NaN, or nothing measured
        return UNKNOWN_FILL
    for name, hi in zip(FILL_BUCKETS, FILL_EDGES, strict=True):
        if ratio < hi:
            return name
    return FILL_BUCKETS[-1]
