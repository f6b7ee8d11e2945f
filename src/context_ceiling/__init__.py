"""context-ceiling: keep LLM requests inside the part of the context window where the model still
works. Measure it (``context_ceiling.sweep``), enforce and observe it (``context_ceiling.sidecar``),
with the definitions both share in ``context_ceiling.core``; ``context_ceiling.cli`` assembles them
into the ``ceiling`` command.

The public Python API (:mod:`context_ceiling.api`) is re-exported here and loaded on first use, so
``import context_ceiling`` stays cheap for the command line::

    from context_ceiling import Policy, fit, input_budget
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("context-ceiling")
except PackageNotFoundError:  # pragma: no cover - a source tree that was never installed
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from context_ceiling.api import (
        Budget,
        BudgetAnswer,
        BudgetError,
        CeilingEntry,
        CeilingError,
        CeilingsDocument,
        CeilingsError,
        ChatFormat,
        Component,
        FitReport,
        Policy,
        RequestCount,
        TextCounter,
        TiktokenCounter,
        UserError,
        count,
        fit,
        input_budget,
        load_document,
        parse_document,
        utilization,
    )

__all__ = [
    "Budget",
    "BudgetAnswer",
    "BudgetError",
    "CeilingEntry",
    "CeilingError",
    "CeilingsDocument",
    "CeilingsError",
    "ChatFormat",
    "Component",
    "FitReport",
    "Policy",
    "RequestCount",
    "TextCounter",
    "TiktokenCounter",
    "UserError",
    "__version__",
    "count",
    "fit",
    "input_budget",
    "load_document",
    "parse_document",
    "utilization",
]


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        from context_ceiling import api

        return getattr(api, name)
    raise AttributeError(f"module 'context_ceiling' has no attribute {name!r}")
