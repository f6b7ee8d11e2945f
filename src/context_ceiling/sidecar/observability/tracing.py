"""OpenTelemetry traces: one CLIENT span per proxied request, GenAI semantic conventions.

On only when an OTLP exporter is configured through the standard variables
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED``
and ``OTEL_TRACES_EXPORTER=none`` turn it off). When off, no tracer exists and the hot path pays
one ``None`` check. The incoming W3C trace context is continued, and the span's context is
propagated to the upstream. No prompt or completion text is ever put on a span.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from typing import Any

from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

SCOPE = "context-ceiling.sidecar"


def exporter_configured(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


class Tracing:
    """The sidecar's tracer, or nothing. ``processor`` lets tests export in memory."""

    def __init__(self, processor: SpanProcessor | None = None) -> None:
        self.provider: TracerProvider | None = None
        self.tracer: Tracer | None = None
        if processor is None and exporter_configured():
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processor = BatchSpanProcessor(OTLPSpanExporter())
        if processor is not None:
            name = os.environ.get("OTEL_SERVICE_NAME", "context-ceiling-sidecar")
            self.provider = TracerProvider(resource=Resource.create({"service.name": name}))
            self.provider.add_span_processor(processor)
            self.tracer = self.provider.get_tracer(SCOPE)

    def start(
        self, operation: str, model: str, provider: str, headers: Mapping[str, str]
    ) -> Span | None:
        if self.tracer is None:
            return None
        ctx = extract(dict(headers))
        span = self.tracer.start_span(
            f"{operation} {model}",
            context=ctx,
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": provider,
                "gen_ai.request.model": model,
            },
        )
        return span

    @staticmethod
    def propagate(span: Span | None, headers: MutableMapping[str, str]) -> None:
        if span is not None:
            inject(headers, context=trace.set_span_in_context(span))

    @staticmethod
    def finish(
        span: Span | None,
        attributes: Mapping[str, Any],
        error: str | None,
        end_ns: int | None = None,
    ) -> None:
        """End ``span`` with its closing ``attributes`` (None values left out); ``end_ns``: when
        its request finished (nanoseconds since the epoch), when it is recorded later."""
        if span is None:
            return
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error:
            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_ns)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()
