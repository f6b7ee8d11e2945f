"""Named upstreams routed by model: hosted OpenAI, a local OpenAI-style server and Anthropic
behind one sidecar and one base_url. The upstreams are loopback test doubles standing in for the
hosted APIs and for a local vLLM."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import ConfigError, Settings, load_settings
from testkit.doubles.hosted_provider import HostedProviderDouble
from testkit.serving import serve

MSG: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.mark.e2e
def test_models_are_routed_to_their_named_upstream(tmp_path) -> None:  # type: ignore[no-untyped-def]
    hosted, local, claude = HostedProviderDouble(), HostedProviderDouble(), HostedProviderDouble()
    with serve(hosted.app()) as h, serve(local.app()) as lo, serve(claude.app()) as c:
        settings = Settings(
            upstreams={
                "openai": {"base_url": h + "/v1"},
                "named": {
                    "vllm": {"api": "openai", "base_url": lo + "/v1"},
                    "claude-eu": {"api": "anthropic", "base_url": c},
                },
            },
            models=[
                {"match": "gpt-4o", "window": 128000},
                {"match": "llama-3*", "label": "llama", "window": 8192, "upstream": "vllm"},
                {"match": "claude-*", "label": "claude", "window": 200000, "upstream": "claude-eu"},
            ],
        )
        app = create_app(settings)
        with serve(app) as url:
            oai = openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0)
            oai.chat.completions.create(model="gpt-4o", messages=MSG)
            oai.chat.completions.create(model="llama-3.1-8b", messages=MSG)
            ant = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0)
            ant.messages.create(model="claude-x", max_tokens=5, messages=MSG)
            # a model served by an Anthropic upstream, asked for through the OpenAI route
            with pytest.raises(openai.BadRequestError, match="claude-eu"):
                oai.chat.completions.create(model="claude-x", messages=MSG)
            # a route the sidecar does not measure goes to the named Anthropic upstream too
            r = httpx.get(url + "/v1/messages/batches", headers={"anthropic-version": "2023-06-01"})
            assert r.status_code == 404 and "x-ceiling-request-id" in r.headers
            status = httpx.get(url + "/status").json()["upstreams"]
            state = app.state.sidecar
        assert [r.json["model"] for r in hosted.received] == ["gpt-4o"]
        assert [r.json["model"] for r in local.received] == ["llama-3.1-8b"]
        assert [r.json["model"] for r in claude.received] == ["claude-x"]
        assert set(status) == {"openai", "vllm", "claude-eu"}
        assert (
            state.metrics.registry.get_sample_value(
                "llm_context_passthrough_requests_total",
                {"upstream": "claude-eu", "route": "message_batches", "outcome": "upstream_4xx"},
            )
            == 1
        )
        assert (
            state.metrics.registry.get_sample_value(
                "llm_context_requests_total",
                {"model": "llama", "workload": "default", "api": "openai_chat", "outcome": "ok"},
            )
            == 1
        )


def test_an_unknown_upstream_name_is_a_config_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "sidecar.yaml"
    cfg.write_text(
        "upstreams: {openai: {base_url: 'http://x/v1'}}\n"
        "models: [{match: m, window: 1000, max_output_tokens: 10, upstream: nowhere}]\n"
    )
    with pytest.raises(ConfigError, match="nowhere"):
        load_settings(cfg)


@pytest.mark.e2e
def test_azure_openai_deployment_paths_with_the_azure_sdk() -> None:
    """AzureOpenAI calls /openai/deployments/{deployment}/...?api-version=... with an api-key
    header: measured on chat completions, passed through elsewhere, the path kept as sent."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    seen: list[tuple[str, str, str | None]] = []
    double = HostedProviderDouble()

    async def chat(request: Request) -> Response:
        seen.append((request.url.path, request.url.query, request.headers.get("api-key")))
        return Response(double.openai_body("gpt-4o"), media_type="application/json")

    async def embeddings(request: Request) -> Response:
        seen.append((request.url.path, request.url.query, request.headers.get("api-key")))
        return JSONResponse(
            {
                "object": "list",
                "data": [{"object": "embedding", "embedding": [0.5], "index": 0}],
                "model": "emb",
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        )

    azure_app = Starlette(
        routes=[
            Route("/openai/deployments/{d}/chat/completions", chat, methods=["POST"]),
            Route("/openai/deployments/{d}/embeddings", embeddings, methods=["POST"]),
        ]
    )
    with serve(azure_app) as az:
        app = create_app(
            Settings(
                upstreams={"named": {"azure-eu": {"api": "openai", "base_url": az, "azure": True}}},
                models=[{"match": "prod-gpt4o", "label": "gpt-4o-azure", "window": 128000}],
            )
        )
        with serve(app) as url:
            client = openai.AzureOpenAI(
                azure_endpoint=url, api_key="azure-key", api_version="2024-10-21", max_retries=0
            )
            r = client.chat.completions.with_raw_response.create(model="prod-gpt4o", messages=MSG)
            assert r.parse().choices[0].message.content == "The answer is 42."
            assert int(r.headers["x-ceiling-input-tokens"]) > 0
            client.embeddings.create(model="text-emb", input="x")
            state = app.state.sidecar
    assert seen[0] == (
        "/openai/deployments/prod-gpt4o/chat/completions",
        "api-version=2024-10-21",
        "azure-key",
    )
    assert seen[1][0] == "/openai/deployments/text-emb/embeddings"
    assert (
        state.metrics.registry.get_sample_value(
            "llm_context_requests_total",
            {"model": "gpt-4o-azure", "workload": "default", "api": "azure_chat", "outcome": "ok"},
        )
        == 1
    )


@pytest.mark.e2e
def test_an_upstream_that_compresses_unasked_is_decoded_for_the_client() -> None:
    """A client that takes no gzip (and every stream) is asked for plain content upstream. An
    upstream that gzips anyway must still reach such a client decoded, its usage read, unary
    and streamed."""
    import gzip
    import json

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    seen: list[str | None] = []

    async def chat(request: Request) -> Response:
        body = await request.json()
        seen.append(request.headers.get("accept-encoding"))
        usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
        if body.get("stream"):
            chunk = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o"}
            events = [
                {**chunk, "choices": [{"index": 0, "delta": {"content": "hel"}}]},
                {**chunk, "choices": [{"index": 0, "delta": {"content": "lo"}}]},
                {**chunk, "choices": [], "usage": usage},
            ]
            raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            raw += b"data: [DONE]\n\n"
            media = "text/event-stream"
        else:
            raw = json.dumps(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 0,
                    "model": "gpt-4o",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hello"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            ).encode()
            media = "application/json"
        return Response(gzip.compress(raw), media_type=media, headers={"content-encoding": "gzip"})

    upstream = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    with serve(upstream) as up:
        app = create_app(
            Settings(
                upstreams={"openai": {"base_url": up + "/v1"}},
                models=[{"match": "gpt-4o", "window": 128000}],
            )
        )
        with serve(app) as url:
            oai = openai.OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0)
            reply = oai.chat.completions.create(model="gpt-4o", messages=MSG)
            stream = oai.chat.completions.create(model="gpt-4o", messages=MSG, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            raw = httpx.post(
                url + "/v1/chat/completions",
                json={"model": "gpt-4o", "messages": MSG},
                headers={"accept-encoding": "identity"},
            )
        reg = app.state.sidecar.metrics.registry
    assert reply.choices[0].message.content == "hello" and reply.usage is not None
    assert text == "hello"
    assert "content-encoding" not in raw.headers and raw.json()["usage"]["prompt_tokens"] == 7
    assert seen == ["gzip", None, None]  # the SDK takes gzip; a stream is asked for plain
    ok = {"model": "gpt-4o", "workload": "default", "api": "openai_chat", "outcome": "ok"}
    assert reg.get_sample_value("llm_context_requests_total", ok) == 3
    assert (
        reg.get_sample_value(
            "gen_ai_client_token_usage_sum",
            {
                "gen_ai_operation_name": "chat",
                "gen_ai_provider_name": "openai",
                "gen_ai_request_model": "gpt-4o",
                "server_address": "127.0.0.1",
                "server_port": up.rsplit(":", 1)[1],
                "model": "gpt-4o",
                "gen_ai_token_type": "input",
            },
        )
        == 21
    )
