"""Drop-in: every route the sidecar does not measure passes through, with the official SDKs.

The upstream is a loopback echo double (a stand-in for the hosted providers) that records what
arrived and answers each route in the shape the SDKs parse.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from context_ceiling.sidecar.state import SidecarState
from testkit.asgi import lifespan, read_body
from testkit.serving import serve
from tests.conftest import MODELS


class EchoProviderDouble:
    """Records method, path, query, headers and body; answers per route."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = await read_body(receive)
        path = scope["path"]
        self.seen.append(
            {
                "method": scope["method"],
                "path": path,
                "query": scope["query_string"].decode(),
                "headers": {k.decode(): v.decode() for k, v in scope["headers"]},
                "body": body,
            }
        )
        out: Any = {"object": "list", "data": []}
        if path.endswith("/embeddings"):
            out = {
                "object": "list",
                "data": [{"object": "embedding", "embedding": [0.1, 0.2], "index": 0}],
                "model": "text-embedding-3-small",
                "usage": {"prompt_tokens": 2, "total_tokens": 2},
            }
        elif path.endswith("/completions") and "chat" not in path:
            out = {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1,
                "model": "gpt-3.5-turbo-instruct",
                "choices": [{"text": " ok", "index": 0, "logprobs": None, "finish_reason": "stop"}],
            }
        elif path.startswith("/v1/messages/batches"):
            out = {"data": [], "has_more": False, "first_id": None, "last_id": None}
        status = 404 if path.endswith("/missing") else 200
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"x-upstream", b"echo")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(out).encode()})


class Running:
    def __init__(self, url: str, state: SidecarState, double: EchoProviderDouble) -> None:
        self.url, self.state, self.double = url, state, double

    def count(self, upstream: str, route: str, outcome: str = "ok") -> float:
        v = self.state.metrics.registry.get_sample_value(
            "llm_context_passthrough_requests_total",
            {"upstream": upstream, "route": route, "outcome": outcome},
        )
        return v or 0.0


@pytest.fixture
def echo() -> Iterator[tuple[EchoProviderDouble, str]]:
    d = EchoProviderDouble()
    with serve(d) as url:
        yield d, url


def start(durl: str, which: tuple[str, ...] = ("openai", "anthropic")) -> Any:
    ups: dict[str, Any] = {}
    if "openai" in which:
        ups["openai"] = {"base_url": durl + "/v1"}
    if "anthropic" in which:
        ups["anthropic"] = {"base_url": durl}
    return create_app(Settings(upstreams=ups, models=MODELS))


@pytest.mark.e2e
def test_openai_routes_pass_through_unchanged(echo: tuple[EchoProviderDouble, str]) -> None:
    d, durl = echo
    app = start(durl)
    with serve(app) as url:
        sc = Running(url, app.state.sidecar, d)
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-secret", max_retries=0)
        e = client.embeddings.create(model="text-embedding-3-small", input="hello")
        assert e.data[0].embedding == [0.1, 0.2]
        c = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="say ok")
        assert c.choices[0].text == " ok"
        client.files.list()
        client.chat.completions.list()  # stored chat completions: a GET on the measured path
        r = httpx.post(
            url + "/v1/moderations?x=1&x=2",
            content=b'{"model": "omni-moderation-latest", "input": "hi"}',
            headers={"authorization": "Bearer sk-secret", "x-custom": "v"},
        )
        assert r.status_code == 200 and r.headers["x-upstream"] == "echo"
        assert r.headers["x-ceiling-request-id"]
    emb, cmpl, files, stored, resp = d.seen
    assert emb["method"] == "POST" and emb["path"] == "/v1/embeddings"
    assert (
        json.loads(emb["body"])
        == {
            "model": "text-embedding-3-small",
            "input": "hello",
            "encoding_format": "base64",
        }
        or json.loads(emb["body"])["input"] == "hello"
    )
    assert emb["headers"]["authorization"] == "Bearer sk-secret"
    assert cmpl["path"] == "/v1/completions"
    assert files["method"] == "GET" and files["path"] == "/v1/files"
    assert stored["method"] == "GET" and stored["path"] == "/v1/chat/completions"
    assert resp["path"] == "/v1/moderations" and resp["query"] == "x=1&x=2"
    assert resp["body"] == b'{"model": "omni-moderation-latest", "input": "hi"}', "byte for byte"
    assert resp["headers"]["x-custom"] == "v"
    for route in ("embeddings", "completions", "files", "chat_completions", "moderations"):
        assert sc.count("openai", route) == 1, route
    assert (
        sc.state.metrics.registry.get_sample_value(
            "llm_context_requests_total",
            {"model": "other", "workload": "default", "api": "passthrough", "outcome": "ok"},
        )
        == 5
    )


@pytest.mark.e2e
def test_anthropic_routes_pass_through(echo: tuple[EchoProviderDouble, str]) -> None:
    d, durl = echo
    app = start(durl)
    with serve(app) as url:
        sc = Running(url, app.state.sidecar, d)
        client = anthropic.Anthropic(base_url=url, api_key="sk-ant", max_retries=0)
        client.messages.batches.list()
        r = httpx.get(url + "/v1/some/new/route", headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 200
    batches, other = d.seen
    assert batches["method"] == "GET" and batches["path"] == "/v1/messages/batches"
    h = batches["headers"]
    assert "sk-ant" in (h.get("x-api-key", "") + h.get("authorization", "")), "auth passes"
    assert other["path"] == "/v1/some/new/route"
    assert sc.count("anthropic", "message_batches") == 1
    assert sc.count("anthropic", "other") == 1, "an unknown route is counted, the path is not"


@pytest.mark.e2e
def test_upstream_errors_and_missing_upstreams(echo: tuple[EchoProviderDouble, str]) -> None:
    d, durl = echo
    app = start(durl, ("openai",))
    with serve(app) as url:
        sc = Running(url, app.state.sidecar, d)
        r = httpx.get(url + "/v1/files/missing")
        assert r.status_code == 404 and r.headers["x-upstream"] == "echo"
        assert sc.count("openai", "files", "upstream_4xx") == 1
        # an Anthropic client on a sidecar with no Anthropic upstream: an error in its shape
        r = httpx.get(url + "/v1/messages/batches", headers={"anthropic-version": "2023-06-01"})
        assert r.status_code == 404 and r.json()["type"] == "error"
        assert "no anthropic upstream" in r.json()["error"]["message"]


@pytest.mark.e2e
def test_a_large_upload_streams_and_the_limit_holds(echo: tuple[EchoProviderDouble, str]) -> None:
    d, durl = echo
    app = create_app(
        Settings(upstreams={"openai": {"base_url": durl + "/v1"}}, limits={"max_body_bytes": 4096})
    )
    with serve(app) as url:
        ok = httpx.post(url + "/v1/files", content=b"x" * 4000)
        assert ok.status_code == 200 and d.seen[-1]["body"] == b"x" * 4000
        big = httpx.post(url + "/v1/files", content=b"x" * 10000)
        assert big.status_code == 413 and "limit" in big.json()["error"]["message"]


@pytest.mark.e2e
def test_an_upstream_redirect_has_one_outcome_on_every_route() -> None:
    """A 3xx is neither an answer nor an upstream error: ``upstream_3xx`` on a measured route
    and on the pass-through alike, relayed as it came (no redirect followed)."""
    from starlette.applications import Starlette
    from starlette.responses import RedirectResponse
    from starlette.routing import Route

    from context_ceiling.sidecar.outcomes import OUTCOMES, outcome_of

    async def moved(_request: Any) -> RedirectResponse:
        return RedirectResponse("https://elsewhere.example/v1/x", status_code=307)

    double = Starlette(
        routes=[Route("/v1/chat/completions", moved, methods=["POST"]), Route("/v1/files/f", moved)]
    )
    with serve(double) as durl:
        app = start(durl, ("openai",))
        with serve(app) as url:
            state: SidecarState = app.state.sidecar
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(url + "/v1/chat/completions", json=body)
            assert r.status_code == 307 and r.headers["location"].startswith("https://elsewhere")
            r = httpx.get(url + "/v1/files/f")
            assert r.status_code == 307
            measured = state.metrics.registry.get_sample_value(
                "llm_context_requests_total",
                {
                    "model": "gpt-4o",
                    "workload": "default",
                    "api": "openai_chat",
                    "outcome": "upstream_3xx",
                },
            )
            passed = state.metrics.registry.get_sample_value(
                "llm_context_passthrough_requests_total",
                {"upstream": "openai", "route": "files", "outcome": "upstream_3xx"},
            )
            assert measured == 1 and passed == 1
    assert [outcome_of(s) for s in (200, 204, 301, 404, 429, 500, 503)] == [
        "ok", "ok", "upstream_3xx", "upstream_4xx", "upstream_4xx", "upstream_5xx", "upstream_5xx"
    ]  # fmt: skip
    assert len(set(OUTCOMES)) == len(OUTCOMES) and "shutdown" in OUTCOMES


def test_one_table_maps_upstream_call_failures_for_every_route() -> None:
    from context_ceiling.sidecar.outcomes import Failure, failure_of

    req = httpx.Request("POST", "http://upstream.invalid/v1/chat/completions")
    assert failure_of(httpx.ReadTimeout("slow", request=req)) == Failure(
        504, "timeout", "upstream timed out"
    )
    assert failure_of(TimeoutError()) == Failure(504, "timeout", "upstream timed out")
    refused = failure_of(httpx.ConnectError("refused", request=req))
    assert refused == Failure(502, "unreachable", "upstream unreachable: ConnectError")
    assert failure_of(httpx.RemoteProtocolError("cut", request=req)).status == 502
    # the class, never the message: an exception's text may carry a URL with its credentials
    leaky = httpx.ConnectError("https://user:sk-secret@upstream.invalid/v1", request=req)
    assert "sk-secret" not in failure_of(leaky).message
