"""Over-ceiling actions: a request over its model's ceiling is sent to the first fallback whose
own measured ceiling it fits (counted with that model's tokenizer), rewritten to that model, and
answered by it as the client's SDK expects; one that fits no model is rejected once, naming the
models tried; ``reject`` and ``trim_then_fallback`` do what they say; routing never loops."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from google import genai
from google.genai import types as genai_types
from openai.types.chat import ChatCompletionMessageParam
from starlette.testclient import TestClient

from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.doubles.answer_provider import AnswerProviderDouble
from testkit.traffic.ceiling_docs import doc, entry

UPSTREAM = "http://upstream.test"
TOKEN = "admin-tok"

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


@dataclass
class Recording:
    """An ASGI wrapper that records the path and body of every request the upstream gets."""

    app: Any
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    #: models the upstream fails (a 503 in OpenAI's error shape)
    failing: set[str] = field(default_factory=set)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        parsed = orjson.loads(body) if body else {}
        self.seen.append((scope["path"], parsed))
        if parsed.get("model") in self.failing:
            error = orjson.dumps({"error": {"message": "the fallback is overloaded", "type": "x"}})
            await send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": error})
            return
        sent = False

        async def replay() -> MutableMapping[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _model(name: str, window: int, **kw: Any) -> dict[str, Any]:
    return {"match": name, "window": window, "max_output_tokens": 500, **kw}


MODELS = [
    _model("small", 8000, fallback=["small", "mid", "unknown-model", "big"]),
    _model("mid", 16000, fallback=["small"]),  # a fallback's own list is never followed
    _model("big", 128000),
    _model("claude-small", 8000, fallback=["claude-big"]),
    _model("claude-big", 200000),
    _model("gemini-small", 8000, fallback=["gemini-big"]),
    _model("gemini-big", 1000000),
    _model("trimmer", 8000, over_ceiling="trim_then_fallback", fallback=["big"]),
    _model("refuser", 8000, over_ceiling="reject"),
    _model("flaky-small", 8000, fallback=["flaky-big"]),
    _model("flaky-big", 128000),
    _model("lone", 8000, fallback=["unmeasured"]),
    _model("unmeasured", 1000000),  # no ceiling measured: judged by its window
]
CEILINGS = doc(
    3,
    *(
        entry(model=m, workload="rag", tokens=t, window=w)
        for m, t, w in (
            ("small", 1000, 8000),
            ("mid", 2000, 16000),
            ("big", 40000, 128000),
            ("claude-small", 1000, 8000),
            ("claude-big", 40000, 200000),
            ("gemini-small", 1000, 8000),
            ("gemini-big", 40000, 1000000),
            ("trimmer", 1000, 8000),
            ("refuser", 1000, 8000),
            ("flaky-small", 1000, 8000),
            ("flaky-big", 40000, 128000),
            ("lone", 1000, 8000),
        )
    ),
)


@dataclass
class Setup:
    http: TestClient
    upstream: Recording
    state: Any

    def routed(self, to: str, frm: str) -> float:
        v = self.state.metrics.registry.get_sample_value(
            "llm_context_routed_total", {"from_model": frm, "to_model": to, "workload": "rag"}
        )
        return v or 0.0


@pytest.fixture
def sc() -> Iterator[Setup]:
    upstream = Recording(AnswerProviderDouble().app())
    settings = Settings(
        upstreams={
            "openai": {"base_url": UPSTREAM + "/v1"},
            "anthropic": {"base_url": UPSTREAM},
            "gemini": {"base_url": UPSTREAM},
        },
        models=MODELS,
        workloads=["default", "rag"],
        admin_token=TOKEN,
        enforcement={
            "mode": "observe",
            "default_output_reservation": 200,
            "workloads": {"rag": {"mode": "enforce", "over_ceiling": "fallback"}},
        },
    )
    app = create_app(settings, httpx.ASGITransport(app=upstream))
    with TestClient(app, base_url="http://sidecar.test") as http:
        put = http.put(
            "/admin/ceilings", json=CEILINGS, headers={"authorization": f"Bearer {TOKEN}"}
        )
        assert put.status_code == 200, put.text
        yield Setup(http, upstream, app.state.sidecar)


RAG = {"x-ceiling-workload": "rag"}


def words(n: int) -> str:
    return " ".join(f"clause{i % 97} renews" for i in range(n // 2))


def oai(sc: Setup) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://sidecar.test/v1",
        api_key="k",
        max_retries=0,
        http_client=sc.http,
        default_headers=RAG,
    )


def test_a_request_over_its_ceiling_goes_to_the_first_fallback_it_fits(sc: Setup) -> None:
    text = words(3000)  # over small's 1000 and mid's 2000, within big's 40000
    raw = oai(sc).chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": text}], max_tokens=50
    )
    answer = raw.parse()
    assert answer.choices[0].message.content  # a normal answer for the SDK
    assert raw.headers["x-ceiling-routed-to"] == "big"
    assert raw.headers["x-ceiling-routed-from"] == "small"
    assert raw.headers["x-ceiling-routed-by"] == "ceiling"
    assert raw.headers["x-ceiling-ceiling-tokens"] == "40000"  # the model that answered
    assert raw.headers["x-ceiling-trimmed-tokens"] == "0"
    path, body = sc.upstream.seen[-1]
    assert path == "/v1/chat/completions" and body["model"] == "big"
    assert body["messages"][0]["content"] == text, "sent whole, not trimmed"
    assert sc.routed("big", "small") == 1
    over = sc.state.metrics.registry.get_sample_value(
        "llm_context_over_ceiling_total", {"model": "small", "workload": "rag", "action": "routed"}
    )
    assert over == 1
    # usage and metrics follow the model that answered
    assert (
        sc.state.metrics.registry.get_sample_value(
            "llm_context_requests_total",
            {"model": "big", "workload": "rag", "api": "openai_chat", "outcome": "ok"},
        )
        == 1
    )


def test_a_request_that_fits_no_model_is_rejected_once_naming_the_models(sc: Setup) -> None:
    before = len(sc.upstream.seen)
    with pytest.raises(openai.BadRequestError) as err:
        oai(sc).chat.completions.create(
            model="small", messages=[{"role": "user", "content": words(50000)}], max_tokens=50
        )
    message = str(err.value)
    assert "mid (" in message and "big (" in message and "unknown-model (no model entry)" in message
    assert err.value.code == "context_length_exceeded"
    assert len(sc.upstream.seen) == before, "nothing was forwarded"


def test_within_its_ceiling_a_request_is_not_routed(sc: Setup) -> None:
    raw = oai(sc).chat.completions.with_raw_response.create(
        model="small", messages=[{"role": "user", "content": "hello"}], max_tokens=50
    )
    assert "x-ceiling-routed-to" not in raw.headers
    assert sc.upstream.seen[-1][1]["model"] == "small"


def test_a_routed_stream_is_the_fallbacks_stream(sc: Setup) -> None:
    stream = oai(sc).chat.completions.create(
        model="small",
        messages=[{"role": "user", "content": words(3000)}],
        max_tokens=50,
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text
    assert sc.upstream.seen[-1][1]["model"] == "big"
    assert sc.routed("big", "small") == 1


def test_anthropic_requests_route_to_an_anthropic_fallback(sc: Setup) -> None:
    client = anthropic.Anthropic(
        base_url="http://sidecar.test",
        api_key="k",
        max_retries=0,
        http_client=sc.http,
        default_headers=RAG,
    )
    raw = client.messages.with_raw_response.create(
        model="claude-small",
        max_tokens=50,
        messages=[{"role": "user", "content": words(3000)}],
    )
    assert raw.parse().content
    assert raw.headers["x-ceiling-routed-to"] == "claude-big"
    assert sc.upstream.seen[-1] == ("/v1/messages", sc.upstream.seen[-1][1])
    assert sc.upstream.seen[-1][1]["model"] == "claude-big"


def test_gemini_requests_route_by_rewriting_the_model_in_the_path(sc: Setup) -> None:
    client = genai.Client(
        api_key="k",
        http_options=genai_types.HttpOptions(
            base_url="http://sidecar.test", headers=RAG, httpx_client=sc.http
        ),
    )
    answer = client.models.generate_content(model="gemini-small", contents=words(3000))
    assert answer.text
    path, _ = sc.upstream.seen[-1]
    assert path.endswith("/models/gemini-big:generateContent"), path
    assert sc.routed("gemini-big", "gemini-small") == 1


def test_reject_refuses_what_trimming_could_fit(sc: Setup) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        oai(sc).chat.completions.create(
            model="refuser", messages=[{"role": "user", "content": words(3000)}], max_tokens=50
        )
    assert "over_ceiling: reject" in str(err.value)


def test_trim_then_fallback_trims_within_the_stated_loss_then_falls_back(sc: Setup) -> None:
    def rag(n_docs: int) -> list[ChatCompletionMessageParam]:
        docs = "\n".join(f'<document id="{i}">' + words(200) + "</document>" for i in range(n_docs))
        return [{"role": "user", "content": docs + "\nWhich clause renews?"}]

    # trimming fits it, and any trim is allowed: trimmed, not routed
    raw = oai(sc).chat.completions.with_raw_response.create(
        model="trimmer", messages=rag(8), max_tokens=50
    )
    assert int(raw.headers["x-ceiling-trimmed-tokens"]) > 0
    assert "x-ceiling-routed-to" not in raw.headers
    # trimming cannot fit it (one document bigger than the ceiling): routed
    raw = oai(sc).chat.completions.with_raw_response.create(
        model="trimmer", messages=[{"role": "user", "content": words(3000)}], max_tokens=50
    )
    assert raw.headers["x-ceiling-routed-to"] == "big"


def test_a_stated_loss_sends_a_heavy_trim_to_the_fallback(sc: Setup) -> None:
    sc.state.settings.enforcement.workloads["rag"].max_trimmed_share = 0.2
    docs = "\n".join(f'<document id="{i}">' + words(200) + "</document>" for i in range(8))
    raw = oai(sc).chat.completions.with_raw_response.create(
        model="trimmer",
        messages=[{"role": "user", "content": docs + "\nWhich clause renews?"}],
        max_tokens=50,
    )
    assert raw.headers["x-ceiling-routed-to"] == "big"
    assert raw.headers["x-ceiling-trimmed-tokens"] == "0"


def test_responses_requests_route_too(sc: Setup) -> None:
    raw = oai(sc).responses.with_raw_response.create(
        model="small", input=words(3000), max_output_tokens=50
    )
    assert raw.parse().output_text
    assert raw.headers["x-ceiling-routed-to"] == "big"
    path, body = sc.upstream.seen[-1]
    assert path == "/v1/responses" and body["model"] == "big"


def test_a_fallback_that_fails_upstream_answers_with_its_own_error(sc: Setup) -> None:
    sc.upstream.failing.add("flaky-big")
    with pytest.raises(openai.InternalServerError) as err:
        oai(sc).chat.completions.create(
            model="flaky-small", messages=[{"role": "user", "content": words(3000)}], max_tokens=5
        )
    assert err.value.status_code == 503 and "the fallback is overloaded" in str(err.value)
    assert err.value.response.headers["x-ceiling-routed-to"] == "flaky-big"
    assert sc.upstream.seen[-1][1]["model"] == "flaky-big"
    failed = sc.state.metrics.registry.get_sample_value(
        "llm_context_requests_total",
        {"model": "flaky-big", "workload": "rag", "api": "openai_chat", "outcome": "upstream_5xx"},
    )
    assert failed == 1


def test_streams_of_every_api_route_and_read_as_the_sdk_expects(sc: Setup) -> None:
    long = words(3000)
    chunks = list(
        oai(sc).responses.create(model="small", input=long, max_output_tokens=50, stream=True)
    )
    assert any(getattr(e, "type", "") == "response.completed" for e in chunks)
    assert sc.upstream.seen[-1][1]["model"] == "big"
    client = anthropic.Anthropic(
        base_url="http://sidecar.test",
        api_key="k",
        max_retries=0,
        http_client=sc.http,
        default_headers=RAG,
    )
    with client.messages.stream(
        model="claude-small", max_tokens=50, messages=[{"role": "user", "content": long}]
    ) as stream:
        assert stream.get_final_text()
    assert sc.upstream.seen[-1][1]["model"] == "claude-big"
    gem = genai.Client(
        api_key="k",
        http_options=genai_types.HttpOptions(
            base_url="http://sidecar.test", headers=RAG, httpx_client=sc.http
        ),
    )
    text = "".join(
        c.text or ""
        for c in gem.models.generate_content_stream(model="gemini-small", contents=long)
    )
    assert text
    assert sc.upstream.seen[-1][0].endswith("/models/gemini-big:streamGenerateContent")
    assert sc.routed("claude-big", "claude-small") == 1
    assert sc.routed("gemini-big", "gemini-small") == 1


def test_a_fallback_without_a_measured_ceiling_is_judged_by_its_window_and_says_so(
    sc: Setup,
) -> None:
    raw = oai(sc).chat.completions.with_raw_response.create(
        model="lone", messages=[{"role": "user", "content": words(3000)}], max_tokens=50
    )
    assert raw.headers["x-ceiling-routed-to"] == "unmeasured"
    assert raw.headers["x-ceiling-routed-by"] == "window"
