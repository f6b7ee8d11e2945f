"""The GenAI semantic conventions' names, chosen with OTEL_SEMCONV_STABILITY_OPT_IN as
OpenTelemetry's instrumentations choose them; server.port; the provider name of an upstream;
finish reasons only for an answer that stopped; pass-through labelled by the upstream that took
it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from context_ceiling.formats.responses import body_usage
from context_ceiling.sidecar.observability.semconv import (
    OPT_IN_ENV,
    GenAiNames,
    known_provider,
    provider_name,
)
from tests.conftest import Running

IN_PROCESS = True

MSG: list[dict[str, Any]] = [{"role": "user", "content": "hello"}]
#: the labels of the in-process sidecar's OpenAI requests (the double at http://upstream.test)
BASE = {
    "gen_ai_operation_name": "chat",
    "gen_ai_provider_name": "openai",
    "gen_ai_request_model": "gpt-4o",
    "server_address": "upstream.test",
    "server_port": "80",
    "model": "gpt-4o",
}


def _traffic(sc: Running) -> None:
    """One answer read whole, one streamed."""
    body = {"model": "gpt-4o", "messages": MSG}
    assert sc.http.post("/v1/chat/completions", json=body).status_code == 200
    r = sc.http.post("/v1/chat/completions", json={**body, "stream": True})
    assert r.status_code == 200 and b"[DONE]" in r.content


def _value(sc: Running, name: str, **labels: str) -> float | None:
    return sc.state.metrics.registry.get_sample_value(name, {**BASE, **labels})


@pytest.mark.parametrize(
    ("value", "legacy", "latest"),
    [
        ("", True, False),
        ("http", True, False),
        ("gen_ai_latest_experimental", False, True),
        ("http/dup, gen_ai_latest_experimental", False, True),
        ("gen_ai_latest_experimental/dup", True, True),
    ],
)
def test_the_opt_in_chooses_the_names(value: str, legacy: bool, latest: bool) -> None:
    names = GenAiNames.from_env({OPT_IN_ENV: value})
    assert (names.legacy, names.latest) == (legacy, latest)


def test_the_earlier_names_by_default(
    make_sidecar: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OPT_IN_ENV, raising=False)
    sc = make_sidecar()
    _traffic(sc)
    assert _value(sc, "gen_ai_client_token_usage_sum", gen_ai_token_type="input") == 2 * 1234
    assert _value(sc, "gen_ai_client_operation_duration_seconds_count") == 2
    assert _value(sc, "gen_ai_server_time_to_first_token_seconds_count") == 1
    assert _value(sc, "gen_ai_client_inference_duration_seconds_count") is None
    text = sc.http.get("/metrics").text
    assert "gen_ai_client_inference_" not in text


def test_the_current_names_with_the_opt_in(
    make_sidecar: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OPT_IN_ENV, "gen_ai_latest_experimental")
    sc = make_sidecar()
    sc.double.cache_read = 1000
    _traffic(sc)
    unknown = {"gen_ai_token_modality": "unknown"}
    # counters by modality: the provider breaks nothing down, so "unknown", as the
    # conventions say; cache reads among the input
    assert _value(sc, "gen_ai_client_inference_usage_input_tokens_total", **unknown) == 2 * 1234
    assert _value(sc, "gen_ai_client_inference_usage_output_tokens_total", **unknown) == 2 * 7
    cache_read = "gen_ai_client_inference_usage_cache_read_input_tokens_total"
    assert (_value(sc, cache_read, **unknown) or 0) >= 1000
    # per-operation histograms, without modality
    assert _value(sc, "gen_ai_client_inference_operation_input_tokens_count") == 2
    assert _value(sc, "gen_ai_client_inference_operation_output_tokens_sum") == 2 * 7
    # the inference duration for both, the chunk timings for the stream only
    assert _value(sc, "gen_ai_client_inference_duration_seconds_count") == 2
    assert _value(sc, "gen_ai_client_inference_time_to_first_chunk_seconds_count") == 1
    # the earlier names are not emitted
    assert _value(sc, "gen_ai_client_token_usage_count", gen_ai_token_type="input") is None
    text = sc.http.get("/metrics").text
    assert "gen_ai_client_token_usage" not in text
    assert "gen_ai_client_operation_duration" not in text


def test_both_names_during_a_migration(
    make_sidecar: Callable[..., Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(OPT_IN_ENV, "gen_ai_latest_experimental/dup")
    sc = make_sidecar()
    _traffic(sc)
    assert _value(sc, "gen_ai_client_token_usage_count", gen_ai_token_type="input") == 2
    assert (
        _value(
            sc, "gen_ai_client_inference_usage_input_tokens_total", gen_ai_token_modality="unknown"
        )
        == 2 * 1234
    )


def _span_attributes(sc: Running, exporter: InMemorySpanExporter) -> dict[str, Any]:
    [span] = [
        s
        for s in exporter.get_finished_spans()
        if s.instrumentation_scope is not None
        and s.instrumentation_scope.name == "context-ceiling.sidecar"
    ]
    return dict(span.attributes or {})


@pytest.mark.parametrize("opt_in", ["", "gen_ai_latest_experimental"])
def test_span_attributes_follow_the_names(
    make_sidecar: Callable[..., Running], monkeypatch: pytest.MonkeyPatch, opt_in: str
) -> None:
    from context_ceiling.sidecar.observability.tracing import Tracing

    monkeypatch.setenv(OPT_IN_ENV, opt_in)
    sc = make_sidecar()
    exporter = InMemorySpanExporter()
    sc.state.tracing = Tracing(SimpleSpanProcessor(exporter))
    r = sc.http.post(
        "/v1/messages",
        json={"model": "claude-sonnet-4", "max_tokens": 5, "messages": MSG},
        headers={"anthropic-version": "2023-06-01", "x-api-key": "k"},
    )
    assert r.status_code == 200
    a = _span_attributes(sc, exporter)
    assert a["server.address"] == "upstream.test" and a["server.port"] == 80
    assert a["gen_ai.provider.name"] == "anthropic"
    written = r.json()["usage"].get("cache_creation_input_tokens")
    if opt_in:
        assert "gen_ai.usage.cache_creation.input_tokens" not in a
        assert a["gen_ai.request.stream"] is False
        if written:
            assert a["gen_ai.usage.cache_write.input_tokens"] == written
    else:
        assert "gen_ai.usage.cache_write.input_tokens" not in a
        assert "gen_ai.request.stream" not in a


def test_provider_names() -> None:
    # the conventions' names for the hosts they know
    assert known_provider("api.openai.com") == "openai"
    assert known_provider("my-resource.openai.azure.com") == "azure.ai.openai"
    assert known_provider("my-hub.services.ai.azure.com") == "azure.ai.inference"
    assert known_provider("bedrock-runtime.eu-west-1.amazonaws.com") == "aws.bedrock"
    assert known_provider("europe-west4-aiplatform.googleapis.com") == "gcp.vertex_ai"
    assert known_provider("generativelanguage.googleapis.com") == "gcp.gemini"
    assert known_provider("API.GROQ.COM.") == "groq"
    assert known_provider("127.0.0.1") is None
    assert known_provider("api.openai.com.evil.example") is None
    # a local OpenAI-compatible server behind a named upstream is not "openai"
    assert provider_name(None, "10.0.0.5", "openai", "vllm", compatible=True) == "vllm"
    # ... behind the default upstream it has no other name but its API's
    assert provider_name(None, "10.0.0.5", "openai") == "openai"
    # a named upstream at a host the conventions know is that provider
    assert provider_name(None, "api.groq.com", "openai", "fast", compatible=True) == "groq"
    # routes that name their provider by their path keep it on an unknown host (a proxy)
    assert provider_name(None, "proxy.internal", "gcp.vertex_ai", "vx") == "gcp.vertex_ai"
    # the configured name wins
    assert provider_name("vllm", "api.openai.com", "openai") == "vllm"


def test_named_upstream_provider_and_pass_through_label(
    make_sidecar: Callable[..., Running],
) -> None:
    """A named OpenAI-API upstream at a host the conventions do not know is reported under its
    name (or its configured ``provider``); what is passed through to it is labelled with it."""
    from tests.conftest import UPSTREAM_URL

    sc = make_sidecar(
        upstreams={
            "openai": {"base_url": UPSTREAM_URL + "/v1"},
            "named": {
                "vllm": {"api": "openai", "base_url": "http://upstream.test:8000/v1"},
                "ollama": {
                    "api": "openai",
                    "base_url": "http://upstream.test:11434/v1",
                    "provider": "ollama_local",
                },
            },
        },
        models=[
            {"match": "llama-3*", "label": "llama", "window": 8192, "upstream": "vllm"},
            {"match": "qwen*", "label": "qwen", "window": 8192, "upstream": "ollama"},
        ],
    )
    for model in ("llama-3.1-8b", "qwen3"):
        assert (
            sc.http.post("/v1/chat/completions", json={"model": model, "messages": MSG}).status_code
            == 200
        )
    reg = sc.state.metrics.registry
    common = {"gen_ai_operation_name": "chat", "server_address": "upstream.test"}
    assert (
        reg.get_sample_value(
            "gen_ai_client_operation_duration_seconds_count",
            {
                **common,
                "gen_ai_provider_name": "vllm",
                "gen_ai_request_model": "llama-3.1-8b",
                "server_port": "8000",
                "model": "llama",
            },
        )
        == 1
    )
    assert (
        reg.get_sample_value(
            "gen_ai_client_operation_duration_seconds_count",
            {
                **common,
                "gen_ai_provider_name": "ollama_local",
                "gen_ai_request_model": "qwen3",
                "server_port": "11434",
                "model": "qwen",
            },
        )
        == 1
    )
    # an embeddings call for the named upstream's model goes there, labelled with its name
    sc.http.post("/v1/embeddings", json={"model": "llama-3.1-8b", "input": "x"})
    passed = [
        s.labels
        for metric in reg.collect()
        if metric.name == "llm_context_passthrough_requests"
        for s in metric.samples
        if s.name.endswith("_total")
    ]
    assert [(p["upstream"], p["route"]) for p in passed] == [("vllm", "embeddings")]


def test_a_background_response_has_no_finish_reason_yet() -> None:
    queued = b'{"id":"resp_1","object":"response","status":"queued","model":"gpt-5","output":[]}'
    assert body_usage(queued).finish_reason is None
    done = b'{"id":"resp_1","object":"response","status":"completed","model":"gpt-5","output":[]}'
    assert body_usage(done).finish_reason == "completed"
    cut = b'{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"output":[]}'
    assert body_usage(cut).finish_reason == "max_output_tokens"
