"""Bounds on a request's input tokens that need no tokenizer (``counting.strategy: bounded``).

Strict: byte-level BPE (tiktoken's encodings, and a calibrated multiple of one) never makes more
tokens than the text has bytes, and the JSON body has more bytes than its texts plus the chat
framing (every message's ``{"role":...,"content":...}`` outweighs its framing tokens), so the
body's size bounds the count; Anthropic's tool use adds a hidden system prompt, and images are
priced apart from their bytes, so requests with images are always counted.

Calibrated (observe mode only: nothing is cut on its word): per model, the smallest bytes per
reported input token over recent requests; the body's bytes over that ratio, plus a margin, is
what the request would cost if it were as dense as the densest one seen.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from context_ceiling.core.models import CalibratedSpec, ModelSpec, TiktokenSpec
from context_ceiling.core.vocabulary import Shape
from context_ceiling.formats.anthropic import TOOL_SYSTEM_TOKENS
from context_ceiling.sidecar.cpu_credit import CpuCredit
from context_ceiling.sidecar.enforce import Decision

#: what the strict bound adds for hidden prompt text a provider inserts
SLACK = 64
MARGIN = 1.1
#: content priced apart from its bytes (images; files and media named by id or URI), in one
#: pass over the body: a loop of eight substring searches costs several times this one pass
_PRICED_APART = re.compile(
    rb'"(?:image_url|input_image|input_file|file_id|inlineData|inline_data|fileData|file_data)"'
    rb'|"type":\s*"image"'
)


def strict(raw: bytes, shape: Shape, spec: ModelSpec | None) -> int | None:
    """An upper bound on the request's input tokens, or None when there is none without
    counting (images, files and media; a tokenizer that is not byte-level BPE)."""
    tok = spec.tokenizer if spec is not None else TiktokenSpec()
    if isinstance(tok, TiktokenSpec):
        factor = 1.0
    elif isinstance(tok, CalibratedSpec):
        factor = max(1.0, tok.factor)
    else:
        return None
    if _PRICED_APART.search(raw):
        return None
    extra = SLACK + (TOOL_SYSTEM_TOKENS if shape == "anthropic" and b'"tools"' in raw else 0)
    return math.ceil(len(raw) * factor) + extra


class Sampler:
    """Which of the requests a bound let through are counted anyway (``counting.sample_every``,
    ``counting.sample_cpu``), so the components, the staleness check and the estimate error
    still see exact counts.

    Every ``every``-th such request is due, as long as the sampled counts have used no more than
    ``share`` of one core on average: a sampled count's seconds are spent from a
    :class:`CpuCredit` (ten seconds' worth saved up while idle, of which at most
    ``busy_burst``, ``counting.sample_cpu_burst_seconds``, is spent at once while other
    requests are in flight: a quiet pod still samples a burst of long requests, and a pod whose
    traffic returns after a pause does not spend its saving beside it), and while it is spent
    no request is due. Why: a fixed 1-in-16
    costs in proportion to the bodies' length (long bodies at a high rate would take a large
    share of a core); the credit bounds the cost whatever the sizes.
    The sample is not biased by size: the first request due after the credit recovers is
    counted, whichever it is. Per process (each worker has its own).

    A sample's count runs beside its upstream call and is paid for when it lands, after the
    answer: nothing waits on it, so at most ``max_inflight`` samples are counting at once (a
    request due beyond that stays due), or under overload the counts would queue up, each
    holding its request's body, faster than the credit could notice (None: no samples go in
    flight, they are counted first)."""

    def __init__(
        self,
        every: int,
        share: float,
        clock: Callable[[], float] = time.monotonic,
        max_inflight: int | None = 4,
        busy_burst: float = 1.0,
    ) -> None:
        self.every = every
        self.max_inflight = max_inflight
        #: samples whose count has not landed yet
        self.inflight = 0
        self._seen = 0
        self.credit = CpuCredit(share, clock, busy_burst=busy_burst)

    def due(self, busy: bool = False) -> bool:
        """Whether this request (one a bound let through) is counted anyway; ``busy``: other
        requests are in flight (:meth:`CpuCredit.ok`)."""
        self._seen += 1
        if self._seen < self.every:
            return False
        if self.max_inflight is not None and self.inflight >= self.max_inflight:
            return False  # stays due
        if not self.credit.ok(busy):
            return False  # stays due: the next request after the credit recovers is counted
        self._seen = 0
        return True

    def counting(self, fut: asyncio.Future[Any]) -> None:
        """A sample's count is under way on ``fut`` (in flight until it is done or
        cancelled)."""
        self.inflight += 1
        fut.add_done_callback(self._landed)

    def _landed(self, _fut: asyncio.Future[Any]) -> None:
        self.inflight -= 1

    def spend(self, seconds: float) -> None:
        """A sampled count took ``seconds`` of CPU."""
        self.credit.spend(seconds)


class Calibration:
    """Per model label, the smallest body-bytes per reported input token of recent requests."""

    def __init__(self, needed: int, window: int = 256) -> None:
        self.needed = needed
        self._seen: dict[str, deque[float]] = {}

        self._window = window

    def observe(self, label: str, body_bytes: int, reported_tokens: int | None) -> None:
        if reported_tokens and body_bytes:
            self._seen.setdefault(label, deque(maxlen=self._window)).append(
                body_bytes / reported_tokens
            )

    def estimate(self, label: str, body_bytes: int) -> int | None:
        seen = self._seen.get(label)
        if seen is None or len(seen) < self.needed:
            return None
        return math.ceil(body_bytes / min(seen) * MARGIN)


def provably_within(
    raw: bytes,
    shape: Shape,
    spec: ModelSpec | None,
    d: Decision,
    calibration: Calibration | None,
    label: str,
) -> bool:
    """Whether a request needs no count before forwarding under decision ``d`` (its mode and
    budget): its mode decides nothing, or a bound on its tokens is within the budget (in
    ``enforce`` only the strict bound; in ``observe`` the calibrated one too, unless
    ``calibration`` is None: the strict bound only)."""
    if d.mode == "off" or d.budget is None:
        return True
    upper = strict(raw, shape, spec)
    if upper is not None and upper <= d.budget:
        return True
    if d.mode == "observe" and upper is not None and calibration is not None:
        # nothing is cut on the estimate's word
        est = calibration.estimate(label, len(raw))
        return est is not None and est <= d.budget
    return False
