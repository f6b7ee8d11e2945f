"""Google's Gemini API through the sidecar, with the official ``google-genai`` SDK.

The upstream is a loopback stand-in for the Gemini API (a test double): ``generateContent``,
``streamGenerateContent?alt=sse`` and ``countTokens`` in the shapes the SDK parses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from context_ceiling.core.tokenizers import CalibratedCounter, TiktokenCounter
from context_ceiling.formats.gemini import count as count_gemini
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.serving import serve

pytestmark = pytest.mark.e2e  # sockets, processes or served servers

COUNTER = CalibratedCounter(TiktokenCounter("o200k_base"), 1.1)
MODEL = "gemini-2.5-flash"


class GeminiDouble:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, Any], str | None]] = []
        self.prompt_tokens = 50
        self.end_early = False

    def reply(self, text: str, final: bool) -> dict[str, Any]:
        cand: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
        out: dict[str, Any] = {"candidates": [cand], "modelVersion": MODEL}
        if final:
            cand["finishReason"] = "STOP"
            out["usageMetadata"] = {
                "promptTokenCount": self.prompt_tokens,
                "candidatesTokenCount": 2,
                "totalTokenCount": self.prompt_tokens + 2,
            }
        return out

    async def handle(self, request: Request) -> Response:
        body = json.loads(await request.body())
        path = request.url.path
        self.seen.append((path, request.url.query, body, request.headers.get("x-goog-api-key")))
        if path.endswith(":countTokens"):
            return JSONResponse({"totalTokens": self.prompt_tokens})
        if path.endswith(":streamGenerateContent"):
            chunks = [self.reply("o", False)] + ([] if self.end_early else [self.reply("k", True)])

            async def gen() -> Any:
                for c in chunks:
                    yield b"data: " + json.dumps(c).encode() + b"\r\n\r\n"

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse(self.reply("ok", True))

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/{rest:path}", self.handle, methods=["POST"])])


@pytest.fixture
def running() -> Iterator[tuple[str, Any, GeminiDouble]]:
    d = GeminiDouble()
    with serve(d.app()) as durl:
        app = create_app(
            Settings(
                upstreams={"gemini": {"base_url": durl}},
                models=[
                    {
                        "match": "gemini-*",
                        "label": "gemini",
                        "window": 2000,
                        "max_output_tokens": 200,
                        "tokenizer": {
                            "kind": "calibrated",
                            "encoding": "o200k_base",
                            "factor": 1.1,
                        },
                    }
                ],
                workloads=["default", "strict"],
                enforcement={"mode": "observe", "workloads": {"strict": {"mode": "enforce"}}},
            )
        )
        with serve(app) as url:
            yield url, app.state.sidecar, d


def client(url: str, headers: dict[str, str] | None = None) -> genai.Client:
    return genai.Client(
        api_key="goog-key",
        http_options=types.HttpOptions(base_url=url, headers=headers or {}),
    )


def sample(state: Any, name: str, **labels: str) -> float:
    return state.metrics.registry.get_sample_value(name, labels) or 0.0


def ok(api: str) -> dict[str, str]:
    return {"model": "gemini", "workload": "default", "api": api, "outcome": "ok"}


def test_generate_stream_and_count_are_measured(running: tuple[str, Any, GeminiDouble]) -> None:
    url, state, d = running
    c = client(url)
    r = c.models.generate_content(
        model=MODEL,
        contents="What is the fee?",
        config=types.GenerateContentConfig(system_instruction="Be brief.", max_output_tokens=50),
    )
    assert r.text == "ok"
    path, _, body, key = d.seen[-1]
    assert path.endswith(f"/models/{MODEL}:generateContent") and key == "goog-key"
    assert body["systemInstruction"]["parts"][0]["text"] == "Be brief."
    assert sample(state, "llm_context_requests_total", **ok("gemini_generate")) == 1
    text = "".join(
        ch.text or "" for ch in c.models.generate_content_stream(model=MODEL, contents="hi")
    )
    assert text == "ok"
    assert d.seen[-1][1] == "alt=sse"
    assert sample(state, "llm_context_requests_total", **ok("gemini_generate")) == 2
    assert c.models.count_tokens(model=MODEL, contents="count me").total_tokens == 50
    assert sample(state, "llm_context_requests_total", **ok("gemini_count_tokens")) == 1
    assert sample(state, "llm_context_token_estimate_error_ratio_count", model="gemini") >= 1
    # the raw route: the sidecar's headers, the local count
    raw = httpx.post(
        url + f"/v1beta/models/{MODEL}:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]},
        headers={"x-goog-api-key": "k"},
    )
    local = count_gemini(
        {"contents": [{"role": "user", "parts": [{"text": "hello there"}]}]}, COUNTER
    )
    assert int(raw.headers["x-ceiling-input-tokens"]) == local.total


def test_over_budget_is_rejected_in_googles_shape(running: tuple[str, Any, GeminiDouble]) -> None:
    url, _, d = running
    c = client(url, {"x-ceiling-workload": "strict"})
    with pytest.raises(genai_errors.ClientError) as e:
        c.models.generate_content(model=MODEL, contents="word " * 3000)
    assert e.value.code == 400 and "exceeds the maximum number of tokens" in str(e.value)
    assert not d.seen, "never forwarded"
    bad = httpx.post(url + f"/v1beta/models/{MODEL}:generateContent", json={"contents": 5})
    assert bad.status_code == 400 and bad.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_a_stream_cut_before_its_finish_raises(running: tuple[str, Any, GeminiDouble]) -> None:
    url, state, d = running
    d.end_early = True

    c = client(url)

    def consume() -> str:
        return "".join(
            ch.text or "" for ch in c.models.generate_content_stream(model=MODEL, contents="hi")
        )

    with pytest.raises((genai_errors.APIError, httpx.HTTPError)):
        consume()
    cut = {
        "model": "gemini",
        "workload": "default",
        "api": "gemini_generate",
        "outcome": "upstream_truncated",
    }
    assert sample(state, "llm_context_requests_total", **cut) == 1


def test_other_gemini_routes_pass_through(running: tuple[str, Any, GeminiDouble]) -> None:
    url, state, d = running
    r = httpx.post(
        url + "/v1beta/cachedContents", json={"model": MODEL}, headers={"x-goog-api-key": "k"}
    )
    assert r.status_code == 200 and d.seen[-1][0] == "/v1beta/cachedContents"
    assert (
        sample(
            state,
            "llm_context_passthrough_requests_total",
            upstream="gemini",
            route="cached_contents",
            outcome="ok",
        )
        == 1
    )
