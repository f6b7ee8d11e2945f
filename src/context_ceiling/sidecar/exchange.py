"""One exchange (a proxied request) and how it is recorded: response headers, the JSON log
line, the Prometheus metrics, the staleness tracker and the OpenTelemetry span all come from the
same :class:`Exchange`, in one place, once per request."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Span

from context_ceiling.core.ceilings import EMPTY, CeilingsDocument
from context_ceiling.core.counting import (
    RequestCount,
    count_anthropic,
    count_gemini,
    count_openai,
    count_responses,
)
from context_ceiling.core.models import OTHER, ModelSpec
from context_ceiling.core.utilization import Component
from context_ceiling.core.wire import STAGE_COMPONENT, Api, Shape
from context_ceiling.sidecar.enforce import Decision
from context_ceiling.sidecar.logs import bounded, log_request
from context_ceiling.sidecar.relay import Tap
from context_ceiling.sidecar.state import State
from context_ceiling.sidecar.usage import (
    AnthropicStreamTap,
    GeminiStreamTap,
    OpenAIStreamTap,
    ResponsesStreamTap,
    Usage,
    anthropic_body_usage,
    gemini_body_usage,
    openai_body_usage,
    responses_body_usage,
    responses_count_usage,
)


@dataclass(frozen=True, slots=True)
class Route:
    """What differs between the two wire formats."""

    api: Api  # whose client and error shape
    metric_api: str
    path: str
    count: Callable[..., RequestCount]
    body_usage: Callable[[bytes], Usage]
    tap: Callable[[bool], Tap]
    shape: Shape  # the request body's shape, for the trimmer
    #: a token-counting endpoint: measured and compared with the provider's count, never
    #: trimmed, traced or streamed
    count_only: bool = False


OPENAI_CHAT = Route(
    "openai",
    "openai_chat",
    "/chat/completions",
    count_openai,
    openai_body_usage,
    OpenAIStreamTap,
    "openai",
)
GEMINI_GENERATE = Route(
    "gemini",
    "gemini_generate",
    "/{version}/models/{model}:generateContent",
    count_gemini,
    gemini_body_usage,
    lambda _injected: GeminiStreamTap(),
    "gemini",
)
GEMINI_COUNT = Route(
    "gemini",
    "gemini_count_tokens",
    "/{version}/models/{model}:countTokens",
    count_gemini,
    gemini_body_usage,
    lambda _injected: GeminiStreamTap(),
    "gemini",
    count_only=True,
)
AZURE_CHAT = Route(
    "openai",
    "azure_chat",
    "/openai/deployments/{deployment}/chat/completions",
    count_openai,
    openai_body_usage,
    OpenAIStreamTap,
    "openai",
)
OPENAI_RESPONSES = Route(
    "openai",
    "openai_responses",
    "/responses",
    count_responses,
    responses_body_usage,
    lambda _injected: ResponsesStreamTap(),
    "responses",
)
ANTHROPIC_MESSAGES = Route(
    "anthropic",
    "anthropic_messages",
    "/v1/messages",
    count_anthropic,
    anthropic_body_usage,
    lambda _injected: AnthropicStreamTap(),
    "anthropic",
)
ANTHROPIC_COUNT = Route(
    "anthropic",
    "anthropic_count_tokens",
    "/v1/messages/count_tokens",
    count_anthropic,
    anthropic_body_usage,
    lambda _injected: AnthropicStreamTap(),
    "anthropic",
    count_only=True,
)
RESPONSES_COUNT = Route(
    "openai",
    "openai_responses_input_tokens",
    "/responses/input_tokens",
    count_responses,
    responses_count_usage,
    lambda _injected: ResponsesStreamTap(),
    "responses",
    count_only=True,
)


@dataclass(slots=True)
class Exchange:
    """Everything known about one request; becomes the log line and the metrics."""

    route: Route
    request_id: str
    workload: str
    started: float
    model: str = ""
    label: str = OTHER
    spec: ModelSpec | None = None
    count: RequestCount | None = None
    util: float | None = None
    stream: bool = False
    status: int = 0
    outcome: str = "ok"
    usage: Usage = field(default_factory=Usage)
    upstream_started: float | None = None
    extra_headers: dict[str, str] = field(default_factory=dict)
    #: the ceilings this request started with; a reload mid-flight does not change them
    ceilings: CeilingsDocument = EMPTY
    decision: Decision | None = None
    bypass: bool = False
    max_tokens: int | None = None
    span: Span | None = None
    upstream: str = ""  # the upstream's name (the API's default: its API's name)

    @property
    def forwarded_tokens(self) -> int:
        """Input tokens sent upstream: after trimming when the sidecar trimmed."""
        d = self.decision
        if d is not None and d.body is not None and d.report is not None:
            return d.report.after
        return self.count.total if self.count else 0


class Recorder:
    """Turns a finished exchange into headers, a log line, metrics, staleness and a span."""

    def __init__(self, state: State) -> None:
        self.state = state

    def headers(self, ex: Exchange) -> dict[str, str]:
        h = {"x-ceiling-request-id": ex.request_id}
        if ex.count is not None:
            h["x-ceiling-input-tokens"] = str(ex.forwarded_tokens)
        if ex.util is not None:
            h["x-ceiling-utilization"] = f"{ex.util:.4f}"
        d = ex.decision
        entry = ex.ceilings.lookup(ex.label, ex.workload) if ex.count is not None else None
        h["x-ceiling-ceiling-tokens"] = str(entry.ceiling_tokens) if entry else "none"
        h["x-ceiling-trimmed-tokens"] = str(d.report.trimmed if d and d.report else 0)
        h["x-ceiling-mode"] = (
            d.mode if d else self.state.settings.enforcement.for_workload(ex.workload)[0]
        )
        h.update(ex.extra_headers)
        return h

    def finish(self, ex: Exchange) -> None:
        now = time.perf_counter()
        m = self.state.metrics
        m.requests.labels(
            model=ex.label, workload=ex.workload, api=ex.route.metric_api, outcome=ex.outcome
        ).inc()
        u = ex.usage
        est_error: float | None = None
        if ex.count is not None and u.input_tokens and not ex.count.partial:
            est_error = (ex.forwarded_tokens - u.input_tokens) / u.input_tokens
            m.estimate_error.labels(model=ex.label).observe(est_error)
        elif ex.count is not None and ex.count.partial and u.input_tokens and ex.spec:
            # the provider holds earlier turns: its reported input is the utilization
            m.utilization.labels(model=ex.label, workload=ex.workload).observe(
                u.input_tokens / ex.spec.window
            )
        if ex.upstream_started is not None:
            m.upstream_duration.labels(model=ex.label, api=ex.route.metric_api).observe(
                now - ex.upstream_started
            )
        if u.output_tokens is not None and not ex.route.count_only:
            m.output_tokens.labels(model=ex.label, workload=ex.workload).observe(u.output_tokens)
        c = ex.count
        d = ex.decision
        r = d.report if d else None
        stale: frozenset[str] = frozenset()
        if c is not None and ex.outcome == "ok" and not ex.route.count_only:
            stale = self.state.staleness.observe(
                ex.label, ex.workload, c, u.response_model, ex.ceilings
            )
        self._genai(ex, now, stale)
        log_request(
            {
                "request_id": ex.request_id,
                "api": ex.route.metric_api,
                "upstream": ex.upstream or None,
                "model": bounded(ex.model),
                "model_label": ex.label,
                "workload": ex.workload,
                "stream": ex.stream,
                "input_tokens_estimated": ex.forwarded_tokens if c else None,
                "input_tokens_before_trim": c.total if c else None,
                "input_tokens_exact": c.exact if c else None,
                "input_tokens_partial": c.partial if c else None,
                "tokenizer": c.counter if c else None,
                "input_tokens_reported": u.input_tokens,
                "cached_tokens": u.cached_tokens,
                "estimate_error": round(est_error, 5) if est_error is not None else None,
                "window": ex.spec.window if ex.spec else None,
                "utilization": round(ex.util, 5) if ex.util is not None else None,
                "components": {k.value: v for k, v in c.components.items()} if c else None,
                "output_tokens": u.output_tokens,
                "finish_reason": u.finish_reason,
                "response_model": bounded(u.response_model),
                "mode": d.mode if d else None,
                "bypass": ex.bypass,
                "ceiling_tokens": d.entry.ceiling_tokens if d and d.entry else None,
                "budget": d.budget if d else None,
                "trimmed_tokens": r.trimmed if r else 0,
                "trimmed": {k: v for k, v in r.removed.items() if v} if r else None,
                "trim_actions": r.actions if r else None,
                "cache_loss_tokens": r.cache_loss_tokens if r else None,
                "status": ex.status,
                "outcome": ex.outcome,
                "latency_ms": round((now - ex.started) * 1000, 2),
            }
        )

    def _genai(self, ex: Exchange, now: float, stale: frozenset[str]) -> None:
        """GenAI semantic conventions: the client metrics, and the span's closing attributes."""
        if ex.route.count_only:
            return
        m, u, provider = self.state.metrics, ex.usage, ex.route.api
        base = {
            "gen_ai_operation_name": "chat",
            "gen_ai_provider_name": provider,
            "gen_ai_request_model": ex.label,
        }
        if ex.upstream_started is not None:
            m.genai_duration.labels(**base).observe(now - ex.upstream_started)
        if u.input_tokens is not None:
            m.genai_tokens.labels(**base, gen_ai_token_type="input").observe(u.input_tokens)
        if u.output_tokens is not None:
            m.genai_tokens.labels(**base, gen_ai_token_type="output").observe(u.output_tokens)
        if ex.span is None:
            return
        d = ex.decision
        attrs: dict[str, Any] = {
            "gen_ai.request.max_tokens": ex.max_tokens,
            "gen_ai.response.model": u.response_model,
            "gen_ai.response.finish_reasons": [u.finish_reason] if u.finish_reason else None,
            "gen_ai.usage.input_tokens": u.input_tokens,
            "gen_ai.usage.output_tokens": u.output_tokens,
            "gen_ai.usage.cache_read.input_tokens": u.cached_tokens,
            "http.response.status_code": ex.status or None,
            "ceiling.workload": ex.workload,
            "ceiling.window": ex.spec.window if ex.spec else None,
            "ceiling.ceiling_tokens": d.entry.ceiling_tokens if d and d.entry else None,
            "ceiling.input_tokens": ex.forwarded_tokens if ex.count else None,
            "ceiling.utilization": ex.util,
            "ceiling.trimmed_tokens": d.report.trimmed if d and d.report else 0,
            "ceiling.mode": d.mode if d else None,
            "ceiling.stale": sorted(stale),
        }
        if ex.count is not None:
            for comp, tokens in ex.count.components.items():
                attrs[f"ceiling.input_tokens.{comp.value}"] = tokens
        self.state.tracing.finish(ex.span, attrs, None if ex.outcome == "ok" else ex.outcome)

    def record_decision(self, ex: Exchange, d: Decision) -> None:
        m, model, wl = self.state.metrics, ex.label, ex.workload
        if d.entry is not None and ex.count is not None:
            m.ceiling_utilization.labels(model=model, workload=wl).observe(
                ex.count.total / d.entry.ceiling_tokens
            )
        r = d.report
        if r is None:
            return
        action = "rejected" if d.reject else ("trimmed" if d.body is not None else "observed")
        m.over_ceiling.labels(model=model, workload=wl, action=action).inc()
        if action == "rejected":
            return
        family = m.trimmed_tokens if action == "trimmed" else m.would_trim_tokens
        for kind, tokens in r.removed.items():
            if tokens:
                family.labels(model=model, workload=wl, kind=kind).inc(tokens)
        if action == "trimmed" and r.cache_loss_tokens:
            m.cache_loss_tokens.labels(model=model, workload=wl).inc(r.cache_loss_tokens)

    @staticmethod
    def forwarded_components(ex: Exchange) -> dict[Component, int]:
        assert ex.count is not None
        comps = dict(ex.count.components)
        d = ex.decision
        if d is not None and d.body is not None and d.report is not None:
            for kind, comp in STAGE_COMPONENT.items():
                comps[comp] = max(0, comps[comp] - d.report.removed.get(kind, 0))
        return comps
