"""The sidecar in front of an OpenAI-compatible upstream, driven by the official openai SDK."""

from __future__ import annotations

import logging
from typing import Any

import openai
import orjson
import pytest

from context_ceiling.core.tokenizers import TiktokenCounter
from context_ceiling.formats.openai_chat import count as count_openai
from context_ceiling.formats.openai_chat import prepare_stream
from tests.conftest import Running

MESSAGES: list[Any] = [
    {"role": "system", "content": "You answer questions about service contracts."},
    {"role": "user", "content": "What is the renewal fee of contract A-17?"},
]


#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


def client(sc: Running, **kw: Any) -> openai.OpenAI:
    return sc.openai(
        api_key="sk-test-SECRET-123",
        max_retries=0,
        **kw,
    )


def request_logs(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.fields for r in caplog.records if r.name == "ceiling.requests"]  # type: ignore[attr-defined]


def test_non_stream_body_is_the_upstreams_and_metrics_hold(
    sidecar: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ceiling.requests")
    raw = client(sidecar).chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=MESSAGES,
        extra_headers={"X-Ceiling-Workload": "rag", "OpenAI-Organization": "org-1"},
    )
    assert raw.http_response.content == sidecar.double.last_bodies["openai"]
    completion = raw.parse()
    assert completion.choices[0].message.content == "The answer is 42."
    # what the upstream got: the same bytes the SDK sent, auth untouched, our header gone
    got = sidecar.double.received[-1]
    assert got.json["messages"] == MESSAGES
    assert got.headers["authorization"] == "Bearer sk-test-SECRET-123"
    assert got.headers["openai-organization"] == "org-1"
    assert "x-ceiling-workload" not in got.headers
    # the count of a request of known size
    expected = count_openai({"messages": MESSAGES}, TiktokenCounter("o200k_base")).total
    assert raw.headers["x-ceiling-input-tokens"] == str(expected)
    util = expected / 128000
    s = sidecar.sample
    assert s("llm_context_utilization_ratio_count", model="gpt-4o", workload="rag") == 1
    assert s("llm_context_utilization_ratio_sum", model="gpt-4o", workload="rag") == pytest.approx(
        util
    )
    assert s("llm_context_utilization_ratio_bucket", model="gpt-4o", workload="rag", le="0.05") == 1
    assert (
        s(
            "llm_context_requests_total",
            model="gpt-4o",
            workload="rag",
            api="openai_chat",
            outcome="ok",
        )
        == 1
    )
    assert s("llm_context_window_tokens", model="gpt-4o") == 128000
    assert s("llm_context_input_tokens_sum", model="gpt-4o", workload="rag", component="system") > 0  # type: ignore[operator]
    # (estimate - reported) / reported is far below -0.5 here: the double reports 1234
    assert (expected - 1234) / 1234 < -0.5
    assert s("llm_context_token_estimate_error_ratio_bucket", model="gpt-4o", le="-0.5") == 1
    assert s("llm_context_upstream_duration_seconds_count", model="gpt-4o", api="openai_chat") == 1
    [line] = request_logs(caplog)
    assert line["input_tokens_estimated"] == expected
    assert line["input_tokens_reported"] == 1234
    assert line["utilization"] == pytest.approx(util, abs=1e-5)
    assert line["window"] == 128000
    assert line["workload"] == "rag"
    assert line["finish_reason"] == "stop"
    assert line["output_tokens"] == 7
    assert line["status"] == 200
    assert sum(line["components"].values()) == expected
    text = "\n".join(r.getMessage() + str(getattr(r, "fields", "")) for r in caplog.records)
    assert "SECRET" not in text and "renewal fee" not in text


def test_stream_without_include_usage_is_unchanged_for_the_client(sidecar: Running) -> None:
    h = sidecar.http
    body = {"model": "gpt-4o", "messages": MESSAGES, "stream": True}
    r = h.post(sidecar.url + "/v1/chat/completions", json=body, headers={"x-double-split": "1"})
    upstream_bytes = sidecar.double.last_bodies["stream"]
    # the upstream was asked for usage ...
    assert sidecar.double.received[-1].json["stream_options"] == {"include_usage": True}
    assert b'"usage":{' in upstream_bytes
    # ... but the client gets exactly what the upstream would have sent without the option
    expected = sidecar.double.openai_events("gpt-4o", include_usage=False, n=5)
    assert r.content == b"".join(expected)
    assert sidecar.sample("llm_context_token_estimate_error_ratio_count", model="gpt-4o") == 1
    assert sidecar.sample("llm_context_output_tokens_sum", model="gpt-4o", workload="default") == 7


def test_include_usage_is_added_to_the_clients_bytes_untouched(sidecar: Running) -> None:
    """The option is spliced into the body as sent: key order, spacing and escapes of every
    other member reach the upstream byte for byte (no re-serialization)."""
    sent = (
        b' {"model" : "gpt-4o",  "stream": true, "messages": [{"role": "user", '
        b'"content": "caf\\u00e9 \\"quoted\\""}], "temperature": 0.5}'
    )
    h = sidecar.http
    r = h.post(
        sidecar.url + "/v1/chat/completions",
        content=sent,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200
    got = sidecar.double.received[-1].body
    assert got == b' {"stream_options":{"include_usage":true},' + sent[2:]
    assert orjson.loads(got) == orjson.loads(sent) | {"stream_options": {"include_usage": True}}


def test_stream_with_include_usage_passes_through_byte_for_byte(
    sidecar: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="ceiling.requests")
    stream = client(sidecar).chat.completions.create(
        model="gpt-4o", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 1234
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == "tok0 tok1 tok2 tok3 tok4 "
    )
    h = sidecar.http
    body = {
        "model": "gpt-4o",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = h.post(sidecar.url + "/v1/chat/completions", json=body)
    assert r.content == sidecar.double.last_bodies["stream"]
    assert r.headers["content-type"].startswith("text/event-stream")
    line = request_logs(caplog)[-1]
    assert (
        line["stream"] is True
        and line["input_tokens_reported"] == 1234
        and line["finish_reason"] == "stop"
    )


def test_sdk_stream_without_usage(sidecar: Running) -> None:
    chunks = list(
        client(sidecar).chat.completions.create(model="gpt-4o", messages=MESSAGES, stream=True)
    )
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_unknown_model_and_workload_are_bounded(sidecar: Running) -> None:
    client(sidecar).chat.completions.create(
        model="some-new-model-xyz",
        messages=MESSAGES,
        extra_headers={"X-Ceiling-Workload": "user-4711"},
    )
    s = sidecar.sample
    assert (
        s(
            "llm_context_requests_total",
            model="other",
            workload="default",
            api="openai_chat",
            outcome="ok",
        )
        == 1
    )
    # no window known: no utilization recorded, but the components still are
    assert s("llm_context_utilization_ratio_count", model="other", workload="default") is None
    assert (
        s(
            "llm_context_input_tokens_count",
            model="other",
            workload="default",
            component="latest_user",
        )
        == 1
    )


def test_glob_entry_labels_with_its_label(sidecar: Running) -> None:
    client(sidecar).chat.completions.create(model="gpt-4o-mini-2024-07-18", messages=MESSAGES)
    assert (
        sidecar.sample(
            "llm_context_requests_total",
            model="gpt-4o-mini",
            workload="default",
            api="openai_chat",
            outcome="ok",
        )
        == 1
    )


def test_models_passthrough(sidecar: Running) -> None:
    models = client(sidecar).models.list()
    assert [m.id for m in models] == ["gpt-4o"]
    assert sidecar.double.received[-1].headers["authorization"] == "Bearer sk-test-SECRET-123"


def test_request_body_is_forwarded_byte_for_byte(sidecar: Running) -> None:
    raw = orjson.dumps(
        {"model": "gpt-4o", "messages": MESSAGES, "temperature": 0.0, "seed": 7},
        option=orjson.OPT_INDENT_2,
    )
    h = sidecar.http
    h.post(
        sidecar.url + "/v1/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert sidecar.double.received[-1].body == raw


def test_repeated_text_is_counted_from_the_cache_with_the_same_result(
    make_sidecar: Any,
) -> None:
    system = "You answer questions about service contracts. Be precise and cite clauses. " * 20
    history = [
        {"role": "system", "content": system},
        {
            "role": "user",
            "content": "<document id='1'>" + "Clause 7: fee 120 EUR. " * 60 + "</document> fee?",
        },
    ]
    sc = make_sidecar()
    c = client(sc)
    first = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)  # type: ignore[arg-type]
    hits = sc.sample("llm_context_count_cache_lookups_total", result="hit") or 0
    second = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)  # type: ignore[arg-type]
    # the long texts (system prompt, the retrieved document) were found, and the count is the same
    assert (sc.sample("llm_context_count_cache_lookups_total", result="hit") or 0) >= hits + 2
    assert first.headers["x-ceiling-input-tokens"] == second.headers["x-ceiling-input-tokens"]
    expected = count_openai({"messages": history}, TiktokenCounter("o200k_base")).total
    assert second.headers["x-ceiling-input-tokens"] == str(expected)
    assert (sc.sample("llm_context_count_cache_bytes") or 0) > len(system)
    # off: no cache, no cache metrics, same count
    off = make_sidecar(counting={"cache_mib": 0})
    r = client(off).chat.completions.with_raw_response.create(model="gpt-4o", messages=history)  # type: ignore[arg-type]
    assert r.headers["x-ceiling-input-tokens"] == str(expected)
    assert off.sample("llm_context_count_cache_lookups_total", result="hit") is None


def test_upstream_cookies_reach_the_client_but_are_never_replayed_upstream(
    sidecar: Running,
) -> None:
    first = sidecar.http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES},
        headers={"authorization": "Bearer sk-client-a"},
    )
    assert "__cf_bm=double-session" in first.headers["set-cookie"]  # passed through to its client
    sidecar.http.cookies.clear()  # client B is another client: it never had A's cookie
    sidecar.http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": MESSAGES},
        headers={"authorization": "Bearer sk-client-b"},
    )
    assert "cookie" not in sidecar.double.received[-1].headers  # client B never gets A's cookie


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        (b'{"stream":true}', b'{"stream_options":{"include_usage":true},"stream":true}'),
        (b"\n\t{ }", b'\n\t{"stream_options":{"include_usage":true} }'),
        (b'{"stream_options":{"x":1},"stream":true}', None),  # merged: serialized again
        (b'{"stream_options":null,"stream":true}', None),
    ],
)
def test_include_usage_is_spliced_into_the_clients_bytes(body: bytes, sent: bytes | None) -> None:
    obj = orjson.loads(body)
    out, injected = prepare_stream(obj, body)
    assert injected and out == sent
    assert obj["stream_options"]["include_usage"] is True
    assert orjson.loads(out or orjson.dumps(obj)) == obj
    if b'"x"' in body:
        assert obj["stream_options"] == {"x": 1, "include_usage": True}


def test_include_usage_asked_by_the_client_is_left_alone() -> None:
    body = b'{"stream":true,"stream_options":{"include_usage":true}}'
    obj = orjson.loads(body)
    assert prepare_stream(obj, body) == (body, False)
    assert prepare_stream(obj, None) == (None, False)
    fresh = {"stream": True}
    assert prepare_stream(fresh, None) == (None, True)  # no bytes to splice: serialize
    assert fresh["stream_options"] == {"include_usage": True}  # type: ignore[comparison-overlap]
