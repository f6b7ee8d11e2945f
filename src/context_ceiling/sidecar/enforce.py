"""Decide, per request, what the ceiling means for it: forward, trim, or reject.

Input budget = min(ceiling tokens, window - reservation), where the reservation is the request's
own output limit (or the configured default) plus the model's reasoning reservation: the ceiling
caps the input, the reservation sits on top. Without a ceiling the window still applies.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

from context_ceiling.ceilings.document import CeilingEntry, CeilingsDocument
from context_ceiling.core.counting import RequestCount
from context_ceiling.core.models import ModelSpec
from context_ceiling.core.tokenizers import TextCounter
from context_ceiling.core.trim import FitReport, Policy, input_budget
from context_ceiling.core.vocabulary import Mode, Shape
from context_ceiling.formats import fit, format_of
from context_ceiling.formats.base import Format
from context_ceiling.sidecar.config import Enforcement


@dataclass
class Decision:
    mode: Mode
    entry: CeilingEntry | None = None
    reservation: int = 0
    budget: int | None = None
    report: FitReport | None = None
    #: the body to forward instead of the original (enforce mode, trimmed)
    body: dict[str, Any] | None = None
    reject: bool = False
    #: the trimming policy in force for the workload (set with the budget)
    policy: Policy | None = None
    #: the provider's own context management to add to the request (``strategy: native``),
    #: its threshold the ceiling; the budget is then the window's
    native: dict[str, Any] | list[Any] | None = None

    @property
    def over(self) -> bool:
        return self.report is not None and self.report.before > (self.budget or 0)


def planned_decision(
    obj: dict[str, Any],
    api: Shape | Format,
    spec: ModelSpec | None,
    label: str,
    workload: str,
    doc: CeilingsDocument,
    cfg: Enforcement,
    bypass: bool = False,
    native_ok: bool = False,
) -> Decision:
    """The mode in force and the input budget (the ceiling, within the window less the output
    reservation), before anything is counted. ``native_ok``: the upstream is the provider's own
    API (``strategy: auto`` uses its context management there)."""
    mode, policy = cfg.for_workload(workload)
    entry = doc.lookup(label, workload)
    if entry is not None and entry.mode is not None:
        mode = entry.mode
    if bypass:
        mode = "off"
    d = Decision(mode=mode, entry=entry, policy=policy)
    if mode == "off" or spec is None:
        return d
    fmt = format_of(api)
    d.reservation = reservation_of(obj, fmt, spec, cfg)
    strategy = spec.strategy or cfg.strategy_for(workload)
    if (
        mode == "enforce"
        and entry is not None
        and fmt.native is not None
        and (strategy == "native" or (strategy == "auto" and native_ok))
        # the client's own is never overridden, nor added where the request cannot carry it
        and not any(key in obj for key in fmt.native.excludes)
    ):
        d.native = fmt.native.build(entry.ceiling_tokens, policy)
        d.budget = input_budget(spec.window, d.reservation)  # the provider keeps the ceiling
        return d
    d.budget = input_budget(spec.window, d.reservation, entry.ceiling_tokens if entry else None)
    return d


def reservation_of(obj: dict[str, Any], fmt: Format, spec: ModelSpec, cfg: Enforcement) -> int:
    """The output tokens reserved on top of a request's input: its own output limit (or the
    configured default) plus the model's reasoning reservation, below the window."""
    asked = fmt.requested_output(obj)
    reserve = asked if asked is not None else cfg.default_output_reservation
    return min(reserve + spec.reasoning_reservation, spec.window - 1)


def trim_to(
    base: Decision,
    obj: dict[str, Any],
    api: Shape | Format,
    count: RequestCount,
    spec: ModelSpec | None,
    counter: TextCounter,
    chunk_pattern: re.Pattern[str] | None,
) -> Decision:
    """The verdict on a counted request under ``base`` (its mode and budget, from
    :func:`planned_decision`): forward, trim or reject. A new decision; ``base`` is not changed."""
    d = dataclasses.replace(base)
    if d.mode == "off" or spec is None or d.budget is None:
        return d
    if count.total <= d.budget:
        return d
    # The trimmer works in the units of the per-part counts. When the engine counted the total
    # exactly, the parts are the fallback encoding's: scale the budget into their units.
    parts_total = sum(p.tokens for p in count.parts) if count.exact else count.total
    scale = parts_total / count.total if count.exact and count.total and parts_total else 1.0
    local = (
        count
        if scale == 1.0
        else RequestCount(parts_total, count.components, count.parts, count.counter)
    )
    fitted, report = fit(
        obj,
        shape=api,
        budget=math.floor(d.budget * scale),
        counter=counter,
        count=local,
        policy=d.policy,
        chat_format=spec.chat_format,
        chunk_pattern=chunk_pattern,
    )
    if scale != 1.0:
        report.budget = d.budget
        report.before = count.total
        report.after = math.ceil(report.after / scale)
        report.removed = {k: round(v / scale) for k, v in report.removed.items()}
    d.report = report
    if d.mode == "enforce":
        if report.fits:
            d.body = fitted
        else:
            d.reject = True
    return d


def context_error(
    fmt: Format,
    label: str,
    workload: str,
    d: Decision,
    window: int,
) -> str:
    """The message of a rejection, in the words each provider uses, naming the counts."""
    assert d.report is not None and d.budget is not None
    r = d.report
    ceiling = (
        f"the context ceiling for {label}/{workload} is {d.entry.ceiling_tokens} tokens; "
        if d.entry
        else ""
    )
    detail = (
        f"{ceiling}window {window}, output reservation {d.reservation}, so the input budget is "
        f"{d.budget} tokens; trimming (tool results, retrieved chunks, older turns) reached only {r.after} tokens"
    )
    return fmt.too_long(r.before, d.budget, detail)
