"""The sidecar in front of an Anthropic upstream, driven by the official anthropic SDK."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from context_ceiling.core.tokenizers import CalibratedCounter, TiktokenCounter
from context_ceiling.formats.anthropic import count as count_anthropic
from tests.conftest import Running

#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


MESSAGES: list[Any] = [{"role": "user", "content": "Which contract has the lowest renewal fee?"}]


def client(sc: Running) -> anthropic.Anthropic:
    return sc.anthropic(api_key="sk-ant-SECRET-9", max_retries=0)


def expected_tokens(body: dict[str, Any]) -> int:
    return count_anthropic(body, CalibratedCounter(TiktokenCounter("cl100k_base"), 1.1)).total


def test_non_stream(sidecar: Running) -> None:
    sidecar.double.cache_read, sidecar.double.cache_creation = 1000, 200
    raw = client(sidecar).messages.with_raw_response.create(
        model="claude-test-model",
        max_tokens=64,
        system="Answer briefly.",
        messages=MESSAGES,
        extra_headers={"anthropic-beta": "context-1m-2025-08-07", "x-ceiling-workload": "agent"},
    )
    assert raw.http_response.content == sidecar.double.last_bodies["anthropic"]
    msg = raw.parse()
    assert msg.content[0].text == "The answer is 42."  # type: ignore[union-attr]
    got = sidecar.double.received[-1]
    # SDKs send the key as x-api-key or as a bearer token; either is forwarded untouched
    assert "sk-ant-SECRET-9" in (
        got.headers.get("x-api-key", "") + got.headers.get("authorization", "")
    )
    assert got.headers["anthropic-beta"] == "context-1m-2025-08-07"
    assert "anthropic-version" in got.headers
    est = expected_tokens({"system": "Answer briefly.", "messages": MESSAGES})
    assert raw.headers["x-ceiling-input-tokens"] == str(est)
    s = sidecar.sample
    assert s(
        "llm_context_utilization_ratio_sum", model="claude", workload="agent"
    ) == pytest.approx(est / 200000)
    assert (
        s(
            "llm_context_requests_total",
            model="claude",
            workload="agent",
            api="anthropic_messages",
            outcome="ok",
        )
        == 1
    )
    # reported input = input + cache_read + cache_creation = 1234 + 1000 + 200
    assert s("llm_context_token_estimate_error_ratio_bucket", model="claude", le="-0.5") == 1


def test_stream_byte_for_byte_and_usage_from_events(sidecar: Running) -> None:
    with client(sidecar).messages.stream(
        model="claude-x", max_tokens=64, messages=MESSAGES
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "tok0 tok1 tok2 tok3 tok4 "
    assert final.usage.output_tokens == 7
    h = sidecar.http
    r = h.post(
        sidecar.url + "/v1/messages",
        json={"model": "claude-x", "max_tokens": 5, "messages": MESSAGES, "stream": True},
        headers={"x-double-split": "1", "x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    assert r.content == sidecar.double.last_bodies["stream"]
    assert sidecar.double.received[-1].body == r.request.content  # request untouched
    s = sidecar.sample
    assert s("llm_context_output_tokens_sum", model="claude", workload="default") == 14
    assert (
        s(
            "llm_context_requests_total",
            model="claude",
            workload="default",
            api="anthropic_messages",
            outcome="ok",
        )
        == 2
    )


def test_count_tokens_passthrough_records_estimate_error(sidecar: Running) -> None:
    result = client(sidecar).messages.count_tokens(model="claude-x", messages=MESSAGES)
    assert result.input_tokens == 1234
    s = sidecar.sample
    assert (
        s(
            "llm_context_requests_total",
            model="claude",
            workload="default",
            api="anthropic_count_tokens",
            outcome="ok",
        )
        == 1
    )
    assert s("llm_context_token_estimate_error_ratio_count", model="claude") == 1
    # counting is not a generation: it is not in the utilization distribution
    assert s("llm_context_utilization_ratio_count", model="claude", workload="default") is None


def test_models_route_follows_anthropic_headers(sidecar: Running) -> None:
    client(sidecar).models.list()
    assert sidecar.double.received[-1].path == "/v1/models"
    got = sidecar.double.received[-1].headers
    assert "sk-ant-SECRET-9" in (got.get("x-api-key", "") + got.get("authorization", ""))
