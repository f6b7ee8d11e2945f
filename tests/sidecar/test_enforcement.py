"""Enforcement end to end: the official SDKs -> sidecar -> a loopback upstream that records."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import orjson
import pytest

from context_ceiling.core.counting import DEFAULT_CHUNK_PATTERN
from context_ceiling.core.tokenizers import CalibratedCounter, TiktokenCounter
from context_ceiling.formats.anthropic import count as count_anthropic
from context_ceiling.formats.openai_chat import count as count_openai
from testkit.traffic.ceiling_docs import doc, entry
from tests.conftest import MODELS, Running

#: this module's sidecars run in process (see tests/conftest.py), but for tests marked e2e
IN_PROCESS = True


TOKEN = "admin-tok"
AUTH = {"authorization": f"Bearer {TOKEN}"}
O200K = TiktokenCounter("o200k_base")
CHUNKS = re.compile(DEFAULT_CHUNK_PATTERN)
CLAUSE = (
    "Clause {i}: the renewal fee of contract K-{i} is {f} EUR and the notice period is {n} days. "
)


def rag_messages(n_chunks: int = 10, size: int = 12) -> list[dict[str, Any]]:
    docs = "\n".join(
        f'<document id="{i}">' + CLAUSE.format(i=i, f=100 + i, n=30 + i) * size + "</document>"
        for i in range(n_chunks)
    )
    return [
        {"role": "system", "content": "Answer from the documents."},
        {"role": "user", "content": docs + "\nWhat is the renewal fee of contract K-3?"},
    ]


@pytest.fixture
def enforcing(make_sidecar: Callable[..., Running]) -> Running:
    models = [*MODELS, {"match": "small-model", "window": 2000, "max_output_tokens": 1900}]
    sc = make_sidecar(
        admin_token=TOKEN,
        models=models,
        enforcement={
            "mode": "observe",
            "default_output_reservation": 256,
            "workloads": {
                "rag": {"mode": "enforce"},
                "agent": {"mode": "enforce", "policy": {"tool_result_max_tokens": 64}},
                "off": {"mode": "off"},
            },
        },
        workloads=["default", "rag", "agent", "off"],
    )
    d = doc(1, entry(tokens=2000), entry(model="claude", window=200000, tokens=1500))
    assert sc.http.put("/admin/ceilings", json=d, headers=AUTH).status_code == 200
    return sc


def oa(sc: Running, workload: str) -> openai.OpenAI:
    return sc.openai(default_headers={"x-ceiling-workload": workload})


def test_enforce_trims_lowest_ranked_chunks_to_the_ceiling(enforcing: Running) -> None:
    msgs = rag_messages()
    before = count_openai({"messages": msgs}, O200K, chunks=CHUNKS).total
    assert before > 2000
    raw = oa(enforcing, "rag").chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=msgs,  # type: ignore[arg-type]
        max_tokens=100,
    )
    sent = enforcing.double.received[-1].json
    content = sent["messages"][1]["content"]
    kept = re.findall(r'<document id="(\d+)">', content)
    assert (
        kept == [str(i) for i in range(len(kept))] and 0 < len(kept) < 10
    )  # the last ones went, whole
    assert content.endswith("What is the renewal fee of contract K-3?")
    after = count_openai(sent, O200K, chunks=CHUNKS).total
    assert after <= 2000
    h = raw.headers
    assert h["x-ceiling-mode"] == "enforce" and h["x-ceiling-ceiling-tokens"] == "2000"
    assert int(h["x-ceiling-input-tokens"]) >= after
    assert int(h["x-ceiling-trimmed-tokens"]) == before - int(h["x-ceiling-input-tokens"])
    s = enforcing.sample
    assert (
        s("llm_context_over_ceiling_total", model="gpt-4o", workload="rag", action="trimmed") == 1
    )
    assert s(
        "llm_context_trimmed_tokens_total", model="gpt-4o", workload="rag", kind="retrieved"
    ) == before - int(h["x-ceiling-input-tokens"])
    assert s(
        "llm_context_ceiling_utilization_ratio_sum", model="gpt-4o", workload="rag"
    ) == pytest.approx(before / 2000)
    assert (
        s("llm_context_ceiling_utilization_ratio_bucket", model="gpt-4o", workload="rag", le="1.0")
        == 0
    )


def test_observe_forwards_the_exact_bytes_and_records(enforcing: Running) -> None:
    raw_body = orjson.dumps(
        {"model": "gpt-4o", "messages": rag_messages(), "max_tokens": 100},
        option=orjson.OPT_INDENT_2,
    )
    r = enforcing.http.post(
        "/v1/chat/completions",
        content=raw_body,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 200
    assert enforcing.double.received[-1].body == raw_body
    assert (
        r.headers["x-ceiling-mode"] == "observe" and int(r.headers["x-ceiling-trimmed-tokens"]) > 0
    )
    s = enforcing.sample
    assert (
        s("llm_context_over_ceiling_total", model="gpt-4o", workload="default", action="observed")
        == 1
    )
    assert (
        s(  # type: ignore[operator]
            "llm_context_would_trim_tokens_total",
            model="gpt-4o",
            workload="default",
            kind="retrieved",
        )
        > 0
    )
    assert (
        s("llm_context_trimmed_tokens_total", model="gpt-4o", workload="default", kind="retrieved")
        is None
    )


def test_off_mode_still_shows_drift(enforcing: Running) -> None:
    r = oa(enforcing, "off").chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=rag_messages(),  # type: ignore[arg-type]
    )
    assert r.headers["x-ceiling-mode"] == "off" and r.headers["x-ceiling-trimmed-tokens"] == "0"
    assert (
        enforcing.sample(
            "llm_context_ceiling_utilization_ratio_count", model="gpt-4o", workload="off"
        )
        == 1
    )
    assert (
        enforcing.sample(
            "llm_context_over_ceiling_total", model="gpt-4o", workload="off", action="observed"
        )
        is None
    )


def test_reject_when_nothing_can_be_trimmed(enforcing: Running) -> None:
    question = " ".join(["Please consider every clause carefully."] * 600)
    n = len(enforcing.double.received)
    with pytest.raises(openai.BadRequestError) as info:
        oa(enforcing, "rag").chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": question}]
        )
    err = info.value
    assert err.code == "context_length_exceeded"
    assert (
        "input budget is 2000 tokens" in err.message
        and "ceiling for gpt-4o/rag is 2000" in err.message
    )
    assert len(enforcing.double.received) == n  # nothing forwarded
    with pytest.raises(anthropic.BadRequestError) as ainfo:
        enforcing.anthropic(api_key="k", max_retries=0).messages.create(
            model="claude-x",
            max_tokens=50,
            messages=[{"role": "user", "content": question}],
            extra_headers={"x-ceiling-workload": "rag"},
        )
    assert "prompt is too long" in str(ainfo.value)
    s = enforcing.sample
    assert (
        s("llm_context_over_ceiling_total", model="gpt-4o", workload="rag", action="rejected") == 1
    )
    assert (
        s(
            "llm_context_requests_total",
            model="gpt-4o",
            workload="rag",
            api="openai_chat",
            outcome="rejected",
        )
        == 1
    )


def test_output_reservation_sits_on_top_of_the_ceiling(enforcing: Running) -> None:
    # no ceiling for small-model: the window (2000) minus max_tokens (1500) caps the input at 500
    msgs = rag_messages(n_chunks=6, size=3)
    r = oa(enforcing, "rag").chat.completions.with_raw_response.create(
        model="small-model",
        messages=msgs,  # type: ignore[arg-type]
        max_tokens=1500,
    )
    sent = enforcing.double.received[-1].json
    assert count_openai(sent, O200K, chunks=CHUNKS).total <= 500
    assert r.headers["x-ceiling-ceiling-tokens"] == "none"
    assert int(r.headers["x-ceiling-input-tokens"]) <= 500


def test_anthropic_agent_stream_caps_tool_results(enforcing: Running) -> None:
    log = " ".join(["2026-11-29 12:00:01 GET /v1/contracts 200 12ms"] * 80)
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "Find contract K-3 and its fee."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "search", "input": {"q": "K-3"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": log}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t2", "name": "search", "input": {"q": "fee"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": log}]},
    ]
    counter = CalibratedCounter(TiktokenCounter("cl100k_base"), 1.1)
    assert count_anthropic({"messages": msgs}, counter).total > 1500
    client = enforcing.anthropic(api_key="k", max_retries=0)
    with client.messages.stream(
        model="claude-x",
        max_tokens=64,
        messages=msgs,  # type: ignore[arg-type]
        extra_headers={"x-ceiling-workload": "agent"},
    ) as stream:
        assert "".join(stream.text_stream) == "tok0 tok1 tok2 tok3 tok4 "
    sent = enforcing.double.received[-1].json
    assert count_anthropic(sent, counter).total <= 1500
    # the older round goes first, whole (its call with it); the result the model answers now is
    # shortened only then, around a marker
    assert [
        b["tool_use_id"]
        for m in sent["messages"]
        for b in m["content"]
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ] == ["t2"]
    latest = sent["messages"][-1]["content"][0]["content"]
    assert "tokens removed by context-ceiling" in latest and latest.startswith("2026-11-29")
    assert (
        enforcing.sample(  # type: ignore[operator]
            "llm_context_trimmed_tokens_total",
            model="claude",
            workload="agent",
            kind="tool_results",
        )
        > 0
    )


def test_bypass_needs_the_admin_token(enforcing: Running) -> None:
    body = {"model": "gpt-4o", "messages": rag_messages(), "max_tokens": 10}
    r = enforcing.http.post(
        "/v1/chat/completions",
        json=body,
        headers={"x-ceiling-workload": "rag", "x-ceiling-bypass": "nope"},
    )
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = enforcing.http.post(
        "/v1/chat/completions",
        json=body,
        headers={"x-ceiling-workload": "rag", "x-ceiling-bypass": TOKEN},
    )
    assert r.status_code == 200 and r.headers["x-ceiling-mode"] == "off"
    assert enforcing.double.received[-1].json["messages"] == body["messages"]
    assert "x-ceiling-bypass" not in enforcing.double.received[-1].headers


def test_a_pushed_entry_mode_switches_enforcement_without_restart(enforcing: Running) -> None:
    msgs = rag_messages()
    r = oa(enforcing, "default").chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=msgs,  # type: ignore[arg-type]
    )
    assert r.headers["x-ceiling-mode"] == "observe"
    d = doc(
        2, entry(tokens=2000, mode="enforce"), entry(model="claude", window=200000, tokens=1500)
    )
    assert enforcing.http.put("/admin/ceilings", json=d, headers=AUTH).status_code == 200
    r = oa(enforcing, "default").chat.completions.with_raw_response.create(
        model="gpt-4o",
        messages=msgs,  # type: ignore[arg-type]
    )
    assert (
        r.headers["x-ceiling-mode"] == "enforce"
        and int(r.headers["x-ceiling-input-tokens"]) <= 2000
    )
    assert count_openai(enforcing.double.received[-1].json, O200K, chunks=CHUNKS).total <= 2000


def test_a_beta_header_that_widens_the_window_is_honoured(
    make_sidecar: Callable[..., Running],
) -> None:
    """Claude's 1M-context beta: the same model, a wider window when the request asks for it."""
    sc = make_sidecar(
        models=[
            {
                "match": "claude-*",
                "label": "claude",
                "window": 1000,
                "max_output_tokens": 100,
                "beta_windows": {"context-1m-2025-08-07": 5000},
            }
        ],
        enforcement={"mode": "enforce", "default_output_reservation": 100},
    )
    body = {
        "model": "claude-x",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "word " * 2000}],
    }
    h = {"anthropic-version": "2023-06-01"}
    r = sc.http.post("/v1/messages", json=body, headers=h)
    assert r.status_code == 400 and "prompt is too long" in r.json()["error"]["message"]
    beta = h | {"anthropic-beta": "some-other-beta, context-1m-2025-08-07"}
    r = sc.http.post("/v1/messages", json=body, headers=beta)
    assert r.status_code == 200
    assert 0.35 < float(r.headers["x-ceiling-utilization"]) < 0.45
