"""The public Python API: the names an application uses to count, budget and trim its own
requests where it builds them, and to read ceilings documents. Import them from
``context_ceiling`` (``from context_ceiling import fit, input_budget``); everything else in the
package may change between minor versions.

The sidecar applies exactly these functions, so an application that trims with them before
sending and the sidecar that enforces after agree on every count.
"""

from __future__ import annotations

from context_ceiling.budget import Budget, BudgetAnswer, BudgetError
from context_ceiling.ceilings.document import (
    CeilingEntry,
    CeilingsDocument,
    CeilingsError,
    load_document,
    parse_document,
)
from context_ceiling.core.counting import RequestCount
from context_ceiling.core.errors import CeilingError, UserError
from context_ceiling.core.models import ChatFormat
from context_ceiling.core.tokenizers import TextCounter, TiktokenCounter
from context_ceiling.core.trim import FitReport, Policy, input_budget
from context_ceiling.core.utilization import Component, utilization
from context_ceiling.formats import count, fit

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
    "count",
    "fit",
    "input_budget",
    "load_document",
    "parse_document",
    "utilization",
]
