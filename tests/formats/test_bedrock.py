"""The Bedrock format module on its own: the event-stream codec held to botocore's decoder,
the Converse count and trimming rules, the routes, the answer reader."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pytest
from botocore.eventstream import EventStreamBuffer
from hypothesis import given
from hypothesis import strategies as st

from context_ceiling import fit
from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.core.utilization import Component
from context_ceiling.formats import API_FORMATS, APIS, FORMATS, anthropic, bedrock, route_for
from context_ceiling.formats.eventstream import EventStreamSplitter, decode, encode, messages
from context_ceiling.sidecar.config import Settings
from testkit.doubles.bedrock_provider import BedrockProviderDouble, frame

O200K = TiktokenCounter("o200k_base")


def test_encoded_messages_decode_with_botocore() -> None:
    raw = encode({":message-type": "exception", ":exception-type": "x"}, b'{"message": "m"}')
    buf = EventStreamBuffer()
    buf.add_data(raw)
    (m,) = list[Any](buf)  # botocore's stubs type the buffer's iteration loosely
    assert m.headers[":message-type"] == "exception" and m.payload == b'{"message": "m"}'


def test_the_double_s_frames_decode_here() -> None:
    d = BedrockProviderDouble()
    got = [decode(f) for f in d.converse_events()]
    assert got[0].event == "messageStart" and got[-1].event == "metadata"
    assert got[-1].json()["usage"]["outputTokens"] == d.output_tokens
    bad = bytearray(d.converse_events()[0])
    bad[-6] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        decode(bytes(bad))


@given(st.lists(st.integers(1, 300), min_size=1, max_size=40), st.integers(0, 5))
def test_the_splitter_yields_each_message_whole_however_the_reads_fall(
    cuts: list[int], n_big: int
) -> None:
    frames = [frame({":event-type": "chunk"}, b"x" * (k * 97 % 500)) for k in range(8 + n_big)]
    stream = b"".join(frames)
    reads, pos = [], 0
    for c in cuts:
        if pos >= len(stream):
            break
        reads.append(stream[pos : pos + c])
        pos += c
    reads.append(stream[pos:])
    s = EventStreamSplitter(10_000)
    out = [f for r in reads if r for f in s.feed(r)]
    assert out == frames and s.idle and s.flush() == b""
    assert EventStreamSplitter.whole(s, stream) and not EventStreamSplitter.whole(s, stream[:-1])


def test_the_registry_knows_bedrock_without_taking_anthropic_s_shape() -> None:
    assert "bedrock" in APIS and APIS["bedrock"].signer is bedrock.SIGNER
    assert FORMATS["anthropic"] is anthropic.FORMAT  # the public fit(shape="anthropic")
    assert FORMATS["converse"] is bedrock.CONVERSE
    assert API_FORMATS["bedrock"].api == "bedrock"
    s = Settings(
        upstreams={"bedrock": {"base_url": "https://bedrock-runtime.eu-west-1.amazonaws.com"}}
    )
    assert s.upstreams.of("bedrock") is not None
    schema = Settings.model_json_schema()
    assert "bedrock" in json.dumps(schema)


@pytest.mark.parametrize(
    ("path", "metric_api", "model"),
    [
        (
            "/model/anthropic.claude-3-haiku-20240307-v1:0/converse",
            "bedrock_converse",
            "anthropic.claude-3-haiku-20240307-v1:0",
        ),
        ("/model/amazon.nova-pro-v1:0/converse-stream", "bedrock_converse", "amazon.nova-pro-v1:0"),
        (
            "/model/arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude-x/converse",
            "bedrock_converse",
            "arn:aws:bedrock:us-east-1:1:inference-profile/us.anthropic.claude-x",
        ),
        (
            "/model/us.anthropic.claude-sonnet-4-5-20250929-v1:0/invoke",
            "bedrock_invoke",
            "us.anthropic.claude-sonnet-4-5-20250929-v1:0",
        ),
        (
            "/model/anthropic.claude-3-haiku/invoke-with-response-stream",
            "bedrock_invoke",
            "anthropic.claude-3-haiku",
        ),
        ("/model/meta.llama3-8b-instruct-v1:0/invoke", None, None),
        (
            "/model/anthropic.claude-3-haiku/count-tokens",
            "bedrock_count_tokens",
            "anthropic.claude-3-haiku",
        ),
    ],
)
def test_routes(path: str, metric_api: str | None, model: str | None) -> None:
    route = route_for(path)
    assert (route.metric_api if route else None) == metric_api
    if route is not None:
        assert route.model({}, path) == model


def _loop(rounds: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"text": "Fix the bug."}]}]
    for k in range(rounds):
        tid = f"t{k}"
        messages += [
            {
                "role": "assistant",
                "content": [
                    {"toolUse": {"toolUseId": tid, "name": "sh", "input": {"cmd": f"cat {k}"}}}
                ],
            },
            {
                "role": "user",
                "content": [
                    {"toolResult": {"toolUseId": tid, "content": [{"text": f"out{k} " * 300}]}}
                ],
            },
        ]
    return {
        "system": [{"text": "You are a coding agent."}],
        "messages": messages,
        "toolConfig": {
            "tools": [{"toolSpec": {"name": "sh", "inputSchema": {"json": {"type": "object"}}}}]
        },
        "inferenceConfig": {"maxTokens": 100},
    }


def test_count_splits_a_converse_body_by_component() -> None:
    body = _loop(3)
    body["messages"][0]["content"].append(
        {"document": {"name": "spec", "format": "txt", "source": {"text": "The spec. " * 50}}}
    )
    c = bedrock.count(body, O200K)
    assert c.components[Component.SYSTEM] > 0 and c.components[Component.TOOL_DEFINITIONS] > 0
    assert c.components[Component.TOOL_RESULTS] > 3 * 300
    assert c.components[Component.RETRIEVED] > 50
    with pytest.raises(ValueError, match=r"messages\[0\].content"):
        bedrock.count({"messages": [{"role": "user", "content": "a string"}]}, O200K)
    assert bedrock.requested_output(body) == 100


def test_fit_clears_old_results_and_keeps_every_pair_and_the_task() -> None:
    body = _loop(10)
    body["system"].append({"cachePoint": {"type": "default"}})
    before = bedrock.count(body, O200K).total
    out, report = fit(body, shape="converse", budget=before // 2)
    assert report.fits and report.after <= before // 2
    assert report.after == bedrock.count(out, O200K).total
    msgs = out["messages"]
    assert out["system"] == body["system"] and msgs[0] == body["messages"][0]
    assert msgs[-1] == body["messages"][-1]  # the newest result whole
    calls = {b["toolUse"]["toolUseId"] for m in msgs for b in m["content"] if "toolUse" in b}
    results = [b["toolResult"] for m in msgs for b in m["content"] if "toolResult" in b]
    assert {r["toolUseId"] for r in results} <= calls
    assert report.removed["clear"] > 0  # older rounds cleared or dropped whole
    assert all(len(r["content"]) == 1 for r in results)


def test_the_answer_reader_reads_whole_and_streamed_answers() -> None:
    d = BedrockProviderDouble()
    whole = bedrock.read_answer([d.converse_body()], stream=False)
    assert whole.text == d.text and whole.finish == "end_turn"
    raw = b"".join(d.converse_events())
    streamed = bedrock.read_answer(bedrock.CONVERSE.framing.events(raw), stream=True)
    assert streamed.text == d.text and streamed.finish == "end_turn"
    tool = [
        {
            "contentBlockStart": {
                "start": {"toolUse": {"toolUseId": "a", "name": "sh"}},
                "contentBlockIndex": 1,
            }
        },
        {"contentBlockDelta": {"delta": {"toolUse": {"input": '{"cmd":'}}, "contentBlockIndex": 1}},
        {"contentBlockDelta": {"delta": {"toolUse": {"input": ' "ls"}'}}, "contentBlockIndex": 1}},
        {"messageStop": {"stopReason": "tool_use"}},
    ]
    a = bedrock.read_answer(tool, stream=True)
    assert a.tool_calls == [("sh", '{"cmd": "ls"}')] and a.finish == "tool_use"
    invoke = b"".join(d.invoke_events("anthropic.claude"))
    objs = list(bedrock.INVOKE.framing.events(invoke))
    assert objs[0]["type"] == "message_start"
    assert anthropic.read_answer(objs, stream=True).text == d.text


def test_the_stream_taps_read_usage_and_end() -> None:
    d = BedrockProviderDouble(input_tokens=500, cache_read=100)
    tap = bedrock.ConverseStreamTap()
    for f in d.converse_events():
        assert tap.on_event(f) == f  # forwarded unchanged
    assert tap.complete and tap.usage.input_tokens == 600 and tap.usage.cached_tokens == 100
    assert tap.usage.output_tokens == d.output_tokens and tap.usage.finish_reason == "end_turn"
    whole = b"".join(d.converse_events())
    assert bedrock.ConverseStreamTap().on_chunk(d.converse_events()[1]) is not None  # a delta
    assert bedrock.ConverseStreamTap().on_chunk(whole) is None  # read event by event
    inv = bedrock.InvokeStreamTap()
    for f in d.invoke_events("anthropic.claude"):
        inv.on_event(f)
    assert inv.complete and inv.usage.input_tokens == 500 and inv.usage.output_tokens == 7
    err = decode(bedrock.ConverseStreamTap.error_event("stop"))
    assert err.kind == "exception" and orjson.loads(err.payload) == {"message": "stop"}
    assert list(messages(whole))[-1].event == "metadata"
    chunk = orjson.loads(decode(d.invoke_events("m")[0]).payload)["bytes"]
    assert orjson.loads(base64.b64decode(chunk))["type"] == "message_start"
