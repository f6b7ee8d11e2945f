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
