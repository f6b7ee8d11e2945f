"""What a request over its ceiling gets in enforce mode: trimmed, rejected, or sent to a model
whose own measured ceiling it fits.

Gateways fall back by the *advertised* window; here a fallback is chosen by the ceilings
document: a candidate is taken when the request, counted with the candidate's own tokenizer,
fits the candidate's measured ceiling (its window less the output reservation where no ceiling
is measured, and the log says so) as it is, so a rerouted request is never above its new
model's ceiling. Candidates are tried in the order listed, on the same wire format only (a
request the provider layer would have to translate is not offered), each once: the original
model and a model already tried are skipped, and a fallback's own fallbacks are never followed,
so routing cannot loop. The action and the list come from the model entry, else the workload,
else the enforcement defaults (:meth:`Enforcement.over_ceiling_for`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from context_ceiling.ceilings.document import CeilingsDocument
from context_ceiling.core.counting import RequestCount
from context_ceiling.core.models import ModelSpec, Registry
from context_ceiling.core.shape_checks import RequestShapeError
from context_ceiling.core.trim import input_budget
from context_ceiling.core.vocabulary import OverCeiling
from context_ceiling.formats.base import Route
from context_ceiling.sidecar.config import Enforcement
from context_ceiling.sidecar.enforce import Decision, reservation_of

__all__ = [
    "Action",
    "Candidate",
    "Routed",
    "action_for",
    "candidates",
    "needs_fallback",
    "rejected",
    "rejects",
    "tried",
]


@dataclass(frozen=True)
class Action:
    """The over-ceiling action in force for one request."""

    kind: OverCeiling
    fallback: tuple[str, ...] = ()
    #: trim_then_fallback: the largest share of the input trimming may remove
    max_trimmed_share: float | None = None


def action_for(cfg: Enforcement, workload: str, spec: ModelSpec | None) -> Action:
    """The model entry's action and list, else the workload's, else the defaults."""
    kind, fallback, share = cfg.over_ceiling_for(workload)
    if spec is not None:
        kind = spec.over_ceiling or kind
        fallback = list(spec.fallback) or fallback
    return Action(kind, tuple(fallback), share)


def rejects(action: Action, d: Decision) -> bool:
    """``reject``: a request over its ceiling in enforce mode is refused, never trimmed."""
    return action.kind == "reject" and d.mode == "enforce" and d.over


def needs_fallback(action: Action, d: Decision) -> bool:
    """Whether a counted request in enforce mode goes to a fallback model: over its ceiling
    under ``fallback``; under ``trim_then_fallback`` when trimming cannot make it fit or would
    remove more than the stated share of its input."""
    if d.mode != "enforce" or not d.over or d.report is None:
        return False
    if action.kind == "fallback":
        return True
    if action.kind != "trim_then_fallback":
        return False
    r = d.report
    if d.reject or not r.fits:
        return True
    limit = action.max_trimmed_share
    return limit is not None and r.before > 0 and r.trimmed / r.before > limit


@dataclass(frozen=True)
class Candidate:
    """One fallback model as it was tried."""

    model: str
    #: why it was not taken (None: taken)
    refused: str | None = None


@dataclass(frozen=True)
class Routed:
    """The fallback that fits: its name, entry, count (its own tokenizer), the decision it is
    forwarded under (its ceiling, the body with the model rewritten) and where the model sits in
    the path (``path_model``: the old and new path segment), if it sits there."""

    model: str
    spec: ModelSpec
    count: RequestCount
    decision: Decision
    #: the ceiling came from the ceilings document (False: the window less the reservation)
    measured: bool
    path_model: tuple[str, str] | None = None


def candidates(
    route: Route,
    path: str,
    sent_path: str,
    obj: dict[str, Any],
    model: str,
    workload: str,
    action: Action,
    registry: Registry,
    doc: CeilingsDocument,
    cfg: Enforcement,
    served: Callable[[ModelSpec], bool],
    chunk_pattern: re.Pattern[str] | None = None,
) -> tuple[Routed | None, list[Candidate]]:
    """The first fallback whose own budget the request fits unchanged, and every model tried.

    ``path``: the request's path (decoded), ``sent_path``: the path as it goes upstream;
    ``served(spec)``: whether the model's upstream takes this route's API on this sidecar.
    """
    tried: list[Candidate] = []
    seen = {model}
    in_path = route.path_model is not None and route.path_model(path) == model
    in_body = isinstance(obj.get("model"), str)
    for name in action.fallback:
        if name in seen:
            continue
        seen.add(name)
        spec = registry.resolve(name)
        if spec is None:
            tried.append(Candidate(name, "no model entry"))
            continue
        if not served(spec):
            tried.append(Candidate(name, f"not served for {route.api} requests here"))
            continue
        swap = None
        if in_path:  # as it is written in the path sent upstream: plain or percent-escaped
            form = next((f for f in (model, quote(model, safe="")) if f in sent_path), None)
            if form is None:
                tried.append(Candidate(name, "the model cannot be rewritten on this route"))
                continue
            swap = (form, name if form == model else quote(name, safe=""))
        body = {**obj, "model": name} if in_body else obj
        reservation = reservation_of(body, route.format, spec, cfg)
        entry = doc.lookup(spec.metric_label, workload)
        budget = input_budget(spec.window, reservation, entry.ceiling_tokens if entry else None)
        counter = registry.counter(spec)
        try:
            count = route.count(body, counter, spec.chat_format, chunk_pattern)
        except RequestShapeError as exc:
            tried.append(Candidate(name, f"not countable: {exc}"))
            continue
        what = f"ceiling {entry.ceiling_tokens}" if entry else f"window {spec.window}"
        if count.total > budget:
            tried.append(Candidate(name, f"{count.total} tokens over its budget {budget} ({what})"))
            continue
        tried.append(Candidate(name))
        decision = Decision(
            mode="enforce",
            entry=entry,
            reservation=reservation,
            budget=budget,
            body=body if in_body else None,
        )
        return Routed(name, spec, count, decision, entry is not None, swap), tried
    return None, tried


def tried(models: list[Candidate]) -> str:
    """The models tried, in words, for a rejection's message."""
    if not models:
        return "no fallback model is configured"
    return "fallback models tried: " + "; ".join(f"{c.model} ({c.refused})" for c in models)


def rejected(d: Decision) -> Decision:
    """``d`` turned into a rejection (nothing is forwarded)."""
    return dataclasses.replace(d, body=None, reject=True)
