"""OpenTelemetry: GenAI-convention spans, context propagation, OTLP export, off by default."""

from __future__ import annotations

import gzip
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.observability.tracing import Tracing, exporter_configured
from testkit.doubles.hosted_provider import HostedProviderDouble
from testkit.serving import serve
from tests.conftest import MODELS

MSG: list[Any] = [{"role": "user", "content": "hello"}]


@pytest.fixture
def traced(
    double: tuple[HostedProviderDouble, str],
) -> Iterator[tuple[str, InMemorySpanExporter, HostedProviderDouble]]:
    d, durl = double
    exporter = InMemorySpanExporter()
    app = create_app(
        Settings(
            upstreams={"openai": {"base_url": durl + "/v1"}, "anthropic": {"base_url": durl}},
            models=MODELS,
        ),
        tracing=Tracing(SimpleSpanProcessor(exporter)),
    )
    with serve(app) as url:
        yield url, exporter, d


def ours(exporter: InMemorySpanExporter) -> list[Any]:
    return [
        s
        for s in exporter.get_finished_spans()
        if s.instrumentation_scope.name == "context-ceiling.sidecar"  # type: ignore[union-attr]
    ]


def test_span_follows_genai_conventions_and_propagates(
    traced: tuple[str, InMemorySpanExporter, HostedProviderDouble],
) -> None:
    url, exporter, d = traced
    parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    client = openai.OpenAI(
        base_url=url + "/v1",
        api_key="k",
        max_retries=0,
        default_headers={"traceparent": f"00-{parent_trace}-00f067aa0ba902b7-01"},
    )
    client.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=33)
    [span] = ours(exporter)
    assert span.name == "chat gpt-4o" and span.kind == SpanKind.CLIENT
    a = span.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert (
        a["gen_ai.request.model"] == "gpt-4o" and a["gen_ai.response.model"] == "gpt-4o-2024-08-06"
    )
    assert a["gen_ai.request.max_tokens"] == 33
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("stop",)
    assert a["gen_ai.usage.input_tokens"] == 1234 and a["gen_ai.usage.output_tokens"] == 7
    assert (
        a["ceiling.window"] == 128000
        and a["ceiling.mode"] == "off"
        and a["ceiling.input_tokens"] > 0
    )
    assert "ceiling.input_tokens.latest_user" in a and a["ceiling.utilization"] > 0
    assert format(span.context.trace_id, "032x") == parent_trace  # the caller's trace continues
    sent = d.received[-1].headers["traceparent"]
    assert sent.split("-")[1] == parent_trace and sent.split("-")[2] == format(
        span.context.span_id, "016x"
    )
    text = str(dict(a))
    assert "hello" not in text  # no prompt text on spans


def test_failed_request_span_has_error_type(
    traced: tuple[str, InMemorySpanExporter, HostedProviderDouble],
) -> None:
    url, exporter, _ = traced
    httpx.post(
        url + "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MSG},
        headers={"x-double-status": "503"},
    )
    [span] = ours(exporter)
    assert (
        span.attributes["error.type"] == "upstream_5xx" and span.status.status_code.name == "ERROR"
    )


def test_semconv_metrics_on_the_prometheus_endpoint(
    traced: tuple[str, InMemorySpanExporter, HostedProviderDouble],
) -> None:
    url, _, d = traced
    openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0).chat.completions.create(
        model="gpt-4o", messages=MSG
    )
    text = httpx.get(url + "/metrics").text
    port = d.received[-1].headers["host"].rsplit(":", 1)[1]  # the upstream's (server.port)
    assert (
        'gen_ai_client_token_usage_bucket{gen_ai_operation_name="chat",gen_ai_provider_name="openai",gen_ai_request_model="gpt-4o",gen_ai_token_type="input",le="4096.0",model="gpt-4o",server_address="127.0.0.1",server_port="'
        + port
        + '"} 1.0'
        in text
    )
    assert "gen_ai_client_operation_duration_seconds_count" in text


def test_off_without_an_exporter(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)
    assert not exporter_configured() and Tracing().tracer is None
    assert exporter_configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"})
    assert not exporter_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}
    )
    assert not exporter_configured(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}
    )


def test_otlp_export_to_a_loopback_receiver(
    double: tuple[HostedProviderDouble, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    got: list[ExportTraceServiceRequest] = []
    arrived = threading.Event()

    async def traces(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        got.append(msg)
        arrived.set()
        return Response(b"", media_type="application/x-protobuf")

    _, durl = double
    with serve(Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])) as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "sidecar-under-test")
        tracing = Tracing()
        assert tracing.tracer is not None
        app = create_app(
            Settings(upstreams={"openai": {"base_url": durl + "/v1"}}, models=MODELS),
            tracing=tracing,
        )
        with serve(app) as url:
            httpx.post(url + "/v1/chat/completions", json={"model": "gpt-4o", "messages": MSG})
        assert tracing.provider is not None
        tracing.provider.force_flush()
        assert arrived.wait(10)
    spans = [
        s for req in got for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans
    ]
    assert [s.name for s in spans] == ["chat gpt-4o"]
    resource = {
        kv.key: kv.value.string_value for kv in got[0].resource_spans[0].resource.attributes
    }
    assert resource["service.name"] == "sidecar-under-test"
    _ = os.environ  # the exporter read its endpoint from the standard variable
