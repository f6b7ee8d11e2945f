"""Stale-ceiling detection: does live traffic still look like what the ceiling was measured on?

A ceiling holds for the model version, prompt skeleton and retrieval settings it was swept with.
Per (model, workload) the tracker keeps an exponentially weighted mean of the live traffic's
shape (system prompt tokens, tool definition tokens, retrieved chunk count and size) and the
model version the upstream last reported, and compares them with the entry's fingerprint and
provenance. Each reason is a bounded label; a change of state is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from context_ceiling.ceilings.document import CeilingEntry, CeilingsDocument, traffic_shape
from context_ceiling.core.counting import RequestCount

log = logging.getLogger(__name__)

REASONS = (
    "model_version",
    "system_prompt",
    "tool_definitions",
    "retrieved_chunks",
    "retrieved_chunk_size",
    "no_ceiling",
)
#: Below these absolute differences a relative change is noise (an empty fingerprint field vs
#: a handful of tokens is not drift).
_FLOOR = {
    "system_tokens": 32.0,
    "tool_definition_tokens": 32.0,
    "retrieved_chunks": 1.0,
    "retrieved_chunk_tokens": 32.0,
}
_REASON_OF = {
    "system_tokens": "system_prompt",
    "tool_definition_tokens": "tool_definitions",
    "retrieved_chunks": "retrieved_chunks",
    "retrieved_chunk_tokens": "retrieved_chunk_size",
}


@dataclass
class _Live:
    n: int = 0
    mean: dict[str, float] = field(default_factory=dict)
    model_version: str | None = None
    active: frozenset[str] = frozenset()


class StalenessTracker:
    def __init__(self, tolerance: float = 0.25, window: int = 50, min_requests: int = 20) -> None:
        self.tolerance = tolerance
        self.alpha = 2.0 / (window + 1)
        self.min_requests = min_requests
        self._live: dict[tuple[str, str], _Live] = {}

    def observe(
        self,
        model: str,
        workload: str,
        count: RequestCount,
        response_model: str | None,
        doc: CeilingsDocument,
    ) -> frozenset[str]:
        live = self._live.setdefault((model, workload), _Live())
        features = traffic_shape(count)
        if live.n == 0:
            live.mean = features
        else:
            a = self.alpha
            for k, v in features.items():
                live.mean[k] += a * (v - live.mean[k])
        live.n += 1
        if response_model:
            live.model_version = response_model
        active = self._reasons(live, doc.lookup(model, workload))
        if active != live.active:
            log.warning(
                "ceiling staleness changed",
                extra={
                    "fields": {
                        "model": model,
                        "workload": workload,
                        "stale_reasons": sorted(active),
                        "cleared": sorted(live.active - active),
                    }
                },
            )
            live.active = active
        return active

    def _reasons(self, live: _Live, entry: CeilingEntry | None) -> frozenset[str]:
        if entry is None:
            return frozenset({"no_ceiling"})
        out: set[str] = set()
        want = entry.provenance.model_version
        if want and live.model_version and live.model_version != want:
            out.add("model_version")
        if entry.fingerprint is not None and live.n >= self.min_requests:
            ref = entry.fingerprint.model_dump()
            for k, v in live.mean.items():
                base = float(ref[k])
                delta = abs(v - base)
                if delta > _FLOOR[k] and delta > self.tolerance * base:
                    out.add(_REASON_OF[k])
        return frozenset(out)

    def states(self, doc: CeilingsDocument) -> Iterator[tuple[tuple[str, str], dict[str, bool]]]:
        """Every tracked (model, workload) with each reason's state against ``doc``."""
        for key, live in list(self._live.items()):
            active = self._reasons(live, doc.lookup(*key))
            yield key, {r: r in active for r in REASONS}
