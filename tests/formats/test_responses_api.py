"""The OpenAI Responses API, measured and enforced like chat completions, with the official SDK.

The upstream is a loopback stand-in for OpenAI's Responses endpoint (a test double): it records
the body and answers with a response object, or a stream of response events.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.core.trim import Policy
from context_ceiling.formats import fit
from context_ceiling.formats.responses import count as count_responses
from context_ceiling.sidecar.app import create_app
from context_ceiling.sidecar.config import Settings
from testkit.asgi import lifespan, read_body
from testkit.serving import serve

ENC = TiktokenCounter("o200k_base")


def response_obj(model: str, input_tokens: int) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": model,
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": 2,
            "total_tokens": input_tokens + 2,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


class ResponsesDouble:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.input_tokens = 100

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = json.loads(await read_body(receive))
        self.bodies.append(body)
        if scope["path"].endswith("/input_tokens"):
            out = {"object": "response.input_tokens", "input_tokens": self.input_tokens}
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": json.dumps(out).encode()})
            return
        obj = response_obj(body.get("model", "m"), self.input_tokens)
        if body.get("stream"):
            events = [
                (
                    "response.created",
                    {
                        "type": "response.created",
                        "response": obj | {"status": "in_progress", "usage": None},
                    },
                ),
                (
                    "response.output_text.delta",
                    {
                        "type": "response.output_text.delta",
                        "delta": "ok",
                        "item_id": "msg_1",
                        "output_index": 0,
                        "content_index": 0,
                    },
                ),
                ("response.completed", {"type": "response.completed", "response": obj}),
            ]
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")],
                }
            )
            for name, data in events:
                await send(
                    {
                        "type": "http.response.body",
                        "body": f"event: {name}\ndata: {json.dumps(data)}\n\n".encode(),
                        "more_body": True,
                    }
                )
            await send({"type": "http.response.body", "body": b""})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": json.dumps(obj).encode()})


@pytest.fixture
def running() -> Iterator[tuple[str, Any, ResponsesDouble]]:
    d = ResponsesDouble()
    with serve(d) as durl:
        app = create_app(
            Settings(
                upstreams={"openai": {"base_url": durl + "/v1"}},
                models=[{"match": "gpt-4o", "window": 4000, "max_output_tokens": 500}],
                workloads=["default", "agent"],
                enforcement={"mode": "observe", "workloads": {"agent": {"mode": "enforce"}}},
            )
        )
        with serve(app) as url:
            yield url, app.state.sidecar, d


def sample(state: Any, name: str, **labels: str) -> float:
    return state.metrics.registry.get_sample_value(name, labels) or 0.0


def agent_input(rng: random.Random, turns: int, out_words: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "developer", "content": "You are an agent."}]
    call = 0
    for t in range(turns):
        items.append({"role": "user", "content": [{"type": "input_text", "text": f"task {t}"}]})
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{t}",
                "summary": [{"type": "summary_text", "text": "think"}],
            }
        )
        for _ in range(rng.randint(1, 2)):
            cid = f"call_{call}"
            call += 1
            items.append(
                {"type": "function_call", "call_id": cid, "name": "read", "arguments": "{}"}
            )
            items.append(
                {"type": "function_call_output", "call_id": cid, "output": "line " * out_words}
            )
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": "done"}]})
    items.append({"role": "user", "content": "and now?"})
    return items


def valid(items: list[dict[str, Any]]) -> bool:
    calls = [i for i in items if i.get("type") == "function_call"]
    outs = [i for i in items if i.get("type") == "function_call_output"]
    ids = [c["call_id"] for c in calls]
    if sorted(ids) != sorted(o["call_id"] for o in outs):
        return False
    return all(  # an output comes after its call
        it["call_id"] in [c.get("call_id") for c in items[:k]]
        for k, it in enumerate(items)
        if it.get("type") == "function_call_output"
    )


@pytest.mark.e2e
def test_responses_are_measured_with_the_sdk(running: tuple[str, Any, ResponsesDouble]) -> None:
    url, state, d = running
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", max_retries=0)
    r = client.responses.with_raw_response.create(
        model="gpt-4o", instructions="Be brief.", input="What is the fee?"
    )
    assert r.parse().output_text == "ok"
    local = count_responses(d.bodies[-1], ENC).total
    assert int(r.headers["x-ceiling-input-tokens"]) == local
    assert float(r.headers["x-ceiling-utilization"]) == pytest.approx(local / 4000, abs=1e-4)
    ok = {"model": "gpt-4o", "workload": "default", "api": "openai_responses", "outcome": "ok"}
    assert sample(state, "llm_context_requests_total", **ok) == 1
    # streamed: usage read from response.completed
    with client.responses.stream(model="gpt-4o", input="again") as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert text == "ok"
    assert sample(state, "llm_context_requests_total", **ok) == 2
    assert sample(state, "llm_context_output_tokens_count", model="gpt-4o", workload="default") == 2


@pytest.mark.e2e
def test_previous_response_id_is_a_partial_count_measured_from_usage(
    running: tuple[str, Any, ResponsesDouble],
) -> None:
    url, state, d = running
    d.input_tokens = 3000  # the provider holds the earlier turns
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", max_retries=0)
    client.responses.create(model="gpt-4o", input="next", previous_response_id="resp_0")
    # the utilization histogram got the reported 3000 / 4000, not the local handful of tokens
    assert (
        sample(
            state,
            "llm_context_utilization_ratio_bucket",
            model="gpt-4o",
            workload="default",
            le="0.7",
        )
        == 0
    )
    assert (
        sample(state, "llm_context_utilization_ratio_count", model="gpt-4o", workload="default")
        == 1
    )
    assert sample(state, "llm_context_token_estimate_error_ratio_count", model="gpt-4o") == 0


@pytest.mark.e2e
def test_enforcement_trims_function_outputs_and_keeps_pairs(
    running: tuple[str, Any, ResponsesDouble],
) -> None:
    url, _, d = running
    client = openai.OpenAI(base_url=url + "/v1", api_key="sk-x", max_retries=0)
    items = agent_input(random.Random(1), 5, 1200)
    body = {"model": "gpt-4o", "input": items, "max_output_tokens": 300}
    assert count_responses(body, ENC).total > 4000
    r = client.responses.with_raw_response.create(
        model="gpt-4o",
        input=items,  # type: ignore[arg-type]
        max_output_tokens=300,
        extra_headers={"x-ceiling-workload": "agent"},
    )
    assert r.status_code == 200
    sent = d.bodies[-1]
    assert count_responses(sent, ENC).total <= 3700 == 4000 - 300
    assert int(r.headers["x-ceiling-input-tokens"]) == count_responses(sent, ENC).total
    assert valid(sent["input"]) and sent["input"][-1] == items[-1]


@pytest.mark.parametrize("seed", range(40))
def test_responses_trimming_properties(seed: int) -> None:
    rng = random.Random(seed)
    items = agent_input(rng, rng.randint(1, 6), rng.randint(10, 400))
    body = {"model": "gpt-4o", "instructions": "x", "input": items}
    total = count_responses(body, ENC).total
    budget = int(total * rng.uniform(0.05, 1.0))
    policy = Policy(
        tool_result_max_tokens=rng.choice([16, 64, 256]), keep_first_user=rng.random() < 0.5
    )
    out, report = fit(body, shape="responses", budget=budget, policy=policy)
    assert body["input"] == items, "input never mutated"
    assert valid(out["input"]), "every call keeps its output"
    assert report.after == count_responses(out, ENC).total
    assert report.fits == (report.after <= budget)
    assert out["input"][0] == items[0] and out["input"][-1] == items[-1]
    reasoning = [i["id"] for i in out["input"] if i.get("type") == "reasoning"]
    for rid in reasoning:  # a kept reasoning item still has its turn's calls after it
        k = next(n for n, i in enumerate(out["input"]) if i.get("id") == rid)
        assert out["input"][k + 1].get("type") == "function_call"


@pytest.mark.e2e
def test_the_input_token_count_endpoint_feeds_the_estimate_error(
    running: tuple[str, Any, ResponsesDouble],
) -> None:
    import httpx

    url, state, d = running
    body = {"model": "gpt-4o", "input": "how many tokens is this?"}
    d.input_tokens = count_responses(body, ENC).total + 2
    r = httpx.post(url + "/v1/responses/input_tokens", json=body)
    assert r.status_code == 200 and r.json()["input_tokens"] == d.input_tokens
    assert sample(state, "llm_context_token_estimate_error_ratio_count", model="gpt-4o") == 1
    labels = {
        "model": "gpt-4o",
        "workload": "default",
        "api": "openai_responses_input_tokens",
        "outcome": "ok",
    }
    assert sample(state, "llm_context_requests_total", **labels) == 1


def test_a_responses_stream_cut_short_ends_with_an_error_the_sdk_raises() -> None:
    """The event the sidecar appends to a Responses stream it cannot finish is the API's own
    ``event: error``, and the official SDK raises on it."""
    import httpx
    import openai

    from context_ceiling.formats.responses import ResponsesStreamTap

    tail = ResponsesStreamTap.error_event("the upstream stream ended early")
    assert tail.startswith(b"event: error\ndata: ")

    def hosted_double(_: httpx.Request) -> httpx.Response:
        created = b'event: response.created\ndata: {"type":"response.created","sequence_number":0,"response":{"id":"r","object":"response","created_at":1,"status":"in_progress","model":"gpt-4o","output":[],"parallel_tool_calls":true,"tool_choice":"auto","tools":[]}}\n\n'
        return httpx.Response(
            200, content=created + tail, headers={"content-type": "text/event-stream"}
        )

    client = openai.OpenAI(
        api_key="k",
        base_url="http://double/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(hosted_double)),  # type: ignore[arg-type]
    )
    with pytest.raises(openai.APIError, match="ended early"):
        for _ in client.responses.create(model="gpt-4o", input="hi", stream=True):
            pass
