"""The proxy path: measure a chat request, forward it, pass the answer back, record the result.

Every request is parsed and counted once before forwarding; its body goes upstream byte for byte
unless the sidecar must change it (OpenAI streams get ``stream_options.include_usage`` so usage
can be recorded). Responses come back unchanged: bodies as the upstream sent them, streams event
by event as they arrive, errors with the upstream's own status and body.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import orjson
from opentelemetry.trace import Span
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ceiling.ceilings import EMPTY, CeilingsDocument
from ceiling.counting import RequestCount, RequestShapeError, count_anthropic, count_openai
from ceiling.engine import EngineCountError, count_chat
from ceiling.models import OTHER, ModelSpec, UpstreamSpec
from ceiling.utilization import Component, utilization
from sidecar.budget import requested_output
from sidecar.enforce import Decision, context_error, decide
from sidecar.errors import Api, error_response
from sidecar.logs import log_request
from sidecar.relay import SSERelay, Tap
from sidecar.state import State
from sidecar.upstream import request_headers, response_headers
from sidecar.usage import (
    AnthropicStreamTap,
    OpenAIStreamTap,
    Usage,
    anthropic_body_usage,
    openai_body_usage,
)

log = logging.getLogger("sidecar.proxy")

WORKLOAD_HEADER = "x-ceiling-workload"
#: With the admin token as its value, the request is never trimmed (the sweep measures with it).
BYPASS_HEADER = "x-ceiling-bypass"
_KIND_COMPONENT = {
    "tool_results": Component.TOOL_RESULTS,
    "retrieved": Component.RETRIEVED,
    "history": Component.HISTORY,
}


@dataclass(frozen=True, slots=True)
class Route:
    """What differs between the two wire formats."""

    api: Api
    metric_api: str
    path: str
    count: Callable[..., RequestCount]
    body_usage: Callable[[bytes], Usage]
    tap: Callable[[bool], Tap]


OPENAI_CHAT = Route(
    "openai", "openai_chat", "/chat/completions", count_openai, openai_body_usage, OpenAIStreamTap
)
ANTHROPIC_MESSAGES = Route(
    "anthropic",
    "anthropic_messages",
    "/v1/messages",
    count_anthropic,
    anthropic_body_usage,
    lambda _injected: AnthropicStreamTap(),
)
ANTHROPIC_COUNT = Route(
    "anthropic",
    "anthropic_count_tokens",
    "/v1/messages/count_tokens",
    count_anthropic,
    anthropic_body_usage,
    lambda _injected: AnthropicStreamTap(),
)


class BodyTooLarge(Exception):
    pass


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

    @property
    def forwarded_tokens(self) -> int:
        """Input tokens sent upstream: after trimming when the sidecar trimmed."""
        d = self.decision
        if d is not None and d.body is not None and d.report is not None:
            return d.report.after
        return self.count.total if self.count else 0


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


class Proxy:
    """Request handlers bound to the sidecar's live state."""

    def __init__(self, state: State) -> None:
        self.state = state

    # -- helpers ---------------------------------------------------------------------------

    def _workload(self, request: Request) -> str:
        name = request.headers.get(WORKLOAD_HEADER)
        return name if name and name in self.state.workloads else "default"

    def _fail(
        self, ex: Exchange, status: int, outcome: str, message: str, code: str | None = None
    ) -> Response:
        ex.status, ex.outcome = status, outcome
        self._finish(ex)
        return error_response(ex.route.api, status, message, code, headers=self._headers(ex))

    def _headers(self, ex: Exchange) -> dict[str, str]:
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

    def _finish(self, ex: Exchange) -> None:
        now = time.perf_counter()
        m = self.state.metrics
        m.requests.labels(
            model=ex.label, workload=ex.workload, api=ex.route.metric_api, outcome=ex.outcome
        ).inc()
        u = ex.usage
        est_error: float | None = None
        if ex.count is not None and u.input_tokens:
            est_error = (ex.forwarded_tokens - u.input_tokens) / u.input_tokens
            m.estimate_error.labels(model=ex.label).observe(est_error)
        if ex.upstream_started is not None:
            m.upstream_duration.labels(model=ex.label, api=ex.route.metric_api).observe(
                now - ex.upstream_started
            )
        if u.output_tokens is not None and ex.route is not ANTHROPIC_COUNT:
            m.output_tokens.labels(model=ex.label, workload=ex.workload).observe(u.output_tokens)
        c = ex.count
        d = ex.decision
        r = d.report if d else None
        stale: frozenset[str] = frozenset()
        if c is not None and ex.outcome == "ok" and ex.route is not ANTHROPIC_COUNT:
            stale = self.state.staleness.observe(
                ex.label, ex.workload, c, u.response_model, ex.ceilings
            )
        self._genai(ex, now, stale)
        log_request(
            {
                "request_id": ex.request_id,
                "api": ex.route.metric_api,
                "model": ex.model,
                "model_label": ex.label,
                "workload": ex.workload,
                "stream": ex.stream,
                "input_tokens_estimated": ex.forwarded_tokens if c else None,
                "input_tokens_before_trim": c.total if c else None,
                "input_tokens_exact": c.exact if c else None,
                "tokenizer": c.counter if c else None,
                "input_tokens_reported": u.input_tokens,
                "cached_tokens": u.cached_tokens,
                "estimate_error": round(est_error, 5) if est_error is not None else None,
                "window": ex.spec.window if ex.spec else None,
                "utilization": round(ex.util, 5) if ex.util is not None else None,
                "components": {k.value: v for k, v in c.components.items()} if c else None,
                "output_tokens": u.output_tokens,
                "finish_reason": u.finish_reason,
                "response_model": u.response_model,
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
        if ex.route is ANTHROPIC_COUNT:
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

    def _record_decision(self, ex: Exchange, d: Decision) -> None:
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
    def _forwarded_components(ex: Exchange) -> dict[Component, int]:
        assert ex.count is not None
        comps = dict(ex.count.components)
        d = ex.decision
        if d is not None and d.body is not None and d.report is not None:
            for kind, comp in _KIND_COMPONENT.items():
                comps[comp] = max(0, comps[comp] - d.report.removed.get(kind, 0))
        return comps

    async def _exact_count(
        self, spec: UpstreamSpec, route: Route, obj: Mapping[str, Any], est: RequestCount
    ) -> RequestCount:
        if route.api != "openai":
            return est
        try:
            total = await count_chat(
                self.state.engine_client, spec, obj["messages"], obj.get("tools"), obj.get("model")
            )
        except EngineCountError as exc:
            log.warning(
                "engine tokenize failed; using the estimate", extra={"fields": {"reason": str(exc)}}
            )
            return est
        return est.scaled_to(total, exact=True, counter=f"upstream:{spec.style}")

    # -- handlers --------------------------------------------------------------------------

    async def openai_chat(self, request: Request) -> Response:
        return await self._handle(request, OPENAI_CHAT)

    async def anthropic_messages(self, request: Request) -> Response:
        return await self._handle(request, ANTHROPIC_MESSAGES)

    async def anthropic_count_tokens(self, request: Request) -> Response:
        return await self._handle(request, ANTHROPIC_COUNT)

    async def _handle(self, request: Request, route: Route) -> Response:
        st = self.state
        ex = Exchange(
            route=route,
            request_id=request.headers.get("x-request-id") or uuid.uuid4().hex,
            workload=self._workload(request),
            started=time.perf_counter(),
        )
        client = st.clients.get(route.api)
        if client is None:
            return self._fail(
                ex, 404, "invalid", f"no {route.api} upstream is configured on this sidecar"
            )
        try:
            raw = await read_body(request, st.settings.limits.max_body_bytes)
        except BodyTooLarge:
            return self._fail(
                ex,
                413,
                "invalid",
                f"request body exceeds the limit of {st.settings.limits.max_body_bytes} bytes",
            )
        except ClientDisconnect:
            ex.outcome = "cancelled"
            self._finish(ex)
            return Response(status_code=499)
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return self._fail(ex, 400, "invalid", f"request body is not valid JSON: {exc}")
        if not isinstance(obj, dict):
            return self._fail(ex, 400, "invalid", "request body must be a JSON object")
        model = obj.get("model")
        if not isinstance(model, str) or not model:
            return self._fail(ex, 400, "invalid", "'model' is required and must be a string")
        ex.model = model
        ex.ceilings = st.ceilings.current
        asked = requested_output(obj, route.api)
        ex.max_tokens = asked
        if route is not ANTHROPIC_COUNT:
            ex.span = st.tracing.start("chat", model, route.api, request.headers)
        spec = st.registry.resolve(model)
        if spec is not None:
            ex.spec, ex.label = spec, spec.metric_label
        counter = st.registry.counter(spec) if spec else st.default_counter
        fmt = spec.chat_format if spec else None
        try:
            # On the event loop, deliberately: tiktoken holds the GIL while it encodes, so a
            # worker thread buys no parallelism and costs a GIL hand-off (measured: +5 ms at 64k).
            ex.count = route.count(obj, counter, fmt, st.chunk_pattern)
        except RequestShapeError as exc:
            return self._fail(ex, 400, "invalid", str(exc))
        if spec is not None and isinstance(spec.tokenizer, UpstreamSpec):
            ex.count = await self._exact_count(spec.tokenizer, route, obj, ex.count)
        bypass_token = request.headers.get(BYPASS_HEADER)
        if bypass_token is not None:
            if st.admin_token is None or not hmac.compare_digest(
                bypass_token.encode(), st.admin_token.encode()
            ):
                return self._fail(
                    ex, 403, "invalid", f"{BYPASS_HEADER} needs this sidecar's admin token"
                )
            ex.bypass = True
        body = raw
        if route is not ANTHROPIC_COUNT:
            d = decide(
                obj,
                route.api,
                ex.count,
                spec,
                ex.label,
                ex.workload,
                ex.ceilings,
                st.settings.enforcement,
                counter,
                st.chunk_pattern,
                ex.bypass,
            )
            ex.decision = d
            self._record_decision(ex, d)
            if d.reject:
                assert spec is not None
                message = context_error(route.api, ex.label, ex.workload, d, spec.window)
                return self._fail(ex, 400, "rejected", message, code="context_length_exceeded")
            if d.body is not None:
                obj = d.body
                body = orjson.dumps(obj)
            if spec is not None:
                ex.util = utilization(ex.forwarded_tokens, spec.window)
            st.metrics.observe_input(ex.label, ex.workload, ex.util, self._forwarded_components(ex))

        ex.stream = obj.get("stream") is True and route is not ANTHROPIC_COUNT
        injected = False
        if ex.stream and route.api == "openai":
            opts = obj.get("stream_options")
            if not (isinstance(opts, dict) and opts.get("include_usage")):
                obj["stream_options"] = {
                    **(opts if isinstance(opts, dict) else {}),
                    "include_usage": True,
                }
                body = orjson.dumps(obj)
                injected = True
        headers = request_headers(request.headers.items())
        if ex.span is not None:
            carrier: dict[str, str] = {}
            st.tracing.propagate(ex.span, carrier)
            headers = [(k, v) for k, v in headers if k.lower() not in carrier] + list(
                carrier.items()
            )
        upstream_cfg = st.upstream_settings(route.api)
        deadline = time.monotonic() + upstream_cfg.timeouts.total
        ex.upstream_started = time.perf_counter()
        req = client.build_request("POST", route.path, content=body, headers=headers)
        try:
            with anyio.fail_after(upstream_cfg.timeouts.total):
                resp = await client.send(req, stream=True)
        except (httpx.TimeoutException, TimeoutError):
            return self._fail(ex, 504, "timeout", "upstream timed out")
        except httpx.TransportError as exc:
            return self._fail(ex, 502, "unreachable", f"upstream unreachable: {type(exc).__name__}")
        ex.status = resp.status_code
        if not ex.stream or resp.status_code != 200:
            return await self._unary(ex, resp, deadline)
        return self._relay(ex, resp, route.tap(injected), deadline)

    async def _unary(self, ex: Exchange, resp: httpx.Response, deadline: float) -> Response:
        try:
            with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                content = await resp.aread()
        except (httpx.TimeoutException, TimeoutError):
            return self._fail(ex, 504, "timeout", "upstream timed out")
        except httpx.TransportError as exc:
            return self._fail(
                ex, 502, "unreachable", f"upstream connection failed: {type(exc).__name__}"
            )
        finally:
            await resp.aclose()
        status = resp.status_code
        if status < 300:
            ex.usage = ex.route.body_usage(content)
            ex.outcome = "ok"
        else:
            ex.outcome = "upstream_4xx" if status < 500 else "upstream_5xx"
        self._finish(ex)
        return Response(
            content, status_code=status, headers=response_headers(resp.headers) | self._headers(ex)
        )

    def _relay(self, ex: Exchange, resp: httpx.Response, tap: Tap, deadline: float) -> SSERelay:
        def done(outcome: str, usage: Usage) -> None:
            ex.outcome, ex.usage = outcome, usage
            self._finish(ex)

        headers = response_headers(resp.headers) | self._headers(ex)
        return SSERelay(resp, tap, deadline, headers, done)

    async def models(self, request: Request) -> Response:
        """``GET /v1/models`` passed through to the upstream the client's headers point at."""
        st = self.state
        api: Api = (
            "anthropic"
            if ("x-api-key" in request.headers or "anthropic-version" in request.headers)
            else "openai"
        )
        client = st.clients.get(api) or next(iter(st.clients.values()))
        api = "openai" if client is st.clients.get("openai") else "anthropic"
        path = "/models" if api == "openai" else "/v1/models"
        try:
            resp = await client.get(
                path,
                headers=request_headers(request.headers.items()),
                params=list(request.query_params.multi_items()),
            )
        except httpx.TimeoutException:
            return error_response(api, 504, "upstream timed out")
        except httpx.TransportError as exc:
            return error_response(api, 502, f"upstream unreachable: {type(exc).__name__}")
        st.metrics.requests.labels(
            model=OTHER,
            workload="default",
            api="models",
            outcome="ok"
            if resp.status_code < 300
            else ("upstream_4xx" if resp.status_code < 500 else "upstream_5xx"),
        ).inc()
        return Response(
            resp.content, status_code=resp.status_code, headers=response_headers(resp.headers)
        )
